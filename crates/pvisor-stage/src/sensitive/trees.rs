//! The workspace's tree and the stage's, read together to find what the
//! host will run (git directories and their configs, virtualenvs, hook
//! directories), and the path arithmetic that places what a config names
//! inside the workspace.

use std::collections::BTreeSet;
use std::io::Read;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use super::{same_name, READ_CAP, REPO_SEARCH};
use crate::beneath::{Kind, Root};

/// The workspace's tree and the stage's, read together.
pub(super) struct Trees<'a> {
    pub(super) workspace: &'a Path,
    pub(super) ws: Option<&'a Root>,
    pub(super) upper: Option<&'a Root>,
}

impl Trees<'_> {
    pub(super) fn kinds(&self, rel: &Path) -> impl Iterator<Item = Kind> + '_ {
        let rel = rel.to_path_buf();
        [self.ws, self.upper]
            .into_iter()
            .flatten()
            .filter_map(move |root| root.stat(&rel).ok().flatten().map(|s| s.kind))
    }

    pub(super) fn exists(&self, rel: &Path) -> bool {
        self.kinds(rel).any(|k| k != Kind::Special)
    }

    pub(super) fn is(&self, rel: &Path, kind: Kind) -> bool {
        self.kinds(rel).any(|k| k == kind)
    }

    /// Why the directory `dir` makes the host run its contents: a git
    /// directory (git's own test: HEAD, objects/ and refs/; or a `config`
    /// with a `[core]` section), or a virtualenv (`pyvenv.cfg`).
    pub(super) fn structure(&self, dir: &Path) -> Option<&'static str> {
        let git = self.is(&dir.join("HEAD"), Kind::File)
            && self.is(&dir.join("objects"), Kind::Dir)
            && self.is(&dir.join("refs"), Kind::Dir);
        let core = || {
            self.read(&self.workspace.join(dir).join("config")).iter().any(|text| {
                String::from_utf8_lossy(text)
                    .lines()
                    .any(|l| l.trim_start().to_ascii_lowercase().starts_with("[core"))
            })
        };
        if git || core() {
            return Some("a git directory (found by its structure): git obeys its config and runs its hooks");
        }
        self.is(&dir.join("pyvenv.cfg"), Kind::File).then_some(
            "a Python virtualenv: its interpreter, scripts and site-packages run whenever it is used",
        )
    }

    /// The config files of the repository whose work tree is `top`: its
    /// `.git/config`, or, when `.git` is a file (a worktree or submodule),
    /// the config of the git directory it points to and of that one's
    /// common directory.
    pub(super) fn git_configs_of(&self, top: &Path) -> Vec<PathBuf> {
        let dot_git = top.join(".git");
        // `config.worktree` holds a worktree's own settings
        // (extensions.worktreeConfig), hooksPath among them.
        let mut configs = vec![dot_git.join("config"), dot_git.join("config.worktree")];
        for text in self.read(&dot_git) {
            let text = String::from_utf8_lossy(&text);
            let Some(target) = text.lines().next().and_then(|l| l.strip_prefix("gitdir:")) else { continue };
            let gitdir = normal(&top.join(target.trim()));
            configs.push(gitdir.join("config"));
            configs.push(gitdir.join("config.worktree"));
            for common in self.read(&gitdir.join("commondir")) {
                let common = String::from_utf8_lossy(&common);
                configs.push(normal(&gitdir.join(common.trim())).join("config"));
            }
        }
        configs
    }

    /// The file at `path` (absolute): inside the workspace, both the
    /// staged and the host's version (each may be obeyed); elsewhere, the
    /// host's. Each at most [`READ_CAP`] bytes; what cannot be read is skipped.
    pub(super) fn read(&self, path: &Path) -> Vec<Vec<u8>> {
        let capped = |file: std::fs::File| {
            let mut bytes = Vec::new();
            file.take(READ_CAP).read_to_end(&mut bytes).ok().map(|_| bytes)
        };
        match inside(self.workspace, path) {
            Some(rel) if rel.as_os_str().is_empty() => Vec::new(),
            Some(rel) => [self.upper, self.ws]
                .into_iter()
                .flatten()
                .filter_map(|root| root.open_file(&rel).ok().and_then(capped))
                .collect(),
            None => {
                let opened = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
                    .open(path);
                opened
                    .ok()
                    .filter(|f| f.metadata().is_ok_and(|m| m.is_file()))
                    .and_then(capped)
                    .into_iter()
                    .collect()
            }
        }
    }

    /// The workspace-relative directories of the host's tree that hold a
    /// `.git`, and the bare repositories (`HEAD`, `objects/`, `refs/`; the
    /// stage's are each a change's ancestor): searched breadth first, never
    /// into a git directory nor through a symlink, over at most
    /// [`REPO_SEARCH`] directories. Read by path with each entry's type from
    /// the directory itself, which keeps a large tree cheap: the host's tree
    /// is the user's, not the command's.
    pub(super) fn repositories(&self) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let (mut found, mut bares) = (Vec::new(), Vec::new());
        if self.ws.is_none() {
            return (found, bares);
        }
        let mut queue = std::collections::VecDeque::from([PathBuf::new()]);
        let mut visited = 0;
        while let Some(dir) = queue.pop_front() {
            visited += 1;
            if visited > REPO_SEARCH {
                break;
            }
            let Ok(entries) = std::fs::read_dir(self.workspace.join(&dir)) else { continue };
            let mut subdirs = Vec::new();
            let mut head = false;
            for entry in entries.flatten() {
                let name = entry.file_name();
                let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                head |= name == "HEAD" && !is_dir;
                if same_name(name.as_bytes(), ".git") {
                    if name == ".git" && !dir.as_os_str().is_empty() {
                        found.push(dir.clone());
                    }
                } else if is_dir {
                    subdirs.push(name);
                }
            }
            if head && ["objects", "refs"].iter().all(|d| subdirs.iter().any(|s| s == d)) {
                bares.push(dir);
                continue;
            }
            queue.extend(subdirs.into_iter().map(|name| dir.join(name)));
        }
        (found, bares)
    }

    /// The names in the directory `dir` (absolute): inside the
    /// workspace, in either tree; elsewhere, the host's.
    pub(super) fn names(&self, dir: &Path) -> BTreeSet<std::ffi::OsString> {
        match inside(self.workspace, dir) {
            Some(rel) => [self.ws, self.upper]
                .into_iter()
                .flatten()
                .flat_map(|r| r.list(&rel).unwrap_or_default())
                .collect(),
            None => std::fs::read_dir(dir)
                .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.file_name())).collect())
                .unwrap_or_default(),
        }
    }

    /// The target of the symlink at `path` (absolute): inside the
    /// workspace, the staged one if staged, else the host's.
    pub(super) fn read_link(&self, path: &Path) -> Option<Vec<u8>> {
        match inside(self.workspace, path) {
            Some(rel) if rel.as_os_str().is_empty() => None,
            Some(rel) => [self.upper, self.ws].into_iter().flatten().find_map(|r| r.read_link(&rel).ok()),
            None => std::fs::read_link(path).ok().map(|t| t.into_os_string().into_vec()),
        }
    }

    /// `path` as a person knows it: workspace-relative when inside.
    pub(super) fn shown(&self, path: &Path) -> String {
        let path = inside(self.workspace, path).unwrap_or_else(|| path.to_path_buf());
        pvisor_core::text::escape_bytes(path.as_os_str().as_bytes(), pvisor_core::text::Tabs::Escape)
    }
}

/// `value` (a path from a git config) made absolute: `~` and `~/` are the
/// home, a relative path is relative to `base`.
pub(super) fn expand(value: &str, base: &Path, home: Option<&Path>) -> PathBuf {
    let in_home = value.strip_prefix('~').filter(|rest| rest.is_empty() || rest.starts_with('/'));
    let path = match (in_home, home) {
        (Some(rest), Some(home)) => home.join(rest.trim_start_matches('/')),
        _ => base.join(value),
    };
    normal(&path)
}

/// `path` with `.` and `..` resolved by name (the files may not exist).
pub(super) fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// `path` relative to `workspace`, when it is inside it ("" for the workspace itself).
pub(super) fn inside(workspace: &Path, path: &Path) -> Option<PathBuf> {
    normal(path).strip_prefix(workspace).ok().map(Path::to_path_buf)
}

/// `path` with the symlinks of its longest existing ancestor resolved (the
/// rest may not exist yet: the config file of a user who has none).
pub(super) fn canonical(path: &Path) -> PathBuf {
    let path = normal(path);
    for ancestor in path.ancestors() {
        if let Ok(real) = std::fs::canonicalize(ancestor) {
            let rest = path.strip_prefix(ancestor).unwrap_or(Path::new(""));
            return if rest.as_os_str().is_empty() { real } else { real.join(rest) };
        }
    }
    path
}
