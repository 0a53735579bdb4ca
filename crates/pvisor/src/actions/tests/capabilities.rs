//! Capabilities: what a backend cannot do is a clear error, and a fake
//! that refuses them refuses every one.

use super::*;

#[test]
fn a_backend_without_checkpoints_refuses_execution_checkpoints_by_name() {
    let f = fixture(vec![Script::exits(0, &[])]);
    let outcome = f.run();
    for err in [
        f.runtime.execute(CheckpointExecution { job: outcome.job.clone() }).unwrap_err(),
        f.runtime.execute(Suspend { job: outcome.job.clone() }).unwrap_err(),
        f.runtime
            .execute(PrepareExecutionFork { parent: outcome.job.clone(), checkpoint: None })
            .unwrap_err(),
    ] {
        assert!(matches!(err, RuntimeError::Unsupported { .. }), "{err:?}");
        let said = err.to_string();
        assert!(said.contains("fake executor") && said.contains("--executor vm"), "{said}");
    }
}

#[test]
fn resume_of_a_job_without_checkpoints_is_refused_and_admits_nothing() {
    let f = fixture(vec![Script::exits(0, &[])]);
    let outcome = f.run();
    let err = block_on(async { f.runtime.execute(Resume { job: outcome.job.clone() }).unwrap_err() });
    assert!(matches!(err, RuntimeError::Unsupported { .. }), "{err:?}");
    assert_eq!(f.fake.journal().started.len(), 1, "no new Attempt was started");
    assert_eq!(f.job_record(&outcome.job).target_attempt, 1);
}

#[test]
fn a_backend_without_a_guest_refuses_guest_access() {
    let f = fixture(vec![Script::exits(0, &[])]);
    let outcome = f.run();
    let err = f.runtime.execute(OpenGuest { job: outcome.job, attempt: None }).unwrap_err();
    assert!(matches!(err, RuntimeError::Unsupported { what: "reach a guest", .. }), "{err:?}");
}

#[test]
fn execution_checkpoints_of_an_ended_job_are_refused_before_the_backend_is_asked() {
    let f = fixture_with(vec![Script::exits(0, &[])], true);
    let outcome = f.run();
    let err = f.runtime.execute(CheckpointExecution { job: outcome.job.clone() }).unwrap_err();
    match &err {
        RuntimeError::NotRunning { state, .. } => assert_eq!(*state, JobState::Completed),
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("not running (state: completed)"), "{err}");
    let err = f.runtime.execute(OpenGuest { job: outcome.job, attempt: None }).unwrap_err();
    assert!(matches!(err, RuntimeError::NotRunning { .. }), "{err:?}");
    assert!(f.capabilities.as_ref().unwrap().asked.lock().unwrap().is_empty(), "the backend was not asked");
}

#[test]
fn a_running_job_is_checkpointed_through_its_backend_and_its_refusal_is_reported() {
    let f = fixture_with(vec![Script::runs_until(&[libc::SIGTERM])], true);
    block_on(async {
        let run = f.start();
        let job = run.job().clone();
        let attempt_dir = f.store().attempt_dir(run.attempt());
        // Patient: admission and the running marks are fsynced writes,
        // slow on a loaded host.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !(f.status(&job).live && f.status(&job).state == JobState::Running) {
            assert!(std::time::Instant::now() < deadline, "the Job never ran");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let err = f.runtime.execute(CheckpointExecution { job: job.clone() }).unwrap_err();
        assert!(matches!(err, RuntimeError::Capability { .. }), "{err:?}");
        assert!(err.to_string().contains("the fake backend refuses"), "{err}");
        let guest = f.runtime.execute(OpenGuest { job: job.clone(), attempt: None }).unwrap();
        assert_eq!(guest.attempt(), run.attempt());
        assert!(guest.connect(8080).is_err());
        let asked = f.capabilities.as_ref().unwrap().asked.lock().unwrap().clone();
        assert_eq!(asked, vec![attempt_dir.clone(), attempt_dir], "asked about the live Attempt's directory");
        f.cancel(run).await;
    });
}

#[test]
fn a_killed_jobs_execution_can_no_longer_be_saved() {
    let f = fixture_with(vec![Script::runs_until(&[libc::SIGTERM])], true);
    block_on(async {
        let run = f.start();
        let job = run.job().clone();
        let mut record = f.job_record(&job);
        record.continuation = false;
        f.store().write(&f.store().job_file(&job), &record).unwrap();
        let err = f.runtime.execute(CheckpointExecution { job: job.clone() }).unwrap_err();
        assert!(matches!(err, RuntimeError::ContinuationWithdrawn { .. }), "{err:?}");
        f.cancel(run).await;
    });
}

#[test]
fn an_unknown_backend_is_named_with_the_ones_that_exist() {
    let f = fixture(vec![]);
    let err = f.runtime.executor("firecracker").unwrap_err();
    assert!(err.to_string().contains("\"firecracker\"") && err.to_string().contains("ns, vm"), "{err}");
}

#[test]
fn the_refusing_fake_still_refuses_every_capability() {
    let f = fixture_with(vec![Script::runs_until(&[libc::SIGTERM])], true);
    let tokio = sessions();
    let run = f.start_live(&tokio);
    let job = run.job().clone();
    assert!(f.runtime.execute(Suspend { job: job.clone() }).is_err());
    let link = f.runtime.execute(OpenGuest { job: job.clone(), attempt: None }).unwrap();
    assert!(link.exec(exec_spec(2, &["true"])).is_err());
    assert_eq!(f.status(&job).state, JobState::Running);
    tokio.block_on(f.cancel(run));
}
