//! `--session NAME` on review, diff, apply, drop, status and events: the
//! session is found from the current directory (its workspace or one
//! above it), and its head Job stands for the whole session.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use pvisor::actions::{CloseSessionIfDone, ReadSession, SessionTurn, SessionView};
use pvisor::run_sessions::SessionError;
use pvisor::{Runtime, RuntimeError};
use pvisor_core::ids::JobId;
use pvisor_core::store::RelPath;

use crate::json::JsonType;

/// The open session `name` of the workspace that holds the current
/// directory: the nearest directory, walking up, with a session of that name.
pub fn find(runtime: &Runtime, name: &str) -> anyhow::Result<SessionView> {
    let cwd = std::env::current_dir()?;
    let mut first_error = None;
    for dir in cwd.ancestors() {
        match runtime.execute(ReadSession { workspace: dir.to_owned(), name: name.to_owned() }) {
            Ok(view) => return Ok(view),
            Err(RuntimeError::Session(SessionError::NotFound { .. })) if first_error.is_some() => {}
            Err(e @ RuntimeError::Session(SessionError::NotFound { .. })) => first_error = Some(e),
            Err(e) => return Err(e.into()),
        }
    }
    Err(first_error.map_or_else(|| anyhow::anyhow!("no session {name:?} here"), Into::into))
}

/// The session's head Job and the paths, relative to its workspace.
pub fn head_and_paths(
    runtime: &Runtime,
    name: &str,
    first: Option<String>,
    rest: Vec<String>,
) -> anyhow::Result<(JobId, Vec<String>, SessionView)> {
    let view = find(runtime, name)?;
    let Some(head) = view.head_job().cloned() else {
        anyhow::bail!("session {name:?} has no run yet; `pvisor run --session {name} -- COMMAND` starts one")
    };
    let paths: Vec<String> = first.into_iter().chain(rest).collect();
    let paths = match std::env::current_dir().and_then(std::fs::canonicalize) {
        Ok(cwd) => super::workspace_relative(paths, &cwd, &view.record.workspace)?,
        Err(_) => paths,
    };
    Ok((head, paths, view))
}

/// Which run of the session made each change it still holds.
pub fn attribution(view: &SessionView) -> BTreeMap<RelPath, JobId> {
    view.remaining().into_iter().map(|a| (a.change.path.clone(), a.job.clone())).collect()
}

/// After an apply or drop of the session: closes it when nothing is left,
/// and says so.
pub fn close_if_done(runtime: &Runtime, name: &str, workspace: PathBuf) -> anyhow::Result<()> {
    let Some(closed) = runtime.execute(CloseSessionIfDone { workspace, name: name.to_owned() })? else {
        return Ok(());
    };
    let how = closed.closed.as_ref().map_or("closed", |c| c.how.as_str());
    if crate::json::mode().is_some() {
        let line = serde_json::json!({"name": name, "ended": how, "runs": closed.jobs});
        return crate::json::emit(JsonType::Session, &line);
    }
    writeln!(
        crate::output::stdout(),
        "session {name} ended ({how}, {} run(s)); `pvisor run --session {name}` starts a new one",
        closed.jobs.len()
    )?;
    Ok(())
}

/// What `run --session` says before the command starts: which run of the
/// session this is and what it stacks on (a `session` line with `--json`).
pub fn announce_turn(turn: &SessionTurn, quiet: bool) {
    let name = &turn.record.name;
    let run = turn.record.jobs.len() + 1;
    let head = turn.stands_on.as_ref();
    let previous_ended = turn.closed_before.as_ref().and_then(|c| c.closed.as_ref()).map(|c| c.how.as_str());
    let line =
        serde_json::json!({"name": name, "run": run, "on_top_of": head, "previous_ended": previous_ended});
    for old in &turn.stranded {
        let jobs: Vec<String> = old.jobs.iter().map(ToString::to_string).collect();
        crate::output::warning(&format!(
            "session {name} of {}, which no longer exists, is not this one: this run does not see what it staged; its runs are {} (review and apply them by id)",
            crate::output::shown_path(&old.workspace),
            jobs.join(", ")
        ));
    }
    if crate::json::mode().is_some() {
        let _ = crate::json::emit(JsonType::Session, &line);
        return;
    }
    if let Some(how) = previous_ended {
        eprintln!("pvisor: session {name}: the previous one ended ({how}); starting a new one");
    }
    if !quiet {
        match head {
            Some(head) => eprintln!("pvisor: session {name}: run {run} on top of what {head} staged"),
            None => eprintln!("pvisor: session {name}: run {run} over the workspace"),
        }
    }
}

/// The session's summary line for review and status.
pub fn header(out: &mut impl Write, view: &SessionView) -> std::io::Result<()> {
    let r = &view.record;
    let held = view.remaining().len();
    writeln!(
        out,
        "session {}  ·  {} run(s) since {}  ·  {held} change(s) held  ·  head {}",
        r.name,
        r.jobs.len(),
        r.started_at,
        r.head().map_or_else(|| "none".to_owned(), ToString::to_string)
    )
}
