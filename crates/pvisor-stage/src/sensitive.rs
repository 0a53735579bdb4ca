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
use std::io::Read;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use pvisor_core::records::{ChangeEntry, ChangeKind, EntryType};
use pvisor_core::store::RelPath;

use crate::beneath::{Kind, Root};
use crate::{gitconfig, glob};

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

/// The workspace's tree and the stage's, read together.
struct Trees<'a> {
    workspace: &'a Path,
    ws: Option<&'a Root>,
    upper: Option<&'a Root>,
}

impl Trees<'_> {
    fn kinds(&self, rel: &Path) -> impl Iterator<Item = Kind> + '_ {
        let rel = rel.to_path_buf();
        [self.ws, self.upper]
            .into_iter()
            .flatten()
            .filter_map(move |root| root.stat(&rel).ok().flatten().map(|s| s.kind))
    }

    fn exists(&self, rel: &Path) -> bool {
        self.kinds(rel).any(|k| k != Kind::Special)
    }

    fn is(&self, rel: &Path, kind: Kind) -> bool {
        self.kinds(rel).any(|k| k == kind)
    }

    /// Why the directory `dir` makes the host run its contents: a git
    /// directory (git's own test: HEAD, objects/ and refs/; or a `config`
    /// with a `[core]` section), or a virtualenv (`pyvenv.cfg`).
    fn structure(&self, dir: &Path) -> Option<&'static str> {
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
    fn git_configs_of(&self, top: &Path) -> Vec<PathBuf> {
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
    fn read(&self, path: &Path) -> Vec<Vec<u8>> {
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
    fn repositories(&self) -> (Vec<PathBuf>, Vec<PathBuf>) {
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
    fn names(&self, dir: &Path) -> BTreeSet<std::ffi::OsString> {
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
    fn read_link(&self, path: &Path) -> Option<Vec<u8>> {
        match inside(self.workspace, path) {
            Some(rel) if rel.as_os_str().is_empty() => None,
            Some(rel) => [self.upper, self.ws].into_iter().flatten().find_map(|r| r.read_link(&rel).ok()),
            None => std::fs::read_link(path).ok().map(|t| t.into_os_string().into_vec()),
        }
    }

    /// `path` as a person knows it: workspace-relative when inside.
    fn shown(&self, path: &Path) -> String {
        let path = inside(self.workspace, path).unwrap_or_else(|| path.to_path_buf());
        pvisor_core::text::escape_bytes(path.as_os_str().as_bytes(), pvisor_core::text::Tabs::Escape)
    }
}

/// `value` (a path from a git config) made absolute: `~` and `~/` are the
/// home, a relative path is relative to `base`.
fn expand(value: &str, base: &Path, home: Option<&Path>) -> PathBuf {
    let in_home = value.strip_prefix('~').filter(|rest| rest.is_empty() || rest.starts_with('/'));
    let path = match (in_home, home) {
        (Some(rest), Some(home)) => home.join(rest.trim_start_matches('/')),
        _ => base.join(value),
    };
    normal(&path)
}

/// `path` with `.` and `..` resolved by name (the files may not exist).
fn normal(path: &Path) -> PathBuf {
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
fn inside(workspace: &Path, path: &Path) -> Option<PathBuf> {
    normal(path).strip_prefix(workspace).ok().map(Path::to_path_buf)
}

/// `path` with the symlinks of its longest existing ancestor resolved (the
/// rest may not exist yet: the config file of a user who has none).
fn canonical(path: &Path) -> PathBuf {
    let path = normal(path);
    for ancestor in path.ancestors() {
        if let Ok(real) = std::fs::canonicalize(ancestor) {
            let rest = path.strip_prefix(ancestor).unwrap_or(Path::new(""));
            return if rest.as_os_str().is_empty() { real } else { real.join(rest) };
        }
    }
    path
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
            "pkg/__pycache__/mod.cpython-312.pyc",
            "pkg/legacy.pyc",
        ] {
            assert!(s.reason(&rel(path)).is_some(), "{path} should be sensitive");
        }
        for path in
            ["src/main.rs", "gitconfig.md", ".github/README.md", "docs/.gitkeep", "my.git/x", "README"]
        {
            assert!(s.reason(&rel(path)).is_none(), "{path} should not be sensitive");
        }
    }

    fn file(path: &str, entry: EntryType) -> ChangeEntry {
        ChangeEntry {
            path: rel(path),
            kind: ChangeKind::Added,
            entry,
            size: 0,
            mode: 0o644,
            blake3: None,
            hardlink_of: None,
        }
    }

    #[test]
    fn what_the_workspace_says_the_host_runs_is_sensitive() {
        let dir = tempfile::tempdir().unwrap();
        let ws = std::fs::canonicalize(dir.path()).unwrap();
        let mk = |p: &str, text: &str| {
            std::fs::create_dir_all(ws.join(p).parent().unwrap()).unwrap();
            std::fs::write(ws.join(p), text).unwrap();
        };
        mk(".git/config", "[core]\n\thooksPath = tools/hooks\n[include]\n\tpath = ../cfg/extra\n");
        mk("cfg/extra", "[core]\nhooksPath = \"more hooks\"\n");
        mk("sub/.git", "gitdir: ../modules/sub\n");
        mk("modules/sub/config", "[core]\nhooksPath = ../sub-hooks\n");
        for d in ["vendor/bare.git/objects", "vendor/bare.git/refs"] {
            std::fs::create_dir_all(ws.join(d)).unwrap();
        }
        mk("vendor/bare.git/HEAD", "ref: refs/heads/main\n");
        mk("odd/config", "[Core]\npager = x\n");
        mk("env/pyvenv.cfg", "home = /usr/bin\n");
        mk(".git/config.worktree", "[core]\nhooksPath = wt-hooks\n");
        mk("scripts/lint.sh", "true\n");
        std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
        std::os::unix::fs::symlink("../../scripts/lint.sh", ws.join(".git/hooks/pre-commit")).unwrap();
        let root = Root::open(&ws).unwrap();
        let host = Host {
            home: Some(ws.clone()),
            homes: vec![ws.join("users/alice")],
            path: vec![ws.join("go/bin"), PathBuf::from("/usr/bin")],
            git_configs: Vec::new(),
            protected: vec![(ws.join(".config/pvisor"), "pvisor's own configuration".into())],
        };
        let s = Sensitive::new(Vec::new()).unwrap().with_host(host);
        let changes: Vec<ChangeEntry> = [
            "tools/hooks/pre-commit",
            "more hooks/post-commit",
            "cfg/extra",
            "sub-hooks/pre-push",
            "vendor/bare.git/config",
            "vendor/bare.git/hooks/post-checkout",
            "odd/config",
            "env/bin/python3",
            ".bashrc",
            ".config/systemd/user/x.service",
            "bin/tool",
            "users/alice/.profile",
            "go/bin/ls",
            "wt-hooks/pre-push",
            "scripts/lint.sh",
            ".config/pvisor/config.toml",
            "src/main.rs",
            "tools/build.sh",
            "users/alice/notes.txt",
        ]
        .iter()
        .map(|p| file(p, EntryType::File))
        .collect();
        let bound = s.bind(&ws, Some(&root), None, &changes);
        let on_path =
            Sensitive::new(Vec::new()).unwrap().with_host(Host { path: vec![ws.clone()], ..Host::default() });
        let on_path = on_path.bind(&ws, Some(&root), None, &changes);
        assert!(on_path.reason_for(&file("tool", EntryType::File)).is_some(), "the workspace is on PATH");
        assert!(on_path.reason_for(&changes[16]).is_none(), "src/main.rs is no command");
        for change in &changes[..16] {
            assert!(bound.reason_for(change).is_some(), "{:?} should be sensitive", change.path);
        }
        for change in &changes[16..] {
            assert!(bound.reason_for(change).is_none(), "{:?} should not be sensitive", change.path);
        }
        assert!(bound.holds_home());
        assert!(bound.forbidden(&changes[15]).is_some(), "pvisor's config is never applied");
        assert!(bound.forbidden(&changes[8]).is_none(), ".bashrc is sensitive, not forbidden");
        let link = ChangeEntry { kind: ChangeKind::Symlink, ..file(".config", EntryType::Symlink) };
        assert!(bound.forbidden(&link).is_some(), "a symlink in place of the config's directory");
        assert!(bound.forbidden(&file(".config", EntryType::Dir)).is_none());
    }

    #[test]
    fn a_tilde_is_the_home_as_git_expands_it() {
        let (base, home) = (Path::new("/w"), Some(Path::new("/h")));
        assert_eq!(expand("~", base, home), Path::new("/h"));
        assert_eq!(expand("~/hooks", base, home), Path::new("/h/hooks"));
        assert_eq!(expand("~x/hooks", base, home), Path::new("/w/~x/hooks"));
        assert_eq!(expand("hooks/../h2", base, home), Path::new("/w/h2"));
    }

    #[test]
    fn agent_and_package_manager_config_is_sensitive() {
        let s = Sensitive::new(Vec::new()).unwrap();
        for path in [
            ".claude/settings.json",
            ".claude/commands/x.md",
            "CLAUDE.md",
            "AGENTS.md",
            ".mcp.json",
            ".vscode/mcp.json",
            ".cursor/mcp.json",
            ".gemini/settings.json",
            ".codex/config.toml",
            ".yarnrc.yml",
            ".yarn/releases/yarn-4.cjs",
            ".yarn/plugins/@yarnpkg/p.cjs",
            ".npmrc",
            ".pnpmfile.cjs",
            "bunfig.toml",
            ".cargo/config.toml",
            "rust-toolchain.toml",
            "venv/lib/python3.12/site-packages/evil.pth",
            "x/evil.pth",
            "venv/bin/activate",
            "venv/bin/activate.fish",
            "pyvenv.cfg",
        ] {
            assert!(s.reason(&rel(path)).is_some(), "{path} should be sensitive");
        }
        assert!(s.reason(&rel(".yarn/cache/x.zip")).is_none());
        assert!(s.reason(&rel("docs/depth.md")).is_none());
    }
}
