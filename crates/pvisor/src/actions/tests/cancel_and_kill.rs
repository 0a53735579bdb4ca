//! Cancellation of a running Job, and kill of one whose owner is gone.

use super::*;

#[test]
fn cancelling_forwards_the_signal_and_records_a_cancelled_run() {
    let f = fixture(vec![Script::runs_until(&[libc::SIGTERM])]);
    let outcome = block_on(async {
        let run = f.start();
        tokio::time::sleep(Duration::from_millis(100)).await;
        f.cancel(run).await.finished().unwrap()
    });
    assert_eq!(outcome.result.state, ResultState::Cancelled);
    assert_eq!(f.fake.journal().signals.first(), Some(&libc::SIGTERM));
    assert_eq!(f.status(&outcome.job).state, JobState::Cancelled);
}

#[test]
fn a_command_that_ignores_the_signal_is_killed_after_the_grace_period() {
    // Dies only of SIGKILL.
    let f = fixture(vec![Script::runs_until(&[])]);
    let started = std::time::Instant::now();
    let outcome = block_on(async {
        let run = f.start();
        tokio::time::sleep(Duration::from_millis(100)).await;
        f.cancel(run).await.finished().unwrap()
    });
    let signals = f.fake.journal().signals.clone();
    assert_eq!(signals.first(), Some(&libc::SIGTERM), "{signals:?}");
    assert_eq!(signals.last(), Some(&libc::SIGKILL), "{signals:?}");
    assert!(started.elapsed() >= Duration::from_millis(300), "not before the 300 ms grace");
    assert_eq!(outcome.result.state, ResultState::Cancelled);
}

#[test]
fn a_dropped_wait_still_finalizes_and_publishes() {
    let f = fixture(vec![Script::runs_until(&[libc::SIGTERM])]);
    let job = block_on(async {
        let run = f.start();
        let job = run.job().clone();
        drop(run);
        // The runtime task keeps going while this runtime lives.
        // Patient: finalizing is a chain of fsynced writes, slow on a
        // loaded host; the runtime must live until it is done.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while f.runtime.execute(Status { job: job.clone() }).unwrap().receipt != ReceiptStatus::Valid {
            assert!(std::time::Instant::now() < deadline, "the Job was never finalized");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        job
    });
    let status = f.status(&job);
    assert_eq!(status.receipt, ReceiptStatus::Valid);
    assert_eq!(status.state, JobState::Cancelled);
}

#[test]
fn killing_an_ended_job_does_nothing_and_says_so() {
    let f = fixture(vec![Script::exits(0, &[])]);
    let outcome = f.run();
    let killed =
        f.runtime.execute(Kill { job: outcome.job.clone(), grace: Duration::from_millis(10) }).unwrap();
    assert!(matches!(killed, Killed::AlreadyEnded(JobState::Completed)), "{killed:?}");
    assert!(f.job_record(&outcome.job).continuation, "an ended Job's record is left alone");
}

#[test]
fn a_job_whose_owner_died_without_a_receipt_is_unknown_then_lost_by_kill() {
    let f = fixture(vec![Script::exits(0, &[])]);
    let outcome = f.run();
    // A crash before the receipt: the Attempt's receipt is gone, and the
    // Job record still says running.
    let attempt_dir = f.store().attempt_dir(&outcome.attempt);
    std::fs::remove_file(attempt_dir.join("completion.json")).unwrap();
    let mut record = f.job_record(&outcome.job);
    record.state = JobState::Running;
    f.store().write(&f.store().job_file(&outcome.job), &record).unwrap();
    assert_eq!(f.status(&outcome.job).state, JobState::Unknown, "no receipt, no owner: unknown");
    let killed =
        f.runtime.execute(Kill { job: outcome.job.clone(), grace: Duration::from_millis(10) }).unwrap();
    assert!(matches!(killed, Killed::Ended { state: JobState::Lost, stopped_owner: None }), "{killed:?}");
    assert!(!f.job_record(&outcome.job).continuation, "kill withdraws continuation");
    assert!(f.kinds(&outcome.job).iter().any(|k| k == "job.lost"));
}
