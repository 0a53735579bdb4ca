//! Recovery and failure semantics, proven by killing the real process.
//!
//! Every finalization crash point (`PVISOR_FAILPOINT`, honoured by debug
//! builds) is hit with a real SIGKILL, then `status`, `review`, `apply` and
//! `drop` must give the answer docs/failure-semantics.md documents.

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::time::Duration;

use crate::support::*;

/// Runs a command that stages `n` and modifies `tracked`, killing pvisor at `point`.
fn crash_at(point: &str) -> Env {
    let env = Env::new(As::Rootless);
    env.write("tracked", "t\n");
    std::thread::sleep(Duration::from_millis(25));
    let out = env
        .command(&["run", "--", "sh", "-c", "echo new > n; echo more >> tracked; exit 4"])
        .env("PVISOR_FAILPOINT", point)
        .output()
        .unwrap();
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{point}: pvisor was not killed there: {out:?}");
    env
}

fn attempt_dir(env: &Env) -> PathBuf {
    let runs: Vec<_> = fs::read_dir(env.home.join("runs")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(runs.len(), 1);
    runs[0].join("attempts/1")
}

fn event_kinds(env: &Env) -> Vec<String> {
    env.events(&only_job(env)).iter().map(|e| e["type"].as_str().unwrap().to_owned()).collect()
}

/// Before the receipt: nothing confirms a result.
fn unconfirmed_after(point: &str) {
    let env = crash_at(point);
    let status = env.status_json(None);
    assert_eq!(status["state"], "unknown", "{point}: {status}");
    assert_eq!(status["receipt"], "missing");
    assert!(status["exit_code"].is_null(), "{point}: an unconfirmed exit code leaked: {status}");
    let review = env.expect(&["review"], 0);
    assert!(review.contains("no confirmed result"), "{point}: {review}");
    assert!(
        review.contains(" n\n") && review.contains("tracked"),
        "{point}: staged files are listed: {review}"
    );
    for cmd in [&["apply", "--all"][..], &["drop"][..]] {
        let out = env.pvisor(cmd);
        assert_eq!(out.status.code(), Some(125), "{point} {cmd:?}");
        assert!(text(&out.stderr).contains("no confirmed result"), "{point}: {}", text(&out.stderr));
    }
    assert!(!env.ws.join("n").exists());
    let job: serde_json::Value = serde_json::from_slice(
        &fs::read(env.home.join("jobs").join(only_job(&env)).join("job.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(job["state"], "unknown", "recovery records the unknown state");
    assert_eq!(event_kinds(&env).iter().filter(|k| *k == "recovery.unknown").count(), 1);
    // The documented way out: kill closes it as lost, never as success.
    let killed = env.expect(&["kill"], 0);
    assert!(killed.contains("closed as lost"), "{killed}");
    assert_eq!(env.status_json(None)["state"], "lost");
    // A lost Job is never applied, and the error says what can be done
    // instead; drop and gc then free it (it was once a dead end).
    let refused = env.pvisor(&["apply", "--all"]);
    assert_eq!(refused.status.code(), Some(125));
    let says = text(&refused.stderr);
    assert!(
        says.contains("closed as lost")
            && says.contains("pvisor drop")
            && !says.contains("closes it as lost"),
        "{says}"
    );
    assert!(!env.ws.join("n").exists());
    // Its stage can be salvaged: export keeps it, marked unconfirmed; verify
    // and import refuse to treat it as a Bundle, and tar unpacks it.
    let exported = env.expect(&["export"], 0);
    assert!(exported.contains("unconfirmed stage"), "{point}: {exported}");
    let tar = fs::read_dir(env.home.join("exports")).unwrap().next().unwrap().unwrap().path();
    let verified = env.pvisor(&["verify", tar.to_str().unwrap()]);
    assert_eq!(verified.status.code(), Some(1), "{point}: an unconfirmed stage never verifies as a Bundle");
    assert!(text(&verified.stdout).contains("no receipt"), "{}", text(&verified.stdout));
    let other = Env::new(As::Rootless);
    let imported = other.pvisor(&["import", tar.to_str().unwrap()]);
    assert_eq!(imported.status.code(), Some(125), "{point}: imported an unconfirmed stage");
    let unpack = env.dir.path().join("unpacked");
    fs::create_dir(&unpack).unwrap();
    let untar =
        std::process::Command::new("tar").arg("-xf").arg(&tar).arg("-C").arg(&unpack).status().unwrap();
    assert!(untar.success());
    assert_eq!(fs::read_to_string(unpack.join("pvisor-bundle/stage/files/n")).unwrap(), "new\n");
    env.expect(&["drop"], 0);
    let review = env.expect(&["review"], 0);
    assert!(review.contains("dropped") && !review.contains("pending"), "{point}: {review}");
    assert_eq!(
        fs::read_to_string(env.ws.join("tracked")).unwrap(),
        "t\n",
        "drop writes nothing to the workspace"
    );
    let gc = env.expect(&["gc", "--older-than", "0s"], 0);
    assert!(gc.contains("freed"), "{gc}");
    assert!(
        !attempt_dir(&env).parent().unwrap().parent().unwrap().join("stage/upper").exists(),
        "{point}: {gc}"
    );
}

/// After the receipt: the result is confirmed even though finalization stopped.
fn confirmed_after(point: &str) {
    let env = crash_at(point);
    let status = env.status_json(None);
    assert_eq!(status["state"], "failed", "{point}: {status}");
    assert_eq!(status["exit_code"], 4);
    assert_eq!(status["receipt"], "valid");
    let gaps = status["audit_gaps"].as_array().unwrap();
    assert!(
        gaps.iter().any(|g| g.as_str().unwrap().contains("terminal event run.failed missing")),
        "{point}: {status}"
    );
    let human = env.expect(&["status"], 0);
    assert!(human.contains("receipt valid, terminal event run.failed missing"), "{human}");
    let review = env.expect(&["review"], 0);
    assert!(review.contains("pending") && !review.contains("no confirmed result"), "{point}: {review}");
    env.expect(&["apply", "n"], 0);
    assert_eq!(fs::read_to_string(env.ws.join("n")).unwrap(), "new\n");
    env.expect(&["drop"], 0);
    assert_eq!(fs::read_to_string(env.ws.join("tracked")).unwrap(), "t\n");
    let job: serde_json::Value = serde_json::from_slice(
        &fs::read(env.home.join("jobs").join(only_job(&env)).join("job.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(job["state"], "failed", "recovery reconciled the Job from the receipt");
    let attempt: serde_json::Value =
        serde_json::from_slice(&fs::read(attempt_dir(&env).join("attempt.json")).unwrap()).unwrap();
    assert_eq!(attempt["state"], "failed");
    assert!(!event_kinds(&env).contains(&"run.failed".to_owned()), "no terminal event is invented");
}

#[test]
fn crash_after_the_stage_is_sealed() {
    unconfirmed_after("after-seal");
}

#[test]
fn crash_after_the_bundle_is_saved() {
    unconfirmed_after("after-bundle");
}

#[test]
fn crash_after_run_json_claims_a_result() {
    unconfirmed_after("after-run-json");
}

#[test]
fn crash_after_the_receipt_commits() {
    confirmed_after("after-receipt");
}

#[test]
fn crash_before_the_terminal_event() {
    confirmed_after("before-terminal-event");
}

/// A power cut before the stage directory existed (a `vm` run makes it at
/// its export): the Job closes as lost, and `drop` and `gc` still free it,
/// as root and rootless.
#[test]
fn drop_and_gc_free_a_job_whose_stage_directory_never_existed() {
    for who in [As::Rootless, As::Root] {
        let env = Env::new(who);
        let out = env
            .command(&["run", "--", "sh", "-c", "echo new > n"])
            .env("PVISOR_FAILPOINT", "after-seal")
            .output()
            .unwrap();
        assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{who:?}: pvisor was not killed: {out:?}");
        let stage = attempt_dir(&env).parent().unwrap().parent().unwrap().join("stage");
        fs::remove_dir_all(&stage).unwrap();
        let killed = env.expect(&["kill"], 0);
        assert!(killed.contains("closed as lost"), "{who:?}: {killed}");
        let dropped = env.expect(&["drop"], 0);
        assert!(dropped.contains("0 change(s) dropped"), "{who:?}: {dropped}");
        env.expect(&["gc", "--older-than", "0s"], 0);
        assert!(!stage.join("upper").exists() && !env.ws.join("n").exists(), "{who:?}");
    }
}

// ---- the corruption corpus: each is an error naming the file, and nothing is rewritten ----

fn finished_run(env: &Env, script: &str) -> PathBuf {
    assert!(env.run_sh(script).status.code().is_some());
    let status = env.status_json(None);
    env.attempt_dir(&status)
}

fn assert_refused(env: &Env, file: &std::path::Path, needle: &str) {
    let before: Vec<(PathBuf, Vec<u8>)> = fs::read_dir(file.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| (p.clone(), fs::read(&p).unwrap()))
        .collect();
    for cmd in [&["status"][..], &["review"][..], &["apply", "--all"][..], &["drop"][..]] {
        let out = env.pvisor(cmd);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{cmd:?}: {stderr}");
        assert!(stderr.contains(needle), "{cmd:?}: expected {needle:?} in {stderr}");
    }
    for (path, bytes) in before {
        assert_eq!(fs::read(&path).unwrap(), bytes, "{} was rewritten", path.display());
    }
    assert!(!env.ws.join("f").exists(), "nothing applied");
}

#[test]
fn corrupt_a_truncated_receipt() {
    let env = Env::new(As::Rootless);
    let attempt = finished_run(&env, "echo x > f");
    let receipt = attempt.join("completion.json");
    let bytes = fs::read(&receipt).unwrap();
    fs::write(&receipt, &bytes[..bytes.len() / 2]).unwrap();
    assert_refused(&env, &receipt, "completion.json is corrupt");
}

#[test]
fn corrupt_one_flipped_bit_in_the_bundle() {
    let env = Env::new(As::Rootless);
    let attempt = finished_run(&env, "echo x > f");
    let bundle = attempt.join("bundle.json");
    let mut bytes = fs::read(&bundle).unwrap();
    let i = bytes.iter().position(|&b| b == b'x').unwrap_or(10);
    bytes[i] ^= 0x01;
    fs::write(&bundle, &bytes).unwrap();
    assert_refused(&env, &bundle, "does not match its receipt");
}

#[test]
fn corrupt_receipts_swapped_between_two_runs() {
    let env = Env::new(As::Rootless);
    let first = finished_run(&env, "echo x > f");
    let second = finished_run(&env, "echo y > f");
    let (a, b) =
        (fs::read(first.join("completion.json")).unwrap(), fs::read(second.join("completion.json")).unwrap());
    fs::write(first.join("completion.json"), &b).unwrap();
    fs::write(second.join("completion.json"), &a).unwrap();
    assert_refused(&env, &second.join("completion.json"), "but belongs to");
}

#[test]
fn corrupt_a_deleted_bundle() {
    let env = Env::new(As::Rootless);
    let attempt = finished_run(&env, "echo x > f");
    fs::remove_file(attempt.join("bundle.json")).unwrap();
    assert_refused(&env, &attempt.join("completion.json"), "is missing");
}

#[test]
fn corrupt_a_receipt_naming_another_attempt() {
    let env = Env::new(As::Rootless);
    let attempt = finished_run(&env, "echo x > f");
    let path = attempt.join("completion.json");
    let text = fs::read_to_string(&path).unwrap();
    let mut receipt: serde_json::Value = serde_json::from_str(&text).unwrap();
    let other = format!("{}.2", receipt["run"].as_str().unwrap());
    receipt["attempt"] = other.into();
    fs::write(&path, serde_json::to_vec_pretty(&receipt).unwrap()).unwrap();
    assert_refused(&env, &path, "but belongs to");
}

#[test]
fn corrupt_run_json_claiming_success_without_a_receipt() {
    let env = Env::new(As::Rootless);
    let marker = "4106.5";
    let mut child =
        env.command(&["run", "--", "sh", "-c", &format!("echo x > f; sleep {marker}")]).spawn().unwrap();
    assert!(wait_until(Duration::from_secs(10), || !sleepers(marker).is_empty()));
    child.kill().unwrap();
    child.wait().unwrap();
    let run_dir = attempt_dir(&env).parent().unwrap().parent().unwrap().to_owned();
    let mut run: serde_json::Value =
        serde_json::from_slice(&fs::read(run_dir.join("run.json")).unwrap()).unwrap();
    let now = run["created_at"].clone();
    run["state"] = "completed".into();
    run["result"] = serde_json::json!({"state": "completed", "exit_code": 0, "signal": null, "started_at": now, "finished_at": now, "error": null});
    fs::write(run_dir.join("run.json"), serde_json::to_vec_pretty(&run).unwrap()).unwrap();
    let status = env.status_json(None);
    assert_eq!(status["state"], "unknown", "a terminal field alone confirms nothing: {status}");
    assert!(status["exit_code"].is_null());
    assert_eq!(env.pvisor(&["apply", "--all"]).status.code(), Some(125));
    let listed = env.expect(&["jobs", "--json"], 0);
    assert!(!listed.contains("\"state\":\"completed\""), "{listed}");
}

// ---- concurrency ----

#[test]
fn concurrent_readers_recover_once_and_corrupt_nothing() {
    let env = crash_at("after-bundle");
    let children: Vec<_> = (0..8)
        .map(|i| {
            env.command(if i % 2 == 0 { &["status", "--json"] } else { &["jobs", "--json"] }).output_spawn()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(text(&out.stdout).contains("\"state\":\"unknown\""), "{}", text(&out.stdout));
    }
    let kinds = event_kinds(&env);
    assert_eq!(kinds.iter().filter(|k| *k == "recovery.unknown").count(), 1, "both reconciled: {kinds:?}");
    let job: serde_json::Value = serde_json::from_slice(
        &fs::read(env.home.join("jobs").join(only_job(&env)).join("job.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(job["state"], "unknown");
}

trait SpawnPiped {
    fn output_spawn(&mut self) -> std::process::Child;
}

impl SpawnPiped for std::process::Command {
    fn output_spawn(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap()
    }
}

// ---- kill ----

#[test]
fn kill_stops_a_live_run_which_still_publishes_its_receipt() {
    let env = Env::new(As::Rootless);
    let marker = "4107.5";
    let child = env
        .command(&["run", "--", "sh", "-c", &format!("echo x > f; sleep {marker}")])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || !sleepers(marker).is_empty()));
    let killed = env.expect(&["kill", "--grace", "10s"], 0);
    assert!(killed.contains("stopped its supervisor"), "{killed}");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(143), "{}", text(&out.stderr));
    assert!(sleepers(marker).is_empty());
    let status = env.status_json(None);
    assert_eq!(status["state"], "cancelled");
    assert_eq!(status["receipt"], "valid");
    let job: serde_json::Value = serde_json::from_slice(
        &fs::read(env.home.join("jobs").join(only_job(&env)).join("job.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(job["continuation"], false);
    assert!(event_kinds(&env).contains(&"job.continuation_withdrawn".to_owned()));
    // The stage is still there to review and apply.
    env.expect(&["apply", "f"], 0);
}

#[test]
fn kill_of_an_ended_job_changes_nothing() {
    let env = Env::new(As::Rootless);
    assert!(env.run_sh("exit 0").status.success());
    let out = env.expect(&["kill"], 0);
    assert!(out.contains("already ended"), "{out}");
    assert_eq!(env.status_json(None)["state"], "completed");
}

/// Readers racing the end of many runs never recover a Job that finished
/// normally: the owner keeps its lock until `job.json` is published, so no
/// reader finds the lock free while the Job still looks unfinished.
#[test]
fn readers_racing_finishing_runs_never_reconcile_them() {
    let env = Env::new(As::Rootless);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = [&["status"][..], &["jobs"][..], &["review"][..]]
        .into_iter()
        .map(|args| {
            let (stop, mut cmd) = (stop.clone(), env.command(args));
            cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
            std::thread::spawn(move || {
                let mut reads = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = cmd.status();
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let runs = 40;
    for i in 0..runs {
        env.expect(&["run", "-q", "--", "sh", "-c", &format!("echo {i} > f{i}")], 0);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads: u32 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(reads > runs, "the readers raced the runs ({reads} reads)");
    let traces: Vec<_> = fs::read_dir(env.home.join("runs")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(traces.len(), runs as usize);
    let reconciled: Vec<_> = traces
        .iter()
        .filter(|run| fs::read_to_string(run.join("events.jsonl")).unwrap().contains("recovery.reconciled"))
        .collect();
    assert!(reconciled.is_empty(), "{} of {runs} Traces: {reconciled:?}", reconciled.len());
}
