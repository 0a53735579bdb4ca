//! The daemon's one link to a sandbox's guest: every call into a live VM
//! (an exec, an agent file operation, a byte stream to a guest port, a
//! suspend) goes through these functions, over the Attempt's control socket
//! ([`pvisor_sandbox::vm::guest`], [`pvisor_sandbox::vm::control`]).
//!
//! Nothing else in the server names those modules or the agent's wire
//! types; the rest of the daemon speaks in these functions and the types
//! re-exported here, so the link can be replaced as one piece.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use pvisor_sandbox::vm::{self, ControlRequest, ControlResponse};

pub use pvisor_agent_proto::{resolve_in_root, EntryKind, FileOp, FileStat, Reply};
pub use vm::guest::{ExecChannel, ExecSignaller, ExecSpec};

use pvisor_agent_proto::Request;

/// How long one agent call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// What the guest (or the supervisor relaying to it) answered instead.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct GuestError(pub String);

/// Starts `spec` in the VM (see [`ExecSpec`]); its replies come on the channel.
pub fn exec(vm_dir: &Path, spec: ExecSpec) -> Result<ExecChannel, GuestError> {
    vm::guest::exec(vm_dir, spec).map_err(GuestError)
}

/// One agent file operation on the sandbox's `root`.
pub fn file_op(vm_dir: &Path, root: &Path, op: FileOp) -> Result<Reply, GuestError> {
    let request = Request::FileOp { root: root.to_owned(), op };
    vm::guest::call(vm_dir, &request, &[], CALL_TIMEOUT).map(|(r, _)| r).map_err(GuestError)
}

/// Up to `len` bytes of the guest file `path` (an absolute guest path) from `offset`.
pub fn read(vm_dir: &Path, path: &Path, offset: u64, len: u64) -> Result<Vec<u8>, GuestError> {
    let request = Request::ReadFile { path: path.to_owned(), offset, len: Some(len) };
    vm::guest::call(vm_dir, &request, &[], CALL_TIMEOUT).map(|(_, b)| b).map_err(GuestError)
}

/// Writes one page of the guest file `path`: truncating it first unless `append`.
pub fn write_chunk(
    vm_dir: &Path,
    path: &Path,
    mode: u32,
    append: bool,
    data: &[u8],
) -> Result<(), GuestError> {
    let request = Request::WriteFile { path: path.to_owned(), mode, append };
    vm::guest::call(vm_dir, &request, data, CALL_TIMEOUT).map(|_| ()).map_err(GuestError)
}

/// Sends `signal` to the guest exec `id`.
pub fn signal(vm_dir: &Path, id: u32, signal: i32) -> Result<(), GuestError> {
    vm::guest::call(vm_dir, &Request::Signal { id, signal }, &[], CALL_TIMEOUT)
        .map(|_| ())
        .map_err(GuestError)
}

/// The guest exec `id`'s state: `Reply::Status` (or whatever else the agent said).
pub fn status(vm_dir: &Path, id: u32) -> Result<Reply, GuestError> {
    vm::guest::call(vm_dir, &Request::Status { id }, &[], CALL_TIMEOUT).map(|(r, _)| r).map_err(GuestError)
}

/// A cheap agent call that succeeds once the guest serves the sandbox `root`.
pub fn probe(vm_dir: &Path, root: &Path) -> Result<(), GuestError> {
    let request = Request::FileOp { root: root.to_owned(), op: FileOp::Stat { path: "/".into() } };
    vm::guest::call(vm_dir, &request, &[], Duration::from_secs(10)).map(|_| ()).map_err(GuestError)
}

/// A byte stream to `127.0.0.1:port` inside the VM.
pub fn forward(vm_dir: &Path, port: u16) -> Result<UnixStream, GuestError> {
    vm::guest::forward(vm_dir, port).map_err(GuestError)
}

/// Asks the Attempt's supervisor to suspend the VM (its execution saved to
/// a checkpoint); Ok once the supervisor says it is checkpointed.
pub fn suspend(vm_dir: &Path) -> Result<(), GuestError> {
    match vm::control(vm_dir, &ControlRequest::Suspend, Duration::from_secs(600)).map_err(GuestError)? {
        ControlResponse::Checkpointed { .. } => Ok(()),
        ControlResponse::Error { message } => Err(GuestError(message)),
        ControlResponse::Forwarded => {
            Err(GuestError("the supervisor answered a suspend with `forwarded`".into()))
        }
    }
}
