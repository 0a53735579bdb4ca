//! The sandbox's read-only view of the host's filesystems, built so that no
//! host Unix socket can be connected to.
//!
//! `connect(2)` and `sendto(2)` to a pathname socket ignore read-only mounts,
//! so a recursive read-only bind of `/` (what most sandboxes do) leaves every
//! host service that listens on a socket file reachable: Docker, containerd,
//! an ssh or gpg agent, a database. overlayfs does not pass sockets through:
//! a socket seen through an overlay is the overlay's inode, not the one the
//! server bound, so the kernel answers `ECONNREFUSED`. Each host mount that
//! can hold files is therefore shown as a read-only overlay of itself (one
//! lower layer plus an empty one; overlays need two); filesystems that cannot
//! hold a socket (`proc`, `sysfs`, cgroup, ...) are plain read-only binds.
//! A directory with mounts below it cannot be an overlay layer in a user
//! namespace, so it becomes a read-only tmpfs skeleton of its entries (on a
//! typical host: `/` alone).
//! `--expose-socket PATH` binds one named socket back over its overlay copy.
//!
//! Where the kernel refuses an overlay of some mount (an exotic filesystem),
//! that mount is bound read-only instead and reported: sockets there stay
//! reachable, and the Trace says so. docs/threat-model.md has the reasoning
//! and the alternatives (Landlock has no right for pathname `connect` before
//! ABI 8; seccomp user notification cannot close the `sendmsg` race).

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::helper::{under, StepError};
use super::mounts::tmpfs;
use pvisor_sandbox::sys;

/// Paths the sandbox gets its own, fresh filesystems for; host mounts at or
/// below them are never shown.
const REPLACED: [&str; 4] = ["/proc", "/dev", "/tmp", "/run"];

/// Whether a mount cannot hold a Unix socket a host service listens on:
/// one of [`SOCKETLESS`], or anything under `/sys` (the kernel's own tree;
/// its cgroup tmpfs is root's).
fn socketless(fs_type: &str, point: &Path) -> bool {
    SOCKETLESS.contains(&fs_type) || point.starts_with("/sys")
}

/// Filesystem types that cannot hold a Unix socket: bound as they are.
const SOCKETLESS: [&str; 18] = [
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "devpts",
    "mqueue",
    "debugfs",
    "tracefs",
    "securityfs",
    "pstore",
    "bpf",
    "configfs",
    "fusectl",
    "binfmt_misc",
    "efivarfs",
    "hugetlbfs",
    "nsfs",
    "selinuxfs",
];

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostMount {
    id: u32,
    parent: u32,
    point: PathBuf,
    fs_type: String,
}

/// What [`assemble`] could not make socket-proof.
#[derive(Debug, Default)]
pub(crate) struct HostView {
    /// Host mounts shown as read-only binds because the kernel refused an
    /// overlay of them: sockets under these stay reachable.
    pub sockets_reachable: Vec<PathBuf>,
}

/// Shows the host's filesystems at `root`, read-only, nosuid and nodev.
pub(crate) fn assemble(root: &Path) -> Result<HostView, StepError> {
    let mounts = read_mountinfo()
        .map_err(|e| StepError::new("root", format!("cannot read /proc/self/mountinfo: {e}")))?;
    show_tree(&mounts, Path::new("/"), root)
}

/// Shows each host path of `paths` (`--ro`) read-only at its own place
/// under `root`, the same way as the rest of the view: a directory as an
/// overlay of itself (or a skeleton), so its sockets stay unreachable; a
/// regular file as a read-only bind. Admission checked that each is a
/// directory or a regular file. A place that does not exist yet (under the
/// sandbox's own `/tmp` or `/run`) is made there first.
pub(crate) fn show_read_only(root: &Path, paths: &[PathBuf]) -> Result<(), StepError> {
    if paths.is_empty() {
        return Ok(());
    }
    let mounts = read_mountinfo()
        .map_err(|e| StepError::new("ro", format!("cannot read /proc/self/mountinfo: {e}")))?;
    for path in paths {
        let target = under(root, path);
        let is_dir = fs::metadata(path).map(|m| m.is_dir()).unwrap_or(false);
        make_place(&target, is_dir)
            .map_err(|e| StepError::new("ro", format!("cannot make a place for {}: {e}", path.display())))?;
        if is_dir {
            show_tree(&mounts, path, &target)?;
        } else {
            bind_read_only(path, &target, false)?;
        }
    }
    Ok(())
}

/// The system CA bundle files clients read when no variable names one
/// (Debian/Ubuntu, Fedora/RHEL, openSUSE, Alpine and others).
const SYSTEM_CA_BUNDLES: [&str; 5] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Shows `bundle` read-only over each system CA bundle that is a regular
/// file in the view (a symlink is left alone: it names one of the others,
/// and a mount would follow it out of the root).
pub(crate) fn show_ca_bundle(root: &Path, bundle: Option<&Path>) -> Result<(), StepError> {
    let Some(bundle) = bundle else { return Ok(()) };
    for system in SYSTEM_CA_BUNDLES {
        let target = under(root, Path::new(system));
        if fs::symlink_metadata(&target).is_ok_and(|m| m.is_file()) {
            bind_read_only(bundle, &target, false)?;
        }
    }
    Ok(())
}

/// Creates `target` (a directory, or an empty file) and its parents when
/// it does not exist.
fn make_place(target: &Path, is_dir: bool) -> io::Result<()> {
    if fs::symlink_metadata(target).is_ok() {
        return Ok(());
    }
    if is_dir {
        return fs::create_dir_all(target);
    }
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::File::create(target).map(drop)
}

/// Shows the host directory `host` at `target`, read-only. The second,
/// empty lower layer every overlay needs is a tiny tmpfs mounted at
/// `target` first, named through an open descriptor, that the view is
/// then stacked on.
fn show_tree(mounts: &[HostMount], host: &Path, target: &Path) -> Result<HostView, StepError> {
    tmpfs(target, "mode=0755,size=64k", 0)?;
    let empty = sys::open_path(target).map_err(|e| mount_err("open the empty layer", e))?;
    let mut builder = Builder {
        mounts: visible_in_order(mounts),
        empty: format!("/proc/self/fd/{}", empty.as_raw_fd()),
        view: HostView::default(),
    };
    builder.show(host, target)?;
    Ok(builder.view)
}

struct Builder<'a> {
    /// The host's visible mounts, parents first.
    mounts: Vec<&'a HostMount>,
    /// The empty lower layer, as a path overlayfs can open.
    empty: String,
    view: HostView,
}

impl Builder<'_> {
    /// Shows the host directory `host` at `target`.
    ///
    /// In a user namespace the kernel will not take a directory with mounts
    /// below it as an overlay layer (they are locked: an overlay would show
    /// what they cover). Such a directory becomes a read-only tmpfs skeleton
    /// whose entries are shown one by one; every other directory is one
    /// overlay.
    fn show(&mut self, host: &Path, target: &Path) -> Result<(), StepError> {
        let fs_type = self
            .mounts
            .iter()
            .rev()
            .filter(|m| host.starts_with(&m.point))
            .max_by_key(|m| m.point.components().count())
            .map_or(String::new(), |m| m.fs_type.clone());
        let below: Vec<&&HostMount> =
            self.mounts.iter().filter(|m| m.point.starts_with(host) && m.point != host).collect();
        // A recursive bind brings every mount below along: only when none
        // of them can hold a socket either (an automounted /home of NFS
        // homes must not come along bound).
        if socketless(&fs_type, host) && below.iter().all(|m| socketless(&m.fs_type, &m.point)) {
            return bind_read_only(host, target, true);
        }
        let mounts_below = !below.is_empty();
        if !mounts_below {
            let options = format!("lowerdir={}:{}", super::mounts::escape_overlay_path(host), self.empty);
            let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
            if sys::mount(Some("overlay"), target, Some("overlay"), flags, Some(&options)).is_ok() {
                return Ok(());
            }
            self.view.sockets_reachable.push(host.to_owned());
            return bind_read_only(host, target, true);
        }
        self.skeleton(host, target)
    }

    fn skeleton(&mut self, host: &Path, target: &Path) -> Result<(), StepError> {
        let io_err = |what: &str, path: &Path, e: io::Error| {
            StepError::new("root", format!("cannot {what} {}: {e}", path.display()))
        };
        let meta = fs::metadata(host).map_err(|e| io_err("inspect", host, e))?;
        tmpfs(target, &format!("mode={:o},size=64k", meta.permissions().mode() & 0o7777), 0)?;
        let entries = fs::read_dir(host).map_err(|e| io_err("list", host, e))?;
        for entry in entries.flatten() {
            let (from, to) = (entry.path(), target.join(entry.file_name()));
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_dir() {
                fs::create_dir(&to).map_err(|e| io_err("create", &to, e))?;
                let replaced = REPLACED.iter().any(|r| from == Path::new(r));
                // A directory pvisor cannot reach (another user's FUSE
                // mount) stays empty in the view, which is safe.
                if !replaced && fs::metadata(&from).is_ok() {
                    self.show(&from, &to)?;
                }
            } else if kind.is_symlink() {
                let link = fs::read_link(&from).map_err(|e| io_err("read", &from, e))?;
                std::os::unix::fs::symlink(link, &to).map_err(|e| io_err("create", &to, e))?;
            } else {
                fs::File::create(&to).map_err(|e| io_err("create", &to, e))?;
                // A socket or a fifo stays an empty file: both are ways to
                // talk to a host process that a read-only mount does not
                // stop (and --expose-socket gets a place to bind onto).
                if !kind.is_socket() && !kind.is_fifo() {
                    bind_read_only(&from, &to, false)?;
                }
            }
        }
        sys::mount_setattr(target, sys::MOUNT_ATTR_RDONLY, false).map_err(|e| mount_err("seal the view", e))
    }
}

fn bind_read_only(source: &Path, target: &Path, recursive: bool) -> Result<(), StepError> {
    let what = format!("bind {}", source.display());
    let flags = if recursive { libc::MS_BIND | libc::MS_REC } else { libc::MS_BIND };
    sys::mount(Some(&source.to_string_lossy()), target, None, flags, None)
        .map_err(|e| mount_err(&what, e))?;
    // mount_setattr adds flags without clearing the ones a user namespace
    // must keep locked (a remount would have to repeat them all).
    let attrs = sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
    sys::mount_setattr(target, attrs, true).map_err(|e| {
        let err = mount_err(&format!("make {} read-only", source.display()), e);
        if err.message.contains("os error 38") {
            err.hint("mount_setattr(2) needs Linux 5.12 or newer")
        } else {
            err
        }
    })
}

/// Binds each exposed host socket over its place in the sandbox, creating
/// the place in a private tmpfs (`/tmp`, `/run`) where it does not exist.
pub(crate) fn expose_sockets(root: &Path, sockets: &[PathBuf]) -> Result<(), StepError> {
    for socket in sockets {
        let target = under(root, socket);
        if fs::symlink_metadata(&target).is_err() {
            let err = |e: io::Error| {
                StepError::new("expose-socket", format!("cannot make a place for {}: {e}", socket.display()))
            };
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent).map_err(err)?;
            }
            fs::File::create(&target).map_err(err)?;
        }
        sys::mount(Some(&socket.to_string_lossy()), &target, None, libc::MS_BIND, None)
            .map_err(|e| mount_err(&format!("expose the socket {}", socket.display()), e))?;
    }
    Ok(())
}

/// Mounts each cache at its host path: an overlay whose lower layer is the
/// host's directory (read-only to the run) and whose upper is the cache
/// store, or a throw-away tmpfs when another run holds the store.
pub(crate) fn mount_caches(root: &Path, caches: &[pvisor_sandbox::CacheMount]) -> Result<(), StepError> {
    for cache in caches {
        let target = under(root, &cache.path);
        let (upper, work) = if cache.persistent {
            (cache.store.join("upper"), cache.store.join("work"))
        } else {
            sys::mount(
                Some("tmpfs"),
                &cache.scratch,
                Some("tmpfs"),
                libc::MS_NOSUID | libc::MS_NODEV,
                Some("mode=0700"),
            )
            .map_err(|e| mount_err("make a private cache layer", e))?;
            let (upper, work) = (cache.scratch.join("upper"), cache.scratch.join("work"));
            for dir in [&upper, &work] {
                fs::create_dir(dir).map_err(|e| mount_err("make a private cache layer", e))?;
            }
            (upper, work)
        };
        let options = format!(
            "lowerdir={},upperdir={},workdir={},userxattr",
            super::mounts::escape_overlay_path(&cache.path),
            super::mounts::escape_overlay_path(&upper),
            super::mounts::escape_overlay_path(&work),
        );
        sys::mount(
            Some("overlay"),
            &target,
            Some("overlay"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&options),
        )
        .map_err(|e| {
            StepError::new("cache", format!("cannot mount the cache {}: {e}", cache.path.display())).hint(
                "--cache needs an existing host directory on a filesystem overlayfs can use as a lower layer",
            )
        })?;
    }
    Ok(())
}

/// Mounts agent state (`--state`) in the spec's order: each parent as an
/// overlay of the host directory with the Job's upper (so a rename of a
/// temp file over a state file works), then each state directory as a
/// read-write bind of the Job's copy. Made before the caches, `--ro`, the
/// workspace and the hidden paths, which all stay on top: a secret store
/// under a state directory is hidden like anywhere else.
pub(crate) fn mount_state(root: &Path, state: &[pvisor_sandbox::StateMount]) -> Result<(), StepError> {
    use pvisor_sandbox::StateMount;
    for mount in state {
        match mount {
            StateMount::Parent { path, upper, work } => {
                // Under the sandbox's own /tmp the place is not there yet.
                make_place(&under(root, path), true).map_err(|e| {
                    StepError::new("state", format!("cannot make a place for {}: {e}", path.display()))
                })?;
                let options = format!(
                    "lowerdir={},upperdir={},workdir={},userxattr",
                    super::mounts::escape_overlay_path(path),
                    super::mounts::escape_overlay_path(upper),
                    super::mounts::escape_overlay_path(work),
                );
                sys::mount(
                    Some("overlay"),
                    &under(root, path),
                    Some("overlay"),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    Some(&options),
                )
                .map_err(|e| {
                    StepError::new("state", format!("cannot make {} writable: {e}", path.display())).hint(
                        "--state needs its parent directory on a filesystem overlayfs can use as a lower layer, with no mounts below it",
                    )
                })?;
            }
            StateMount::Directory { path, tree } => {
                let target = under(root, path);
                make_place(&target, true).map_err(|e| {
                    StepError::new("state", format!("cannot make a place for {}: {e}", path.display()))
                })?;
                let what = format!("bind the state of {}", path.display());
                sys::mount(Some(&tree.to_string_lossy()), &target, None, libc::MS_BIND, None)
                    .map_err(|e| super::mounts::mount_err("state", &what, e))?;
                sys::mount_setattr(&target, sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV, false)
                    .map_err(|e| super::mounts::mount_err("state", &what, e))?;
            }
        }
    }
    Ok(())
}

fn mount_err(what: &str, e: io::Error) -> StepError {
    super::mounts::mount_err("root", what, e)
}

fn read_mountinfo() -> io::Result<Vec<HostMount>> {
    let bytes = fs::read("/proc/self/mountinfo")?;
    Ok(bytes.split(|&b| b == b'\n').filter_map(parse_line).collect())
}

/// Parses one mountinfo line: `id parent major:minor root point options
/// [optional...] - fstype source super-options`. Fields are
/// space-separated, with spaces, tabs, newlines and backslashes in paths
/// written as octal escapes (`\040`). (procfs-core's parser leaves the
/// escapes in and rejects non-UTF-8 paths, so this one is by hand.)
fn parse_line(line: &[u8]) -> Option<HostMount> {
    let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let number = |f: &[u8]| std::str::from_utf8(f).ok()?.parse::<u32>().ok();
    let separator = fields.iter().position(|f| *f == b"-")?;
    Some(HostMount {
        id: number(fields.first()?)?,
        parent: number(fields.get(1)?)?,
        point: PathBuf::from(OsString::from_vec(unescape(fields.get(4)?))),
        fs_type: String::from_utf8_lossy(fields.get(separator + 1)?).into_owned(),
    })
}

fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (field[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// The mounts a process in this namespace can actually see, parents before
/// children: a mount hidden by another mounted over the same point (or below
/// a hidden one) is left out, so the sandbox never sees more than the host does.
fn visible_in_order(mounts: &[HostMount]) -> Vec<&HostMount> {
    let by_id: HashMap<u32, &HostMount> = mounts.iter().map(|m| (m.id, m)).collect();
    // Whether something other than `except` is mounted over `m` itself.
    let covered = |m: &HostMount, except: u32| {
        mounts.iter().any(|c| c.parent == m.id && c.id != m.id && c.id != except && c.point == m.point)
    };
    let visible = |m: &HostMount| {
        if covered(m, m.id) {
            return false;
        }
        let mut current = m;
        for _ in 0..mounts.len() {
            match by_id.get(&current.parent) {
                Some(parent) if parent.id != current.id => {
                    if covered(parent, current.id) {
                        return false;
                    }
                    current = parent;
                }
                _ => return true,
            }
        }
        false
    };
    let mut shown: Vec<&HostMount> = mounts.iter().filter(|m| visible(m)).collect();
    shown.sort_by_key(|m| m.point.components().count());
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(id: u32, parent: u32, point: &str, fs_type: &str) -> HostMount {
        HostMount { id, parent, point: PathBuf::from(point), fs_type: fs_type.into() }
    }

    #[test]
    fn parses_escaped_and_optional_fields() {
        let line = br"36 35 98:0 / /mnt/my\040disk\134x rw,noatime master:1 shared:2 - ext3 /dev/root rw,errors=continue";
        let parsed = parse_line(line).unwrap();
        assert_eq!(parsed, mount(36, 35, "/mnt/my disk\\x", "ext3"));
        assert!(parse_line(b"garbage").is_none());
    }

    #[test]
    fn overmounted_and_shadowed_mounts_are_not_shown() {
        let mounts = vec![
            mount(1, 0, "/", "ext4"),
            mount(2, 1, "/home", "ext4"),
            mount(3, 2, "/home/data", "xfs"),
            mount(4, 2, "/home", "tmpfs"), // mounted over /home: hides 2 and 3
            mount(5, 1, "/sys", "sysfs"),
        ];
        let shown: Vec<u32> = visible_in_order(&mounts).iter().map(|m| m.id).collect();
        assert_eq!(shown, vec![1, 4, 5]);
    }
}
