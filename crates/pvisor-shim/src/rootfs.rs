//! The container's root filesystem on the host: containerd hands the shim
//! the snapshot's mounts (an overlay of the image's layers, or a bind of a
//! native snapshot) and the shim mounts them at the bundle's `rootfs`,
//! which becomes the Job's workspace. The vm executor copies the workspace
//! into the guest's lower disk when the Job is admitted; the mount is
//! removed when the task is deleted.

use std::ffi::CString;
use std::path::Path;

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
        let data = CString::new(data).map_err(|_| std::io::Error::other("a mount option holds a NUL"))?;
        let kind = if flags.contains(MountFlags::BIND) { "none" } else { m.kind.as_str() };
        rustix::mount::mount(m.source.as_str(), target, kind, flags, Some(data.as_c_str())).map_err(|e| {
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
/// nothing mounted there is not an error.
pub fn unmount_all(target: &Path) {
    for _ in 0..16 {
        if rustix::mount::unmount(target, UnmountFlags::DETACH).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
