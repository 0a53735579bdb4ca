//! Admission, the Session's finalization and receipts: how a run ends is
//! what its records say.

use super::*;

#[test]
fn a_run_that_exits_zero_is_completed_and_confirmed_by_its_receipt() {
    let f = fixture(vec![Script::exits(0, &[])]);
    let outcome = f.run();
    assert_eq!(outcome.result.state, ResultState::Completed);
    assert_eq!(outcome.result.exit_code, Some(0));
    let status = f.status(&outcome.job);
    assert_eq!(status.state, JobState::Completed);
    assert_eq!(status.receipt, ReceiptStatus::Valid);
    assert!(!status.live, "nothing owns a finished Attempt");
}

#[test]
fn labels_are_recorded_on_the_job_and_in_job_created() {
    let f = fixture(vec![Script::exits(0, &[])]);
    let mut labeled = request(&f.workspace);
    labeled.labels = [("containerd.io/container".into(), "web-1".into())].into();
    let outcome = f.run_request(labeled);
    assert_eq!(
        f.job_record(&outcome.job).labels.get("containerd.io/container").map(String::as_str),
        Some("web-1")
    );
    let events = f.runtime.execute(Events { job: outcome.job.clone() }).unwrap().events;
    let created = events.iter().find(|e| e.kind.as_str() == "job.created").expect("job.created");
    assert_eq!(created.data["labels"]["containerd.io/container"], "web-1");
}

#[test]
fn a_bad_label_is_refused_before_any_record_is_written() {
    let f = fixture(vec![Script::exits(0, &[])]);
    let mut labeled = request(&f.workspace);
    labeled.labels = [("team".into(), "\u{1b}[2Jfake".into())].into();
    let refused =
        f.runtime.execute(Run { request: labeled, executor: f.executor() }).map(|_| ()).unwrap_err();
    assert!(refused.to_string().contains("label \"team\""), "{refused}");
    assert!(f.runtime.execute(ListJobs).unwrap().is_empty(), "no Job was created");
}

#[test]
fn the_receipt_binds_the_bundle_by_its_blake3() {
    let f = fixture(vec![Script::exits(0, &[("a.txt", "a")])]);
    let outcome = f.run();
    let bundle = std::fs::read(f.store().attempt_dir(&outcome.attempt).join("bundle.json")).unwrap();
    assert_eq!(outcome.bundle_blake3, blake3::hash(&bundle).to_hex().to_string());
}

#[test]
fn a_nonzero_exit_is_failed_with_its_code() {
    let f = fixture(vec![Script::exits(3, &[])]);
    let outcome = f.run();
    assert_eq!(outcome.result.state, ResultState::Failed);
    assert_eq!(outcome.result.exit_code, Some(3));
    assert_eq!(f.status(&outcome.job).state, JobState::Failed);
}

#[test]
fn death_by_a_signal_is_failed_with_the_signal() {
    let f = fixture(vec![Script::ends(Termination::Signaled(libc::SIGSEGV))]);
    let outcome = f.run();
    assert_eq!(outcome.result.state, ResultState::Failed);
    assert_eq!(outcome.result.signal, Some(libc::SIGSEGV));
    assert_eq!(outcome.result.exit_code, None);
}

#[test]
fn a_program_that_cannot_be_executed_is_failed_with_the_reason() {
    let f = fixture(vec![Script::ends(Termination::ExecFailed {
        program: "fake-command".into(),
        errno: libc::ENOENT,
        message: "No such file or directory".into(),
    })]);
    let outcome = f.run();
    assert_eq!(outcome.result.state, ResultState::Failed);
    assert_eq!(outcome.result.exit_code, Some(127), "ENOENT is the shell's 127");
    assert!(outcome.result.error.as_deref().unwrap_or("").contains("fake-command"), "{:?}", outcome.result);
}

#[test]
fn a_sandbox_that_vanishes_is_failed_not_completed() {
    let f = fixture(vec![Script::ends(Termination::Vanished { detail: "gone".into() })]);
    let outcome = f.run();
    assert_ne!(outcome.result.state, ResultState::Completed);
    assert!(outcome.result.error.is_some(), "{:?}", outcome.result);
}

#[test]
fn a_setup_failure_is_a_recorded_failed_job_naming_the_step() {
    let f = fixture(vec![Script::setup_fails("overlay", "cannot mount the overlay")]);
    let outcome = f.run();
    assert_eq!(outcome.result.state, ResultState::Failed);
    let error = outcome.result.error.clone().unwrap_or_default();
    assert!(error.contains("cannot mount the overlay"), "{error}");
    assert_eq!(f.status(&outcome.job).receipt, ReceiptStatus::Valid, "a setup failure is confirmed too");
}

#[test]
fn the_backend_is_given_the_command_workspace_and_a_private_stage() {
    let f = fixture(vec![Script::exits(0, &[])]);
    let outcome = f.run();
    let journal = f.fake.journal();
    let spec = journal.started.first().expect("the executor was started");
    assert_eq!(spec.program, "fake-command");
    assert_eq!(spec.args, vec!["--flag".to_owned()]);
    assert_eq!(spec.workspace, f.workspace.canonicalize().unwrap());
    assert!(spec.upper.starts_with(f.store().root()), "the stage is under the state directory");
    assert!(!spec.upper.starts_with(&f.workspace), "the stage is not inside the workspace");
    assert!(spec.seccomp);
    assert_eq!(f.status(&outcome.job).executor, "fake", "Placement names the backend");
}

#[test]
fn files_the_command_writes_are_staged_not_applied() {
    let f = fixture(vec![Script::exits(0, &[("new.txt", "hello\n"), ("kept.txt", "changed\n")])]);
    let outcome = f.run();
    let mut changes: Vec<(String, ChangeKind)> =
        outcome.changes.iter().map(|c| (c.path.display_escaped(), c.kind)).collect();
    changes.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        changes,
        vec![("kept.txt".to_owned(), ChangeKind::Modified), ("new.txt".to_owned(), ChangeKind::Added)]
    );
    assert_eq!(std::fs::read_to_string(f.workspace.join("kept.txt")).unwrap(), "original\n");
    assert!(!f.workspace.join("new.txt").exists(), "nothing reaches the workspace before apply");
}

#[test]
fn an_oom_kill_is_recorded_in_the_result() {
    let mut script = Script::ends(Termination::Signaled(libc::SIGKILL));
    script.oom_killed = true;
    let f = fixture(vec![script]);
    let outcome = f.run();
    assert_eq!(outcome.result.state, ResultState::Failed);
    let error = outcome.result.error.unwrap_or_default();
    assert!(error.to_lowercase().contains("memory"), "the result says memory ran out: {error}");
}

#[test]
fn an_incomplete_stage_is_never_reported_as_a_clean_result() {
    let mut script = Script::exits(0, &[("a.txt", "a")]);
    script.stage_error = Some("the memory stage could not be copied out".into());
    let f = fixture(vec![script]);
    let outcome = f.run();
    let said = format!("{:?} {:?}", outcome.result, outcome.warnings);
    assert!(said.contains("memory stage could not be copied out"), "{said}");
}

#[test]
fn the_trace_runs_from_creation_to_a_terminal_event_in_sequence() {
    let f = fixture(vec![Script::exits(0, &[])]);
    let outcome = f.run();
    let trace = f.runtime.execute(Events { job: outcome.job.clone() }).unwrap();
    assert!(trace.warnings.is_empty(), "{:?}", trace.warnings);
    let seqs: Vec<u64> = trace.events.iter().map(|e| e.seq).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "strictly increasing: {seqs:?}");
    let kinds = f.kinds(&outcome.job);
    assert_eq!(kinds.first().map(String::as_str), Some("job.created"), "{kinds:?}");
    assert!(kinds.iter().any(|k| k == "attempt.started"), "{kinds:?}");
    assert_eq!(kinds.last().map(String::as_str), Some("run.completed"), "{kinds:?}");
}

#[test]
fn every_job_gets_its_own_records() {
    let f = fixture(vec![Script::exits(0, &[("a", "1")]), Script::exits(1, &[("b", "2")])]);
    let first = f.run();
    let second = f.run();
    assert_ne!(first.job, second.job);
    assert_ne!(first.run, second.run);
    let listed = f.runtime.execute(ListJobs).unwrap();
    let ids: Vec<&JobId> = listed.iter().map(|(id, _)| id).collect();
    assert!(ids.contains(&&first.job) && ids.contains(&&second.job), "{ids:?}");
    assert!(listed.iter().all(|(_, s)| s.is_ok()));
    assert_eq!(f.status(&second.job).state, JobState::Failed);
}
