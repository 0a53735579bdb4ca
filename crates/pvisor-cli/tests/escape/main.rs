//! The escape corpus: every case runs a hostile action inside the real
//! sandbox and asserts that it failed to get out. Each case is a test.
//!
//! Symlinks planted against apply are next to the effects tests
//! (`e2e effects::a_staged_symlink_*`, `effects::a_directory_swapped_*`), and
//! the network's walls next to the network tests (`e2e network::*`).
//!
//! Here: escapes through /proc, the supervisor, capabilities and an apply
//! race; resource limits are in `limits`, the kernel's surface (root,
//! seccomp, descriptors, the terminal) in `kernel`, the host's sockets,
//! fifos and state directories in `host`, what pvisor's own fds 0–2 are
//! and what a background run prints on the terminal in `stdio`, state
//! directories made after a sandbox started in `leaks`, and records a
//! command tries to break (trees deeper than the stack and PATH_MAX, the
//! state filesystem out of inodes, a flood of Trace events) in `records`.

// A test (or benchmark) program: it writes fixtures and says what it measured
// or skipped; clippy.toml's lints are for the libraries' own code.
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

#[path = "../e2e/support.rs"]
mod support;

use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::*;

mod host;
mod kernel;
mod leaks;
mod limits;
mod records;
mod stdio;

fn escaped(out: &std::process::Output) -> bool {
    text(&out.stdout).contains("ESCAPED")
}

/// The last run failed as its command did, with a valid receipt and `changes` staged.
fn sealed_with_receipt(env: &Env, changes: u64) {
    let status = env.status_json(None);
    assert_eq!(
        (status["state"].as_str(), status["receipt"].as_str()),
        (Some("failed"), Some("valid")),
        "{status}"
    );
    assert_eq!(status["changes"], changes, "{status}");
}

#[test]
fn writing_outside_through_proc_self_root() {
    let env = Env::new(As::Root);
    let target = format!("/etc/pvisor-escape-root-{}", std::process::id());
    let out = env.run_sh(&format!("echo x > /proc/self/root{target} 2>/dev/null && echo ESCAPED; true"));
    assert!(!escaped(&out) && !Path::new(&target).exists());
}

#[test]
fn writing_outside_through_proc_1_cwd_and_root() {
    let env = Env::new(As::Rootless);
    let out = env.run_sh(
        "ls /proc/1/cwd/ >/dev/null 2>&1 && echo ESCAPED-cwd-readable; \
         ls /proc/1/root/ >/dev/null 2>&1 && echo ESCAPED-root-readable; \
         ls -l /proc/1/fd/ 2>/dev/null | grep -q . && echo ESCAPED-fds; true",
    );
    assert!(!escaped(&out), "{}", text(&out.stdout));
}

const SUPERVISOR_PROBE: &str = r#"
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
for _ in range(600):
    if os.path.getsize('supervisor.pid') > 0:
        break
    time.sleep(0.05)
sup = int(open('supervisor.pid').read())
def argv(p):
    try:
        return open(f'/proc/{p}/cmdline', 'rb').read().split(b'\0')
    except OSError:
        return []
visible = [p for p in os.listdir('/proc') if p.isdigit() and argv(p)[:2] and argv(p)[0].endswith(b'pvisor') and argv(p)[1:2] == [b'run']]
print('ESCAPED-visible' if visible else 'hidden')
rc = libc.ptrace(16, sup, 0, 0)
print('ESCAPED-ptrace' if rc == 0 else 'ptrace refused', ctypes.get_errno())
print('ESCAPED-proc' if os.path.exists(f'/proc/{sup}/environ') and os.access(f'/proc/{sup}/environ', os.R_OK) else 'proc refused')
"#;

#[test]
fn the_supervisor_is_out_of_sight_and_out_of_reach() {
    let env = Env::new(As::Rootless);
    env.write("probe.py", SUPERVISOR_PROBE);
    // Empty before the run, so the sandbox's overlay knows the file from the
    // start (one it first looked up as missing, it would never see appear);
    // the pid is written into it once the run is spawned.
    env.write("supervisor.pid", "");
    let child =
        env.command(&["run", "--", "/usr/bin/python3", "probe.py"]).stdout(Stdio::piped()).spawn().unwrap();
    // The sandbox learns the supervisor's host pid from a file the test writes.
    fs::write(env.ws.join("supervisor.pid"), child.id().to_string()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("ptrace refused") && stdout.contains("hidden"),
        "the probe did not run: {stdout}"
    );
    assert!(!escaped(&out), "{stdout}");
}

#[test]
fn regaining_capabilities_through_a_new_user_namespace() {
    let env = Env::new(As::Rootless);
    let out = env.run_sh(
        "unshare -Ur true 2>/dev/null && echo ESCAPED-unshare; \
         unshare -Urm sh -c 'mount -t tmpfs t /mnt' 2>/dev/null && echo ESCAPED-mount; \
         mount -o remount,rw / 2>/dev/null && echo ESCAPED-remount; true",
    );
    assert!(!escaped(&out), "{}", text(&out.stdout));
}

#[test]
fn a_symlink_race_against_apply_never_writes_outside() {
    let env = Env::new(As::Rootless);
    assert!(env
        .run_sh("mkdir d; i=0; while [ $i -lt 3000 ]; do echo $i > d/f$i; i=$((i+1)); done")
        .status
        .success());
    let outside = env.dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    env.give_away(&outside);
    let apply = env
        .command(&["apply", "--all", "--force"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Swap the workspace directory for a symlink to `outside`, over and over,
    // while apply runs.
    let (d, real) = (env.ws.join("d"), env.ws.join("d.real"));
    let start = Instant::now();
    let mut apply = apply;
    while start.elapsed() < Duration::from_secs(5) {
        if apply.try_wait().unwrap().is_some() {
            break;
        }
        if d.is_dir() && !d.is_symlink() {
            let _ = fs::rename(&d, &real);
            let _ = std::os::unix::fs::symlink(&outside, &d);
        } else {
            let _ = fs::remove_file(&d);
            let _ = fs::rename(&real, &d);
        }
    }
    let _ = apply.wait();
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0, "apply wrote through the swapped symlink");
}
