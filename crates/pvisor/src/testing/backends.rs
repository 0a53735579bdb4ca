//! The fake backends the runtime is built on in tests: `fake`, or `fake`
//! answering for `vm`.

use std::sync::Arc;

use pvisor_sandbox::capabilities::{Checkpointable, GuestAccess};
use pvisor_sandbox::Executor;

use super::{FakeCheckpointer, FakeExecutor, FakeGuest, Script};
use crate::backends::Backends;

/// Backends with only `fake`, with or without the capabilities.
#[derive(Debug)]
pub struct FakeBackends {
    pub executor: Arc<FakeExecutor>,
    pub capabilities: Option<Arc<FakeCheckpointer>>,
}

impl Backends for FakeBackends {
    fn executor(&self, name: &str) -> Option<Arc<dyn Executor>> {
        (name == "fake").then(|| self.executor.clone() as Arc<dyn Executor>)
    }

    fn checkpointable(&self, name: &str) -> Option<Arc<dyn Checkpointable>> {
        self.capabilities.clone().filter(|_| name == "fake").map(|c| c as Arc<dyn Checkpointable>)
    }

    fn guest_access(&self, name: &str) -> Option<Arc<dyn GuestAccess>> {
        self.capabilities.clone().filter(|_| name == "fake").map(|c| c as Arc<dyn GuestAccess>)
    }
}

/// [`FakeBackends`] that answer for the backend name `vm`: for the
/// frontends that ask for `vm` by name (the daemon's sandbox supervisor,
/// the containerd shim). Their fake executor places Jobs as `vm` Jobs.
#[derive(Debug)]
pub struct FakeVmBackends(pub FakeBackends);

impl FakeVmBackends {
    /// A working fake VM: every start plays `keeper` unless a script is
    /// queued; checkpoints, suspends, restores and a guest that plays `guest`.
    pub fn working(keeper: Script, guest: Arc<FakeGuest>) -> Self {
        let executor = FakeExecutor::always_as("vm", keeper);
        let capabilities = Some(Arc::new(FakeCheckpointer::working_with(&executor, guest)));
        Self(FakeBackends { executor, capabilities })
    }

    fn alias(name: &str) -> &str {
        if name == "vm" {
            "fake"
        } else {
            name
        }
    }
}

impl Backends for FakeVmBackends {
    fn executor(&self, name: &str) -> Option<Arc<dyn Executor>> {
        self.0.executor(Self::alias(name))
    }

    fn checkpointable(&self, name: &str) -> Option<Arc<dyn Checkpointable>> {
        self.0.checkpointable(Self::alias(name))
    }

    fn guest_access(&self, name: &str) -> Option<Arc<dyn GuestAccess>> {
        self.0.guest_access(Self::alias(name))
    }
}
