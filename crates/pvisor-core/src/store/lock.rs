//! The owner lock: `flock(2)` on a file or directory, held for as long as
//! the process that owns an Attempt (or a stage, or the admission) lives.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use rustix::fs::FlockOperation;

use super::StoreError;

/// An exclusive advisory lock (`flock(2)`) held by the process that owns an Attempt.
///
/// The kernel drops it when the owner exits, however it exits, so a reader that
/// can take the lock knows the owner is gone.
#[derive(Debug)]
pub struct OwnerLock {
    file: File,
}

impl OwnerLock {
    fn open_file(path: &Path) -> Result<File, StoreError> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| StoreError::io("open lock", path, e))
    }

    /// Takes the lock, failing if another process holds it.
    pub fn acquire(path: &Path) -> Result<Self, StoreError> {
        let file = Self::open_file(path)?;
        if let Err(e) = rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            return Err(StoreError::io("lock", path, e.into()));
        }
        Ok(Self { file })
    }

    /// Takes the lock, waiting while another process holds it.
    pub fn acquire_blocking(path: &Path) -> Result<Self, StoreError> {
        Self::lock_blocking(Self::open_file(path)?, path)
    }

    /// Takes an exclusive lock on directory `dir` itself, waiting while
    /// another process holds it. Nothing is created inside `dir`.
    pub fn acquire_directory(dir: &Path) -> Result<Self, StoreError> {
        Self::flock_blocking(Self::open_directory(dir)?, dir, FlockOperation::LockExclusive)
    }

    /// Takes a shared lock on directory `dir` itself, waiting while another
    /// process holds it exclusively.
    pub fn acquire_directory_shared(dir: &Path) -> Result<Self, StoreError> {
        Self::flock_blocking(Self::open_directory(dir)?, dir, FlockOperation::LockShared)
    }

    fn open_directory(dir: &Path) -> Result<File, StoreError> {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(dir)
            .map_err(|e| StoreError::io("open", dir, e))
    }

    /// Takes a shared lock at `path`, waiting while an exclusive holder has it.
    /// Many processes may hold it at once; an exclusive [`Self::try_acquire`]
    /// fails while any do.
    pub fn acquire_shared_blocking(path: &Path) -> Result<Self, StoreError> {
        Self::flock_blocking(Self::open_file(path)?, path, FlockOperation::LockShared)
    }

    /// Takes the lock exclusively if nobody holds it (shared or not);
    /// `Ok(None)` if somebody does.
    pub fn try_acquire(path: &Path) -> Result<Option<Self>, StoreError> {
        match Self::acquire(path) {
            Ok(lock) => Ok(Some(lock)),
            Err(StoreError::Io { source, .. }) if source.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Takes the lock on an already open `file` (named `path` in errors),
    /// waiting while another holder has it.
    pub(crate) fn lock_blocking(file: File, path: &Path) -> Result<Self, StoreError> {
        Self::flock_blocking(file, path, FlockOperation::LockExclusive)
    }

    /// The locked file, for a holder that also reads or writes it.
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    fn flock_blocking(file: File, path: &Path, op: FlockOperation) -> Result<Self, StoreError> {
        loop {
            match rustix::fs::flock(&file, op) {
                Ok(()) => return Ok(Self { file }),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(StoreError::io("lock", path, e.into())),
            }
        }
    }

    /// Returns whether some process currently holds the lock at `path`.
    /// A missing lock file means nobody does.
    pub fn is_held(path: &Path) -> Result<bool, StoreError> {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(StoreError::io("open lock", path, e)),
        };
        // The shared lock is released on drop.
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockShared) {
            Ok(()) => Ok(false),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(true),
            Err(e) => Err(StoreError::io("probe lock", path, e.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_lock_is_visible_to_readers_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("owner.lock");
        assert!(!OwnerLock::is_held(&path).unwrap());
        let lock = OwnerLock::acquire(&path).unwrap();
        assert!(OwnerLock::is_held(&path).unwrap());
        drop(lock);
        assert!(!OwnerLock::is_held(&path).unwrap());
    }
}
