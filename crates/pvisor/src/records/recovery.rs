//! Recovery on read: settle an Attempt whose owner is gone.
//!
//! Every read and mutating command calls [`recover`] first. For a Job whose
//! target Attempt is no longer held by its owner:
//! - a valid receipt reconciles the Attempt, Run and Job, but only while the
//!   Job still targets that Attempt and has not ended otherwise (an old result
//!   never overwrites a Job that moved on or was closed by `kill`);
//! - no receipt: the Job (and Run) become `unknown`, the stage is kept;
//! - a corrupt or foreign receipt, or a digest mismatch, is an error naming
//!   the file, and nothing is written.
//!
//! Recovery holds `jobs/<job>/recover.lock`, so two processes recovering the
//! same Job at once serialize and only the first one records anything.

use pvisor_core::event::EventKind;
use pvisor_core::ids::{AttemptId, JobId};
use pvisor_core::records::{AttemptRecord, JobRecord, RunRecord};
use pvisor_core::state::{AttemptState, JobState};
use pvisor_core::store::{OwnerLock, Store};
use pvisor_core::time::Timestamp;

use super::views::ViewError;
use super::{completion, suspension};
use crate::trace::{data, Trace};

/// What recovery found (and did).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovered {
    /// The Job had already ended; nothing to do.
    Settled,
    /// A live owner holds the Attempt.
    Live,
    /// A valid receipt was found and the records now project it.
    Reconciled(JobState),
    /// No receipt and no owner: the Job is now `unknown`.
    Unknown,
}

fn target_attempt(job: &JobRecord) -> AttemptId {
    AttemptId::new(job.run.clone(), job.target_attempt)
}

pub(crate) fn append_event(
    store: &Store,
    job: &JobRecord,
    kind: EventKind,
    data: &impl serde::Serialize,
) -> Result<(), ViewError> {
    Trace::open(store, &job.run).emit(kind, Some(job.target_attempt), None, data, true)?;
    Ok(())
}

/// Holds the Job's recovery lock: the one writer of recovery facts.
pub(crate) fn lock_job(store: &Store, job: &JobId) -> Result<OwnerLock, ViewError> {
    Ok(OwnerLock::acquire_blocking(&store.job_dir(job).join("recover.lock"))?)
}

/// Changes `job.json` by read-modify-write under the Job's record lock, so
/// a concurrent `kill` (which withdraws continuation) or recovery is never
/// overwritten by a stale copy. Returns the record as written (or as found,
/// when `change` returns `false` and nothing is written).
pub(crate) fn update_job(
    store: &Store,
    job_id: &JobId,
    change: impl FnOnce(&mut JobRecord) -> bool,
) -> Result<JobRecord, pvisor_core::store::StoreError> {
    let _guard = OwnerLock::acquire_blocking(&store.job_dir(job_id).join("recover.lock"))?;
    let mut job: JobRecord = store.read(&store.job_file(job_id))?;
    if change(&mut job) {
        job.updated_at = Timestamp::now();
        store.write(&store.job_file(job_id), &job)?;
    }
    Ok(job)
}

/// Projects a receipt's outcome onto the Attempt and the Job (each only if
/// its lifecycle allows the move) and records `recovery.reconciled`.
fn reconcile(
    store: &Store,
    job: &mut JobRecord,
    attempt_id: &AttemptId,
    attempt_state: AttemptState,
    state: JobState,
) -> Result<(), ViewError> {
    let now = Timestamp::now();
    let mut attempt: AttemptRecord = store.read(&store.attempt_file(attempt_id))?;
    if let Ok(next) = attempt.state.transition(attempt_state) {
        attempt.state = next;
        attempt.updated_at = now;
        store.write(&store.attempt_file(attempt_id), &attempt)?;
    }
    if job.state.can_transition(state) {
        job.state = state;
        job.updated_at = now;
        store.write(&store.job_file(&job.id), job)?;
        let reconciled = data::RecoveryReconciled { state, attempt: attempt_id };
        append_event(store, job, EventKind::RecoveryReconciled, &reconciled)?;
    }
    Ok(())
}

/// Recovers `job` if its owner is gone (see the module doc).
pub fn recover(store: &Store, job_id: &JobId) -> Result<Recovered, ViewError> {
    let job: JobRecord = store.read(&store.job_file(job_id))?;
    if job.state.is_terminal() || matches!(job.state, JobState::Unknown | JobState::Suspended) {
        return Ok(Recovered::Settled);
    }
    let attempt_id = target_attempt(&job);
    if OwnerLock::is_held(&store.lock_file(&attempt_id))? {
        return Ok(Recovered::Live);
    }
    let _guard = lock_job(store, job_id)?;
    // Re-read under the lock: another process may have just recovered it.
    let mut job: JobRecord = store.read(&store.job_file(job_id))?;
    if job.state.is_terminal() || matches!(job.state, JobState::Unknown | JobState::Suspended) {
        return Ok(Recovered::Settled);
    }
    if OwnerLock::is_held(&store.lock_file(&attempt_id))? {
        return Ok(Recovered::Live);
    }
    let now = Timestamp::now();
    let mut run: RunRecord = store.read(&store.run_file(&job.run))?;
    match completion::load(store, job_id, &attempt_id)? {
        Some((receipt, _bundle)) => {
            let state = receipt.result.state.job_state();
            if run.result.is_none() || run.state != state {
                run.result = Some(receipt.result.clone());
                run.state = state;
                run.updated_at = now;
                store.write(&store.run_file(&run.id), &run)?;
            }
            reconcile(store, &mut job, &attempt_id, receipt.result.state.attempt_state(), state)?;
            Ok(Recovered::Reconciled(state))
        }
        None if suspension::load(store, job_id, &attempt_id)
            .map_err(|e| ViewError::Suspension(Box::new(e)))?
            .is_some() =>
        {
            // The supervisor died after the termination receipt: finish its records.
            if run.state.can_transition(JobState::Suspended) {
                run.state = JobState::Suspended;
                run.updated_at = now;
                store.write(&store.run_file(&run.id), &run)?;
            }
            reconcile(store, &mut job, &attempt_id, AttemptState::Hibernated, JobState::Suspended)?;
            Ok(Recovered::Reconciled(JobState::Suspended))
        }
        None => {
            job.state = job.state.transition(JobState::Unknown).map_err(|e| {
                ViewError::Store(pvisor_core::store::StoreError::Io {
                    op: "recover",
                    path: store.job_file(job_id),
                    source: std::io::Error::other(e),
                })
            })?;
            job.updated_at = now;
            store.write(&store.job_file(job_id), &job)?;
            // run.json may already carry an unconfirmed result; only a run that
            // never got that far is marked unknown too.
            if run.state.can_transition(JobState::Unknown) {
                run.state = JobState::Unknown;
                run.updated_at = now;
                store.write(&store.run_file(&run.id), &run)?;
            }
            let unknown = data::RecoveryUnknown {
                attempt: &attempt_id,
                reason: "the owner exited without a completion receipt; the stage is kept",
            };
            append_event(store, &job, EventKind::RecoveryUnknown, &unknown)?;
            Ok(Recovered::Unknown)
        }
    }
}
