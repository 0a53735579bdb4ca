//! Where a stage stands, derived from its change list and ledger: what
//! status views and the effects both read.

use std::collections::BTreeMap;

use serde::Serialize;

use pvisor_core::records::ChangeEntry;
use pvisor_core::store::RelPath;
use pvisor_stage::ledger::Outcome;

/// Where a stage stands, separately from how the run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StageState {
    /// The run staged nothing.
    Empty,
    /// Nothing applied or dropped yet.
    Pending,
    /// Some changes applied or dropped, some remain.
    PartiallyApplied,
    /// Nothing remains, and something was applied.
    Applied,
    /// Nothing remains, and nothing was applied.
    Dropped,
    /// `gc --force` removed the staged files before every change was
    /// applied or dropped: what remained can no longer be applied.
    Collected,
}

impl StageState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::Pending => "pending",
            Self::PartiallyApplied => "partially-applied",
            Self::Applied => "applied",
            Self::Dropped => "dropped",
            Self::Collected => "collected",
        }
    }

    /// Derives the state from the change list, the ledger and whether gc
    /// removed the staged files (`stage_dir/collected`).
    pub fn of_stage(
        changes: &[ChangeEntry],
        outcomes: &BTreeMap<RelPath, Outcome>,
        stage_dir: &std::path::Path,
    ) -> Self {
        match Self::of(changes, outcomes) {
            Self::Pending | Self::PartiallyApplied if stage_dir.join("collected").exists() => Self::Collected,
            other => other,
        }
    }

    /// Derives the state from the change list and the ledger.
    pub fn of(changes: &[ChangeEntry], outcomes: &BTreeMap<RelPath, Outcome>) -> Self {
        if changes.is_empty() {
            return Self::Empty;
        }
        let (mut applied, mut dropped, mut partial) = (0, 0, false);
        for change in changes {
            match outcomes.get(&change.path) {
                Some(Outcome::Applied) => applied += 1,
                Some(Outcome::Dropped) => dropped += 1,
                // Some hunks are on the host: the stage is partly applied.
                Some(Outcome::Partial(_)) => partial = true,
                Some(Outcome::Interrupted { .. }) | None => {}
            }
        }
        match (applied + dropped == changes.len(), applied, dropped) {
            (false, 0, 0) if !partial => Self::Pending,
            (false, _, _) => Self::PartiallyApplied,
            (true, 0, _) => Self::Dropped,
            (true, _, _) => Self::Applied,
        }
    }
}
