//! Unit tests of the runtime through its action API, on the recording fake
//! backend (`crate::testing`): admission, the Session's finalization, the
//! Job service, cancellation, kill, effects, gc and the capability checks.
//! Real processes, overlays and VMs are the end-to-end suite's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pvisor_core::ids::JobId;
use pvisor_core::records::{ChangeKind, JobRecord};
use pvisor_core::state::{JobState, ResultState};
use pvisor_core::store::Store;
use pvisor_sandbox::Termination;

use super::*;
use crate::effects::{ApplyOptions, Selection};
use crate::records::views::ReceiptStatus;
use crate::runtime::kill::Killed;
use crate::testing::{FakeBackends, FakeCheckpointer, FakeExecutor, Script};
use crate::{RunEnd, RunOutcome, RunRequest};

struct Fixture {
    _dir: tempfile::TempDir,
    workspace: PathBuf,
    runtime: Runtime,
    fake: Arc<FakeExecutor>,
    capabilities: Option<Arc<FakeCheckpointer>>,
}

fn fixture_with(scripts: Vec<Script>, capabilities: bool) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("ws");
    std::fs::create_dir(&workspace).unwrap();
    std::fs::write(workspace.join("kept.txt"), "original\n").unwrap();
    // Past the coarse clock's tick: an edit in the very tick a run starts is
    // "racy" by design (see `pvisor_stage::preimage::baseline_now`), and a
    // test that starts a run microseconds after preparing its workspace
    // must not depend on which side of the tick it landed.
    std::thread::sleep(Duration::from_millis(20));
    let store = Store::open(dir.path().join("state")).unwrap();
    let fake = FakeExecutor::new(scripts);
    let capabilities = capabilities.then(|| Arc::new(FakeCheckpointer::default()));
    let backends = Arc::new(FakeBackends { executor: fake.clone(), capabilities: capabilities.clone() });
    Fixture { _dir: dir, workspace, runtime: Runtime::new(store, backends), fake, capabilities }
}

fn fixture(scripts: Vec<Script>) -> Fixture {
    fixture_with(scripts, false)
}

fn request(workspace: &std::path::Path) -> RunRequest {
    RunRequest {
        caches: Vec::new(),
        labels: Default::default(),
        network_namespace: None,
        shared_directories: Vec::new(),
        workspace: workspace.to_owned(),
        cwd: None,
        program: "fake-command".into(),
        args: vec!["--flag".into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        kill_grace: Duration::from_millis(300),
        network: Vec::new(),
        fork: None,
        fork_execution: None,
        secrets: Default::default(),
        seccomp: true,
        limits: Default::default(),
    }
}

fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(future)
}

impl Fixture {
    fn store(&self) -> &Store {
        self.runtime.store()
    }

    fn executor(&self) -> Arc<dyn pvisor_sandbox::Executor> {
        self.runtime.executor("fake").unwrap()
    }

    /// Runs one Job to its published end.
    fn run(&self) -> RunOutcome {
        self.run_request(request(&self.workspace))
    }

    fn run_request(&self, request: RunRequest) -> RunOutcome {
        block_on(async {
            let mut run = self.runtime.execute(Run { request, executor: self.executor() }).unwrap();
            match run.wait().await.unwrap() {
                RunEnd::Finished(outcome) => outcome,
                RunEnd::Suspended(s) => panic!("suspended: {s:?}"),
            }
        })
    }

    /// Starts one Job on the fake; the caller awaits (or drops) the handle.
    fn start(&self) -> crate::ManagedJobRun {
        self.runtime.execute(Run { request: request(&self.workspace), executor: self.executor() }).unwrap()
    }

    /// Cancels a run started by [`Self::start`] and waits for its published end.
    async fn cancel(&self, mut run: crate::ManagedJobRun) -> RunEnd {
        run.cancel_handle().cancel(libc::SIGTERM);
        run.wait().await.unwrap()
    }

    fn status(&self, job: &JobId) -> crate::records::views::JobStatus {
        self.runtime.execute(Status { job: job.clone() }).unwrap()
    }

    fn kinds(&self, job: &JobId) -> Vec<String> {
        self.runtime
            .execute(Events { job: job.clone() })
            .unwrap()
            .events
            .into_iter()
            .map(|e| e.kind.as_str().to_owned())
            .collect()
    }

    fn job_record(&self, job: &JobId) -> JobRecord {
        self.store().read(&self.store().job_file(job)).unwrap()
    }
}

// ---- admission, Session and receipts ---------------------------------------

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

// ---- cancellation ------------------------------------------------------------

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
        for _ in 0..200 {
            if f.runtime.execute(Status { job: job.clone() }).unwrap().receipt == ReceiptStatus::Valid {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        job
    });
    let status = f.status(&job);
    assert_eq!(status.receipt, ReceiptStatus::Valid);
    assert_eq!(status.state, JobState::Cancelled);
}

// ---- kill and continuation ---------------------------------------------------

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

// ---- effects: apply and drop ---------------------------------------------------

#[test]
fn apply_writes_the_selected_change_and_leaves_the_rest_staged() {
    let f = fixture(vec![Script::exits(0, &[("one.txt", "1\n"), ("two.txt", "2\n")])]);
    let outcome = f.run();
    let mut seen = Vec::new();
    let report = f
        .runtime
        .execute(Apply {
            job: outcome.job.clone(),
            selection: Selection::Patterns(vec!["one.txt".into()]),
            options: ApplyOptions::default(),
            progress: Box::new(|c| seen.push(c.path.display_escaped())),
        })
        .unwrap();
    assert!(report.executed && report.conflicts.is_empty() && report.failed.is_empty(), "{report:?}");
    assert_eq!(seen, vec!["one.txt".to_owned()]);
    assert_eq!(std::fs::read_to_string(f.workspace.join("one.txt")).unwrap(), "1\n");
    assert!(!f.workspace.join("two.txt").exists());
}

#[test]
fn apply_refuses_a_change_the_host_edited_since_the_run() {
    let f = fixture(vec![Script::exits(0, &[("kept.txt", "from the sandbox\n")])]);
    let outcome = f.run();
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(f.workspace.join("kept.txt"), "edited on the host\n").unwrap();
    let report = f
        .runtime
        .execute(Apply {
            job: outcome.job.clone(),
            selection: Selection::Patterns(Vec::new()),
            options: ApplyOptions::default(),
            progress: Box::new(|_| {}),
        })
        .unwrap();
    assert!(!report.executed, "a conflict refuses the apply");
    assert_eq!(report.conflicts.len(), 1, "{report:?}");
    assert_eq!(std::fs::read_to_string(f.workspace.join("kept.txt")).unwrap(), "edited on the host\n");
}

#[test]
fn a_dry_run_apply_plans_but_writes_nothing() {
    let f = fixture(vec![Script::exits(0, &[("new.txt", "x")])]);
    let outcome = f.run();
    let options = ApplyOptions { dry_run: true, ..Default::default() };
    let report = f
        .runtime
        .execute(Apply {
            job: outcome.job,
            selection: Selection::Patterns(Vec::new()),
            options,
            progress: Box::new(|_| {}),
        })
        .unwrap();
    assert!(!report.executed);
    assert_eq!(report.plan.len(), 1);
    assert!(!f.workspace.join("new.txt").exists());
}

#[test]
fn drop_discards_what_is_left_and_never_undoes_an_apply() {
    let f = fixture(vec![Script::exits(0, &[("one.txt", "1"), ("two.txt", "2")])]);
    let outcome = f.run();
    let applied = f
        .runtime
        .execute(Apply {
            job: outcome.job.clone(),
            selection: Selection::Patterns(vec!["one.txt".into()]),
            options: ApplyOptions::default(),
            progress: Box::new(|_| {}),
        })
        .unwrap();
    assert!(applied.executed && applied.conflicts.is_empty() && applied.failed.is_empty(), "{applied:?}");
    let report = f.runtime.execute(DropChanges { job: outcome.job.clone(), patterns: Vec::new() }).unwrap();
    assert_eq!(report.dropped.iter().map(|c| c.path.display_escaped()).collect::<Vec<_>>(), vec!["two.txt"]);
    assert_eq!(report.already_applied, 1);
    assert!(f.workspace.join("one.txt").exists(), "the applied change stays");
    assert!(!f.workspace.join("two.txt").exists());
}

#[test]
fn effects_of_a_job_that_does_not_exist_name_it() {
    let f = fixture(vec![]);
    let missing: JobId = "j-000000000000".parse().unwrap_or_else(|_| JobId::generate());
    let err = f.runtime.execute(DropChanges { job: missing.clone(), patterns: Vec::new() }).unwrap_err();
    assert!(err.to_string().contains(&missing.to_string()) || err.to_string().contains("job"), "{err}");
}

// ---- checkpoints and gc ------------------------------------------------------------

#[test]
fn a_workspace_checkpoint_forks_a_job_that_sees_the_parents_files() {
    let f = fixture(vec![Script::exits(0, &[("from-parent.txt", "p")]), Script::exits(0, &[])]);
    let parent = f.run();
    let (manifest, _hold) = f.runtime.execute(CheckpointWorkspace { job: parent.job.clone() }).unwrap();
    let mut fork = request(&f.workspace);
    fork.fork = Some(manifest.id.clone());
    let child = f.run_request(fork);
    let journal = f.fake.journal();
    let child_upper = &journal.started[1].upper;
    assert!(child_upper.join("from-parent.txt").exists(), "the fork starts from the parent's stage");
    drop(journal);
    let status = f.status(&child.job);
    assert!(status.lineage.is_some(), "the fork records its parent");
}

#[test]
fn a_running_job_cannot_be_checkpointed_as_a_workspace() {
    let f = fixture(vec![Script::runs_until(&[libc::SIGTERM])]);
    block_on(async {
        let run = f.start();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let err = f.runtime.execute(CheckpointWorkspace { job: run.job().clone() }).unwrap_err();
        assert!(err.to_string().contains("running") || err.to_string().contains("confirmed"), "{err}");
        f.cancel(run).await;
    });
}

#[test]
fn gc_frees_a_dropped_stage_and_a_dry_run_frees_nothing() {
    let f = fixture(vec![Script::exits(0, &[("big.bin", "0123456789")])]);
    let outcome = f.run();
    f.runtime.execute(DropChanges { job: outcome.job.clone(), patterns: Vec::new() }).unwrap();
    let stage = f.status(&outcome.job).stage.join("upper");
    let dry = f.runtime.execute(Gc { age: Duration::ZERO, dry_run: true, force: true }).unwrap();
    assert!(!dry.freed.is_empty(), "{dry:?}");
    assert!(stage.exists(), "a dry run removes nothing");
    let report = f.runtime.execute(Gc { age: Duration::ZERO, dry_run: false, force: true }).unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    assert!(!stage.exists(), "{report:?}");
}

// ---- capabilities: what a backend cannot do is a clear error -----------------------

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
        for _ in 0..100 {
            if f.status(&job).live && f.status(&job).state == JobState::Running {
                break;
            }
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

// ---- working capabilities: checkpoints, suspend, resume, forks, guests -----

use crate::testing::{FakeGuest, GuestRun};
use pvisor_agent_proto::{FileOp, Reply, Request};
use pvisor_vm::guest::ExecSpec;

/// A fixture whose `fake` backend saves, suspends, restores and has a
/// guest; with the Tokio runtime its Sessions run on (two workers, so an
/// action that waits for a Session, as `Suspend` does, can be called from
/// this thread).
fn working(scripts: Vec<Script>, guest: Arc<FakeGuest>) -> (Fixture, tokio::runtime::Handle) {
    let mut f = fixture(scripts);
    let capabilities = Arc::new(FakeCheckpointer::working_with(&f.fake, guest));
    let backends =
        Arc::new(FakeBackends { executor: f.fake.clone(), capabilities: Some(capabilities.clone()) });
    f.runtime = Runtime::new(f.runtime.store().clone(), backends);
    f.capabilities = Some(capabilities);
    (f, sessions())
}

/// A Tokio runtime on a thread of its own, as the shim runs its Sessions:
/// an action that waits for a Session (`Suspend`) may block this thread.
fn sessions() -> tokio::runtime::Handle {
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let handle = tokio.handle().clone();
    std::thread::spawn(move || tokio.block_on(std::future::pending::<()>()));
    handle
}

impl Fixture {
    /// Starts a keeper-like Job (runs until SIGTERM) and waits until it runs.
    fn start_live(&self, tokio: &tokio::runtime::Handle) -> crate::ManagedJobRun {
        let _inside = tokio.enter();
        let run = self.start();
        self.await_running(run.job());
        run
    }

    fn await_running(&self, job: &JobId) {
        // Patient: the machine may be busy with other builds.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            let status = self.status(job);
            if status.live && status.state == JobState::Running {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("{job} never ran: {:?}", self.status(job));
    }
}

fn exec_spec(id: u32, argv: &[&str]) -> ExecSpec {
    ExecSpec {
        id,
        argv: argv.iter().map(|a| (*a).to_owned()).collect(),
        env: Vec::new(),
        cwd: "/".into(),
        root: None,
        output: None,
        terminal: None,
        confinement: None,
    }
}

/// Every reply of a guest exec until its channel ends.
fn replies(channel: &mut pvisor_vm::guest::ExecChannel) -> Vec<(Reply, Vec<u8>)> {
    let mut all = Vec::new();
    while let Some(reply) = channel.next_reply().unwrap() {
        let exited = matches!(reply.0, Reply::Exited { .. } | Reply::ExecFailed { .. });
        all.push(reply);
        if exited {
            break;
        }
    }
    all
}

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

#[test]
fn a_guest_exec_relays_its_scripted_output_and_exit_code() {
    let guest = FakeGuest::new([
        ("echo hello", GuestRun::prints("hello\n", "a warning\n", 3)),
        ("missing-program", GuestRun::fails(libc::ENOENT, "no such file")),
    ]);
    let (f, tokio) = working(vec![Script::runs_until(&[libc::SIGTERM])], guest.clone());
    let run = f.start_live(&tokio);
    let link = f.runtime.execute(OpenGuest { job: run.job().clone(), attempt: None }).unwrap();
    let mut channel = link.exec(exec_spec(2, &["sh", "-c", "echo hello"])).unwrap();
    let got = replies(&mut channel);
    assert!(matches!(got[0].0, Reply::Started { id: 2, .. }), "{got:?}");
    assert_eq!(got[1], (Reply::Stdout { id: 2 }, b"hello\n".to_vec()));
    assert_eq!(got[2], (Reply::Stderr { id: 2 }, b"a warning\n".to_vec()));
    assert_eq!(got[3].0, Reply::Exited { id: 2, code: Some(3), signal: None });
    let mut channel = link.exec(exec_spec(3, &["missing-program"])).unwrap();
    let got = replies(&mut channel);
    assert!(matches!(&got[0].0, Reply::ExecFailed { id: 3, errno, .. } if *errno == libc::ENOENT), "{got:?}");
    assert_eq!(guest.started.lock().unwrap().len(), 2, "both execs reached the guest");
    tokio.block_on(f.cancel(run));
}

#[test]
fn a_running_guest_exec_is_signalled_by_an_agent_call_and_attached_to_again() {
    let guest = FakeGuest::new([("sleep", GuestRun::runs("started\n"))]);
    let (f, tokio) = working(vec![Script::runs_until(&[libc::SIGTERM])], guest);
    let run = f.start_live(&tokio);
    let link = f.runtime.execute(OpenGuest { job: run.job().clone(), attempt: None }).unwrap();
    let mut channel = link.exec(exec_spec(5, &["sleep", "100"])).unwrap();
    assert!(matches!(channel.next_reply().unwrap().unwrap().0, Reply::Started { id: 5, .. }));
    assert_eq!(channel.next_reply().unwrap().unwrap(), (Reply::Stdout { id: 5 }, b"started\n".to_vec()));
    let timeout = Duration::from_secs(5);
    let (status, _) = link.call(&Request::Status { id: 5 }, &[], timeout).unwrap();
    assert_eq!(status, Reply::Status { id: 5, running: true, code: None, signal: None });
    link.call(&Request::Signal { id: 5, signal: libc::SIGTERM }, &[], timeout).unwrap();
    assert_eq!(
        channel.next_reply().unwrap().unwrap().0,
        Reply::Exited { id: 5, code: None, signal: Some(libc::SIGTERM) }
    );
    let (status, _) = link.call(&Request::Status { id: 5 }, &[], timeout).unwrap();
    assert_eq!(status, Reply::Status { id: 5, running: false, code: None, signal: Some(libc::SIGTERM) });
    let mut again = link.attach(5).unwrap();
    assert_eq!(
        again.next_reply().unwrap().unwrap().0,
        Reply::Exited { id: 5, code: None, signal: Some(libc::SIGTERM) }
    );
    tokio.block_on(f.cancel(run));
}

#[test]
fn guest_file_calls_act_beneath_the_root_they_name() {
    let (f, tokio) = working(vec![Script::runs_until(&[libc::SIGTERM])], Arc::default());
    let run = f.start_live(&tokio);
    let link = f.runtime.execute(OpenGuest { job: run.job().clone(), attempt: None }).unwrap();
    let (root, timeout) = (f.workspace.clone(), Duration::from_secs(5));
    let op = |op| Request::FileOp { root: root.clone(), op };
    link.call(&op(FileOp::Mkdir { path: "/data".into(), mode: 0o755 }), &[], timeout).unwrap();
    let write = Request::WriteFile { path: root.join("data/a.txt"), mode: 0o600, append: false };
    link.call(&write, b"one ", timeout).unwrap();
    let append = Request::WriteFile { path: root.join("data/a.txt"), mode: 0o600, append: true };
    link.call(&append, b"two", timeout).unwrap();
    let read = Request::ReadFile { path: root.join("data/a.txt"), offset: 4, len: Some(3) };
    assert_eq!(link.call(&read, &[], timeout).unwrap().1, b"two");
    match link.call(&op(FileOp::Stat { path: "/data/a.txt".into() }), &[], timeout).unwrap().0 {
        Reply::Stat { stat } => assert_eq!((stat.size, stat.mode), (7, 0o600)),
        other => panic!("{other:?}"),
    }
    match link.call(&op(FileOp::List { path: "/".into(), depth: 2 }), &[], timeout).unwrap().0 {
        Reply::Listing { entries, .. } => {
            let names: Vec<_> = entries.iter().map(|e| e.path.display().to_string()).collect();
            assert_eq!(names, ["data", "data/a.txt", "kept.txt"]);
        }
        other => panic!("{other:?}"),
    }
    // `..` stops at the root, as in the guest.
    let escape = op(FileOp::Stat { path: "/../../kept.txt".into() });
    assert!(matches!(link.call(&escape, &[], timeout).unwrap().0, Reply::Stat { .. }));
    link.call(&op(FileOp::Remove { path: "/data".into(), recursive: true }), &[], timeout).unwrap();
    assert!(!f.workspace.join("data").exists());
    tokio.block_on(f.cancel(run));
    // An ended Job's guest is not reachable.
    assert!(matches!(
        link.call(&read, &[], timeout),
        Err(pvisor_sandbox::capabilities::CapabilityError::Unreachable(_))
    ));
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

fn keeper(workspace: &std::path::Path) -> Box<Keeper> {
    Box::new(Keeper {
        workspace: workspace.to_owned(),
        limits: Default::default(),
        labels: Default::default(),
        network: Vec::new(),
        network_namespace: None,
        shared_directories: Vec::new(),
        kill_grace: Duration::from_millis(300),
    })
}

fn ready(root: &std::path::Path) -> Readiness {
    Readiness { root: root.to_owned(), timeout: Duration::from_secs(20), poll: Duration::from_millis(5) }
}

#[test]
fn a_held_guest_answers_when_the_hold_returns_and_a_resumed_hold_is_a_new_attempt() {
    let (f, tokio) = working(Vec::new(), Arc::default());
    f.fake.push(Script::runs_until(&[libc::SIGTERM]));
    f.fake.push(Script::runs_until(&[libc::SIGTERM]));
    let hold = Hold::New { keeper: keeper(&f.workspace), backend: "fake".into() };
    let held = {
        let _inside = tokio.enter();
        f.runtime.execute(HoldGuest { hold, ready: Some(ready(&f.workspace)) }).unwrap()
    };
    let job = held.job().clone();
    let spec = f.fake.journal().started[0].clone();
    assert_eq!((spec.program.as_str(), spec.args[1].as_str()), ("/bin/sh", guest::KEEPER), "the keeper runs");
    let guest = held.guest.clone().expect("the hold waited for the guest");
    let probe = Request::FileOp { root: f.workspace.clone(), op: FileOp::Stat { path: "/kept.txt".into() } };
    assert!(matches!(guest.call(&probe, &[], Duration::from_secs(5)).unwrap().0, Reply::Stat { .. }));
    f.runtime.execute(Suspend { job: job.clone() }).unwrap();
    let resumed = {
        let _inside = tokio.enter();
        f.runtime
            .execute(HoldGuest { hold: Hold::Resume(job.clone()), ready: Some(ready(&f.workspace)) })
            .unwrap()
    };
    assert_eq!(resumed.job(), &job);
    assert_eq!(resumed.guest.as_ref().unwrap().attempt().number(), 2, "the guest of the new Attempt");
    resumed.cancel_handle().cancel(libc::SIGTERM);
    let mut run = resumed.run;
    let end = tokio.block_on(run.wait());
    assert!(end.is_ok(), "{end:?}");
    assert_eq!(f.status(&job).state, JobState::Cancelled);
}

#[test]
fn a_hold_whose_keeper_ends_before_its_guest_answers_fails_naming_the_end() {
    let (f, tokio) = working(vec![Script::exits(1, &[])], Arc::default());
    let hold = Hold::New { keeper: keeper(&f.workspace), backend: "fake".into() };
    let err = {
        let _inside = tokio.enter();
        f.runtime.execute(HoldGuest { hold, ready: Some(ready(&f.workspace)) }).unwrap_err()
    };
    match err {
        RuntimeError::GuestNotReady { why: NotReady::Ended(state), .. } => {
            assert_eq!(state, JobState::Failed)
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_awaited_guest_stops_waiting_when_the_caller_gives_up() {
    let (f, tokio) = working(vec![Script::runs_until(&[libc::SIGTERM])], Arc::default());
    let run = f.start_live(&tokio);
    let wait = AwaitGuest {
        job: run.job().clone(),
        attempt: Some(7),
        ready: ready(&f.workspace),
        give_up: Some(Box::new(|| Some("its supervisor exited".into()))),
    };
    let err = f.runtime.execute(wait).unwrap_err();
    assert!(
        matches!(&err, RuntimeError::GuestNotReady { why: NotReady::GaveUp(w), .. } if w == "its supervisor exited"),
        "{err:?}"
    );
    tokio.block_on(f.cancel(run));
}
