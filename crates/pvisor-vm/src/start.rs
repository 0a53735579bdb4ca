//! The phases of a VM start, in order ([`VmProcess::start`](super::VmProcess)
//! runs them): check the spec, prepare the disks (a checkpoint's, or the
//! workspace's and the choice of template or boot), spawn QEMU (with the
//! NIC joined and virtiofsd started), connect the agent link and QMP, load
//! saved machine state, wait for the agent's `Hello`, repair a restored
//! guest, and set up the workspace and exec the command.

use std::fs;
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pvisor_agent_proto::{Reply, Request};

use super::link::{read_agent, AgentEvent, Calls, Credits, LinkError, Shared, Sinks};
use super::net::NetBridge;
use super::nic;
use super::qemu::{capture_console, incoming_uri, qemu_command, spawn_qemu, tail, Ram, TapNic};
use super::virtiofs::{self, FileServers};
use super::{
    checkpoint, disk, lower, qmp, setup, Accelerator, ExecCheckpoint, Layout, MachineConfig, RamFormat,
    VmExecutor, EXEC_ID,
};
use pvisor_sandbox::timing::PhaseClock;
use pvisor_sandbox::{sys, NetworkAttachment, SandboxError, SandboxSpec, Termination, VmSpec};

/// Why saved machine state could not be loaded, or a restored guest repaired.
#[derive(Debug, thiserror::Error)]
enum RestoreError {
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error("restoring the machine state ended in state {0}")]
    EndedIn(String),
    #[error("cannot reseed the guest: {0}")]
    Entropy(#[source] std::io::Error),
    #[error("the agent answered {request} with {reply}")]
    Unexpected { request: &'static str, reply: String },
}

/// Replies the reader buffers for the op in progress; beyond that it waits,
/// so a flooding guest stalls only itself, never the supervisor's memory.
const REPLY_BACKLOG: usize = 64;

/// The Attempt's disk images, removed unless the VM started (then `wait`
/// owns them).
pub(super) struct Scratch(pub(super) Vec<PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = fs::remove_file(path);
        }
    }
}

/// What the spec asks of the VM, checked before anything is created.
pub(super) struct Checked {
    pub(super) vm: VmSpec,
    pub(super) proxy_port: Option<u16>,
    /// The network namespace whose interface the guest's NIC takes over.
    pub(super) netns: Option<PathBuf>,
}

/// Refuses what a VM cannot do (the host network, a hidden path inside the
/// workspace it copies, a full state filesystem) and creates its directory.
pub(super) fn check(spec: &SandboxSpec) -> Result<Checked, SandboxError> {
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
    Ok(Checked { vm, proxy_port, netns })
}

/// Free space below which a VM is not started: its disks are sparse files
/// in the state directory, and QEMU stops a guest whose write finds the
/// filesystem full, so a start there would only wait.
const MIN_FREE_BYTES: u64 = 16 << 20;

/// Refuses to start a VM on a full state filesystem, naming it (ENOSPC).
fn check_room(dir: &Path) -> Result<(), SandboxError> {
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

/// How a VM starts.
pub(super) enum Start {
    /// Restore an execution checkpoint (resume, fork).
    Restore { state: PathBuf, manifest: Box<ExecCheckpoint> },
    /// Restore a template; `in_use` keeps it from removal until QEMU loaded it.
    Clone { template: Box<super::template::Template>, _in_use: Option<super::template::InUse> },
    /// Boot the kernel, and why no template was used.
    Boot { reason: String },
}

impl Start {
    pub(super) fn mode(&self) -> &'static str {
        match self {
            Self::Restore { .. } => "checkpoint-restore",
            Self::Clone { .. } => "template-restore",
            Self::Boot { .. } => "boot",
        }
    }

    /// Releases the template once QEMU holds its files.
    pub(super) fn loaded(self) -> Self {
        match self {
            Self::Clone { template, .. } => Self::Clone { template, _in_use: None },
            other => other,
        }
    }

    pub(super) fn facts(&self) -> serde_json::Value {
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

    /// The saved machine state QEMU loads instead of booting, if any.
    fn incoming(&self) -> Option<PathBuf> {
        match self {
            Self::Restore { state, .. } => Some(state.clone()),
            Self::Clone { template, .. } => Some(template.state()),
            Self::Boot { .. } => None,
        }
    }
}

/// How a fresh start's disks were made, for the Attempt's facts (a
/// restore reuses the checkpoint's).
#[derive(Debug, Default)]
pub(super) struct Prepared {
    pub(super) workspace: Option<lower::Prepared>,
    /// The userland image's base and delta (`--image`).
    pub(super) image: Option<lower::Prepared>,
}

/// Prepares the disks in `scratch` and decides how the VM starts: from the
/// checkpoint `vm.restore` names, else from a template, else by booting.
pub(super) fn prepare(
    executor: &VmExecutor,
    spec: &SandboxSpec,
    checked: &Checked,
    boot_reason: Option<String>,
    scratch: &mut Scratch,
) -> Result<(Start, Prepared), SandboxError> {
    let vm = &checked.vm;
    match &vm.restore {
        Some(_) if !vm.shared_directories.is_empty() => {
            Err(setup("restore", "a VM that shares host directories has no execution checkpoints"))
        }
        Some(dir) => Ok((restore_disks(dir, checked, scratch)?, Prepared::default())),
        None => fresh_disks(executor, spec, checked, boot_reason, scratch),
    }
}

/// Copies a verified checkpoint's disks, exactly the device list it was taken with.
fn restore_disks(dir: &Path, checked: &Checked, scratch: &mut Scratch) -> Result<Start, SandboxError> {
    let manifest = checkpoint::verify(dir).map_err(|e| SandboxError::Setup {
        step: "restore".into(),
        message: e.to_string(),
        hint: Some("the checkpoint cannot be resumed; fork an earlier one or drop the Job".into()),
    })?;
    // Exactly the device list the checkpoint was taken with.
    scratch.0 = manifest.disks.iter().map(|name| checked.vm.dir.join(name)).collect();
    for (name, path) in manifest.disks.iter().zip(&scratch.0) {
        disk::keep_disk(&dir.join(name), path)
            .map_err(|e| setup("restore", format!("cannot copy the checkpoint's {name}: {e}")))?;
    }
    // The device list must be the saved one: a NIC exactly when it had one.
    match (&manifest.nic, &checked.netns) {
        (Some(_), None) => {
            return Err(setup(
                "restore",
                "the checkpoint's VM had a NIC in a pod's network namespace; it resumes only in one",
            ))
        }
        (None, Some(_)) => {
            return Err(setup(
                "restore",
                "the checkpoint's VM had no NIC; it cannot resume into a network namespace",
            ))
        }
        _ => {}
    }
    Ok(Start::Restore { state: dir.join(checkpoint::STATE), manifest: Box::new(manifest) })
}

/// Images the workspace (lower and delta disks), creates the upper disk,
/// images the userland (`--image`) the same way, and picks the template to
/// restore, or why the VM boots.
fn fresh_disks(
    executor: &VmExecutor,
    spec: &SandboxSpec,
    checked: &Checked,
    boot_reason: Option<String>,
    scratch: &mut Scratch,
) -> Result<(Start, Prepared), SandboxError> {
    let vm = &checked.vm;
    scratch.0 = disk::boot_disk_names().iter().map(|name| vm.dir.join(name)).collect();
    let upper = disk::start_upper(&scratch.0[2]).map_err(|e| setup("upper-disk", e))?;
    let staging = vm.dir.join(lower::DELTA_STAGING);
    let prepared =
        lower::prepare(&executor.state_root, &spec.workspace, &scratch.0[0], &scratch.0[1], &staging)
            .map_err(|e| SandboxError::Setup {
                step: "workspace-image".into(),
                message: format!("cannot image the workspace {}: {e}", spec.workspace.display()),
                hint: Some("every file in the workspace must be readable by the user running pvisor".into()),
            })?;
    let image = vm.image.as_ref().map(|image| image_disks(executor, image, &vm.dir, scratch)).transpose()?;
    let plan = match boot_reason {
        Some(reason) => Err(reason),
        // A template's device list has no NIC; it cannot gain one.
        None if checked.netns.is_some() => Err("a VM with a NIC boots: templates are built without one".into()),
        None if !vm.shared_directories.is_empty() => Err(
            "a VM that shares host directories boots: virtiofsd maps its RAM, which a template clone keeps private"
                .into(),
        ),
        // With a userland image, a template of the same five disks.
        None => executor.template_for(&executor.machine_config(&spec.limits), Layout::of(vm.image.is_some())),
    };
    let start = match plan {
        Ok((template, in_use)) => Start::Clone { template: Box::new(template), _in_use: Some(in_use) },
        Err(reason) => Start::Boot { reason },
    };
    upper.finish().map_err(|e| setup("upper-disk", e))?;
    Ok((start, Prepared { workspace: Some(prepared), image }))
}

/// Images the userland's root filesystem as a base (cached, like a
/// workspace's) and a delta, appended to the device list after the
/// workspace's disks.
fn image_disks(
    executor: &VmExecutor,
    image: &pvisor_core::records::UserlandImage,
    dir: &Path,
    scratch: &mut Scratch,
) -> Result<lower::Prepared, SandboxError> {
    let (base, delta) = (dir.join(disk::IMAGE_LOWER), dir.join(disk::IMAGE_DELTA));
    scratch.0.extend([base.clone(), delta.clone()]);
    let staging = dir.join(lower::IMAGE_DELTA_STAGING);
    lower::prepare(&executor.state_root, &image.rootfs, &base, &delta, &staging).map_err(|e| SandboxError::Setup {
        step: "userland-image".into(),
        message: format!("cannot image the userland {} ({}): {e}", image.name, image.rootfs.display()),
        hint: Some(format!(
            "every file of the image must be readable by the user running pvisor; import it again (pvisor image import {} DIR|TAR|OCI-LAYOUT)",
            image.name
        )),
    })
}

/// A spawned QEMU and the host ends of its channels.
pub(super) struct Machine {
    child: Child,
    agent: UnixStream,
    qmp: UnixStream,
    /// The guest NIC's configuration, for the agent's `Setup`.
    pub(super) interface: Option<pvisor_agent_proto::Interface>,
    nic_mac: Option<String>,
    file_servers: FileServers,
    /// When QEMU was spawned: the boot (or restore) time counts from here.
    pub(super) started: Instant,
}

/// Joins the NIC's network namespace, starts virtiofsd for the shared
/// directories, and spawns QEMU on the disks in `disks`.
pub(super) fn spawn_machine(
    executor: &VmExecutor,
    checked: &Checked,
    start: &Start,
    config: &MachineConfig,
    disks: &[PathBuf],
) -> Result<Machine, SandboxError> {
    let vm = &checked.vm;
    let shares = &vm.shared_directories;
    let ram = match start {
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
    let devices: Vec<disk::Disk<'_>> =
        disks.iter().map(|p| disk::Disk::of(p)).collect::<Result<_, _>>().map_err(|e| setup("vm", e))?;

    let (agent, agent_qemu) = UnixStream::pair().map_err(SandboxError::Spawn)?;
    let (qmp_host, qmp_qemu) = UnixStream::pair().map_err(SandboxError::Spawn)?;
    let (console_host, console_qemu) = UnixStream::pair().map_err(SandboxError::Spawn)?;
    capture_console(console_host, &vm.dir.join("console.log")).map_err(|e| setup("vm", e))?;
    let nic = join_nic(checked, start)?;
    let mut file_servers = FileServers::start(shares, &vm.dir).map_err(|e| setup("share", e))?;
    let nic_mac = nic.as_ref().map(|n| n.mac.clone());
    let tap_nic = nic.as_ref().map(|n| TapNic { tap: n.tap.as_fd(), mac: &n.mac });
    let mut command = qemu_command(
        &executor.image,
        config,
        ram,
        &devices,
        &agent_qemu,
        &qmp_qemu,
        &console_qemu,
        &file_servers.devices(),
        tap_nic,
        start.incoming().is_some(),
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
    Ok(Machine { child, agent, qmp: qmp_host, interface, nic_mac, file_servers, started })
}

/// Takes over the network namespace's interface for the guest's NIC; a
/// restored guest keeps the address and MAC it was saved with, so the
/// interface must still be the one it took over.
fn join_nic(checked: &Checked, start: &Start) -> Result<Option<nic::Nic>, SandboxError> {
    let Some(netns) = &checked.netns else { return Ok(None) };
    let nic = nic::join(netns).map_err(|e| SandboxError::Setup {
        step: "network".into(),
        message: e.to_string(),
        hint: Some("the VM's NIC takes over the namespace's one interface (docs/kubernetes.md)".into()),
    })?;
    if let Start::Restore { manifest, .. } = start {
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
    Ok(Some(nic))
}

/// How long QEMU has to answer QMP, load state and bring the agent up.
pub(super) fn boot_timeout(config: &MachineConfig) -> Duration {
    match config.accelerator {
        Accelerator::Kvm => Duration::from_secs(30),
        Accelerator::Tcg => Duration::from_secs(120),
    }
}

/// A start failure once QEMU runs, with the tails of its log and the console.
pub(super) fn qemu_failed(dir: &Path, what: String) -> SandboxError {
    setup(
        "qemu",
        format!(
            "{what}; qemu: {}; console: {}",
            tail(&dir.join("qemu.log"), 3),
            tail(&dir.join("console.log"), 3)
        ),
    )
}

/// A start failure once the link is up: QEMU is stopped and reaped first.
pub(super) fn fail(shared: &Shared, message: impl std::fmt::Display) -> SandboxError {
    // A full disk stops the VM mid-boot: name it, not the silence it causes.
    let message = match shared.disk_error() {
        Some(why) => format!("{why} ({message})"),
        None => message.to_string(),
    };
    tracing::info!(error = %message, "VM start failed; stopping QEMU");
    let (status, _) = shared.quit_and_reap();
    qemu_failed(&shared.vm.dir, format!("{message} (qemu {status})"))
}

/// The supervisor's side of a spawned VM: QMP connected, the agent reader running.
pub(super) struct Linked {
    pub(super) shared: Arc<Shared>,
    pub(super) events: Receiver<AgentEvent>,
    pub(super) proxy_listener: Option<TcpListener>,
}

/// Connects QMP, binds the proxy listener, starts the thread that reads the
/// agent, and gathers the VM's shared state.
pub(super) fn link(
    executor: &VmExecutor,
    spec: &SandboxSpec,
    checked: &Checked,
    machine: Machine,
    config: MachineConfig,
    start: &Start,
    disks: Vec<PathBuf>,
) -> Result<Linked, SandboxError> {
    let Machine { child, agent, qmp: qmp_host, nic_mac, file_servers, .. } = machine;
    let qemu_pidfd = Arc::new(sys::pidfd_open(child.id() as i32).map_err(SandboxError::Spawn)?);
    let qmp = qmp::Qmp::connect(qmp_host, boot_timeout(&config))
        .map_err(|e| qemu_failed(&checked.vm.dir, e.to_string()))?;

    // The proxy listens on host loopback; only this process connects to
    // it, once per guest connection the agent reports.
    let proxy_listener = match checked.proxy_port {
        Some(_) => Some(TcpListener::bind("127.0.0.1:0").map_err(|e| setup("network", e))?),
        None => None,
    };
    let credits = Arc::new(Credits::default());
    let (replies_tx, replies_rx) = mpsc::sync_channel(REPLY_BACKLOG);
    let (events_tx, events) = mpsc::channel();
    let reader = agent.try_clone().map_err(SandboxError::Spawn)?;
    let agent = Arc::new(Mutex::new(agent));
    let net =
        NetBridge::new(proxy_listener.as_ref().and_then(|l| l.local_addr().ok()), credits.clone(), &agent)
            .map_err(SandboxError::Spawn)?;
    let writer = agent.clone();
    let sinks = Sinks::default();
    // Only a restored guest runs execs this supervisor did not start.
    {
        let mut relays = sinks.lock().unwrap_or_else(|p| p.into_inner());
        relays.holding = matches!(start, Start::Restore { .. });
        relays.output = spec.output.clone();
    }
    let calls = Arc::new(Calls::default());
    std::thread::Builder::new()
        .name("pvisor-vm-agent".into())
        .spawn({
            let (credits, sinks, net, calls) = (credits.clone(), sinks.clone(), net.clone(), calls.clone());
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
        vm: checked.vm.clone(),
        disks,
        nic_mac,
        file_servers: Mutex::new(file_servers),
        control_stop: std::sync::atomic::AtomicBool::new(false),
    });
    Ok(Linked { shared, events, proxy_listener })
}

/// Loads the saved machine state (a checkpoint's or a template's) into the
/// paused QEMU and lets it run. While a template loads, `restoring` names it.
pub(super) fn load_state(
    shared: &Shared,
    start: &Start,
    started: Instant,
    restoring: &mut Option<String>,
) -> Result<(), SandboxError> {
    let Some(state) = start.incoming() else { return Ok(()) };
    if let Start::Clone { template, .. } = start {
        // From the load to the guest's repair, a failure is the template's.
        *restoring = Some(template.manifest.id.clone());
    }
    // The lock is released before `fail`, which quits QEMU over QMP.
    let loading = {
        let mut qmp = shared.qmp.lock().unwrap_or_else(|p| p.into_inner());
        (if shared.config.ram == RamFormat::Named { qmp::ignore_shared(&mut qmp) } else { Ok(()) }).and_then(
            |()| {
                qmp.execute::<qmp::Empty>(&qmp::Command::MigrateIncoming { uri: incoming_uri(&state) })
                    .map(|_| ())
            },
        )
    };
    loading.map_err(|e| fail(shared, e))?;
    wait_for_incoming(shared, boot_timeout(&shared.config)).map_err(|e| fail(shared, e))?;
    shared.qmp::<qmp::Empty>(&qmp::Command::Cont).map_err(|e| fail(shared, e))?;
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        start = start.mode(),
        "restore: machine state loaded"
    );
    Ok(())
}

/// Polls until QEMU has loaded the incoming state (it stays paused: `-S`).
fn wait_for_incoming(shared: &Shared, timeout: Duration) -> Result<(), RestoreError> {
    let deadline = Instant::now() + timeout;
    loop {
        let status: qmp::Status = shared.qmp(&qmp::Command::QueryStatus)?;
        match status.status.as_str() {
            "inmigrate" | "prelaunch" if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            "paused" | "postmigrate" => return Ok(()),
            other => return Err(RestoreError::EndedIn(other.to_owned())),
        }
    }
}

/// Waits for the agent's `Hello` and checks its protocol version.
pub(super) fn hello(shared: &Shared) -> Result<(), SandboxError> {
    match shared.hello(boot_timeout(&shared.config)).map_err(|e| fail(shared, e))? {
        (Reply::Hello { version, .. }, _) if version == pvisor_agent_proto::VERSION => Ok(()),
        (other, _) => Err(fail(
            shared,
            format!("the agent answered Hello with {other:?} (protocol {})", pvisor_agent_proto::VERSION),
        )),
    }
}

/// Repairs a guest restored from a template or checkpoint (see
/// [`reattach`] and [`reseed`]): the facts worth an event, `None` for a boot.
pub(super) fn repair(shared: &Shared, start: &Start) -> Result<Option<serde_json::Value>, SandboxError> {
    match start {
        Start::Restore { manifest, .. } => Ok(Some(reattach(shared, manifest).map_err(|e| fail(shared, e))?)),
        Start::Clone { template, .. } => {
            // A clone must never keep the template's random state.
            let (clock_step_ns, entropy_avail, reseeded) = reseed(shared).map_err(|e| fail(shared, e))?;
            Ok(Some(serde_json::json!({
                "template": template.manifest.id,
                "clock_step_ms": clock_step_ns / 1_000_000,
                "entropy_reseeded_bytes": reseeded,
                "entropy_avail": entropy_avail,
            })))
        }
        Start::Boot { .. } => Ok(None),
    }
}

/// Mounts the workspace in the guest and starts the command. `Some` is how
/// it ended at once: the agent could not execute it.
/// The command's environment, plus git's permission for the workspace: the
/// guest keeps the workspace's host owner (a rootless run's user) while the
/// command runs as the guest's root, and git refuses a repository another
/// user owns ("dubious ownership"), so an agent's `git commit` would fail.
/// The workspace is the one the user ran pvisor in; `GIT_CONFIG_COUNT` adds
/// `safe.directory` for it alone, unless the command brings its own.
fn command_env(spec: &SandboxSpec) -> Vec<(String, String)> {
    let mut env = spec.env.clone();
    if !env.iter().any(|(k, _)| k == "GIT_CONFIG_COUNT") {
        env.push(("GIT_CONFIG_COUNT".into(), "1".into()));
        env.push(("GIT_CONFIG_KEY_0".into(), "safe.directory".into()));
        env.push(("GIT_CONFIG_VALUE_0".into(), spec.workspace.to_string_lossy().into_owned()));
    }
    env
}

pub(super) fn run_command(
    shared: &Shared,
    spec: &SandboxSpec,
    checked: &Checked,
    interface: Option<pvisor_agent_proto::Interface>,
    clock: &mut PhaseClock,
) -> Result<Option<Termination>, SandboxError> {
    let timeout = boot_timeout(&shared.config);
    let request = Request::Setup {
        workspace: spec.workspace.clone(),
        hostname: spec.hostname.clone(),
        clock_unix_ns: unix_now_ns(),
        proxy_port: checked.proxy_port,
        delta: true,
        interface,
        shares: virtiofs::guest_shares(&checked.vm.shared_directories),
        userland: checked.vm.image.is_some(),
    };
    let setting_up = Instant::now();
    let guest_steps = match shared.call(&request, &[], timeout).map_err(|e| fail(shared, e))? {
        (Reply::Ready { steps_us }, _) => steps_us,
        (other, _) => return Err(fail(shared, format!("the agent answered Setup with {other:?}"))),
    };
    tracing::info!(setup_ms = setting_up.elapsed().as_millis() as u64, "workspace mounted in the guest");
    clock.mark("guest_setup");
    // The guest's word, for timings only: it decides nothing, and only
    // short plain names reach the records and the terminal.
    let plain = |name: &str| {
        (1..=32).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
    };
    clock.nested("guest", guest_steps.into_iter().filter(|(name, _)| plain(name)).take(32).collect());
    let argv = std::iter::once(spec.program.clone()).chain(spec.args.iter().cloned()).collect();
    let exec = Request::Exec {
        id: EXEC_ID,
        argv,
        env: command_env(spec),
        // The workspace is at its own path inside the userland, so the
        // cwd is the same path there.
        cwd: spec.cwd.clone(),
        root: checked.vm.image.as_ref().map(|_| PathBuf::from(pvisor_agent_proto::USERLAND_ROOT)),
        output: None,
        terminal: None,
        confinement: None,
    };
    let started = shared.call(&exec, &[], timeout).map_err(|e| fail(shared, e))?;
    clock.mark("exec");
    match started {
        (Reply::Started { .. }, _) => Ok(None),
        // Recorded like `ns` does: a failed Run with 126/127, not a setup error.
        (Reply::ExecFailed { errno, message, .. }, _) => {
            Ok(Some(Termination::ExecFailed { program: spec.program.clone(), errno, message }))
        }
        (other, _) => Err(fail(shared, format!("the agent answered Exec with {other:?}"))),
    }
}

fn unix_now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

/// After a restore: thaw the filesystems the checkpoint froze, step the
/// clock, reseed the guest's CRNG, and have the agent resend the command's
/// exit if it ended before the checkpoint.
fn reattach(shared: &Shared, manifest: &ExecCheckpoint) -> Result<serde_json::Value, RestoreError> {
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
fn reseed(shared: &Shared) -> Result<(i64, u64, usize), RestoreError> {
    // Never zeros: a guest reseeded with nothing would repeat its saved
    // random state in every copy.
    let entropy = pvisor_core::random::bytes::<64>().map_err(RestoreError::Entropy)?;
    match shared.call(
        &Request::Restored { clock_unix_ns: unix_now_ns() },
        &entropy,
        Duration::from_secs(30),
    )? {
        (Reply::Restored { clock_step_ns, entropy_avail }, _) => {
            Ok((clock_step_ns, entropy_avail as u64, entropy.len()))
        }
        (other, _) => Err(RestoreError::Unexpected { request: "Restored", reply: format!("{other:?}") }),
    }
}
