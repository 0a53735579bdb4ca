//! The OCI spec's host bind mounts, honoured the way a VM can:
//! - a read-write bind of a directory is **shared** live (virtiofs): the
//!   guest reads and writes the host directory itself, so a pod's
//!   `emptyDir` is one directory for its init containers, its containers
//!   and the node (OpenSandbox's execd injection copies execd into one);
//! - every other bind (read-only, or of a file such as CRI's `/etc/hosts`)
//!   is **copied** into the container's rootfs before the Job is admitted,
//!   so it reaches the guest inside the workspace image. A read-only bind is
//!   exact (a guest is root in its VM and could remount a shared one
//!   writable); a read-write file is a copy whose writes stay in the VM.
//!
//! Kernel filesystems (`/proc`, `/dev`, `/sys`, tmpfs) are the guest
//! agent's own: a bind there (CRI's `/dev/shm`) is never shared.
//!
//! The rootfs is the image's, hence untrusted: no component of a
//! destination may be a symlink, so a copy cannot be steered out of it.

use std::fs;
use std::path::{Component, Path, PathBuf};

use oci_spec::runtime::Spec;
use pvisor_core::records::SharedDirectory;

/// The most bytes all binds of one container may copy.
const MAX_COPY: u64 = 256 << 20;

/// A host path to copy to `destination` in the container.
#[derive(Clone, Debug, PartialEq)]
pub struct Bind {
    pub source: PathBuf,
    pub destination: PathBuf,
    pub read_only: bool,
}

/// The spec's bind mounts (type `bind`, or a `bind`/`rbind` option).
pub fn binds(spec: &Spec) -> Vec<Bind> {
    let mut found = Vec::new();
    for m in spec.mounts().iter().flatten() {
        let options = m.options().clone().unwrap_or_default();
        let bind = m.typ().as_deref() == Some("bind") || options.iter().any(|o| o == "bind" || o == "rbind");
        if let (true, Some(source)) = (bind, m.source()) {
            found.push(Bind {
                source: source.clone(),
                destination: m.destination().clone(),
                read_only: options.iter().any(|o| o == "ro"),
            });
        }
    }
    found
}

/// What becomes of the spec's binds.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// Copied into the rootfs ([`copy_in`]).
    pub copied: Vec<Bind>,
    /// Shared with the VM live ([`make_mount_points`], then the Job's
    /// shared directories).
    pub shared: Vec<SharedDirectory>,
}

/// Sorts `binds` into shared (read-write directories outside the guest's
/// own filesystems) and copied (the rest).
pub fn plan(binds: Vec<Bind>) -> Plan {
    let mut plan = Plan::default();
    for bind in binds {
        let guests_own = SharedDirectory::in_kernel_filesystem(&bind.destination);
        if !bind.read_only && !guests_own && bind.source.is_dir() {
            plan.shared.push(SharedDirectory { source: bind.source, target: bind.destination });
        } else {
            plan.copied.push(bind);
        }
    }
    plan
}

/// Makes an empty directory in `rootfs` at each shared directory's target,
/// through no symlink, for the guest to mount it on.
pub fn make_mount_points(shared: &[SharedDirectory], rootfs: &Path) -> Result<(), String> {
    for share in shared {
        let target = inside(rootfs, &share.target)?;
        if fs::symlink_metadata(&target).is_ok_and(|m| !m.is_dir()) {
            return Err(format!(
                "the volume {} is a directory, but the image has a file at {}",
                share.source.display(),
                share.target.display()
            ));
        }
        fs::create_dir_all(&target).map_err(|e| {
            format!(
                "cannot make the mount point {} for {}: {e}",
                share.target.display(),
                share.source.display()
            )
        })?;
    }
    Ok(())
}

/// Copies every bind into `rootfs`.
pub fn copy_in(binds: &[Bind], rootfs: &Path) -> Result<(), String> {
    let mut budget = MAX_COPY;
    for bind in binds {
        let target = inside(rootfs, &bind.destination)?;
        copy(&bind.source, &target, &mut budget).map_err(|e| {
            format!(
                "cannot copy the bind mount {} to {}: {e}",
                bind.source.display(),
                bind.destination.display()
            )
        })?;
        if !bind.read_only {
            log::warn!(
                "{} is a copy in the VM: writes to it do not reach the host",
                bind.destination.display()
            );
        }
    }
    Ok(())
}

/// `destination` under `rootfs`, refusing `..` and symlinked components.
fn inside(rootfs: &Path, destination: &Path) -> Result<PathBuf, String> {
    let mut path = rootfs.to_path_buf();
    for component in destination.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => {
                path.push(name);
                if fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
                    return Err(format!(
                        "{} is a symlink in the image; a bind mount cannot go there",
                        destination.display()
                    ));
                }
            }
            _ => return Err(format!("{} is not a plain absolute path", destination.display())),
        }
    }
    Ok(path)
}

/// Copies `source` (a file or a tree) to `target`. The walk keeps its own
/// stack of directories to copy: a volume's tree may have been built by a
/// container and chooses its depth, which must not become the shim's stack.
fn copy(source: &Path, target: &Path, budget: &mut u64) -> std::io::Result<()> {
    let mut pending = vec![(source.to_owned(), target.to_owned())];
    while let Some((source, target)) = pending.pop() {
        let meta = fs::metadata(&source)?;
        if !meta.is_dir() {
            copy_file(&source, &target, meta.len(), budget)?;
            continue;
        }
        fs::create_dir_all(&target)?;
        for entry in fs::read_dir(&source)? {
            let entry = entry?;
            let (from, to) = (entry.path(), target.join(entry.file_name()));
            if entry.file_type()?.is_symlink() {
                let _ = fs::remove_file(&to);
                std::os::unix::fs::symlink(fs::read_link(&from)?, &to)?;
            } else {
                pending.push((from, to));
            }
        }
    }
    Ok(())
}

fn copy_file(source: &Path, target: &Path, len: u64, budget: &mut u64) -> std::io::Result<()> {
    *budget = budget
        .checked_sub(len)
        .ok_or_else(|| std::io::Error::other(format!("the bind mounts exceed {} MiB", MAX_COPY >> 20)))?;
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent)?;
    }
    // Not through an image symlink at the leaf either.
    if fs::symlink_metadata(target).is_ok_and(|m| m.file_type().is_symlink()) {
        fs::remove_file(target)?;
    }
    fs::copy(source, target).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_are_copied_in_and_symlinks_refused() {
        let host = tempfile::tempdir().expect("tempdir");
        let rootfs = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(host.path().join("data/sub")).expect("mkdir");
        fs::write(host.path().join("data/sub/f"), b"payload").expect("write");
        fs::write(host.path().join("hosts"), b"127.0.0.1 x\n").expect("write");
        let spec: Spec = serde_json::from_value(serde_json::json!({
            "ociVersion": "1.0.2",
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/data", "type": "bind", "source": host.path().join("data"), "options": ["rbind", "ro"]},
                {"destination": "/etc/hosts", "type": "bind", "source": host.path().join("hosts"), "options": ["rbind", "rw"]}
            ]
        }))
        .expect("a spec");
        let found = binds(&spec);
        assert_eq!(found.len(), 2);
        assert!(found[0].read_only && !found[1].read_only);
        copy_in(&found, rootfs.path()).expect("copied");
        assert_eq!(fs::read(rootfs.path().join("data/sub/f")).expect("read"), b"payload");
        assert_eq!(fs::read(rootfs.path().join("etc/hosts")).expect("read"), b"127.0.0.1 x\n");
        std::os::unix::fs::symlink(host.path(), rootfs.path().join("escape")).expect("symlink");
        let bad =
            Bind { source: host.path().join("hosts"), destination: "/escape/x".into(), read_only: true };
        assert!(copy_in(&[bad], rootfs.path()).unwrap_err().contains("symlink"));
        assert!(!host.path().join("x").exists(), "nothing was written outside the rootfs");
    }

    /// Read-write directories are shared; read-only binds, files and the
    /// guest's own filesystems (CRI's `/dev/shm`) are copied.
    #[test]
    fn read_write_directories_are_shared_and_the_rest_copied() {
        let host = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(host.path().join("vol")).expect("mkdir");
        fs::write(host.path().join("hosts"), b"x").expect("write");
        let bind = |source: &str, destination: &str, read_only| Bind {
            source: host.path().join(source),
            destination: destination.into(),
            read_only,
        };
        let planned = plan(vec![
            bind("vol", "/data", false),
            bind("vol", "/ro", true),
            bind("hosts", "/etc/hosts", false),
            bind("vol", "/dev/shm", false),
        ]);
        assert_eq!(
            planned.shared,
            [SharedDirectory { source: host.path().join("vol"), target: "/data".into() }]
        );
        let copied: Vec<&str> = planned.copied.iter().map(|b| b.destination.to_str().unwrap()).collect();
        assert_eq!(copied, ["/ro", "/etc/hosts", "/dev/shm"]);

        let rootfs = tempfile::tempdir().expect("tempdir");
        make_mount_points(&planned.shared, rootfs.path()).expect("made");
        assert!(rootfs.path().join("data").is_dir());
        // The image cannot steer the mount point out of the rootfs.
        std::os::unix::fs::symlink(host.path(), rootfs.path().join("escape")).expect("symlink");
        let hostile = [SharedDirectory { source: host.path().join("vol"), target: "/escape/made".into() }];
        assert!(make_mount_points(&hostile, rootfs.path()).unwrap_err().contains("symlink"));
        assert!(!host.path().join("made").exists(), "nothing was made outside the rootfs");
        fs::write(rootfs.path().join("file"), b"").expect("write");
        let onto_file = [SharedDirectory { source: host.path().join("vol"), target: "/file".into() }];
        assert!(make_mount_points(&onto_file, rootfs.path()).unwrap_err().contains("a file at /file"));
    }
}
