//! Sensitive paths: staged changes that make the host run code or change
//! policy once applied.
//!
//! A change to `.git/hooks/pre-commit` or `.git/config` (`core.fsmonitor`,
//! `core.hooksPath`) runs the command's code the next time the user types
//! `git status`; `.envrc` runs when they `cd` in; `.pvisor.toml` changes the
//! next run's policy. Such a change is only applied with explicit consent:
//! `review` marks it, `apply --all`, globs and directories skip it unless
//! `--include-sensitive` is given, and naming the exact path applies it.
//! The built-in list is below (and in docs/review-and-apply.md); users add
//! globs with `[apply] sensitive = [...]` in their own config.

use std::os::unix::ffi::OsStrExt;

use pvisor_core::records::{ChangeEntry, EntryType};
use pvisor_core::store::RelPath;

use crate::glob;

/// Any path with one of these components (compared ignoring ASCII case: on
/// a case-insensitive workspace `.GIT` is `.git`).
const DIRECTORIES: [(&str, &str); 11] = [
    (".git", "git runs hooks and reads config from .git/"),
    (".hg", "Mercurial runs hooks and reads config from .hg/"),
    (".jj", "jj reads its repository config from .jj/"),
    (".idea", "IDE project settings can run tools on open"),
    (".zed", "editor settings and tasks can run tools"),
    (".devcontainer", "a dev container definition runs on the host's container engine"),
    (".husky", "git hooks installed by husky"),
    (".mise", "mise tool configuration runs tasks and hooks"),
    (".circleci", "a CI pipeline definition"),
    (".githooks", "git hooks"),
    (".lfsconfig", "git-lfs reads its transfer configuration from it"),
];

/// Any path whose last component is one of these.
const FILE_NAMES: [(&str, &str); 12] = [
    (".envrc", "direnv runs it when you enter the directory"),
    (".pvisor.toml", "it sets pvisor's policy for the next run here"),
    (".tool-versions", "asdf/mise install and run the tools it names"),
    ("mise.toml", "mise runs its tasks and hooks"),
    (".mise.toml", "mise runs its tasks and hooks"),
    ("mise.local.toml", "mise runs its tasks and hooks"),
    (".mise.local.toml", "mise runs its tasks and hooks"),
    (".devcontainer.json", "a dev container definition runs on the host's container engine"),
    (".gitmodules", "it points git at other repositories to fetch and check out"),
    (".gitattributes", "it selects git filters and diff drivers that run on the host"),
    // Without HEAD a directory is no git repository: an embedded bare
    // repository (with a config that runs commands) needs one.
    ("HEAD", "it makes its directory a git repository, whose config git obeys"),
    ("packed-refs", "part of a git repository's metadata"),
];

/// Exactly these workspace-relative paths, or anything beneath them.
const ROOT_PATHS: [(&str, &str); 5] = [
    (".github/workflows", "a CI workflow runs with the repository's secrets"),
    (".gitlab-ci.yml", "a CI pipeline definition"),
    (".pre-commit-config.yaml", "pre-commit runs the hooks it names on every commit"),
    (".vscode/settings.json", "editor settings can run tools when the folder opens"),
    (".vscode/tasks.json", "editor tasks can run automatically when the folder opens"),
];

fn same_name(a: &[u8], b: &str) -> bool {
    a.eq_ignore_ascii_case(b.as_bytes())
}

/// The built-in list plus the user's own globs.
#[derive(Clone, Debug, Default)]
pub struct Sensitive {
    user: Vec<glob::Pattern>,
}

impl Sensitive {
    /// The built-in list and `user` globs (from the user's config).
    pub fn new(user: Vec<String>) -> Result<Self, glob::BadPattern> {
        Ok(Self { user: user.iter().map(|p| glob::Pattern::new(p)).collect::<Result<_, _>>()? })
    }

    /// Why applying `path` needs consent, or `None` if it does not.
    pub fn reason(&self, path: &RelPath) -> Option<String> {
        let bytes = path.as_path().as_os_str().as_bytes();
        let components: Vec<&[u8]> = bytes.split(|&b| b == b'/').collect();
        for (name, why) in DIRECTORIES {
            if components.iter().any(|c| same_name(c, name)) {
                return Some(why.to_owned());
            }
        }
        let last = components.last().copied().unwrap_or_default();
        for (name, why) in FILE_NAMES {
            if same_name(last, name) {
                return Some(why.to_owned());
            }
        }
        // `.vscode/launch.json` and friends anywhere, not only at the root.
        if components.len() >= 2 && same_name(components[components.len() - 2], ".vscode") {
            let editor = ["settings.json", "tasks.json", "launch.json"];
            if editor.iter().any(|e| same_name(last, e)) {
                return Some("editor settings and tasks can run tools when the folder opens".into());
            }
        }
        if last.len() > ".code-workspace".len() && last.to_ascii_lowercase().ends_with(b".code-workspace") {
            return Some("an editor workspace file can run tasks when opened".into());
        }
        let lower = bytes.to_ascii_lowercase();
        for (root, why) in ROOT_PATHS {
            let root = root.as_bytes();
            if lower == root || (lower.starts_with(root) && lower.get(root.len()) == Some(&b'/')) {
                return Some(why.to_owned());
            }
        }
        self.user
            .iter()
            .find(|pattern| pattern.matches(bytes))
            .map(|pattern| format!("your config marks {:?} as sensitive", pattern.as_str()))
    }

    /// [`Self::reason`] for a staged change, and also: a symlink or file put
    /// where a sensitive directory is read from (`.vscode`, `.github`, the
    /// directory part of a user glob), which would make git or an editor
    /// read files that are not flagged themselves.
    pub fn reason_for(&self, change: &ChangeEntry) -> Option<String> {
        if let Some(why) = self.reason(&change.path) {
            return Some(why);
        }
        if change.entry == EntryType::Dir {
            return None;
        }
        let lower = change.path.as_path().as_os_str().as_bytes().to_ascii_lowercase();
        let above =
            |root: &[u8]| root.len() > lower.len() && root.starts_with(&lower) && root[lower.len()] == b'/';
        let builtin = ROOT_PATHS.iter().any(|(root, _)| above(root.as_bytes()));
        let user = self.user.iter().any(|pattern| {
            let literal: Vec<u8> = pattern.as_str().bytes().take_while(|b| !b"*?[\\".contains(b)).collect();
            above(&literal.to_ascii_lowercase())
        });
        (builtin || user).then(|| {
            "a symlink or file in place of a directory whose files are sensitive: what it leads to would not be flagged"
                .to_owned()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(s: &str) -> RelPath {
        RelPath::new(std::path::Path::new(s))
    }

    #[test]
    fn paths_that_run_code_on_the_host_are_sensitive() {
        let s = Sensitive::new(vec!["Makefile".into(), "scripts/**".into()]).unwrap();
        for path in [
            ".git/hooks/pre-commit",
            ".git/config",
            ".git",
            "vendor/lib/.git/hooks/post-checkout",
            ".envrc",
            "sub/.envrc",
            ".pvisor.toml",
            ".vscode/settings.json",
            "web/.vscode/tasks.json",
            ".idea/workspace.xml",
            ".devcontainer/devcontainer.json",
            ".github/workflows/ci.yml",
            ".husky/pre-push",
            ".pre-commit-config.yaml",
            ".tool-versions",
            "mise.toml",
            "Makefile",
            "scripts/deploy.sh",
            ".GIT/hooks/pre-commit",
            ".VSCode/tasks.json",
            "sub/.gitattributes",
            "evil/HEAD",
            "proj.code-workspace",
        ] {
            assert!(s.reason(&rel(path)).is_some(), "{path} should be sensitive");
        }
        for path in
            ["src/main.rs", "gitconfig.md", ".github/README.md", "docs/.gitkeep", "my.git/x", "README"]
        {
            assert!(s.reason(&rel(path)).is_none(), "{path} should not be sensitive");
        }
    }
}
