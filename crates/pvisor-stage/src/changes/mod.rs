//! The change set: what an upper layer changes relative to its lower layer.
//!
//! `scan` walks the upper tree depth-first in byte order, compares each entry
//! with the same path in the lower tree and classifies it (see
//! [`ChangeKind`]). Entries that overlay copied up without changing them
//! (a directory traversed into, a file whose metadata only was touched with
//! identical contents and mode) are not changes and are left out.

use std::collections::HashMap;
use std::fs::{self, Metadata};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use pvisor_core::records::{ChangeEntry, ChangeKind, EntryType};
use pvisor_core::store::RelPath;

use crate::overlay;
use crate::StageError;

/// Above this many entries one `syncfs(2)` is cheaper than an fsync each.
const FSYNC_EACH_LIMIT: usize = 256;

/// Makes the staged entries durable before the Bundle that describes them is
/// written. A small stage of regular files and directories fsyncs each:
/// O(staged entries), and no other dirty data on the filesystem is flushed
/// with it. A large one (thousands of files from a build or an install),
/// one with an entry no `fsync` reaches (a symlink, a deletion's whiteout,
/// a fifo: their inodes are written by neither their own nor their
/// directory's `fsync` on a filesystem without a journal), or one the walk
/// cannot finish (a tree deeper than PATH_MAX, a directory the command made
/// unreadable), is flushed with a single `syncfs(2)`: the command can make
/// sealing slower, never impossible. This is the only sync the stage gets:
/// the workspace overlay is `volatile`.
pub fn seal(upper: &Path) -> Result<(), StageError> {
    let open = |path: &Path| {
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY | libc::O_NONBLOCK)
            .open(path)
    };
    let syncfs = || {
        let root = open(upper).map_err(|e| StageError::io("open", upper, e))?;
        rustix::fs::syncfs(&root).map_err(|e| StageError::io("sync", upper, e.into()))
    };
    let mut to_sync = Vec::new();
    let mut dirs = vec![upper.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&dir) else { return syncfs() };
        for entry in entries {
            let Ok(entry) = entry else { return syncfs() };
            let Ok(file_type) = entry.file_type() else { return syncfs() };
            if file_type.is_dir() {
                dirs.push(entry.path());
            } else if file_type.is_file() {
                to_sync.push(entry.path());
            } else {
                return syncfs();
            }
        }
        to_sync.push(dir);
        if to_sync.len() > FSYNC_EACH_LIMIT {
            return syncfs();
        }
    }
    for path in to_sync {
        match open(&path) {
            Ok(file) => file.sync_all().map_err(|e| StageError::io("sync", &path, e))?,
            // Unreadable or out of reach by path: one syncfs covers it.
            Err(_) => return syncfs(),
        }
    }
    Ok(())
}

/// The longest workspace-relative path the change manifest records, in
/// bytes: PATH_MAX. A command can build a tree as deep as it likes; the
/// records of a chain of directories grow with the square of its depth, so
/// what lies deeper is left out of the manifest (counted, and said in a
/// warning): it is never reviewed or applied, and goes with the stage.
pub const RECORDED_PATH_MAX: usize = libc::PATH_MAX as usize;

/// What [`scan_counted`] found.
#[derive(Debug, Default)]
pub struct Scanned {
    /// The changes, sorted by path.
    pub changes: Vec<ChangeEntry>,
    /// Staged entries (and host entries an opaque directory hides) whose
    /// path is longer than [`RECORDED_PATH_MAX`] (not in `changes`).
    pub beyond_limit: u64,
    /// The directories `changes` calls added that overlayfs had copied up
    /// from the lower layer: it held each when the run wrote into it, and
    /// no longer does (removed or renamed since). Sorted by path.
    pub copied_up: Vec<RelPath>,
}

/// Returns the changes in `upper` relative to `lower`, sorted by path.
pub fn scan(upper: &Path, lower: &Path) -> Result<Vec<ChangeEntry>, StageError> {
    scan_counted(upper, lower).map(|s| s.changes)
}

/// [`scan`], with the count of entries too deep to record.
///
/// The walk keeps its own stack (a command chose the tree's depth, which
/// must not become the supervisor's stack depth), holds one directory of
/// each layer open, climbing back with a checked `..`, and reaches entries
/// as `/proc/self/fd/<dir>/<name>`, so no path it uses is longer than a
/// name: a tree deeper than PATH_MAX is walked whole. A staged directory or
/// file the command made unreadable to its owner (`chmod 000`) is given the
/// owner's access back (pvisor must read it to seal, review and apply it);
/// the manifest records the mode the command left, which apply writes.
pub fn scan_counted(upper: &Path, lower: &Path) -> Result<Scanned, StageError> {
    let mut out = Scanned::default();
    let upper_dir = open_dir(upper).map_err(|e| StageError::io("list", upper, e))?;
    let lower_dir = match open_dir(lower) {
        Ok(dir) => Some(dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(StageError::io("list", lower, e)),
    };
    walk(upper_dir, lower_dir, &mut out, &mut HashMap::new())?;
    first_links_by_path(&mut out.changes);
    out.copied_up.sort();
    Ok(out)
}

/// Gives the owner search and read on a staged directory the command locked
/// (the manifest keeps the mode it set).
fn unlock_dir(path: &Path, mode: u32, rel: &Path) -> Result<(), StageError> {
    use std::os::unix::fs::PermissionsExt;
    if mode & 0o700 != 0o700 {
        fs::set_permissions(path, fs::Permissions::from_mode(mode | 0o700))
            .map_err(|e| StageError::io("unlock", rel, e))?;
    }
    Ok(())
}

/// Makes each link group name its least path (by bytes, the order apply
/// writes in) as the first, so the file exists before its links are made.
/// The walk meets names depth first, which is not that order (`a/x` comes
/// before `a-c` there).
fn first_links_by_path(out: &mut [ChangeEntry]) {
    let mut least: HashMap<RelPath, RelPath> = HashMap::new();
    for c in out.iter() {
        if let Some(first) = &c.hardlink_of {
            let slot = least.entry(first.clone()).or_insert_with(|| first.clone());
            if c.path < *slot {
                *slot = c.path.clone();
            }
        }
    }
    for c in out.iter_mut() {
        let group = c.hardlink_of.clone().unwrap_or_else(|| c.path.clone());
        if let Some(first) = least.get(&group) {
            c.hardlink_of = (c.path != *first).then(|| first.clone());
        }
    }
}

fn open_dir(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// `/proc/self/fd/<dir>/<name>`: a short path to an entry of an open directory.
fn at(dir: &fs::File, name: &std::ffi::OsStr) -> PathBuf {
    use std::os::fd::AsRawFd;
    Path::new("/proc/self/fd").join(dir.as_raw_fd().to_string()).join(name)
}

/// Runs `f` on an entry the owner may have made unreadable: on `EACCES`,
/// grants the owner `add` (read, and search for directories) and retries.
fn with_access<T>(path: &Path, mode: u32, add: u32, f: impl Fn() -> io::Result<T>) -> io::Result<T> {
    use std::os::unix::fs::PermissionsExt;
    match f() {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied && mode & add != add => {
            fs::set_permissions(path, fs::Permissions::from_mode(mode | add))?;
            f()
        }
        other => other,
    }
}
fn entry_type(meta: &Metadata) -> EntryType {
    let ft = meta.file_type();
    if ft.is_file() {
        EntryType::File
    } else if ft.is_dir() {
        EntryType::Dir
    } else if ft.is_symlink() {
        EntryType::Symlink
    } else {
        EntryType::Special
    }
}

fn lstat(path: &Path) -> Result<Option<Metadata>, StageError> {
    match fs::symlink_metadata(path) {
        Ok(m) => Ok(Some(m)),
        Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => Ok(None),
        Err(e) => Err(StageError::io("inspect", path, e)),
    }
}

/// The content digest of a regular file (holes are not read), opened without
/// following symlinks.
fn file_digest(path: &Path) -> io::Result<String> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(path)?;
    pvisor_core::digest::digest(&file)
}

fn link_digest(path: &Path) -> io::Result<(PathBuf, String)> {
    let target = fs::read_link(path)?;
    use std::os::unix::ffi::OsStrExt;
    let digest = blake3::hash(target.as_os_str().as_bytes()).to_hex().to_string();
    Ok((target, digest))
}

/// The sorted names of the directory open as `dir`.
fn list(dir: &fs::File, rel: &Path) -> Result<Vec<std::ffi::OsString>, StageError> {
    use std::os::unix::ffi::OsStrExt;
    let list_err = |e| StageError::io("list", rel, e);
    let mut names: Vec<_> = fs::read_dir(at(dir, std::ffi::OsStr::new(".")))
        .map_err(list_err)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(list_err)?;
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok(names)
}

/// Staged files with more than one name, by (device, inode).
type Links = HashMap<(u64, u64), Linked>;

/// The first name met of a staged inode with several.
#[derive(Clone)]
struct Linked {
    /// Its path, if it is a change (a name the manifest holds).
    path: Option<RelPath>,
    digest: String,
}

/// A directory being walked: where it is, and the names left to visit.
///
/// `hides_lower`: this directory, or an ancestor, is opaque (overlay shows
/// none of the lower directory's entries here), so every lower entry the
/// upper does not re-create is a deletion, named as one: review must show
/// each path that applying the directory removes. Entries the upper does
/// hold are compared with the lower as anywhere else, so a file copied back
/// unchanged is no change and an edited one is `modified`.
struct Dir {
    rel: PathBuf,
    hides_lower: bool,
    /// Below [`RECORDED_PATH_MAX`]: entries are counted, not classified
    /// (and `rel` stays the last recorded directory's, so the walk holds no
    /// path longer than the limit).
    beyond: bool,
    /// Names left, each with whether it is a lower entry the upper hides.
    names: std::vec::IntoIter<(std::ffi::OsString, bool)>,
    /// (device, inode) of this directory in each layer: the way back up
    /// (`..`) is checked against them.
    upper_id: (u64, u64),
    lower_id: Option<(u64, u64)>,
    /// This directory's lower handle, kept while a child that has no lower
    /// side is walked (there is no `..` to climb back to it from there).
    parked_lower: Option<fs::File>,
}

/// A subdirectory to walk next.
struct Descend {
    upper: fs::File,
    lower: Option<fs::File>,
    rel: PathBuf,
    hides_lower: bool,
    /// Past [`RECORDED_PATH_MAX`]: only counted.
    beyond: bool,
}

fn id_of(dir: &fs::File, rel: &Path) -> Result<(u64, u64), StageError> {
    let meta = dir.metadata().map_err(|e| StageError::io("inspect", rel, e))?;
    Ok((meta.dev(), meta.ino()))
}

impl Dir {
    fn open(
        upper: &fs::File,
        lower: Option<&fs::File>,
        rel: PathBuf,
        hides_lower: bool,
    ) -> Result<Self, StageError> {
        use std::os::unix::ffi::OsStrExt;
        let upper_names = list(upper, &rel)?;
        let mut names: Vec<_> = upper_names.iter().map(|n| (n.clone(), false)).collect();
        if let (true, Some(lower)) = (hides_lower, lower) {
            let upper_set: std::collections::HashSet<_> = upper_names.iter().collect();
            let hidden = list(lower, &rel)?.into_iter().filter(|n| !upper_set.contains(n));
            names.extend(hidden.map(|n| (n, true)));
            names.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        }
        Ok(Self {
            upper_id: id_of(upper, &rel)?,
            lower_id: lower.map(|l| id_of(l, &rel)).transpose()?,
            rel,
            hides_lower,
            beyond: false,
            names: names.into_iter(),
            parked_lower: None,
        })
    }
}

/// Opens the parent of the directory open as `child` and checks it is the
/// directory `id` the walk came down from: a directory moved meanwhile is
/// an error, never a walk of somewhere else.
fn climb(child: &fs::File, id: (u64, u64), rel: &Path) -> Result<fs::File, StageError> {
    let parent =
        open_dir(&at(child, std::ffi::OsStr::new(".."))).map_err(|e| StageError::io("list", rel, e))?;
    if id_of(&parent, rel)? != id {
        let moved = io::Error::other("the directory moved while it was being scanned");
        return Err(StageError::io("list", rel, moved));
    }
    Ok(parent)
}

/// Walks both layers depth first in byte order without recursion: a tree
/// 10,000 directories deep takes no stack and, climbing back through `..`
/// (checked), two descriptors at a time, not two per level.
fn walk(
    upper_root: fs::File,
    lower_root: Option<fs::File>,
    out: &mut Scanned,
    links: &mut Links,
) -> Result<(), StageError> {
    let (mut upper, mut lower) = (upper_root, lower_root);
    let mut stack = vec![Dir::open(&upper, lower.as_ref(), PathBuf::new(), false)?];
    while let Some(dir) = stack.last_mut() {
        match dir.names.next() {
            Some((name, hidden)) => {
                let next = if dir.beyond || dir.rel.as_os_str().len() + 1 + name.len() > RECORDED_PATH_MAX {
                    out.beyond_limit += 1;
                    count_only(&upper, dir, &name, hidden)?
                } else {
                    visit(&upper, lower.as_ref(), dir, &name, hidden, out, links)?
                };
                let Some(next) = next else { continue };
                let beyond = next.beyond;
                let mut child = Dir::open(&next.upper, next.lower.as_ref(), next.rel, next.hides_lower)?;
                child.beyond = beyond;
                if next.lower.is_none() {
                    dir.parked_lower = lower.take();
                }
                (upper, lower) = (next.upper, next.lower);
                stack.push(child);
            }
            None => {
                let done = stack.pop().expect("the loop holds a directory");
                let Some(parent) = stack.last_mut() else { break };
                let up = climb(&upper, parent.upper_id, &parent.rel)?;
                lower = match (&lower, parent.lower_id, done.lower_id) {
                    (Some(l), Some(id), Some(_)) => Some(climb(l, id, &parent.rel)?),
                    _ => parent.parked_lower.take(),
                };
                upper = up;
            }
        }
    }
    Ok(())
}

/// Past [`RECORDED_PATH_MAX`]: returns the staged subdirectory `name` of
/// `dir` to count the entries of (upper side only, its owner given access
/// back), if it is one.
fn count_only(
    upper_dir: &fs::File,
    dir: &Dir,
    name: &std::ffi::OsStr,
    hidden: bool,
) -> Result<Option<Descend>, StageError> {
    let here = at(upper_dir, name);
    let Some(meta) = lstat(&here).map_err(|e| rename_path(e, &dir.rel))? else { return Ok(None) };
    if hidden || !meta.is_dir() {
        return Ok(None);
    }
    unlock_dir(&here, meta.mode() & 0o7777, &dir.rel)?;
    let upper = open_dir(&here).map_err(|e| StageError::io("list", &dir.rel, e))?;
    let rel = dir.rel.clone();
    Ok(Some(Descend { upper, lower: None, rel, hides_lower: false, beyond: true }))
}

/// Classifies the entry `name` of `dir` (open as `upper_dir` and
/// `lower_dir`); returns the subdirectory to walk, if it is one.
#[allow(clippy::too_many_arguments)]
fn visit(
    upper_dir: &fs::File,
    lower_dir: Option<&fs::File>,
    dir: &Dir,
    name: &std::ffi::OsStr,
    hidden: bool,
    out: &mut Scanned,
    links: &mut Links,
) -> Result<Option<Descend>, StageError> {
    let rel = dir.rel.join(name);
    if hidden {
        out.changes.push(deleted(&rel));
        return Ok(None);
    }
    let upper = at(upper_dir, name);
    let lower_path = lower_dir.map(|d| at(d, name));
    let hides_lower = dir.hides_lower;
    let Some(meta) = lstat(&upper).map_err(|e| rename_path(e, &rel))? else { return Ok(None) };
    let lower = match &lower_path {
        Some(p) => lstat(p).map_err(|e| rename_path(e, &rel))?,
        None => None,
    };
    let lower_type = lower.as_ref().map(entry_type);
    let mode = meta.mode() & 0o7777;
    let before = out.changes.len();
    let mut push = |kind, entry, size, digest| {
        out.changes.push(ChangeEntry {
            path: RelPath::new(&rel),
            kind,
            entry,
            size,
            mode,
            blake3: digest,
            hardlink_of: None,
        })
    };

    if overlay::is_whiteout(&upper, &meta) {
        if lower.is_some() {
            push(ChangeKind::Deleted, EntryType::None, 0, None);
        }
        return Ok(None);
    }
    let this = entry_type(&meta);
    let mode_differs = lower.as_ref().is_some_and(|l| l.mode() & 0o7777 != mode);
    match this {
        EntryType::Dir => {
            let opaque = overlay::is_opaque(&upper);
            match lower_type {
                None => {
                    push(ChangeKind::Added, EntryType::Dir, 0, None);
                    if overlay::is_copied_up(&upper) {
                        out.copied_up.push(RelPath::new(&rel));
                    }
                }
                Some(EntryType::Dir) if opaque => push(ChangeKind::OpaqueDir, EntryType::Dir, 0, None),
                Some(EntryType::Dir) if mode_differs => {
                    push(ChangeKind::ModeChanged, EntryType::Dir, 0, None)
                }
                Some(EntryType::Dir) => {}
                Some(_) => push(ChangeKind::TypeChanged, EntryType::Dir, 0, None),
            }
            let lower_dir = lower_path.as_deref().filter(|_| lower_type == Some(EntryType::Dir));
            return descend(&upper, lower_dir, mode, rel, hides_lower || opaque).map(Some);
        }
        EntryType::File => {
            // A file with several names is hashed once: 200 links of a
            // 50 MiB file are 50 MiB to read, not 10 GB.
            let inode = (meta.nlink() > 1).then(|| (meta.dev(), meta.ino()));
            let known = inode.and_then(|i| links.get(&i)).cloned();
            let digest = match &known {
                Some(first) => first.digest.clone(),
                None => with_access(&upper, mode, 0o400, || file_digest(&upper))
                    .map_err(|e| StageError::io("read", &rel, e))?,
            };
            let kept = digest.clone();
            let size = meta.len();
            match (lower_type, &lower, &lower_path) {
                (None, _, _) => push(ChangeKind::Added, EntryType::File, size, Some(digest)),
                (Some(EntryType::File), Some(l), Some(lp)) => {
                    let same = l.len() == size
                        && file_digest(lp).map_err(|e| StageError::io("read", &rel, e))? == digest;
                    if !same {
                        push(ChangeKind::Modified, EntryType::File, size, Some(digest));
                    } else if mode_differs {
                        push(ChangeKind::ModeChanged, EntryType::File, size, Some(digest));
                    }
                }
                (Some(_), _, _) => push(ChangeKind::TypeChanged, EntryType::File, size, Some(digest)),
            }
            note_link(&mut out.changes, before, known, inode, &rel, kept, links);
        }
        EntryType::Symlink => {
            let (target, digest) = link_digest(&upper).map_err(|e| StageError::io("read link", &rel, e))?;
            let size = target.as_os_str().len() as u64;
            match (lower_type, &lower_path) {
                (None, _) => push(ChangeKind::Added, EntryType::Symlink, size, Some(digest)),
                (Some(EntryType::Symlink), Some(lp)) => {
                    if fs::read_link(lp).ok().as_deref() != Some(target.as_path()) {
                        push(ChangeKind::Symlink, EntryType::Symlink, size, Some(digest));
                    }
                }
                (Some(_), _) => push(ChangeKind::TypeChanged, EntryType::Symlink, size, Some(digest)),
            }
        }
        EntryType::Special | EntryType::None => match lower_type {
            None => push(ChangeKind::Added, EntryType::Special, 0, None),
            Some(_) => push(ChangeKind::TypeChanged, EntryType::Special, 0, None),
        },
    }
    Ok(None)
}

/// The deletion of `rel`, which a whiteout or an opaque directory hides.
fn deleted(rel: &Path) -> ChangeEntry {
    ChangeEntry {
        path: RelPath::new(rel),
        kind: ChangeKind::Deleted,
        entry: EntryType::None,
        size: 0,
        mode: 0,
        blake3: None,
        hardlink_of: None,
    }
}

/// Opens the staged directory at `upper` (and its lower namesake, if a
/// directory) to be walked.
fn descend(
    upper: &Path,
    lower: Option<&Path>,
    mode: u32,
    rel: PathBuf,
    hides_lower: bool,
) -> Result<Descend, StageError> {
    // A directory the command made unsearchable to its owner is opened
    // back up (the manifest keeps the mode it set).
    unlock_dir(upper, mode, &rel)?;
    let child = open_dir(upper).map_err(|e| StageError::io("list", &rel, e))?;
    let lower_child = match lower {
        Some(p) => Some(open_dir(p).map_err(|e| StageError::io("list", &rel, e))?),
        None => None,
    };
    Ok(Descend { upper: child, lower: lower_child, rel, hides_lower, beyond: false })
}

/// Keeps track of a file with several names: a later name of a changed
/// inode is marked a hard link of the first; the first name met of an
/// inode is remembered (with its digest, so it is hashed once).
fn note_link(
    out: &mut [ChangeEntry],
    before: usize,
    known: Option<Linked>,
    inode: Option<(u64, u64)>,
    rel: &Path,
    digest: String,
    links: &mut Links,
) {
    let pushed = out.len() > before;
    match (known, inode) {
        (Some(Linked { path: Some(first), .. }), _) if pushed => {
            if let Some(last) = out.last_mut() {
                last.hardlink_of = Some(first);
            }
        }
        (None, Some(inode)) => {
            let path = pushed.then(|| RelPath::new(rel));
            links.insert(inode, Linked { path, digest });
        }
        _ => {}
    }
}

/// Names the workspace-relative path in an error about a `/proc/self/fd` path.
fn rename_path(e: StageError, rel: &Path) -> StageError {
    match e {
        StageError::Io { op, source, .. } => StageError::Io { op, path: rel.to_owned(), source },
        other => other,
    }
}

#[cfg(test)]
mod tests;
