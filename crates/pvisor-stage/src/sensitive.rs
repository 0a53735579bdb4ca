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

use pvisor_core::store::RelPath;

use crate::glob;

/// Any path with one of these components.
const DIRECTORIES: [(&str, &str); 7] = [
    (".git", "git runs hooks and reads config from .git/"),
    (".idea", "IDE project settings can run tools on open"),
    (".devcontainer", "a dev container definition runs on the host's container engine"),
    (".husky", "git hooks installed by husky"),
    (".mise", "mise tool configuration runs tasks and hooks"),
    (".circleci", "a CI pipeline definition"),
    (".githooks", "git hooks"),
];

/// Any path whose last component is one of these.
const FILE_NAMES: [(&str, &str); 9] = [
    (".envrc", "direnv runs it when you enter the directory"),
    (".pvisor.toml", "it sets pvisor's policy for the next run here"),
    (".tool-versions", "asdf/mise install and run the tools it names"),
    ("mise.toml", "mise runs its tasks and hooks"),
    (".mise.toml", "mise runs its tasks and hooks"),
    ("mise.local.toml", "mise runs its tasks and hooks"),
    (".mise.local.toml", "mise runs its tasks and hooks"),
    (".devcontainer.json", "a dev container definition runs on the host's container engine"),
    (".gitmodules", "it points git at other repositories to fetch and check out"),
];

/// Exactly these workspace-relative paths, or anything beneath them.
const ROOT_PATHS: [(&str, &str); 6] = [
    (".github/workflows", "a CI workflow runs with the repository's secrets"),
    (".gitlab-ci.yml", "a CI pipeline definition"),
    (".pre-commit-config.yaml", "pre-commit runs the hooks it names on every commit"),
    (".gitattributes", "it selects git filters and diff drivers that run on the host"),
    (".vscode/settings.json", "editor settings can run tools when the folder opens"),
    (".vscode/tasks.json", "editor tasks can run automatically when the folder opens"),
];

/// The built-in list plus the user's own globs.
#[derive(Clone, Debug, Default)]
pub struct Sensitive {
    user: Vec<String>,
}

impl Sensitive {
    /// The built-in list and `user` globs (from the user's config).
    pub fn new(user: Vec<String>) -> Self {
        Self { user }
    }

    /// Why applying `path` needs consent, or `None` if it does not.
    pub fn reason(&self, path: &RelPath) -> Option<String> {
        let bytes = path.as_path().as_os_str().as_bytes();
        let components: Vec<&[u8]> = bytes.split(|&b| b == b'/').collect();
        for (name, why) in DIRECTORIES {
            if components.contains(&name.as_bytes()) {
                return Some(why.to_owned());
            }
        }
        let last = components.last().copied().unwrap_or_default();
        for (name, why) in FILE_NAMES {
            if last == name.as_bytes() {
                return Some(why.to_owned());
            }
        }
        // `.vscode/launch.json` and friends anywhere, not only at the root.
        if components.len() >= 2 && components[components.len() - 2] == b".vscode" {
            let editor = [&b"settings.json"[..], b"tasks.json", b"launch.json"];
            if editor.contains(&last) {
                return Some("editor settings and tasks can run tools when the folder opens".into());
            }
        }
        for (root, why) in ROOT_PATHS {
            let root = root.as_bytes();
            if bytes == root || (bytes.starts_with(root) && bytes.get(root.len()) == Some(&b'/')) {
                return Some(why.to_owned());
            }
        }
        self.user
            .iter()
            .find(|pattern| glob::matches(pattern.as_bytes(), bytes))
            .map(|pattern| format!("your config marks {pattern:?} as sensitive"))
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
        let s = Sensitive::new(vec!["Makefile".into(), "scripts/**".into()]);
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
