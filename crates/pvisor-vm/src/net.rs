//! The guest's network streams on the host side: each agent stream is a TCP
//! connection to pvisor's policy proxy on host loopback, or the control
//! connection of a port forward, pumped both ways within the stream's credits.
//!
//! The guest opens streams at will, so what it costs the host is fixed: at
//! most [`MAX_STREAMS`] live streams (two threads each), and every stream
//! the host cannot take is refused by one refusal thread through a bounded
//! queue; a refusal that finds the queue full is dropped (the guest's own
//! connection then waits on a stream nobody answers), never a thread more.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use pvisor_agent_proto::{write_frame, Request};

use super::credit::{Credit, Credits};

/// Concurrent proxy connections one guest may hold open.
pub(super) const MAX_STREAMS: usize = 256;
/// Refusals waiting for the agent channel; past this the guest's stream is left unanswered.
const REFUSALS: usize = 256;

/// The host ends of the guest's streams: each agent stream is a TCP
/// connection to pvisor's proxy on host loopback, or a port forward.
#[derive(Clone)]
pub(super) struct NetBridge {
    pub(super) proxy: Option<SocketAddr>,
    pub(super) streams: Arc<Mutex<HashMap<u32, HostEnd>>>,
    pub(super) credits: Arc<Credits>,
    /// Proxy streams whose host-to-guest pump still runs (a closed stream's
    /// pump ends when its proxy connection does): what bounds their threads.
    live: Arc<AtomicUsize>,
    /// The refusal thread's queue.
    refusals: SyncSender<u32>,
    /// Refusals dropped because the queue was full.
    pub(super) unrefused: Arc<AtomicUsize>,
}

impl std::fmt::Debug for NetBridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetBridge").field("proxy", &self.proxy).finish_non_exhaustive()
    }
}

/// The host end of a stream: a connection to the policy proxy (guest
/// connections to its proxy port), or the control connection of a port
/// forward ([`guest::forward`]).
#[derive(Debug)]
pub(super) enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    pub(super) fn try_clone(&self) -> io::Result<Conn> {
        Ok(match self {
            Conn::Tcp(c) => Conn::Tcp(c.try_clone()?),
            Conn::Unix(c) => Conn::Unix(c.try_clone()?),
        })
    }

    pub(super) fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Conn::Tcp(c) => c.write_all(bytes),
            Conn::Unix(c) => c.write_all(bytes),
        }
    }

    pub(super) fn shutdown(&self, how: std::net::Shutdown) {
        let _ = match self {
            Conn::Tcp(c) => c.shutdown(how),
            Conn::Unix(c) => c.shutdown(how),
        };
    }

    pub(super) fn reader(&self) -> io::Result<Box<dyn Read + Send>> {
        Ok(match self {
            Conn::Tcp(c) => Box::new(c.try_clone()?),
            Conn::Unix(c) => Box::new(c.try_clone()?),
        })
    }
}

/// A stream's host end, written by its own thread from a queue: the guest
/// sends at most [`pvisor_agent_proto::CREDITS`] chunks before an ack, so the
/// agent reader never waits on a slow host end. An empty chunk closes it.
#[derive(Debug)]
pub(super) struct HostEnd {
    queue: SyncSender<Vec<u8>>,
    conn: Conn,
}

impl NetBridge {
    /// The bridge to `proxy` (if the guest may reach one), with its refusal thread.
    pub(super) fn new(
        proxy: Option<SocketAddr>,
        credits: Arc<Credits>,
        agent: &Arc<Mutex<UnixStream>>,
    ) -> io::Result<Self> {
        let (refusals, refused) = mpsc::sync_channel::<u32>(REFUSALS);
        let agent = agent.clone();
        // Off the reader thread: a checkpoint may hold the channel, and it
        // waits for the reader to deliver its `Quiesced`.
        std::thread::Builder::new().name("pvisor-vm-net-refuse".into()).spawn(move || {
            for stream in refused {
                let mut agent = agent.lock().unwrap_or_else(|p| p.into_inner());
                let _ = write_frame(&mut *agent, &Request::NetClose { stream }, &[]);
            }
        })?;
        Ok(Self {
            proxy,
            streams: Arc::default(),
            credits,
            live: Arc::default(),
            refusals,
            unrefused: Arc::default(),
        })
    }

    /// The guest connected to its proxy port: a connection to the proxy,
    /// or a refusal when there is no proxy or the guest holds too many.
    pub(super) fn open(&self, stream: u32, agent: &Arc<Mutex<UnixStream>>) {
        let known = self.streams.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&stream);
        let full = self.live.load(Ordering::SeqCst) >= MAX_STREAMS;
        let conn = self.proxy.filter(|_| !full && !known).and_then(|addr| TcpStream::connect(addr).ok());
        let Some(conn) = conn else {
            if self.refusals.try_send(stream).is_err() {
                self.unrefused.fetch_add(1, Ordering::Relaxed);
            }
            return;
        };
        let conn = Conn::Tcp(conn);
        let Ok(reader) = conn.reader() else { return };
        if self.register(stream, conn, agent, None).is_ok() {
            self.pump_to_guest(stream, reader, agent);
        }
    }

    /// Makes `conn` the host end of `stream`, with its writer thread; with
    /// `ready`, the thread writes nothing until it fires (a forward first
    /// answers its caller on the same connection).
    pub(super) fn register(
        &self,
        stream: u32,
        conn: Conn,
        agent: &Arc<Mutex<UnixStream>>,
        ready: Option<Receiver<()>>,
    ) -> io::Result<()> {
        let mut writer = conn.try_clone()?;
        let (queue, chunks) = mpsc::sync_channel::<Vec<u8>>(pvisor_agent_proto::CREDITS * 2);
        let (agent, streams) = (agent.clone(), self.streams.clone());
        std::thread::Builder::new().name("pvisor-vm-net-out".into()).spawn(move || {
            if ready.is_some_and(|r| r.recv().is_err()) {
                return;
            }
            for bytes in chunks {
                if bytes.is_empty() {
                    writer.shutdown(std::net::Shutdown::Write);
                    return;
                }
                if writer.write_all(&bytes).is_err() {
                    break;
                }
                let mut agent = agent.lock().unwrap_or_else(|p| p.into_inner());
                let _ = write_frame(&mut *agent, &Request::NetAck { stream }, &[]);
            }
            // The host end is gone: so is the stream.
            writer.shutdown(std::net::Shutdown::Both);
            streams.lock().unwrap_or_else(|p| p.into_inner()).remove(&stream);
        })?;
        self.streams.lock().unwrap_or_else(|p| p.into_inner()).insert(stream, HostEnd { queue, conn });
        Ok(())
    }

    /// Copies the host end's bytes to the guest as `NetData` (within the
    /// stream's credits), then `NetClose`.
    pub(super) fn pump_to_guest(
        &self,
        stream: u32,
        mut reader: Box<dyn Read + Send>,
        agent: &Arc<Mutex<UnixStream>>,
    ) {
        let (agent, streams, credits) = (agent.clone(), self.streams.clone(), self.credits.clone());
        let live = self.live.clone();
        live.fetch_add(1, Ordering::SeqCst);
        let spawned = std::thread::Builder::new().name("pvisor-vm-net".into()).spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            let closed = |s: &Arc<Mutex<HashMap<u32, HostEnd>>>| {
                !s.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&stream)
            };
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if !credits.take(Credit::Stream(stream), || closed(&streams)) => break,
                    Ok(n) => {
                        let mut agent = agent.lock().unwrap_or_else(|p| p.into_inner());
                        if write_frame(&mut *agent, &Request::NetData { stream }, &buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
            credits.forget(Credit::Stream(stream));
            {
                let mut agent = agent.lock().unwrap_or_else(|p| p.into_inner());
                let _ = write_frame(&mut *agent, &Request::NetClose { stream }, &[]);
            }
            live.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            self.live.fetch_sub(1, Ordering::SeqCst);
            self.close(stream);
        }
    }

    /// Guest bytes for `stream`: queued, never waited on (the guest keeps
    /// within its credits; one that does not loses the stream).
    pub(super) fn data(&self, stream: u32, bytes: Vec<u8>) {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(end) = streams.get(&stream) {
            if bytes.is_empty() {
                return;
            }
            if end.queue.try_send(bytes).is_err() {
                end.conn.shutdown(std::net::Shutdown::Both);
                streams.remove(&stream);
            }
        }
    }

    /// The guest closed `stream`: the host end gets EOF once its queue is out,
    /// and the stream is forgotten (its host-to-guest pump stops too).
    pub(super) fn close(&self, stream: u32) {
        if let Some(end) = self.streams.lock().unwrap_or_else(|p| p.into_inner()).remove(&stream) {
            let _ = end.queue.try_send(Vec::new());
        }
    }
}
