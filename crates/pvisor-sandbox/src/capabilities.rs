//! What a backend can do to a sandbox that is already running, beyond the
//! core [`Executor`](crate::Executor) contract (start, signal, wait).
//!
//! A running sandbox is owned by one supervisor process (the `pvisor run`
//! or `sandbox-supervisor` that holds its Attempt's owner lock). Other
//! processes — the CLI's `checkpoint`/`suspend`/`fork`, the daemon's execd
//! and port relay — reach it through these capabilities, addressed by the
//! Attempt's directory, where the backend keeps its sockets. They are
//! traits so that the runtime (`pvisor::Runtime`) asks "can this backend
//! checkpoint?" instead of branching on the executor's name, and so that
//! tests can substitute a fake backend.
//!
//! - [`Checkpointable`]: save the execution state (keep running, or stop:
//!   suspend), and build the executor that restores it.
//! - [`GuestAccess`]: more commands, agent file operations and byte streams
//!   into the running guest.
//!
//! - [`Templates`]: saved, freshly booted guests that new sandboxes start
//!   from instead of booting (built ahead of time, listed, removed).
//!
//! The `ns` backend offers none (a process tree has no portable machine
//! state and no agent); the `vm` backend offers both (`pvisor_vm::VmControl`).

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::checkpoint::ExecCheckpoint;
use crate::guest::{ExecChannel, ExecSpec};
use crate::templates::{Swept, TemplateListing};
use crate::{Executor, SandboxError};

pub use pvisor_agent_proto::{EntryKind, FileOp, FileStat, Reply, Request};

/// Why a capability of a running sandbox could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CapabilityError {
    /// The sandbox's supervisor is not there to ask (the Attempt ended, or
    /// its process died).
    #[error("{0}")]
    Unreachable(String),
    /// The backend was reached and refused or failed the request.
    #[error("{0}")]
    Failed(String),
}

/// A backend whose running sandboxes can save their execution state.
pub trait Checkpointable: Send + Sync + std::fmt::Debug {
    /// Saves the execution state of the sandbox of `attempt_dir`; it keeps
    /// running. The checkpoint is verified and recorded by the supervisor.
    fn checkpoint(&self, attempt_dir: &Path, timeout: Duration) -> Result<ExecCheckpoint, CapabilityError>;

    /// Saves the execution state and stops the sandbox. The supervisor then
    /// commits the Attempt's termination receipt (the Job becomes
    /// `suspended`); the caller waits for that, not for this answer.
    fn suspend(&self, attempt_dir: &Path, timeout: Duration) -> Result<ExecCheckpoint, CapabilityError>;

    /// The executor that starts a new Attempt from `checkpoint` (resume, or
    /// an execution fork), booting exactly the machine it was saved from.
    fn restorer(
        &self,
        state_root: &Path,
        checkpoint: &ExecCheckpoint,
    ) -> Result<Arc<dyn Executor>, SandboxError>;
}

/// A backend whose running sandboxes have a guest the host can reach.
pub trait GuestAccess: Send + Sync + std::fmt::Debug {
    /// Starts another command in the guest and relays its stdio and exit.
    fn exec(&self, attempt_dir: &Path, spec: ExecSpec) -> Result<ExecChannel, CapabilityError>;

    /// Relays exec `id`, started in an earlier Attempt of this resumed
    /// guest: its output since the restore, then as it comes, and its exit.
    fn attach(&self, attempt_dir: &Path, id: u32) -> Result<ExecChannel, CapabilityError>;

    /// One agent request (a file operation, a write chunk, a poll) with its
    /// payload, answered by one reply. A guest-side failure is `Failed`.
    fn call(
        &self,
        attempt_dir: &Path,
        request: &Request,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(Reply, Vec<u8>), CapabilityError>;

    /// A byte stream to `127.0.0.1:port` inside the guest.
    fn connect(&self, attempt_dir: &Path, port: u16) -> Result<UnixStream, CapabilityError>;
}

/// A backend's start templates (the `vm` backend's).
pub trait Templates: Send + Sync {
    /// Builds (or verifies) the template a start with `limits` restores;
    /// `built` says whether this call built it.
    fn warm(&self, limits: &crate::limits::Limits) -> Result<WarmedTemplate, CapabilityError>;
    /// Every template kept, current or stale.
    fn list(&self) -> Vec<TemplateListing>;
    /// Removes one template (not while a clone is starting from it); bytes freed.
    fn remove(&self, id: &str) -> Result<u64, CapabilityError>;
    /// Removes stale templates (built for another image or QEMU), corrupt
    /// ones moved aside and partial builds of killed builders: what went
    /// (or, with `dry_run`, would go).
    fn sweep(&self, dry_run: bool) -> Vec<Swept>;
}

/// What [`Templates::warm`] did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct WarmedTemplate {
    pub id: String,
    pub built: bool,
    pub build_ms: Option<u64>,
    pub dir: std::path::PathBuf,
}
