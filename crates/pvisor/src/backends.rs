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

    /// What sandboxes of backend `name` are like; an unknown name has none
    /// of the traits.
    fn traits(&self, name: &str) -> BackendTraits {
        host_traits(name)
    }
}

/// What a backend's sandboxes are like: what admission, the actions and a
/// frontend ask instead of comparing the backend's name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendTraits {
    /// The sandbox is a guest machine: its Attempts get a VM spec (disks,
    /// control socket, execution checkpoints) and may share host
    /// directories or join a network namespace.
    pub guest_machine: bool,
    /// A workspace under the state directory's sandbox images may be run
    /// (the guest sees a copy of it as its root filesystem).
    pub image_rootfs: bool,
    /// The sandbox shares the host's kernel: it gets pvisor's default
    /// limits, a disk quota on its stage, `--cache` mounts and exposed
    /// host sockets.
    pub shares_host_kernel: bool,
    /// The exit status and staged files are what a guest the command
    /// controls reported.
    pub guest_reported: bool,
    /// The backend keeps start templates.
    pub keeps_templates: bool,
}

/// The traits of the backends [`HostBackends`] knows, by name.
pub fn host_traits(name: &str) -> BackendTraits {
    match name {
        "ns" => BackendTraits { shares_host_kernel: true, ..BackendTraits::default() },
        "vm" => BackendTraits {
            guest_machine: true,
            image_rootfs: true,
            guest_reported: true,
            keeps_templates: true,
            ..BackendTraits::default()
        },
        _ => BackendTraits::default(),
    }
}

/// The backend that keeps start templates, if any.
pub(crate) fn template_backend(backends: &dyn Backends) -> Option<&'static str> {
    HOST_BACKENDS.iter().copied().find(|name| backends.traits(name).keeps_templates)
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use super::*;
    use crate::actions::Run;
    use crate::testing::{FakeBackends, FakeExecutor, Script};
    use crate::{RunEnd, RunRequest, Runtime, RuntimeError};
    use pvisor_sandbox::capabilities::{Checkpointable, GuestAccess};

    /// The fake backend, with the traits a test gives it.
    #[derive(Debug)]
    struct WithTraits(FakeBackends, BackendTraits);

    impl Backends for WithTraits {
        fn executor(&self, name: &str) -> Option<Arc<dyn Executor>> {
            self.0.executor(name)
        }

        fn checkpointable(&self, name: &str) -> Option<Arc<dyn Checkpointable>> {
            self.0.checkpointable(name)
        }

        fn guest_access(&self, name: &str) -> Option<Arc<dyn GuestAccess>> {
            self.0.guest_access(name)
        }

        fn traits(&self, name: &str) -> BackendTraits {
            if name == "fake" {
                self.1
            } else {
                BackendTraits::default()
            }
        }
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        workspace: PathBuf,
        runtime: Runtime,
        fake: Arc<FakeExecutor>,
    }

    fn on(traits: BackendTraits) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("ws");
        std::fs::create_dir(&workspace).unwrap();
        let store = pvisor_core::store::Store::open(dir.path().join("state")).unwrap();
        let fake = FakeExecutor::new([Script::exits(0, &[])]);
        let backends = WithTraits(FakeBackends { executor: fake.clone(), capabilities: None }, traits);
        Fixture { _dir: dir, workspace, runtime: Runtime::new(store, Arc::new(backends)), fake }
    }

    impl Fixture {
        fn request(&self) -> RunRequest {
            RunRequest {
                caches: Vec::new(),
                state: Vec::new(),
                state_from: None,
                labels: Default::default(),
                network_namespace: None,
                shared_directories: Vec::new(),
                image: None,
                output: None,
                workspace: self.workspace.clone(),
                cwd: None,
                program: "fake-command".into(),
                args: Vec::new(),
                env: vec![("PATH".into(), "/usr/bin:/bin".into())],
                kill_grace: Duration::from_millis(300),
                network: Vec::new(),
                fork: None,
                fork_execution: None,
                secrets: Default::default(),
                seccomp: true,
                limits: Default::default(),
            }
        }

        /// Runs `request` to its end, or returns why it was not admitted.
        fn run(&self, request: RunRequest) -> Result<(), RuntimeError> {
            let executor = self.runtime.executor("fake").unwrap();
            let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            tokio.block_on(async {
                let mut run = self.runtime.execute(Run { request, executor })?;
                assert!(matches!(run.wait().await.unwrap(), RunEnd::Finished(_)));
                Ok(())
            })
        }
    }

    #[test]
    fn the_host_table_says_what_each_backend_is_like() {
        let ns = host_traits("ns");
        assert!(ns.shares_host_kernel && !ns.guest_machine && !ns.guest_reported && !ns.keeps_templates);
        let vm = host_traits("vm");
        assert!(vm.guest_machine && vm.image_rootfs && vm.guest_reported && vm.keeps_templates);
        assert!(!vm.shares_host_kernel);
        assert_eq!(host_traits("no-such-backend"), BackendTraits::default());
    }

    #[test]
    fn only_a_guest_machine_backend_is_given_a_vm_spec() {
        let plain = on(BackendTraits::default());
        plain.run(plain.request()).unwrap();
        assert!(plain.fake.journal().started[0].vm.is_none());
        let machine = on(BackendTraits { guest_machine: true, ..BackendTraits::default() });
        machine.run(machine.request()).unwrap();
        let spec = &machine.fake.journal().started[0];
        let vm = spec.vm.as_ref().expect("a VM spec");
        assert!(vm.dir.ends_with("vm"), "{:?}", vm.dir);
    }

    #[test]
    fn host_directories_are_shared_only_with_a_guest_machine_and_the_message_names_the_backend() {
        let f = on(BackendTraits { shares_host_kernel: true, ..BackendTraits::default() });
        let mut request = f.request();
        request.shared_directories = vec![pvisor_core::records::SharedDirectory {
            source: f.workspace.clone(),
            target: "/data".into(),
            read_only: false,
            live_mounts: false,
        }];
        let e = f.run(request).unwrap_err().to_string();
        assert!(e.contains("only a vm Job shares host directories (this Job's executor is fake)"), "{e}");
        assert!(f.fake.journal().started.is_empty(), "nothing started");
    }
}
