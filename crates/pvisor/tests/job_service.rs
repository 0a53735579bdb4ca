//! The Job service as an embedder uses it: real sandboxes, real records.
//!
//! The `ns` executor re-executes the current binary as its namespace helper,
//! so this test has its own `main` that hands over to the helper first, as
//! every embedding binary must.

// A test (or benchmark) program: it writes fixtures and says what it measured
// or skipped; clippy.toml's lints are for the libraries' own code.
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use pvisor::actions::Status;
use pvisor::{JobService, JobStatus, ReceiptStatus, RunRequest, Runtime, RuntimeError};
use pvisor_core::state::JobState;
use pvisor_core::store::Store;
use pvisor_ns::NsExecutor;

/// A Job's status, read through the runtime's door.
fn status(store: &Store, job: &pvisor_core::ids::JobId) -> Result<JobStatus, RuntimeError> {
    Runtime::on_host(store.clone()).execute(Status { job: job.clone() })
}

fn request(workspace: &std::path::Path, script: &str) -> RunRequest {
    RunRequest {
        caches: Vec::new(),
        state: Vec::new(),
        state_from: None,
        labels: Default::default(),
        network_namespace: None,
        shared_directories: Vec::new(),
        image: None,
        output: None,
        workspace: workspace.to_owned(),
        cwd: None,
        program: "sh".into(),
        args: vec!["-c".into(), script.into()],
        env: vec![("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())],
        kill_grace: Duration::from_secs(5),
        network: Vec::new(),
        fork: None,
        fork_execution: None,
        secrets: Default::default(),
        seccomp: true,
        limits: Default::default(),
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    workspace: std::path::PathBuf,
    service: JobService,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("ws");
    std::fs::create_dir(&workspace).unwrap();
    let store = Store::open(dir.path().join("state")).unwrap();
    Fixture { _dir: dir, workspace, service: JobService::new(store, Arc::new(NsExecutor)) }
}

async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A frontend that drops its wait adapter cancels the run, and the runtime
/// task still finalizes it and publishes a valid receipt.
async fn a_dropped_wait_cancels_and_completion_is_still_published() {
    let f = fixture();
    let run = f.service.submit(request(&f.workspace, "echo staged > f; sleep 30")).unwrap();
    let job = run.job().clone();
    let store = f.service.store().clone();
    // Running is recorded before the command forks: wait for its write too.
    let staged = store.stage_dir(run.attempt().run()).join("upper/f");
    wait_for("the command to write", || staged.exists()).await;
    assert_eq!(f.service.registry().list().len(), 1);
    drop(run);
    wait_for("the receipt", || {
        status(&store, &job).map(|s| s.receipt == ReceiptStatus::Valid).unwrap_or(false)
    })
    .await;
    let status = status(&store, &job).unwrap();
    assert_eq!(status.state, JobState::Cancelled);
    assert_eq!(status.signal, Some(libc::SIGTERM));
    assert_eq!(status.changes, Some(1));
    wait_for("the registry to forget the run", || f.service.registry().list().is_empty()).await;
}

/// The wait adapter returns the result bound by the receipt.
async fn waiting_returns_the_receipted_result() {
    let f = fixture();
    let mut run = f.service.submit(request(&f.workspace, "echo a > a; exit 9")).unwrap();
    let outcome = run.wait().await.unwrap().finished().expect("an ns run is never suspended");
    assert_eq!(outcome.result.exit_code, Some(9));
    assert_eq!(outcome.changes.len(), 1);
    assert!(outcome.audit_gaps.is_empty(), "{:?}", outcome.audit_gaps);
    let status = status(f.service.store(), &outcome.job).unwrap();
    assert_eq!(status.state, JobState::Failed);
    assert_eq!(status.receipt, ReceiptStatus::Valid);
}

/// Cancelling through a handle forwards the signal to the command.
async fn a_cancel_handle_forwards_the_signal() {
    let f = fixture();
    let mut run = f
        .service
        .submit(request(&f.workspace, "trap 'exit 42' USR1; touch ready; while :; do sleep 0.05; done"))
        .unwrap();
    // Once the trap is set (it says so by staging `ready`), not after a
    // fixed delay: a USR1 before it would kill the shell.
    let ready = f.service.store().stage_dir(run.attempt().run()).join("upper/ready");
    wait_for("the trap to be set", || ready.exists()).await;
    run.cancel_handle().cancel(libc::SIGUSR1);
    let outcome = run.wait().await.unwrap().finished().expect("an ns run is never suspended");
    assert_eq!(outcome.result.exit_code, Some(42));
    assert_eq!(outcome.result.state, pvisor_core::state::ResultState::Cancelled);
}

type TestCase = std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

fn main() {
    pvisor_ns::maybe_run_helper();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let tests: Vec<(&str, TestCase)> = vec![
        (
            "a_dropped_wait_cancels_and_completion_is_still_published",
            Box::pin(a_dropped_wait_cancels_and_completion_is_still_published()),
        ),
        ("waiting_returns_the_receipted_result", Box::pin(waiting_returns_the_receipted_result())),
        ("a_cancel_handle_forwards_the_signal", Box::pin(a_cancel_handle_forwards_the_signal())),
    ];
    let mut passed = 0;
    let total = tests.len();
    for (name, test) in tests {
        runtime.block_on(test);
        println!("test {name} ... ok");
        passed += 1;
    }
    println!("job_service: {passed} passed, {} failed", total - passed);
}
