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

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat, Timespec, Timestamps, XattrFlags, CWD};
use rustix::io::Errno;

use super::helper::StepError;
use pvisor_sandbox::sys;

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
    let disk = open_dir(CWD, &cpath(upper)?).map_err(|e| err("open the stage", e))?;
    // One inode per 4 KiB of quota, as a disk filesystem would have.
    let options = format!("size={bytes},nr_inodes={},mode=0700", (bytes / 4096).max(1024));
    super::mounts::tmpfs(work, &options, 0)?;
    let (mem_upper, mem_work) = (work.join("upper"), work.join("work"));
    for dir in [&mem_upper, &mem_work] {
        std::fs::create_dir(dir).map_err(|e| err("create the stage's layers", e))?;
    }
    let memory = open_dir(CWD, &cpath(&mem_upper)?).map_err(|e| err("open the tmpfs", e))?;
    Ok((MemoryStage { memory, disk, limit: bytes }, mem_upper, mem_work))
}

fn cpath(path: &Path) -> Result<CString, StepError> {
    sys::cpath(path).map_err(|_| StepError::new("disk-quota", "a stage path holds a NUL byte"))
}

fn open_dir(at: impl AsFd, name: &CStr) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(rustix::fs::openat(at, name, flags, Mode::empty())?)
}

fn fstatat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Stat> {
    Ok(rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?)
}

fn names(dir: BorrowedFd<'_>) -> io::Result<Vec<CString>> {
    // A fresh descriptor for the stream (opened on ".", so at its start).
    let mut stream = rustix::fs::Dir::read_from(dir)?;
    let mut out = Vec::new();
    while let Some(entry) = stream.read() {
        let entry = entry?;
        let name = entry.file_name();
        if name != c"." && name != c".." {
            out.push(name.to_owned());
        }
    }
    Ok(out)
}

/// Why the copy of the memory stage to the disk stopped, and where.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CopyOutError {
    #[error("copying the stage out of memory at {at:?}: {source}")]
    Io { at: String, source: io::Error },
    #[error(
        "the staged files add up to more than the --disk quota of {limit} bytes (hard links are copied as separate files); the copy stopped at {at:?}"
    )]
    Quota { limit: u64, at: String },
}

/// Copies the tmpfs upper layer to the stage on disk. The first error
/// stops the copy and is returned: the run's records then say the stage is
/// incomplete.
pub(crate) fn copy_out(stage: &MemoryStage) -> Result<(), CopyOutError> {
    let describe = |at: &[u8], source: io::Error| CopyOutError::Io {
        at: String::from_utf8_lossy(at).into_owned(),
        source,
    };
    // The directories still to list, each as (depth, names left); only the
    // current pair of directory descriptors is open, so depth is unlimited.
    let mut memory = open_dir(stage.memory.as_fd(), c".").map_err(|e| describe(b".", e))?;
    let mut disk = open_dir(stage.disk.as_fd(), c".").map_err(|e| describe(b".", e))?;
    copy_xattrs(memory.as_fd(), disk.as_fd());
    let mut pending: Vec<Vec<CString>> = vec![names(memory.as_fd()).map_err(|e| describe(b".", e))?];
    let mut path: Vec<u8> = Vec::new();
    let mut written = 0u64;
    while let Some(level) = pending.last_mut() {
        let Some(name) = level.pop() else {
            pending.pop();
            finish_dir(memory.as_fd(), disk.as_fd());
            if pending.is_empty() {
                break;
            }
            memory = open_dir(memory.as_fd(), c"..").map_err(|e| describe(&path, e))?;
            disk = open_dir(disk.as_fd(), c"..").map_err(|e| describe(&path, e))?;
            let cut = path.iter().rposition(|&b| b == b'/').unwrap_or(0);
            path.truncate(cut);
            continue;
        };
        let shown = [path.as_slice(), b"/", name.as_bytes()].concat();
        let st = fstatat(memory.as_fd(), &name).map_err(|e| describe(&shown, e))?;
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            match rustix::fs::mkdirat(disk.as_fd(), &name, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(describe(&shown, e.into())),
            }
            let child_memory = open_dir(memory.as_fd(), &name).map_err(|e| describe(&shown, e))?;
            let child_disk = open_dir(disk.as_fd(), &name).map_err(|e| describe(&shown, e))?;
            copy_xattrs(child_memory.as_fd(), child_disk.as_fd());
            let listed = names(child_memory.as_fd()).map_err(|e| describe(&shown, e))?;
            (memory, disk) = (child_memory, child_disk);
            pending.push(listed);
            path = shown;
            continue;
        }
        written = written.saturating_add(st.st_blocks as u64 * 512);
        if written > stage.limit {
            return Err(CopyOutError::Quota {
                limit: stage.limit,
                at: String::from_utf8_lossy(&shown).into_owned(),
            });
        }
        copy_entry(memory.as_fd(), disk.as_fd(), &name, &st).map_err(|e| describe(&shown, e))?;
    }
    // Made durable by the seal, as every stage is, after the exit is reported.
    Ok(())
}

/// Gives a copied directory its source's owner, mode and times, last (a
/// mode without write permission would have stopped the copy into it).
fn finish_dir(memory: BorrowedFd<'_>, disk: BorrowedFd<'_>) {
    let Ok(st) = rustix::fs::fstat(memory) else { return };
    // Failures leave pvisor's defaults.
    let _ = rustix::fs::fchown(disk, Some(uid(&st)), Some(gid(&st)));
    let _ = rustix::fs::fchmod(disk, Mode::from_raw_mode(st.st_mode & 0o7777));
    let _ = rustix::fs::futimens(disk, &times(&st));
}

fn uid(st: &Stat) -> rustix::fs::Uid {
    rustix::fs::Uid::from_raw(st.st_uid)
}

fn gid(st: &Stat) -> rustix::fs::Gid {
    rustix::fs::Gid::from_raw(st.st_gid)
}

fn times(st: &Stat) -> Timestamps {
    Timestamps {
        last_access: Timespec { tv_sec: st.st_atime as _, tv_nsec: st.st_atime_nsec as _ },
        last_modification: Timespec { tv_sec: st.st_mtime as _, tv_nsec: st.st_mtime_nsec as _ },
    }
}

fn copy_entry(memory: BorrowedFd<'_>, disk: BorrowedFd<'_>, name: &CStr, st: &Stat) -> io::Result<()> {
    let chown = || {
        // A failure keeps init's ownership.
        let _ = rustix::fs::chownat(disk, name, Some(uid(st)), Some(gid(st)), AtFlags::SYMLINK_NOFOLLOW);
    };
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {
            let open = |dir: BorrowedFd<'_>, flags: OFlags| -> io::Result<File> {
                let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                Ok(File::from(rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o600))?))
            };
            let from = open(memory, OFlags::RDONLY)?;
            let to = open(disk, OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC)?;
            pvisor_core::digest::copy_sparse(&from, &to)?;
            copy_xattrs(from.as_fd(), to.as_fd());
            chown();
            rustix::fs::fchmod(&to, Mode::from_raw_mode(st.st_mode & 0o7777))?;
        }
        FileType::Symlink => {
            let target = rustix::fs::readlinkat(memory, name, Vec::with_capacity(libc::PATH_MAX as usize))?;
            rustix::fs::symlinkat(&target, disk, name)?;
            chown();
        }
        // Whiteouts (character device 0:0) may be made without CAP_MKNOD;
        // fifos by anyone. Sockets and other devices cannot be copied and
        // are staged as nothing (the seal would refuse them anyway).
        kind @ (FileType::CharacterDevice | FileType::Fifo) => {
            rustix::fs::mknodat(disk, name, kind, Mode::from_raw_mode(st.st_mode), st.st_rdev as _)?;
            chown();
        }
        _ => return Ok(()),
    }
    set_times(disk, name, st)
}

fn set_times(dir: BorrowedFd<'_>, name: &CStr, st: &Stat) -> io::Result<()> {
    Ok(rustix::fs::utimensat(dir, name, &times(st), AtFlags::SYMLINK_NOFOLLOW)?)
}

/// Copies the `user.*` and `trusted.*` extended attributes (the overlay's
/// opaque-directory and whiteout markers among them); best effort.
fn copy_xattrs(from: BorrowedFd<'_>, to: BorrowedFd<'_>) {
    let mut list = vec![0u8; 4096];
    let Ok(n) = rustix::fs::flistxattr(from, &mut list[..]) else { return };
    if n == 0 {
        return;
    }
    list.truncate(n);
    for key in list.split(|&b| b == 0).filter(|k| !k.is_empty()) {
        if !(key.starts_with(b"user.") || key.starts_with(b"trusted.")) {
            continue;
        }
        let Ok(key) = CString::new(key) else { continue };
        let mut value = vec![0u8; 4096];
        let Ok(len) = rustix::fs::fgetxattr(from, &key, &mut value[..]) else { continue };
        let _ = rustix::fs::fsetxattr(to, &key, &value[..len], XattrFlags::empty());
    }
}
