//! The vm backend's capabilities for a running VM ([`Checkpointable`],
//! [`GuestAccess`]): requests to the control socket the Attempt's
//! supervisor serves in `<attempt>/vm/` (see `checkpoint.rs` and
//! `guest.rs` for the wire format).

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use pvisor_sandbox::capabilities::{CapabilityError, Checkpointable, GuestAccess};
use pvisor_sandbox::{Executor, SandboxError};

use super::control::control_socket;
use super::guest::{self, ExecChannel, ExecSpec};
use super::{ControlRequest, ControlResponse, ExecCheckpoint, VmExecutor};
use pvisor_agent_proto::{Reply, Request};

/// Reaches running VMs through their supervisors; holds no state, so one
/// value serves every Attempt.
#[derive(Clone, Copy, Debug, Default)]
pub struct VmControl;

impl VmControl {
    fn vm_dir(attempt_dir: &Path) -> Result<PathBuf, CapabilityError> {
        let dir = attempt_dir.join("vm");
        if control_socket(&dir).exists() {
            Ok(dir)
        } else {
            Err(CapabilityError::Unreachable(format!(
                "no live VM supervisor for {} (the Attempt is not running)",
                attempt_dir.display()
            )))
        }
    }

    fn save(
        attempt_dir: &Path,
        request: ControlRequest,
        timeout: Duration,
    ) -> Result<ExecCheckpoint, CapabilityError> {
        let dir = Self::vm_dir(attempt_dir)?;
        match super::control(&dir, &request, timeout).map_err(|e| CapabilityError::Failed(e.to_string()))? {
            ControlResponse::Checkpointed { manifest } => Ok(*manifest),
            ControlResponse::Error { message } => Err(CapabilityError::Failed(message)),
            ControlResponse::Forwarded => Err(CapabilityError::Failed(
                "the VM's supervisor answered a checkpoint request with `forwarded`".into(),
            )),
        }
    }
}

impl Checkpointable for VmControl {
    fn checkpoint(&self, attempt_dir: &Path, timeout: Duration) -> Result<ExecCheckpoint, CapabilityError> {
        Self::save(attempt_dir, ControlRequest::Checkpoint, timeout)
    }

    fn suspend(&self, attempt_dir: &Path, timeout: Duration) -> Result<ExecCheckpoint, CapabilityError> {
        Self::save(attempt_dir, ControlRequest::Suspend, timeout)
    }

    fn restorer(
        &self,
        state_root: &Path,
        checkpoint: &ExecCheckpoint,
    ) -> Result<Arc<dyn Executor>, SandboxError> {
        Ok(Arc::new(VmExecutor::for_checkpoint(state_root, checkpoint)?))
    }
}

impl GuestAccess for VmControl {
    fn exec(&self, attempt_dir: &Path, spec: ExecSpec) -> Result<ExecChannel, CapabilityError> {
        guest::exec(&Self::vm_dir(attempt_dir)?, spec).map_err(|e| CapabilityError::Failed(e.to_string()))
    }

    fn attach(&self, attempt_dir: &Path, id: u32) -> Result<ExecChannel, CapabilityError> {
        guest::attach(&Self::vm_dir(attempt_dir)?, id).map_err(|e| CapabilityError::Failed(e.to_string()))
    }

    fn call(
        &self,
        attempt_dir: &Path,
        request: &Request,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(Reply, Vec<u8>), CapabilityError> {
        guest::call(&Self::vm_dir(attempt_dir)?, request, payload, timeout)
            .map_err(|e| CapabilityError::Failed(e.to_string()))
    }

    fn connect(&self, attempt_dir: &Path, port: u16) -> Result<UnixStream, CapabilityError> {
        guest::forward(&Self::vm_dir(attempt_dir)?, port).map_err(|e| CapabilityError::Failed(e.to_string()))
    }
}
