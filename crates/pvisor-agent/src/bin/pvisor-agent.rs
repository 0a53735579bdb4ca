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

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pvisor_agent::files;
use pvisor_agent_proto::{
    read_frame, write_frame, EntryKind, Reply, Request, LOWER_SERIAL, PORT_NAME, UPPER_SERIAL,
};

const LOWER_MNT: &str = "/mnt/pvisor/lower";
const UPPER_MNT: &str = "/mnt/pvisor/upper";
/// How long output pumps may run on after the process exits (a background
/// child holding the pipes open must not delay `Exited` forever).
const OUTPUT_GRACE: Duration = Duration::from_millis(300);

/// Bounded, so a large export or a chatty process waits for the port instead of filling guest RAM.
type Out = SyncSender<(Reply, Vec<u8>)>;

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
    let (out, out_rx) = mpsc::sync_channel::<(Reply, Vec<u8>)>(64);
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
    let mut agent = Agent { out, execs, boot, streams: Arc::default(), stream_credits: Arc::default(), gate };
    let mut reader = port_file;
    loop {
        match read_frame::<Request>(&mut reader) {
            Ok(Some((request, payload))) => agent.handle(request, payload),
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
        // SAFETY: sync and reboot take no pointers; PID 1 exiting would panic the kernel.
        unsafe {
            libc::sync();
            libc::reboot(libc::RB_POWER_OFF);
        }
    }
    std::process::exit(1)
}

/// Holds the writer between `Quiesced` and the next `Thaw`/`Restored`: the
/// port splits writes at 32 KiB, so a frame written while QEMU stops for a
/// checkpoint could be cut in two, its head going to the old host and its
/// tail to the restored one.
///
/// Counted, not a flag: a `Thaw` may be handled while its `Quiesced` still
/// waits in the queue (a slow host), and must then keep that `Quiesced`
/// from closing the gate afterwards.
#[derive(Default)]
struct Gate {
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
    fn queue_quiesced(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).queued += 1;
    }

    fn open(&self) {
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

fn write_replies(mut port: File, rx: Receiver<(Reply, Vec<u8>)>, gate: Arc<Gate>) {
    for (reply, payload) in rx {
        gate.wait_open();
        // Close the gate *before* `Quiesced` leaves: once the host has read
        // it the guest may be stopped at any instruction, and a close still
        // pending then would run after the restore's `Hello` reopened it.
        if matches!(reply, Reply::Quiesced { .. }) {
            gate.writing_quiesced();
        }
        // A write error means the host side is gone for good; nothing to tell.
        let _ = write_frame(&mut port, &reply, &payload);
    }
}

/// Mounts the pseudo-filesystems and loads the modules listed in /etc/pvisor/modules.
fn init_guest() -> io::Result<()> {
    for (src, target, fstype) in [
        ("proc", "/proc", "proc"),
        ("sysfs", "/sys", "sysfs"),
        ("devtmpfs", "/dev", "devtmpfs"),
        ("tmpfs", "/tmp", "tmpfs"),
        ("tmpfs", "/run", "tmpfs"),
    ] {
        fs::create_dir_all(target)?;
        let _ = mount(src, target, fstype, 0, "");
    }
    fs::create_dir_all("/dev/pts")?;
    let _ = mount("devpts", "/dev/pts", "devpts", 0, "ptmxmode=0666");
    let modules = fs::read_to_string("/etc/pvisor/modules").unwrap_or_default();
    let cmdline = fs::read_to_string("/proc/cmdline").unwrap_or_default();
    for module in modules.lines().filter(|l| !l.trim().is_empty()) {
        let file = File::open(module.trim())?;
        let params = CString::new(module_params(module.trim(), &cmdline)).unwrap_or_default();
        // SAFETY: a valid open fd and a NUL-terminated parameter string.
        let rc = unsafe { libc::syscall(libc::SYS_finit_module, file.as_raw_fd(), params.as_ptr(), 0) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                eprintln!("pvisor-agent: cannot load {module}: {e}");
            }
        }
    }
    Ok(())
}

/// The `name.key=value` words of the kernel command line that belong to the
/// module at `path`: modprobe would pass them, and microvm describes its
/// virtio-mmio devices this way (`virtio_mmio.device=…`).
fn module_params(path: &str, cmdline: &str) -> String {
    let file = Path::new(path).file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let name = file.split('.').next().unwrap_or_default().replace('-', "_");
    let prefix = format!("{name}.");
    cmdline.split_whitespace().filter_map(|word| word.strip_prefix(&prefix)).collect::<Vec<_>>().join(" ")
}

fn mount(src: &str, target: &str, fstype: &str, flags: libc::c_ulong, data: &str) -> io::Result<()> {
    let c = |s: &str| CString::new(s).map_err(io::Error::other);
    let (src, target, fstype, data) = (c(src)?, c(target)?, c(fstype)?, c(data)?);
    // SAFETY: all pointers are NUL-terminated strings that outlive the call.
    let rc =
        unsafe { libc::mount(src.as_ptr(), target.as_ptr(), fstype.as_ptr(), flags, data.as_ptr().cast()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Finds `/dev/vportNpM` whose name is [`PORT_NAME`] (there is no udev for the by-name link).
fn find_port() -> io::Result<PathBuf> {
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

/// Finds the block device whose virtio serial is `serial`.
fn disk_by_serial(serial: &str) -> io::Result<PathBuf> {
    for entry in fs::read_dir("/sys/block")?.flatten() {
        let found = fs::read_to_string(entry.path().join("serial")).unwrap_or_default();
        if found.trim() == serial {
            return Ok(Path::new("/dev").join(entry.file_name()));
        }
    }
    Err(io::Error::other(format!("no disk with serial {serial}")))
}

/// Exec ids by pid, and exit statuses that arrived before their pid was registered.
#[derive(Default)]
struct ExecTable {
    by_pid: HashMap<i32, Sender<libc::c_int>>,
    early: HashMap<i32, libc::c_int>,
    groups: HashMap<u32, i32>,
    stdin: HashMap<u32, Writer>,
    /// Exit statuses already reported, for `Poll` after a restore.
    finished: HashMap<u32, (Option<i32>, Option<i32>)>,
}
type Execs = Arc<Mutex<ExecTable>>;

/// Reaps every child (PID 1 inherits orphans). It first *peeks* at an exited
/// child, then reaps it under the table lock, which `exec` holds while
/// spawning: a child whose exec failed is reaped by `Command::spawn` itself,
/// and reaping it here first would make std panic.
fn reap(execs: Execs) {
    loop {
        // SAFETY: siginfo_t is plain data that waitid fills in.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid writes only into `info`; WNOWAIT leaves the child reapable.
        let rc = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc < 0 {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        // SAFETY: waitid succeeded with WEXITED, so si_pid is set.
        let pid = unsafe { info.si_pid() };
        let mut table = execs.lock().unwrap_or_else(|p| p.into_inner());
        let mut status = 0;
        // SAFETY: waitpid writes only into `status`.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } != pid {
            continue; // spawn reaped it (a failed exec)
        }
        match table.by_pid.remove(&pid) {
            Some(tx) => {
                let _ = tx.send(status);
            }
            None => {
                table.early.insert(pid, status);
            }
        }
    }
}

struct Agent {
    out: Out,
    execs: Execs,
    boot: Instant,
    /// Guest connections to the proxy port: a writer queue per stream id.
    streams: Arc<Mutex<HashMap<u32, Writer>>>,
    /// Guest-to-host chunks in flight per stream (the host acks each).
    stream_credits: Arc<StreamCredits>,
    gate: Arc<Gate>,
}

/// Flow control for guest-to-host stream data: a stream's pump waits while
/// [`pvisor_agent_proto::CREDITS`] of its chunks are unacknowledged, so a slow
/// host end (a client not reading a forwarded service) stalls that stream
/// only, never the channel every other reply shares.
#[derive(Default)]
struct StreamCredits {
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

    fn ack(&self, stream: u32) {
        if let Some(n) = self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&stream) {
            *n = n.saturating_sub(1);
        }
        self.freed.notify_all();
    }

    fn forget(&self, stream: u32) {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).remove(&stream);
        self.freed.notify_all();
    }

    fn clear(&self) {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.freed.notify_all();
    }
}

/// A queue drained by its own thread, so a slow reader in the guest (a
/// process not reading its stdin, a stalled proxy client) never blocks the
/// agent's request loop. Dropping it closes the target.
struct Writer {
    tx: SyncSender<Vec<u8>>,
}

impl Writer {
    fn spawn(
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
                let _ = out.send((ack.clone(), Vec::new()));
            }
            drop(target);
            on_close();
        });
        Self { tx }
    }

    /// Queues `bytes`; false once the target is gone, or if the host ignored
    /// flow control.
    fn push(&self, bytes: Vec<u8>) -> bool {
        self.tx.try_send(bytes).is_ok()
    }
}

impl Agent {
    fn send(&self, reply: Reply, payload: Vec<u8>) {
        let _ = self.out.send((reply, payload));
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
            Request::Setup { workspace, hostname, clock_unix_ns, proxy_port } => {
                let _ = set_clock(clock_unix_ns);
                // Loopback is the guest's own: services inside it need it,
                // and it reaches nothing outside.
                let _ = loopback_up();
                let network = match proxy_port {
                    Some(port) => self.listen_proxy(port),
                    None => Ok(()),
                };
                match network.and_then(|()| setup_workspace(&workspace, &hostname)) {
                    Ok(()) => self.send(Reply::Ready, Vec::new()),
                    Err(e) => {
                        self.send(Reply::Error { op: "setup".into(), message: e.to_string() }, Vec::new())
                    }
                }
            }
            Request::Exec { id, argv, env, cwd, root, output } => {
                self.exec(id, argv, env, cwd, root.as_deref(), output.as_deref())
            }
            Request::Stdin { id } => {
                let mut table = self.execs.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(stdin) = table.stdin.get(&id) {
                    if !stdin.push(payload) {
                        table.stdin.remove(&id);
                    }
                }
            }
            Request::CloseStdin { id } => {
                self.execs.lock().unwrap_or_else(|p| p.into_inner()).stdin.remove(&id);
            }
            Request::Signal { id, signal } => {
                let group = self.execs.lock().unwrap_or_else(|p| p.into_inner()).groups.get(&id).copied();
                if let Some(pgid) = group {
                    // SAFETY: kill takes no pointers.
                    unsafe { libc::kill(-pgid, signal) };
                }
            }
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
            Request::NetData { stream } => {
                let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(conn) = streams.get(&stream) {
                    if !conn.push(payload) {
                        streams.remove(&stream);
                    }
                }
            }
            Request::NetConnect { stream, port } => {
                // Bounded: a service whose backlog is full must not hold the
                // request loop for the kernel's whole SYN retry time.
                let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
                let connected =
                    std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).and_then(|conn| {
                        attach_stream(stream, conn, &self.out, &self.streams, &self.stream_credits)
                    });
                match connected {
                    Ok(start) => {
                        // Announced before any of its bytes can be sent.
                        self.done("net_connect", Ok(()));
                        start();
                    }
                    Err(e) => self.done("net_connect", Err(e)),
                }
            }
            Request::NetAck { stream } => self.stream_credits.ack(stream),
            Request::NetClose { stream } => {
                // Dropping the writer closes the guest side once queued bytes are out.
                self.streams.lock().unwrap_or_else(|p| p.into_inner()).remove(&stream);
            }
            Request::Restored { clock_unix_ns } => {
                // Connections to the old host's proxy are gone: reset them.
                self.streams.lock().unwrap_or_else(|p| p.into_inner()).clear();
                self.stream_credits.clear();
                self.gate.open();
                let step = set_clock(clock_unix_ns).unwrap_or(0);
                let _ = reseed(&payload);
                let entropy_avail = fs::read_to_string("/proc/sys/kernel/random/entropy_avail")
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0);
                self.send(Reply::Restored { clock_step_ns: step, entropy_avail }, Vec::new());
            }
            Request::Status { id } => {
                let table = self.execs.lock().unwrap_or_else(|p| p.into_inner());
                let running = table.groups.contains_key(&id);
                let (code, signal) = table.finished.get(&id).copied().unwrap_or((None, None));
                drop(table);
                self.send(Reply::Status { id, running, code, signal }, Vec::new());
            }
            Request::Poll { id } => {
                let finished =
                    self.execs.lock().unwrap_or_else(|p| p.into_inner()).finished.get(&id).copied();
                if let Some((code, signal)) = finished {
                    self.send(Reply::Exited { id, code, signal }, Vec::new());
                }
                self.send(Reply::Done { op: "poll".into() }, Vec::new());
            }
            Request::Export => {
                let upper = Path::new(UPPER_MNT).join("upper");
                // SAFETY: sync takes no arguments.
                unsafe { libc::sync() };
                let mut stats = (0u64, 0u64);
                match export_dir(&upper, &upper, &self.out, &mut stats) {
                    Ok(()) => self.send(Reply::ExportDone { entries: stats.0, bytes: stats.1 }, Vec::new()),
                    Err(e) => {
                        self.send(Reply::Error { op: "export".into(), message: e.to_string() }, Vec::new())
                    }
                }
            }
        }
    }

    /// Brings up `lo` and turns each connection to `127.0.0.1:port` into a
    /// stream that the host hands to pvisor's proxy.
    fn listen_proxy(&self, port: u16) -> io::Result<()> {
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
                    let _ = out.send((Reply::NetOpen { stream }, Vec::new()));
                    start();
                }
            }
        });
        Ok(())
    }

    fn exec(
        &mut self,
        id: u32,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: PathBuf,
        root: Option<&Path>,
        output: Option<&Path>,
    ) {
        let failed = |errno: i32, message: String| Reply::ExecFailed { id, errno, message };
        let Some((program, args)) = argv.split_first() else {
            return self.send(failed(libc::EINVAL, "empty argv".into()), Vec::new());
        };
        let mut command = Command::new(program);
        command.args(args).env_clear().envs(env).stdin(Stdio::piped());
        let open_log = |path: &Path| {
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)?;
            }
            OpenOptions::new().create(true).append(true).mode(0o600).open(path)
        };
        match output.map(open_log) {
            None => {
                command.stdout(Stdio::piped()).stderr(Stdio::piped());
            }
            Some(Ok(log)) => match log.try_clone() {
                Ok(copy) => {
                    command.stdout(copy).stderr(log);
                }
                Err(e) => return self.send(failed(libc::EIO, e.to_string()), Vec::new()),
            },
            Some(Err(e)) => {
                let errno = e.raw_os_error().unwrap_or(libc::EIO);
                return self.send(failed(errno, format!("cannot open the log: {e}")), Vec::new());
            }
        }
        let confine = match root.map(|r| prepare_root(r).map(|()| r)) {
            Some(Err(e)) => {
                return self.send(failed(libc::EIO, format!("cannot prepare the root: {e}")), Vec::new())
            }
            Some(Ok(r)) => Some(
                CString::new(r.as_os_str().as_bytes())
                    .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL)),
            ),
            None => None,
        };
        let cwd = match CString::new(cwd.as_os_str().as_bytes()) {
            Ok(c) => c,
            Err(_) => return self.send(failed(libc::EINVAL, "cwd has a NUL byte".into()), Vec::new()),
        };
        let confine = match confine.transpose() {
            Ok(c) => c,
            Err(e) => return self.send(failed(libc::EINVAL, e.to_string()), Vec::new()),
        };
        // SAFETY: setsid, chroot and chdir are async-signal-safe; the
        // CStrings were built before the fork.
        unsafe {
            command.pre_exec(move || {
                if libc::setsid() < 0 {
                    return Err(io::Error::last_os_error());
                }
                if let Some(root) = &confine {
                    if libc::chroot(root.as_ptr()) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                if libc::chdir(cwd.as_ptr()) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // Hold the table while spawning so the reaper cannot lose this pid's status.
        let mut table = self.execs.lock().unwrap_or_else(|p| p.into_inner());
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                drop(table);
                let errno = e.raw_os_error().unwrap_or(libc::EIO);
                return self.send(Reply::ExecFailed { id, errno, message: e.to_string() }, Vec::new());
            }
        };
        let pid = child.id() as i32;
        let (status_tx, status_rx) = mpsc::channel();
        match table.early.remove(&pid) {
            Some(status) => {
                let _ = status_tx.send(status);
            }
            None => {
                table.by_pid.insert(pid, status_tx);
            }
        }
        table.groups.insert(id, pid);
        if let Some(stdin) = child.stdin.take() {
            table.stdin.insert(id, Writer::spawn(stdin, self.out.clone(), Reply::StdinAck { id }, || {}));
        }
        drop(table);
        self.send(Reply::Started { id, pid }, Vec::new());
        let pumps = [
            child.stdout.take().map(|r| pump(r, self.out.clone(), move || Reply::Stdout { id })),
            child.stderr.take().map(|r| pump(r, self.out.clone(), move || Reply::Stderr { id })),
        ];
        let (out, execs) = (self.out.clone(), self.execs.clone());
        std::thread::spawn(move || {
            let status = status_rx.recv().unwrap_or(0);
            let grace = Instant::now() + OUTPUT_GRACE;
            for done in pumps.into_iter().flatten() {
                let _ = done.recv_timeout(grace.saturating_duration_since(Instant::now()));
            }
            let (code, signal) = if libc::WIFEXITED(status) {
                (Some(libc::WEXITSTATUS(status)), None)
            } else {
                (None, Some(libc::WTERMSIG(status)))
            };
            let mut table = execs.lock().unwrap_or_else(|p| p.into_inner());
            table.stdin.remove(&id);
            table.groups.remove(&id);
            table.finished.insert(id, (code, signal));
            drop(table);
            let _ = out.send((Reply::Exited { id, code, signal }, Vec::new()));
        });
    }
}

/// Joins a guest TCP connection to stream `stream`: a writer queue for the
/// host's `NetData` (acked, for flow control) and a pump for the guest's
/// bytes (within the stream's credits); `NetClose` when the guest side ends.
/// The pump starts when the caller calls the returned closure, after it
/// announced the stream, so no byte can arrive before the announcement.
fn attach_stream(
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
                        let _ = out.send((Reply::NetData { stream }, buf[..n].to_vec()));
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            streams.lock().unwrap_or_else(|p| p.into_inner()).remove(&stream);
            credits.forget(stream);
            let _ = out.send((Reply::NetClose { stream }, Vec::new()));
        });
    })
}

/// Copies a pipe into output frames; the returned channel fires at EOF.
fn pump(
    mut r: impl Read + Send + 'static,
    out: Out,
    frame: impl Fn() -> Reply + Send + 'static,
) -> Receiver<()> {
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let _ = out.send((frame(), buf[..n].to_vec()));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = done_tx.send(());
    });
    done_rx
}

/// `ip link set lo up`, by ioctl (there is no iproute2 in the guest).
fn loopback_up() -> io::Result<()> {
    #[repr(C)]
    struct IfReq {
        name: [u8; 16],
        flags: libc::c_short,
        _pad: [u8; 22],
    }
    // SAFETY: a plain socket for interface ioctls.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut req = IfReq { name: [0; 16], flags: 0, _pad: [0; 22] };
    req.name[..2].copy_from_slice(b"lo");
    req.flags = (libc::IFF_UP | libc::IFF_LOOPBACK | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads a struct ifreq; ours has its layout and size.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) };
    let err = io::Error::last_os_error();
    // SAFETY: closing the socket we opened.
    unsafe { libc::close(fd) };
    if rc != 0 {
        return Err(err);
    }
    Ok(())
}

fn setup_workspace(workspace: &Path, hostname: &str) -> io::Result<()> {
    let ctx = |what: String| move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
    if !hostname.is_empty() {
        // SAFETY: pointer and length describe `hostname`.
        unsafe { libc::sethostname(hostname.as_ptr().cast(), hostname.len()) };
    }
    fs::create_dir_all(LOWER_MNT)?;
    fs::create_dir_all(UPPER_MNT)?;
    let lower = disk_by_serial(LOWER_SERIAL)?;
    let upper = disk_by_serial(UPPER_SERIAL)?;
    let lower_s = lower.to_string_lossy().into_owned();
    let upper_s = upper.to_string_lossy().into_owned();
    mount(&lower_s, LOWER_MNT, "ext4", libc::MS_RDONLY | libc::MS_NODEV, "")
        .map_err(ctx(format!("mounting the workspace image {lower_s}")))?;
    mount(&upper_s, UPPER_MNT, "ext4", libc::MS_NODEV, "")
        .map_err(ctx(format!("mounting the upper disk {upper_s}")))?;
    let (up, work) = (Path::new(UPPER_MNT).join("upper"), Path::new(UPPER_MNT).join("work"));
    fs::create_dir_all(&up)?;
    fs::create_dir_all(&work)?;
    // The upper root must look like the workspace root.
    let root = fs::metadata(LOWER_MNT)?;
    fs::set_permissions(&up, fs::Permissions::from_mode(root.mode() & 0o7777))?;
    std::os::unix::fs::chown(&up, Some(root.uid()), Some(root.gid()))?;
    fs::create_dir_all(workspace)?;
    let options = format!(
        "lowerdir={LOWER_MNT},upperdir={},workdir={},redirect_dir=off,index=off,metacopy=off,xino=off",
        up.display(),
        work.display()
    );
    mount("overlay", &workspace.to_string_lossy(), "overlay", 0, &options)
        .map_err(ctx(format!("mounting the overlay at {}", workspace.display())))
}

/// Reads at most `len` bytes (and at most `MAX_PAYLOAD`) from `offset`.
fn read_range(path: &Path, offset: u64, len: Option<u64>) -> io::Result<Vec<u8>> {
    use std::io::{Seek, SeekFrom};
    let mut file = open_regular(OpenOptions::new().read(true), path)?;
    file.seek(SeekFrom::Start(offset))?;
    let limit = len.unwrap_or(u64::MAX).min(u64::from(pvisor_agent_proto::MAX_PAYLOAD));
    let mut bytes = Vec::new();
    file.take(limit).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Opens `path` without blocking (a FIFO or a tty would hang the agent's
/// only request loop) and refuses anything but a regular file.
fn open_regular(options: &OpenOptions, path: &Path) -> io::Result<File> {
    let mut options = options.clone();
    options.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    let file = options.open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    // Regular-file I/O ignores O_NONBLOCK, but clear it anyway, and only it
    // (F_SETFL replaces every status flag: O_APPEND must stay).
    // SAFETY: F_GETFL/F_SETFL on our own descriptor.
    unsafe {
        let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    Ok(file)
}

/// Makes a sandbox root usable by chrooted commands: `/proc`, `/dev` (with
/// `/dev/pts` and `/dev/shm`) and a world-writable `/tmp`. Idempotent.
fn prepare_root(root: &Path) -> io::Result<()> {
    let proc_dir = root.join("proc");
    if proc_dir.join("self").exists() {
        return Ok(());
    }
    for (dir, mode) in [("proc", 0o555), ("dev", 0o755), ("sys", 0o555), ("tmp", 0o1777)] {
        let path = root.join(dir);
        if !path.is_dir() {
            fs::create_dir_all(&path)?;
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
        }
    }
    let at = |dir: &str| root.join(dir).to_string_lossy().into_owned();
    mount("proc", &at("proc"), "proc", libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC, "")?;
    mount("devtmpfs", &at("dev"), "devtmpfs", libc::MS_NOSUID, "")?;
    for (dir, fstype, data) in
        [("dev/pts", "devpts", "newinstance,ptmxmode=0666"), ("dev/shm", "tmpfs", "mode=1777")]
    {
        let _ = fs::create_dir_all(root.join(dir));
        let _ = mount(fstype, &at(dir), fstype, libc::MS_NOSUID | libc::MS_NOEXEC, data);
    }
    let _ = mount(
        "sysfs",
        &at("sys"),
        "sysfs",
        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        "",
    );
    Ok(())
}

fn quiesce() -> io::Result<Vec<PathBuf>> {
    // SAFETY: sync takes no arguments.
    unsafe { libc::sync() };
    let mut frozen = Vec::new();
    if Path::new(UPPER_MNT).join("upper").is_dir() {
        freeze_ioctl(UPPER_MNT, FIFREEZE)?;
        frozen.push(PathBuf::from(UPPER_MNT));
    }
    Ok(frozen)
}

fn thaw() -> io::Result<()> {
    match freeze_ioctl(UPPER_MNT, FITHAW) {
        // EINVAL: not frozen (thaw after a restore whose checkpoint froze is still fine).
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        other => other,
    }
}

const FIFREEZE: libc::c_ulong = 0xC004_5877;
const FITHAW: libc::c_ulong = 0xC004_5878;

fn freeze_ioctl(mountpoint: &str, request: libc::c_ulong) -> io::Result<()> {
    let dir = File::open(mountpoint)?;
    // SAFETY: FIFREEZE/FITHAW take an int argument that the kernel ignores.
    let rc = unsafe { libc::ioctl(dir.as_raw_fd(), request, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Steps CLOCK_REALTIME to the host's time; returns how far it moved.
fn set_clock(unix_ns: i64) -> io::Result<i64> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    let ts = libc::timespec {
        tv_sec: (unix_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (unix_ns % 1_000_000_000) as _,
    };
    // SAFETY: a valid timespec.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unix_ns - now)
}

/// Mixes host entropy into the pool and forces the CRNG to reseed, so a
/// restored or forked guest does not repeat its parent's random stream.
fn reseed(entropy: &[u8]) -> io::Result<()> {
    const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
    const RNDRESEEDCRNG: libc::c_ulong = 0x5207;
    let random = OpenOptions::new().write(true).open("/dev/urandom")?;
    let mut buf = Vec::with_capacity(8 + entropy.len());
    buf.extend_from_slice(&((entropy.len() * 8) as i32).to_ne_bytes());
    buf.extend_from_slice(&(entropy.len() as i32).to_ne_bytes());
    buf.extend_from_slice(entropy);
    // SAFETY: `buf` is a struct rand_pool_info followed by its buffer.
    unsafe {
        libc::ioctl(random.as_raw_fd(), RNDADDENTROPY, buf.as_ptr());
        libc::ioctl(random.as_raw_fd(), RNDRESEEDCRNG, 0);
    }
    Ok(())
}

fn export_dir(root: &Path, dir: &Path, out: &Out, stats: &mut (u64, u64)) -> io::Result<()> {
    let mut entries: Vec<_> = fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let meta = fs::symlink_metadata(&path)?;
        let rel = path.strip_prefix(root).map_err(io::Error::other)?.as_os_str().as_bytes().to_vec();
        let ft = meta.file_type();
        let mtime_ns = meta.mtime() as i64 * 1_000_000_000 + meta.mtime_nsec() as i64;
        let (kind, target, opaque) = if ft.is_dir() {
            (EntryKind::Dir, None, xattr_is(&path, "trusted.overlay.opaque", b"y"))
        } else if ft.is_symlink() {
            (EntryKind::Symlink, Some(fs::read_link(&path)?.as_os_str().as_bytes().to_vec()), false)
        } else if ft.is_char_device() && meta.rdev() == 0 {
            (EntryKind::Whiteout, None, false)
        } else if ft.is_fifo() {
            (EntryKind::Fifo, None, false)
        } else if ft.is_file() {
            (EntryKind::File, None, false)
        } else {
            continue; // sockets and device nodes are not workspace content
        };
        let size = if kind == EntryKind::File { meta.len() } else { 0 };
        let header =
            Reply::Entry { path: rel, kind, mode: meta.mode() & 0o7777, mtime_ns, size, target, opaque };
        let _ = out.send((header, Vec::new()));
        stats.0 += 1;
        match kind {
            EntryKind::File => {
                let mut file = File::open(&path)?;
                let mut left = size;
                let mut buf = vec![0u8; 1 << 20];
                while left > 0 {
                    let want = buf.len().min(left as usize);
                    let n = file.read(&mut buf[..want])?;
                    if n == 0 {
                        return Err(io::Error::other(format!("{} shrank during export", path.display())));
                    }
                    let _ = out.send((Reply::Data, buf[..n].to_vec()));
                    left -= n as u64;
                    stats.1 += n as u64;
                }
            }
            EntryKind::Dir => export_dir(root, &path, out, stats)?,
            _ => {}
        }
    }
    Ok(())
}

fn xattr_is(path: &Path, name: &str, want: &[u8]) -> bool {
    let (Ok(p), Ok(n)) = (CString::new(path.as_os_str().as_bytes()), CString::new(name)) else {
        return false;
    };
    let mut buf = [0u8; 8];
    // SAFETY: valid C strings and a buffer of the stated length.
    let len = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    len > 0 && &buf[..len as usize] == want
}
