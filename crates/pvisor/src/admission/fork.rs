//! Forks: admitting a run that starts from a checkpoint instead of the
//! workspace as it is.
//!
//! A workspace fork restores a parent's stage over the workspace its
//! checkpoint was taken of; an execution fork (vm) restores a running
//! guest. Either way the checkpoint is verified before anything is
//! recorded, the workspace comes from its manifest, and the Job records
//! its lineage.

use std::path::PathBuf;

use pvisor_core::ids::{CheckpointId, JobId};
use pvisor_core::records::{CheckpointManifest, Lineage};
use pvisor_core::store::Store;

use super::AdmissionError;

/// Where an execution fork starts: a running VM's saved state.
#[derive(Clone, Debug)]
pub struct ExecutionFork {
    pub parent: JobId,
    pub dir: PathBuf,
    pub manifest: pvisor_vm::ExecCheckpoint,
}

/// A verified workspace fork: the checkpoint directory its stage is
/// restored from, and the checkpoint's manifest.
pub(super) type WorkspaceFork = (PathBuf, CheckpointManifest);

/// Decides whether the request forks a workspace checkpoint, verifying the
/// checkpoint (every file's digest) so a damaged one is refused before any
/// record exists.
pub(super) fn verify(
    store: &Store,
    fork: Option<&CheckpointId>,
) -> Result<Option<WorkspaceFork>, AdmissionError> {
    // A fork runs over its checkpoint's workspace, with the parent's stage restored.
    Ok(match fork {
        None => None,
        Some(id) => {
            let dir = store.checkpoint_dir(id);
            let manifest = pvisor_stage::checkpoint::verify_checkpoint(&dir)
                .map_err(|source| AdmissionError::Checkpoint { checkpoint: id.clone(), source })?;
            Some((dir, manifest))
        }
    })
}

/// Decides which workspace the run is over: a fork's comes from its
/// checkpoint, never from the request.
pub(super) fn workspace(
    fork: &Option<WorkspaceFork>,
    execution: Option<&ExecutionFork>,
    requested: &std::path::Path,
) -> PathBuf {
    match (fork, execution) {
        (Some((_, m)), _) => m.workspace.clone(),
        (None, Some(f)) => f.manifest.workspace.clone(),
        (None, None) => requested.to_owned(),
    }
}

/// The lineage the Job records: which Job and checkpoint it was forked from.
pub(super) fn lineage(fork: &Option<WorkspaceFork>, execution: Option<&ExecutionFork>) -> Option<Lineage> {
    match (fork, execution) {
        (Some((_, m)), _) => {
            Some(Lineage { parent_job: m.job.clone(), checkpoint: m.id.clone(), kind: m.kind })
        }
        (None, Some(f)) => Some(Lineage {
            parent_job: f.parent.clone(),
            checkpoint: f.manifest.id.clone(),
            kind: pvisor_core::records::CheckpointKind::Execution,
        }),
        (None, None) => None,
    }
}

/// The conflict baseline recorded in an execution checkpoint's context.
pub(super) fn checkpoint_baseline(manifest: &pvisor_vm::ExecCheckpoint) -> Option<i128> {
    manifest.context.get("baseline").and_then(|b| b.as_str()).and_then(|b| b.parse().ok())
}
