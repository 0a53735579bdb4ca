//! Exporting the overlay's upper layer: every staged entry (files with
//! their bytes, directories, symlinks, whiteouts, opaque markers) streamed
//! as `Entry`/`Data` frames, which the host turns into the Run's stage. A
//! sparse file's holes travel as `Hole` frames, found with `SEEK_DATA` /
//! `SEEK_HOLE`, so a 1 GiB file with one written block costs one block.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use pvisor_agent_proto::{EntryKind, Reply};

use crate::init::UPPER_MNT;
use crate::{Agent, Out};

impl Agent {
    /// Streams the upper layer, then `ExportDone` (or `Error`); every
    /// frame names the `Export` request it answers.
    pub(crate) fn export(&self) {
        let upper = Path::new(UPPER_MNT).join("upper");
        rustix::fs::sync();
        let mut stats = (0u64, 0u64);
        let out = Tagged { out: &self.out, answers: self.answering };
        match export_dir(&upper, &upper, &out, &mut stats) {
            Ok(()) => self.send(Reply::ExportDone { entries: stats.0, bytes: stats.1 }, Vec::new()),
            Err(e) => self.send(Reply::Error { op: "export".into(), message: e.to_string() }, Vec::new()),
        }
    }
}

/// The export's frames, each naming the request they answer.
struct Tagged<'a> {
    out: &'a Out,
    answers: Option<u64>,
}

impl Tagged<'_> {
    fn send(&self, reply: Reply, payload: Vec<u8>) {
        let _ = self.out.send((reply, payload, self.answers));
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
fn export_dir(root: &Path, dir: &Path, out: &Tagged, stats: &mut (u64, u64)) -> io::Result<()> {
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
        out.send(header, Vec::new());
        stats.0 += 1;
        match kind {
            EntryKind::File => {
                let mut file = File::open(&path)?;
                stats.1 += export_file(&mut file, size, out)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            }
            EntryKind::Dir => stack.push(listed(&path)?),
            _ => {}
        }
    }
    Ok(())
}

/// Sends `size` bytes of `file` as `Data` for its data and `Hole` for its
/// holes; returns the data bytes sent.
fn export_file(file: &mut File, size: u64, out: &Tagged) -> io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let (mut at, mut sent) = (0u64, 0u64);
    while at < size {
        let data = next_data(file, at, size)?;
        if data > at {
            out.send(Reply::Hole { len: data - at }, Vec::new());
            at = data;
            continue;
        }
        let end = next_hole(file, at, size)?;
        file.seek(SeekFrom::Start(at))?;
        while at < end {
            let want = buf.len().min((end - at) as usize);
            let n = file.read(&mut buf[..want])?;
            if n == 0 {
                return Err(io::Error::other("the file shrank during export"));
            }
            out.send(Reply::Data, buf[..n].to_vec());
            at += n as u64;
            sent += n as u64;
        }
    }
    Ok(sent)
}

/// Where the next data at or after `at` starts; `size` when only a hole is
/// left (ENXIO), and `at` itself on a filesystem that cannot tell.
fn next_data(file: &File, at: u64, size: u64) -> io::Result<u64> {
    match rustix::fs::seek(file, rustix::fs::SeekFrom::Data(at)) {
        Ok(offset) => Ok(offset.min(size)),
        Err(rustix::io::Errno::NXIO) => Ok(size),
        Err(rustix::io::Errno::INVAL | rustix::io::Errno::OPNOTSUPP) => Ok(at),
        Err(e) => Err(e.into()),
    }
}

/// Where the data at `at` ends (the file's end if nothing says otherwise).
fn next_hole(file: &File, at: u64, size: u64) -> io::Result<u64> {
    match rustix::fs::seek(file, rustix::fs::SeekFrom::Hole(at)) {
        Ok(offset) if offset > at => Ok(offset.min(size)),
        Ok(_) | Err(rustix::io::Errno::INVAL | rustix::io::Errno::OPNOTSUPP) => Ok(size),
        Err(e) => Err(e.into()),
    }
}

fn xattr_is(path: &Path, name: &str, want: &[u8]) -> bool {
    let mut buf = [0u8; 8];
    match rustix::fs::lgetxattr(path, name, &mut buf[..]) {
        Ok(len) => len > 0 && &buf[..len] == want,
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    /// A sparse file travels as its one written block and holes, and the
    /// frames add up to its size.
    #[test]
    fn a_sparse_file_is_sent_as_data_and_holes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        let size = 64u64 << 20;
        let mut file = File::create(&path).unwrap();
        file.set_len(size).unwrap();
        file.write_all_at(&[7u8; 4096], size / 2).unwrap();
        file.flush().unwrap();
        let sparse = fs::metadata(&path).unwrap().blocks() * 512 < 1 << 20;
        let (out, frames) = std::sync::mpsc::sync_channel(64);
        let reader = std::thread::spawn(move || frames.into_iter().collect::<Vec<crate::Frame>>());
        let sent =
            export_file(&mut File::open(&path).unwrap(), size, &Tagged { out: &out, answers: Some(9) });
        drop(out);
        let frames = reader.join().unwrap();
        let (mut data, mut holes) = (0u64, 0u64);
        for (reply, payload, answers) in &frames {
            assert_eq!(*answers, Some(9));
            match reply {
                Reply::Data => data += payload.len() as u64,
                Reply::Hole { len } => holes += len,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(data + holes, size);
        assert_eq!(sent.unwrap(), data);
        if sparse {
            assert!(data <= 1 << 20, "{data} data bytes sent for one block");
        }
    }
}
