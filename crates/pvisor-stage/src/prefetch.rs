//! Reading the staged files an apply is about to copy, ahead of it.
//!
//! Apply writes one path at a time, in order, and each small file it copies
//! costs two reads from disk when the stage is not in the page cache (its
//! inode, then its data), each waited for in turn. A few threads open the
//! files a little further down the plan and ask the kernel for their data
//! (`POSIX_FADV_WILLNEED`), so the disk serves several reads at once and
//! apply finds them in memory. They only read, through the same confined
//! opens as apply, stay at most [`LEAD`] files ahead of it (what they read
//! must still be cached when apply gets there), and stop when apply is done
//! or fails; what they fail to open, apply reports when it gets there.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::beneath::Root;

/// How many threads read ahead: enough to keep a disk's queue busy; they
/// sleep on I/O, not on the CPU.
const READERS: usize = 4;

/// How many files the readers may be ahead of apply.
const LEAD: usize = 512;

/// Files larger than this are left to apply's own sequential reads: their
/// data would crowd the page cache, and a large copy is bound by bandwidth,
/// not by waiting.
pub(crate) const LARGEST: u64 = 1 << 20;

/// Where apply is in the plan, for the readers to stay near it.
#[derive(Default)]
pub(crate) struct Cursor {
    at: AtomicUsize,
    done: AtomicBool,
}

impl Cursor {
    /// Apply has reached item `index` of the plan (the furthest of its
    /// writers, when several write at once).
    pub(crate) fn reached(&self, index: usize) {
        self.at.fetch_max(index, Ordering::Relaxed);
    }
}

/// Ends the readers however `work` ends, a panic included.
struct Finish<'a>(&'a Cursor);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        self.0.done.store(true, Ordering::Relaxed);
    }
}

/// Runs `work` while up to [`READERS`] threads read `files` ahead of it, and
/// returns what `work` returns. Each file is `(index in the plan, path
/// beneath upper)`; `work` moves the [`Cursor`] as it goes. A reader that
/// cannot be started is done without: apply does not need it.
pub(crate) fn while_reading<T>(upper: &Root, files: &[(usize, &Path)], work: impl FnOnce(&Cursor) -> T) -> T {
    let cursor = Cursor::default();
    if files.len() < 2 * READERS {
        return work(&cursor);
    }
    std::thread::scope(|scope| {
        let finish = Finish(&cursor);
        for first in 0..READERS {
            let Ok(fd) = upper.dup_fd() else { break };
            let cursor = &cursor;
            let reader =
                move || read_ahead(Root::from_fd(fd), files.iter().skip(first).step_by(READERS), cursor);
            if std::thread::Builder::new()
                .name("pvisor-read-ahead".into())
                .spawn_scoped(scope, reader)
                .is_err()
            {
                break;
            }
        }
        let result = work(&cursor);
        drop(finish);
        result
    })
}

/// One reader's share of the files, each opened and its data asked for,
/// never more than [`LEAD`] plan items ahead of apply.
fn read_ahead<'a>(root: Root, files: impl Iterator<Item = &'a (usize, &'a Path)>, cursor: &Cursor) {
    for (index, rel) in files {
        while *index > cursor.at.load(Ordering::Relaxed) + LEAD {
            if cursor.done.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if cursor.done.load(Ordering::Relaxed) {
            return;
        }
        if let Ok(file) = root.open_file(rel) {
            let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::WillNeed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use super::{while_reading, READERS};
    use crate::beneath::Root;

    /// Readers never hold apply up: a FIFO is opened without blocking and
    /// refused, a symlink out of the root is not followed, a missing file is
    /// skipped, and the readers come to the end of the list while the work
    /// waits (a reader blocked on the FIFO would hang the test).
    #[test]
    fn readers_pass_what_is_not_a_file_and_end_with_the_work() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut names: Vec<PathBuf> = ["fifo", "out", "missing"].map(PathBuf::from).to_vec();
        for i in 0..4 * READERS {
            std::fs::write(dir.path().join(format!("f{i}")), "data").expect("file");
            names.push(format!("f{i}").into());
        }
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dir.path().join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .expect("fifo");
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("out")).expect("symlink");
        let root = Root::open(dir.path()).expect("root");
        let files: Vec<(usize, &Path)> = names.iter().map(PathBuf::as_path).enumerate().collect();
        let answer = while_reading(&root, &files, |cursor| {
            cursor.reached(files.len());
            // Long enough for four readers to open twenty entries.
            std::thread::sleep(Duration::from_millis(300));
            42
        });
        assert_eq!(answer, 42);
    }
}
