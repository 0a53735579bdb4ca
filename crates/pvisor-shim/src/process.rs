//! One container process (the init process or an exec) and its stdio:
//! the guest exec's output frames are written to containerd's FIFOs, the
//! stdin FIFO is fed to the exec, and its exit status is kept for `wait`,
//! `state` and `delete`.
//!
//! Exit statuses are containerd's: the exit code, or 128 + the signal that
//! ended the process; 255 when the VM went away without reporting an exit.
//!
//! Stdin is runc's: the shim holds a write end of the stdin FIFO of its
//! own, so containerd closing and reopening its writer (a restart, a
//! client detaching) does not end the process's stdin; `CloseIO` drops the
//! shim's writer ([`Process::close_stdin`]) and the stdin ends once every
//! other writer has closed too.
//!
//! A pause (an execution suspend) ends every exec channel; the processes
//! live on in the saved guest. After the resume each process's relay
//! attaches to it again in the new Attempt ([`Guest::attach`]): the
//! supervisor has held its output since the restore, so the FIFOs go on
//! where they stopped, and stdin goes on to the same process.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};

use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use pvisor::actions::guest::{ExecChannel, ExecSignaller};
use pvisor::actions::guest::{Reply, TerminalSize};
use pvisor::actions::Guest;
use pvisor_core::ids::AttemptId;
use std::time::{Duration, Instant};

use crate::logger::{Logger, LoggerError};
use crate::spec::ProcessSpec;
use crate::vm::{status_of, ExecError, Vm};

/// The exit status of a process whose VM vanished without reporting one.
pub const LOST: u32 = 255;
/// How long a relay waits before it attaches again to a process whose
/// channel ended without a pause (an attach that failed, a relay cut off).
const REATTACH_PAUSE: Duration = Duration::from_millis(250);
/// The agent queues a few stdin chunks per exec; keep each one small.
const STDIN_CHUNK: usize = 16 << 10;

/// Where containerd wants a process's stdio (FIFO or file paths; empty
/// for none).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stdio {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
}

/// Stdio the shim cannot connect.
#[derive(Debug, thiserror::Error)]
pub enum StdioError {
    #[error("unsupported: stdio {path:?} (FIFOs, files, file:// URIs, and binary:// for output)")]
    Scheme { path: String },
    #[error(
        "unsupported: binary:// stderr {stderr:?} without the same stdout (a logger takes both streams)"
    )]
    SplitLogger { stderr: String },
}

/// Why a process could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the process was already started")]
    AlreadyStarted,
    #[error(transparent)]
    Exec(#[from] ExecError),
}

/// Why a process's terminal could not be resized.
#[derive(Debug, thiserror::Error)]
pub enum ResizeError {
    #[error("the process has no terminal (it was not started with one)")]
    NoTerminal,
    #[error(transparent)]
    Exec(#[from] ExecError),
}

impl Stdio {
    /// Refuses what the shim cannot connect: a `binary://` stdin, and URI
    /// schemes other than `file://` and (for output) `binary://`.
    pub fn check(&self) -> Result<(), StdioError> {
        for (path, output) in [(&self.stdin, false), (&self.stdout, true), (&self.stderr, true)] {
            let binary = output && crate::logger::is_binary(path);
            if path.contains("://") && !path.starts_with("file://") && !binary {
                return Err(StdioError::Scheme { path: path.clone() });
            }
        }
        // One logger takes both streams (containerd's NewBinaryIO uses
        // stdout's URI for both): a stderr elsewhere would be dropped.
        if crate::logger::is_binary(&self.stderr) && self.stderr != self.stdout {
            return Err(StdioError::SplitLogger { stderr: self.stderr.clone() });
        }
        Ok(())
    }

    /// The logger a `binary://` stdout names, started for container `id`.
    pub fn logger(&self, id: &str, namespace: &str) -> Result<Option<Logger>, LoggerError> {
        if !crate::logger::is_binary(&self.stdout) {
            return Ok(None);
        }
        Logger::start(&self.stdout, id, namespace).map(Some)
    }
}

/// containerd's process status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Created,
    Running,
    Stopped,
}

/// How a process ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Exit {
    pub status: u32,
    pub at: Timestamp,
}

/// What `state` reports of a process.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub status: Status,
    pub pid: u32,
    pub exit: Option<Exit>,
}

#[derive(Debug)]
struct Inner {
    status: Status,
    pid: u32,
    exit: Option<Exit>,
    /// The VM and guest exec id, once started.
    started: Option<(Arc<Vm>, u32)>,
    /// Runs once, when the process is first recorded as ended.
    on_exit: Option<OnExit>,
    /// Runs once, before the end is recorded and anyone waiting hears of
    /// it: the Job's Trace notes the end first.
    before_exit: Option<OnExit>,
    /// The channel the relay reads now.
    link: Option<Link>,
    /// The terminal's size: the last `ResizePty`, applied at the start of
    /// a process that was resized before it started.
    size: TerminalSize,
    /// The shim's own writer on the stdin FIFO, until `CloseIO` or the end.
    stdin_writer: Option<File>,
    /// `CloseIO` came: no writer of the shim's is opened at the start.
    stdin_closed: bool,
}

/// The channel a process's relay reads now: the Attempt it reaches, and
/// two handles on its writing end, one for stdin (taken while a write is
/// under way) and one to hang it up with.
#[derive(Debug)]
struct Link {
    attempt: AttemptId,
    stdin: Option<ExecSignaller>,
    hang_up: ExecSignaller,
}

/// What runs when a started process has ended: its guest pid and exit.
struct OnExit(Box<ExitFn>);
type ExitFn = dyn FnOnce(u32, &Exit) + Send;
/// What runs when the guest's OOM killer has killed a process (its pid):
/// the guest is the container's one memory domain.
pub type OnOom = Box<dyn Fn(i32) + Send>;

impl std::fmt::Debug for OnExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnExit")
    }
}

/// A container process.
#[derive(Debug)]
pub struct Process {
    pub spec: ProcessSpec,
    pub stdio: Stdio,
    /// The `binary://` logger its output goes to, if any.
    logger: Mutex<Option<Logger>>,
    inner: Mutex<Inner>,
    /// Signalled when the process ends and when its relay has a new link.
    changed: Condvar,
}

impl Process {
    pub fn new(spec: ProcessSpec, stdio: Stdio, logger: Option<Logger>) -> Arc<Process> {
        let inner = Inner {
            status: Status::Created,
            pid: 0,
            exit: None,
            started: None,
            on_exit: None,
            before_exit: None,
            link: None,
            // As runc's console: no size until containerd sends one.
            size: TerminalSize { rows: 0, cols: 0 },
            stdin_writer: None,
            stdin_closed: false,
        };
        let logger = Mutex::new(logger);
        Arc::new(Process { spec, stdio, logger, inner: Mutex::new(inner), changed: Condvar::new() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn snapshot(&self) -> Snapshot {
        let inner = self.lock();
        Snapshot { status: inner.status, pid: inner.pid, exit: inner.exit.clone() }
    }

    /// Starts the process in `vm`; `before_exit` runs once it has ended,
    /// before its end is recorded, `on_exit` after that, once its output
    /// has been written; `on_oom` at each OOM kill in the guest while it
    /// runs. Returns the guest pid.
    pub fn start(
        self: &Arc<Self>,
        vm: &Arc<Vm>,
        before_exit: impl FnOnce(u32, &Exit) + Send + 'static,
        on_exit: impl FnOnce(u32, &Exit) + Send + 'static,
        on_oom: Option<OnOom>,
    ) -> Result<u32, StartError> {
        // `on_exit` runs only for a process that started: a failed start
        // is the error containerd gets.
        if self.lock().status != Status::Created {
            return Err(StartError::AlreadyStarted);
        }
        let terminal = self.has_terminal().then(|| self.lock().size);
        let (channel, attempt, id, pid) = match vm.exec(&self.spec, terminal) {
            Ok(started) => started,
            Err(e) => {
                // As runc: the start fails, and the process is stopped with
                // the shell's status for a missing or unrunnable program.
                let status = match &e {
                    ExecError::Failed { errno, .. } if *errno == libc_enoent() => 127,
                    ExecError::Failed { .. } => 126,
                    ExecError::Guest(_) | ExecError::Paused => LOST,
                };
                self.exit(status);
                return Err(e.into());
            }
        };
        {
            let mut inner = self.lock();
            inner.status = Status::Running;
            inner.pid = pid;
            inner.started = Some((vm.clone(), id));
            inner.on_exit = Some(OnExit(Box::new(on_exit)));
            inner.before_exit = Some(OnExit(Box::new(before_exit)));
        }
        self.link(attempt, &channel);
        if !self.stdio.stdin.is_empty() {
            let closed = self.lock().stdin_closed;
            match open_stdin(&self.stdio.stdin, !closed) {
                Ok((reader, writer)) => {
                    // A CloseIO (or the exit) while the FIFO was opening
                    // must not be undone by storing the writer after it.
                    let mut inner = self.lock();
                    if !inner.stdin_closed && inner.status != Status::Stopped {
                        inner.stdin_writer = writer;
                    }
                    drop(inner);
                    let process = self.clone();
                    std::thread::spawn(move || feed_stdin(reader, &process));
                }
                Err(e) => {
                    log::warn!("cannot open stdin {}: {e}", self.stdio.stdin);
                    self.write_stdin(None);
                }
            }
        }
        let (process, vm) = (self.clone(), vm.clone());
        std::thread::spawn(move || {
            let status = process.relay(channel, &vm, id, on_oom);
            process.exit(status);
        });
        Ok(pid)
    }

    /// Writes the exec's output to its FIFOs until it exits; returns its
    /// exit status. A channel that ends (a pause, or the VM's end) is
    /// replaced by attaching to the process again once the VM runs. The
    /// FIFOs are closed after the last byte, before the exit is recorded,
    /// so a reader sees all output before `wait` returns.
    fn relay(&self, mut channel: ExecChannel, vm: &Vm, id: u32, on_oom: Option<OnOom>) -> u32 {
        let logged = self.logger.lock().unwrap_or_else(|p| p.into_inner()).as_mut().map(Logger::take_outputs);
        let (mut stdout, mut stderr) = match logged {
            Some(pipes) => pipes,
            None if self.stdio.stderr == self.stdio.stdout => (open_output(&self.stdio.stdout), None),
            None => (open_output(&self.stdio.stdout), open_output(&self.stdio.stderr)),
        };
        let mut attached = Instant::now();
        loop {
            match channel.next_reply() {
                Ok(Some((Reply::Stdout { .. }, bytes))) => write_all(stdout.as_mut(), &bytes),
                Ok(Some((Reply::Stderr { .. }, bytes))) => {
                    write_all(if stderr.is_some() { stderr.as_mut() } else { stdout.as_mut() }, &bytes)
                }
                Ok(Some((Reply::Oom { pid, .. }, _))) => {
                    if let Some(on_oom) = &on_oom {
                        on_oom(pid);
                    }
                }
                Ok(Some((Reply::Exited { code, signal, .. }, _))) => return status_of(code, signal),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    // A channel that ends right after an attach is not a
                    // pause: do not spin on it.
                    std::thread::sleep(REATTACH_PAUSE.saturating_sub(attached.elapsed()));
                    match self.reattach(vm, id) {
                        Ok(next) => channel = next,
                        Err(status) => return status,
                    }
                    attached = Instant::now();
                }
            }
        }
    }

    /// A new channel to exec `id` once the VM runs (waiting out a pause);
    /// or, as `Err`, its exit status if the guest says it ended, and
    /// [`LOST`] once the VM has ended.
    fn reattach(&self, vm: &Vm, id: u32) -> Result<ExecChannel, u32> {
        loop {
            let Some(guest) = vm.live_guest() else {
                log::warn!("the VM ended before exec {id} reported its exit");
                return Err(LOST);
            };
            match guest.attach(id) {
                Ok(channel) => {
                    self.link(guest.attempt().clone(), &channel);
                    return Ok(channel);
                }
                Err(e) => {
                    if let Ok(Some(status)) = vm.exit_status(&guest, id) {
                        return Err(status);
                    }
                    log::debug!("exec {id}: cannot attach yet: {e}");
                    std::thread::sleep(REATTACH_PAUSE);
                }
            }
        }
    }

    /// Makes `channel` (to `attempt`'s guest) the one stdin goes to.
    fn link(&self, attempt: AttemptId, channel: &ExecChannel) {
        match channel.signaller().and_then(|stdin| Ok((stdin, channel.signaller()?))) {
            Ok((stdin, hang_up)) => {
                self.lock().link = Some(Link { attempt, stdin: Some(stdin), hang_up });
                self.changed.notify_all();
            }
            Err(e) => log::warn!("cannot write to the process's stdin: {e}"),
        }
    }

    /// After a resume into `guest`: hangs up a channel to an earlier
    /// Attempt, which may stay open with no VM behind it, so the relay
    /// attaches to the process in the new one.
    pub fn resumed(&self, guest: &Guest) {
        let mut inner = self.lock();
        if inner.link.as_ref().is_some_and(|link| &link.attempt != guest.attempt()) {
            if let Some(link) = inner.link.take() {
                link.hang_up.hang_up();
            }
        }
    }

    /// Writes `bytes` to the process's stdin (`None`: ends it), through
    /// the current channel, waiting out a pause; false once it has ended.
    fn write_stdin(&self, bytes: Option<&[u8]>) -> bool {
        let mut inner = self.lock();
        loop {
            if inner.status == Status::Stopped {
                return false;
            }
            // Written without the lock: a channel to a paused VM may block,
            // and the resume must still be able to hang it up.
            if let Some((attempt, mut stdin)) =
                inner.link.as_mut().and_then(|link| Some((link.attempt.clone(), link.stdin.take()?)))
            {
                drop(inner);
                let written = match bytes {
                    Some(bytes) => stdin.stdin(bytes),
                    None => stdin.close_stdin(),
                };
                inner = self.lock();
                if let Some(link) = inner.link.as_mut().filter(|link| link.attempt == attempt) {
                    if written.is_ok() {
                        link.stdin = Some(stdin);
                        return true;
                    }
                    // The channel ended (a pause): the relay links the next.
                    inner.link = None;
                } else if written.is_ok() {
                    return true;
                }
            }
            inner = self.changed.wait(inner).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// `CloseIO` with `stdin`: the shim lets go of its writer on the stdin
    /// FIFO, so the process reads EOF once containerd's writers have closed
    /// (runc's shim closes its own `p.stdin` the same way).
    pub fn close_stdin(&self) {
        let mut inner = self.lock();
        inner.stdin_closed = true;
        inner.stdin_writer = None;
    }

    /// Records the end (once), wakes the waiters and runs `on_exit`.
    pub fn exit(&self, status: u32) -> Exit {
        let before = {
            let mut inner = self.lock();
            if inner.exit.is_some() {
                None
            } else {
                inner.before_exit.take().map(|f| (f, inner.pid))
            }
        };
        if let Some((before, pid)) = before {
            (before.0)(pid, &Exit { status, at: Timestamp::now() });
        }
        let (exit, pid, on_exit) = {
            let mut inner = self.lock();
            if let Some(exit) = &inner.exit {
                return exit.clone();
            }
            let exit = Exit { status, at: Timestamp::now() };
            inner.status = Status::Stopped;
            inner.exit = Some(exit.clone());
            inner.link = None;
            inner.stdin_writer = None;
            self.changed.notify_all();
            (exit, inner.pid, inner.on_exit.take())
        };
        if let Some(on_exit) = on_exit {
            (on_exit.0)(pid, &exit);
        }
        exit
    }

    /// Sends `signal` to the process's group in the guest.
    pub fn kill(&self, signal: u32) -> Result<(), KillError> {
        let inner = self.lock();
        match (inner.status, inner.started.clone()) {
            (Status::Stopped, _) => Err(KillError::Finished),
            (_, Some((vm, id))) => {
                drop(inner);
                vm.signal(id, signal as i32).map_err(|e| match e {
                    ExecError::Paused => KillError::Paused,
                    other => KillError::Unreachable(other.to_string()),
                })
            }
            (_, None) => {
                // Never started: it ends as if the signal had killed it.
                drop(inner);
                self.exit(128 + signal);
                Ok(())
            }
        }
    }

    /// At delete: the process's logger is told to finish (containerd's
    /// binaryIO `Close`), and waited for.
    pub fn release(&self) {
        if let Some(mut logger) = self.logger.lock().unwrap_or_else(|p| p.into_inner()).take() {
            logger.finish();
        }
    }

    /// On a terminal (containerd's `terminal`, or the spec's).
    pub fn has_terminal(&self) -> bool {
        self.stdio.terminal || self.spec.terminal
    }

    /// Sets the size of the process's terminal (`ResizePty`).
    pub fn resize(&self, size: TerminalSize) -> Result<(), ResizeError> {
        if !self.has_terminal() {
            return Err(ResizeError::NoTerminal);
        }
        let mut inner = self.lock();
        inner.size = size;
        match (inner.status, inner.started.clone()) {
            (Status::Running, Some((vm, id))) => {
                drop(inner);
                vm.resize(id, size).map_err(ResizeError::from)
            }
            // Not started: the size is its first; ended: nothing to size.
            _ => Ok(()),
        }
    }

    /// Blocks until the process has ended.
    pub fn wait(&self) -> Exit {
        let mut inner = self.lock();
        loop {
            if let Some(exit) = &inner.exit {
                return exit.clone();
            }
            inner = self.changed.wait(inner).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Why a signal was not delivered.
#[derive(Debug)]
pub enum KillError {
    Finished,
    Paused,
    Unreachable(String),
}

fn libc_enoent() -> i32 {
    rustix::io::Errno::NOENT.raw_os_error()
}

/// Opens a stdio path for writing. A FIFO is opened read-write, so the
/// open never waits for containerd's reader and a reader that goes away
/// does not end the relay with EPIPE (what the runc shim does too).
fn open_output(path: &str) -> Option<File> {
    if path.is_empty() {
        return None;
    }
    let path = path.strip_prefix("file://").unwrap_or(path);
    let fifo = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo());
    let opened = if fifo {
        OpenOptions::new().read(true).write(true).open(path)
    } else {
        OpenOptions::new().create(true).append(true).open(path)
    };
    opened.map_err(|e| log::warn!("cannot open {path} for output: {e}")).ok()
}

fn write_all(out: Option<&mut File>, bytes: &[u8]) {
    if let Some(out) = out {
        // A reader that stopped reading must not stop the relay: the exit
        // still has to be recorded.
        let _ = out.write_all(bytes);
    }
}

/// Opens the stdin path for reading and, for a FIFO when `hold` is set, a
/// writer of the shim's own (see the module doc). The reader is opened
/// without waiting for a writer, then reads block as usual.
fn open_stdin(path: &str, hold: bool) -> std::io::Result<(File, Option<File>)> {
    use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
    let path = Path::new(path.strip_prefix("file://").unwrap_or(path));
    if !std::fs::metadata(path)?.file_type().is_fifo() {
        return Ok((File::open(path)?, None));
    }
    let nonblock = OFlags::NONBLOCK.bits() as i32;
    let reader = OpenOptions::new().read(true).custom_flags(nonblock).open(path)?;
    // With a reader open, a writer's open does not wait.
    let writer = if hold { Some(OpenOptions::new().write(true).open(path)?) } else { None };
    fcntl_setfl(&reader, fcntl_getfl(&reader)? - OFlags::NONBLOCK)?;
    Ok((reader, writer))
}

/// Feeds stdin to the process until EOF, then ends its stdin (so `echo hi
/// | ctr run … cat` ends).
fn feed_stdin(mut from: File, to: &Process) {
    let mut buf = vec![0u8; STDIN_CHUNK];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => {
                to.write_stdin(None);
                return;
            }
            Ok(n) => {
                if !to.write_stdin(Some(&buf[..n])) {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{open_stdin, Stdio};
    use std::fs::OpenOptions;
    use std::io::{Read, Write};
    use std::time::Duration;

    /// runc's stdin: containerd's writer closing is not the end while the
    /// shim holds its own (containerd's runc shim, `openStdin` in
    /// cmd/containerd-shim-runc-v2/process/init.go); dropping it is.
    #[test]
    fn stdin_ends_only_once_the_shims_own_writer_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("stdin");
        rustix::fs::mknodat(rustix::fs::CWD, &fifo, rustix::fs::FileType::Fifo, 0o600.into(), 0).unwrap();
        let (mut reader, writer) = open_stdin(fifo.to_str().unwrap(), true).unwrap();
        let writer = writer.expect("a FIFO gets the shim's writer");
        // containerd's writer: one line, then gone (a restart, a detach).
        OpenOptions::new().write(true).open(&fifo).unwrap().write_all(b"line\n").unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut all = Vec::new();
            let _ = reader.read_to_end(&mut all);
            let _ = tx.send(all);
        });
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "no EOF while the shim holds a writer");
        drop(writer); // CloseIO
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), b"line\n");
    }

    #[test]
    fn a_closed_stdin_or_a_plain_file_gets_no_writer() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("stdin");
        rustix::fs::mknodat(rustix::fs::CWD, &fifo, rustix::fs::FileType::Fifo, 0o600.into(), 0).unwrap();
        let (mut reader, writer) = open_stdin(fifo.to_str().unwrap(), false).unwrap();
        assert!(writer.is_none());
        assert_eq!(reader.read(&mut [0u8; 8]).unwrap(), 0, "no writer at all: EOF at once");
        let file = dir.path().join("input");
        std::fs::write(&file, "x").unwrap();
        assert!(open_stdin(&format!("file://{}", file.display()), true).unwrap().1.is_none());
    }

    /// One logger takes both streams (containerd's `NewBinaryIO` starts one
    /// command from stdout's URI): stdin and a separate stderr are refused.
    #[test]
    fn a_binary_logger_takes_stdout_and_stderr_together() {
        let stdio = |stdin: &str, stdout: &str, stderr: &str| Stdio {
            stdin: stdin.into(),
            stdout: stdout.into(),
            stderr: stderr.into(),
            terminal: false,
        };
        let logger = "binary:///usr/bin/logger?x=1";
        assert!(stdio("", logger, logger).check().is_ok());
        assert!(stdio("", logger, "").check().is_ok());
        assert!(stdio("/run/fifo/in", "/run/fifo/out", "/run/fifo/err").check().is_ok());
        assert!(stdio(logger, "", "").check().unwrap_err().to_string().contains("unsupported"));
        assert!(stdio("", "/run/fifo/out", logger).check().unwrap_err().to_string().contains("same stdout"));
        assert!(stdio("", logger, "binary:///usr/bin/other")
            .check()
            .unwrap_err()
            .to_string()
            .contains("same stdout"));
        assert!(stdio("", "tcp://x", "").check().is_err());
    }
}
