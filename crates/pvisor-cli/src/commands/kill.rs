//! `pvisor kill [JOB] [--grace DURATION] [--json]`.

use pvisor::actions::Kill;
use pvisor::{Killed, Runtime};

use crate::cli::KillArgs;
use crate::json::{json_line, JsonType};
use crate::results::KillResult;

pub fn cmd_kill(runtime: &Runtime, args: KillArgs) -> anyhow::Result<i32> {
    let job = super::resolve_job(runtime, args.job.as_deref())?;
    if !args.force {
        super::containerd_owned::refuse_if_running(runtime, &job, super::containerd_owned::Change::Kill)?;
    }
    let killed = super::freeing_space(runtime.store(), || {
        Ok(runtime.execute(Kill { job: job.clone(), grace: args.grace })?)
    })?;
    if args.json {
        json_line(&mut crate::output::stdout(), JsonType::Result, &KillResult::new(&job, &killed))?;
        return Ok(0);
    }
    match killed {
        Killed::AlreadyEnded(state) => println!("{job} had already ended ({state}); nothing to kill"),
        Killed::Ended { state, stopped_owner } => {
            if let Some(pid) = stopped_owner {
                println!("{job}: stopped its supervisor (pid {pid})");
            }
            match state {
                pvisor_core::state::JobState::Lost => println!(
                    "{job} closed as lost: no completion receipt confirms a result; its stage is kept (pvisor review {job})"
                ),
                other => println!("{job} ended: {other} (confirmed by its receipt); continuation withdrawn"),
            }
        }
    }
    Ok(0)
}
