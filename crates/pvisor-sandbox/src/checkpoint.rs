//! Execution checkpoints as the runtime sees them: the manifest a backend
//! publishes (what was saved, of which machine, with which digests) and the
//! machine shape a restore must repeat. How a checkpoint is taken and
//! verified is the backend's (the `vm` crate's `checkpoint` module).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use pvisor_core::ids::CheckpointId;
use pvisor_core::time::Timestamp;

/// The files of a checkpoint directory.
pub const STATE: &str = "state";
pub const UPPER: &str = "upper.img";
pub const LOWER: &str = "lower.img";
/// The per-start delta disk (a guest-writable lower layer; see `vm::lower`).
pub const DELTA: &str = "delta.img";
/// A userland image's base and delta disks (`--image`): the same pair as
/// the workspace's, of the imported root filesystem.
pub const IMAGE_LOWER: &str = "image-lower.img";
pub const IMAGE_DELTA: &str = "image-delta.img";
pub const MANIFEST: &str = "manifest.json";
pub const KIND: &str = "execution";

/// `runs/<run>/exec-checkpoints/<id>/manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecCheckpoint {
    pub format: u32,
    pub id: CheckpointId,
    pub kind: String,
    pub created_at: Timestamp,
    /// The guest image digest; a restore boots exactly this image.
    pub image: String,
    pub machine: MachineConfig,
    pub workspace: PathBuf,
    pub exec_id: u32,
    /// The runtime's facts (job, attempt, baseline).
    pub context: serde_json::Value,
    pub files: Vec<CheckpointFile>,
    /// The disk files in device order; a restore attaches exactly these.
    /// Checkpoints taken before the delta disk existed had two.
    #[serde(default = "two_disks")]
    pub disks: Vec<String>,
    /// Filesystems the agent froze; the restore thaws them.
    pub frozen: Vec<PathBuf>,
    /// The MAC of the guest's NIC, if it had one (a VM in a pod's network):
    /// a restore attaches the same device, in a network namespace again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nic: Option<String>,
    /// The userland image the command runs in (`--image`), whose disks are
    /// in `disks`: a fork records it as its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub userland: Option<pvisor_core::records::UserlandImage>,
    /// How long the guest was stopped, and the whole save.
    pub paused_ms: u64,
    pub save_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointFile {
    pub name: String,
    pub size: u64,
    /// BLAKE3 of the bytes, or of the data extents for sparse disk images.
    pub blake3: String,
    pub sparse: bool,
}

fn two_disks() -> Vec<String> {
    vec![LOWER.into(), UPPER.into()]
}

/// The machine shape; a restore must repeat it exactly.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MachineConfig {
    pub memory_mib: u64,
    pub cpus: u32,
    pub accelerator: Accelerator,
    /// How RAM was provided (absent in checkpoints older than templates).
    #[serde(default)]
    pub ram: RamFormat,
    /// The CPU model a TCG guest emulates (absent in checkpoints older
    /// than it: QEMU's default). A KVM guest has the host's.
    #[serde(default)]
    pub cpu: CpuModel,
    /// Whether the machine has the legacy i8254 PIT (absent in checkpoints
    /// older than the choice: QEMU's default, a PIT). Its migration state is
    /// in a saved machine, so a restore must repeat it.
    #[serde(default)]
    pub pit: Pit,
}

/// The legacy i8254 timer. Linux never uses it on these machines (the TSC is
/// its clock, the local APIC its timer), but QEMU keeps its channel 0
/// counting at 18.2 Hz from reset: a host wakeup every 27 ms for every idle
/// VM, about a third of an idle TCG guest's CPU (measured in the
/// performance docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pit {
    /// QEMU's default: what machines saved before the choice have.
    #[default]
    On,
    /// `-machine microvm,pit=off`: every fresh start since.
    Off,
}

/// The vCPU model under TCG; a restore must repeat it (the guest kernel
/// chose its code paths by the features it saw at boot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CpuModel {
    /// QEMU's `qemu64`: baseline x86-64, no SSE4.2 or AVX. Programs built
    /// for newer CPUs (Bun's, so Claude Code's native binary) die of SIGILL.
    #[default]
    Default,
    /// `-cpu max`: every feature TCG emulates (AVX2 and the rest of
    /// x86-64-v3 in QEMU 7.2).
    Max,
}

impl CpuModel {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Max => "max",
        }
    }
}

/// The RAM layout a saved machine needs again on restore.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RamFormat {
    /// `-m` alone, no `x-ignore-shared`: checkpoints from before templates.
    #[default]
    Legacy,
    /// The `pvisor.ram` backend with `x-ignore-shared`: everything since.
    Named,
}

/// The hardware accelerator QEMU uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accelerator {
    Kvm,
    Tcg,
}

impl Accelerator {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Tcg => "tcg",
        }
    }
}
