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

mod entrypoint;
mod generations;
mod operations;
mod prune;
mod records;
mod recovery;
mod renew;
mod reserve;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pvisor::Runtime;
use pvisor_core::ids::JobId;
use pvisor_core::store::Store;

use crate::images::ImageStore;

pub use prune::{prune_records, Pruning};
pub use records::{
    command_env, set_state, trim_commands, Binding, CommandRecord, CreateRequest, Generation, SandboxRecord,
    SandboxState,
};
pub use renew::renew_extension;

/// The port of the execd API inside an OpenSandbox sandbox.
pub const EXECD_PORT: u16 = 44772;
/// The egress sidecar port the SDK resolves at create.
pub const EGRESS_PORT: u16 = 18080;
/// Where background command logs live inside the guest (outside the rootfs).
pub const GUEST_LOG_DIR: &str = "/run/pvisor/cmd";
/// The Job's own command: idles in the guest's initramfs until killed.
pub use pvisor::actions::guest::KEEPER;
/// The label on a sandbox's Job that names the sandbox.
pub const SANDBOX_LABEL: &str = "pvisor.serve/sandbox";
/// How long a VM may take to boot (TCG is slow) or restore.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// Why an operation was refused (answered 404, 409, 400 and 500).
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Internal(String),
    /// The state directory's disk is full (answered 507).
    #[error("{0}")]
    DiskFull(String),
}

/// Why the daemon could not load its records.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Store(#[from] pvisor_core::store::StoreError),
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Signals one foreground command; shared by its stream and `DELETE /command`.
pub type SharedSignaller = Arc<Mutex<Option<crate::guest_link::ExecSignaller>>>;

/// How the daemon is set up.
#[derive(Clone, Debug)]
pub struct Config {
    pub state_root: PathBuf,
    /// The `pvisor` binary that supervises each sandbox.
    pub pvisor: PathBuf,
    /// Largest `timeout` a create may ask for.
    pub max_timeout: Duration,
    /// The daemon's `--log-level`, handed to each supervisor it starts.
    pub log_level: Option<String>,
    /// Where a create's `volumes` may come from.
    pub volumes: crate::volumes::VolumeConfig,
}

/// Where the supervisor of each sandbox generation runs.
#[derive(Clone, Debug, Default)]
pub enum Supervisors {
    /// `pvisor sandbox-supervisor` processes (the `pvisor` of [`Config`]),
    /// which outlive a daemon restart.
    #[default]
    Processes,
    /// Threads of the daemon's own process over its Runtime, their
    /// Sessions on this Tokio runtime (which must run on a thread of its
    /// own). A placeholder child process stands for each, so the daemon
    /// watches, finds and stops it exactly as it would a supervisor
    /// process. For tests over fake backends.
    InProcess(tokio::runtime::Handle),
}

/// The daemon's view of every sandbox; one per `pvisor serve`.
#[derive(Debug)]
pub struct Daemon {
    pub config: Config,
    /// The one door to the runtime, built once at open.
    pub runtime: Runtime,
    supervisors: Supervisors,
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
    /// Space held back so that a sandbox can be ended on a full disk.
    reserve: reserve::Reserve,
    /// Snapshots of sandboxes' filesystems (they outlive their sandboxes).
    pub snapshots: crate::snapshots::Snapshots,
    /// Sandboxes' credential vaults (in memory only: they hold values).
    pub vaults: crate::credential_vault::Vaults,
    /// Sandboxes whose entrypoint a thread of this daemon watches: one each.
    entrypoint_watchers: Mutex<HashSet<String>>,
}

/// Streams one sandbox may hold open at once; each holds a worker thread.
pub const MAX_STREAMS: usize = 32;

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

impl Daemon {
    /// The daemon over this machine's backends.
    pub fn open(config: Config, built_in_images: Vec<(String, PathBuf)>) -> Result<Arc<Self>, OpenError> {
        let runtime = Runtime::on_host(Store::open(&config.state_root)?);
        Self::open_with(runtime, Supervisors::Processes, config, built_in_images)
    }

    /// The daemon over `runtime` (whose store is at `config.state_root`):
    /// every Job it runs, reads or ends goes through it; its sandboxes'
    /// supervisors run as `supervisors` says.
    pub fn open_with(
        runtime: Runtime,
        supervisors: Supervisors,
        config: Config,
        built_in_images: Vec<(String, PathBuf)>,
    ) -> Result<Arc<Self>, OpenError> {
        let store = runtime.store().clone();
        let dir = config.state_root.join("server").join("sandboxes");
        pvisor_core::store::create_dir_all_private(&dir)?;
        let mut records = BTreeMap::new();
        let unreadable = |path: &std::path::Path| {
            let path = path.to_owned();
            move |source| OpenError::Read { path, source }
        };
        for entry in fs::read_dir(&dir).map_err(unreadable(&dir))? {
            let path = entry.map_err(unreadable(&dir))?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let bytes = fs::read(&path).map_err(unreadable(&path))?;
            match serde_json::from_slice::<SandboxRecord>(&bytes) {
                Ok(r) => {
                    records.insert(r.id.clone(), r);
                }
                Err(e) => tracing::warn!(
                    "skipping the corrupt sandbox record {} ({e}); move it away to silence this",
                    path.display()
                ),
            }
        }
        let images = ImageStore::new(&store).with_built_in(built_in_images);
        let snapshots = crate::snapshots::Snapshots::open(&config.state_root, &images)
            .map_err(unreadable(&config.state_root.join("server").join("snapshots")))?;
        let reserve =
            reserve::Reserve::new(config.state_root.join("server").join("reserve"), reserve::RESERVE_BYTES);
        reserve.ensure();
        Ok(Arc::new(Self {
            config,
            runtime,
            supervisors,
            store,
            images,
            dir,
            records: Mutex::new(records),
            running: Mutex::default(),
            sessions: Mutex::default(),
            contexts: Mutex::default(),
            streams: Mutex::default(),
            reserve,
            snapshots,
            vaults: Default::default(),
            entrypoint_watchers: Mutex::default(),
        }))
    }

    fn records(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, SandboxRecord>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the record. On a full disk, a record that ends the sandbox
    /// (a delete, Stopping, Terminated, Failed) is written into the space the
    /// reserve held back; anything else fails naming the disk.
    fn persist(&self, record: &SandboxRecord) -> Result<(), OpError> {
        let path = self.dir.join(format!("{}.json", record.id));
        let write = || pvisor_core::store::write_atomic(&path, &pvisor_core::store::to_json_bytes(record));
        let Err(e) = write() else { return Ok(()) };
        if !reserve::disk_full(&e) {
            return Err(OpError::Internal(format!("cannot write {}: {e}", path.display())));
        }
        let ending = record.deleted
            || matches!(
                record.state,
                SandboxState::Stopping | SandboxState::Terminated | SandboxState::Failed
            );
        if ending && self.reserve.release() && write().is_ok() {
            return Ok(());
        }
        Err(OpError::DiskFull(format!(
            "cannot write {}: {}; delete sandboxes (DELETE always works) or free space",
            path.display(),
            reserve::describe_disk(&self.config.state_root)
        )))
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
        let (out, ended) = {
            let mut records = self.records();
            let record = records.get_mut(id).ok_or_else(|| OpError::NotFound(format!("no sandbox {id}")))?;
            let mut next = record.clone();
            let out = change(&mut next)?;
            self.persist(&next)?;
            *record = next;
            (out, matches!(record.state, SandboxState::Terminated | SandboxState::Failed))
        };
        // Whatever ended it, its vault's values go with it (after the
        // records' lock: a vault change holds its own lock, then reads records).
        if ended {
            self.vaults.forget(id);
        }
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
            set_state(r, to, reason, "").map_err(|e| OpError::Conflict(e.to_string()))?;
            Ok(r.clone())
        })
    }

    /// Records the end of an operation, if the state table allows it from
    /// where the sandbox is now: Terminated and Failed are final, and a
    /// Stopping sandbox only ends, so a pause or resume finishing late (or a
    /// recovery acting on what it saw earlier) never undoes them.
    fn finish(&self, id: &str, to: SandboxState, reason: &str, message: &str) {
        let _ = self.update(id, |r| {
            if let Err(e) = set_state(r, to, reason, message) {
                tracing::debug!(sandbox = %id, "{e}; the late {reason:?} is not recorded");
            }
            Ok(())
        });
    }

    fn bind_file(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.bind"))
    }

    fn log_file(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.log"))
    }

    /// The guest of generation `attempt` of `job`.
    pub(crate) fn link_of(
        &self,
        job: &JobId,
        attempt: u32,
    ) -> Result<crate::guest_link::Link, crate::guest_link::GuestError> {
        crate::guest_link::open(&self.runtime, job, attempt)
    }

    /// The guest of a Running sandbox's current generation.
    pub fn live_link(&self, id: &str) -> Result<(SandboxRecord, crate::guest_link::Link), OpError> {
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
        let link = self.link_of(job, generation.attempt).map_err(|e| OpError::Conflict(e.to_string()))?;
        Ok((record, link))
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
        self.update(id, |r| Ok(r.take_exec_id()))
    }
}
