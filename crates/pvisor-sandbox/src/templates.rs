//! Start templates as the runtime lists and removes them (see
//! [`Templates`](crate::capabilities::Templates)): a template's key, its
//! manifest, and what a sweep removed. Building and verifying them is the
//! backend's (the `vm` crate's `template` module).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use pvisor_core::time::Timestamp;

use crate::checkpoint::{Accelerator, CheckpointFile};

/// Everything a template's saved state depends on; any change is a new template.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateKey {
    pub format: u32,
    /// The guest image's digest (kernel, initramfs with the agent, cmdline).
    pub image: String,
    pub memory_mib: u64,
    pub cpus: u32,
    pub accelerator: Accelerator,
    /// The QEMU binary (path, size, mtime): device state only loads into
    /// the QEMU that saved it, and the microvm machine is not versioned.
    pub qemu: String,
    /// The disks' ids, serials and virtual sizes, in order.
    pub disks: String,
    /// Under KVM (`-cpu host`) the saved CPU state is this host CPU's: its
    /// model and flags and the host kernel. Under TCG the CPU is QEMU's own.
    #[serde(default)]
    pub host_cpu: String,
}

impl TemplateKey {
    /// The template's directory name: a digest of the key.
    pub fn id(&self) -> String {
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        format!("tpl-{}", &blake3::hash(&bytes).to_hex()[..20])
    }
}

/// `vm-templates/<id>/manifest.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TemplateManifest {
    pub id: String,
    pub key: TemplateKey,
    pub created_at: Timestamp,
    pub files: Vec<CheckpointFile>,
    /// Boot to agent, and the whole build.
    pub boot_ms: u64,
    pub build_ms: u64,
}

/// A published template as `pvisor image templates` lists it.
#[derive(Clone, Debug, Serialize)]
pub struct TemplateListing {
    pub id: String,
    pub dir: PathBuf,
    /// Host bytes used (sparse files count their data only).
    pub bytes: u64,
    pub manifest: Option<TemplateManifest>,
    /// Built for another guest image or QEMU than the installed ones.
    pub stale: bool,
}

/// One template directory `sweep` removed (or would remove).
#[derive(Clone, Debug, Serialize)]
pub struct Swept {
    pub what: String,
    pub path: PathBuf,
    pub bytes: u64,
}
