//! The per-start delta disk: what changed in the workspace since its base
//! image was built, as a small ext4 image the agent finishes and layers
//! above the base (the contract is [`pvisor_agent_proto::DeltaManifest`]).
//!
//! The image holds a staging copy of every changed file, symlink and
//! directory, with the ancestors that lead to them, under
//! [`DELTA_LAYER`], and the manifest beside it. Ownership, modes, mtimes,
//! xattrs and special files are the manifest's (a rootless host cannot
//! reproduce them in the copy); deletions are the listings of the changed
//! directories, against which the guest whites out whatever the base has
//! beyond them, so the base itself is the only truth about what it holds.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use pvisor_agent_proto::{DeltaEntry, DeltaManifest, DeltaNode, DELTA_FORMAT, DELTA_LAYER, DELTA_MANIFEST};

use super::index::{self, Diff, Entry, Kind};
use crate::disk;

/// What a delta holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DeltaSize {
    /// Entries of the layer (changed ones and their ancestors).
    pub entries: usize,
    /// Bytes of the files copied into it.
    pub bytes: u64,
}

/// Bytes of the changed regular files: what a delta of `diff` would copy.
pub(crate) fn changed_bytes(current: &[Entry], diff: &Diff) -> u64 {
    diff.changed.iter().map(|&i| &current[i]).filter(|e| e.kind == Kind::File).map(|e| e.size).sum()
}

/// Builds the delta image at `image` (staging under `staging`, removed after).
pub(crate) fn build(
    workspace: &Path,
    current: &[Entry],
    diff: &Diff,
    staging: &Path,
    image: &Path,
) -> io::Result<DeltaSize> {
    let size = stage(workspace, current, diff, staging)?;
    let built = disk::image_tree(
        staging,
        image,
        disk::Footprint { bytes: size.bytes + (1 << 20), inodes: size.entries as u64 + 2 },
        (0, 0),
        disk::DELTA_DISK_BYTES,
        "workspace delta",
    );
    let _ = pvisor_core::tree::remove_tree(staging);
    built.map(|()| size)
}

/// Writes the staging tree and its manifest under `staging`.
pub(crate) fn stage(
    workspace: &Path,
    current: &[Entry],
    diff: &Diff,
    staging: &Path,
) -> io::Result<DeltaSize> {
    let _ = pvisor_core::tree::remove_tree(staging);
    let layer = staging.join(DELTA_LAYER);
    fs::create_dir_all(&layer)?;
    let at: HashMap<&[u8], usize> = current.iter().enumerate().map(|(i, e)| (e.path.as_slice(), i)).collect();
    // The layer: each changed entry with its ancestors (a lower layer's
    // directory hides the base's attributes, so every one needs the host's),
    // and the root always, since the layer root is the workspace root.
    let mut members: BTreeSet<usize> = BTreeSet::from([0]);
    for &i in &diff.changed {
        let mut path = current[i].path.as_slice();
        members.insert(i);
        while let Some(up) = index::parent(path) {
            if !members.insert(at[up]) {
                break;
            }
            path = up;
        }
    }
    // The root is always listed: mkfs put a `lost+found` in the base that
    // the workspace does not have.
    let changed_dirs: HashSet<usize> =
        diff.changed.iter().copied().filter(|&i| current[i].kind == Kind::Dir).chain([0]).collect();
    let mut listings: HashMap<usize, Vec<Vec<u8>>> = changed_dirs.iter().map(|&i| (i, Vec::new())).collect();
    for entry in &current[1..] {
        if let Some(list) = index::parent(&entry.path).and_then(|p| listings.get_mut(&at[p])) {
            list.push(index::name(&entry.path).to_vec());
        }
    }

    let mut size = DeltaSize::default();
    let mut linked: HashMap<u64, PathBuf> = HashMap::new();
    let mut entries = Vec::with_capacity(members.len());
    for i in members {
        let entry = &current[i];
        let (from, to) = (entry.host_path(workspace), entry.host_path(&layer));
        let mut node = None;
        match entry.kind {
            Kind::Dir if entry.path.is_empty() => {}
            Kind::Dir => fs::create_dir(&to)?,
            Kind::File => {
                // Hard links stay links: the walk saw every name of a changed inode change.
                match linked.get(&entry.ino).filter(|_| entry.nlink > 1) {
                    Some(first) => fs::hard_link(first, &to)?,
                    None => {
                        fs::copy(&from, &to)?;
                        // Readable by us whatever the host mode (owner bits may be 0).
                        fs::set_permissions(&to, fs::Permissions::from_mode(0o600))?;
                        size.bytes += entry.size;
                        linked.insert(entry.ino, to.clone());
                    }
                }
            }
            Kind::Symlink => {
                let target =
                    entry.target.as_deref().ok_or_else(|| io::Error::other("a symlink without a target"))?;
                symlink(OsStr::from_bytes(target), &to)?
            }
            Kind::Fifo => node = Some(DeltaNode::Fifo),
            Kind::Socket => node = Some(DeltaNode::Socket),
            Kind::Char => node = Some(DeltaNode::Char { rdev: entry.rdev }),
            Kind::Block => node = Some(DeltaNode::Block { rdev: entry.rdev }),
        }
        if entry.kind == Kind::Dir {
            fs::set_permissions(&to, fs::Permissions::from_mode(0o700))?;
        }
        entries.push(DeltaEntry {
            path: entry.path.clone(),
            mode: entry.mode,
            uid: entry.uid,
            gid: entry.gid,
            mtime_ns: entry.mtime_ns,
            xattrs: xattrs(&from)?,
            node,
            listing: listings.remove(&i),
        });
    }
    size.entries = entries.len();
    let manifest = DeltaManifest { format: DELTA_FORMAT, entries };
    // Part of one start's staging, rebuilt by the next: not a record.
    #[allow(clippy::disallowed_methods)]
    fs::write(staging.join(DELTA_MANIFEST), manifest.to_bytes())?;
    Ok(size)
}

/// The extended attributes of `path` (not following a symlink), except the
/// overlay's own, which would change what the guest's overlay does.
fn xattrs(path: &Path) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let unsupported = |e: &rustix::io::Errno| {
        matches!(*e, rustix::io::Errno::NOTSUP | rustix::io::Errno::NODATA | rustix::io::Errno::ACCESS)
    };
    let mut names = vec![0u8; 256];
    let len = loop {
        match rustix::fs::llistxattr(path, &mut names[..]) {
            Ok(len) => break len,
            Err(rustix::io::Errno::RANGE) => {
                names.resize(rustix::fs::llistxattr_query(path)?.max(names.len() * 2), 0)
            }
            Err(e) if unsupported(&e) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        }
    };
    let mut out = Vec::new();
    for name in names[..len].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        if name.starts_with(b"trusted.overlay.") {
            continue;
        }
        let name_str = OsStr::from_bytes(name);
        let mut value = vec![0u8; 256];
        let got = loop {
            match rustix::fs::lgetxattr(path, name_str, &mut value[..]) {
                Ok(n) => break Some(n),
                Err(rustix::io::Errno::RANGE) => {
                    value.resize(rustix::fs::lgetxattr_query(path, name_str)?.max(value.len() * 2), 0)
                }
                // Removed since the listing, or not ours to read: as absent.
                Err(e) if unsupported(&e) => break None,
                Err(e) => return Err(e.into()),
            }
        };
        if let Some(n) = got {
            out.push((name.to_vec(), value[..n].to_vec()));
        }
    }
    Ok(out)
}

#[cfg(test)]
#[path = "delta_tests.rs"]
mod tests;
