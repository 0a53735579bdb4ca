//! Thin, safe wrappers over the raw Linux calls the sandbox needs.
//!
//! Each wrapper turns a `-1` into an [`io::Error`] from `errno` and nothing
//! more; policy lives in the callers.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Converts `rc == -1` into the current `errno`.
pub(crate) fn check(rc: libc::c_long) -> io::Result<libc::c_long> {
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Builds a C string from a path; paths with NUL bytes cannot exist on Linux.
pub(crate) fn cpath(path: &Path) -> io::Result<CString> {
    cstr(path.as_os_str())
}

pub(crate) fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

pub(crate) fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
    let fd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: the kernel just returned this descriptor to us; we own it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

pub(crate) fn pidfd_send_signal(pidfd: &OwnedFd, signal: i32) -> io::Result<()> {
    // SAFETY: a valid pidfd, a signal number, no siginfo, no flags.
    check(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    })?;
    Ok(())
}

/// Creates a pipe with both ends close-on-exec.
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }.into())?;
    // SAFETY: pipe2 succeeded, so both descriptors are new and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Writes all of `buf`, retrying on EINTR and short writes.
pub(crate) fn write_all(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is a valid readable slice.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// Returns a signal set holding `signals`.
pub(crate) fn sigset(signals: &[i32]) -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the zeroed set; sigaddset only adds members.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Replaces the calling thread's signal mask.
pub(crate) fn set_sigmask(how: libc::c_int, set: &libc::sigset_t) -> io::Result<()> {
    // SAFETY: `set` is an initialised signal set; the old mask is not needed.
    let rc = unsafe { libc::pthread_sigmask(how, set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Waits for one of the blocked signals in `set`.
pub(crate) fn sigwait(set: &libc::sigset_t) -> io::Result<i32> {
    loop {
        // SAFETY: `set` is initialised; siginfo is not needed.
        let sig = unsafe { libc::sigwaitinfo(set, std::ptr::null_mut()) };
        if sig >= 0 {
            return Ok(sig);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Asks the kernel to SIGKILL the caller when its parent exits.
pub(crate) fn die_with_parent() -> io::Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) }.into())?;
    Ok(())
}

pub(crate) fn mount(
    source: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let source = source.map(CString::new).transpose()?;
    let target = cpath(target)?;
    let fstype = fstype.map(CString::new).transpose()?;
    let data = data.map(CString::new).transpose()?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is either null or a NUL-terminated string that outlives the call.
    let rc = unsafe { libc::mount(ptr(&source), target.as_ptr(), ptr(&fstype), flags, ptr(&data).cast()) };
    check(rc.into())?;
    Ok(())
}

/// `struct mount_attr` for mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Sets mount attributes on the mount at `path` (and every mount below it,
/// when `recursive`).
pub(crate) fn mount_setattr(path: &Path, attr_set: u64, recursive: bool) -> io::Result<()> {
    let target = cpath(path)?;
    let attr = MountAttr { attr_set, attr_clr: 0, propagation: 0, userns_fd: 0 };
    // SAFETY: a valid path, AT_RECURSIVE, and a correctly sized mount_attr.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            target.as_ptr(),
            if recursive { libc::AT_RECURSIVE } else { 0 },
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    Ok(())
}

pub(crate) const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub(crate) const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub(crate) const MOUNT_ATTR_NODEV: u64 = 0x4;

/// Opens `path` as an `O_PATH` directory descriptor (close-on-exec).
pub(crate) fn open_path(path: &Path) -> io::Result<OwnedFd> {
    let c = cpath(path)?;
    // SAFETY: a valid NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sends `fd` over the Unix socket `sock` (SCM_RIGHTS), with one data byte.
pub(crate) fn send_fd(sock: RawFd, fd: RawFd) -> io::Result<()> {
    send_fd_with(sock, fd, &[0u8])
}

/// Sends `data` with `fd` attached (SCM_RIGHTS); the rest of `data`, if the
/// kernel took only part of it, follows as plain writes.
pub(crate) fn send_fd_with(sock: RawFd, fd: RawFd, data: &[u8]) -> io::Result<()> {
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: zeroed msghdr is valid; every pointer set below outlives sendmsg.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        let sent = check(libc::sendmsg(sock, &msg, 0) as libc::c_long)? as usize;
        write_all(sock, &data[sent..])?;
    }
    Ok(())
}

/// Receives one descriptor sent with [`send_fd`]; `None` if the peer closed.
pub(crate) fn recv_fd(sock: RawFd) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: zeroed msghdr is valid; every pointer set below outlives recvmsg,
    // and the control data is read only as the kernel filled it.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        let n = check(libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) as libc::c_long)?;
        if n == 0 {
            return Ok(None);
        }
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() || (*cmsg).cmsg_level != libc::SOL_SOCKET || (*cmsg).cmsg_type != libc::SCM_RIGHTS {
            return Ok(None);
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
        Ok(Some(OwnedFd::from_raw_fd(fd)))
    }
}

/// The peer of a connected Unix socket: `(pid, uid)` from `SO_PEERCRED`, the
/// pid as this process's pid namespace sees it.
pub(crate) fn peer_credentials(sock: RawFd) -> io::Result<(libc::pid_t, libc::uid_t)> {
    // SAFETY: zeroed ucred is a valid out-parameter.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid socket, out-pointer and length.
    let rc = unsafe {
        libc::getsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    check(rc.into())?;
    Ok((cred.pid, cred.uid))
}

/// Whether `pid` shares this process's user and mount namespaces: it is not
/// inside any sandbox (each has its own of both).
pub(crate) fn shares_namespaces(pid: libc::pid_t) -> bool {
    ["user", "mnt"].iter().all(|ns| {
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}"));
        let ours = std::fs::read_link(format!("/proc/self/ns/{ns}"));
        matches!((theirs, ours), (Ok(a), Ok(b)) if a == b)
    })
}

#[cfg(test)]
mod peer_tests {
    use super::*;

    #[test]
    fn a_process_in_other_namespaces_is_not_taken_for_a_host_peer() {
        // SAFETY: getpid has no preconditions.
        assert!(shares_namespaces(unsafe { libc::getpid() }));
        let mut child = match std::process::Command::new("unshare").args(["-Urm", "sleep", "5"]).spawn() {
            Ok(child) => child,
            Err(e) => return eprintln!("skipped: no unshare ({e})"),
        };
        let pid = child.id() as libc::pid_t;
        let moved = (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            std::fs::read_link(format!("/proc/{pid}/ns/user")).ok()
                != std::fs::read_link("/proc/self/ns/user").ok()
        });
        let shares = shares_namespaces(pid);
        let _ = child.kill();
        let _ = child.wait();
        assert!(moved && !shares);
    }
}
