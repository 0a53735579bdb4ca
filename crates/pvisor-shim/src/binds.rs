//! The OCI spec's host bind mounts, honoured the way a VM can: each is
//! **copied** into the container's rootfs before the Job is admitted, so it
//! reaches the guest inside the workspace image. A read-only bind is exact;
//! a read-write bind is a copy whose writes stay in the VM (logged).
//! Kernel filesystems (`/proc`, `/dev`, `/sys`, tmpfs) are the guest
//! agent's own and are skipped.
//!
//! The rootfs is the image's, hence untrusted: no component of a
//! destination may be a symlink, so a copy cannot be steered out of it.

use std::fs;
use std::path::{Component, Path, PathBuf};

use oci_spec::runtime::Spec;

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

fn copy(source: &Path, target: &Path, budget: &mut u64) -> std::io::Result<()> {
    let meta = fs::metadata(source)?;
    if meta.is_dir() {
        fs::create_dir_all(target)?;
        for entry in fs::read_dir(source)? {
            let entry = entry?;
            let (from, to) = (entry.path(), target.join(entry.file_name()));
            if entry.file_type()?.is_symlink() {
                let _ = fs::remove_file(&to);
                std::os::unix::fs::symlink(fs::read_link(&from)?, &to)?;
            } else {
                copy(&from, &to, budget)?;
            }
        }
        return Ok(());
    }
    *budget = budget
        .checked_sub(meta.len())
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
}
