//! Exporting the overlay's upper layer: every staged entry (files with
//! their bytes, directories, symlinks, whiteouts, opaque markers) streamed
//! as `Entry`/`Data` frames, which the host turns into the Run's stage.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use pvisor_agent_proto::{EntryKind, Reply};

use crate::init::UPPER_MNT;
use crate::{Agent, Out};

impl Agent {
    /// Streams the upper layer, then `ExportDone` (or `Error`).
    pub(crate) fn export(&self) {
        let upper = Path::new(UPPER_MNT).join("upper");
        rustix::fs::sync();
        let mut stats = (0u64, 0u64);
        match export_dir(&upper, &upper, &self.out, &mut stats) {
            Ok(()) => self.send(Reply::ExportDone { entries: stats.0, bytes: stats.1 }, Vec::new()),
            Err(e) => self.send(Reply::Error { op: "export".into(), message: e.to_string() }, Vec::new()),
        }
    }
}

/// The entries of `dir`, sorted, reversed (the next one is last).
fn listed(dir: &Path) -> io::Result<Vec<fs::DirEntry>> {
    let mut entries: Vec<_> = fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| std::cmp::Reverse(e.file_name()));
    Ok(entries)
}

/// Streams the tree under `dir` depth-first in name order. The command
/// chose the tree's depth: the walk keeps its own stack rather than recurse
/// (on PID 1's stack), and a path past PATH_MAX is an export error.
fn export_dir(root: &Path, dir: &Path, out: &Out, stats: &mut (u64, u64)) -> io::Result<()> {
    let mut stack = vec![listed(dir)?];
    while let Some(level) = stack.last_mut() {
        let Some(entry) = level.pop() else {
            stack.pop();
            continue;
        };
        let path = entry.path();
        let meta = fs::symlink_metadata(&path)?;
        let rel = path.strip_prefix(root).map_err(io::Error::other)?.as_os_str().as_bytes().to_vec();
        let ft = meta.file_type();
        let mtime_ns = meta.mtime() as i64 * 1_000_000_000 + meta.mtime_nsec() as i64;
        let (kind, target, opaque) = if ft.is_dir() {
            (EntryKind::Dir, None, xattr_is(&path, "trusted.overlay.opaque", b"y"))
        } else if ft.is_symlink() {
            (EntryKind::Symlink, Some(fs::read_link(&path)?.as_os_str().as_bytes().to_vec()), false)
        } else if ft.is_char_device() && meta.rdev() == 0 {
            (EntryKind::Whiteout, None, false)
        } else if ft.is_fifo() {
            (EntryKind::Fifo, None, false)
        } else if ft.is_file() {
            (EntryKind::File, None, false)
        } else {
            continue; // sockets and device nodes are not workspace content
        };
        let size = if kind == EntryKind::File { meta.len() } else { 0 };
        let header =
            Reply::Entry { path: rel, kind, mode: meta.mode() & 0o7777, mtime_ns, size, target, opaque };
        let _ = out.send((header, Vec::new()));
        stats.0 += 1;
        match kind {
            EntryKind::File => {
                let mut file = File::open(&path)?;
                let mut left = size;
                let mut buf = vec![0u8; 1 << 20];
                while left > 0 {
                    let want = buf.len().min(left as usize);
                    let n = file.read(&mut buf[..want])?;
                    if n == 0 {
                        return Err(io::Error::other(format!("{} shrank during export", path.display())));
                    }
                    let _ = out.send((Reply::Data, buf[..n].to_vec()));
                    left -= n as u64;
                    stats.1 += n as u64;
                }
            }
            EntryKind::Dir => stack.push(listed(&path)?),
            _ => {}
        }
    }
    Ok(())
}

fn xattr_is(path: &Path, name: &str, want: &[u8]) -> bool {
    let mut buf = [0u8; 8];
    match rustix::fs::lgetxattr(path, name, &mut buf[..]) {
        Ok(len) => len > 0 && &buf[..len] == want,
        Err(_) => false,
    }
}
