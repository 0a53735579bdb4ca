//! A CRI pod as one VM, Kata Containers' model: the pod's sandbox
//! container boots the VM (with the pod's network), and each later
//! container of the pod runs in it, as guest processes chrooted into its
//! own root filesystem, sharing the VM's network (one `localhost`) and
//! ending with it.
//!
//! The root filesystems reach the running VM through one shared directory,
//! the pod's, made when the sandbox is created: `<sandbox bundle>/pod` on
//! the host, a shared mount point of its own, served to the guest live
//! (virtiofs, [`SharedDirectory::live_mounts`]) and mounted there at
//! [`GUEST_TARGET`] in the sandbox's root. A later container's snapshot
//! (and its volumes) are mounted on the host at `pod/<container id>`; the
//! mount propagates into the file server's view, so the guest sees it at
//! once, with nothing booted, restored or copied.
//!
//! Only this module knows the layout; containerd groups a pod's containers
//! into one shim (`start` answers with the sandbox's shim, see
//! [`grouping`]), which keeps the pod's containers in one process.

use std::path::{Path, PathBuf};

use pvisor_core::records::SharedDirectory;
use rustix::mount::{MountPropagationFlags, UnmountFlags};

use crate::spec;

/// The pod's directory, in the sandbox's bundle.
const POD_DIR: &str = "pod";
/// Where the guest mounts the pod's directory, in the sandbox's root.
const GUEST_TARGET: &str = "/.pvisor-pod";

/// The pod's directory on the host, while its VM runs.
#[derive(Debug)]
pub struct PodDir {
    host: PathBuf,
    /// Where the sandbox's root (the VM's workspace) is in the guest: its
    /// host path, which is where the guest mounts it.
    sandbox_root: PathBuf,
}

/// Why a pod's directory or a container's place in it could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    #[error("cannot make the pod's directory {}: {source}", dir.display())]
    Make {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{id:?} is not a container id this shim can place in a pod (one plain path component)")]
    Id { id: String },
}

impl PodDir {
    /// Makes `<bundle>/pod` a shared mount point of its own, so the mounts
    /// made beneath it later reach the VM's file server (a slave of it).
    pub fn make(bundle: &Path, sandbox_root: &Path) -> Result<PodDir, PodError> {
        let host = bundle.join(POD_DIR);
        let made = (|| {
            std::fs::create_dir_all(&host)?;
            let host = std::fs::canonicalize(&host)?;
            rustix::mount::mount_bind(&host, &host)?;
            rustix::mount::mount_change(&host, MountPropagationFlags::SHARED)?;
            Ok(host)
        })();
        match made {
            Ok(host) => Ok(PodDir { host, sandbox_root: sandbox_root.to_owned() }),
            Err(source) => {
                remove(bundle);
                Err(PodError::Make { dir: bundle.join(POD_DIR), source })
            }
        }
    }

    /// The share that gives the pod's VM the directory.
    pub fn share(&self) -> SharedDirectory {
        SharedDirectory {
            source: self.host.clone(),
            target: GUEST_TARGET.into(),
            read_only: false,
            live_mounts: true,
        }
    }

    /// Where container `id`'s root filesystem goes: on the host (made,
    /// empty) and as the guest sees it.
    pub fn place(&self, id: &str) -> Result<(PathBuf, PathBuf), PodError> {
        if !spec::is_plain_id(id) {
            return Err(PodError::Id { id: id.to_owned() });
        }
        let host = self.host.join(id);
        std::fs::create_dir_all(&host).map_err(|source| PodError::Make { dir: host.clone(), source })?;
        let guest = self.sandbox_root.join(GUEST_TARGET.trim_start_matches('/')).join(id);
        Ok((host, guest))
    }
}

/// Unmounts the pod's directory (whatever is still mounted beneath it
/// goes with it, detached) and removes it; nothing there is not an error. Also what
/// the cleanup after a crashed shim runs on a sandbox's bundle.
pub fn remove(bundle: &Path) {
    let dir = bundle.join(POD_DIR);
    for _ in 0..4 {
        if rustix::mount::unmount(&dir, UnmountFlags::DETACH).is_err() {
            break;
        }
    }
    // Never a recursive removal: a mount point that is still mounted holds
    // a container's files or a volume's. What is left are the containers'
    // empty mount points, and rmdir refuses anything else.
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let _ = std::fs::remove_dir(entry.path());
    }
    let _ = std::fs::remove_dir(&dir);
}

/// The shim a container belongs to: a pod's later container is served by
/// its sandbox's shim (containerd then sends its Create there), every
/// other container by its own. containerd runs `start` in the bundle.
pub fn grouping(id: &str, bundle: &Path) -> String {
    match spec::load(bundle).ok().and_then(|s| spec::pod_member_of(&s)) {
        Some(sandbox) => sandbox,
        None => id.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle_with(annotations: serde_json::Value) -> tempfile::TempDir {
        let bundle = tempfile::tempdir().expect("tempdir");
        let spec = serde_json::json!({"ociVersion": "1.0.2", "annotations": annotations});
        std::fs::write(bundle.path().join("config.json"), spec.to_string()).expect("write");
        bundle
    }

    /// A pod's later container goes to its sandbox's shim; the sandbox, a
    /// plain container, a hostile sandbox id and a bundle without a spec
    /// each get a shim of their own.
    #[test]
    fn a_pods_containers_are_grouped_with_its_sandbox() {
        let member = serde_json::json!({
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.sandbox-id": "sb1",
        });
        assert_eq!(grouping("c1", bundle_with(member).path()), "sb1");
        let sandbox = serde_json::json!({
            "io.kubernetes.cri.container-type": "sandbox",
            "io.kubernetes.cri.sandbox-id": "sb1",
        });
        assert_eq!(grouping("sb1", bundle_with(sandbox).path()), "sb1");
        assert_eq!(grouping("plain", bundle_with(serde_json::json!({})).path()), "plain");
        for hostile in ["../sb1", "", "..", "a/b"] {
            let member = serde_json::json!({
                "io.kubernetes.cri.container-type": "container",
                "io.kubernetes.cri.sandbox-id": hostile,
            });
            assert_eq!(grouping("c1", bundle_with(member).path()), "c1", "{hostile:?}");
        }
        let empty = tempfile::tempdir().expect("tempdir");
        assert_eq!(grouping("c1", empty.path()), "c1");
    }

    /// A container's place in the pod: its id is one path component, and
    /// the guest sees it under the sandbox's root.
    #[test]
    fn a_container_is_placed_by_a_plain_id_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pod = PodDir { host: dir.path().to_owned(), sandbox_root: "/run/b/sb1/rootfs".into() };
        let (host, guest) = pod.place("c1").expect("placed");
        assert!(host.is_dir() && host.starts_with(dir.path()));
        assert_eq!(guest, PathBuf::from("/run/b/sb1/rootfs/.pvisor-pod/c1"));
        for hostile in ["../x", "..", "", "a/b", "/etc"] {
            assert!(pod.place(hostile).is_err(), "{hostile:?}");
        }
        assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 1, "nothing else was made");
    }
}
