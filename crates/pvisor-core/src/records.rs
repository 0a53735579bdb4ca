//! The durable records: Job, Run, Attempt, Operation, Placement, RunResult,
//! Run Bundle and completion receipt.
//!
//! Each record carries a `format` number independent of the release; readers
//! refuse a format newer than they know (see `docs/records-and-version-matrix.md`).
//! Field names are the on-disk contract documented in `docs/on-disk-format.md`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::ids::{AttemptId, JobId, RunId};
use crate::state::{AttemptState, JobState, ResultState};
use crate::time::Timestamp;

pub use crate::limits::{LimitKind, ResourceLimits};

/// The format number written by this release into every record.
pub const FORMAT: u32 = 1;

/// A record type that carries a `format` number.
pub trait Record: Serialize + for<'de> Deserialize<'de> {
    /// The file name this record is stored under (used in error messages).
    const FILE: &'static str;
    /// Returns the record's format number.
    fn format(&self) -> u32;
}

macro_rules! record {
    ($t:ty, $file:literal) => {
        impl Record for $t {
            const FILE: &'static str = $file;
            fn format(&self) -> u32 {
                self.format
            }
        }
    };
}

/// `jobs/<job>/job.json`: the user's persistent work.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub format: u32,
    pub id: JobId,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub workspace: PathBuf,
    pub run: RunId,
    pub state: JobState,
    /// The Attempt number whose result this Job accepts.
    pub target_attempt: u32,
    /// Whether the Job may still continue (resume, new Attempts). `kill` withdraws it.
    pub continuation: bool,
    /// Where this Job came from, when it is a fork.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<Lineage>,
    /// The Bundle archive this Job was imported from: a read-only Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported_from: Option<String>,
    /// `key=value` labels given at admission ([`crate::labels`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: crate::labels::Labels,
}
record!(JobRecord, "job.json");

/// A fork's origin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lineage {
    pub parent_job: JobId,
    pub checkpoint: crate::ids::CheckpointId,
    pub kind: CheckpointKind,
}

/// What a checkpoint holds: `workspace` (a stage's files and conflict
/// baselines) or `execution` (a VM's machine state and disks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointKind {
    Workspace,
    Execution,
}

impl CheckpointKind {
    /// The kind's name as written in records.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Workspace => "workspace",
            Self::Execution => "execution",
        }
    }
}

impl std::fmt::Display for CheckpointKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `checkpoints/<id>/manifest.json`: a sealed snapshot of a stage.
///
/// Published (its directory renamed into place) only after every file below
/// it is synced; a checkpoint directory without a manifest is not a checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointManifest {
    pub format: u32,
    pub id: crate::ids::CheckpointId,
    /// Always `workspace` for a stage checkpoint.
    pub kind: CheckpointKind,
    pub created_at: Timestamp,
    /// The Job and Attempt whose stage was snapshotted.
    pub job: JobId,
    pub attempt: AttemptId,
    pub workspace: PathBuf,
    /// The Job's own lineage, if it was itself a fork.
    pub lineage: Option<Lineage>,
    /// `reflink` or `copy`: how the files were duplicated.
    pub copy_method: String,
    /// Every entry of `upper/`, sorted by path.
    pub entries: Vec<CheckpointEntry>,
    /// Hex BLAKE3 of `preimages.json`.
    pub preimages_blake3: String,
    /// What a workspace checkpoint does not capture.
    pub limits: String,
    /// The Job's changes not carried because they were already applied or
    /// dropped: a fork starts from the *remaining* changes only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<LeftOut>,
}
record!(CheckpointManifest, "manifest.json");

/// A change a checkpoint leaves out, and why (`applied` or `dropped`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeftOut {
    pub path: crate::store::RelPath,
    pub outcome: String,
}

/// One entry of a checkpoint's upper tree, with its overlay markers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointEntry {
    pub path: crate::store::RelPath,
    /// `file`, `dir`, `symlink`, `whiteout`, or `special` (fifo/socket).
    pub entry: String,
    pub mode: u32,
    pub size: u64,
    /// Contents of a file, target of a symlink.
    pub blake3: Option<String>,
    /// A directory that hides the lower directory's contents.
    #[serde(default)]
    pub opaque: bool,
}

/// `runs/<run>/run.json`: the Job's internal record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub format: u32,
    pub id: RunId,
    pub job: JobId,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub workspace: PathBuf,
    pub operation: Operation,
    /// The projection of the confirmed result (or `pending`/`running`).
    pub state: JobState,
    /// How many Attempts were created.
    pub attempts: u32,
    /// The confirmed result, copied from the receipt; absent until one commits.
    pub result: Option<RunResult>,
}
record!(RunRecord, "run.json");

impl RunRecord {
    /// The BLAKE3 of what admission fixed and nothing may change afterwards:
    /// the Run's identity, its workspace and its Operation (program, args,
    /// cwd, policy, Placement). The Bundle binds it, and the receipt binds
    /// the Bundle, so a `run.json` pointed at another workspace or given
    /// another command is detected.
    pub fn fixed_digest(&self) -> String {
        let fixed = (&self.id, &self.job, &self.workspace, &self.operation);
        crate::store::blake3_hex(&serde_json::to_vec(&fixed).unwrap_or_default())
    }
}

/// What a Bundle binds besides the result (absent in Bundles before it existed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunBinding {
    /// [`RunRecord::fixed_digest`] of the Run at admission.
    pub run_blake3: String,
    /// BLAKE3 of the exact bytes of `stage/preimages.json`, the conflict
    /// baselines apply trusts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preimages_blake3: Option<String>,
    /// The Trace up to the Bundle (every event before `bundle.saved`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<crate::journal::TracePrefix>,
}

/// What an Operation does. Today only `run.execute`: run a command in a
/// sandbox over a workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OperationKind {
    #[serde(rename = "run.execute")]
    RunExecute,
}

/// What pvisor processes: today only `run.execute`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Operation {
    pub kind: OperationKind,
    pub program: String,
    pub args: Vec<String>,
    /// The working directory inside the sandbox.
    pub cwd: PathBuf,
    /// Names of the environment variables passed in; values are never recorded.
    pub env_names: Vec<String>,
    /// The effective policy, resolved once at admission.
    pub policy: EffectivePolicy,
    /// Where the Attempt runs.
    pub placement: Placement,
}

/// The policy decisions fixed at admission; later stages consume, never re-derive, them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EffectivePolicy {
    /// The network decision (mode and rules, each with its source).
    pub network: EffectiveNetwork,
    /// How long a cancelled command gets after the forwarded signal before SIGKILL.
    pub kill_grace_ms: u64,
    /// Paths hidden from the sandbox (replaced by empty directories).
    pub hidden_paths: Vec<PathBuf>,
    /// Host Unix sockets the command may connect to (`--expose-socket`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exposed_sockets: Vec<PathBuf>,
    /// Host directories mounted writable through pvisor's cache store (`--cache`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caches: Vec<PathBuf>,
    /// Host files and directories shown read-only at their own path (`--ro`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only: Vec<PathBuf>,
    /// Host directories the VM mounts live and unstaged (virtiofs): the
    /// read-write volumes of a containerd pod. Writes to them are not
    /// effects pvisor stages; they reach the host as they happen.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_directories: Vec<SharedDirectory>,
    /// The root filesystem a vm Job's command runs in (`--image`), instead
    /// of the guest's own minimal one; absent: the guest's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<UserlandImage>,
    /// Whether the command runs under pvisor's seccomp deny-list.
    #[serde(default = "enabled")]
    pub seccomp: bool,
    /// Requested resource limits (how each was enforced is in the Bundle).
    #[serde(default)]
    pub limits: ResourceLimits,
}

/// An imported root filesystem (`pvisor image import`) a vm Job's command
/// runs in: read-only underneath, with the workspace at its own path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserlandImage {
    /// The name it was imported as.
    pub name: String,
    /// BLAKE3 over the tree's paths, kinds, modes, owners and contents
    /// (`blake3:HEX`): which userland ran, whatever the name now means.
    pub digest: String,
    /// The imported tree on the host (under the state directory).
    pub rootfs: PathBuf,
}

/// A host directory shared with a VM, live: the guest sees and changes the
/// host's files themselves (through `virtiofsd`), not a staged copy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedDirectory {
    /// The host directory (canonical).
    pub source: PathBuf,
    /// Where the guest mounts it, as an absolute path inside the workspace
    /// (the container's root).
    pub target: PathBuf,
    /// Shared read-only: the guest mounts it read-only, and its file server
    /// sees the directory through a read-only bind mount of its own, so a
    /// guest that remounts it (it is root in its VM) still writes nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// Host mounts made beneath the directory after the VM started reach
    /// the guest (its file server's view follows the host's mounts), and
    /// the directory itself is read-only to the guest, which writes only
    /// inside those mounts: a pod's directory, where each later container's
    /// root filesystem and volumes are mounted while the pod's VM runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub live_mounts: bool,
}

impl SharedDirectory {
    /// The kernel filesystems a guest has of its own: never a share's
    /// target, and never shared from the host.
    pub const KERNEL_FILESYSTEMS: [&'static str; 3] = ["/proc", "/dev", "/sys"];

    /// Whether `path` lies in one of [`Self::KERNEL_FILESYSTEMS`].
    pub fn in_kernel_filesystem(path: &std::path::Path) -> bool {
        Self::KERNEL_FILESYSTEMS.iter().any(|p| path.starts_with(p))
    }
}

fn enabled() -> bool {
    true
}

/// How the sandbox reaches the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// Its own network namespace with only loopback.
    None,
    /// Only through pvisor's allowlist proxy.
    Proxy,
    /// The host's network, shared (bypassable).
    Host,
    /// A network namespace the caller made (a pod's, from the containerd
    /// shim), joined through the VM's NIC: its own policy (CNI,
    /// Kubernetes'), not pvisor's, decides. `EffectiveNetwork::namespace`.
    Namespace,
}

impl NetworkMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Proxy => "proxy",
            Self::Host => "host",
            Self::Namespace => "namespace",
        }
    }
}

/// One network rule and where it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkRule {
    pub pattern: String,
    pub source: String,
}

/// The network decision fixed at admission; the proxy and the namespace setup
/// consume it and never re-read any configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectiveNetwork {
    pub mode: NetworkMode,
    /// Which scope decided the mode (a file, "command line", or "default").
    pub mode_source: String,
    pub allow: Vec<NetworkRule>,
    pub deny: Vec<NetworkRule>,
    /// An ordered policy (OpenSandbox's `networkPolicy`, from `pvisor
    /// serve`): when present it alone decides, first matching rule wins,
    /// and `allow`/`deny` are empty. Absent in every record before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordered: Option<OrderedPolicy>,
    /// With [`NetworkMode::Namespace`]: the namespace's path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<PathBuf>,
}

/// One host loopback port a `HOST:PORT` allow rule opens, forwarded into the
/// sandbox: pvisor listens on `listen` inside the sandbox's network
/// namespace and connects each connection to `host` on the same port, on the
/// host side, through the policy (so clients that ignore the proxy
/// variables reach it too).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopbackForward {
    /// The sandbox's own loopback address and port to listen on.
    pub listen: std::net::SocketAddr,
    /// The destination as the rule names it (`127.0.0.1`, `::1`, `localhost`),
    /// decided and resolved like a proxied request's.
    pub host: String,
}

/// Allow or deny.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleAction {
    Allow,
    Deny,
}

/// Rules evaluated in order; the first whose target matches decides, else
/// `default_action`. A target is a name, `*.domain`, an IP address or a
/// CIDR block (validated by `pvisor_net::policy`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderedPolicy {
    pub default_action: RuleAction,
    pub rules: Vec<OrderedRule>,
    /// Where the policy came from (e.g. "pvisor serve networkPolicy").
    pub source: String,
}

/// One rule of an [`OrderedPolicy`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderedRule {
    pub action: RuleAction,
    pub target: String,
}

/// Where and how an Attempt is executed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    /// The executor backend, e.g. `ns`. A descriptive record, not a capability check.
    pub executor: String,
    /// Whether the supervisor ran without host root (user-namespace only).
    pub rootless: bool,
    /// The uid the command runs as inside the sandbox.
    pub sandbox_uid: u32,
    /// The host's name and kernel release at placement time.
    pub host: String,
    pub kernel: String,
    /// Executor-specific facts: for `vm`, the accelerator, why it was chosen,
    /// and the guest image digest.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub details: std::collections::BTreeMap<String, String>,
}

/// `runs/<run>/attempts/<n>/attempt.json`: one execution.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub format: u32,
    pub id: AttemptId,
    pub job: JobId,
    pub executor: String,
    pub state: AttemptState,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// When the command was exec'd inside the sandbox.
    pub started_at: Option<Timestamp>,
    /// The supervisor process that owns this Attempt (advisory; the lock is the truth).
    pub owner_pid: u32,
}
record!(AttemptRecord, "attempt.json");

/// How an Attempt ended. Fixed in the Bundle and bound by the receipt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub state: ResultState,
    /// The command's exit code, when it exited normally (or pvisor's 126/127 when it
    /// could not be executed).
    pub exit_code: Option<i32>,
    /// The signal that killed the command, when it did not exit normally.
    pub signal: Option<i32>,
    pub started_at: Timestamp,
    pub finished_at: Timestamp,
    /// Why the command could not run or finish, when pvisor knows.
    pub error: Option<String>,
}

/// Describes how a run ended: `completed`, `failed (exit 3)`, `cancelled (signal 2)`.
pub fn ending(state: &str, exit_code: Option<i32>, signal: Option<i32>) -> String {
    match (exit_code, signal) {
        (Some(code), _) => format!("{state} (exit {code})"),
        (None, Some(sig)) => format!(
            "{state} (signal {sig}{})",
            signal_name(sig).map(|n| format!(", {n}")).unwrap_or_default()
        ),
        (None, None) => state.to_owned(),
    }
}

fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        libc::SIGABRT => "SIGABRT",
        _ => return None,
    })
}

/// [`ending`], then why when pvisor knows: `failed (exit 1): no guest image
/// found ...`.
pub fn summary(state: &str, exit_code: Option<i32>, signal: Option<i32>, error: Option<&str>) -> String {
    let ended = ending(state, exit_code, signal);
    match error {
        Some(error) => format!("{ended}: {error}"),
        None => ended,
    }
}

impl RunResult {
    /// How the run ended, and why when pvisor knows (see [`summary`]).
    pub fn summary(&self) -> String {
        summary(self.state.as_str(), self.exit_code, self.signal, self.error.as_deref())
    }
}

/// `runs/<run>/attempts/<n>/bundle.json`: the saved result and observations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bundle {
    pub format: u32,
    pub job: JobId,
    pub run: RunId,
    pub attempt: AttemptId,
    pub result: RunResult,
    pub observations: Observations,
    /// The staged-change manifest, sorted by path.
    pub changes: Vec<ChangeEntry>,
    pub warnings: Vec<String>,
    /// Why the stage is not whole, when it is not (the executor could not
    /// take all of it out of the sandbox): `changes` lists only what
    /// arrived, and apply refuses it unless told otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
    /// The Run and conflict baselines this result belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<RunBinding>,
}
record!(Bundle, "bundle.json");

/// What was measured about an Attempt.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Observations {
    pub wall_ms: u64,
    pub user_cpu_ms: u64,
    pub system_cpu_ms: u64,
    pub max_rss_kib: u64,
    /// How the sandbox was actually attached to the network, and whether that
    /// path can be bypassed: the marker comes from here, never from a name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkObservation>,
    /// Extra facts an executor reports (e.g. the uid mapping used).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, String>,
}

/// The network attachment an executor made, and what went through it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NetworkObservation {
    /// e.g. "own network namespace, loopback only".
    pub attachment: String,
    pub non_bypassable: bool,
    /// Requests allowed and connected.
    pub allowed: u64,
    /// Requests allowed that could not be resolved or connected (absent
    /// in records before they were told apart, which counted them as allowed).
    #[serde(default)]
    pub failed: u64,
    pub denied: u64,
    /// The most denied hosts, most first, with their counts.
    pub top_denied: Vec<(String, u64)>,
    /// The destinations (host, port) most often allowed but not reached,
    /// most first, with their counts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_failed: Vec<(String, u16, u64)>,
}

/// What happened to one path in the stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChangeKind {
    /// The path did not exist in the workspace.
    Added,
    /// A regular file's contents changed.
    Modified,
    /// The path was removed.
    Deleted,
    /// File ↔ directory ↔ symlink.
    TypeChanged,
    /// Only the permission bits changed.
    ModeChanged,
    /// A symlink's target changed.
    Symlink,
    /// A directory was replaced wholesale: the lower contents are hidden.
    OpaqueDir,
}

impl ChangeKind {
    /// Returns the kind's name as written in records.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "added",
            Self::Modified => "modified",
            Self::Deleted => "deleted",
            Self::TypeChanged => "type-changed",
            Self::ModeChanged => "mode-changed",
            Self::Symlink => "symlink",
            Self::OpaqueDir => "opaque-dir",
        }
    }
}

/// The file type of a staged entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryType {
    File,
    Dir,
    Symlink,
    /// Sockets, fifos and device nodes; staged but never applied.
    Special,
    /// Nothing: the path is deleted.
    None,
}

/// One line of the staged-change manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChangeEntry {
    /// Workspace-relative path.
    pub path: crate::store::RelPath,
    pub kind: ChangeKind,
    /// What the stage now holds at this path.
    pub entry: EntryType,
    /// Size in bytes of the staged entry (0 for deletions and directories).
    pub size: u64,
    /// Permission bits of the staged entry.
    pub mode: u32,
    /// Hex BLAKE3 of a staged regular file's contents or a symlink's target.
    pub blake3: Option<String>,
    /// A staged file that is a hard link of another staged file: the first
    /// path (in manifest order) of the same inode. Apply links it to that
    /// path's applied file instead of writing the contents again. Absent in
    /// manifests written before links were kept, which apply copies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardlink_of: Option<crate::store::RelPath>,
}

/// `runs/<run>/attempts/<n>/completion.json`: the only proof that an Attempt completed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompletionReceipt {
    pub format: u32,
    pub job: JobId,
    pub run: RunId,
    pub attempt: AttemptId,
    pub result: RunResult,
    pub bundle: BundleRef,
}
record!(CompletionReceipt, "completion.json");

/// The receipt's binding to the exact bytes of the Bundle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleRef {
    /// The Bundle's file name, relative to the Attempt directory.
    pub file: String,
    pub size: u64,
    /// Hex BLAKE3 of the Bundle file's bytes.
    pub blake3: String,
}

/// Test helpers shared by this crate's unit tests.
#[cfg(test)]
pub(crate) struct ResultFixture;

#[cfg(test)]
impl ResultFixture {
    pub(crate) fn completed() -> RunResult {
        let now = Timestamp::now();
        RunResult {
            state: ResultState::Completed,
            exit_code: Some(0),
            signal: None,
            started_at: now,
            finished_at: now,
            error: None,
        }
    }
}

/// `runs/<run>/attempts/<n>/termination.json`: proof that a vm Attempt was
/// suspended. Written no-clobber only after the checkpoint manifest was
/// published *and* the QEMU process was reaped, so a `suspended` Job never
/// has a second live copy of its VM.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TerminationReceipt {
    pub format: u32,
    pub job: JobId,
    pub attempt: AttemptId,
    /// Always `suspended` in this format.
    pub kind: String,
    pub checkpoint: crate::ids::CheckpointId,
    /// BLAKE3 of the checkpoint's `manifest.json` bytes.
    pub manifest_blake3: String,
    /// How QEMU ended, e.g. `exited 0`.
    pub vm_exit: String,
    pub recorded_at: Timestamp,
}
record!(TerminationReceipt, "termination.json");
