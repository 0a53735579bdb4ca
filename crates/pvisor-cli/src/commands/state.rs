//! `pvisor review --state`, `pvisor state approve|promote`: a Job's agent
//! state (`run --state`), which is never staged and never reaches the
//! host's real files.

use std::io::Write;

use pvisor::actions::{ApproveState, PromoteState, ReviewState};
use pvisor::agent_state::{StateChange, StateChangeKind};
use pvisor::Runtime;
use pvisor_core::ids::JobId;

use crate::cli::{ReviewArgs, StateAction, StateArgs};
use crate::json::{json_line, JsonType};
use crate::output::shown_path;

/// `review --state [JOB | --session NAME]`: one line per changed path.
pub fn cmd_review_state(runtime: &Runtime, args: ReviewArgs) -> anyhow::Result<i32> {
    if !args.paths.is_empty() || args.diff {
        anyhow::bail!("review --state lists every state change; it takes no PATH and no --diff");
    }
    let job = target(runtime, args.job.as_deref(), args.session.as_deref())?;
    let changes = runtime.execute(ReviewState { job: job.clone() })?;
    let mut out = crate::output::stdout();
    if args.json {
        for change in &changes {
            json_line(&mut out, JsonType::State, change)?;
        }
        return Ok(0);
    }
    writeln!(out, "Agent state of {job}: {} change(s), never staged, never the host's files", changes.len())?;
    for change in &changes {
        writeln!(out, "{}", line(change))?;
    }
    if changes.iter().any(|c| c.gated && !c.approved) {
        writeln!(
            out,
            "Gated changes are held back from later runs until approved: pvisor state approve --job {job} PATH..."
        )?;
    }
    Ok(0)
}

fn line(change: &StateChange) -> String {
    let kind = match change.change {
        StateChangeKind::Added => "A",
        StateChangeKind::Modified => "M",
        StateChangeKind::Deleted => "D",
    };
    let mark = match (change.gated, change.approved) {
        (false, _) => "",
        (true, true) => "  [gated, approved]",
        (true, false) => "  [gated, held back]",
    };
    let earlier = if change.held { "  (from an earlier run)" } else { "" };
    format!("  {kind} {}{mark}{earlier}", shown_path(std::path::Path::new(&change.path)))
}

pub fn cmd_state(runtime: &Runtime, args: StateArgs) -> anyhow::Result<i32> {
    match args.action {
        StateAction::Approve { paths, job, session, json } => {
            let job = target(runtime, job.as_deref(), session.as_deref())?;
            let cwd = std::env::current_dir()?;
            let paths = paths.into_iter().map(|p| cwd.join(p)).collect();
            let approved = runtime.execute(ApproveState { job: job.clone(), paths })?;
            let mut out = crate::output::stdout();
            for change in &approved {
                if json {
                    json_line(&mut out, JsonType::State, change)?;
                } else {
                    writeln!(out, "approved {}", shown_path(std::path::Path::new(&change.path)))?;
                }
            }
            if json {
                let line = serde_json::json!({"job": job, "approved": approved.len()});
                json_line(&mut out, JsonType::Result, &line)?;
            }
        }
        StateAction::Promote { job, session, json } => {
            let job = target(runtime, job.as_deref(), session.as_deref())?;
            let promoted = runtime.execute(PromoteState { job: job.clone() })?;
            let mut out = crate::output::stdout();
            if json {
                json_line(
                    &mut out,
                    JsonType::Result,
                    &serde_json::json!({"job": job, "promoted": promoted}),
                )?;
            } else {
                for path in &promoted {
                    writeln!(
                        out,
                        "promoted {} from {job}: runs outside its session start from it",
                        shown_path(path)
                    )?;
                }
            }
        }
    }
    Ok(0)
}

/// After a run: says how many gated agent state changes it holds back
/// from later runs, and how to review them (nothing for a run without
/// agent state, or with nothing held).
pub fn note_held(runtime: &Runtime, job: &JobId) {
    let Ok(changes) = runtime.execute(ReviewState { job: job.clone() }) else { return };
    let held = changes.iter().filter(|c| c.gated && !c.approved).count();
    if held > 0 {
        crate::output::note(&format!(
            "agent state: {held} gated change(s) held back from later runs until approved; pvisor review --state {job}"
        ));
    }
}

/// The Job a state command acts on: the run `--session NAME`'s next run
/// carries its agent state from, else JOB, else the most recent Job of
/// this workspace.
fn target(runtime: &Runtime, job: Option<&str>, session: Option<&str>) -> anyhow::Result<JobId> {
    let Some(name) = session else { return super::resolve_job(runtime, job) };
    let view = super::sessions::find(runtime, name)?;
    view.state_head.ok_or_else(|| {
        anyhow::anyhow!("session {name:?} has no run with agent state; `pvisor run --session {name} --state PATH -- COMMAND` makes one")
    })
}
