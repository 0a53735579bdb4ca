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
    for path in ["src/main.rs", "gitconfig.md", ".github/README.md", "docs/.gitkeep", "my.git/x", "README"] {
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
