//! Dropping staged changes: recorded in the ledger and as `stage.dropped`;
//! what was already applied stays applied.

use pvisor_core::event::EventKind;
use pvisor_core::ids::JobId;
use pvisor_core::records::ChangeEntry;
use pvisor_core::store::{RelPath, Store};
use pvisor_stage::apply;
use pvisor_stage::ledger::{self, Action, Ledger, Outcome};

use super::writers::{lock_stage, lock_workspace, open_trace, reconcile};
use super::{require_closed, EffectsError, Stage, StageState};
use crate::trace::data;

/// What a drop did.
#[derive(Debug, Default)]
pub struct DropReport {
    pub dropped: Vec<ChangeEntry>,
    /// Already applied changes stay applied; drop never undoes them.
    pub already_applied: usize,
    pub state: Option<StageState>,
}

/// Discards the remaining staged changes of `job` (or only those selected).
pub fn drop_changes(store: &Store, job: &JobId, patterns: &[String]) -> Result<DropReport, EffectsError> {
    let stage = Stage::open(store, job)?;
    require_closed(&stage)?;
    // A Job cut off before its stage existed (a `vm` run stopped before its
    // export, or a power cut) has nothing staged: its stage directory is
    // made empty, so the lock and the ledger have a home and gc frees it.
    if !stage.stage_dir.is_dir() {
        std::fs::create_dir_all(&stage.stage_dir)
            .map_err(|e| pvisor_stage::StageError::io("create", &stage.stage_dir, e))?;
    }
    let _lock = lock_stage(&stage.stage_dir)?;
    // A workspace that is gone can be written by nobody: nothing to lock or
    // reconcile, and its stage can still be dropped.
    let workspace_exists = stage.workspace.is_dir();
    let _workspace_lock = if workspace_exists { Some(lock_workspace(&stage.workspace)?) } else { None };
    let mut stage = if workspace_exists {
        reconcile(store, job, Stage::open(store, job)?)?
    } else {
        Stage::open(store, job)?
    };
    let selected = apply::select(&stage.changes, patterns)?;
    let mut report = DropReport::default();
    for i in selected {
        let change = &stage.changes[i];
        match stage.outcomes.get(&change.path) {
            Some(Outcome::Applied) => report.already_applied += 1,
            Some(Outcome::Dropped) => {}
            Some(Outcome::Interrupted { .. } | Outcome::Partial(_)) | None => {
                report.dropped.push(change.clone())
            }
        }
    }
    let ledger = Ledger::new(&stage.stage_dir, &stage.status.run);
    let records: Vec<_> = report
        .dropped
        .iter()
        .map(|c| ledger::Entry::new(c.path.clone(), Action::Dropped, None, false))
        .collect();
    ledger.append(&records)?;
    if !report.dropped.is_empty() {
        let (mut trace, terminal) = open_trace(store, &stage)?;
        let paths: Vec<&RelPath> = report.dropped.iter().map(|c| &c.path).collect();
        let dropped = data::StageDropped { paths, already_applied: report.already_applied };
        trace.emit(EventKind::StageDropped, Some(stage.status.attempt.number()), terminal, &dropped, true)?;
    }
    let dropped: Vec<_> = report.dropped.iter().map(|c| (c.path.clone(), Outcome::Dropped)).collect();
    report.state = Some(stage.after(dropped).0);
    Ok(report)
}
