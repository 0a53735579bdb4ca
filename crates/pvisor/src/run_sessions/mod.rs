//! Run sessions: named runs over one workspace that stack.
//!
//! (Not to be confused with `session`, which owns one Attempt's lifecycle.)
//!
//! A run session is a recorded list of Jobs. Each run in it is a workspace
//! fork of the session's last Job, so it sees the workspace plus everything
//! the earlier runs staged and nobody applied or dropped, and its stage is a
//! superset of theirs: the session's *head* (its last Job) holds what the
//! session has staged, with the conflict baselines of the session's first
//! run. Reviewing, applying or dropping the session is reviewing, applying
//! or dropping its head; once the head has nothing left, the session is
//! closed, and the same name starts a new one.
//!
//! Records live in `sessions/<workspace key>/<name>.json` (the key is a
//! digest of the canonical workspace path); a closed session moves to
//! `sessions/<key>/closed/`. Runs in one session are serialized by an
//! exclusive lock on `<name>.lock`, held from before the fork's checkpoint
//! until the run has ended. A crash between admission and the record's
//! update leaves a Job outside its session (it is still an ordinary Job);
//! the record never names a Job that does not exist.

mod attribution;
mod record;

pub use attribution::{attribute, Attributed};
pub use record::{SessionClosed, SessionName, SessionNameError, SessionRecord};

use std::path::{Path, PathBuf};

use pvisor_core::ids::JobId;
use pvisor_core::store::{self, OwnerLock, Store, StoreError};
use pvisor_core::time::Timestamp;

/// A session that could not be found, started or changed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Name(#[from] SessionNameError),
    #[error("workspace {} cannot be used for a session: {source}; pass an existing directory", path.display())]
    Workspace {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no open session {name:?} in {}{}; start one with `pvisor run --session {name} -- COMMAND`", workspace.display(), elsewhere_hint(elsewhere))]
    NotFound { name: String, workspace: PathBuf, elsewhere: Vec<PathBuf> },
    #[error(
        "session {name:?}: its last run {job} has no confirmed result (state {state}); `pvisor kill {job}` closes it as lost, `pvisor review {job}` shows what it staged"
    )]
    HeadUnconfirmed { name: String, job: JobId, state: String },
    #[error(
        "session {name:?} has a run starting or live; wait for it to end (`pvisor status --session {name}`), then apply or drop"
    )]
    Busy { name: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn elsewhere_hint(elsewhere: &[PathBuf]) -> String {
    match elsewhere {
        [] => String::new(),
        [one] if !one.exists() => format!(
            " (a session of that name belongs to {}, which no longer exists: review its Jobs by id)",
            one.display()
        ),
        many => {
            let places: Vec<String> = many.iter().map(|p| p.display().to_string()).collect();
            format!(" (sessions of that name are open in {}; run from there)", places.join(", "))
        }
    }
}

/// Where a workspace's sessions are recorded.
#[derive(Debug, Clone)]
pub struct SessionPlace {
    /// The canonical workspace path.
    pub workspace: PathBuf,
    dir: PathBuf,
}

impl SessionPlace {
    /// The sessions directory of `workspace`, which must exist.
    pub fn of(store: &Store, workspace: &Path) -> Result<Self, SessionError> {
        let workspace = workspace
            .canonicalize()
            .map_err(|source| SessionError::Workspace { path: workspace.to_owned(), source })?;
        if !workspace.is_dir() {
            let source = std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory");
            return Err(SessionError::Workspace { path: workspace, source });
        }
        let digest = store::blake3_hex(workspace.as_os_str().as_encoded_bytes());
        let dir = sessions_dir(store).join(&digest[..32]);
        Ok(Self { workspace, dir })
    }

    fn record_file(&self, name: &SessionName) -> PathBuf {
        self.dir.join(format!("{name}.json"))
    }

    fn lock_file(&self, name: &SessionName) -> PathBuf {
        self.dir.join(format!("{name}.lock"))
    }

    /// The open session `name`, if there is one.
    pub fn open_session(&self, name: &SessionName) -> Result<Option<SessionRecord>, StoreError> {
        match store::read_record::<SessionRecord>(&self.record_file(name)) {
            Ok(record) => Ok(Some(record)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The open session `name`, or a [`SessionError::NotFound`] that says
    /// where sessions of that name are open instead.
    pub fn require(&self, store: &Store, name: &SessionName) -> Result<SessionRecord, SessionError> {
        match self.open_session(name)? {
            Some(record) => Ok(record),
            None => Err(SessionError::NotFound {
                name: name.to_string(),
                workspace: self.workspace.clone(),
                elsewhere: open_elsewhere(store, name)?,
            }),
        }
    }

    /// Every open session of this workspace, by name.
    pub fn list(&self) -> Result<Vec<SessionRecord>, StoreError> {
        let mut found = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
            Err(e) => return Err(StoreError::Io { op: "list", path: self.dir.clone(), source: e }),
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".json")) else { continue };
            if stem.parse::<SessionName>().is_ok() {
                found.push(store::read_record(&entry.path())?);
            }
        }
        found.sort_by(|a: &SessionRecord, b| a.name.cmp(&b.name));
        Ok(found)
    }

    /// Takes the session's run lock, blocking while another run of it is
    /// live; `waiting` is called once before blocking.
    pub fn lock(&self, name: &SessionName, waiting: impl FnOnce()) -> Result<OwnerLock, StoreError> {
        store::create_dir_all_durable(&self.dir)?;
        let path = self.lock_file(name);
        if let Some(lock) = OwnerLock::try_acquire(&path)? {
            return Ok(lock);
        }
        waiting();
        OwnerLock::acquire_blocking(&path)
    }

    /// Takes the session's run lock if no run of it is live.
    pub fn try_lock(&self, name: &SessionName) -> Result<Option<OwnerLock>, StoreError> {
        store::create_dir_all_durable(&self.dir)?;
        OwnerLock::try_acquire(&self.lock_file(name))
    }

    /// Durably writes `record` as the open session of its name.
    pub fn save(&self, record: &SessionRecord) -> Result<(), StoreError> {
        store::create_dir_all_durable(&self.dir)?;
        store::write_atomic(&self.record_file(&record.name), &store::to_json_bytes(record))
    }

    /// Closes the session: records how, and moves its record to `closed/`
    /// so the name is free for a new session.
    pub fn close(&self, mut record: SessionRecord, how: &str) -> Result<SessionRecord, StoreError> {
        record.closed = Some(SessionClosed { at: Timestamp::now(), how: how.to_owned() });
        let closed_dir = self.dir.join("closed");
        store::create_dir_all_durable(&closed_dir)?;
        let first = record.jobs.first().map(|j| j.to_string()).unwrap_or_else(|| "empty".into());
        let target = closed_dir.join(format!("{}-{first}.json", record.name));
        store::write_atomic(&target, &store::to_json_bytes(&record))?;
        let open = self.record_file(&record.name);
        std::fs::remove_file(&open).map_err(|e| StoreError::Io {
            op: "remove",
            path: open.clone(),
            source: e,
        })?;
        store::sync_dir(&self.dir)?;
        Ok(record)
    }
}

/// `sessions/` under the state directory.
fn sessions_dir(store: &Store) -> PathBuf {
    store.root().join("sessions")
}

/// The workspaces where a session named `name` is open.
fn open_elsewhere(store: &Store, name: &SessionName) -> Result<Vec<PathBuf>, StoreError> {
    Ok(open_anywhere(store, name).into_iter().map(|r| r.workspace).collect())
}

/// Every open session named `name`, in any workspace.
fn open_anywhere(store: &Store, name: &SessionName) -> Vec<SessionRecord> {
    let Ok(entries) = std::fs::read_dir(sessions_dir(store)) else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| {
            store::read_record::<SessionRecord>(&entry.path().join(format!("{name}.json"))).ok()
        })
        .collect()
}

/// Open sessions named `name` whose workspace no longer exists (it was
/// moved or removed): their staged work is reachable only by Job id.
pub fn stranded(store: &Store, name: &SessionName) -> Vec<SessionRecord> {
    open_anywhere(store, name).into_iter().filter(|r| !r.workspace.exists()).collect()
}
