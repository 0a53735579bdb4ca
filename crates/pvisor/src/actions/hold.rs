//! Holding a guest up: the one way `pvisor serve`'s sandboxes and the
//! containerd shim's containers run a VM whose real work arrives as guest
//! execs.
//!
//! [`HoldGuest`] admits the [`Keeper`] Job (or resumes a suspended one) and,
//! when asked, waits until its guest serves a root directory; [`AwaitGuest`]
//! is that wait alone, for a frontend whose Job is supervised elsewhere (the
//! daemon waits for the VM its sandbox supervisor process started).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use pvisor_core::ids::{AttemptId, JobId};
use pvisor_core::labels::Labels;
use pvisor_core::records::{ResourceLimits, SharedDirectory};
use pvisor_net::ScopedPolicy;

use super::guest::{FileOp, Guest, OpenGuest, Request, KEEPER};
use super::jobs::{Resume, Run};
use super::{Action, Runtime, RuntimeError};
use crate::{CancelHandle, ManagedJobRun, RunRequest};

/// How long one readiness probe (an agent call) may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the Job's records are read again to open its guest: until the
/// Attempt runs there is no guest to open, and a resume targets a new one.
const REOPEN_POLL: Duration = Duration::from_millis(50);

/// The Job that holds a guest up: its Operation is [`KEEPER`], which idles
/// until the Job is ended. The one definition of it.
#[derive(Debug, Clone)]
pub struct Keeper {
    /// The Job's workspace (the image or container rootfs the execs see).
    pub workspace: PathBuf,
    pub limits: ResourceLimits,
    pub labels: Labels,
    /// The network policy, as the frontend scopes it.
    pub network: Vec<ScopedPolicy>,
    /// A network namespace whose interface the VM's NIC takes over.
    pub network_namespace: Option<PathBuf>,
    /// Read-write directories the guest mounts live.
    pub shared_directories: Vec<SharedDirectory>,
    /// Between SIGTERM and SIGKILL when the Job is ended.
    pub kill_grace: Duration,
}

impl Keeper {
    /// The run request of the keeper Job.
    pub fn request(self) -> RunRequest {
        RunRequest {
            caches: Vec::new(),
            state: Vec::new(),
            state_from: None,
            labels: self.labels,
            network_namespace: self.network_namespace,
            shared_directories: self.shared_directories,
            image: None,
            output: None,
            workspace: self.workspace,
            cwd: None,
            program: "/bin/sh".into(),
            args: vec!["-c".into(), KEEPER.into()],
            env: vec![("PATH".into(), "/bin:/sbin:/usr/bin:/usr/sbin".into())],
            kill_grace: self.kill_grace,
            network: self.network,
            fork: None,
            fork_execution: None,
            secrets: crate::SecretPolicy::default(),
            seccomp: true,
            limits: self.limits,
        }
    }
}

/// Checks host directories that join a keeper Job's guest through a share
/// it has (the containerd shim's pod containers' volumes), exactly as the
/// Job's own shares were checked at its admission; the answer is the
/// shares as the guest must get them (sources canonicalized).
#[derive(Debug)]
pub struct CheckJoiningShares {
    /// The keeper Job's workspace.
    pub workspace: PathBuf,
    pub shares: Vec<SharedDirectory>,
}

impl Action for CheckJoiningShares {
    const NAME: &'static str = "check-joining-shares";
    type Outcome = Vec<SharedDirectory>;

    fn perform(self, runtime: &Runtime) -> Result<Vec<SharedDirectory>, RuntimeError> {
        // A keeper's secrets are `Keeper::request`'s: the default policy.
        let secrets = crate::SecretPolicy::default();
        Ok(crate::admission::check_joining_shares(runtime.store(), &self.workspace, &secrets, &self.shares)?)
    }
}

/// What a [`HoldGuest`] starts.
#[derive(Debug)]
pub enum Hold {
    /// A new keeper Job on `backend` (`vm`).
    New { keeper: Box<Keeper>, backend: String },
    /// The suspended keeper Job `job`, in a new Attempt restored from its
    /// suspension.
    Resume(JobId),
}

/// When a held guest counts as up: it serves `root` (a stat of its `/`).
#[derive(Debug, Clone)]
pub struct Readiness {
    pub root: PathBuf,
    pub timeout: Duration,
    /// How often the guest is probed.
    pub poll: Duration,
}

/// Starts (or resumes) a keeper Job and, with `ready`, waits until its
/// guest answers. Needs a Tokio runtime, as [`Run`] does; with `ready` the
/// Session must run on another thread than the caller's (it blocks).
#[derive(Debug)]
pub struct HoldGuest {
    pub hold: Hold,
    pub ready: Option<Readiness>,
}

/// A held guest: the keeper Job's run (await it to learn how it ended),
/// and its guest once it answered.
#[derive(Debug)]
pub struct Held {
    pub run: ManagedJobRun,
    /// The ready guest: `Some` when the hold waited for readiness.
    pub guest: Option<Guest>,
}

impl Held {
    pub fn job(&self) -> &JobId {
        self.run.job()
    }

    pub fn attempt(&self) -> &AttemptId {
        self.run.attempt()
    }

    /// Ends the keeper: forwards `signal`, SIGKILL after its grace.
    pub fn cancel_handle(&self) -> CancelHandle {
        self.run.cancel_handle()
    }
}

impl Action for HoldGuest {
    const NAME: &'static str = "hold-guest";
    type Outcome = Held;

    fn perform(self, runtime: &Runtime) -> Result<Held, RuntimeError> {
        let run = match self.hold {
            Hold::New { keeper, backend } => {
                let executor = runtime.executor(&backend)?;
                Run { request: keeper.request(), executor }.perform(runtime)?
            }
            Hold::Resume(job) => Resume { job }.perform(runtime)?,
        };
        let Some(ready) = self.ready else { return Ok(Held { run, guest: None }) };
        let wait = AwaitGuest {
            job: run.job().clone(),
            attempt: Some(run.attempt().number()),
            ready,
            give_up: None,
        };
        match wait.perform(runtime) {
            Ok(guest) => Ok(Held { run, guest: Some(guest) }),
            Err(e) => {
                // Not up in time: the keeper is ended (its Session records why).
                run.cancel_handle().cancel(libc::SIGTERM);
                Err(e)
            }
        }
    }
}

/// Asked between probes: `Some(why)` stops the wait.
pub type GiveUp = Box<dyn FnMut() -> Option<String> + Send>;

/// Waits until the guest of `job`'s Attempt `attempt` (or the one it
/// targets) serves `ready.root`. Gives up when the Job ends first, when
/// `give_up` says why, or at the timeout.
pub struct AwaitGuest {
    pub job: JobId,
    pub attempt: Option<u32>,
    pub ready: Readiness,
    pub give_up: Option<GiveUp>,
}

impl std::fmt::Debug for AwaitGuest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwaitGuest")
            .field("job", &self.job)
            .field("attempt", &self.attempt)
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

/// Why an awaited guest never answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// The Job ended first, in this state.
    #[error("the Job ended ({0})")]
    Ended(pvisor_core::state::JobState),
    /// The caller's `give_up` said so.
    #[error("{0}")]
    GaveUp(String),
    /// Not up within the timeout.
    #[error("not up in time")]
    TimedOut,
}

impl Action for AwaitGuest {
    const NAME: &'static str = "await-guest";
    type Outcome = Guest;

    fn perform(mut self, runtime: &Runtime) -> Result<Guest, RuntimeError> {
        let probe = Request::FileOp { root: self.ready.root.clone(), op: FileOp::Stat { path: "/".into() } };
        let deadline = Instant::now() + self.ready.timeout;
        let mut last = String::from("the guest was never reached");
        // Opening reads the Job's records; probing is one agent call. So the
        // guest is opened again now and then, and probed often: every
        // millisecond polled away is on the frontend's create.
        let mut opened: Option<(Guest, Instant)> = None;
        let not_ready = |why, last: String| RuntimeError::GuestNotReady { job: self.job.clone(), why, last };
        loop {
            if opened.as_ref().is_none_or(|(_, at)| at.elapsed() > REOPEN_POLL) {
                opened = match (OpenGuest { job: self.job.clone(), attempt: self.attempt }).perform(runtime) {
                    Ok(guest) => Some((guest, Instant::now())),
                    Err(e @ RuntimeError::NotRunning { state, .. }) if state.is_terminal() => {
                        return Err(not_ready(NotReady::Ended(state), e.to_string()))
                    }
                    Err(e) => {
                        last = e.to_string();
                        None
                    }
                };
            }
            if let Some((guest, _)) = &opened {
                match guest.call(&probe, &[], PROBE_TIMEOUT) {
                    Ok(_) => return Ok(guest.clone()),
                    Err(e) => last = e.to_string(),
                }
            }
            if let Some(why) = self.give_up.as_mut().and_then(|give_up| give_up()) {
                return Err(not_ready(NotReady::GaveUp(why), last));
            }
            if Instant::now() > deadline {
                return Err(not_ready(NotReady::TimedOut, last));
            }
            std::thread::sleep(if opened.is_some() { self.ready.poll } else { REOPEN_POLL });
        }
    }
}
