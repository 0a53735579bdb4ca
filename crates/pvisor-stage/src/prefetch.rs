//! Reading the staged files an apply is about to copy, ahead of it.
//!
//! Apply writes one path at a time, in order, and each small file it copies
//! costs two reads from disk when the stage is not in the page cache (its
//! inode, then its data), each waited for in turn. A few threads open the
//! files further down the plan and ask the kernel for their data
//! (`POSIX_FADV_WILLNEED`), so the disk serves several reads at once and
//! apply finds them in memory. They only read, through the same confined
//! opens as apply, and stop when apply is done; what they fail to open,
//! apply reports when it gets there.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::beneath::Root;

/// How many threads read ahead: enough to keep a disk's queue busy; they
/// sleep on I/O, not on the CPU.
const READERS: usize = 4;

/// Files larger than this are left to apply's own sequential reads: their
/// data would crowd the page cache, and a large copy is bound by bandwidth,
/// not by waiting.
pub(crate) const LARGEST: u64 = 1 << 20;

/// Runs `work` while [`READERS`] threads read `files` (paths beneath
/// `upper`) ahead of it, and returns what `work` returns.
pub(crate) fn while_reading<T>(upper: &Root, files: &[&Path], work: impl FnOnce() -> T) -> T {
    if files.len() < 2 * READERS {
        return work();
    }
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for first in 0..READERS {
            let Ok(fd) = upper.dup_fd() else { break };
            let done = &done;
            scope.spawn(move || {
                let root = Root::from_fd(fd);
                for rel in files.iter().skip(first).step_by(READERS) {
                    if done.load(Ordering::Relaxed) {
                        return;
                    }
                    if let Ok(file) = root.open_file(rel) {
                        let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::WillNeed);
                    }
                }
            });
        }
        let result = work();
        done.store(true, Ordering::Relaxed);
        result
    })
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::{while_reading, READERS};
    use crate::beneath::Root;

    /// Readers never hold apply up: a FIFO is opened without blocking and
    /// refused, a symlink out of the root is not followed, a missing file is
    /// skipped, and what `work` returns comes back once it is done.
    #[test]
    fn readers_skip_what_is_not_a_file_and_end_with_the_work() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut names: Vec<PathBuf> = Vec::new();
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
        names.extend(["fifo", "out", "missing"].map(PathBuf::from));
        let root = Root::open(dir.path()).expect("root");
        let files: Vec<&Path> = names.iter().map(PathBuf::as_path).collect();
        let answer = while_reading(&root, &files, || 42);
        assert_eq!(answer, 42);
    }
}
