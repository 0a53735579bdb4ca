//! Which executor starts a Job on each backend, and which capabilities each
//! backend offers to a Job that is already running.
//!
//! The runtime never branches on an executor's name to decide what it can
//! do: it asks [`Backends`] for a [`Checkpointable`] or a [`GuestAccess`]
//! and reports "unsupported" when there is none. [`HostBackends`] is the
//! real machine (`ns`, `vm`); tests substitute their own.

use std::path::PathBuf;
use std::sync::Arc;

use pvisor_ns::NsExecutor;
use pvisor_sandbox::capabilities::{Checkpointable, GuestAccess, Templates};
use pvisor_sandbox::{Executor, Unavailable};
use pvisor_vm::{VmControl, VmExecutor};

/// The executors and capabilities of each backend, by the name recorded in
/// a Job's Placement (`ns`, `vm`).
pub trait Backends: Send + Sync + std::fmt::Debug {
    /// The executor that starts new Jobs on backend `name`, or `None` if
    /// there is no such backend. A backend that exists but cannot be
    /// prepared returns an executor whose `start` fails with the reason, so
    /// the Job is still admitted and fails setup on the record.
    fn executor(&self, name: &str) -> Option<Arc<dyn Executor>>;

    /// How running sandboxes of backend `name` save their execution state.
    fn checkpointable(&self, name: &str) -> Option<Arc<dyn Checkpointable>>;

    /// How the guests of running sandboxes of backend `name` are reached.
    fn guest_access(&self, name: &str) -> Option<Arc<dyn GuestAccess>>;

    /// The start templates of backend `name`, if it keeps any.
    fn templates(&self, _name: &str) -> Option<Arc<dyn Templates>> {
        None
    }
}

/// The backends of this machine.
#[derive(Debug)]
pub struct HostBackends {
    state_root: PathBuf,
}

impl HostBackends {
    /// Backends whose images and checkpoints live under `state_root`.
    pub fn new(state_root: impl Into<PathBuf>) -> Self {
        Self { state_root: state_root.into() }
    }
}

/// The backend names [`HostBackends`] knows, for error messages and `--help`.
pub const HOST_BACKENDS: &[&str] = &["ns", "vm"];

impl Backends for HostBackends {
    fn executor(&self, name: &str) -> Option<Arc<dyn Executor>> {
        match name {
            "ns" => Some(Arc::new(NsExecutor)),
            // Installs the guest image under the state directory and decides
            // KVM or TCG (recorded in Placement).
            "vm" => Some(match VmExecutor::prepare(&self.state_root) {
                Ok(vm) => Arc::new(vm),
                Err(e) => Arc::new(Unavailable::new("vm", &e)),
            }),
            _ => None,
        }
    }

    fn checkpointable(&self, name: &str) -> Option<Arc<dyn Checkpointable>> {
        (name == "vm").then(|| Arc::new(VmControl) as Arc<dyn Checkpointable>)
    }

    fn guest_access(&self, name: &str) -> Option<Arc<dyn GuestAccess>> {
        (name == "vm").then(|| Arc::new(VmControl) as Arc<dyn GuestAccess>)
    }

    fn templates(&self, name: &str) -> Option<Arc<dyn Templates>> {
        match name {
            "vm" => VmExecutor::prepare(&self.state_root).ok().map(|vm| Arc::new(vm) as Arc<dyn Templates>),
            _ => None,
        }
    }
}
