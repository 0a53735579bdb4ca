//! The records tell the truth under concurrency, crashes and full disks:
//! one writer per Trace, one apply per workspace, a ledger that
//! never calls an applied file dropped, Jobs that appear whole, records bound
//! to the receipt, and commands that recover a full state directory.
//!
//! Every test drives real `pvisor` processes, many trials each, and asserts
//! the failure did not happen (no lost update, no duplicate seq, no write),
//! not merely that something was recorded. Damaged and redirected records
//! are in `damage`.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

mod damage;

fn job_ids(env: &Env) -> Vec<String> {
    let mut ids: Vec<String> = fs::read_dir(env.home.join("jobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("job-"))
        .collect();
    ids.sort();
    ids
}

fn run_dir(env: &Env, job: &str) -> PathBuf {
    let status = env.status_json(Some(job));
    env.home.join("runs").join(status["run"].as_str().unwrap())
}

/// Every path's final ledger action.
fn ledger(env: &Env, job: &str) -> BTreeMap<String, String> {
    let path = run_dir(env, job).join("stage/ledger.jsonl");
    let mut out = BTreeMap::new();
    for line in fs::read_to_string(path).unwrap_or_default().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        out.insert(v["path"].as_str().unwrap().to_owned(), v["action"].as_str().unwrap().to_owned());
    }
    out
}

/// Starts `apply JOB --all` for every Job at once; returns their exit codes.
fn apply_all_at_once(env: &Env, jobs: &[String]) -> Vec<Option<i32>> {
    let children: Vec<_> = jobs
        .iter()
        .map(|job| {
            env.command(&["apply", job, "--all"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children.into_iter().map(|c| c.wait_with_output().unwrap().status.code()).collect()
}

/// Asserts `job`'s Trace is numbered 1, 2, 3, … with no gap or repeat.
fn assert_trace_in_order(env: &Env, job: &str) {
    let seqs: Vec<u64> = env.events(job).iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "{job}: Trace out of order");
}

fn concurrent_applies_never_both_win(who: As) {
    who.require();
    const TRIALS: usize = 12;
    let mut failures = Vec::new();
    for trial in 0..TRIALS {
        let env = Env::new(who);
        env.write("shared", "base\n");
        assert_eq!(env.run_sh("echo from-a > shared").status.code(), Some(0));
        assert_eq!(env.run_sh("echo from-b > shared").status.code(), Some(0));
        let jobs = job_ids(&env);
        let codes = apply_all_at_once(&env, &jobs);
        let content = fs::read_to_string(env.ws.join("shared")).unwrap();
        let winners: Vec<usize> = (0..2).filter(|&i| codes[i] == Some(0)).collect();
        let [winner] = winners[..] else {
            failures.push(format!("trial {trial}: exit codes {codes:?}, file {content:?} (lost update)"));
            continue;
        };
        let loser = 1 - winner;
        let expected = if winner == 0 { "from-a\n" } else { "from-b\n" };
        let loser_ledger = ledger(&env, &jobs[loser]).get("shared").cloned();
        if codes[loser] != Some(1) || content != expected || loser_ledger.as_deref() == Some("applied") {
            failures.push(format!(
                "trial {trial}: codes {codes:?}, file {content:?}, loser's ledger {loser_ledger:?}"
            ));
        }
    }
    eprintln!("concurrent applies ({who:?}): {} of {TRIALS} trials lost an update", failures.len());
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn concurrent_applies_of_two_jobs_never_both_win_as_root() {
    concurrent_applies_never_both_win(As::Root);
}

#[test]
fn concurrent_applies_of_two_jobs_never_both_win_rootless() {
    concurrent_applies_never_both_win(As::Rootless);
}

#[test]
fn a_killed_apply_is_reconciled_and_drop_never_records_an_applied_file_as_dropped() {
    const FILES: usize = 3000;
    // SIGKILL at several points of the apply: once the first, the 500th and
    // the 1500th file landed in the workspace.
    for (trial, landed) in [1usize, 500, 1500].into_iter().enumerate() {
        let env = Env::new(As::Rootless);
        let script = format!("mkdir d; i=0; while [ $i -lt {FILES} ]; do echo $i > d/f$i; i=$((i+1)); done");
        assert_eq!(env.run_sh(&script).status.code(), Some(0));
        let job = only_job(&env);
        let mut apply = env.command(&["apply", "--all"]).stdout(Stdio::null()).spawn().unwrap();
        let count = || fs::read_dir(env.ws.join("d")).map(|d| d.count()).unwrap_or(0);
        assert!(
            wait_until(Duration::from_secs(60), || count() >= landed || apply.try_wait().unwrap().is_some()),
            "trial {trial}: the apply made no progress"
        );
        let _ = apply.kill();
        let _ = apply.wait();
        let on_host: Vec<String> = (0..FILES)
            .filter(|i| fs::read_to_string(env.ws.join(format!("d/f{i}"))).ok() == Some(format!("{i}\n")))
            .map(|i| format!("d/f{i}"))
            .collect();
        eprintln!(
            "trial {trial}: SIGKILL once {landed} landed; {} of {FILES} files had landed",
            on_host.len()
        );
        assert!(on_host.len() < FILES, "trial {trial}: the apply finished before it could be killed");
        // review already counts what landed as applied.
        let review = env.review();
        let applied_in_review = review.iter().filter(|c| c["applied"] == true).count();
        assert!(
            applied_in_review >= on_host.len(),
            "trial {trial}: review says {applied_in_review} applied, the workspace holds {}",
            on_host.len()
        );
        env.expect(&["drop"], 0);
        let outcomes = ledger(&env, &job);
        let lies = on_host.iter().filter(|p| outcomes.get(*p).map(String::as_str) != Some("applied")).count();
        eprintln!("trial {trial}: {lies} file(s) in the workspace recorded as not applied");
        assert_eq!(lies, 0, "trial {trial}: the ledger disagrees with the workspace");
        // No temporary of the killed apply is left in the workspace.
        let temps = fs::read_dir(env.ws.join("d"))
            .map(|d| {
                d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(".pvisor-tmp-")).count()
            })
            .unwrap_or(0);
        assert_eq!(temps, 0, "trial {trial}: temporaries left in the workspace");
        assert_trace_in_order(&env, &job);
    }
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn readers_and_kill_never_corrupt_live_traces() {
    // Readers run as the same user as the runs (root here), straight from threads.
    As::Root.require();
    let env = Env::new(As::Root);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let failures = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut readers = Vec::new();
    for args in [&["jobs", "--json"][..], &["status", "--json"][..], &["jobs"][..]] {
        let (stop, failures) = (stop.clone(), failures.clone());
        let cmd_args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let (home, dir, ws) = (env.home.clone(), env.dir.path().to_owned(), env.ws.clone());
        readers.push(std::thread::spawn(move || {
            let mut polls = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut cmd = Command::new(bin());
                cmd.args(&cmd_args).current_dir(&ws).env("PVISOR_HOME", &home).env("HOME", &dir);
                let out = cmd.stdin(Stdio::null()).output().unwrap();
                polls += 1;
                // `status` before the first Job exists is the one expected error.
                let no_jobs_yet = text(&out.stderr).contains("no jobs yet");
                if !out.status.success() && !no_jobs_yet {
                    failures.lock().unwrap().push(format!("{cmd_args:?}: {}", text(&out.stderr)));
                }
            }
            polls
        }));
    }
    const RUNS: usize = 40;
    for i in 0..RUNS {
        if i % 8 == 7 {
            // A kill of a live Job appends to the same Trace as its owner.
            let mut child = env.command(&["run", "--", "sleep", "5"]).spawn().unwrap();
            assert!(wait_until(Duration::from_secs(10), || job_ids(&env).len() == i + 1));
            std::thread::sleep(Duration::from_millis(100));
            env.expect(&["kill", &job_ids(&env)[i]], 0);
            let _ = child.wait();
        } else {
            assert_eq!(env.pvisor(&["run", "--", "true"]).status.code(), Some(0));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let polls: usize = readers.into_iter().map(|r| r.join().unwrap()).sum();
    let failures = failures.lock().unwrap();
    eprintln!("readers: {} of {polls} polls failed", failures.len());
    let (mut false_unknown, mut disordered, mut unverified) = (0, 0, 0);
    let jobs = job_ids(&env);
    for job in &jobs {
        let events = env.events(job);
        let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
        false_unknown += usize::from(events.iter().any(|e| e["type"] == "recovery.unknown"));
        disordered += usize::from(seqs != (1..=seqs.len() as u64).collect::<Vec<u64>>());
        unverified += usize::from(!env.pvisor(&["verify", job]).status.success());
    }
    eprintln!(
        "readers during {} runs ({polls} polls): {false_unknown} false recovery.unknown, {disordered} Traces out of order, {unverified} not verified",
        jobs.len()
    );
    assert!(failures.is_empty(), "{:?}", &failures[..failures.len().min(3)]);
    assert_eq!((false_unknown, disordered, unverified), (0, 0, 0));
}

#[test]
fn a_sigkill_during_admission_never_leaves_an_unreadable_job() {
    let env = Env::new(As::Rootless);
    const TRIALS: u32 = 40;
    // Admission begins when the Run's directory appears: found in one run
    // on this host now, however loaded it is (a fixed window of 0-15 ms
    // after spawn all landed before admission on a busy CI host). Even
    // trials sweep from 3 ms before that to 7 ms after, in 0.5 ms steps;
    // odd ones wait for the Run's directory to appear and kill 0-1 ms after
    // it, in 50 µs steps (the timed sweep alone once missed admission on a
    // loaded CI host).
    let runs = env.home.join("runs");
    let count = || fs::read_dir(&runs).map(|d| d.count()).unwrap_or(0);
    let admission = {
        let before = count();
        let started = std::time::Instant::now();
        let mut child = env.command(&["run", "-q", "--", "true"]).spawn().unwrap();
        while count() == before && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_micros(100));
        }
        let at = started.elapsed();
        assert!(child.wait().unwrap().success());
        at
    };
    let orphans = || {
        let jobs_named: std::collections::BTreeSet<String> = job_ids(&env)
            .iter()
            .map(|j| env.status_json(Some(j))["run"].as_str().unwrap().to_owned())
            .collect();
        fs::read_dir(env.home.join("runs"))
            .unwrap()
            .flatten()
            .filter(|r| !jobs_named.contains(&r.file_name().to_string_lossy().into_owned()))
            .count()
    };
    let mut failures = Vec::new();
    // Up to three sweeps, until one kill has landed inside admission.
    for trial in (0..3 * TRIALS).take_while(|t| t % TRIALS != 0 || *t == 0 || orphans() == 0) {
        let trial = trial % TRIALS;
        let before = count();
        let mut child = env.command(&["run", "-q", "--", "true"]).spawn().unwrap();
        if trial.is_multiple_of(2) {
            std::thread::sleep(
                admission.saturating_sub(Duration::from_millis(3)) + Duration::from_micros(250) * trial,
            );
        } else {
            while count() == before && child.try_wait().unwrap().is_none() {
                std::hint::spin_loop();
            }
            std::thread::sleep(Duration::from_micros(50) * (trial / 2));
        }
        let _ = child.kill();
        let _ = child.wait();
        let jobs = env.pvisor(&["jobs"]);
        let unreadable = job_ids(&env)
            .iter()
            .filter(|job| !env.pvisor(&["status", "--json", job]).status.success())
            .count();
        if jobs.status.code() != Some(0) || text(&jobs.stdout).contains("damaged") || unreadable > 0 {
            // Every visible Job reads, whatever state its killed owner left.
            failures.push(format!("trial {trial}: {unreadable} unreadable Job(s): {}", text(&jobs.stdout)));
        }
    }
    eprintln!("SIGKILL during admission: {} trials left an unreadable Job", failures.len());
    assert!(failures.is_empty(), "{failures:#?}");
    // Some kills did land inside admission: there is something to clean up.
    let orphans = orphans();
    eprintln!("SIGKILL during admission: {orphans} orphaned Run(s) before gc");
    assert!(orphans > 0, "no kill landed inside admission; the trial proves nothing");
    // gc removes what the killed admissions left, at once: every Run left is a Job's.
    env.expect(&["gc"], 0);
    let runs_of_jobs: std::collections::BTreeSet<String> =
        job_ids(&env).iter().map(|j| env.status_json(Some(j))["run"].as_str().unwrap().to_owned()).collect();
    for run in fs::read_dir(env.home.join("runs")).unwrap().flatten() {
        let name = run.file_name().to_string_lossy().into_owned();
        assert!(runs_of_jobs.contains(&name), "{name} is an orphan gc kept");
    }
    let leftovers: Vec<_> = fs::read_dir(env.home.join("jobs"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.file_name())
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn fork_racing_gc_keeps_the_forks_checkpoint() {
    let env = Env::new(As::Rootless);
    assert_eq!(env.run_sh("echo parent > p").status.code(), Some(0));
    let parent = only_job(&env);
    const TRIALS: usize = 10;
    let mut failures = Vec::new();
    for trial in 0..TRIALS {
        let fork = env
            .command(&["fork", &parent, "-q", "--", "cat", "p"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut gcs = Vec::new();
        for _ in 0..3 {
            gcs.push(
                env.command(&["gc", "--older-than", "0s"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
            std::thread::sleep(Duration::from_millis(15));
        }
        let out = fork.wait_with_output().unwrap();
        for mut gc in gcs {
            let _ = gc.wait();
        }
        if out.status.code() != Some(0) || text(&out.stdout) != "parent\n" {
            failures.push(format!("trial {trial}: {:?} {}", out.status.code(), text(&out.stderr)));
        }
    }
    eprintln!("fork racing gc: {} of {TRIALS} forks failed", failures.len());
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn a_killed_checkpoint_leaves_a_temporary_gc_removes_at_once() {
    let env = Env::new(As::Rootless);
    assert_eq!(env.run_sh("head -c 4000000 /dev/zero > big").status.code(), Some(0));
    let out =
        env.command(&["checkpoint"]).env("PVISOR_FAILPOINT", "checkpoint-before-publish").output().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&out.status), Some(libc::SIGKILL));
    let temps = || {
        fs::read_dir(env.home.join("checkpoints"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
            .count()
    };
    assert_eq!(temps(), 1);
    // The default threshold is 7 days; an unowned temporary goes regardless.
    env.expect(&["gc"], 0);
    assert_eq!(temps(), 0);
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn ctrl_c_typed_on_a_terminal_ends_the_job_cancelled() {
    let env = Env::new(As::Root);
    As::Root.require();
    // Not `sh -c 'echo READY; sleep 30'`: dash catches SIGINT under -c, and a
    // Ctrl-C that lands while it forks `sleep` is lost for both (the child
    // execs with the signal swallowed, the shell waits for it): the same
    // race a user at a real shell meets, and 1 in ~20 trials under load.
    // Python is already asleep when it prints READY, and dies of SIGINT.
    let inner = format!(
        "PVISOR_HOME={} {} run -q -- /usr/bin/python3 -c 'import time; print(\"READY\", flush=True); time.sleep(30)'",
        env.home.display(),
        bin()
    );
    // script(1) gives pvisor a real terminal; bytes written to its stdin are typed keys.
    let mut child = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .current_dir(&env.ws)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let started = Instant::now();
    while !line.contains("READY") {
        line.clear();
        assert!(lines.read_line(&mut line).unwrap() > 0, "the command never started");
        assert!(started.elapsed() < Duration::from_secs(30));
    }
    stdin.write_all(b"\x03").unwrap();
    stdin.flush().unwrap();
    // Under heavy load about 1 in 15 first Ctrl-Cs sent the instant the
    // command's first line appears does not end it, though the relay passes
    // the byte and the sandbox's terminal signals the command's process group
    // (traced to that point; the root cause is still open). A
    // second one always has; the claim here is how a Ctrl-C death is recorded.
    if !wait_until(Duration::from_secs(5), || child.try_wait().unwrap().is_some()) {
        stdin.write_all(b"\x03").unwrap();
        stdin.flush().unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(20), || child.try_wait().unwrap().is_some()),
        "Ctrl-C did not end it"
    );
    drop(stdin);
    let status = env.status_json(None);
    assert_eq!(status["state"], "cancelled", "{status}");
    assert_eq!(status["signal"], libc::SIGINT);
}

/// A tmpfs state directory the size of `mib`, as root.
fn small_state_dir(env: &Env, mib: u32) -> PathBuf {
    assert!(is_root(), "mounting a small tmpfs needs root (the test is ignored unless included)");
    let mount = env.dir.path().join("small");
    fs::create_dir(&mount).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={mib}m,mode=0755"), "tmpfs"])
        .arg(&mount)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mount tmpfs");
    mount
}

struct Unmount(PathBuf);
impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn a_full_state_directory_is_recovered_with_pvisor_commands_only() {
    let mut env = Env::new(As::Root);
    let mount = small_state_dir(&env, 48);
    let _unmount = Unmount(mount.clone());
    env.home = mount.join("state");
    // A finished Job with a staged change; then a command fills the state
    // filesystem through its stage (its own run may not be sealable).
    assert_eq!(env.run_sh("echo keep-or-drop > staged").status.code(), Some(0));
    let first = only_job(&env);
    let out = env.run_sh("head -c 100000000 /dev/zero > huge");
    assert_ne!(out.status.code(), Some(0));
    let second = job_ids(&env).into_iter().find(|j| *j != first).expect("the second Job is recorded");
    // The run that filled it released the reserve to record its own result.
    let filled = env.status_json(Some(&second));
    assert_eq!(filled["receipt"].as_str(), Some("valid"), "{filled}");
    // drop, kill and gc --force all work on the full filesystem.
    let dropped = env.pvisor(&["drop", &first]);
    assert_eq!(dropped.status.code(), Some(0), "{}", text(&dropped.stderr));
    assert_eq!(ledger(&env, &first).get("staged").map(String::as_str), Some("dropped"));
    env.expect(&["kill", &second], 0);
    env.expect(&["gc", "--force", "--older-than", "0s"], 0);
    // And pvisor is usable again.
    assert_eq!(env.run_sh("echo after > after").status.code(), Some(0));
    assert!(!env.ws.join("staged").exists(), "drop wrote to the workspace");
}

#[test]
fn a_killed_export_leaves_no_temporary_after_the_next_export() {
    let env = Env::new(As::Rootless);
    assert_eq!(env.run_sh("head -c 80000000 /dev/urandom > big").status.code(), Some(0));
    let out_dir = env.dir.path().join("exports");
    fs::create_dir(&out_dir).unwrap();
    env.give_away(&out_dir);
    let target = out_dir.join("run.pvisor.tar");
    let target_arg = target.to_string_lossy().into_owned();
    let temps = || {
        fs::read_dir(&out_dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".run.pvisor.tar.tmp-"))
            .count()
    };
    let mut export = env.command(&["export", "-o", &target_arg]).stdout(Stdio::null()).spawn().unwrap();
    assert!(wait_until(Duration::from_secs(30), || temps() > 0 || export.try_wait().unwrap().is_some()));
    let _ = export.kill();
    let _ = export.wait();
    assert_eq!(temps(), 1, "the killed export left its temporary (or finished first)");
    env.expect(&["export", "-o", &target_arg], 0);
    assert_eq!(temps(), 0, "the next export removed the dead one's temporary");
    env.expect(&["verify", &target_arg], 0);
}

#[test]
fn drop_works_when_the_workspace_is_gone() {
    let env = Env::new(As::Rootless);
    assert_eq!(env.run_sh("echo x > f").status.code(), Some(0));
    let job = only_job(&env);
    let moved = env.dir.path().join("moved");
    fs::rename(&env.ws, &moved).unwrap();
    let mut cmd = env.command(&["drop", &job]);
    cmd.current_dir(env.dir.path());
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let run = fs::read_dir(env.home.join("runs")).unwrap().next().unwrap().unwrap().path();
    let ledger = fs::read_to_string(run.join("stage/ledger.jsonl")).unwrap();
    assert!(ledger.contains("\"path\":\"f\"") && ledger.contains("\"dropped\""), "{ledger}");
}

/// The same file through nested workspaces: a Job over the workspace and a
/// Job over its subdirectory never both win it.
#[test]
fn concurrent_applies_through_nested_workspaces_never_both_win() {
    const TRIALS: usize = 8;
    let mut failures = Vec::new();
    for trial in 0..TRIALS {
        let env = Env::new(As::Rootless);
        env.write("sub/shared", "base\n");
        assert_eq!(env.run_sh("echo from-outer > sub/shared").status.code(), Some(0));
        std::thread::sleep(Duration::from_millis(25));
        let sub = env.ws.join("sub").to_string_lossy().into_owned();
        let out = env.pvisor(&["run", "-w", &sub, "--", "sh", "-c", "echo from-inner > shared"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let jobs = job_ids(&env);
        let codes = apply_all_at_once(&env, &jobs);
        let content = fs::read_to_string(env.ws.join("sub/shared")).unwrap();
        let winners = codes.iter().filter(|c| **c == Some(0)).count();
        // The loser reports a conflict (1), never some other error.
        let expected = ["from-outer\n", "from-inner\n"];
        if winners != 1 || !codes.contains(&Some(1)) || !expected.contains(&content.as_str()) {
            failures.push(format!("trial {trial}: exit codes {codes:?}, file {content:?}"));
        }
    }
    eprintln!("nested workspaces: {} of {TRIALS} trials lost an update", failures.len());
    assert!(failures.is_empty(), "{failures:#?}");
}
