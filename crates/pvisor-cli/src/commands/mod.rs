//! One file per subcommand; `dispatch` routes to them.

mod apply;
mod apply_hunks;
mod archive;
mod cache;
mod checkpoint;
mod containerd_owned;
mod doctor;
mod drop;
mod events;
mod execution;
mod jobs;
mod kill;
mod manuals;
mod review;
mod run;
pub use run::{executor_for, request_for};
mod serve;
mod sessions;
mod state;
mod status;
mod trust;

#[cfg(test)]
mod tests;

use anyhow::Context;
use pvisor::actions::{LatestJobIn, Recover, ResolveJob, Review};
use pvisor::{Runtime, RuntimeError, ViewError};
use pvisor_core::ids::JobId;
use pvisor_core::store::{resolve_state_root, Store};

use crate::cli::{Cli, Command};

/// Runs the command `cli` names on the runtime `runtime` builds (the
/// machine's backends over the state directory, from `main`; a fake one in
/// tests). The runtime is built once,
/// here, and only for the commands that use the state directory.
///
/// A command that changes something and was given `--json` runs in
/// [`crate::json::scoped`]: its failure is its last JSON line, and the
/// result is then `Ok` with pvisor's exit status.
pub fn dispatch(cli: Cli, runtime: impl FnOnce() -> anyhow::Result<Runtime>) -> anyhow::Result<i32> {
    match json_stream(&cli.command) {
        Some(stream) => crate::json::scoped(stream, || route(cli.command, runtime)),
        None => route(cli.command, runtime),
    }
}

/// Where a command that changes something writes with `--json`: stderr
/// for those that run a command (its stdout is the command's), else
/// stdout. `None` without `--json`, and for the read commands, whose
/// `--json` lines are their records and whose messages stay text.
fn json_stream(command: &Command) -> Option<crate::json::Stream> {
    use crate::json::Stream::{Stderr, Stdout};
    let (json, stream) = match command {
        Command::Run(args) => (args.options.json, Stderr),
        Command::Fork(args) => (args.run.json, Stderr),
        Command::Resume(args) => (args.json, Stderr),
        Command::Apply(args) => (args.json, Stdout),
        Command::Drop(args) => (args.json, Stdout),
        Command::Kill(args) => (args.json, Stdout),
        Command::Suspend(args) => (args.json, Stdout),
        Command::Checkpoint(args) => (args.json, Stdout),
        Command::Export(args) => (args.json, Stdout),
        Command::Verify(args) => (args.json, Stdout),
        Command::Import(args) => (args.json, Stdout),
        Command::Cache(crate::cli::CacheArgs { action: crate::cli::CacheAction::Prune { json, .. } }) => {
            (*json, Stdout)
        }
        Command::State(crate::cli::StateArgs {
            action:
                crate::cli::StateAction::Approve { json, .. } | crate::cli::StateAction::Promote { json, .. },
        }) => (*json, Stdout),
        Command::Image(crate::cli::ImageArgs {
            command:
                crate::cli::ImageCommand::Import { json, .. }
                | crate::cli::ImageCommand::Warm { json, .. }
                | crate::cli::ImageCommand::RmTemplate { json, .. },
        }) => (*json, Stdout),
        _ => (false, Stdout),
    };
    json.then_some(stream)
}

fn route(command: Command, runtime: impl FnOnce() -> anyhow::Result<Runtime>) -> anyhow::Result<i32> {
    let command = match command {
        Command::Completions(args) => return manuals::cmd_completions(args),
        Command::Man(args) => return manuals::cmd_man(args),
        command => command,
    };
    // The daemon's logs start before anything else can fail.
    match &command {
        Command::Serve(args) => pvisor_server::logging::init(args.log_level.as_deref())?,
        Command::SandboxSupervisor(args) => pvisor_server::logging::init(args.log_level.as_deref())?,
        Command::Mcp(args) => {
            pvisor_server::logging::init(Some(args.log_level.as_deref().unwrap_or("warn")))?
        }
        _ => {}
    }
    if let Command::Mcp(args) = command {
        let workspace = match args.workspace {
            Some(dir) => dir,
            None => std::env::current_dir()?,
        };
        return crate::mcp::serve(runtime()?, workspace, args.any_workspace);
    }
    let runtime = &runtime()?;
    match command {
        Command::Run(args) => run::cmd_run(runtime, args),
        Command::Status(args) => status::cmd_status(runtime, args),
        Command::Review(args) => review::cmd_review(runtime, args),
        Command::Cache(args) => cache::cmd_cache(runtime, args),
        Command::State(args) => state::cmd_state(runtime, args),
        Command::Completions(_) | Command::Man(_) => unreachable!("answered above"),
        Command::Diff(mut args) => {
            args.diff = true;
            review::cmd_review(runtime, args)
        }
        Command::Apply(args) => apply::cmd_apply(runtime, args),
        Command::Drop(args) => drop::cmd_drop(runtime, args),
        Command::Kill(args) => kill::cmd_kill(runtime, args),
        Command::Doctor(args) => doctor::cmd_doctor(runtime, args),
        Command::Checkpoint(args) => checkpoint::cmd_checkpoint(runtime, args),
        Command::Checkpoints(args) => checkpoint::cmd_checkpoints(runtime, args),
        Command::Fork(args) => checkpoint::cmd_fork(runtime, args),
        Command::Suspend(args) => execution::cmd_suspend(runtime, args),
        Command::Resume(args) => execution::cmd_resume(runtime, args),
        Command::Export(args) => archive::cmd_export(runtime, args),
        Command::Verify(args) => archive::cmd_verify(runtime, args),
        Command::Import(args) => archive::cmd_import(runtime, args),
        Command::Gc(args) => archive::cmd_gc(runtime, args),
        Command::Jobs(args) => jobs::cmd_jobs(runtime, args),
        Command::Events(args) => events::cmd_events(runtime, args),
        Command::Serve(args) => serve::cmd_serve(runtime, args),
        Command::Image(args) => serve::cmd_image(runtime, args),
        Command::Trust(args) => trust::cmd_trust(runtime, args),
        Command::SandboxSupervisor(args) => serve::cmd_sandbox_supervisor(runtime, args),
        Command::Mcp(_) => unreachable!("served above"),
    }
}

/// Opens the state directory named by the environment.
pub fn open_store() -> anyhow::Result<Store> {
    let root = resolve_state_root(
        std::env::var_os("PVISOR_HOME"),
        std::env::var_os("XDG_STATE_HOME"),
        std::env::var_os("HOME"),
    )
    .context("Cannot locate the state directory: set PVISOR_HOME (or HOME)")?;
    let store = Store::open(&root).with_context(|| {
        format!("Cannot use state directory {} (set PVISOR_HOME to a writable directory)", root.display())
    })?;
    if let Some(registry) = state_dirs_registry() {
        pvisor_core::store::register_state_dir(&registry, store.root());
    }
    Ok(store)
}

fn state_dirs_registry() -> Option<std::path::PathBuf> {
    pvisor_core::store::state_dirs_registry(std::env::var_os("XDG_STATE_HOME"), std::env::var_os("HOME"))
}

/// Every pvisor state directory a sandbox must not see besides `store`'s
/// own (which admission always hides): the ones this user registered, the
/// containerd shim's, and every user's default one under `/home` and
/// `/root`. Those made after the sandbox starts are closed to it by their
/// mode instead (`pvisor_core::store::close_to_sandboxes`).
pub fn other_state_dirs(store: &Store) -> Vec<std::path::PathBuf> {
    let mut dirs =
        state_dirs_registry().map(|r| pvisor_core::store::known_state_dirs(&r)).unwrap_or_default();
    if let Ok(real) = std::fs::canonicalize(pvisor_core::store::SHIM_STATE_ROOT) {
        dirs.push(real);
    }
    let homes = std::fs::read_dir("/home").into_iter().flatten().flatten().map(|e| e.path());
    for home in homes.chain(std::iter::once(std::path::PathBuf::from("/root"))) {
        let default = home.join(".local/state/pvisor");
        if let Ok(real) = std::fs::canonicalize(&default) {
            dirs.push(real);
        }
    }
    dirs.retain(|d| d != store.root());
    dirs.sort();
    dirs.dedup();
    dirs
}

/// Runs a command that frees space (`drop`, `kill`, `gc`). If the state
/// filesystem is full, it releases the state directory's reserve and runs
/// the command once more: these commands are idempotent, and the reserve is
/// what lets them write their records. The next command re-creates it.
pub fn freeing_space<T>(store: &Store, mut command: impl FnMut() -> anyhow::Result<T>) -> anyhow::Result<T> {
    match command() {
        Err(e) if e.chain().any(pvisor_core::store::is_out_of_space) && store.release_reserve() => {
            crate::output::warning(&format!(
                "the state directory {} is full; using its reserve to record this",
                store.root().display()
            ));
            command()
        }
        other => other,
    }
}

/// Splits `[JOB] [PATH...]`: the first word is a job if it resolves to one,
/// otherwise it is a path and the current workspace's most recent Job is
/// meant (see [`resolve_job`]). Paths are relative to the current directory
/// when it is inside the Job's workspace, else to the workspace's root.
pub fn job_and_paths(
    runtime: &Runtime,
    first: Option<String>,
    rest: Vec<String>,
) -> anyhow::Result<(JobId, Vec<String>)> {
    job_and_paths_named(runtime, first, rest).map(|(job, paths, _)| (job, paths))
}

/// [`job_and_paths`] for `apply` and `drop`, which change the workspace or
/// discard work: without a JOB they take the newest Job of the workspace
/// only if it is the one last reviewed there (or none was), and refuse when
/// a newer Job has arrived since the review (the user would act on a Job
/// they never saw).
pub fn job_and_paths_reviewed(
    runtime: &Runtime,
    first: Option<String>,
    rest: Vec<String>,
    verb: &str,
) -> anyhow::Result<(JobId, Vec<String>)> {
    let (job, paths, named) = job_and_paths_named(runtime, first, rest)?;
    let store = runtime.store();
    if named {
        return Ok((job, paths));
    }
    let workspace = store.read::<pvisor_core::records::JobRecord>(&store.job_file(&job))?.workspace;
    let me = crate::output::me();
    match last_reviewed(runtime, &workspace) {
        Some((reviewed, _)) if reviewed != job => {
            anyhow::bail!(
                "you last reviewed {reviewed} in {}, but {job} is newer and unreviewed; name the Job: `{me} {verb} {reviewed} ...` for the one you reviewed, or `{me} review {job}` first",
                crate::output::shown_path(&workspace)
            )
        }
        // Still without a result, apply itself refuses and says why.
        Some((_, false)) if runtime.execute(Review { job: job.clone() }).is_ok_and(|s| s.confirmed) => anyhow::bail!(
            "you reviewed {job} while it was still running: what it staged afterwards is unseen; `{me} review {job}` again, or name the Job: `{me} {verb} {job} ...`"
        ),
        _ => Ok((job, paths)),
    }
}

/// [`job_and_paths_reviewed`], or with `--session NAME` the session's head
/// (a first argument is then a path), held against a new run of the
/// session until the returned hold is dropped.
pub fn target_and_paths_reviewed(
    runtime: &Runtime,
    session: Option<&str>,
    first: Option<String>,
    rest: Vec<String>,
    verb: &str,
) -> anyhow::Result<(JobId, Vec<String>, Option<pvisor::actions::SessionHold>)> {
    let Some(name) = session else {
        return job_and_paths_reviewed(runtime, first, rest, verb).map(|(job, paths)| (job, paths, None));
    };
    let (head, paths, view) = sessions::head_and_paths(runtime, name, first, rest)?;
    let hold = runtime.execute(pvisor::actions::HoldSession {
        workspace: view.record.workspace.clone(),
        name: name.to_owned(),
    })?;
    Ok((head, paths, Some(hold)))
}

/// Releases a session's hold before the session is closed (the close
/// takes the session's lock itself, and this process's own hold would
/// refuse it).
pub fn drop_hold(hold: &mut Option<pvisor::actions::SessionHold>) {
    hold.take();
}

/// After `apply` or `drop --session NAME`: ends the session if nothing is
/// left, and says so (a `session` line with `--json`, before the `result`).
pub fn end_session_if_done(runtime: &Runtime, session: Option<&str>, job: &JobId) -> anyhow::Result<()> {
    let Some(name) = session else { return Ok(()) };
    let store = runtime.store();
    let workspace = store.read::<pvisor_core::records::JobRecord>(&store.job_file(job))?.workspace;
    sessions::close_if_done(runtime, name, workspace)
}

/// Where the Job last reviewed over `workspace` is recorded: one file per
/// workspace, named by the digest of its path.
fn reviewed_file(store: &Store, workspace: &std::path::Path) -> std::path::PathBuf {
    let key = pvisor_core::digest::digest_bytes(workspace.as_os_str().as_encoded_bytes());
    store.root().join("reviewed").join(key)
}

/// What follows the Job in the record of a review made before the Job
/// ended: the command may have staged more since.
const UNFINISHED: &str = " unfinished";

/// Records that `job` (over `workspace`) was just reviewed, and whether its
/// result was `confirmed` (the Job had ended). Best effort: a state
/// directory we may not write (someone else's) only loses the guard.
pub fn record_reviewed(
    store: &Store,
    job: &pvisor_core::ids::JobId,
    workspace: &std::path::Path,
    confirmed: bool,
) {
    let file = reviewed_file(store, workspace);
    let record = format!("{job}{}", if confirmed { "" } else { UNFINISHED });
    let written = file
        .parent()
        .map_or(Ok(()), pvisor_core::store::create_dir_all_private)
        .and_then(|()| pvisor_core::store::write_atomic(&file, record.as_bytes()));
    if let Err(e) = written {
        crate::output::warning(&format!("could not record that {job} was reviewed: {e}"));
    }
}

/// The Job last reviewed over `workspace`, if one was and it still exists,
/// and whether it had ended when reviewed.
fn last_reviewed(runtime: &Runtime, workspace: &std::path::Path) -> Option<(JobId, bool)> {
    let store = runtime.store();
    let text = std::fs::read_to_string(reviewed_file(store, workspace)).ok()?;
    let (id, finished) = match text.trim().strip_suffix(UNFINISHED) {
        Some(id) => (id, false),
        None => (text.trim(), true),
    };
    let job = runtime.execute(ResolveJob { query: Some(id.to_owned()) }).ok()?;
    store.job_file(&job).exists().then_some((job, finished))
}

fn job_and_paths_named(
    runtime: &Runtime,
    first: Option<String>,
    mut rest: Vec<String>,
) -> anyhow::Result<(JobId, Vec<String>, bool)> {
    let mut named = None;
    if let Some(word) = first {
        let looks_like_job =
            word.starts_with("job-") || (!word.contains(['/', '.', '*', '?', '[']) && word.len() >= 4);
        if looks_like_job {
            match runtime.execute(ResolveJob { query: Some(word.clone()) }) {
                Ok(job) => named = Some(job),
                Err(RuntimeError::View(ViewError::NotFound { .. })) if !word.starts_with("job-") => {}
                Err(e) => return Err(e.into()),
            }
        }
        if named.is_none() {
            rest.insert(0, word);
        }
    }
    let was_named = named.is_some();
    let job = match named {
        Some(job) => job,
        None => resolve_job(runtime, None)?,
    };
    let store = runtime.store();
    let workspace = store.read::<pvisor_core::records::JobRecord>(&store.job_file(&job))?.workspace;
    let paths = match current_dir() {
        Some(cwd) => workspace_relative(rest, &cwd, &workspace)?,
        None => rest,
    };
    Ok((job, paths, was_named))
}

fn current_dir() -> Option<std::path::PathBuf> {
    std::env::current_dir().and_then(std::fs::canonicalize).ok()
}

/// Resolves a JOB argument; without one, the most recent Job of the
/// workspace that contains the current directory (said on stderr when it is
/// not the most recent Job overall), else the most recent Job (said too).
pub fn resolve_job(runtime: &Runtime, query: Option<&str>) -> anyhow::Result<JobId> {
    if query.is_some() {
        return Ok(runtime.execute(ResolveJob { query: query.map(str::to_owned) })?);
    }
    let latest = runtime.execute(ResolveJob { query: None })?;
    let Some(cwd) = current_dir() else { return Ok(latest) };
    let store = runtime.store();
    match runtime.execute(LatestJobIn { dir: cwd })? {
        Some((job, _)) if job == latest => Ok(job),
        Some((job, workspace)) => {
            crate::output::plain(
                crate::json::JsonType::Note,
                &format!(
                    "{job}: the most recent Job of this workspace ({}); the most recent overall is {latest}",
                    crate::output::shown_path(&workspace)
                ),
            );
            Ok(job)
        }
        None => {
            let workspace = store
                .read::<pvisor_core::records::JobRecord>(&store.job_file(&latest))
                .map(|r| crate::output::shown_path(&r.workspace))
                .unwrap_or_default();
            crate::output::note(&format!(
                "no Job ran over this directory; using the most recent Job, {latest} (workspace {workspace})"
            ));
            Ok(latest)
        }
    }
}

/// Makes `paths` (given relative to `cwd`) relative to `workspace`, when
/// `cwd` is inside it: `pvisor apply file` from `sub/` means `sub/file`,
/// `.` means `sub` (or everything, at the root), `../x` climbs. A path that
/// leaves the workspace is an error. Globs are taken relative to `cwd` too.
fn workspace_relative(
    paths: Vec<String>,
    cwd: &std::path::Path,
    workspace: &std::path::Path,
) -> anyhow::Result<Vec<String>> {
    use std::path::{Component, Path, PathBuf};
    if !cwd.starts_with(workspace) {
        return Ok(paths);
    }
    let mut out = Vec::with_capacity(paths.len());
    for given in paths {
        let joined = if Path::new(&given).is_absolute() { PathBuf::from(&given) } else { cwd.join(&given) };
        let mut normal = PathBuf::new();
        for component in joined.components() {
            match component {
                Component::ParentDir => {
                    normal.pop();
                }
                Component::CurDir => {}
                other => normal.push(other),
            }
        }
        let Ok(rel) = normal.strip_prefix(workspace) else {
            anyhow::bail!(
                "{} is outside the workspace {}; give a path inside it",
                crate::output::shown(&given),
                crate::output::shown_path(workspace)
            );
        };
        out.push(if rel.as_os_str().is_empty() {
            "**".to_owned()
        } else {
            rel.to_string_lossy().into_owned()
        });
    }
    Ok(out)
}

/// Whether to colour output written to stdout.
pub fn use_color(choice: crate::cli::ColorChoice) -> bool {
    match choice {
        crate::cli::ColorChoice::Always => true,
        crate::cli::ColorChoice::Never => false,
        crate::cli::ColorChoice::Auto => {
            let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
            tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                && std::env::var("TERM").map_or(true, |t| t != "dumb")
        }
    }
}

/// Recovers `job` before it is read (the `Recover` action). A state
/// directory we may read but not write (someone else's) still gets an honest,
/// derived answer from the views, so a failed write is only a warning;
/// corruption is an error.
pub fn recover(runtime: &Runtime, job: &JobId) -> anyhow::Result<()> {
    use pvisor_core::store::StoreError;
    match runtime.execute(Recover { job: job.clone() }) {
        Ok(_) => Ok(()),
        Err(RuntimeError::View(ViewError::Store(e @ StoreError::Io { .. }))) if !e.is_not_found() => {
            crate::output::warning(&format!("could not record the recovery of {job}: {e}"));
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}
