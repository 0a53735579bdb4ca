//! Takes the guest's overlay upper layer out of the VM and writes it into
//! the Run's stage, in the format the `ns` backend's overlay leaves: 0/0
//! character devices for whiteouts and `user.overlay.opaque=y` on opaque
//! directories (what the stage reader and a userxattr overlay understand).
//!
//! The stream comes from the guest, which is untrusted: every path must be a
//! plain relative path whose parent is a directory this import created, no
//! path may repeat, and a file gets exactly the bytes its entry announced.
//! Nothing is ever resolved through a symlink, so a hostile guest can write
//! only inside the stage.
//!
//! A file's holes arrive as `Hole` frames and stay holes in the stage (the
//! writer seeks over them and sets the length at the end), so the cap — the
//! upper disk's size — counts the bytes the guest actually stored, not a
//! sparse file's apparent size.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use pvisor_agent_proto::{EntryKind, Reply, Request};

use super::disk::UPPER_DISK_BYTES;
use super::link::{LinkError, Shared};

/// Why the export of the upper layer into the stage failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum ExportError {
    #[error(transparent)]
    Link(#[from] LinkError),
    /// What the guest sent breaks the export's rules (an unsafe path, more
    /// data than announced); nothing more of it is staged.
    #[error("{0}")]
    Refused(String),
    #[error("cannot {action} {}: {source}", path.display())]
    Io { action: &'static str, path: PathBuf, source: std::io::Error },
}

impl ExportError {
    fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Io { action, path: path.to_owned(), source }
    }
}

/// More entries than an 8 GiB ext4 upper disk can hold inodes for.
const MAX_ENTRIES: u64 = 4 << 20;

/// Streams the upper layer into `stage` (which exists and is empty).
pub(super) fn export_stage(shared: &Shared, stage: &Path) -> Result<(u64, u64), ExportError> {
    let call = shared.send_call(&Request::Export, &[])?;
    let exported = import_all(shared, stage);
    shared.end_call(call);
    exported
}

/// Takes the export's frames (each an answer to its one call) into `stage`.
fn import_all(shared: &Shared, stage: &Path) -> Result<(u64, u64), ExportError> {
    let timeout = Duration::from_secs(120);
    fs::create_dir_all(stage).map_err(|source| ExportError::io("create", stage, source))?;
    let mut import = Import::new(stage);
    loop {
        match shared.next_reply(timeout)? {
            (Reply::Entry { path, kind, mode, mtime_ns, size, target, opaque }, _) => {
                import.entry(path, kind, mode, mtime_ns, size, target, opaque)?
            }
            (Reply::Data, bytes) => import.data(&bytes)?,
            (Reply::Hole { len }, _) => import.hole(len)?,
            (Reply::ExportDone { entries, bytes }, _) => {
                import.finish()?;
                if entries != import.entries {
                    return Err(ExportError::Refused(format!(
                        "the agent announced {entries} entries but sent {}",
                        import.entries
                    )));
                }
                return Ok((entries, bytes));
            }
            (other, _) => {
                return Err(ExportError::Refused(format!("unexpected reply during export: {other:?}")))
            }
        }
    }
}

struct OpenFile {
    file: File,
    path: PathBuf,
    size: u64,
    left: u64,
    mtime_ns: i64,
}

struct Import {
    stage: PathBuf,
    dirs: HashSet<Vec<u8>>,
    seen: HashSet<Vec<u8>>,
    current: Option<OpenFile>,
    /// Directory modes are set last: a 0555 directory would refuse its children.
    dir_modes: Vec<(PathBuf, u32, i64)>,
    entries: u64,
    /// File data bytes received so far; a guest cannot send more than its disk holds.
    data: u64,
}

impl Import {
    fn new(stage: &Path) -> Self {
        Self {
            stage: stage.to_owned(),
            dirs: HashSet::from([Vec::new()]),
            seen: HashSet::new(),
            current: None,
            dir_modes: Vec::new(),
            entries: 0,
            data: 0,
        }
    }

    fn check_path(&self, path: &[u8]) -> Result<(), ExportError> {
        let shown = String::from_utf8_lossy(path);
        let plain = !path.is_empty()
            && path[0] != b'/'
            && !path.contains(&0)
            && path.split(|&b| b == b'/').all(|c| !c.is_empty() && c != b"." && c != b"..");
        if !plain {
            return Err(ExportError::Refused(format!("the guest sent an unsafe path {shown:?}")));
        }
        let parent = path.iter().rposition(|&b| b == b'/').map_or(&path[..0], |i| &path[..i]);
        if !self.dirs.contains(parent) {
            return Err(ExportError::Refused(format!("the guest sent {shown:?} before its directory")));
        }
        if self.seen.contains(path) {
            return Err(ExportError::Refused(format!("the guest sent {shown:?} twice")));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn entry(
        &mut self,
        path: Vec<u8>,
        kind: EntryKind,
        mode: u32,
        mtime_ns: i64,
        size: u64,
        target: Option<Vec<u8>>,
        opaque: bool,
    ) -> Result<(), ExportError> {
        self.close_file()?;
        self.check_path(&path)?;
        if self.entries >= MAX_ENTRIES {
            return Err(ExportError::Refused(format!(
                "the guest announced more than its upper disk can hold ({} entries)",
                self.entries + 1
            )));
        }
        let full = self.stage.join(std::ffi::OsStr::from_bytes(&path));
        let fail = |source: std::io::Error| ExportError::io("stage", &full, source);
        let mode = mode & 0o7777;
        match kind {
            EntryKind::Dir => {
                fs::create_dir(&full).map_err(fail)?;
                if opaque {
                    set_xattr(&full, "user.overlay.opaque", b"y").map_err(fail)?;
                }
                self.dirs.insert(path.clone());
                self.dir_modes.push((full.clone(), mode, mtime_ns));
            }
            EntryKind::File => {
                let file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&full)
                    .map_err(fail)?;
                file.set_permissions(fs::Permissions::from_mode(mode)).map_err(fail)?;
                self.current = Some(OpenFile { file, path: full.clone(), size, left: size, mtime_ns });
            }
            EntryKind::Symlink => {
                let target = target.ok_or_else(|| {
                    ExportError::Refused(format!("symlink {} has no target", full.display()))
                })?;
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&target), &full).map_err(fail)?;
            }
            EntryKind::Whiteout => mknod(&full, libc::S_IFCHR | 0o600).map_err(fail)?,
            EntryKind::Fifo => mknod(&full, libc::S_IFIFO | mode).map_err(fail)?,
        }
        if kind != EntryKind::File && kind != EntryKind::Dir {
            set_mtime(&full, mtime_ns);
        }
        self.seen.insert(path);
        self.entries += 1;
        Ok(())
    }

    fn data(&mut self, bytes: &[u8]) -> Result<(), ExportError> {
        let Some(open) = self.current.as_mut() else {
            return Err(ExportError::Refused("the guest sent file data outside a file".into()));
        };
        if bytes.len() as u64 > open.left {
            return Err(ExportError::Refused(format!(
                "the guest sent more bytes for {} than announced",
                open.path.display()
            )));
        }
        self.data += bytes.len() as u64;
        if self.data > UPPER_DISK_BYTES {
            return Err(ExportError::Refused(format!(
                "the guest sent more file data than its upper disk can hold ({} bytes)",
                self.data
            )));
        }
        open.file.write_all(bytes).map_err(|source| ExportError::io("write", &open.path, source))?;
        open.left -= bytes.len() as u64;
        Ok(())
    }

    /// The next `len` bytes of the current file are a hole: skipped, so the
    /// staged file has the same hole (its length is set when it closes).
    fn hole(&mut self, len: u64) -> Result<(), ExportError> {
        let Some(open) = self.current.as_mut() else {
            return Err(ExportError::Refused("the guest sent a hole outside a file".into()));
        };
        if len > open.left {
            return Err(ExportError::Refused(format!(
                "the guest sent a hole past the end of {}",
                open.path.display()
            )));
        }
        open.file
            .seek(SeekFrom::Current(len as i64))
            .map_err(|source| ExportError::io("seek in", &open.path, source))?;
        open.left -= len;
        Ok(())
    }

    fn close_file(&mut self) -> Result<(), ExportError> {
        if let Some(open) = self.current.take() {
            if open.left != 0 {
                return Err(ExportError::Refused(format!(
                    "{} is {} bytes short",
                    open.path.display(),
                    open.left
                )));
            }
            // A trailing hole was seeked over, never written.
            open.file.set_len(open.size).map_err(|source| ExportError::io("size", &open.path, source))?;
            drop(open.file);
            set_mtime(&open.path, open.mtime_ns);
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), ExportError> {
        self.close_file()?;
        for (dir, mode, mtime_ns) in self.dir_modes.drain(..).rev() {
            fs::set_permissions(&dir, fs::Permissions::from_mode(mode))
                .map_err(|source| ExportError::io("set the mode of", &dir, source))?;
            set_mtime(&dir, mtime_ns);
        }
        Ok(())
    }
}

fn mknod(path: &Path, mode: u32) -> std::io::Result<()> {
    use rustix::fs::{FileType, Mode, CWD};
    // Device 0 (a whiteout) or a fifo.
    Ok(rustix::fs::mknodat(CWD, path, FileType::from_raw_mode(mode), Mode::from_raw_mode(mode), 0)?)
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    Ok(rustix::fs::lsetxattr(path, name, value, rustix::fs::XattrFlags::empty())?)
}

/// Best effort: the stage reader does not rely on mtimes, the review shows them.
fn set_mtime(path: &Path, mtime_ns: i64) {
    use rustix::fs::{AtFlags, Timespec, Timestamps, CWD, UTIME_OMIT};
    let times = Timestamps {
        last_access: Timespec { tv_sec: 0, tv_nsec: UTIME_OMIT },
        last_modification: Timespec {
            tv_sec: mtime_ns.div_euclid(1_000_000_000),
            tv_nsec: mtime_ns.rem_euclid(1_000_000_000),
        },
    };
    let _ = rustix::fs::utimensat(CWD, path, &times, AtFlags::SYMLINK_NOFOLLOW);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(import: &mut Import, path: &str, kind: EntryKind) -> Result<(), ExportError> {
        import.entry(path.as_bytes().to_vec(), kind, 0o755, 0, 0, Some(b"/etc".to_vec()), false)
    }

    #[test]
    fn hostile_paths_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut import = Import::new(dir.path());
        for bad in ["../x", "/etc/passwd", "a/../../x", "", "a//b", "./a"] {
            assert!(entry(&mut import, bad, EntryKind::File).is_err(), "{bad:?} accepted");
        }
        // A symlink cannot become a parent: its children were never created as directories.
        entry(&mut import, "link", EntryKind::Symlink).unwrap();
        assert!(entry(&mut import, "link/passwd", EntryKind::File)
            .unwrap_err()
            .to_string()
            .contains("before its directory"));
        assert!(entry(&mut import, "link", EntryKind::File).unwrap_err().to_string().contains("twice"));
        entry(&mut import, "d", EntryKind::Dir).unwrap();
        import.entry(b"d/f".to_vec(), EntryKind::File, 0o644, 0, 2, None, false).unwrap();
        assert!(import.data(b"abc").is_err());
        import.data(b"ab").unwrap();
        import.finish().unwrap();
        assert_eq!(fs::read(dir.path().join("d/f")).unwrap(), b"ab");
        assert!(fs::symlink_metadata(dir.path().join("link")).unwrap().file_type().is_symlink());
    }

    /// The cap counts data: a file that claims to be huge must still send
    /// its bytes, and its data past the disk's size is refused.
    #[test]
    fn a_guest_cannot_send_more_data_than_its_disk() {
        let dir = tempfile::tempdir().unwrap();
        let mut import = Import::new(dir.path());
        import.entry(b"f".to_vec(), EntryKind::File, 0o644, 0, u64::MAX, None, false).unwrap();
        import.data = UPPER_DISK_BYTES;
        assert!(import.data(b"x").unwrap_err().to_string().contains("more file data than its upper disk"));
        assert!(import.finish().unwrap_err().to_string().contains("bytes short"));
    }

    /// A 1 GiB file with one written block is staged with the same hole:
    /// its length is whole, its blocks are few, and the block reads back.
    #[test]
    fn a_sparse_file_is_staged_with_its_holes() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let mut import = Import::new(dir.path());
        let size = 1u64 << 30;
        import.entry(b"sparse".to_vec(), EntryKind::File, 0o644, 0, size, None, false).unwrap();
        import.hole(size / 2).unwrap();
        import.data(&[7u8; 4096]).unwrap();
        assert!(import.hole(size).unwrap_err().to_string().contains("past the end"));
        import.hole(size / 2 - 4096).unwrap();
        import.finish().unwrap();
        let meta = fs::metadata(dir.path().join("sparse")).unwrap();
        assert_eq!(meta.len(), size);
        assert!(meta.blocks() * 512 < 1 << 20, "{} blocks: the holes were filled", meta.blocks());
        let mut file = File::open(dir.path().join("sparse")).unwrap();
        let mut block = vec![0u8; 4096];
        file.seek(SeekFrom::Start(size / 2)).unwrap();
        std::io::Read::read_exact(&mut file, &mut block).unwrap();
        assert_eq!(block, vec![7u8; 4096]);
        assert_eq!(import.data, 4096, "only data counts against the cap");
    }

    #[test]
    fn short_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let mut import = Import::new(dir.path());
        import.entry(b"f".to_vec(), EntryKind::File, 0o644, 0, 5, None, false).unwrap();
        import.data(b"ab").unwrap();
        assert!(import.finish().unwrap_err().to_string().contains("3 bytes short"));
    }
}
