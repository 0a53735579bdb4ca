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
//! The copy runs on the host, as root, between two untrusted trees: the
//! rootfs is the image's, and a bind's source may be a directory a guest
//! writes through a shared volume. So no symlink on either side is ever
//! followed: every file operation is relative to a directory descriptor,
//! resolved with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`
//! ([`pvisor_stage::beneath`]); a symlink is copied as a symlink, for the
//! guest to resolve in its own VM. Devices, FIFOs and sockets are skipped
//! (logged), never opened; a file is opened `O_NOFOLLOW | O_NONBLOCK` and
//! checked to be regular before a byte is read. Copies keep their source's
//! owner and permission bits but never setuid or setgid, and no extended
//! attribute (file capabilities), so no copy grants a privilege in the
//! guest that the bind's files did not already give their owner.
//!
//! A bind shadows what the image has at its destination, as a mount would:
//! that is removed first, so nothing the image planted below it (a
//! symlink out of the rootfs) is merged into.

use std::ffi::OsStr;
use std::fs::File;
use std::path::{Component, Path, PathBuf};

use oci_spec::runtime::Spec;
use pvisor_core::digest::Contents;
use pvisor_core::records::SharedDirectory;
use pvisor_stage::beneath::{Kind, Root, Stat};

/// The most bytes all binds of one container may copy.
const MAX_COPY: u64 = 256 << 20;
/// The most entries (files, directories, links) they may hold.
const MAX_ENTRIES: u64 = 100_000;

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
            plan.shared.push(SharedDirectory {
                source: bind.source,
                target: bind.destination,
                read_only: false,
                live_mounts: false,
            });
        } else {
            plan.copied.push(bind);
        }
    }
    plan
}

/// Why a volume's mount point or a bind's copy could not be made in the
/// rootfs.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("cannot open the rootfs {}: {source}", rootfs.display())]
    OpenRootfs {
        rootfs: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not a plain absolute path", destination.display())]
    NotPlain { destination: PathBuf },
    #[error("a bind mount cannot replace the container's root")]
    ReplacesRoot,
    #[error("cannot make {} for a bind mount: {source}", parent.display())]
    MakeParent {
        parent: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is a symlink in the image; a bind mount cannot go there", destination.display())]
    Symlink { destination: PathBuf },
    #[error("{} is not a directory in the image", parent.display())]
    NotDirectory { parent: PathBuf },
    #[error("cannot make the mount point {} for {}: {source}", target.display(), source_dir.display())]
    MountPoint {
        target: PathBuf,
        source_dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the volume {} is a directory, but the image has a file at {}", volume.display(), target.display())]
    FileAtMountPoint { volume: PathBuf, target: PathBuf },
    #[error("cannot mount the volume {} at {}: {source}", source_dir.display(), target.display())]
    Mount {
        source_dir: PathBuf,
        target: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot copy the bind mount {} to {}: {source}", from.display(), to.display())]
    Copy {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Makes an empty directory in `rootfs` at each shared directory's target,
/// through no symlink, for the guest to mount it on.
pub fn make_mount_points(shared: &[SharedDirectory], rootfs: &Path) -> Result<(), BindError> {
    let into = open_rootfs(rootfs)?;
    for share in shared {
        let target = inside(&share.target)?;
        make_parents(&into, &target, &share.target)?;
        let made = |source: std::io::Error| BindError::MountPoint {
            target: share.target.clone(),
            source_dir: share.source.clone(),
            source,
        };
        match into.stat(&target).map_err(made)?.map(|s| s.kind) {
            None => into.mkdir(&target, 0o755).map_err(made)?,
            Some(Kind::Dir) => {}
            Some(_) => {
                return Err(BindError::FileAtMountPoint {
                    volume: share.source.clone(),
                    target: share.target.clone(),
                })
            }
        }
    }
    Ok(())
}

/// Mounts each shared directory on the host at its target in `rootfs`,
/// made as [`make_mount_points`] makes it, right before its mount (so a
/// volume nested in another gets its mount point in that volume, as runc
/// makes it): for a container in a pod's VM, whose rootfs that VM's file
/// server sees live, mounts included (Kata Containers shares a pod's
/// volumes with its VM the same way). Both ends are opened through no
/// symlink and mounted by descriptor, so nothing the image or a volume
/// holds can redirect the mount. Each mount is made private at once: a
/// bind of a volume would otherwise stay a peer of the node's directory
/// (the kubelet's are shared), and a volume nested in it would appear in
/// the node's copy. What was mounted before an error goes with the
/// rootfs's (recursive) unmount.
pub fn mount_into(shared: &[SharedDirectory], rootfs: &Path) -> Result<(), BindError> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let path = |fd: &std::os::fd::OwnedFd| format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(fd));
    for share in shared {
        make_mount_points(std::slice::from_ref(share), rootfs)?;
        let into = open_rootfs(rootfs)?;
        let failed = |source: std::io::Error| BindError::Mount {
            source_dir: share.source.clone(),
            target: share.target.clone(),
            source,
        };
        let target = inside(&share.target)?;
        let at = into.open_directory(&target).map_err(failed)?;
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        let from = rustix::fs::openat2(rustix::fs::CWD, &share.source, flags, Mode::empty(), resolve)
            .map_err(|e| failed(e.into()))?;
        // Read-write: [`plan`] shares no read-only bind (it copies those).
        rustix::mount::mount_bind_recursive(path(&from), path(&at)).map_err(|e| failed(e.into()))?;
        // Opened again, the place is now the mount's root.
        let mounted = open_rootfs(rootfs)?.open_directory(&target).map_err(failed)?;
        let private =
            rustix::mount::MountPropagationFlags::PRIVATE | rustix::mount::MountPropagationFlags::REC;
        rustix::mount::mount_change(path(&mounted), private).map_err(|e| failed(e.into()))?;
    }
    Ok(())
}

/// Copies every bind into `rootfs`.
pub fn copy_in(binds: &[Bind], rootfs: &Path) -> Result<(), BindError> {
    let into = open_rootfs(rootfs)?;
    let mut budget = Budget { bytes: MAX_COPY, entries: MAX_ENTRIES };
    for bind in binds {
        let target = inside(&bind.destination)?;
        make_parents(&into, &target, &bind.destination)?;
        let failed = |source: std::io::Error| BindError::Copy {
            from: bind.source.clone(),
            to: bind.destination.clone(),
            source,
        };
        into.remove_all(&target).map_err(failed)?;
        copy_bind(&bind.source, &into, &target, &mut budget).map_err(failed)?;
        if !bind.read_only {
            log::warn!(
                "{} is a copy in the VM: writes to it do not reach the host",
                bind.destination.display()
            );
        }
    }
    Ok(())
}

fn open_rootfs(rootfs: &Path) -> Result<Root, BindError> {
    Root::open(rootfs).map_err(|source| BindError::OpenRootfs { rootfs: rootfs.to_path_buf(), source })
}

/// `destination` relative to the rootfs, refusing `..` and the root itself.
fn inside(destination: &Path) -> Result<PathBuf, BindError> {
    let mut path = PathBuf::new();
    for component in destination.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => path.push(name),
            _ => return Err(BindError::NotPlain { destination: destination.to_path_buf() }),
        }
    }
    if path.as_os_str().is_empty() {
        return Err(BindError::ReplacesRoot);
    }
    Ok(path)
}

/// Makes the directories above `target` that the image lacks (0755, the
/// shim's), refusing any that is a symlink or not a directory.
fn make_parents(into: &Root, target: &Path, destination: &Path) -> Result<(), BindError> {
    let mut parent = PathBuf::new();
    let mut names: Vec<&OsStr> = target.iter().collect();
    names.pop();
    for name in names {
        parent.push(name);
        let failed = |source: std::io::Error| BindError::MakeParent { parent: parent.clone(), source };
        match into.stat(&parent).map_err(failed)?.map(|s| s.kind) {
            None => into.mkdir(&parent, 0o755).map_err(failed)?,
            Some(Kind::Dir) => {}
            Some(Kind::Symlink) => return Err(BindError::Symlink { destination: destination.to_path_buf() }),
            Some(_) => return Err(BindError::NotDirectory { parent }),
        }
    }
    Ok(())
}

/// What the binds of one container may still copy.
struct Budget {
    bytes: u64,
    entries: u64,
}

impl Budget {
    fn take(&mut self, bytes: u64) -> std::io::Result<()> {
        self.entries = self.entries.checked_sub(1).ok_or_else(|| {
            std::io::Error::other(format!("the bind mounts hold more than {MAX_ENTRIES} entries"))
        })?;
        self.bytes = self
            .bytes
            .checked_sub(bytes)
            .ok_or_else(|| std::io::Error::other(format!("the bind mounts exceed {} MiB", MAX_COPY >> 20)))?;
        Ok(())
    }
}

/// Copies the bind `source` (a path the spec names, followed as given:
/// containerd and the kubelet chose it) to `target` in `into`. Below it,
/// nothing is followed.
fn copy_bind(source: &Path, into: &Root, target: &Path, budget: &mut Budget) -> std::io::Result<()> {
    let source = source.canonicalize()?;
    if source.is_dir() {
        let from = Root::open(&source)?;
        return copy_tree(&from, into, target, budget);
    }
    let (Some(parent), Some(name)) = (source.parent(), source.file_name()) else {
        return Err(std::io::Error::other("not a file or a directory"));
    };
    let from = Root::open(parent)?;
    let name = Path::new(name);
    let stat = from.stat(name)?.ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
    copy_entry(&from, name, stat, into, target, budget)
}

/// Copies the directory `from` (its root) to `target`, one entry at a
/// time (a deep tree cannot overflow the stack).
fn copy_tree(from: &Root, into: &Root, target: &Path, budget: &mut Budget) -> std::io::Result<()> {
    let root = from.stat_root()?;
    budget.take(0)?;
    make_dir(into, target, &root)?;
    let mut pending = vec![(PathBuf::new(), target.to_path_buf())];
    while let Some((source_dir, target_dir)) = pending.pop() {
        for name in from.list(&source_dir)? {
            let (source, target) = (source_dir.join(&name), target_dir.join(&name));
            // Gone since the listing: a guest is writing the share.
            let Some(stat) = from.stat(&source)? else { continue };
            if stat.kind == Kind::Dir {
                budget.take(0)?;
                make_dir(into, &target, &stat)?;
                pending.push((source, target));
            } else {
                copy_entry(from, &source, stat, into, &target, budget)?;
            }
        }
    }
    Ok(())
}

/// Copies one file, symlink or (empty) directory; skips anything else.
fn copy_entry(
    from: &Root,
    source: &Path,
    stat: Stat,
    into: &Root,
    target: &Path,
    budget: &mut Budget,
) -> std::io::Result<()> {
    match stat.kind {
        Kind::Dir => {
            budget.take(0)?;
            make_dir(into, target, &stat)
        }
        Kind::Symlink => {
            budget.take(0)?;
            into.write_symlink(target, &from.read_link(source)?)
        }
        Kind::File => {
            let file = from.open_file(source)?;
            let size = file.metadata()?.len();
            budget.take(size)?;
            into.write_file(target, &Prefix { file, size }, unprivileged(stat.mode), None)?;
            own(into, target, &stat)
        }
        Kind::Special => {
            log::warn!("{}: not copied, a device, FIFO or socket is never opened", source.display());
            Ok(())
        }
    }
}

fn make_dir(into: &Root, target: &Path, stat: &Stat) -> std::io::Result<()> {
    into.mkdir(target, unprivileged(stat.mode))?;
    own(into, target, stat)
}

/// The source's owner, which grants nothing once setuid/setgid are gone
/// (the owner could already write the source). `-1` is no owner to give.
fn own(into: &Root, target: &Path, stat: &Stat) -> std::io::Result<()> {
    if stat.uid == u32::MAX || stat.gid == u32::MAX {
        return Ok(());
    }
    into.chown(target, stat.uid, stat.gid)
}

/// Permission bits without setuid and setgid (the sticky bit stays).
fn unprivileged(mode: u32) -> u32 {
    mode & 0o1777
}

/// The first `size` bytes of `file`: what the budget counted, however much
/// a guest appends while it is copied.
struct Prefix {
    file: File,
    size: u64,
}

impl Contents for Prefix {
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.size.min(self.file.size()?))
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let room = usize::try_from(self.size.saturating_sub(offset)).unwrap_or(usize::MAX);
        let len = buf.len().min(room);
        Contents::read_at(&self.file, &mut buf[..len], offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

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
        assert!(copy_in(&[bad], rootfs.path()).unwrap_err().to_string().contains("symlink"));
        assert!(!host.path().join("x").exists(), "nothing was written outside the rootfs");
    }

    /// A pod container's volume is mounted into its rootfs on the host, at
    /// its target and nowhere a symlink in the image leads.
    #[test]
    #[ignore = "needs root (a bind mount): scripts/test.sh runs it as root, with --include-ignored"]
    fn a_pod_containers_volume_is_mounted_beneath_its_rootfs_only() {
        assert!(rustix::process::geteuid().is_root(), "a bind mount needs root (ignored unless included)");
        let host = tempfile::tempdir().expect("tempdir");
        let rootfs = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(host.path().join("vol")).expect("mkdir");
        fs::write(host.path().join("vol/f"), b"volume").expect("write");
        std::os::unix::fs::symlink(host.path(), rootfs.path().join("escape")).expect("symlink");
        let share = |target: &str| SharedDirectory {
            source: host.path().join("vol"),
            target: target.into(),
            read_only: false,
            live_mounts: false,
        };
        let refused = mount_into(&[share("/escape/vol2")], rootfs.path()).unwrap_err();
        assert!(refused.to_string().contains("symlink"), "{refused}");
        assert!(!host.path().join("vol2").exists(), "nothing was made outside the rootfs");
        // A second volume nested in the first: its mount point is made in
        // the first volume, and its mount does not reach the node's copy
        // of that volume (each bind is made private at once).
        fs::create_dir_all(host.path().join("vol2")).expect("mkdir");
        // The node's volumes live on a shared mount (the kubelet's are).
        rustix::mount::mount_bind(host.path(), host.path()).expect("bind");
        rustix::mount::mount_change(host.path(), rustix::mount::MountPropagationFlags::SHARED)
            .expect("shared");
        let nested = SharedDirectory { source: host.path().join("vol2"), ..share("/data/vol/inner") };
        mount_into(&[share("/data/vol"), nested], rootfs.path()).expect("mounted");
        let seen = fs::read(rootfs.path().join("data/vol/f"));
        let table = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        crate::rootfs::unmount_all(&rootfs.path().join("data/vol"), &[]);
        crate::rootfs::unmount_all(host.path(), &[]);
        assert_eq!(seen.expect("the volume's file, through the mount"), b"volume");
        let node_copy = host.path().join("vol/inner").display().to_string();
        assert!(host.path().join("vol/inner").is_dir(), "the nested mount point is in the volume");
        assert!(
            !table.lines().any(|l| l.split(' ').nth(4) == Some(node_copy.as_str())),
            "the nested volume is not mounted in the node's directory: {table}"
        );
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
            [SharedDirectory {
                source: host.path().join("vol"),
                target: "/data".into(),
                read_only: false,
                live_mounts: false
            }]
        );
        let copied: Vec<&str> = planned.copied.iter().map(|b| b.destination.to_str().unwrap()).collect();
        assert_eq!(copied, ["/ro", "/etc/hosts", "/dev/shm"]);

        let rootfs = tempfile::tempdir().expect("tempdir");
        make_mount_points(&planned.shared, rootfs.path()).expect("made");
        assert!(rootfs.path().join("data").is_dir());
        // The image cannot steer the mount point out of the rootfs.
        std::os::unix::fs::symlink(host.path(), rootfs.path().join("escape")).expect("symlink");
        let hostile = [SharedDirectory {
            source: host.path().join("vol"),
            target: "/escape/made".into(),
            read_only: false,
            live_mounts: false,
        }];
        assert!(make_mount_points(&hostile, rootfs.path()).unwrap_err().to_string().contains("symlink"));
        assert!(!host.path().join("made").exists(), "nothing was made outside the rootfs");
        fs::write(rootfs.path().join("file"), b"").expect("write");
        let onto_file = [SharedDirectory {
            source: host.path().join("vol"),
            target: "/file".into(),
            read_only: false,
            live_mounts: false,
        }];
        assert!(make_mount_points(&onto_file, rootfs.path())
            .unwrap_err()
            .to_string()
            .contains("a file at /file"));
    }

    /// The image plants `/data/sub -> OUTSIDE` and the source holds
    /// `sub/authorized_keys`, a symlink to a host secret, a FIFO, a device
    /// node and a setuid-root file: nothing is written outside the rootfs,
    /// nothing special is opened (a FIFO would block), no setuid survives.
    #[test]
    fn a_copy_follows_no_symlink_opens_no_special_file_and_drops_setuid() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let (outside, host, rootfs) = (tempdir(), tempdir(), tempdir());
        fs::write(outside.path().join("secret"), b"host secret").expect("write");
        let source = host.path().join("vol");
        fs::create_dir_all(source.join("sub")).expect("mkdir");
        fs::write(source.join("sub/authorized_keys"), b"ssh-ed25519 attacker").expect("write");
        symlink(outside.path().join("secret"), source.join("leak")).expect("symlink");
        fs::write(source.join("suid"), b"#!/bin/sh\n").expect("write");
        fs::set_permissions(source.join("suid"), fs::Permissions::from_mode(0o6755)).expect("chmod");
        let fifo = rustix::fs::mknodat(
            rustix::fs::CWD,
            source.join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        );
        fifo.expect("mkfifo");
        let root = rustix::process::geteuid().is_root();
        if root {
            let null = rustix::fs::makedev(1, 3);
            let made = rustix::fs::mknodat(
                rustix::fs::CWD,
                source.join("null"),
                rustix::fs::FileType::CharacterDevice,
                rustix::fs::Mode::from_raw_mode(0o666),
                null,
            );
            made.expect("mknod");
        }
        fs::create_dir_all(rootfs.path().join("data")).expect("mkdir");
        symlink(outside.path(), rootfs.path().join("data/sub")).expect("symlink");

        let bind = Bind { source, destination: "/data".into(), read_only: true };
        copy_in(&[bind], rootfs.path()).expect("copied");

        let names: Vec<_> =
            fs::read_dir(outside.path()).expect("list").map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["secret"], "nothing was created outside the rootfs");
        assert_eq!(fs::read(outside.path().join("secret")).expect("read"), b"host secret");
        let data = rootfs.path().join("data");
        assert!(fs::symlink_metadata(data.join("sub")).expect("sub").is_dir(), "the image's link is gone");
        assert_eq!(fs::read(data.join("sub/authorized_keys")).expect("read"), b"ssh-ed25519 attacker");
        assert!(fs::symlink_metadata(data.join("leak")).expect("leak").file_type().is_symlink());
        assert_eq!(fs::read_link(data.join("leak")).expect("link"), outside.path().join("secret"));
        let mode = fs::metadata(data.join("suid")).expect("suid").permissions().mode();
        assert_eq!(mode & 0o7777, 0o755, "setuid and setgid are dropped");
        assert!(!data.join("fifo").exists() && !data.join("null").exists(), "special files are skipped");
    }

    /// A bind cannot replace the rootfs itself or climb out of it.
    #[test]
    fn destinations_must_be_plain_paths_below_the_root() {
        let (host, rootfs) = (tempdir(), tempdir());
        fs::write(host.path().join("f"), b"x").expect("write");
        for bad in ["/", "/a/../../x"] {
            let bind = Bind { source: host.path().join("f"), destination: bad.into(), read_only: true };
            assert!(copy_in(&[bind], rootfs.path()).is_err(), "{bad}");
        }
        assert_eq!(fs::read_dir(rootfs.path()).expect("list").count(), 0);
    }

    fn tempdir() -> tempfile::TempDir {
        tempfile::tempdir().expect("tempdir")
    }
}
