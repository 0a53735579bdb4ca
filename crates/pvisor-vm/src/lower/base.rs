//! The published base image of one workspace: its files in the cache
//! directory, the lock that orders builders and readers, how a base is
//! built and published, how it is checked before use, and what `pvisor gc`
//! may remove.
//!
//! Layout of `<state>/vm-lowers/<blake3 of the canonical workspace path>/`:
//! `lock` (flock: shared while a start reads the cache, exclusive while one
//! builds; its mtime is the last use), `current.json` (the [`BaseManifest`],
//! the commit point), `base-<id>.img` and `base-<id>.index` (immutable once
//! published), and `tmp-*` (a build in progress, or one a SIGKILL cut
//! short: never read, removed by the next builder).
//!
//! A base is replaced by publishing a new one and unlinking the old files:
//! running VMs and checkpoints hard-linked the old image, so they keep it.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use rustix::fs::FlockOperation;
use serde::{Deserialize, Serialize};

use super::index::{self, Entry, Kind};
use crate::disk;

/// Where the caches live under the state directory.
pub const LOWERS_DIR: &str = "vm-lowers";
const MANIFEST: &str = "current.json";
const LOCK: &str = "lock";
const FORMAT: u32 = 1;
/// How close to a build's start an entry's mtime or ctime may be and still
/// count as unchanged: timestamps come from a coarse clock, and some
/// filesystems keep whole (or even two) seconds.
pub(crate) const RACY_MARGIN_NS: i64 = 2_000_000_000;

/// `current.json`: which base is published, and how to check it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct BaseManifest {
    pub format: u32,
    pub id: String,
    pub workspace: PathBuf,
    /// When the walk the index came from started (host clock, ns since the epoch).
    pub build_start_ns: i64,
    /// Index entries stamped at or after this may have changed unseen.
    pub clean_before_ns: i64,
    pub entries: u64,
    /// Bytes of the regular files in the image.
    pub file_bytes: u64,
    pub built_ms: u64,
    pub image: Stamp,
    pub index_blake3: String,
}

/// The published image file as it was right after publication: it is
/// never opened for writing again, so any difference means it was damaged
/// or replaced, and the cache is rebuilt rather than trusted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Stamp {
    pub len: u64,
    pub blocks: u64,
    pub mtime_ns: i64,
    pub ino: u64,
}

impl Stamp {
    fn of(path: &Path) -> io::Result<Self> {
        let m = fs::metadata(path)?;
        Ok(Self {
            len: m.len(),
            blocks: m.blocks(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            ino: m.ino(),
        })
    }
}

/// The cache directory of the workspace at the canonical path `workspace`.
pub(crate) fn cache_dir(state_root: &Path, workspace: &Path) -> PathBuf {
    let key = pvisor_core::store::blake3_hex(workspace.as_os_str().as_bytes());
    state_root.join(LOWERS_DIR).join(&key[..32])
}

pub(crate) fn image_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("base-{id}.img"))
}

fn index_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("base-{id}.index"))
}

/// Why the published base of a workspace cannot be used (a new one is built).
#[derive(Debug, thiserror::Error)]
pub(crate) enum BaseError {
    #[error("no base image of this workspace yet")]
    Missing,
    #[error("the base manifest is unreadable: {0}")]
    Unreadable(#[source] pvisor_core::store::StoreError),
    #[error("the base manifest {} is corrupt: {source}", path.display())]
    Corrupt { path: PathBuf, source: serde_json::Error },
    #[error("the base manifest {} is of another format or workspace", .0.display())]
    Other(PathBuf),
    #[error("the base image {} changed after it was published", .0.display())]
    Changed(PathBuf),
    #[error("the base image {}: {source}", path.display())]
    Image { path: PathBuf, source: io::Error },
    #[error("the base index: {0}")]
    Index(#[source] io::Error),
    #[error("the base index does not match its manifest's digest")]
    IndexDigest,
    /// The index does not decode.
    #[error("{0}")]
    Decode(#[source] io::Error),
}

/// The published base of `dir` and its index, checked; `Err` says why it cannot be used.
pub(crate) fn load(dir: &Path, workspace: &Path) -> Result<(BaseManifest, Vec<Entry>), BaseError> {
    let path = dir.join(MANIFEST);
    let bytes = match pvisor_core::store::read_capped(&path, 1 << 20) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Err(BaseError::Missing),
        Err(e) => return Err(BaseError::Unreadable(e)),
    };
    let manifest: BaseManifest = match serde_json::from_slice(&bytes) {
        Ok(manifest) => manifest,
        Err(source) => return Err(BaseError::Corrupt { path, source }),
    };
    if manifest.format != FORMAT || manifest.workspace != workspace {
        return Err(BaseError::Other(path));
    }
    let image = image_path(dir, &manifest.id);
    match Stamp::of(&image) {
        Ok(stamp) if stamp == manifest.image => {}
        Ok(_) => return Err(BaseError::Changed(image)),
        Err(source) => return Err(BaseError::Image { path: image, source }),
    }
    let raw = fs::read(index_path(dir, &manifest.id)).map_err(BaseError::Index)?;
    if pvisor_core::store::blake3_hex(&raw) != manifest.index_blake3 {
        return Err(BaseError::IndexDigest);
    }
    let index = index::decode(&raw).map_err(BaseError::Decode)?;
    Ok((manifest, index))
}

/// Room an image of these entries needs.
pub(crate) fn footprint(entries: &[Entry]) -> disk::Footprint {
    let bytes = entries
        .iter()
        .map(|e| match e.kind {
            Kind::File => e.size.div_ceil(4096) * 4096,
            // Short targets live in the inode; longer ones take a block.
            Kind::Symlink if e.target.as_ref().is_some_and(|t| t.len() < 60) => 0,
            _ => 4096,
        })
        .sum();
    disk::Footprint { bytes, inodes: entries.len() as u64 }
}

pub(crate) fn now_ns() -> i64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

/// Builds a new base of `workspace` in `dir` and publishes it (call with the
/// lock held exclusively): image → fsync → rename, index, then the manifest.
pub(crate) fn build(dir: &Path, workspace: &Path) -> io::Result<BaseManifest> {
    let started = Instant::now();
    // Nobody else writes here while we hold the lock: what is left is a
    // build that was killed, or a base no longer current.
    let current =
        fs::read(dir.join(MANIFEST)).ok().and_then(|b| serde_json::from_slice::<BaseManifest>(&b).ok());
    for entry in fs::read_dir(dir)?.flatten() {
        let name = entry.file_name();
        if name.as_bytes().starts_with(b"tmp-") {
            let _ = fs::remove_file(entry.path());
        }
    }
    // The clock is read before the walk: anything that changes from here on
    // is stamped at or after it (less the coarse clock's lag, which the
    // margin covers), so it counts as changed against this base.
    let mut build_start_ns = now_ns();
    let mut entries = index::walk(workspace)?;
    if let Some(wait) = racy_wait(&entries, build_start_ns) {
        // Written in the last seconds (a fresh clone, an unpacked archive):
        // a base built now would trust none of it, and every start would
        // copy it all again into its delta. Waiting out the margin is cheaper.
        tracing::info!(
            wait_ms = wait.as_millis() as u64,
            "the workspace was just written; waiting out the racy margin"
        );
        std::thread::sleep(wait);
        build_start_ns = now_ns();
        entries = index::walk(workspace)?;
    }
    let id = format!("{:016x}", u64::from_le_bytes(pvisor_core::random::bytes::<8>()?));
    let tmp = dir.join(format!("tmp-{id}.img"));
    let root = (entries[0].uid, entries[0].gid);
    let built =
        disk::image_tree(workspace, &tmp, footprint(&entries), root, disk::LOWER_DISK_BYTES, "workspace")
            .and_then(|()| File::open(&tmp)?.sync_all());
    if let Err(e) = built {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    let image = image_path(dir, &id);
    fs::rename(&tmp, &image)?;
    let raw = index::encode(&entries);
    let store_err = |e: pvisor_core::store::StoreError| io::Error::other(e.to_string());
    pvisor_core::store::write_atomic(&index_path(dir, &id), &raw).map_err(store_err)?;
    let manifest = BaseManifest {
        format: FORMAT,
        id: id.clone(),
        workspace: workspace.to_owned(),
        build_start_ns,
        clean_before_ns: build_start_ns - RACY_MARGIN_NS,
        entries: entries.len() as u64,
        file_bytes: entries.iter().filter(|e| e.kind == Kind::File).map(|e| e.size).sum(),
        built_ms: started.elapsed().as_millis() as u64,
        image: Stamp::of(&image)?,
        index_blake3: pvisor_core::store::blake3_hex(&raw),
    };
    pvisor_core::store::write_atomic(&dir.join(MANIFEST), &pvisor_core::store::to_json_bytes(&manifest))
        .map_err(store_err)?;
    if let Some(old) = current.filter(|m| m.id != id) {
        let _ = fs::remove_file(image_path(dir, &old.id));
        let _ = fs::remove_file(index_path(dir, &old.id));
    }
    Ok(manifest)
}

/// Racy entries below this many bytes are cheaper to copy into a delta than
/// to wait for (the rebase thresholds apply too: see [`super::rebase_reason`]).
const RACY_WAIT_BYTES: u64 = 64 << 20;

/// How long to wait before building, if so much of the workspace would be
/// racy against a base built at `start_ns` that its delta would be over the
/// rebase thresholds and large: until the newest stamp is past the margin.
fn racy_wait(entries: &[Entry], start_ns: i64) -> Option<std::time::Duration> {
    let racy: Vec<&Entry> = entries.iter().filter(|e| e.racy(start_ns - RACY_MARGIN_NS)).collect();
    let bytes: u64 = racy.iter().filter(|e| e.kind == Kind::File).map(|e| e.size).sum();
    let total: u64 = entries.iter().filter(|e| e.kind == Kind::File).map(|e| e.size).sum();
    let large = bytes > RACY_WAIT_BYTES || racy.len() > super::REBASE_ENTRIES;
    super::rebase_reason(racy.len(), bytes, total).filter(|_| large)?;
    let newest = racy.iter().map(|e| e.mtime_ns.max(e.ctime_ns)).max()?;
    let until = (newest + RACY_MARGIN_NS + 10_000_000 - start_ns).clamp(0, RACY_MARGIN_NS + 10_000_000);
    Some(std::time::Duration::from_nanos(until as u64))
}

/// The cache's `flock`, shared or exclusive.
#[derive(Debug)]
pub(crate) struct CacheLock {
    file: File,
}

impl CacheLock {
    /// Takes the lock of `dir` (creating both), waiting for a holder.
    pub(crate) fn take(dir: &Path, exclusive: bool) -> io::Result<Self> {
        let op = if exclusive { FlockOperation::LockExclusive } else { FlockOperation::LockShared };
        loop {
            fs::create_dir_all(dir)?;
            let path = dir.join(LOCK);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&path)?;
            loop {
                match rustix::fs::flock(&file, op) {
                    Ok(()) => break,
                    Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            // gc retires a cache by renaming it while holding the lock: a
            // lock on a file that is no longer at `path` guards nothing.
            let held = file.metadata()?;
            match fs::metadata(&path) {
                Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => return Ok(Self { file }),
                _ => continue,
            }
        }
    }

    fn try_exclusive(dir: &Path) -> io::Result<Option<Self>> {
        let file = OpenOptions::new().read(true).write(true).open(dir.join(LOCK))?;
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(Self { file })),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Records a use (the lock file's mtime), which `gc` ages caches by.
    pub(crate) fn touch(&self) {
        let now = rustix::fs::Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_NOW };
        let _ = rustix::fs::futimens(
            &self.file,
            &rustix::fs::Timestamps { last_access: now, last_modification: now },
        );
    }
}

/// One workspace's lower cache, as `pvisor gc` sees it.
#[derive(Debug)]
pub struct LowerCache {
    pub dir: PathBuf,
    /// The workspace it images (`None` if its manifest is unreadable).
    pub workspace: Option<PathBuf>,
    /// When a vm Job last started from it.
    pub last_used: Option<SystemTime>,
}

/// The lower caches under `state_root`, and the leftovers of a `gc` that was
/// killed while removing one (`retired`: nothing uses them).
pub fn lower_caches(state_root: &Path) -> (Vec<LowerCache>, Vec<PathBuf>) {
    let (mut caches, mut retired) = (Vec::new(), Vec::new());
    for entry in fs::read_dir(state_root.join(LOWERS_DIR)).into_iter().flatten().flatten() {
        let dir = entry.path();
        if entry.file_name().as_bytes().starts_with(b".retired-") {
            retired.push(dir);
            continue;
        }
        let workspace = fs::read(dir.join(MANIFEST))
            .ok()
            .and_then(|b| serde_json::from_slice::<BaseManifest>(&b).ok())
            .map(|m| m.workspace);
        let last_used = fs::metadata(dir.join(LOCK)).and_then(|m| m.modified()).ok();
        caches.push(LowerCache { dir, workspace, last_used });
    }
    (caches, retired)
}

impl LowerCache {
    /// Takes the cache away from future starts, if no start holds it now:
    /// renamed aside under its exclusive lock, the path returned is the
    /// caller's to delete. `Ok(None)`: a vm Job is starting from it.
    /// Running VMs and checkpoints hard-linked their base, so they keep it.
    pub fn retire(&self) -> io::Result<Option<PathBuf>> {
        let Some(_lock) = CacheLock::try_exclusive(&self.dir)? else { return Ok(None) };
        let name = format!(".retired-{:016x}", u64::from_le_bytes(pvisor_core::random::bytes::<8>()?));
        let aside = self.dir.with_file_name(name);
        fs::rename(&self.dir, &aside)?;
        Ok(Some(aside))
    }
}
