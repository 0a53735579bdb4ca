//! Finishing the delta disk before the overlay uses it (the contract is
//! [`pvisor_agent_proto::DeltaManifest`]): create the special files the host
//! could not, white out what the base has beyond each changed directory's
//! host listing, then give every entry the host's exact owner, mode, xattrs
//! and mtime. Whiteouts first, metadata after: creating a whiteout touches
//! its directory's mtime.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use pvisor_agent_proto::{DeltaManifest, DeltaNode, DELTA_LAYER, DELTA_MANIFEST};
use rustix::fs::{AtFlags, FileType, Mode, Timespec, Timestamps, XattrFlags, CWD};

/// Applies the manifest of the delta mounted (read-write) at `delta` against
/// the base mounted at `base`; returns the layer directory for the overlay.
pub(crate) fn finish(delta: &Path, base: &Path) -> io::Result<PathBuf> {
    let bytes = fs::read(delta.join(DELTA_MANIFEST))?;
    let manifest = DeltaManifest::parse(&bytes).map_err(io::Error::other)?;
    let layer = delta.join(DELTA_LAYER);
    let at = |root: &Path, rel: &[u8]| {
        if rel.is_empty() {
            root.to_owned()
        } else {
            root.join(OsStr::from_bytes(rel))
        }
    };
    let named = |path: &Path, e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    for entry in &manifest.entries {
        let path = at(&layer, &entry.path);
        if let Some(node) = entry.node {
            let (kind, dev) = match node {
                DeltaNode::Fifo => (FileType::Fifo, 0),
                DeltaNode::Socket => (FileType::Socket, 0),
                DeltaNode::Char { rdev } => (FileType::CharacterDevice, rdev),
                DeltaNode::Block { rdev } => (FileType::BlockDevice, rdev),
            };
            rustix::fs::mknodat(CWD, &path, kind, Mode::from_raw_mode(0o600), dev)
                .map_err(|e| named(&path, e.into()))?;
        }
        if let Some(listing) = &entry.listing {
            let keep: HashSet<&[u8]> = listing.iter().map(Vec::as_slice).collect();
            for name in base_names(base, &entry.path)? {
                if !keep.contains(name.as_bytes()) {
                    let whiteout = path.join(&name);
                    rustix::fs::mknodat(CWD, &whiteout, FileType::CharacterDevice, Mode::empty(), 0)
                        .map_err(|e| named(&whiteout, e.into()))?;
                }
            }
        }
    }
    for entry in &manifest.entries {
        let path = at(&layer, &entry.path);
        let set = || -> io::Result<()> {
            let uid = rustix::fs::Uid::from_raw(entry.uid);
            let gid = rustix::fs::Gid::from_raw(entry.gid);
            rustix::fs::chownat(CWD, &path, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)?;
            // After the chown, which clears set-id bits; symlinks have no mode.
            if !fs::symlink_metadata(&path)?.file_type().is_symlink() {
                rustix::fs::chmodat(CWD, &path, Mode::from_raw_mode(entry.mode), AtFlags::empty())?;
            }
            for (name, value) in &entry.xattrs {
                rustix::fs::lsetxattr(&path, OsStr::from_bytes(name), value, XattrFlags::empty())?;
            }
            let mtime = Timespec {
                tv_sec: entry.mtime_ns.div_euclid(1_000_000_000),
                tv_nsec: entry.mtime_ns.rem_euclid(1_000_000_000),
            };
            let times = Timestamps { last_access: mtime, last_modification: mtime };
            rustix::fs::utimensat(CWD, &path, &times, AtFlags::SYMLINK_NOFOLLOW)?;
            Ok(())
        };
        set().map_err(|e| named(&path, e))?;
    }
    Ok(layer)
}

/// The names in the base's directory `rel`, if the base has a real
/// directory there (no component a symlink: the overlay would not merge
/// through one, and following it would list some other guest directory).
fn base_names(base: &Path, rel: &[u8]) -> io::Result<Vec<std::ffi::OsString>> {
    let mut dir = base.to_owned();
    for part in rel.split(|&b| b == b'/').filter(|p| !p.is_empty()) {
        dir.push(OsStr::from_bytes(part));
        match fs::symlink_metadata(&dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Ok(Vec::new()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        }
    }
    fs::read_dir(&dir)?.map(|e| e.map(|e| e.file_name())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvisor_agent_proto::{DeltaEntry, DELTA_FORMAT};

    #[test]
    fn the_base_listing_ignores_paths_through_symlinks_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base");
        fs::create_dir_all(base.join("d/sub")).unwrap();
        fs::write(base.join("d/file"), "f").unwrap();
        std::os::unix::fs::symlink("/etc", base.join("link")).unwrap();
        let mut names = base_names(&base, b"d").unwrap();
        names.sort();
        assert_eq!(names, ["file", "sub"]);
        assert!(base_names(&base, b"link").unwrap().is_empty(), "a symlink is not followed");
        assert!(base_names(&base, b"d/file").unwrap().is_empty());
        assert!(base_names(&base, b"missing/x").unwrap().is_empty());
    }

    /// Whiteouts and ownership need root: as the guest's PID 1 the agent is.
    #[test]
    #[ignore = "needs root (the agent runs as the guest's root): scripts/test.sh runs it as root, with --include-ignored"]
    fn whiteouts_and_exact_metadata_as_root() {
        assert!(rustix::process::geteuid().is_root(), "needs root (the test is ignored unless included)");
        let dir = tempfile::tempdir().unwrap();
        let (base, delta) = (dir.path().join("base"), dir.path().join("delta"));
        fs::create_dir_all(base.join("d")).unwrap();
        for name in ["d/gone", "d/kept", "top"] {
            fs::write(base.join(name), "b").unwrap();
        }
        fs::create_dir_all(delta.join("layer/d")).unwrap();
        fs::write(delta.join("layer/d/new"), "n").unwrap();
        let e = |path: &[u8], mode, listing: Option<Vec<&[u8]>>, node| DeltaEntry {
            path: path.to_vec(),
            mode,
            uid: 1234,
            gid: 4321,
            mtime_ns: 1_600_000_000_500_000_000,
            xattrs: Vec::new(),
            node,
            listing: listing.map(|l| l.into_iter().map(<[u8]>::to_vec).collect()),
        };
        let manifest = DeltaManifest {
            format: DELTA_FORMAT,
            entries: vec![
                e(b"", 0o755, None, None),
                e(b"d", 0o750, Some(vec![b"kept", b"new", b"pipe"]), None),
                e(b"d/new", 0o4711, None, None),
                e(b"d/pipe", 0o640, None, Some(DeltaNode::Fifo)),
            ],
        };
        fs::write(delta.join(DELTA_MANIFEST), manifest.to_bytes()).unwrap();
        let layer = finish(&delta, &base).unwrap();
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let gone = fs::symlink_metadata(layer.join("d/gone")).unwrap();
        assert!(gone.file_type().is_char_device() && gone.rdev() == 0, "d/gone is whited out");
        assert!(!layer.join("d/kept").exists() && !layer.join("top").exists(), "nothing else is");
        let new = fs::metadata(layer.join("d/new")).unwrap();
        assert_eq!((new.mode() & 0o7777, new.uid(), new.gid()), (0o4711, 1234, 4321));
        assert!(fs::symlink_metadata(layer.join("d/pipe")).unwrap().file_type().is_fifo());
        let d = fs::metadata(layer.join("d")).unwrap();
        assert_eq!((d.mode() & 0o7777, d.mtime(), d.mtime_nsec()), (0o750, 1_600_000_000, 500_000_000));
    }
}
