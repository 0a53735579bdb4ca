//! What a Session ends with: the outcome of a finished or suspended
//! Attempt, or why its result could not be confirmed. The Job service
//! publishes these; they live with the Session, which produces them, so
//! the Session depends on no layer above it.

use std::path::PathBuf;

use pvisor_core::ids::{AttemptId, JobId, RunId};
use pvisor_core::records::{ChangeEntry, JobRecord, RunResult};
use pvisor_core::store::StoreError;

use crate::records::attempt::AttemptError;

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
    pub(crate) fn release(&mut self) {
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
    Suspension(#[from] crate::records::suspension::SuspensionError),
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
