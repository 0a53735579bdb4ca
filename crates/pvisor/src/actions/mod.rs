//! The runtime's action API: the one way a frontend asks the runtime to do
//! anything to a Job.
//!
//! The CLI, `pvisor serve` and any later frontend translate their protocol
//! (arguments, HTTP routes, a containerd Task call) into an [`Action`] and
//! hand it to [`Runtime::execute`]; none of them talks to an executor's
//! control socket or the guest agent itself. Each action is a typed request
//! with a typed outcome (Firecracker's `VmmAction` and cloud-hypervisor's
//! `RequestHandler`, with the response type tied to the request):
//!
//! | action | outcome |
//! |---|---|
//! | [`Run`] (also a workspace fork or an execution fork) | [`ManagedJobRun`](crate::ManagedJobRun) |
//! | [`Resume`] | [`ManagedJobRun`](crate::ManagedJobRun) |
//! | [`PrepareExecutionFork`] | [`ExecutionForkSource`] |
//! | [`CheckpointWorkspace`] | the checkpoint manifest and its hold |
//! | [`CheckpointExecution`] | [`ExecCheckpoint`](pvisor_vm::ExecCheckpoint) |
//! | [`Suspend`] | [`ExecCheckpoint`](pvisor_vm::ExecCheckpoint), once the Job is `suspended` |
//! | [`Kill`] | [`Killed`](crate::Killed) |
//! | [`ChangeNetworkPolicy`] | `()`, once the running Job's proxy decides by the new policy |
//! | [`ChangeCredentialVault`] | `()`, once the running Job's proxy injects from the new vault |
//! | [`NoteInTrace`] | `()`, once the running Job's Session has the note for its Trace |
//! | [`Apply`], [`DropChanges`] | the effects reports |
//! | [`Status`], [`Events`], [`ListJobs`] | read projections |
//! | [`Gc`] | [`GcReport`](crate::GcReport) |
//! | [`Review`] | the [`Stage`](crate::Stage) view; [`ApplyHunks`] applies chosen hunks |
//! | [`ResolveJob`], [`LatestJobIn`], [`Recover`] | finding a Job, reconciling it before it is read |
//! | [`ReadReceipt`] | a Job's completion receipt, validated |
//! | [`Export`], [`Import`], [`VerifyArchive`], [`VerifyJob`] | Run Bundle archives |
//! | [`ListCheckpoints`], [`ListExecutionCheckpoints`], [`HoldCheckpoint`], [`ReadCheckpoint`] | checkpoints |
//! | [`ListCaches`], [`PruneCache`] | the stores of `--cache` directories |
//! | [`ReleaseStorage`] | [`Released`]: one ended Job's stage, VM disks and execution checkpoints removed |
//! | [`OpenGuest`] | a [`Guest`] handle: exec, file operations, connect |
//! | [`HoldGuest`] | [`Held`]: a keeper Job started or resumed, and its guest once it answers |
//! | [`AwaitGuest`] | a [`Guest`] once it answers |
//! | [`BeginSessionRun`], [`ReadSession`], [`CloseSessionIfDone`], [`ListSessions`] | run sessions: runs that stack (see [`crate::run_sessions`]) |
//! | [`WarmTemplate`], [`ListTemplates`], [`RemoveTemplate`] | the vm backend's start templates |
//!
//! What an action may do depends on the Job's backend, which the runtime
//! learns from [`Backends`]: an execution checkpoint of an `ns` Job is a
//! clear "unsupported" error, not a branch on the executor's name.

mod changes;
mod execution;
pub mod guest;
mod hold;
mod jobs;
mod network;
mod records;
mod sessions;
mod storage;
mod templates;

use std::path::PathBuf;
use std::sync::Arc;

use pvisor_core::ids::{AttemptId, JobId};
use pvisor_core::records::{JobRecord, RunRecord};
use pvisor_core::state::JobState;
use pvisor_core::store::{OwnerLock, Store, StoreError};
use pvisor_sandbox::Executor;

use crate::backends::{BackendTraits, Backends, HostBackends};
use crate::records::views::{self, ViewError};

pub use changes::{Apply, ApplyHunks, ApproveState, DropChanges, PromoteState, Review, ReviewState};
pub use execution::{
    CheckpointExecution, CheckpointWorkspace, ExecutionForkSource, PrepareExecutionFork, Suspend,
};
pub use guest::{Guest, OpenGuest};
pub use hold::{AwaitGuest, CheckJoiningShares, GiveUp, Held, Hold, HoldGuest, Keeper, NotReady, Readiness};
pub use jobs::{Events, Gc, Kill, ListJobs, Resume, Run, Status, Trace};
pub use network::{ChangeCredentialVault, ChangeNetworkPolicy, NoteInTrace};
pub use records::{
    ArchiveVerified, Cache, Export, HoldCheckpoint, Import, JobVerified, LatestJobIn, ListCaches,
    ListCheckpoints, ListExecutionCheckpoints, PruneCache, ReadCheckpoint, ReadReceipt, Recover, ResolveJob,
    VerifyArchive, VerifyJob,
};
pub use sessions::{
    BeginSessionRun, CloseSessionIfDone, HoldSession, ListSessions, ReadSession, SessionHold, SessionTurn,
    SessionView,
};
pub use storage::{ReleaseStorage, Released};
pub use templates::{ListTemplates, RemoveTemplate, WarmTemplate};

/// A request to the runtime with its typed outcome.
pub trait Action: std::fmt::Debug {
    /// The action's name in operator logs.
    const NAME: &'static str;
    type Outcome;
    /// Does it. Called only through [`Runtime::execute`].
    fn perform(self, runtime: &Runtime) -> Result<Self::Outcome, RuntimeError>;
}

/// The embedded runtime: a state directory and the backends that run Jobs.
/// Cheap to clone.
#[derive(Clone, Debug)]
pub struct Runtime {
    store: Store,
    backends: Arc<dyn Backends>,
    /// The runs this process supervises (started through this runtime),
    /// so that [`Kill`] cancels them here instead of signalling the
    /// Attempt's lock holder, which is this very process.
    owned: Arc<std::sync::Mutex<std::collections::HashMap<JobId, crate::CancelHandle>>>,
}

impl Runtime {
    pub fn new(store: Store, backends: Arc<dyn Backends>) -> Self {
        Self { store, backends, owned: Arc::default() }
    }

    /// Remembers that this process supervises `run`.
    fn own(&self, run: &crate::ManagedJobRun) {
        let mut owned = self.owned.lock().unwrap_or_else(|p| p.into_inner());
        owned.insert(run.job().clone(), run.cancel_handle());
    }

    /// The cancel handle of `job`'s run, if this process started it.
    fn owned(&self, job: &JobId) -> Option<crate::CancelHandle> {
        self.owned.lock().unwrap_or_else(|p| p.into_inner()).get(job).cloned()
    }

    fn disown(&self, job: &JobId) {
        self.owned.lock().unwrap_or_else(|p| p.into_inner()).remove(job);
    }

    /// The runtime of this machine's backends over `store`.
    pub fn on_host(store: Store) -> Self {
        let backends = Arc::new(HostBackends::new(store.root()));
        Self::new(store, backends)
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Does `action`. The one entry point of every frontend.
    pub fn execute<A: Action>(&self, action: A) -> Result<A::Outcome, RuntimeError> {
        action.perform(self)
    }

    /// The executor that starts new Jobs on backend `name` (`ns`, `vm`).
    pub fn executor(&self, name: &str) -> Result<Arc<dyn Executor>, RuntimeError> {
        self.backends.executor(name).ok_or_else(|| RuntimeError::UnknownBackend { name: name.to_owned() })
    }

    /// What sandboxes of backend `name` are like (see [`BackendTraits`]).
    pub fn traits(&self, name: &str) -> BackendTraits {
        self.backends.traits(name)
    }

    /// A Job's records and the Attempt it targets, running or not.
    fn job(&self, job: &JobId) -> Result<LiveJob, RuntimeError> {
        let record: JobRecord = self.store.read(&self.store.job_file(job))?;
        let run: RunRecord = self.store.read(&self.store.run_file(&record.run))?;
        let attempt = AttemptId::new(run.id.clone(), record.target_attempt);
        let attempt_dir = self.store.attempt_dir(&attempt);
        Ok(LiveJob { record, run, attempt, attempt_dir })
    }

    /// Fails unless `job`'s target Attempt is running (held by its supervisor).
    fn require_running(&self, job: &LiveJob, needs: &'static str) -> Result<(), RuntimeError> {
        if OwnerLock::is_held(&self.store.lock_file(&job.attempt))? {
            return Ok(());
        }
        let state = views::status(&self.store, &job.record.id)?.state;
        Err(RuntimeError::NotRunning { job: job.record.id.clone(), state, needs })
    }
}

/// A Job's records and the Attempt it targets.
#[derive(Debug)]
struct LiveJob {
    record: JobRecord,
    run: RunRecord,
    attempt: AttemptId,
    attempt_dir: PathBuf,
}

impl LiveJob {
    fn executor(&self) -> &str {
        &self.run.operation.placement.executor
    }
}

/// Why an action was not done. Each says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("Job {job} is not running (state: {state}); {needs}")]
    NotRunning { job: JobId, state: JobState, needs: &'static str },
    #[error("Job {job} ran on the {executor} executor, which cannot {what}; {hint}")]
    Unsupported { job: JobId, executor: String, what: &'static str, hint: &'static str },
    #[error("Job {job} {why}")]
    ContinuationWithdrawn { job: JobId, why: &'static str },
    #[error(
        "Job {job} is {state}, not suspended; only a suspended vm Job can be resumed (pvisor suspend {job})"
    )]
    NotSuspended { job: JobId, state: JobState },
    #[error("the VM of {job} was saved as {checkpoint}, but {detail}")]
    SuspendUnconfirmed { job: JobId, checkpoint: String, detail: String },
    #[error("Cannot save the execution state of job {job}: {source}")]
    Capability {
        job: JobId,
        #[source]
        source: pvisor_sandbox::capabilities::CapabilityError,
    },
    /// A held or awaited guest did not answer; `last` is what the last
    /// attempt to reach it said.
    #[error("the guest of Job {job} did not become ready ({why}): {last}")]
    GuestNotReady { job: JobId, why: NotReady, last: String },
    #[error("no backend named {name:?}; the backends are {}", crate::backends::HOST_BACKENDS.join(", "))]
    UnknownBackend { name: String },
    /// A start template could not be built, found or removed.
    #[error("{0}")]
    Template(String),
    /// A cache store could not be listed or removed.
    #[error("{0}")]
    Cache(String),
    #[error(transparent)]
    Archive(#[from] crate::runtime::archive::ArchiveError),
    #[error(transparent)]
    Admission(#[from] crate::AdmissionError),
    #[error(transparent)]
    View(#[from] ViewError),
    #[error(transparent)]
    Effects(#[from] crate::effects::EffectsError),
    #[error(transparent)]
    Checkpoint(#[from] crate::runtime::checkpoint::CheckpointError),
    #[error(transparent)]
    Suspension(#[from] crate::records::suspension::SuspensionError),
    #[error(transparent)]
    Sandbox(#[from] pvisor_sandbox::SandboxError),
    #[error(transparent)]
    Session(#[from] crate::run_sessions::SessionError),
    #[error(transparent)]
    State(#[from] crate::agent_state::StateError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the network policy of Job {job} did not change: {why}")]
    PolicyChange { job: JobId, why: String },
    #[error("the credential vault of Job {job} did not change: {why}")]
    VaultChange { job: JobId, why: String },
    #[error("the Trace of Job {job} did not take the note: {why}")]
    Note { job: JobId, why: String },
}

#[cfg(test)]
mod tests;
