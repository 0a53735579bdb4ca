//! pvisor-stage: the stage, i.e. the overlay upper layer a sandbox wrote into.
//!
//! This crate turns an upper layer into a change set relative to the
//! workspace (the lower layer) and seals it durably. It reads overlayfs's
//! on-disk conventions (whiteouts, opaque directories, both the `trusted.` and
//! the rootless `user.` xattr namespaces) and never follows a symlink the
//! sandbox created.
//!
//! - `changes`: scan and seal an upper layer into the change manifest;
//! - [`preimage`]: the conflict baseline of each changed path;
//! - [`ledger`]: what has been applied or dropped, crash-safe;
//! - [`apply`]: selection, conflict verdicts and confined writes;
//! - [`review`]: unified diffs for people;
//! - [`linediff`]: the bounded line diff they and `apply -p` share;
//! - [`hunks`]: a modified text file's hunks, and the file with only some of them (`apply -p`);
//! - [`commits`]: a commit made inside the sandbox, checked and landed as one (never as `.git/` files);
//! - [`checkpoint`]: sealed copies of a stage, and `restore_logical_checkpoint`;
//! - [`beneath`]: every file operation confined beneath a root.
//! - [`names`]: names a person could mistake for others (marked in review);
//! - [`sensitive`]: paths that make the host run code when applied (need consent);
//! - [`glob`]: path patterns (`*`, `**`, `?`, classes), shared with `pvisor serve`'s file search.

// The lints of clippy.toml (durable record writes, no prints) are for the
// library's own code: its unit tests write fixtures and may say what they do.
#![cfg_attr(test, allow(clippy::disallowed_methods, clippy::disallowed_macros))]

pub mod apply;
pub mod beneath;
mod changes;
pub mod checkpoint;
pub mod commits;
mod gitconfig;
pub mod glob;
pub mod hunks;
pub mod ledger;
pub mod linediff;
pub mod names;
mod overlay;
mod prefetch;
pub mod preimage;
mod region;
pub mod review;
pub mod sensitive;
mod writers;

pub use changes::{scan, scan_counted, seal, Scanned, RECORDED_PATH_MAX};
pub use checkpoint::restore_logical_checkpoint;

use std::io;
use std::path::PathBuf;

/// A failure reading or sealing a stage. Each variant names the path.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("Cannot {op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Record(pvisor_core::store::StoreError),
    #[error("Checkpoint {}: {reason}", path.display())]
    Checkpoint { path: PathBuf, reason: String },
    #[error(
        "{} line {line} records {found}, not {expected}: the ledger was replaced or edited outside pvisor",
        path.display()
    )]
    ForeignLedger { path: PathBuf, line: usize, found: String, expected: String },
}

impl StageError {
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io { op, path: path.into(), source }
    }
}
