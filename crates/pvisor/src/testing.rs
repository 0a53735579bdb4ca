//! A recording fake backend for unit tests of the runtime: admission, the
//! Session, the Job service, recovery, kill, gc and the action API, without
//! namespaces, overlays or VMs.
//!
//! [`FakeExecutor::start`] plays the next [`Script`]: it writes the
//! script's files into the stage's upper directory (as an overlay would
//! when a command writes), then ends the way the script says — at once, or
//! only when signalled. Every start and every signal is recorded, so a test
//! asserts what the runtime asked of the backend, not only what it wrote.
//! [`FakeBackends`] serves it under the backend name `fake`, optionally
//! with a [`FakeCheckpointer`] for the execution-checkpoint paths.
//!
//! What only real processes can show (isolation, overlay semantics, QEMU)
//! stays in the end-to-end suite.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pvisor_sandbox::capabilities::{CapabilityError, Checkpointable, GuestAccess};
use pvisor_sandbox::{
    Executor, ExitReport, SandboxError, SandboxProcess, SandboxSpec, Signaller, Termination, Usage,
};
use pvisor_vm::ExecCheckpoint;

use crate::backends::Backends;

/// How one fake sandbox behaves.
#[derive(Clone, Debug)]
pub struct Script {
    /// Files written into the upper layer, relative to the workspace.
    pub writes: Vec<(PathBuf, Vec<u8>)>,
    pub end: End,
    /// Reported with the exit.
    pub oom_killed: bool,
    pub stage_error: Option<String>,
}

/// How a fake sandbox ends.
#[derive(Clone, Debug)]
pub enum End {
    /// Ends at once like this.
    Now(Termination),
    /// Runs until signalled; dies of the first signal in `dies_of`
    /// (`Signaled`), ignoring the others. `SIGKILL` always kills.
    UntilSignalled { dies_of: Vec<i32> },
    /// `start` fails with this setup step and message.
    SetupFails { step: String, message: String, hint: Option<String> },
}

impl Script {
    /// Exits with `code` after writing `writes`.
    pub fn exits(code: i32, writes: &[(&str, &str)]) -> Self {
        Self {
            writes: writes.iter().map(|(p, c)| (PathBuf::from(p), c.as_bytes().to_vec())).collect(),
            end: End::Now(Termination::Exited(code)),
            oom_killed: false,
            stage_error: None,
        }
    }

    /// Ends at once with `termination`.
    pub fn ends(termination: Termination) -> Self {
        Self { end: End::Now(termination), ..Self::exits(0, &[]) }
    }

    /// Runs until one of `dies_of` (or SIGKILL) arrives.
    pub fn runs_until(dies_of: &[i32]) -> Self {
        Self { end: End::UntilSignalled { dies_of: dies_of.to_vec() }, ..Self::exits(0, &[]) }
    }

    /// Fails to set up at `step`.
    pub fn setup_fails(step: &str, message: &str) -> Self {
        Self {
            end: End::SetupFails { step: step.into(), message: message.into(), hint: Some("a hint".into()) },
            ..Self::exits(0, &[])
        }
    }
}

/// What the runtime asked of the fake.
#[derive(Debug, Default)]
pub struct Journal {
    pub started: Vec<SandboxSpec>,
    pub signals: Vec<i32>,
}

/// The recording fake executor (backend name `fake`).
#[derive(Debug, Default)]
pub struct FakeExecutor {
    scripts: Mutex<VecDeque<Script>>,
    journal: Arc<Mutex<Journal>>,
}

impl FakeExecutor {
    /// Plays `scripts` in order, one per start; then exits 0.
    pub fn new(scripts: impl IntoIterator<Item = Script>) -> Arc<Self> {
        Arc::new(Self { scripts: Mutex::new(scripts.into_iter().collect()), journal: Arc::default() })
    }

    /// Queues one more script.
    pub fn push(&self, script: Script) {
        lock(&self.scripts).push_back(script);
    }

    pub fn journal(&self) -> std::sync::MutexGuard<'_, Journal> {
        lock(&self.journal)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Executor for FakeExecutor {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn start(&self, spec: &SandboxSpec) -> Result<Box<dyn SandboxProcess>, SandboxError> {
        let script = lock(&self.scripts).pop_front().unwrap_or_else(|| Script::exits(0, &[]));
        lock(&self.journal).started.push(spec.clone());
        if let End::SetupFails { step, message, hint } = &script.end {
            return Err(SandboxError::Setup {
                step: step.clone(),
                message: message.clone(),
                hint: hint.clone(),
            });
        }
        for (path, contents) in &script.writes {
            let target = spec.upper.join(path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(SandboxError::Spawn)?;
            }
            std::fs::write(&target, contents).map_err(SandboxError::Spawn)?;
        }
        let (tx, rx) = mpsc::channel();
        let journal = self.journal.clone();
        let signaller = Signaller::custom(Arc::new(move |signal| {
            lock(&journal).signals.push(signal);
            // The sandbox may be gone already: a late signal is not an error.
            let _ = tx.send(signal);
            Ok(())
        }));
        Ok(Box::new(FakeProcess { script, signals: rx, signaller }))
    }
}

#[derive(Debug)]
struct FakeProcess {
    script: Script,
    signals: mpsc::Receiver<i32>,
    signaller: Signaller,
}

impl SandboxProcess for FakeProcess {
    fn signaller(&self) -> Signaller {
        self.signaller.clone()
    }

    fn wait(self: Box<Self>) -> Result<ExitReport, SandboxError> {
        let termination = match self.script.end {
            End::Now(t) => t,
            End::UntilSignalled { dies_of } => loop {
                match self.signals.recv_timeout(Duration::from_secs(60)) {
                    Ok(s) if s == libc::SIGKILL || dies_of.contains(&s) => break Termination::Signaled(s),
                    Ok(_) => {}
                    Err(_) => break Termination::Vanished { detail: "the fake was never signalled".into() },
                }
            },
            End::SetupFails { .. } => unreachable!("a setup failure never starts"),
        };
        Ok(ExitReport {
            termination,
            usage: Usage::default(),
            oom_killed: self.script.oom_killed,
            interrupted_at_terminal: false,
            stage_error: self.script.stage_error,
        })
    }
}

/// A fake [`Checkpointable`] + [`GuestAccess`] that answers every request
/// with the configured failure, and records which Attempt directory it was
/// asked about.
#[derive(Debug, Default)]
pub struct FakeCheckpointer {
    pub asked: Mutex<Vec<PathBuf>>,
}

impl FakeCheckpointer {
    fn refuse(&self, attempt_dir: &Path) -> CapabilityError {
        lock(&self.asked).push(attempt_dir.to_owned());
        CapabilityError::Failed("the fake backend refuses".into())
    }
}

impl Checkpointable for FakeCheckpointer {
    fn checkpoint(&self, attempt_dir: &Path, _: Duration) -> Result<ExecCheckpoint, CapabilityError> {
        Err(self.refuse(attempt_dir))
    }

    fn suspend(&self, attempt_dir: &Path, _: Duration) -> Result<ExecCheckpoint, CapabilityError> {
        Err(self.refuse(attempt_dir))
    }

    fn restorer(&self, _: &Path, _: &ExecCheckpoint) -> Result<Arc<dyn Executor>, SandboxError> {
        Err(SandboxError::Protocol("the fake backend cannot restore".into()))
    }
}

impl GuestAccess for FakeCheckpointer {
    fn exec(
        &self,
        attempt_dir: &Path,
        _: pvisor_vm::guest::ExecSpec,
    ) -> Result<pvisor_vm::guest::ExecChannel, CapabilityError> {
        Err(self.refuse(attempt_dir))
    }

    fn attach(&self, attempt_dir: &Path, _: u32) -> Result<pvisor_vm::guest::ExecChannel, CapabilityError> {
        Err(self.refuse(attempt_dir))
    }

    fn call(
        &self,
        attempt_dir: &Path,
        _: &pvisor_sandbox::capabilities::Request,
        _: &[u8],
        _: Duration,
    ) -> Result<(pvisor_sandbox::capabilities::Reply, Vec<u8>), CapabilityError> {
        Err(self.refuse(attempt_dir))
    }

    fn connect(&self, attempt_dir: &Path, _: u16) -> Result<std::os::unix::net::UnixStream, CapabilityError> {
        Err(self.refuse(attempt_dir))
    }
}

/// Backends with only `fake`, with or without the capabilities.
#[derive(Debug)]
pub struct FakeBackends {
    pub executor: Arc<FakeExecutor>,
    pub capabilities: Option<Arc<FakeCheckpointer>>,
}

impl Backends for FakeBackends {
    fn executor(&self, name: &str) -> Option<Arc<dyn Executor>> {
        (name == "fake").then(|| self.executor.clone() as Arc<dyn Executor>)
    }

    fn checkpointable(&self, name: &str) -> Option<Arc<dyn Checkpointable>> {
        self.capabilities.clone().filter(|_| name == "fake").map(|c| c as Arc<dyn Checkpointable>)
    }

    fn guest_access(&self, name: &str) -> Option<Arc<dyn GuestAccess>> {
        self.capabilities.clone().filter(|_| name == "fake").map(|c| c as Arc<dyn GuestAccess>)
    }
}
