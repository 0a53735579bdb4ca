//! pvisor: the embedded runtime.
//!
//! The flow of one run, and where each step lives:
//! 1. [`admission`]: validate the request, resolve the effective policy once,
//!    record it and every rewrite as events, decide the Placement, create the
//!    Job, Run and Attempt records.
//! 2. [`session`]: the Session owns the Attempt's lifecycle: preparation,
//!    cancellation, cleanup and terminal publication, with finalization in
//!    the fixed order of DESIGN.md (seal stage → Bundle → Run projection and
//!    receipt → terminal event).
//! 3. [`runtime::job_service`]: the durable Job service runs each Session as a
//!    Tokio task ([`ManagedJobRun`]) and publishes the Job state after joining
//!    the Attempt. Frontends hold only a wait adapter.
//! 4. [`runtime::completion`]: building, validating and committing receipts.
//! 5. [`effects`]: review, apply and drop of staged changes.
//! 6. [`runtime::job_service::views`]: read projections for status, lists and
//!    the Trace, trusting only valid receipts.
//! 7. [`trust`]: which workspace configuration files the user trusts.
//!
//! Frontends reach all of it through one entry point, [`Runtime::execute`]
//! with an [`Action`] (see [`actions`]); [`backends`] says which executor
//! runs each backend and what each can do to a running Job.
//!
//! The library never prints, exits or reads user configuration; the CLI and
//! the daemon do.

pub mod actions;
pub mod admission;
pub mod backends;
pub mod effects;
use pvisor_core::failpoint;
pub mod runtime;
pub mod session;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod trace;
pub mod trust;

pub use actions::{Action, Runtime, RuntimeError};
pub use admission::{proxy_env, AdmissionError, RunRequest, SecretPolicy};
pub use runtime::job_service::views::{JobListing, JobStatus, ViewError};
pub use runtime::job_service::{
    CancelHandle, JobService, ManagedJobRun, RunEnd, RunError, RunOutcome, SuspendedOutcome,
};
pub use runtime::kill::Killed;
