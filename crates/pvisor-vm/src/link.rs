//! The agent link: the state shared by the waiter, the control thread and
//! the signaller ([`Shared`]), request/reply calls over the virtio-serial
//! channel, the reader thread that routes every agent frame, and the
//! per-exec and per-stream credits that bound host-to-guest data.
//!
//! The agent is as untrusted as the command (root in the guest can write
//! frames on the agent's port), so nothing a frame says may make the host
//! grow without bound or wait: a call's answer must name the call's request
//! id ([`Calls`]); a reply nobody waits for is dropped and counted, and past
//! [`MAX_UNREQUESTED`] the agent is cut off; output is held only for the
//! execs a restored guest may have running, within [`HELD_TOTAL`] bytes and
//! [`MAX_HELD_EXECS`] execs; the reader never blocks on a queue the guest
//! fills.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pvisor_agent_proto::{read_tagged, write_frame, write_tagged, Reply, Request, ANSWERS, REQUEST_ID};

pub(super) use super::credit::{Credit, Credits};
use super::net::NetBridge;
use super::qemu::reap;
use super::{qmp, ExecCheckpoint, GuestImage, MachineConfig, VmSpec, EXEC_ID};
use pvisor_sandbox::{sys, SandboxSpec, Usage};

/// What the agent reader thread tells the waiter.
#[derive(Debug)]
pub(super) enum AgentEvent {
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
    },
    /// The guest's OOM killer killed a process while the command ran.
    OomKill,
    Gone(String),
}

/// Where the replies of execs started through [`guest::exec`] (or attached
/// to) go, by exec id.
pub(super) type Sinks = Arc<Mutex<Relays>>;
/// Frames (up to 64 KiB each) a relayed exec may have in flight to its caller.
pub(super) const RELAY_BACKLOG: usize = 64;
/// Bytes of output held for one exec of a restored guest until a caller
/// attaches to it; beyond that the oldest frames are dropped.
const HELD_BYTES: usize = 1 << 20;
/// Bytes held across all of a restored guest's execs: past it, frames of
/// an exec with nothing held yet are dropped.
pub(super) const HELD_TOTAL: usize = 4 << 20;
/// Execs of a restored guest whose output is held; frames of any other are dropped.
pub(super) const MAX_HELD_EXECS: usize = 16;
/// Replies nobody waits for (unrequested, stale, or past a full queue) the
/// agent may send before the host cuts it off.
pub(super) const MAX_UNREQUESTED: usize = 256;

/// The relays of this supervisor's execs, and what is held for the execs
/// of a restored guest, which started before this supervisor did.
#[derive(Debug, Default)]
pub(super) struct Relays {
    /// Bounded: a relay whose caller reads slowly holds the guest back (as
    /// our own stdout does), for at most [`RELAY_STALL`].
    sinks: HashMap<u32, SyncSender<(Reply, Vec<u8>)>>,
    /// Every exec this supervisor has relayed: their frames without a
    /// relay are dropped (the caller left on purpose).
    known: HashSet<u32>,
    /// Frames of execs this supervisor never relayed (a resumed guest's
    /// commands, running on across the pause), kept for an attach.
    held: HashMap<u32, Held>,
    /// The agent link is down: no relay can start any more.
    ended: bool,
    /// The guest was restored from a checkpoint, so it may run execs this
    /// supervisor never started; only then is any output held.
    pub(super) holding: bool,
    /// Bytes in `held`, across execs.
    held_bytes: usize,
    /// Output bytes dropped because no exec may hold them (the guest sent
    /// frames for execs that do not exist, or too many).
    pub(super) unheld: usize,
    /// Where the command's own output goes when the frontend captures it
    /// (else pvisor's stdout and stderr).
    pub(super) output: Option<pvisor_sandbox::CapturedOutput>,
}

#[derive(Debug, Default)]
struct Held {
    frames: VecDeque<(Reply, Vec<u8>)>,
    bytes: usize,
    dropped: usize,
}

impl Relays {
    /// Relays exec `id`'s frames to `sink` from now on; returns the frames
    /// held for it until now, which go first. `None` if it has a relay,
    /// or the agent link is down.
    pub(super) fn attach(
        &mut self,
        id: u32,
        sink: SyncSender<(Reply, Vec<u8>)>,
    ) -> Option<VecDeque<(Reply, Vec<u8>)>> {
        if self.ended || self.sinks.contains_key(&id) {
            return None;
        }
        self.known.insert(id);
        self.sinks.insert(id, sink);
        let held = self.held.remove(&id).unwrap_or_default();
        self.held_bytes -= held.bytes;
        if held.dropped > 0 {
            tracing::warn!(
                exec = id,
                bytes = held.dropped,
                "output of a resumed exec was dropped before a caller attached to it"
            );
        }
        Some(held.frames)
    }

    pub(super) fn detach(&mut self, id: u32) {
        self.sinks.remove(&id);
    }

    /// The agent link is down (the VM stopped, was suspended or died):
    /// every relay ends, so each caller sees its channel end and asks the
    /// Job what became of its exec, instead of waiting on a guest that is
    /// gone.
    fn end_all(&mut self) {
        self.ended = true;
        self.sinks.clear();
    }

    fn sink(&self, id: u32) -> Option<SyncSender<(Reply, Vec<u8>)>> {
        self.sinks.get(&id).cloned()
    }

    /// Keeps a frame of an exec this supervisor has never relayed, if the
    /// guest was restored (a booted guest runs only execs started here) and
    /// the exec has room: at most [`MAX_HELD_EXECS`] execs, [`HELD_BYTES`]
    /// each (the oldest frames go first) and [`HELD_TOTAL`] in all.
    fn hold(&mut self, id: u32, frame: (Reply, Vec<u8>)) {
        if self.known.contains(&id) {
            return;
        }
        let size = frame.1.len();
        let room = self.holding
            && (self.held.contains_key(&id) || self.held.len() < MAX_HELD_EXECS)
            && (self.held_bytes + size <= HELD_TOTAL || self.held.get(&id).is_some_and(|h| h.bytes >= size));
        if !room {
            self.unheld += size;
            return;
        }
        let held = self.held.entry(id).or_default();
        held.bytes += size;
        self.held_bytes += size;
        held.frames.push_back(frame);
        while held.bytes > HELD_BYTES || self.held_bytes > HELD_TOTAL {
            let Some((_, bytes)) = held.frames.pop_front() else { break };
            held.bytes -= bytes.len();
            self.held_bytes -= bytes.len();
            held.dropped += bytes.len();
        }
    }
}
/// How long a relay's full queue may stall the guest before it is cut off.
const RELAY_STALL: Duration = Duration::from_secs(30);

/// A call's answer as the reader queues it: the request id it names, the reply, its payload.
pub(super) type Answer = (u64, Reply, Vec<u8>);

/// Request ids, shared by the callers and the reader: each call's request
/// carries a fresh id and only a reply naming it is its answer. Id 0 is an
/// untagged frame (`Hello`, which an agent of any version must parse).
#[derive(Debug, Default)]
pub(super) struct Calls {
    next: AtomicU64,
    /// The id of the call now waiting for its answer.
    awaited: AtomicU64,
    /// Replies nobody waited for, so far.
    unrequested: AtomicUsize,
}

impl Calls {
    /// A fresh id, awaited from now on.
    fn start(&self) -> u64 {
        let id = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        self.awaited.store(id, Ordering::SeqCst);
        id
    }

    /// The call `id` has its answer (or gave up waiting): frames naming it
    /// from now on are late answers, dropped by the reader.
    fn end(&self, id: u64) {
        let _ = self.awaited.compare_exchange(id, NO_CALL, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Whether a frame naming `id` answers the call now awaited (id 0, an
    /// untagged frame, answers `Hello`).
    fn is_awaited(&self, id: u64) -> bool {
        id == self.awaited.load(Ordering::SeqCst)
    }

    /// Whether `id` names a request this host sent: a reply naming one
    /// that is no longer awaited is a late answer (its call timed out), not
    /// an unrequested reply.
    fn issued(&self, id: u64) -> bool {
        id != 0 && id <= self.next.load(Ordering::SeqCst)
    }

    /// Counts a reply nobody asked for; true once the agent is past the limit.
    pub(super) fn unrequested(&self) -> bool {
        self.unrequested.fetch_add(1, Ordering::SeqCst) + 1 > MAX_UNREQUESTED
    }

    pub(super) fn cut_off(&self) -> bool {
        self.unrequested.load(Ordering::SeqCst) > MAX_UNREQUESTED
    }
}

/// What [`Calls::awaited`] holds between calls: no frame names it (ids
/// count up from 1, and 0 is `Hello`'s).
const NO_CALL: u64 = u64::MAX;

/// Why the reader stopped listening to an agent that sent too much unasked.
/// Why a call to the agent (or a QMP command through [`Shared`]) failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkError {
    #[error("cannot reach the agent: {0}")]
    Unreachable(#[source] io::Error),
    /// The agent answered with its `Error` reply.
    #[error("the agent failed {op}: {message}")]
    Failed { op: String, message: String },
    #[error("the agent did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the agent sent more replies nobody asked for than the host accepts (256); it is cut off")]
    CutOff,
    #[error("the agent connection closed")]
    Closed,
    #[error(transparent)]
    Qmp(#[from] qmp::QmpError),
}

/// State shared by the waiter, the control thread and the signaller.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) agent: Arc<Mutex<UnixStream>>,
    pub(super) sinks: Sinks,
    /// The guest's streams (proxy connections and port forwards).
    pub(super) net: NetBridge,
    /// The next host-initiated stream id (below [`pvisor_agent_proto::HOST_STREAM`]).
    pub(super) next_stream: std::sync::atomic::AtomicU32,
    pub(super) credits: Arc<Credits>,
    pub(super) calls: Arc<Calls>,
    pub(super) replies: Mutex<Receiver<Answer>>,
    /// Serialises multi-step agent/QMP operations (checkpoint, export).
    pub(super) op: Mutex<()>,
    pub(super) qmp: Mutex<qmp::Qmp>,
    pub(super) qemu: Mutex<Option<Child>>,
    pub(super) qemu_pidfd: Arc<OwnedFd>,
    pub(super) exited: Mutex<bool>,
    pub(super) suspended: Mutex<Option<ExecCheckpoint>>,
    pub(super) image: GuestImage,
    pub(super) config: MachineConfig,
    pub(super) spec: SandboxSpec,
    pub(super) vm: VmSpec,
    /// The Attempt's disk files in device order (see [`super::disk::Disk::of`]).
    pub(super) disks: Vec<PathBuf>,
    /// The MAC of the guest's NIC, when it joined a network namespace.
    pub(super) nic_mac: Option<String>,
    /// The virtiofsd of each shared directory; they end with QEMU.
    pub(super) file_servers: Mutex<super::virtiofs::FileServers>,
    /// Set once QEMU is reaped: the control socket's thread ends, and with
    /// it the last hold on this state (a long-lived frontend, such as an
    /// MCP server, runs many VMs in one process).
    pub(super) control_stop: std::sync::atomic::AtomicBool,
}

impl Shared {
    /// Removes the Attempt's disk files (its scratch; checkpoints hold their own).
    pub(super) fn remove_disks(&self) {
        for disk in &self.disks {
            let _ = std::fs::remove_file(disk);
        }
    }

    pub(super) fn send(&self, request: &Request, payload: &[u8]) -> io::Result<()> {
        let mut agent = self.agent.lock().unwrap_or_else(|p| p.into_inner());
        write_frame(&mut *agent, request, payload)
    }

    /// Sends `request` with a fresh request id and waits for the first
    /// reply that names it. The channel is held only for the write, so
    /// signals and stdin are never stuck behind a slow answer.
    pub(super) fn call(
        &self,
        request: &Request,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(Reply, Vec<u8>), LinkError> {
        let id = self.send_call(request, payload)?;
        let answer = self.next_reply(timeout);
        self.end_call(id);
        answer
    }

    /// Sends `request` with a fresh request id, without waiting: its
    /// answers are [`next_reply`](Self::next_reply)'s until
    /// [`end_call`](Self::end_call) with the id returned.
    pub(super) fn send_call(&self, request: &Request, payload: &[u8]) -> Result<u64, LinkError> {
        let mut agent = self.agent.lock().unwrap_or_else(|p| p.into_inner());
        let id = self.calls.start();
        write_tagged(&mut *agent, REQUEST_ID, Some(id), request, payload).map_err(LinkError::Unreachable)?;
        Ok(id)
    }

    /// Call `id` is over: the reader stops queueing (and waiting to queue)
    /// frames that name it.
    pub(super) fn end_call(&self, id: u64) {
        self.calls.end(id);
    }

    /// `Hello`, untagged: an agent of another protocol version must still
    /// parse it to say which version it speaks.
    pub(super) fn hello(&self, timeout: Duration) -> Result<(Reply, Vec<u8>), LinkError> {
        self.calls.awaited.store(0, Ordering::SeqCst);
        let request = Request::Hello { version: pvisor_agent_proto::VERSION };
        self.send(&request, &[]).map_err(LinkError::Unreachable)?;
        let answer = self.next_reply(timeout);
        self.calls.end(0);
        answer
    }

    /// [`call`](Self::call) on a channel the caller holds: a checkpoint holds
    /// it from `Quiesce` to `Thaw` (or `quit`), so no other host frame can be
    /// half-delivered when the guest stops.
    pub(super) fn call_held(
        &self,
        agent: &mut UnixStream,
        request: &Request,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(Reply, Vec<u8>), LinkError> {
        // A late answer to an earlier call that timed out names that call's id.
        let id = self.calls.start();
        write_tagged(agent, REQUEST_ID, Some(id), request, payload).map_err(LinkError::Unreachable)?;
        let answer = self.next_reply(timeout);
        self.end_call(id);
        answer
    }

    /// The next reply to the call now awaited; one naming another request
    /// (a late answer queued before this call began) is dropped.
    pub(super) fn next_reply(&self, timeout: Duration) -> Result<(Reply, Vec<u8>), LinkError> {
        let deadline = Instant::now() + timeout;
        let replies = self.replies.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match replies.recv_timeout(left) {
                Ok((id, _, _)) if id != self.calls.awaited.load(Ordering::SeqCst) => {}
                Ok((_, Reply::Error { op, message }, _)) => return Err(LinkError::Failed { op, message }),
                Ok((_, reply, payload)) => return Ok((reply, payload)),
                Err(RecvTimeoutError::Timeout) => return Err(LinkError::Timeout(timeout)),
                Err(RecvTimeoutError::Disconnected) if self.calls.cut_off() => return Err(LinkError::CutOff),
                Err(RecvTimeoutError::Disconnected) => return Err(LinkError::Closed),
            }
        }
    }

    pub(super) fn qmp<R: serde::de::DeserializeOwned>(&self, command: &qmp::Command) -> Result<R, LinkError> {
        Ok(self.qmp.lock().unwrap_or_else(|p| p.into_inner()).execute(command)?)
    }

    /// Why QEMU stopped the guest on a disk error, if it did: QEMU pauses a
    /// VM whose disk write hit ENOSPC (its default `werror=enospc`), which
    /// from here looks like a guest that never answers. Names the disk file
    /// and the filesystem that is full.
    pub(super) fn disk_error(&self) -> Option<String> {
        let status: qmp::Status = self.qmp(&qmp::Command::QueryStatus).ok()?;
        if status.status != "io-error" {
            return None;
        }
        let drives: Vec<qmp::BlockInfo> = self.qmp(&qmp::Command::QueryBlock).unwrap_or_default();
        let failed = drives.iter().find(|d| d.io_status.as_deref().is_some_and(|s| s != "ok"));
        Some(match failed {
            Some(drive) if drive.io_status.as_deref() == Some("nospace") => format!(
                "no space left on device (ENOSPC): QEMU could not write the guest disk {}; its filesystem (the state directory's) is full, and the VM stopped",
                drive.inserted.as_ref().map_or("?", |i| i.file.as_str())
            ),
            Some(drive) => format!(
                "an I/O error on the guest disk {} stopped the VM",
                drive.inserted.as_ref().map_or("?", |i| i.file.as_str())
            ),
            None => "a disk I/O error stopped the VM".into(),
        })
    }

    pub(super) fn qemu_running(&self) -> bool {
        let mut qemu = self.qemu.lock().unwrap_or_else(|p| p.into_inner());
        qemu.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Asks QEMU to quit and reaps it; returns its exit status and usage.
    pub(super) fn quit_and_reap(&self) -> (String, Usage) {
        tracing::debug!("asking QEMU to quit");
        let _ = self.qmp::<qmp::Empty>(&qmp::Command::Quit);
        let child = self.qemu.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(child) = child else { return ("already reaped".into(), Usage::default()) };
        let reaped = reap(child, Duration::from_secs(10));
        self.file_servers.lock().unwrap_or_else(|p| p.into_inner()).stop();
        self.control_stop.store(true, std::sync::atomic::Ordering::Release);
        reaped
    }
}

/// Routes agent frames: the command's output to our stdout/stderr, other
/// execs' replies to their relays, proxy streams to the proxy, the exit to
/// the waiter, everything else to whoever holds the op lock.
///
/// It never waits on anything the guest can fill: a reply that names no
/// call now waiting is dropped (a late answer to a call that timed out) and
/// counted when it names no request ever sent, as is an answer that finds
/// the queue full; an agent past [`MAX_UNREQUESTED`] of those is cut off.
#[allow(clippy::too_many_arguments)]
pub(super) fn read_agent(
    mut stream: UnixStream,
    replies: SyncSender<Answer>,
    calls: Arc<Calls>,
    events: Sender<AgentEvent>,
    net: NetBridge,
    agent: Arc<Mutex<UnixStream>>,
    credits: Arc<Credits>,
    sinks: Sinks,
) {
    let captured = sinks.lock().unwrap_or_else(|p| p.into_inner()).output.clone();
    loop {
        let frame = read_tagged::<Reply>(&mut stream, ANSWERS)
            .map(|frame| frame.map(|(reply, id, bytes)| (reply, bytes, id.unwrap_or(0))));
        if let Ok(Some((reply, bytes, _))) = frame.as_ref() {
            if let Some(id) = relayed_exec(reply) {
                // Never a `call`'s answer: a relayed exec's frames go to its
                // relay, or nowhere if its caller left; those of an exec that
                // predates this supervisor (a resumed guest's) are held for
                // a caller that attaches to it.
                let sink = {
                    let mut relays = sinks.lock().unwrap_or_else(|p| p.into_inner());
                    let sink = relays.sink(id);
                    if sink.is_none() {
                        relays.hold(id, (reply.clone(), bytes.clone()));
                    }
                    sink
                };
                if let Some(sink) = sink {
                    let last = matches!(reply, Reply::Exited { .. } | Reply::ExecFailed { .. });
                    if !relay_frame(&sink, (reply.clone(), bytes.clone())) || last {
                        sinks.lock().unwrap_or_else(|p| p.into_inner()).detach(id);
                    }
                }
                continue;
            }
        }
        match frame {
            Ok(Some((Reply::Stdout { .. }, bytes, _))) => {
                let _ = sys::write_all(
                    captured.as_ref().map_or(rustix::stdio::stdout(), |o| o.stdout.as_fd()),
                    &bytes,
                );
            }
            Ok(Some((Reply::Stderr { .. }, bytes, _))) => {
                let _ = sys::write_all(
                    captured.as_ref().map_or(rustix::stdio::stderr(), |o| o.stderr.as_fd()),
                    &bytes,
                );
            }
            Ok(Some((Reply::NetOpen { stream }, _, _))) => net.open(stream, &agent),
            Ok(Some((Reply::NetData { stream }, bytes, _))) => net.data(stream, bytes),
            Ok(Some((Reply::NetClose { stream }, _, _))) => net.close(stream),
            Ok(Some((Reply::Exited { id: EXEC_ID, code, signal }, _, _))) => {
                let _ = events.send(AgentEvent::Exited { code, signal });
            }
            Ok(Some((Reply::Oom { .. }, _, _))) => {
                let _ = events.send(AgentEvent::OomKill);
            }
            Ok(Some((Reply::StdinAck { id }, _, _))) if id == EXEC_ID => credits.release(Credit::Stdin),
            Ok(Some((Reply::StdinAck { .. }, _, _))) => {}
            Ok(Some((Reply::NetAck { stream }, _, _))) => credits.release(Credit::Stream(stream)),
            Ok(Some((reply, bytes, id))) => {
                let awaited = calls.is_awaited(id);
                match awaited.then(|| queue_answer(&replies, &calls, (id, reply, bytes))) {
                    Some(Ok(())) => {}
                    Some(Err(TrySendError::Disconnected(_))) => break,
                    // A late answer to a call that timed out: dropped, not held against the agent.
                    None if calls.issued(id) => {}
                    None | Some(Err(TrySendError::Full(_))) => {
                        if calls.unrequested() {
                            tracing::warn!("agent link cut off: {}", LinkError::CutOff);
                            let _ = events.send(AgentEvent::Gone(LinkError::CutOff.to_string()));
                            break;
                        }
                    }
                }
            }
            Ok(None) => {
                tracing::info!("agent link down: the agent connection closed");
                let _ = events.send(AgentEvent::Gone("the agent connection closed".into()));
                break;
            }
            Err(e) => {
                tracing::info!(error = %e, "agent link down: the agent stream broke");
                let _ = events.send(AgentEvent::Gone(format!("the agent stream broke: {e}")));
                break;
            }
        }
    }
    sinks.lock().unwrap_or_else(|p| p.into_inner()).end_all();
}

/// How long the reader waits for room in the reply queue for the call being
/// awaited. An answer may be many frames (an export streams every staged
/// byte as replies to one call): a caller busy writing them is backpressure,
/// not a flood, so the reader waits for it. A caller that takes no frame in
/// this long, or a call that ends meanwhile, gets the frame dropped instead,
/// so the reader never blocks for ever on the guest's say-so.
const REPLY_STALL: Duration = Duration::from_secs(30);

/// Queues an answer to the awaited call, waiting while the caller drains the
/// queue (see [`REPLY_STALL`]).
fn queue_answer(
    replies: &SyncSender<(u64, Reply, Vec<u8>)>,
    calls: &Calls,
    mut frame: (u64, Reply, Vec<u8>),
) -> Result<(), TrySendError<(u64, Reply, Vec<u8>)>> {
    let deadline = Instant::now() + REPLY_STALL;
    loop {
        match replies.try_send(frame) {
            Err(TrySendError::Full(back)) if Instant::now() < deadline && calls.is_awaited(back.0) => {
                frame = back;
                std::thread::sleep(Duration::from_millis(1));
            }
            other => return other,
        }
    }
}

/// Queues a frame for a relay, waiting up to [`RELAY_STALL`] for room;
/// false when the relay is gone or stalled (it is then cut off).
fn relay_frame(sink: &SyncSender<(Reply, Vec<u8>)>, mut frame: (Reply, Vec<u8>)) -> bool {
    let deadline = Instant::now() + RELAY_STALL;
    loop {
        match sink.try_send(frame) {
            Ok(()) => return true,
            Err(mpsc::TrySendError::Disconnected(_)) => return false,
            Err(mpsc::TrySendError::Full(back)) if Instant::now() < deadline => {
                frame = back;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(mpsc::TrySendError::Full(_)) => return false,
        }
    }
}

/// The exec a reply belongs to, when it is not the Attempt's own command.
fn relayed_exec(reply: &Reply) -> Option<u32> {
    match reply {
        Reply::Started { id, .. }
        | Reply::ExecFailed { id, .. }
        | Reply::Stdout { id }
        | Reply::Stderr { id }
        | Reply::Oom { id, .. }
        | Reply::Exited { id, .. } => Some(*id).filter(|id| *id != EXEC_ID),
        _ => None,
    }
}

#[cfg(test)]
#[path = "link_tests.rs"]
mod tests;
