//! Resource limits: enforced where the host allows, and reported honestly.

use std::time::{Duration, Instant};

use crate::support::*;

fn limit_events(env: &Env) -> Vec<serde_json::Value> {
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    let events = env.events(&job);
    events
        .into_iter()
        .find(|e| e["type"] == "attempt.limits")
        .map(|e| e["data"]["limits"].as_array().unwrap().clone())
        .unwrap_or_default()
}

fn fork_bomb_is_contained(who: As) {
    if !who.available() {
        return;
    }
    let env = Env::new(who);
    let start = Instant::now();
    // The bomb fills the sandbox's process budget; the main process then exits
    // and init takes every bomb process with it.
    let out = env.pvisor(&["run", "--pids", "32", "--", "sh", "-c", "f() { f | f & }; f & exec sleep 2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(start.elapsed() < Duration::from_secs(30));
    let limits = limit_events(&env);
    assert!(limits.iter().any(|l| l["limit"] == "pids" && l["value"] == "32"), "{limits:?}");
    // Nothing of the bomb is left running.
    assert!(wait_until(Duration::from_secs(5), || {
        std::process::Command::new("pgrep")
            .args(["-c", "-f", "f\\(\\) \\{ f \\| f"])
            .output()
            .map(|o| text(&o.stdout).trim() == "0")
            .unwrap_or(true)
    }));
}

#[test]
fn a_fork_bomb_under_pids_is_contained_as_root() {
    fork_bomb_is_contained(As::Root);
}

#[test]
fn a_fork_bomb_under_pids_is_contained_rootless() {
    fork_bomb_is_contained(As::Rootless);
}

#[test]
fn memory_exhaustion_is_stopped_and_the_result_says_so() {
    if !As::Root.available() {
        return;
    }
    let env = Env::new(As::Root);
    let out = env.pvisor(&[
        "run",
        "--memory",
        "64M",
        "--",
        "/usr/bin/python3",
        "-c",
        "x = bytearray(400 * 1024 * 1024); print('survived')",
    ]);
    assert!(!text(&out.stdout).contains("survived"));
    let status = env.status_json(None);
    assert_eq!(status["state"], "failed", "{status}");
    let limits = limit_events(&env);
    let memory = limits.iter().find(|l| l["limit"] == "memory").unwrap();
    if memory["by"].as_str().unwrap().starts_with("cgroup") {
        assert_eq!(status["signal"], 9, "{status}");
        assert!(status["error"].as_str().unwrap().contains("OOM killer"), "{status}");
    }
}

#[test]
fn limits_that_cannot_be_enforced_are_reported_not_pretended() {
    let env = Env::new(As::Rootless);
    let out = env.pvisor(&[
        "run",
        "--memory",
        "64M",
        "--cpus",
        "0.5",
        "--",
        "/usr/bin/python3",
        "-c",
        "x = bytearray(400 * 1024 * 1024)",
    ]);
    assert_ne!(out.status.code(), Some(0), "the allocation must fail");
    let limits = limit_events(&env);
    assert_eq!(limits.len(), 2, "{limits:?}");
    for l in &limits {
        let by = l["by"].as_str().unwrap();
        assert!(
            by.starts_with("cgroup") || by.starts_with("rlimit") || by.starts_with("not enforced"),
            "{by}"
        );
    }
    let cpus = limits.iter().find(|l| l["limit"] == "cpus").unwrap();
    if cpus["by"].as_str().unwrap().starts_with("not enforced") {
        assert!(text(&out.stderr).contains("--cpus 0.5 is not enforced"), "{}", text(&out.stderr));
    }
}
