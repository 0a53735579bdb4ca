//! containerd's side: the shim's lifecycle (`start`, `delete`, serve) and
//! the Task service, translating each ttrpc call into a [`Container`]
//! operation and each lifecycle step into the task event containerd
//! expects. What pvisor cannot do yet answers UNIMPLEMENTED with the reason.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use containerd_shim::protos::events::task::{
    TaskCheckpointed, TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskIO, TaskOOM,
    TaskPaused, TaskResumed, TaskStart,
};
use containerd_shim::protos::protobuf::{MessageDyn, MessageField};
use containerd_shim::protos::topics;
use containerd_shim::protos::ttrpc::{self, Code};
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::{api, Config, DeleteResponse, ExitSignal, Flags, StartOpts, TtrpcContext, TtrpcResult};
use pvisor::actions::guest::TerminalSize;
use pvisor::Runtime;
use pvisor_core::store::{Store, StoreError};

use crate::container::{self, Container, CreateRequest, Error};
use crate::process::{Exit, KillError, OnOom, Status, Stdio};
use crate::rootfs::Mount;

const SIGKILL: u32 = 9;
/// Where Jobs live when containerd's environment names no PVISOR_HOME.
const DEFAULT_HOME: &str = pvisor_core::store::SHIM_STATE_ROOT;

/// The runtime and the Tokio runtime its Sessions run on, made at the
/// first create (the serving shim; `start` and `delete` need neither).
struct Engine {
    runtime: Runtime,
    tokio: tokio::runtime::Handle,
}

struct Shared {
    namespace: String,
    /// The id containerd started this shim for (`-id`): a container's, or
    /// the pod sandbox's of a pod's shim.
    id: String,
    exit: ExitSignal,
    engine: OnceLock<Result<Engine, EngineError>>,
    containers: Mutex<HashMap<String, Arc<Container>>>,
    publisher: Mutex<Option<RemotePublisher>>,
}

/// The shim: one per container, or per CRI pod (containerd sends a pod's
/// containers to its sandbox's shim, [`crate::pod::grouping`]), so a pod's
/// containers find its VM here.
#[derive(Clone)]
pub struct Service {
    shared: Arc<Shared>,
}

/// The state directory: `PVISOR_HOME` from containerd's environment.
fn state_root() -> PathBuf {
    std::env::var_os("PVISOR_HOME")
        .filter(|v| !v.is_empty())
        .map_or_else(|| DEFAULT_HOME.into(), PathBuf::from)
}

/// Why the shim could not start serving containers.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EngineError {
    #[error("cannot use the state directory {}: {source}", root.display())]
    State {
        root: PathBuf,
        #[source]
        source: StoreError,
    },
    #[error("cannot start the async runtime: {0}")]
    Async(#[source] std::io::Error),
    /// The thread that runs the Sessions could not be started.
    #[error(transparent)]
    Thread(std::io::Error),
}

fn open_runtime() -> Result<Runtime, EngineError> {
    let root = state_root();
    let store = Store::open(&root).map_err(|source| EngineError::State { root, source })?;
    Ok(Runtime::on_host(store))
}

fn start_engine() -> Result<Engine, EngineError> {
    start_engine_with(open_runtime()?)
}

/// The engine over `runtime`, built once: its Sessions run on a Tokio
/// runtime of their own thread.
fn start_engine_with(runtime: Runtime) -> Result<Engine, EngineError> {
    let tokio =
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(EngineError::Async)?;
    let handle = tokio.handle().clone();
    std::thread::Builder::new()
        .name("pvisor-sessions".into())
        .spawn(move || tokio.block_on(std::future::pending::<()>()))
        .map_err(EngineError::Thread)?;
    Ok(Engine { runtime, tokio: handle })
}

impl Service {
    /// A Task service whose containers run on `runtime` (the serving shim
    /// builds its own at the first create; a test hands it fakes).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn with_runtime(namespace: &str, runtime: Runtime) -> Result<Self, EngineError> {
        let engine = OnceLock::new();
        let _ = engine.set(Ok(start_engine_with(runtime)?));
        let shared = Shared {
            namespace: namespace.to_owned(),
            id: String::new(),
            exit: ExitSignal::default(),
            engine,
            containers: Mutex::new(HashMap::new()),
            publisher: Mutex::new(None),
        };
        Ok(Service { shared: Arc::new(shared) })
    }

    fn engine(&self) -> Result<&Engine, Error> {
        self.shared.engine.get_or_init(start_engine).as_ref().map_err(|e| Error::Internal(e.to_string()))
    }

    fn container(&self, id: &str) -> Result<Arc<Container>, Error> {
        let containers = self.shared.containers.lock().unwrap_or_else(|p| p.into_inner());
        containers.get(id).cloned().ok_or_else(|| Error::NotFound(format!("container {id} not found")))
    }

    /// A container whose whole VM `what` acts on: not a pod's later
    /// container, whose VM is the pod's.
    fn with_own_vm(&self, id: &str, what: &str) -> Result<Arc<Container>, Error> {
        let container = self.container(id)?;
        if !container.owns_vm() {
            return Err(Error::Unsupported(format!(
                "unsupported by containerd-shim-pvisor-v1: {what} of container {id}: it runs in its pod's VM, \
                 which its pod's other containers share"
            )));
        }
        Ok(container)
    }

    /// Publishes a task event. containerd may have restarted since the
    /// last one (its socket is then new): the publisher reconnects once.
    fn publish(&self, topic: &str, event: Box<dyn MessageDyn>) {
        let mut publisher = self.shared.publisher.lock().unwrap_or_else(|p| p.into_inner());
        for retry in [false, true] {
            if retry || publisher.is_none() {
                match std::env::var("TTRPC_ADDRESS").map(RemotePublisher::new) {
                    Ok(Ok(fresh)) => *publisher = Some(fresh),
                    Ok(Err(e)) => log::warn!("cannot reconnect to containerd to publish {topic}: {e}"),
                    Err(_) => return,
                }
            }
            let Some(client) = publisher.as_ref() else { return };
            let ctx = ttrpc::context::with_timeout(5_000_000_000);
            match client.publish(ctx, topic, &self.shared.namespace, event.clone_box()) {
                Ok(()) => return,
                Err(e) if retry => log::warn!("cannot publish {topic}: {e}"),
                Err(_) => {}
            }
        }
    }

    /// What runs when a process has ended: TaskExit, and for the init
    /// process the end of the VM.
    fn on_exit(&self, container: &Arc<Container>, exec_id: &str) -> impl FnOnce(u32, &Exit) + Send + 'static {
        let (service, container, exec_id) = (self.clone(), Arc::downgrade(container), exec_id.to_owned());
        move |pid, exit| {
            let Some(container) = container.upgrade() else { return };
            let pid = reported_pid(&exec_id, pid);
            let id = if exec_id.is_empty() { container.id.clone() } else { exec_id.clone() };
            service.publish(
                topics::TASK_EXIT_EVENT_TOPIC,
                Box::new(TaskExit {
                    container_id: container.id.clone(),
                    id,
                    pid,
                    exit_status: exit.status,
                    exited_at: MessageField::some(exit.at.clone()),
                    ..Default::default()
                }),
            );
            if exec_id.is_empty() && container.owns_vm() {
                // Its exit status is already left for the Job's keeper.
                container.stop_vm();
            }
        }
    }

    /// What runs at each OOM kill in the container's guest: TaskOOM (the
    /// CRI plugin then reports the container `OOMKilled`).
    fn on_oom(&self, container: &Arc<Container>) -> OnOom {
        let (service, container) = (self.clone(), Arc::downgrade(container));
        Box::new(move |pid| {
            let Some(container) = container.upgrade() else { return };
            log::warn!(
                "{}: the guest's OOM killer killed process {pid} (Job {})",
                container.id,
                container.vm.job()
            );
            service.publish(
                topics::TASK_OOM_EVENT_TOPIC,
                Box::new(TaskOOM { container_id: container.id.clone(), ..Default::default() }),
            );
        })
    }
}

/// The pid containerd sees: the init process is the shim's own (the host
/// process that holds the container's VM, as Kata reports its hypervisor);
/// an exec's is its pid in the guest, where alone it exists.
fn reported_pid(exec_id: &str, guest_pid: u32) -> u32 {
    if exec_id.is_empty() {
        std::process::id()
    } else {
        guest_pid
    }
}

fn rpc(e: Error) -> ttrpc::Error {
    let (code, message) = match e {
        Error::NotFound(m) => (Code::NOT_FOUND, m),
        Error::Precondition(m) => (Code::FAILED_PRECONDITION, m),
        Error::Unsupported(m) => (Code::UNIMPLEMENTED, m),
        Error::Invalid(m) => (Code::INVALID_ARGUMENT, m),
        Error::Internal(m) => (Code::INTERNAL, m),
    };
    log::warn!("{message}");
    ttrpc::Error::RpcStatus(ttrpc::get_status(code, message))
}

fn unsupported<T>(what: &str, why: &str) -> TtrpcResult<T> {
    Err(rpc(Error::Unsupported(format!("unsupported by containerd-shim-pvisor-v1: {what}: {why}"))))
}

fn status(s: Status) -> api::Status {
    match s {
        Status::Created => api::Status::CREATED,
        Status::Running => api::Status::RUNNING,
        Status::Stopped => api::Status::STOPPED,
    }
}

impl containerd_shim::Shim for Service {
    type T = Service;

    fn new(_runtime_id: &str, args: &Flags, _config: &mut Config) -> Self {
        let shared = Shared {
            namespace: args.namespace.clone(),
            id: args.id.clone(),
            exit: ExitSignal::default(),
            engine: OnceLock::new(),
            containers: Mutex::new(HashMap::new()),
            publisher: Mutex::new(None),
        };
        Service { shared: Arc::new(shared) }
    }

    fn start_shim(&mut self, opts: StartOpts) -> Result<String, containerd_shim::Error> {
        let bundle = std::env::current_dir().map_err(|e| containerd_shim::Error::Other(e.to_string()))?;
        let grouping = crate::pod::grouping(&opts.id, &bundle);
        let (_, address) = containerd_shim::spawn(opts, &grouping, Vec::new())?;
        // containerd reconnects to a running shim through this file after
        // it restarts; without it the container would be cleaned up as dead.
        containerd_shim::synchronous::util::write_address(&address)?;
        Ok(address)
    }

    /// containerd's cleanup after a shim died: the Job it left is ended.
    fn delete_shim(&mut self) -> Result<DeleteResponse, containerd_shim::Error> {
        // A pod's directory first, whatever else fails: nothing of it may
        // stay mounted where it could be walked into.
        crate::pod::remove(&self.shared.namespace, &self.shared.id);
        let bundle = std::env::current_dir().map_err(|e| containerd_shim::Error::Other(e.to_string()))?;
        match open_runtime() {
            Ok(runtime) => container::cleanup_bundle(&runtime, &bundle),
            Err(e) => log::warn!("{e}"),
        }
        Ok(DeleteResponse {
            exit_status: 128 + 9,
            exited_at: MessageField::some(
                containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp::now(),
            ),
            ..Default::default()
        })
    }

    fn wait(&mut self) {
        self.shared.exit.wait();
    }

    fn create_task_service(&self, publisher: RemotePublisher) -> Self::T {
        // The serving shim and its Task service share one state, so
        // `wait` sees the exit `shutdown` signals.
        *self.shared.publisher.lock().unwrap_or_else(|p| p.into_inner()) = Some(publisher);
        self.clone()
    }
}

impl containerd_shim::Task for Service {
    fn create(
        &self,
        _ctx: &TtrpcContext,
        req: api::CreateTaskRequest,
    ) -> TtrpcResult<api::CreateTaskResponse> {
        if !req.checkpoint.is_empty() {
            return unsupported("create from a checkpoint", "restore with `pvisor fork --state execution`");
        }
        let engine = self.engine().map_err(rpc)?;
        let stdio = Stdio {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
        };
        let mounts = req
            .rootfs
            .iter()
            .map(|m| Mount { kind: m.type_.clone(), source: m.source.clone(), options: m.options.clone() })
            .collect();
        let request = CreateRequest {
            id: req.id.clone(),
            namespace: self.shared.namespace.clone(),
            bundle: req.bundle.clone().into(),
            rootfs: mounts,
            stdio,
        };
        // A pod's later container joins its sandbox's VM, if this shim runs it.
        let sandbox = crate::spec::load(&request.bundle)
            .ok()
            .and_then(|s| crate::spec::pod_member_of(&s))
            .and_then(|id| self.container(&id).ok())
            .filter(|c| c.holds_a_pod());
        let container = Container::create(request, &engine.runtime, &engine.tokio, sandbox.as_deref());
        let container = Arc::new(container.map_err(rpc)?);
        let pid = std::process::id();
        self.shared.containers.lock().unwrap_or_else(|p| p.into_inner()).insert(req.id.clone(), container);
        self.publish(
            topics::TASK_CREATE_EVENT_TOPIC,
            Box::new(TaskCreate {
                container_id: req.id.clone(),
                bundle: req.bundle.clone(),
                rootfs: req.rootfs.clone(),
                io: MessageField::some(TaskIO {
                    stdin: req.stdin.clone(),
                    stdout: req.stdout.clone(),
                    stderr: req.stderr.clone(),
                    terminal: req.terminal,
                    ..Default::default()
                }),
                pid,
                ..Default::default()
            }),
        );
        Ok(api::CreateTaskResponse { pid, ..Default::default() })
    }

    fn start(&self, _ctx: &TtrpcContext, req: api::StartRequest) -> TtrpcResult<api::StartResponse> {
        let container = self.container(&req.id).map_err(rpc)?;
        let guest_pid = container
            .start(&req.exec_id, self.on_exit(&container, &req.exec_id), self.on_oom(&container))
            .map_err(rpc)?;
        let pid = reported_pid(&req.exec_id, guest_pid);
        if req.exec_id.is_empty() {
            self.publish(
                topics::TASK_START_EVENT_TOPIC,
                Box::new(TaskStart { container_id: req.id.clone(), pid, ..Default::default() }),
            );
        } else {
            self.publish(
                topics::TASK_EXEC_STARTED_EVENT_TOPIC,
                Box::new(TaskExecStarted {
                    container_id: req.id.clone(),
                    exec_id: req.exec_id.clone(),
                    pid,
                    ..Default::default()
                }),
            );
        }
        Ok(api::StartResponse { pid, ..Default::default() })
    }

    fn state(&self, _ctx: &TtrpcContext, req: api::StateRequest) -> TtrpcResult<api::StateResponse> {
        let container = self.container(&req.id).map_err(rpc)?;
        let process = container.process(&req.exec_id).map_err(rpc)?;
        let snapshot = process.snapshot();
        let stdio = &process.stdio;
        Ok(api::StateResponse {
            id: req.id.clone(),
            exec_id: req.exec_id.clone(),
            bundle: container.bundle.display().to_string(),
            pid: reported_pid(&req.exec_id, snapshot.pid),
            status: match (snapshot.status, container.vm.is_paused()) {
                (Status::Running, true) => api::Status::PAUSED,
                (s, _) => status(s),
            }
            .into(),
            stdin: stdio.stdin.clone(),
            stdout: stdio.stdout.clone(),
            stderr: stdio.stderr.clone(),
            terminal: stdio.terminal,
            exit_status: snapshot.exit.as_ref().map_or(0, |e| e.status),
            exited_at: snapshot.exit.map(|e| e.at).into(),
            ..Default::default()
        })
    }

    fn pids(&self, _ctx: &TtrpcContext, req: api::PidsRequest) -> TtrpcResult<api::PidsResponse> {
        let container = self.container(&req.id).map_err(rpc)?;
        let processes = container
            .pids()
            .into_iter()
            .map(|pid| containerd_shim::protos::api::ProcessInfo { pid, ..Default::default() })
            .collect();
        Ok(api::PidsResponse { processes, ..Default::default() })
    }

    fn kill(&self, _ctx: &TtrpcContext, req: api::KillRequest) -> TtrpcResult<api::Empty> {
        let container = self.container(&req.id).map_err(rpc)?;
        let process = container.process(&req.exec_id).map_err(rpc)?;
        // Every signal goes to the process's group in the guest, so `all`
        // changes nothing: the init's group is the container.
        match process.kill(req.signal) {
            Ok(()) => {}
            // A paused container's VM is saved, not running: SIGKILL ends
            // its Job (every process exits 137); other signals wait.
            Err(KillError::Paused) if req.signal == SIGKILL => container.kill_paused(),
            Err(KillError::Paused) => {
                return Err(rpc(Error::Precondition(format!(
                    "container {} is paused; resume it to deliver signal {} (SIGKILL ends it)",
                    req.id, req.signal
                ))))
            }
            Err(KillError::Finished) => return Err(rpc(Error::NotFound("process already finished".into()))),
            Err(KillError::Unreachable(m)) => return Err(rpc(Error::Internal(m))),
        }
        Ok(api::Empty::default())
    }

    fn exec(&self, _ctx: &TtrpcContext, req: api::ExecProcessRequest) -> TtrpcResult<api::Empty> {
        let container = self.container(&req.id).map_err(rpc)?;
        let stdio = Stdio {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
        };
        let process_json = req.spec.as_ref().map(|any| any.value.clone()).unwrap_or_default();
        container.add_exec(&req.exec_id, &process_json, stdio).map_err(rpc)?;
        self.publish(
            topics::TASK_EXEC_ADDED_EVENT_TOPIC,
            Box::new(TaskExecAdded {
                container_id: req.id.clone(),
                exec_id: req.exec_id.clone(),
                ..Default::default()
            }),
        );
        Ok(api::Empty::default())
    }

    fn wait(&self, _ctx: &TtrpcContext, req: api::WaitRequest) -> TtrpcResult<api::WaitResponse> {
        let container = self.container(&req.id).map_err(rpc)?;
        let exit = container.process(&req.exec_id).map_err(rpc)?.wait();
        Ok(api::WaitResponse {
            exit_status: exit.status,
            exited_at: MessageField::some(exit.at),
            ..Default::default()
        })
    }

    fn delete(&self, _ctx: &TtrpcContext, req: api::DeleteRequest) -> TtrpcResult<api::DeleteResponse> {
        let container = self.container(&req.id).map_err(rpc)?;
        let (snapshot, exit) = if req.exec_id.is_empty() {
            let ended = container.delete().map_err(rpc)?;
            self.shared.containers.lock().unwrap_or_else(|p| p.into_inner()).remove(&req.id);
            self.publish(
                topics::TASK_DELETE_EVENT_TOPIC,
                Box::new(TaskDelete {
                    container_id: req.id.clone(),
                    id: req.id.clone(),
                    pid: std::process::id(),
                    exit_status: ended.1.status,
                    exited_at: MessageField::some(ended.1.at.clone()),
                    ..Default::default()
                }),
            );
            ended
        } else {
            container.delete_exec(&req.exec_id).map_err(rpc)?
        };
        Ok(api::DeleteResponse {
            pid: reported_pid(&req.exec_id, snapshot.pid),
            exit_status: exit.status,
            exited_at: MessageField::some(exit.at),
            ..Default::default()
        })
    }

    fn connect(&self, _ctx: &TtrpcContext, _req: api::ConnectRequest) -> TtrpcResult<api::ConnectResponse> {
        let task_pid = std::process::id();
        Ok(api::ConnectResponse {
            shim_pid: std::process::id(),
            task_pid,
            version: format!("containerd-shim-pvisor-v1 {}", env!("CARGO_PKG_VERSION")),
            ..Default::default()
        })
    }

    fn shutdown(&self, _ctx: &TtrpcContext, req: api::ShutdownRequest) -> TtrpcResult<api::Empty> {
        let empty = self.shared.containers.lock().unwrap_or_else(|p| p.into_inner()).is_empty();
        if empty || req.now {
            self.shared.exit.signal();
        }
        Ok(api::Empty::default())
    }

    /// An execution suspend of the container's Job: the VM is saved and
    /// stopped, the Job `suspended`.
    fn pause(&self, _ctx: &TtrpcContext, req: api::PauseRequest) -> TtrpcResult<api::Empty> {
        let container = self.with_own_vm(&req.id, "pause").map_err(rpc)?;
        if container.init.snapshot().status != Status::Running {
            return Err(rpc(Error::Precondition(format!("container {} is not running", req.id))));
        }
        let checkpoint = container.vm.pause().map_err(|e| rpc(Error::Internal(e.to_string())))?;
        log::info!("{}: paused: Job {} suspended to {checkpoint}", req.id, container.vm.job());
        self.publish(
            topics::TASK_PAUSED_EVENT_TOPIC,
            Box::new(TaskPaused { container_id: req.id.clone(), ..Default::default() }),
        );
        Ok(api::Empty::default())
    }

    /// Resumes the suspended Job in a new Attempt, from its checkpoint.
    fn resume(&self, _ctx: &TtrpcContext, req: api::ResumeRequest) -> TtrpcResult<api::Empty> {
        let container = self.with_own_vm(&req.id, "resume").map_err(rpc)?;
        container.vm.resume().map_err(|e| rpc(Error::Precondition(e.to_string())))?;
        container.resumed();
        log::info!("{}: resumed: Job {}", req.id, container.vm.job());
        self.publish(
            topics::TASK_RESUMED_EVENT_TOPIC,
            Box::new(TaskResumed { container_id: req.id.clone(), ..Default::default() }),
        );
        Ok(api::Empty::default())
    }

    /// An execution checkpoint of the container's Job (the VM keeps
    /// running). containerd's checkpoint directory gets a record naming it;
    /// the machine state stays in pvisor's store, where `pvisor fork
    /// --state execution` restores it.
    fn checkpoint(&self, _ctx: &TtrpcContext, req: api::CheckpointTaskRequest) -> TtrpcResult<api::Empty> {
        let container = self.with_own_vm(&req.id, "checkpoint").map_err(rpc)?;
        if container.init.snapshot().status != Status::Running {
            return Err(rpc(Error::Precondition(format!("container {} is not running", req.id))));
        }
        if req.options.is_some() {
            log::info!("{}: checkpoint options are ignored (pvisor saves the whole VM)", req.id);
        }
        let saved = container.vm.checkpoint().map_err(|e| rpc(Error::Internal(e.to_string())))?;
        if !req.path.is_empty() {
            let record = serde_json::json!({
                "runtime": "io.containerd.pvisor.v1",
                "job": container.vm.job().as_str(),
                "checkpoint": saved,
                "state_dir": state_root(),
            });
            let file = std::path::Path::new(&req.path).join("pvisor-checkpoint.json");
            // The checkpoint's description, in the directory ctr names: the
            // client's file, not a record of the store.
            #[allow(clippy::disallowed_methods)]
            let written =
                std::fs::create_dir_all(&req.path).and_then(|()| std::fs::write(&file, record.to_string()));
            written.map_err(|e| rpc(Error::Internal(format!("cannot write {}: {e}", file.display()))))?;
        }
        log::info!("{}: execution checkpoint {saved} of Job {}", req.id, container.vm.job());
        self.publish(
            topics::TASK_CHECKPOINTED_EVENT_TOPIC,
            Box::new(TaskCheckpointed {
                container_id: req.id.clone(),
                checkpoint: req.path.clone(),
                ..Default::default()
            }),
        );
        Ok(api::Empty::default())
    }

    fn update(&self, _ctx: &TtrpcContext, _req: api::UpdateTaskRequest) -> TtrpcResult<api::Empty> {
        unsupported("update", "a VM's memory and CPUs are fixed when it boots")
    }

    /// The new size of a process's terminal, set in the guest.
    fn resize_pty(&self, _ctx: &TtrpcContext, req: api::ResizePtyRequest) -> TtrpcResult<api::Empty> {
        let container = self.container(&req.id).map_err(rpc)?;
        let process = container.process(&req.exec_id).map_err(rpc)?;
        let clamp = |n: u32| n.min(u32::from(u16::MAX)) as u16;
        let size = TerminalSize { rows: clamp(req.height), cols: clamp(req.width) };
        process.resize(size).map_err(|e| rpc(Error::Precondition(format!("{}: {e}", req.id))))?;
        Ok(api::Empty::default())
    }

    /// Ends a process's stdin: the shim's own writer on the FIFO closes,
    /// and the process reads EOF once containerd's have (as runc's shim).
    fn close_io(&self, _ctx: &TtrpcContext, req: api::CloseIORequest) -> TtrpcResult<api::Empty> {
        let container = self.container(&req.id).map_err(rpc)?;
        let process = container.process(&req.exec_id).map_err(rpc)?;
        if req.stdin {
            process.close_stdin();
        }
        Ok(api::Empty::default())
    }

    /// The guest kernel's CPU and memory figures, as cgroup v1 metrics.
    fn stats(&self, _ctx: &TtrpcContext, req: api::StatsRequest) -> TtrpcResult<api::StatsResponse> {
        let container = self.container(&req.id).map_err(rpc)?;
        let read = |path: &str| {
            container.vm.read_guest_file(path).map_err(|e| rpc(Error::Precondition(e.to_string())))
        };
        let (stat, mem) = (read("/proc/stat")?, read("/proc/meminfo")?);
        let processes = container.pids().len() as u64;
        let metrics = crate::stats::metrics(&stat, &mem, processes, container.pids_limit);
        let any = containerd_shim::util::convert_to_any(Box::new(metrics))
            .map_err(|e| rpc(Error::Internal(e.to_string())))?;
        Ok(api::StatsResponse { stats: MessageField::some(any), ..Default::default() })
    }
}

#[cfg(test)]
mod tests;
