//! The change set: what an upper layer changes relative to its lower layer.
//!
//! `scan` walks the upper tree depth-first in byte order, compares each entry
//! with the same path in the lower tree and classifies it (see
//! [`ChangeKind`]). Entries that overlay copied up without changing them
//! (a directory traversed into, a file whose metadata only was touched with
//! identical contents and mode) are not changes and are left out.

use std::fs::{self, Metadata};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use pvisor_core::records::{ChangeEntry, ChangeKind, EntryType};
use pvisor_core::store::RelPath;
use pvisor_core::tree::DirCursor;

use crate::overlay;
use crate::StageError;

/// Above this many entries one `syncfs(2)` is cheaper than an fsync each.
const FSYNC_EACH_LIMIT: usize = 256;

/// Makes the staged files durable before the Bundle that describes them is
/// written. A small stage fsyncs each file and directory: O(staged entries),
/// and no other dirty data on the filesystem is flushed with it. A large one
/// (thousands of files from a build or an install), or one the walk cannot
/// finish (a tree deeper than PATH_MAX, a directory the command made
/// unreadable), is flushed with a single `syncfs(2)`: the command can make
/// sealing slower, never impossible.
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
    /// Staged entries whose path is longer than [`RECORDED_PATH_MAX`] (not
    /// in `changes`).
    pub beyond_limit: u64,
}

/// Returns the changes in `upper` relative to `lower`, sorted by path.
pub fn scan(upper: &Path, lower: &Path) -> Result<Vec<ChangeEntry>, StageError> {
    scan_counted(upper, lower).map(|s| s.changes)
}

/// One directory of the walk: its names still to visit (reversed, so the
/// next is last) and whether the lower layer has the same directory open
/// beside it (not hidden by an opaque or type-changed ancestor).
struct Level {
    rel: PathBuf,
    names: Vec<std::ffi::OsString>,
    has_lower: bool,
    /// Below [`RECORDED_PATH_MAX`]: entries are counted, not classified.
    beyond: bool,
}

/// [`scan`], with the count of entries too deep to record.
///
/// The walk keeps its own stack (a command chose the tree's depth, which
/// must not become the supervisor's stack depth) and holds one directory of
/// each layer open, climbing back with a checked `..` (see
/// `pvisor_core::tree`); entries are reached as `/proc/self/fd/<dir>/<name>`,
/// so no path it uses is longer than a name. A staged directory or file
/// the command made unreadable to its owner (`chmod 000`) is given the
/// owner's access back (pvisor must read it to seal, review and apply it);
/// the manifest records the mode the command left, which apply writes.
pub fn scan_counted(upper: &Path, lower: &Path) -> Result<Scanned, StageError> {
    let mut out = Scanned::default();
    let mut upper_dir = DirCursor::open(upper).map_err(|e| StageError::io("list", upper, e))?;
    let mut lower_dir = match DirCursor::open(lower) {
        Ok(dir) => Some(dir),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
        Err(e) => return Err(StageError::io("list", lower, e)),
    };
    let list = |dir: &DirCursor, rel: &Path| {
        let mut names = dir.names().map_err(|e| StageError::io("list", rel, e))?;
        names.reverse();
        Ok::<_, StageError>(names)
    };
    let names = list(&upper_dir, upper)?;
    let mut stack = vec![Level { rel: PathBuf::new(), names, has_lower: lower_dir.is_some(), beyond: false }];
    while let Some(level) = stack.last_mut() {
        let Some(name) = level.names.pop() else {
            let done = stack.pop().expect("the stack is not empty");
            if stack.is_empty() {
                break;
            }
            upper_dir.ascend().map_err(|e| StageError::io("list", &done.rel, e))?;
            if let (true, Some(lower)) = (done.has_lower, lower_dir.as_mut()) {
                lower.ascend().map_err(|e| StageError::io("list", &done.rel, e))?;
            }
            continue;
        };
        if level.beyond || level.rel.as_os_str().len() + 1 + name.len() > RECORDED_PATH_MAX {
            out.beyond_limit += 1;
            let here = upper_dir.entry_path(&name);
            if let Some(true) = lstat(&here)?.map(|m| m.is_dir()) {
                unlock_dir(&here, &level.rel)?;
                upper_dir.descend(&name).map_err(|e| StageError::io("list", &level.rel, e))?;
                let (rel, names) = (level.rel.clone(), list(&upper_dir, &level.rel)?);
                stack.push(Level { rel, names, has_lower: false, beyond: true });
            }
            continue;
        }
        let rel = level.rel.join(&name);
        let lower_here = lower_dir.as_ref().filter(|_| level.has_lower);
        let Some(has_lower) = classify(&upper_dir, lower_here, &name, &rel, &mut out.changes)? else {
            continue;
        };
        upper_dir.descend(&name).map_err(|e| StageError::io("list", &rel, e))?;
        if let (true, Some(lower)) = (has_lower, lower_dir.as_mut()) {
            lower.descend(&name).map_err(|e| StageError::io("list", &rel, e))?;
        }
        let names = list(&upper_dir, &rel)?;
        stack.push(Level { rel, names, has_lower, beyond: false });
    }
    Ok(out)
}

/// Gives the owner search and read on a staged directory the command locked
/// (the manifest keeps the mode it set).
fn unlock_dir(path: &Path, rel: &Path) -> Result<(), StageError> {
    use std::os::unix::fs::PermissionsExt;
    let Some(meta) = lstat(path)? else { return Ok(()) };
    let mode = meta.mode() & 0o7777;
    if mode & 0o700 != 0o700 {
        fs::set_permissions(path, fs::Permissions::from_mode(mode | 0o700))
            .map_err(|e| StageError::io("unlock", rel, e))?;
    }
    Ok(())
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

/// Classifies the entry `name` of the open directories `upper_dir` and (if
/// not hidden) `lower_dir`, both at `rel`'s parent, pushing its change if it
/// is one. For a directory to walk into, returns whether the lower layer
/// has it too (`Some(has_lower)`), having given its owner access back.
fn classify(
    upper_dir: &DirCursor,
    lower_dir: Option<&DirCursor>,
    name: &std::ffi::OsStr,
    rel: &Path,
    out: &mut Vec<ChangeEntry>,
) -> Result<Option<bool>, StageError> {
    {
        let upper = upper_dir.entry_path(name);
        let lower_path = lower_dir.map(|d| d.entry_path(name));
        let Some(meta) = lstat(&upper).map_err(|e| rename_path(e, rel))? else { return Ok(None) };
        let lower = match &lower_path {
            Some(p) => lstat(p).map_err(|e| rename_path(e, rel))?,
            None => None,
        };
        let lower_type = lower.as_ref().map(entry_type);
        let mode = meta.mode() & 0o7777;
        let mut push = |kind, entry, size, digest| {
            out.push(ChangeEntry { path: RelPath::new(rel), kind, entry, size, mode, blake3: digest })
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
                    None => push(ChangeKind::Added, EntryType::Dir, 0, None),
                    Some(EntryType::Dir) if opaque => push(ChangeKind::OpaqueDir, EntryType::Dir, 0, None),
                    Some(EntryType::Dir) if mode_differs => {
                        push(ChangeKind::ModeChanged, EntryType::Dir, 0, None)
                    }
                    Some(EntryType::Dir) => {}
                    Some(_) => push(ChangeKind::TypeChanged, EntryType::Dir, 0, None),
                }
                // A directory the command made unsearchable to its owner is
                // opened back up (the manifest keeps the mode it set).
                unlock_dir(&upper, rel)?;
                return Ok(Some(!opaque && lower_type == Some(EntryType::Dir)));
            }
            EntryType::File => {
                let digest = with_access(&upper, mode, 0o400, || file_digest(&upper))
                    .map_err(|e| StageError::io("read", rel, e))?;
                let size = meta.len();
                match (lower_type, &lower, &lower_path) {
                    (None, _, _) => push(ChangeKind::Added, EntryType::File, size, Some(digest)),
                    (Some(EntryType::File), Some(l), Some(lp)) => {
                        let same = l.len() == size
                            && file_digest(lp).map_err(|e| StageError::io("read", rel, e))? == digest;
                        if !same {
                            push(ChangeKind::Modified, EntryType::File, size, Some(digest));
                        } else if mode_differs {
                            push(ChangeKind::ModeChanged, EntryType::File, size, Some(digest));
                        }
                    }
                    (Some(_), _, _) => push(ChangeKind::TypeChanged, EntryType::File, size, Some(digest)),
                }
            }
            EntryType::Symlink => {
                let (target, digest) =
                    link_digest(&upper).map_err(|e| StageError::io("read link", rel, e))?;
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
    }
    Ok(None)
}

/// Names the workspace-relative path in an error about a `/proc/self/fd` path.
fn rename_path(e: StageError, rel: &Path) -> StageError {
    match e {
        StageError::Io { op, source, .. } => StageError::Io { op, path: rel.to_owned(), source },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn kinds(changes: &[ChangeEntry]) -> Vec<(String, &'static str)> {
        changes.iter().map(|c| (c.path.display_escaped(), c.kind.as_str())).collect()
    }

    fn mknod_whiteout(path: &Path) -> bool {
        crate::overlay::make_whiteout(path).is_ok()
    }

    #[test]
    fn classifies_plain_changes_against_the_lower_layer() {
        let lower = tempfile::tempdir().unwrap();
        let upper = tempfile::tempdir().unwrap();
        let (l, u) = (lower.path(), upper.path());
        fs::write(l.join("tracked"), "a\n").unwrap();
        fs::write(l.join("same"), "same\n").unwrap();
        fs::write(l.join("chmod"), "x").unwrap();
        fs::create_dir(l.join("dir")).unwrap();
        fs::write(l.join("was-file"), "f").unwrap();
        symlink("old", l.join("link")).unwrap();

        fs::write(u.join("tracked"), "a\nb\n").unwrap();
        fs::write(u.join("same"), "same\n").unwrap();
        fs::write(u.join("chmod"), "x").unwrap();
        fs::set_permissions(u.join("chmod"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(l.join("chmod"), fs::Permissions::from_mode(0o644)).unwrap();
        fs::create_dir(u.join("dir")).unwrap();
        fs::write(u.join("dir/new"), "n").unwrap();
        fs::create_dir(u.join("was-file")).unwrap();
        symlink("new", u.join("link")).unwrap();

        let changes = scan(u, l).unwrap();
        assert_eq!(
            kinds(&changes),
            vec![
                ("chmod".into(), "mode-changed"),
                ("dir/new".into(), "added"),
                ("link".into(), "symlink"),
                ("tracked".into(), "modified"),
                ("was-file".into(), "type-changed"),
            ]
        );
        let tracked = changes.iter().find(|c| c.path.as_path() == Path::new("tracked")).unwrap();
        assert_eq!(tracked.size, 4);
        assert_eq!(tracked.blake3.as_deref(), Some(blake3::hash(b"a\nb\n").to_hex().as_str()));
    }

    #[test]
    fn whiteouts_are_deletions_only_when_the_lower_path_exists() {
        let lower = tempfile::tempdir().unwrap();
        let upper = tempfile::tempdir().unwrap();
        fs::write(lower.path().join("gone"), "x").unwrap();
        if !mknod_whiteout(&upper.path().join("gone")) {
            eprintln!("skipped: creating a whiteout needs CAP_MKNOD");
            return;
        }
        assert!(mknod_whiteout(&upper.path().join("never-existed")));
        assert_eq!(kinds(&scan(upper.path(), lower.path()).unwrap()), vec![("gone".into(), "deleted")]);
    }

    #[test]
    fn a_tree_deeper_than_the_stack_and_path_max_is_scanned_and_what_is_too_deep_counted() {
        let lower = tempfile::tempdir().unwrap();
        let upper = tempfile::tempdir().unwrap();
        let mut cursor = DirCursor::open(upper.path()).unwrap();
        let depth = 3_000;
        for _ in 0..depth {
            let dir = std::fs::File::open(cursor.entry_path(std::ffi::OsStr::new("."))).unwrap();
            rustix::fs::mkdirat(&dir, "d", rustix::fs::Mode::from_raw_mode(0o700)).unwrap();
            fs::write(cursor.entry_path(std::ffi::OsStr::new("f")), "x").unwrap();
            cursor.descend(std::ffi::OsStr::new("d")).unwrap();
        }
        let scanned = scan_counted(upper.path(), lower.path()).unwrap();
        // "d/" per level: every path up to PATH_MAX is recorded, the rest counted.
        let recorded = scanned.changes.len() as u64;
        assert_eq!(recorded + scanned.beyond_limit, 2 * depth as u64);
        assert!(scanned.beyond_limit > 0 && recorded > 2_000, "{recorded} {}", scanned.beyond_limit);
        assert!(scanned.changes.iter().all(|c| c.path.as_path().as_os_str().len() <= RECORDED_PATH_MAX));
    }

    #[test]
    fn symlinks_in_the_stage_are_never_followed() {
        let lower = tempfile::tempdir().unwrap();
        let upper = tempfile::tempdir().unwrap();
        symlink("/etc/shadow", upper.path().join("evil")).unwrap();
        let changes = scan(upper.path(), lower.path()).unwrap();
        assert_eq!(changes[0].entry, EntryType::Symlink);
        assert_eq!(changes[0].size, "/etc/shadow".len() as u64);
    }
}
