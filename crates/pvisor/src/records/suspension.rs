//! Suspended vm Attempts: termination receipts and the execution checkpoints
//! they point at.
//!
//! A Job is `suspended` only while its target Attempt has a termination
//! receipt whose checkpoint manifest still hashes to the recorded digest.
//! Without one (a supervisor killed mid-suspend), recovery treats the Attempt
//! like any other that lost its owner: `unknown`.

use std::path::PathBuf;

use pvisor_core::ids::{AttemptId, CheckpointId, JobId, RunId};
use pvisor_core::records::{TerminationReceipt, FORMAT};
use pvisor_core::store::{self, Store, StoreError};
use pvisor_core::time::Timestamp;
use pvisor_vm::{checkpoint, ExecCheckpoint};

/// Why a suspension or an execution checkpoint cannot be trusted.
#[derive(Debug, thiserror::Error)]
pub enum SuspensionError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("Termination receipt {path} is invalid: {reason}")]
    Invalid { path: String, reason: String },
    #[error("{0}")]
    Checkpoint(String),
    #[error("Execution checkpoint {id} was not found in job {job}; `pvisor checkpoints` lists them")]
    NotFound { id: String, job: JobId },
    #[error(
        "Job {job} has no execution checkpoint; take one with `pvisor checkpoint {job} --kind execution`"
    )]
    NoneTaken { job: JobId },
}

pub fn checkpoint_dir(store: &Store, run: &RunId, id: &CheckpointId) -> PathBuf {
    store.exec_checkpoints_dir(run).join(id.as_str())
}

/// Commits the termination receipt for a suspension (no-clobber).
pub fn commit(
    store: &Store,
    job: &JobId,
    attempt: &AttemptId,
    manifest: &ExecCheckpoint,
    vm_exit: &str,
) -> Result<TerminationReceipt, SuspensionError> {
    let manifest_path = checkpoint_dir(store, attempt.run(), &manifest.id).join(checkpoint::MANIFEST);
    let bytes = store::read_capped(&manifest_path, 1 << 20)?;
    let receipt = TerminationReceipt {
        format: FORMAT,
        job: job.clone(),
        attempt: attempt.clone(),
        kind: "suspended".into(),
        checkpoint: manifest.id.clone(),
        manifest_blake3: store::blake3_hex(&bytes),
        vm_exit: vm_exit.to_owned(),
        recorded_at: Timestamp::now(),
    };
    store::commit_no_clobber(&store.termination_file(attempt), &store::to_json_bytes(&receipt))?;
    Ok(receipt)
}

/// Loads and checks the termination receipt of `attempt`, if there is one:
/// identity, and the checkpoint manifest's digest (not the multi-megabyte
/// state, which `resume` verifies before it touches any record).
pub fn load(
    store: &Store,
    job: &JobId,
    attempt: &AttemptId,
) -> Result<Option<(TerminationReceipt, ExecCheckpoint)>, SuspensionError> {
    let path = store.termination_file(attempt);
    let receipt: TerminationReceipt = match store.read(&path) {
        Ok(r) => r,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let invalid = |reason: String| SuspensionError::Invalid { path: path.display().to_string(), reason };
    if &receipt.job != job || &receipt.attempt != attempt || receipt.kind != "suspended" {
        return Err(invalid(format!("it names {} of {} ({})", receipt.attempt, receipt.job, receipt.kind)));
    }
    let manifest_path = checkpoint_dir(store, attempt.run(), &receipt.checkpoint).join(checkpoint::MANIFEST);
    let bytes = store::read_capped(&manifest_path, 1 << 20)
        .map_err(|e| invalid(format!("its checkpoint manifest cannot be read: {e}")))?;
    if store::blake3_hex(&bytes) != receipt.manifest_blake3 {
        return Err(invalid(format!("{} does not match the recorded digest", manifest_path.display())));
    }
    let manifest: ExecCheckpoint = serde_json::from_slice(&bytes)
        .map_err(|e| invalid(format!("{} is corrupt: {e}", manifest_path.display())))?;
    Ok(Some((receipt, manifest)))
}

/// Finds an execution checkpoint of `run` (`id`, or the newest) and verifies
/// every file of it.
pub fn find_verified(
    store: &Store,
    job: &JobId,
    run: &RunId,
    id: Option<&str>,
) -> Result<(PathBuf, ExecCheckpoint), SuspensionError> {
    let all = checkpoint::list(&store.exec_checkpoints_dir(run));
    let dir = match id {
        Some(id) => all
            .into_iter()
            .find(|d| d.file_name().is_some_and(|n| n.to_string_lossy().starts_with(id)))
            .ok_or_else(|| SuspensionError::NotFound { id: id.to_owned(), job: job.clone() })?,
        None => all.into_iter().last().ok_or_else(|| SuspensionError::NoneTaken { job: job.clone() })?,
    };
    let manifest = checkpoint::verify(&dir).map_err(|e| SuspensionError::Checkpoint(e.to_string()))?;
    Ok((dir, manifest))
}

/// One listed execution checkpoint: its Job, its directory, and its manifest
/// (parsed, not verified) or why it cannot be read.
/// (The reason is a String: it is shown as text beside the listing, not a failure of it.)
pub type Listing = (JobId, PathBuf, Result<ExecCheckpoint, String>);

/// Every execution checkpoint of every Job, oldest Job first.
pub fn list_all(store: &Store) -> Result<Vec<Listing>, StoreError> {
    let mut out = Vec::new();
    for job_id in store.list_jobs()? {
        let Ok(job) = store.read::<pvisor_core::records::JobRecord>(&store.job_file(&job_id)) else {
            continue;
        };
        for dir in checkpoint::list(&store.exec_checkpoints_dir(&job.run)) {
            let manifest = store::read_capped(&dir.join(checkpoint::MANIFEST), 1 << 20)
                .map_err(|e| e.to_string())
                .and_then(|b| {
                    serde_json::from_slice::<ExecCheckpoint>(&b).map_err(|e| format!("corrupt manifest: {e}"))
                });
            out.push((job_id.clone(), dir, manifest));
        }
    }
    Ok(out)
}

/// The suspension a resume continues from: the newest Attempt with a
/// termination receipt, provided every later Attempt never started (a resume
/// whose restore failed, or whose supervisor died while preparing, does not
/// use the suspension up).
pub fn resumable(
    store: &Store,
    job: &pvisor_core::records::JobRecord,
) -> Result<Option<(AttemptId, TerminationReceipt, ExecCheckpoint)>, SuspensionError> {
    for n in (1..=job.target_attempt).rev() {
        let attempt = AttemptId::new(job.run.clone(), n);
        if let Some((receipt, manifest)) = load(store, &job.id, &attempt)? {
            return Ok(Some((attempt, receipt, manifest)));
        }
        let record: pvisor_core::records::AttemptRecord = match store.read(&store.attempt_file(&attempt)) {
            Ok(r) => r,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e.into()),
        };
        if record.started_at.is_some() {
            return Ok(None);
        }
    }
    Ok(None)
}
