//! The scripted fake guest: execs played by [`GuestRun`]s over a real
//! control socket, and agent calls answered on the host paths they name.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pvisor_agent_proto::{read_frame, write_frame, EntryKind, FileOp, FileStat, Reply, Request};
use pvisor_sandbox::capabilities::CapabilityError;
use pvisor_vm::guest::{ExecChannel, ExecSpec};

use super::lock;

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
    /// Exits with this code, but its `Exited` never reaches the channel,
    /// which stays open (the guest's status knows the exit).
    ExitsUnheard(i32),
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

    /// Exits with `code`, its `Exited` frame lost on the way.
    pub fn exits_unheard(code: i32) -> Self {
        Self { end: GuestEnd::ExitsUnheard(code), ..Self::exits(0, "") }
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

    pub(super) fn exec(self: &Arc<Self>, spec: ExecSpec) -> Result<ExecChannel, CapabilityError> {
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
            GuestEnd::ExitsUnheard(code) => {
                if let Some(state) = lock(&self.execs).get_mut(&id) {
                    state.ended = Some((Some(code), None));
                    state.signals = None;
                }
                // The channel stays open, silent, until the caller leaves.
                let _ = read_frame::<Request>(&mut reader);
                return;
            }
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

    pub(super) fn attach(self: &Arc<Self>, id: u32) -> Result<ExecChannel, CapabilityError> {
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

    pub(super) fn call(
        &self,
        request: &Request,
        payload: &[u8],
    ) -> Result<(Reply, Vec<u8>), CapabilityError> {
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
    pub(super) fn connect(&self, _port: u16) -> Result<UnixStream, CapabilityError> {
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
