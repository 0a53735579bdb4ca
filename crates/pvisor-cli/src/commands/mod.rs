//! One file per subcommand; `dispatch` routes to them.

mod apply;
mod archive;
mod checkpoint;
mod doctor;
mod drop;
mod events;
mod execution;
mod jobs;
mod kill;
mod review;
mod run;
mod serve;
mod status;
mod trust;

use anyhow::Context;
use pvisor_core::store::{resolve_state_root, Store};

use crate::cli::{Cli, Command};

pub fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Run(args) => run::cmd_run(args),
        Command::Status(args) => status::cmd_status(args),
        Command::Review(args) => review::cmd_review(args),
        Command::Diff(mut args) => {
            args.diff = true;
            review::cmd_review(args)
        }
        Command::Apply(args) => apply::cmd_apply(args),
        Command::Drop(args) => drop::cmd_drop(args),
        Command::Kill(args) => kill::cmd_kill(args),
        Command::Doctor(args) => doctor::cmd_doctor(args),
        Command::Checkpoint(args) => checkpoint::cmd_checkpoint(args),
        Command::Checkpoints(args) => checkpoint::cmd_checkpoints(args),
        Command::Fork(args) => checkpoint::cmd_fork(args),
        Command::Suspend(args) => execution::cmd_suspend(args),
        Command::Resume(args) => execution::cmd_resume(args),
        Command::Export(args) => archive::cmd_export(args),
        Command::Verify(args) => archive::cmd_verify(args),
        Command::Import(args) => archive::cmd_import(args),
        Command::Gc(args) => archive::cmd_gc(args),
        Command::Jobs(args) => jobs::cmd_jobs(args),
        Command::Events(args) => events::cmd_events(args),
        Command::Serve(args) => serve::cmd_serve(args),
        Command::Image(args) => serve::cmd_image(args),
        Command::Trust(args) => trust::cmd_trust(args),
        Command::SandboxSupervisor(args) => serve::cmd_sandbox_supervisor(args),
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
/// own (which admission always hides): the ones this user registered, and
/// every user's default one under `/home` and `/root` (visible to a
/// sandbox run as root).
pub fn other_state_dirs(store: &Store) -> Vec<std::path::PathBuf> {
    let mut dirs =
        state_dirs_registry().map(|r| pvisor_core::store::known_state_dirs(&r)).unwrap_or_default();
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
            eprintln!(
                "pvisor: warning: the state directory {} is full; using its reserve to record this",
                store.root().display()
            );
            command()
        }
        other => other,
    }
}

/// Splits `[JOB] [PATH...]`: the first word is a job if it resolves to one,
/// otherwise it is a path and the most recent Job is meant.
pub fn job_and_paths(
    store: &Store,
    first: Option<String>,
    mut rest: Vec<String>,
) -> anyhow::Result<(pvisor_core::ids::JobId, Vec<String>)> {
    use pvisor::runtime::job_service::views;
    if let Some(word) = first {
        let looks_like_job =
            word.starts_with("job-") || (!word.contains(['/', '.', '*', '?', '[']) && word.len() >= 4);
        if looks_like_job {
            match views::resolve_job(store, Some(&word)) {
                Ok(job) => return Ok((job, rest)),
                Err(views::ViewError::NotFound { .. }) if !word.starts_with("job-") => {}
                Err(e) => return Err(e.into()),
            }
        }
        rest.insert(0, word);
    }
    Ok((views::resolve_job(store, None)?, rest))
}

/// Whether to colour output written to stdout.
pub fn use_color(choice: crate::cli::ColorChoice) -> bool {
    match choice {
        crate::cli::ColorChoice::Always => true,
        crate::cli::ColorChoice::Never => false,
        crate::cli::ColorChoice::Auto => {
            // SAFETY: isatty only inspects the descriptor.
            let tty = unsafe { libc::isatty(1) == 1 };
            tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                && std::env::var("TERM").map_or(true, |t| t != "dumb")
        }
    }
}

/// Recovers `job` before it is read (see `pvisor::runtime::recovery`). A state
/// directory we may read but not write (someone else's) still gets an honest,
/// derived answer from the views, so a failed write is only a warning;
/// corruption is an error.
pub fn recover(store: &Store, job: &pvisor_core::ids::JobId) -> anyhow::Result<()> {
    use pvisor::runtime::job_service::views::ViewError;
    use pvisor_core::store::StoreError;
    match pvisor::runtime::recovery::recover(store, job) {
        Ok(_) => Ok(()),
        Err(ViewError::Store(e @ StoreError::Io { .. })) if !e.is_not_found() => {
            eprintln!("pvisor: warning: could not record the recovery of {job}: {e}");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}
