//! The `vm` executor: one QEMU microVM per Attempt, driven over QMP, with
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
//! Attempt's `wait` returns [`Termination::Suspended`](crate::Termination::Suspended) only after QEMU exited.
//!
//! The code is split along its seams: `qemu` builds the command line and
//! owns the QEMU process, `link` is the agent channel (shared state,
//! calls, the frame router, credits), `net` the guest's proxy and forward
//! streams, `control` the control socket (server and client), and `process`
//! one running microVM from boot to its end. This file holds the executor.

pub mod checkpoint;
mod control;
mod disk;
mod export;
pub mod guest;
pub mod image;
mod link;
mod live;
pub mod lower;
mod net;
mod process;
mod qemu;
mod qmp;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use checkpoint::{ControlRequest, ControlResponse, ExecCheckpoint};
pub use control::control;
pub use image::{AccelChoice, Accelerator, GuestImage};
pub use live::VmControl;
pub use process::VmProcess;

use crate::{Executor, NetworkAttachment, SandboxError, SandboxProcess, SandboxSpec};

/// The one exec id of an Attempt's command (the protocol allows more).
const EXEC_ID: u32 = 1;

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
    /// The state directory: where the per-workspace lower caches live.
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
