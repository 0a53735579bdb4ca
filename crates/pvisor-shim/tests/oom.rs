//! A guest OOM kill under a real containerd, in a test binary of its own.
//!
//! Alone because it is timing-sensitive on TCG: in a 128 MiB guest on a
//! loaded 2-core host, the guest kernel's reclaim can fall behind the OOM
//! killer, which then finds nothing left it may kill (the keeper is exempt)
//! and panics ("System is deadlocked on memory"): the VM ends and the
//! container with it (255), recorded as such (docs/kubernetes.md, "Limits").
//! Cargo runs test binaries one after another, so no sibling test's VM
//! competes; where the panic still happens, the test checks that it is that
//! panic and nothing else. (A memory cgroup in the guest around the execs
//! was tried: under load its reclaim thrashes on the container's file pages
//! and the hog runs for minutes instead.)

// A test (or benchmark) program: it writes fixtures and says what it measured
// or skipped; clippy.toml's lints are for the libraries' own code.
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

// The harness is containerd.rs's; this test uses part of it.
#[allow(dead_code)]
#[path = "containerd/harness.rs"]
mod harness;

use std::process::{Command, Stdio};
use std::time::Duration;

use harness::*;

#[test]
#[ignore = "needs root, containerd and the vm guest image: scripts/test.sh runs it as root, with --include-ignored"]
fn an_oom_kill_in_the_guest_is_task_oom_and_exit_137() {
    require();
    let c = start(NAMESPACE);
    let mut events = Command::new("ctr")
        .args(["-a", &c.sock, "-n", NAMESPACE, "events"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("ctr events runs");
    // The memory limit is the guest's RAM (the smallest a VM gets: 128
    // MiB); the shell's command substitution grows without bound. Nothing
    // here steers the OOM killer: the Job's keeper makes itself the last
    // choice (before it did, the kernel sometimes took the keeper and with
    // it the VM), so the victim must be the container's shell.
    let limit = (128u64 << 20).to_string();
    let script = "echo start; x=$(tr '\\0' a </dev/zero); echo survived";
    let out = c.ctr(&[
        "run",
        "--rm",
        "--memory-limit",
        &limit,
        "--runtime",
        RUNTIME,
        IMAGE,
        "hog",
        "sh",
        "-c",
        script,
    ]);
    assert_eq!(text(&out.stdout), "start\n", "stderr: {}", text(&out.stderr));
    if out.status.code() == Some(255) {
        // The one other honest outcome (module doc): the guest kernel
        // panicked on memory, the VM ended, and the container with it. Only
        // that panic excuses a 255: any other end of the VM fails here.
        let consoles: Vec<String> = walk(&c.home())
            .into_iter()
            .filter(|p| p.file_name().is_some_and(|n| n == "console.log"))
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .collect();
        assert!(
            consoles
                .iter()
                .any(|log| log.contains("Out of memory: Killed process")
                    && log.contains("deadlocked on memory")),
            "exit 255 without the guest kernel's OOM panic: {consoles:?}"
        );
        let _ = events.kill();
        let _ = events.wait();
        eprintln!("NOTE: the 128 MiB guest's kernel panicked on memory (a loaded TCG host); its container ended 255");
        return;
    }
    assert_eq!(out.status.code(), Some(137), "killed by SIGKILL: 128 + 9");
    // Published before the exit; give ctr events a moment to print it.
    std::thread::sleep(Duration::from_secs(1));
    let _ = events.kill();
    let seen = text(&events.wait_with_output().expect("ctr events ends").stdout);
    let oom = seen.lines().position(|l| l.contains("/tasks/oom") && l.contains("\"container_id\":\"hog\""));
    let exit = seen.lines().position(|l| l.contains("/tasks/exit") && l.contains("\"container_id\":\"hog\""));
    assert!(oom.is_some() && oom < exit, "TaskOOM, then TaskExit: {seen}");
    // The Job's records say why.
    let jobs = pvisor(&c, &["jobs"]);
    let job = jobs.lines().last().and_then(|l| l.split_whitespace().next()).expect("the container's Job");
    let status = pvisor(&c, &["status", job]);
    assert!(status.contains("killed by the kernel's OOM killer"), "pvisor status: {status}");
    // And its result carries the container's status, as containerd saw it.
    let status = pvisor(&c, &["status", "--json", job]);
    let status: serde_json::Value = serde_json::from_str(status.trim()).expect("one status line");
    assert_eq!(
        status["data"]["exit_code"].as_i64(),
        Some(137),
        "the Job ends with the container's 137: {status}"
    );
}
