//! What the host runs in place of a file that looks harmless is sensitive
//! too: the workspace file a git hook is a symlink to, the directory
//! `.git/hooks` is a symlink to, the hook directory a linked worktree's own
//! `config.worktree` names, the hook directory a repository nested deep in
//! the workspace names outside its own tree (where no change is), the one
//! a bare repository used as a local remote names, and a
//! compiled Python module in `__pycache__` that runs instead of its
//! unchanged source. So are the dotfiles of any account's home the
//! workspace is (not only `$HOME`'s), what the user's environment names (a
//! `core.hooksPath` in the config `GIT_CONFIG_GLOBAL` names, a directory on
//! `PATH`), and editors' and agents' project start-up files.
//!
//! The command stages each payload; `apply --all` skips them, and what the
//! user does next (`git commit`, `import pkg.mod`, log in, type `ls`, start
//! vim) runs none of it; named exactly, each applies and the same action
//! runs it (the probes work). Last, a review of a Job that still runs is no
//! review of what it stages afterwards.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::support::*;

fn git(dir: &Path, args: &[&str]) -> Output {
    let out = Command::new("git")
        .args(["-c", "safe.directory=*", "-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", text(&out.stderr));
    out
}

/// A push to a repository the test's user does not own (rootless).
const RECEIVE: &str = "--receive-pack=git -c safe.directory=* receive-pack";

fn commit(dir: &Path) {
    git(dir, &["commit", "-q", "--allow-empty", "-m", "after apply"]);
}

/// `import pkg.mod` on the host, writing no cache of its own.
fn import(ws: &Path) -> String {
    let out = Command::new("/usr/bin/python3")
        .args(["-c", "import pkg.mod"])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(ws)
        .output()
        .unwrap();
    assert!(out.status.success(), "python: {}", text(&out.stderr));
    text(&out.stdout)
}

/// Where the host's Python caches `pkg/mod.py`, relative to the workspace.
fn cached() -> String {
    let out = Command::new("/usr/bin/python3")
        .args(["-c", "import importlib.util as u; print(u.cache_from_source('pkg/mod.py'))"])
        .output()
        .unwrap();
    text(&out.stdout).trim().to_owned()
}

fn what_runs_in_place_of_a_harmless_file_is_not_applied_by_all(who: As) {
    who.require();
    let env = Env::new(who);
    let mark = env.dir.path().join("marks");
    fs::create_dir(&mark).unwrap();
    fs::set_permissions(&mark, fs::Permissions::from_mode(0o777)).unwrap();
    // The host: a pre-commit hook that is a symlink to a script in the work
    // tree, a linked worktree with its own hooksPath, a Python package.
    git(&env.ws, &["init", "-q"]);
    commit(&env.ws);
    git(&env.ws, &["worktree", "add", "-q", "w2"]);
    git(&env.ws, &["config", "extensions.worktreeConfig", "true"]);
    git(&env.ws.join("w2"), &["config", "--worktree", "core.hooksPath", "wthooks"]);
    // `.git/hooks -> ../hooks`, the hooks kept in the work tree.
    let other = env.ws.join("other");
    fs::create_dir_all(other.join("hooks")).unwrap();
    git(&other, &["init", "-q"]);
    fs::remove_dir_all(other.join(".git/hooks")).unwrap();
    symlink("../hooks", other.join(".git/hooks")).unwrap();
    // A bare repository used as a local remote, its hooks kept elsewhere.
    git(&env.ws, &["init", "-q", "--bare", "remotes/r.git"]);
    git(&env.ws.join("remotes/r.git"), &["config", "core.hooksPath", "../../remote-hooks"]);
    let nested = env.ws.join("vendor/lib");
    fs::create_dir_all(&nested).unwrap();
    git(&nested, &["init", "-q"]);
    git(&nested, &["config", "core.hooksPath", "../../shared-hooks"]);
    env.write("shared-hooks/pre-commit", "#!/bin/sh\ntrue\n");
    fs::set_permissions(env.ws.join("shared-hooks/pre-commit"), fs::Permissions::from_mode(0o755)).unwrap();
    env.write("scripts/lint.sh", "#!/bin/sh\ntrue\n");
    fs::set_permissions(env.ws.join("scripts/lint.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    symlink("../../scripts/lint.sh", env.ws.join(".git/hooks/pre-commit")).unwrap();
    env.write("pkg/__init__.py", "");
    env.write("pkg/mod.py", "print('source')\n");
    env.give_away(&env.ws);
    let pyc = cached();
    let m = mark.display();
    let script = format!(
        "set -e
        echo 'touch {m}/linked-hook-ran' >> scripts/lint.sh
        echo 'touch {m}/nested-hook-ran' >> shared-hooks/pre-commit
        mkdir remote-hooks; printf '#!/bin/sh\\ntouch {m}/bare-hook-ran\\n' > remote-hooks/post-receive; chmod +x remote-hooks/post-receive
        printf '#!/bin/sh\\ntouch {m}/hooks-link-ran\\n' > other/hooks/pre-commit; chmod +x other/hooks/pre-commit
        mkdir -p w2/wthooks
        printf '#!/bin/sh\\ntouch {m}/worktree-hook-ran\\n' > w2/wthooks/pre-commit; chmod +x w2/wthooks/pre-commit
        mkdir -p /tmp/evil
        echo \"open('{m}/pyc-ran', 'w'); print('compiled')\" > /tmp/evil/mod.py
        python3 -c \"import py_compile as p; p.compile('/tmp/evil/mod.py', cfile='{pyc}', doraise=True, invalidation_mode=p.PycInvalidationMode.UNCHECKED_HASH)\"
        echo fine > notes.txt
        echo probe-ran"
    );
    let out = env.run_sh(&script);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("probe-ran"));

    let review = env.review();
    for (path, why) in [
        ("scripts/lint.sh", "symlink"),
        ("w2/wthooks/pre-commit", "config.worktree"),
        ("shared-hooks/pre-commit", "vendor/lib/.git/config"),
        ("other/hooks/pre-commit", "other/.git/hooks leads to it"),
        ("remote-hooks/post-receive", "remotes/r.git/config"),
        (pyc.as_str(), "compiled"),
    ] {
        let item = review.iter().find(|c| c["path"] == path).unwrap_or_else(|| panic!("{path}: {review:?}"));
        assert_eq!(item["sensitive"], true, "{item}");
        assert!(item["sensitive_reason"].as_str().unwrap().contains(why), "{item}");
    }

    let out = env.pvisor(&["apply", "--all"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert_eq!(fs::read_to_string(env.ws.join("notes.txt")).unwrap(), "fine\n");
    assert_eq!(fs::read_to_string(env.ws.join("scripts/lint.sh")).unwrap(), "#!/bin/sh\ntrue\n");
    assert!(!env.ws.join("w2/wthooks").exists() && !env.ws.join(&pyc).exists());
    assert_eq!(fs::read_to_string(env.ws.join("shared-hooks/pre-commit")).unwrap(), "#!/bin/sh\ntrue\n");
    commit(&env.ws);
    commit(&env.ws.join("w2"));
    commit(&nested);
    commit(&other);
    git(&env.ws, &["push", "-q", RECEIVE, "remotes/r.git", "HEAD:refs/heads/a"]);
    assert!(!other.join("hooks/pre-commit").exists());
    assert_eq!(import(&env.ws), "source\n");
    let ran: Vec<_> = fs::read_dir(&mark).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(ran.is_empty(), "the host ran the command's payload: {ran:?}");

    // Named exactly, each is the user's choice, and each probe then runs.
    for path in [
        "scripts/lint.sh",
        "w2/wthooks/pre-commit",
        "shared-hooks/pre-commit",
        "other/hooks/pre-commit",
        "remote-hooks/post-receive",
        &pyc,
    ] {
        env.expect(&["apply", "--", path], 0);
    }
    commit(&env.ws);
    commit(&env.ws.join("w2"));
    commit(&nested);
    commit(&other);
    git(&env.ws, &["push", "-q", RECEIVE, "remotes/r.git", "HEAD:refs/heads/b"]);
    assert_eq!(import(&env.ws), "compiled\n", "the cached module runs in place of the source");
    for probe in [
        "linked-hook-ran",
        "worktree-hook-ran",
        "nested-hook-ran",
        "hooks-link-ran",
        "bare-hook-ran",
        "pyc-ran",
    ] {
        assert!(mark.join(probe).exists(), "{probe}: the probe works once applied by name");
    }
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn what_runs_in_place_of_a_harmless_file_is_not_applied_by_all_as_root() {
    what_runs_in_place_of_a_harmless_file_is_not_applied_by_all(As::Root);
}

#[test]
fn what_runs_in_place_of_a_harmless_file_is_not_applied_by_all_rootless() {
    what_runs_in_place_of_a_harmless_file_is_not_applied_by_all(As::Rootless);
}

/// `pvisor ARGS` on a host whose passwd database is `passwd` (bound over
/// /etc/passwd in a private mount namespace: the test adds an account
/// without touching the machine's).
fn with_passwd(env: &Env, passwd: &Path, args: &[&str]) -> Output {
    let inner = env.command(args);
    let mut cmd = Command::new("unshare");
    cmd.args([
        "-m",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        "mount --bind \"$0\" /etc/passwd && exec \"$@\"",
    ])
    .arg(passwd)
    .arg(inner.get_program())
    .args(inner.get_args());
    for (key, value) in inner.get_envs() {
        match value {
            Some(value) => cmd.env(key, value),
            None => cmd.env_remove(key),
        };
    }
    cmd.current_dir(&env.ws).stdin(Stdio::null()).output().unwrap()
}

fn another_accounts_home_keeps_its_dotfiles(who: As) {
    // Binding a passwd database needs root, for both variants.
    assert!(is_root(), "binding a passwd database needs root (the test is ignored unless included)");
    let env = Env::new(who);
    let mark = env.dir.path().join("marks");
    fs::create_dir(&mark).unwrap();
    fs::set_permissions(&mark, fs::Permissions::from_mode(0o777)).unwrap();
    // The workspace is alice's home; pvisor runs with another $HOME (root's
    // `sudo`, an admin's shell).
    env.write(".bashrc", "# alice's\n");
    let passwd = env.dir.path().join("passwd");
    let mut accounts = fs::read_to_string("/etc/passwd").unwrap();
    accounts.push_str(&format!("alice:x:4243:4243::{}:/bin/sh\n", env.ws.display()));
    fs::write(&passwd, accounts).unwrap();
    let m = mark.display();
    let out = env.run_sh(&format!(
        "echo 'touch {m}/bashrc-ran' >> .bashrc; mkdir .ssh; echo 'ssh-ed25519 AAAA evil' > .ssh/authorized_keys
        echo fine > notes.txt; echo probe-ran"
    ));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("probe-ran"));

    let out = with_passwd(&env, &passwd, &["apply", "--all"]);
    assert_eq!(out.status.code(), Some(1), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("SENSITIVE .bashrc"), "{}", text(&out.stdout));
    assert_eq!(fs::read_to_string(env.ws.join("notes.txt")).unwrap(), "fine\n");
    assert!(!env.ws.join(".ssh").exists(), "authorized_keys was applied by --all");
    // alice logs in: her shell reads .bashrc.
    let login = || Command::new("sh").args(["-c", ". ./.bashrc"]).current_dir(&env.ws).status().unwrap();
    assert!(login().success());
    assert!(!mark.join("bashrc-ran").exists(), "the host ran the command's .bashrc");

    // Named exactly, it applies, and the probe runs.
    let out = with_passwd(&env, &passwd, &["apply", "--", ".bashrc"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(login().success());
    assert!(mark.join("bashrc-ran").exists(), "the probe works once applied by name");
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn another_accounts_home_keeps_its_dotfiles_as_root() {
    another_accounts_home_keeps_its_dotfiles(As::Root);
}

#[test]
#[ignore = "needs root (to run as another user): scripts/test.sh runs it as root, with --include-ignored"]
fn another_accounts_home_keeps_its_dotfiles_rootless() {
    another_accounts_home_keeps_its_dotfiles(As::Rootless);
}

fn what_the_users_environment_names_is_sensitive(who: As) {
    who.require();
    let env = Env::new(who);
    let mark = env.dir.path().join("marks");
    fs::create_dir(&mark).unwrap();
    fs::set_permissions(&mark, fs::Permissions::from_mode(0o777)).unwrap();
    let global = env.dir.path().join("global.gitconfig");
    fs::write(&global, format!("[core]\n\thooksPath = {}/hk\n", env.ws.display())).unwrap();
    git(&env.ws, &["init", "-q"]);
    env.give_away(&env.ws);
    let m = mark.display();
    let out = env.run_sh(&format!(
        "mkdir hk; printf '#!/bin/sh\\ntouch {m}/global-hook-ran\\n' > hk/pre-commit; chmod +x hk/pre-commit
        mkdir -p tools/bin; printf '#!/bin/sh\\ntouch {m}/path-ran\\n' > tools/bin/ls; chmod +x tools/bin/ls
        echo probe-ran"
    ));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("probe-ran"));
    let path = format!("{}/tools/bin:{}", env.ws.display(), std::env::var("PATH").unwrap());
    let apply = |args: &[&str]| {
        env.command(args).env("GIT_CONFIG_GLOBAL", &global).env("PATH", &path).output().unwrap()
    };
    let out = apply(&["apply", "--all"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("global.gitconfig"), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("SENSITIVE tools/bin/ls: a directory on your PATH"),
        "{}",
        text(&out.stdout)
    );
    // The user types `ls`.
    let ls = || Command::new("sh").args(["-c", "ls >/dev/null"]).env("PATH", &path).status().unwrap();
    assert!(ls().success());
    let commit = || {
        let out = Command::new("git")
            .args(["-c", "safe.directory=*", "-c", "user.name=t", "-c", "user.email=t@t"])
            .args(["commit", "-q", "--allow-empty", "-m", "x"])
            .env("GIT_CONFIG_GLOBAL", &global)
            .current_dir(&env.ws)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    };
    commit();
    assert!(!mark.join("global-hook-ran").exists(), "the host ran the command's hook");
    assert!(!mark.join("path-ran").exists(), "the host ran the command's ls");
    for named in ["hk/pre-commit", "tools/bin/ls"] {
        let out = apply(&["apply", "--", named]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    }
    commit();
    assert!(ls().success());
    assert!(mark.join("global-hook-ran").exists(), "the hook probe works once applied by name");
    assert!(mark.join("path-ran").exists(), "the PATH probe works once applied by name");
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn what_the_users_environment_names_is_sensitive_as_root() {
    what_the_users_environment_names_is_sensitive(As::Root);
}

#[test]
fn what_the_users_environment_names_is_sensitive_rootless() {
    what_the_users_environment_names_is_sensitive(As::Rootless);
}

/// Editor and agent start-up files read from the directory they open in.
const EDITOR_CONFIG: [&str; 8] = [
    ".vimrc",
    "sub/.exrc",
    ".nvim.lua",
    ".dir-locals.el",
    ".helix/languages.toml",
    ".aider.conf.yml",
    "opencode.json",
    ".opencode/agent.md",
];

/// `vim` started in the workspace by a user whose own vimrc sets 'exrc',
/// as the owner of the workspace (vim's 'secure' would stop another's).
fn vim_here(env: &Env, vim_home: &Path) {
    let mut vim = if env.who == As::Rootless && is_root() {
        let mut c = Command::new("setpriv");
        let id = UNPRIVILEGED.to_string();
        c.args(["--reuid", &id, "--regid", &id, "--clear-groups", "vim"]);
        c
    } else {
        Command::new("vim")
    };
    let status = vim
        .args(["-N", "-X", "-c", "qa!"])
        .env("HOME", vim_home)
        .env("TERM", "dumb")
        .current_dir(&env.ws)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "vim: {status}");
}

fn editor_start_up_files_are_not_applied_by_all(who: As) {
    who.require();
    assert!(
        Command::new("vim").arg("--version").output().is_ok(),
        "needs vim (scripts/setup.sh installs it; the test is ignored unless included)"
    );
    let env = Env::new(who);
    let mark = env.dir.path().join("marks");
    fs::create_dir(&mark).unwrap();
    fs::set_permissions(&mark, fs::Permissions::from_mode(0o777)).unwrap();
    let vim_home = env.dir.path().join("vim-home");
    fs::create_dir(&vim_home).unwrap();
    fs::write(vim_home.join(".vimrc"), "set exrc\n").unwrap();
    env.give_away(&vim_home);
    let m = mark.display();
    let mut script = format!("echo 'call writefile([], \"{m}/exrc-ran\")' > .vimrc\n");
    for path in &EDITOR_CONFIG[1..] {
        script.push_str(&format!("mkdir -p \"$(dirname {path})\"; echo 'touch {m}/editor' > {path}\n"));
    }
    script.push_str("echo fine > notes.txt; echo probe-ran");
    let out = env.run_sh(&script);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("probe-ran"));
    let review = env.review();
    for path in EDITOR_CONFIG {
        let item = review.iter().find(|c| c["path"] == path).unwrap_or_else(|| panic!("{path}: {review:?}"));
        assert_eq!(item["sensitive"], true, "{item}");
    }
    let out = env.pvisor(&["apply", "--all"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert_eq!(fs::read_to_string(env.ws.join("notes.txt")).unwrap(), "fine\n");
    for path in EDITOR_CONFIG {
        assert!(!env.ws.join(path).exists(), "{path} was applied by --all");
    }
    vim_here(&env, &vim_home);
    assert!(!mark.join("exrc-ran").exists(), "vim ran the command's .vimrc");
    env.expect(&["apply", "--", ".vimrc"], 0);
    vim_here(&env, &vim_home);
    assert!(mark.join("exrc-ran").exists(), "the probe works once applied by name");
}

#[test]
#[ignore = "needs root and vim: scripts/test.sh runs it as root, with --include-ignored"]
fn editor_start_up_files_are_not_applied_by_all_as_root() {
    editor_start_up_files_are_not_applied_by_all(As::Root);
}

#[test]
#[ignore = "needs vim: scripts/test.sh runs it as root, with --include-ignored"]
fn editor_start_up_files_are_not_applied_by_all_rootless() {
    editor_start_up_files_are_not_applied_by_all(As::Rootless);
}

/// A review made while the Job still ran saw only part of what it stages:
/// a plain `apply --all` afterwards refuses (what came later is unseen)
/// until the ended Job is reviewed again.
#[test]
fn a_plain_apply_refuses_a_job_reviewed_before_it_ended() {
    let env = Env::new(As::Rootless);
    let mut run = env
        .command(&["run", "--", "sh", "-c", "echo shown > seen.txt; sleep 3; echo hidden > unseen.txt"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let review = text(&env.pvisor(&["review"]).stdout);
        if review.contains("no confirmed result") && review.contains("seen.txt") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the run never staged seen.txt: {review}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(run.wait().unwrap().success());
    let out = env.pvisor(&["apply", "--all"]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(text(&out.stderr).contains("while it was still running"), "{}", text(&out.stderr));
    assert!(!env.ws.join("unseen.txt").exists() && !env.ws.join("seen.txt").exists());
    env.expect(&["review"], 0);
    env.expect(&["apply", "--all"], 0);
    assert_eq!(fs::read_to_string(env.ws.join("unseen.txt")).unwrap(), "hidden\n");
}
