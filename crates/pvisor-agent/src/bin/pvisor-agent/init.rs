//! Bringing the guest up as PID 1: the pseudo-filesystems, the kernel
//! modules the image lists, loopback networking, and (on `Setup`) the
//! workspace overlay over the virtio disks: the base image, the delta of
//! what changed since it was built ([`crate::delta`]), and the upper disk;
//! with a userland image, the root the command is chrooted into.

use std::ffi::CString;
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use pvisor_agent_proto::timing::PhaseClock;
use pvisor_agent_proto::{
    DELTA_SERIAL, IMAGE_DELTA_SERIAL, IMAGE_LOWER_SERIAL, LOWER_SERIAL, UPPER_SERIAL, USERLAND_ROOT,
};
use rustix::mount::MountFlags;
use rustix::net::{AddressFamily, SocketFlags, SocketType};

pub(crate) const LOWER_MNT: &str = "/mnt/pvisor/lower";
pub(crate) const DELTA_MNT: &str = "/mnt/pvisor/delta";
pub(crate) const UPPER_MNT: &str = "/mnt/pvisor/upper";
const IMAGE_LOWER_MNT: &str = "/mnt/pvisor/image-lower";
const IMAGE_DELTA_MNT: &str = "/mnt/pvisor/image-delta";

/// Mounts the pseudo-filesystems and loads the modules listed in /etc/pvisor/modules.
pub(crate) fn init_guest() -> io::Result<()> {
    for (src, target, fstype) in [
        ("proc", "/proc", "proc"),
        ("sysfs", "/sys", "sysfs"),
        ("devtmpfs", "/dev", "devtmpfs"),
        ("tmpfs", "/tmp", "tmpfs"),
        ("tmpfs", "/run", "tmpfs"),
    ] {
        fs::create_dir_all(target)?;
        let _ = mount(src, target, fstype, MountFlags::empty(), "");
    }
    fs::create_dir_all("/dev/pts")?;
    let _ = mount("devpts", "/dev/pts", "devpts", MountFlags::empty(), "ptmxmode=0666");
    protect_against_thrashing();
    // Loopback is the guest's own: services inside it need it, and it
    // reaches nothing outside. Up before a template is saved, so no
    // restored run pays for it (about 20 ms of emulated guest time).
    let _ = loopback_up();
    let modules = fs::read_to_string("/etc/pvisor/modules").unwrap_or_default();
    let cmdline = fs::read_to_string("/proc/cmdline").unwrap_or_default();
    for module in modules.lines().filter(|l| !l.trim().is_empty()) {
        let file = File::open(module.trim())?;
        let params = CString::new(module_params(module.trim(), &cmdline)).unwrap_or_default();
        match rustix::system::finit_module(&file, &params, 0) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => eprintln!("pvisor-agent: cannot load {module}: {}", io::Error::from(e)),
        }
    }
    Ok(())
}

/// A guest out of memory must meet the OOM killer, not thrash: with no
/// swap, reclaim evicts the text pages of running programs and reads them
/// back from the workspace disk, which under TCG can spin for many minutes
/// before the kernel declares OOM. The multi-gen LRU's `min_ttl_ms` makes
/// the kernel kill rather than evict a working set younger than 1 s (a
/// kernel without it keeps its default behaviour).
fn protect_against_thrashing() {
    if fs::write("/sys/kernel/mm/lru_gen/enabled", "y").is_ok() {
        let _ = fs::write("/sys/kernel/mm/lru_gen/min_ttl_ms", "1000");
    }
}

/// The `name.key=value` words of the kernel command line that belong to the
/// module at `path`: modprobe would pass them, and microvm describes its
/// virtio-mmio devices this way (`virtio_mmio.device=…`).
fn module_params(path: &str, cmdline: &str) -> String {
    let file = Path::new(path).file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let name = file.split('.').next().unwrap_or_default().replace('-', "_");
    let prefix = format!("{name}.");
    cmdline.split_whitespace().filter_map(|word| word.strip_prefix(&prefix)).collect::<Vec<_>>().join(" ")
}

/// `mount(2)` with string options (`data` may be empty).
pub(crate) fn mount(src: &str, target: &str, fstype: &str, flags: MountFlags, data: &str) -> io::Result<()> {
    let data = CString::new(data).map_err(io::Error::other)?;
    Ok(rustix::mount::mount(src, target, fstype, flags, data.as_c_str())?)
}

/// Finds the block device whose virtio serial is `serial`.
fn disk_by_serial(serial: &str) -> io::Result<PathBuf> {
    for entry in fs::read_dir("/sys/block")?.flatten() {
        let found = fs::read_to_string(entry.path().join("serial")).unwrap_or_default();
        if found.trim() == serial {
            return Ok(Path::new("/dev").join(entry.file_name()));
        }
    }
    Err(io::Error::other(format!("no disk with serial {serial}")))
}

/// `ip link set lo up`, by ioctl (there is no iproute2 in the guest).
/// rustix has no call for SIOCSIFFLAGS, so the ioctl itself is libc's.
pub(crate) fn loopback_up() -> io::Result<()> {
    #[repr(C)]
    struct IfReq {
        name: [u8; 16],
        flags: libc::c_short,
        _pad: [u8; 22],
    }
    let socket =
        rustix::net::socket_with(AddressFamily::INET, SocketType::DGRAM, SocketFlags::CLOEXEC, None)?;
    let mut req = IfReq { name: [0; 16], flags: 0, _pad: [0; 22] };
    req.name[..2].copy_from_slice(b"lo");
    req.flags = (libc::IFF_UP | libc::IFF_LOOPBACK | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads a struct ifreq; ours has its layout and size.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Gives the guest's NIC (the link with the interface's MAC) the address,
/// MTU and default route of the interface it stands in for. The initramfs's
/// busybox `ip` does it: address and route ioctls by hand would be the same
/// calls with more to get wrong.
pub(crate) fn configure_interface(interface: &pvisor_agent_proto::Interface) -> io::Result<()> {
    let name = fs::read_dir("/sys/class/net")?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| {
            fs::read_to_string(format!("/sys/class/net/{n}/address"))
                .is_ok_and(|mac| mac.trim().eq_ignore_ascii_case(&interface.mac))
        })
        .ok_or_else(|| {
            io::Error::other(format!(
                "the guest has no link with MAC {} (is virtio_net loaded?)",
                interface.mac
            ))
        })?;
    let mtu = interface.mtu.to_string();
    let mut steps: Vec<Vec<&str>> = vec![
        vec!["link", "set", &name, "mtu", &mtu],
        vec!["addr", "add", &interface.address, "dev", &name],
        vec!["link", "set", &name, "up"],
    ];
    if let Some(gateway) = &interface.gateway {
        // The gateway on the link first: CNIs such as Calico give a /32
        // address whose gateway (169.254.1.1) lies outside it.
        steps.push(vec!["route", "replace", gateway, "dev", &name, "scope", "link"]);
        steps.push(vec!["route", "add", "default", "via", gateway, "dev", &name]);
    }
    for args in steps {
        let out = std::process::Command::new("/bin/busybox").arg("ip").args(&args).output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    Ok(())
}

/// A fresh /etc/machine-id per sandbox: clones of one template must not
/// share it. Drawn after the restore's reseed, so from this guest's own CRNG.
fn write_machine_id() -> io::Result<()> {
    let mut id = [0u8; 16];
    let n = rustix::rand::getrandom(&mut id, rustix::rand::GetRandomFlags::empty())?;
    if n != id.len() {
        return Err(io::Error::other("getrandom returned too few bytes"));
    }
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    fs::create_dir_all("/etc")?;
    fs::write("/etc/machine-id", format!("{hex}\n"))
}

/// The block device whose virtio serial is `serial`, its buffer cache
/// dropped: a guest restored from a template probed other disks (of the
/// same size) at boot, and what it read then must not be taken for this one's.
fn fresh_disk(serial: &str) -> io::Result<String> {
    let dev = disk_by_serial(serial)?.to_string_lossy().into_owned();
    crate::restore::path_ioctl(&dev, crate::restore::BLKFLSBUF)
        .map_err(|e| io::Error::new(e.kind(), format!("dropping the buffer cache of {dev}: {e}")))?;
    Ok(dev)
}

/// Mounts the workspace overlay at `workspace`: with `delta`, the delta
/// disk (finished from its manifest, then remounted read-only) above the
/// base image; without, the base alone (the host decides, see `Setup`).
pub(crate) fn setup_workspace(
    workspace: &Path,
    hostname: &str,
    delta: bool,
    steps: &mut PhaseClock,
) -> io::Result<()> {
    if !hostname.is_empty() {
        let _ = rustix::system::sethostname(hostname.as_bytes());
    }
    write_machine_id().map_err(ctx("writing /etc/machine-id".into()))?;
    steps.mark("hostname_machine_id");
    let delta = delta.then_some((DELTA_SERIAL, DELTA_MNT));
    let layers = lower_layers((LOWER_SERIAL, LOWER_MNT), delta, "workspace", steps)?;
    fs::create_dir_all(UPPER_MNT)?;
    let upper = fresh_disk(UPPER_SERIAL)?;
    mount(&upper, UPPER_MNT, "ext4", MountFlags::NODEV, "")
        .map_err(ctx(format!("mounting the upper disk {upper}")))?;
    steps.mark("upper_mount");
    let (up, work) =
        upper_dirs(&Path::new(UPPER_MNT).join("upper"), &Path::new(UPPER_MNT).join("work"), &layers[0])?;
    fs::create_dir_all(workspace)?;
    mount_overlay(&layers, &up, &work, workspace)?;
    steps.mark("overlay");
    Ok(())
}

/// Wraps an error with what was being done.
fn ctx(what: String) -> impl FnOnce(io::Error) -> io::Error {
    move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Mounts the base image disk `base` (serial, mount point) read-only and,
/// with `delta`, the delta disk above it, finished from its manifest and
/// then remounted read-only: the overlay's lower layers, topmost first.
fn lower_layers(
    base: (&str, &str),
    delta: Option<(&str, &str)>,
    what: &str,
    steps: &mut PhaseClock,
) -> io::Result<Vec<PathBuf>> {
    let (serial, at) = base;
    fs::create_dir_all(at)?;
    let dev = fresh_disk(serial)?;
    steps.mark("base_disk");
    mount(&dev, at, "ext4", MountFlags::RDONLY | MountFlags::NODEV, "")
        .map_err(ctx(format!("mounting the {what} image {dev}")))?;
    steps.mark("base_mount");
    let mut layers = vec![PathBuf::from(at)];
    if let Some((serial, delta_at)) = delta {
        fs::create_dir_all(delta_at)?;
        let dev = fresh_disk(serial)?;
        mount(&dev, delta_at, "ext4", MountFlags::NODEV, "")
            .map_err(ctx(format!("mounting the {what} delta {dev}")))?;
        steps.mark("delta_mount");
        let layer = crate::delta::finish(Path::new(delta_at), Path::new(at))
            .map_err(ctx(format!("applying the {what} delta")))?;
        steps.mark("delta_finish");
        // Finished: nothing in the guest writes it again.
        rustix::mount::mount_remount(delta_at, MountFlags::RDONLY | MountFlags::NODEV, "").map_err(|e| {
            io::Error::new(e.kind(), format!("remounting the {what} delta {dev} read-only: {e}"))
        })?;
        layers.insert(0, layer);
    }
    Ok(layers)
}

/// Creates an overlay's upper and work directories, the upper root made to
/// look like the topmost lower layer's root (mode, owner, mtime: the
/// overlay shows a directory's times from its upper copy, which the root
/// always has).
fn upper_dirs(up: &Path, work: &Path, top: &Path) -> io::Result<(PathBuf, PathBuf)> {
    fs::create_dir_all(up)?;
    fs::create_dir_all(work)?;
    let root = fs::metadata(top)?;
    fs::set_permissions(up, fs::Permissions::from_mode(root.mode() & 0o7777))?;
    std::os::unix::fs::chown(up, Some(root.uid()), Some(root.gid()))?;
    let mtime = rustix::fs::Timespec { tv_sec: root.mtime(), tv_nsec: root.mtime_nsec() };
    let times = rustix::fs::Timestamps { last_access: mtime, last_modification: mtime };
    rustix::fs::utimensat(rustix::fs::CWD, up, &times, rustix::fs::AtFlags::empty())?;
    Ok((up.to_owned(), work.to_owned()))
}

/// Mounts an overlay of `layers` (topmost first) under `up` at `target`.
fn mount_overlay(layers: &[PathBuf], up: &Path, work: &Path, target: &Path) -> io::Result<()> {
    let lowerdir: Vec<String> = layers.iter().map(|l| l.to_string_lossy().into_owned()).collect();
    let options = format!(
        "lowerdir={},upperdir={},workdir={},redirect_dir=off,index=off,metacopy=off,xino=off",
        lowerdir.join(":"),
        up.display(),
        work.display()
    );
    mount("overlay", &target.to_string_lossy(), "overlay", MountFlags::empty(), &options)
        .map_err(ctx(format!("mounting the overlay at {}", target.display())))
}

/// Assembles [`USERLAND_ROOT`]: the userland image's base and delta disks
/// read-only under a layer on the upper disk beside the workspace's (so
/// never exported, never staged, and thrown away with the Attempt's disks),
/// with the workspace overlay (and the shares inside it) bound at its own
/// path. The path is resolved beneath the root, as the image's symlinks
/// lead: no user code has run yet, so nothing can swap one after the check.
pub(crate) fn setup_userland(workspace: &Path) -> io::Result<()> {
    let base = (IMAGE_LOWER_SERIAL, IMAGE_LOWER_MNT);
    // The userland's own steps are the one `userland` step of the caller's.
    let layers = lower_layers(
        base,
        Some((IMAGE_DELTA_SERIAL, IMAGE_DELTA_MNT)),
        "userland",
        &mut PhaseClock::start(),
    )?;
    let scratch = Path::new(UPPER_MNT).join("userland");
    let (up, work) = upper_dirs(&scratch.join("upper"), &scratch.join("work"), &layers[0])?;
    fs::create_dir_all(USERLAND_ROOT)?;
    mount_overlay(&layers, &up, &work, Path::new(USERLAND_ROOT))?;
    let at = pvisor_agent_proto::resolve_in_root(Path::new(USERLAND_ROOT), workspace, true)
        .map_err(ctx(format!("resolving the workspace {} in the userland", workspace.display())))?;
    fs::create_dir_all(&at).map_err(ctx(format!("making a place for the workspace at {}", at.display())))?;
    mount(&workspace.to_string_lossy(), &at.to_string_lossy(), "", MountFlags::BIND | MountFlags::REC, "")
        .map_err(ctx(format!("binding the workspace at {}", at.display())))
}

/// Mounts each shared host directory (virtiofs, the host's `virtiofsd`) at
/// its target in the workspace, `nodev`. The target is resolved beneath the
/// workspace, as the image's symlinks lead (no user code has run yet, so
/// nothing can swap one after the check), and made if missing.
pub(crate) fn mount_shares(workspace: &Path, shares: &[pvisor_agent_proto::Share]) -> io::Result<()> {
    for share in shares {
        let ctx = |what: &str| {
            let (tag, target) = (share.tag.clone(), share.target.display().to_string());
            let what = what.to_owned();
            move |e: io::Error| {
                io::Error::new(e.kind(), format!("{what} the shared directory {tag} at {target}: {e}"))
            }
        };
        let at =
            pvisor_agent_proto::resolve_in_root(workspace, &share.target, true).map_err(ctx("resolving"))?;
        fs::create_dir_all(&at).map_err(ctx("making a place for"))?;
        // No device node of a host directory opens a guest device (an
        // image's layer, a pod container's rootfs, can hold any).
        let flags =
            if share.read_only { MountFlags::RDONLY } else { MountFlags::empty() } | MountFlags::NODEV;
        mount(&share.tag, &at.to_string_lossy(), "virtiofs", flags, "").map_err(ctx("mounting"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_params_are_the_cmdline_words_of_that_module() {
        let cmdline = "console=ttyS0 virtio_mmio.device=512@0xfeb00e00:12 virtio_mmio.device=4K@0x1:5 quiet";
        assert_eq!(
            module_params("/lib/modules/virtio-mmio.ko", cmdline),
            "device=512@0xfeb00e00:12 device=4K@0x1:5"
        );
        assert_eq!(module_params("/lib/modules/overlay.ko.xz", cmdline), "");
    }
}
