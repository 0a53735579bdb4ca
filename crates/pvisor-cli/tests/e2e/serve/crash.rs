//! Crashes and endings: a daemon killed mid-operation, a client that goes
//! away, an expired sandbox, SIGTERM, and a VM or supervisor that ends on
//! its own; after each, the state reported is what is really true.

use super::*;

#[test]
fn a_daemon_killed_during_create_finds_the_sandbox_running_after_restart() {
    let mut daemon = Daemon::new();
    let id = daemon.create(json!({}));
    // Killed once the supervisor is starting the VM (well before it is ready).
    let record = daemon.env.home.join(format!("server/sandboxes/{id}.json"));
    let spawned = || {
        fs::read(&record)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .is_some_and(|r| r["supervisor"].is_u64())
    };
    assert!(wait_until(Duration::from_secs(10), spawned));
    daemon.kill9();
    assert_eq!(daemon.curl("GET", "/health", None).0, 0, "the daemon is down");
    daemon.start();
    // Pending (booting, or being reattached) and then Running; never Failed.
    daemon.wait_state(&id, "Running", &["Pending"]);
    assert!(daemon.run(&id, "echo alive").contains(r#""text":"alive""#));
    assert_eq!(daemon.jobs().len(), 1, "the restart must not start a second VM");
    // The entrypoint was started exactly once.
    let record: Value = serde_json::from_slice(
        &fs::read(daemon.env.home.join(format!("server/sandboxes/{id}.json"))).unwrap(),
    )
    .unwrap();
    assert!(record["commands"]["entrypoint"].is_object(), "{record}");
}

#[test]
fn a_daemon_killed_during_pause_reports_paused_only_once_it_is() {
    let mut daemon = Daemon::new();
    let id = daemon.create(json!({}));
    daemon.wait_state(&id, "Running", &["Pending"]);
    daemon.run(&id, "echo before > /root/mark");
    let (code, body) = daemon.curl("POST", &format!("/v1/sandboxes/{id}/pause"), None);
    assert_eq!(code, 202, "{body}");
    daemon.kill9();
    daemon.start();
    // The supervisor finished the suspend on its own; the state says so only
    // once the termination receipt made the Job suspended.
    daemon.wait_state(&id, "Paused", &["Pausing", "Running"]);
    let status = daemon.env.pvisor(&["status", "--json"]);
    assert!(text(&status.stdout).contains("\"suspended\""), "{}", text(&status.stdout));
    assert_eq!(daemon.curl("POST", &format!("/v1/sandboxes/{id}/resume"), None).0, 202);
    daemon.wait_state(&id, "Running", &["Resuming", "Paused"]);
    assert!(daemon.run(&id, "cat /root/mark").contains(r#""text":"before""#));
}

#[test]
fn a_daemon_killed_during_a_streamed_command_reports_it_honestly() {
    let mut daemon = Daemon::new();
    let id = daemon.create(json!({}));
    daemon.wait_state(&id, "Running", &["Pending"]);
    let (base, token) = daemon.execd(&id);
    let mut stream = Command::new("curl")
        .args(["-sN", "-H", &token, "-H", "content-type: application/json", "--data-binary"])
        .arg(json!({ "command": "echo started; sleep 3; echo finished > /tmp/done" }).to_string())
        .arg(format!("{base}/command"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = String::new();
    let mut out = stream.stdout.take().unwrap();
    while !seen.contains("started") {
        let mut buf = [0u8; 4096];
        let n = std::io::Read::read(&mut out, &mut buf).unwrap();
        assert!(n > 0, "the stream ended early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let cmd = seen.split("\"text\":\"").nth(1).unwrap().split('"').next().unwrap().to_owned();
    daemon.kill9();
    let _ = stream.wait();
    daemon.start();
    daemon.wait_state(&id, "Running", &["Pending"]);
    // The command kept running in the guest; its status comes from the guest.
    assert!(
        wait_until(Duration::from_secs(30), || daemon.command_status(&id, &cmd)["running"] == false),
        "{}",
        daemon.command_status(&id, &cmd)
    );
    let status = daemon.command_status(&id, &cmd);
    assert_eq!(status["exit_code"], 0, "{status}");
    assert!(daemon.run(&id, "cat /tmp/done").contains("finished"));
}

#[test]
fn a_client_that_disconnects_cancels_its_command() {
    let daemon = Daemon::new();
    let id = daemon.create(json!({}));
    daemon.wait_state(&id, "Running", &["Pending"]);
    let (base, token) = daemon.execd(&id);
    let mut stream = Command::new("curl")
        .args(["-sN", "--max-time", "120", "-H", &token, "-H", "content-type: application/json"])
        .arg("--data-binary")
        .arg(json!({ "command": "echo go; sleep 20; touch /tmp/never" }).to_string())
        .arg(format!("{base}/command"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Once the command runs (not after a fixed time, which a slow guest's
    // start can outlast), the client goes away.
    let mut seen = String::new();
    let mut out = stream.stdout.take().unwrap();
    while !seen.contains("go") {
        let mut buf = [0u8; 4096];
        let n = std::io::Read::read(&mut out, &mut buf).unwrap();
        assert!(n > 0, "the stream ended early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let _ = stream.kill();
    let _ = stream.wait();
    let cmd = seen.split("\"text\":\"").nth(1).unwrap().split('"').next().unwrap().to_owned();
    assert!(
        wait_until(Duration::from_secs(15), || daemon.command_status(&id, &cmd)["running"] == false),
        "the command outlived its client: {}",
        daemon.command_status(&id, &cmd)
    );
    let status = daemon.command_status(&id, &cmd);
    assert_eq!(status["exit_code"], 128 + libc::SIGTERM, "{status}");
    std::thread::sleep(Duration::from_secs(1));
    assert!(daemon.run(&id, "ls /tmp/never 2>&1; true").contains("No such file"));
}

#[test]
fn an_expired_sandbox_is_killed_even_across_a_restart() {
    let mut daemon = Daemon::new();
    let id = daemon.create(json!({ "timeout": 60 }));
    daemon.wait_state(&id, "Running", &["Pending"]);
    daemon.kill9();
    daemon.start();
    let started = Instant::now();
    let ended = daemon.wait_record(&id, "Terminated");
    assert_eq!(ended["reason"], "ttl_expiry", "{ended}");
    // Expired is deleted: gone from the API, as the reference's
    // `_expire_sandbox` removes the container.
    assert_eq!(daemon.curl("GET", &format!("/v1/sandboxes/{id}"), None).0, 404);
    let expires = ended["expires_at"].as_str().unwrap_or_default().to_owned();
    assert!(started.elapsed() < Duration::from_secs(75), "expired late ({expires})");
    let jobs = daemon.jobs();
    assert!(jobs.iter().all(|j| j["state"] != "running"), "{jobs:?}");
}

#[test]
fn sigterm_pauses_running_sandboxes_and_they_resume_after_restart() {
    let mut daemon = Daemon::new();
    let id = daemon.create(json!({}));
    daemon.wait_state(&id, "Running", &["Pending"]);
    daemon.run(
        &id,
        "echo kept > /root/file; (while true; do date +%s%N > /tmp/beat; sleep 0.2; done) > /dev/null 2>&1 &",
    );
    let mut child = daemon.child.take().unwrap();
    send_signal(child.id(), rustix::process::Signal::TERM).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}: {}", daemon.log());
    daemon.start();
    assert_eq!(daemon.state(&id)["status"]["state"], "Paused", "{}", daemon.log());
    assert_eq!(daemon.curl("POST", &format!("/v1/sandboxes/{id}/resume"), None).0, 202);
    daemon.wait_state(&id, "Running", &["Resuming", "Paused"]);
    assert!(daemon.run(&id, "cat /root/file").contains("kept"));
    let beat = |d: &Daemon| d.run(&id, "cat /tmp/beat");
    let first = beat(&daemon);
    std::thread::sleep(Duration::from_millis(800));
    assert_ne!(first, beat(&daemon), "the background loop did not survive pause and resume");
}

#[test]
fn a_vm_that_ends_on_its_own_is_not_reported_running() {
    let daemon = Daemon::new();
    let id = daemon.create(json!({}));
    daemon.wait_state(&id, "Running", &["Pending"]);
    // Root in the guest can kill every process but PID 1, the Job's keeper included.
    daemon.run(&id, "kill -9 -1");
    // Whichever the daemon sees first ends it, both as Failed: the keeper's
    // death (the VM ended) or the entrypoint's (killed: 128 + 9, as docker
    // reports a container whose main process was killed).
    let ended = daemon.wait_state(&id, "Failed", &["Running", "Stopping"]);
    let (reason, message) = (&ended["status"]["reason"], ended["status"]["message"].as_str().unwrap());
    let truthful = (reason == "runtime_exited" && message.contains("keeper"))
        || (reason == "CONTAINER_EXITED_ERROR" && message == "Sandbox container exited with code 137.");
    assert!(truthful, "{ended}");
    let (code, _) = daemon.curl("POST", &format!("/v1/sandboxes/{id}/pause"), None);
    assert_eq!(code, 409);
    assert_closed_and_freed(&daemon, &id);
}

/// The VM disk images left anywhere in the daemon's state directory.
fn vm_disks(daemon: &Daemon) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for run in fs::read_dir(daemon.env.home.join("runs")).into_iter().flatten().flatten() {
        for attempt in fs::read_dir(run.path().join("attempts")).into_iter().flatten().flatten() {
            for image in ["lower.img", "delta.img", "upper.img"] {
                let path = attempt.path().join("vm").join(image);
                if path.exists() {
                    found.push(path);
                }
            }
        }
    }
    found
}

/// A Failed sandbox: its Job is closed, its disks are freed, and DELETE
/// answers 204 (the reference server deletes a failed sandbox's container).
fn assert_closed_and_freed(daemon: &Daemon, id: &str) {
    assert!(
        wait_until(Duration::from_secs(60), || vm_disks(daemon).is_empty()),
        "VM disks left behind: {:?}",
        vm_disks(daemon)
    );
    let jobs = daemon.jobs();
    assert!(jobs.iter().all(|j| j["live"] == false && j["state"] != "running"), "{jobs:?}");
    let (code, _) = daemon.curl("DELETE", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(code, 204);
}

#[test]
fn a_killed_sandbox_supervisor_is_closed_and_its_disks_freed() {
    let daemon = Daemon::new();
    let id = daemon.create(json!({}));
    daemon.wait_state(&id, "Running", &["Pending"]);
    assert!(!vm_disks(&daemon).is_empty(), "a running VM has its disks");
    let record: Value = serde_json::from_slice(
        &fs::read(daemon.env.home.join("server/sandboxes").join(format!("{id}.json"))).unwrap(),
    )
    .unwrap();
    let pid = record["supervisor"].as_u64().expect("the supervisor's pid is recorded") as u32;
    // The sandbox's supervisor, a child process of this test's daemon.
    send_signal(pid, rustix::process::Signal::KILL).unwrap();
    let ended = daemon.wait_state(&id, "Failed", &["Running"]);
    assert_eq!(ended["status"]["reason"], "runtime_exited", "{ended}");
    assert_closed_and_freed(&daemon, &id);
}

/// A record deleted or damaged while the daemon was down no longer leaves
/// its VM running out of everyone's reach: the restarted daemon finds the
/// Job by its sandbox label, logs it and stops it. Then, with the daemon
/// down, `pvisor gc` prunes the records of sandboxes that ended (and keeps
/// them while a daemon runs, which prunes its own).
#[test]
fn a_lost_record_does_not_leave_its_vm_running_and_gc_prunes_ended_records() {
    let mut daemon = Daemon::new();
    let (deleted, damaged, ended) =
        (daemon.create(json!({})), daemon.create(json!({})), daemon.create(json!({})));
    for id in [&deleted, &damaged, &ended] {
        daemon.wait_state(id, "Running", &["Pending"]);
    }
    assert_eq!(daemon.curl("DELETE", &format!("/v1/sandboxes/{ended}"), None).0, 204);
    daemon.wait_record(&ended, "Terminated");
    let live = |daemon: &Daemon| daemon.jobs().into_iter().filter(|j| j["live"] == true).count();
    assert_eq!(live(&daemon), 2);
    daemon.kill9();
    let records = daemon.env.home.join("server/sandboxes");
    fs::remove_file(records.join(format!("{deleted}.json"))).unwrap();
    fs::write(records.join(format!("{damaged}.json")), b"{ not json").unwrap();
    daemon.start();
    assert!(
        wait_until(Duration::from_secs(60), || live(&daemon) == 0),
        "the orphaned VMs were stopped: {:?}\n{}",
        daemon.jobs(),
        daemon.log()
    );
    for id in [&deleted, &damaged] {
        assert!(
            daemon.log().contains(&format!("sandbox={id}")),
            "stopping {id} was logged:\n{}",
            daemon.log()
        );
    }
    // A running daemon owns its records: gc keeps them and says why.
    let out = daemon.env.pvisor(&["gc", "--older-than", "0s", "--json"]);
    assert!(text(&out.stdout).contains("a pvisor serve daemon is running"), "{}", text(&out.stdout));
    assert!(records.join(format!("{ended}.json")).exists());
    daemon.kill9();
    let out = daemon.env.pvisor(&["gc", "--older-than", "0s", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&format!("sandbox record {ended}")), "{}", text(&out.stdout));
    for ext in ["json", "log", "bind"] {
        assert!(!records.join(format!("{ended}.{ext}")).exists(), "{ended}.{ext} was pruned");
    }
    assert!(records.join(format!("{damaged}.json")).exists(), "an unreadable record is kept and named");
    assert!(text(&out.stdout).contains(&format!("sandbox record {damaged}")), "{}", text(&out.stdout));
}
