//! Execution checkpoints, suspend, resume and execution forks on the
//! working fakes.

use super::*;

#[test]
fn an_execution_checkpoint_is_verifiable_and_the_job_keeps_running() {
    let (f, tokio) = working(vec![Script::runs_until(&[libc::SIGTERM])], Arc::default());
    let run = f.start_live(&tokio);
    let job = run.job().clone();
    let saved = f.runtime.execute(CheckpointExecution { job: job.clone() }).unwrap();
    let dir = f.store().exec_checkpoints_dir(&f.job_record(&job).run).join(saved.id.as_str());
    let verified = pvisor_vm::checkpoint::verify(&dir).unwrap();
    assert_eq!(verified.id, saved.id);
    assert_eq!(verified.workspace, f.workspace, "the checkpoint names the Job's workspace");
    assert_eq!(f.status(&job).state, JobState::Running, "a checkpoint does not stop the Job");
    let end = tokio.block_on(f.cancel(run));
    assert!(matches!(end, RunEnd::Finished(ref o) if o.result.state == ResultState::Cancelled), "{end:?}");
}

#[test]
fn a_suspend_ends_the_attempt_suspended_and_a_resume_continues_it_in_a_new_attempt() {
    let (f, tokio) = working(
        vec![Script::runs_until(&[libc::SIGTERM]), Script::runs_until(&[libc::SIGTERM])],
        Arc::default(),
    );
    let mut run = f.start_live(&tokio);
    let job = run.job().clone();
    let saved = f.runtime.execute(Suspend { job: job.clone() }).unwrap();
    assert_eq!(f.status(&job).state, JobState::Suspended);
    match tokio.block_on(run.wait()).unwrap() {
        RunEnd::Suspended(s) => assert_eq!(s.checkpoint.id, saved.id),
        other => panic!("{other:?}"),
    }
    assert!(f.kinds(&job).iter().any(|k| k == "run.hibernated"), "{:?}", f.kinds(&job));
    // A suspended Job has no guest until it is resumed.
    let err = f.runtime.execute(OpenGuest { job: job.clone(), attempt: None }).unwrap_err();
    assert!(matches!(err, RuntimeError::NotRunning { state: JobState::Suspended, .. }), "{err:?}");

    let resumed = {
        let _inside = tokio.enter();
        f.runtime.execute(Resume { job: job.clone() }).unwrap()
    };
    assert_eq!(resumed.job(), &job, "the same Job continues");
    assert_eq!(resumed.attempt().number(), 2, "in a new Attempt");
    f.await_running(&job);
    assert_eq!(f.fake.journal().started.len(), 2, "the restorer started the second Attempt");
    let guest = f.runtime.execute(OpenGuest { job: job.clone(), attempt: None }).unwrap();
    assert_eq!(guest.attempt().number(), 2);
    tokio.block_on(f.cancel(resumed));
    assert_eq!(f.status(&job).state, JobState::Cancelled);
}

#[test]
fn an_execution_fork_of_a_running_job_checkpoints_it_and_runs_a_new_job_from_there() {
    let (f, tokio) = working(
        vec![Script::runs_until(&[libc::SIGTERM]), Script::exits(7, &[("forked.txt", "child\n")])],
        Arc::default(),
    );
    let parent_run = f.start_live(&tokio);
    let parent = parent_run.job().clone();
    let source =
        f.runtime.execute(PrepareExecutionFork { parent: parent.clone(), checkpoint: None }).unwrap();
    let taken = source.taken.clone().expect("a running parent is checkpointed for the fork");
    assert_eq!(source.fork.manifest.id, taken.id);
    assert_eq!(source.command, vec!["fake-command".to_owned(), "--flag".to_owned()]);
    let mut request = request(&source.workspace);
    request.fork_execution = Some(source.fork);
    let outcome = tokio.block_on(async {
        let mut run = f.runtime.execute(Run { request, executor: source.executor }).unwrap();
        match run.wait().await.unwrap() {
            RunEnd::Finished(o) => o,
            other => panic!("{other:?}"),
        }
    });
    assert_ne!(outcome.job, parent, "a fork is a new Job");
    assert_eq!(outcome.result.exit_code, Some(7));
    assert_eq!(f.status(&parent).state, JobState::Running, "the parent runs on");
    tokio.block_on(f.cancel(parent_run));
}
