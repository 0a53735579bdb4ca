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
use pvisor_core::state::JobState;
use pvisor_core::store::{Store, StoreError};
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
    /// A resume whose restore failed: the suspended Attempt the Job still targets.
    pub restore_failed_from: Option<u32>,
    pub(crate) job_record: JobRecord,
    pub(crate) owner: OwnerHold,
}

/// A vm Attempt that was suspended: saved to `checkpoint`, its VM stopped
/// and a termination receipt committed. The Job continues with `resume`.
#[derive(Debug, Clone)]
pub struct SuspendedOutcome {
    pub job: JobId,
    pub run: RunId,
    pub attempt: AttemptId,
    pub checkpoint: Box<pvisor_vm::ExecCheckpoint>,
    /// How the QEMU process ended.
    pub vm_exit: String,
    pub audit_gaps: Vec<String>,
    pub(crate) job_record: JobRecord,
    pub(crate) owner: OwnerHold,
}

/// The Attempt's owner lock, carried from finalization until the Job state
/// is published: while it is held no reader may recover the Job, and a
/// reader that finds it free finds `job.json` already terminal (a reader
/// that saw it free before would append a false `recovery.reconciled`).
#[derive(Debug, Clone, Default)]
pub(crate) struct OwnerHold(Option<std::sync::Arc<pvisor_core::store::OwnerLock>>);

impl OwnerHold {
    pub(crate) fn new(lock: pvisor_core::store::OwnerLock) -> Self {
        Self(Some(std::sync::Arc::new(lock)))
    }

    /// Gives the lock up (when the last copy is released).
    fn release(&mut self) {
        self.0.take();
    }
}

/// How an Attempt ended: finished with a completion receipt, or suspended.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // one per run, moved a handful of times
pub enum RunEnd {
    Finished(RunOutcome),
    Suspended(SuspendedOutcome),
}

impl RunEnd {
    /// The finished outcome, or `None` for a suspension.
    pub fn finished(self) -> Option<RunOutcome> {
        match self {
            Self::Finished(o) => Some(o),
            Self::Suspended(_) => None,
        }
    }
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
    #[error(transparent)]
    Suspension(#[from] super::suspension::SuspensionError),
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
    outcome: Option<oneshot::Receiver<Result<RunEnd, RunError>>>,
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
    pub async fn wait(&mut self) -> Result<RunEnd, RunError> {
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
        let admitted = admission::admit(&self.store, self.executor.as_ref(), request)?;
        Ok(self.start(admitted))
    }

    /// Resumes a suspended vm Job in a new Attempt (see [`admission::admit_resume`]).
    pub fn resume(&self, job: &JobId) -> Result<ManagedJobRun, AdmissionError> {
        let admitted = admission::admit_resume(&self.store, self.executor.as_ref(), job)?;
        Ok(self.start(admitted))
    }

    fn start(&self, admitted: admission::Admitted) -> ManagedJobRun {
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
        ManagedJobRun { job, attempt, cancel, outcome: Some(done_rx) }
    }

    /// Publishes the Job state after joining the Attempt, if the Job still
    /// targets it. A failure is an audit gap: the receipt already holds the truth.
    fn publish_job(&self, end: RunEnd) -> RunEnd {
        let (job_id, attempt, target, record) = match &end {
            RunEnd::Finished(o) => (&o.job, &o.attempt, o.result.state.job_state(), &o.job_record),
            RunEnd::Suspended(s) => (&s.job, &s.attempt, JobState::Suspended, &s.job_record),
        };
        // Read-modify-write under the Job's lock: `kill` may have closed it,
        // or it may target another Attempt by now, and an old result must
        // not overwrite that.
        let mut gaps = Vec::new();
        let failed_restore = match &end {
            RunEnd::Finished(o) => o.restore_failed_from,
            RunEnd::Suspended(_) => None,
        };
        let updated = crate::runtime::recovery::update_job(&self.store, job_id, |job| {
            if let Some(previous) = failed_restore.filter(|_| job.target_attempt == attempt.number()) {
                // The Job stays suspended on its intact checkpoint; this Attempt's
                // failure is recorded in its own receipt and events.
                job.target_attempt = previous;
                return true;
            }
            if job.target_attempt != attempt.number() || job.state.is_terminal() {
                return false;
            }
            match job.state.transition(target) {
                Ok(state) => {
                    job.state = state;
                    true
                }
                Err(e) => {
                    gaps.push(format!("job state not published: {e}"));
                    false
                }
            }
        });
        let job = updated.unwrap_or_else(|e| {
            gaps.push(format!("job.json not updated: {e}"));
            record.clone()
        });
        // Only now, with job.json published, may readers recover the Job.
        match end {
            RunEnd::Finished(mut o) => {
                o.audit_gaps.extend(gaps);
                o.job_record = job;
                o.owner.release();
                RunEnd::Finished(o)
            }
            RunEnd::Suspended(mut s) => {
                s.audit_gaps.extend(gaps);
                s.job_record = job;
                s.owner.release();
                RunEnd::Suspended(s)
            }
        }
    }
}
