//! Workspace checkpoints of stopped, staged Runs.
//!
//! `checkpoint` copies a confirmed Job's stage (upper tree and conflict
//! baselines) into `checkpoints/.tmp-<id>/`, syncs everything, writes the
//! manifest, and only then renames the directory to `checkpoints/<id>/`. A
//! crash at any point before the rename leaves a temporary that no listing
//! shows (and `gc` removes). Checkpoints save no process memory and no
//! external service state, and do not freeze the workspace.

use std::fs;

use pvisor_core::event::EventKind;
use pvisor_core::ids::{CheckpointId, JobId};
use pvisor_core::records::{CheckpointManifest, LeftOut};
use pvisor_core::store::{self, OwnerLock, Store, StoreError};
use pvisor_core::time::Timestamp;
use pvisor_stage::checkpoint::copy_upper_except;
use pvisor_stage::ledger::Outcome;
use pvisor_stage::StageError;

use crate::effects::{self, EffectsError, Stage};
use crate::failpoint;
use crate::trace::{data, Trace};

/// What a workspace checkpoint does not capture; printed and recorded.
pub const LIMITS: &str = "a workspace checkpoint holds the staged files and their conflict baselines only: \
no process memory, no external service state, and the workspace it sits on is not frozen";

/// A checkpoint lookup that failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("No checkpoint matches {query:?}; `pvisor checkpoints` lists them")]
    NotFound { query: String },
    #[error("{query:?} matches several checkpoints; give more characters")]
    Ambiguous { query: String },
    #[error(transparent)]
    Effects(#[from] EffectsError),
    #[error(transparent)]
    Stage(#[from] StageError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A shared hold on a checkpoint: while any process holds one, `gc` neither
/// removes the checkpoint nor (for one being written) its temporary.
#[derive(Debug)]
pub struct CheckpointHold {
    _lock: OwnerLock,
}

fn use_lock_file(store: &Store, id: &CheckpointId) -> std::path::PathBuf {
    store.checkpoints_dir().join(format!(".use-{id}.lock"))
}

/// Holds `id` against `gc` (a fork holds its checkpoint until it is done).
pub fn hold(store: &Store, id: &CheckpointId) -> Result<CheckpointHold, StoreError> {
    Ok(CheckpointHold { _lock: OwnerLock::acquire_shared_blocking(&use_lock_file(store, id))? })
}

/// For `gc`: takes `id` exclusively if no process holds it, so nothing can
/// start using it while it is removed. `None` while it is in use.
pub(crate) fn try_claim(store: &Store, id: &str) -> Result<Option<OwnerLock>, StoreError> {
    OwnerLock::try_acquire(&store.checkpoints_dir().join(format!(".use-{id}.lock")))
}

/// Checkpoints `job`'s stage. The Job must be confirmed stopped by its
/// receipt. The returned hold keeps `gc` away from the new checkpoint (and
/// from its temporary while it is being written) until it is dropped.
pub fn checkpoint(
    store: &Store,
    job: &JobId,
) -> Result<(CheckpointManifest, CheckpointHold), CheckpointError> {
    let stage = Stage::open(store, job)?;
    effects::require_confirmed(&stage)?;
    let _lock = effects::lock_stage(&stage.stage_dir)?;
    let id = CheckpointId::generate();
    let held = hold(store, &id)?;
    let tmp = store.checkpoints_dir().join(format!(".tmp-{id}"));
    store::create_dir_all_private(&tmp)?;
    let result = (|| -> Result<CheckpointManifest, CheckpointError> {
        // Changes already applied (now in the workspace) or dropped are
        // not carried: a fork must not bring back what the user discarded.
        let left_out: Vec<LeftOut> = stage
            .outcomes
            .iter()
            .filter_map(|(path, outcome)| match outcome {
                Outcome::Applied => Some(LeftOut { path: path.clone(), outcome: "applied".into() }),
                Outcome::Dropped => Some(LeftOut { path: path.clone(), outcome: "dropped".into() }),
                Outcome::Interrupted { .. } | Outcome::Partial(_) => None,
            })
            .collect();
        let skip = left_out.iter().map(|l| l.path.clone()).collect();
        let (entries, method) = copy_upper_except(&stage.stage_dir.join("upper"), &tmp.join("upper"), &skip)?;
        let preimages =
            match store::read_capped(&stage.stage_dir.join("preimages.json"), store::RECORD_READ_CAP) {
                // A path some of whose hunks were applied carries what the
                // host holds now as its baseline, not what the run found.
                Ok(bytes) if stage.outcomes.values().any(|o| matches!(o, Outcome::Partial(_))) => {
                    match &stage.preimages {
                        Some(p) => {
                            store::to_json_bytes(&pvisor_stage::apply::current_baselines(p, &stage.outcomes))
                        }
                        None => bytes,
                    }
                }
                Ok(bytes) => bytes,
                Err(e) if e.is_not_found() => {
                    store::to_json_bytes(&pvisor_stage::preimage::Preimages::none())
                }
                Err(e) => return Err(e.into()),
            };
        store::write_atomic(&tmp.join("preimages.json"), &preimages)?;
        let manifest = CheckpointManifest {
            format: pvisor_core::records::FORMAT,
            id: id.clone(),
            kind: pvisor_core::records::CheckpointKind::Workspace,
            created_at: Timestamp::now(),
            job: job.clone(),
            attempt: stage.status.attempt.clone(),
            workspace: stage.workspace.clone(),
            lineage: stage.job.lineage.clone(),
            copy_method: method.describe().into(),
            entries,
            preimages_blake3: store::blake3_hex(&preimages),
            limits: LIMITS.into(),
            left_out,
        };
        failpoint::hit("checkpoint-before-manifest");
        store::write_atomic(&tmp.join("manifest.json"), &store::to_json_bytes(&manifest))?;
        store::sync_dir(&tmp)?;
        failpoint::hit("checkpoint-before-publish");
        let final_dir = store.checkpoint_dir(&id);
        fs::rename(&tmp, &final_dir).map_err(|e| StoreError::Io {
            op: "publish",
            path: final_dir.clone(),
            source: e,
        })?;
        store::sync_dir(&store.checkpoints_dir())?;
        Ok(manifest)
    })();
    let manifest = match result {
        Ok(m) => m,
        Err(e) => {
            let _ = pvisor_core::tree::remove_tree(&tmp);
            return Err(e);
        }
    };
    let mut trace = Trace::open(store, &stage.status.run);
    let created = data::CheckpointCreated {
        checkpoint: &manifest.id,
        kind: manifest.kind.as_str(),
        entries: manifest.entries.len(),
        copy_method: &manifest.copy_method,
        left_out: &manifest.left_out,
    };
    trace.emit(EventKind::CheckpointCreated, Some(stage.status.attempt.number()), None, &created, true)?;
    Ok((manifest, held))
}

/// One row of [`list`]: a checkpoint id and its manifest, or why it cannot be read.
pub type CheckpointListing = (CheckpointId, Result<CheckpointManifest, StoreError>);

/// Every published checkpoint, oldest first; a damaged one is returned as its error.
pub fn list(store: &Store) -> Result<Vec<CheckpointListing>, StoreError> {
    let dir = store.checkpoints_dir();
    let mut ids: Vec<CheckpointId> = match fs::read_dir(&dir) {
        Ok(entries) => {
            entries.flatten().filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok())).collect()
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(StoreError::Io { op: "list", path: dir, source: e }),
    };
    ids.sort();
    Ok(ids
        .into_iter()
        .map(|id| {
            let manifest = store::read_record(&store.checkpoint_dir(&id).join("manifest.json"));
            (id, manifest)
        })
        .collect())
}

/// Resolves a checkpoint id or unique prefix (with or without `ckpt-`).
pub fn resolve(store: &Store, query: &str) -> Result<CheckpointId, CheckpointError> {
    let wanted = if query.starts_with(CheckpointId::PREFIX) {
        query.to_owned()
    } else {
        format!("{}{}", CheckpointId::PREFIX, query.to_ascii_uppercase())
    };
    let all: Vec<CheckpointId> = list(store)?.into_iter().map(|(id, _)| id).collect();
    let hits: Vec<&CheckpointId> = all.iter().filter(|id| id.as_str().starts_with(&wanted)).collect();
    match hits.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(CheckpointError::NotFound { query: query.to_owned() }),
        _ => Err(CheckpointError::Ambiguous { query: query.to_owned() }),
    }
}

/// Reads a checkpoint's manifest without verifying its files (cheap).
pub fn manifest(store: &Store, id: &CheckpointId) -> Result<CheckpointManifest, CheckpointError> {
    Ok(store::read_record(&store.checkpoint_dir(id).join("manifest.json"))?)
}
