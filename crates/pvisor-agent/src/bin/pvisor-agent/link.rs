//! The link to the host: finding the AgentCtl virtio-serial port, the one
//! writer thread that owns its write side (and the gate that holds it across
//! a checkpoint), and flow control for data in both directions: the
//! [`Writer`] queues that ack host chunks, the [`StreamCredits`] that bound
//! guest chunks, and the proxy/forwarded TCP streams built on them.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pvisor_agent_proto::{write_tagged, Reply, ANSWERS, PORT_NAME};

use crate::init::loopback_up;
use crate::{Agent, Out};

/// Holds the writer between `Quiesced` and the next `Thaw`/`Restored`: the
/// port splits writes at 32 KiB, so a frame written while QEMU stops for a
/// checkpoint could be cut in two, its head going to the old host and its
/// tail to the restored one.
///
/// Counted, not a flag: a `Thaw` may be handled while its `Quiesced` still
/// waits in the queue (a slow host), and must then keep that `Quiesced`
/// from closing the gate afterwards.
#[derive(Default)]
pub(crate) struct Gate {
    state: Mutex<GateState>,
    opened: std::sync::Condvar,
}

#[derive(Default)]
struct GateState {
    /// `Quiesced` replies queued by the request loop.
    queued: u64,
    /// `Quiesced` replies the writer has written.
    written: u64,
    /// The value of `queued` at the last Thaw/Hello/Restored.
    released: u64,
}

impl Gate {
    pub(crate) fn queue_quiesced(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).queued += 1;
    }

    pub(crate) fn open(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.released = state.queued;
        self.opened.notify_all();
    }

    /// Counts a `Quiesced` about to be written.
    fn writing_quiesced(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).written += 1;
    }

    fn wait_open(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while state.written > state.released {
            state = self.opened.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
}

pub(crate) fn write_replies(mut port: File, rx: Receiver<crate::Frame>, gate: Arc<Gate>) {
    for (reply, payload, answers) in rx {
        gate.wait_open();
        // Close the gate *before* `Quiesced` leaves: once the host has read
        // it the guest may be stopped at any instruction, and a close still
        // pending then would run after the restore's `Hello` reopened it.
        if matches!(reply, Reply::Quiesced { .. }) {
            gate.writing_quiesced();
        }
        // A write error means the host side is gone for good; nothing to tell.
        let _ = write_tagged(&mut port, ANSWERS, answers, &reply, &payload);
    }
}

/// Finds `/dev/vportNpM` whose name is [`PORT_NAME`] (there is no udev for the by-name link).
pub(crate) fn find_port() -> io::Result<PathBuf> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(entries) = fs::read_dir("/sys/class/virtio-ports") {
            for entry in entries.flatten() {
                let name = fs::read_to_string(entry.path().join("name")).unwrap_or_default();
                if name.trim() == PORT_NAME {
                    return Ok(Path::new("/dev").join(entry.file_name()));
                }
            }
        }
        if Instant::now() > deadline {
            return Err(io::Error::other(format!("no virtio-serial port named {PORT_NAME}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Flow control for guest-to-host stream data: a stream's pump waits while
/// [`pvisor_agent_proto::CREDITS`] of its chunks are unacknowledged, so a slow
/// host end (a client not reading a forwarded service) stalls that stream
/// only, never the channel every other reply shares.
#[derive(Default)]
pub(crate) struct StreamCredits {
    in_flight: Mutex<HashMap<u32, usize>>,
    freed: std::sync::Condvar,
}

impl StreamCredits {
    /// Waits for room; false once `open` says the stream is gone.
    fn take(&self, stream: u32, open: impl Fn() -> bool) -> bool {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let n = in_flight.entry(stream).or_default();
            if *n < pvisor_agent_proto::CREDITS {
                *n += 1;
                return true;
            }
            if !open() {
                return false;
            }
            in_flight = self
                .freed
                .wait_timeout(in_flight, Duration::from_millis(200))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    pub(crate) fn ack(&self, stream: u32) {
        if let Some(n) = self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&stream) {
            *n = n.saturating_sub(1);
        }
        self.freed.notify_all();
    }

    fn forget(&self, stream: u32) {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).remove(&stream);
        self.freed.notify_all();
    }

    pub(crate) fn clear(&self) {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.freed.notify_all();
    }
}

/// A queue drained by its own thread, so a slow reader in the guest (a
/// process not reading its stdin, a stalled proxy client) never blocks the
/// agent's request loop. Dropping it closes the target.
pub(crate) struct Writer {
    tx: SyncSender<Vec<u8>>,
}

impl Writer {
    pub(crate) fn spawn(
        mut target: impl Write + Send + 'static,
        out: Out,
        ack: Reply,
        on_close: impl FnOnce() + Send + 'static,
    ) -> Self {
        // Room for more than the host keeps in flight (`CREDITS`).
        let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(pvisor_agent_proto::CREDITS * 2);
        std::thread::spawn(move || {
            for bytes in rx {
                if target.write_all(&bytes).is_err() {
                    break;
                }
                let _ = out.send((ack.clone(), Vec::new(), None));
            }
            drop(target);
            on_close();
        });
        Self { tx }
    }

    /// Queues `bytes`; false once the target is gone, or if the host ignored
    /// flow control.
    pub(crate) fn push(&self, bytes: Vec<u8>) -> bool {
        self.tx.try_send(bytes).is_ok()
    }
}

impl Agent {
    /// Queues host bytes for guest connection `stream`.
    pub(crate) fn stream_data(&self, stream: u32, payload: Vec<u8>) {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(conn) = streams.get(&stream) {
            if !conn.push(payload) {
                streams.remove(&stream);
            }
        }
    }

    /// Connects host-initiated `stream` to guest `127.0.0.1:port`.
    pub(crate) fn connect_stream(&self, stream: u32, port: u16) {
        // Bounded: a service whose backlog is full must not hold the
        // request loop for the kernel's whole SYN retry time.
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let connected = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .and_then(|conn| attach_stream(stream, conn, &self.out, &self.streams, &self.stream_credits));
        match connected {
            Ok(start) => {
                // Announced before any of its bytes can be sent.
                self.done("net_connect", Ok(()));
                start();
            }
            Err(e) => self.done("net_connect", Err(e)),
        }
    }

    pub(crate) fn close_stream(&self, stream: u32) {
        // Dropping the writer closes the guest side once queued bytes are out.
        self.streams.lock().unwrap_or_else(|p| p.into_inner()).remove(&stream);
    }

    /// Brings up `lo` and turns each connection to `127.0.0.1:port` into a
    /// stream that the host hands to pvisor's proxy.
    pub(crate) fn listen_proxy(&self, port: u16) -> io::Result<()> {
        loopback_up()?;
        let listener = std::net::TcpListener::bind(("127.0.0.1", port))?;
        let (out, streams, credits) = (self.out.clone(), self.streams.clone(), self.stream_credits.clone());
        std::thread::spawn(move || {
            let mut next = 0u32;
            for conn in listener.incoming().flatten() {
                next = (next + 1) % pvisor_agent_proto::HOST_STREAM;
                let stream = next.max(1);
                if let Ok(start) = attach_stream(stream, conn, &out, &streams, &credits) {
                    // Announced before any of its bytes can be sent.
                    let _ = out.send((Reply::NetOpen { stream }, Vec::new(), None));
                    start();
                }
            }
        });
        Ok(())
    }
}

/// Joins a guest TCP connection to stream `stream`: a writer queue for the
/// host's `NetData` (acked, for flow control) and a pump for the guest's
/// bytes (within the stream's credits); `NetClose` when the guest side ends.
/// The pump starts when the caller calls the returned closure, after it
/// announced the stream, so no byte can arrive before the announcement.
pub(crate) fn attach_stream(
    stream: u32,
    conn: std::net::TcpStream,
    out: &Out,
    streams: &Arc<Mutex<HashMap<u32, Writer>>>,
    credits: &Arc<StreamCredits>,
) -> io::Result<impl FnOnce()> {
    let mut reader = conn.try_clone()?;
    let closer = conn.try_clone().ok();
    let writer = Writer::spawn(conn, out.clone(), Reply::NetAck { stream }, move || {
        if let Some(c) = closer {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    });
    streams.lock().unwrap_or_else(|p| p.into_inner()).insert(stream, writer);
    let (out, streams, credits) = (out.clone(), streams.clone(), credits.clone());
    Ok(move || {
        std::thread::spawn(move || {
            let open = || streams.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&stream);
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if !credits.take(stream, open) {
                            break;
                        }
                        let _ = out.send((Reply::NetData { stream }, buf[..n].to_vec(), None));
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            streams.lock().unwrap_or_else(|p| p.into_inner()).remove(&stream);
            credits.forget(stream);
            let _ = out.send((Reply::NetClose { stream }, Vec::new(), None));
        });
    })
}
