//! What pvisor prints for pasting is exactly what runs: the `--allow` hint
//! after a run and the "apply one by naming it" hint after `apply --all`
//! quote every name, and the names the sandbox chose (by sending denied
//! requests, by naming staged files) never become a wildcard, a loopback or
//! IP-literal allow rule, or a shell command.

use std::fs;
use std::process::Command;

use crate::support::*;

/// Sends, through the proxy, a request for each of these names (and with
/// `LOOPBACK=1`, for the host's loopback too).
const REQUESTS: &str = r#"
import os, socket
proxy = os.environ["http_proxy"].split("//")[1].rstrip("/")
host, port = proxy.rsplit(":", 1)
mark = os.environ["MARK"]
names = ["x$(touch %s/allow-ran)" % mark, "*",
         "a;touch${IFS}%s/semi-ran;.com" % mark, "'$(touch %s/quote-ran)'.com" % mark, "pypi-mirror.example"]
if os.environ.get("LOOPBACK") == "1":
    names += ["127.0.0.1", "[::1]", "localhost"]
for name in names:
    for request in ("GET http://%s/ HTTP/1.1\r\nHost: %s\r\n\r\n" % (name, name), "CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n" % (name, name)):
        s = socket.create_connection((host, int(port)), 5)
        s.sendall(request.encode())
        try:
            s.recv(4096)
        except Exception:
            pass
        s.close()
print("requests-sent")
"#;

/// Runs `echo ARGS` through a shell in `dir`, as pasting them would, and
/// returns what it printed.
fn pasted(args: &str, dir: &std::path::Path) -> String {
    let out = Command::new("sh").args(["-c", &format!("echo {args}")]).current_dir(dir).output().unwrap();
    text(&out.stdout)
}

#[test]
fn the_allow_hint_never_runs_or_widens_what_the_sandbox_named() {
    let env = Env::new(As::Rootless);
    let mark = env.dir.path().join("marks");
    fs::create_dir(&mark).unwrap();
    env.give_away(&mark);
    let out = env
        .command(&["run", "--allow", "allowed.example", "--", "python3", "-c", REQUESTS])
        .env("MARK", &mark)
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_only_the_plain_name_is_suggested(&stderr, &text(&out.stdout), &mark);
    // With the host's loopback among the denied names no name is suggested
    // at all: a client that missed a local server may have fallen back to a
    // public one.
    let out = env
        .command(&["run", "--allow", "allowed.example", "--", "python3", "-c", REQUESTS])
        .env("MARK", &mark)
        .env("LOOPBACK", "1")
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert!(text(&out.stdout).contains("requests-sent"), "{}\n{stderr}", text(&out.stdout));
    assert!(stderr.contains("denied:") && !stderr.contains("to allow"), "{stderr}");
    assert!(stderr.contains("could not reach the host's loopback"), "{stderr}");
    for line in stderr.lines() {
        for literal in ["127.0.0.1", "::1", "'::1'", "localhost", "'[::1]'"] {
            assert!(!line.contains(&format!("--allow {literal}")), "{line}");
        }
    }
}

fn assert_only_the_plain_name_is_suggested(stderr: &str, stdout: &str, mark: &std::path::Path) {
    assert!(stdout.contains("requests-sent"), "{stdout}\n{stderr}");
    assert!(stderr.contains("denied:"), "the denied names are listed: {stderr}");
    let hint = stderr
        .lines()
        .find(|l| l.contains("to allow"))
        .unwrap_or_else(|| panic!("a hint for the plain name: {stderr}"));
    assert!(hint.contains("came from the sandbox"), "{hint}");
    let flags = hint.split_once("first): ").unwrap().1;
    assert_eq!(flags, "--allow pypi-mirror.example", "only the plain public name is suggested: {hint}");
    let echoed = pasted(flags, mark);
    assert!(echoed.contains("pypi-mirror.example"), "{echoed}");
    let ran: Vec<_> = fs::read_dir(mark).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(ran.is_empty(), "pasting the hint ran a command: {ran:?}");
    for line in stderr.lines() {
        assert!(!line.contains("--allow *") && !line.contains("--allow '*'"), "{line}");
    }
}

#[test]
fn the_apply_hint_quotes_the_names_the_sandbox_chose() {
    let env = Env::new(As::Rootless);
    let mark = env.dir.path().join("marks");
    fs::create_dir(&mark).unwrap();
    // Names that run `touch` in the directory they are pasted in.
    let script = "mkdir -p .claude && echo x > '.claude/x$(touch dollar-ran)' \
        && echo x > \".claude/q'\\$(touch quote-ran)'\" && echo x > '.claude/-rf' \
        && echo x > .claude/plain.json && echo probe-ran";
    std::thread::sleep(std::time::Duration::from_millis(25));
    let out = env.pvisor(&["run", "--", "sh", "-c", script]);
    assert!(text(&out.stdout).contains("probe-ran"), "{}", text(&out.stderr));
    let out = env.pvisor(&["apply", "--all"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let hints: Vec<&str> = stdout.lines().filter(|l| l.trim_start().starts_with("pvisor apply ")).collect();
    let skipped = stdout.lines().filter(|l| l.trim_start().starts_with("SENSITIVE")).count();
    assert_eq!(
        (hints.len(), skipped),
        (5, 5),
        "one command per skipped path (and .claude/ itself): {stdout}"
    );
    let mut names: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("SENSITIVE "))
        .map(|l| l.split_once(": a coding agent").unwrap().0)
        .collect();
    let mut echoed: Vec<String> = hints
        .iter()
        .map(|hint| {
            let args = hint.trim_start().strip_prefix("pvisor apply ").unwrap();
            let words = pasted(args, &mark);
            words.trim_end().split_once(" -- ").unwrap().1.to_owned()
        })
        .collect();
    names.sort_unstable();
    echoed.sort_unstable();
    assert_eq!(echoed, names, "pasted, each hint names exactly its path");
    let ran: Vec<_> = fs::read_dir(&mark).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(ran.is_empty(), "pasting the hint ran a command: {ran:?}");
    // Pasted as printed, each applies exactly its own path.
    let hint = hints.iter().find(|h| h.contains("dollar-ran")).unwrap();
    let out = Command::new("sh")
        .args(["-c", &format!("{} {}", bin(), hint.trim_start().strip_prefix("pvisor ").unwrap())])
        .current_dir(&mark)
        .env("PVISOR_HOME", &env.home)
        .env("HOME", env.dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(env.ws.join(".claude/x$(touch dollar-ran)").exists(), "the named path was applied");
    assert!(!env.ws.join(".claude/plain.json").exists(), "and only it");
    assert!(fs::read_dir(&mark).unwrap().next().is_none(), "applying it ran nothing");
}
