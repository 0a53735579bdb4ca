//! Cancellation and supervisor death.

use std::process::Stdio;
use std::time::Duration;

use crate::support::*;
use rustix::process::Signal;

/// Starts `sleep MARKER` in a sandbox and waits until the run is live.
fn start_sleeper(env: &Env, marker: &str, extra: &[&str]) -> std::process::Child {
    let mut args = vec!["run"];
    args.extend_from_slice(extra);
    let script = format!("sleep {marker}; echo not-reached");
    args.extend_from_slice(&["--", "sh", "-c", &script]);
    let child = env.command(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || !sleepers(marker).is_empty()),
        "the sandboxed sleep never started"
    );
    child
}

fn sigint_cancels_with_a_receipt_and_no_survivors(who: As, marker: &str) {
    who.require();
    let env = Env::new(who);
    let child = start_sleeper(&env, marker, &[]);
    send_signal(child.id(), Signal::INT).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "stderr: {}", text(&out.stderr));
    assert!(!text(&out.stdout).contains("not-reached"));
    assert!(sleepers(marker).is_empty(), "survivors");

    let status = env.status_json(None);
    assert_eq!(status["state"], "cancelled");
    assert_eq!(status["receipt"], "valid");
    assert_eq!(status["signal"], 2);
    let kinds: Vec<String> = env
        .events(status["job"].as_str().unwrap())
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect();
    assert!(kinds.contains(&"run.cancel_requested".to_owned()), "{kinds:?}");
    assert_eq!(kinds.last().unwrap(), "run.cancelled");
}

#[test]
fn sigint_cancels_with_a_receipt_and_no_survivors_as_root() {
    sigint_cancels_with_a_receipt_and_no_survivors(As::Root, "4101.5");
}

#[test]
fn sigint_cancels_with_a_receipt_and_no_survivors_rootless() {
    sigint_cancels_with_a_receipt_and_no_survivors(As::Rootless, "4102.5");
}

#[test]
fn a_command_that_ignores_the_signal_is_killed_after_the_grace_period() {
    let env = Env::new(As::Rootless);
    let marker = "4103.5";
    let script = format!("trap '' TERM INT; sleep {marker}; sleep {marker}");
    let child = env
        .command(&["run", "--kill-grace", "300ms", "--", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || !sleepers(marker).is_empty()));
    send_signal(child.id(), Signal::TERM).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + 9), "stderr: {}", text(&out.stderr));
    let status = env.status_json(None);
    assert_eq!(status["state"], "cancelled");
    let kinds: Vec<String> = env
        .events(status["job"].as_str().unwrap())
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect();
    assert!(kinds.contains(&"run.kill_escalated".to_owned()), "{kinds:?}");
    assert!(sleepers(marker).is_empty());
}

#[test]
fn a_killed_supervisor_takes_the_sandbox_with_it_and_the_result_is_unknown() {
    let env = Env::new(As::Rootless);
    let marker = "4104.5";
    let mut child = start_sleeper(&env, marker, &[]);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || sleepers(marker).is_empty()),
        "survivors: {:?}",
        sleepers(marker)
    );
    let status = env.status_json(None);
    assert_eq!(status["state"], "unknown", "{status}");
    assert_eq!(status["receipt"], "missing");
    assert_eq!(status["live"], false);
    let stage = std::path::Path::new(status["stage"].as_str().unwrap());
    assert!(stage.join("upper").is_dir(), "the stage must be kept");
}
