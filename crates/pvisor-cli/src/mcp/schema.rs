//! The MCP tools' arguments and structured results: what their JSON
//! schemas describe. Every string that came from a sandbox (paths, output,
//! reasons) is sanitised before it is put here (see [`super::shown`]).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which Job a tool acts on: a session's head, a Job, or the newest Job of
/// the workspace.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub struct Target {
    /// The workspace directory (default: the directory `pvisor mcp` was started in).
    pub workspace: Option<String>,
    /// A session name: its head Job, which holds everything its runs staged.
    pub session: Option<String>,
    /// A Job id or unique prefix (instead of a session).
    pub job: Option<String>,
}

/// The network a run may reach.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Network {
    /// `"none"` (loopback only, the default).
    Mode(NetworkMode),
    /// Only these hosts (names, `*.suffix` wildcards or IP addresses).
    Allow { allow: Vec<String> },
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    None,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RunArgs {
    /// Shell text, run with `sh -c` (give this or `argv`).
    pub command: Option<String>,
    /// The program and its arguments, run without a shell.
    pub argv: Option<Vec<String>>,
    #[serde(flatten)]
    pub place: RunPlace,
    /// `none` (the default) or `{"allow": ["pypi.org", "*.github.com"]}`.
    pub network: Option<Network>,
    /// `ns` (Linux namespaces, the default) or `vm` (a microVM).
    pub executor: Option<String>,
    /// Seconds before the command is cancelled (it still ends with a receipt).
    pub timeout: Option<u64>,
    /// How many of the last bytes of stdout and stderr to return (default 1024, at most 65536).
    pub tail_bytes: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RunPlace {
    /// The workspace directory (default: the directory `pvisor mcp` was started in).
    pub workspace: Option<String>,
    /// Run in this session: on top of everything its earlier runs staged.
    pub session: Option<String>,
}

/// One change of a stage.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Change {
    pub path: String,
    /// added, modified, deleted, type-changed, mode-changed or symlink.
    pub kind: String,
    pub size: u64,
    /// pending, applied, dropped, partly-applied or conflict.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conflict: Option<String>,
    /// Why applying it needs `include_sensitive` (it makes the host run code).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sensitive: Option<String>,
    /// Why it is never applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confusable: Option<String>,
    /// In a session: the run that made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ChangesSummary {
    pub total: usize,
    pub by_kind: BTreeMap<String, usize>,
    /// The first changes, by path.
    pub paths: Vec<PathKind>,
    /// More changes than `paths` lists.
    pub truncated: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct PathKind {
    pub path: String,
    pub kind: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct PathReason {
    pub path: String,
    pub reason: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Output {
    /// The last bytes, terminal escapes shown as text.
    pub tail: String,
    /// How many bytes the command wrote in all.
    pub bytes: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SessionInfo {
    pub name: String,
    /// This run's place in the session (1 = first).
    pub run: usize,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct RunResult {
    pub job: String,
    pub attempt: String,
    /// completed, failed or cancelled.
    pub state: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Why the command could not run or finish.
    pub error: Option<String>,
    /// `valid` when a completion receipt binds the result.
    pub receipt: String,
    pub bundle_blake3: String,
    pub stdout: Output,
    pub stderr: Output,
    /// What the Job's stage holds now (in a session: everything its runs staged).
    pub changes: ChangesSummary,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionInfo>,
    pub warnings: Vec<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ReviewResult {
    pub job: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// empty, pending, partially-applied, applied, dropped or collected.
    pub stage: String,
    /// Whether a receipt confirms the result (apply refuses otherwise).
    pub confirmed: bool,
    pub changes: Vec<Change>,
    pub truncated: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct DiffArgs {
    #[serde(flatten)]
    pub target: Target,
    /// Only these paths or globs (default: every remaining change).
    #[serde(default)]
    pub paths: Vec<String>,
    /// The most bytes of diff per path (default 16384).
    pub max_bytes_per_path: Option<usize>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct FileDiff {
    pub path: String,
    /// A unified diff (binary files: sizes and digests).
    pub diff: String,
    pub truncated: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct DiffResult {
    pub job: String,
    pub diffs: Vec<FileDiff>,
    /// Paths left out because the whole answer reached its size cap.
    pub omitted: usize,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ApplyArgs {
    #[serde(flatten)]
    pub target: Target,
    /// Paths (a directory selects everything beneath) or globs.
    #[serde(default)]
    pub paths: Vec<String>,
    /// Apply every remaining change instead.
    #[serde(default)]
    pub all: bool,
    /// Consent to apply sensitive paths (git hooks and config, editor and
    /// CI tasks, dotfiles...: they make the host run code). Without it they
    /// are skipped, even when named exactly.
    #[serde(default)]
    pub include_sensitive: bool,
    /// Show what would happen; change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ApplyResult {
    pub job: String,
    pub dry_run: bool,
    pub applied: Vec<PathKind>,
    /// Sensitive or never-applied paths, and paths that could not be written.
    pub skipped: Vec<PathReason>,
    /// The host changed these since the run: nothing was applied.
    pub conflicts: Vec<PathReason>,
    pub remaining: usize,
    pub stage: String,
    /// The session ended: everything it staged was applied or dropped.
    pub session_ended: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct DropArgs {
    #[serde(flatten)]
    pub target: Target,
    /// Paths or globs to drop (default: every remaining change).
    #[serde(default)]
    pub paths: Vec<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct DropResult {
    pub job: String,
    pub dropped: Vec<PathKind>,
    pub stage: String,
    pub session_ended: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct StatusResult {
    pub job: String,
    /// The Job's status, as `pvisor status --json` prints it.
    pub status: serde_json::Value,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct JobsArgs {
    /// How many of the newest Jobs (default 20).
    pub limit: Option<usize>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct JobsResult {
    /// Newest first, as `pvisor jobs --json` prints them.
    pub jobs: Vec<serde_json::Value>,
}
