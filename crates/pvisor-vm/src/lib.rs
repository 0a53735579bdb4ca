//! pvisor-vm: the `vm` executor, one QEMU microVM per Attempt, driven over QMP, with
//! `pvisor-agent` as the guest's PID 1 (AgentCtl over virtio-serial).
//!
//! The workspace reaches the guest as three disks: a read-only ext4 base
//! image of the workspace cached across Jobs (lower), a small image of what
//! changed since that base was built (delta, see [`lower`]), and a sparse
//! writable ext4 disk (upper), joined by an overlay the agent mounts at the
//! workspace's own path. When the command
//! ends, the agent streams the upper layer out and [`export`] writes it into
//! the Run's stage in the same format the `ns` backend leaves, so review,
//! apply, preimages and receipts have no VM special case.
//!
//! Execution checkpoints ([`checkpoint`]) go through a control socket in the
//! Attempt's `vm/` directory: quiesce through the agent, `stop`, migrate the
//! machine state to a file, copy the upper disk, publish a manifest with
//! digests, then either `cont` (checkpoint) or `quit` (suspend). A suspended
//! Attempt's `wait` returns [`Termination::Suspended`](pvisor_sandbox::Termination::Suspended) only after QEMU exited.
//!
//! The code is split along its seams: `qemu` builds the command line and
//! owns the QEMU process, `link` is the agent channel (shared state,
//! calls, the frame router, credits), `net` the guest's proxy and forward
//! streams, `control` the control socket (server and client), and `process`
//! one running microVM from boot to its end. This file holds the executor.
//!
//! Boundary: this crate implements `pvisor-sandbox`'s [`Executor`] and its
//! capabilities ([`VmControl`]) and owns everything about QEMU, the guest
//! image, disks, templates and the agent channel. It does not know the `ns`
//! backend, nor Jobs and records (the runtime, `pvisor`, does).

// Unit tests write fixtures and print freely.
#![cfg_attr(test, allow(clippy::disallowed_methods, clippy::disallowed_macros))]

pub mod checkpoint;
mod control;
mod credit;
mod disk;
mod export;
pub mod guest;
pub mod image;
mod link;
mod live;
pub mod lower;
mod net;
pub mod nic;
mod process;
mod qemu;
mod qmp;
mod start;
pub mod template;
pub mod virtiofs;

use std::path::{Path, PathBuf};

pub use checkpoint::ExecCheckpoint;
pub use control::{control, ControlError, ControlRequest, ControlResponse, CONTROL_SOCKET};
pub use disk::Layout;
pub use image::{AccelChoice, Accelerator, GuestImage};
pub use live::VmControl;
pub use process::VmProcess;
pub use pvisor_sandbox::checkpoint::{CpuModel, MachineConfig, Pit, RamFormat};
pub use pvisor_sandbox::VmSpec;

use pvisor_sandbox::capabilities::CapabilityError;
use pvisor_sandbox::{Executor, NetworkAttachment, SandboxError, SandboxProcess, SandboxSpec};

/// The one exec id of an Attempt's command (the protocol allows more).
const EXEC_ID: u32 = 1;

/// Default guest RAM when no `--memory` limit is given.
const DEFAULT_MEMORY_MIB: u64 = 512;

/// `PVISOR_VM_TEMPLATES=off` makes every vm Job boot (benchmarks compare the two).
const TEMPLATES_ENV: &str = "PVISOR_VM_TEMPLATES";

/// The microVM executor. Holds the verified image and the accelerator decision.
#[derive(Clone, Debug)]
pub struct VmExecutor {
    image: GuestImage,
    accel: AccelChoice,
    /// The state directory: vm templates (`vm-templates/`) and the
    /// per-workspace lower caches live under it.
    state_root: PathBuf,
}

impl VmExecutor {
    /// Installs the built guest image under `state_root` and picks the accelerator.
    pub fn prepare(state_root: &Path) -> Result<Self, SandboxError> {
        let built = GuestImage::locate_built()?;
        let image = GuestImage::install(&built, state_root)?;
        let accel = image::choose_accelerator(&image);
        Ok(Self { image, accel, state_root: state_root.to_owned() })
    }

    /// The executor a checkpoint was taken with: its installed image (verified)
    /// and its accelerator, since machine state only restores onto the same.
    pub fn for_checkpoint(state_root: &Path, manifest: &ExecCheckpoint) -> Result<Self, SandboxError> {
        let image = GuestImage::open_installed(state_root, &manifest.image)?;
        let accel = AccelChoice {
            accelerator: manifest.machine.accelerator,
            reason: format!("restoring a checkpoint taken under {}", manifest.machine.accelerator.as_str()),
        };
        Ok(Self { image, accel, state_root: state_root.to_owned() })
    }

    pub fn image(&self) -> &GuestImage {
        &self.image
    }

    pub fn accelerator(&self) -> &AccelChoice {
        &self.accel
    }

    /// The machine a fresh start of `limits` gets.
    pub fn machine_config(&self, limits: &pvisor_sandbox::limits::Limits) -> MachineConfig {
        MachineConfig {
            memory_mib: limits.memory_bytes.map_or(DEFAULT_MEMORY_MIB, |b| (b >> 20).max(128)),
            cpus: limits.cpus.map_or(1, |c| c.ceil().max(1.0) as u32),
            accelerator: self.accel.accelerator,
            ram: RamFormat::Named,
            cpu: CpuModel::Max,
            pit: Pit::Off,
        }
    }

    pub fn templates_root(&self) -> PathBuf {
        template::root(&self.state_root)
    }

    fn templates_disabled(&self) -> Option<String> {
        (std::env::var(TEMPLATES_ENV).as_deref() == Ok("off")).then(|| format!("{TEMPLATES_ENV}=off"))
    }

    /// How a fresh start of `config` with the disks of `layout` is planned,
    /// for the Placement: the template it restores (possibly built first),
    /// or why it boots. (Both are descriptions the Placement records, not
    /// errors: a String.)
    pub fn start_plan(&self, config: &MachineConfig, layout: Layout) -> Result<String, String> {
        if let Some(why) = self.templates_disabled() {
            return Err(why);
        }
        let key = template::key(&self.image, config, layout);
        let id = key.id();
        let root = self.templates_root();
        // Read-only: the plan must not take the locks a build or a remove needs.
        let building = fs_names(&root).any(|n| n.starts_with(&format!(".partial-{id}-")));
        if root.join(&id).join(template::MANIFEST).is_file() {
            Ok(id)
        } else if building {
            Err(template::TemplateError::Busy(id).to_string())
        } else {
            Ok(format!("{id} (built on this first use)"))
        }
    }

    /// The verified template to start `config` from, built first if none
    /// is published; `Err` is why this start boots instead, a reason the
    /// Placement records as text (not an error the start fails with).
    pub(crate) fn template_for(
        &self,
        config: &MachineConfig,
        layout: Layout,
    ) -> Result<(template::Template, template::InUse), String> {
        if let Some(why) = self.templates_disabled() {
            return Err(why);
        }
        let key = template::key(&self.image, config, layout);
        let root = self.templates_root();
        match template::open(&root, &key) {
            Ok(Some(found)) => return Ok(found),
            Ok(None) => {}
            Err(why) => tracing::warn!(error = %why, "vm template refused"),
        }
        // A one-time wait of seconds to minutes the user must be told of.
        pvisor_sandbox::notice::tell(&format!(
            "building the vm template {} ({} MiB, {} vCPU, {}): a one-time boot; later vm starts restore it",
            key.id(),
            config.memory_mib,
            config.cpus,
            config.accelerator.as_str()
        ));
        template::build(&root, &self.image, config, layout).map_err(|e| e.to_string())?;
        template::open(&root, &key)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("the template {} vanished after its build", key.id()))
    }
}

impl pvisor_sandbox::capabilities::Templates for VmExecutor {
    fn warm(
        &self,
        limits: &pvisor_sandbox::limits::Limits,
    ) -> Result<pvisor_sandbox::capabilities::WarmedTemplate, CapabilityError> {
        let config = self.machine_config(limits);
        let key = template::key(&self.image, &config, Layout::Workspace);
        let root = self.templates_root();
        if let Ok(Some((found, _))) = template::open(&root, &key) {
            return Ok(pvisor_sandbox::capabilities::WarmedTemplate {
                id: key.id(),
                built: false,
                build_ms: None,
                dir: found.dir,
            });
        }
        let built = template::build(&root, &self.image, &config, Layout::Workspace)
            .map_err(|e| CapabilityError::Failed(e.to_string()))?;
        Ok(pvisor_sandbox::capabilities::WarmedTemplate {
            id: key.id(),
            built: true,
            build_ms: Some(built.manifest.build_ms),
            dir: built.dir,
        })
    }

    fn list(&self) -> Vec<template::TemplateListing> {
        let fresh = self.machine_config(&pvisor_sandbox::limits::Limits::default());
        template::list(&self.templates_root(), &|key| template::is_current(key, &self.image, fresh))
    }

    fn remove(&self, id: &str) -> Result<u64, CapabilityError> {
        template::remove(&self.templates_root(), id).map_err(|e| CapabilityError::Failed(e.to_string()))
    }

    fn sweep(&self, dry_run: bool) -> Vec<template::Swept> {
        let root = self.templates_root();
        let mut swept: Vec<template::Swept> = self
            .list()
            .into_iter()
            .filter(|t| t.stale)
            .filter(|t| dry_run || template::remove(&root, &t.id).is_ok())
            .map(|t| template::Swept {
                what: format!("vm template {} (stale: built for another guest image or QEMU)", t.id),
                path: t.dir,
                bytes: t.bytes,
            })
            .collect();
        swept.extend(template::sweep(&root, dry_run));
        swept
    }
}

impl Executor for VmExecutor {
    fn name(&self) -> &'static str {
        "vm"
    }

    fn describe_attachment(&self, attachment: NetworkAttachment) -> String {
        describe_attachment(attachment)
    }

    fn placement_details(
        &self,
        limits: &pvisor_sandbox::limits::Limits,
        image: Option<&pvisor_core::records::UserlandImage>,
    ) -> Vec<(String, String)> {
        let mut details = vec![
            ("accelerator".into(), self.accel.accelerator.as_str().into()),
            ("accelerator_reason".into(), self.accel.reason.clone()),
            ("image".into(), self.image.digest.clone()),
            ("guest_kernel".into(), self.image.kernel_version.clone()),
        ];
        if let Some(image) = image {
            details.push(("userland".into(), format!("{} {}", image.name, image.digest)));
        }
        match self.start_plan(&self.machine_config(limits), Layout::of(image.is_some())) {
            Ok(template) => {
                details.push(("start".into(), "template".into()));
                details.push(("template".into(), template));
            }
            Err(why) => {
                details.push(("start".into(), "boot".into()));
                details.push(("boot_reason".into(), why));
            }
        }
        details
    }

    fn start(&self, spec: &SandboxSpec) -> Result<Box<dyn SandboxProcess>, SandboxError> {
        let mut restoring = None;
        let started = match VmProcess::start(self, spec, None, &mut restoring) {
            // A template that verified but would not restore (a QEMU or host
            // CPU it was not built for): set it aside and boot; no user code ran.
            Err(e) if restoring.is_some() => {
                let id = restoring.take().unwrap_or_default();
                let aside = template::discarded(template::discard(&self.templates_root(), &id));
                tracing::warn!(template = %id, error = %e, "template restore failed; booting instead");
                let reason = format!("restoring the template {id} failed ({e}); {aside}");
                VmProcess::start(self, spec, Some(reason), &mut restoring)
            }
            other => other,
        };
        started.map(|p| Box::new(p) as Box<dyn SandboxProcess>)
    }
}

fn fs_names(dir: &Path) -> impl Iterator<Item = String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
}

/// How a VM is attached to the network, as recorded in the Bundle. Without
/// a namespace to join, the guest has no network device at all.
fn describe_attachment(attachment: NetworkAttachment) -> String {
    match attachment {
        NetworkAttachment::Isolated => "microVM without a network device".into(),
        NetworkAttachment::ProxyListener { port } => format!(
            "microVM without a network device; guest 127.0.0.1:{port} is relayed by the agent over virtio-serial to pvisor's proxy; host loopback ports a HOST:PORT rule opens are reached through that proxy only (no raw TCP forward in the guest)"
        ),
        NetworkAttachment::Host => "refused: a VM cannot share the host network".into(),
        NetworkAttachment::Namespace => format!(
            "microVM with a virtio-net NIC: a TAP ({}) in the caller's network namespace, to and from which tc redirects all of its interface's traffic",
            nic::TAP
        ),
    }
}

fn setup(step: &str, message: impl std::fmt::Display) -> SandboxError {
    SandboxError::Setup { step: step.into(), message: message.to_string(), hint: None }
}
