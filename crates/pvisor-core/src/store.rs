//! The state directory: layout, and the only sanctioned ways to write to it.
//!
//! Durable writes follow one protocol: write a temporary file in the same
//! directory, fsync it, rename it over the target, fsync the directory.
//! Receipts are committed no-clobber (`link(2)` of the synced temporary), so a
//! second, different receipt for the same Attempt is refused, and the same one
//! again is a no-op. Reads are size-capped so a corrupt or hostile file cannot
//! exhaust memory.

use rustix::fs::FlockOperation;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ids::{AttemptId, JobId, RunId};
use crate::records::{Record, FORMAT};

/// The size of the state directory's `reserve` file (see [`Store::reserve_file`]).
pub const RESERVE_BYTES: u64 = 8 * 1024 * 1024;

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

/// Where a user's pvisor state directories are listed, so every sandbox can
/// hide all of them, not only its own: `$XDG_STATE_HOME/pvisor-state-dirs`,
/// else `$HOME/.local/state/pvisor-state-dirs`.
pub fn state_dirs_registry(xdg_state_home: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    let non_empty = |v: Option<OsString>| v.filter(|s| !s.is_empty()).map(PathBuf::from);
    non_empty(xdg_state_home)
        .or_else(|| non_empty(home).map(|h| h.join(".local/state")))
        .map(|dir| dir.join("pvisor-state-dirs"))
}

/// Adds `root` to the registry (one canonical path per line) unless it is
/// listed already, and drops entries whose directory is gone once they
/// outnumber the live ones (test suites and benchmarks make hundreds of
/// temporary state directories, and every run stats each entry). Best
/// effort: a registry that cannot be written only means fewer directories
/// are known to hide. Changes are serialised by `flock` on a lock file
/// beside the registry, so a prune never loses a concurrent registration.
pub fn register_state_dir(registry: &Path, root: &Path) {
    let (live, dead) = listed_state_dirs(registry);
    let listed = live.iter().any(|known| known == root);
    if listed && dead <= 16.max(live.len()) {
        return;
    }
    let mut line = root.as_os_str().as_bytes().to_vec();
    if line.contains(&b'\n') {
        return;
    }
    line.push(b'\n');
    if let Some(parent) = registry.parent() {
        let _ = fs::create_dir_all(parent);
    }
    let mut lock_path = registry.as_os_str().to_owned();
    lock_path.push(".lock");
    let Ok(lock) = OpenOptions::new().write(true).create(true).truncate(false).mode(0o600).open(&lock_path)
    else {
        return;
    };
    // Released when `lock` is dropped.
    if rustix::fs::flock(&lock, FlockOperation::LockExclusive).is_err() {
        return;
    }
    // Re-read under the lock: another process may have changed it.
    let (mut live, dead) = listed_state_dirs(registry);
    if !live.iter().any(|known| known == root) {
        live.push(root.to_owned());
    }
    if dead > 16.max(live.len()) {
        let mut text = Vec::new();
        for dir in &live {
            text.extend_from_slice(dir.as_os_str().as_bytes());
            text.push(b'\n');
        }
        let _ = write_atomic(registry, &text);
    } else if !listed {
        let _ = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(registry)
            .and_then(|mut f| f.write_all(&line));
    }
}

/// The state directories listed in the registry that still exist.
pub fn known_state_dirs(registry: &Path) -> Vec<PathBuf> {
    listed_state_dirs(registry).0
}

/// The listed directories that exist, and how many listed ones are gone.
fn listed_state_dirs(registry: &Path) -> (Vec<PathBuf>, usize) {
    let Ok(bytes) = read_capped(registry, 1 << 20) else { return (Vec::new(), 0) };
    let listed: Vec<PathBuf> = bytes
        .split(|&b| b == b'\n')
        .filter(|l| l.first() == Some(&b'/'))
        .map(|l| PathBuf::from(OsStr::from_bytes(l)))
        .collect();
    let total = listed.len();
    let mut dirs: Vec<PathBuf> = listed.into_iter().filter(|p| p.is_dir()).collect();
    let dead = total - dirs.len();
    dirs.sort();
    dirs.dedup();
    (dirs, dead)
}

/// The state directory and its layout (see `docs/on-disk-format.md`).
#[derive(Clone, Debug)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// Opens (creating if needed) the state directory at `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let root = root.into();
        for dir in [root.clone(), root.join("jobs"), root.join("runs"), root.join("checkpoints")] {
            create_dir_all_private(&dir)?;
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

    /// Allocates the reserve if it is missing (best effort: on a full
    /// filesystem there is nothing to set aside, and nothing fails).
    fn ensure_reserve(&self) {
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

    /// Gives the reserve back to the filesystem. Returns whether there was one.
    pub fn release_reserve(&self) -> bool {
        fs::remove_file(self.reserve_file()).is_ok()
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

/// The name prefix of a Job directory still being admitted (see [`Store::publish_job`]).
pub const ADMITTING_PREFIX: &str = ".admitting-";

/// Serializes a record as pretty JSON with a trailing newline.
pub fn to_json_bytes<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing our own plain-data records cannot fail (no maps with non-string keys).
    let mut bytes = serde_json::to_vec_pretty(value).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// Creates `dir` and its parents with mode 0700 (records can name private paths).
pub fn create_dir_all_private(dir: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| StoreError::io("create directory", dir, e))
}

/// Reads at most `cap` bytes of `path`, failing if the file is larger.
pub fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, StoreError> {
    let file = File::open(path).map_err(|e| StoreError::io("read", path, e))?;
    let mut bytes = Vec::new();
    file.take(cap + 1).read_to_end(&mut bytes).map_err(|e| StoreError::io("read", path, e))?;
    if bytes.len() as u64 > cap {
        let size = fs::metadata(path).map(|m| m.len()).unwrap_or(bytes.len() as u64);
        return Err(StoreError::TooLarge { path: path.to_owned(), size, cap });
    }
    Ok(bytes)
}

/// Reads a record, refusing corrupt JSON and formats newer than [`FORMAT`].
pub fn read_record<T: Record>(path: &Path) -> Result<T, StoreError> {
    let bytes = read_capped(path, RECORD_READ_CAP)?;
    parse_record(path, &bytes)
}

/// Parses record bytes that were read from `path`.
pub fn parse_record<T: Record>(path: &Path, bytes: &[u8]) -> Result<T, StoreError> {
    #[derive(Deserialize)]
    struct Probe {
        format: u32,
    }
    let corrupt = |source| StoreError::Corrupt { path: path.to_owned(), what: T::FILE, source };
    let probe: Probe = serde_json::from_slice(bytes).map_err(corrupt)?;
    if probe.format > FORMAT {
        return Err(StoreError::NewerFormat {
            path: path.to_owned(),
            found: probe.format,
            supported: FORMAT,
        });
    }
    let record: T = serde_json::from_slice(bytes).map_err(corrupt)?;
    Ok(record)
}

/// Returns the hex BLAKE3 digest of `bytes`.
pub fn blake3_hex(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_else(|| OsStr::new("record"));
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".tmp-{}-{}", std::process::id(), crate::ids::new_ulid()));
    path.with_file_name(tmp)
}

fn write_synced_temp(path: &Path, bytes: &[u8]) -> Result<PathBuf, StoreError> {
    let tmp = temp_path(path);
    let result = (|| {
        let mut file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()
    })();
    match result {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(StoreError::io("write", path, e))
        }
    }
}

/// Fsyncs a directory so a rename or link inside it is durable.
pub fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| StoreError::io("sync directory", dir, e))
}

fn parent_of(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Atomically replaces `path` with `bytes`: temp → fsync → rename → fsync dir.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let tmp = write_synced_temp(path, bytes)?;
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(StoreError::io("replace", path, e));
    }
    sync_dir(parent_of(path))
}

/// The outcome of a no-clobber commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// The file was written by this call.
    Written,
    /// The file already held exactly these bytes; nothing changed.
    AlreadyCommitted,
}

/// Writes `path` only if it does not exist yet. The same bytes again succeed
/// ([`Commit::AlreadyCommitted`]); different bytes are a [`StoreError::Conflict`].
pub fn commit_no_clobber(path: &Path, bytes: &[u8]) -> Result<Commit, StoreError> {
    let tmp = write_synced_temp(path, bytes)?;
    let linked = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            sync_dir(parent_of(path))?;
            Ok(Commit::Written)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let existing = read_capped(path, RECORD_READ_CAP)?;
            if existing == bytes {
                Ok(Commit::AlreadyCommitted)
            } else {
                Err(StoreError::Conflict { path: path.to_owned() })
            }
        }
        Err(e) => Err(StoreError::io("commit", path, e)),
    }
}

/// Appends one line to a JSON Lines file, optionally fsyncing it.
///
/// Callers are the file's single writer (they hold the owner or apply lock).
/// A torn final line — a write interrupted by a crash, never acknowledged — is
/// cut off first, so the new line starts on a line of its own.
pub fn append_line(path: &Path, line: &[u8], sync: bool) -> Result<(), StoreError> {
    let mut buf = Vec::with_capacity(line.len() + 1);
    buf.extend_from_slice(line);
    buf.push(b'\n');
    let result = (|| {
        let mut file = OpenOptions::new().read(true).append(true).create(true).mode(0o600).open(path)?;
        trim_torn_tail(&file)?;
        // One write(2) per call: O_APPEND keeps whole lines together.
        file.write_all(&buf)?;
        if sync {
            file.sync_data()?;
        }
        Ok(())
    })();
    result.map_err(|e| StoreError::io("append to", path, e))
}

/// Truncates `file` after its last newline if it ends in a partial line.
pub(crate) fn trim_torn_tail(file: &File) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    let mut last = [0u8; 1];
    file.read_exact_at(&mut last, len - 1)?;
    if last[0] == b'\n' {
        return Ok(());
    }
    let mut end = len;
    let mut chunk = vec![0u8; 64 * 1024];
    while end > 0 {
        let start = end.saturating_sub(chunk.len() as u64);
        let piece = &mut chunk[..(end - start) as usize];
        file.read_exact_at(piece, start)?;
        if let Some(pos) = piece.iter().rposition(|&b| b == b'\n') {
            return file.set_len(start + pos as u64 + 1);
        }
        end = start;
    }
    file.set_len(0)
}

/// An exclusive advisory lock (`flock(2)`) held by the process that owns an Attempt.
///
/// The kernel drops it when the owner exits, however it exits, so a reader that
/// can take the lock knows the owner is gone.
#[derive(Debug)]
pub struct OwnerLock {
    file: File,
}

impl OwnerLock {
    fn open_file(path: &Path) -> Result<File, StoreError> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| StoreError::io("open lock", path, e))
    }

    /// Takes the lock, failing if another process holds it.
    pub fn acquire(path: &Path) -> Result<Self, StoreError> {
        let file = Self::open_file(path)?;
        if let Err(e) = rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            return Err(StoreError::io("lock", path, e.into()));
        }
        Ok(Self { file })
    }

    /// Takes the lock, waiting while another process holds it.
    pub fn acquire_blocking(path: &Path) -> Result<Self, StoreError> {
        Self::lock_blocking(Self::open_file(path)?, path)
    }

    /// Takes an exclusive lock on directory `dir` itself, waiting while
    /// another process holds it. Nothing is created inside `dir`.
    pub fn acquire_directory(dir: &Path) -> Result<Self, StoreError> {
        Self::flock_blocking(Self::open_directory(dir)?, dir, FlockOperation::LockExclusive)
    }

    /// Takes a shared lock on directory `dir` itself, waiting while another
    /// process holds it exclusively.
    pub fn acquire_directory_shared(dir: &Path) -> Result<Self, StoreError> {
        Self::flock_blocking(Self::open_directory(dir)?, dir, FlockOperation::LockShared)
    }

    fn open_directory(dir: &Path) -> Result<File, StoreError> {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(dir)
            .map_err(|e| StoreError::io("open", dir, e))
    }

    /// Takes a shared lock at `path`, waiting while an exclusive holder has it.
    /// Many processes may hold it at once; an exclusive [`Self::try_acquire`]
    /// fails while any do.
    pub fn acquire_shared_blocking(path: &Path) -> Result<Self, StoreError> {
        Self::flock_blocking(Self::open_file(path)?, path, FlockOperation::LockShared)
    }

    /// Takes the lock exclusively if nobody holds it (shared or not);
    /// `Ok(None)` if somebody does.
    pub fn try_acquire(path: &Path) -> Result<Option<Self>, StoreError> {
        match Self::acquire(path) {
            Ok(lock) => Ok(Some(lock)),
            Err(StoreError::Io { source, .. }) if source.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Takes the lock on an already open `file` (named `path` in errors),
    /// waiting while another holder has it.
    pub(crate) fn lock_blocking(file: File, path: &Path) -> Result<Self, StoreError> {
        Self::flock_blocking(file, path, FlockOperation::LockExclusive)
    }

    /// The locked file, for a holder that also reads or writes it.
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    fn flock_blocking(file: File, path: &Path, op: FlockOperation) -> Result<Self, StoreError> {
        loop {
            match rustix::fs::flock(&file, op) {
                Ok(()) => return Ok(Self { file }),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(StoreError::io("lock", path, e.into())),
            }
        }
    }

    /// Returns whether some process currently holds the lock at `path`.
    /// A missing lock file means nobody does.
    pub fn is_held(path: &Path) -> Result<bool, StoreError> {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(StoreError::io("open lock", path, e)),
        };
        // The shared lock is released on drop.
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockShared) {
            Ok(()) => Ok(false),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(true),
            Err(e) => Err(StoreError::io("probe lock", path, e.into())),
        }
    }
}

/// A workspace-relative path, kept as raw bytes so no file name is ever lost.
///
/// Serialized as a JSON string when the bytes are UTF-8, otherwise as
/// `{"hex": "<bytes>"}`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelPath(Vec<u8>);

impl RelPath {
    /// Wraps a relative path.
    pub fn new(path: &Path) -> Self {
        Self(path.as_os_str().as_bytes().to_vec())
    }
    /// Returns the path.
    pub fn as_path(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.0))
    }
    /// Whether `bytes` is a non-empty relative path of plain names (no `/`
    /// prefix, no `.` or `..`, no empty components, no NUL).
    pub fn is_plain_relative(bytes: &[u8]) -> bool {
        !bytes.is_empty()
            && !bytes.contains(&0)
            && bytes.split(|&b| b == b'/').all(|c| !c.is_empty() && c != b"." && c != b"..")
    }

    /// Returns the path for a person's terminal: control, escape, bidi and
    /// invisible formatting characters and invalid UTF-8 shown escaped
    /// (see [`crate::text`]).
    pub fn display_escaped(&self) -> String {
        crate::text::escape_bytes(&self.0, crate::text::Tabs::Escape)
    }
}

impl fmt::Debug for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.display_escaped())
    }
}

impl Serialize for RelPath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(&self.0) {
            Ok(text) => s.serialize_str(text),
            Err(_) => {
                use serde::ser::SerializeMap;
                let hex: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
                let mut map = s.serialize_map(Some(1))?;
                map.serialize_entry("hex", &hex)?;
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for RelPath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Text(String),
            Hex { hex: String },
        }
        let bytes = match Repr::deserialize(d)? {
            Repr::Text(t) => t.into_bytes(),
            Repr::Hex { hex } => (0..hex.len())
                .step_by(2)
                .map(|i| hex.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
                .collect::<Option<Vec<u8>>>()
                .ok_or_else(|| serde::de::Error::custom("invalid hex path"))?,
        };
        // A record is input too: only plain relative names, never `/x` or `..`.
        if !Self::is_plain_relative(&bytes) {
            return Err(serde::de::Error::custom(format!(
                "path {:?} is not a plain relative path",
                String::from_utf8_lossy(&bytes)
            )));
        }
        Ok(Self(OsString::from_vec(bytes).into_vec()))
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_state_dir_registry_forgets_dirs_that_are_gone() {
        let dir = tempfile::tempdir().unwrap();
        let registry = dir.path().join("registry");
        let live: Vec<PathBuf> = (0..2).map(|i| dir.path().join(format!("live{i}"))).collect();
        let mut text = String::new();
        for i in 0..40 {
            text.push_str(&format!("{}/gone{i}\n", dir.path().display()));
        }
        for l in &live {
            fs::create_dir(l).unwrap();
            text.push_str(&format!("{}\n", l.display()));
        }
        fs::write(&registry, text).unwrap();
        let new = dir.path().join("new");
        fs::create_dir(&new).unwrap();
        register_state_dir(&registry, &new);
        let mut expected = live.clone();
        expected.push(new.clone());
        expected.sort();
        assert_eq!(known_state_dirs(&registry), expected);
        assert_eq!(fs::read_to_string(&registry).unwrap().lines().count(), 3, "dead entries were pruned");
        register_state_dir(&registry, &new);
        assert_eq!(fs::read_to_string(&registry).unwrap().lines().count(), 3, "listed once");
    }

    use super::*;
    use crate::records::{BundleRef, CompletionReceipt, ResultFixture};

    #[test]
    fn state_root_precedence() {
        let s = |v: &str| Some(OsString::from(v));
        assert_eq!(resolve_state_root(s("/p"), s("/x"), s("/h")), Some(PathBuf::from("/p")));
        assert_eq!(resolve_state_root(s(""), s("/x"), s("/h")), Some(PathBuf::from("/x/pvisor")));
        assert_eq!(resolve_state_root(None, None, s("/h")), Some(PathBuf::from("/h/.local/state/pvisor")));
        assert_eq!(resolve_state_root(None, None, None), None);
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn no_clobber_is_idempotent_and_refuses_a_different_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("completion.json");
        assert_eq!(commit_no_clobber(&path, b"r1").unwrap(), Commit::Written);
        assert_eq!(commit_no_clobber(&path, b"r1").unwrap(), Commit::AlreadyCommitted);
        assert!(matches!(commit_no_clobber(&path, b"r2"), Err(StoreError::Conflict { .. })));
        assert_eq!(fs::read(&path).unwrap(), b"r1");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "temp files left behind");
    }

    #[test]
    fn reads_are_capped_and_corruption_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("completion.json");
        fs::write(&path, b"{\"format\":1, truncated").unwrap();
        let err = read_record::<CompletionReceipt>(&path).unwrap_err();
        assert!(err.to_string().contains("completion.json is corrupt"), "{err}");
        fs::write(&path, vec![b' '; 100]).unwrap();
        assert!(matches!(read_capped(&path, 10), Err(StoreError::TooLarge { size: 100, .. })));
    }

    #[test]
    fn newer_formats_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("completion.json");
        let mut receipt = CompletionReceipt {
            format: FORMAT,
            job: JobId::generate(),
            run: RunId::generate(),
            attempt: AttemptId::new(RunId::generate(), 1),
            result: ResultFixture::completed(),
            bundle: BundleRef { file: "bundle.json".into(), size: 1, blake3: "00".into() },
        };
        receipt.format = FORMAT + 1;
        fs::write(&path, to_json_bytes(&receipt)).unwrap();
        let err = read_record::<CompletionReceipt>(&path).unwrap_err();
        assert!(matches!(err, StoreError::NewerFormat { found, .. } if found == FORMAT + 1));
    }

    #[test]
    fn appending_after_a_torn_line_cuts_it_off() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        fs::write(&path, b"{\"a\":1}\n{\"b\":").unwrap();
        append_line(&path, b"{\"c\":3}", false).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"{\"a\":1}\n{\"c\":3}\n");
        fs::write(&path, b"torn-only").unwrap();
        append_line(&path, b"x", false).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"x\n");
    }

    #[test]
    fn owner_lock_is_visible_to_readers_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("owner.lock");
        assert!(!OwnerLock::is_held(&path).unwrap());
        let lock = OwnerLock::acquire(&path).unwrap();
        assert!(OwnerLock::is_held(&path).unwrap());
        drop(lock);
        assert!(!OwnerLock::is_held(&path).unwrap());
    }

    #[test]
    fn rel_paths_keep_every_byte() {
        let odd = RelPath(b"dir/new\nline\xff".to_vec());
        let json = serde_json::to_string(&odd).unwrap();
        assert!(json.contains("hex"), "{json}");
        assert_eq!(serde_json::from_str::<RelPath>(&json).unwrap(), odd);
        assert_eq!(odd.display_escaped(), "dir/new\\nline\\xff");
        for bad in
            ["\"/etc/passwd\"", "\"../x\"", "\"a/../../x\"", "\"\"", "\"a//b\"", "{\"hex\": \"2e2e2f78\"}"]
        {
            assert!(serde_json::from_str::<RelPath>(bad).is_err(), "{bad}");
        }
        let plain = RelPath::new(Path::new("a/b.txt"));
        assert_eq!(serde_json::to_string(&plain).unwrap(), "\"a/b.txt\"");
    }
}
