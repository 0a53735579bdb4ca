//! pvisor-core: the vocabulary every other pvisor crate speaks.
//!
//! This crate owns the *data* of pvisor and nothing that touches a sandbox:
//! - [`ids`]: `job-<ulid>`, `run-<ulid>`, `<run>.<n>` attempt ids, `ckpt-<ulid>`;
//! - [`records`]: Job, Run, Attempt, Operation, Placement, RunResult, Bundle and
//!   completion receipt, as versioned serde records;
//! - [`state`]: the lifecycle enums and their explicit transition functions;
//! - [`event`]: the Trace (`events.jsonl`) entry shape;
//! - [`journal`]: the Trace's appends, sequence-numbered under a lock on the file;
//! - [`store`]: the on-disk layout and the only sanctioned way to write durable
//!   state (atomic replace, no-clobber commit, size-capped reads, BLAKE3 digests).
//!
//! - [`labels`]: a Job's `key=value` labels and their checks;
//! - [`text`]: untrusted names and contents made safe for a terminal;
//! - [`digest`]: content digests of files (BLAKE3, holes skipped) and sparse copies;
//! - [`random`]: the one path to the kernel's random bytes;
//! - [`tree`]: walks over untrusted directory trees, iterative and by descriptor;
//! - [`assets`]: where the images pvisor ships with are found (build tree, install prefix, XDG).
//!
//! It never prints, exits, or reads user configuration.

// The lints of clippy.toml (durable record writes, no prints) are for the
// library's own code: its unit tests write fixtures and may say what they do.
#![cfg_attr(test, allow(clippy::disallowed_methods, clippy::disallowed_macros))]

pub mod assets;
pub mod digest;
pub mod event;
pub mod failpoint;
pub mod ids;
pub mod journal;
pub mod labels;
pub mod limits;
pub mod random;
pub mod records;
pub mod state;
pub mod store;
pub mod text;
pub mod time;
pub mod tree;

pub use ids::{AttemptId, JobId, RunId};
