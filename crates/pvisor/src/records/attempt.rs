//! Attempt records: every state change checks the lifecycle first, then
//! durably replaces `attempt.json`.

use pvisor_core::records::AttemptRecord;
use pvisor_core::state::{AttemptState, InvalidTransition};
use pvisor_core::store::{Store, StoreError};
use pvisor_core::time::Timestamp;

/// A failure to move an Attempt to a new state.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    #[error(transparent)]
    Transition(#[from] InvalidTransition),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Moves `attempt` to `to` and persists it.
pub fn advance(store: &Store, attempt: &mut AttemptRecord, to: AttemptState) -> Result<(), AttemptError> {
    let next = attempt.state.transition(to)?;
    let mut updated = attempt.clone();
    updated.state = next;
    updated.updated_at = Timestamp::now();
    if next == AttemptState::Running {
        updated.started_at = Some(updated.updated_at);
    }
    store.write(&store.attempt_file(&updated.id), &updated)?;
    *attempt = updated;
    Ok(())
}
