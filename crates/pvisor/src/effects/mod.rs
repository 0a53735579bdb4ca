//! The effects workflow: review, apply selected files, drop.
//!
//! ```text
//! run → stop → review → apply selected files → review remaining changes → apply or drop
//! ```
//!
//! The list of changes is the Bundle's manifest, bound by the receipt. Apply
//! and drop need that receipt: a run without one (`unknown`, or still live)
//! can be reviewed from its stage, but nothing is applied or dropped. Each
//! apply or drop holds the stage's `apply.lock` and then the workspace's
//! lock, so two at once serialize even across Jobs, reconciles what an
//! interrupted apply left, and records every step in the ledger and the Trace.
//!
//! The modules follow the workflow: [`stage`] opens and reviews a stage,
//! [`writers`] holds the writer locks and reconciles an interrupted apply,
//! [`mod@apply`] and [`hunks`] write to the workspace, [`discard`] drops.

use std::path::PathBuf;

use pvisor_core::ids::JobId;
use pvisor_core::state::JobState;
use pvisor_core::store::StoreError;
use pvisor_stage::apply::NoMatch;
use pvisor_stage::StageError;

use crate::records::views::ViewError;

mod apply;
mod commit_verdict;
mod discard;
mod hunks;
mod stage;
mod writers;

pub use crate::records::StageState;
pub use apply::{apply, ApplyOptions, ApplyReport, CommitReport, Selection};
pub use discard::{drop_changes, DropReport};
pub use hunks::{apply_hunks, HunkChoice, HunksReport};
pub use pvisor_stage::sensitive::Sensitive;
pub use stage::{InCommit, ReviewItem, Stage};
pub(crate) use writers::lock_stage;

/// Why an effects command could not proceed. Nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum EffectsError {
    #[error(
        "Job {job} has no confirmed result (state: {state}): apply needs an Attempt confirmed stopped by a valid receipt, \
         and drop a Job that is closed. `pvisor review {job} --diff` shows its staged files; `pvisor kill {job}` closes \
         it as lost, after which `pvisor drop {job}` can discard them"
    )]
    Unconfirmed { job: JobId, state: JobState },
    #[error(
        "Job {job} was closed as lost: no receipt confirms how its command ended, so its staged files are never \
         applied. `pvisor review {job} --diff` shows them; `pvisor export {job}` saves them to a tar for inspection \
         (copy what you need by hand); `pvisor drop {job}` discards them, and `pvisor gc` then frees the space"
    )]
    Lost { job: JobId },
    #[error("Job {job} is still running; wait for it to finish (or cancel it) before applying or dropping")]
    Live { job: JobId },
    #[error(
        "Job {job}'s stage is incomplete ({why}): it holds only part of what the command wrote. \
         `pvisor review {job}` lists what arrived; `pvisor apply {job} --allow-incomplete` applies from it anyway, \
         `pvisor drop {job}` discards it"
    )]
    Incomplete { job: JobId, why: String },
    #[error(
        "Job {job} is suspended: its staged files are inside the saved VM. `pvisor resume {job}` continues it \
         (apply after it finishes); `pvisor kill {job}` gives it up"
    )]
    Suspended { job: JobId },
    #[error(
        "The staged files of job {job} were removed by `pvisor gc`; its records remain (status, events)"
    )]
    Collected { job: JobId },
    #[error("Job {job} was imported from {origin}: it is read-only here (review it; apply it where it ran)")]
    Imported { job: JobId, origin: String },
    #[error("Workspace {} no longer exists; nothing can be applied to it", path.display())]
    WorkspaceMissing { path: PathBuf },
    #[error(transparent)]
    NoMatch(#[from] NoMatch),
    #[error(transparent)]
    View(#[from] ViewError),
    #[error(transparent)]
    Stage(#[from] StageError),
    #[error(transparent)]
    Commit(#[from] pvisor_stage::commits::CommitError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Refuses a stage that may not be applied: imported, live, suspended,
/// lost or otherwise unconfirmed, each with what to do instead.
pub fn require_confirmed(stage: &Stage) -> Result<(), EffectsError> {
    if let Some(origin) = &stage.job.imported_from {
        return Err(EffectsError::Imported { job: stage.status.job.clone(), origin: origin.clone() });
    }
    if stage.status.live {
        return Err(EffectsError::Live { job: stage.status.job.clone() });
    }
    if stage.status.state == JobState::Suspended {
        return Err(EffectsError::Suspended { job: stage.status.job.clone() });
    }
    if !stage.confirmed && stage.status.state == JobState::Lost {
        return Err(EffectsError::Lost { job: stage.status.job.clone() });
    }
    if !stage.confirmed {
        return Err(EffectsError::Unconfirmed { job: stage.status.job.clone(), state: stage.status.state });
    }
    Ok(())
}

/// What `drop` needs: a stage nobody writes any more. A Job closed as lost
/// qualifies (dropping writes nothing to the workspace), though it can
/// never be applied.
fn require_closed(stage: &Stage) -> Result<(), EffectsError> {
    match require_confirmed(stage) {
        Err(EffectsError::Lost { .. }) => Ok(()),
        other => other,
    }
}
