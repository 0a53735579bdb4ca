//! File operations confined beneath a root directory.
//!
//! Every operation opens the *parent* of its target with `openat2(2)` and
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`, then acts on
//! the final name relative to that descriptor without following it. So no
//! symlink — planted by the sandbox in the stage, or by anyone in the
//! workspace after the run — can redirect a read or a write outside the root.
//! On kernels without `openat2` (before 5.6) the same walk is done one
//! component at a time with `O_NOFOLLOW`.
//!
//! Atomic replacement writes a temporary beside the target and renames it
//! over. Its name is fixed per target, so a temporary left by a killed apply
//! is replaced when the path is retried instead of lingering; it carries the
//! name's whole BLAKE3, so no two targets of one directory share one (apply
//! writes a directory's files on several threads), and apply never writes a
//! staged name that begins like it (see [`is_temporary`]).

use std::ffi::{CStr, OsStr, OsString};
use std::fs::File;
use std::io;

use pvisor_core::digest::Contents;
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, CWD};
use rustix::io::Errno;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

/// A directory that confines every path resolved through it.
///
/// The last parent directory resolved is kept open, so writing many files
/// into one directory resolves it once. Removals clear it.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    last_parent: std::cell::RefCell<Option<(std::path::PathBuf, std::rc::Rc<OwnedFd>)>>,
}

/// The name apply writes `plain`'s new content under before renaming it
/// over: fixed-length (76 bytes), so any legal name (up to NAME_MAX) has
/// one; derived from the name, so the temporary a killed apply of that very
/// path left is found again; the whole digest, so two names cannot be made
/// to share one (a 64-bit prefix collides after about 2^32 tries).
fn temp_name(plain: &OsStr) -> OsString {
    let digest = blake3::hash(plain.as_bytes()).to_hex();
    OsString::from(format!("{TEMP_PREFIX}{digest}"))
}

/// How apply's temporaries are named (`.pvisor-tmp-` and 64 hex digits).
pub const TEMP_PREFIX: &str = ".pvisor-tmp-";

/// Whether `name` begins like one of apply's temporaries, in any case. Apply never writes
/// such a name: it would be unlinked as a leftover when its neighbour is
/// replaced, or renamed over that neighbour by the thread writing it.
pub fn is_temporary(name: &OsStr) -> bool {
    // Whatever the case: on a case-insensitive directory (ext4 casefold,
    // vfat) `.PVISOR-TMP-…` is the same file as apply's temporary.
    let prefix = name.as_bytes().get(..TEMP_PREFIX.len());
    prefix.is_some_and(|p| p.eq_ignore_ascii_case(TEMP_PREFIX.as_bytes()))
}

/// Splits a relative path into its normal components, refusing `..`, `.`,
/// absolute paths and empty paths: the names a manifest may hold.
pub fn components(rel: &Path) -> io::Result<Vec<&OsStr>> {
    let mut out = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(name) => out.push(name),
            Component::CurDir | Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("unsafe path {:?}: only plain relative names are allowed", rel),
                ))
            }
        }
    }
    if out.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty path"));
    }
    Ok(out)
}

/// What is at a path, without following a final symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Special,
}

/// `lstat`-like facts about an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub kind: Kind,
    pub mode: u32,
    pub size: u64,
    pub uid: u32,
    pub gid: u32,
    pub ctime_ns: i128,
}

fn stat_of(st: &rustix::fs::Stat) -> Stat {
    use rustix::fs::FileType;
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => Kind::File,
        FileType::Directory => Kind::Dir,
        FileType::Symlink => Kind::Symlink,
        _ => Kind::Special,
    };
    Stat {
        kind,
        mode: st.st_mode & 0o7777,
        size: st.st_size as u64,
        uid: st.st_uid,
        gid: st.st_gid,
        ctime_ns: i128::from(st.st_ctime) * 1_000_000_000 + i128::from(st.st_ctime_nsec),
    }
}

fn mode(bits: u32) -> Mode {
    Mode::from_raw_mode(bits)
}

impl Root {
    /// Opens `path` as a confining root.
    pub fn open(path: &Path) -> io::Result<Self> {
        let fd = rustix::fs::open(path, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        Ok(Self::from_fd(fd))
    }

    /// The root's descriptor, duplicated, for a [`Root::from_fd`] on
    /// another thread (a `Root` keeps its last parent in a cell, so one is
    /// not shared between threads).
    pub(crate) fn dup_fd(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }

    /// The root whose descriptor [`Root::dup_fd`] gave.
    pub(crate) fn from_fd(fd: OwnedFd) -> Self {
        Self { fd, last_parent: std::cell::RefCell::new(None) }
    }

    /// Opens `rel` (a directory, or "" for the root itself) beneath the root.
    fn open_dir(&self, parts: &[&OsStr]) -> io::Result<OwnedFd> {
        if parts.is_empty() {
            return self.fd.try_clone();
        }
        let joined: std::path::PathBuf = parts.iter().collect();
        let opened = rustix::fs::openat2(
            &self.fd,
            &joined,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        );
        match opened {
            Ok(fd) => Ok(fd),
            // No openat2, or a path longer than PATH_MAX (a tree a command
            // built deeper than that): the same confinement, a name at a time.
            Err(Errno::NOSYS | Errno::NAMETOOLONG) => self.walk(parts),
            Err(e) => Err(e.into()),
        }
    }

    /// Opens the directory `rel` beneath the root (`O_PATH`), through no
    /// symlink: a place to mount on that no path lookup can redirect.
    pub fn open_directory(&self, rel: &Path) -> io::Result<OwnedFd> {
        self.open_dir(&components(rel)?)
    }

    /// The pre-openat2 fallback, and the way past PATH_MAX: one component
    /// at a time, never following a symlink.
    fn walk(&self, parts: &[&OsStr]) -> io::Result<OwnedFd> {
        let mut dir = self.fd.try_clone()?;
        for part in parts {
            dir = openat(&dir, *part, OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW)?;
        }
        Ok(dir)
    }

    /// Returns the parent directory's descriptor and the final name of `rel`.
    fn parent<'a>(&self, rel: &'a Path) -> io::Result<(std::rc::Rc<OwnedFd>, &'a OsStr)> {
        let parts = components(rel)?;
        let (name, dirs) = parts.split_last().ok_or_else(|| io::Error::from(Errno::INVAL))?;
        let dir_path: std::path::PathBuf = dirs.iter().collect();
        if let Some((cached, fd)) = self.last_parent.borrow().as_ref() {
            if *cached == dir_path {
                return Ok((fd.clone(), name));
            }
        }
        let fd = std::rc::Rc::new(self.open_dir(dirs)?);
        *self.last_parent.borrow_mut() = Some((dir_path, fd.clone()));
        Ok((fd, name))
    }

    /// Forgets the cached parent: a directory may have been removed or replaced.
    fn forget_parent(&self) {
        self.last_parent.borrow_mut().take();
    }

    /// `fstat` of the root directory itself.
    pub fn stat_root(&self) -> io::Result<Stat> {
        Ok(stat_of(&rustix::fs::fstat(&self.fd)?))
    }

    /// `lstat` of `rel`; `None` if it does not exist beneath the root (a
    /// parent is missing, not a directory, or a symlink, which is never
    /// followed: a command may replace a host symlink with a directory).
    pub fn stat(&self, rel: &Path) -> io::Result<Option<Stat>> {
        let (dir, name) = match self.parent(rel) {
            Ok(p) => p,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        match rustix::fs::statat(&*dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(stat_of(&st))),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Opens the regular file `rel` for reading, refusing anything else.
    pub fn open_file(&self, rel: &Path) -> io::Result<File> {
        let (dir, name) = self.parent(rel)?;
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY;
        let file = File::from(openat(&*dir, name, flags)?);
        if !file.metadata()?.is_file() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
        }
        Ok(file)
    }

    /// Reads the target of the symlink `rel`.
    pub fn read_link(&self, rel: &Path) -> io::Result<Vec<u8>> {
        let (dir, name) = self.parent(rel)?;
        Ok(rustix::fs::readlinkat(&*dir, name, Vec::new())?.into_bytes())
    }

    /// Creates the directory `rel` with `mode` (an existing directory is fine).
    pub fn mkdir(&self, rel: &Path, bits: u32) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        match rustix::fs::mkdirat(&*dir, name, mode(bits)) {
            Ok(()) => {}
            Err(Errno::EXIST) => {
                if self.stat(rel)?.map(|s| s.kind) != Some(Kind::Dir) {
                    return Err(Errno::EXIST.into());
                }
            }
            Err(e) => return Err(e.into()),
        }
        self.chmod_dir(rel, bits)
    }

    /// Creates the directory `rel` and those missing above it, new ones
    /// with `bits`: one name at a time, each opened from the last (so the
    /// cost is linear in the depth, however deep), never through a symlink
    /// or a file (`ENOTDIR`).
    pub fn mkdir_all(&self, rel: &Path, bits: u32) -> io::Result<()> {
        let mut dir = self.fd.try_clone()?;
        for part in components(rel)? {
            match rustix::fs::mkdirat(&dir, part, mode(bits)) {
                // Exactly `bits`, whatever the umask, as `mkdir` does.
                Ok(()) => rustix::fs::chmodat(&dir, part, mode(bits), AtFlags::empty())?,
                Err(Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
            dir = openat(&dir, part, OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW)?;
        }
        Ok(())
    }

    fn chmod_dir(&self, rel: &Path, bits: u32) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        let fd = openat(&*dir, name, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW)?;
        rustix::fs::fchmod(&fd, mode(bits))?;
        Ok(())
    }

    /// Gives `rel` (never followed, even as the final name) the owner
    /// `uid` and group `gid`.
    pub fn chown(&self, rel: &Path, uid: u32, gid: u32) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        let (uid, gid) = (rustix::fs::Uid::from_raw(uid), rustix::fs::Gid::from_raw(gid));
        Ok(rustix::fs::chownat(&*dir, name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)?)
    }

    /// Sets the permission bits of the existing directory `rel`.
    pub fn set_dir_mode(&self, rel: &Path, mode: u32) -> io::Result<()> {
        self.chmod_dir(rel, mode)
    }

    /// Removes `rel` (a file, symlink, special file, or a whole directory tree).
    /// A path that is already gone is fine.
    pub fn remove_all(&self, rel: &Path) -> io::Result<()> {
        self.forget_parent();
        let (dir, name) = match self.parent(rel) {
            Ok(p) => p,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => return Ok(()),
            Err(e) => return Err(e),
        };
        remove_at(&*dir, name)
    }

    /// Writes `rel` atomically: a temporary file in the same directory gets
    /// `contents` and `mode`, then is renamed over the target. A directory at
    /// the target is removed first (type change). Returns the BLAKE3 of what
    /// was written; the rename happens only if `expect` matches it.
    pub fn write_file(
        &self,
        rel: &Path,
        contents: &(impl Contents + ?Sized),
        mode: u32,
        expect: Option<&str>,
    ) -> io::Result<String> {
        self.replace_file(rel, mode, |file| {
            // Zero blocks stay holes: a sparse file is applied sparse.
            let digest = pvisor_core::digest::copy_sparse(contents, file)?;
            if let Some(expected) = expect {
                if digest != expected {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "staged contents changed since sealing (blake3 {digest}, manifest {expected})"
                        ),
                    ));
                }
            }
            Ok(digest)
        })
    }

    /// Writes `rel` atomically as a reflink of `from` (shared extents, no
    /// data copied), with `mode`. `Ok(false)`, with nothing changed, where
    /// the filesystem cannot reflink between the two.
    pub fn clone_file(&self, rel: &Path, from: &File, mode: u32) -> io::Result<bool> {
        let cloned = self.replace_file(rel, mode, |file| match pvisor_core::digest::reflink(from, file) {
            true => Ok(()),
            false => Err(io::Error::from(io::ErrorKind::Unsupported)),
        });
        match cloned {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Unsupported => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Makes `rel` another name of `file` (a regular file opened beneath
    /// this root), replacing what is there: linked under the temporary name,
    /// then renamed over `rel`, as [`Root::write_file`] does.
    pub fn link_file(&self, rel: &Path, file: &File) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        let tmp = temp_name(name);
        // A temporary a killed apply left.
        rustix::fs::unlinkat(&*dir, &tmp, AtFlags::empty()).ok();
        link_anonymous(file, &dir, &tmp)?;
        if let Err(e) = self.rename_over(&dir, &tmp, name) {
            rustix::fs::unlinkat(&*dir, &tmp, AtFlags::empty()).ok();
            return Err(e);
        }
        Ok(())
    }

    /// Creates a temporary beside `rel`, lets `fill` write it, gives it
    /// `mode` and renames it over `rel`; on any error the temporary is gone.
    fn replace_file<T>(
        &self,
        rel: &Path,
        bits: u32,
        fill: impl FnOnce(&File) -> io::Result<T>,
    ) -> io::Result<T> {
        let (dir, name) = self.parent(rel)?;
        let tmp = temp_name(name);
        // Best effort: a temporary that is not there is the usual case.
        let unlink_tmp = || rustix::fs::unlinkat(&*dir, &tmp, AtFlags::empty()).ok();
        // Unnamed until complete (O_TMPFILE): a new file appears whole by one
        // link, with no temporary name to create, rename away or leave behind
        // after a crash; only a file that replaces another is linked under the
        // temporary name first, then renamed over it.
        if let Some(file) = tmpfile_in(&dir)? {
            let filled = fill(&file)?;
            rustix::fs::fchmod(&file, mode(bits))?;
            match link_anonymous(&file, &dir, name) {
                Ok(()) => return Ok(filled),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => return Err(e),
            }
            // A temporary a killed apply left.
            unlink_tmp();
            link_anonymous(&file, &dir, &tmp)?;
            if let Err(e) = self.rename_over(&dir, &tmp, name) {
                unlink_tmp();
                return Err(e);
            }
            return Ok(filled);
        }
        // O_EXCL|O_NOFOLLOW never reuse or follow.
        let create = || {
            rustix::fs::openat(
                &*dir,
                &tmp,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                mode(0o600),
            )
        };
        let fd = match create() {
            // A temporary left by a killed apply of this very path.
            Err(Errno::EXIST) => {
                unlink_tmp();
                create()?
            }
            other => other?,
        };
        let file = File::from(fd);
        let result = (|| {
            let filled = fill(&file)?;
            rustix::fs::fchmod(&file, mode(bits))?;
            self.rename_over(&dir, &tmp, name)?;
            Ok(filled)
        })();
        if result.is_err() {
            unlink_tmp();
        }
        result
    }

    /// Renames `tmp` over `name` in `dir`; a directory in the way (a type
    /// change) is removed first.
    fn rename_over(&self, dir: &OwnedFd, tmp: &OsStr, name: &OsStr) -> io::Result<()> {
        let rename = || rustix::fs::renameat(dir, tmp, dir, name);
        match rename() {
            Err(Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST) => {
                self.forget_parent();
                remove_at(dir, name)?;
                Ok(rename()?)
            }
            other => Ok(other?),
        }
    }

    /// Removes the temporary a killed apply of `rel` may have left beside it.
    /// Returns whether there was one.
    pub fn remove_temporary(&self, rel: &Path) -> io::Result<bool> {
        let (dir, name) = match self.parent(rel) {
            Ok(found) => found,
            // No parent directory: nothing can have been written there.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => return Ok(false),
            Err(e) => return Err(e),
        };
        // unlinkat never follows the final name.
        match rustix::fs::unlinkat(&*dir, temp_name(name), AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Replaces `rel` with a symlink to `target`, atomically.
    pub fn write_symlink(&self, rel: &Path, target: &[u8]) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        let tmp = temp_name(name);
        let target = OsStr::from_bytes(target);
        let _ = rustix::fs::unlinkat(&*dir, &tmp, AtFlags::empty());
        rustix::fs::symlinkat(target, &*dir, &tmp)?;
        let renamed = self.rename_over(&dir, &tmp, name);
        if renamed.is_err() {
            let _ = rustix::fs::unlinkat(&*dir, &tmp, AtFlags::empty());
        }
        renamed
    }

    /// Creates the regular file `rel` anew for writing, with `bits` (less
    /// the umask): whatever was there (a file, a symlink, a tree) is removed
    /// first, and the new file is created with `O_EXCL | O_NOFOLLOW`, so
    /// nothing that was at the name is written through.
    pub fn create_file(&self, rel: &Path, bits: u32) -> io::Result<File> {
        let (dir, name) = self.parent(rel)?;
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rustix::fs::openat(&*dir, name, flags, mode(bits)) {
            Err(Errno::EXIST) => {
                self.forget_parent();
                remove_at(&*dir, name)?;
                Ok(File::from(rustix::fs::openat(&*dir, name, flags, mode(bits))?))
            }
            other => Ok(File::from(other?)),
        }
    }

    /// Makes `rel` a hard link to `target` (both beneath the root; neither
    /// followed if a symlink), replacing what was at `rel`.
    pub fn hard_link(&self, target: &Path, rel: &Path) -> io::Result<()> {
        let (from_dir, from_name) = self.parent(target)?;
        let (dir, name) = self.parent(rel)?;
        match rustix::fs::linkat(&*from_dir, from_name, &*dir, name, AtFlags::empty()) {
            Err(Errno::EXIST) => {
                self.forget_parent();
                remove_at(&*dir, name)?;
                Ok(rustix::fs::linkat(&*from_dir, from_name, &*dir, name, AtFlags::empty())?)
            }
            other => Ok(other?),
        }
    }

    /// Lists the names in directory `rel` ("" for the root).
    pub fn list(&self, rel: &Path) -> io::Result<Vec<OsString>> {
        let parts = if rel.as_os_str().is_empty() { Vec::new() } else { components(rel)? };
        let fd = self.open_dir(&parts)?;
        list_fd(&fd)
    }

    /// Makes everything written beneath the root durable: one `syncfs(2)`.
    pub fn sync(&self) -> io::Result<()> {
        // syncfs needs a real open file, not the O_PATH root descriptor.
        let dir = openat(&self.fd, c".", OFlags::RDONLY | OFlags::DIRECTORY)?;
        rustix::fs::syncfs(&dir)?;
        Ok(())
    }
}

/// An unnamed regular file in `dir` (`O_TMPFILE`), or `None` where the
/// filesystem has none or `/proc` is missing (an unnamed file is linked
/// through `/proc/self/fd` without privileges): the caller then names a
/// temporary instead.
fn tmpfile_in(dir: &OwnedFd) -> io::Result<Option<File>> {
    static PROC_FD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !*PROC_FD.get_or_init(|| Path::new("/proc/self/fd").is_dir()) {
        return Ok(None);
    }
    // O_TMPFILE creates no directory entry.
    match rustix::fs::openat(dir, c".", OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC, mode(0o600)) {
        Ok(fd) => Ok(Some(File::from(fd))),
        Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Gives the unnamed `file` the name `name` in `dir`; `EEXIST` if taken
/// (never replaces, never follows `name`).
fn link_anonymous(file: &File, dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    /// Set once the kernel refused `AT_EMPTY_PATH`: not asked again.
    static EMPTY_PATH_REFUSED: AtomicBool = AtomicBool::new(false);
    // The descriptor itself, with no path to walk: a tenth of applying a
    // small file went to resolving the /proc link. Linux allows it to
    // CAP_DAC_READ_SEARCH and, since 6.10, to whoever opened the file;
    // elsewhere it is ENOENT, and the /proc link does the same.
    let refused = EMPTY_PATH_REFUSED.load(Ordering::Relaxed);
    if !refused {
        match rustix::fs::linkat(file, c"", dir, name, AtFlags::EMPTY_PATH) {
            Err(Errno::NOENT) => {}
            done => return Ok(done?),
        }
    }
    let source = format!("/proc/self/fd/{}", file.as_raw_fd());
    // AT_SYMLINK_FOLLOW resolves only the /proc magic link to our own
    // descriptor's inode.
    rustix::fs::linkat(CWD, source.as_str(), dir, name, AtFlags::SYMLINK_FOLLOW)?;
    // Refused only if the same link works through /proc: ENOENT also means
    // the file has no name left or `dir` was removed, which says nothing
    // about the kernel.
    if !refused {
        EMPTY_PATH_REFUSED.store(true, Ordering::Relaxed);
    }
    Ok(())
}

/// `openat(2)` with `O_CLOEXEC`; the flags never create.
fn openat(dir: impl AsFd, name: impl rustix::path::Arg, flags: OFlags) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(dir, name, flags | OFlags::CLOEXEC, Mode::empty())?)
}

fn list_fd(dir: impl AsFd) -> io::Result<Vec<OsString>> {
    // Re-open as a readable directory: O_PATH descriptors cannot be listed.
    let fd = openat(dir, c".", OFlags::RDONLY | OFlags::DIRECTORY)?;
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::new(fd)? {
        let entry = entry?;
        let name: &CStr = entry.file_name();
        let bytes = name.to_bytes();
        if bytes != b"." && bytes != b".." {
            names.push(OsStr::from_bytes(bytes).to_owned());
        }
    }
    Ok(names)
}

/// Removes `name` in `dir`, a whole tree if it is a directory, without
/// following links and without recursion (the tree's depth is not ours to
/// choose; see `pvisor_core::tree`).
fn remove_at(dir: impl AsFd, name: &OsStr) -> io::Result<()> {
    pvisor_core::tree::remove_tree_at(dir.as_fd(), name, pvisor_core::tree::Unlock::No).map_err(|(_, e)| e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn unsafe_names_are_refused() {
        for bad in ["../x", "a/../../b", "/etc/passwd", "", "."] {
            assert!(components(Path::new(bad)).is_err(), "{bad}");
        }
        assert_eq!(components(Path::new("a/b c/d")).unwrap().len(), 3);
    }

    #[test]
    fn symlinked_parents_are_never_followed() {
        let outside = tempfile::tempdir().unwrap();
        let root_dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root_dir.path().join("evil")).unwrap();
        let root = Root::open(root_dir.path()).unwrap();
        let err = root.write_file(Path::new("evil/pwned"), &b"x"[..], 0o644, None).unwrap_err();
        assert!(matches!(err.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)), "{err}");
        assert!(!outside.path().join("pwned").exists());
        assert!(root.open_file(Path::new("evil/anything")).is_err());
        assert!(root.mkdir(Path::new("evil/d"), 0o755).is_err());
        // The link itself is a fine target: it is replaced, not followed.
        root.write_file(Path::new("evil"), &b"now a file"[..], 0o644, None).unwrap();
        assert_eq!(fs::read(root_dir.path().join("evil")).unwrap(), b"now a file");
        assert!(outside.path().is_dir());
    }

    #[test]
    fn writes_are_atomic_and_checked_against_the_expected_digest() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("f"), "old").unwrap();
        let root = Root::open(dir.path()).unwrap();
        let err = root.write_file(Path::new("f"), &b"new"[..], 0o644, Some("00")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"old");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "temporary left behind");
        let digest = blake3::hash(b"new").to_hex().to_string();
        root.write_file(Path::new("f"), &b"new"[..], 0o600, Some(&digest)).unwrap();
        assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"new");
    }

    #[test]
    fn remove_all_deletes_trees_without_following_links() {
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("keep"), "k").unwrap();
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("t/a/b")).unwrap();
        fs::write(dir.path().join("t/a/b/f"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("t/link")).unwrap();
        let root = Root::open(dir.path()).unwrap();
        root.remove_all(Path::new("t")).unwrap();
        assert!(!dir.path().join("t").exists());
        assert!(outside.path().join("keep").exists());
        root.remove_all(Path::new("t")).unwrap();
    }
}
