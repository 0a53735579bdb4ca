//! `pvisor review [JOB] [PATH...] [--diff] [--json]` (alias `diff`).

use std::collections::BTreeMap;
use std::io::Write;

use pvisor::actions::Review;
use pvisor::{ReviewItem, Runtime, Stage};
use pvisor_core::ids::JobId;
use pvisor_core::records::EntryType;
use pvisor_core::store::RelPath;

use crate::cli::ReviewArgs;
use crate::json::{json_line, JsonType};
use crate::output::ending;

pub fn cmd_review(runtime: &Runtime, args: ReviewArgs) -> anyhow::Result<i32> {
    if args.state {
        return super::state::cmd_review_state(runtime, args);
    }
    let store = runtime.store();
    let (job, paths, session) = match &args.session {
        Some(name) => {
            let (head, paths, view) = super::sessions::head_and_paths(runtime, name, args.job, args.paths)?;
            (head, paths, Some(view))
        }
        None => {
            let (job, paths) = super::job_and_paths(runtime, args.job, args.paths)?;
            (job, paths, None)
        }
    };
    let made_by = session.as_ref().map(super::sessions::attribution).unwrap_or_default();
    let stage = runtime.execute(Review { job: job.clone() })?;
    crate::config::warn_if_home(&stage.status.workspace);
    super::record_reviewed(store, &job, &stage.status.workspace, stage.confirmed);
    let items = stage.review(&paths, &crate::config::sensitive(store)?)?;
    // Buffered: a diff of 300,000 lines is 300,000 writes through a line buffer.
    let mut out = std::io::BufWriter::new(crate::output::stdout());
    if args.json {
        for line in commit_json(&items) {
            json_line(&mut out, JsonType::Commit, &line)?;
        }
        for item in &items {
            let mut change = change_json(item);
            if let Some(job) = made_by.get(&item.change.path) {
                change["job"] = serde_json::json!(job);
            }
            json_line(&mut out, JsonType::Change, &change)?;
        }
        out.flush()?;
        return Ok(0);
    }
    if let Some(view) = &session {
        super::sessions::header(&mut out, view)?;
    }
    print_header(&mut out, &stage, &items)?;
    print_items(&mut out, &items, &made_by)?;
    if args.diff {
        let color = super::use_color(args.color);
        let (ws, upper) = stage.diff_roots()?;
        for item in items.iter().filter(|i| i.remaining()) {
            writeln!(out)?;
            pvisor_stage::review::write_diff(
                &mut out,
                &ws,
                &upper,
                &item.change,
                item.confusable.as_deref(),
                color,
            )?;
        }
    }
    out.flush()?;
    Ok(0)
}

pub fn change_json(item: &ReviewItem) -> serde_json::Value {
    let c = &item.change;
    serde_json::json!({
        "path": c.path,
        "kind": c.kind,
        "entry": c.entry,
        "size": c.size,
        "mode": c.mode,
        "blake3": c.blake3,
        "conflict": item.conflict.is_some(),
        "conflict_reason": item.conflict,
        "unsupported": item.unsupported,
        "applied": item.applied,
        "dropped": item.dropped,
        "partly_applied": item.partly_applied,
        "sensitive": item.sensitive.is_some(),
        "sensitive_reason": item.sensitive,
        "never_applied": item.forbidden.is_some(),
        "confusable": item.confusable.is_some(),
        "confusable_reason": item.confusable,
        "hardlink_of": c.hardlink_of,
        "with_commit": item.commit.is_some(),
    })
}

/// One `commit` line per branch or tag a commit made in the sandbox sets:
/// `ref`, `new`, `paths` (the staged `.git/` paths it is made of) and
/// `applied`.
pub fn commit_json(items: &[ReviewItem]) -> Vec<serde_json::Value> {
    let mut lines = Vec::new();
    for item in items {
        let Some(commit) = &item.commit else { continue };
        for (name, new) in &commit.refs {
            lines.push(serde_json::json!({
                "ref": name,
                "new": new,
                "paths": commit.paths,
                "applied": item.applied,
            }));
        }
    }
    lines
}

pub fn print_header(out: &mut impl Write, stage: &Stage, items: &[ReviewItem]) -> std::io::Result<()> {
    let s = &stage.status;
    if stage.confirmed {
        let state = ending(s.state.as_str(), s.exit_code, s.signal);
        let remaining = items.iter().filter(|i| i.remaining()).count();
        let conflicts = items.iter().filter(|i| i.conflict.is_some()).count();
        writeln!(
            out,
            "{}  {state}  ·  stage {}: {remaining} remaining, {} applied, {} dropped{}",
            s.job,
            stage.state().as_str(),
            items.iter().filter(|i| i.applied).count(),
            items.iter().filter(|i| i.dropped).count(),
            if conflicts > 0 { format!(", {conflicts} in conflict") } else { String::new() },
        )?;
    } else {
        writeln!(
            out,
            "{}  no confirmed result (state: {}): these are the staged files; apply and drop are refused",
            s.job, s.state
        )?;
    }
    if let Some(why) = &stage.incomplete {
        writeln!(
            out,
            "INCOMPLETE stage: {why}; only what arrived is listed, and apply refuses it without --allow-incomplete"
        )?;
    }
    writeln!(out, "workspace {}", crate::output::shown_path(&s.workspace))
}

fn human_size(change: &pvisor_core::records::ChangeEntry) -> String {
    match change.entry {
        EntryType::File | EntryType::Symlink => {
            let n = change.size as f64;
            if change.size < 1024 {
                format!("{} B", change.size)
            } else if n < 1024.0 * 1024.0 {
                format!("{:.1} KiB", n / 1024.0)
            } else if n < 1024.0 * 1024.0 * 1024.0 {
                format!("{:.1} MiB", n / (1024.0 * 1024.0))
            } else {
                format!("{:.2} GiB", n / (1024.0 * 1024.0 * 1024.0))
            }
        }
        EntryType::Dir => "dir".into(),
        EntryType::Special => "special".into(),
        EntryType::None => "-".into(),
    }
}

/// A commit made in the sandbox, shown as the refs it sets (one line
/// each, on the path that sets them) rather than as its object paths.
fn print_commit(out: &mut impl Write, item: &ReviewItem, commit: &pvisor::InCommit) -> std::io::Result<()> {
    let status = if item.applied {
        "applied"
    } else if item.dropped {
        "dropped"
    } else {
        "pending"
    };
    for (name, new) in &commit.refs {
        writeln!(
            out,
            "  {status:<8}  {:<12}  {:>9}  {} → {} (a commit made in the sandbox, with {} .git path(s): objects, refs, reflogs, index)",
            "commit",
            "",
            crate::output::shown(name),
            &new[..new.len().min(7)],
            commit.paths
        )?;
        if let Some(reason) = commit.sensitive.as_ref().filter(|_| item.remaining()) {
            let reason = crate::output::shown(reason);
            writeln!(out, "            SENSITIVE: {reason}; landed only when its ref or .git is named")?;
        }
    }
    Ok(())
}

/// Lists the items; `made_by` names the session run that made a change.
pub fn print_items(
    out: &mut impl Write,
    items: &[ReviewItem],
    made_by: &BTreeMap<RelPath, JobId>,
) -> std::io::Result<()> {
    if items.is_empty() {
        return writeln!(out, "no staged changes");
    }
    for item in items {
        if let Some(commit) = &item.commit {
            print_commit(out, item, commit)?;
            continue;
        }
        let status = if item.applied {
            "applied"
        } else if item.dropped {
            "dropped"
        } else if item.conflict.is_some() {
            "CONFLICT"
        } else if item.unsupported.is_some() {
            "skipped"
        } else if item.partly_applied {
            // Some hunks are on the host (`apply -p`); the rest remain.
            "partly"
        } else {
            "pending"
        };
        let by = made_by.get(&item.change.path).map(|job| format!("  ({job})")).unwrap_or_default();
        writeln!(
            out,
            "  {status:<8}  {:<12}  {:>9}  {}{by}",
            item.change.kind.as_str(),
            human_size(&item.change),
            item.change.path.display_escaped()
        )?;
        if let Some(reason) =
            item.conflict.as_ref().or(item.unsupported.as_ref()).filter(|_| item.remaining())
        {
            writeln!(out, "            {}", crate::output::shown(reason))?;
        }
        if let Some(reason) = item.confusable.as_ref().filter(|_| item.remaining()) {
            writeln!(out, "            CONFUSABLE NAME: {}", crate::output::shown(reason))?;
        }
        if let Some(reason) = item.forbidden.as_ref().filter(|_| item.remaining()) {
            let reason = crate::output::shown(reason);
            writeln!(out, "            REFUSED: {reason}; never applied, whatever the flags (drop it)")?;
        } else if let Some(reason) = item.sensitive.as_ref().filter(|_| item.remaining()) {
            let reason = crate::output::shown(reason);
            writeln!(out, "            SENSITIVE: {reason}; applied only when named exactly")?;
        }
    }
    Ok(())
}
