//! `pvisor-agent`: PID 1 of pvisor's microVM guests.
//!
//! It brings the guest up (pseudo-filesystems, the kernel modules the image
//! lists), opens the AgentCtl virtio-serial port and serves [`Request`]s:
//! exec with streamed stdio, signals, files, quiesce/thaw for execution
//! checkpoints, clock and entropy repair after a restore, and the export of
//! the overlay's upper layer that becomes the Run's stage on the host.
//!
//! Threads: the main thread reads requests; one writer thread owns the port's
//! write side (replies stay ordered); a reaper thread collects every child,
//! since PID 1 inherits orphans; each exec has two output pumps and a finisher.
//! While the host side of the port is closed (between a checkpoint and its
//! restore), reads return EOF and writes block, so output waits in the guest
//! rather than being lost.
//!
//! This file is the request loop and its dispatch; each concern lives in its
//! module: [`init`] (PID 1 setup and the workspace overlay), [`delta`]
//! (finishing the workspace delta disk), [`link`] (the
//! port, its writer and flow control), [`exec`] (commands and the reaper),
//! [`pty`] (terminals for execs that ask for one), [`container`] and
//! [`cgroup`] (a pod's containers: their namespaces, their cgroups), [`oom`] (the kernel's OOM kills, told to
//! the execs they concern),
//! [`restore`] (quiesce/thaw, clock and CRNG after a restore) and [`export`]
//! (the upper layer).

// The guest's PID 1: its stderr is the guest console (the host's log of the
// guest), and it writes kernel interface files (procfs, sysfs), not records.
#![allow(clippy::disallowed_macros, clippy::disallowed_methods)]

mod cgroup;
mod confine;
mod container;
mod delta;
mod exec;
mod export;
mod init;
mod link;
mod oom;
mod pty;
mod restore;

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pvisor_agent::files::{self, open_regular, read_range};
use pvisor_agent_proto::{read_tagged, Reply, Request, REQUEST_ID};

use exec::{reap, ExecRequest, Execs};
use init::{configure_interface, init_guest, mount_shares, setup_userland, setup_workspace};
use link::{find_port, write_replies, Gate, StreamCredits, Writer};
use pvisor_agent_proto::timing::PhaseClock;
use restore::{quiesce, set_clock, thaw};

/// A reply, its payload, and the id of the request it answers (none for
/// output, stream data and exits, which answer no request).
type Frame = (Reply, Vec<u8>, Option<u64>);
/// Bounded, so a large export or a chatty process waits for the port instead of filling guest RAM.
type Out = SyncSender<Frame>;

fn main() {
    let boot = Instant::now();
    if std::process::id() == 1 {
        if let Err(e) = init_guest() {
            eprintln!("pvisor-agent: guest init failed: {e}");
        }
    }
    let port = match find_port() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("pvisor-agent: {e}");
            halt();
        }
    };
    // The kernel lets one opener hold a port; reads and writes share it.
    let port_file = OpenOptions::new().read(true).write(true).open(&port).unwrap_or_else(|e| fatal(&port, e));
    let writer = port_file.try_clone().unwrap_or_else(|e| fatal(&port, e));
    let (out, out_rx) = mpsc::sync_channel::<Frame>(64);
    let gate = Arc::new(Gate::default());
    {
        let gate = gate.clone();
        std::thread::spawn(move || write_replies(writer, out_rx, gate));
    }
    let execs: Execs = Arc::default();
    {
        let execs = execs.clone();
        std::thread::spawn(move || reap(execs));
    }
    let oom = oom::OomWatch::start(out.clone(), execs.clone());
    let mut agent = Agent {
        out,
        execs,
        oom,
        boot,
        streams: Arc::default(),
        stream_credits: Arc::default(),
        gate,
        answering: None,
    };
    let mut reader = port_file;
    loop {
        match read_tagged::<Request>(&mut reader, REQUEST_ID) {
            Ok(Some((request, id, payload))) => {
                agent.answering = id;
                agent.handle(request, payload);
                agent.answering = None;
            }
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                agent.send(Reply::Error { op: "frame".into(), message: e.to_string() }, Vec::new());
            }
            // EOF: the host side is closed (between a checkpoint and its restore).
            Ok(None) | Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn fatal(what: &Path, e: io::Error) -> ! {
    eprintln!("pvisor-agent: cannot open {}: {e}", what.display());
    halt()
}

fn halt() -> ! {
    if std::process::id() == 1 {
        // PID 1 exiting would panic the kernel: power off instead.
        rustix::fs::sync();
        let _ = rustix::system::reboot(rustix::system::RebootCommand::PowerOff);
    }
    std::process::exit(1)
}

/// The request loop's state; the threads it starts hold clones of its parts.
struct Agent {
    out: Out,
    execs: Execs,
    oom: Arc<oom::OomWatch>,
    boot: Instant,
    /// Guest connections to the proxy port: a writer queue per stream id.
    streams: Arc<Mutex<HashMap<u32, Writer>>>,
    /// Guest-to-host chunks in flight per stream (the host acks each).
    stream_credits: Arc<StreamCredits>,
    gate: Arc<Gate>,
    /// The id of the request being handled: every reply the request loop
    /// sends for it names it, so the host never takes it for another's.
    answering: Option<u64>,
}

impl Agent {
    fn send(&self, reply: Reply, payload: Vec<u8>) {
        let _ = self.out.send((reply, payload, self.answering));
    }

    fn done(&self, op: &str, result: io::Result<()>) {
        match result {
            Ok(()) => self.send(Reply::Done { op: op.into() }, Vec::new()),
            Err(e) => self.send(Reply::Error { op: op.into(), message: e.to_string() }, Vec::new()),
        }
    }

    fn handle(&mut self, request: Request, payload: Vec<u8>) {
        match request {
            // A new host connected (first boot, or after a restore): the
            // writer may run again.
            Request::Hello { .. } => {
                self.gate.open();
                self.send(
                    Reply::Hello {
                        version: pvisor_agent_proto::VERSION,
                        agent: format!("pvisor-agent {}", env!("CARGO_PKG_VERSION")),
                        uptime_ms: self.boot.elapsed().as_millis() as u64,
                    },
                    Vec::new(),
                );
            }
            Request::Setup {
                workspace,
                hostname,
                clock_unix_ns,
                proxy_port,
                delta,
                interface,
                shares,
                userland,
            } => {
                let mut steps = PhaseClock::start();
                let _ = set_clock(clock_unix_ns);
                steps.mark("clock");
                let network = match (proxy_port, &interface) {
                    (Some(port), _) => self.listen_proxy(port),
                    (None, Some(interface)) => {
                        // The reaper reaps every child, unless it waits for
                        // this lock: `ip` is waited for by its own Command.
                        let _table = self.execs.lock().unwrap_or_else(|p| p.into_inner());
                        configure_interface(interface)
                    }
                    (None, None) => Ok(()),
                };
                steps.mark("network");
                let ready = network
                    .and_then(|()| setup_workspace(&workspace, &hostname, delta, &mut steps))
                    .and_then(|()| mount_shares(&workspace, &shares))
                    .inspect(|()| steps.mark("shares"))
                    // Last: the shares are inside the workspace it binds.
                    .and_then(|()| if userland { setup_userland(&workspace) } else { Ok(()) })
                    .inspect(|()| steps.mark("userland"));
                match ready {
                    Ok(()) => self.send(Reply::Ready { steps_us: steps.phases() }, Vec::new()),
                    Err(e) => {
                        self.send(Reply::Error { op: "setup".into(), message: e.to_string() }, Vec::new())
                    }
                }
            }
            Request::Exec { id, argv, env, cwd, root, output, terminal, confinement } => {
                self.exec(ExecRequest { id, argv, env, cwd, root, output, terminal, confinement })
            }
            Request::Resize { id, size } => self.resize(id, size),
            Request::Stdin { id } => self.stdin(id, payload),
            Request::CloseStdin { id } => self.close_stdin(id),
            Request::Signal { id, signal } => self.signal(id, signal),
            Request::ReadFile { path, offset, len } => match read_range(&path, offset, len) {
                Ok(bytes) => self.send(Reply::File { path }, bytes),
                Err(e) => {
                    self.send(Reply::Error { op: "read_file".into(), message: e.to_string() }, Vec::new())
                }
            },
            Request::WriteFile { path, mode, append } => {
                let mut options = OpenOptions::new();
                options.write(true).create(true).append(append).mode(mode);
                // Truncate only once it is known to be a regular file.
                let result = open_regular(&options, &path).and_then(|mut f| {
                    if !append {
                        f.set_len(0)?;
                    }
                    f.write_all(&payload)
                });
                self.done("write_file", result)
            }
            Request::FileOp { root, op } => match files::run(&root, op) {
                Ok(reply) => self.send(reply, Vec::new()),
                Err(e) => self.send(Reply::Error { op: "file".into(), message: e.to_string() }, Vec::new()),
            },
            Request::Quiesce => match quiesce() {
                Ok(frozen) => {
                    self.gate.queue_quiesced();
                    self.send(Reply::Quiesced { frozen }, Vec::new())
                }
                Err(e) => {
                    self.send(Reply::Error { op: "quiesce".into(), message: e.to_string() }, Vec::new())
                }
            },
            Request::Thaw => {
                self.gate.open();
                self.done("thaw", thaw())
            }
            Request::NetData { stream } => self.stream_data(stream, payload),
            Request::NetConnect { stream, port } => self.connect_stream(stream, port),
            Request::NetAck { stream } => self.stream_credits.ack(stream),
            Request::NetClose { stream } => self.close_stream(stream),
            Request::Restored { clock_unix_ns } => self.restored(clock_unix_ns, &payload),
            Request::Status { id } => self.status(id),
            Request::Poll { id } => self.poll(id),
            Request::Export => self.export(),
        }
    }
}
