//! The `vm` executor: one QEMU microVM per Attempt, driven over QMP, with
//! `pvisor-agent` as the guest's PID 1 (AgentCtl over virtio-serial).
//!
//! The workspace reaches the guest as two disks: a read-only ext4 image of
//! the workspace (lower) and a sparse writable ext4 disk (upper), joined by an
//! overlay the agent mounts at the workspace's own path. When the command
//! ends, the agent streams the upper layer out and [`export`] writes it into
//! the Run's stage in the same format the `ns` backend leaves, so review,
//! apply, preimages and receipts have no VM special case.
//!
//! Execution checkpoints ([`checkpoint`]) go through a control socket in the
//! Attempt's `vm/` directory: quiesce through the agent, `stop`, migrate the
//! machine state to a file, copy the upper disk, publish a manifest with
//! digests, then either `cont` (checkpoint) or `quit` (suspend). A suspended
//! Attempt's `wait` returns [`Termination::Suspended`] only after QEMU exited.

pub mod checkpoint;
mod disk;
mod export;
pub mod guest;
pub mod image;
mod live;
mod qmp;

use std::collections::HashMap;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use pvisor_agent_proto::{read_frame, write_frame, Reply, Request};

pub use checkpoint::{ControlRequest, ControlResponse, ExecCheckpoint};
pub use image::{AccelChoice, Accelerator, GuestImage};
pub use live::VmControl;

use crate::{
    sys, Executor, ExitReport, NetworkAttachment, SandboxError, SandboxProcess, SandboxSpec, Signaller,
    Termination, Usage,
};

/// The one exec id of an Attempt's command (the protocol allows more).
const EXEC_ID: u32 = 1;
/// Replies the reader buffers for the op in progress; beyond that it waits,
/// so a flooding guest stalls only itself, never the supervisor's memory.
const REPLY_BACKLOG: usize = 64;
/// Concurrent proxy connections one guest may hold open.
const MAX_STREAMS: usize = 256;
/// After a SIGKILL sent through the agent, how long before QEMU itself is killed.
const VM_KILL_GRACE: Duration = Duration::from_secs(5);
/// Default guest RAM when no `--memory` limit is given.
const DEFAULT_MEMORY_MIB: u64 = 512;

/// What the `vm` backend needs beyond the common spec.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VmSpec {
    /// The Attempt's private directory: disks, console log, control socket.
    pub dir: PathBuf,
    /// Where this Run's execution checkpoints are written.
    pub checkpoints: PathBuf,
    /// An execution checkpoint to restore instead of booting (resume, fork).
    pub restore: Option<PathBuf>,
    /// Opaque facts of the runtime (job, attempt, baseline), copied into
    /// every checkpoint manifest.
    pub context: serde_json::Value,
}

/// The machine shape; a restore must repeat it exactly.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MachineConfig {
    pub memory_mib: u64,
    pub cpus: u32,
    pub accelerator: Accelerator,
}

/// The microVM executor. Holds the verified image and the accelerator decision.
#[derive(Clone, Debug)]
pub struct VmExecutor {
    image: GuestImage,
    accel: AccelChoice,
}

impl VmExecutor {
    /// Installs the built guest image under `state_root` and picks the accelerator.
    pub fn prepare(state_root: &Path) -> Result<Self, SandboxError> {
        let built = GuestImage::locate_built()?;
        let image = GuestImage::install(&built, state_root)?;
        let accel = image::choose_accelerator(&image);
        Ok(Self { image, accel })
    }

    /// The executor a checkpoint was taken with: its installed image (verified)
    /// and its accelerator, since machine state only restores onto the same.
    pub fn for_checkpoint(state_root: &Path, manifest: &ExecCheckpoint) -> Result<Self, SandboxError> {
        let image = GuestImage::open_installed(state_root, &manifest.image)?;
        let accel = AccelChoice {
            accelerator: manifest.machine.accelerator,
            reason: format!("restoring a checkpoint taken under {}", manifest.machine.accelerator.as_str()),
        };
        Ok(Self { image, accel })
    }

    pub fn image(&self) -> &GuestImage {
        &self.image
    }

    pub fn accelerator(&self) -> &AccelChoice {
        &self.accel
    }
}

impl Executor for VmExecutor {
    fn name(&self) -> &'static str {
        "vm"
    }

    fn describe_attachment(&self, attachment: NetworkAttachment) -> String {
        describe_attachment(attachment)
    }

    fn placement_details(&self) -> Vec<(String, String)> {
        vec![
            ("accelerator".into(), self.accel.accelerator.as_str().into()),
            ("accelerator_reason".into(), self.accel.reason.clone()),
            ("image".into(), self.image.digest.clone()),
            ("guest_kernel".into(), self.image.kernel_version.clone()),
        ]
    }

    fn start(&self, spec: &SandboxSpec) -> Result<Box<dyn SandboxProcess>, SandboxError> {
        VmProcess::start(self, spec).map(|p| Box::new(p) as Box<dyn SandboxProcess>)
    }
}

/// How a VM is attached to the network, as recorded in the Bundle. Both
/// modes are non-bypassable: the guest has no network device at all.
fn describe_attachment(attachment: NetworkAttachment) -> String {
    match attachment {
        NetworkAttachment::Isolated => "microVM without a network device".into(),
        NetworkAttachment::ProxyListener { port } => format!(
            "microVM without a network device; guest 127.0.0.1:{port} is relayed by the agent over virtio-serial to pvisor's proxy"
        ),
        NetworkAttachment::Host => "refused: a VM cannot share the host network".into(),
    }
}

fn setup(step: &str, message: impl std::fmt::Display) -> SandboxError {
    SandboxError::Setup { step: step.into(), message: message.to_string(), hint: None }
}

/// Escapes a value for a QEMU `key=value,...` option (commas are doubled).
fn opt(path: &Path) -> String {
    path.to_string_lossy().replace(',', ",,")
}

/// Quotes `path` for the shell that QEMU's `exec:` migration runs.
fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.to_string_lossy().replace('\'', r"'\''"))
}

/// The Attempt's disk images, removed unless the VM started (then `wait`
/// owns them).
struct Scratch(Vec<PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = fs::remove_file(path);
        }
    }
}

/// The QEMU command line shared by boots, restores and the KVM probe. The
/// device list and its order are part of the migration contract.
pub(crate) fn qemu_command(
    image: &GuestImage,
    config: &MachineConfig,
    disks: Option<(&Path, &Path)>,
    agent: &UnixStream,
    qmp: &UnixStream,
    console: &UnixStream,
    incoming: Option<&Path>,
) -> Command {
    let mut cmdline = image.cmdline.clone();
    let mut command = Command::new(qemu_binary());
    command.args(["-machine", "microvm", "-nodefaults", "-no-user-config", "-nographic", "-no-reboot"]);
    match config.accelerator {
        Accelerator::Kvm => {
            command.args(["-accel", "kvm", "-cpu", "host"]);
        }
        Accelerator::Tcg => {
            command.args(["-accel", "tcg"]);
            // Without it a TCG guest cannot calibrate the TSC while the host is busy.
            if let Some(khz) = host_tsc_khz() {
                cmdline.push_str(&format!(" tsc_early_khz={khz}"));
            }
        }
    }
    command
        .args(["-m", &config.memory_mib.to_string(), "-smp", &config.cpus.to_string()])
        .arg("-kernel")
        .arg(image.kernel())
        .arg("-initrd")
        .arg(image.initramfs())
        .args(["-append", &cmdline])
        .args([
            "-chardev",
            &format!("socket,id=console,fd={}", console.as_raw_fd()),
            "-serial",
            "chardev:console",
        ]);
    if let Some((lower, upper)) = disks {
        command.args([
            "-drive",
            &format!("file={},if=none,id=lower,format=raw,readonly=on", opt(lower)),
            "-device",
            &format!("virtio-blk-device,drive=lower,serial={}", pvisor_agent_proto::LOWER_SERIAL),
            "-drive",
            &format!("file={},if=none,id=upper,format=raw,cache=writeback", opt(upper)),
            "-device",
            &format!("virtio-blk-device,drive=upper,serial={}", pvisor_agent_proto::UPPER_SERIAL),
        ]);
    }
    command.args([
        "-device",
        "virtio-serial-device",
        "-chardev",
        &format!("socket,id=agent,fd={}", agent.as_raw_fd()),
        "-device",
        &format!("virtserialport,chardev=agent,name={}", pvisor_agent_proto::PORT_NAME),
        "-chardev",
        &format!("socket,id=qmp,fd={}", qmp.as_raw_fd()),
        "-mon",
        "chardev=qmp,mode=control",
        "-nic",
        "none",
    ]);
    if let Some(state) = incoming {
        command.args(["-S", "-incoming", &format!("exec:cat {}", shell_quote(state))]);
    }
    command
}

fn qemu_binary() -> String {
    std::env::var("PVISOR_QEMU").unwrap_or_else(|_| "qemu-system-x86_64".into())
}

fn host_tsc_khz() -> Option<u64> {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").ok()?;
    let mhz: f64 =
        cpuinfo.lines().find(|l| l.starts_with("cpu MHz"))?.split(':').nth(1)?.trim().parse().ok()?;
    Some((mhz * 1000.0) as u64)
}

/// Starts QEMU in its own session (a terminal's ^C is the supervisor's to
/// forward), dying with the supervisor thread, with `keep` inherited.
pub(crate) fn spawn_qemu(command: &mut Command, log: &Path, keep: &[&UnixStream]) -> io::Result<Child> {
    let log = fs::File::create(log)?;
    let fds: Vec<i32> = keep.iter().map(|s| s.as_raw_fd()).collect();
    command.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    // SAFETY: only async-signal-safe calls (setsid, prctl, fcntl) run in the child.
    unsafe {
        command.pre_exec(move || {
            libc::setsid();
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            for &fd in &fds {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    command.spawn().map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            io::Error::new(
                e.kind(),
                format!("{} not found; install qemu-system-x86 (scripts/setup.sh)", qemu_binary()),
            )
        } else {
            e
        }
    })
}

/// The most of the guest console kept on disk: the guest writes it at will.
const CONSOLE_CAP: u64 = 1 << 20;

/// Copies the guest console into `path`, keeping the first [`CONSOLE_CAP`]
/// bytes and discarding the rest (still reading, so the guest never blocks).
pub(crate) fn capture_console(console: UnixStream, path: &Path) -> io::Result<()> {
    let mut file = fs::File::create(path)?;
    let _ = std::thread::Builder::new().name("pvisor-vm-console".into()).spawn(move || {
        let (mut console, mut kept, mut buf) = (console, 0u64, vec![0u8; 16 * 1024]);
        loop {
            match console.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) if kept < CONSOLE_CAP => {
                    let n = n.min((CONSOLE_CAP - kept) as usize);
                    let _ = file.write_all(&buf[..n]);
                    kept += n as u64;
                    if kept >= CONSOLE_CAP {
                        let _ = file.write_all(b"\n[pvisor: console truncated at 1 MiB]\n");
                    }
                }
                Ok(_) => {}
            }
        }
    });
    Ok(())
}

/// Reads the last lines of a log for an error message.
fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join(" | ")
}

/// What the agent reader thread tells the waiter.
#[derive(Debug)]
enum AgentEvent {
    Exited { code: Option<i32>, signal: Option<i32> },
    Gone(String),
}

/// Where the replies of execs started through [`guest::exec`] go, by exec id.
/// Bounded: a relay whose caller reads slowly holds the guest back (as our
/// own stdout does), for at most [`RELAY_STALL`].
type Sinks = Arc<Mutex<HashMap<u32, SyncSender<(Reply, Vec<u8>)>>>>;
/// Frames (up to 64 KiB each) a relayed exec may have in flight to its caller.
const RELAY_BACKLOG: usize = 64;
/// How long a relay's full queue may stall the guest before it is cut off.
const RELAY_STALL: Duration = Duration::from_secs(30);

/// State shared by the waiter, the control thread and the signaller.
#[derive(Debug)]
struct Shared {
    agent: Arc<Mutex<UnixStream>>,
    sinks: Sinks,
    /// The guest's streams (proxy connections and port forwards).
    net: NetBridge,
    /// The next host-initiated stream id (below [`pvisor_agent_proto::HOST_STREAM`]).
    next_stream: std::sync::atomic::AtomicU32,
    credits: Arc<Credits>,
    replies: Mutex<Receiver<(Reply, Vec<u8>)>>,
    /// Serialises multi-step agent/QMP operations (checkpoint, export).
    op: Mutex<()>,
    qmp: Mutex<qmp::Qmp>,
    qemu: Mutex<Option<Child>>,
    qemu_pidfd: Arc<OwnedFd>,
    exited: Mutex<bool>,
    suspended: Mutex<Option<ExecCheckpoint>>,
    image: GuestImage,
    config: MachineConfig,
    spec: SandboxSpec,
    vm: VmSpec,
    lower: PathBuf,
    upper: PathBuf,
}

impl Shared {
    fn send(&self, request: &Request, payload: &[u8]) -> io::Result<()> {
        let mut agent = self.agent.lock().unwrap_or_else(|p| p.into_inner());
        write_frame(&mut *agent, request, payload)
    }

    /// Sends `request` and waits for the next non-output reply.
    /// The channel is held only for the write, so signals and stdin are
    /// never stuck behind a slow answer.
    fn call(&self, request: &Request, payload: &[u8], timeout: Duration) -> Result<(Reply, Vec<u8>), String> {
        while self.replies.lock().unwrap_or_else(|p| p.into_inner()).try_recv().is_ok() {}
        self.send(request, payload).map_err(|e| format!("cannot reach the agent: {e}"))?;
        self.next_reply(timeout)
    }

    /// [`call`](Self::call) on a channel the caller holds: a checkpoint holds
    /// it from `Quiesce` to `Thaw` (or `quit`), so no other host frame can be
    /// half-delivered when the guest stops.
    fn call_held(
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

    fn next_reply(&self, timeout: Duration) -> Result<(Reply, Vec<u8>), String> {
        let replies = self.replies.lock().unwrap_or_else(|p| p.into_inner());
        match replies.recv_timeout(timeout) {
            Ok((Reply::Error { op, message }, _)) => Err(format!("the agent failed {op}: {message}")),
            Ok(reply) => Ok(reply),
            Err(RecvTimeoutError::Timeout) => Err(format!("the agent did not answer within {timeout:?}")),
            Err(RecvTimeoutError::Disconnected) => Err("the agent connection closed".into()),
        }
    }

    fn qmp<R: serde::de::DeserializeOwned>(&self, command: &qmp::Command) -> Result<R, String> {
        self.qmp.lock().unwrap_or_else(|p| p.into_inner()).execute(command).map_err(|e| e.to_string())
    }

    fn qmp_with_fd<R: serde::de::DeserializeOwned>(
        &self,
        command: &qmp::Command,
        fd: std::os::fd::RawFd,
    ) -> Result<R, String> {
        self.qmp
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .execute_with(command, Some(fd))
            .map_err(|e| e.to_string())
    }

    fn qemu_running(&self) -> bool {
        let mut qemu = self.qemu.lock().unwrap_or_else(|p| p.into_inner());
        qemu.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Asks QEMU to quit and reaps it; returns its exit status and usage.
    fn quit_and_reap(&self) -> (String, Usage) {
        let _ = self.qmp::<qmp::Empty>(&qmp::Command::Quit);
        let child = self.qemu.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(child) = child else { return ("already reaped".into(), Usage::default()) };
        reap(child, Duration::from_secs(10))
    }
}

/// Waits for QEMU (killing it after `grace`), with its resource usage.
fn reap(child: Child, grace: Duration) -> (String, Usage) {
    let pid = child.id() as libc::pid_t;
    let deadline = Instant::now() + grace;
    let mut status = 0;
    // SAFETY: rusage is plain data.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 writes into `status` and `usage` only.
        let rc = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if rc == pid || rc < 0 {
            break;
        }
        if Instant::now() > deadline {
            // SAFETY: the child is not reaped yet, so `pid` is still ours.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let described = if libc::WIFEXITED(status) {
        format!("exited {}", libc::WEXITSTATUS(status))
    } else {
        format!("killed by signal {}", libc::WTERMSIG(status))
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    let usage = Usage {
        user_cpu: tv(usage.ru_utime),
        system_cpu: tv(usage.ru_stime),
        max_rss_kib: usage.ru_maxrss as u64,
    };
    (described, usage)
}

/// A running microVM.
#[derive(Debug)]
pub struct VmProcess {
    shared: Arc<Shared>,
    events: Receiver<AgentEvent>,
    boot_ms: u64,
    restored: Option<serde_json::Value>,
    /// The command never started (the agent's exec failed).
    early: Option<Termination>,
    proxy_listener: Option<TcpListener>,
}

impl VmProcess {
    fn start(executor: &VmExecutor, spec: &SandboxSpec) -> Result<Self, SandboxError> {
        let vm = spec.vm.clone().ok_or_else(|| setup("vm", "the vm executor needs a VmSpec"))?;
        let proxy_port = match spec.network {
            NetworkAttachment::Isolated => None,
            NetworkAttachment::ProxyListener { port } => Some(port),
            NetworkAttachment::Host => {
                return Err(SandboxError::Setup {
                    step: "network".into(),
                    message: "a VM cannot share the host network (--net host)".into(),
                    hint: Some("use --net proxy with --allow DOMAIN, or --executor ns".into()),
                })
            }
        };
        // The guest gets a copy of the workspace; a path the policy hides
        // inside it would be copied too, so refuse rather than leak it.
        if vm.restore.is_none() {
            if let Some(hidden) = spec.hidden.iter().find(|h| h.starts_with(&spec.workspace)) {
                return Err(SandboxError::Setup {
                    step: "hide".into(),
                    message: format!(
                        "{} is hidden by the policy but lies inside the workspace {}, which the vm executor copies whole into the guest",
                        hidden.display(),
                        spec.workspace.display()
                    ),
                    hint: Some(format!(
                        "run on a project directory that does not contain it, pass --expose {} if the command may read it, or use --executor ns",
                        hidden.display()
                    )),
                });
            }
        }
        fs::create_dir_all(&vm.dir)
            .map_err(|e| setup("vm", format!("cannot create {}: {e}", vm.dir.display())))?;
        let (lower, upper) = (vm.dir.join("lower.img"), vm.dir.join("upper.img"));
        let mut scratch = Scratch(vec![lower.clone(), upper.clone()]);
        let restore = match &vm.restore {
            Some(dir) => {
                let manifest = checkpoint::verify(dir).map_err(|e| SandboxError::Setup {
                    step: "restore".into(),
                    message: e,
                    hint: Some(
                        "the checkpoint cannot be resumed; fork an earlier one or drop the Job".into(),
                    ),
                })?;
                disk::link_or_copy(&dir.join(checkpoint::LOWER), &lower)
                    .and_then(|()| disk::sparse_copy(&dir.join(checkpoint::UPPER), &upper))
                    .map_err(|e| setup("restore", format!("cannot copy the checkpoint's disks: {e}")))?;
                Some((dir.join(checkpoint::STATE), manifest))
            }
            None => {
                disk::build_lower(&spec.workspace, &lower).map_err(|e| SandboxError::Setup {
                    step: "workspace-image".into(),
                    message: format!("cannot image the workspace {}: {e}", spec.workspace.display()),
                    hint: Some(
                        "every file in the workspace must be readable by the user running pvisor".into(),
                    ),
                })?;
                disk::create_upper(&upper).map_err(|e| setup("upper-disk", e))?;
                None
            }
        };
        let config = match &restore {
            Some((_, manifest)) => manifest.machine,
            None => MachineConfig {
                memory_mib: spec.limits.memory_bytes.map_or(DEFAULT_MEMORY_MIB, |b| (b >> 20).max(128)),
                cpus: spec.limits.cpus.map_or(1, |c| c.ceil().max(1.0) as u32),
                accelerator: executor.accel.accelerator,
            },
        };

        let (agent, agent_qemu) = UnixStream::pair().map_err(SandboxError::Spawn)?;
        let (qmp_host, qmp_qemu) = UnixStream::pair().map_err(SandboxError::Spawn)?;
        let (console_host, console_qemu) = UnixStream::pair().map_err(SandboxError::Spawn)?;
        let console = vm.dir.join("console.log");
        capture_console(console_host, &console).map_err(|e| setup("vm", e))?;
        let mut command = qemu_command(
            &executor.image,
            &config,
            Some((&lower, &upper)),
            &agent_qemu,
            &qmp_qemu,
            &console_qemu,
            restore.as_ref().map(|(state, _)| state.as_path()),
        );
        let started = Instant::now();
        let child =
            spawn_qemu(&mut command, &vm.dir.join("qemu.log"), &[&agent_qemu, &qmp_qemu, &console_qemu])
                .map_err(|e| setup("qemu", e))?;
        drop((agent_qemu, qmp_qemu, console_qemu));
        let qemu_pidfd = Arc::new(sys::pidfd_open(child.id() as i32).map_err(SandboxError::Spawn)?);
        let qemu_failed = |what: String| {
            setup(
                "qemu",
                format!(
                    "{what}; qemu: {}; console: {}",
                    tail(&vm.dir.join("qemu.log"), 3),
                    tail(&console, 3)
                ),
            )
        };
        let boot_timeout = match config.accelerator {
            Accelerator::Kvm => Duration::from_secs(30),
            Accelerator::Tcg => Duration::from_secs(120),
        };
        let qmp = qmp::Qmp::connect(qmp_host, boot_timeout).map_err(|e| qemu_failed(e.to_string()))?;

        // The proxy listens on host loopback; only this process connects to
        // it, once per guest connection the agent reports.
        let proxy_listener = match proxy_port {
            Some(_) => Some(TcpListener::bind("127.0.0.1:0").map_err(|e| setup("network", e))?),
            None => None,
        };
        let credits = Arc::new(Credits::default());
        let net = NetBridge {
            proxy: proxy_listener.as_ref().and_then(|l| l.local_addr().ok()),
            streams: Arc::default(),
            credits: credits.clone(),
        };
        let (replies_tx, replies_rx) = mpsc::sync_channel(REPLY_BACKLOG);
        let (events_tx, events) = mpsc::channel();
        let reader = agent.try_clone().map_err(SandboxError::Spawn)?;
        let agent = Arc::new(Mutex::new(agent));
        let writer = agent.clone();
        let sinks = Sinks::default();
        std::thread::Builder::new()
            .name("pvisor-vm-agent".into())
            .spawn({
                let (credits, sinks, net) = (credits.clone(), sinks.clone(), net.clone());
                move || read_agent(reader, replies_tx, events_tx, net, writer, credits, sinks)
            })
            .map_err(SandboxError::Spawn)?;
        let shared = Arc::new(Shared {
            agent,
            sinks,
            net,
            next_stream: std::sync::atomic::AtomicU32::new(1),
            credits,
            replies: Mutex::new(replies_rx),
            op: Mutex::new(()),
            qmp: Mutex::new(qmp),
            qemu: Mutex::new(Some(child)),
            qemu_pidfd,
            exited: Mutex::new(false),
            suspended: Mutex::new(None),
            image: executor.image.clone(),
            config,
            spec: spec.clone(),
            vm: vm.clone(),
            lower,
            upper,
        });
        let fail = |message: String| {
            let (status, _) = shared.quit_and_reap();
            qemu_failed(format!("{message} (qemu {status})"))
        };

        let mut restored = None;
        if restore.is_some() {
            wait_for_incoming(&shared, boot_timeout).map_err(fail)?;
            shared.qmp::<qmp::Empty>(&qmp::Command::Cont).map_err(fail)?;
        }
        match shared
            .call(&Request::Hello { version: pvisor_agent_proto::VERSION }, &[], boot_timeout)
            .map_err(fail)?
        {
            (Reply::Hello { version, .. }, _) if version == pvisor_agent_proto::VERSION => {}
            (other, _) => {
                return Err(fail(format!(
                    "the agent answered Hello with {other:?} (protocol {})",
                    pvisor_agent_proto::VERSION
                )))
            }
        }
        let boot_ms = started.elapsed().as_millis() as u64;
        if let Some((_, manifest)) = &restore {
            restored = Some(reattach(&shared, manifest).map_err(fail)?);
        } else {
            let request = Request::Setup {
                workspace: spec.workspace.clone(),
                hostname: spec.hostname.clone(),
                clock_unix_ns: unix_now_ns(),
                proxy_port,
            };
            match shared.call(&request, &[], boot_timeout).map_err(fail)? {
                (Reply::Ready, _) => {}
                (other, _) => return Err(fail(format!("the agent answered Setup with {other:?}"))),
            }
            let argv = std::iter::once(spec.program.clone()).chain(spec.args.iter().cloned()).collect();
            let exec = Request::Exec {
                id: EXEC_ID,
                argv,
                env: spec.env.clone(),
                cwd: spec.cwd.clone(),
                root: None,
                output: None,
            };
            match shared.call(&exec, &[], boot_timeout).map_err(fail)? {
                (Reply::Started { .. }, _) => {}
                (Reply::ExecFailed { errno, message, .. }, _) => {
                    // Recorded like `ns` does: a failed Run with 126/127, not a setup error.
                    let early = Termination::ExecFailed { program: spec.program.clone(), errno, message };
                    scratch.0.clear(); // `wait` removes them after QEMU is gone
                    return Ok(Self {
                        shared,
                        events,
                        boot_ms,
                        restored,
                        early: Some(early),
                        proxy_listener,
                    });
                }
                (other, _) => return Err(fail(format!("the agent answered Exec with {other:?}"))),
            }
        }
        forward_stdin(shared.clone());
        serve_control(shared.clone()).map_err(|e| setup("control-socket", e))?;
        scratch.0.clear();
        Ok(Self { shared, events, boot_ms, restored, early: None, proxy_listener })
    }
}

fn unix_now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

/// Polls until QEMU has loaded the incoming state (it stays paused: `-S`).
fn wait_for_incoming(shared: &Shared, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let status: qmp::Status = shared.qmp(&qmp::Command::QueryStatus)?;
        match status.status.as_str() {
            "inmigrate" | "prelaunch" if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            "paused" | "postmigrate" => return Ok(()),
            other => return Err(format!("restoring the machine state ended in state {other}")),
        }
    }
}

/// After a restore: thaw the filesystems the checkpoint froze, step the
/// clock, reseed the guest's CRNG, and have the agent resend the command's
/// exit if it ended before the checkpoint.
fn reattach(shared: &Shared, manifest: &ExecCheckpoint) -> Result<serde_json::Value, String> {
    let timeout = Duration::from_secs(30);
    shared.call(&Request::Thaw, &[], timeout)?;
    // Never zeros: a guest reseeded with nothing would repeat its
    // checkpoint's random state in every copy.
    let entropy = pvisor_core::random::bytes::<64>().map_err(|e| format!("cannot reseed the guest: {e}"))?;
    let (clock_step_ns, entropy_avail) =
        match shared.call(&Request::Restored { clock_unix_ns: unix_now_ns() }, &entropy, timeout)? {
            (Reply::Restored { clock_step_ns, entropy_avail }, _) => (clock_step_ns, entropy_avail),
            (other, _) => return Err(format!("the agent answered Restored with {other:?}")),
        };
    shared.call(&Request::Poll { id: EXEC_ID }, &[], timeout)?;
    Ok(serde_json::json!({
        "checkpoint": manifest.id,
        "clock_step_ms": clock_step_ns / 1_000_000,
        "entropy_reseeded_bytes": entropy.len(),
        "entropy_avail": entropy_avail,
        "network": "no NIC; nothing to reset",
    }))
}

/// What a host-to-guest data chunk is charged to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Credit {
    Stdin,
    Stream(u32),
}

/// Flow control for host-to-guest data: at most [`pvisor_agent_proto::CREDITS`]
/// chunks in flight per exec or stream; the agent acks each one it wrote.
#[derive(Debug, Default)]
struct Credits {
    in_flight: Mutex<HashMap<Credit, usize>>,
    freed: std::sync::Condvar,
}

impl Credits {
    /// Waits for room, then charges one chunk. False if `gone` says to stop.
    fn take(&self, key: Credit, gone: impl Fn() -> bool) -> bool {
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

    fn release(&self, key: Credit) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(used) = in_flight.get_mut(&key) {
            *used = used.saturating_sub(1);
        }
        self.freed.notify_all();
    }

    fn forget(&self, key: Credit) {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        self.freed.notify_all();
    }
}

/// The host ends of the guest's streams: each agent stream is a TCP
/// connection to pvisor's proxy on host loopback, or a port forward.
#[derive(Clone)]
struct NetBridge {
    proxy: Option<SocketAddr>,
    streams: Arc<Mutex<HashMap<u32, HostEnd>>>,
    credits: Arc<Credits>,
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
enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    fn try_clone(&self) -> io::Result<Conn> {
        Ok(match self {
            Conn::Tcp(c) => Conn::Tcp(c.try_clone()?),
            Conn::Unix(c) => Conn::Unix(c.try_clone()?),
        })
    }

    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Conn::Tcp(c) => c.write_all(bytes),
            Conn::Unix(c) => c.write_all(bytes),
        }
    }

    fn shutdown(&self, how: std::net::Shutdown) {
        let _ = match self {
            Conn::Tcp(c) => c.shutdown(how),
            Conn::Unix(c) => c.shutdown(how),
        };
    }

    fn reader(&self) -> io::Result<Box<dyn Read + Send>> {
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
struct HostEnd {
    queue: SyncSender<Vec<u8>>,
    conn: Conn,
}

impl NetBridge {
    fn open(&self, stream: u32, agent: &Arc<Mutex<UnixStream>>) {
        let full = self.streams.lock().unwrap_or_else(|p| p.into_inner()).len() >= MAX_STREAMS;
        let Some(conn) = self.proxy.filter(|_| !full).and_then(|addr| TcpStream::connect(addr).ok()) else {
            // Off the reader thread: a checkpoint may hold the channel, and
            // it waits for this thread to deliver its `Quiesced`.
            let agent = agent.clone();
            let _ = std::thread::Builder::new().name("pvisor-vm-net".into()).spawn(move || {
                let mut agent = agent.lock().unwrap_or_else(|p| p.into_inner());
                let _ = write_frame(&mut *agent, &Request::NetClose { stream }, &[]);
            });
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
    fn register(
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
    fn pump_to_guest(&self, stream: u32, mut reader: Box<dyn Read + Send>, agent: &Arc<Mutex<UnixStream>>) {
        let (agent, streams, credits) = (agent.clone(), self.streams.clone(), self.credits.clone());
        let _ = std::thread::Builder::new().name("pvisor-vm-net".into()).spawn(move || {
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
            let mut agent = agent.lock().unwrap_or_else(|p| p.into_inner());
            let _ = write_frame(&mut *agent, &Request::NetClose { stream }, &[]);
        });
    }

    /// Guest bytes for `stream`: queued, never waited on (the guest keeps
    /// within its credits; one that does not loses the stream).
    fn data(&self, stream: u32, bytes: Vec<u8>) {
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
    fn close(&self, stream: u32) {
        if let Some(end) = self.streams.lock().unwrap_or_else(|p| p.into_inner()).remove(&stream) {
            let _ = end.queue.try_send(Vec::new());
        }
    }
}

/// Routes agent frames: the command's output to our stdout/stderr, other
/// execs' replies to their relays, proxy streams to the proxy, the exit to
/// the waiter, everything else to whoever holds the op lock.
fn read_agent(
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
                // relay, or nowhere (its caller left, or it predates this
                // supervisor, as a resumed guest's commands do).
                let sink = sinks.lock().unwrap_or_else(|p| p.into_inner()).get(&id).cloned();
                if let Some(sink) = sink {
                    let last = matches!(reply, Reply::Exited { .. } | Reply::ExecFailed { .. });
                    if !relay_frame(&sink, (reply.clone(), bytes.clone())) || last {
                        sinks.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                    }
                }
                continue;
            }
        }
        match frame {
            Ok(Some((Reply::Stdout { .. }, bytes))) => {
                let _ = sys::write_all(1, &bytes);
            }
            Ok(Some((Reply::Stderr { .. }, bytes))) => {
                let _ = sys::write_all(2, &bytes);
            }
            Ok(Some((Reply::NetOpen { stream }, _))) => net.open(stream, &agent),
            Ok(Some((Reply::NetData { stream }, bytes))) => net.data(stream, bytes),
            Ok(Some((Reply::NetClose { stream }, _))) => net.close(stream),
            Ok(Some((Reply::Exited { id: EXEC_ID, code, signal }, _))) => {
                let _ = events.send(AgentEvent::Exited { code, signal });
            }
            Ok(Some((Reply::StdinAck { id }, _))) if id == EXEC_ID => credits.release(Credit::Stdin),
            Ok(Some((Reply::StdinAck { .. }, _))) => {}
            Ok(Some((Reply::NetAck { stream }, _))) => credits.release(Credit::Stream(stream)),
            Ok(Some(reply)) => {
                if replies.send(reply).is_err() {
                    return;
                }
            }
            Ok(None) => {
                let _ = events.send(AgentEvent::Gone("the agent connection closed".into()));
                return;
            }
            Err(e) => {
                let _ = events.send(AgentEvent::Gone(format!("the agent stream broke: {e}")));
                return;
            }
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
        | Reply::Exited { id, .. } => Some(*id).filter(|id| *id != EXEC_ID),
        _ => None,
    }
}

/// Copies our stdin to the command's stdin; EOF closes it.
fn forward_stdin(shared: Arc<Shared>) {
    let _ = std::thread::Builder::new().name("pvisor-vm-stdin".into()).spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: reading into our own buffer from fd 0.
            let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if n <= 0 {
                let _ = shared.send(&Request::CloseStdin { id: EXEC_ID }, &[]);
                return;
            }
            let gone = || *shared.exited.lock().unwrap_or_else(|p| p.into_inner()) || !shared.qemu_running();
            if !shared.credits.take(Credit::Stdin, gone) {
                return;
            }
            if shared.send(&Request::Stdin { id: EXEC_ID }, &buf[..n as usize]).is_err() {
                return;
            }
        }
    });
}

/// Binds `vm/control.sock` (through `/proc/self/fd` when the path is too
/// long for `sun_path`) and serves checkpoint and suspend requests.
fn serve_control(shared: Arc<Shared>) -> io::Result<()> {
    let path = checkpoint::control_socket(&shared.vm.dir);
    let _ = fs::remove_file(&path);
    let dir = fs::File::open(&shared.vm.dir)?;
    let short = PathBuf::from(format!("/proc/self/fd/{}/{}", dir.as_raw_fd(), checkpoint::CONTROL_SOCKET));
    let listener = UnixListener::bind(if path.as_os_str().len() < 100 { &path } else { &short })?;
    std::thread::Builder::new().name("pvisor-vm-control".into()).spawn(move || {
        for stream in listener.incoming() {
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

/// The control socket answers only the user who owns the Attempt (or root),
/// from outside every sandbox: a process in another user or mount namespace
/// than the supervisor's (a sandboxed command that somehow reached the
/// socket) is refused, whatever its uid. The socket also lives in the state
/// directory, which every sandbox has hidden.
fn trusted_peer(stream: &UnixStream) -> bool {
    // SAFETY: geteuid has no preconditions.
    let own = unsafe { libc::geteuid() };
    match crate::sys::peer_credentials(stream.as_raw_fd()) {
        Ok((pid, uid)) => (uid == own || uid == 0) && pid > 0 && crate::sys::shares_namespaces(pid),
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
        Ok(ControlRequest::Forward { port }) => return forward(shared, port, stream),
        Ok(ControlRequest::Call { request, payload }) => {
            let payload = guest::read_payload(&mut reader, payload)?;
            let (reply, bytes) = guest_call(shared, *request, &payload);
            return write_frame(&mut &stream, &reply, &bytes);
        }
        Ok(request) => match checkpoint::take(shared, request == ControlRequest::Suspend) {
            Ok(manifest) => ControlResponse::Checkpointed { manifest },
            Err(message) => ControlResponse::Error { message },
        },
    };
    let mut out = serde_json::to_vec(&response).map_err(io::Error::other)?;
    out.push(b'\n');
    (&stream).write_all(&out)
}

/// One agent request for a guest-access caller. Only requests that answer
/// with exactly one reply are passed through; the rest would confuse the
/// Attempt's own use of the channel.
fn guest_call(shared: &Shared, request: Request, payload: &[u8]) -> (Reply, Vec<u8>) {
    let refuse = |message: String| (Reply::Error { op: "call".into(), message }, Vec::new());
    match request {
        Request::ReadFile { .. }
        | Request::WriteFile { .. }
        | Request::FileOp { .. }
        | Request::Status { .. }
        | Request::NetConnect { .. } => {}
        // Signals have no reply; they need no op lock either.
        Request::Signal { id, .. } if id != EXEC_ID => {
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
        Err(message) => refuse(message),
    }
}

/// Whether `reply` can be the answer to `request` (replies carry no request id).
fn answers(request: &Request, reply: &Reply) -> bool {
    match (request, reply) {
        (_, Reply::Error { .. }) => true,
        (Request::ReadFile { path, .. }, Reply::File { path: p }) => p == path,
        (Request::WriteFile { .. }, Reply::Done { op }) => op == "write_file",
        (Request::Status { id }, Reply::Status { id: i, .. }) => i == id,
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
    spec: guest::ExecSpec,
    mut from: BufReader<UnixStream>,
    to: UnixStream,
) -> io::Result<()> {
    let id = spec.id;
    let (tx, rx) = mpsc::sync_channel(RELAY_BACKLOG);
    {
        let mut sinks = shared.sinks.lock().unwrap_or_else(|p| p.into_inner());
        if id == EXEC_ID || sinks.contains_key(&id) {
            let message = format!("exec id {id} is in use");
            return write_frame(&mut &to, &Reply::ExecFailed { id, errno: libc::EEXIST, message }, &[]);
        }
        sinks.insert(id, tx);
    }
    let exec = Request::Exec {
        id,
        argv: spec.argv,
        env: spec.env,
        cwd: spec.cwd,
        root: spec.root,
        output: spec.output,
    };
    if let Err(e) = shared.send(&exec, &[]) {
        shared.sinks.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        let message = format!("cannot reach the agent: {e}");
        return write_frame(&mut &to, &Reply::ExecFailed { id, errno: libc::EIO, message }, &[]);
    }
    // The caller's signals and stdin, forced to this exec's id.
    let agent = shared.agent.clone();
    std::thread::Builder::new().name("pvisor-vm-relay-in".into()).spawn(move || {
        while let Ok(Some((request, payload))) = read_frame::<Request>(&mut from) {
            let request = match request {
                Request::Stdin { .. } => Request::Stdin { id },
                Request::CloseStdin { .. } => Request::CloseStdin { id },
                Request::Signal { signal, .. } => Request::Signal { id, signal },
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
            shared.sinks.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            break;
        }
    }
    // Ended (exit, hang-up, or cut off for stalling): close both directions,
    // which also ends the relay-in thread and tells the caller.
    let _ = to.shutdown(std::net::Shutdown::Both);
    Ok(())
}

impl SandboxProcess for VmProcess {
    fn take_proxy_listener(&mut self) -> Option<std::net::TcpListener> {
        self.proxy_listener.take()
    }

    fn signaller(&self) -> Signaller {
        let shared = self.shared.clone();
        Signaller::custom(Arc::new(move |signal| {
            if signal == libc::SIGKILL {
                // Kill the command's process group inside the guest, so its
                // staged files can still be exported; if the agent does not
                // deliver within the grace, kill the whole VM.
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name("pvisor-vm-kill".into())
                    .spawn(move || {
                        let sender = shared.clone();
                        let _ =
                            std::thread::Builder::new().name("pvisor-vm-signal".into()).spawn(move || {
                                let _ =
                                    sender.send(&Request::Signal { id: EXEC_ID, signal: libc::SIGKILL }, &[]);
                            });
                        std::thread::sleep(VM_KILL_GRACE);
                        if !*shared.exited.lock().unwrap_or_else(|p| p.into_inner()) && shared.qemu_running()
                        {
                            let _ = sys::pidfd_send_signal(&shared.qemu_pidfd, libc::SIGKILL);
                        }
                    })
                    .map(|_| ())
            } else {
                // Never block the caller (the Session's event loop) on the
                // agent channel; the kill escalation must still fire.
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name("pvisor-vm-signal".into())
                    .spawn(move || {
                        let _ = shared.send(&Request::Signal { id: EXEC_ID, signal }, &[]);
                    })
                    .map(|_| ())
            }
        }))
    }

    fn limits(&self) -> Vec<crate::limits::Enforcement> {
        let requested = &self.shared.spec.limits;
        let config = &self.shared.config;
        let mut out = Vec::new();
        if let Some(bytes) = requested.memory_bytes {
            out.push(crate::limits::Enforcement {
                limit: "memory".into(),
                value: bytes.to_string(),
                by: format!(
                    "guest RAM of {} MiB (the guest kernel's OOM killer acts inside it)",
                    config.memory_mib
                ),
            });
        }
        if let Some(cpus) = requested.cpus {
            out.push(crate::limits::Enforcement {
                limit: "cpus".into(),
                value: cpus.to_string(),
                by: format!("{} vCPU(s)", config.cpus),
            });
        }
        if let Some(pids) = requested.pids {
            out.push(crate::limits::Enforcement {
                limit: "pids".into(),
                value: pids.to_string(),
                by: "not enforced: the vm executor does not limit processes inside the guest".into(),
            });
        }
        out
    }

    fn facts(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({
            "accelerator": self.shared.config.accelerator.as_str(),
            "memory_mib": self.shared.config.memory_mib,
            "cpus": self.shared.config.cpus,
            "image": self.shared.image.digest,
            "ready_ms": self.boot_ms,
            "restored": self.restored,
        }))
    }

    fn wait(self: Box<Self>) -> Result<ExitReport, SandboxError> {
        let shared = self.shared;
        if let Some(termination) = self.early {
            let (_, usage) = shared.quit_and_reap();
            let _ = fs::remove_file(&shared.lower);
            let _ = fs::remove_file(&shared.upper);
            return Ok(ExitReport {
                termination,
                usage,
                oom_killed: false,
                interrupted_at_terminal: false,
                stage_error: None,
            });
        }
        let ending = loop {
            match self.events.recv_timeout(Duration::from_millis(100)) {
                Ok(AgentEvent::Exited { code, signal }) => {
                    *shared.exited.lock().unwrap_or_else(|p| p.into_inner()) = true;
                    break Ok((code, signal));
                }
                Ok(AgentEvent::Gone(why)) => break Err(why),
                Err(RecvTimeoutError::Timeout) if shared.qemu_running() => {}
                Err(_) => break Err("the VM stopped".into()),
            }
        };
        // A checkpoint or suspension in progress finishes first.
        let _op = shared.op.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(manifest) = shared.suspended.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let (qemu, usage) = shared.quit_and_reap();
            // The checkpoint holds its own copies; these were this Attempt's scratch.
            let _ = fs::remove_file(&shared.lower);
            let _ = fs::remove_file(&shared.upper);
            return Ok(ExitReport {
                termination: Termination::Suspended { checkpoint: Box::new(manifest), qemu },
                usage,
                oom_killed: false,
                interrupted_at_terminal: false,
                stage_error: None,
            });
        }
        let termination = match ending {
            Ok((code, signal)) => {
                if let Err(e) = export::export_stage(&shared, &shared.spec.upper) {
                    let (qemu, _) = shared.quit_and_reap();
                    return Err(SandboxError::Protocol(format!(
                        "cannot take the staged files out of the VM: {e} (qemu {qemu}); the guest disk is kept at {}",
                        shared.upper.display()
                    )));
                }
                match (code, signal) {
                    (Some(code), _) => Termination::Exited(code),
                    (None, Some(signal)) => Termination::Signaled(signal),
                    (None, None) => Termination::Vanished { detail: "the agent reported no status".into() },
                }
            }
            Err(why) => {
                let console = tail(&shared.vm.dir.join("console.log"), 3);
                if shared.qemu_running() {
                    Termination::Vanished { detail: format!("{why}; console: {console}") }
                } else {
                    // Killed from outside (or by cancellation): nothing left to export.
                    Termination::Signaled(libc::SIGKILL)
                }
            }
        };
        let (_, usage) = shared.quit_and_reap();
        // The disks are the Attempt's scratch; the stage now holds the result.
        let _ = fs::remove_file(&shared.lower);
        let _ = fs::remove_file(&shared.upper);
        Ok(ExitReport {
            termination,
            usage,
            oom_killed: false,
            interrupted_at_terminal: false,
            stage_error: None,
        })
    }
}

/// Connects to the control socket of the live supervisor of an Attempt
/// (through `/proc/self/fd` when the path is too long for `sun_path`).
fn connect_control(vm_dir: &Path) -> Result<UnixStream, String> {
    let path = checkpoint::control_socket(vm_dir);
    let dir = fs::File::open(vm_dir).map_err(|e| format!("no VM directory at {} ({e})", vm_dir.display()))?;
    let short = PathBuf::from(format!("/proc/self/fd/{}/{}", dir.as_raw_fd(), checkpoint::CONTROL_SOCKET));
    let target = if path.as_os_str().len() < 100 { path.clone() } else { short };
    UnixStream::connect(&target).map_err(|e| {
        format!("the VM's supervisor is not reachable at {} ({e}); is the Job running?", path.display())
    })
}

/// Sends a control request to the live supervisor of an Attempt.
pub fn control(
    vm_dir: &Path,
    request: &ControlRequest,
    timeout: Duration,
) -> Result<ControlResponse, String> {
    let stream = connect_control(vm_dir)?;
    stream.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    let mut line = serde_json::to_vec(request).map_err(|e| e.to_string())?;
    line.push(b'\n');
    (&stream).write_all(&line).map_err(|e| e.to_string())?;
    let mut answer = String::new();
    BufReader::new(&stream)
        .read_line(&mut answer)
        .map_err(|e| format!("no answer from the supervisor: {e}"))?;
    serde_json::from_str(&answer).map_err(|e| format!("the supervisor answered garbage: {e}"))
}
