//! Checkpoints: of a stopped Job's workspace, and of a running Job's
//! execution (keep running, or suspend); and where an execution fork
//! restores from.
//!
//! Execution state is saved by the Attempt's own supervisor, asked through
//! the backend's [`Checkpointable`](pvisor_sandbox::capabilities::Checkpointable)
//! capability; the records it writes (the checkpoint manifest, the
//! suspension's termination receipt) are what these actions confirm.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pvisor_core::ids::JobId;
use pvisor_core::records::CheckpointManifest;
use pvisor_core::state::JobState;
use pvisor_core::store::OwnerLock;
use pvisor_sandbox::capabilities::Checkpointable;
use pvisor_sandbox::Executor;
use pvisor_vm::ExecCheckpoint;

use super::{Action, LiveJob, Runtime, RuntimeError};
use crate::admission::ExecutionFork;
use crate::records::suspension;
use crate::records::views;
use crate::runtime::checkpoint::{self, CheckpointHold};

/// How long a machine checkpoint may take (a large guest under TCG is slow).
const SAVE_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the supervisor may take, after a suspension is saved, to reap
/// the VM and commit the termination receipt.
const SUSPEND_CONFIRM: Duration = Duration::from_secs(120);

/// Checkpoints the stage of a Job whose stop is confirmed by its receipt.
/// The hold keeps `gc` away from the checkpoint until it is dropped.
#[derive(Debug)]
pub struct CheckpointWorkspace {
    pub job: JobId,
}

impl Action for CheckpointWorkspace {
    const NAME: &'static str = "checkpoint-workspace";
    type Outcome = (CheckpointManifest, CheckpointHold);

    fn perform(self, runtime: &Runtime) -> Result<Self::Outcome, RuntimeError> {
        Ok(checkpoint::checkpoint(&runtime.store, &self.job)?)
    }
}

/// Saves the execution state of a running Job, which keeps running.
#[derive(Debug)]
pub struct CheckpointExecution {
    pub job: JobId,
}

impl Action for CheckpointExecution {
    const NAME: &'static str = "checkpoint-execution";
    type Outcome = ExecCheckpoint;

    fn perform(self, runtime: &Runtime) -> Result<ExecCheckpoint, RuntimeError> {
        let (live, saver) = savable(runtime, &self.job)?;
        saver
            .checkpoint(&live.attempt_dir, SAVE_TIMEOUT)
            .map_err(|source| RuntimeError::Capability { job: self.job, source })
    }
}

/// Saves the execution state of a running Job and stops it. Returns once
/// the Attempt's termination receipt has made the Job `suspended`.
#[derive(Debug)]
pub struct Suspend {
    pub job: JobId,
}

impl Action for Suspend {
    const NAME: &'static str = "suspend";
    type Outcome = ExecCheckpoint;

    fn perform(self, runtime: &Runtime) -> Result<ExecCheckpoint, RuntimeError> {
        let store = &runtime.store;
        let job = self.job;
        let (live, saver) = savable(runtime, &job)?;
        let saved = saver
            .suspend(&live.attempt_dir, SAVE_TIMEOUT)
            .map_err(|source| RuntimeError::Capability { job: job.clone(), source })?;
        // The supervisor reaps the VM and commits the termination receipt;
        // the Job is suspended only once that receipt says so.
        let unconfirmed = |detail: String| RuntimeError::SuspendUnconfirmed {
            job: job.clone(),
            checkpoint: saved.id.to_string(),
            detail,
        };
        let deadline = Instant::now() + SUSPEND_CONFIRM;
        while OwnerLock::is_held(&store.lock_file(&live.attempt))? {
            if Instant::now() > deadline {
                return Err(unconfirmed(format!(
                    "its supervisor has not finished after {} s",
                    SUSPEND_CONFIRM.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        match views::status(store, &job)?.state {
            JobState::Suspended => Ok(saved),
            state => Err(unconfirmed(format!("the Job is {state}; see `pvisor events {job}`"))),
        }
    }
}

/// A running Job whose backend can save its execution, and whose
/// continuation has not been withdrawn.
fn savable(runtime: &Runtime, job: &JobId) -> Result<(LiveJob, Arc<dyn Checkpointable>), RuntimeError> {
    let live = runtime.job(job)?;
    let saver =
        runtime.backends.checkpointable(live.executor()).ok_or_else(|| RuntimeError::Unsupported {
            job: job.clone(),
            executor: live.executor().to_owned(),
            what: "save execution state",
            hint: "execution checkpoints need a Job started with --executor vm",
        })?;
    runtime.require_running(&live, "only a running vm Job has execution state to save")?;
    if !live.record.continuation {
        return Err(RuntimeError::ContinuationWithdrawn {
            job: job.clone(),
            why: "is being killed; its execution can no longer be saved",
        });
    }
    Ok((live, saver))
}

/// Finds (or takes) the execution checkpoint an execution fork of `parent`
/// restores from: `checkpoint` if given; else a fresh one of the running
/// VM; else the suspension's; else the latest.
#[derive(Debug)]
pub struct PrepareExecutionFork {
    pub parent: JobId,
    pub checkpoint: Option<String>,
}

/// Where an execution fork starts: submit `fork` with `command` over
/// `workspace` on `executor` (a [`super::Run`] with `fork_execution` set).
#[derive(Debug)]
pub struct ExecutionForkSource {
    pub fork: ExecutionFork,
    pub executor: Arc<dyn Executor>,
    /// The parent's command, which the fork continues.
    pub command: Vec<String>,
    pub workspace: PathBuf,
    /// The checkpoint taken of the running parent for this fork, if one was.
    pub taken: Option<ExecCheckpoint>,
    /// Keeps `gc` away from the checkpoint until the fork is admitted.
    pub hold: CheckpointHold,
}

impl Action for PrepareExecutionFork {
    const NAME: &'static str = "prepare-execution-fork";
    type Outcome = ExecutionForkSource;

    fn perform(self, runtime: &Runtime) -> Result<ExecutionForkSource, RuntimeError> {
        let store = &runtime.store;
        let parent = self.parent;
        let job = runtime.job(&parent)?;
        let restorer = runtime.backends.checkpointable(job.executor()).ok_or_else(|| RuntimeError::Unsupported {
            job: parent.clone(),
            executor: job.executor().to_owned(),
            what: "fork its execution",
            hint: "execution forks need a Job started with --executor vm (or use --state workspace to run a new command over the parent's files)",
        })?;
        if !job.record.continuation {
            return Err(RuntimeError::ContinuationWithdrawn {
                job: parent,
                why: "was killed; its execution checkpoints can no longer be forked",
            });
        }
        let (run, attempt) = (&job.run, &job.attempt);
        let live = OwnerLock::is_held(&store.lock_file(attempt))?;
        let mut taken = None;
        let (dir, manifest) = match (&self.checkpoint, live) {
            (Some(id), _) => suspension::find_verified(store, &parent, &run.id, Some(id))?,
            (None, true) => {
                let saved = (CheckpointExecution { job: parent.clone() }).perform(runtime)?;
                let found = suspension::find_verified(store, &parent, &run.id, Some(saved.id.as_str()))?;
                taken = Some(saved);
                found
            }
            (None, false) => match suspension::load(store, &parent, attempt)? {
                Some((receipt, _)) => {
                    suspension::find_verified(store, &parent, &run.id, Some(receipt.checkpoint.as_str()))?
                }
                None => suspension::find_verified(store, &parent, &run.id, None)?,
            },
        };
        // Held until the fork is admitted, as a workspace checkpoint is.
        let hold = checkpoint::hold(store, &manifest.id)?;
        let executor = restorer.restorer(store.root(), &manifest)?;
        let command = std::iter::once(run.operation.program.clone())
            .chain(run.operation.args.iter().cloned())
            .collect();
        let workspace = manifest.workspace.clone();
        Ok(ExecutionForkSource {
            fork: ExecutionFork { parent, dir, manifest },
            executor,
            command,
            workspace,
            taken,
            hold,
        })
    }
}
