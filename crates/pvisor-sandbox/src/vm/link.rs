//! The agent link: the state shared by the waiter, the control thread and
//! the signaller ([`Shared`]), request/reply calls over the virtio-serial
//! channel, the reader thread that routes every agent frame, and the
//! per-exec and per-stream credits that bound host-to-guest data.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Child;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pvisor_agent_proto::{read_frame, write_frame, Reply, Request};

use super::net::NetBridge;
use super::qemu::reap;
use super::{qmp, ExecCheckpoint, GuestImage, MachineConfig, VmSpec, EXEC_ID};
use crate::{sys, SandboxSpec, Usage};

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

    /// Keeps a frame of an exec this supervisor has never relayed.
    fn hold(&mut self, id: u32, frame: (Reply, Vec<u8>)) {
        if self.known.contains(&id) {
            return;
        }
        let held = self.held.entry(id).or_default();
        held.bytes += frame.1.len();
        held.frames.push_back(frame);
        while held.bytes > HELD_BYTES {
            let Some((_, bytes)) = held.frames.pop_front() else { break };
            held.bytes -= bytes.len();
            held.dropped += bytes.len();
        }
    }
}
/// How long a relay's full queue may stall the guest before it is cut off.
const RELAY_STALL: Duration = Duration::from_secs(30);

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
    pub(super) replies: Mutex<Receiver<(Reply, Vec<u8>)>>,
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

    /// Sends `request` and waits for the next non-output reply.
    /// The channel is held only for the write, so signals and stdin are
    /// never stuck behind a slow answer.
    pub(super) fn call(
        &self,
        request: &Request,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(Reply, Vec<u8>), String> {
        while self.replies.lock().unwrap_or_else(|p| p.into_inner()).try_recv().is_ok() {}
        self.send(request, payload).map_err(|e| format!("cannot reach the agent: {e}"))?;
        self.next_reply(timeout)
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
    ) -> Result<(Reply, Vec<u8>), String> {
        // A late answer to an earlier call that timed out must not be taken for this one.
        while self.replies.lock().unwrap_or_else(|p| p.into_inner()).try_recv().is_ok() {}
        write_frame(agent, request, payload).map_err(|e| format!("cannot reach the agent: {e}"))?;
        self.next_reply(timeout)
    }

    pub(super) fn next_reply(&self, timeout: Duration) -> Result<(Reply, Vec<u8>), String> {
        let replies = self.replies.lock().unwrap_or_else(|p| p.into_inner());
        match replies.recv_timeout(timeout) {
            Ok((Reply::Error { op, message }, _)) => Err(format!("the agent failed {op}: {message}")),
            Ok(reply) => Ok(reply),
            Err(RecvTimeoutError::Timeout) => Err(format!("the agent did not answer within {timeout:?}")),
            Err(RecvTimeoutError::Disconnected) => Err("the agent connection closed".into()),
        }
    }

    pub(super) fn qmp<R: serde::de::DeserializeOwned>(&self, command: &qmp::Command) -> Result<R, String> {
        self.qmp.lock().unwrap_or_else(|p| p.into_inner()).execute(command).map_err(|e| e.to_string())
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
        reaped
    }
}

/// What a host-to-guest data chunk is charged to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Credit {
    Stdin,
    Stream(u32),
}

/// Flow control for host-to-guest data: at most [`pvisor_agent_proto::CREDITS`]
/// chunks in flight per exec or stream; the agent acks each one it wrote.
#[derive(Debug, Default)]
pub(super) struct Credits {
    in_flight: Mutex<HashMap<Credit, usize>>,
    freed: std::sync::Condvar,
}

impl Credits {
    /// Waits for room, then charges one chunk. False if `gone` says to stop.
    pub(super) fn take(&self, key: Credit, gone: impl Fn() -> bool) -> bool {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if gone() {
                return false;
            }
            let used = in_flight.entry(key).or_default();
            if *used < pvisor_agent_proto::CREDITS {
                *used += 1;
                return true;
            }
            in_flight = self
                .freed
                .wait_timeout(in_flight, Duration::from_millis(200))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    pub(super) fn release(&self, key: Credit) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(used) = in_flight.get_mut(&key) {
            *used = used.saturating_sub(1);
        }
        self.freed.notify_all();
    }

    pub(super) fn forget(&self, key: Credit) {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        self.freed.notify_all();
    }
}

/// Routes agent frames: the command's output to our stdout/stderr, other
/// execs' replies to their relays, proxy streams to the proxy, the exit to
/// the waiter, everything else to whoever holds the op lock.
pub(super) fn read_agent(
    mut stream: UnixStream,
    replies: SyncSender<(Reply, Vec<u8>)>,
    events: Sender<AgentEvent>,
    net: NetBridge,
    agent: Arc<Mutex<UnixStream>>,
    credits: Arc<Credits>,
    sinks: Sinks,
) {
    loop {
        let frame = read_frame::<Reply>(&mut stream);
        if let Ok(Some((reply, bytes))) = frame.as_ref() {
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
            Ok(Some((Reply::Stdout { .. }, bytes))) => {
                let _ = sys::write_all(rustix::stdio::stdout(), &bytes);
            }
            Ok(Some((Reply::Stderr { .. }, bytes))) => {
                let _ = sys::write_all(rustix::stdio::stderr(), &bytes);
            }
            Ok(Some((Reply::NetOpen { stream }, _))) => net.open(stream, &agent),
            Ok(Some((Reply::NetData { stream }, bytes))) => net.data(stream, bytes),
            Ok(Some((Reply::NetClose { stream }, _))) => net.close(stream),
            Ok(Some((Reply::Exited { id: EXEC_ID, code, signal }, _))) => {
                let _ = events.send(AgentEvent::Exited { code, signal });
            }
            Ok(Some((Reply::Oom { .. }, _))) => {
                let _ = events.send(AgentEvent::OomKill);
            }
            Ok(Some((Reply::StdinAck { id }, _))) if id == EXEC_ID => credits.release(Credit::Stdin),
            Ok(Some((Reply::StdinAck { .. }, _))) => {}
            Ok(Some((Reply::NetAck { stream }, _))) => credits.release(Credit::Stream(stream)),
            Ok(Some(reply)) => {
                if replies.send(reply).is_err() {
                    break;
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
