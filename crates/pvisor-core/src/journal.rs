//! The Trace's one writer: sequence numbers allocated under a lock on the file.
//!
//! Several processes append to one Run's `events.jsonl`: the Attempt's owner,
//! `kill`, recovery, apply and drop. A counter kept in one process's memory
//! cannot be the source of truth (two counters gave duplicate `seq`s), so
//! every append here takes an exclusive `flock(2)` on the events file itself,
//! cuts off a torn tail, reads the last complete event's `seq`, writes the new
//! lines numbered after it in one `write(2)`, and releases the lock. Appends
//! from any number of processes therefore produce one strictly increasing,
//! gap-free sequence.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::store::{self, OwnerLock, StoreError};

/// A prefix of a Trace, as a Bundle binds it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct TracePrefix {
    pub bytes: u64,
    pub blake3: String,
}

/// How a Trace no longer begins with the prefix its Bundle binds.
#[derive(Debug, thiserror::Error)]
pub enum PrefixError {
    #[error("cannot read it: {source}")]
    Read {
        #[source]
        source: std::io::Error,
    },
    #[error("it is {read} bytes, shorter than the {bound} its Bundle binds")]
    Shorter { read: u64, bound: u64 },
    #[error("its first {bound} bytes differ from the ones its Bundle binds")]
    Differs { bound: u64 },
}

/// An append-only JSON Lines file whose lines carry a `seq` field.
#[derive(Debug, Clone)]
pub struct Journal {
    path: PathBuf,
}

impl Journal {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the file (creating it), takes its lock and cuts off a torn
    /// tail. The lock is released when the returned guard is dropped.
    fn lock(&self) -> Result<OwnerLock, StoreError> {
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(&self.path)
            .map_err(|e| StoreError::Io { op: "open", path: self.path.clone(), source: e })?;
        let locked = OwnerLock::lock_blocking(file, &self.path)?;
        store::trim_torn_tail(locked.file()).map_err(|e| StoreError::Io {
            op: "repair",
            path: self.path.clone(),
            source: e,
        })?;
        Ok(locked)
    }

    /// Appends `count` lines built by `build(first_seq)` (which returns them
    /// joined by `\n`, without the final newline) and returns `first_seq`.
    /// `sync` makes them durable before returning.
    pub fn append(
        &self,
        count: u64,
        sync: bool,
        build: impl FnOnce(u64) -> Vec<u8>,
    ) -> Result<u64, StoreError> {
        let io = |e| StoreError::Io { op: "append to", path: self.path.clone(), source: e };
        let locked = self.lock()?;
        let file = locked.file();
        let first = self.last_seq(file)? + 1;
        if count == 0 {
            return Ok(first);
        }
        let mut bytes = build(first);
        bytes.push(b'\n');
        // One write(2) under the lock: readers never see a line cut in two
        // except after a crash, which the next append trims.
        let mut writer = file;
        writer.write_all(&bytes).map_err(io)?;
        if sync {
            file.sync_data().map_err(io)?;
        }
        Ok(first)
    }

    /// The length and BLAKE3 of the file as it stands (a torn tail cut
    /// first), taken under the lock, so no append is half in it. A Bundle
    /// binds this prefix of the Trace; later appends do not change it.
    pub fn seal_prefix(&self) -> Result<TracePrefix, StoreError> {
        let io = |e| StoreError::Io { op: "read", path: self.path.clone(), source: e };
        let locked = self.lock()?;
        let file = locked.file();
        // Durable before it is bound: the Bundle and receipt are fsynced,
        // and after a power loss the Trace must still begin with what they bind.
        file.sync_data().map_err(io)?;
        let mut hasher = blake3::Hasher::new();
        let bytes = std::io::copy(&mut std::io::Read::by_ref(&mut &*file), &mut hasher).map_err(io)?;
        Ok(TracePrefix { bytes, blake3: hasher.finalize().to_hex().to_string() })
    }

    /// Checks that the file still begins with `prefix`; an error says how not.
    pub fn check_prefix(&self, prefix: &TracePrefix) -> Result<(), PrefixError> {
        let file = File::open(&self.path).map_err(|source| PrefixError::Read { source })?;
        let mut hasher = blake3::Hasher::new();
        let read = std::io::copy(&mut std::io::Read::take(&file, prefix.bytes), &mut hasher)
            .map_err(|source| PrefixError::Read { source })?;
        if read < prefix.bytes {
            return Err(PrefixError::Shorter { read, bound: prefix.bytes });
        }
        if hasher.finalize().to_hex().as_str() != prefix.blake3 {
            return Err(PrefixError::Differs { bound: prefix.bytes });
        }
        Ok(())
    }

    /// The `seq` of the file's last line (0 when empty). The file ends in a
    /// newline or is empty (the torn tail was trimmed).
    fn last_seq(&self, file: &File) -> Result<u64, StoreError> {
        #[derive(Deserialize)]
        struct Seq {
            seq: u64,
        }
        let io = |e| StoreError::Io { op: "read", path: self.path.clone(), source: e };
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            return Ok(0);
        }
        // Read backwards from the final newline until the line before it
        // starts. Each chunk is searched once and kept apart (a line of
        // megabytes — a drop of thousands of deep paths — costs its length,
        // not its length squared).
        let end = len - 1;
        let mut chunks: Vec<Vec<u8>> = Vec::new();
        let (mut start, mut read) = (end, 0u64);
        loop {
            let step = start.min(64 * 1024);
            let from = start - step;
            let mut chunk = vec![0u8; step as usize];
            file.read_exact_at(&mut chunk, from).map_err(io)?;
            start = from;
            read += step;
            if let Some(pos) = chunk.iter().rposition(|&b| b == b'\n') {
                chunk.drain(..=pos);
                chunks.push(chunk);
                break;
            }
            chunks.push(chunk);
            if start == 0 || read > store::RECORD_READ_CAP {
                break;
            }
        }
        let tail: Vec<u8> = chunks.into_iter().rev().flatten().collect();
        serde_json::from_slice::<Seq>(&tail).map(|s| s.seq).map_err(|source| StoreError::Corrupt {
            path: self.path.clone(),
            what: "events.jsonl (its last line has no seq)",
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(seq: u64, tag: &str) -> Vec<u8> {
        format!("{{\"seq\":{seq},\"tag\":\"{tag}\"}}").into_bytes()
    }

    fn seqs(path: &Path) -> Vec<u64> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"].as_u64().unwrap())
            .collect()
    }

    #[test]
    fn sequences_continue_from_the_file_not_from_memory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let a = Journal::new(&path);
        let b = Journal::new(&path);
        assert_eq!(a.append(1, false, |s| line(s, "a")).unwrap(), 1);
        assert_eq!(b.append(2, false, |s| [line(s, "b"), line(s + 1, "b")].join(&b'\n')).unwrap(), 2);
        assert_eq!(a.append(1, false, |s| line(s, "a")).unwrap(), 4);
        assert_eq!(seqs(&path), vec![1, 2, 3, 4]);
    }

    #[test]
    fn a_torn_tail_is_cut_and_its_seq_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        std::fs::write(&path, b"{\"seq\":1}\n{\"seq\":2,\"ta").unwrap();
        assert_eq!(Journal::new(&path).append(1, false, |s| line(s, "x")).unwrap(), 2);
        assert_eq!(seqs(&path), vec![1, 2]);
    }

    #[test]
    fn a_long_last_line_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let big = "y".repeat(20_000);
        Journal::new(&path).append(1, false, |s| line(s, &big)).unwrap();
        assert_eq!(Journal::new(&path).append(1, false, |s| line(s, "z")).unwrap(), 2);
    }

    #[test]
    fn contended_appends_from_many_threads_never_share_a_seq() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let path = path.clone();
                std::thread::spawn(move || {
                    // Each thread opens its own file description, as a process would.
                    for _ in 0..50 {
                        Journal::new(&path).append(1, false, |s| line(s, &t.to_string())).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(seqs(&path), (1..=400).collect::<Vec<u64>>());
    }
}
