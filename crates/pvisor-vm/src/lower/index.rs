//! The metadata index of a workspace: one [`Entry`] per path, taken by a
//! walk that never follows symlinks (stat only, no reads), its compact
//! on-disk encoding, and the [`diff`] of a fresh walk against the index a
//! base image was built with.
//!
//! The diff is deliberately pessimistic, like git's racy-clean rule: an
//! index entry whose mtime or ctime is not strictly older than the build's
//! start (less a margin) may have changed again within the same timestamp
//! tick, so it always counts as changed. Anything else counts as unchanged
//! only if every recorded field (kind, size, mode, owner, mtime, ctime,
//! inode, links, device, symlink target) is identical.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// What an entry is; stored as one byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Dir,
    File,
    Symlink,
    Fifo,
    Socket,
    Char,
    Block,
}

impl Kind {
    const ALL: [Kind; 7] =
        [Kind::Dir, Kind::File, Kind::Symlink, Kind::Fifo, Kind::Socket, Kind::Char, Kind::Block];

    fn of(meta: &fs::Metadata) -> Self {
        let ft = meta.file_type();
        if ft.is_dir() {
            Kind::Dir
        } else if ft.is_symlink() {
            Kind::Symlink
        } else if ft.is_fifo() {
            Kind::Fifo
        } else if ft.is_socket() {
            Kind::Socket
        } else if ft.is_char_device() {
            Kind::Char
        } else if ft.is_block_device() {
            Kind::Block
        } else {
            Kind::File
        }
    }
}

/// One path of the workspace, as `lstat` saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Relative to the workspace, `/`-separated raw bytes; the root is empty.
    pub path: Vec<u8>,
    pub kind: Kind,
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub ino: u64,
    pub nlink: u64,
    pub rdev: u64,
    pub target: Option<Vec<u8>>,
}

impl Entry {
    fn from_meta(path: Vec<u8>, meta: &fs::Metadata, target: Option<Vec<u8>>) -> Self {
        Self {
            path,
            kind: Kind::of(meta),
            size: meta.len(),
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
            mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
            ctime_ns: meta.ctime() * 1_000_000_000 + meta.ctime_nsec(),
            ino: meta.ino(),
            nlink: meta.nlink(),
            rdev: meta.rdev(),
            target,
        }
    }

    /// Whether the entry may have changed since a build that started at
    /// `clean_before_ns` (margin already taken off) without its stat showing it.
    pub fn racy(&self, clean_before_ns: i64) -> bool {
        self.mtime_ns >= clean_before_ns || self.ctime_ns >= clean_before_ns
    }

    /// The host path of the entry under `root`.
    pub fn host_path(&self, root: &Path) -> PathBuf {
        if self.path.is_empty() {
            root.to_owned()
        } else {
            root.join(std::ffi::OsStr::from_bytes(&self.path))
        }
    }
}

/// The parent of a relative path (`b""` for a top-level name), `None` for the root.
pub(crate) fn parent(path: &[u8]) -> Option<&[u8]> {
    if path.is_empty() {
        return None;
    }
    Some(path.iter().rposition(|&b| b == b'/').map_or(&path[..0], |i| &path[..i]))
}

/// The last component of a relative path.
pub(crate) fn name(path: &[u8]) -> &[u8] {
    path.iter().rposition(|&b| b == b'/').map_or(path, |i| &path[i + 1..])
}

/// Every entry under `root` (itself included as the empty path), sorted by
/// path, so parents come before their children. Symlinks are not followed.
pub(crate) fn walk(root: &Path) -> io::Result<Vec<Entry>> {
    let named = |path: &Path, e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    let meta = fs::symlink_metadata(root).map_err(|e| named(root, e))?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!("{} is not a directory", root.display())));
    }
    let mut out = vec![Entry::from_meta(Vec::new(), &meta, None)];
    let mut stack = vec![0usize];
    while let Some(at) = stack.pop() {
        let dir = out[at].host_path(root);
        let prefix = out[at].path.clone();
        for entry in fs::read_dir(&dir).map_err(|e| named(&dir, e))? {
            let entry = entry.map_err(|e| named(&dir, e))?;
            // DirEntry::metadata is an lstat: symlinks are entries, not followed.
            let meta = entry.metadata().map_err(|e| named(&entry.path(), e))?;
            let mut path = prefix.clone();
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(entry.file_name().as_bytes());
            let target = if meta.file_type().is_symlink() {
                let link = fs::read_link(entry.path()).map_err(|e| named(&entry.path(), e))?;
                Some(link.into_os_string().into_encoded_bytes())
            } else {
                None
            };
            let is_dir = meta.is_dir();
            out.push(Entry::from_meta(path, &meta, target));
            if is_dir {
                stack.push(out.len() - 1);
            }
        }
    }
    out.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// What changed between an index and a fresh walk.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Diff {
    /// Indices into the fresh walk of entries that are new, differ, or are
    /// racy in the index, plus every directory an entry was deleted from.
    pub changed: Vec<usize>,
    /// Index paths the workspace no longer has.
    pub deleted: Vec<Vec<u8>>,
}

/// Compares a fresh walk (`current`) against the `index` of a base image
/// whose build started at `clean_before_ns` (less the racy margin).
pub(crate) fn diff(index: &[Entry], current: &[Entry], clean_before_ns: i64) -> Diff {
    let old: HashMap<&[u8], &Entry> = index.iter().map(|e| (e.path.as_slice(), e)).collect();
    let now: HashMap<&[u8], usize> =
        current.iter().enumerate().map(|(i, e)| (e.path.as_slice(), i)).collect();
    let mut changed: HashSet<usize> = current
        .iter()
        .enumerate()
        .filter(|(_, e)| old.get(e.path.as_slice()).is_none_or(|o| o.racy(clean_before_ns) || *o != *e))
        .map(|(i, _)| i)
        .collect();
    let deleted: Vec<Vec<u8>> =
        index.iter().filter(|e| !now.contains_key(e.path.as_slice())).map(|e| e.path.clone()).collect();
    // A deletion always changes its directory's mtime, but the listing is
    // what hides the base's copy: never rely on the timestamp for it.
    for path in &deleted {
        if let Some(&i) = parent(path).and_then(|p| now.get(p)) {
            if current[i].kind == Kind::Dir {
                changed.insert(i);
            }
        }
    }
    let mut changed: Vec<usize> = changed.into_iter().collect();
    changed.sort_unstable();
    Diff { changed, deleted }
}

const MAGIC: &[u8; 16] = b"pvisor-lowerix1\n";

/// The index as bytes: a magic line, the count, then each entry's fields.
pub(crate) fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + entries.len() * 96);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for e in entries {
        out.extend_from_slice(&(e.path.len() as u32).to_le_bytes());
        out.extend_from_slice(&e.path);
        out.push(Kind::ALL.iter().position(|k| *k == e.kind).unwrap_or(0) as u8);
        for v in [e.size, e.ino, e.nlink, e.rdev] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [e.mode, e.uid, e.gid] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [e.mtime_ns, e.ctime_ns] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        match &e.target {
            Some(t) => {
                out.extend_from_slice(&(t.len() as u32).to_le_bytes());
                out.extend_from_slice(t);
            }
            None => out.extend_from_slice(&u32::MAX.to_le_bytes()),
        }
    }
    out
}

/// Parses [`encode`]'s output; anything malformed is `InvalidData`.
pub(crate) fn decode(bytes: &[u8]) -> io::Result<Vec<Entry>> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("lower index: {what}"));
    let mut r = Reader { bytes, at: 0 };
    if r.take(MAGIC.len()).ok_or_else(|| bad("truncated"))? != MAGIC {
        return Err(bad("not an index (bad magic)"));
    }
    let count = r.u64().ok_or_else(|| bad("truncated"))?;
    let mut out = Vec::with_capacity(count.min(1 << 20) as usize);
    for _ in 0..count {
        let entry = (|| {
            let len = r.u32()? as usize;
            let path = r.take(len)?.to_vec();
            let kind = *Kind::ALL.get(usize::from(*r.take(1)?.first()?))?;
            let (size, ino, nlink, rdev) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            let (mode, uid, gid) = (r.u32()?, r.u32()?, r.u32()?);
            let (mtime_ns, ctime_ns) = (r.u64()? as i64, r.u64()? as i64);
            let target = match r.u32()? {
                u32::MAX => None,
                len => Some(r.take(len as usize)?.to_vec()),
            };
            Some(Entry { path, kind, size, mode, uid, gid, mtime_ns, ctime_ns, ino, nlink, rdev, target })
        })()
        .ok_or_else(|| bad("truncated or malformed entry"))?;
        out.push(entry);
    }
    if r.at != bytes.len() {
        return Err(bad("trailing bytes"));
    }
    Ok(out)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.at.checked_add(n)?;
        let out = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(out)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes)
    }
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
