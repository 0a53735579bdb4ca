//! A container's VM: one pvisor vm Job, started and ended through the
//! runtime's action API ([`pvisor::Runtime::execute`]), exactly as `pvisor
//! serve` runs a sandbox: the Job's Operation is a keeper that holds the VM
//! up, and the container's processes are guest execs chrooted into the
//! container's rootfs (the Job's workspace, seen at its host path).
//!
//! The shim process is the Job's supervisor: the Session runs as a task on
//! the shim's Tokio runtime, so the VM lives exactly as long as the shim
//! serves the container, and a shim that dies takes its VM with it (the
//! Job's receipt then says so honestly, as for any crashed supervisor).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use pvisor::actions::guest::{CapabilityError, ExecChannel, ExecSpec, TerminalSize};
use pvisor::actions::guest::{Reply, Request};
use pvisor::actions::{
    CheckpointExecution, Guest, Held, Hold, HoldGuest, Keeper, Kill, NotReady, NoteInTrace, Readiness,
    ReleaseStorage, Status, Suspend,
};
use pvisor::{CancelHandle, Killed, RunEnd, Runtime, RuntimeError};
use pvisor_core::ids::{AttemptId, JobId};
use pvisor_core::labels::Labels;
use pvisor_core::records::{ResourceLimits, SharedDirectory};
use pvisor_net::{Mode, PolicySpec, Scope, ScopedPolicy};

use crate::spec::{ProcessSpec, Root};

mod phase;

use phase::{IllegalMove, Phase, Stage};

/// The Job's Operation: it only keeps the VM up (the container's own
/// process is a guest exec, so its stdio and exit are relayed exactly).
/// How long a VM may take to boot (TCG is slow) before create fails.
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// How long leaving the exit status in the guest may take.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the Job's keeper gets between SIGTERM and SIGKILL on delete.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// How long delete waits for the Job's supervisor task to finish it.
const END_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one agent call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a booting VM's guest is probed.
const READY_POLL: Duration = Duration::from_millis(5);
/// The first exec id: the Attempt's own command is id 1.
const FIRST_EXEC_ID: u32 = 2;

#[derive(Debug)]
struct State {
    phase: Phase,
    /// The current generation's run and guest.
    cancel: Option<CancelHandle>,
    guest: Option<Guest>,
    /// The live generation's end, once its Session has published it.
    generation_end: Option<String>,
}

/// What of the host a container's VM takes besides its rootfs.
#[derive(Debug, Default)]
pub struct HostAttachments {
    /// The pod's network namespace, whose interface the VM's NIC takes over.
    pub network_namespace: Option<PathBuf>,
    /// Read-write volumes the guest mounts live (virtiofs).
    pub shared_directories: Vec<SharedDirectory>,
}

/// A container's VM: one Job, one generation (Attempt) per boot or resume.
#[derive(Debug)]
pub struct Vm {
    runtime: Runtime,
    tokio: tokio::runtime::Handle,
    job: JobId,
    rootfs: PathBuf,
    state: Arc<(Mutex<State>, Condvar)>,
    next_exec: AtomicU32,
}

impl State {
    /// Moves to `to` if the table allows it from where the VM stands.
    fn move_to(&mut self, to: Phase) -> Result<(), IllegalMove> {
        self.phase.move_to(to)
    }

    /// [`move_to`](Self::move_to) where a refusal is not the caller's
    /// error: it is logged, and the VM stays where it stands.
    fn move_or_log(&mut self, to: Phase) {
        if let Err(e) = self.move_to(to) {
            log::warn!("{e}; it stays {:?}", self.phase);
        }
    }
}

impl Vm {
    /// Admits the container's Job over `rootfs` and waits until its guest
    /// answers. `tokio` runs the Job's Session.
    pub fn boot(
        runtime: &Runtime,
        tokio: &tokio::runtime::Handle,
        container: &str,
        rootfs: PathBuf,
        limits: ResourceLimits,
        labels: Labels,
        host: HostAttachments,
    ) -> Result<Vm, VmError> {
        let keeper = keeper(container, rootfs.clone(), limits, labels, host);
        let hold = Hold::New { keeper: Box::new(keeper), backend: "vm".into() };
        let held = {
            let _inside = tokio.enter();
            runtime
                .execute(HoldGuest { hold, ready: Some(readiness(&rootfs)) })
                .map_err(|e| not_held(runtime, e))?
        };
        let job = held.job().clone();
        log::info!("container {container} is Job {job} (workspace {})", rootfs.display());
        let state = State { phase: Phase::Starting, cancel: None, guest: None, generation_end: None };
        let vm = Vm {
            runtime: runtime.clone(),
            tokio: tokio.clone(),
            job,
            rootfs,
            state: Arc::new((Mutex::new(state), Condvar::new())),
            next_exec: AtomicU32::new(FIRST_EXEC_ID),
        };
        vm.adopt(held);
        Ok(vm)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves the VM to `phase` (see [`State::move_or_log`]) and wakes
    /// whoever waits on it.
    fn set(&self, phase: Phase) {
        self.lock().move_or_log(phase);
        self.state.1.notify_all();
    }

    /// Watches a new generation whose guest answers; the VM is then live.
    fn adopt(&self, held: Held) {
        let Held { mut run, guest } = held;
        let cancel = run.cancel_handle();
        // Stopped while it was starting: the new generation is ended at
        // once, and the waiting stop returns with its end.
        let stopped = {
            let mut state = self.lock();
            state.generation_end = None;
            state.cancel = Some(cancel.clone());
            state.guest = guest;
            matches!(state.phase, Phase::Ended { .. })
        };
        let state = self.state.clone();
        self.tokio.spawn(async move {
            let summary = match run.wait().await {
                Ok(RunEnd::Finished(o)) => format!("ended {}", o.result.summary()),
                Ok(RunEnd::Suspended(s)) => format!("suspended to {}", s.checkpoint.id),
                Err(e) => format!("failed: {e}"),
            };
            let mut locked = state.0.lock().unwrap_or_else(|p| p.into_inner());
            // A generation that ends while live (not paused) ends the VM.
            if matches!(locked.phase.stage(), Stage::Live | Stage::Ending) {
                locked.move_or_log(Phase::Ended { summary: Some(summary.clone()) });
            }
            locked.generation_end = Some(summary);
            state.1.notify_all();
        });
        if stopped {
            cancel.cancel(rustix::process::Signal::TERM.as_raw());
        } else {
            self.set(Phase::Live);
        }
    }

    pub fn job(&self) -> &JobId {
        &self.job
    }

    /// Leaves the container's exit status where the Job's keeper ends with
    /// it when the VM is stopped (see [`KEEPER`](pvisor::actions::guest::KEEPER)),
    /// so the Job's result carries the container's status rather than the
    /// keeper's signal. A VM that is not live keeps none, which is logged.
    pub fn leave_exit_status(&self, status: u32) {
        use pvisor::actions::guest::{FileOp, KEEPER_EXIT};
        let path = format!("{KEEPER_EXIT}.{status}").into();
        let left = self.guest_now().map_err(|e| e.to_string()).and_then(|guest| {
            let request = Request::FileOp { root: "/".into(), op: FileOp::Mkdir { path, mode: 0o700 } };
            match guest.call(&request, &[], LEAVE_TIMEOUT) {
                Ok((Reply::Done { .. }, _)) => Ok(()),
                Ok((other, _)) => Err(format!("the guest answered {other:?}")),
                Err(e) => Err(e.to_string()),
            }
        });
        if let Err(e) = left {
            log::warn!("Job {}: its result will not carry the exit status {status}: {e}", self.job);
        }
    }

    /// Has the Job's Trace record a process containerd ran (a
    /// `frontend.command` event), waiting for the record so that notes
    /// keep their order. A VM that is not running (paused, ended) takes no
    /// note, which is logged.
    pub fn note(&self, note: pvisor::FrontendNote) {
        if let Err(e) = self.runtime.execute(NoteInTrace { job: self.job.clone(), note }) {
            log::warn!("Job {}: a process is missing from the Trace: {e}", self.job);
        }
    }

    /// The live guest, waiting out a pause or resume in progress; `None`
    /// once the VM has ended.
    pub fn live_guest(&self) -> Option<Guest> {
        let mut state = self.lock();
        loop {
            match &state.phase {
                Phase::Live => return state.guest.clone(),
                Phase::Ended { .. } => return None,
                Phase::Starting | Phase::Pausing | Phase::Paused { .. } => {
                    state = self.state.1.wait(state).unwrap_or_else(|p| p.into_inner());
                }
            }
        }
    }

    /// The live guest now, or why there is none.
    fn guest_now(&self) -> Result<Guest, ExecError> {
        let state = self.lock();
        match (&state.phase, &state.guest) {
            (Phase::Live, Some(guest)) => Ok(guest.clone()),
            (phase, _) if phase.is_paused() => Err(ExecError::Paused),
            _ => Err(ExecError::Guest(GuestUnreachable::Ended)),
        }
    }

    /// Paused, or being paused or resumed.
    pub fn is_paused(&self) -> bool {
        self.lock().phase.is_paused()
    }

    /// The checkpoint the VM is suspended to, while paused.
    pub fn paused(&self) -> Option<String> {
        match &self.lock().phase {
            Phase::Paused { checkpoint } => Some(checkpoint.clone()),
            _ => None,
        }
    }

    /// Starts `process` chrooted into its root (see [`Root`]); returns the channel (first reply
    /// already read), the Attempt it reaches, the exec id and the guest pid.
    pub fn exec(
        &self,
        process: &ProcessSpec,
        terminal: Option<TerminalSize>,
    ) -> Result<(ExecChannel, AttemptId, u32, u32), ExecError> {
        let guest = self.guest_now()?;
        let id = self.next_exec.fetch_add(1, Ordering::Relaxed);
        let spec = ExecSpec {
            id,
            argv: process.argv.clone(),
            env: process.env.clone(),
            cwd: process.cwd.clone(),
            root: match &process.root {
                Root::Workspace => Some(self.rootfs.clone()),
                Root::Guest => None,
                Root::At(dir) => Some(dir.clone()),
            },
            output: None,
            terminal,
            confinement: process.confinement.clone(),
        };
        let mut channel = guest.exec(spec).map_err(|e| ExecError::Guest(e.into()))?;
        match channel.next_reply() {
            Ok(Some((Reply::Started { pid, .. }, _))) => {
                Ok((channel, guest.attempt().clone(), id, pid.max(0) as u32))
            }
            Ok(Some((Reply::ExecFailed { errno, message, .. }, _))) => {
                let program = process.argv.first().cloned().unwrap_or_default();
                Err(ExecError::Failed { program, errno, message })
            }
            Ok(other) => Err(ExecError::Guest(GuestUnreachable::Answered(format!("{other:?}")))),
            Err(e) => Err(ExecError::Guest(e.into())),
        }
    }

    /// Signals exec `id`'s process group. Through an agent call, not the
    /// exec's own channel, so it reaches a process across a pause.
    pub fn signal(&self, id: u32, signal: i32) -> Result<(), ExecError> {
        let request = Request::Signal { id, signal };
        self.guest_now()?.call(&request, &[], CALL_TIMEOUT).map(drop).map_err(|e| ExecError::Guest(e.into()))
    }

    /// Sets the window size of exec `id`'s terminal (an agent call, like
    /// [`signal`](Self::signal)).
    pub fn resize(&self, id: u32, size: TerminalSize) -> Result<(), ExecError> {
        let request = Request::Resize { id, size };
        self.guest_now()?.call(&request, &[], CALL_TIMEOUT).map(drop).map_err(|e| ExecError::Guest(e.into()))
    }

    /// Exec `id`'s exit status once it has exited (`None` while it runs),
    /// asked of the guest: for a process whose channel is gone and cannot
    /// be attached to again.
    pub fn exit_status(&self, guest: &Guest, id: u32) -> Result<Option<u32>, VmError> {
        match guest.call(&Request::Status { id }, &[], CALL_TIMEOUT)? {
            (Reply::Status { running: true, .. }, _) => Ok(None),
            (Reply::Status { code, signal, .. }, _) => Ok(Some(status_of(code, signal))),
            (other, _) => Err(VmError::Answered(format!("{other:?}"))),
        }
    }

    /// A file of the guest itself (not the container's root), such as
    /// `/proc/meminfo`.
    pub fn read_guest_file(&self, path: &str) -> Result<String, VmError> {
        let request = Request::ReadFile { path: path.into(), offset: 0, len: Some(1 << 20) };
        let guest = self.guest_now()?;
        let (_, bytes) = guest.call(&request, &[], CALL_TIMEOUT)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Saves the VM's execution state; it keeps running. While paused, the
    /// suspension's checkpoint is the answer.
    pub fn checkpoint(&self) -> Result<String, VmError> {
        if let Some(checkpoint) = self.paused() {
            return Ok(checkpoint);
        }
        let saved = self.runtime.execute(CheckpointExecution { job: self.job.clone() })?;
        Ok(saved.id.to_string())
    }

    /// Suspends the VM (execution suspend: saved, then stopped; the Job is
    /// `suspended`). Its processes are kept in the saved state.
    pub fn pause(&self) -> Result<String, VmError> {
        self.lock().move_to(Phase::Pausing).map_err(|_| VmError::NotRunning)?;
        match self.runtime.execute(Suspend { job: self.job.clone() }) {
            Ok(saved) => {
                self.set(Phase::Paused { checkpoint: saved.id.to_string() });
                Ok(saved.id.to_string())
            }
            Err(e) => {
                // Still running if the save failed before the stop.
                let ended = self.lock().generation_end.clone();
                self.set(match ended {
                    Some(summary) => Phase::Ended { summary: Some(summary) },
                    None => Phase::Live,
                });
                Err(e.into())
            }
        }
    }

    /// Resumes the suspended VM: a new Attempt of the same Job, restored
    /// from the suspension's checkpoint.
    pub fn resume(&self) -> Result<(), VmError> {
        let (checkpoint, suspended_end) = {
            let mut state = self.lock();
            let Phase::Paused { checkpoint } = &state.phase else { return Err(VmError::NotPaused) };
            let checkpoint = checkpoint.clone();
            state.move_to(Phase::Starting).map_err(|_| VmError::NotPaused)?;
            // The suspended generation's end is not the new one's: a stop
            // while starting waits for the new generation (see `adopt`).
            (checkpoint, state.generation_end.take())
        };
        let held = {
            let _inside = self.tokio.enter();
            let hold = Hold::Resume(self.job.clone());
            self.runtime.execute(HoldGuest { hold, ready: Some(readiness(&self.rootfs)) })
        };
        match held {
            Ok(held) => {
                self.adopt(held);
                Ok(())
            }
            Err(e @ RuntimeError::GuestNotReady { .. }) => {
                let e = not_held(&self.runtime, e);
                self.set(Phase::Ended { summary: Some(e.to_string()) });
                Err(e)
            }
            Err(e) => {
                // Still suspended: a stop that came meanwhile ends with that.
                self.lock().generation_end = suspended_end;
                self.set(Phase::Paused { checkpoint });
                Err(e.into())
            }
        }
    }

    /// Removes what the ended Job keeps on disk (its stage, VM disks and
    /// execution checkpoints): a deleted container is gone for good.
    pub fn release(&self) {
        release(&self.runtime, &self.job);
    }

    /// Ends the Job (SIGTERM to the keeper, SIGKILL after its grace) and
    /// waits until its Session has recorded the end. The shim is the Job's
    /// supervisor, so it cancels its own live run (the `Kill` action would
    /// signal the supervisor, that is, the shim itself); a paused Job has no
    /// supervisor, and `Kill` closes it.
    pub fn stop(&self) -> Result<String, VmError> {
        let (previous, cancel) = {
            let mut state = self.lock();
            let previous = state.phase.stage();
            if let Phase::Ended { summary: Some(summary) } = &state.phase {
                return Ok(summary.clone());
            }
            state.move_or_log(Phase::Ended { summary: None });
            (previous, state.cancel.clone())
        };
        match previous {
            Stage::Live => {
                if let Some(cancel) = cancel {
                    cancel.cancel(rustix::process::Signal::TERM.as_raw());
                }
            }
            Stage::Paused => {
                let killed = self.runtime.execute(Kill { job: self.job.clone(), grace: KILL_GRACE });
                let summary = match killed {
                    Ok(Killed::AlreadyEnded(state) | Killed::Ended { state, .. }) => {
                        format!("closed while paused: {state}")
                    }
                    Err(e) => format!("could not be closed while paused: {e}"),
                };
                self.set(Phase::Ended { summary: Some(summary.clone()) });
                return Ok(summary);
            }
            Stage::Starting | Stage::Pausing | Stage::Ending | Stage::Ended => {}
        }
        self.state.1.notify_all();
        let deadline = Instant::now() + END_TIMEOUT;
        let mut state = self.lock();
        loop {
            if let Phase::Ended { summary: Some(summary) } = &state.phase {
                return Ok(summary.clone());
            }
            if let Some(summary) = state.generation_end.clone() {
                state.move_or_log(Phase::Ended { summary: Some(summary.clone()) });
                self.state.1.notify_all();
                return Ok(summary);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(VmError::EndTimeout { job: self.job.clone(), seconds: END_TIMEOUT.as_secs() });
            }
            state = self.state.1.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

/// Releases an ended Job's storage, saying what it could not remove.
pub fn release(runtime: &Runtime, job: &JobId) {
    match runtime.execute(ReleaseStorage { job: job.clone() }) {
        Ok(released) => {
            for warning in released.warnings {
                log::warn!("Job {job}: {warning}");
            }
        }
        Err(e) => log::warn!("cannot release the storage of Job {job}: {e}"),
    }
}

/// containerd's exit status: the code, or 128 + the signal.
pub fn status_of(code: Option<i32>, signal: Option<i32>) -> u32 {
    match (code, signal) {
        (_, Some(signal)) => 128 + signal.max(0) as u32,
        (Some(code), None) => code.max(0) as u32,
        (None, None) => crate::process::LOST,
    }
}

/// Why a process did not start.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The guest could not be reached.
    #[error("the container's VM is unreachable: {0}")]
    Guest(#[source] GuestUnreachable),
    /// The guest could not start `program` (`errno`: ENOENT for a
    /// missing one, which runc reports the same way).
    #[error("cannot start {program:?} in the container: {message}")]
    Failed { program: String, errno: i32, message: String },
    /// The container is paused.
    #[error("the container is paused; resume it first")]
    Paused,
}

/// Why the guest could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum GuestUnreachable {
    #[error(transparent)]
    Capability(#[from] CapabilityError),
    #[error(transparent)]
    Channel(#[from] std::io::Error),
    #[error("the guest answered {0}")]
    Answered(String),
    #[error("the container's VM has ended")]
    Ended,
}

/// Why an operation on the container's VM failed. The texts are what
/// containerd's clients see.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("the Job was not admitted: {0}")]
    NotAdmitted(#[source] RuntimeError),
    #[error(transparent)]
    Guest(#[from] CapabilityError),
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("the guest answered {0}")]
    Answered(String),
    #[error("Job {job} ended before its VM was ready: {summary}\n(its whole record: `pvisor events {job}`)")]
    EndedBeforeReady { job: JobId, summary: String },
    #[error("the VM of Job {job} was not ready after {seconds} s: {last}")]
    NotReady { job: JobId, seconds: u64, last: String },
    #[error("the container's VM is not running")]
    NotRunning,
    #[error("the container is not paused")]
    NotPaused,
    #[error("Job {job} did not end within {seconds} s")]
    EndTimeout { job: JobId, seconds: u64 },
}

/// The Job that holds a container's VM up.
fn keeper(
    container: &str,
    workspace: PathBuf,
    limits: ResourceLimits,
    labels: Labels,
    host: HostAttachments,
) -> Keeper {
    Keeper {
        workspace,
        limits,
        labels,
        // No pvisor policy: a container has its namespace's network (the
        // pod's, through the VM's NIC), or none at all.
        network: vec![ScopedPolicy {
            scope: Scope::CommandLine,
            source: format!("containerd-shim-pvisor-v1 (container {container})"),
            spec: PolicySpec { mode: Some(Mode::None), allow: Vec::new(), deny: Vec::new(), ordered: None },
        }],
        network_namespace: host.network_namespace,
        shared_directories: host.shared_directories,
        kill_grace: KILL_GRACE,
    }
}

/// Up once the guest answers a file operation in the container's rootfs.
fn readiness(rootfs: &std::path::Path) -> Readiness {
    Readiness { root: rootfs.to_owned(), timeout: READY_TIMEOUT, poll: READY_POLL }
}

/// Why a generation did not come up, as containerd is told: a Job that
/// ended says how and why (its recorded error and hint), which is what
/// `ctr` and `kubectl describe pod` then show.
fn not_held(runtime: &Runtime, e: RuntimeError) -> VmError {
    match e {
        RuntimeError::GuestNotReady { job, why: NotReady::Ended(state), .. } => {
            let summary = match runtime.execute(Status { job: job.clone() }) {
                Ok(s) => {
                    pvisor_core::records::summary(s.state.as_str(), s.exit_code, s.signal, s.error.as_deref())
                }
                Err(_) => state.to_string(),
            };
            VmError::EndedBeforeReady { job, summary }
        }
        RuntimeError::GuestNotReady { job, last, .. } => {
            VmError::NotReady { job, seconds: READY_TIMEOUT.as_secs(), last }
        }
        other => VmError::NotAdmitted(other),
    }
}
