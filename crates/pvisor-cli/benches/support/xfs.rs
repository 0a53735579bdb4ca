//! A loop-mounted XFS image with reflink, for the benchmarks that compare
//! copies with reflinks (`#[path]`-included by each bench that needs it).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted XFS image; unmounted when dropped.
pub struct Xfs {
    pub mount: PathBuf,
}

impl Xfs {
    /// Makes and mounts a `size` (e.g. `4G`) sparse XFS image under `dir`,
    /// or says why not (needs root, `mkfs.xfs` from xfsprogs, which
    /// scripts/setup.sh installs, and loop devices).
    pub fn mount(dir: &Path, size: &str) -> Result<Self, String> {
        if !rustix::process::geteuid().is_root() {
            return Err("needs root (to mount an image)".into());
        }
        let mkfs = ["/usr/sbin/mkfs.xfs", "/sbin/mkfs.xfs"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .ok_or("needs mkfs.xfs (scripts/setup.sh installs xfsprogs)")?;
        let image = dir.join("xfs.img");
        let mount = dir.join("xfs");
        std::fs::create_dir_all(&mount).map_err(|e| e.to_string())?;
        let ok = Command::new("truncate").args(["-s", size]).arg(&image).status().is_ok_and(|s| s.success())
            && Command::new(mkfs)
                .args(["-q", "-m", "reflink=1"])
                .arg(&image)
                .status()
                .is_ok_and(|s| s.success())
            && Command::new("mount")
                .args(["-o", "loop"])
                .arg(&image)
                .arg(&mount)
                .status()
                .is_ok_and(|s| s.success());
        if ok {
            Ok(Self { mount })
        } else {
            Err("could not make a loop-mounted XFS image".into())
        }
    }
}

impl Drop for Xfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
    }
}
