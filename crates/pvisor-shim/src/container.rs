//! One container: its bundle and mounted rootfs, its VM (a pvisor vm Job)
//! and its processes (the init process and the execs), with the lifecycle
//! containerd drives: create boots the VM, start runs the init process,
//! the init's exit ends the VM, delete unmounts what create mounted.
//!
//! A pod's later container has no VM of its own: create mounts its rootfs
//! in the pod's directory and it runs in the sandbox's VM ([`crate::pod`]);
//! its init's exit and its delete leave that VM running.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use pvisor::Runtime;

use crate::binds;
use crate::pod::{self, PodDir};
use crate::process::{Exit, OnOom, Process, Snapshot, Status, Stdio};
use crate::rootfs::{self, Mount};
use crate::spec::{self, ProcessSpec, Root};
use crate::vm::{HostAttachments, Vm};
use pvisor_agent_proto::GuestContainer;

/// The bundle file that names the container's Job, for `pvisor` and for
/// the shim's `delete` action after a crash.
pub const JOB_FILE: &str = "pvisor-job";

/// What containerd asks for in `Create`.
#[derive(Debug)]
pub struct CreateRequest {
    pub id: String,
    /// containerd's namespace (a label of the Job).
    pub namespace: String,
    pub bundle: PathBuf,
    pub rootfs: Vec<Mount>,
    pub stdio: Stdio,
}

/// Why a container operation failed, in the terms containerd maps to its
/// error kinds.
#[derive(Debug)]
pub enum Error {
    NotFound(String),
    Precondition(String),
    Unsupported(String),
    Invalid(String),
    Internal(String),
}

impl From<spec::SpecError> for Error {
    fn from(e: spec::SpecError) -> Self {
        match e {
            spec::SpecError::Unsupported(_) => Error::Unsupported(e.to_string()),
            other => Error::Invalid(other.to_string()),
        }
    }
}

#[derive(Debug)]
pub struct Container {
    pub id: String,
    /// containerd's namespace (a `binary://` logger is told it).
    namespace: String,
    pub bundle: PathBuf,
    rootfs: PathBuf,
    /// What create mounted at `rootfs` (nothing: a rootfs already in place).
    mounts: Vec<Mount>,
    pub init: Arc<Process>,
    execs: Mutex<HashMap<String, Arc<Process>>>,
    pub vm: Arc<Vm>,
    /// The pids limit the spec asked for (0: none).
    pub pids_limit: u64,
    place: Place,
}

/// Where a container runs.
#[derive(Debug)]
enum Place {
    /// In a VM of its own; a pod's sandbox also holds the pod's directory.
    OwnVm { pod: Option<PodDir> },
    /// In its pod's VM, the sandbox's, chrooted into its rootfs there.
    InPod,
}

impl Container {
    /// Mounts the rootfs and boots the container's VM, or for a pod's later
    /// container whose sandbox this shim runs (`sandbox`), places it in the
    /// pod's VM. Nothing is left mounted or running if it fails.
    pub fn create(
        request: CreateRequest,
        runtime: &Runtime,
        tokio: &tokio::runtime::Handle,
        sandbox: Option<&Container>,
    ) -> Result<Container, Error> {
        if let Some(sandbox) = sandbox {
            return Self::join(request, runtime, sandbox);
        }
        request.stdio.check().map_err(|e| Error::Unsupported(e.to_string()))?;
        let oci = spec::load(&request.bundle)?;
        let root = oci.root().as_ref().map(|r| r.path().clone()).unwrap_or_else(|| "rootfs".into());
        let rootfs = request.bundle.join(root);
        let limits = spec::limits(&oci);
        let pids_limit = limits.pids.unwrap_or(0);
        std::fs::create_dir_all(&rootfs)
            .map_err(|e| Error::Internal(format!("cannot create {}: {e}", rootfs.display())))?;
        rootfs::mount_all(&request.rootfs, &rootfs).map_err(|e| Error::Internal(e.to_string()))?;
        let mounted = !request.rootfs.is_empty();
        let undo = |e: Error| {
            if mounted {
                rootfs::unmount_all(&rootfs, &request.rootfs);
            }
            pod::remove(&request.namespace, &request.id);
            e
        };
        let init = spec::init_process(&oci).map_err(|e| undo(e.into()))?;
        // Into containerd's snapshot only: a rootfs the shim did not mount
        // is someone's directory, not to be written.
        let binds = binds::plan(binds::binds(&oci));
        if mounted {
            binds::copy_in(&binds.copied, &rootfs).map_err(|e| undo(Error::Invalid(e.to_string())))?;
            binds::make_mount_points(&binds.shared, &rootfs)
                .map_err(|e| undo(Error::Invalid(e.to_string())))?;
        } else if !binds.copied.is_empty() {
            log::warn!("{}: bind mounts are not copied into a rootfs the shim did not mount", request.id);
        }
        let labels = spec::labels(&oci, &request.namespace, &request.id);
        let logger = request
            .stdio
            .logger(&request.id, &request.namespace)
            .map_err(|e| undo(Error::Invalid(e.to_string())))?;
        let pod = match spec::is_pod_sandbox(&oci) {
            true => Some(
                PodDir::make(&request.namespace, &request.id, &rootfs)
                    .map_err(|e| undo(Error::Internal(e.to_string())))?,
            ),
            false => None,
        };
        let mut shared_directories = binds.shared;
        shared_directories.extend(pod.as_ref().map(PodDir::share));
        let host = HostAttachments {
            network_namespace: spec::network_namespace(&oci, &request.bundle).map_err(|e| undo(e.into()))?,
            shared_directories,
        };
        let vm = Vm::boot(runtime, tokio, &request.id, rootfs.clone(), limits, labels, host)
            .map_err(|e| undo(Error::Internal(e.to_string())))?;
        // In containerd's bundle, not the store: a file lost to a crash only
        // means the cleanup after a crashed shim cannot name its Job.
        #[allow(clippy::disallowed_methods)]
        let _ = std::fs::write(request.bundle.join(JOB_FILE), vm.job().as_str());
        Ok(Container {
            id: request.id,
            namespace: request.namespace,
            bundle: request.bundle,
            rootfs,
            mounts: request.rootfs,
            init: Process::new(init, request.stdio, logger),
            execs: Mutex::new(HashMap::new()),
            vm: Arc::new(vm),
            pids_limit,
            place: Place::OwnVm { pod },
        })
    }

    /// A pod's later container in the pod's VM: its rootfs (and volumes)
    /// built on the node and moved into the pod's directory, where the
    /// guest sees them live ([`crate::pod`]).
    fn join(request: CreateRequest, runtime: &Runtime, sandbox: &Container) -> Result<Container, Error> {
        request.stdio.check().map_err(|e| Error::Unsupported(e.to_string()))?;
        let Place::OwnVm { pod: Some(pod) } = &sandbox.place else {
            return Err(Error::Precondition(format!("{} is not a pod sandbox of this shim", sandbox.id)));
        };
        let ending = |why: String| Error::Precondition(format!("pod sandbox {}: {why}", sandbox.id));
        let admission = pod.admit().map_err(|e| ending(e.to_string()))?;
        if sandbox.init.snapshot().status == Status::Stopped || sandbox.vm.paused().is_some() {
            return Err(ending("it is stopped or stopping; its VM takes no new container".into()));
        }
        if request.rootfs.is_empty() {
            return Err(Error::Unsupported(format!(
                "container {}: a pod's container runs from containerd's snapshot; this bundle brings its own rootfs",
                request.id
            )));
        }
        let oci = spec::load(&request.bundle)?;
        let mut init = spec::init_process(&oci)?;
        let limits = spec::limits(&oci);
        if let Some(max_bytes) = limits.memory_bytes {
            sandbox.fits_in_vm(&request.id, max_bytes)?;
        }
        // Its own pid and mount namespaces in the VM, and cgroup.
        let container = GuestContainer {
            name: request.id.clone(),
            memory_max: limits.memory_bytes,
            pids_max: limits.pids,
            cpu_max_us: limits.cpus.map(|cpus| (cpus * 100_000.0).round() as u64),
            start: true,
        };
        init.confinement.get_or_insert_with(Default::default).container = Some(container);
        let binds = binds::plan(binds::binds(&oci));
        // The volumes pass the checks the pod's own shares passed.
        let check =
            pvisor::actions::CheckJoiningShares { workspace: sandbox.rootfs.clone(), shares: binds.shared };
        let shared =
            runtime.execute(check).map_err(|e| Error::Invalid(format!("container {}: {e}", request.id)))?;
        let logger = request
            .stdio
            .logger(&request.id, &request.namespace)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        let staging = admission.staging(&request.id).map_err(|e| Error::Invalid(e.to_string()))?;
        let undo = |e: Error| {
            rootfs::unmount_all(&staging, &request.rootfs);
            let _ = std::fs::remove_dir(&staging);
            e
        };
        rootfs::mount_all(&request.rootfs, &staging).map_err(|e| undo(Error::Internal(e.to_string())))?;
        binds::copy_in(&binds.copied, &staging).map_err(|e| undo(Error::Invalid(e.to_string())))?;
        binds::mount_into(&shared, &staging).map_err(|e| undo(Error::Invalid(e.to_string())))?;
        let (rootfs, guest_root) =
            admission.enter(&request.id, &staging).map_err(|e| undo(Error::Internal(e.to_string())))?;
        init.root = Root::At(guest_root);
        log::info!("container {} runs in pod {}'s VM (Job {})", request.id, sandbox.id, sandbox.vm.job());
        Ok(Container {
            id: request.id,
            namespace: request.namespace,
            bundle: request.bundle,
            rootfs,
            mounts: request.rootfs,
            init: Process::new(init, request.stdio, logger),
            execs: Mutex::new(HashMap::new()),
            vm: sandbox.vm.clone(),
            pids_limit: limits.pids.unwrap_or(0),
            place: Place::InPod,
        })
    }

    /// Refuses a container of the pod whose memory limit is more than the
    /// pod's VM has: the VM's memory is fixed when it boots.
    fn fits_in_vm(&self, id: &str, max_bytes: u64) -> Result<(), Error> {
        let meminfo =
            self.vm.read_guest_file("/proc/meminfo").map_err(|e| Error::Precondition(e.to_string()))?;
        let total_kib = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
        match total_kib {
            Some(kib) if max_bytes > kib * 1024 => Err(Error::Invalid(format!(
                "container {id} asks for {} MiB of memory, more than its pod's VM has ({} MiB); \
                 give the pod's sandbox a larger memory limit, or the container a smaller one",
                max_bytes >> 20,
                kib >> 10
            ))),
            _ => Ok(()),
        }
    }

    /// Whether the VM is this container's own (not its pod's).
    pub fn owns_vm(&self) -> bool {
        matches!(self.place, Place::OwnVm { .. })
    }

    /// Whether this is a pod's sandbox, whose VM its later containers join.
    pub fn holds_a_pod(&self) -> bool {
        matches!(self.place, Place::OwnVm { pod: Some(_) })
    }

    /// The process `exec_id` names (empty: the init process).
    pub fn process(&self, exec_id: &str) -> Result<Arc<Process>, Error> {
        if exec_id.is_empty() {
            return Ok(self.init.clone());
        }
        self.lock_execs()
            .get(exec_id)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("no exec {exec_id} in container {}", self.id)))
    }

    fn lock_execs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Process>>> {
        self.execs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds an exec (not started yet).
    pub fn add_exec(&self, exec_id: &str, process_json: &[u8], stdio: Stdio) -> Result<(), Error> {
        stdio.check().map_err(|e| Error::Unsupported(e.to_string()))?;
        if self.init.snapshot().status != Status::Running {
            return Err(Error::Precondition(format!("container {} is not running", self.id)));
        }
        let seccomp = self.init.spec.confinement.as_ref().and_then(|c| c.seccomp.as_ref());
        let mut spec: ProcessSpec = spec::exec_process(process_json, seccomp)?;
        if let Place::InPod = self.place {
            // In the guest container its init started.
            spec.root = self.init.spec.root.clone();
            let init = self.init.spec.confinement.as_ref().and_then(|c| c.container.clone());
            let container = init.map(|c| GuestContainer { start: false, ..c });
            spec.confinement.get_or_insert_with(Default::default).container = container;
        }
        // Started before the lock (it may take seconds to get ready); a
        // duplicate's logger is finished when it is dropped. Its
        // CONTAINER_ID is the exec's id, as runc's shim gives it
        // (`process/exec.go`, `createIO(ctx, e.id, ...)`); runc starts it at
        // the exec's start, this shim at its create, so a broken logger
        // fails `ctr task exec` either way.
        let logger = stdio.logger(exec_id, &self.namespace).map_err(|e| Error::Invalid(e.to_string()))?;
        let mut execs = self.lock_execs();
        if execs.contains_key(exec_id) {
            return Err(Error::Precondition(format!("exec {exec_id} already exists")));
        }
        execs.insert(exec_id.to_owned(), Process::new(spec, stdio, logger));
        Ok(())
    }

    /// Starts a process; `on_exit` runs after it ended, `on_oom` (for the
    /// init process only: an OOM kill is the container's) at each OOM kill.
    pub fn start(
        &self,
        exec_id: &str,
        on_exit: impl FnOnce(u32, &Exit) + Send + 'static,
        on_oom: OnOom,
    ) -> Result<u32, Error> {
        let process = self.process(exec_id)?;
        if !exec_id.is_empty() && self.init.snapshot().status != Status::Running {
            return Err(Error::Precondition(format!("container {} is not running", self.id)));
        }
        let on_oom = exec_id.is_empty().then_some(on_oom);
        if process.snapshot().status != Status::Created {
            return Err(Error::Precondition(format!(
                "process {exec_id:?} of {} was already started",
                self.id
            )));
        }
        // The Job's Trace says what containerd ran: the start is recorded
        // before the process can end, its end before containerd (or a
        // `Wait`) hears of it, so before the init process's exit ends the VM.
        // So is the init's exit status, left for the Job's keeper: a Delete
        // that stops the VM as soon as its Wait returned finds it there, and
        // the Job's result carries the container's status.
        let ran = Ran::new(&self.id, exec_id, &process.spec);
        self.vm.note(ran.started());
        let (vm, noted, since) = (self.vm.clone(), ran.clone(), std::time::Instant::now());
        let init = exec_id.is_empty() && self.owns_vm();
        let before_exit = move |_pid: u32, exit: &Exit| {
            vm.note(noted.ended(exit.status, since.elapsed()));
            if init {
                vm.leave_exit_status(exit.status);
            }
        };
        process.start(&self.vm, before_exit, on_exit, on_oom).map_err(|e| {
            // The guest's words: untrusted text, on its way to terminals.
            let why = pvisor_core::text::escape(&e.to_string(), pvisor_core::text::Tabs::Escape).into_owned();
            self.vm.note(ran.failed(&why));
            Error::Internal(why)
        })
    }

    /// Every live process's guest pid (the init process first).
    pub fn pids(&self) -> Vec<u32> {
        let mut all = vec![self.init.snapshot()];
        all.extend(self.lock_execs().values().map(|p| p.snapshot()));
        all.into_iter().filter(|s| s.status == Status::Running).map(|s| s.pid).collect()
    }

    /// Removes an exec that has ended; returns how it ended.
    pub fn delete_exec(&self, exec_id: &str) -> Result<(Snapshot, Exit), Error> {
        let process = self.process(exec_id)?;
        let snapshot = process.snapshot();
        let exit = match (&snapshot.exit, snapshot.status) {
            (Some(exit), _) => exit.clone(),
            (None, Status::Created) => process.exit(0),
            (None, _) => return Err(Error::Precondition(format!("exec {exec_id} is still running"))),
        };
        self.lock_execs().remove(exec_id);
        process.release();
        Ok((snapshot, exit))
    }

    /// Ends the VM (if the init process's exit has not already) and
    /// unmounts the rootfs. The init process must have ended or never started.
    pub fn delete(&self) -> Result<(Snapshot, Exit), Error> {
        let snapshot = self.init.snapshot();
        let exit = match (&snapshot.exit, snapshot.status) {
            (Some(exit), _) => exit.clone(),
            (None, Status::Created) => self.init.exit(0),
            (None, _) => return Err(Error::Precondition(format!("container {} is still running", self.id))),
        };
        if let Place::OwnVm { pod: Some(pod) } = &self.place {
            // No container joins from here on.
            pod.close();
        }
        if self.owns_vm() {
            self.stop_vm();
        }
        // Released outside the lock: a logger may take seconds to exit.
        let execs: Vec<Arc<Process>> = self.lock_execs().values().cloned().collect();
        for process in execs {
            if !self.owns_vm() {
                // Its processes end with it; the pod's VM runs on.
                let _ = process.kill(9);
            }
            process.exit(crate::process::LOST);
            process.release();
        }
        self.init.release();
        match &self.place {
            Place::OwnVm { pod } => {
                self.vm.release();
                if !self.mounts.is_empty() {
                    rootfs::unmount_all(&self.rootfs, &self.mounts);
                }
                if pod.is_some() {
                    pod::remove(&self.namespace, &self.id);
                }
                let _ = std::fs::remove_file(self.bundle.join(JOB_FILE));
            }
            Place::InPod => {
                rootfs::unmount_all(&self.rootfs, &self.mounts);
                let _ = std::fs::remove_dir(&self.rootfs);
            }
        }
        Ok((snapshot, exit))
    }

    /// After a resume: every process's relay attaches to it in the new
    /// Attempt (see [`Process::resumed`]).
    pub fn resumed(&self) {
        let Some(guest) = self.vm.live_guest() else { return };
        self.init.resumed(&guest);
        for process in self.lock_execs().values() {
            process.resumed(&guest);
        }
    }

    /// SIGKILL to a paused container: its Job is closed, and every process
    /// ends as killed.
    pub fn kill_paused(&self) {
        // Recorded first: the processes' relays see the VM end next.
        self.init.exit(128 + 9);
        for process in self.lock_execs().values() {
            process.exit(128 + 9);
        }
        self.stop_vm();
    }

    /// Ends the Job; safe to call again once it has ended.
    pub fn stop_vm(&self) {
        match self.vm.stop() {
            Ok(summary) => log::info!("{}: Job {} {summary}", self.id, self.vm.job()),
            Err(e) => log::warn!("{}: {e}", self.id),
        }
    }
}

/// Ends the Job a crashed shim left behind (containerd's `delete` action
/// runs in the bundle directory) and unmounts the rootfs.
pub fn cleanup_bundle(runtime: &Runtime, bundle: &Path) {
    if let Ok(job) = std::fs::read_to_string(bundle.join(JOB_FILE)) {
        match job.trim().parse::<pvisor_core::ids::JobId>() {
            Ok(job) => {
                let grace = std::time::Duration::from_secs(2);
                if let Err(e) = runtime.execute(pvisor::actions::Kill { job: job.clone(), grace }) {
                    // Often only "already ended" (its supervisor died and
                    // recovery recorded it): its disks must go all the same.
                    log::warn!("cannot end the Job of {}: {e}", bundle.display());
                }
                // Refuses by itself while the Job is still live.
                crate::vm::release(runtime, &job);
            }
            Err(e) => log::warn!("{}: {e}", bundle.join(JOB_FILE).display()),
        }
        let _ = std::fs::remove_file(bundle.join(JOB_FILE));
    }
    // The mounts are not known here; a volatile overlay's marker is cleared
    // when its snapshot is mounted again.
    rootfs::unmount_all(&bundle.join("rootfs"), &[]);
}

/// A process containerd ran in the container, as the Job's Trace records
/// it (`frontend.command`): `container ID: ARGV` for the init process,
/// `exec in ID: ARGV` for an exec; the start has no exit code yet. The
/// exec's id is left out: the Trace counts repeats of one text rather than
/// writing each, and a probe the kubelet runs every few seconds comes with
/// a new id each time.
#[derive(Clone)]
struct Ran {
    command: String,
    uid: Option<u32>,
}

impl Ran {
    fn new(container: &str, exec_id: &str, spec: &ProcessSpec) -> Ran {
        let argv = spec.argv.join(" ");
        // An empty exec id is the init process's.
        let command = if exec_id.is_empty() {
            format!("container {container}: {argv}")
        } else {
            format!("exec in {container}: {argv}")
        };
        Ran { command, uid: spec.confinement.as_ref().map(|c| c.uid) }
    }

    fn note(&self) -> pvisor::FrontendNote {
        pvisor::FrontendNote {
            command: self.command.clone(),
            uid: self.uid,
            background: false,
            exit_code: None,
            error: None,
            duration_ms: 0,
        }
    }

    fn started(&self) -> pvisor::FrontendNote {
        pvisor::FrontendNote { background: true, ..self.note() }
    }

    /// Its end: the exit status containerd is given (128 + a signal's number).
    fn ended(&self, status: u32, ran: std::time::Duration) -> pvisor::FrontendNote {
        let duration_ms = u64::try_from(ran.as_millis()).unwrap_or(u64::MAX);
        pvisor::FrontendNote { exit_code: i32::try_from(status).ok(), duration_ms, ..self.note() }
    }

    fn failed(&self, why: &str) -> pvisor::FrontendNote {
        pvisor::FrontendNote { error: Some(why.to_owned()), ..self.note() }
    }
}
