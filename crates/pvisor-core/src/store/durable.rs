//! The durable write protocol and capped reads: temporary, fsync, rename,
//! fsync the directory; no-clobber commits by `link(2)`; JSON Lines appends
//! that cut off a torn tail; records parsed with their format checked.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{StoreError, RECORD_READ_CAP};
use crate::records::{Record, FORMAT};

/// Serializes a record as pretty JSON with a trailing newline.
pub fn to_json_bytes<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing our own plain-data records cannot fail (no maps with non-string keys).
    let mut bytes = serde_json::to_vec_pretty(value).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// Creates `dir` and its parents with mode 0700 (records can name private paths).
pub fn create_dir_all_private(dir: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| StoreError::io("create directory", dir, e))
}

/// [`create_dir_all_private`] for a directory that will hold records: the
/// name of each directory it makes is synced into its parent, so a power
/// cut cannot lose the directory while a record that names it survives.
/// (Journaled filesystems order these anyway, and ext4 without a journal
/// syncs a new file's new parents when the file is synced; ext2 and others
/// do neither.)
pub fn create_dir_all_durable(dir: &Path) -> Result<(), StoreError> {
    let missing: Vec<&Path> =
        dir.ancestors().take_while(|d| !d.as_os_str().is_empty() && !d.exists()).collect();
    create_dir_all_private(dir)?;
    for made in missing.iter().rev() {
        sync_dir(parent_of(made))?;
    }
    Ok(())
}

/// Reads at most `cap` bytes of `path`, failing if the file is larger.
pub fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, StoreError> {
    let file = File::open(path).map_err(|e| StoreError::io("read", path, e))?;
    let mut bytes = Vec::new();
    file.take(cap + 1).read_to_end(&mut bytes).map_err(|e| StoreError::io("read", path, e))?;
    if bytes.len() as u64 > cap {
        let size = fs::metadata(path).map(|m| m.len()).unwrap_or(bytes.len() as u64);
        return Err(StoreError::TooLarge { path: path.to_owned(), size, cap });
    }
    Ok(bytes)
}

/// Reads a record, refusing corrupt JSON and formats newer than [`FORMAT`].
pub fn read_record<T: Record>(path: &Path) -> Result<T, StoreError> {
    let bytes = read_capped(path, RECORD_READ_CAP)?;
    parse_record(path, &bytes)
}

/// Parses record bytes that were read from `path`.
pub fn parse_record<T: Record>(path: &Path, bytes: &[u8]) -> Result<T, StoreError> {
    #[derive(Deserialize)]
    struct Probe {
        format: u32,
    }
    let corrupt = |source| StoreError::Corrupt { path: path.to_owned(), what: T::FILE, source };
    let probe: Probe = serde_json::from_slice(bytes).map_err(corrupt)?;
    if probe.format > FORMAT {
        return Err(StoreError::NewerFormat {
            path: path.to_owned(),
            found: probe.format,
            supported: FORMAT,
        });
    }
    let record: T = serde_json::from_slice(bytes).map_err(corrupt)?;
    Ok(record)
}

/// Returns the hex BLAKE3 digest of `bytes`.
pub fn blake3_hex(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

pub(super) fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_else(|| OsStr::new("record"));
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".tmp-{}-{}", std::process::id(), crate::ids::new_ulid()));
    path.with_file_name(tmp)
}

fn write_synced_temp(path: &Path, bytes: &[u8]) -> Result<PathBuf, StoreError> {
    let tmp = temp_path(path);
    let result = (|| {
        let mut file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()
    })();
    match result {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(StoreError::io("write", path, e))
        }
    }
}

/// Fsyncs a directory so a rename or link inside it is durable.
pub fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| StoreError::io("sync directory", dir, e))
}

fn parent_of(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Atomically replaces `path` with `bytes`: temp → fsync → rename → fsync dir.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let tmp = write_synced_temp(path, bytes)?;
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(StoreError::io("replace", path, e));
    }
    sync_dir(parent_of(path))
}

/// The outcome of a no-clobber commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// The file was written by this call.
    Written,
    /// The file already held exactly these bytes; nothing changed.
    AlreadyCommitted,
}

/// Writes `path` only if it does not exist yet. The same bytes again succeed
/// ([`Commit::AlreadyCommitted`]); different bytes are a [`StoreError::Conflict`].
pub fn commit_no_clobber(path: &Path, bytes: &[u8]) -> Result<Commit, StoreError> {
    let tmp = write_synced_temp(path, bytes)?;
    let linked = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            sync_dir(parent_of(path))?;
            Ok(Commit::Written)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let existing = read_capped(path, RECORD_READ_CAP)?;
            if existing == bytes {
                Ok(Commit::AlreadyCommitted)
            } else {
                Err(StoreError::Conflict { path: path.to_owned() })
            }
        }
        Err(e) => Err(StoreError::io("commit", path, e)),
    }
}

/// Appends one line to a JSON Lines file, optionally fsyncing it.
///
/// Callers are the file's single writer (they hold the owner or apply lock).
/// A torn final line — a write interrupted by a crash, never acknowledged — is
/// cut off first, so the new line starts on a line of its own.
pub fn append_line(path: &Path, line: &[u8], sync: bool) -> Result<(), StoreError> {
    let mut buf = Vec::with_capacity(line.len() + 1);
    buf.extend_from_slice(line);
    buf.push(b'\n');
    let result = (|| {
        let mut file = OpenOptions::new().read(true).append(true).create(true).mode(0o600).open(path)?;
        trim_torn_tail(&file)?;
        // One write(2) per call: O_APPEND keeps whole lines together.
        file.write_all(&buf)?;
        if sync {
            file.sync_data()?;
        }
        Ok(())
    })();
    result.map_err(|e| StoreError::io("append to", path, e))
}

/// Truncates `file` after its last newline if it ends in a partial line.
pub(crate) fn trim_torn_tail(file: &File) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    let mut last = [0u8; 1];
    file.read_exact_at(&mut last, len - 1)?;
    if last[0] == b'\n' {
        return Ok(());
    }
    let mut end = len;
    let mut chunk = vec![0u8; 64 * 1024];
    while end > 0 {
        let start = end.saturating_sub(chunk.len() as u64);
        let piece = &mut chunk[..(end - start) as usize];
        file.read_exact_at(piece, start)?;
        if let Some(pos) = piece.iter().rposition(|&b| b == b'\n') {
            return file.set_len(start + pos as u64 + 1);
        }
        end = start;
    }
    file.set_len(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{AttemptId, JobId, RunId};
    use crate::records::{BundleRef, CompletionReceipt, ResultFixture};

    #[test]
    fn a_durable_directory_is_made_private_with_its_parents_and_made_again_quietly() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("runs/run-1/attempts/1");
        create_dir_all_durable(&deep).unwrap();
        for made in ["runs", "runs/run-1", "runs/run-1/attempts", "runs/run-1/attempts/1"] {
            let mode = fs::metadata(dir.path().join(made)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{made}");
        }
        create_dir_all_durable(&deep).unwrap();
        let file = dir.path().join("a-file");
        fs::write(&file, "").unwrap();
        assert!(create_dir_all_durable(&file.join("below")).is_err(), "a file is not a parent");
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn no_clobber_is_idempotent_and_refuses_a_different_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("completion.json");
        assert_eq!(commit_no_clobber(&path, b"r1").unwrap(), Commit::Written);
        assert_eq!(commit_no_clobber(&path, b"r1").unwrap(), Commit::AlreadyCommitted);
        assert!(matches!(commit_no_clobber(&path, b"r2"), Err(StoreError::Conflict { .. })));
        assert_eq!(fs::read(&path).unwrap(), b"r1");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "temp files left behind");
    }

    #[test]
    fn reads_are_capped_and_corruption_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("completion.json");
        fs::write(&path, b"{\"format\":1, truncated").unwrap();
        let err = read_record::<CompletionReceipt>(&path).unwrap_err();
        assert!(err.to_string().contains("completion.json is corrupt"), "{err}");
        fs::write(&path, vec![b' '; 100]).unwrap();
        assert!(matches!(read_capped(&path, 10), Err(StoreError::TooLarge { size: 100, .. })));
    }

    #[test]
    fn newer_formats_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("completion.json");
        let mut receipt = CompletionReceipt {
            format: FORMAT,
            job: JobId::generate(),
            run: RunId::generate(),
            attempt: AttemptId::new(RunId::generate(), 1),
            result: ResultFixture::completed(),
            bundle: BundleRef { file: "bundle.json".into(), size: 1, blake3: "00".into() },
        };
        receipt.format = FORMAT + 1;
        fs::write(&path, to_json_bytes(&receipt)).unwrap();
        let err = read_record::<CompletionReceipt>(&path).unwrap_err();
        assert!(matches!(err, StoreError::NewerFormat { found, .. } if found == FORMAT + 1));
    }

    #[test]
    fn appending_after_a_torn_line_cuts_it_off() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        fs::write(&path, b"{\"a\":1}\n{\"b\":").unwrap();
        append_line(&path, b"{\"c\":3}", false).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"{\"a\":1}\n{\"c\":3}\n");
        fs::write(&path, b"torn-only").unwrap();
        append_line(&path, b"x", false).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"x\n");
    }
}
