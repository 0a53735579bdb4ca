//! Access to the guest of a running Job: more commands, agent file
//! operations and byte streams to its services — what `pvisor serve`'s
//! execd, code interpreter and port relay are built on.
//!
//! [`OpenGuest`] resolves the Job's live Attempt once and checks that its
//! backend has a guest; the [`Guest`] handle then carries each request to
//! the backend's [`GuestAccess`].

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pvisor_core::ids::{AttemptId, JobId};
use pvisor_sandbox::capabilities::GuestAccess;

/// The vocabulary of guest access: commands (`ExecSpec`, on pipes or a
/// terminal of a `TerminalSize`, relayed on an `ExecChannel`), agent requests and replies, file metadata, and the
/// host-side lookup of a path beneath an image root, which resolves
/// symlinks the way the guest will. One definition, shared with the agent.
pub use pvisor_agent_proto::{resolve_in_root, EntryKind, FileOp, FileStat, Reply, Request, TerminalSize};
pub use pvisor_sandbox::capabilities::CapabilityError;
pub use pvisor_vm::guest::{ExecChannel, ExecSignaller, ExecSpec};

/// The Operation of a Job that exists to hold a guest open while its real
/// work arrives as guest execs (`pvisor serve`'s sandboxes, the containerd
/// shim's containers): it sleeps until the Job is ended.
///
/// It first makes itself the OOM killer's last choice (where it may: root
/// in a VM guest; elsewhere the write fails quietly). Its end is the Job's
/// end, so a guest out of memory must kill the work that filled it, not
/// the keeper: a keeper killed first took the whole VM down under the
/// container whose process had used the memory.
///
/// Ended (SIGTERM to its group, so its `sleep` too), it exits with the
/// status a frontend left as the name of a directory [`KEEPER_EXIT`]`.N`
/// in the guest's root (the containerd shim leaves its container's exit
/// status, so the Job's result carries it); with none there, it dies of
/// the signal as before.
pub const KEEPER: &str = "{ echo -1000 >/proc/self/oom_score_adj; } 2>/dev/null; \
    trap 'for f in /run/pvisor-keeper-exit.*; do [ -d \"$f\" ] && exit \"${f##*.}\"; done; trap - TERM; kill -TERM $$' TERM; \
    while :; do sleep 3600; done";

/// Where a frontend leaves the status the [`KEEPER`] ends with: a directory
/// named this, a dot and the status, in the guest's own root.
pub const KEEPER_EXIT: &str = "/run/pvisor-keeper-exit";

use super::{Action, Runtime, RuntimeError};

/// Opens the guest of `job`'s running Attempt: `attempt` (its number), or
/// the one the Job targets.
#[derive(Debug)]
pub struct OpenGuest {
    pub job: JobId,
    pub attempt: Option<u32>,
}

/// The guest of one running Attempt. Cheap to clone; a request after the
/// Attempt ended fails with [`CapabilityError::Unreachable`].
#[derive(Clone, Debug)]
pub struct Guest {
    access: Arc<dyn GuestAccess>,
    attempt: AttemptId,
    attempt_dir: PathBuf,
}

impl Action for OpenGuest {
    const NAME: &'static str = "open-guest";
    type Outcome = Guest;

    fn perform(self, runtime: &Runtime) -> Result<Guest, RuntimeError> {
        let mut live = runtime.job(&self.job)?;
        if let Some(n) = self.attempt {
            live.attempt = AttemptId::new(live.run.id.clone(), n);
            live.attempt_dir = runtime.store.attempt_dir(&live.attempt);
        }
        let access =
            runtime.backends.guest_access(live.executor()).ok_or_else(|| RuntimeError::Unsupported {
                job: self.job.clone(),
                executor: live.executor().to_owned(),
                what: "reach a guest",
                hint: "guest access needs a Job started with --executor vm",
            })?;
        runtime.require_running(&live, "only a running Job has a guest to reach")?;
        Ok(Guest { access, attempt: live.attempt, attempt_dir: live.attempt_dir })
    }
}

impl Guest {
    /// The Attempt this handle reaches.
    pub fn attempt(&self) -> &AttemptId {
        &self.attempt
    }

    /// Starts another command in the guest; its stdio and exit are relayed.
    pub fn exec(&self, spec: ExecSpec) -> Result<ExecChannel, CapabilityError> {
        self.access.exec(&self.attempt_dir, spec)
    }

    /// Follows a command started in an earlier Attempt of this resumed
    /// guest again (its channel ended with the suspension).
    pub fn attach(&self, id: u32) -> Result<ExecChannel, CapabilityError> {
        self.access.attach(&self.attempt_dir, id)
    }

    /// One agent request with its payload, answered by one reply.
    pub fn call(
        &self,
        request: &Request,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(Reply, Vec<u8>), CapabilityError> {
        self.access.call(&self.attempt_dir, request, payload, timeout)
    }

    /// A byte stream to `127.0.0.1:port` inside the guest.
    pub fn connect(&self, port: u16) -> Result<UnixStream, CapabilityError> {
        self.access.connect(&self.attempt_dir, port)
    }
}
