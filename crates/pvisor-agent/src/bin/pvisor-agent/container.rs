//! Guest containers ([`GuestContainer`]): a pod's containers inside the
//! pod's VM, each in pid and mount namespaces of its own, as Kata
//! Containers' agent runs them. A container's first process is PID 1 of a
//! new pid namespace (its end ends the container, as under runc) in a new
//! mount namespace whose root is the container's rootfs; later processes
//! join both; a container that ended is not started again.
//!
//! The mount namespace is built by the container's first process between
//! fork and exec, so none of it is left in the agent's own namespace:
//! - its `/dev`: a `nodev` tmpfs holding null, zero, full, random, urandom
//!   and tty bound from the guest's (no other device opens there, and none
//!   made there opens), its own devpts (made by the agent, which opens a
//!   terminal's master there, and bound in) and `/dev/shm`; its `/sys`,
//!   read-only. An image whose `/dev`, `/proc`, `/sys` or `/tmp` is a
//!   symlink is refused: runc's rule, and what keeps the masks below in
//!   place;
//! - the guest's initramfs cannot be `pivot_root`ed, so the rootfs is moved
//!   onto `/` as runc's `no_pivot` does, after every other mount of the
//!   guest (its `/proc`, `/dev`, the workspace, the pod's directory with the
//!   other containers' roots) is detached from the namespace, and the
//!   initramfs beneath made read-only, `nodev`, `nosuid` and `noexec` there;
//!   `..` from the moved root leads back into it;
//! - a `/proc` of its pid namespace, with runc's defaults applied: the
//!   kernel's settings (`/proc/sys`, `sysrq-trigger`, `irq`, `bus`, `fs`)
//!   read-only, `kcore`, `keys`, `timer_list` and the like masked. Without
//!   that, root in one container could set `core_pattern` and run a program
//!   as the guest's root, outside every container.
//!
//! Entering runs between fork and exec, so only bare syscalls, on paths
//! resolved before the fork (beneath the root, as the image's symlinks
//! lead); the pid namespace is entered by the forking thread, a
//! short-lived one of its own ([`Entry::spawn_in`]).

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use pvisor_agent_proto::GuestContainer;

/// Where a new container's rootfs is moved while the guest's other mounts
/// are detached (a directory of the initramfs).
const STAGING: &CStr = c"/.pvisor-container";
/// The devices a container's `/dev` has, bound from the guest's: what
/// runc's default spec gives a container.
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];
/// Made read-only in a container's `/proc` (runc's default `readonlyPaths`).
const READ_ONLY: [&CStr; 5] = [c"/proc/bus", c"/proc/fs", c"/proc/irq", c"/proc/sys", c"/proc/sysrq-trigger"];
/// Files masked with `/dev/null` (runc's default `maskedPaths` that are files).
const MASKED_FILES: [&CStr; 5] =
    [c"/proc/kcore", c"/proc/keys", c"/proc/timer_list", c"/proc/latency_stats", c"/proc/sched_debug"];
/// Directories masked with an empty read-only tmpfs.
const MASKED_DIRS: [&CStr; 3] = [c"/proc/acpi", c"/proc/scsi", c"/sys/firmware"];

/// Where the agent mounts a new container's devpts instance while it
/// starts (in the guest's own `/run`, which no container sees).
const PTS: &str = "/run/pvisor-agent/pts";

/// A running container's namespaces, for its later processes to join.
pub(crate) struct Namespaces {
    pid: OwnedFd,
    mnt: OwnedFd,
    /// The exec that is its PID 1: the container ends with it.
    init: u32,
    /// Its PID 1's pid in the guest.
    init_pid: u32,
}

/// The guest's containers: the running ones by name, and the names of
/// those that ended (never started again).
#[derive(Default)]
pub(crate) struct Containers {
    running: HashMap<String, Namespaces>,
    ended: HashSet<String>,
}

/// How a process enters its container.
pub(crate) enum Entry {
    /// It starts the container: `steps` build its root's mounts, then the
    /// root becomes `/` of the new mount namespace, from which `detach`
    /// (the guest's other mounts) go.
    /// `pts` is the container's devpts instance, mounted where the agent
    /// opens terminals until it is bound into the root (unmounted when the
    /// entry is dropped).
    New { root: CString, steps: Vec<Step>, detach: Vec<CString>, pts: std::path::PathBuf },
    /// It joins a running one, whose PID 1 is `init_pid`.
    Join { pid: OwnedFd, mnt: OwnedFd, init_pid: u32 },
}

/// One step of building a new container's root, on paths made before the fork.
pub(crate) enum Step {
    Mount {
        source: CString,
        target: CString,
        fstype: CString,
        flags: libc::c_ulong,
        data: CString,
    },
    Mkdir(CString, libc::mode_t),
    /// An empty file, a device's mount point.
    Touch(CString),
    Symlink {
        target: CString,
        link: CString,
    },
}

impl Containers {
    /// Records the namespaces of a container's PID 1, just started.
    pub(crate) fn started(&mut self, name: &str, pid: u32, init: u32) -> io::Result<()> {
        let open = |kind: &str| -> io::Result<OwnedFd> {
            Ok(fs::File::open(format!("/proc/{pid}/ns/{kind}"))?.into())
        };
        let ns = Namespaces { pid: open("pid")?, mnt: open("mnt")?, init, init_pid: pid };
        self.running.insert(name.to_owned(), ns);
        Ok(())
    }

    /// Exec `id` ended: if it was a container's PID 1, so is the container.
    pub(crate) fn exited(&mut self, id: u32) {
        let ended: Vec<String> =
            self.running.iter().filter(|(_, ns)| ns.init == id).map(|(name, _)| name.clone()).collect();
        for name in ended {
            self.running.remove(&name);
            self.ended.insert(name);
        }
    }
}

/// Says how `container`'s process enters it, readying `root` for a start:
/// a start of a container that runs or ran, or a join of one that does
/// not run, is refused.
pub(crate) fn prepare(container: &GuestContainer, root: &Path, known: &Containers) -> io::Result<Entry> {
    let refuse = |why: String| Err(io::Error::new(io::ErrorKind::InvalidInput, why));
    if !container.name_is_plain() {
        return refuse(format!("{:?} is not a container name", container.name));
    }
    let name = &container.name;
    match (container.start, known.running.get(name)) {
        (false, Some(ns)) => {
            Ok(Entry::Join { pid: ns.pid.try_clone()?, mnt: ns.mnt.try_clone()?, init_pid: ns.init_pid })
        }
        (false, None) => refuse(format!("container {name} is not running")),
        (true, Some(_)) => refuse(format!("container {name} is already running")),
        (true, None) if known.ended.contains(name) => refuse(format!("container {name} has ended")),
        (true, None) => {
            let staging = Path::new(STAGING.to_str().unwrap_or("/.pvisor-container"));
            match fs::symlink_metadata(staging) {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => return refuse(format!("{} is not a directory", staging.display())),
                Err(_) => fs::create_dir(staging)?,
            }
            let pts = private_devpts(name)?;
            let made =
                root_steps(root, &pts).and_then(|steps| Ok((steps, top_level_mounts()?, cstring(root)?)));
            match made {
                Ok((steps, detach, root)) => Ok(Entry::New { root, steps, detach, pts }),
                Err(e) => {
                    release_devpts(&pts);
                    Err(e)
                }
            }
        }
    }
}

fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{} has a NUL byte", path.display()))
    })
}

/// A new devpts instance for container `name`, in the agent's own `/run`.
fn private_devpts(name: &str) -> io::Result<std::path::PathBuf> {
    let dir = Path::new(PTS).join(name);
    fs::create_dir_all(&dir)?;
    let flags = rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NOEXEC;
    crate::init::mount(
        "devpts",
        &dir.to_string_lossy(),
        "devpts",
        flags,
        "newinstance,ptmxmode=0666,mode=620",
    )?;
    Ok(dir)
}

fn release_devpts(dir: &Path) {
    let _ = rustix::mount::unmount(dir, rustix::mount::UnmountFlags::DETACH);
    let _ = fs::remove_dir(dir);
}

impl Drop for Entry {
    fn drop(&mut self) {
        if let Entry::New { pts, .. } = self {
            release_devpts(pts);
        }
    }
}

/// The steps that make `root`'s `/dev` and `/sys` (see the module's doc),
/// its `/proc` and `/tmp` made if missing, now; the mounts happen in the
/// container's namespace. `pts` is its devpts instance.
fn root_steps(root: &Path, pts: &Path) -> io::Result<Vec<Step>> {
    let at = |name: &str| -> io::Result<std::path::PathBuf> {
        let path = root.join(name);
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                let why = format!("the image's /{name} is not a directory (a container's /{name} must be)");
                return Err(io::Error::new(io::ErrorKind::InvalidInput, why));
            }
            Err(_) => fs::create_dir(&path)?,
        }
        Ok(path)
    };
    at("proc")?;
    let tmp = at("tmp")?;
    fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o1777))?;
    let dev = at("dev")?;
    let sys = at("sys")?;
    let c = |s: &str| CString::new(s).unwrap_or_default();
    let mount =
        |source: &str, target: &Path, fstype: &str, flags: libc::c_ulong, data: &str| -> io::Result<Step> {
            Ok(Step::Mount {
                source: c(source),
                target: cstring(target)?,
                fstype: c(fstype),
                flags,
                data: c(data),
            })
        };
    let hidden = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    let mut steps = vec![mount("tmpfs", &dev, "tmpfs", hidden, "mode=755,size=65536k")?];
    for name in DEVICES {
        let node = dev.join(name);
        steps.push(Step::Touch(cstring(&node)?));
        steps.push(mount(&format!("/dev/{name}"), &node, "", libc::MS_BIND, "")?);
    }
    steps.push(Step::Mkdir(cstring(&dev.join("pts"))?, 0o755));
    steps.push(mount(&pts.to_string_lossy(), &dev.join("pts"), "", libc::MS_BIND, "")?);
    steps.push(Step::Mkdir(cstring(&dev.join("shm"))?, 0o1777));
    steps.push(mount("tmpfs", &dev.join("shm"), "tmpfs", hidden, "mode=1777")?);
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        steps.push(Step::Symlink { target: c(target), link: cstring(&dev.join(link))? });
    }
    steps.push(mount("sysfs", &sys, "sysfs", hidden | libc::MS_RDONLY, "")?);
    Ok(steps)
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

fn ok(r: libc::c_int) -> io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `ok`, where a path the kernel lacks (`ENOENT`) is nothing to do.
fn ok_if_present(r: libc::c_int) -> io::Result<()> {
    match ok(r) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        other => other,
    }
}

impl Step {
    /// Only bare syscalls: it runs between fork and exec.
    fn run(&self) -> io::Result<()> {
        // SAFETY: each call takes NUL-terminated strings made before the
        // fork, integers, or null.
        unsafe {
            match self {
                Step::Mount { source, target, fstype, flags, data } => {
                    let fstype = if fstype.is_empty() { std::ptr::null() } else { fstype.as_ptr() };
                    let data = if data.is_empty() { std::ptr::null() } else { data.as_ptr().cast() };
                    ok(libc::mount(source.as_ptr(), target.as_ptr(), fstype, *flags, data))
                }
                Step::Mkdir(path, mode) => ok(libc::mkdir(path.as_ptr(), *mode)),
                Step::Touch(path) => {
                    let fd = libc::open(
                        path.as_ptr(),
                        libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                        0o644,
                    );
                    if fd < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    ok(libc::close(fd))
                }
                Step::Symlink { target, link } => ok(libc::symlink(target.as_ptr(), link.as_ptr())),
            }
        }
    }
}

impl Entry {
    /// Runs `spawn` (the fork) on a thread of its own that has entered the
    /// container's pid namespace, or made it: a thread's first child in a
    /// new pid namespace is its PID 1, and the thread cannot fork there
    /// again once that child has ended.
    pub(crate) fn spawn_in<T: Send>(&self, spawn: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
        let enter = || -> io::Result<()> {
            match self {
                // SAFETY: unshare takes flags only.
                Entry::New { .. } => ok(unsafe { libc::unshare(libc::CLONE_NEWPID) }),
                // SAFETY: setns takes a descriptor we own and flags.
                Entry::Join { pid, .. } => ok(unsafe { libc::setns(pid.as_raw_fd(), libc::CLONE_NEWPID) }),
            }
        };
        std::thread::scope(|scope| {
            let spawned = scope.spawn(|| enter().and_then(|()| spawn()));
            spawned.join().unwrap_or_else(|_| Err(io::Error::other("the forking thread panicked")))
        })
    }

    /// Opens a terminal's master in the container's devpts instance: the
    /// agent's mount of it while the container starts; through its PID 1's
    /// root (resolved inside it) once it runs.
    pub(crate) fn ptmx(&self) -> io::Result<OwnedFd> {
        use rustix::fs::{Mode, OFlags, ResolveFlags};
        let flags = OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC;
        let opened = match self {
            Entry::New { pts, .. } => rustix::fs::open(pts.join("ptmx"), flags, Mode::empty()),
            Entry::Join { init_pid, .. } => {
                let root = format!("/proc/{init_pid}/root");
                let root = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
                let resolve = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS;
                rustix::fs::openat2(&root, "dev/pts/ptmx", flags, Mode::empty(), resolve)
            }
        };
        Ok(opened?)
    }

    /// Puts the calling process (forked, single-threaded, still root) in
    /// its container's mount namespace, at its root. Only bare syscalls.
    pub(crate) fn enter(&self) -> io::Result<()> {
        match self {
            // SAFETY: setns takes a descriptor we own and flags.
            Entry::Join { mnt, .. } => ok(unsafe { libc::setns(mnt.as_raw_fd(), libc::CLONE_NEWNS) }),
            Entry::New { root, steps, detach, .. } => {
                let none = std::ptr::null();
                // SAFETY: each call takes NUL-terminated strings made before
                // the fork, or null, and flags; none allocates.
                unsafe {
                    ok(libc::unshare(libc::CLONE_NEWNS))?;
                    ok(libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_SLAVE, none.cast()))?;
                    for step in steps {
                        step.run()?;
                    }
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
                        match ok(libc::umount2(point.as_ptr(), libc::MNT_DETACH)) {
                            Err(e) if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) => {
                                return Err(e)
                            }
                            _ => {}
                        }
                    }
                    // What is left of the guest's root beneath: nothing a
                    // process that climbs there can write, run or open.
                    let bare = libc::MS_REMOUNT
                        | libc::MS_BIND
                        | libc::MS_RDONLY
                        | libc::MS_NOSUID
                        | libc::MS_NODEV
                        | libc::MS_NOEXEC;
                    ok(libc::mount(none, c"/".as_ptr(), none, bare, none.cast()))?;
                    ok(libc::chdir(STAGING.as_ptr()))?;
                    ok(libc::mount(c".".as_ptr(), c"/".as_ptr(), none, libc::MS_MOVE, none.cast()))?;
                    ok(libc::chroot(c".".as_ptr()))?;
                    ok(libc::chdir(c"/".as_ptr()))?;
                }
                own_proc()
            }
        }
    }
}

/// The container's `/proc` (of its pid namespace), with runc's defaults:
/// the kernel's settings read-only, what leaks the guest's state masked.
fn own_proc() -> io::Result<()> {
    let none: *const libc::c_char = std::ptr::null();
    let hidden = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: as in `enter`: literals, flags and null only.
    unsafe {
        ok(libc::mount(c"proc".as_ptr(), c"/proc".as_ptr(), c"proc".as_ptr(), hidden, none.cast()))?;
        for path in READ_ONLY {
            ok_if_present(libc::mount(
                path.as_ptr(),
                path.as_ptr(),
                none,
                libc::MS_BIND | libc::MS_REC,
                none.cast(),
            ))?;
            let read_only = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | hidden;
            ok_if_present(libc::mount(path.as_ptr(), path.as_ptr(), none, read_only, none.cast()))?;
        }
        for path in MASKED_FILES {
            ok_if_present(libc::mount(
                c"/dev/null".as_ptr(),
                path.as_ptr(),
                none,
                libc::MS_BIND,
                none.cast(),
            ))?;
        }
        for path in MASKED_DIRS {
            let flags = libc::MS_RDONLY | hidden;
            ok_if_present(libc::mount(
                c"tmpfs".as_ptr(),
                path.as_ptr(),
                c"tmpfs".as_ptr(),
                flags,
                none.cast(),
            ))?;
        }
    }
    Ok(())
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

    /// A container's name is started once: a second start, a start after
    /// its end and a join of one that does not run are refused.
    #[test]
    fn a_container_starts_once_and_is_joined_only_while_it_runs() {
        let mut known = Containers::default();
        let guest = |start: bool| GuestContainer { name: "c1".into(), start, ..Default::default() };
        let refused = |g: GuestContainer, known: &Containers| {
            prepare(&g, Path::new("/nonexistent-root"), known)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(refused(guest(false), &known).contains("not running"));
        let own = std::process::id();
        known.started("c1", own, 7).expect("our own namespaces");
        assert!(refused(guest(true), &known).contains("already running"));
        let joined = prepare(&guest(false), Path::new("/"), &known);
        assert!(matches!(joined, Ok(Entry::Join { init_pid, .. }) if init_pid == own));
        known.exited(7);
        assert!(refused(guest(true), &known).contains("has ended"));
        assert!(refused(guest(false), &known).contains("not running"));
    }
}
