//! Guest access for whoever owns a live vm Attempt (the `pvisor serve`
//! daemon): more commands inside the running VM, and agent calls such as file
//! operations, over the Attempt's control socket.
//!
//! Wire format on the socket: one JSON [`ControlRequest`] line, then
//! - `exec` (and `attach`, to an exec a resumed guest runs): AgentCtl
//!   frames both ways. The supervisor relays the exec's
//!   [`Reply`]s (`Started`/`ExecFailed`, output, `Exited`) and accepts
//!   `Stdin`/`CloseStdin`/`Signal`/`Resize` [`Request`]s, whose id it forces
//!   to the exec's own. Closing the socket does not signal the process: the caller
//!   decides (a background command must outlive its request).
//! - `call`: `payload` raw bytes follow the line; the answer is one frame.
//! - `forward`: one JSON [`ControlResponse`] line; after `forwarded`, the
//!   connection is a byte stream to a service on guest `127.0.0.1:port`.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use pvisor_agent_proto::{read_frame, Reply, Request};

pub use pvisor_sandbox::guest::{ExecChannel, ExecSignaller, ExecSpec};

use super::control::{ControlError, ControlRequest, ControlResponse};

/// Starts `spec` in the VM whose Attempt directory holds `vm_dir`.
pub fn exec(vm_dir: &Path, spec: ExecSpec) -> Result<ExecChannel, ControlError> {
    let id = spec.id;
    let stream = super::control::connect_control(vm_dir)?;
    let mut line = serde_json::to_vec(&ControlRequest::Exec(spec)).map_err(ControlError::Encode)?;
    line.push(b'\n');
    (&stream).write_all(&line).map_err(ControlError::Send)?;
    ExecChannel::new(stream, id).map_err(ControlError::Io)
}

/// Relays exec `id` of the VM whose Attempt directory holds `vm_dir`: a
/// command started in an earlier Attempt of a resumed guest, whose output
/// since the restore the supervisor has held. The channel then carries its
/// output, its `Exited` (again, if it ended before), signals and stdin.
pub fn attach(vm_dir: &Path, id: u32) -> Result<ExecChannel, ControlError> {
    let stream = super::control::connect_control(vm_dir)?;
    let mut line = serde_json::to_vec(&ControlRequest::Attach { id }).map_err(ControlError::Encode)?;
    line.push(b'\n');
    (&stream).write_all(&line).map_err(ControlError::Send)?;
    ExecChannel::new(stream, id).map_err(ControlError::Io)
}

/// One agent request (file operations, `Poll`) answered by one reply.
pub fn call(
    vm_dir: &Path,
    request: &Request,
    payload: &[u8],
    timeout: Duration,
) -> Result<(Reply, Vec<u8>), ControlError> {
    let stream = super::control::connect_control(vm_dir)?;
    stream.set_read_timeout(Some(timeout)).map_err(ControlError::Io)?;
    let call = ControlRequest::Call { request: Box::new(request.clone()), payload: payload.len() as u32 };
    let mut line = serde_json::to_vec(&call).map_err(ControlError::Encode)?;
    line.push(b'\n');
    line.extend_from_slice(payload);
    (&stream).write_all(&line).map_err(ControlError::Send)?;
    match read_frame::<Reply>(&mut (&stream)) {
        Ok(Some((Reply::Error { op, message }, _))) => Err(ControlError::GuestFailed { op, message }),
        Ok(Some(reply)) => Ok(reply),
        Ok(None) => Err(ControlError::Closed),
        Err(e) => Err(ControlError::NoReply(e)),
    }
}

/// A byte stream to `127.0.0.1:port` inside the VM (a service the sandbox runs).
pub fn forward(vm_dir: &Path, port: u16) -> Result<UnixStream, ControlError> {
    let stream = super::control::connect_control(vm_dir)?;
    let mut line = serde_json::to_vec(&ControlRequest::Forward { port }).map_err(ControlError::Encode)?;
    line.push(b'\n');
    (&stream).write_all(&line).map_err(ControlError::Send)?;
    // Byte by byte: what follows the answer line is the stream itself.
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while answer.len() < 64 << 10 {
        match (&stream).read(&mut byte) {
            Ok(1) if byte[0] == b'\n' => break,
            Ok(1) => answer.push(byte[0]),
            Ok(_) => return Err(ControlError::Closed),
            Err(e) => return Err(ControlError::NoReply(e)),
        }
    }
    match serde_json::from_slice(&answer) {
        Ok(ControlResponse::Forwarded) => Ok(stream),
        Ok(ControlResponse::Error { message }) => Err(ControlError::Refused(message)),
        Ok(other) => Err(ControlError::Unexpected(format!("{other:?}"))),
        Err(e) => Err(ControlError::Garbage(e)),
    }
}
