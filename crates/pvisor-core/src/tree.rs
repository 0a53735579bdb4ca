//! Walks over directory trees pvisor does not trust: staged files, checkpoints,
//! caches — anything a sandboxed command could have shaped.
//!
//! A command decides how deep such a tree is. So no walk here recurses (the
//! depth would become the supervisor's stack depth) and none holds a
//! descriptor per level (the depth would become its descriptor count) or
//! builds a full path (the depth would pass PATH_MAX). A [`DirCursor`] holds
//! one directory open, steps into a child by name with `openat` and climbs
//! back with `..`, checking that `..` is the directory it came from; the
//! callers keep their own explicit stack of what is left to visit.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, CWD};
use rustix::io::Errno;

/// One open directory of a walk, and the identities (device, inode) of the
/// directories from the walk's root down to it.
#[derive(Debug)]
pub struct DirCursor {
    dir: OwnedFd,
    trail: Vec<(u64, u64)>,
}

fn open_dir(at: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(rustix::fs::openat(at, name, flags, Mode::empty())?)
}

fn identity(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

impl DirCursor {
    /// Opens the directory at `path` (never through a final symlink).
    pub fn open(path: &Path) -> io::Result<Self> {
        Self::open_at(CWD, path.as_os_str())
    }

    /// Opens the directory `name` of `at` (never through a symlink).
    pub fn open_at(at: BorrowedFd<'_>, name: &OsStr) -> io::Result<Self> {
        let dir = open_dir(at, name)?;
        let trail = vec![identity(dir.as_fd())?];
        Ok(Self { dir, trail })
    }

    /// The open directory.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    /// How many levels below the root the cursor is.
    pub fn depth(&self) -> usize {
        self.trail.len() - 1
    }

    /// Steps into the child directory `name` (never through a symlink).
    pub fn descend(&mut self, name: &OsStr) -> io::Result<()> {
        let child = open_dir(self.dir.as_fd(), name)?;
        self.trail.push(identity(child.as_fd())?);
        self.dir = child;
        Ok(())
    }

    /// Climbs back to the parent: `..`, which must be the directory the
    /// cursor came down from (a tree moved under the walk is an error, not
    /// a way out of it).
    pub fn ascend(&mut self) -> io::Result<()> {
        let Some(&parent) = self.trail.len().checked_sub(2).and_then(|i| self.trail.get(i)) else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "already at the walk's root"));
        };
        let up = open_dir(self.dir.as_fd(), OsStr::new(".."))?;
        if identity(up.as_fd())? != parent {
            return Err(io::Error::other("the tree was moved while it was walked"));
        }
        self.trail.pop();
        self.dir = up;
        Ok(())
    }

    /// The names in the open directory (without `.` and `..`), in byte order.
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        names(self.dir.as_fd())
    }

    /// `/proc/self/fd/<dir>/<name>`: a short path to an entry of the open
    /// directory, for the calls that take a path only.
    pub fn entry_path(&self, name: &OsStr) -> PathBuf {
        use std::os::fd::AsRawFd;
        Path::new("/proc/self/fd").join(self.dir.as_raw_fd().to_string()).join(name)
    }

    /// `lstat` of the entry `name`.
    pub fn stat(&self, name: &OsStr) -> io::Result<rustix::fs::Stat> {
        Ok(rustix::fs::statat(self.dir.as_fd(), name, AtFlags::SYMLINK_NOFOLLOW)?)
    }
}

/// The names in `dir` (without `.` and `..`), in byte order.
pub fn names(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    // A fresh descriptor for the stream (opened on ".", so at its start).
    let mut stream = rustix::fs::Dir::read_from(dir)?;
    let mut out = Vec::new();
    while let Some(entry) = stream.read() {
        let name = entry?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            out.push(OsString::from(OsStr::from_bytes(&name)));
        }
    }
    out.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok(out)
}

fn is_dir(st: &rustix::fs::Stat) -> bool {
    FileType::from_raw_mode(st.st_mode) == FileType::Directory
}

/// The space the tree at `path` occupies: the allocated size of each
/// non-directory (sparse files count their blocks, not their length). What
/// cannot be read counts as nothing.
pub fn allocated_bytes(path: &Path) -> u64 {
    let size = |st: &rustix::fs::Stat| (st.st_size.max(0) as u64).min(st.st_blocks as u64 * 512);
    let Ok(st) = rustix::fs::lstat(path) else { return 0 };
    if !is_dir(&st) {
        return size(&st);
    }
    let Ok(mut cursor) = DirCursor::open(path) else { return 0 };
    let mut pending = vec![cursor.names().unwrap_or_default()];
    let mut total = 0u64;
    while let Some(level) = pending.last_mut() {
        let Some(name) = level.pop() else {
            pending.pop();
            if pending.is_empty() || cursor.ascend().is_err() {
                break;
            }
            continue;
        };
        let Ok(st) = cursor.stat(&name) else { continue };
        if !is_dir(&st) {
            total = total.saturating_add(size(&st));
        } else if cursor.descend(&name).is_ok() {
            pending.push(cursor.names().unwrap_or_default());
        }
    }
    total
}

/// Removes the tree at `path` (or the file there; nothing there is fine),
/// giving its owner access back first where a command took it away (overlay
/// work directories are 000, and a command can `chmod 000` what it staged).
/// An error names the entry: `path` and the names below it.
pub fn remove_tree(path: &Path) -> Result<(), (PathBuf, io::Error)> {
    remove_tree_at(CWD, path.as_os_str(), Unlock::Yes)
}

/// Whether [`remove_tree_at`] gives the owner back access to directories it
/// must empty (in pvisor's own state), or leaves modes alone (in a user's
/// workspace, where a directory its owner locked stays an error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unlock {
    Yes,
    No,
}

/// Removes the entry `name` of `at`, a whole tree if it is a directory,
/// never following a symlink. Nothing there is fine. An error names the
/// entry as `name` and the names below it.
pub fn remove_tree_at(
    at: BorrowedFd<'_>,
    name: &OsStr,
    unlock_dirs: Unlock,
) -> Result<(), (PathBuf, io::Error)> {
    let top = Path::new(name);
    let root_err = |e: io::Error| (top.to_owned(), e);
    let st = match rustix::fs::statat(at, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(root_err(e.into())),
    };
    if !is_dir(&st) {
        return match rustix::fs::unlinkat(at, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(root_err(e.into())),
        };
    }
    let unlock = |at: BorrowedFd<'_>, name: &OsStr, st: &rustix::fs::Stat| match unlock_dirs {
        Unlock::Yes => unlock(at, name, st),
        Unlock::No => Ok(()),
    };
    unlock(at, name, &st).map_err(root_err)?;
    let mut cursor = DirCursor::open_at(at, name).map_err(root_err)?;
    // The names of the directories entered, to name an error and to remove
    // each directory from its parent once it is empty.
    let mut trail: Vec<OsString> = Vec::new();
    let mut pending = vec![cursor.names().map_err(root_err)?];
    let named = |trail: &[OsString], name: Option<&OsStr>| {
        let mut p = top.to_owned();
        p.extend(trail.iter().map(OsString::as_os_str).chain(name));
        p
    };
    while let Some(level) = pending.last_mut() {
        let Some(entry) = level.pop() else {
            pending.pop();
            let Some(done) = trail.pop() else { break };
            cursor.ascend().map_err(|e| (named(&trail, Some(&done)), e))?;
            rustix::fs::unlinkat(cursor.fd(), &done, AtFlags::REMOVEDIR)
                .map_err(|e| (named(&trail, Some(&done)), e.into()))?;
            continue;
        };
        let err = |e: io::Error| (named(&trail, Some(&entry)), e);
        let st = match cursor.stat(&entry) {
            Ok(st) => st,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(err(e)),
        };
        if !is_dir(&st) {
            match rustix::fs::unlinkat(cursor.fd(), &entry, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => continue,
                Err(e) => return Err(err(e.into())),
            }
        }
        unlock(cursor.fd(), &entry, &st).map_err(err)?;
        cursor.descend(&entry).map_err(err)?;
        pending.push(cursor.names().map_err(err)?);
        trail.push(entry);
    }
    drop(cursor);
    rustix::fs::unlinkat(at, name, AtFlags::REMOVEDIR).map_err(|e| root_err(e.into()))
}

/// Gives the owner of the directory `name` in `at` read, write and search
/// on it, if it lacks any. The mode is set through an `O_PATH` descriptor
/// opened without following symlinks, so it lands on that directory only.
fn unlock(at: BorrowedFd<'_>, name: &OsStr, st: &rustix::fs::Stat) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::PermissionsExt;
    if st.st_mode & 0o700 == 0o700 {
        return Ok(());
    }
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(at, name, flags, Mode::empty())?;
    let magic = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    std::fs::set_permissions(&magic, std::fs::Permissions::from_mode((st.st_mode | 0o700) & 0o7777))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A chain of `depth` directories named `d` under `root`, built by
    /// descriptor (its full path is far longer than PATH_MAX), with a file
    /// at each level.
    fn chain(root: &Path, depth: usize) {
        let mut cursor = DirCursor::open(root).unwrap();
        for _ in 0..depth {
            rustix::fs::mkdirat(cursor.fd(), "d", Mode::from_raw_mode(0o755)).unwrap();
            let f = rustix::fs::openat(
                cursor.fd(),
                "f",
                OFlags::CREATE | OFlags::WRONLY,
                Mode::from_raw_mode(0o644),
            )
            .unwrap();
            rustix::io::write(&f, b"x").unwrap();
            cursor.descend(OsStr::new("d")).unwrap();
        }
        // The deepest directory is one its owner cannot enter.
        rustix::fs::fchmod(cursor.fd(), Mode::from_raw_mode(0)).unwrap();
    }

    #[test]
    fn a_tree_deeper_than_any_stack_or_path_is_measured_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tree");
        std::fs::create_dir(&root).unwrap();
        chain(&root, 3_000);
        // One file of one byte per level: its blocks (a page on most filesystems) count.
        assert!(allocated_bytes(&root) >= 3_000);
        remove_tree(&root).unwrap();
        assert!(!root.exists());
        remove_tree(&root).unwrap();
    }

    #[test]
    fn remove_tree_gives_locked_directories_back_to_their_owner() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tree");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/f"), "x").unwrap();
        std::fs::set_permissions(root.join("a"), std::fs::Permissions::from_mode(0o0)).unwrap();
        remove_tree(&root).unwrap();
        assert!(!root.exists());
    }

    #[test]
    fn symlinks_are_removed_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let (root, outside) = (dir.path().join("tree"), dir.path().join("outside"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(outside.join("keep")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        remove_tree(&root).unwrap();
        assert!(outside.join("keep").is_dir());
    }
}
