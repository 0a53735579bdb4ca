//! Thin, safe wrappers over the raw Linux calls the sandbox needs.
//!
//! Each wrapper turns a failure into an [`io::Error`] and nothing more;
//! policy lives in the callers. Most calls go through `rustix`; the few
//! left on raw `libc` are those rustix has no safe form of (signal masks,
//! `mount_setattr(2)`, `SO_PEERCRED` of a peer outside our pid namespace),
//! each saying so.

use std::ffi::{CString, OsStr};
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};
use rustix::process::{Pid, PidfdFlags, Signal};

/// Converts `rc == -1` into the current `errno`.
pub fn check(rc: libc::c_long) -> io::Result<libc::c_long> {
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Builds a C string from a path; paths with NUL bytes cannot exist on Linux.
/// The one C-string helper of the crate: everything that needs a `CString`
/// of a path or name comes here.
pub fn cpath(path: &Path) -> io::Result<CString> {
    cstr(path.as_os_str())
}

pub fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The named signal `signal` (rustix has no value for unnamed numbers).
pub fn signal(signal: i32) -> io::Result<Signal> {
    Signal::from_named_raw(signal).ok_or_else(|| io::Error::from(Errno::INVAL))
}

/// A process id; 0 and negative numbers (process groups) are refused.
pub fn pid(pid: libc::pid_t) -> io::Result<Pid> {
    Pid::from_raw(pid).ok_or_else(|| io::Error::from(Errno::INVAL))
}

pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    Ok(rustix::process::pidfd_open(self::pid(pid)?, PidfdFlags::empty())?)
}

pub fn pidfd_send_signal(pidfd: &OwnedFd, signal: i32) -> io::Result<()> {
    Ok(rustix::process::pidfd_send_signal(pidfd, self::signal(signal)?)?)
}

/// Creates a pipe with both ends close-on-exec.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?)
}

/// The standard descriptor `fd` (0, 1 or 2; anything else is stderr).
pub fn stdio(fd: RawFd) -> BorrowedFd<'static> {
    match fd {
        0 => rustix::stdio::stdin(),
        1 => rustix::stdio::stdout(),
        _ => rustix::stdio::stderr(),
    }
}

/// Writes all of `buf`, retrying on EINTR and short writes.
pub fn write_all(fd: impl AsFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match rustix::io::write(&fd, buf) {
            Ok(n) => buf = &buf[n..],
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Returns a signal set holding `signals`. The signal calls stay on raw
/// `libc`: rustix offers masks and `sigwaitinfo` only as unsafe runtime calls.
pub fn sigset(signals: &[i32]) -> libc::sigset_t {
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
pub fn set_sigmask(how: libc::c_int, set: &libc::sigset_t) -> io::Result<()> {
    // SAFETY: `set` is an initialised signal set; the old mask is not needed.
    let rc = unsafe { libc::pthread_sigmask(how, set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Waits for one of the blocked signals in `set`.
pub fn sigwait(set: &libc::sigset_t) -> io::Result<i32> {
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

/// `wait4(pid, options)`: a reaped child (`pid` -1: any) with its wait
/// status and resource usage; `None` when `WNOHANG` found none to reap.
/// Raw `libc`: rustix has no wait4, and the usage is what callers want.
pub fn wait4(pid: libc::pid_t, options: libc::c_int) -> io::Result<Option<(libc::pid_t, i32, crate::Usage)>> {
    let mut status = 0;
    let mut usage = MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: wait4 writes only into `status` and `usage`, both valid.
    let rc = unsafe { libc::wait4(pid, &mut status, options, usage.as_mut_ptr()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    if rc == 0 {
        return Ok(None);
    }
    // SAFETY: zeroed rusage is valid plain data, and wait4 filled it.
    let usage = unsafe { usage.assume_init() };
    let tv = |t: libc::timeval| std::time::Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    let usage = crate::Usage {
        user_cpu: tv(usage.ru_utime),
        system_cpu: tv(usage.ru_stime),
        max_rss_kib: usage.ru_maxrss as u64,
    };
    Ok(Some((rc, status, usage)))
}

/// Asks the kernel to SIGKILL the caller when its parent exits.
pub fn die_with_parent() -> io::Result<()> {
    Ok(rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?)
}

/// `mount(2)` with the classic flag word (`MS_*`, as libc spells them).
/// A `None` source or type is passed as an empty string: the kernel reads
/// neither for the bind, remount and propagation changes that omit them.
pub fn mount(
    source: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let data = data.map(CString::new).transpose()?;
    let flags = rustix::mount::MountFlags::from_bits_retain(flags as _);
    rustix::mount::mount(source.unwrap_or(""), target, fstype.unwrap_or(""), flags, data.as_deref())?;
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
/// when `recursive`). Raw: rustix has no `mount_setattr(2)`.
pub fn mount_setattr(path: &Path, attr_set: u64, recursive: bool) -> io::Result<()> {
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

pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;

/// Opens `path` as an `O_PATH` directory descriptor (close-on-exec).
pub fn open_path(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(path, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?)
}

/// Sends `fd` over the Unix socket `sock` (SCM_RIGHTS), with one data byte.
pub fn send_fd(sock: impl AsFd, fd: BorrowedFd<'_>) -> io::Result<()> {
    send_fd_with(sock, fd, &[0u8])
}

/// Sends `data` with `fd` attached (SCM_RIGHTS); the rest of `data`, if the
/// kernel took only part of it, follows as plain writes.
pub fn send_fd_with(sock: impl AsFd, fd: BorrowedFd<'_>, data: &[u8]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    control.push(SendAncillaryMessage::ScmRights(&fds));
    let sent = rustix::net::sendmsg(&sock, &[IoSlice::new(data)], &mut control, SendFlags::empty())?;
    write_all(&sock, &data[sent..])
}

/// Receives one descriptor sent with [`send_fd`]; `None` if the peer closed.
pub fn recv_fd(sock: impl AsFd) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        &sock,
        &mut [IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    if got.bytes == 0 {
        return Ok(None);
    }
    // Only the first message counts, as before; any other descriptor the
    // buffer holds is closed when it drops.
    let first = control.drain().next();
    Ok(match first {
        Some(RecvAncillaryMessage::ScmRights(mut fds)) => fds.next(),
        _ => None,
    })
}

/// The peer of a connected Unix socket: `(pid, uid)` from `SO_PEERCRED`, the
/// pid as this process's pid namespace sees it. Raw `libc`: rustix's
/// `UCred` holds a nonzero `Pid`, but the kernel reports pid 0 for a peer
/// outside our pid namespace, which is exactly the peer this must refuse.
pub fn peer_credentials(sock: RawFd) -> io::Result<(libc::pid_t, libc::uid_t)> {
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
pub fn shares_namespaces(pid: libc::pid_t) -> bool {
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
    #[ignore = "needs unshare(1) and unprivileged user namespaces (run as root, or in CI)"]
    fn a_process_in_other_namespaces_is_not_taken_for_a_host_peer() {
        assert!(shares_namespaces(rustix::process::getpid().as_raw_nonzero().get()));
        let mut child = match std::process::Command::new("unshare").args(["-Urm", "sleep", "5"]).spawn() {
            Ok(child) => child,
            Err(e) => panic!("this test needs unshare(1): {e}"),
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
