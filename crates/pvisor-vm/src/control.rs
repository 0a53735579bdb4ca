//! The control socket in the Attempt's `vm/` directory: the server the
//! supervisor runs (checkpoint and suspend requests, guest-access calls,
//! relayed execs, port forwards), and the client side other processes use.

use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use pvisor_agent_proto::{read_frame, write_frame, Reply, Request};
use serde::{Deserialize, Serialize};

use super::link::{Shared, RELAY_BACKLOG};
use super::net::{Conn, MAX_STREAMS};
use super::{checkpoint, EXEC_ID};

pub const CONTROL_SOCKET: &str = "control.sock";

pub fn control_socket(vm_dir: &Path) -> PathBuf {
    vm_dir.join(CONTROL_SOCKET)
}

/// What `pvisor checkpoint --kind execution` and `pvisor suspend` ask for,
/// and the guest access of [`super::guest`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ControlRequest {
    /// Save and continue.
    Checkpoint,
    /// Save, then stop the VM; the Attempt ends hibernated.
    Suspend,
    /// Start another command in the guest and relay it ([`super::guest::exec`]).
    Exec(pvisor_sandbox::guest::ExecSpec),
    /// Relay a command already running in a resumed guest ([`super::guest::attach`]).
    Attach { id: u32 },
    /// One agent request; `payload` bytes follow the line ([`super::guest::call`]).
    Call { request: Box<Request>, payload: u32 },
    /// A stream to guest `127.0.0.1:port` ([`super::guest::forward`]).
    Forward { port: u16 },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum ControlResponse {
    Checkpointed {
        manifest: Box<pvisor_sandbox::checkpoint::ExecCheckpoint>,
    },
    /// A forward is connected; raw stream bytes follow on the connection.
    Forwarded,
    Error {
        message: String,
    },
}

/// Reads a `call`'s payload that follows its request line.
pub(super) fn read_payload(reader: &mut impl Read, len: u32) -> io::Result<Vec<u8>> {
    if len > pvisor_agent_proto::MAX_PAYLOAD {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "payload exceeds the protocol limit"));
    }
    let mut payload = vec![0; len as usize];
    reader.read_exact(&mut payload)?;
    Ok(payload)
}

/// Binds `vm/control.sock` (through `/proc/self/fd` when the path is too
/// long for `sun_path`) and serves checkpoint and suspend requests.
pub(super) fn serve_control(shared: Arc<Shared>) -> io::Result<()> {
    let path = control_socket(&shared.vm.dir);
    let _ = fs::remove_file(&path);
    let dir = fs::File::open(&shared.vm.dir)?;
    let short = PathBuf::from(format!("/proc/self/fd/{}/{}", dir.as_raw_fd(), CONTROL_SOCKET));
    let listener = UnixListener::bind(if path.as_os_str().len() < 100 { &path } else { &short })?;
    std::thread::Builder::new().name("pvisor-vm-control".into()).spawn(move || {
        while let Some(stream) = next_connection(&listener, &shared) {
            let Ok(stream) = stream else { continue };
            if !trusted_peer(&stream) {
                // Dropped unanswered: nothing about the VM reaches a stranger.
                continue;
            }
            let conn = shared.clone();
            let _ = std::thread::Builder::new().name("pvisor-vm-control-conn".into()).spawn(move || {
                let _ = handle_control(&conn, stream);
            });
            if shared.suspended.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
                return;
            }
        }
    })?;
    Ok(())
}

/// The next connection to the control socket, or `None` once QEMU has been
/// reaped (checked every [`CONTROL_TICK`] while nobody connects).
fn next_connection(listener: &UnixListener, shared: &Shared) -> Option<io::Result<UnixStream>> {
    let tick = rustix::time::Timespec { tv_sec: 0, tv_nsec: CONTROL_TICK.as_nanos() as i64 };
    loop {
        if shared.control_stop.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let mut fds = [rustix::event::PollFd::new(listener, rustix::event::PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&tick)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => return Some(listener.accept().map(|(stream, _)| stream)),
            Err(e) => return Some(Err(e.into())),
        }
    }
}

/// How often the control socket's thread looks whether the VM is gone.
const CONTROL_TICK: std::time::Duration = std::time::Duration::from_millis(250);

/// The control socket answers only the user who owns the Attempt (or root),
/// from outside every sandbox: a process in another user or mount namespace
/// than the supervisor's (a sandboxed command that somehow reached the
/// socket) is refused, whatever its uid. The socket also lives in the state
/// directory, which every sandbox has hidden.
fn trusted_peer(stream: &UnixStream) -> bool {
    let own = rustix::process::geteuid().as_raw();
    match pvisor_sandbox::sys::peer_credentials(stream.as_raw_fd()) {
        Ok((pid, uid)) => (uid == own || uid == 0) && pid > 0 && pvisor_sandbox::sys::shares_namespaces(pid),
        Err(_) => false,
    }
}

fn handle_control(shared: &Shared, stream: UnixStream) -> io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let response = match serde_json::from_str::<ControlRequest>(&line) {
        Err(e) => ControlResponse::Error { message: format!("bad control request: {e}") },
        Ok(ControlRequest::Exec(spec)) => return relay_exec(shared, spec, reader, stream),
        Ok(ControlRequest::Attach { id }) => return attach_exec(shared, id, reader, stream),
        Ok(ControlRequest::Forward { port }) => return forward(shared, port, stream),
        Ok(ControlRequest::Call { request, payload }) => {
            let payload = read_payload(&mut reader, payload)?;
            let (reply, bytes) = guest_call(shared, *request, &payload);
            return write_frame(&mut &stream, &reply, &bytes);
        }
        Ok(request) => match checkpoint::take(shared, request == ControlRequest::Suspend) {
            Ok(manifest) => ControlResponse::Checkpointed { manifest },
            Err(e) => ControlResponse::Error { message: e.to_string() },
        },
    };
    let mut out = serde_json::to_vec(&response).map_err(io::Error::other)?;
    out.push(b'\n');
    (&stream).write_all(&out)
}

/// One agent request for a guest-access caller. Only requests that answer
/// with exactly one reply are passed through; the rest would confuse the
/// Attempt's own use of the channel.
pub(super) fn guest_call(shared: &Shared, request: Request, payload: &[u8]) -> (Reply, Vec<u8>) {
    let refuse = |message: String| (Reply::Error { op: "call".into(), message }, Vec::new());
    match request {
        Request::ReadFile { .. }
        | Request::WriteFile { .. }
        | Request::FileOp { .. }
        | Request::Status { .. }
        | Request::Poll { .. }
        | Request::NetConnect { .. } => {}
        // Signals and resizes have no reply; they need no op lock either.
        Request::Signal { id, .. } | Request::Resize { id, .. } if id != EXEC_ID => {
            return match shared.send(&request, &[]) {
                Ok(()) => (Reply::Done { op: "signal".into() }, Vec::new()),
                Err(e) => refuse(format!("cannot reach the agent: {e}")),
            };
        }
        _ => return refuse(format!("{request:?} is not a guest-access request")),
    }
    // Serialised with checkpoints and other calls, so replies cannot cross.
    let _op = shared.op.lock().unwrap_or_else(|p| p.into_inner());
    if shared.suspended.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
        return refuse("the VM is suspended".into());
    }
    let timeout = Duration::from_secs(60);
    let deadline = Instant::now() + timeout;
    let mut answer = shared.call(&request, payload, timeout);
    // A late answer to an earlier call that timed out is not this one's.
    while let Ok((reply, _)) = &answer {
        if answers(&request, reply) {
            break;
        }
        answer = shared.next_reply(deadline.saturating_duration_since(Instant::now()));
    }
    match answer {
        Ok(answer) => answer,
        Err(e) => refuse(e.to_string()),
    }
}

/// Whether `reply` can be the answer to `request` (replies carry no request id).
fn answers(request: &Request, reply: &Reply) -> bool {
    match (request, reply) {
        (_, Reply::Error { .. }) => true,
        (Request::ReadFile { path, .. }, Reply::File { path: p }) => p == path,
        (Request::WriteFile { .. }, Reply::Done { op }) => op == "write_file",
        (Request::Status { id }, Reply::Status { id: i, .. }) => i == id,
        (Request::Poll { .. }, Reply::Done { op }) => op == "poll",
        (Request::NetConnect { .. }, Reply::Done { op }) => op == "net_connect",
        (Request::FileOp { op, .. }, reply) => match (op, reply) {
            (pvisor_agent_proto::FileOp::Stat { path }, Reply::Stat { stat }) => &stat.path == path,
            (pvisor_agent_proto::FileOp::List { .. }, Reply::Listing { .. }) => true,
            (
                pvisor_agent_proto::FileOp::MkParents { .. } | pvisor_agent_proto::FileOp::Resolve { .. },
                Reply::Resolved { .. },
            ) => true,
            (pvisor_agent_proto::FileOp::Mkdir { .. }, Reply::Done { op }) => op == "mkdir",
            (pvisor_agent_proto::FileOp::Remove { .. }, Reply::Done { op }) => op == "remove",
            (pvisor_agent_proto::FileOp::Rename { .. }, Reply::Done { op }) => op == "rename",
            (pvisor_agent_proto::FileOp::Chmod { .. }, Reply::Done { op }) => op == "chmod",
            _ => false,
        },
        _ => false,
    }
}

/// Connects the caller to guest `127.0.0.1:port`: once the agent has
/// connected, the control connection carries the stream's raw bytes.
fn forward(shared: &Shared, port: u16, stream: UnixStream) -> io::Result<()> {
    let answer = |response: &ControlResponse| -> io::Result<()> {
        let mut line = serde_json::to_vec(response).map_err(io::Error::other)?;
        line.push(b'\n');
        (&stream).write_all(&line)
    };
    let id = pvisor_agent_proto::HOST_STREAM
        | (shared.next_stream.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            & !pvisor_agent_proto::HOST_STREAM);
    if shared.net.streams.lock().unwrap_or_else(|p| p.into_inner()).len() >= MAX_STREAMS {
        return answer(&ControlResponse::Error {
            message: format!("the VM already has {MAX_STREAMS} open streams"),
        });
    }
    let conn = Conn::Unix(stream.try_clone()?);
    let reader = conn.reader()?;
    let (ready, wait) = mpsc::channel();
    shared.net.register(id, conn, &shared.agent, Some(wait))?;
    let (reply, _) = guest_call(shared, Request::NetConnect { stream: id, port }, &[]);
    if let Reply::Error { message, .. } = reply {
        shared.net.streams.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        return answer(&ControlResponse::Error {
            message: format!("nothing accepts connections on port {port} in the guest ({message})"),
        });
    }
    answer(&ControlResponse::Forwarded)?;
    let _ = ready.send(());
    shared.net.pump_to_guest(id, reader, &shared.agent);
    Ok(())
}

/// Starts `spec` and relays it until it exits or the caller hangs up.
fn relay_exec(
    shared: &Shared,
    spec: pvisor_sandbox::guest::ExecSpec,
    from: BufReader<UnixStream>,
    to: UnixStream,
) -> io::Result<()> {
    let id = spec.id;
    let (tx, rx) = mpsc::sync_channel(RELAY_BACKLOG);
    let attached =
        (id != EXEC_ID).then(|| shared.sinks.lock().unwrap_or_else(|p| p.into_inner()).attach(id, tx));
    if !matches!(attached, Some(Some(_))) {
        let message = format!("exec id {id} is in use, or the VM's agent is gone");
        return write_frame(&mut &to, &Reply::ExecFailed { id, errno: libc::EEXIST, message }, &[]);
    }
    let exec = Request::Exec {
        id,
        argv: spec.argv,
        env: spec.env,
        cwd: spec.cwd,
        root: spec.root,
        output: spec.output,
        terminal: spec.terminal,
        confinement: spec.confinement,
    };
    if let Err(e) = shared.send(&exec, &[]) {
        shared.sinks.lock().unwrap_or_else(|p| p.into_inner()).detach(id);
        let message = format!("cannot reach the agent: {e}");
        return write_frame(&mut &to, &Reply::ExecFailed { id, errno: libc::EIO, message }, &[]);
    }
    relay(shared, id, from, to, rx)
}

/// Relays exec `id`, which runs in the guest without a relay here (a
/// resumed guest's command, started before this supervisor): first the
/// output held for it since the restore, then its frames as they come. One
/// that has already ended is sent its `Exited` again (an agent `Poll`).
fn attach_exec(shared: &Shared, id: u32, from: BufReader<UnixStream>, to: UnixStream) -> io::Result<()> {
    let (tx, rx) = mpsc::sync_channel(RELAY_BACKLOG);
    let attached =
        (id != EXEC_ID).then(|| shared.sinks.lock().unwrap_or_else(|p| p.into_inner()).attach(id, tx));
    let Some(Some(held)) = attached else {
        let message = format!(
            "exec {id} is relayed already (or is the Attempt's own command, or the VM's agent is gone)"
        );
        return write_frame(&mut &to, &Reply::ExecFailed { id, errno: libc::EEXIST, message }, &[]);
    };
    let ended = held.iter().any(|(reply, _)| matches!(reply, Reply::Exited { .. }));
    if ended {
        shared.sinks.lock().unwrap_or_else(|p| p.into_inner()).detach(id);
    }
    for (reply, bytes) in held {
        write_frame(&mut &to, &reply, &bytes)?;
    }
    if ended {
        let _ = to.shutdown(std::net::Shutdown::Both);
        return Ok(());
    }
    if let (Reply::Error { message, .. }, _) = guest_call(shared, Request::Poll { id }, &[]) {
        shared.sinks.lock().unwrap_or_else(|p| p.into_inner()).detach(id);
        let message = format!("cannot ask the guest about exec {id}: {message}");
        return write_frame(&mut &to, &Reply::ExecFailed { id, errno: libc::EIO, message }, &[]);
    }
    relay(shared, id, from, to, rx)
}

/// Carries exec `id`'s frames from `rx` to the caller, and the caller's
/// signals, stdin and resizes (forced to this exec's id) to the agent,
/// until it exits or the caller hangs up.
fn relay(
    shared: &Shared,
    id: u32,
    mut from: BufReader<UnixStream>,
    to: UnixStream,
    rx: mpsc::Receiver<(Reply, Vec<u8>)>,
) -> io::Result<()> {
    let agent = shared.agent.clone();
    std::thread::Builder::new().name("pvisor-vm-relay-in".into()).spawn(move || {
        while let Ok(Some((request, payload))) = read_frame::<Request>(&mut from) {
            let request = match request {
                Request::Stdin { .. } => Request::Stdin { id },
                Request::CloseStdin { .. } => Request::CloseStdin { id },
                Request::Signal { signal, .. } => Request::Signal { id, signal },
                Request::Resize { size, .. } => Request::Resize { id, size },
                _ => continue,
            };
            let mut agent = agent.lock().unwrap_or_else(|p| p.into_inner());
            if write_frame(&mut *agent, &request, &payload).is_err() {
                return;
            }
        }
    })?;
    for (reply, bytes) in rx {
        if write_frame(&mut &to, &reply, &bytes).is_err() {
            // The caller hung up; the process keeps running (see `guest`).
            shared.sinks.lock().unwrap_or_else(|p| p.into_inner()).detach(id);
            break;
        }
    }
    // Ended (exit, hang-up, or cut off for stalling): close both directions,
    // which also ends the relay-in thread and tells the caller.
    let _ = to.shutdown(std::net::Shutdown::Both);
    Ok(())
}

/// Why a request to the control socket of an Attempt's supervisor failed
/// (a checkpoint, or a guest access of [`super::guest`]).
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("no VM directory at {} ({source})", dir.display())]
    NoDirectory { dir: PathBuf, source: io::Error },
    #[error("the VM's supervisor is not reachable at {} ({source}); is the Job running?", path.display())]
    Unreachable { path: PathBuf, source: io::Error },
    /// Setting up or writing the request failed.
    #[error("{0}")]
    Io(#[source] io::Error),
    #[error("{0}")]
    Encode(#[source] serde_json::Error),
    #[error("cannot reach the VM's supervisor: {0}")]
    Send(#[source] io::Error),
    #[error("no answer from the supervisor: {0}")]
    NoAnswer(#[source] io::Error),
    #[error("the supervisor answered garbage: {0}")]
    Garbage(#[source] serde_json::Error),
    #[error("no answer from the VM's supervisor: {0}")]
    NoReply(#[source] io::Error),
    #[error("the VM's supervisor closed the connection")]
    Closed,
    /// The guest's agent answered a call with its `Error` reply.
    #[error("the guest failed {op}: {message}")]
    GuestFailed { op: String, message: String },
    /// The supervisor refused the request, saying why.
    #[error("{0}")]
    Refused(String),
    #[error("the supervisor answered {0}")]
    Unexpected(String),
}

/// Connects to the control socket of the live supervisor of an Attempt
/// (through `/proc/self/fd` when the path is too long for `sun_path`).
pub(super) fn connect_control(vm_dir: &Path) -> Result<UnixStream, ControlError> {
    let path = control_socket(vm_dir);
    let dir = fs::File::open(vm_dir)
        .map_err(|source| ControlError::NoDirectory { dir: vm_dir.to_owned(), source })?;
    let short = PathBuf::from(format!("/proc/self/fd/{}/{}", dir.as_raw_fd(), CONTROL_SOCKET));
    let target = if path.as_os_str().len() < 100 { path.clone() } else { short };
    UnixStream::connect(&target).map_err(|source| ControlError::Unreachable { path, source })
}

/// Sends a control request to the live supervisor of an Attempt.
pub fn control(
    vm_dir: &Path,
    request: &ControlRequest,
    timeout: Duration,
) -> Result<ControlResponse, ControlError> {
    let stream = connect_control(vm_dir)?;
    stream.set_read_timeout(Some(timeout)).map_err(ControlError::Io)?;
    let mut line = serde_json::to_vec(request).map_err(ControlError::Encode)?;
    line.push(b'\n');
    (&stream).write_all(&line).map_err(ControlError::Io)?;
    let mut answer = String::new();
    BufReader::new(&stream).read_line(&mut answer).map_err(ControlError::NoAnswer)?;
    serde_json::from_str(&answer).map_err(ControlError::Garbage)
}
