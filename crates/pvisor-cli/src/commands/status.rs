//! `pvisor status [JOB] [--json]`.

use std::io::Write;

use pvisor::actions::{Review, Status};
use pvisor::{JobStatus, ReceiptStatus, Runtime};

use crate::cli::StatusArgs;
use crate::json::{json_line, JsonType};
use crate::output::{ending, shell_words};

pub fn cmd_status(runtime: &Runtime, args: StatusArgs) -> anyhow::Result<i32> {
    let mut out = crate::output::stdout();
    let job = match &args.session {
        Some(name) => {
            anyhow::ensure!(args.job.is_none(), "give a JOB or --session NAME, not both");
            let (head, _, view) = super::sessions::head_and_paths(runtime, name, None, Vec::new())?;
            session_status(runtime, &mut out, &view, args.json)?;
            head
        }
        None => super::resolve_job(runtime, args.job.as_deref())?,
    };
    super::recover(runtime, &job)?;
    let status = runtime.execute(Status { job: job.clone() })?;
    if args.json {
        json_line(&mut out, JsonType::Status, &status)?;
    } else {
        print_status(&mut out, &status)?;
    }
    if args.review {
        let stage = runtime.execute(Review { job: job.clone() })?;
        let items = stage.review(&[], &crate::config::sensitive(runtime.store())?)?;
        if args.json {
            for line in super::review::commit_json(&items) {
                json_line(&mut out, JsonType::Commit, &line)?;
            }
            for item in &items {
                json_line(&mut out, JsonType::Change, &super::review::change_json(item))?;
            }
        } else {
            writeln!(out)?;
            super::review::print_items(&mut out, &items, &Default::default())?;
        }
    }
    Ok(0)
}

/// The session's record and each run's state, before its head's status.
fn session_status(
    runtime: &Runtime,
    out: &mut impl Write,
    view: &pvisor::actions::SessionView,
    json: bool,
) -> anyhow::Result<()> {
    let made_by = super::sessions::attribution(view);
    if json {
        let record = &view.record;
        let runs: Vec<serde_json::Value> = record
            .jobs
            .iter()
            .map(|job| serde_json::json!({"job": job, "changes_held": made_by.values().filter(|j| *j == job).count()}))
            .collect();
        let data = serde_json::json!({
            "name": record.name, "workspace": record.workspace, "started_at": record.started_at,
            "head": record.head(), "changes_held": made_by.len(), "runs": runs,
        });
        return json_line(out, JsonType::Session, &data);
    }
    super::sessions::header(out, view)?;
    for job in &view.record.jobs {
        let s = runtime.execute(Status { job: job.clone() })?;
        let held = made_by.values().filter(|j| *j == job).count();
        let state = ending(s.state.as_str(), s.exit_code, s.signal);
        writeln!(out, "  {job}  {state:<24}  {held:>4} held  {}", shell_words(&s.program, &s.args))?;
    }
    writeln!(out)?;
    Ok(())
}

fn print_status(out: &mut impl Write, s: &JobStatus) -> std::io::Result<()> {
    let state = ending(s.state.as_str(), s.exit_code, s.signal);
    let live = if s.live { " (live)" } else { "" };
    writeln!(out, "job        {}", s.job)?;
    writeln!(out, "state      {state}{live}")?;
    let receipt = match s.receipt {
        ReceiptStatus::Valid => "valid (result confirmed)".to_owned(),
        ReceiptStatus::Missing if s.live => "not yet (the run is in progress)".to_owned(),
        ReceiptStatus::Missing if s.suspended_to.is_some() => format!(
            "none yet: suspended to {} (termination receipt valid); {}",
            s.suspended_to.as_ref().map(|c| c.as_str()).unwrap_or_default(),
            super::containerd_owned::resume_hint(&s.labels, &s.job)
        ),
        ReceiptStatus::Missing => {
            "missing: the supervisor stopped before confirming a result; the stage is kept".to_owned()
        }
    };
    writeln!(out, "receipt    {receipt}")?;
    for gap in &s.audit_gaps {
        writeln!(out, "audit      {gap}")?;
    }
    if let Some(error) = &s.error {
        writeln!(out, "error      {}", crate::output::shown(error))?;
    }
    if let Some(l) = &s.lineage {
        writeln!(out, "lineage    fork of {} (checkpoint {}, {})", l.parent_job, l.checkpoint, l.kind)?;
    }
    if let Some(origin) = &s.imported_from {
        writeln!(out, "imported   from {origin} (read-only: review only)")?;
    }
    if !s.labels.is_empty() {
        let labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        writeln!(out, "labels     {}", crate::output::shown(&labels.join(" ")))?;
    }
    writeln!(out, "command    {}", shell_words(&s.program, &s.args))?;
    if let Some(image) = &s.image {
        writeln!(out, "image      {} ({})", crate::output::shown(&image.name), image.digest)?;
    }
    writeln!(out, "workspace  {}", crate::output::shown_path(&s.workspace))?;
    writeln!(out, "run        {}  (attempt {})", s.run, s.attempt)?;
    writeln!(out, "created    {}", s.created_at)?;
    if let Some(t) = s.started_at {
        writeln!(out, "started    {t}")?;
    }
    if let Some(t) = s.finished_at {
        writeln!(out, "finished   {t}")?;
    }
    match s.changes {
        Some(n) => writeln!(
            out,
            "changes    {n} staged ({}) in {}",
            s.stage_state.map_or("?", |st| st.as_str()),
            s.stage.display()
        )?,
        None => writeln!(out, "changes    unconfirmed; staged files are in {}", s.stage.display())?,
    }
    Ok(())
}
