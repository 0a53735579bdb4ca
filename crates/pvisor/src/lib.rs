//! pvisor: the embedded runtime.
//!
//! The flow of one run, and where each step lives:
//! 1. `admission`: validate the request, resolve the effective policy once,
//!    record it and every rewrite as events, decide the Placement, create the
//!    Job, Run and Attempt records.
//! 2. `session`: the Session owns the Attempt's lifecycle: preparation,
//!    cancellation, cleanup and terminal publication, with finalization in
//!    a fixed order (seal stage → Bundle → Run projection and
//!    receipt → terminal event).
//! 3. `runtime::job_service`: the durable Job service runs each Session as a
//!    Tokio task ([`ManagedJobRun`]) and publishes the Job state after joining
//!    the Attempt. Frontends hold only a wait adapter.
//! 4. `records::completion`: building, validating and committing receipts.
//! 5. `effects`: review, apply and drop of staged changes.
//! 6. `records::views`: read projections for status, lists and the Trace,
//!    trusting only valid receipts.
//! 7. [`trust`]: which workspace configuration files the user trusts.
//!
//! The layers depend one way, each only on those below it:
//! `trace` ← `records` ← `admission`, `effects` ← `session` ← `runtime`
//! (the Job service, checkpoints, kill, gc, archives) ← [`actions`].
//!
//! These layers are private to the crate. Frontends reach all of it through
//! one entry point, [`Runtime::execute`] with an [`Action`] (see
//! [`actions`]), and read the view and record types re-exported here;
//! [`backends`] says which executor runs each backend, what each backend's
//! sandboxes are like ([`BackendTraits`]) and what each can do to a running
//! Job.
//!
//! The library never prints, exits or reads user configuration; the CLI and
//! the daemon do.

// The lints of clippy.toml (durable record writes, no prints) are for the
// library's own code: its unit tests write fixtures and may say what they do.
#![cfg_attr(test, allow(clippy::disallowed_methods, clippy::disallowed_macros))]

pub mod actions;
pub(crate) mod admission;
pub mod agent_state;
pub mod backends;
pub(crate) mod effects;
use pvisor_core::failpoint;
pub(crate) mod records;
pub mod run_sessions;
pub(crate) mod runtime;
pub(crate) mod session;
#[cfg(any(test, feature = "testing"))]
#[allow(clippy::disallowed_methods)] // fixtures for other crates' tests
pub mod testing;
mod trace;
pub mod trust;

pub use actions::{Action, Runtime, RuntimeError};
pub use admission::{
    proxy_env, AdmissionError, ExecutionFork, RunRequest, SecretPolicy, DEFAULT_HIDDEN, HIDDEN_NAME_PREFIXES,
    PROXY_PORT,
};
pub use backends::BackendTraits;
pub use effects::{
    ApplyOptions, ApplyReport, CommitReport, DropReport, EffectsError, HunkChoice, HunksReport, InCommit,
    ReviewItem, Selection, Sensitive, Stage, StageState,
};
/// Whether a completion receipt binds the Bundle bytes given (for fuzzing
/// and for tools that audit exported records).
pub use records::completion::validate as validate_receipt;
pub use records::recovery::Recovered;
pub use records::suspension::{Listing as ExecutionCheckpointListing, SuspensionError};
pub use records::views::{JobListing, JobStatus, ReceiptStatus, ViewError};
pub use runtime::archive::{ArchiveError, ArchiveManifest, Exported, Verified};
pub use runtime::checkpoint::{
    CheckpointError, CheckpointHold, CheckpointListing, LIMITS as CHECKPOINT_LIMITS,
};
pub use runtime::gc::{Failed, Freed, GcReport, Kept};
pub use runtime::job_service::{
    CancelHandle, JobService, ManagedJobRun, RunEnd, RunError, RunOutcome, SuspendedOutcome,
};
pub use runtime::kill::Killed;
pub use session::job_control::FrontendNote;
