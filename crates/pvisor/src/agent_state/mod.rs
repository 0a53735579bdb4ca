//! Agent state (`pvisor run --state PATH`): an agent's home state
//! (`~/.claude`, `~/.claude.json`, `~/.codex`) made writable in the
//! sandbox without the host's real files ever changing.
//!
//! Boundary: this module decides which paths are state ([`check`]), keeps
//! each Job's copy of them in the Run's directory, beside the stage and
//! never in it (`layer.rs`), carries it to the next run of a session or
//! from what the user promoted, and holds back *gated* changes (settings,
//! hooks, MCP server lists, instruction files: what makes a later run
//! execute something) until the user approves them. The executor only
//! mounts what [`pvisor_sandbox::StateMount`] says; the host's real state
//! is read once per run (when nothing is carried) and never written.
//!
//! The protocol of one run:
//! 1. admission checks the paths and plans the mounts ([`check`], [`plan`]);
//! 2. before the sandbox starts, each path's tree is made: the previous
//!    run's (session), else the promoted copy, else the host's, with every
//!    unapproved gated change reset and held as pending (`layer::prepare`);
//! 3. the command writes the tree directly (a directory) or through its
//!    parent's overlay (a single file, so a temp file and rename work);
//! 4. when it has ended, single files are taken out of the parent's upper
//!    (`layer::collect`), and `review --state` compares the tree with its
//!    manifest at the start.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod json_keys;
mod layer;
mod tree;

pub use layer::Plan;
pub use layer::{approve, changes, has_state, promote, StateChange, StateChangeKind};
pub(crate) use layer::{collect, mounts, prepare};

/// What a state path is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StateKind {
    Directory,
    File,
}

/// One state path a run may write through its own layer, with the globs
/// (relative to the directory, or the file's name) whose changes are gated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatePath {
    pub path: PathBuf,
    /// What it is when the host has nothing there yet; `None` means a
    /// directory then. An existing path is what the host has.
    #[serde(default)]
    pub kind: Option<StateKind>,
    pub gated: Vec<String>,
    /// For a single JSON file: the keys whose values are gated (the file
    /// itself carries). See [`DEFAULT_GATED_KEYS`].
    #[serde(default)]
    pub gated_keys: Vec<String>,
}

impl StatePath {
    /// `path` with [`DEFAULT_GATED`] and [`DEFAULT_GATED_KEYS`].
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let owned = |list: &[&str]| list.iter().map(|g| (*g).to_owned()).collect();
        Self {
            path: path.into(),
            kind: None,
            gated: owned(DEFAULT_GATED),
            gated_keys: owned(DEFAULT_GATED_KEYS),
        }
    }
}

/// Changes that make a later run execute something, for both Claude Code
/// and Codex: settings (hooks, permissions, MCP servers live there),
/// hook scripts, MCP server lists, memory and instruction files, custom
/// commands, agents, plugins, skills, Codex's `config.toml`, status line
/// scripts, a local install of the agent itself (`~/.claude/local`). Globs
/// over the path relative to a state directory, or a state file's name.
/// Besides these, every symlink and executable file is gated, and anything
/// but a directory where a gated directory's entries are read.
pub const DEFAULT_GATED: &[&str] = &[
    "**/settings.json",
    "**/settings.local.json",
    "**/hooks/**",
    "**/*mcp*.json",
    "**/CLAUDE.md",
    "**/AGENTS.md",
    "**/config.toml",
    "commands/**",
    "agents/**",
    "plugins/**",
    "skills/**",
    "rules/**",
    "prompts/**",
    "**/statusline*",
    "local/**",
];

/// The keys of a single JSON state file (`~/.claude.json`) that make a
/// later run execute something or widen what it may do: MCP servers, hooks,
/// permissions and allowed tools, globally and per project. Changes to
/// other keys (counters, the last session of a project) carry.
pub const DEFAULT_GATED_KEYS: &[&str] = &[
    "mcpServers",
    "hooks",
    "permissions",
    "allowedTools",
    "env",
    "apiKeyHelper",
    "enabledMcpjsonServers",
    "disabledMcpjsonServers",
    "enableAllProjectMcpServers",
    "projects.*.mcpServers",
    "projects.*.allowedTools",
    "projects.*.enabledMcpjsonServers",
    "projects.*.disabledMcpjsonServers",
    "projects.*.enableAllProjectMcpServers",
    "projects.*.hasTrustDialogAccepted",
];

/// A state path that passed [`check`]: canonical, its kind known.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckedState {
    pub path: PathBuf,
    pub kind: StateKind,
    pub gated: Vec<String>,
    /// Gated keys of a single JSON file; empty for a directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gated_keys: Vec<String>,
    /// The host's copy is a secret store (`~/.claude.json` holds account
    /// data and may hold an API key): the state never starts from it, only
    /// from nothing, the promoted copy or a session's earlier run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secret_on_host: bool,
}

/// Why a state path was refused, before anything ran.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("--state {}: {problem}", path.display())]
    Refused { path: PathBuf, problem: String },
    #[error("--state {}: invalid gated pattern", path.display())]
    Pattern {
        path: PathBuf,
        #[source]
        source: pvisor_stage::glob::BadPattern,
    },
    #[error("Agent state of {}: {what}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("Agent state record {}", path.display())]
    Record {
        path: PathBuf,
        #[source]
        source: pvisor_core::store::StoreError,
    },
    #[error("{path} is not a gated state change of job {job}; `pvisor review --state {job}` lists them")]
    NotGated { path: String, job: pvisor_core::ids::JobId },
    #[error("Job {job} has no agent state; run with --state PATH to give a run some")]
    NoState { job: pvisor_core::ids::JobId },
}

/// What a state path may not be: `state_dirs` (pvisor's own) are never
/// in, at or below one; a `secret_stores` path may be one exactly (the
/// state then never starts from the host's copy), never below one.
#[derive(Clone, Copy, Debug)]
pub struct Hidden<'a> {
    pub state_dirs: &'a [PathBuf],
    pub secret_stores: &'a [PathBuf],
}

/// Checks each requested state path against the user's `home`, the
/// workspace, the hidden paths and each other: a directory or a regular
/// file below `home` (or not there yet, its parent below or at `home`),
/// never a symlink, socket, fifo or device, never in the workspace, never
/// overlapping a pvisor state directory, never inside a secret store.
/// Returns them canonical, in request order.
pub fn check(
    requested: &[StatePath],
    home: Option<&Path>,
    workspace: &Path,
    hidden: Hidden<'_>,
) -> Result<Vec<CheckedState>, StateError> {
    let mut out: Vec<CheckedState> = Vec::new();
    for want in requested {
        let refuse =
            |problem: &str| StateError::Refused { path: want.path.clone(), problem: problem.to_owned() };
        let home = home
            .and_then(|h| std::fs::canonicalize(h).ok())
            .ok_or_else(|| refuse("state lives under $HOME, which is not set; set HOME"))?;
        let checked = check_one(want, &home, workspace, hidden).map_err(refuse)?;
        for pattern in &checked.gated {
            pvisor_stage::glob::Pattern::new(pattern)
                .map_err(|source| StateError::Pattern { path: want.path.clone(), source })?;
        }
        if out.iter().any(|o| o.path.starts_with(&checked.path) || checked.path.starts_with(&o.path)) {
            return Err(refuse("overlaps another state path; give each tree once"));
        }
        out.push(checked);
    }
    Ok(out)
}

fn check_one(
    want: &StatePath,
    home: &Path,
    workspace: &Path,
    hidden: Hidden<'_>,
) -> Result<CheckedState, &'static str> {
    use std::os::unix::fs::FileTypeExt;
    let name = want.path.file_name().ok_or("names no file or directory; give a path below $HOME")?;
    let parent = want.path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let parent = std::fs::canonicalize(parent)
        .map_err(|_| "its parent directory does not exist; state lives below $HOME")?;
    if !parent.starts_with(home) {
        return Err("is outside $HOME; agent state lives below the home directory");
    }
    let path = parent.join(name);
    let kind =
        match std::fs::symlink_metadata(&path) {
            Err(_) => want.kind.unwrap_or(StateKind::Directory),
            Ok(meta) if meta.is_dir() => StateKind::Directory,
            Ok(meta) if meta.is_file() => StateKind::File,
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err("is a symlink; give the path it points to (below $HOME)")
            }
            Ok(meta) if meta.file_type().is_socket() => return Err(
                "is a socket; a state path is a directory or a regular file (--expose-socket shows a socket)",
            ),
            Ok(_) => return Err("is a fifo or device; a state path is a directory or a regular file"),
        };
    if path.starts_with(workspace) || workspace.starts_with(&path) {
        return Err("overlaps the workspace, whose changes are staged; state is kept apart from them");
    }
    if hidden.state_dirs.iter().any(|h| path.starts_with(h) || h.starts_with(&path)) {
        return Err("overlaps a pvisor state directory, which the sandbox never sees");
    }
    if hidden.secret_stores.iter().any(|h| path.starts_with(h) && path != *h) {
        return Err("is inside a hidden secret store; --expose shows a secret store");
    }
    if path.to_str().is_none() {
        return Err("is not valid UTF-8; pvisor records paths as text");
    }
    let gated_keys = if kind == StateKind::File { want.gated_keys.clone() } else { Vec::new() };
    let secret_on_host = hidden.secret_stores.contains(&path);
    Ok(CheckedState { path, kind, gated: want.gated.clone(), gated_keys, secret_on_host })
}

/// Agent directories and files a `--cache` must never be: a cache is
/// carried to later runs unreviewed, so a hook or an MCP server written
/// there would run next time. Relative to `$HOME`.
const AGENT_HOMES: &[&str] =
    &[".claude", ".claude.json", ".codex", ".gemini", ".config/opencode", ".cursor", ".continue"];

/// Files whose presence marks a directory as an agent's config or credentials.
const AGENT_MARKERS: &[&str] = &["auth.json", ".credentials.json", "settings.json", "settings.local.json"];

/// Why `dir` (canonical) cannot be a `--cache`: it is, holds or lies in an
/// agent's config or credentials. `None` when it may.
pub fn agent_config_in(dir: &Path, home: Option<&Path>) -> Option<&'static str> {
    let home = home.and_then(|h| std::fs::canonicalize(h).ok());
    if let Some(home) = &home {
        let in_agent = AGENT_HOMES
            .iter()
            .map(|rel| home.join(rel))
            .any(|agent| dir.starts_with(&agent) || (agent.starts_with(dir) && dir != Path::new("/")));
        let aider = dir
            .strip_prefix(home)
            .ok()
            .and_then(|rel| rel.components().next())
            .is_some_and(|c| c.as_os_str().to_string_lossy().starts_with(".aider"));
        if in_agent || aider {
            return Some("is, holds or lies in an agent's config or credentials");
        }
    }
    AGENT_MARKERS
        .iter()
        .any(|m| dir.join(m).exists())
        .then_some("holds agent config or credentials (settings.json, auth.json, .credentials.json)")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::disallowed_methods)]
    use super::*;

    #[test]
    fn state_is_a_directory_or_file_below_home_and_never_a_socket() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let (home, ws) = (root.join("home"), root.join("home/ws"));
        std::fs::create_dir_all(home.join(".agent")).unwrap();
        std::fs::create_dir_all(home.join(".ssh")).unwrap();
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(home.join(".agent.json"), b"{}").unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(home.join("sock")).unwrap();
        let (state_dirs, secret_stores) =
            ([home.join("pvisor")], [home.join(".ssh"), home.join(".agent.json")]);
        let hidden = Hidden { state_dirs: &state_dirs, secret_stores: &secret_stores };
        let check = |paths: &[&Path]| {
            let req: Vec<StatePath> = paths.iter().map(|p| StatePath::new(*p)).collect();
            check(&req, Some(&home), &ws, hidden).map_err(|e| e.to_string())
        };
        let ok = check(&[&home.join(".agent"), &home.join(".agent.json"), &home.join(".new")]).unwrap();
        let kinds: Vec<StateKind> = ok.iter().map(|c| c.kind).collect();
        assert_eq!(kinds, [StateKind::Directory, StateKind::File, StateKind::Directory]);
        let secret: Vec<bool> = ok.iter().map(|c| c.secret_on_host).collect();
        assert_eq!(secret, [false, true, false], "a secret store itself is state that starts empty");
        for (path, expected) in [
            (home.join("sock"), "is a socket"),
            (root.join("elsewhere"), "outside $HOME"),
            (home.join("missing/deeper"), "parent directory does not exist"),
            (ws.join("x"), "overlaps the workspace"),
            (home.join(".ssh/agent.json"), "inside a hidden secret store"),
            (home.join("pvisor"), "pvisor state directory"),
        ] {
            let e = check(&[&path]).unwrap_err();
            assert!(e.contains(expected) && e.starts_with("--state "), "{path:?}: {e}");
        }
        let e = check(&[&home.join(".agent"), &home.join(".agent/sub")]).unwrap_err();
        assert!(e.contains("overlaps another state path"), "{e}");
    }

    #[test]
    fn a_cache_may_not_hold_agent_config() {
        let dir = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(dir.path()).unwrap();
        for d in [".claude", ".cargo", ".aider.tags", "tool"] {
            std::fs::create_dir_all(home.join(d)).unwrap();
        }
        std::fs::write(home.join("tool/auth.json"), b"{}").unwrap();
        assert!(agent_config_in(&home.join(".claude"), Some(&home)).is_some());
        assert!(agent_config_in(&home, Some(&home)).is_some(), "a cache of $HOME holds ~/.claude");
        assert!(agent_config_in(&home.join(".aider.tags"), Some(&home)).is_some());
        assert!(agent_config_in(&home.join("tool"), Some(&home)).is_some());
        assert!(agent_config_in(&home.join(".cargo"), Some(&home)).is_none());
    }
}
