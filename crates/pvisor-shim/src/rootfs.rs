//! The container's root filesystem on the host: containerd hands the shim
//! the snapshot's mounts (an overlay of the image's layers, or a bind of a
//! native snapshot) and the shim mounts them at the bundle's `rootfs`,
//! which becomes the Job's workspace. The vm executor copies the workspace
//! into the guest's lower disk when the Job is admitted; the mount is
//! removed when the task is deleted.
//!
//! An overlay is mounted `volatile`: nothing writes through it once the Job
//! is admitted (the guest writes to its own disk), and without it the
//! unmount syncs the whole host filesystem the snapshots live on, which on
//! a busy node costs a `ctr run --rm` hundreds of milliseconds.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, UnmountFlags};

/// One mount as containerd describes it (`containerd.types.Mount`).
#[derive(Clone, Debug, PartialEq)]
pub struct Mount {
    pub kind: String,
    pub source: String,
    pub options: Vec<String>,
}

/// The mount flags an option names, or `None` for filesystem data.
fn flag(option: &str) -> Option<MountFlags> {
    Some(match option {
        "ro" => MountFlags::RDONLY,
        "rw" => MountFlags::empty(),
        "bind" => MountFlags::BIND,
        "rbind" => MountFlags::BIND | MountFlags::REC,
        "nosuid" => MountFlags::NOSUID,
        "nodev" => MountFlags::NODEV,
        "noexec" => MountFlags::NOEXEC,
        "noatime" => MountFlags::NOATIME,
        "relatime" => MountFlags::RELATIME,
        "sync" => MountFlags::SYNCHRONOUS,
        _ => return None,
    })
}

/// Splits options into flags and the data string (`lowerdir=...,upperdir=...`).
fn split(options: &[String]) -> (MountFlags, String) {
    let mut flags = MountFlags::empty();
    let mut data = Vec::new();
    for option in options {
        match flag(option) {
            Some(f) => flags |= f,
            None => data.push(option.as_str()),
        }
    }
    (flags, data.join(","))
}

/// Mounts `mounts` in order at `target`. An empty list means the bundle's
/// rootfs is already in place (a runtime-prepared bundle).
pub fn mount_all(mounts: &[Mount], target: &Path) -> std::io::Result<()> {
    for m in mounts {
        let (flags, data) = split(&m.options);
        let kind = if flags.contains(MountFlags::BIND) { "none" } else { m.kind.as_str() };
        let mount = |data: &str| {
            let data = CString::new(data).map_err(|_| std::io::Error::other("a mount option holds a NUL"))?;
            rustix::mount::mount(m.source.as_str(), target, kind, flags, Some(data.as_c_str()))
                .map_err(std::io::Error::from)
        };
        let mounted = match volatile_workdir(kind, &data) {
            Some(workdir) => {
                // An earlier volatile mount of this snapshot left its marker;
                // its upper layer holds only what the shim copied in.
                clear_volatile(&workdir);
                // Kernels before 5.10 know no `volatile`: mount as given.
                mount(&format!("{data},volatile")).or_else(|_| mount(&data))
            }
            None => mount(&data),
        };
        mounted.map_err(|e| {
            std::io::Error::other(format!(
                "cannot mount {} ({}) at {}: {e}",
                m.source,
                m.kind,
                target.display()
            ))
        })?;
        // A read-only bind takes effect only on a remount.
        if flags.contains(MountFlags::BIND) && flags.contains(MountFlags::RDONLY) {
            rustix::mount::mount_remount(target, flags | MountFlags::BIND, "").map_err(|e| {
                std::io::Error::other(format!("cannot make {} read-only: {e}", target.display()))
            })?;
        }
    }
    Ok(())
}

/// Unmounts whatever is mounted at `target` (several layers, if stacked);
/// nothing mounted there is not an error. `mounts` (what was mounted, if
/// known) lose the marker a volatile overlay leaves, so containerd and
/// others can mount the snapshot again as usual.
pub fn unmount_all(target: &Path, mounts: &[Mount]) {
    for _ in 0..16 {
        if rustix::mount::unmount(target, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW).is_err() {
            break;
        }
    }
    for m in mounts {
        if let Some(workdir) = volatile_workdir(&m.kind, &split(&m.options).1) {
            clear_volatile(&workdir);
        }
    }
}

/// The workdir of an overlay that can be mounted volatile (a writable one
/// not asking for `volatile` itself).
fn volatile_workdir(kind: &str, data: &str) -> Option<PathBuf> {
    if kind != "overlay" || data.split(',').any(|o| o == "volatile") {
        return None;
    }
    data.split(',').find_map(|o| o.strip_prefix("workdir=")).map(PathBuf::from)
}

/// Removes the `work/incompat/volatile` marker under an overlay workdir,
/// without which the kernel refuses to mount it again.
fn clear_volatile(workdir: &Path) {
    let incompat = workdir.join("work/incompat");
    let _ = std::fs::remove_dir_all(incompat.join("volatile"));
    let _ = std::fs::remove_dir(incompat);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_writable_overlay_is_mounted_volatile() {
        let data = "index=off,workdir=/s/work,upperdir=/s/fs,lowerdir=/l";
        assert_eq!(volatile_workdir("overlay", data), Some(PathBuf::from("/s/work")));
        assert_eq!(volatile_workdir("overlay", "lowerdir=/l1:/l2"), None, "a read-only view has no workdir");
        assert_eq!(volatile_workdir("overlay", &format!("{data},volatile")), None);
        assert_eq!(volatile_workdir("none", "workdir=/w"), None);
    }

    #[test]
    #[ignore = "needs root (an overlay mount): scripts/test.sh runs it as root, with --include-ignored"]
    fn a_volatile_overlay_mounts_again_after_its_unmount() {
        assert!(
            rustix::process::geteuid().is_root(),
            "mounting an overlay needs root (ignored unless included)"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        for d in ["l", "u", "w", "m"] {
            std::fs::create_dir(dir.path().join(d)).expect("mkdir");
        }
        std::fs::write(dir.path().join("l/f"), "lower\n").expect("write");
        let at = |d: &str| dir.path().join(d).display().to_string();
        let mount = Mount {
            kind: "overlay".into(),
            source: "overlay".into(),
            options: vec![
                format!("workdir={}", at("w")),
                format!("upperdir={}", at("u")),
                format!("lowerdir={}", at("l")),
            ],
        };
        let target = dir.path().join("m");
        for round in 0..2 {
            mount_all(std::slice::from_ref(&mount), &target).unwrap_or_else(|e| panic!("mount {round}: {e}"));
            assert_eq!(std::fs::read_to_string(target.join("f")).expect("read"), "lower\n");
            let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
            let line = mounts.lines().find(|l| l.contains(&target.display().to_string())).expect("mounted");
            assert!(line.contains("volatile"), "{line}");
            unmount_all(&target, std::slice::from_ref(&mount));
        }
        assert!(!dir.path().join("w/work/incompat/volatile").exists(), "the marker is cleared");
    }

    #[test]
    fn options_split_into_flags_and_overlay_data() {
        let options: Vec<String> =
            ["index=off", "workdir=/w", "upperdir=/u", "lowerdir=/l1:/l2", "ro"].map(String::from).into();
        let (flags, data) = split(&options);
        assert_eq!(flags, MountFlags::RDONLY);
        assert_eq!(data, "index=off,workdir=/w,upperdir=/u,lowerdir=/l1:/l2");
        let (flags, data) = split(&["rbind".to_owned(), "ro".to_owned()]);
        assert_eq!(flags, MountFlags::BIND | MountFlags::REC | MountFlags::RDONLY);
        assert_eq!(data, "");
    }
}
