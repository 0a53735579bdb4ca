//! Guest containers ([`GuestContainer`]): a pod's containers inside the
//! pod's VM, each in pid and mount namespaces of its own, as Kata
//! Containers' agent runs them. A container's first process is PID 1 of a
//! new pid namespace (its end ends the container, as under runc) in a new
//! mount namespace whose root is the container's rootfs; later processes
//! join both.
//!
//! The guest's root is the initramfs, which `pivot_root` cannot leave, so
//! the new mount namespace is made as runc's `no_pivot` makes it, with
//! what that leaves reachable taken away first: every other mount of the
//! guest (its `/proc`, `/dev`, the workspace, the pod's directory holding
//! the other containers' roots) is detached from the namespace before the
//! rootfs is moved onto `/`. A process that climbs out of its chroot
//! (`CAP_SYS_CHROOT`) finds only the initramfs's own files. The rootfs's
//! `/dev` holds the standard devices only (not the guest's disks), and its
//! `/proc` is the container's pid namespace's.
//!
//! Entering runs between fork and exec, so only bare syscalls, on paths
//! made before the fork; the pid namespace is entered by the forking
//! thread, a short-lived one of its own ([`Entry::spawn_in`]).

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use pvisor_agent_proto::GuestContainer;
use rustix::mount::MountFlags;

use crate::init::mount;

/// Where a new container's rootfs is moved while the guest's other mounts
/// are detached (a directory of the initramfs).
const STAGING: &CStr = c"/.pvisor-container";
/// The devices a container's `/dev` has, bound from the guest's: what
/// runc's default spec gives a container.
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// A running container's namespaces, for its later processes to join.
pub(crate) struct Namespaces {
    pid: OwnedFd,
    mnt: OwnedFd,
    /// The exec that is its PID 1: the container ends with it.
    pub(crate) init: u32,
}

/// The running containers, by name.
pub(crate) type Containers = HashMap<String, Namespaces>;

/// How a process enters its container.
pub(crate) enum Entry {
    /// It starts the container: `root` becomes `/` of a new mount
    /// namespace, from which `detach` (the guest's other mounts) go.
    New { root: CString, detach: Vec<CString> },
    /// It joins a running one.
    Join { pid: OwnedFd, mnt: OwnedFd },
}

impl Namespaces {
    /// The namespaces of a new container's PID 1, just started.
    pub(crate) fn of(pid: u32, init: u32) -> io::Result<Namespaces> {
        let open = |kind: &str| -> io::Result<OwnedFd> {
            let path = format!("/proc/{pid}/ns/{kind}");
            Ok(fs::File::open(path)?.into())
        };
        Ok(Namespaces { pid: open("pid")?, mnt: open("mnt")?, init })
    }
}

/// Readies `root` for `container` and says how its process enters: it
/// joins the container if it runs, or starts it.
pub(crate) fn prepare(container: &GuestContainer, root: &Path, running: &Containers) -> io::Result<Entry> {
    if !container.name_is_plain() {
        let message = format!("{:?} is not a container name", container.name);
        return Err(io::Error::new(io::ErrorKind::InvalidInput, message));
    }
    if let Some(ns) = running.get(&container.name) {
        return Ok(Entry::Join { pid: ns.pid.try_clone()?, mnt: ns.mnt.try_clone()? });
    }
    prepare_root(root)?;
    fs::create_dir_all(Path::new(STAGING.to_str().unwrap_or("/.pvisor-container")))?;
    let root = CString::new(root.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the root has a NUL byte"))?;
    Ok(Entry::New { root, detach: top_level_mounts()? })
}

/// The mount points whose parent is the guest's root mount: detaching
/// them (recursively) leaves the root mount bare.
fn top_level_mounts() -> io::Result<Vec<CString>> {
    let table = fs::read_to_string("/proc/self/mountinfo")?;
    let entries: Vec<(&str, &str, &str)> = table
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            Some((fields.next()?, fields.next()?, fields.nth(2)?))
        })
        .collect();
    let root = entries.iter().find(|(_, _, point)| *point == "/").map(|(id, _, _)| *id);
    let points = entries
        .iter()
        .filter(|(_, parent, point)| Some(*parent) == root && *point != "/")
        .filter_map(|(_, _, point)| CString::new(unescape(point)).ok());
    Ok(points.collect())
}

/// A mountinfo path: spaces, tabs, newlines and backslashes come as `\ooo`.
fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |n, b| n.wrapping_mul(8).wrapping_add(b - b'0')));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

/// Makes `root` a container's root: `/proc`, `/sys` (read-only), `/tmp`,
/// and a `/dev` of its own (a tmpfs with the standard devices bound from
/// the guest's, its own devpts and `/dev/shm`). Each place is resolved
/// beneath the root, as the image's symlinks lead, so no symlink in an
/// image makes the agent mount on the guest's own directories.
fn prepare_root(root: &Path) -> io::Result<()> {
    let at = |path: &str| -> io::Result<String> {
        let resolved = pvisor_agent_proto::resolve_in_root(root, Path::new(path), true)?;
        fs::create_dir_all(&resolved)?;
        Ok(resolved.to_string_lossy().into_owned())
    };
    let hidden = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    // The guest's, replaced by the container's own at its start.
    mount("proc", &at("/proc")?, "proc", hidden, "")?;
    mount("sysfs", &at("/sys")?, "sysfs", hidden | MountFlags::RDONLY, "")?;
    let tmp = at("/tmp")?;
    fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o1777))?;
    let dev = at("/dev")?;
    mount("tmpfs", &dev, "tmpfs", MountFlags::NOSUID, "mode=755,size=65536k")?;
    for name in DEVICES {
        let node = Path::new(&dev).join(name);
        fs::File::create(&node)?;
        let node = node.to_string_lossy();
        mount(&format!("/dev/{name}"), &node, "", MountFlags::BIND, "")?;
    }
    for dir in ["pts", "shm"] {
        fs::create_dir(Path::new(&dev).join(dir))?;
    }
    let pts = format!("{dev}/pts");
    mount(
        "devpts",
        &pts,
        "devpts",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        "newinstance,ptmxmode=0666,mode=620",
    )?;
    mount("tmpfs", &format!("{dev}/shm"), "tmpfs", hidden, "mode=1777")?;
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, Path::new(&dev).join(link))?;
    }
    Ok(())
}

impl Entry {
    /// Runs `spawn` (the fork) on a thread of its own that has entered the
    /// container's pid namespace, or made it: a thread's first child in a
    /// new pid namespace is its PID 1, and the thread cannot fork there
    /// again once that child has ended.
    pub(crate) fn spawn_in<T: Send>(&self, spawn: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
        let enter = || -> io::Result<()> {
            let done = match self {
                // SAFETY: unshare takes flags only.
                Entry::New { .. } => unsafe { libc::unshare(libc::CLONE_NEWPID) },
                // SAFETY: setns takes a descriptor we own and flags.
                Entry::Join { pid, .. } => unsafe { libc::setns(pid.as_raw_fd(), libc::CLONE_NEWPID) },
            };
            if done != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        };
        std::thread::scope(|scope| {
            let spawned = scope.spawn(|| enter().and_then(|()| spawn()));
            spawned.join().unwrap_or_else(|_| Err(io::Error::other("the forking thread panicked")))
        })
    }

    /// Puts the calling process (forked, single-threaded, still root) in
    /// its container's mount namespace, at its root. Only bare syscalls.
    pub(crate) fn enter(&self) -> io::Result<()> {
        let ok = |r: libc::c_int| if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) };
        let none = std::ptr::null();
        // SAFETY: each call takes NUL-terminated strings made before the
        // fork, or null, and flags; none allocates.
        unsafe {
            match self {
                Entry::Join { mnt, .. } => ok(libc::setns(mnt.as_raw_fd(), libc::CLONE_NEWNS)),
                Entry::New { root, detach } => {
                    ok(libc::unshare(libc::CLONE_NEWNS))?;
                    ok(libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_SLAVE, none.cast()))?;
                    ok(libc::mount(
                        root.as_ptr(),
                        root.as_ptr(),
                        none,
                        libc::MS_BIND | libc::MS_REC,
                        none.cast(),
                    ))?;
                    ok(libc::mount(root.as_ptr(), STAGING.as_ptr(), none, libc::MS_MOVE, none.cast()))?;
                    for point in detach {
                        // One already gone with another is no error.
                        libc::umount2(point.as_ptr(), libc::MNT_DETACH);
                    }
                    ok(libc::chdir(STAGING.as_ptr()))?;
                    ok(libc::mount(c".".as_ptr(), c"/".as_ptr(), none, libc::MS_MOVE, none.cast()))?;
                    ok(libc::chroot(c".".as_ptr()))?;
                    ok(libc::chdir(c"/".as_ptr()))?;
                    // The guest's /proc, then the container's own.
                    libc::umount2(c"/proc".as_ptr(), libc::MNT_DETACH);
                    let hidden = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
                    ok(libc::mount(
                        c"proc".as_ptr(),
                        c"/proc".as_ptr(),
                        c"proc".as_ptr(),
                        hidden,
                        none.cast(),
                    ))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape(r"/run/a\040b\134c"), b"/run/a b\\c");
        assert_eq!(unescape(r"/plain"), b"/plain");
        assert_eq!(unescape(r"/odd\04"), b"/odd\\04");
    }
}
