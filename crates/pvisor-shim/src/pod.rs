//! A CRI pod as one VM, Kata Containers' model: the pod's sandbox
//! container boots the VM (with the pod's network), and each later
//! container of the pod runs in it as a guest container (its own root,
//! pid and mount namespaces, memory group), sharing the VM's network (one
//! `localhost`) and ending with it.
//!
//! The root filesystems reach the running VM through one shared directory,
//! the pod's, made when the sandbox is created, on the node at
//! `/run/pvisor-shim/pods/<namespace>/<sandbox id>/`:
//! - the whole is a private mount of its own, so nothing made beneath it
//!   propagates to the node's other mount namespaces (`/run` is shared on
//!   a systemd node), nor back from them;
//! - `pod/` in it is a shared mount of its own peer group, served to the
//!   guest live (virtiofs, [`SharedDirectory::live_mounts`]: the file
//!   server's view is its slave, its top read-only, so a guest cannot plant
//!   a symlink where the node mounts next) and mounted in the guest at
//!   [`GUEST_TARGET`] in the sandbox's root;
//! - `staging/` is where a later container's snapshot is mounted and its
//!   volumes bound inside it; the tree is made private (cut from the
//!   volumes' peer groups, so nothing mounted in one propagates back to the
//!   node's volume directory) and moved to `pod/<container id>` in one step,
//!   which propagates it, whole, into the file server's view.
//!
//! It lives outside containerd's bundles: containerd removes a bundle
//! recursively, and must never walk into a mounted volume. Removing it
//! detaches everything beneath it and only ever `rmdir`s.
//!
//! containerd groups a pod's containers into one shim (`start` answers
//! with the sandbox's shim, see [`grouping`]), which keeps the pod's
//! containers in one process; [`PodDir::admit`] serialises a container's
//! arrival with the pod's end.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use pvisor_core::records::SharedDirectory;
use rustix::mount::{MountPropagationFlags, UnmountFlags};

use crate::spec;

/// The shim's own directory on the node: a private mount, so that nothing
/// made beneath it is copied into the node's other mount namespaces.
const SHIM_RUN: &str = "/run/pvisor-shim";
/// Where pods' directories are made.
const PODS: &str = "/run/pvisor-shim/pods";
/// Where the guest mounts the pod's directory, in the sandbox's root.
const GUEST_TARGET: &str = "/.pvisor-pod";

/// The pod's directory on the node, while its VM runs.
#[derive(Debug)]
pub struct PodDir {
    base: PathBuf,
    /// Where the sandbox's root (the VM's workspace) is in the guest: its
    /// host path, which is where the guest mounts it.
    sandbox_root: PathBuf,
    /// Set once the pod is ending: no container joins it after that.
    closing: Mutex<bool>,
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
    #[error("{id:?} is not an id this shim can place in a pod (one plain path component)")]
    Id { id: String },
    #[error("cannot move container {id}'s root into the pod: {source}")]
    Move {
        id: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the pod is ending; its VM takes no new container")]
    Closing,
}

/// The pod directory's place for `sandbox` of containerd namespace `namespace`.
fn base(namespace: &str, sandbox: &str) -> Result<PathBuf, PodError> {
    for id in [namespace, sandbox] {
        if !spec::is_plain_id(id) {
            return Err(PodError::Id { id: id.to_owned() });
        }
    }
    Ok(Path::new(PODS).join(namespace).join(sandbox))
}

/// A container's way into the pod, held while it is placed: the pod does
/// not end meanwhile.
pub struct Admission<'a> {
    pod: &'a PodDir,
    _open: MutexGuard<'a, bool>,
}

impl PodDir {
    /// Makes the pod's directory (see the module's doc).
    pub fn make(namespace: &str, sandbox: &str, sandbox_root: &Path) -> Result<PodDir, PodError> {
        let base = base(namespace, sandbox)?;
        let made = (|| {
            private_shim_run()?;
            std::fs::create_dir_all(&base)?;
            rustix::mount::mount_bind(&base, &base)?;
            rustix::mount::mount_change(&base, MountPropagationFlags::PRIVATE)?;
            let pod = base.join("pod");
            std::fs::create_dir(&pod)?;
            std::fs::create_dir(base.join("staging"))?;
            rustix::mount::mount_bind(&pod, &pod)?;
            rustix::mount::mount_change(&pod, MountPropagationFlags::SHARED)?;
            Ok(())
        })();
        match made {
            Ok(()) => Ok(PodDir { base, sandbox_root: sandbox_root.to_owned(), closing: Mutex::new(false) }),
            Err(source) => {
                remove(namespace, sandbox);
                Err(PodError::Make { dir: base, source })
            }
        }
    }

    /// The share that gives the pod's VM the directory.
    pub fn share(&self) -> SharedDirectory {
        SharedDirectory {
            source: self.base.join("pod"),
            target: GUEST_TARGET.into(),
            read_only: false,
            live_mounts: true,
        }
    }

    /// Lets a container in, unless the pod is ending.
    pub fn admit(&self) -> Result<Admission<'_>, PodError> {
        let open = self.closing.lock().unwrap_or_else(|p| p.into_inner());
        if *open {
            return Err(PodError::Closing);
        }
        Ok(Admission { pod: self, _open: open })
    }

    /// Ends the pod's directory: no container joins after this returns.
    pub fn close(&self) {
        *self.closing.lock().unwrap_or_else(|p| p.into_inner()) = true;
    }
}

impl Admission<'_> {
    /// Where container `id`'s rootfs is built (made, empty): mount it and
    /// its volumes there, then [`enter`](Self::enter).
    pub fn staging(&self, id: &str) -> Result<PathBuf, PodError> {
        if !spec::is_plain_id(id) {
            return Err(PodError::Id { id: id.to_owned() });
        }
        let dir = self.pod.base.join("staging").join(id);
        std::fs::create_dir(&dir).map_err(|source| PodError::Make { dir: dir.clone(), source })?;
        Ok(dir)
    }

    /// Moves the rootfs built at `staging` into the pod, where the guest
    /// sees it; returns where it is now on the node and in the guest.
    pub fn enter(&self, id: &str, staging: &Path) -> Result<(PathBuf, PathBuf), PodError> {
        let failed = |source: std::io::Error| PodError::Move { id: id.to_owned(), source };
        let host = self.pod.base.join("pod").join(id);
        std::fs::create_dir(&host).map_err(failed)?;
        let moved =
            rustix::mount::mount_change(staging, MountPropagationFlags::PRIVATE | MountPropagationFlags::REC)
                .and_then(|()| rustix::mount::mount_move(staging, &host));
        if let Err(e) = moved {
            let _ = std::fs::remove_dir(&host);
            return Err(failed(e.into()));
        }
        let _ = std::fs::remove_dir(staging);
        let guest = self.pod.sandbox_root.join(GUEST_TARGET.trim_start_matches('/')).join(id);
        Ok((host, guest))
    }
}

/// Makes [`SHIM_RUN`] a private mount of its own, once per boot (a second
/// shim racing the first stacks a second private mount, which is harmless).
fn private_shim_run() -> std::io::Result<()> {
    std::fs::create_dir_all(SHIM_RUN)?;
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    if table.lines().any(|l| l.split(' ').nth(4) == Some(SHIM_RUN)) {
        return Ok(());
    }
    rustix::mount::mount_bind(SHIM_RUN, SHIM_RUN)?;
    rustix::mount::mount_change(SHIM_RUN, MountPropagationFlags::PRIVATE)?;
    Ok(())
}

/// Unmounts the pod's directory (whatever is still mounted beneath it
/// goes with it, detached) and removes it; nothing there is not an error.
/// Also what the cleanup after a crashed shim runs.
pub fn remove(namespace: &str, sandbox: &str) {
    let Ok(base) = base(namespace, sandbox) else { return };
    for _ in 0..4 {
        if rustix::mount::unmount(&base, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW).is_err() {
            break;
        }
    }
    // Never a recursive removal: a mount point that is still mounted holds
    // a container's files or a volume's, and rmdir refuses anything else.
    for dir in ["pod", "staging"] {
        let dir = base.join(dir);
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let _ = std::fs::remove_dir(entry.path());
        }
        let _ = std::fs::remove_dir(&dir);
    }
    let _ = std::fs::remove_dir(&base);
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

    /// A pod's directory is named by plain ids only; a container is placed
    /// by a plain id only, and not once the pod is closing.
    #[test]
    fn pods_and_containers_are_placed_by_plain_ids_only() {
        for (namespace, sandbox) in [("k8s.io", "../x"), ("..", "sb1"), ("k8s.io", ""), ("a/b", "sb1")] {
            assert!(base(namespace, sandbox).is_err(), "{namespace:?} {sandbox:?}");
        }
        assert_eq!(base("k8s.io", "sb1").expect("plain"), Path::new("/run/pvisor-shim/pods/k8s.io/sb1"));
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("staging")).expect("mkdir");
        let pod =
            PodDir { base: dir.path().to_owned(), sandbox_root: "/r".into(), closing: Mutex::new(false) };
        {
            let admission = pod.admit().expect("open");
            for hostile in ["../x", "..", "", "a/b", "/etc"] {
                assert!(admission.staging(hostile).is_err(), "{hostile:?}");
            }
            assert!(admission.staging("c1").expect("made").is_dir());
        }
        pod.close();
        assert!(matches!(pod.admit(), Err(PodError::Closing)));
    }
}
