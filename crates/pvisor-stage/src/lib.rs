//! pvisor-stage: the stage, i.e. the overlay upper layer a sandbox wrote into.
//!
//! This crate turns an upper layer into a change set relative to the
//! workspace (the lower layer) and seals it durably. It reads overlayfs's
//! on-disk conventions (whiteouts, opaque directories, both the `trusted.` and
//! the rootless `user.` xattr namespaces) and never follows a symlink the
//! sandbox created.

mod changes;
mod overlay;

pub use changes::{scan, seal};

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
}

impl StageError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io { op, path: path.into(), source }
    }
}
