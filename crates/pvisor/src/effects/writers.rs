//! The writers' protocol shared by apply and drop: the stage's lock, then
//! the workspace's, then reconciling what an interrupted apply left, and
//! reopening the Trace after the run's terminal event.

use std::path::Path;

use pvisor_core::event::EventKind;
use pvisor_core::ids::JobId;
use pvisor_core::store::{OwnerLock, RelPath, Store, StoreError};
use pvisor_stage::apply;
use pvisor_stage::ledger::{Ledger, Outcome};

use super::{require_confirmed, EffectsError, Stage};
use crate::records::views;
use crate::trace::{data, Trace};

/// The stage's writer lock: one apply or drop at a time.
pub(crate) fn lock_stage(stage_dir: &Path) -> Result<OwnerLock, EffectsError> {
    Ok(OwnerLock::acquire_blocking(&stage_dir.join("apply.lock"))?)
}

/// The workspace's writer lock, taken after the stage's: the preimage check
/// and the writes of one apply happen with no other apply or drop (of any
/// Job, from any state directory) in between, so two Jobs can never both
/// "win" the same file. It is an exclusive `flock` on the workspace
/// directory itself (no file in the workspace; shared by every pvisor), after
/// shared ones on each of its ancestors, taken from `/` down: a Job whose
/// workspace is a parent or a child of this one waits too, while sibling
/// workspaces do not.
pub(crate) fn lock_workspace(workspace: &Path) -> Result<Vec<OwnerLock>, EffectsError> {
    let missing = |e: StoreError| match e {
        StoreError::Io { ref source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            EffectsError::WorkspaceMissing { path: workspace.to_owned() }
        }
        other => other.into(),
    };
    let mut ancestors: Vec<&Path> = workspace.ancestors().skip(1).collect();
    ancestors.reverse();
    let mut locks = Vec::with_capacity(ancestors.len() + 1);
    for dir in ancestors {
        // An ancestor pvisor may not open (another user's home above a
        // shared workspace) cannot hold a nested workspace of ours either.
        if let Ok(lock) = OwnerLock::acquire_directory_shared(dir) {
            locks.push(lock);
        }
    }
    locks.push(OwnerLock::acquire_directory(workspace).map_err(missing)?);
    Ok(locks)
}

/// Under both writer locks: records what an interrupted apply already wrote
/// as applied (and removes its temporaries), so nothing that is in the
/// workspace is ever recorded as dropped, then reopens the stage.
pub(super) fn reconcile(store: &Store, job: &JobId, stage: Stage) -> Result<Stage, EffectsError> {
    let ledger = Ledger::new(&stage.stage_dir, &stage.status.run);
    let raw = ledger.outcomes()?;
    if !raw.values().any(|o| matches!(o, Outcome::Interrupted { .. })) {
        return Ok(stage);
    }
    let (ws, _) = stage.roots()?;
    let (_, landed) = apply::reconcile_interrupted(&ws, &ledger, &stage.changes, raw)?;
    if !landed.is_empty() {
        let (mut trace, terminal) = open_trace(store, &stage)?;
        let paths: Vec<&RelPath> = landed.iter().map(|l| &l.change().path).collect();
        let reconciled =
            data::ApplyReconciled { paths, reason: "an interrupted apply had already written them" };
        trace.emit(
            EventKind::ApplyReconciled,
            Some(stage.status.attempt.number()),
            terminal,
            &reconciled,
            true,
        )?;
    }
    Stage::open(store, job)
}

/// Reopens the Trace for an apply or drop; returns it with the seq of the
/// run's terminal event, the cause of everything that follows.
pub(super) fn open_trace(store: &Store, stage: &Stage) -> Result<(Trace, Option<u64>), EffectsError> {
    let (events, _) = views::events(store, &stage.status.run)?;
    let terminal = events.iter().rev().find(|e| e.kind.is_run_end()).map(|e| e.seq);
    Ok((Trace::open(store, &stage.status.run), terminal))
}

/// Both writer locks of an apply, released when dropped (the workspace's
/// first, as they were taken in the other order).
pub(super) struct WriterLocks {
    _workspace: Vec<OwnerLock>,
    _stage: OwnerLock,
}

/// Opens `job`'s stage for writing to the workspace: confirmed, both writer
/// locks taken, then re-read under them (another apply may have just
/// finished) with what an interrupted apply left reconciled.
pub(super) fn open_for_apply(store: &Store, job: &JobId) -> Result<(Stage, WriterLocks), EffectsError> {
    let stage = Stage::open(store, job)?;
    require_confirmed(&stage)?;
    let stage_lock = lock_stage(&stage.stage_dir)?;
    let locks = WriterLocks { _workspace: lock_workspace(&stage.workspace)?, _stage: stage_lock };
    let stage = reconcile(store, job, Stage::open(store, job)?)?;
    Ok((stage, locks))
}
