//! Unpacking a tar archive (an OCI layer, or a rootfs tarball) into an
//! image's rootfs on the host: the boundary between a hostile archive and
//! the host's filesystem, with the one tar implementation the daemon uses
//! (the `tar` crate).
//!
//! Every write is made through [`pvisor_stage::beneath::Root`]: beneath the
//! rootfs, never following or writing through a symlink. An entry whose
//! path is absolute, holds `..`, or passes through a symlink or a file is
//! refused (the whole import fails). Device nodes, FIFOs and sockets are
//! never created, and setuid/setgid bits are never set on the host: both
//! are listed in the [`Unpacked`] report instead. Owners are kept when the
//! importer is root (the guest's disk is built from these files with their
//! owners, `mkfs.ext4 -d`); directories stay owner-writable so later layers
//! can be applied.
//!
//! Whiteouts follow the OCI image spec: a layer's whiteouts are applied
//! first, to what the lower layers left ([`apply_whiteouts`]), then its
//! entries ([`extract`]), so a whiteout never removes a file of its own
//! layer. `.wh..wh..opq` empties its directory, `.wh.NAME` removes NAME in
//! the same directory, any other name starting `.wh.` (`.wh...`,
//! `.wh..wh.x`) is refused, and whiteouts are never written as files.
//!
//! The tar crate reads an entry's long name and pax extensions whole into
//! memory; [`Entries`] lets it read at most [`MAX_HEADER_BYTES`] between
//! two entries' data, so a hostile layer (a gzip bomb of one pax header)
//! cannot exhaust the importer's memory.

use std::cell::Cell;
use std::ffi::OsStr;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use pvisor_stage::beneath::{Kind, Root};
use serde::{Deserialize, Serialize};

/// What an import left out of the host's copy, for the record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unpacked {
    /// Device nodes, FIFOs and sockets the archives held (not created).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub special_files_skipped: Vec<String>,
    /// Files and directories whose setuid/setgid bits were dropped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub setid_bits_dropped: Vec<String>,
}

/// Why an archive was refused.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("the archive entry {path:?} would land outside the image root ({why})")]
    Escapes { path: String, why: &'static str },
    #[error("the archive entry {path:?} is a whiteout that names no entry of its directory; refused")]
    BadWhiteout { path: String },
    #[error("the archive entry {path:?} goes through {through:?}, which is not a directory (a symlink is never followed)")]
    Through { path: String, through: String },
    #[error("an archive entry's path is {len} bytes long; a path is under PATH_MAX (4096 bytes)")]
    TooLong { len: usize },
    #[error("the archive holds more than {MAX_HEADER_BYTES} bytes of headers (long names, pax extensions) for one entry; refused")]
    HugeHeader,
    #[error("the archive entry {path:?} would leave less than {KEEP_FREE} bytes free on the disk it is unpacked to (a file that large, or an archive that expands, such as a sparse entry or a compressed stream); refused")]
    DiskFull { path: String },
    #[error("the archive is unreadable: {0}")]
    Read(#[source] io::Error),
    #[error("cannot unpack {path:?}: {source}")]
    Write {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// The most header bytes (the entry's header, its long name and link
/// name, pax extensions, sparse maps) the tar crate may read, into memory,
/// for one entry: far more than any path (PATH_MAX is 4096) or xattr needs.
pub const MAX_HEADER_BYTES: u64 = 1 << 20;

/// The free space an unpacked file may not eat into. An archive's size says
/// little of what it writes (a gzip stream, a sparse entry's holes written
/// as zeros), so each file is bounded by the disk's free space when it
/// starts, less this, rather than by the archive.
pub const KEEP_FREE: u64 = 1 << 30;

/// A reader that fails once more than its budget is read: the budget is
/// [`MAX_HEADER_BYTES`] while the tar crate looks for the next entry, and
/// unbounded while an entry's data is read.
struct Budgeted<R> {
    inner: R,
    left: std::rc::Rc<Cell<u64>>,
}

impl<R: Read> Read for Budgeted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left.get();
        if left == 0 {
            return Err(io::Error::other(HUGE_HEADER));
        }
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.left.set(left - n as u64);
        Ok(n)
    }
}

const HUGE_HEADER: &str = "an entry's headers are over the limit";

/// Calls `each` with every entry of `archive`, reading each entry's
/// headers within [`MAX_HEADER_BYTES`]; what `each` leaves of an entry's
/// data is read past (unbounded) before the next headers.
fn entries<R: Read>(
    archive: R,
    mut each: impl FnMut(&mut tar::Entry<'_, Budgeted<R>>) -> Result<(), LayerError>,
) -> Result<(), LayerError> {
    let left = std::rc::Rc::new(Cell::new(MAX_HEADER_BYTES));
    let mut archive = tar::Archive::new(Budgeted { inner: archive, left: left.clone() });
    let huge = |e: io::Error| {
        if e.get_ref().is_some_and(|inner| inner.to_string() == HUGE_HEADER) {
            LayerError::HugeHeader
        } else {
            LayerError::Read(e)
        }
    };
    let mut all = archive.entries().map_err(huge)?;
    loop {
        left.set(MAX_HEADER_BYTES);
        let Some(entry) = all.next() else { return Ok(()) };
        let mut entry = entry.map_err(huge)?;
        left.set(u64::MAX);
        each(&mut entry)?;
        io::copy(&mut entry, &mut io::sink()).map_err(LayerError::Read)?;
    }
}

/// The entry's path relative to the root: `.` components dropped, `None`
/// for the root itself; absolute paths, `..` and paths longer than
/// `PATH_MAX` refused (no program opens such a path, and a tree that deep
/// is one the host's own tools cannot remove).
pub fn entry_path(raw: &Path) -> Result<Option<PathBuf>, LayerError> {
    if raw.as_os_str().len() >= libc::PATH_MAX as usize {
        return Err(LayerError::TooLong { len: raw.as_os_str().len() });
    }
    let escapes = |why| LayerError::Escapes { path: raw.display().to_string(), why };
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(name) => out.push(name),
            Component::CurDir => {}
            Component::ParentDir => return Err(escapes("it holds `..`")),
            Component::RootDir | Component::Prefix(_) => return Err(escapes("it is absolute")),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// What a whiteout entry removes.
#[derive(Debug, PartialEq, Eq)]
pub enum Whiteout {
    /// Everything the lower layers hold in this directory.
    Opaque(PathBuf),
    /// This one entry of the lower layers.
    Remove(PathBuf),
}

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";

/// The whiteout `path` (already normalised) stands for, if it is one.
pub fn whiteout(path: &Path) -> Result<Option<Whiteout>, LayerError> {
    let Some(name) = path.file_name().map(OsStr::as_bytes) else { return Ok(None) };
    if !name.starts_with(WHITEOUT_PREFIX) {
        return Ok(None);
    }
    let dir = path.parent().unwrap_or(Path::new("")).to_owned();
    if name == OPAQUE {
        return Ok(Some(Whiteout::Opaque(dir)));
    }
    let target = &name[WHITEOUT_PREFIX.len()..];
    // `.wh...` would name the parent, `.wh..` the directory itself; the
    // `.wh.` prefix is reserved, so `.wh..wh.x` names nothing either.
    if target.is_empty() || target == b"." || target == b".." || target.starts_with(WHITEOUT_PREFIX) {
        return Err(LayerError::BadWhiteout { path: path.display().to_string() });
    }
    Ok(Some(Whiteout::Remove(dir.join(OsStr::from_bytes(target)))))
}

fn write_err(path: &Path) -> impl FnOnce(io::Error) -> LayerError + '_ {
    move |source| LayerError::Write { path: path.display().to_string(), source }
}

/// Applies the whiteouts of one layer to what the lower layers left under
/// `root`; the layer's other entries are read past.
pub fn apply_whiteouts(root: &Root, archive: impl Read) -> Result<(), LayerError> {
    entries(archive, |entry| {
        let Some(path) = entry_path(&entry.path().map_err(LayerError::Read)?)? else { return Ok(()) };
        match whiteout(&path)? {
            None => {}
            Some(Whiteout::Remove(target)) => remove(root, &target).map_err(write_err(&target))?,
            Some(Whiteout::Opaque(dir))
                if dir.as_os_str().is_empty() || is_dir(root, &dir).map_err(write_err(&dir))? =>
            {
                for child in root.list(&dir).map_err(write_err(&dir))? {
                    let child = dir.join(child);
                    remove(root, &child).map_err(write_err(&child))?;
                }
            }
            // An opaque directory the lower layers do not have: nothing to hide.
            Some(Whiteout::Opaque(_)) => {}
        }
        Ok(())
    })
}

/// Removes `rel` and what it holds; nothing there (or a symlink on the way,
/// which a whiteout never reaches through) is nothing to do.
fn remove(root: &Root, rel: &Path) -> io::Result<()> {
    match root.remove_all(rel) {
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Ok(()),
        other => other,
    }
}

fn is_dir(root: &Root, rel: &Path) -> io::Result<bool> {
    Ok(root.stat(rel)?.is_some_and(|s| s.kind == Kind::Dir))
}

/// Unpacks one layer's entries (not its whiteouts) under `root`.
pub fn extract(root: &Root, archive: impl Read, report: &mut Unpacked) -> Result<(), LayerError> {
    extract_keeping(root, archive, report, KEEP_FREE)
}

/// [`extract`], leaving `keep_free` bytes of the disk free.
fn extract_keeping(
    root: &Root,
    archive: impl Read,
    report: &mut Unpacked,
    keep_free: u64,
) -> Result<(), LayerError> {
    // Owners are the image's own only when the importer may give them away.
    let how = Unpacking { keep_owners: rustix::process::geteuid().is_root(), keep_free };
    entries(archive, |entry| one(root, entry, how, report))
}

/// How entries are unpacked: whose owners they keep, how much disk they leave.
#[derive(Clone, Copy)]
struct Unpacking {
    keep_owners: bool,
    keep_free: u64,
}

/// Unpacks one entry (not a whiteout) under `root`.
fn one<R: Read>(
    root: &Root,
    entry: &mut tar::Entry<'_, R>,
    how: Unpacking,
    report: &mut Unpacked,
) -> Result<(), LayerError> {
    let keep_owners = how.keep_owners;
    let Some(path) = entry_path(&entry.path().map_err(LayerError::Read)?)? else { return Ok(()) };
    if whiteout(&path)?.is_some() {
        return Ok(());
    }
    let header = entry.header();
    let mode = header.mode().map_err(LayerError::Read)?;
    let owner = (header.uid().map_err(LayerError::Read)?, header.gid().map_err(LayerError::Read)?);
    let kind = header.entry_type();
    let shown = || path.display().to_string();
    if mode & 0o6000 != 0 && (kind.is_file() || kind.is_dir()) {
        report.setid_bits_dropped.push(shown());
    }
    // No setuid/setgid on the host; the sticky bit (/tmp) is harmless.
    let mode = mode & 0o1777;
    parents(root, &path)?;
    let w = write_err(&path);
    match kind {
        tar::EntryType::Directory => {
            if !is_dir(root, &path).map_err(write_err(&path))? {
                root.remove_all(&path).map_err(write_err(&path))?;
            }
            root.mkdir(&path, mode | 0o700).map_err(w)?;
        }
        tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
            let mut file = root.create_file(&path, 0o600).map_err(write_err(&path))?;
            let room = rustix::fs::fstatvfs(&file)
                .map(|s| s.f_bavail.saturating_mul(s.f_frsize).saturating_sub(how.keep_free))
                .map_err(|e| write_err(&path)(e.into()))?;
            let written =
                io::copy(&mut entry.take(room.saturating_add(1)), &mut file).map_err(write_err(&path))?;
            if written > room {
                drop(file);
                let _ = root.remove_all(&path);
                return Err(LayerError::DiskFull { path: shown() });
            }
            if keep_owners {
                rustix::fs::fchown(
                    &file,
                    Some(rustix::fs::Uid::from_raw(owner.0 as u32)),
                    Some(rustix::fs::Gid::from_raw(owner.1 as u32)),
                )
                .map_err(|e| write_err(&path)(e.into()))?;
            }
            rustix::fs::fchmod(&file, rustix::fs::Mode::from_raw_mode(mode)).map_err(|e| w(e.into()))?;
            return Ok(());
        }
        tar::EntryType::Symlink => {
            let target = entry.link_name_bytes().ok_or_else(|| {
                LayerError::Read(io::Error::other(format!("the symlink {} has no target", shown())))
            })?;
            // Stored as written; the host never follows it.
            root.write_symlink(&path, &target).map_err(w)?;
        }
        tar::EntryType::Link => {
            let raw = entry.link_name().map_err(LayerError::Read)?.unwrap_or_default();
            let target = entry_path(&raw)?
                .ok_or_else(|| LayerError::Escapes { path: shown(), why: "it is a hard link to the root" })?;
            root.hard_link(&target, &path).map_err(w)?;
            return Ok(());
        }
        tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
            report.special_files_skipped.push(shown());
            return Ok(());
        }
        // Pax and GNU extension headers are read by the tar crate itself;
        // anything else holds no file.
        _ => return Ok(()),
    }
    if keep_owners {
        root.chown(&path, owner.0 as u32, owner.1 as u32).map_err(write_err(&path))?;
    }
    Ok(())
}

/// Creates the missing directories above `path`; refuses a symlink or a
/// file on the way (an entry is never written through one).
fn parents(root: &Root, path: &Path) -> Result<(), LayerError> {
    let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) else { return Ok(()) };
    match root.mkdir_all(parent, 0o755) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) => Err(LayerError::Through {
            path: path.display().to_string(),
            through: parent.display().to_string(),
        }),
        other => other.map_err(write_err(parent)),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    /// One archive entry, its name written raw (the tar crate's own
    /// builder refuses the hostile names these tests need).
    pub(crate) enum E<'a> {
        Dir(&'a str),
        File(&'a str, &'a [u8], u32),
        Symlink(&'a str, &'a str),
        Link(&'a str, &'a str),
        Special(&'a str, tar::EntryType),
    }

    pub(crate) fn archive(entries: &[E]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for e in entries {
            let mut h = tar::Header::new_gnu();
            let (name, kind, mode, data, link): (&str, _, u32, &[u8], Option<&str>) = match e {
                E::Dir(n) => (n, tar::EntryType::Directory, 0o755, b"", None),
                E::File(n, d, m) => (n, tar::EntryType::Regular, *m, d, None),
                E::Symlink(n, t) => (n, tar::EntryType::Symlink, 0o777, b"", Some(t)),
                E::Link(n, t) => (n, tar::EntryType::Link, 0o644, b"", Some(t)),
                E::Special(n, k) => (n, *k, 0o644, b"", None),
            };
            let gnu = h.as_gnu_mut().unwrap();
            gnu.name[..name.len()].copy_from_slice(name.as_bytes());
            if let Some(t) = link {
                gnu.linkname[..t.len()].copy_from_slice(t.as_bytes());
            }
            h.set_entry_type(kind);
            h.set_mode(mode);
            h.set_size(data.len() as u64);
            h.set_uid(0);
            h.set_gid(0);
            h.set_cksum();
            b.append(&h, data).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// Applies one layer as an import does: its whiteouts, then its entries.
    fn apply(root: &Path, entries: &[E]) -> Result<Unpacked, LayerError> {
        let tar = archive(entries);
        let r = Root::open(root).unwrap();
        apply_whiteouts(&r, &tar[..])?;
        let mut report = Unpacked::default();
        extract(&r, &tar[..], &mut report)?;
        Ok(report)
    }

    fn lower() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        apply(
            dir.path(),
            &[E::Dir("bin"), E::File("bin/sh", b"sh", 0o755), E::Dir("d"), E::File("d/a", b"a", 0o644)],
        )
        .unwrap();
        fs::write(dir.path().join("d/b"), b"b").unwrap();
        dir
    }

    #[test]
    fn whiteouts_never_reach_outside_their_directory() {
        let root = lower();
        for bad in ["bin/.wh...", "bin/.wh..", "bin/.wh..wh.x", ".wh..."] {
            let e = apply(root.path(), &[E::File(bad, b"", 0o644)]).unwrap_err();
            assert!(matches!(e, LayerError::BadWhiteout { .. }), "{bad}: {e}");
        }
        assert!(root.path().join("bin/sh").is_file(), "the rootfs is intact");
        assert!(root.path().join("d/a").is_file());
    }

    #[test]
    fn opaque_and_plain_whiteouts_remove_only_lower_entries() {
        let root = lower();
        apply(
            root.path(),
            &[
                E::File("d/c", b"c", 0o644),
                E::File("d/.wh..wh..opq", b"", 0o644),
                // Whited out, but brought back by this same layer.
                E::File("bin/sh", b"new sh", 0o755),
                E::File("bin/.wh.sh", b"", 0o644),
            ],
        )
        .unwrap();
        let names = |d: &str| {
            let mut n: Vec<_> = fs::read_dir(root.path().join(d))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            n.sort();
            n
        };
        assert_eq!(names("d"), ["c"], "the opaque directory keeps only this layer's entries");
        assert_eq!(fs::read(root.path().join("bin/sh")).unwrap(), b"new sh");
        apply(root.path(), &[E::File(".wh.bin", b"", 0o644)]).unwrap();
        assert!(!root.path().join("bin").exists(), "a later layer's whiteout removes it");
    }

    #[test]
    fn whiteouts_in_a_new_directory_are_never_literal_files() {
        let root = lower();
        apply(root.path(), &[E::Dir("new"), E::File("new/.wh.x", b"", 0o644), E::File("new/y", b"y", 0o644)])
            .unwrap();
        assert_eq!(fs::read_dir(root.path().join("new")).unwrap().count(), 1);
        assert!(root.path().join("new/y").is_file());
    }

    /// A sparse entry is a few bytes of archive that would write its holes
    /// as zeros: one larger than the disk's free space (less what is kept
    /// free) is refused, and nothing of it is left (GNU tar writes the
    /// archive; the tar crate cannot). The test keeps all but 64 MiB free,
    /// so that it writes little before it is refused.
    #[test]
    fn an_entry_that_would_fill_the_disk_is_refused() {
        let work = tempfile::tempdir().unwrap();
        let free = rustix::fs::statvfs(work.path()).unwrap();
        let free = free.f_bavail * free.f_frsize;
        let keep_free = free.saturating_sub(64 << 20);
        let big = work.path().join("big");
        fs::File::create(&big).unwrap().set_len(1 << 30).unwrap();
        let archive = work.path().join("bomb.tar");
        let made = std::process::Command::new("tar")
            .args(["--sparse", "-cf"])
            .arg(&archive)
            .args(["-C", work.path().to_str().unwrap(), "big"])
            .status()
            .expect("GNU tar runs");
        assert!(made.success());
        assert!(fs::metadata(&archive).unwrap().len() < 1 << 20, "the archive itself is small");
        let root = work.path().join("root");
        fs::create_dir(&root).unwrap();
        let r = Root::open(&root).unwrap();
        let got = extract_keeping(&r, fs::File::open(&archive).unwrap(), &mut Unpacked::default(), keep_free);
        assert!(matches!(got, Err(LayerError::DiskFull { .. })), "{got:?}");
        assert!(!root.join("big").exists(), "nothing of it is left");
    }

    #[test]
    fn entries_that_escape_the_root_are_refused() {
        let outside = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let inner = root.path().join("r");
        fs::create_dir(&inner).unwrap();
        for bad in ["../escaped", "a/../../escaped", "/escaped"] {
            let e = apply(&inner, &[E::File(bad, b"x", 0o644)]).unwrap_err();
            assert!(matches!(e, LayerError::Escapes { .. }), "{bad}: {e}");
        }
        assert!(!root.path().join("escaped").exists());
        // A symlink, then an entry written through it.
        let target = outside.path().to_str().unwrap();
        let e = apply(&inner, &[E::Symlink("evil", target), E::File("evil/pwned", b"x", 0o644)]).unwrap_err();
        assert!(matches!(e, LayerError::Through { .. }), "{e}");
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0, "nothing was written outside");
        // A symlink over an existing file is replaced, never written through.
        fs::write(outside.path().join("host"), b"host").unwrap();
        let host = outside.path().join("host");
        apply(&inner, &[E::Symlink("f", host.to_str().unwrap()), E::File("f", b"mine", 0o644)]).unwrap();
        assert_eq!(fs::read(&host).unwrap(), b"host");
        assert_eq!(fs::read(inner.join("f")).unwrap(), b"mine");
        let e = apply(&inner, &[E::Link("l", "../x")]).unwrap_err();
        assert!(matches!(e, LayerError::Escapes { .. }), "{e}");
    }

    /// A pax header (or GNU long name) claiming 8 GiB, its bytes endless:
    /// what a gzip bomb of a few MiB decompresses to. The tar crate would
    /// read it whole into memory.
    #[test]
    fn a_huge_pax_header_or_long_name_is_refused_without_reading_it_into_memory() {
        for kind in [tar::EntryType::XHeader, tar::EntryType::GNULongName] {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_size(8 << 30);
            h.set_cksum();
            let hostile = || h.as_bytes().chain(io::repeat(b'a'));
            let root = tempfile::tempdir().unwrap();
            let r = Root::open(root.path()).unwrap();
            let started = std::time::Instant::now();
            let e = extract(&r, hostile(), &mut Unpacked::default()).unwrap_err();
            assert!(matches!(e, LayerError::HugeHeader), "{kind:?}: {e}");
            let e = apply_whiteouts(&r, hostile()).unwrap_err();
            assert!(matches!(e, LayerError::HugeHeader), "{kind:?}: {e}");
            assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
        }
        // A long name under the limit still works, and big file data is not
        // counted as headers.
        let mut b = tar::Builder::new(Vec::new());
        let long = format!("{}/f", "d".repeat(200));
        let mut h = tar::Header::new_gnu();
        h.set_size(2 << 20);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        b.append_data(&mut h, &long, &vec![b'x'; 2 << 20][..]).unwrap();
        let tar = b.into_inner().unwrap();
        let root = tempfile::tempdir().unwrap();
        let r = Root::open(root.path()).unwrap();
        apply_whiteouts(&r, &tar[..]).unwrap();
        extract(&r, &tar[..], &mut Unpacked::default()).unwrap();
        assert_eq!(fs::metadata(root.path().join(&long)).unwrap().len(), 2 << 20);
    }

    /// Entries 2,000 directories deep (a 4,000-byte name): their
    /// parents are made one name at a time, not by resolving every prefix
    /// from the root again (quadratic: a layer of such entries never ended).
    #[test]
    fn deep_entries_unpack_in_time_linear_in_their_depth() {
        let deep = "d/".repeat(2000);
        let mut b = tar::Builder::new(Vec::new());
        for name in ["f", "g"] {
            let mut h = tar::Header::new_gnu();
            h.set_size(1);
            h.set_mode(0o644);
            h.set_uid(0);
            h.set_gid(0);
            b.append_data(&mut h, format!("{deep}{name}"), &b"x"[..]).unwrap();
        }
        let root = tempfile::tempdir().unwrap();
        let started = std::time::Instant::now();
        apply(root.path(), &[]).unwrap();
        let r = Root::open(root.path()).unwrap();
        extract(&r, &b.into_inner().unwrap()[..], &mut Unpacked::default()).unwrap();
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_secs(5), "{took:?}");
        let g = r.open_file(&Path::new(&deep).join("g")).unwrap();
        assert_eq!(g.metadata().unwrap().len(), 1, "the probe file was unpacked");
        // Removed fd-relative: a path-based removal of the tree is slow.
        r.remove_all(Path::new("d")).unwrap();
        // Deeper than PATH_MAX: refused, nothing created.
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        b.append_data(&mut h, format!("{}f", "d/".repeat(2048)), &b"x"[..]).unwrap();
        let e = extract(&r, &b.into_inner().unwrap()[..], &mut Unpacked::default()).unwrap_err();
        assert!(matches!(e, LayerError::TooLong { len: 4097 }), "{e}");
        assert!(r.stat(Path::new("d")).unwrap().is_none(), "no directory was made for it");
    }

    /// A lower layer's symlink to a host directory, then whiteouts and
    /// hard links through it: nothing outside the root is removed, and a
    /// hard link to a symlink is that symlink, never its target.
    #[test]
    fn whiteouts_and_hard_links_never_act_through_a_symlink() {
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("passwd"), b"host").unwrap();
        fs::create_dir(outside.path().join("sub")).unwrap();
        let root = lower();
        let host = outside.path().to_str().unwrap();
        let host_passwd = format!("{host}/passwd");
        apply(root.path(), &[E::Symlink("a", host), E::Symlink("s", &host_passwd), E::Link("h", "s")])
            .unwrap();
        // A whiteout never reaches through a symlink: there is nothing to remove.
        apply(root.path(), &[E::File("a/.wh.passwd", b"", 0o644), E::File("a/.wh..wh..opq", b"", 0o644)])
            .unwrap();
        assert_eq!(fs::read(outside.path().join("passwd")).unwrap(), b"host", "the host file is still there");
        assert!(outside.path().join("sub").is_dir(), "the opaque whiteout emptied nothing outside");
        let h = fs::symlink_metadata(root.path().join("h")).unwrap();
        assert!(h.file_type().is_symlink(), "the hard link is to the symlink itself");
        apply(root.path(), &[E::File("h", b"mine", 0o644)]).unwrap();
        assert_eq!(
            fs::read(outside.path().join("passwd")).unwrap(),
            b"host",
            "writing the link wrote no host file"
        );
    }

    #[test]
    fn setuid_bits_and_device_nodes_are_never_created_on_the_host() {
        let root = tempfile::tempdir().unwrap();
        let report = apply(
            root.path(),
            &[
                E::File("su", b"#!", 0o4755),
                E::File("wall", b"#!", 0o2755),
                E::Special("dev-sda", tar::EntryType::Block),
                E::Special("null", tar::EntryType::Char),
                E::Special("fifo", tar::EntryType::Fifo),
                E::Link("su-again", "su"),
            ],
        )
        .unwrap();
        for f in ["su", "wall", "su-again"] {
            let mode = fs::metadata(root.path().join(f)).unwrap().permissions().mode();
            assert_eq!(mode & 0o7777, 0o755, "{f}: {mode:o}");
        }
        for f in ["dev-sda", "null", "fifo"] {
            assert!(fs::symlink_metadata(root.path().join(f)).is_err(), "{f} was created");
        }
        assert_eq!(report.setid_bits_dropped, ["su", "wall"]);
        assert_eq!(report.special_files_skipped, ["dev-sda", "null", "fifo"]);
    }
}
