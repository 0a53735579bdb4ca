//! The records of a new Job: its Operation, and the Run, Attempt and Job
//! files, created in the one order that is safe against a crash.
//!
//! The owner lock is taken first, so a reader never "recovers" a Job that is
//! still being created; the Job is published last and whole, so a Job file
//! never points at a missing Run. A crash in between leaves an unreferenced
//! Run that gc removes.

use std::path::PathBuf;

use pvisor_core::ids::{AttemptId, JobId, RunId};
use pvisor_core::records::{
    AttemptRecord, EffectivePolicy, JobRecord, Lineage, Operation, Placement, RunRecord, FORMAT,
};
use pvisor_core::state::{AttemptState, JobState};
use pvisor_core::store::{self, OwnerLock, Store, StoreError};
use pvisor_core::time::Timestamp;

/// The Operation the Run records: what runs (the environment by name only)
/// and the decisions admission fixed.
pub(super) fn operation(
    program: &str,
    args: &[String],
    cwd: PathBuf,
    env: &[(String, String)],
    policy: EffectivePolicy,
    placement: Placement,
) -> Operation {
    Operation {
        kind: pvisor_core::records::OperationKind::RunExecute,
        program: program.to_owned(),
        args: args.to_vec(),
        cwd,
        env_names: {
            let mut names: Vec<String> = env.iter().map(|(k, _)| k.clone()).collect();
            names.sort();
            names
        },
        policy,
        placement,
    }
}

/// A new Attempt's record: preparing, owned by this process.
pub(super) fn new_attempt(id: &AttemptId, job: &JobId, executor: &str, now: Timestamp) -> AttemptRecord {
    AttemptRecord {
        format: FORMAT,
        id: id.clone(),
        job: job.clone(),
        executor: executor.to_owned(),
        state: AttemptState::Preparing,
        created_at: now,
        updated_at: now,
        started_at: None,
        owner_pid: std::process::id(),
    }
}

/// The records of a new Job, as written.
pub(super) struct Created {
    pub(super) job: JobRecord,
    pub(super) run: RunRecord,
    pub(super) attempt: AttemptRecord,
    pub(super) lock: OwnerLock,
}

/// What a new Job's records hold besides its ids.
pub(super) struct NewJob {
    pub(super) now: Timestamp,
    pub(super) workspace: PathBuf,
    pub(super) operation: Operation,
    pub(super) lineage: Option<Lineage>,
    pub(super) executor: String,
    pub(super) labels: pvisor_core::labels::Labels,
}

/// Takes Attempt 1's owner lock (under the shared admission lock), then
/// writes the Run, the Attempt and, last, publishes the Job.
pub(super) fn create(
    store: &Store,
    job_id: &JobId,
    run_id: &RunId,
    attempt_id: &AttemptId,
    new: NewJob,
) -> Result<Created, StoreError> {
    let NewJob { now, workspace, operation, lineage, executor, labels } = new;
    // The owner lock comes first: from the moment any record of this Job
    // exists, a reader sees a live owner and never "recovers" a starting run.
    let creating = OwnerLock::acquire_shared_blocking(&store.admission_lock_file())?;
    let attempt_dir = store.attempt_dir(attempt_id);
    store::create_dir_all_private(&attempt_dir)?;
    let lock = OwnerLock::acquire(&store.lock_file(attempt_id))?;
    drop(creating);
    // The new names made durable ([`store::create_dir_all_durable`]), with
    // one sync fewer: the Run's directory is synced by run.json's write below.
    for parent in [store.run_dir(run_id).parent(), attempt_dir.parent()].into_iter().flatten() {
        store::sync_dir(parent)?;
    }
    let run = RunRecord {
        format: FORMAT,
        id: run_id.clone(),
        job: job_id.clone(),
        created_at: now,
        updated_at: now,
        workspace: workspace.clone(),
        operation,
        state: JobState::Pending,
        attempts: 1,
        result: None,
    };
    store.write(&store.run_file(run_id), &run)?;
    let job = JobRecord {
        format: FORMAT,
        id: job_id.clone(),
        created_at: now,
        updated_at: now,
        workspace,
        run: run_id.clone(),
        state: JobState::Pending,
        target_attempt: 1,
        continuation: true,
        lineage,
        imported_from: None,
        labels,
    };
    let attempt = new_attempt(attempt_id, job_id, &executor, now);
    store.write(&store.attempt_file(attempt_id), &attempt)?;
    // The Job appears last and whole: its directory is renamed into place
    // with job.json inside, so `pvisor jobs` never meets a half-made Job.
    // A crash before this leaves an unreferenced Run that gc removes.
    store.publish_job(&job)?;
    Ok(Created { job, run, attempt, lock })
}
