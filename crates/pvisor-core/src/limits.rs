//! Resource limits as admission records them (`--memory`, `--pids`,
//! `--cpus`, `--disk` and pvisor's defaults); how each was enforced is the
//! executor's report (`pvisor_sandbox::limits::Enforcement`).

use serde::{Deserialize, Serialize};

/// `--memory`, `--pids`, `--cpus`, `--disk`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceLimits {
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
    pub cpus: Option<f64>,
    /// The memory limit is pvisor's default, not the user's: it is enforced
    /// by a cgroup only, never by an address-space rlimit (which breaks
    /// programs that reserve large address ranges).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub memory_is_default: bool,
    /// The process limit is pvisor's default, not the user's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pids_is_default: bool,
    /// The stage's disk quota (`--disk`): bytes and inodes the command may
    /// add to the stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// The disk quota is pvisor's default, not the user's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disk_is_default: bool,
}

impl ResourceLimits {
    /// Whether no limit at all is asked for.
    pub fn is_empty(&self) -> bool {
        self.memory_bytes.is_none() && self.pids.is_none() && self.cpus.is_none() && self.disk_bytes.is_none()
    }

    /// Whether `limit` is pvisor's default rather than the user's request
    /// (pvisor has no default CPU limit).
    pub fn is_default(&self, limit: LimitKind) -> bool {
        match limit {
            LimitKind::Memory => self.memory_is_default,
            LimitKind::Pids => self.pids_is_default,
            LimitKind::Disk => self.disk_is_default,
            LimitKind::Cpus => false,
        }
    }
}

/// One kind of resource limit, named as `--memory`, `--pids`, `--cpus` and
/// `--disk` name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LimitKind {
    Memory,
    Pids,
    Cpus,
    Disk,
}

impl LimitKind {
    /// The limit's name as written in records and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Pids => "pids",
            Self::Cpus => "cpus",
            Self::Disk => "disk",
        }
    }
}

impl std::fmt::Display for LimitKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
