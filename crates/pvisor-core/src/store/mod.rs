//! The state directory: layout, and the only sanctioned ways to write to it.
//!
//! Durable writes follow one protocol: write a temporary file in the same
//! directory, fsync it, rename it over the target, fsync the directory.
//! Receipts are committed no-clobber (`link(2)` of the synced temporary), so a
//! second, different receipt for the same Attempt is refused, and the same one
//! again is a no-op. Reads are size-capped so a corrupt or hostile file cannot
//! exhaust memory.
//!
//! This module holds the layout ([`Store`]) and its errors; the write
//! protocol is in `durable`, the owner lock in `lock`, workspace paths in
//! `relpath`, and the list of a user's state directories in `registry`.

use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::ids::{AttemptId, JobId, RunId};
use crate::records::Record;

mod durable;
mod lock;
mod registry;
mod relpath;

use durable::temp_path;
pub(crate) use durable::trim_torn_tail;
pub use durable::{
    append_line, blake3_hex, commit_no_clobber, create_dir_all_durable, create_dir_all_private, parse_record,
    read_capped, read_record, sync_dir, to_json_bytes, write_atomic, Commit,
};
pub use lock::OwnerLock;
pub use registry::{known_state_dirs, register_state_dir, state_dirs_registry};
pub use relpath::RelPath;

/// The size of the state directory's `reserve` file (see [`Store::reserve_file`]).
pub const RESERVE_BYTES: u64 = 8 * 1024 * 1024;

/// How many empty files `reserve.inodes/` holds: the inodes the records of
/// a run need (new records and their temporaries) on a filesystem a command
/// filled with files rather than bytes.
pub const RESERVE_INODES: usize = 64;

/// Whether `err` or any error beneath it is "no space left on device" (or
/// a disk quota exceeded).
pub fn is_out_of_space(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
                return true;
            }
        }
        current = e.source();
    }
    false
}

/// The largest record pvisor will read (Bundles with huge manifests included).
pub const RECORD_READ_CAP: u64 = 256 * 1024 * 1024;

/// A failure reading or writing the state directory. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("Cannot {op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is {size} bytes, over the {cap}-byte limit for a record", path.display())]
    TooLarge { path: PathBuf, size: u64, cap: u64 },
    #[error("{} is corrupt (not a valid {what} record)", path.display())]
    Corrupt {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("{} has format {found}, newer than this pvisor reads ({supported}); upgrade pvisor", path.display())]
    NewerFormat { path: PathBuf, found: u32, supported: u32 },
    #[error("{} already holds different contents; refusing to overwrite a committed record", path.display())]
    Conflict { path: PathBuf },
}

impl StoreError {
    fn io(op: &'static str, path: &Path, source: io::Error) -> Self {
        Self::Io { op, path: path.to_owned(), source }
    }

    /// Returns whether this error means the file does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// Returns the state root: `$PVISOR_HOME`, else `$XDG_STATE_HOME/pvisor`, else
/// `$HOME/.local/state/pvisor`. Callers pass the environment in; this crate reads none.
pub fn resolve_state_root(
    pvisor_home: Option<OsString>,
    xdg_state_home: Option<OsString>,
    home: Option<OsString>,
) -> Option<PathBuf> {
    let non_empty = |v: Option<OsString>| v.filter(|s| !s.is_empty()).map(PathBuf::from);
    non_empty(pvisor_home)
        .or_else(|| non_empty(xdg_state_home).map(|p| p.join("pvisor")))
        .or_else(|| non_empty(home).map(|p| p.join(".local/state/pvisor")))
}

/// The state directory and its layout (see `docs/on-disk-format.md`).
#[derive(Clone, Debug)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// Opens (creating if needed) the state directory at `root`. Opened by
    /// root, the directory is first closed to every sandbox (see
    /// [`close_to_sandboxes`]), before anything is made inside it.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let root = root.into();
        create_dir_all_durable(&root)?;
        close_to_sandboxes(&root)?;
        for dir in [root.join("jobs"), root.join("runs"), root.join("checkpoints")] {
            create_dir_all_durable(&dir)?;
        }
        let root = fs::canonicalize(&root).map_err(|e| StoreError::io("resolve", &root, e))?;
        let store = Self { root };
        store.ensure_reserve();
        Ok(store)
    }

    /// `admission.lock`: held shared by every admission (and import) from
    /// before it creates a Run directory until that Run's owner lock is
    /// held, and exclusively by `gc` while it looks for the leftovers of
    /// killed admissions, so gc never mistakes a Run being created for one.
    pub fn admission_lock_file(&self) -> PathBuf {
        self.root.join("admission.lock")
    }

    /// `reserve`: space set aside so the commands that free space (`drop`,
    /// `kill`, `gc`) can still write their records on a full filesystem.
    pub fn reserve_file(&self) -> PathBuf {
        self.root.join("reserve")
    }

    /// `reserve.inodes`: [`RESERVE_INODES`] empty files, the reserve's inodes.
    pub fn reserve_inodes_dir(&self) -> PathBuf {
        self.root.join("reserve.inodes")
    }

    /// Allocates the reserve if it is missing (best effort: on a full
    /// filesystem there is nothing to set aside, and nothing fails).
    fn ensure_reserve(&self) {
        self.ensure_reserve_inodes();
        let path = self.reserve_file();
        if path.exists() {
            return;
        }
        let tmp = temp_path(&path);
        let allocated =
            OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).and_then(|f| {
                // Real blocks, not a sparse hole.
                rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, RESERVE_BYTES)?;
                f.sync_all()
            });
        if allocated.is_ok() && fs::rename(&tmp, &path).is_ok() {
            return;
        }
        let _ = fs::remove_file(&tmp);
    }

    /// Sets the reserve's inodes aside: empty files made in a temporary
    /// directory, published whole by a rename.
    fn ensure_reserve_inodes(&self) {
        let dir = self.reserve_inodes_dir();
        if dir.exists() {
            return;
        }
        let tmp = temp_path(&dir);
        let made = create_dir_all_private(&tmp).is_ok()
            && (0..RESERVE_INODES).all(|i| {
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(tmp.join(i.to_string()))
                    .is_ok()
            });
        if !(made && fs::rename(&tmp, &dir).is_ok()) {
            let _ = crate::tree::remove_tree(&tmp);
        }
    }

    /// Gives the reserve (its bytes and its inodes) back to the filesystem.
    /// Returns whether there was one.
    pub fn release_reserve(&self) -> bool {
        let inodes = crate::tree::remove_tree(&self.reserve_inodes_dir()).is_ok();
        fs::remove_file(self.reserve_file()).is_ok() || inodes
    }

    /// Whether the state directory's filesystem has less room left, in
    /// bytes or in inodes, than the reserve holds: then the next records may
    /// not fit unless the reserve is released. (A filesystem that reports
    /// no inode count has no inode limit.)
    pub fn is_short_of_space(&self) -> bool {
        let Ok(st) = rustix::fs::statvfs(&self.root) else { return false };
        let bytes = st.f_bavail.saturating_mul(st.f_frsize);
        bytes < RESERVE_BYTES || (st.f_files > 0 && st.f_favail < RESERVE_INODES as u64)
    }

    /// Returns the canonical state root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn jobs_dir(&self) -> PathBuf {
        self.root.join("jobs")
    }

    /// The root filesystems `pvisor serve` sandboxes boot (`pvisor image`).
    /// The only place inside the state directory a (vm) workspace may be.
    pub fn sandbox_images_dir(&self) -> PathBuf {
        self.root.join("sandbox-images")
    }
    pub fn job_dir(&self, job: &JobId) -> PathBuf {
        self.jobs_dir().join(job.as_str())
    }
    pub fn job_file(&self, job: &JobId) -> PathBuf {
        self.job_dir(job).join("job.json")
    }
    pub fn run_dir(&self, run: &RunId) -> PathBuf {
        self.root.join("runs").join(run.as_str())
    }
    pub fn run_file(&self, run: &RunId) -> PathBuf {
        self.run_dir(run).join("run.json")
    }
    pub fn events_file(&self, run: &RunId) -> PathBuf {
        self.run_dir(run).join("events.jsonl")
    }
    pub fn attempt_dir(&self, attempt: &AttemptId) -> PathBuf {
        self.run_dir(attempt.run()).join("attempts").join(attempt.number().to_string())
    }
    pub fn attempt_file(&self, attempt: &AttemptId) -> PathBuf {
        self.attempt_dir(attempt).join("attempt.json")
    }
    pub fn bundle_file(&self, attempt: &AttemptId) -> PathBuf {
        self.attempt_dir(attempt).join("bundle.json")
    }
    pub fn receipt_file(&self, attempt: &AttemptId) -> PathBuf {
        self.attempt_dir(attempt).join("completion.json")
    }
    /// The termination receipt of a suspended (hibernated) Attempt.
    pub fn termination_file(&self, attempt: &AttemptId) -> PathBuf {
        self.attempt_dir(attempt).join("termination.json")
    }
    /// A Run's execution checkpoints (vm executor), one directory each.
    pub fn exec_checkpoints_dir(&self, run: &RunId) -> PathBuf {
        self.run_dir(run).join("exec-checkpoints")
    }
    pub fn lock_file(&self, attempt: &AttemptId) -> PathBuf {
        self.attempt_dir(attempt).join("owner.lock")
    }
    /// Where `--cache` stores what runs add: one directory per host path.
    pub fn caches_dir(&self) -> PathBuf {
        self.root.join("caches")
    }

    /// The cache store of host directory `path`: readable name, plus a short
    /// digest of the path so two directories never share one.
    pub fn cache_dir(&self, path: &Path) -> PathBuf {
        let name: String = path
            .components()
            .rev()
            .take(2)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("-")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
            .collect();
        let digest = blake3_hex(path.as_os_str().as_bytes());
        self.caches_dir().join(format!("{}-{}", name.trim_start_matches(['-', '_']), &digest[..12]))
    }

    pub fn checkpoints_dir(&self) -> PathBuf {
        self.root.join("checkpoints")
    }
    pub fn checkpoint_dir(&self, id: &crate::ids::CheckpointId) -> PathBuf {
        self.checkpoints_dir().join(id.as_str())
    }
    /// The stage: `upper/` and `work/` of the overlay, and `root/`, the empty
    /// directory the sandbox's new root is assembled on.
    pub fn stage_dir(&self, run: &RunId) -> PathBuf {
        self.run_dir(run).join("stage")
    }

    /// Makes a new Job visible atomically: `job.json` is written into a
    /// private directory (`jobs/.admitting-<run>`, named after the Run so gc
    /// can tell whether its admission is still alive) that is then renamed
    /// to `jobs/<job>`. Readers see either no Job or a whole one.
    pub fn publish_job(&self, job: &crate::records::JobRecord) -> Result<(), StoreError> {
        let id = &job.id;
        let staging = self.jobs_dir().join(format!("{ADMITTING_PREFIX}{}", job.run));
        create_dir_all_private(&staging)?;
        write_atomic(&staging.join("job.json"), &to_json_bytes(job))?;
        let target = self.job_dir(id);
        fs::rename(&staging, &target).map_err(|e| StoreError::io("publish", &target, e))?;
        sync_dir(&self.jobs_dir())
    }

    /// Lists every Job id, oldest first (ULIDs sort by time). Foreign names are skipped.
    pub fn list_jobs(&self) -> Result<Vec<JobId>, StoreError> {
        let dir = self.jobs_dir();
        let entries = fs::read_dir(&dir).map_err(|e| StoreError::io("list", &dir, e))?;
        let mut ids = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| StoreError::io("list", &dir, e))?;
            if let Some(id) = entry.file_name().to_str().and_then(|s| s.parse().ok()) {
                ids.push(id);
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// Reads and checks a record.
    pub fn read<T: Record>(&self, path: &Path) -> Result<T, StoreError> {
        read_record(path)
    }

    /// Atomically replaces the record at `path`.
    pub fn write<T: Record>(&self, path: &Path, record: &T) -> Result<(), StoreError> {
        write_atomic(path, &to_json_bytes(record))
    }
}

/// The containerd shim's state directory when containerd names no `PVISOR_HOME`.
pub const SHIM_STATE_ROOT: &str = "/var/lib/pvisor";

/// The group a root-owned state directory is given: one no namespace a
/// sandbox can make maps (see [`close_to_sandboxes`]).
pub const CLOSED_STATE_GID: u32 = 65534;

/// Makes a state directory opened by root unreadable to every sandbox,
/// including ones that started before it existed: mode 0000, owner root,
/// group [`CLOSED_STATE_GID`].
///
/// A sandbox's mount namespace is fixed when it starts, so no mount can hide
/// a state directory made later (`PVISOR_HOME=elsewhere`, the containerd
/// shim's `/var/lib/pvisor` first used after the sandbox started). What a
/// root sandbox lacks instead is capabilities: its command is uid 0 with
/// every capability dropped, so for it a 0000 directory is closed even
/// though it is the owner, and its read-only view refuses the `chmod` that
/// would reopen it. pvisor, with `CAP_DAC_OVERRIDE`, goes in regardless.
/// The group matters under `--no-seccomp`: a command may then make a user
/// namespace of its own and hold capabilities there, but those apply only
/// to inodes whose owner and group it can map, and it can map only uid 0
/// and gid 0. A root without `CAP_DAC_OVERRIDE` would lock itself out, and
/// the root of a user namespace (`unshare -r`, a rootless container) would
/// lock out its own user outside it, and another user's directory opened by
/// root would be taken from them: all three leave the directory as it is.
/// A rootless sandbox is its user's own uid: docs/threat-model.md says what
/// covers that user's state directories.
pub fn close_to_sandboxes(root: &Path) -> Result<(), StoreError> {
    use rustix::fs::{Gid, Mode, Uid};
    if !rustix::process::geteuid().is_root() || !in_initial_user_namespace() {
        return Ok(());
    }
    let caps = rustix::thread::capabilities(None).map_err(|e| StoreError::io("inspect", root, e.into()))?;
    if !caps.effective.contains(rustix::thread::CapabilitySet::DAC_OVERRIDE) {
        return Ok(());
    }
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(root).map_err(|e| StoreError::io("inspect", root, e))?;
    // Another user's state directory opened by root (`sudo pvisor jobs`
    // with that user's HOME) stays theirs: closed, it would lock them out.
    if meta.uid() != 0 {
        return Ok(());
    }
    if meta.mode() & 0o7777 != 0 {
        rustix::fs::chmod(root, Mode::empty()).map_err(|e| StoreError::io("close", root, e.into()))?;
    }
    if meta.gid() != CLOSED_STATE_GID {
        let (uid, gid) = (Uid::from_raw(0), Gid::from_raw(CLOSED_STATE_GID));
        // A filesystem that refuses the group keeps the directory's own: only
        // a `--no-seccomp` command could try to use that, and the kernel
        // refuses it a map of uid 0 anyway.
        let _ = rustix::fs::chown(root, Some(uid), Some(gid));
    }
    Ok(())
}

/// Whether this process's user namespace is the host's: its uid map is
/// the whole identity range.
fn in_initial_user_namespace() -> bool {
    fs::read_to_string("/proc/self/uid_map")
        .is_ok_and(|map| map.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"])
}

/// The name prefix of a Job directory still being admitted (see [`Store::publish_job`]).
pub const ADMITTING_PREFIX: &str = ".admitting-";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[ignore = "needs root in the host's user namespace: scripts/test.sh runs it as root, with --include-ignored"]
    fn roots_own_state_directory_is_closed_and_another_users_is_left_alone() {
        use std::os::unix::fs::MetadataExt;
        assert!(
            rustix::process::geteuid().is_root() && in_initial_user_namespace(),
            "needs root in the host's user namespace (the test is ignored unless included)"
        );
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("state")).unwrap();
        let meta = fs::metadata(store.root()).unwrap();
        assert_eq!((meta.mode() & 0o7777, meta.uid(), meta.gid()), (0, 0, CLOSED_STATE_GID));
        assert!(store.jobs_dir().is_dir(), "root still goes in");
        let theirs = dir.path().join("theirs");
        fs::create_dir(&theirs).unwrap();
        fs::set_permissions(&theirs, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(&theirs, Some(4242), Some(4242)).unwrap();
        Store::open(&theirs).unwrap();
        let meta = fs::metadata(&theirs).unwrap();
        assert_eq!((meta.mode() & 0o7777, meta.uid(), meta.gid()), (0o755, 4242, 4242));
    }

    #[test]
    fn state_root_precedence() {
        let s = |v: &str| Some(OsString::from(v));
        assert_eq!(resolve_state_root(s("/p"), s("/x"), s("/h")), Some(PathBuf::from("/p")));
        assert_eq!(resolve_state_root(s(""), s("/x"), s("/h")), Some(PathBuf::from("/x/pvisor")));
        assert_eq!(resolve_state_root(None, None, s("/h")), Some(PathBuf::from("/h/.local/state/pvisor")));
        assert_eq!(resolve_state_root(None, None, None), None);
    }
}
