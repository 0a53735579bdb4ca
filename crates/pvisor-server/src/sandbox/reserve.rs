//! Space held back on the state directory's disk so that a sandbox can
//! always be ended: when the disk fills (a guest writing through its upper
//! disk, logs, checkpoints), a DELETE must still record Stopping, kill the
//! Job (which writes its receipt) and record Terminated. The daemon keeps a
//! preallocated file, `server/reserve`; a write that ends a sandbox and
//! fails for want of space frees it and tries again, and the file is made
//! again once a stop is done and the space is there. Every other write on
//! a full disk fails with an error that names the disk.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// What the reserve holds: many times what ending a sandbox writes (its
/// record twice, the Job's receipt and events).
pub const RESERVE_BYTES: u64 = 8 << 20;

#[derive(Debug)]
pub struct Reserve {
    path: PathBuf,
    bytes: u64,
}

impl Reserve {
    pub fn new(path: PathBuf, bytes: u64) -> Self {
        Self { path, bytes }
    }

    /// Makes the reserve if it is missing and the disk has the room
    /// (allocated blocks, not a sparse file); on a full disk it stays missing.
    pub fn ensure(&self) {
        if fs::metadata(&self.path).is_ok_and(|m| m.len() == self.bytes) {
            return;
        }
        let made = (|| {
            let file = fs::OpenOptions::new().create(true).truncate(true).write(true).open(&self.path)?;
            rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, self.bytes)?;
            file.sync_all()
        })();
        if let Err(e) = made {
            let _ = fs::remove_file(&self.path);
            tracing::warn!("cannot hold back {} bytes at {}: {e}", self.bytes, self.path.display());
        }
    }

    /// Frees the reserve; whether there was one.
    pub fn release(&self) -> bool {
        let released = fs::remove_file(&self.path).is_ok();
        if released {
            tracing::warn!(
                "the state disk is full: released the {}-byte reserve to end a sandbox",
                self.bytes
            );
        }
        released
    }

    /// Whether the disk holding the reserve has less free than the reserve.
    pub fn disk_low(&self) -> bool {
        let dir = self.path.parent().unwrap_or(Path::new("/"));
        rustix::fs::statvfs(dir).is_ok_and(|s| s.f_bavail.saturating_mul(s.f_frsize) < self.bytes)
    }
}

/// Whether `e` (or what caused it) is a full disk or an exhausted quota.
pub fn disk_full(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
                return true;
            }
        }
        cause = e.source();
    }
    false
}

/// Names the disk `path` is on: its mount point and what is free there.
pub fn describe_disk(path: &Path) -> String {
    let mount = mount_point(path);
    match rustix::fs::statvfs(path) {
        Ok(s) => format!(
            "the disk holding {} (the filesystem mounted at {}) is full: {} of {} bytes free",
            path.display(),
            mount.display(),
            s.f_bavail.saturating_mul(s.f_frsize),
            s.f_blocks.saturating_mul(s.f_frsize)
        ),
        Err(_) => format!("the disk holding {} (mounted at {}) is full", path.display(), mount.display()),
    }
}

/// The deepest ancestor of `path` on the same device.
fn mount_point(path: &Path) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let path = fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    let Ok(dev) = fs::metadata(&path).map(|m| m.dev()) else { return path };
    let mut mount = path.clone();
    for ancestor in path.ancestors().skip(1) {
        match fs::metadata(ancestor) {
            Ok(m) if m.dev() == dev => mount = ancestor.to_owned(),
            _ => break,
        }
    }
    mount
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 2 MiB tmpfs (root only): the test fills it.
    fn small_disk() -> Option<tempfile::TempDir> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = rustix::mount::mount(
            "pvisor-test",
            dir.path(),
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            Some(c"size=2m"),
        );
        mounted.is_ok().then_some(dir)
    }

    #[test]
    #[ignore = "needs root (a small tmpfs): scripts/test.sh runs it as root, with --include-ignored"]
    fn a_full_disk_still_lets_a_sandbox_end_and_errors_name_the_disk() {
        let disk =
            small_disk().expect("cannot mount a tmpfs: needs root (the test is ignored unless included)");
        let reserve = Reserve::new(disk.path().join("reserve"), 512 << 10);
        reserve.ensure();
        assert_eq!(fs::metadata(disk.path().join("reserve")).unwrap().len(), 512 << 10);
        // Fill the rest.
        let mut filler = fs::File::create(disk.path().join("filler")).unwrap();
        while io::Write::write_all(&mut filler, &[0u8; 4096]).is_ok() {}
        let write = || fs::write(disk.path().join("record.json"), vec![b'x'; 64 << 10]);
        let e = write().unwrap_err();
        assert!(disk_full(&e), "{e}");
        assert!(reserve.disk_low());
        let message = describe_disk(disk.path());
        assert!(
            message.contains(&disk.path().display().to_string()) && message.contains("is full"),
            "{message}"
        );
        assert!(reserve.release());
        write().expect("the reserve makes room for the record that ends a sandbox");
        drop(filler);
        let _ = rustix::mount::unmount(disk.path(), rustix::mount::UnmountFlags::DETACH);
    }
}
