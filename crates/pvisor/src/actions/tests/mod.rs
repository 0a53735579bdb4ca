//! Unit tests of the runtime through its action API, on the recording fake
//! backend (`crate::testing`): admission, the Session's finalization, the
//! Job service, cancellation, kill, effects, gc and the capability checks.
//! Real processes, overlays and VMs are the end-to-end suite's.
//!
//! One file per subject; the fixtures they share (a runtime on the fakes,
//! refusing or working, and the guest exec helpers) are here.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pvisor_agent_proto::{FileOp, Reply, Request};
use pvisor_core::ids::JobId;
use pvisor_core::records::{ChangeKind, JobRecord};
use pvisor_core::state::{JobState, ResultState};
use pvisor_core::store::Store;
use pvisor_sandbox::Termination;
use pvisor_vm::guest::ExecSpec;

use super::*;
use crate::effects::{ApplyOptions, Selection};
use crate::records::views::ReceiptStatus;
use crate::runtime::kill::Killed;
use crate::testing::{FakeBackends, FakeCheckpointer, FakeExecutor, FakeGuest, GuestRun, Script};
use crate::{RunEnd, RunOutcome, RunRequest};

mod cancel_and_kill;
mod capabilities;
mod effects;
mod guest_access;
mod runs;
mod sessions;
mod working;

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
        state: Vec::new(),
        state_from: None,
        labels: Default::default(),
        network_namespace: None,
        shared_directories: Vec::new(),
        image: None,
        output: None,
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
