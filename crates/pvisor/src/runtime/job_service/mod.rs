//! The durable Job service: owns completion publication.
//!
//! [`JobService::submit`] admits a request and hands the Session to a Tokio
//! task, the [`ManagedJobRun`]'s runtime side, which joins the Attempt,
//! finalizes it and then publishes the Job state. Frontends hold only the wait
//! adapter. A failed or dropped wait requests cancellation, but accepted
//! completion work keeps reconciling and publishing as long as the Tokio
//! runtime lives. (Runtime shutdown and process exit are recovery's problem:
//! the owner lock is released and readers see `unknown` without a receipt.)

pub mod views;

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use pvisor_core::ids::{AttemptId, JobId, RunId};
use pvisor_core::records::{ChangeEntry, JobRecord, RunResult};
use pvisor_core::store::{Store, StoreError};
use pvisor_core::time::Timestamp;
use pvisor_sandbox::Executor;

use super::attempt::AttemptError;
use super::registry::{LiveAttempt, Registry};
use crate::admission::{self, AdmissionError, RunRequest};
use crate::session::Session;

/// What a finished run produced. The result is the one bound by the receipt.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub job: JobId,
    pub run: RunId,
    pub attempt: AttemptId,
    pub workspace: PathBuf,
    pub result: RunResult,
    pub changes: Vec<ChangeEntry>,
    pub bundle_blake3: String,
    /// The network attachment and what went through the proxy.
    pub network: Option<pvisor_core::records::NetworkObservation>,
    /// Non-fatal problems recorded in the Bundle.
    pub warnings: Vec<String>,
    /// Facts that could not be recorded after the receipt committed.
    pub audit_gaps: Vec<String>,
    pub(crate) job_record: JobRecord,
}

/// What went wrong underneath a finalization step.
#[derive(Debug, thiserror::Error)]
pub enum FinalizeSource {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Stage(#[from] pvisor_stage::StageError),
    #[error(transparent)]
    Attempt(#[from] AttemptError),
}

/// A run whose result could not be confirmed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(
        "Finalization of {attempt} (job {job}) failed while {step}; its result is unconfirmed (state: unknown) and the stage is kept at {}",
        stage.display()
    )]
    Finalize {
        step: &'static str,
        job: JobId,
        attempt: AttemptId,
        stage: PathBuf,
        #[source]
        source: Box<FinalizeSource>,
    },
    #[error("The run task of job {job} ended without reporting; its result is unconfirmed")]
    Lost { job: JobId },
}

/// Requests cancellation of a live Attempt by forwarding a signal to it.
#[derive(Clone, Debug)]
pub struct CancelHandle {
    tx: mpsc::UnboundedSender<i32>,
}

impl CancelHandle {
    /// Forwards `signal` and marks the run cancelled; a second request kills it.
    pub fn cancel(&self, signal: i32) {
        let _ = self.tx.send(signal);
    }
}

/// The frontend's wait adapter for one submitted run.
#[derive(Debug)]
pub struct ManagedJobRun {
    job: JobId,
    attempt: AttemptId,
    cancel: CancelHandle,
    outcome: Option<oneshot::Receiver<Result<RunOutcome, RunError>>>,
}

impl ManagedJobRun {
    pub fn job(&self) -> &JobId {
        &self.job
    }

    pub fn attempt(&self) -> &AttemptId {
        &self.attempt
    }

    /// Returns a handle that can cancel the run from elsewhere.
    pub fn cancel_handle(&self) -> CancelHandle {
        self.cancel.clone()
    }

    /// Waits for the published outcome. Cancel-safe: dropping the future
    /// leaves the adapter usable.
    pub async fn wait(&mut self) -> Result<RunOutcome, RunError> {
        let Some(rx) = self.outcome.as_mut() else {
            return Err(RunError::Lost { job: self.job.clone() });
        };
        let result = rx.await.unwrap_or_else(|_| Err(RunError::Lost { job: self.job.clone() }));
        self.outcome = None;
        result
    }
}

impl Drop for ManagedJobRun {
    /// A frontend that stops waiting withdraws its interest: the run is
    /// cancelled, and the runtime task still finalizes and publishes it.
    fn drop(&mut self) {
        if self.outcome.is_some() {
            self.cancel.cancel(libc::SIGTERM);
        }
    }
}

/// The Job service. Cheap to clone.
#[derive(Clone, Debug)]
pub struct JobService {
    store: Store,
    executor: Arc<dyn Executor>,
    registry: Registry,
}

impl JobService {
    pub fn new(store: Store, executor: Arc<dyn Executor>) -> Self {
        Self { store, executor, registry: Registry::default() }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The live Attempts this process owns.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Admits `request` and starts it on the current Tokio runtime.
    pub fn submit(&self, request: RunRequest) -> Result<ManagedJobRun, AdmissionError> {
        let admitted = admission::admit(&self.store, self.executor.name(), request)?;
        let job = admitted.job_id().clone();
        let attempt = admitted.attempt_id().clone();
        let (cancel_tx, cancel_rx) = mpsc::unbounded_channel();
        let cancel = CancelHandle { tx: cancel_tx };
        self.registry.insert(LiveAttempt {
            job: job.clone(),
            attempt: attempt.clone(),
            cancel: cancel.clone(),
        });
        let session = Session::new(self.store.clone(), self.executor.clone(), admitted);
        let (done_tx, done_rx) = oneshot::channel();
        let service = self.clone();
        let task_attempt = attempt.clone();
        tokio::spawn(async move {
            let outcome = session.run(cancel_rx).await;
            let outcome = outcome.map(|o| service.publish_job(o));
            service.registry.remove(&task_attempt);
            let _ = done_tx.send(outcome);
        });
        Ok(ManagedJobRun { job, attempt, cancel, outcome: Some(done_rx) })
    }

    /// Publishes the Job state after joining the Attempt, if the Job still
    /// targets it. A failure is an audit gap: the receipt already holds the truth.
    fn publish_job(&self, mut outcome: RunOutcome) -> RunOutcome {
        // Read the Job afresh: `kill` may have closed it, or it may target
        // another Attempt by now, and an old result must not overwrite that.
        let mut job = self
            .store
            .read(&self.store.job_file(&outcome.job))
            .unwrap_or_else(|_| outcome.job_record.clone());
        if job.target_attempt != outcome.attempt.number() || job.state.is_terminal() {
            outcome.job_record = job;
            return outcome;
        }
        match job.state.transition(outcome.result.state.job_state()) {
            Ok(state) => {
                job.state = state;
                job.updated_at = Timestamp::now();
                if let Err(e) = self.store.write(&self.store.job_file(&job.id), &job) {
                    outcome.audit_gaps.push(format!("job.json not updated: {e}"));
                }
            }
            Err(e) => outcome.audit_gaps.push(format!("job state not published: {e}")),
        }
        outcome.job_record = job;
        outcome
    }
}
