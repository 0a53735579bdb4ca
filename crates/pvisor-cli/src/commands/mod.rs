//! One file per subcommand; `dispatch` routes to them.

mod events;
mod jobs;
mod run;
mod status;

use anyhow::Context;
use pvisor_core::store::{resolve_state_root, Store};

use crate::cli::{Cli, Command};

pub fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Run(args) => run::cmd_run(args),
        Command::Status(args) => status::cmd_status(args),
        Command::Jobs(args) => jobs::cmd_jobs(args),
        Command::Events(args) => events::cmd_events(args),
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
    Store::open(&root).with_context(|| {
        format!("Cannot use state directory {} (set PVISOR_HOME to a writable directory)", root.display())
    })
}
