//! The helper → supervisor report channel.
//!
//! The helper, the sandbox's init and the command child (before it execs) all
//! hold the write end of one pipe. Each message is one JSON line written with a
//! single `write(2)` under `PIPE_BUF`, so messages from different processes
//! never interleave. The supervisor reads until EOF, which comes only when
//! every holder is gone.

use std::os::fd::{BorrowedFd, RawFd};

use serde::{Deserialize, Serialize};

use pvisor_sandbox::sys;

/// The helper's end of the report pipe, at this fixed descriptor.
pub(crate) const REPORT_FD: RawFd = 4;
/// The helper reads its [`HelperSpec`](super::helper::HelperSpec) from this descriptor.
pub(crate) const SPEC_FD: RawFd = 3;
/// A Unix socket to the supervisor, for handing over descriptors (the proxy listener).
pub(crate) const FD_PASS_FD: RawFd = 5;

/// One of the descriptors the supervisor leaves open for the whole life of
/// the helper and its descendants ([`REPORT_FD`], [`FD_PASS_FD`]).
pub(crate) fn inherited(fd: RawFd) -> BorrowedFd<'static> {
    debug_assert!(fd == REPORT_FD || fd == FD_PASS_FD);
    // SAFETY: the supervisor places these two at fixed numbers before exec
    // and nothing in the sandbox's processes closes them (they are only
    // marked close-on-exec), so they stay open as long as the process.
    unsafe { BorrowedFd::borrow_raw(fd) }
}

/// Largest message; pipes write up to `PIPE_BUF` (4096) bytes atomically.
const MAX_MESSAGE: usize = 4000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub(crate) enum Report {
    /// A setup step failed; the command was never started.
    SetupError { step: String, message: String, hint: Option<String> },
    /// The sandbox is assembled and the command is about to be executed.
    /// `sockets_reachable` lists host mounts shown without the socket-proof
    /// overlay (see `host_view.rs`).
    Ready {
        #[serde(default)]
        sockets_reachable: Vec<std::path::PathBuf>,
        /// How long init's setup steps took ([`pvisor_sandbox::timing::PhaseClock`]).
        #[serde(default)]
        setup_us: Vec<(String, u64)>,
    },
    /// execve(2) of the program failed inside the sandbox.
    ExecError { program: String, errno: i32 },
    /// The command ended; rusage sums every process init reaped.
    /// `stage_error`: a memory stage (`--disk`) could not be copied out whole.
    Exit {
        code: Option<i32>,
        signal: Option<i32>,
        user_us: u64,
        system_us: u64,
        max_rss_kib: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stage_error: Option<String>,
    },
}

impl Report {
    /// Sends the report on [`REPORT_FD`]. Failures are ignored: if the supervisor
    /// is gone, the sandbox dies with it anyway.
    pub(crate) fn send(&self) {
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        if line.len() > MAX_MESSAGE {
            if let Report::SetupError { step, message, hint } = self {
                let short = Report::SetupError {
                    step: step.clone(),
                    message: message.chars().take(MAX_MESSAGE / 2).collect(),
                    hint: hint.as_ref().map(|h| h.chars().take(MAX_MESSAGE / 4).collect()),
                };
                line = serde_json::to_vec(&short).unwrap_or_default();
            }
        }
        line.push(b'\n');
        let _ = sys::write_all(inherited(REPORT_FD), &line);
    }
}
