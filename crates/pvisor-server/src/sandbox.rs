//! The sandboxes a daemon manages: their private records, the OpenSandbox
//! state machine, and the operations behind the lifecycle API.
//!
//! A sandbox `sb-<ulid>` is one vm Job. Its supervisor is `pvisor
//! sandbox-supervisor`, a separate process in its own process group, so a
//! daemon restart leaves the VM running. The record binds each generation
//! (create, then one per resume) to the Job's Attempt; sandbox ids are never
//! Job ids, and the Job id never leaves this daemon.
//!
//! The Job's own command is an idle keeper in the guest's initramfs; the
//! image's entrypoint and every execd command run chrooted in the image
//! rootfs, which is the Job's workspace (the read-only lower layer; writes
//! land in the VM's upper disk). Pause is an execution suspend; resume is a
//! new Attempt restored from it; delete is `pvisor kill`.
//!
//! Records are `server/sandboxes/<id>.json`, written atomically; the state
//! there is what a restarted daemon starts from ([`Daemon::recover`]).

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use pvisor::runtime::job_service::views;
use pvisor_core::ids::{AttemptId, JobId};
use pvisor_core::state::JobState;
use pvisor_core::store::Store;
use pvisor_core::time::Timestamp;
use pvisor_sandbox::vm::{self, ControlRequest, ControlResponse};

use crate::images::ImageStore;

/// The port of the execd API inside an OpenSandbox sandbox.
pub const EXECD_PORT: u16 = 44772;
/// The egress sidecar port the SDK resolves at create.
pub const EGRESS_PORT: u16 = 18080;
/// Where background command logs live inside the guest (outside the rootfs).
pub const GUEST_LOG_DIR: &str = "/run/pvisor/cmd";
/// The Job's own command: idles in the guest's initramfs until killed.
pub const KEEPER: &str = "while :; do sleep 3600; done";
/// How long a VM may take to boot (TCG is slow) or restore.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SandboxState {
    Pending,
    Running,
    Pausing,
    Paused,
    Resuming,
    Stopping,
    Terminated,
    Failed,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Pausing => "Pausing",
            Self::Paused => "Paused",
            Self::Resuming => "Resuming",
            Self::Stopping => "Stopping",
            Self::Terminated => "Terminated",
            Self::Failed => "Failed",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Pending,
            Self::Running,
            Self::Pausing,
            Self::Paused,
            Self::Resuming,
            Self::Stopping,
            Self::Terminated,
            Self::Failed,
        ]
        .into_iter()
        .find(|st| st.as_str().eq_ignore_ascii_case(s))
    }
    pub fn is_final(self) -> bool {
        matches!(self, Self::Terminated | Self::Failed)
    }
}

/// One generation: the Attempt that ran the sandbox from a create or a resume.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Generation {
    pub attempt: u32,
    pub started_at: Timestamp,
    /// Milliseconds from the request to a ready agent.
    pub ready_ms: Option<u64>,
}

/// An execd command: its guest exec id and, for background ones, its log.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CommandRecord {
    pub exec_id: u32,
    pub command: String,
    pub background: bool,
    pub started_at: Timestamp,
    pub finished_at: Option<Timestamp>,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
}

/// The private record of a sandbox (`server/sandboxes/<id>.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub format: u32,
    pub id: String,
    pub image: String,
    pub entrypoint: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    pub resource_limits: BTreeMap<String, String>,
    pub platform: Option<serde_json::Value>,
    pub created_at: Timestamp,
    pub expires_at: Option<Timestamp>,
    pub state: SandboxState,
    pub reason: String,
    pub message: String,
    pub last_transition_at: Timestamp,
    /// The vm Job behind the sandbox, once its supervisor admitted it.
    pub job: Option<JobId>,
    pub generations: Vec<Generation>,
    /// The execd access token the endpoint hands out.
    pub token: String,
    /// Guest exec ids are unique for the guest's life (they survive resume).
    pub next_exec: u32,
    pub commands: BTreeMap<String, CommandRecord>,
    /// The rootfs path: the Job's workspace, and the root commands are confined to.
    pub rootfs: PathBuf,
    /// The pid of the current generation's supervisor (to find it after a daemon restart).
    #[serde(default)]
    pub supervisor: Option<u32>,
    pub memory_mib: u64,
    pub cpus: u32,
    /// A client deleted it (or its timeout did): the API answers 404 for it
    /// from then on, as the reference server does once a sandbox's container
    /// is removed, while the daemon still stops its Job and keeps the record.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    /// The create request's `networkPolicy`: the Job's proxy enforces it, and
    /// commands get the proxy variables. None: the VM reaches nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<pvisor_net::OrderedPolicy>,
}

/// Why an operation was refused.
#[derive(Debug)]
pub enum OpError {
    NotFound(String),
    Conflict(String),
    Invalid(String),
    Internal(String),
}

/// Signals one foreground command; shared by its stream and `DELETE /command`.
pub type SharedSignaller = Arc<Mutex<Option<vm::guest::ExecSignaller>>>;

/// How the daemon is set up.
#[derive(Clone, Debug)]
pub struct Config {
    pub state_root: PathBuf,
    /// The `pvisor` binary that supervises each sandbox.
    pub pvisor: PathBuf,
    /// Largest `timeout` a create may ask for.
    pub max_timeout: Duration,
}

/// The daemon's view of every sandbox; one per `pvisor serve`.
#[derive(Debug)]
pub struct Daemon {
    pub config: Config,
    pub store: Store,
    pub images: ImageStore,
    dir: PathBuf,
    records: Mutex<BTreeMap<String, SandboxRecord>>,
    /// Foreground commands in flight, for `DELETE /command`.
    pub running: Mutex<HashMap<(String, String), SharedSignaller>>,
    /// Execd bash sessions (in memory: they end with their relay).
    pub sessions: crate::repl::Sessions,
    /// Execd code contexts (in memory, like sessions).
    pub contexts: crate::code_contexts::Contexts,
    /// Open streams (foreground commands, downloads) per sandbox.
    streams: Mutex<HashMap<String, usize>>,
}

/// Streams one sandbox may hold open at once; each holds a worker thread.
pub const MAX_STREAMS: usize = 32;
/// Finished commands a record keeps (status and logs of older ones go).
const KEPT_COMMANDS: usize = 500;
/// How long a Terminated or Failed sandbox stays listed.
const KEEP_FINISHED: Duration = Duration::from_secs(3600);

/// A held stream slot of one sandbox; released on drop.
#[derive(Debug)]
pub struct StreamSlot {
    daemon: Arc<Daemon>,
    id: String,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut streams = self.daemon.streams.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = streams.get_mut(&self.id) {
            *n = n.saturating_sub(1);
        }
    }
}

/// Drops the oldest finished commands beyond [`KEPT_COMMANDS`].
pub fn trim_commands(commands: &mut BTreeMap<String, CommandRecord>) {
    let mut finished: Vec<(Timestamp, String)> = commands
        .iter()
        .filter(|(_, c)| c.finished_at.is_some())
        .map(|(k, c)| (c.started_at, k.clone()))
        .collect();
    if finished.len() <= KEPT_COMMANDS {
        return;
    }
    finished.sort();
    for (_, key) in finished.iter().take(finished.len() - KEPT_COMMANDS) {
        commands.remove(key);
    }
}

impl Daemon {
    pub fn open(config: Config, built_in_images: Vec<(String, PathBuf)>) -> anyhow::Result<Arc<Self>> {
        let store = Store::open(&config.state_root)?;
        let dir = config.state_root.join("server").join("sandboxes");
        pvisor_core::store::create_dir_all_private(&dir)?;
        let mut records = BTreeMap::new();
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let bytes = fs::read(&path)?;
            match serde_json::from_slice::<SandboxRecord>(&bytes) {
                Ok(r) => {
                    records.insert(r.id.clone(), r);
                }
                Err(e) => eprintln!(
                    "pvisor serve: warning: skipping the corrupt sandbox record {} ({e}); move it away to silence this",
                    path.display()
                ),
            }
        }
        let images = ImageStore::new(&store).with_built_in(built_in_images);
        Ok(Arc::new(Self {
            config,
            store,
            images,
            dir,
            records: Mutex::new(records),
            running: Mutex::default(),
            sessions: Mutex::default(),
            contexts: Mutex::default(),
            streams: Mutex::default(),
        }))
    }

    fn records(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, SandboxRecord>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn persist(&self, record: &SandboxRecord) -> Result<(), OpError> {
        let path = self.dir.join(format!("{}.json", record.id));
        pvisor_core::store::write_atomic(&path, &pvisor_core::store::to_json_bytes(record))
            .map_err(|e| OpError::Internal(format!("cannot write {}: {e}", path.display())))
    }

    pub fn get(&self, id: &str) -> Result<SandboxRecord, OpError> {
        self.records().get(id).cloned().ok_or_else(|| OpError::NotFound(format!("no sandbox {id}")))
    }

    /// [`Self::get`] for a client: a deleted sandbox is not found (the
    /// reference's wording: "Sandbox {id} not found.").
    pub fn visible(&self, id: &str) -> Result<SandboxRecord, OpError> {
        self.get(id)
            .ok()
            .filter(|r| !r.deleted)
            .ok_or_else(|| OpError::NotFound(format!("Sandbox {id} not found.")))
    }

    pub fn list(&self) -> Vec<SandboxRecord> {
        self.records().values().cloned().collect()
    }

    /// Applies `change` to the record under the lock and persists it.
    pub fn update<T>(
        &self,
        id: &str,
        change: impl FnOnce(&mut SandboxRecord) -> Result<T, OpError>,
    ) -> Result<T, OpError> {
        let mut records = self.records();
        let record = records.get_mut(id).ok_or_else(|| OpError::NotFound(format!("no sandbox {id}")))?;
        let mut next = record.clone();
        let out = change(&mut next)?;
        self.persist(&next)?;
        *record = next;
        Ok(out)
    }

    /// Moves `id` from one of `from` to `to`, or refuses with 409.
    fn transition(
        &self,
        id: &str,
        from: &[SandboxState],
        to: SandboxState,
        reason: &str,
    ) -> Result<SandboxRecord, OpError> {
        self.update(id, |r| {
            if !from.contains(&r.state) {
                return Err(OpError::Conflict(format!(
                    "sandbox {id} is {}; this needs it {}",
                    r.state.as_str(),
                    from.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" or ")
                )));
            }
            set_state(r, to, reason, "");
            Ok(r.clone())
        })
    }

    /// Records the end of an operation. Terminated and Failed are final,
    /// and a Stopping sandbox only ends: a pause or resume finishing late
    /// (or a recovery acting on what it saw earlier) never undoes them.
    fn finish(&self, id: &str, to: SandboxState, reason: &str, message: &str) {
        let _ = self.update(id, |r| {
            let allowed = match r.state {
                SandboxState::Terminated | SandboxState::Failed => false,
                SandboxState::Stopping => to.is_final(),
                _ => true,
            };
            if allowed {
                set_state(r, to, reason, message);
            }
            Ok(())
        });
    }

    /// Creates a sandbox record in `Pending` and starts its VM in the background.
    pub fn create(self: &Arc<Self>, request: CreateRequest) -> Result<SandboxRecord, OpError> {
        crate::images::validate_name(&request.image).map_err(|e| OpError::Invalid(e.0))?;
        let rootfs = self.images.rootfs_importing(&request.image).map_err(|e| OpError::Invalid(e.0))?;
        let rootfs = rootfs.ok_or_else(|| {
            let known = self.images.list().map(|l| l.into_iter().map(|r| r.name).collect::<Vec<_>>().join(", "));
            OpError::Invalid(format!(
                "image {:?} is not imported on this host (known: {}); import it with `pvisor image import {} DIR|TAR|OCI-LAYOUT` (no registry is contacted)",
                request.image,
                known.unwrap_or_default(),
                request.image
            ))
        })?;
        let now = Timestamp::now();
        let expires_at = match request.timeout {
            None => None,
            Some(t) if t < 60 => {
                return Err(OpError::Invalid(format!("timeout {t} s is below the minimum of 60 s")))
            }
            Some(t) if Duration::from_secs(t) > self.config.max_timeout => {
                return Err(OpError::Invalid(format!(
                    "timeout {t} s exceeds this server's maximum of {} s",
                    self.config.max_timeout.as_secs()
                )))
            }
            Some(t) => Some(Timestamp::from(now.system_time() + Duration::from_secs(t))),
        };
        let record = SandboxRecord {
            format: 1,
            id: format!("sb-{}", pvisor_core::ids::new_ulid().to_ascii_lowercase()),
            image: request.image,
            entrypoint: request.entrypoint,
            env: request.env,
            metadata: request.metadata,
            resource_limits: request.resource_limits,
            platform: request.platform,
            created_at: now,
            expires_at,
            state: SandboxState::Pending,
            reason: "provisioning".into(),
            message: "starting the microVM".into(),
            last_transition_at: now,
            job: None,
            generations: Vec::new(),
            token: crate::http::uuid4(),
            next_exec: 2,
            commands: BTreeMap::new(),
            rootfs,
            supervisor: None,
            memory_mib: request.memory_mib,
            cpus: request.cpus,
            deleted: false,
            network_policy: request.network_policy,
        };
        self.persist(&record)?;
        self.records().insert(record.id.clone(), record.clone());
        let (daemon, id) = (self.clone(), record.id.clone());
        std::thread::Builder::new()
            .name("pvisor-sb-create".into())
            .spawn(move || daemon.provision(&id, None))
            .map_err(|e| OpError::Internal(e.to_string()))?;
        Ok(record)
    }

    /// Starts (or, with `resume`, restores) the sandbox's VM and waits until
    /// its agent answers; then `Running`, or `Failed`/`Paused` saying why.
    fn provision(self: &Arc<Self>, id: &str, resume: Option<JobId>) {
        let started = Instant::now();
        let outcome = self.start_generation(id, resume.as_ref());
        self.provisioned(id, resume, outcome, started);
    }

    /// Records the outcome of a generation's start (see [`Self::provision`]).
    fn provisioned(
        self: &Arc<Self>,
        id: &str,
        resume: Option<JobId>,
        outcome: Result<u32, String>,
        started: Instant,
    ) {
        let ready_ms = started.elapsed().as_millis() as u64;
        let Ok(record) = self.get(id) else { return };
        match outcome {
            Ok(attempt) => {
                let first = resume.is_none();
                let _ = self.update(id, |r| {
                    r.generations.push(Generation {
                        attempt,
                        started_at: Timestamp::now(),
                        ready_ms: Some(ready_ms),
                    });
                    if r.state != SandboxState::Stopping {
                        set_state(r, SandboxState::Running, if first { "ready" } else { "resumed" }, "");
                    }
                    Ok(())
                });
                if first {
                    if let Err(e) = self.start_entrypoint(id) {
                        eprintln!("pvisor serve: {id}: the entrypoint did not start: {e}");
                    }
                }
                // A delete that arrived while it was starting.
                if self.get(id).is_ok_and(|r| r.state == SandboxState::Stopping) {
                    self.stop(id, "user_delete");
                }
            }
            Err(message) => {
                eprintln!("pvisor serve: {id}: {message}");
                // A supervisor that is still starting the VM must not finish
                // the job for a sandbox recorded as failed.
                let bind = self.bind_file(id);
                if let Some(pid) = record.supervisor.filter(|pid| supervisor_alive(*pid, &bind)) {
                    stop_supervisor(pid, &bind);
                }
                let record = self.get(id).unwrap_or(record);
                let job_state =
                    record.job.as_ref().and_then(|j| views::status(&self.store, j).ok()).map(|s| s.state);
                if resume.is_some() && job_state == Some(JobState::Suspended) {
                    self.finish(id, SandboxState::Paused, "resume_failed", &message);
                } else {
                    if let Some(job) = &record.job {
                        let _ = pvisor::runtime::kill::kill(&self.store, job, Duration::from_secs(10));
                    }
                    self.finish(id, SandboxState::Failed, "runtime_error", &message);
                }
            }
        }
    }

    fn start_generation(self: &Arc<Self>, id: &str, resume: Option<&JobId>) -> Result<u32, String> {
        let record = self.get(id).map_err(|_| "the record vanished".to_string())?;
        let bind = self.bind_file(id);
        let _ = fs::remove_file(&bind);
        let log_path = self.log_file(id);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
        let mut command = Command::new(&self.config.pvisor);
        command.arg("sandbox-supervisor").arg("--bind").arg(&bind);
        match resume {
            Some(job) => {
                command.arg("--resume").arg(job.as_str());
            }
            None => {
                command
                    .arg("--workspace")
                    .arg(&record.rootfs)
                    .arg("--memory-mib")
                    .arg(record.memory_mib.to_string())
                    .arg("--cpus")
                    .arg(record.cpus.to_string());
                if let Some(policy) = &record.network_policy {
                    command
                        .arg("--network-policy")
                        .arg(serde_json::to_string(policy).map_err(|e| e.to_string())?);
                }
            }
        }
        command
            .env("PVISOR_HOME", &self.config.state_root)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        // Its own process group: a Ctrl-C or SIGTERM aimed at the daemon
        // must not reach the VMs (the daemon's shutdown policy decides).
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child =
            command.spawn().map_err(|e| format!("cannot start {}: {e}", self.config.pvisor.display()))?;
        let pid = child.id();
        // Recorded first, so a daemon that dies now can find this supervisor again.
        let _ = self.update(id, |r| {
            r.supervisor = Some(pid);
            Ok(())
        });
        std::thread::spawn(move || {
            let _ = child.wait();
        });
        self.watch(id, pid);
        self.await_generation(id, pid)
    }

    /// Notices when a generation's supervisor exits on its own: a Running
    /// sandbox whose VM ended (a crash, or `kill -9 -1` inside it taking
    /// the Job's keeper) must not stay Running.
    fn watch(self: &Arc<Self>, id: &str, pid: u32) {
        let (daemon, id, bind) = (self.clone(), id.to_owned(), self.bind_file(id));
        std::thread::spawn(move || {
            while supervisor_alive(pid, &bind) {
                std::thread::sleep(Duration::from_millis(250));
            }
            let Ok(record) = daemon.get(&id) else { return };
            // A pause, a delete or a later generation accounts for this exit.
            if record.supervisor != Some(pid) || record.state != SandboxState::Running {
                return;
            }
            let state =
                record.job.as_ref().and_then(|j| views::status(&daemon.store, j).ok()).map(|s| s.state);
            match state {
                Some(JobState::Suspended) => {
                    daemon.finish(&id, SandboxState::Paused, "paused", "suspended outside the API")
                }
                other => {
                    let what = other.map_or("unknown".to_owned(), |s| s.to_string());
                    let failed = daemon.update(&id, |r| {
                        let ours = r.state == SandboxState::Running && r.supervisor == Some(pid);
                        if ours {
                            set_state(r, SandboxState::Failed, "runtime_exited", &format!("the VM ended on its own (Job {what}); was its keeper killed from inside?"));
                        }
                        Ok(ours)
                    });
                    // Nobody will continue it: close the Job and free its disks now.
                    if let (Ok(true), Some(job)) = (failed, &record.job) {
                        daemon.close_and_release(job);
                    }
                }
            }
        });
    }

    /// Waits for the supervisor `pid` of `id` to admit its Job (the bind
    /// file) and for the guest agent to answer; returns the Attempt number.
    fn await_generation(&self, id: &str, pid: u32) -> Result<u32, String> {
        let record = self.get(id).map_err(|_| "the record vanished".to_string())?;
        let (bind, log_path) = (self.bind_file(id), self.log_file(id));
        let read_bind = || fs::read(&bind).ok().and_then(|b| serde_json::from_slice::<Binding>(&b).ok());
        let deadline = Instant::now() + READY_TIMEOUT;
        let binding = loop {
            if let Some(b) = read_bind() {
                break b;
            }
            if Instant::now() > deadline || !supervisor_alive(pid, &bind) {
                // The bind file may have landed just before the exit.
                if let Some(b) = read_bind() {
                    break b;
                }
                return Err(format!(
                    "the sandbox supervisor exited before admitting the VM; see {}: {}",
                    log_path.display(),
                    tail(&log_path)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let _ = self.update(id, |r| {
            r.job = Some(binding.job.clone());
            Ok(())
        });
        let vm_dir = self.vm_dir_of(&binding.job, binding.attempt);
        loop {
            match vm::guest::call(&vm_dir, &probe(&record), &[], Duration::from_secs(10)) {
                Ok(_) => return Ok(binding.attempt),
                Err(e) => {
                    if Instant::now() > deadline || !supervisor_alive(pid, &bind) {
                        return Err(format!(
                            "the VM did not become ready: {e}; see {}: {}",
                            log_path.display(),
                            tail(&log_path)
                        ));
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn bind_file(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.bind"))
    }

    fn log_file(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.log"))
    }

    fn vm_dir_of(&self, job: &JobId, attempt: u32) -> PathBuf {
        let run =
            self.store.read::<pvisor_core::records::JobRecord>(&self.store.job_file(job)).map(|j| j.run);
        match run {
            Ok(run) => self.store.attempt_dir(&AttemptId::new(run, attempt)).join("vm"),
            Err(_) => PathBuf::from("/nonexistent"),
        }
    }

    /// The VM directory of a Running sandbox's current generation.
    pub fn live_vm_dir(&self, id: &str) -> Result<(SandboxRecord, PathBuf), OpError> {
        let record = self.get(id)?;
        if record.state != SandboxState::Running {
            return Err(OpError::Conflict(format!(
                "sandbox {id} is {}; the execd API needs it Running",
                record.state.as_str()
            )));
        }
        let (Some(job), Some(generation)) = (&record.job, record.generations.last()) else {
            return Err(OpError::Conflict(format!("sandbox {id} has no running VM")));
        };
        let dir = self.vm_dir_of(job, generation.attempt);
        Ok((record, dir))
    }

    /// Takes one of the sandbox's [`MAX_STREAMS`] stream slots, or 429.
    pub fn stream_slot(self: &Arc<Self>, id: &str) -> Result<StreamSlot, crate::http::ApiError> {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        let n = streams.entry(id.to_owned()).or_default();
        if *n >= MAX_STREAMS {
            return Err(crate::http::ApiError::new(
                hyper::StatusCode::TOO_MANY_REQUESTS,
                "TOO_MANY_STREAMS",
                format!("sandbox {id} already has {MAX_STREAMS} streamed commands or downloads open; wait for one to end"),
            ));
        }
        *n += 1;
        Ok(StreamSlot { daemon: self.clone(), id: id.to_owned() })
    }

    /// Allocates a guest exec id (persisted: ids are unique for the guest's life).
    pub fn next_exec_id(&self, id: &str) -> Result<u32, OpError> {
        self.update(id, |r| {
            let n = r.next_exec;
            r.next_exec += 1;
            Ok(n)
        })
    }

    fn start_entrypoint(&self, id: &str) -> Result<(), String> {
        let (record, vm_dir) = self.live_vm_dir(id).map_err(|e| format!("{e:?}"))?;
        if record.entrypoint.is_empty() {
            return Ok(());
        }
        let exec_id = self.next_exec_id(id).map_err(|e| format!("{e:?}"))?;
        let spec = vm::guest::ExecSpec {
            id: exec_id,
            argv: record.entrypoint.clone(),
            env: command_env(&record, &BTreeMap::new()),
            cwd: "/".into(),
            root: Some(record.rootfs.clone()),
            output: Some(PathBuf::from(format!("{GUEST_LOG_DIR}/{exec_id}.log"))),
        };
        let mut channel = vm::guest::exec(&vm_dir, spec)?;
        let started = match channel.next_reply() {
            Ok(Some((pvisor_agent_proto::Reply::Started { .. }, _))) => Ok(()),
            Ok(Some((pvisor_agent_proto::Reply::ExecFailed { message, .. }, _))) => Err(message),
            other => Err(format!("unexpected answer {other:?}")),
        };
        let _ = self.update(id, |r| {
            r.commands.insert(
                "entrypoint".into(),
                CommandRecord {
                    exec_id,
                    command: r.entrypoint.join(" "),
                    background: true,
                    started_at: Timestamp::now(),
                    finished_at: None,
                    exit_code: None,
                    error: started.as_ref().err().cloned(),
                },
            );
            Ok(())
        });
        started
    }

    /// `POST /pause`: Running → Pausing, then Paused once the VM's state is saved.
    pub fn pause(self: &Arc<Self>, id: &str) -> Result<(), OpError> {
        let record =
            self.transition(id, &[SandboxState::Running], SandboxState::Pausing, "pause_requested")?;
        let (daemon, id) = (self.clone(), id.to_owned());
        std::thread::spawn(move || {
            let outcome = daemon.suspend_vm(&record);
            match outcome {
                Ok(()) => daemon.finish(&id, SandboxState::Paused, "paused", ""),
                Err(message) => {
                    eprintln!("pvisor serve: {id}: pause failed: {message}");
                    let alive = record.job.as_ref().and_then(|j| views::status(&daemon.store, j).ok());
                    match alive.map(|s| s.state) {
                        Some(JobState::Running) => {
                            daemon.finish(&id, SandboxState::Running, "pause_failed", &message)
                        }
                        Some(JobState::Suspended) => daemon.finish(&id, SandboxState::Paused, "paused", ""),
                        _ => daemon.finish(&id, SandboxState::Failed, "pause_failed", &message),
                    }
                }
            }
        });
        Ok(())
    }

    fn suspend_vm(&self, record: &SandboxRecord) -> Result<(), String> {
        let (Some(job), Some(generation)) = (&record.job, record.generations.last()) else {
            return Err("no VM to suspend".into());
        };
        let vm_dir = self.vm_dir_of(job, generation.attempt);
        match vm::control(&vm_dir, &ControlRequest::Suspend, Duration::from_secs(600))? {
            ControlResponse::Checkpointed { .. } => {}
            ControlResponse::Error { message } => return Err(message),
            ControlResponse::Forwarded => {
                return Err("the supervisor answered a suspend with `forwarded`".into())
            }
        }
        // Paused only once the termination receipt makes the Job suspended.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            match views::status(&self.store, job).map(|s| s.state) {
                Ok(JobState::Suspended) => return Ok(()),
                Ok(JobState::Running | JobState::Pending) if Instant::now() < deadline => {}
                Ok(other) => return Err(format!("the Job ended {other} instead of suspended")),
                Err(e) => return Err(e.to_string()),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `POST /resume`: Paused → Resuming, then Running in a new generation.
    pub fn resume(self: &Arc<Self>, id: &str) -> Result<(), OpError> {
        let record =
            self.transition(id, &[SandboxState::Paused], SandboxState::Resuming, "resume_requested")?;
        let job =
            record.job.clone().ok_or_else(|| OpError::Internal("a paused sandbox without a Job".into()))?;
        let (daemon, id) = (self.clone(), id.to_owned());
        std::thread::spawn(move || daemon.provision(&id, Some(job)));
        Ok(())
    }

    /// `DELETE`: → Stopping, then Terminated once the Job has ended.
    pub fn delete(self: &Arc<Self>, id: &str, reason: &str) -> Result<(), OpError> {
        // Decided under the records lock: a provisioner that sets Running
        // concurrently either sees Stopping (and stops it) or is seen here.
        let was = self.update(id, |r| {
            if r.deleted {
                return Err(OpError::NotFound(format!("Sandbox {id} not found.")));
            }
            match r.state {
                SandboxState::Pending | SandboxState::Running | SandboxState::Paused => {}
                // The reference server removes an ended sandbox's container
                // too: DELETE frees what is left, answers 204, and the
                // sandbox is gone from the API.
                SandboxState::Failed | SandboxState::Terminated => {
                    r.deleted = true;
                    return Ok(r.state);
                }
                SandboxState::Pausing | SandboxState::Resuming | SandboxState::Stopping => {
                    return Err(OpError::Conflict(format!(
                        "sandbox {id} is {}; delete it once that finishes",
                        r.state.as_str()
                    )))
                }
            }
            let was = r.state;
            r.deleted = true;
            set_state(r, SandboxState::Stopping, reason, "");
            Ok(was)
        })?;
        if was == SandboxState::Terminated {
            return Ok(());
        }
        if was == SandboxState::Failed {
            if let Some(job) = self.get(id).ok().and_then(|r| r.job) {
                let daemon = self.clone();
                std::thread::spawn(move || daemon.close_and_release(&job));
            }
            return Ok(());
        }
        if was != SandboxState::Pending {
            // A Pending sandbox is stopped by its provisioner once it is up.
            let (daemon, id, reason) = (self.clone(), id.to_owned(), reason.to_owned());
            std::thread::spawn(move || daemon.stop(&id, &reason));
        }
        Ok(())
    }

    /// Closes the Job of a sandbox that can never run again (its supervisor
    /// died) and frees its storage. Idempotent.
    fn close_and_release(&self, job: &JobId) {
        if let Err(e) = pvisor::runtime::kill::kill(&self.store, job, Duration::from_secs(5)) {
            eprintln!("pvisor serve: warning: cannot close {job}: {e}");
        }
        self.release_storage(job);
    }

    fn stop(&self, id: &str, reason: &str) {
        let Ok(record) = self.get(id) else { return };
        let result = match &record.job {
            Some(job) => pvisor::runtime::kill::kill(&self.store, job, Duration::from_secs(15))
                .map(|_| ())
                .map_err(|e| e.to_string()),
            None => Ok(()),
        };
        match result {
            Ok(()) => {
                if let Some(job) = &record.job {
                    self.release_storage(job);
                }
                self.finish(id, SandboxState::Terminated, reason, "")
            }
            Err(e) => self.finish(id, SandboxState::Failed, "stop_failed", &e),
        }
    }

    /// A terminated sandbox's disk: its staged writes are dropped (there is
    /// no apply over this API; `pvisor gc` then frees them) and its execution
    /// checkpoints are deleted (the killed Job can never continue from them).
    /// The records and receipts stay.
    fn release_storage(&self, job: &JobId) {
        // Only a confirmed result has a stage to drop (a suspended Job that
        // was killed ends `lost`, its writes only in the checkpoint below).
        let confirmed = views::status(&self.store, job)
            .is_ok_and(|s| matches!(s.state, JobState::Completed | JobState::Failed | JobState::Cancelled));
        if confirmed {
            if let Err(e) = pvisor::effects::drop_changes(&self.store, job, &[]) {
                eprintln!("pvisor serve: warning: cannot drop the stage of {job}: {e}");
            }
        }
        if let Ok(record) = self.store.read::<pvisor_core::records::JobRecord>(&self.store.job_file(job)) {
            let live = views::status(&self.store, job).map_or(true, |s| s.live);
            for (what, path) in pvisor::runtime::gc::leftover_vm_disks(&self.store, &record) {
                if live {
                    break;
                }
                if let Err(e) = fs::remove_file(&path) {
                    eprintln!("pvisor serve: warning: cannot remove {what} ({}): {e}", path.display());
                }
            }
            let dir = self.store.exec_checkpoints_dir(&record.run);
            // A Job still live (its kill did not finish) may yet need them.
            if live {
                return;
            }
            if let Err(e) = fs::remove_dir_all(&dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    eprintln!("pvisor serve: warning: cannot remove {}: {e}", dir.display());
                }
            }
        }
    }

    /// Kills sandboxes whose `expiresAt` passed (Running, Paused, or Pending).
    pub fn expire(self: &Arc<Self>) {
        let now = SystemTime::now();
        let due: Vec<String> = self
            .records()
            .values()
            .filter(|r| {
                matches!(r.state, SandboxState::Running | SandboxState::Paused | SandboxState::Pending)
            })
            .filter(|r| r.expires_at.is_some_and(|t| t.system_time() <= now))
            .map(|r| r.id.clone())
            .collect();
        for id in due {
            eprintln!("pvisor serve: {id}: its timeout expired; stopping it");
            let _ = self.delete(&id, "ttl_expiry");
        }
        // Finished sandboxes stay listed for a while, then their records go
        // (the Job's own records stay with pvisor's).
        let old: Vec<String> = self
            .records()
            .values()
            .filter(|r| r.state.is_final() && r.last_transition_at.system_time() + KEEP_FINISHED <= now)
            // Never forget a sandbox whose VM still runs (a failed stop).
            .filter(
                |r| !matches!(r.job.as_ref().map(|j| views::status(&self.store, j)), Some(Ok(s)) if s.live),
            )
            .map(|r| r.id.clone())
            .collect();
        for id in old {
            self.records().remove(&id);
            for file in [format!("{id}.json"), format!("{id}.bind"), format!("{id}.log")] {
                let _ = fs::remove_file(self.dir.join(file));
            }
            self.sessions.lock().unwrap_or_else(|p| p.into_inner()).retain(|(sb, _), _| sb != &id);
            self.contexts.lock().unwrap_or_else(|p| p.into_inner()).retain(|(sb, _), _| sb != &id);
        }
    }

    /// Reconciles every unfinished record with what is on disk after a
    /// (re)start: a state is only kept when the Job confirms it. Work a dead
    /// daemon left in flight (a create, pause or resume its supervisor is
    /// still doing) is awaited in the background.
    pub fn recover(self: &Arc<Self>) {
        for record in self.list() {
            if record.state.is_final() {
                continue;
            }
            let id = record.id.clone();
            let bind = self.bind_file(&id);
            // The pid is recorded just after the spawn; a daemon killed in
            // between is covered by looking for the bind file in /proc.
            let supervisor = record
                .supervisor
                .filter(|pid| supervisor_alive(*pid, &bind))
                .or_else(|| find_supervisor(&bind));
            let binding = fs::read(&bind).ok().and_then(|b| serde_json::from_slice::<Binding>(&b).ok());
            // A create or resume whose supervisor is still starting the VM.
            if matches!(record.state, SandboxState::Pending | SandboxState::Resuming) {
                if let Some(pid) = supervisor {
                    let daemon = self.clone();
                    let resume =
                        (record.state == SandboxState::Resuming).then(|| record.job.clone()).flatten();
                    std::thread::spawn(move || {
                        let outcome = daemon.await_generation(&id, pid);
                        daemon.provisioned(&id, resume, outcome, Instant::now());
                    });
                    continue;
                }
            }
            let Some(job) = binding.map(|b| b.job).or(record.job.clone()) else {
                self.finish(&id, SandboxState::Failed, "daemon_restart", "the daemon stopped before this sandbox's VM was admitted, and its supervisor is gone; nothing is running");
                continue;
            };
            let status = match views::status(&self.store, &job) {
                Ok(s) => s,
                Err(e) => {
                    self.finish(
                        &id,
                        SandboxState::Failed,
                        "record_unreadable",
                        &format!("its Job {job} cannot be read: {e}"),
                    );
                    continue;
                }
            };
            let attempt = status.attempt.number();
            let _ = self.update(&id, |r| {
                r.job = Some(job.clone());
                if r.generations.last().map(|g| g.attempt) != Some(attempt)
                    && status.state == JobState::Running
                {
                    r.generations.push(Generation { attempt, started_at: Timestamp::now(), ready_ms: None });
                }
                Ok(())
            });
            match (record.state, status.state) {
                (SandboxState::Stopping, _) => {
                    let daemon = self.clone();
                    std::thread::spawn(move || daemon.stop(&id, "user_delete"));
                }
                (_, JobState::Suspended) => {
                    self.finish(
                        &id,
                        SandboxState::Paused,
                        "paused",
                        "recovered from disk: the VM is suspended",
                    );
                }
                // An accepted pause is finished: asked again (a suspend the
                // supervisor already began answers at once, and is waited out).
                (SandboxState::Pausing, JobState::Running) => {
                    let (daemon, mut record) = (self.clone(), record.clone());
                    record.job = Some(job.clone());
                    std::thread::spawn(move || match daemon.suspend_vm(&record) {
                        Ok(()) => daemon.finish(&id, SandboxState::Paused, "paused", ""),
                        Err(_) => daemon.settle_pause(&id, &job),
                    });
                }
                (_, JobState::Running | JobState::Pending) => {
                    // Probed in the background, with patience: a busy or slow
                    // (TCG) guest is not a dead one.
                    let vm_dir = self.vm_dir_of(&job, attempt);
                    let (daemon, record) = (self.clone(), record.clone());
                    std::thread::spawn(move || {
                        let deadline = Instant::now() + READY_TIMEOUT;
                        let mut last = String::new();
                        while Instant::now() < deadline {
                            match vm::guest::call(&vm_dir, &probe(&record), &[], Duration::from_secs(10)) {
                                Ok(_) => {
                                    // Only if nothing happened to it meanwhile (a pause, a delete).
                                    let _ = daemon.update(&id, |r| {
                                        if r.state == SandboxState::Running {
                                            r.supervisor = supervisor.or(r.supervisor);
                                            set_state(
                                                r,
                                                SandboxState::Running,
                                                "reattached",
                                                "the daemon restarted; the VM kept running",
                                            );
                                        }
                                        Ok(())
                                    });
                                    if let Some(pid) = supervisor {
                                        daemon.watch(&id, pid);
                                    }
                                    if !record.commands.contains_key("entrypoint") {
                                        let _ = daemon.start_entrypoint(&id);
                                    }
                                    return;
                                }
                                Err(e) => last = e,
                            }
                            std::thread::sleep(Duration::from_millis(200));
                        }
                        // A sandbox paused or deleted meanwhile is not this probe's to end.
                        if daemon.get(&id).is_ok_and(|r| r.state == SandboxState::Running) {
                            let _ = pvisor::runtime::kill::kill(&daemon.store, &job, Duration::from_secs(10));
                            daemon.finish(&id, SandboxState::Failed, "daemon_restart", &format!("its VM did not answer for {READY_TIMEOUT:?} after the restart ({last}); it was stopped"));
                        }
                    });
                }
                (_, other) => {
                    let message = format!("its VM ended while the daemon was away (Job state {other})");
                    if matches!(other, JobState::Unknown) {
                        let _ = pvisor::runtime::kill::kill(&self.store, &job, Duration::from_secs(10));
                    }
                    self.finish(&id, SandboxState::Failed, "runtime_exited", &message);
                }
            }
        }
    }

    /// Waits out a suspend another daemon instance requested.
    fn settle_pause(&self, id: &str, job: &JobId) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            match views::status(&self.store, job).map(|s| s.state) {
                Ok(JobState::Suspended) => return self.finish(id, SandboxState::Paused, "paused", ""),
                Ok(JobState::Running) => {}
                Ok(other) => {
                    return self.finish(
                        id,
                        SandboxState::Failed,
                        "pause_failed",
                        &format!("the Job ended {other}"),
                    )
                }
                Err(e) => return self.finish(id, SandboxState::Failed, "pause_failed", &e.to_string()),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Still running: the suspend was never taken (or failed); the VM is live.
        self.finish(
            id,
            SandboxState::Running,
            "pause_failed",
            "the pause did not complete before the daemon restarted",
        );
    }

    /// The SIGTERM policy: every Running sandbox is paused (its execution
    /// saved to disk, the VM stopped), so a restarted daemon lists it Paused.
    pub fn shutdown(self: &Arc<Self>) {
        let running: Vec<SandboxRecord> =
            self.list().into_iter().filter(|r| r.state == SandboxState::Running).collect();
        let handles: Vec<_> = running
            .into_iter()
            .filter_map(|record| {
                let daemon = self.clone();
                let id = record.id.clone();
                daemon.transition(&id, &[SandboxState::Running], SandboxState::Pausing, "daemon_shutdown").ok()?;
                Some(std::thread::spawn(move || match daemon.suspend_vm(&record) {
                    Ok(()) => daemon.finish(&id, SandboxState::Paused, "daemon_shutdown", "paused when the daemon stopped"),
                    Err(e) => {
                        eprintln!("pvisor serve: {id}: could not pause at shutdown ({e}); it keeps running and is reattached on restart");
                        daemon.finish(&id, SandboxState::Running, "pause_failed", &e);
                    }
                }))
            })
            .collect();
        for h in handles {
            let _ = h.join();
        }
    }
}

/// What the supervisor writes once its Job is admitted.
#[derive(Debug, Serialize, Deserialize)]
pub struct Binding {
    pub job: JobId,
    pub attempt: u32,
}

/// The validated parts of a create request.
#[derive(Debug)]
pub struct CreateRequest {
    pub image: String,
    pub entrypoint: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    pub resource_limits: BTreeMap<String, String>,
    pub platform: Option<serde_json::Value>,
    pub timeout: Option<u64>,
    pub memory_mib: u64,
    pub cpus: u32,
    pub network_policy: Option<pvisor_net::OrderedPolicy>,
}

pub fn set_state(r: &mut SandboxRecord, to: SandboxState, reason: &str, message: &str) {
    r.state = to;
    r.reason = reason.into();
    r.message = message.into();
    r.last_transition_at = Timestamp::now();
}

/// The environment of a command in the sandbox: a standard PATH and HOME,
/// the sandbox's env, then the request's.
pub fn command_env(record: &SandboxRecord, extra: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let mut env: BTreeMap<String, String> = [
        ("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
        ("HOME", "/root"),
        ("TERM", "xterm"),
        ("LANG", "C.UTF-8"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    env.insert("HOSTNAME".into(), record.id.clone());
    if record.network_policy.is_some() {
        // What the Job's own command gets: the agent's relay to the proxy.
        env.extend(pvisor::admission::proxy_env().into_iter().map(|(k, v)| (k.to_owned(), v)));
    }
    env.extend(record.env.clone());
    env.extend(extra.clone());
    env.into_iter().collect()
}

/// Whether `pid` is still this sandbox's supervisor: alive (a zombie is
/// not), and its command line names our bind file (pids are reused).
fn supervisor_alive(pid: u32, bind: &Path) -> bool {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name: "<state> <ppid> ...".
    let mut fields = stat.rsplit(')').next().unwrap_or("").split_whitespace();
    let (state, ppid) = (fields.next().unwrap_or("Z"), fields.next().and_then(|p| p.parse::<u32>().ok()));
    let alive = !stat.is_empty() && !state.starts_with('Z');
    // A child of this daemon is ours even before it has exec'd (its cmdline
    // is still the daemon's then); after a daemon restart the supervisor is
    // recognised by the bind file on its command line.
    let child = ppid == Some(std::process::id());
    let ours = child
        || fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| c.split(|b| *b == 0).any(|arg| arg == bind.as_os_str().as_encoded_bytes()))
            .unwrap_or(false);
    alive && ours
}

/// Asks a supervisor to cancel its Job (SIGTERM: it still publishes a
/// receipt), then SIGKILLs it after 15 s.
fn stop_supervisor(pid: u32, bind: &Path) {
    // SAFETY: kill takes no pointers; the pid was just checked to be ours.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(15);
    while supervisor_alive(pid, bind) {
        if Instant::now() > deadline {
            // SAFETY: as above.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The live supervisor whose command line names `bind`, if any.
fn find_supervisor(bind: &Path) -> Option<u32> {
    fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        supervisor_alive(pid, bind).then_some(pid)
    })
}

/// A cheap agent call that succeeds once the guest serves the sandbox root.
fn probe(record: &SandboxRecord) -> pvisor_agent_proto::Request {
    pvisor_agent_proto::Request::FileOp {
        root: record.rootfs.clone(),
        op: pvisor_agent_proto::FileOp::Stat { path: "/".into() },
    }
}

fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(3).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}
