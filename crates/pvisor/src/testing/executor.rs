//! The recording fake executor: [`Script`]s played one per start, and the
//! live sandboxes a working [`super::FakeCheckpointer`] suspends.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pvisor_sandbox::{
    Executor, ExitReport, SandboxError, SandboxProcess, SandboxSpec, Signaller, Termination, Usage,
};
use pvisor_vm::ExecCheckpoint;

use super::lock;

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

/// What reaches a running fake sandbox: a signal, or a suspension (its
/// Attempt then ends `Suspended` to the checkpoint).
#[derive(Debug)]
pub(super) enum Control {
    Signal(i32),
    Suspend(Box<ExecCheckpoint>),
}

/// A running fake sandbox, found by its Run's directory (the parent of its
/// stage and of its Attempt directories): one live Attempt per Run.
#[derive(Debug, Clone)]
pub(super) struct LiveSandbox {
    pub(super) control: mpsc::Sender<Control>,
    pub(super) workspace: PathBuf,
}

type LiveSandboxes = Arc<Mutex<HashMap<PathBuf, LiveSandbox>>>;

/// The recording fake executor (backend name `fake`).
#[derive(Debug, Default)]
pub struct FakeExecutor {
    scripts: Mutex<VecDeque<Script>>,
    /// Played once `scripts` is used up (exit 0 when unset).
    fallback: Mutex<Option<Script>>,
    journal: Arc<Mutex<Journal>>,
    live: LiveSandboxes,
    /// The executor name Jobs are placed under (`fake` unless set).
    name: Option<&'static str>,
}

impl FakeExecutor {
    /// Plays `scripts` in order, one per start; then exits 0.
    pub fn new(scripts: impl IntoIterator<Item = Script>) -> Arc<Self> {
        Arc::new(Self { scripts: Mutex::new(scripts.into_iter().collect()), ..Self::default() })
    }

    /// Plays `script` at every start the queue has no script for (a keeper
    /// that runs until signalled, for a frontend that boots, suspends and
    /// resumes a VM any number of times).
    pub fn always(script: Script) -> Arc<Self> {
        Arc::new(Self { fallback: Mutex::new(Some(script)), ..Self::default() })
    }

    /// [`Self::always`], placing Jobs under the executor name `name` (`vm`:
    /// admitted as vm Jobs are, a sandbox image's rootfs as workspace).
    pub fn always_as(name: &'static str, script: Script) -> Arc<Self> {
        Arc::new(Self { fallback: Mutex::new(Some(script)), name: Some(name), ..Self::default() })
    }

    /// Queues one more script.
    pub fn push(&self, script: Script) {
        lock(&self.scripts).push_back(script);
    }

    /// The running fake sandbox of the Run whose Attempt directory is `attempt_dir`.
    pub(super) fn live_of(&self, attempt_dir: &Path) -> Option<LiveSandbox> {
        lock(&self.live).get(&run_dir_of_attempt(attempt_dir)).cloned()
    }

    pub fn journal(&self) -> std::sync::MutexGuard<'_, Journal> {
        lock(&self.journal)
    }
}

impl Executor for FakeExecutor {
    fn name(&self) -> &'static str {
        self.name.unwrap_or("fake")
    }

    fn start(&self, spec: &SandboxSpec) -> Result<Box<dyn SandboxProcess>, SandboxError> {
        let queued = lock(&self.scripts).pop_front();
        let script = queued.or_else(|| lock(&self.fallback).clone()).unwrap_or_else(|| Script::exits(0, &[]));
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
        // The stage is `<run>/stage/upper`: the Run's directory keys it.
        let run_dir = spec.upper.parent().and_then(Path::parent).map(Path::to_owned).unwrap_or_default();
        if matches!(script.end, End::UntilSignalled { .. }) {
            let live = LiveSandbox { control: tx.clone(), workspace: spec.workspace.clone() };
            lock(&self.live).insert(run_dir.clone(), live);
        }
        let journal = self.journal.clone();
        let signaller = Signaller::custom(Arc::new(move |signal| {
            lock(&journal).signals.push(signal);
            // The sandbox may be gone already: a late signal is not an error.
            let _ = tx.send(Control::Signal(signal));
            Ok(())
        }));
        let registration = (self.live.clone(), run_dir);
        Ok(Box::new(FakeProcess { script, control: rx, signaller, registration }))
    }
}

/// `<run>/attempts/<n>` → `<run>`.
pub(super) fn run_dir_of_attempt(attempt_dir: &Path) -> PathBuf {
    attempt_dir.parent().and_then(Path::parent).map(Path::to_owned).unwrap_or_default()
}

#[derive(Debug)]
struct FakeProcess {
    script: Script,
    control: mpsc::Receiver<Control>,
    signaller: Signaller,
    registration: (LiveSandboxes, PathBuf),
}

impl SandboxProcess for FakeProcess {
    fn signaller(&self) -> Signaller {
        self.signaller.clone()
    }

    fn wait(self: Box<Self>) -> Result<ExitReport, SandboxError> {
        let termination = match self.script.end {
            End::Now(t) => t,
            End::UntilSignalled { dies_of } => loop {
                match self.control.recv_timeout(Duration::from_secs(60)) {
                    Ok(Control::Signal(s)) if s == libc::SIGKILL || dies_of.contains(&s) => {
                        break Termination::Signaled(s)
                    }
                    Ok(Control::Signal(_)) => {}
                    Ok(Control::Suspend(checkpoint)) => {
                        break Termination::Suspended { checkpoint, qemu: "the fake VM stopped".into() }
                    }
                    Err(_) => break Termination::Vanished { detail: "the fake was never signalled".into() },
                }
            },
            End::SetupFails { .. } => unreachable!("a setup failure never starts"),
        };
        let (live, run_dir) = &self.registration;
        lock(live).remove(run_dir);
        Ok(ExitReport {
            termination,
            usage: Usage::default(),
            oom_killed: self.script.oom_killed,
            interrupted_at_terminal: false,
            stage_error: self.script.stage_error,
        })
    }
}
