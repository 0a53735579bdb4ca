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
//!
//! Names alone miss what a particular workspace makes the host run, so
//! [`Sensitive::bind`] derives the rest from the workspace and the stage:
//! the hook directory a repository's `core.hooksPath` names, git
//! directories and virtualenvs found by their structure, files a git config
//! includes, workspace files a hook is a symlink to, and, when the
//! workspace holds the user's home, its dotfiles.
//! pvisor's own config and state ([`Host::protected`]) are not sensitive
//! but forbidden: [`Bound::forbidden`] refuses them whatever the selection.

use std::collections::BTreeSet;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use pvisor_core::records::{ChangeEntry, ChangeKind, EntryType};
use pvisor_core::store::RelPath;

use crate::beneath::Root;
use crate::{gitconfig, glob};

mod trees;

use trees::{canonical, expand, inside, normal, Trees};

/// Any path with one of these components (compared ignoring ASCII case: on
/// a case-insensitive workspace `.GIT` is `.git`).
const DIRECTORIES: &[(&str, &str)] = &[
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
    // Coding agents read their settings, hooks, commands and MCP servers
    // from these when they next start here, and act on them.
    (".claude", "a coding agent's settings, hooks and commands: the next agent run here obeys them"),
    (".cursor", "a coding agent's rules and MCP servers: the next agent run here obeys them"),
    (".gemini", "a coding agent's settings and MCP servers: the next agent run here obeys them"),
    (".codex", "a coding agent's config: the next agent run here obeys it"),
    (".windsurf", "a coding agent's rules: the next agent run here obeys them"),
    (".continue", "a coding agent's config and MCP servers: the next agent run here obeys them"),
    (".opencode", "a coding agent's config and MCP servers: the next agent run here obeys them"),
    (".helix", "the editor starts the language servers its languages.toml names"),
    (".cargo", "cargo obeys its config (build.rustc-wrapper, runners, aliases) on the next build"),
    (".direnv", "direnv's layouts (virtualenvs, PATH entries) run when you enter the directory"),
    ("site-packages", "Python runs .pth files and imports modules from site-packages"),
    ("dist-packages", "Python runs .pth files and imports modules from dist-packages"),
    // A cached module runs in place of its source when its header matches
    // the source's size and time (or asks not to be checked): the reviewed
    // .py is unchanged while what runs is not.
    ("__pycache__", "Python runs the compiled modules in it in place of their source, which looks unchanged"),
];

/// Any path whose last component is one of these.
const FILE_NAMES: &[(&str, &str)] = &[
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
    // Instructions a coding agent reads at start and acts on with the
    // user's permissions: a staged one is a prompt injection that outlives
    // the sandbox, so it is shown for consent like a hook.
    (".mcp.json", "it names MCP servers a coding agent starts (commands run on the host)"),
    ("CLAUDE.md", "a coding agent reads it as instructions and acts on them"),
    ("CLAUDE.local.md", "a coding agent reads it as instructions and acts on them"),
    ("AGENTS.md", "a coding agent reads it as instructions and acts on them"),
    ("GEMINI.md", "a coding agent reads it as instructions and acts on them"),
    (".cursorrules", "a coding agent reads it as instructions and acts on them"),
    (".windsurfrules", "a coding agent reads it as instructions and acts on them"),
    (".yarnrc.yml", "yarn runs the program its yarnPath names, and its plugins"),
    (".yarnrc", "yarn runs the program its yarn-path names"),
    (".npmrc", "npm runs scripts with its script-shell and obeys its settings"),
    (".pnpmfile.cjs", "pnpm runs it on every install"),
    (".pnp.cjs", "yarn and node load it as code"),
    (".pnp.loader.mjs", "yarn and node load it as code"),
    ("bunfig.toml", "bun obeys its preload scripts and settings"),
    (".bunfig.toml", "bun obeys its preload scripts and settings"),
    ("pip.conf", "pip obeys its index and install settings"),
    ("pip.ini", "pip obeys its index and install settings"),
    ("rust-toolchain", "rustup installs and runs the toolchain it names"),
    ("rust-toolchain.toml", "rustup installs and runs the toolchain it names"),
    ("pyvenv.cfg", "it makes its directory a Python virtualenv, whose interpreter it names"),
    ("sitecustomize.py", "Python runs it at every start where it is on the path"),
    ("usercustomize.py", "Python runs it at every start where it is on the path"),
    // Editors that read a project's own start-up file from the directory
    // they are opened in (vim's and neovim's 'exrc', emacs's dir-locals
    // with `eval`).
    (".vimrc", "vim with 'exrc' runs it when started here"),
    (".gvimrc", "vim with 'exrc' runs it when started here"),
    (".exrc", "vim with 'exrc' runs it when started here"),
    ("_vimrc", "vim with 'exrc' runs it when started here"),
    ("_exrc", "vim with 'exrc' runs it when started here"),
    (".nvimrc", "neovim with 'exrc' runs it when started here"),
    (".nvim.lua", "neovim with 'exrc' runs it when started here"),
    (".dir-locals.el", "emacs evaluates its settings for files here"),
    (".dir-locals-2.el", "emacs evaluates its settings for files here"),
    (".aider.conf.yml", "a coding agent runs the lint and test commands it names"),
    ("opencode.json", "a coding agent's config and MCP servers: the next agent run here obeys them"),
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

/// The built-in list plus the user's own globs, and what is known of the
/// host (see [`Host`]); [`Sensitive::bind`] adds what the workspace and the
/// stage themselves say.
#[derive(Clone, Debug, Default)]
pub struct Sensitive {
    user: Vec<glob::Pattern>,
    host: Host,
}

/// Facts about the host that decide what it runs: given by the caller, who
/// knows the user's environment.
#[derive(Clone, Debug, Default)]
pub struct Host {
    /// The user's home directory: when the workspace is or holds it, every
    /// dotfile at its top is sensitive. Also where a git config's `~/` leads.
    pub home: Option<PathBuf>,
    /// Every other account's home directory (the passwd database): the
    /// shell and ssh of whoever owns one read its dotfiles, whatever `$HOME`
    /// says of the user running pvisor (root, or `sudo`, in another's home).
    pub homes: Vec<PathBuf>,
    /// The directories of the user's `PATH`: a program staged in one runs
    /// when the user types its name (`~/go/bin`, `/usr/local/bin` when the
    /// workspace is `/usr/local`, a project's `bin/` put on `PATH`).
    pub path: Vec<PathBuf>,
    /// The user's own git config files (`~/.gitconfig`, ...): a
    /// `core.hooksPath` there applies to every repository.
    pub git_configs: Vec<PathBuf>,
    /// pvisor's own configuration and state (absolute paths, each with the
    /// reason): never applied, whatever the selection or flags.
    pub protected: Vec<(PathBuf, String)>,
}

impl Sensitive {
    /// The built-in list and `user` globs (from the user's config).
    pub fn new(user: Vec<String>) -> Result<Self, glob::BadPattern> {
        let user = user.iter().map(|p| glob::Pattern::new(p)).collect::<Result<_, _>>()?;
        Ok(Self { user, host: Host::default() })
    }

    /// The same list, knowing `host`.
    pub fn with_host(mut self, host: Host) -> Self {
        self.host = host;
        self
    }

    /// Why applying `path` needs consent, or `None` if it does not.
    pub fn reason(&self, path: &RelPath) -> Option<String> {
        let bytes = path.as_path().as_os_str().as_bytes();
        let components: Vec<&[u8]> = bytes.split(|&b| b == b'/').collect();
        for &(name, why) in DIRECTORIES {
            if components.iter().any(|c| same_name(c, name)) {
                return Some(why.to_owned());
            }
        }
        let last = components.last().copied().unwrap_or_default();
        for &(name, why) in FILE_NAMES {
            if same_name(last, name) {
                return Some(why.to_owned());
            }
        }
        if let Some(why) = Self::by_parent(&components) {
            return Some(why.to_owned());
        }
        let lower_last = last.to_ascii_lowercase();
        if last.len() > ".code-workspace".len() && lower_last.ends_with(b".code-workspace") {
            return Some("an editor workspace file can run tasks when opened".into());
        }
        if last.len() > ".pth".len() && lower_last.ends_with(b".pth") {
            return Some("Python runs the import lines of a .pth file at every start".into());
        }
        if [&b".pyc"[..], b".pyo"].iter().any(|ext| last.len() > ext.len() && lower_last.ends_with(ext)) {
            return Some(
                "Python imports a compiled module where no source is beside it; its code is not reviewable"
                    .into(),
            );
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

    /// A file that matters by the directory it is in: `.vscode/tasks.json`
    /// and friends, a virtualenv's `bin/activate*`, yarn's releases and
    /// plugins (anywhere, not only at the root).
    fn by_parent(components: &[&[u8]]) -> Option<&'static str> {
        let [.., parent, last] = components else { return None };
        let lower = last.to_ascii_lowercase();
        if same_name(parent, ".vscode")
            && ["settings.json", "tasks.json", "launch.json", "mcp.json"].iter().any(|e| same_name(last, e))
        {
            return Some("editor settings, tasks and MCP servers run tools when the folder opens");
        }
        if (same_name(parent, "bin") || same_name(parent, "Scripts")) && lower.starts_with(b"activate") {
            return Some("a virtualenv's activate script runs in your shell");
        }
        let yarn = |w: &[&[u8]]| {
            same_name(w[0], ".yarn") && (same_name(w[1], "releases") || same_name(w[1], "plugins"))
        };
        components.windows(2).any(yarn).then_some("yarn runs its release and plugins from .yarn/")
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

/// The largest config file read to find hook directories and includes.
const READ_CAP: u64 = 64 * 1024;

/// How deep `include.path` is followed (git's own limit is 10).
const INCLUDE_DEPTH: usize = 4;

/// [`Sensitive`] for one stage: also what the workspace and the stage say
/// the host will run (hook directories that a repository's `core.hooksPath`
/// names, git directories and virtualenvs found by their structure, files a
/// git config includes), where the user's home is, and pvisor's own files,
/// which are never applied.
#[derive(Debug)]
pub struct Bound<'a> {
    base: &'a Sensitive,
    /// Workspace-relative directories everything beneath which is sensitive.
    dirs: Vec<(PathBuf, String)>,
    /// Workspace-relative files that are sensitive.
    files: Vec<(PathBuf, String)>,
    /// The homes the workspace holds, relative to it.
    homes: Vec<PathBuf>,
    /// pvisor's own files, relative to the workspace.
    protected: Vec<(PathBuf, String)>,
    /// Why the files at the workspace's top are commands: it is on `PATH`.
    top_on_path: Option<String>,
}

impl Sensitive {
    /// What the host will run from `workspace` (an absolute, canonical
    /// path) once `changes` are applied, read from the workspace's tree
    /// (`ws`, absent for an imported Job) and the stage's (`upper`): both,
    /// since either may hold the config that names a hook directory.
    pub fn bind(
        &self,
        workspace: &Path,
        ws: Option<&Root>,
        upper: Option<&Root>,
        changes: &[ChangeEntry],
    ) -> Bound<'_> {
        let trees = Trees { workspace, ws, upper };
        let mut bound = Bound {
            base: self,
            dirs: Vec::new(),
            files: Vec::new(),
            homes: self
                .host
                .home
                .iter()
                .chain(&self.host.homes)
                .filter_map(|home| inside(workspace, &canonical(home)))
                .collect(),
            protected: self
                .host
                .protected
                .iter()
                .filter_map(|(path, why)| Some((inside(workspace, &canonical(path))?, why.clone())))
                .collect(),
            top_on_path: None,
        };
        for dir in &self.host.path {
            let Some(rel) = inside(workspace, &canonical(dir)) else { continue };
            let why = format!(
                "a directory on your PATH ({}): a program in it runs when you type its name",
                trees.shown(dir)
            );
            // The workspace itself: its top's files, not everything beneath.
            if rel.as_os_str().is_empty() {
                bound.top_on_path = Some(why);
            } else {
                bound.dirs.push((rel, why));
            }
        }
        let mut seen = BTreeSet::new();
        for change in changes {
            let path = change.path.as_path();
            seen.extend(path.ancestors().skip(1).map(Path::to_path_buf));
            if change.entry == EntryType::Dir {
                seen.insert(path.to_path_buf());
            }
        }
        // Repository top levels: each directory with a `.git` that holds a
        // change or is anywhere in the workspace within [`REPO_SEARCH`]
        // directories of its top (a nested repository's hooksPath may lead
        // out of it), and the repository the workspace itself is in, found
        // as git finds it.
        let mut tops: Vec<PathBuf> = Vec::new();
        let (work_trees, bares) = trees.repositories();
        for dir in work_trees {
            if !seen.contains(&dir) {
                tops.push(workspace.join(dir));
            }
        }
        for dir in &seen {
            if let Some(why) = trees.structure(dir) {
                bound.dirs.push((dir.clone(), why.to_owned()));
            }
            if trees.exists(&dir.join(".git")) {
                tops.push(workspace.join(dir));
            }
        }
        if !tops.iter().any(|t| t == workspace) {
            if let Some(top) = workspace.ancestors().find(|a| a.join(".git").symlink_metadata().is_ok()) {
                tops.push(top.to_path_buf());
            }
        }
        // Hook directories: each git directory's own `hooks/` and every
        // `core.hooksPath` (recorded by `read_git_config`).
        let mut hook_dirs: Vec<PathBuf> = Vec::new();
        for (dir, why) in &bound.dirs {
            if why.starts_with("a git directory") {
                hook_dirs.push(workspace.join(dir).join("hooks"));
            }
        }
        for top in &tops {
            for config in trees.git_configs_of(top) {
                hook_dirs.extend(config.parent().map(|gitdir| gitdir.join("hooks")));
                hook_dirs.extend(bound.read_git_config(&trees, &config, top, 0));
            }
            for config in &self.host.git_configs {
                hook_dirs.extend(bound.read_git_config(&trees, config, top, 0));
            }
        }
        // A bare repository runs its hooks when pushed to (a local remote);
        // a relative hooksPath there is taken from the repository itself.
        for bare in bares {
            let bare = workspace.join(bare);
            hook_dirs.push(bare.join("hooks"));
            hook_dirs.extend(bound.read_git_config(&trees, &bare.join("config"), &bare, 0));
        }
        for dir in &hook_dirs {
            // `.git/hooks -> ../scripts/hooks` is a common set-up: git runs
            // what the host's symlinks lead to.
            let real = canonical(dir);
            if &real != dir {
                if let Some(rel) = inside(workspace, &real) {
                    let why =
                        format!("git runs hooks from this directory ({} leads to it)", trees.shown(dir));
                    bound.dirs.push((rel, why));
                }
                bound.hook_link_targets(&trees, &real);
            }
            bound.hook_link_targets(&trees, dir);
        }
        bound
    }
}

/// How many directories of the workspace are searched for nested
/// repositories, nearest the top first: a bound on the time a review or
/// apply takes in a huge tree, past which deeper repositories are missed.
const REPO_SEARCH: usize = 10_000;

/// How many symlinks in a row are followed from a hook to the file it runs.
const LINK_DEPTH: usize = 8;

impl Bound<'_> {
    /// Records what the git config at `config` (absolute) names for the
    /// repository whose work tree is `top`: its hook directories and the
    /// files it includes, followed to [`INCLUDE_DEPTH`].
    /// Returns the hook directories found (absolute), wherever they are.
    fn read_git_config(&mut self, trees: &Trees, config: &Path, top: &Path, depth: usize) -> Vec<PathBuf> {
        let shown = trees.shown(config);
        let mut hook_dirs = Vec::new();
        for text in trees.read(config) {
            let named = gitconfig::named(&text);
            for hooks in named.hooks_paths.iter().filter(|h| !h.is_empty()) {
                let dir = expand(hooks, top, self.base.host.home.as_deref());
                if let Some(rel) = inside(trees.workspace, &dir) {
                    let why = format!("git runs hooks from this directory (core.hooksPath in {shown})");
                    self.dirs.push((rel, why));
                }
                hook_dirs.push(dir);
            }
            for include in named.includes.iter().filter(|i| !i.is_empty()) {
                let base = config.parent().unwrap_or(Path::new("/"));
                let file = expand(include, base, self.base.host.home.as_deref());
                if let Some(rel) = inside(trees.workspace, &file) {
                    let why = format!("git reads it as config (include.path in {shown})");
                    self.files.push((rel, why));
                }
                if depth < INCLUDE_DEPTH {
                    hook_dirs.extend(self.read_git_config(trees, &file, top, depth + 1));
                }
            }
        }
        hook_dirs
    }

    /// Records the workspace files that the hooks in `dir` (absolute) are
    /// symlinks to: git runs a hook through its link, so changing the file
    /// it leads to changes the hook as surely as writing the hook itself.
    fn hook_link_targets(&mut self, trees: &Trees, dir: &Path) {
        for name in trees.names(dir) {
            let hook = dir.join(name);
            let mut link = hook.clone();
            for _ in 0..LINK_DEPTH {
                let Some(target) = trees.read_link(&link) else { break };
                let parent = link.parent().unwrap_or(Path::new("/"));
                link = normal(&parent.join(std::ffi::OsStr::from_bytes(&target)));
                if let Some(rel) = inside(trees.workspace, &link).filter(|r| !r.as_os_str().is_empty()) {
                    let why = format!("a git hook ({}) is a symlink to it", trees.shown(&hook));
                    self.files.push((rel, why));
                }
            }
        }
    }

    /// Why `change` is never applied: it is pvisor's own configuration or
    /// state (or replaces a directory holding it). A sandboxed command that
    /// could write these would widen its own next run's policy.
    pub fn forbidden(&self, change: &ChangeEntry) -> Option<String> {
        let path = change.path.as_path();
        let plain_dir = change.entry == EntryType::Dir
            && !matches!(change.kind, ChangeKind::OpaqueDir | ChangeKind::TypeChanged | ChangeKind::Deleted);
        self.protected.iter().find_map(|(protected, why)| {
            if path.starts_with(protected) {
                Some(why.clone())
            } else if protected.starts_with(path) && !plain_dir {
                Some(format!("it replaces a directory that holds {why}"))
            } else {
                None
            }
        })
    }

    /// Whether the workspace is a home directory or holds one.
    pub fn holds_home(&self) -> bool {
        !self.homes.is_empty()
    }

    /// Why applying `change` needs consent (or is never done: see
    /// [`Self::forbidden`]), or `None` if it does not.
    pub fn reason_for(&self, change: &ChangeEntry) -> Option<String> {
        if let Some(why) = self.forbidden(change) {
            return Some(format!("never applied: {why}"));
        }
        if let Some(why) = self.base.reason_for(change) {
            return Some(why);
        }
        let path = change.path.as_path();
        if let Some(why) = self.in_home(path) {
            return Some(why);
        }
        if let Some((_, why)) = self.files.iter().find(|(file, _)| path == file) {
            return Some(why.clone());
        }
        if let Some(why) = self.top_on_path.as_ref().filter(|_| path.components().count() == 1) {
            return Some(why.clone());
        }
        if let Some((_, why)) = self.dirs.iter().find(|(dir, _)| path.starts_with(dir)) {
            return Some(why.clone());
        }
        // A symlink or file put where such a directory is read from.
        let above = |dir: &PathBuf| dir.starts_with(path) && dir.as_path() != path;
        (change.entry != EntryType::Dir && self.dirs.iter().chain(&self.files).any(|(dir, _)| above(dir))).then(|| {
            "a symlink or file in place of a directory whose files the host runs: what it leads to would not be flagged"
                .to_owned()
        })
    }

    /// A dotfile or `bin/` at the top of a home the workspace holds:
    /// shells, ssh, git, systemd and the desktop read or run them at login.
    fn in_home(&self, path: &Path) -> Option<String> {
        let first = |home: &PathBuf| {
            let rest = path.strip_prefix(home).ok()?;
            Some(rest.components().next()?.as_os_str().as_bytes().to_vec())
        };
        let dotted = self.homes.iter().filter_map(first).any(|f| f.starts_with(b".") || f == b"bin");
        dotted.then(|| {
            "the workspace holds a home directory: its owner's shell, ssh, git, systemd and desktop read or run its dotfiles".to_owned()
        })
    }
}

#[cfg(test)]
mod tests;
