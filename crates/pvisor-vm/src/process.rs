//! One running microVM ([`VmProcess`]): booting or restoring it (disks,
//! QEMU, the agent handshake, the command's exec), forwarding stdin,
//! signalling, and waiting for its end (export, suspension, teardown).

use std::fs;
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pvisor_agent_proto::{Reply, Request};

use super::control::serve_control;
use super::link::{read_agent, AgentEvent, Calls, Credit, Credits, Shared, Sinks};
use super::net::NetBridge;
use super::nic;
use super::qemu::{capture_console, incoming_uri, qemu_command, spawn_qemu, tail, Ram, TapNic};
use super::virtiofs::{self, FileServers};
use super::{
    checkpoint, disk, export, lower, qmp, setup, Accelerator, ExecCheckpoint, RamFormat, VmExecutor, EXEC_ID,
};
use pvisor_sandbox::{
    sys, ExitReport, NetworkAttachment, SandboxError, SandboxProcess, SandboxSpec, Signaller, Termination,
};

/// Replies the reader buffers for the op in progress; beyond that it waits,
/// so a flooding guest stalls only itself, never the supervisor's memory.
const REPLY_BACKLOG: usize = 64;
/// After a SIGKILL sent through the agent, how long before QEMU itself is killed.
const VM_KILL_GRACE: Duration = Duration::from_secs(5);

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

/// A running microVM.
#[derive(Debug)]
pub struct VmProcess {
    shared: Arc<Shared>,
    events: Receiver<AgentEvent>,
    boot_ms: u64,
    restored: Option<serde_json::Value>,
    /// How the workspace disks were made (a fresh start; a restore reuses the checkpoint's).
    workspace_disks: Option<lower::Prepared>,
    /// How this VM started (template restore, boot and why, checkpoint restore).
    start: serde_json::Value,
    /// The command never started (the agent's exec failed).
    early: Option<Termination>,
    proxy_listener: Option<TcpListener>,
}

impl VmProcess {
    /// Starts the VM: restores `spec.vm.restore`, else a template, else boots
    /// (always, with `boot_reason`). While a template restore has not yet
    /// reached the command's exec, `restoring` names the template, so a
    /// failure there can be retried as a boot (no user code ran).
    pub(super) fn start(
        executor: &VmExecutor,
        spec: &SandboxSpec,
        boot_reason: Option<String>,
        restoring: &mut Option<String>,
    ) -> Result<Self, SandboxError> {
        let vm = spec.vm.clone().ok_or_else(|| setup("vm", "the vm executor needs a VmSpec"))?;
        let proxy_port = match spec.network {
            NetworkAttachment::Isolated | NetworkAttachment::Namespace => None,
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
        // The namespace is joined last, just before QEMU starts: a start
        // that fails earlier leaves no redirect behind.
        let netns = match (spec.network, &vm.network_namespace) {
            (NetworkAttachment::Namespace, Some(netns)) => Some(netns.clone()),
            (NetworkAttachment::Namespace, None) => {
                return Err(setup("network", "the Job joins a network namespace, but its VmSpec names none"))
            }
            _ => None,
        };
        check_room(&vm.dir)?;
        let shares = &vm.shared_directories;
        let mut scratch = Scratch(Vec::new());
        let mut workspace_disks = None;
        let start = match &vm.restore {
            Some(_) if !shares.is_empty() => {
                return Err(setup(
                    "restore",
                    "a VM that shares host directories has no execution checkpoints",
                ))
            }
            Some(dir) => {
                let manifest = checkpoint::verify(dir).map_err(|e| SandboxError::Setup {
                    step: "restore".into(),
                    message: e,
                    hint: Some(
                        "the checkpoint cannot be resumed; fork an earlier one or drop the Job".into(),
                    ),
                })?;
                // Exactly the device list the checkpoint was taken with.
                scratch.0 = manifest.disks.iter().map(|name| vm.dir.join(name)).collect();
                for (name, path) in manifest.disks.iter().zip(&scratch.0) {
                    disk::keep_disk(&dir.join(name), path)
                        .map_err(|e| setup("restore", format!("cannot copy the checkpoint's {name}: {e}")))?;
                }
                // The device list must be the saved one: a NIC exactly when it had one.
                match (&manifest.nic, &netns) {
                    (Some(_), None) => return Err(setup(
                        "restore",
                        "the checkpoint's VM had a NIC in a pod's network namespace; it resumes only in one",
                    )),
                    (None, Some(_)) => {
                        return Err(setup(
                            "restore",
                            "the checkpoint's VM had no NIC; it cannot resume into a network namespace",
                        ))
                    }
                    _ => {}
                }
                Start::Restore { state: dir.join(checkpoint::STATE), manifest: Box::new(manifest) }
            }
            None => {
                scratch.0 = disk::boot_disk_names().iter().map(|name| vm.dir.join(name)).collect();
                let staging = vm.dir.join(lower::DELTA_STAGING);
                let prepared = lower::prepare(
                    &executor.state_root,
                    &spec.workspace,
                    &scratch.0[0],
                    &scratch.0[1],
                    &staging,
                )
                .map_err(|e| SandboxError::Setup {
                    step: "workspace-image".into(),
                    message: format!("cannot image the workspace {}: {e}", spec.workspace.display()),
                    hint: Some(
                        "every file in the workspace must be readable by the user running pvisor".into(),
                    ),
                })?;
                disk::create_upper(&scratch.0[2]).map_err(|e| setup("upper-disk", e))?;
                workspace_disks = Some(prepared);
                let plan = match boot_reason {
                    Some(reason) => Err(reason),
                    // A template's device list has no NIC; it cannot gain one.
                    None if netns.is_some() => {
                        Err("a VM with a NIC boots: templates are built without one".into())
                    }
                    None if !shares.is_empty() => Err(
                        "a VM that shares host directories boots: virtiofsd maps its RAM, which a template clone keeps private".into(),
                    ),
                    None => executor.template_for(&executor.machine_config(&spec.limits)),
                };
                match plan {
                    Ok((template, in_use)) => {
                        Start::Clone { template: Box::new(template), _in_use: Some(in_use) }
                    }
                    Err(reason) => Start::Boot { reason },
                }
            }
        };
        let config = match &start {
            Start::Restore { manifest, .. } => manifest.machine,
            _ => executor.machine_config(&spec.limits),
        };
        let ram = match &start {
            Start::Restore { manifest, .. } if manifest.machine.ram == RamFormat::Legacy => Ram::Legacy,
            Start::Clone { template, .. } => Ram::TemplateClone(&template.dir),
            _ if !shares.is_empty() => Ram::Shared,
            _ => Ram::Private,
        };
        let template_memory;
        let ram = match ram {
            Ram::TemplateClone(dir) => {
                template_memory = dir.join(super::template::MEMORY);
                Ram::TemplateClone(&template_memory)
            }
            other => other,
        };
        let disks = scratch.0.clone();
        let devices: Vec<disk::Disk<'_>> =
            disks.iter().map(|p| disk::Disk::of(p)).collect::<Result<_, _>>().map_err(|e| setup("vm", e))?;
        let incoming = match &start {
            Start::Restore { state, .. } => Some(state.clone()),
            Start::Clone { template, .. } => Some(template.state()),
            Start::Boot { .. } => None,
        };

        let (agent, agent_qemu) = UnixStream::pair().map_err(SandboxError::Spawn)?;
        let (qmp_host, qmp_qemu) = UnixStream::pair().map_err(SandboxError::Spawn)?;
        let (console_host, console_qemu) = UnixStream::pair().map_err(SandboxError::Spawn)?;
        let console = vm.dir.join("console.log");
        capture_console(console_host, &console).map_err(|e| setup("vm", e))?;
        let nic = match &netns {
            Some(netns) => Some(nic::join(netns).map_err(|e| SandboxError::Setup {
                step: "network".into(),
                message: e,
                hint: Some(
                    "the VM's NIC takes over the namespace's one interface (docs/kubernetes.md)".into(),
                ),
            })?),
            None => None,
        };
        // A restored guest keeps the address and MAC it was saved with: the
        // namespace's interface must still be the one it took over.
        if let (Start::Restore { manifest, .. }, Some(nic)) = (&start, &nic) {
            if manifest.nic.as_deref() != Some(nic.mac.as_str()) {
                return Err(setup(
                    "restore",
                    format!(
                        "the checkpoint's VM had the NIC {}, but {} in the network namespace is now {}: resume it in the namespace it was suspended in",
                        manifest.nic.as_deref().unwrap_or("-"),
                        nic.interface,
                        nic.mac
                    ),
                ));
            }
        }
        let mut file_servers = FileServers::start(shares, &vm.dir).map_err(|e| setup("share", e))?;
        let nic_mac = nic.as_ref().map(|n| n.mac.clone());
        let tap_nic = nic.as_ref().map(|n| TapNic { tap: n.tap.as_fd(), mac: &n.mac });
        let mut command = qemu_command(
            &executor.image,
            &config,
            ram,
            &devices,
            &agent_qemu,
            &qmp_qemu,
            &console_qemu,
            &file_servers.devices(),
            tap_nic,
            incoming.is_some(),
        );
        let started = Instant::now();
        let child = {
            let mut keep = vec![agent_qemu.as_fd(), qmp_qemu.as_fd(), console_qemu.as_fd()];
            keep.extend(tap_nic.map(|n| n.tap));
            keep.extend(file_servers.devices().iter().map(|d| d.socket));
            spawn_qemu(&mut command, &vm.dir.join("qemu.log"), &keep).map_err(|e| setup("qemu", e))?
        };
        file_servers.handed_over();
        tracing::info!(
            pid = child.id(),
            accelerator = config.accelerator.as_str(),
            memory_mib = config.memory_mib,
            cpus = config.cpus,
            start = start.mode(),
            dir = %vm.dir.display(),
            "QEMU started"
        );
        drop((agent_qemu, qmp_qemu, console_qemu));
        // QEMU holds the TAP now: it lasts exactly as long as QEMU.
        let interface = nic.map(|n| {
            tracing::info!(interface = %n.interface, mac = %n.mac, address = %n.config.address, "NIC joined the network namespace");
            n.config
        });
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
        let (replies_tx, replies_rx) = mpsc::sync_channel(REPLY_BACKLOG);
        let (events_tx, events) = mpsc::channel();
        let reader = agent.try_clone().map_err(SandboxError::Spawn)?;
        let agent = Arc::new(Mutex::new(agent));
        let net = NetBridge::new(
            proxy_listener.as_ref().and_then(|l| l.local_addr().ok()),
            credits.clone(),
            &agent,
        )
        .map_err(SandboxError::Spawn)?;
        let writer = agent.clone();
        let sinks = Sinks::default();
        // Only a restored guest runs execs this supervisor did not start.
        sinks.lock().unwrap_or_else(|p| p.into_inner()).holding = matches!(start, Start::Restore { .. });
        let calls = Arc::new(Calls::default());
        std::thread::Builder::new()
            .name("pvisor-vm-agent".into())
            .spawn({
                let (credits, sinks, net, calls) =
                    (credits.clone(), sinks.clone(), net.clone(), calls.clone());
                move || read_agent(reader, replies_tx, calls, events_tx, net, writer, credits, sinks)
            })
            .map_err(SandboxError::Spawn)?;
        let shared = Arc::new(Shared {
            agent,
            sinks,
            net,
            next_stream: std::sync::atomic::AtomicU32::new(1),
            credits,
            calls,
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
            disks,
            nic_mac,
            file_servers: Mutex::new(file_servers),
        });
        let fail = |message: String| {
            // A full disk stops the VM mid-boot: name it, not the silence it causes.
            let message = match shared.disk_error() {
                Some(why) => format!("{why} ({message})"),
                None => message,
            };
            tracing::info!(error = %message, "VM start failed; stopping QEMU");
            let (status, _) = shared.quit_and_reap();
            qemu_failed(format!("{message} (qemu {status})"))
        };

        let mut restored = None;
        if let Some(state) = &incoming {
            if let Start::Clone { template, .. } = &start {
                // From the load to the guest's repair, a failure is the template's.
                *restoring = Some(template.manifest.id.clone());
            }
            // The lock is released before `fail`, which quits QEMU over QMP.
            let loading = {
                let mut qmp = shared.qmp.lock().unwrap_or_else(|p| p.into_inner());
                (if config.ram == RamFormat::Named { qmp::ignore_shared(&mut qmp) } else { Ok(()) }).and_then(
                    |()| {
                        qmp.execute::<qmp::Empty>(&qmp::Command::MigrateIncoming { uri: incoming_uri(state) })
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    },
                )
            };
            loading.map_err(fail)?;
            wait_for_incoming(&shared, boot_timeout).map_err(fail)?;
            shared.qmp::<qmp::Empty>(&qmp::Command::Cont).map_err(fail)?;
            tracing::info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                start = start.mode(),
                "restore: machine state loaded"
            );
        }
        // QEMU holds the template's files now (mapped and read): gc may go.
        let start = start.loaded();
        match shared.hello(boot_timeout).map_err(fail)? {
            (Reply::Hello { version, .. }, _) if version == pvisor_agent_proto::VERSION => {}
            (other, _) => {
                return Err(fail(format!(
                    "the agent answered Hello with {other:?} (protocol {})",
                    pvisor_agent_proto::VERSION
                )))
            }
        }
        let boot_ms = started.elapsed().as_millis() as u64;
        tracing::info!(boot_ms, "agent link up");
        if let Start::Restore { manifest, .. } = &start {
            restored = Some(reattach(&shared, manifest).map_err(fail)?);
        } else {
            if let Start::Clone { template, .. } = &start {
                // A clone must never keep the template's random state.
                let (clock_step_ns, entropy_avail, reseeded) = reseed(&shared).map_err(fail)?;
                restored = Some(serde_json::json!({
                    "template": template.manifest.id,
                    "clock_step_ms": clock_step_ns / 1_000_000,
                    "entropy_reseeded_bytes": reseeded,
                    "entropy_avail": entropy_avail,
                }));
            }
            // From here on a failure is this Job's (its workspace, its command).
            *restoring = None;
            let request = Request::Setup {
                workspace: spec.workspace.clone(),
                hostname: spec.hostname.clone(),
                clock_unix_ns: unix_now_ns(),
                proxy_port,
                delta: true,
                interface,
                shares: virtiofs::guest_shares(shares),
            };
            let setting_up = Instant::now();
            match shared.call(&request, &[], boot_timeout).map_err(fail)? {
                (Reply::Ready, _) => {}
                (other, _) => return Err(fail(format!("the agent answered Setup with {other:?}"))),
            }
            tracing::info!(
                setup_ms = setting_up.elapsed().as_millis() as u64,
                "workspace mounted in the guest"
            );
            let argv = std::iter::once(spec.program.clone()).chain(spec.args.iter().cloned()).collect();
            let exec = Request::Exec {
                id: EXEC_ID,
                argv,
                env: spec.env.clone(),
                cwd: spec.cwd.clone(),
                root: None,
                output: None,
                terminal: None,
                confinement: None,
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
                        workspace_disks,
                        start: start.facts(),
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
        Ok(Self {
            shared,
            events,
            boot_ms,
            restored,
            workspace_disks,
            start: start.facts(),
            early: None,
            proxy_listener,
        })
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

/// Free space below which a VM is not started: its disks are sparse files
/// in the state directory, and QEMU stops a guest whose write finds the
/// filesystem full, so a start there would only wait.
const MIN_FREE_BYTES: u64 = 16 << 20;

/// Refuses to start a VM on a full state filesystem, naming it (ENOSPC).
fn check_room(dir: &std::path::Path) -> Result<(), SandboxError> {
    let Ok(fs) = rustix::fs::statvfs(dir) else { return Ok(()) };
    let free = fs.f_bavail.saturating_mul(fs.f_frsize);
    if free >= MIN_FREE_BYTES {
        return Ok(());
    }
    Err(SandboxError::Setup {
        step: "state-directory-space".into(),
        message: format!(
            "no space left on device (ENOSPC): the filesystem of {} has {} KiB free, and the VM's disks are written there",
            dir.display(),
            free >> 10
        ),
        hint: Some("free space in the state directory (`pvisor gc`, `pvisor drop`), then run again".into()),
    })
}

/// After a restore: thaw the filesystems the checkpoint froze, step the
/// clock, reseed the guest's CRNG, and have the agent resend the command's
/// exit if it ended before the checkpoint.
fn reattach(shared: &Shared, manifest: &ExecCheckpoint) -> Result<serde_json::Value, String> {
    let timeout = Duration::from_secs(30);
    shared.call(&Request::Thaw, &[], timeout)?;
    let (clock_step_ns, entropy_avail, reseeded) = reseed(shared)?;
    shared.call(&Request::Poll { id: EXEC_ID }, &[], timeout)?;
    tracing::info!(
        checkpoint = %manifest.id,
        clock_step_ms = clock_step_ns / 1_000_000,
        entropy_avail,
        "restore: guest thawed, clock stepped and CRNG reseeded"
    );
    Ok(serde_json::json!({
        "checkpoint": manifest.id,
        "clock_step_ms": clock_step_ns / 1_000_000,
        "entropy_reseeded_bytes": reseeded,
        "entropy_avail": entropy_avail,
        "network": "no NIC; nothing to reset",
    }))
}

/// Steps the restored guest's clock and reseeds its CRNG with fresh host
/// entropy: (clock step ns, the guest's entropy_avail, bytes sent).
fn reseed(shared: &Shared) -> Result<(i64, u64, usize), String> {
    // Never zeros: a guest reseeded with nothing would repeat its saved
    // random state in every copy.
    let entropy = pvisor_core::random::bytes::<64>().map_err(|e| format!("cannot reseed the guest: {e}"))?;
    match shared.call(
        &Request::Restored { clock_unix_ns: unix_now_ns() },
        &entropy,
        Duration::from_secs(30),
    )? {
        (Reply::Restored { clock_step_ns, entropy_avail }, _) => {
            Ok((clock_step_ns, entropy_avail as u64, entropy.len()))
        }
        (other, _) => Err(format!("the agent answered Restored with {other:?}")),
    }
}

/// How a VM starts.
enum Start {
    /// Restore an execution checkpoint (resume, fork).
    Restore { state: PathBuf, manifest: Box<ExecCheckpoint> },
    /// Restore a template; `in_use` keeps it from removal until QEMU loaded it.
    Clone { template: Box<super::template::Template>, _in_use: Option<super::template::InUse> },
    /// Boot the kernel, and why no template was used.
    Boot { reason: String },
}

impl Start {
    fn mode(&self) -> &'static str {
        match self {
            Self::Restore { .. } => "checkpoint-restore",
            Self::Clone { .. } => "template-restore",
            Self::Boot { .. } => "boot",
        }
    }

    /// Releases the template once QEMU holds its files.
    fn loaded(self) -> Self {
        match self {
            Self::Clone { template, .. } => Self::Clone { template, _in_use: None },
            other => other,
        }
    }

    fn facts(&self) -> serde_json::Value {
        match self {
            Self::Restore { manifest, .. } => {
                serde_json::json!({"mode": self.mode(), "checkpoint": manifest.id})
            }
            Self::Clone { template, .. } => {
                serde_json::json!({"mode": self.mode(), "template": template.manifest.id})
            }
            Self::Boot { reason } => serde_json::json!({"mode": self.mode(), "reason": reason}),
        }
    }
}

/// Copies our stdin to the command's stdin; EOF closes it.
fn forward_stdin(shared: Arc<Shared>) {
    let _ = std::thread::Builder::new().name("pvisor-vm-stdin".into()).spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match rustix::io::read(rustix::stdio::stdin(), &mut buf) {
                Err(rustix::io::Errno::INTR) => continue,
                Ok(n) if n > 0 => n,
                _ => {
                    let _ = shared.send(&Request::CloseStdin { id: EXEC_ID }, &[]);
                    return;
                }
            };
            let gone = || *shared.exited.lock().unwrap_or_else(|p| p.into_inner()) || !shared.qemu_running();
            if !shared.credits.take(Credit::Stdin, gone) {
                return;
            }
            if shared.send(&Request::Stdin { id: EXEC_ID }, &buf[..n]).is_err() {
                return;
            }
        }
    });
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

    fn limits(&self) -> Vec<pvisor_sandbox::limits::Enforcement> {
        let requested = &self.shared.spec.limits;
        let config = &self.shared.config;
        let mut out = Vec::new();
        if let Some(bytes) = requested.memory_bytes {
            out.push(pvisor_sandbox::limits::Enforcement {
                limit: pvisor_sandbox::limits::LimitKind::Memory,
                value: bytes.to_string(),
                by: pvisor_sandbox::limits::Mechanism::Enforced(format!(
                    "guest RAM of {} MiB (the guest kernel's OOM killer acts inside it)",
                    config.memory_mib
                )),
            });
        }
        if let Some(cpus) = requested.cpus {
            out.push(pvisor_sandbox::limits::Enforcement {
                limit: pvisor_sandbox::limits::LimitKind::Cpus,
                value: cpus.to_string(),
                by: pvisor_sandbox::limits::Mechanism::Enforced(format!("{} vCPU(s)", config.cpus)),
            });
        }
        if let Some(pids) = requested.pids {
            out.push(pvisor_sandbox::limits::Enforcement {
                limit: pvisor_sandbox::limits::LimitKind::Pids,
                value: pids.to_string(),
                by: pvisor_sandbox::limits::Mechanism::NotEnforced(
                    "the vm executor does not limit processes inside the guest".into(),
                ),
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
            "start": self.start,
            "workspace_disks": self.workspace_disks,
        }))
    }

    fn wait(self: Box<Self>) -> Result<ExitReport, SandboxError> {
        let shared = self.shared;
        if let Some(termination) = self.early {
            let (_, usage) = shared.quit_and_reap();
            shared.remove_disks();
            return Ok(ExitReport {
                termination,
                usage,
                oom_killed: false,
                interrupted_at_terminal: false,
                stage_error: None,
            });
        }
        let mut oom_killed = false;
        let mut ticks = 0u32;
        let ending = loop {
            match self.events.recv_timeout(Duration::from_millis(100)) {
                Ok(AgentEvent::OomKill) => oom_killed = true,
                Ok(AgentEvent::Exited { code, signal }) => {
                    *shared.exited.lock().unwrap_or_else(|p| p.into_inner()) = true;
                    break Ok((code, signal));
                }
                Ok(AgentEvent::Gone(why)) => break Err(why),
                Err(RecvTimeoutError::Timeout) if shared.qemu_running() => {
                    // Once a second: a VM QEMU stopped on a full disk would
                    // otherwise be waited for for ever.
                    ticks += 1;
                    if ticks.is_multiple_of(10) {
                        if let Some(why) = shared.disk_error() {
                            break Err(why);
                        }
                    }
                }
                Err(_) => break Err("the VM stopped".into()),
            }
        };
        // A checkpoint or suspension in progress finishes first.
        let _op = shared.op.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(manifest) = shared.suspended.lock().unwrap_or_else(|p| p.into_inner()).take() {
            tracing::info!(checkpoint = %manifest.id, "suspend: waiting for QEMU to quit");
            let (qemu, usage) = shared.quit_and_reap();
            // The checkpoint holds its own copies; these were this Attempt's scratch.
            shared.remove_disks();
            return Ok(ExitReport {
                termination: Termination::Suspended { checkpoint: Box::new(manifest), qemu },
                usage,
                oom_killed: false,
                interrupted_at_terminal: false,
                stage_error: None,
            });
        }
        // An export that fails leaves a partial stage: the result says so
        // (the Bundle marks it incomplete), and the guest disk is kept.
        let mut stage_error = None;
        let termination = match ending {
            Ok((code, signal)) => {
                tracing::info!(?code, ?signal, "the command exited in the guest; exporting its staged files");
                let exporting = Instant::now();
                if let Err(e) = export::export_stage(&shared, &shared.spec.upper) {
                    let e = match shared.disk_error() {
                        Some(why) => format!("{why} ({e})"),
                        None => e,
                    };
                    tracing::info!(error = %e, "export of the staged files failed");
                    stage_error = Some(format!(
                        "cannot take the staged files out of the VM: {e}; the guest disk is kept at {}",
                        shared.vm.dir.join(checkpoint::UPPER).display()
                    ));
                }
                tracing::debug!(elapsed_ms = exporting.elapsed().as_millis() as u64, "staged files exported");
                match (code, signal) {
                    (Some(code), _) => Termination::Exited(code),
                    (None, Some(signal)) => Termination::Signaled(signal),
                    (None, None) => Termination::Vanished { detail: "the agent reported no status".into() },
                }
            }
            Err(why) => {
                tracing::info!(reason = %why, "the VM ended without the command's exit");
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
        if stage_error.is_none() {
            // The disks are the Attempt's scratch; the stage now holds the result.
            shared.remove_disks();
        }
        Ok(ExitReport { termination, usage, oom_killed, interrupted_at_terminal: false, stage_error })
    }
}
