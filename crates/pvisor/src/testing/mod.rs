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
//! with a [`FakeCheckpointer`] for the execution-checkpoint paths: one that
//! refuses every request ([`FakeCheckpointer::default`]), or one that works
//! ([`FakeCheckpointer::working`]): it writes real, verifiable execution
//! checkpoints, suspends a running fake sandbox (its Attempt ends
//! `Suspended`), restores on the same fake executor (a resume or an
//! execution fork is a new Attempt that plays the next script), and serves
//! a [`FakeGuest`]: guest execs with scripted output and exit codes, and
//! agent calls (file operations, reads, writes, signals, status) answered
//! from the host paths the requests name, as a guest would see them.
//!
//! What only real processes can show (isolation, overlay semantics, QEMU)
//! stays in the end-to-end suite.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pvisor_agent_proto::{read_frame, write_frame, EntryKind, FileOp, FileStat, Reply, Request};
use pvisor_core::ids::CheckpointId;
use pvisor_core::time::Timestamp;
use pvisor_vm::checkpoint::{CheckpointFile, KIND, LOWER, MANIFEST, STATE, UPPER};
use pvisor_vm::guest::{ExecChannel, ExecSpec};

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

/// What reaches a running fake sandbox: a signal, or a suspension (its
/// Attempt then ends `Suspended` to the checkpoint).
#[derive(Debug)]
enum Control {
    Signal(i32),
    Suspend(Box<ExecCheckpoint>),
}

/// A running fake sandbox, found by its Run's directory (the parent of its
/// stage and of its Attempt directories): one live Attempt per Run.
#[derive(Debug, Clone)]
struct LiveSandbox {
    control: mpsc::Sender<Control>,
    workspace: PathBuf,
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
    fn live_of(&self, attempt_dir: &Path) -> Option<LiveSandbox> {
        lock(&self.live).get(&run_dir_of_attempt(attempt_dir)).cloned()
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
fn run_dir_of_attempt(attempt_dir: &Path) -> PathBuf {
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

/// A fake [`Checkpointable`] + [`GuestAccess`]. [`Default`] answers every
/// request with a failure and records which Attempt directory it was asked
/// about; [`FakeCheckpointer::working`] does what a vm backend does, on the
/// fake executor's sandboxes and a [`FakeGuest`].
#[derive(Debug, Default)]
pub struct FakeCheckpointer {
    pub asked: Mutex<Vec<PathBuf>>,
    working: Option<Working>,
}

#[derive(Debug)]
struct Working {
    executor: Arc<FakeExecutor>,
    guest: Arc<FakeGuest>,
}

impl FakeCheckpointer {
    /// Checkpoints, suspends and restores the sandboxes `executor` runs
    /// (a script that runs until signalled is a live VM), and serves a
    /// [`FakeGuest`] that runs every exec as exit 0.
    pub fn working(executor: &Arc<FakeExecutor>) -> Self {
        Self::working_with(executor, Arc::new(FakeGuest::default()))
    }

    /// [`Self::working`] with the guest `guest` (scripted execs).
    pub fn working_with(executor: &Arc<FakeExecutor>, guest: Arc<FakeGuest>) -> Self {
        Self { asked: Mutex::default(), working: Some(Working { executor: executor.clone(), guest }) }
    }

    /// The guest of a working fake.
    pub fn guest(&self) -> Option<&Arc<FakeGuest>> {
        self.working.as_ref().map(|w| &w.guest)
    }

    fn refuse(&self, attempt_dir: &Path) -> CapabilityError {
        lock(&self.asked).push(attempt_dir.to_owned());
        CapabilityError::Failed("the fake backend refuses".into())
    }

    fn reach(&self, attempt_dir: &Path) -> Result<&Working, CapabilityError> {
        match &self.working {
            Some(w) => {
                lock(&self.asked).push(attempt_dir.to_owned());
                Ok(w)
            }
            None => Err(self.refuse(attempt_dir)),
        }
    }

    /// Writes a verifiable execution checkpoint of the live sandbox of
    /// `attempt_dir`; with `suspend`, that sandbox then ends `Suspended`.
    fn save(&self, attempt_dir: &Path, suspend: bool) -> Result<ExecCheckpoint, CapabilityError> {
        let working = self.reach(attempt_dir)?;
        let live = working.executor.live_of(attempt_dir).ok_or_else(|| {
            CapabilityError::Unreachable(format!("no fake sandbox runs for {}", attempt_dir.display()))
        })?;
        let id = CheckpointId::generate();
        let dir = run_dir_of_attempt(attempt_dir).join("exec-checkpoints").join(id.as_str());
        let failed =
            |e: std::io::Error| CapabilityError::Failed(format!("cannot write the fake checkpoint: {e}"));
        std::fs::create_dir_all(&dir).map_err(failed)?;
        let mut files = Vec::new();
        for name in [STATE, LOWER, UPPER] {
            let bytes = format!("fake {name} of {}", id.as_str()).into_bytes();
            std::fs::write(dir.join(name), &bytes).map_err(failed)?;
            files.push(CheckpointFile {
                name: name.into(),
                size: bytes.len() as u64,
                blake3: pvisor_core::store::blake3_hex(&bytes),
                sparse: false,
            });
        }
        let manifest = ExecCheckpoint {
            format: 1,
            id,
            kind: KIND.into(),
            created_at: Timestamp::now(),
            image: "fake".into(),
            machine: pvisor_vm::MachineConfig {
                memory_mib: 256,
                cpus: 1,
                accelerator: pvisor_vm::Accelerator::Tcg,
                ram: Default::default(),
            },
            workspace: live.workspace.clone(),
            exec_id: 1,
            context: serde_json::Value::Null,
            files,
            disks: vec![LOWER.into(), UPPER.into()],
            frozen: Vec::new(),
            nic: None,
            paused_ms: 1,
            save_ms: 1,
        };
        let bytes =
            serde_json::to_vec_pretty(&manifest).map_err(|e| CapabilityError::Failed(e.to_string()))?;
        std::fs::write(dir.join(MANIFEST), bytes).map_err(failed)?;
        if suspend {
            live.control
                .send(Control::Suspend(Box::new(manifest.clone())))
                .map_err(|_| CapabilityError::Unreachable("the fake sandbox ended meanwhile".into()))?;
        }
        Ok(manifest)
    }
}

impl Checkpointable for FakeCheckpointer {
    fn checkpoint(&self, attempt_dir: &Path, _: Duration) -> Result<ExecCheckpoint, CapabilityError> {
        self.save(attempt_dir, false)
    }

    fn suspend(&self, attempt_dir: &Path, _: Duration) -> Result<ExecCheckpoint, CapabilityError> {
        self.save(attempt_dir, true)
    }

    fn restorer(&self, _: &Path, _: &ExecCheckpoint) -> Result<Arc<dyn Executor>, SandboxError> {
        match &self.working {
            Some(w) => Ok(w.executor.clone()),
            None => Err(SandboxError::Protocol("the fake backend cannot restore".into())),
        }
    }
}

impl GuestAccess for FakeCheckpointer {
    fn exec(&self, attempt_dir: &Path, spec: ExecSpec) -> Result<ExecChannel, CapabilityError> {
        let working = self.reach(attempt_dir)?;
        reachable(working, attempt_dir)?;
        working.guest.exec(spec)
    }

    fn attach(&self, attempt_dir: &Path, id: u32) -> Result<ExecChannel, CapabilityError> {
        let working = self.reach(attempt_dir)?;
        reachable(working, attempt_dir)?;
        working.guest.attach(id)
    }

    fn call(
        &self,
        attempt_dir: &Path,
        request: &Request,
        payload: &[u8],
        _: Duration,
    ) -> Result<(Reply, Vec<u8>), CapabilityError> {
        let working = self.reach(attempt_dir)?;
        reachable(working, attempt_dir)?;
        working.guest.call(request, payload)
    }

    fn connect(&self, attempt_dir: &Path, port: u16) -> Result<UnixStream, CapabilityError> {
        let working = self.reach(attempt_dir)?;
        reachable(working, attempt_dir)?;
        working.guest.connect(port)
    }
}

/// A guest is reachable only while its fake sandbox runs, and (as a VM's
/// guest answers only once it has booted) once the Session has recorded
/// the start.
fn reachable(working: &Working, attempt_dir: &Path) -> Result<(), CapabilityError> {
    let unreachable = |why: &str| {
        Err(CapabilityError::Unreachable(format!(
            "the VM's supervisor is not reachable at {} ({why}); is the Job running?",
            attempt_dir.display()
        )))
    };
    if working.executor.live_of(attempt_dir).is_none() {
        return unreachable("no fake sandbox runs");
    }
    if !started(attempt_dir) {
        return unreachable("the fake VM is still booting");
    }
    Ok(())
}

/// Whether the Session recorded the start of the Attempt of `attempt_dir`
/// (`<root>/runs/<run>/attempts/<n>`): its Job is `running`.
fn started(attempt_dir: &Path) -> bool {
    use pvisor_core::records::{AttemptRecord, JobRecord};
    let read = |path: &Path| std::fs::read(path).ok();
    let Some(attempt) = read(&attempt_dir.join("attempt.json"))
        .and_then(|b| serde_json::from_slice::<AttemptRecord>(&b).ok())
        .filter(|a| a.started_at.is_some())
    else {
        return false;
    };
    let Some(root) = attempt_dir.ancestors().nth(4) else { return false };
    let Ok(store) = pvisor_core::store::Store::open(root) else { return false };
    store
        .read::<JobRecord>(&store.job_file(&attempt.job))
        .is_ok_and(|job| job.state == pvisor_core::state::JobState::Running)
}

/// How one fake guest exec plays.
#[derive(Clone, Debug)]
pub struct GuestRun {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub end: GuestEnd,
    /// Echoes what arrives on stdin to stdout (as `cat` would).
    pub echo_stdin: bool,
}

/// How a fake guest exec ends.
#[derive(Clone, Debug)]
pub enum GuestEnd {
    /// Exits with this code after its output.
    Exits(i32),
    /// Runs until a signal arrives (on its channel, or as an agent call),
    /// then dies of it.
    UntilSignalled,
    /// The guest cannot start it.
    Fails { errno: i32, message: String },
}

impl GuestRun {
    /// Prints `stdout`, then exits with `code`.
    pub fn exits(code: i32, stdout: &str) -> Self {
        Self {
            stdout: stdout.as_bytes().to_vec(),
            stderr: Vec::new(),
            end: GuestEnd::Exits(code),
            echo_stdin: false,
        }
    }

    /// Prints `stdout` and `stderr`, then exits with `code`.
    pub fn prints(stdout: &str, stderr: &str, code: i32) -> Self {
        Self { stderr: stderr.as_bytes().to_vec(), ..Self::exits(code, stdout) }
    }

    /// Prints `stdout`, then runs until signalled.
    pub fn runs(stdout: &str) -> Self {
        Self { end: GuestEnd::UntilSignalled, ..Self::exits(0, stdout) }
    }

    /// Echoes its stdin until signalled.
    pub fn cat() -> Self {
        Self { echo_stdin: true, ..Self::runs("") }
    }

    /// Cannot be started: `errno` (ENOENT for a missing program).
    pub fn fails(errno: i32, message: &str) -> Self {
        Self { end: GuestEnd::Fails { errno, message: message.into() }, ..Self::exits(0, "") }
    }
}

/// One exec the fake guest ran.
#[derive(Debug, Default)]
struct ExecState {
    pid: i32,
    ended: Option<(Option<i32>, Option<i32>)>,
    signals: Option<mpsc::Sender<i32>>,
}

/// A scripted guest: each exec plays the first [`GuestRun`] whose pattern
/// its command line (argv joined by spaces) contains, else exits 0 with no
/// output; agent calls act on the host paths they name (a guest sees the
/// Job's workspace at its host path). Every exec spec and call is recorded.
#[derive(Debug, Default)]
pub struct FakeGuest {
    rules: Mutex<Vec<(String, GuestRun)>>,
    execs: Mutex<HashMap<u32, ExecState>>,
    /// Every exec spec, in order.
    pub started: Mutex<Vec<ExecSpec>>,
    /// Every agent call, in order.
    pub calls: Mutex<Vec<Request>>,
    sockets: AtomicU32,
}

impl FakeGuest {
    /// A guest whose execs play `rules` (pattern, run).
    pub fn new(rules: impl IntoIterator<Item = (&'static str, GuestRun)>) -> Arc<Self> {
        let guest = Self::default();
        for (pattern, run) in rules {
            guest.on(pattern, run);
        }
        Arc::new(guest)
    }

    /// Execs whose command line contains `pattern` play `run` (rules added
    /// first win).
    pub fn on(&self, pattern: &str, run: GuestRun) {
        lock(&self.rules).push((pattern.to_owned(), run));
    }

    fn play_for(&self, spec: &ExecSpec) -> GuestRun {
        let line = spec.argv.join(" ");
        lock(&self.rules)
            .iter()
            .find(|(pattern, _)| line.contains(pattern.as_str()))
            .map(|(_, run)| run.clone())
            .unwrap_or_else(|| GuestRun::exits(0, ""))
    }

    /// A one-connection control socket in a fresh short directory; the
    /// returned directory is what the vm backend's guest client connects to.
    fn socket(&self) -> Result<(PathBuf, UnixListener), CapabilityError> {
        let n = self.sockets.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("pvf-{}-{:p}-{n}", std::process::id(), self));
        let failed = |e: std::io::Error| CapabilityError::Failed(format!("the fake guest: {e}"));
        std::fs::create_dir_all(&dir).map_err(failed)?;
        let listener = UnixListener::bind(dir.join(pvisor_vm::CONTROL_SOCKET)).map_err(failed)?;
        Ok((dir, listener))
    }

    fn exec(self: &Arc<Self>, spec: ExecSpec) -> Result<ExecChannel, CapabilityError> {
        lock(&self.started).push(spec.clone());
        let run = self.play_for(&spec);
        let id = spec.id;
        let pid = 100 + id as i32;
        let (tx, rx) = mpsc::channel();
        if !matches!(run.end, GuestEnd::Fails { .. }) {
            lock(&self.execs).insert(id, ExecState { pid, ended: None, signals: Some(tx.clone()) });
        }
        let (dir, listener) = self.socket()?;
        let guest = self.clone();
        let socket_dir = dir.clone();
        std::thread::spawn(move || {
            let Ok((stream, _)) = listener.accept() else { return };
            let _ = std::fs::remove_dir_all(&socket_dir);
            guest.serve_exec(stream, id, pid, run, tx, rx);
        });
        pvisor_vm::guest::exec(&dir, spec).map_err(|e| CapabilityError::Failed(e.to_string()))
    }

    fn serve_exec(
        &self,
        stream: UnixStream,
        id: u32,
        pid: i32,
        run: GuestRun,
        tx: mpsc::Sender<i32>,
        rx: mpsc::Receiver<i32>,
    ) {
        let Ok(reader) = stream.try_clone() else { return };
        let mut reader = BufReader::new(reader);
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() {
            return;
        }
        let mut writer = stream;
        if let GuestEnd::Fails { errno, message } = &run.end {
            let _ = write_frame(
                &mut writer,
                &Reply::ExecFailed { id, errno: *errno, message: message.clone() },
                &[],
            );
            return;
        }
        let _ = write_frame(&mut writer, &Reply::Started { id, pid }, &[]);
        if !run.stdout.is_empty() {
            let _ = write_frame(&mut writer, &Reply::Stdout { id }, &run.stdout);
        }
        if !run.stderr.is_empty() {
            let _ = write_frame(&mut writer, &Reply::Stderr { id }, &run.stderr);
        }
        let ended = match run.end {
            GuestEnd::Exits(code) => (Some(code), None),
            GuestEnd::UntilSignalled => {
                // Requests on the channel: signals, and stdin to echo.
                let echo = writer.try_clone().ok().filter(|_| run.echo_stdin);
                std::thread::spawn(move || {
                    let mut echo = echo;
                    while let Ok(Some((request, payload))) = read_frame::<Request>(&mut reader) {
                        match request {
                            Request::Signal { signal, .. } => {
                                let _ = tx.send(signal);
                            }
                            Request::Stdin { .. } => {
                                if let Some(w) = echo.as_mut() {
                                    let _ = write_frame(w, &Reply::Stdout { id }, &payload);
                                }
                            }
                            _ => {}
                        }
                    }
                });
                match rx.recv() {
                    Ok(signal) => (None, Some(signal)),
                    Err(_) => return,
                }
            }
            GuestEnd::Fails { .. } => unreachable!("answered above"),
        };
        if let Some(state) = lock(&self.execs).get_mut(&id) {
            state.ended = Some(ended);
            state.signals = None;
        }
        let _ = write_frame(&mut writer, &Reply::Exited { id, code: ended.0, signal: ended.1 }, &[]);
        let _ = writer.flush();
    }

    fn attach(self: &Arc<Self>, id: u32) -> Result<ExecChannel, CapabilityError> {
        if !lock(&self.execs).contains_key(&id) {
            return Err(CapabilityError::Failed(format!("the guest runs no exec {id}")));
        }
        let (dir, listener) = self.socket()?;
        let (guest, socket_dir) = (self.clone(), dir.clone());
        std::thread::spawn(move || {
            let Ok((mut stream, _)) = listener.accept() else { return };
            let _ = std::fs::remove_dir_all(&socket_dir);
            // Its end, once it has one.
            let ended = loop {
                if let Some(ended) = lock(&guest.execs).get(&id).and_then(|s| s.ended) {
                    break ended;
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            let _ = write_frame(&mut stream, &Reply::Exited { id, code: ended.0, signal: ended.1 }, &[]);
        });
        pvisor_vm::guest::attach(&dir, id).map_err(|e| CapabilityError::Failed(e.to_string()))
    }

    fn call(&self, request: &Request, payload: &[u8]) -> Result<(Reply, Vec<u8>), CapabilityError> {
        lock(&self.calls).push(request.clone());
        let failed =
            |op: &str, e: std::io::Error| CapabilityError::Failed(format!("the guest failed {op}: {e}"));
        match request {
            Request::FileOp { root, op } => file_op(root, op).map(|r| (r, Vec::new())),
            Request::ReadFile { path, offset, len } => {
                let bytes = std::fs::read(path).map_err(|e| failed("read_file", e))?;
                let start = (*offset as usize).min(bytes.len());
                let end = len.map_or(bytes.len(), |l| (start + l as usize).min(bytes.len()));
                Ok((Reply::File { path: path.clone() }, bytes[start..end].to_vec()))
            }
            Request::WriteFile { path, mode, append } => {
                use std::os::unix::fs::PermissionsExt;
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .write(true)
                    .append(*append)
                    .truncate(!*append)
                    .open(path)
                    .map_err(|e| failed("write_file", e))?;
                file.write_all(payload).map_err(|e| failed("write_file", e))?;
                let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(*mode & 0o7777));
                Ok((Reply::Done { op: "write_file".into() }, Vec::new()))
            }
            Request::Signal { id, signal } => {
                if let Some(tx) = lock(&self.execs).get(id).and_then(|s| s.signals.clone()) {
                    let _ = tx.send(*signal);
                }
                Ok((Reply::Done { op: "signal".into() }, Vec::new()))
            }
            Request::Status { id } => {
                let execs = lock(&self.execs);
                let (running, (code, signal)) = match execs.get(id) {
                    Some(ExecState { ended: Some(ended), .. }) => (false, *ended),
                    Some(_) => (true, (None, None)),
                    None => (false, (None, None)),
                };
                Ok((Reply::Status { id: *id, running, code, signal }, Vec::new()))
            }
            Request::Resize { .. } | Request::Poll { .. } => {
                Ok((Reply::Done { op: "ok".into() }, Vec::new()))
            }
            other => Err(CapabilityError::Failed(format!("the fake guest does not answer {other:?}"))),
        }
    }

    /// The pid the guest gave exec `id`.
    pub fn pid_of(&self, id: u32) -> Option<i32> {
        lock(&self.execs).get(&id).map(|s| s.pid)
    }

    /// A stream to guest `port`: an echo service.
    fn connect(&self, _port: u16) -> Result<UnixStream, CapabilityError> {
        let (ours, theirs) = UnixStream::pair().map_err(|e| CapabilityError::Failed(e.to_string()))?;
        std::thread::spawn(move || {
            let mut reader = &theirs;
            let mut writer = &theirs;
            let _ = std::io::copy(&mut reader, &mut writer);
        });
        Ok(ours)
    }
}

/// One agent file operation beneath `root`, on the host.
fn file_op(root: &Path, op: &FileOp) -> Result<Reply, CapabilityError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let failed = |e: std::io::Error| CapabilityError::Failed(format!("the guest failed file_op: {e}"));
    let resolve =
        |path: &Path, follow: bool| pvisor_agent_proto::resolve_in_root(root, path, follow).map_err(failed);
    let stat_of = |shown: &Path, meta: &std::fs::Metadata| FileStat {
        path: shown.to_owned(),
        kind: if meta.is_dir() {
            EntryKind::Dir
        } else if meta.file_type().is_symlink() {
            EntryKind::Symlink
        } else {
            EntryKind::File
        },
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
        ctime_ns: meta.ctime() * 1_000_000_000 + meta.ctime_nsec(),
    };
    let done = |op: &str| Ok(Reply::Done { op: op.into() });
    match op {
        FileOp::Stat { path } => {
            let meta = std::fs::metadata(resolve(path, true)?).map_err(failed)?;
            Ok(Reply::Stat { stat: stat_of(path, &meta) })
        }
        FileOp::List { path, depth } => {
            let base = resolve(path, true)?;
            let mut entries = Vec::new();
            let mut pending = vec![(PathBuf::new(), 1)];
            while let Some((relative, level)) = pending.pop() {
                for entry in std::fs::read_dir(base.join(&relative)).map_err(failed)? {
                    let entry = entry.map_err(failed)?;
                    let shown = relative.join(entry.file_name());
                    let meta = std::fs::symlink_metadata(entry.path()).map_err(failed)?;
                    if meta.is_dir() && level < (*depth).max(1) {
                        pending.push((shown.clone(), level + 1));
                    }
                    entries.push(stat_of(&shown, &meta));
                }
            }
            entries.sort_by(|a, b| a.path.cmp(&b.path));
            Ok(Reply::Listing { entries, truncated: false })
        }
        FileOp::Mkdir { path, mode } => {
            let target = resolve(path, true)?;
            std::fs::create_dir_all(&target).map_err(failed)?;
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(*mode & 0o7777))
                .map_err(failed)?;
            done("mkdir")
        }
        FileOp::Remove { path, recursive } => {
            let target = resolve(path, false)?;
            let meta = std::fs::symlink_metadata(&target).map_err(failed)?;
            match (meta.is_dir(), recursive) {
                (true, true) => std::fs::remove_dir_all(&target),
                (true, false) => std::fs::remove_dir(&target),
                (false, _) => std::fs::remove_file(&target),
            }
            .map_err(failed)?;
            done("remove")
        }
        FileOp::Rename { from, to } => {
            std::fs::rename(resolve(from, false)?, resolve(to, false)?).map_err(failed)?;
            done("rename")
        }
        FileOp::Chmod { path, mode, .. } => {
            if let Some(mode) = mode {
                std::fs::set_permissions(
                    resolve(path, true)?,
                    std::fs::Permissions::from_mode(*mode & 0o7777),
                )
                .map_err(failed)?;
            }
            done("chmod")
        }
        FileOp::MkParents { path } => {
            let target = resolve(path, true)?;
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(failed)?;
            }
            Ok(Reply::Resolved { path: target })
        }
        FileOp::Resolve { path } => Ok(Reply::Resolved { path: resolve(path, true)? }),
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

/// [`FakeBackends`] that answer for the backend name `vm`: for the
/// frontends that ask for `vm` by name (the daemon's sandbox supervisor,
/// the containerd shim). Their fake executor places Jobs as `vm` Jobs.
#[derive(Debug)]
pub struct FakeVmBackends(pub FakeBackends);

impl FakeVmBackends {
    /// A working fake VM: every start plays `keeper` unless a script is
    /// queued; checkpoints, suspends, restores and a guest that plays `guest`.
    pub fn working(keeper: Script, guest: Arc<FakeGuest>) -> Self {
        let executor = FakeExecutor::always_as("vm", keeper);
        let capabilities = Some(Arc::new(FakeCheckpointer::working_with(&executor, guest)));
        Self(FakeBackends { executor, capabilities })
    }

    fn alias(name: &str) -> &str {
        if name == "vm" {
            "fake"
        } else {
            name
        }
    }
}

impl Backends for FakeVmBackends {
    fn executor(&self, name: &str) -> Option<Arc<dyn Executor>> {
        self.0.executor(Self::alias(name))
    }

    fn checkpointable(&self, name: &str) -> Option<Arc<dyn Checkpointable>> {
        self.0.checkpointable(Self::alias(name))
    }

    fn guest_access(&self, name: &str) -> Option<Arc<dyn GuestAccess>> {
        self.0.guest_access(Self::alias(name))
    }
}
