//! The records of Jobs, Runs and Attempts and what is read from them: the
//! lowest layer of the crate, which every other one builds on (admission,
//! the effects and the Session write through it; the Job service and the
//! actions read through it). It depends on no other layer but the Trace.
//!
//! - [`attempt`]: an Attempt's record and its state transitions;
//! - [`completion`]: building, validating and committing receipts;
//! - [`suspension`]: a suspended Attempt's termination receipt and checkpoints;
//! - [`recovery`]: reconciling a Job whose owner died;
//! - [`views`]: read projections for status, lists and the Trace, trusting
//!   only valid receipts;
//! - [`StageState`]: where a stage stands.

pub mod attempt;
pub mod completion;
pub mod recovery;
mod stage_state;
pub mod suspension;
pub mod views;

pub use stage_state::StageState;
