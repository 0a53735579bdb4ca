//! Actions on a Job's staged changes: apply the selected ones to the
//! workspace, or drop them.

use pvisor_core::ids::JobId;
use pvisor_core::records::ChangeEntry;

use super::{Action, Runtime, RuntimeError};
use crate::effects::{
    self, ApplyOptions, ApplyReport, DropReport, HunkChoice, HunksReport, Selection, Sensitive, Stage,
};

/// Applies the selected changes; `progress` sees each change as it lands.
pub struct Apply<'a> {
    pub job: JobId,
    pub selection: Selection,
    pub options: ApplyOptions,
    pub progress: Box<dyn FnMut(&ChangeEntry) + 'a>,
}

impl std::fmt::Debug for Apply<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Apply")
            .field("job", &self.job)
            .field("selection", &self.selection)
            .finish_non_exhaustive()
    }
}

impl Action for Apply<'_> {
    const NAME: &'static str = "apply";
    type Outcome = ApplyReport;

    fn perform(self, runtime: &Runtime) -> Result<ApplyReport, RuntimeError> {
        Ok(effects::apply(&runtime.store, &self.job, &self.selection, self.options, self.progress)?)
    }
}

/// Drops the staged changes matching `patterns` (every remaining one when
/// empty). Never undoes an apply.
#[derive(Debug)]
pub struct DropChanges {
    pub job: JobId,
    pub patterns: Vec<String>,
}

impl Action for DropChanges {
    const NAME: &'static str = "drop";
    type Outcome = DropReport;

    fn perform(self, runtime: &Runtime) -> Result<DropReport, RuntimeError> {
        Ok(effects::drop_changes(&runtime.store, &self.job, &self.patterns)?)
    }
}

/// A Job's stage as it stands: its changes, what was applied or dropped,
/// and whether a receipt confirms it. [`Stage::review`] lists its items.
#[derive(Debug)]
pub struct Review {
    pub job: JobId,
}

impl Action for Review {
    const NAME: &'static str = "review";
    type Outcome = Stage;

    fn perform(self, runtime: &Runtime) -> Result<Stage, RuntimeError> {
        Ok(Stage::open(&runtime.store, &self.job)?)
    }
}

/// Applies the chosen hunks of files (`apply -p`); a file with none chosen
/// is left alone.
#[derive(Debug)]
pub struct ApplyHunks {
    pub job: JobId,
    pub choices: Vec<HunkChoice>,
    pub sensitive: Sensitive,
}

impl Action for ApplyHunks {
    const NAME: &'static str = "apply-hunks";
    type Outcome = HunksReport;

    fn perform(self, runtime: &Runtime) -> Result<HunksReport, RuntimeError> {
        Ok(effects::apply_hunks(&runtime.store, &self.job, &self.choices, &self.sensitive)?)
    }
}

/// A Job's agent state changes (`review --state`): what its run changed
/// and the gated changes it holds back from earlier runs of its session.
#[derive(Debug)]
pub struct ReviewState {
    pub job: JobId,
}

impl Action for ReviewState {
    const NAME: &'static str = "review-state";
    type Outcome = Vec<crate::agent_state::StateChange>;

    fn perform(self, runtime: &Runtime) -> Result<Self::Outcome, RuntimeError> {
        Ok(crate::agent_state::changes(&runtime.store, &self.job)?)
    }
}

/// Approves gated agent state changes of a Job (absolute paths), so the
/// next run carried from it gets them.
#[derive(Debug)]
pub struct ApproveState {
    pub job: JobId,
    pub paths: Vec<std::path::PathBuf>,
}

impl Action for ApproveState {
    const NAME: &'static str = "approve-state";
    type Outcome = Vec<crate::agent_state::StateChange>;

    fn perform(self, runtime: &Runtime) -> Result<Self::Outcome, RuntimeError> {
        Ok(crate::agent_state::approve(&runtime.store, &self.job, &self.paths)?)
    }
}

/// Promotes a Job's agent state (without unapproved gated changes) into
/// pvisor's per-user store, where later runs outside its session start.
#[derive(Debug)]
pub struct PromoteState {
    pub job: JobId,
}

impl Action for PromoteState {
    const NAME: &'static str = "promote-state";
    type Outcome = Vec<std::path::PathBuf>;

    fn perform(self, runtime: &Runtime) -> Result<Self::Outcome, RuntimeError> {
        Ok(crate::agent_state::promote(&runtime.store, &self.job)?)
    }
}
