//! Scratch filesystems mounted for one benchmark section: a loop-mounted
//! XFS with reflink (copies against reflinks) and a tmpfs (figures no
//! on-disk history moves). `#[path]`-included by each bench that needs one.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted scratch filesystem; unmounted when dropped.
pub struct Scratch {
    pub mount: PathBuf,
}

impl Scratch {
    /// Makes and mounts a `size` (e.g. `4G`) sparse XFS image under `dir`,
    /// or says why not (needs root, `mkfs.xfs` from xfsprogs, which
    /// scripts/setup.sh installs, and loop devices).
    pub fn xfs(dir: &Path, size: &str) -> Result<Self, String> {
        let mkfs = ["/usr/sbin/mkfs.xfs", "/sbin/mkfs.xfs"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .ok_or("needs mkfs.xfs (scripts/setup.sh installs xfsprogs)")?;
        let image = dir.join("xfs.img");
        need_root()?;
        let made =
            Command::new("truncate").args(["-s", size]).arg(&image).status().is_ok_and(|s| s.success())
                && Command::new(mkfs)
                    .args(["-q", "-m", "reflink=1"])
                    .arg(&image)
                    .status()
                    .is_ok_and(|s| s.success());
        if !made {
            return Err("could not make an XFS image".into());
        }
        Self::mount(dir.join("xfs"), &["-o", "loop"], &image)
    }

    /// Mounts a `size` tmpfs under `dir`, or says why not (needs root).
    #[allow(dead_code)] // each bench includes this file; not each mounts a tmpfs
    pub fn tmpfs(dir: &Path, size: &str) -> Result<Self, String> {
        need_root()?;
        Self::mount(dir.join("tmpfs"), &["-t", "tmpfs", "-o", &format!("size={size}")], Path::new("tmpfs"))
    }

    fn mount(mount: PathBuf, options: &[&str], source: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(&mount).map_err(|e| e.to_string())?;
        let mounted =
            Command::new("mount").args(options).arg(source).arg(&mount).status().is_ok_and(|s| s.success());
        mounted.then_some(Self { mount }).ok_or_else(|| format!("could not mount {}", source.display()))
    }
}

fn need_root() -> Result<(), String> {
    let root = rustix::process::geteuid().is_root();
    root.then_some(()).ok_or_else(|| "needs root (to mount a filesystem)".into())
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
    }
}
