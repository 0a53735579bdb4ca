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
//! Atomic replacement writes `.NAME.pvisor-tmp` beside the target and renames
//! it over. The name is fixed per target (applies are serialized by the stage
//! lock), so a temporary left by a killed apply is replaced when the path is
//! retried instead of lingering.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;

use pvisor_core::digest::Contents;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
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

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(rc: libc::c_long) -> io::Result<libc::c_long> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// `struct open_how` for openat2(2).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;

/// The name apply writes `plain`'s new content under before renaming it
/// over: fixed-length (29 bytes), so any legal name (up to NAME_MAX) has
/// one, and derived from the name, so the temporary a killed apply of that
/// very path left is found again.
fn temp_name(plain: &OsStr) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    let digest = blake3::hash(plain.as_bytes()).to_hex();
    cstr(OsStr::new(&format!("{TEMP_PREFIX}{}", &digest[..16])))
}

/// How apply's temporaries are named (`.pvisor-tmp-` and 16 hex digits).
pub const TEMP_PREFIX: &str = ".pvisor-tmp-";

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

fn stat_of(st: &libc::stat) -> Stat {
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => Kind::File,
        libc::S_IFDIR => Kind::Dir,
        libc::S_IFLNK => Kind::Symlink,
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

impl Root {
    /// Opens `path` as a confining root.
    pub fn open(path: &Path) -> io::Result<Self> {
        let c = cstr(path.as_os_str())?;
        // SAFETY: a valid C string; the descriptor is ours.
        let fd = check(
            unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) }.into(),
        )?;
        // SAFETY: open returned a fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        Ok(Self { fd, last_parent: std::cell::RefCell::new(None) })
    }

    /// Opens `rel` (a directory, or "" for the root itself) beneath the root.
    fn open_dir(&self, parts: &[&OsStr]) -> io::Result<OwnedFd> {
        if parts.is_empty() {
            return self.fd.try_clone();
        }
        let joined: std::path::PathBuf = parts.iter().collect();
        let c = cstr(joined.as_os_str())?;
        let how = OpenHow {
            flags: (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64,
            mode: 0,
            resolve: RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        };
        // SAFETY: a valid dirfd, C string and open_how of the stated size.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        match check(rc) {
            // SAFETY: openat2 returned a fresh descriptor.
            Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }),
            // No openat2, or a path longer than PATH_MAX (a tree a command
            // built deeper than that): the same confinement, a name at a time.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::ENAMETOOLONG)) => self.walk(parts),
            Err(e) => Err(e),
        }
    }

    /// The pre-openat2 fallback, and the way past PATH_MAX: one component
    /// at a time, never following a symlink.
    fn walk(&self, parts: &[&OsStr]) -> io::Result<OwnedFd> {
        let mut dir = self.fd.try_clone()?;
        for part in parts {
            dir = openat(dir.as_raw_fd(), &cstr(part)?, libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW)?;
        }
        Ok(dir)
    }

    /// Returns the parent directory's descriptor and the final name of `rel`.
    fn parent<'a>(&self, rel: &'a Path) -> io::Result<(std::rc::Rc<OwnedFd>, CString, &'a OsStr)> {
        let parts = components(rel)?;
        let (name, dirs) = parts.split_last().ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let dir_path: std::path::PathBuf = dirs.iter().collect();
        if let Some((cached, fd)) = self.last_parent.borrow().as_ref() {
            if *cached == dir_path {
                return Ok((fd.clone(), cstr(name)?, name));
            }
        }
        let fd = std::rc::Rc::new(self.open_dir(dirs)?);
        *self.last_parent.borrow_mut() = Some((dir_path, fd.clone()));
        Ok((fd, cstr(name)?, name))
    }

    /// Forgets the cached parent: a directory may have been removed or replaced.
    fn forget_parent(&self) {
        self.last_parent.borrow_mut().take();
    }

    /// `fstat` of the root directory itself.
    pub fn stat_root(&self) -> io::Result<Stat> {
        // SAFETY: zeroed stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and out-pointer.
        check(unsafe { libc::fstat(self.fd.as_raw_fd(), &mut st) }.into())?;
        Ok(stat_of(&st))
    }

    /// `lstat` of `rel`; `None` if it does not exist beneath the root (a
    /// parent is missing, not a directory, or a symlink, which is never
    /// followed: a command may replace a host symlink with a directory).
    pub fn stat(&self, rel: &Path) -> io::Result<Option<Stat>> {
        let (dir, name, _) = match self.parent(rel) {
            Ok(p) => p,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        // SAFETY: zeroed stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid dirfd, name and out-pointer.
        let rc = unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
        match check(rc.into()) {
            Ok(_) => Ok(Some(stat_of(&st))),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Opens the regular file `rel` for reading, refusing anything else.
    pub fn open_file(&self, rel: &Path) -> io::Result<File> {
        let (dir, name, _) = self.parent(rel)?;
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
        let file = File::from(openat(dir.as_raw_fd(), &name, flags)?);
        if !file.metadata()?.is_file() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
        }
        Ok(file)
    }

    /// Reads the target of the symlink `rel`.
    pub fn read_link(&self, rel: &Path) -> io::Result<Vec<u8>> {
        let (dir, name, _) = self.parent(rel)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize];
        // SAFETY: valid dirfd, name and buffer.
        let n = check(unsafe {
            libc::readlinkat(dir.as_raw_fd(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
        } as libc::c_long)?;
        buf.truncate(n as usize);
        Ok(buf)
    }

    /// Creates the directory `rel` with `mode` (an existing directory is fine).
    pub fn mkdir(&self, rel: &Path, mode: u32) -> io::Result<()> {
        let (dir, name, _) = self.parent(rel)?;
        // SAFETY: valid dirfd and name.
        match check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) }.into()) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                if self.stat(rel)?.map(|s| s.kind) != Some(Kind::Dir) {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
        self.chmod_dir(rel, mode)
    }

    fn chmod_dir(&self, rel: &Path, mode: u32) -> io::Result<()> {
        let (dir, name, _) = self.parent(rel)?;
        let fd = openat(
            dir.as_raw_fd(),
            &name,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )?;
        // SAFETY: fchmod on our descriptor.
        check(unsafe { libc::fchmod(fd.as_raw_fd(), mode) }.into())?;
        Ok(())
    }

    /// Sets the permission bits of the existing directory `rel`.
    pub fn set_dir_mode(&self, rel: &Path, mode: u32) -> io::Result<()> {
        self.chmod_dir(rel, mode)
    }

    /// Removes `rel` (a file, symlink, special file, or a whole directory tree).
    /// A path that is already gone is fine.
    pub fn remove_all(&self, rel: &Path) -> io::Result<()> {
        self.forget_parent();
        let (dir, name, _) = match self.parent(rel) {
            Ok(p) => p,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => return Ok(()),
            Err(e) => return Err(e),
        };
        remove_at(dir.as_raw_fd(), &name)
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

    /// Creates a temporary beside `rel`, lets `fill` write it, gives it
    /// `mode` and renames it over `rel`; on any error the temporary is gone.
    fn replace_file<T>(
        &self,
        rel: &Path,
        mode: u32,
        fill: impl FnOnce(&File) -> io::Result<T>,
    ) -> io::Result<T> {
        let (dir, name, plain) = self.parent(rel)?;
        let tmp = temp_name(plain)?;
        // Unnamed until complete (O_TMPFILE): a new file appears whole by one
        // link, with no temporary name to create, rename away or leave behind
        // after a crash; only a file that replaces another is linked under the
        // temporary name first, then renamed over it.
        if let Some(file) = tmpfile_in(&dir)? {
            let filled = fill(&file)?;
            // SAFETY: fchmod on our descriptor.
            check(unsafe { libc::fchmod(file.as_raw_fd(), mode) }.into())?;
            match link_anonymous(&file, &dir, &name) {
                Ok(()) => return Ok(filled),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => return Err(e),
            }
            // SAFETY: valid dirfd and name (a temporary a killed apply left).
            unsafe { libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0) };
            link_anonymous(&file, &dir, &tmp)?;
            if let Err(e) = self.rename_over(&dir, &tmp, &name) {
                // SAFETY: valid dirfd and name.
                unsafe { libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0) };
                return Err(e);
            }
            return Ok(filled);
        }
        let create = || {
            // SAFETY: valid dirfd and name; O_EXCL|O_NOFOLLOW never reuse or follow.
            let rc = unsafe {
                libc::openat(
                    dir.as_raw_fd(),
                    tmp.as_ptr(),
                    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                    0o600,
                )
            };
            check(rc.into())
        };
        let fd = match create() {
            // A temporary left by a killed apply of this very path.
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                // SAFETY: valid dirfd and name.
                unsafe { libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0) };
                create()?
            }
            other => other?,
        };
        // SAFETY: openat returned a fresh descriptor.
        let file = unsafe { File::from_raw_fd(fd as RawFd) };
        let result = (|| {
            let filled = fill(&file)?;
            // SAFETY: fchmod on our descriptor.
            check(unsafe { libc::fchmod(file.as_raw_fd(), mode) }.into())?;
            self.rename_over(&dir, &tmp, &name)?;
            Ok(filled)
        })();
        if result.is_err() {
            // SAFETY: valid dirfd and name.
            unsafe { libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0) };
        }
        result
    }

    /// Renames `tmp` over `name` in `dir`; a directory in the way (a type
    /// change) is removed first.
    fn rename_over(&self, dir: &OwnedFd, tmp: &CString, name: &CString) -> io::Result<()> {
        let rename = || {
            // SAFETY: valid dirfd and names.
            let rc = unsafe { libc::renameat(dir.as_raw_fd(), tmp.as_ptr(), dir.as_raw_fd(), name.as_ptr()) };
            check(rc.into())
        };
        match rename() {
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EISDIR) | Some(libc::ENOTEMPTY) | Some(libc::EEXIST)
                ) =>
            {
                self.forget_parent();
                remove_at(dir.as_raw_fd(), name)?;
                rename().map(|_| ())
            }
            other => other.map(|_| ()),
        }
    }

    /// Removes the temporary a killed apply of `rel` may have left beside it.
    /// Returns whether there was one.
    pub fn remove_temporary(&self, rel: &Path) -> io::Result<bool> {
        let (dir, _, plain) = match self.parent(rel) {
            Ok(found) => found,
            // No parent directory: nothing can have been written there.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => return Ok(false),
            Err(e) => return Err(e),
        };
        let tmp = temp_name(plain)?;
        // SAFETY: valid dirfd and name; unlinkat never follows the final name.
        match check(unsafe { libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0) }.into()) {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Replaces `rel` with a symlink to `target`, atomically.
    pub fn write_symlink(&self, rel: &Path, target: &[u8]) -> io::Result<()> {
        let (dir, name, plain) = self.parent(rel)?;
        let tmp = temp_name(plain)?;
        let target = CString::new(target).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: valid dirfd and names.
        unsafe { libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0) };
        // SAFETY: valid C strings and dirfd.
        check(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), tmp.as_ptr()) }.into())?;
        let renamed = self.rename_over(&dir, &tmp, &name);
        if renamed.is_err() {
            // SAFETY: valid dirfd and name.
            unsafe { libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0) };
        }
        renamed
    }

    /// Lists the names in directory `rel` ("" for the root).
    pub fn list(&self, rel: &Path) -> io::Result<Vec<std::ffi::OsString>> {
        let parts = if rel.as_os_str().is_empty() { Vec::new() } else { components(rel)? };
        let fd = self.open_dir(&parts)?;
        list_fd(fd.as_raw_fd())
    }

    /// Makes everything written beneath the root durable: one `syncfs(2)`.
    pub fn sync(&self) -> io::Result<()> {
        // syncfs needs a real open file, not the O_PATH root descriptor.
        let dir = openat(self.fd.as_raw_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC)?;
        // SAFETY: syncfs on a valid descriptor.
        check(unsafe { libc::syncfs(dir.as_raw_fd()) }.into())?;
        Ok(())
    }
}

/// `openat(2)` with `O_CLOEXEC`, returning an owned descriptor.
/// An unnamed regular file in `dir` (`O_TMPFILE`), or `None` where the
/// filesystem has none or `/proc` is missing (an unnamed file is linked
/// through `/proc/self/fd` without privileges): the caller then names a
/// temporary instead.
fn tmpfile_in(dir: &OwnedFd) -> io::Result<Option<File>> {
    static PROC_FD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !*PROC_FD.get_or_init(|| Path::new("/proc/self/fd").is_dir()) {
        return Ok(None);
    }
    // SAFETY: a valid dirfd and name; O_TMPFILE creates no directory entry.
    let rc = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c".".as_ptr(),
            libc::O_TMPFILE | libc::O_WRONLY | libc::O_CLOEXEC,
            0o600,
        )
    };
    match check(rc.into()) {
        // SAFETY: openat returned a fresh descriptor.
        Ok(fd) => Ok(Some(unsafe { File::from_raw_fd(fd as RawFd) })),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)) => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Gives the unnamed `file` the name `name` in `dir`; `EEXIST` if taken
/// (never replaces, never follows `name`).
fn link_anonymous(file: &File, dir: &OwnedFd, name: &std::ffi::CStr) -> io::Result<()> {
    let source = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())).map_err(io::Error::other)?;
    // SAFETY: valid C strings and dirfd; AT_SYMLINK_FOLLOW resolves only the
    // /proc magic link to our own descriptor's inode.
    let rc = unsafe {
        libc::linkat(libc::AT_FDCWD, source.as_ptr(), dir.as_raw_fd(), name.as_ptr(), libc::AT_SYMLINK_FOLLOW)
    };
    check(rc.into()).map(|_| ())
}

fn openat(dirfd: RawFd, name: &std::ffi::CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: a valid dirfd and NUL-terminated name; the flags never create.
    let fd = check(unsafe { libc::openat(dirfd, name.as_ptr(), flags | libc::O_CLOEXEC) }.into())?;
    // SAFETY: openat returned a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn list_fd(dirfd: RawFd) -> io::Result<Vec<std::ffi::OsString>> {
    // Re-open as a readable directory: O_PATH descriptors cannot be listed.
    let dot = c".";
    // SAFETY: valid dirfd and name.
    let fd = check(
        unsafe { libc::openat(dirfd, dot.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) }
            .into(),
    )?;
    // SAFETY: fdopendir takes ownership of the fresh descriptor.
    let dirp = unsafe { libc::fdopendir(fd as RawFd) };
    if dirp.is_null() {
        let err = io::Error::last_os_error();
        // SAFETY: closing the descriptor fdopendir did not take.
        unsafe { libc::close(fd as RawFd) };
        return Err(err);
    }
    let mut names = Vec::new();
    loop {
        // SAFETY: dirp is a valid DIR*.
        let entry = unsafe { libc::readdir64(dirp) };
        if entry.is_null() {
            break;
        }
        // SAFETY: readdir returned a valid entry whose d_name is NUL-terminated.
        let name = unsafe { std::ffi::CStr::from_ptr((*entry).d_name.as_ptr()) };
        let bytes = name.to_bytes();
        if bytes != b"." && bytes != b".." {
            names.push(OsStr::from_bytes(bytes).to_owned());
        }
    }
    // SAFETY: closing the DIR* we opened.
    unsafe { libc::closedir(dirp) };
    Ok(names)
}

/// Removes `name` in `dirfd`, recursing into directories without following links.
fn remove_at(dirfd: RawFd, name: &CString) -> io::Result<()> {
    // SAFETY: valid dirfd and name.
    if unsafe { libc::unlinkat(dirfd, name.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::ENOENT) => return Ok(()),
        Some(libc::EISDIR) | Some(libc::EPERM) => {}
        _ => return Err(err),
    }
    let sub = openat(dirfd, name, libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)?;
    for child in list_fd(sub.as_raw_fd())? {
        remove_at(sub.as_raw_fd(), &cstr(&child)?)?;
    }
    // SAFETY: valid dirfd and name.
    check(unsafe { libc::unlinkat(dirfd, name.as_ptr(), libc::AT_REMOVEDIR) }.into())?;
    Ok(())
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
