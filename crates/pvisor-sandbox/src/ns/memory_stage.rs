//! The stage of a run with a disk quota (`--disk SIZE`): a tmpfs of that
//! size as the overlay's upper layer, copied to the Run's stage on disk when
//! the command has ended.
//!
//! A tmpfs with `size=` is the one filesystem every kernel lets a user
//! namespace mount that answers a write past a limit with `ENOSPC` inside the
//! sandbox. Project quotas need root, a filesystem mounted with them and a
//! kernel built with `CONFIG_QUOTA`; a loop-mounted image needs root and a
//! `mkfs` per run. The price, said in the docs: the staged bytes live in
//! memory (charged to the run's memory cgroup) until init copies them out,
//! and a supervisor killed mid-run takes them with it.
//!
//! The copy runs in init after every sandboxed process is gone, walks by
//! descriptor (`openat`, `..` to climb, so no path length or depth limit),
//! keeps modes, owners, times, symlinks, fifos, overlay whiteouts and the
//! overlay's `user.overlay.*` markers, and writes files sparse.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::helper::StepError;
use crate::sys;

/// The two ends of the copy, opened before `pivot_root` hides the disk side.
#[derive(Debug)]
pub(crate) struct MemoryStage {
    memory: OwnedFd,
    disk: OwnedFd,
    /// The quota: the copy never writes more than this to the disk either.
    /// (Hard links share blocks in the tmpfs but are copied as files, so a
    /// command could otherwise multiply its quota by linking.)
    limit: u64,
}

/// Mounts a tmpfs of `bytes` on the stage's work directory (in init's mount
/// namespace only) and returns the upper and work directories to give the
/// overlay, with the copy's ends.
pub(crate) fn prepare(
    upper: &Path,
    work: &Path,
    bytes: u64,
) -> Result<(MemoryStage, std::path::PathBuf, std::path::PathBuf), StepError> {
    let err = |what: &str, e: io::Error| StepError::new("disk-quota", format!("cannot {what}: {e}"));
    let disk = open_dir(libc::AT_FDCWD, &cpath(upper.as_os_str())?).map_err(|e| err("open the stage", e))?;
    // One inode per 4 KiB of quota, as a disk filesystem would have.
    let options = format!("size={bytes},nr_inodes={},mode=0700", (bytes / 4096).max(1024));
    super::mounts::tmpfs(work, &options, 0)?;
    let (mem_upper, mem_work) = (work.join("upper"), work.join("work"));
    for dir in [&mem_upper, &mem_work] {
        std::fs::create_dir(dir).map_err(|e| err("create the stage's layers", e))?;
    }
    let memory =
        open_dir(libc::AT_FDCWD, &cpath(mem_upper.as_os_str())?).map_err(|e| err("open the tmpfs", e))?;
    Ok((MemoryStage { memory, disk, limit: bytes }, mem_upper, mem_work))
}

fn cpath(path: &OsStr) -> Result<CString, StepError> {
    CString::new(path.as_bytes()).map_err(|_| StepError::new("disk-quota", "a stage path holds a NUL byte"))
}

fn open_dir(at: RawFd, name: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: a valid directory descriptor (or AT_FDCWD) and name.
    let fd = unsafe {
        libc::openat(
            at,
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    sys::check(fd.into())?;
    // SAFETY: a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstatat(dir: RawFd, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor, name and out-pointer.
    let rc = unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    sys::check(rc.into())?;
    Ok(st)
}

fn names(dir: RawFd) -> io::Result<Vec<CString>> {
    // A fresh descriptor for the stream: closedir closes it.
    // SAFETY: dup of a valid descriptor.
    let fd = unsafe { libc::fcntl(dir, libc::F_DUPFD_CLOEXEC, 0) };
    sys::check(fd.into())?;
    // SAFETY: fd is a directory descriptor we own; fdopendir takes it.
    let stream = unsafe { libc::fdopendir(fd) };
    if stream.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so fd is still ours.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    // SAFETY: rewinding a valid stream (the dup shares the offset).
    unsafe { libc::rewinddir(stream) };
    let mut out = Vec::new();
    loop {
        // SAFETY: a valid stream; the entry is read before the next call.
        let entry = unsafe { libc::readdir(stream) };
        if entry.is_null() {
            break;
        }
        // SAFETY: d_name is NUL-terminated.
        let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
        if name != c"." && name != c".." {
            out.push(name.to_owned());
        }
    }
    // SAFETY: closing the stream we opened.
    unsafe { libc::closedir(stream) };
    Ok(out)
}

/// Copies the tmpfs upper layer to the stage on disk. The first error
/// stops the copy and is returned: the run's records then say the stage is
/// incomplete.
pub(crate) fn copy_out(stage: &MemoryStage) -> Result<(), String> {
    let describe = |at: &[u8], e: io::Error| {
        format!("copying the stage out of memory at {:?}: {e}", String::from_utf8_lossy(at))
    };
    // The directories still to list, each as (depth, names left); only the
    // current pair of directory descriptors is open, so depth is unlimited.
    let mut memory = open_dir(stage.memory.as_raw_fd(), c".").map_err(|e| describe(b".", e))?;
    let mut disk = open_dir(stage.disk.as_raw_fd(), c".").map_err(|e| describe(b".", e))?;
    copy_xattrs(memory.as_raw_fd(), disk.as_raw_fd());
    let mut pending: Vec<Vec<CString>> = vec![names(memory.as_raw_fd()).map_err(|e| describe(b".", e))?];
    let mut path: Vec<u8> = Vec::new();
    let mut written = 0u64;
    while let Some(level) = pending.last_mut() {
        let Some(name) = level.pop() else {
            pending.pop();
            finish_dir(memory.as_raw_fd(), disk.as_raw_fd());
            if pending.is_empty() {
                break;
            }
            memory = open_dir(memory.as_raw_fd(), c"..").map_err(|e| describe(&path, e))?;
            disk = open_dir(disk.as_raw_fd(), c"..").map_err(|e| describe(&path, e))?;
            let cut = path.iter().rposition(|&b| b == b'/').unwrap_or(0);
            path.truncate(cut);
            continue;
        };
        let shown = [path.as_slice(), b"/", name.as_bytes()].concat();
        let st = fstatat(memory.as_raw_fd(), &name).map_err(|e| describe(&shown, e))?;
        let kind = st.st_mode & libc::S_IFMT;
        if kind == libc::S_IFDIR {
            // SAFETY: valid descriptor and name.
            let rc = unsafe { libc::mkdirat(disk.as_raw_fd(), name.as_ptr(), 0o700) };
            if rc != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
                return Err(describe(&shown, io::Error::last_os_error()));
            }
            let child_memory = open_dir(memory.as_raw_fd(), &name).map_err(|e| describe(&shown, e))?;
            let child_disk = open_dir(disk.as_raw_fd(), &name).map_err(|e| describe(&shown, e))?;
            copy_xattrs(child_memory.as_raw_fd(), child_disk.as_raw_fd());
            let listed = names(child_memory.as_raw_fd()).map_err(|e| describe(&shown, e))?;
            (memory, disk) = (child_memory, child_disk);
            pending.push(listed);
            path = shown;
            continue;
        }
        written = written.saturating_add(st.st_blocks as u64 * 512);
        if written > stage.limit {
            return Err(format!(
                "the staged files add up to more than the --disk quota of {} bytes (hard links are copied as separate files); the copy stopped at {:?}",
                stage.limit,
                String::from_utf8_lossy(&shown)
            ));
        }
        copy_entry(memory.as_raw_fd(), disk.as_raw_fd(), &name, &st).map_err(|e| describe(&shown, e))?;
    }
    // SAFETY: syncfs on a valid descriptor: the copy is durable before the
    // command's exit is reported and the stage sealed.
    unsafe { libc::syncfs(stage.disk.as_raw_fd()) };
    Ok(())
}

/// Gives a copied directory its source's owner, mode and times, last (a
/// mode without write permission would have stopped the copy into it).
fn finish_dir(memory: RawFd, disk: RawFd) {
    // SAFETY: zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat of a valid descriptor.
    if unsafe { libc::fstat(memory, &mut st) } != 0 {
        return;
    }
    // SAFETY: plain calls on a valid descriptor; failures leave pvisor's defaults.
    unsafe {
        libc::fchown(disk, st.st_uid, st.st_gid);
        libc::fchmod(disk, st.st_mode & 0o7777);
        let times = [
            libc::timespec { tv_sec: st.st_atime, tv_nsec: st.st_atime_nsec },
            libc::timespec { tv_sec: st.st_mtime, tv_nsec: st.st_mtime_nsec },
        ];
        libc::futimens(disk, times.as_ptr());
    }
}

fn copy_entry(memory: RawFd, disk: RawFd, name: &CStr, st: &libc::stat) -> io::Result<()> {
    let kind = st.st_mode & libc::S_IFMT;
    let chown = || {
        // SAFETY: valid descriptor and name; a failure keeps init's ownership.
        unsafe { libc::fchownat(disk, name.as_ptr(), st.st_uid, st.st_gid, libc::AT_SYMLINK_NOFOLLOW) };
    };
    match kind {
        libc::S_IFREG => {
            let open = |dir: RawFd, flags: libc::c_int| -> io::Result<File> {
                // SAFETY: valid descriptor and name.
                let fd = unsafe {
                    libc::openat(dir, name.as_ptr(), flags | libc::O_NOFOLLOW | libc::O_CLOEXEC, 0o600)
                };
                sys::check(fd.into())?;
                // SAFETY: a fresh descriptor.
                Ok(unsafe { File::from_raw_fd(fd) })
            };
            let from = open(memory, libc::O_RDONLY)?;
            let to = open(disk, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC)?;
            pvisor_core::digest::copy_sparse(&from, &to)?;
            copy_xattrs(from.as_raw_fd(), to.as_raw_fd());
            chown();
            // SAFETY: fchmod on our descriptor.
            sys::check(unsafe { libc::fchmod(to.as_raw_fd(), st.st_mode & 0o7777) }.into())?;
        }
        libc::S_IFLNK => {
            let mut buf = vec![0u8; libc::PATH_MAX as usize];
            // SAFETY: valid descriptor, name and buffer.
            let n = unsafe { libc::readlinkat(memory, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
            sys::check(n as i64)?;
            buf.truncate(n as usize);
            let target = CString::new(buf).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
            // SAFETY: valid descriptor and NUL-terminated strings.
            sys::check(unsafe { libc::symlinkat(target.as_ptr(), disk, name.as_ptr()) }.into())?;
            chown();
        }
        // Whiteouts (character device 0:0) may be made without CAP_MKNOD;
        // fifos by anyone. Sockets and other devices cannot be copied and
        // are staged as nothing (the seal would refuse them anyway).
        libc::S_IFCHR | libc::S_IFIFO => {
            // SAFETY: valid descriptor and name.
            sys::check(unsafe { libc::mknodat(disk, name.as_ptr(), st.st_mode, st.st_rdev) }.into())?;
            chown();
        }
        _ => return Ok(()),
    }
    set_times(disk, name, st)
}

fn set_times(dir: RawFd, name: &CStr, st: &libc::stat) -> io::Result<()> {
    let times = [
        libc::timespec { tv_sec: st.st_atime, tv_nsec: st.st_atime_nsec },
        libc::timespec { tv_sec: st.st_mtime, tv_nsec: st.st_mtime_nsec },
    ];
    // SAFETY: valid descriptor, name and two timespecs.
    let rc = unsafe { libc::utimensat(dir, name.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) };
    sys::check(rc.into()).map(drop)
}

/// Copies the `user.*` and `trusted.*` extended attributes (the overlay's
/// opaque-directory and whiteout markers among them); best effort.
fn copy_xattrs(from: RawFd, to: RawFd) {
    let mut list = vec![0u8; 4096];
    // SAFETY: a valid descriptor and buffer.
    let n = unsafe { libc::flistxattr(from, list.as_mut_ptr().cast(), list.len()) };
    if n <= 0 {
        return;
    }
    list.truncate(n as usize);
    for key in list.split(|&b| b == 0).filter(|k| !k.is_empty()) {
        if !(key.starts_with(b"user.") || key.starts_with(b"trusted.")) {
            continue;
        }
        let Ok(key) = CString::new(key) else { continue };
        let mut value = vec![0u8; 4096];
        // SAFETY: valid descriptor, name and buffer.
        let len = unsafe { libc::fgetxattr(from, key.as_ptr(), value.as_mut_ptr().cast(), value.len()) };
        if len < 0 {
            continue;
        }
        // SAFETY: valid descriptor, name and value.
        unsafe { libc::fsetxattr(to, key.as_ptr(), value.as_ptr().cast(), len as usize, 0) };
    }
}
