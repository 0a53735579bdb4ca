//! Resource limits: enforced where the host allows, and reported honestly.

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
    // The two asked for, and the default process limit every ns run gets.
    assert_eq!(limits.len(), 3, "{limits:?}");
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
