//! Snapshots (`POST /sandboxes/{id}/snapshots`, `/snapshots`, create from
//! `snapshotId`): a point-in-time copy of a sandbox's root filesystem, kept
//! as an image of its own that outlives the sandbox, as the reference
//! Docker runtime commits a container to an image
//! (server/opensandbox_server/services/docker/snapshot_runtime.py).
//!
//! Boundary: the records (`server/snapshots/<id>.json`, written before an
//! answer goes out), their states (`Creating` → `Ready` | `Failed`;
//! `Deleting` → gone), and the recovery of an interrupted capture when the
//! daemon opens. [`capture`] takes the filesystem out of the guest;
//! [`routes`] is the HTTP side.

mod capture;
pub mod routes;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use pvisor_core::time::Timestamp;
use serde::{Deserialize, Serialize};

use crate::images::ImageStore;
use crate::sandbox::OpError;

/// The image a snapshot's filesystem is kept as (the reference's
/// `opensandbox-snapshots:<id>`).
pub fn image_of(id: &str) -> String {
    format!("opensandbox-snapshots:{id}")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SnapshotState {
    Creating,
    Ready,
    Failed,
    Deleting,
}

impl SnapshotState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Creating => "Creating",
            Self::Ready => "Ready",
            Self::Failed => "Failed",
            Self::Deleting => "Deleting",
        }
    }
}

/// One snapshot, as `server/snapshots/<id>.json` holds it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub format: u32,
    pub id: String,
    pub sandbox_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub state: SnapshotState,
    pub reason: String,
    pub message: String,
    pub last_transition_at: Timestamp,
    pub created_at: Timestamp,
    /// The image its filesystem is kept as ([`image_of`]).
    pub image: String,
}

impl SnapshotRecord {
    fn set(&mut self, state: SnapshotState, reason: &str, message: impl Into<String>) {
        (self.state, self.reason, self.message) = (state, reason.into(), message.into());
        self.last_transition_at = Timestamp::now();
    }
}

/// The daemon's snapshots: records on disk, mirrored in memory.
#[derive(Debug)]
pub struct Snapshots {
    dir: PathBuf,
    records: Mutex<BTreeMap<String, SnapshotRecord>>,
    captures: Mutex<CaptureQueue>,
    /// Snapshots a delete has claimed while it looks for users, before it
    /// records `Deleting`: in memory only, so a daemon that dies then
    /// leaves the snapshot as it was (the next start finishes a recorded
    /// delete, and must never remove an image a sandbox uses).
    deleting: Mutex<BTreeSet<String>>,
}

/// A delete's claim on a snapshot ([`Snapshots::claim_delete`]); released
/// when dropped.
#[derive(Debug)]
pub struct DeleteClaim<'a> {
    snapshots: &'a Snapshots,
    id: String,
}

impl Drop for DeleteClaim<'_> {
    fn drop(&mut self) {
        self.snapshots.deleting.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
    }
}

/// Captures waiting for a worker, and how many workers run
/// ([`capture::submit`]).
#[derive(Debug, Default)]
struct CaptureQueue {
    /// (snapshot id, sandbox id), oldest first.
    pending: VecDeque<(String, String)>,
    workers: usize,
}

impl Snapshots {
    /// Reads `server/snapshots/` under `state_root` and settles what a
    /// stopped daemon left: a capture it was making is `Ready` if its image
    /// was published, `Failed` otherwise (the reference's
    /// `recover_unfinished_snapshots`); a delete it was making finishes.
    pub fn open(state_root: &Path, images: &ImageStore) -> std::io::Result<Self> {
        let dir = state_root.join("server").join("snapshots");
        pvisor_core::store::create_dir_all_private(&dir).map_err(std::io::Error::other)?;
        let snapshots =
            Self { dir, records: Mutex::default(), captures: Mutex::default(), deleting: Mutex::default() };
        for entry in fs::read_dir(&snapshots.dir)? {
            let path = entry?.path();
            match path.extension().and_then(|e| e.to_str()) {
                Some("json") => snapshots.load(&path, images),
                Some("partial") => drop(fs::remove_file(&path)),
                _ => {}
            }
        }
        Ok(snapshots)
    }

    fn load(&self, path: &Path, images: &ImageStore) {
        let record = match fs::read(path).map(|b| serde_json::from_slice::<SnapshotRecord>(&b)) {
            Ok(Ok(record)) => record,
            Ok(Err(e)) => {
                tracing::warn!("skipping the corrupt snapshot record {} ({e})", path.display());
                return;
            }
            Err(e) => {
                tracing::warn!("cannot read the snapshot record {}: {e}", path.display());
                return;
            }
        };
        // The record names its own file and image; one that does not (an
        // edited or misplaced file) is not trusted to name what to delete.
        let stem = path.file_stem().and_then(|s| s.to_str());
        if stem != Some(record.id.as_str()) || record.image != image_of(&record.id) {
            tracing::warn!(
                "skipping the snapshot record {}: its id or image does not match its file name",
                path.display()
            );
            return;
        }
        let id = record.id.clone();
        self.records().insert(id.clone(), record.clone());
        let settled = match record.state {
            SnapshotState::Creating if images.rootfs(&record.image).is_some() => {
                self.update(&id, |r| {
                    r.set(SnapshotState::Ready, "snapshot_recovery_ready", "Recovered the snapshot image after a daemon restart.");
                    Ok(())
                })
                .map(Some)
            }
            SnapshotState::Creating => self.update(&id, |r| {
                r.set(
                    SnapshotState::Failed,
                    "snapshot_recovery_interrupted",
                    "The capture was interrupted (the daemon stopped) and no image was published; create the snapshot again.",
                );
                Ok(())
            })
            .map(Some),
            SnapshotState::Deleting => self.finish_delete(&id, images).map(|()| None),
            _ => Ok(None),
        };
        if let Err(e) = settled {
            tracing::warn!(snapshot = %id, "cannot settle an interrupted snapshot: {e}");
        }
    }

    fn records(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, SnapshotRecord>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn captures(&self) -> std::sync::MutexGuard<'_, CaptureQueue> {
        self.captures.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Where a capture's archive is written before it is imported.
    fn archive(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.tar.partial"))
    }

    fn persist(&self, record: &SnapshotRecord) -> Result<(), OpError> {
        let path = self.path(&record.id);
        pvisor_core::store::write_atomic(&path, &pvisor_core::store::to_json_bytes(record))
            .map_err(|e| OpError::Internal(format!("cannot write {}: {e}", path.display())))
    }

    /// Records a new snapshot (written before it is answered).
    fn insert(&self, record: SnapshotRecord) -> Result<(), OpError> {
        self.persist(&record)?;
        self.records().insert(record.id.clone(), record);
        Ok(())
    }

    pub fn get(&self, id: &str) -> Result<SnapshotRecord, OpError> {
        self.records().get(id).cloned().ok_or_else(|| OpError::NotFound(format!("Snapshot {id} not found")))
    }

    /// Claims `id` for a delete; `None` if another delete has it.
    pub fn claim_delete(&self, id: &str) -> Option<DeleteClaim<'_>> {
        let mut deleting = self.deleting.lock().unwrap_or_else(|p| p.into_inner());
        deleting.insert(id.to_owned()).then(|| DeleteClaim { snapshots: self, id: id.to_owned() })
    }

    /// Whether a sandbox may be made from `id` now: it is `Ready` and no
    /// delete has claimed it.
    pub fn restorable(&self, id: &str) -> bool {
        let claimed = self.deleting.lock().unwrap_or_else(|p| p.into_inner()).contains(id);
        !claimed && self.get(id).is_ok_and(|r| r.state == SnapshotState::Ready)
    }

    pub fn list(&self) -> Vec<SnapshotRecord> {
        self.records().values().cloned().collect()
    }

    /// Changes a record under the lock, on disk first.
    fn update(
        &self,
        id: &str,
        change: impl FnOnce(&mut SnapshotRecord) -> Result<(), OpError>,
    ) -> Result<SnapshotRecord, OpError> {
        let mut records = self.records();
        let current = records.get(id).ok_or_else(|| OpError::NotFound(format!("Snapshot {id} not found")))?;
        let mut next = current.clone();
        change(&mut next)?;
        self.persist(&next)?;
        records.insert(id.to_owned(), next.clone());
        Ok(next)
    }

    /// Removes the image, then the record (a crash between leaves
    /// `Deleting`, finished when the daemon opens).
    fn finish_delete(&self, id: &str, images: &ImageStore) -> Result<(), OpError> {
        let image = self.get(id)?.image;
        images.remove(&image).map_err(|e| OpError::Internal(e.0))?;
        let path = self.path(id);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(OpError::Internal(format!("cannot remove {}: {e}", path.display()))),
        }
        self.records().remove(id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, state: SnapshotState) -> SnapshotRecord {
        let now = Timestamp::now();
        SnapshotRecord {
            format: 1,
            id: id.into(),
            sandbox_id: "sb-1".into(),
            name: None,
            state,
            reason: String::new(),
            message: String::new(),
            last_transition_at: now,
            created_at: now,
            image: image_of(id),
        }
    }

    fn write(dir: &Path, name: &str, record: &SnapshotRecord) {
        fs::write(dir.join(name), serde_json::to_vec(record).unwrap()).unwrap();
    }

    #[test]
    fn opening_settles_what_a_stopped_daemon_left() {
        let root = tempfile::tempdir().unwrap();
        let store = pvisor_core::store::Store::open(root.path()).unwrap();
        let images = ImageStore::new(&store);
        let dir = root.path().join("server").join("snapshots");
        fs::create_dir_all(&dir).unwrap();
        write(&dir, "capturing.json", &record("capturing", SnapshotState::Creating));
        write(&dir, "deleting.json", &record("deleting", SnapshotState::Deleting));
        write(&dir, "ready.json", &record("ready", SnapshotState::Ready));
        let mut misplaced = record("other", SnapshotState::Ready);
        misplaced.image = "debian:12".into();
        write(&dir, "other.json", &misplaced);
        write(&dir, "renamed.json", &record("elsewhere", SnapshotState::Ready));
        fs::write(dir.join("corrupt.json"), b"{").unwrap();
        fs::write(dir.join("capturing.tar.partial"), b"half an archive").unwrap();

        let snapshots = Snapshots::open(root.path(), &images).unwrap();

        let failed = snapshots.get("capturing").unwrap();
        assert_eq!(
            (failed.state, failed.reason.as_str()),
            (SnapshotState::Failed, "snapshot_recovery_interrupted")
        );
        let on_disk: SnapshotRecord =
            serde_json::from_slice(&fs::read(dir.join("capturing.json")).unwrap()).unwrap();
        assert_eq!(on_disk.state, SnapshotState::Failed, "the settled state is on disk");
        assert!(snapshots.get("deleting").is_err() && !dir.join("deleting.json").exists());
        assert_eq!(snapshots.get("ready").unwrap().state, SnapshotState::Ready);
        let ids: Vec<String> = snapshots.list().into_iter().map(|r| r.id).collect();
        assert_eq!(ids, ["capturing", "ready"], "mismatched and corrupt records are skipped");
        assert!(!dir.join("capturing.tar.partial").exists());
        assert!(dir.join("corrupt.json").exists(), "a corrupt record is kept for the operator, not deleted");
    }

    /// A delete's claim stops creates from the snapshot while it lasts,
    /// only one delete holds it, and nothing of it is on disk: a daemon
    /// that died holding it comes back to the snapshot as it was.
    #[test]
    fn a_delete_claim_is_exclusive_in_memory_and_released_on_drop() {
        let root = tempfile::tempdir().unwrap();
        let store = pvisor_core::store::Store::open(root.path()).unwrap();
        let images = ImageStore::new(&store);
        let dir = root.path().join("server").join("snapshots");
        fs::create_dir_all(&dir).unwrap();
        write(&dir, "ready.json", &record("ready", SnapshotState::Ready));
        let snapshots = Snapshots::open(root.path(), &images).unwrap();
        assert!(snapshots.restorable("ready"));

        let claim = snapshots.claim_delete("ready").expect("the first delete claims it");
        assert!(!snapshots.restorable("ready"), "no create while a delete holds it");
        assert!(snapshots.claim_delete("ready").is_none(), "a second delete is refused");
        let reopened = Snapshots::open(root.path(), &images).unwrap();
        assert!(reopened.restorable("ready"), "the claim is not on disk");
        drop(claim);
        assert!(snapshots.restorable("ready"));
        assert!(!snapshots.restorable("missing"));
    }
}
