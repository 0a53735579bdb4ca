//! The daemon's one link to a sandbox's guest: every call into a live VM
//! (an exec, an agent file operation, a byte stream to a guest port, a
//! suspend) goes through these functions, which translate the daemon's
//! needs into the runtime's actions ([`pvisor::actions::OpenGuest`] and its
//! [`Link`] handle, [`pvisor::actions::Suspend`]). The daemon never speaks
//! to a control socket or the agent protocol itself.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use pvisor::actions::guest::Request;
use pvisor::actions::{AwaitGuest, GiveUp, OpenGuest, Readiness, Suspend};
use pvisor::Runtime;
use pvisor_core::ids::JobId;

pub use pvisor::actions::guest::{
    resolve_in_root, EntryKind, ExecChannel, ExecSignaller, ExecSpec, FileOp, FileStat, Reply,
};
/// The guest of one sandbox generation (one Attempt of its Job).
pub use pvisor::actions::Guest as Link;

/// How long one agent call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// What the guest (or the runtime on its way there) answered instead.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct GuestError(pub String);

impl From<pvisor::actions::guest::CapabilityError> for GuestError {
    fn from(e: pvisor::actions::guest::CapabilityError) -> Self {
        Self(e.to_string())
    }
}

impl From<pvisor::RuntimeError> for GuestError {
    fn from(e: pvisor::RuntimeError) -> Self {
        Self(e.to_string())
    }
}

/// The guest of Attempt `attempt` of `job`, which must be running.
pub fn open(runtime: &Runtime, job: &JobId, attempt: u32) -> Result<Link, GuestError> {
    Ok(runtime.execute(OpenGuest { job: job.clone(), attempt: Some(attempt) })?)
}

/// Starts `spec` in the VM (see [`ExecSpec`]); its replies come on the channel.
pub fn exec(link: &Link, spec: ExecSpec) -> Result<ExecChannel, GuestError> {
    Ok(link.exec(spec)?)
}

/// One agent file operation on the sandbox's `root`.
pub fn file_op(link: &Link, root: &Path, op: FileOp) -> Result<Reply, GuestError> {
    let request = Request::FileOp { root: root.to_owned(), op };
    Ok(link.call(&request, &[], CALL_TIMEOUT).map(|(r, _)| r)?)
}

/// Up to `len` bytes of the guest file `path` (an absolute guest path) from `offset`.
pub fn read(link: &Link, path: &Path, offset: u64, len: u64) -> Result<Vec<u8>, GuestError> {
    let request = Request::ReadFile { path: path.to_owned(), offset, len: Some(len) };
    Ok(link.call(&request, &[], CALL_TIMEOUT).map(|(_, b)| b)?)
}

/// Writes one page of the guest file `path`: truncating it first unless `append`.
pub fn write_chunk(link: &Link, path: &Path, mode: u32, append: bool, data: &[u8]) -> Result<(), GuestError> {
    let request = Request::WriteFile { path: path.to_owned(), mode, append };
    Ok(link.call(&request, data, CALL_TIMEOUT).map(|_| ())?)
}

/// Sends `signal` to the guest exec `id`.
pub fn signal(link: &Link, id: u32, signal: i32) -> Result<(), GuestError> {
    Ok(link.call(&Request::Signal { id, signal }, &[], CALL_TIMEOUT).map(|_| ())?)
}

/// The guest exec `id`'s state: `Reply::Status` (or whatever else the agent said).
pub fn status(link: &Link, id: u32) -> Result<Reply, GuestError> {
    Ok(link.call(&Request::Status { id }, &[], CALL_TIMEOUT).map(|(r, _)| r)?)
}

/// Waits until the guest of Attempt `attempt` of `job` serves the sandbox
/// `root`, polling every `poll`; stops early when the Job ends or
/// `give_up` says why.
pub fn await_ready(
    runtime: &Runtime,
    job: &JobId,
    attempt: u32,
    root: &Path,
    (timeout, poll): (Duration, Duration),
    give_up: Option<GiveUp>,
) -> Result<Link, GuestError> {
    let ready = Readiness { root: root.to_owned(), timeout, poll };
    let wait = AwaitGuest { job: job.clone(), attempt: Some(attempt), ready, give_up };
    runtime.execute(wait).map_err(|e| match e {
        pvisor::RuntimeError::GuestNotReady { last, .. } => GuestError(last),
        other => GuestError(other.to_string()),
    })
}

/// A byte stream to `127.0.0.1:port` inside the VM.
pub fn forward(link: &Link, port: u16) -> Result<UnixStream, GuestError> {
    Ok(link.connect(port)?)
}

/// Suspends the sandbox's VM (its execution saved to a checkpoint); Ok
/// once the termination receipt has made the Job `suspended`.
pub fn suspend(runtime: &Runtime, job: &JobId) -> Result<(), GuestError> {
    runtime.execute(Suspend { job: job.clone() })?;
    Ok(())
}
