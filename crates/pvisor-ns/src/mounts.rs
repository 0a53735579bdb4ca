//! Assembles the sandbox's filesystem inside init's new mount namespace.
//!
//! The result, after `pivot_root`:
//! - `/` shows the host's filesystems read-only, nosuid and nodev, each as an
//!   overlay of itself so no host Unix socket can be connected to
//!   (`host_view.rs`);
//! - the workspace path is an overlayfs (lower = the live workspace,
//!   upper/work = the Run's stage, `userxattr` so it works in a user namespace,
//!   `volatile` because the seal, not the overlay, makes the stage durable);
//! - `/tmp`, `/run` and `/dev/shm` are private tmpfs, sized so that together
//!   they stay within the run's memory limit (`limits::TmpfsSizes`); `/proc`
//!   is a fresh procfs for the new pid namespace; `/dev` is a small tmpfs
//!   with only null, zero, full, random, urandom, tty (each bound read-only,
//!   so the host's device node cannot be `chmod`ed) and a private devpts instance;
//! - each `--ro` path is shown read-only at its own place, like the host view;
//! - each `--state` path is the Job's own writable copy, its parent a
//!   writable overlay whose upper is the Job's (`host_view::mount_state`);
//! - every hidden path (the state directory, the user's secret stores) is an
//!   empty read-only tmpfs (directories) or a read-only `/dev/null` (files).
//!
//! Private mounts are made before the workspace overlay, so a workspace that
//! lives under `/tmp` still appears (its mount point is created in the new tmpfs).

use std::fs;
use std::io;
use std::path::Path;

use super::helper::{under, StepError};
use super::host_view::{self, HostView};
use super::memory_stage::{self, MemoryStage};
use pvisor_sandbox::sys;
use pvisor_sandbox::SandboxSpec;

/// What init keeps from the assembly: the host view's gaps, and the memory
/// stage to copy out when the command has ended (with `--disk`).
#[derive(Debug)]
pub(crate) struct Assembled {
    pub view: HostView,
    pub memory_stage: Option<MemoryStage>,
}

pub(crate) fn assemble(spec: &SandboxSpec) -> Result<Assembled, StepError> {
    let root = spec.root_mount.as_path();
    sys::mount(None, Path::new("/"), None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(|e| mount_err("mount-namespace", "make / private", e))?;
    let view = host_view::assemble(root)?;

    let sizes = pvisor_sandbox::limits::TmpfsSizes::for_limits(&spec.limits);
    tmpfs(&under(root, Path::new("/tmp")), &format!("mode=1777,size={}", sizes.tmp), 0)?;
    private_run(root, sizes.run)?;
    minimal_dev(root, &sizes)?;
    sys::mount(
        Some("proc"),
        &under(root, Path::new("/proc")),
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )
    .map_err(|e| {
        mount_err("proc", "mount a fresh /proc", e).hint(
            "the kernel refuses procfs in a user namespace when the host /proc has masked paths (as in some containers); run pvisor on the host or in a VM",
        )
    })?;

    protect_proc(&under(root, Path::new("/proc")))?;

    // First: a state parent is often $HOME, which holds caches, `--ro`
    // paths and the workspace, each mounted on top of it below.
    host_view::mount_state(root, &spec.state)?;
    host_view::mount_caches(root, &spec.caches)?;
    // Before the workspace's overlay, which stays on top of a `--ro` parent.
    host_view::show_read_only(root, &spec.read_only)?;
    host_view::show_ca_bundle(root, spec.ca_bundle.as_deref())?;
    let memory_stage = overlay_workspace(spec, root)?;
    // After the overlay, so a hidden path inside the workspace is hidden too.
    for hidden in &spec.hidden {
        hide(&under(root, hidden))?;
    }
    host_view::expose_sockets(root, &spec.exposed_sockets)?;

    let enter = |what: &str, e: io::Error| mount_err("pivot-root", what, e);
    std::env::set_current_dir(root).map_err(|e| enter("enter the new root", e))?;
    // pivot_root(".", ".") stacks the old root under the new one; the
    // umount below detaches it.
    rustix::process::pivot_root(".", ".").map_err(|e| enter("pivot_root", e.into()))?;
    rustix::mount::unmount(".", rustix::mount::UnmountFlags::DETACH)
        .map_err(|e| enter("detach the host root", e.into()))?;
    std::env::set_current_dir("/").map_err(|e| enter("enter /", e))?;
    Ok(Assembled { view, memory_stage })
}

/// Parts of a fresh /proc that reach the host kernel itself. Sysctl writes are
/// checked by uid, not capability, so with real root's identity map uid 0 in
/// the sandbox could set `kernel.core_pattern` (a host-root command) without
/// any capability. As runc does, these are bound read-only over themselves,
/// and the kernel's memory image is masked.
const PROC_READ_ONLY: [&str; 5] = ["sys", "sysrq-trigger", "irq", "bus", "fs"];
const PROC_MASKED: [&str; 3] = ["kcore", "keys", "timer_list"];

fn protect_proc(proc: &Path) -> Result<(), StepError> {
    for name in PROC_READ_ONLY {
        let path = proc.join(name);
        if !path.exists() {
            continue;
        }
        sys::mount(Some(&path.to_string_lossy()), &path, None, libc::MS_BIND | libc::MS_REC, None)
            .map_err(|e| mount_err("proc", &format!("bind /proc/{name}"), e))?;
        sys::mount(
            None,
            &path,
            None,
            libc::MS_BIND
                | libc::MS_REMOUNT
                | libc::MS_RDONLY
                | libc::MS_NOSUID
                | libc::MS_NODEV
                | libc::MS_NOEXEC,
            None,
        )
        .map_err(|e| mount_err("proc", &format!("make /proc/{name} read-only"), e))?;
    }
    for name in PROC_MASKED {
        let path = proc.join(name);
        if path.exists() {
            sys::mount(Some("/dev/null"), &path, None, libc::MS_BIND, None)
                .map_err(|e| mount_err("proc", &format!("mask /proc/{name}"), e))?;
        }
    }
    Ok(())
}

/// Replaces `target` with nothing: a directory by an empty read-only tmpfs, a
/// file (or socket) by a read-only `/dev/null`. Admission resolved symlinks,
/// so `target` is the real location; a missing one is left alone.
fn hide(target: &Path) -> Result<(), StepError> {
    let Ok(meta) = fs::symlink_metadata(target) else { return Ok(()) };
    if meta.is_dir() {
        return tmpfs(target, "mode=0755,size=4k", libc::MS_RDONLY);
    }
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let what = format!("hide {}", target.display());
    sys::mount(Some("/dev/null"), target, None, libc::MS_BIND, None)
        .map_err(|e| mount_err("hide", &what, e))?;
    sys::mount(None, target, None, libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY, None)
        .map_err(|e| mount_err("hide", &what, e))
}

pub(crate) fn mount_err(step: &'static str, what: &str, e: io::Error) -> StepError {
    StepError::new(step, format!("cannot {what}: {e}"))
}

pub(crate) fn tmpfs(target: &Path, options: &str, flags: libc::c_ulong) -> Result<(), StepError> {
    sys::mount(Some("tmpfs"), target, Some("tmpfs"), libc::MS_NOSUID | libc::MS_NODEV | flags, Some(options))
        .map_err(|e| mount_err("tmpfs", &format!("mount a tmpfs on {}", target.display()), e))
}

/// `/run` holds host services' sockets (docker, dbus, the session bus under
/// `/run/user`); a read-only mount does not stop `connect(2)`, so the sandbox
/// gets an empty `/run` with only `lock/` and the `shm` link.
fn private_run(root: &Path, size: u64) -> Result<(), StepError> {
    let run = under(root, Path::new("/run"));
    if !run.is_dir() {
        return Ok(());
    }
    tmpfs(&run, &format!("mode=0755,size={size}"), 0)?;
    let io_err = |what: &str, e: io::Error| StepError::new("run", format!("cannot {what}: {e}"));
    fs::create_dir(run.join("lock")).map_err(|e| io_err("create /run/lock", e))?;
    fs::set_permissions(run.join("lock"), std::os::unix::fs::PermissionsExt::from_mode(0o1777))
        .map_err(|e| io_err("set the mode of /run/lock", e))?;
    std::os::unix::fs::symlink("/dev/shm", run.join("shm")).map_err(|e| io_err("link /run/shm", e))
}

fn minimal_dev(root: &Path, sizes: &pvisor_sandbox::limits::TmpfsSizes) -> Result<(), StepError> {
    let dev = under(root, Path::new("/dev"));
    let options = format!("mode=0755,size={}", sizes.dev);
    sys::mount(Some("tmpfs"), &dev, Some("tmpfs"), libc::MS_NOSUID, Some(&options))
        .map_err(|e| mount_err("dev", "mount a tmpfs on /dev", e))?;
    let io_err = |what: String, e: io::Error| StepError::new("dev", format!("cannot {what}: {e}"));
    for node in ["null", "zero", "full", "random", "urandom", "tty"] {
        let host = Path::new("/dev").join(node);
        if !host.exists() {
            continue;
        }
        let target = dev.join(node);
        fs::File::create(&target).map_err(|e| io_err(format!("create /dev/{node}"), e))?;
        sys::mount(Some(&host.to_string_lossy()), &target, None, libc::MS_BIND, None)
            .map_err(|e| mount_err("dev", &format!("bind /dev/{node}"), e))?;
        read_only_bind(&target).map_err(|e| mount_err("dev", &format!("make /dev/{node} read-only"), e))?;
    }
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        std::os::unix::fs::symlink(to, dev.join(link)).map_err(|e| io_err(format!("link /dev/{link}"), e))?;
    }
    let shm = dev.join("shm");
    fs::create_dir(&shm).map_err(|e| io_err("create /dev/shm".into(), e))?;
    tmpfs(&shm, &format!("mode=1777,size={}", sizes.shm), 0)?;
    // A private devpts instance: the sandbox's own pseudo-terminal lives here,
    // and none of the host's terminals is reachable.
    let pts = dev.join("pts");
    fs::create_dir(&pts).map_err(|e| io_err("create /dev/pts".into(), e))?;
    sys::mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .map_err(|e| mount_err("dev", "mount a private /dev/pts", e))?;
    Ok(())
}

/// Remounts the bind mount at `target` read-only, keeping the flags it has
/// (in a user namespace the kernel refuses to drop those it inherited).
///
/// A device node is the host's inode: on a read-write mount, uid 0 in the
/// sandbox (real root's identity map) could `chmod` the host's `/dev/null`.
/// A read-only mount refuses that (`EROFS`), while reads and writes of the
/// device itself still work.
fn read_only_bind(target: &Path) -> io::Result<()> {
    let kept = rustix::fs::statvfs(target)?.f_flag.bits()
        & (libc::MS_NOSUID
            | libc::MS_NODEV
            | libc::MS_NOEXEC
            | libc::MS_NOATIME
            | libc::MS_NODIRATIME
            | libc::MS_RELATIME);
    sys::mount(None, target, None, libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | kept, None)
}

/// Escapes a path for overlayfs's option string, where `,` separates options,
/// `:` separates lower layers and `\` escapes.
pub(crate) fn escape_overlay_path(path: &Path) -> String {
    let mut out = String::new();
    for c in path.to_string_lossy().chars() {
        if matches!(c, '\\' | ',' | ':') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn overlay_workspace(spec: &SandboxSpec, root: &Path) -> Result<Option<MemoryStage>, StepError> {
    let target = under(root, &spec.workspace);
    if !target.is_dir() {
        // The workspace lives under a private tmpfs (e.g. /tmp): make its mount point there.
        fs::create_dir_all(&target).map_err(|e| {
            StepError::new(
                "overlay",
                format!("cannot create the workspace mount point {}: {e}", spec.workspace.display()),
            )
        })?;
    }
    // With a disk quota the layers live in a tmpfs of that size (see
    // memory_stage.rs), copied to the stage when the command has ended.
    let (memory, upper, work) = match spec.limits.disk_bytes {
        Some(bytes) => {
            let (stage, upper, work) = memory_stage::prepare(&spec.upper, &spec.work, bytes)?;
            (Some(stage), upper, work)
        }
        None => (None, spec.upper.clone(), spec.work.clone()),
    };
    let options = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        escape_overlay_path(&spec.workspace),
        escape_overlay_path(&upper),
        escape_overlay_path(&work),
    );
    // `volatile`: the overlay passes no sync to the stage's filesystem, and
    // its unmount does not sync that whole filesystem. The stage is made
    // durable by `seal` when the command has ended, and nothing applies a
    // stage that was not sealed. Every kernel with `userxattr` (5.11) has it.
    let options = format!("{options},volatile");
    sys::mount(Some("overlay"), &target, Some("overlay"), 0, Some(&options)).map_err(|e| {
        let hint = match e.raw_os_error() {
            Some(libc::ENODEV) => "overlayfs is not available: load it with `modprobe overlay` (CONFIG_OVERLAY_FS)".to_string(),
            Some(libc::EPERM) => "this kernel does not allow overlayfs inside a user namespace; Linux 5.11 or newer is needed".to_string(),
            Some(libc::ELOOP) => "the workspace and the stage overlap; keep PVISOR_HOME outside the workspace".to_string(),
            Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => format!(
                "the filesystem holding the stage ({}) cannot be an overlay upper layer with user xattrs; put PVISOR_HOME on ext4, xfs, btrfs or tmpfs (Linux 6.6+), and check `dmesg` for the overlayfs message",
                spec.upper.display()
            ),
            _ => "check `dmesg` for the overlayfs message".to_string(),
        };
        StepError::new(
            "overlay",
            format!("cannot mount the workspace overlay on {}: {e}", spec.workspace.display()),
        )
        .hint(hint)
    })?;
    Ok(memory)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_paths_escape_separators() {
        assert_eq!(escape_overlay_path(Path::new("/a,b:c\\d")), "/a\\,b\\:c\\\\d");
        assert_eq!(escape_overlay_path(Path::new("/plain/dir")), "/plain/dir");
    }
}
