//! Trusted workspace configuration files (direnv's `allow`, for `.pvisor.toml`).
//!
//! A workspace's `.pvisor.toml` is the repository's content, so it is
//! untrusted: until the user trusts that exact file, it may only narrow the
//! policy. Trusting records the file's canonical path and the BLAKE3 of its
//! bytes in `trusted-configs.json` in the state directory, which no sandbox
//! can read or write; any change to the file (by the user, a `git pull`, or
//! an applied change staged by a command) no longer matches, and the file is
//! untrusted again until trusted anew.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use pvisor_core::records::{Record, FORMAT};
use pvisor_core::store::{self, OwnerLock, Store, StoreError};
use pvisor_core::time::Timestamp;

/// One trusted file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrustedFile {
    /// The file's canonical path.
    pub path: PathBuf,
    /// BLAKE3 of the exact bytes that were trusted.
    pub blake3: String,
    pub trusted_at: Timestamp,
}

/// `trusted-configs.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrustRecord {
    pub format: u32,
    pub files: Vec<TrustedFile>,
}

impl Record for TrustRecord {
    const FILE: &'static str = "trusted-configs.json";
    fn format(&self) -> u32 {
        self.format
    }
}

/// What is known about one file's trust.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trust {
    /// Trusted, and unchanged since.
    Trusted,
    /// Trusted once, but its bytes have changed since: untrusted.
    Changed,
    /// Never trusted (or revoked).
    Untrusted,
}

fn record_file(store: &Store) -> PathBuf {
    store.root().join(TrustRecord::FILE)
}

fn load(store: &Store) -> Result<TrustRecord, StoreError> {
    match store.read(&record_file(store)) {
        Ok(record) => Ok(record),
        Err(e) if e.is_not_found() => Ok(TrustRecord { format: FORMAT, files: Vec::new() }),
        Err(e) => Err(e),
    }
}

/// Changes the record under its lock (two `pvisor trust` at once lose nothing).
fn update(store: &Store, change: impl FnOnce(&mut TrustRecord)) -> Result<TrustRecord, StoreError> {
    let _lock = OwnerLock::acquire_blocking(&store.root().join("trusted-configs.lock"))?;
    let mut record = load(store)?;
    change(&mut record);
    record.format = FORMAT;
    store.write(&record_file(store), &record)?;
    Ok(record)
}

/// Whether `bytes`, read from the file at canonical path `path`, are trusted.
pub fn check(store: &Store, path: &Path, bytes: &[u8]) -> Result<Trust, StoreError> {
    let record = load(store)?;
    let digest = store::blake3_hex(bytes);
    Ok(match record.files.iter().find(|f| f.path == path) {
        Some(f) if f.blake3 == digest => Trust::Trusted,
        Some(_) => Trust::Changed,
        None => Trust::Untrusted,
    })
}

/// Trusts exactly `bytes` of the file at canonical path `path`.
pub fn trust(store: &Store, path: &Path, bytes: &[u8]) -> Result<TrustedFile, StoreError> {
    let entry =
        TrustedFile { path: path.to_owned(), blake3: store::blake3_hex(bytes), trusted_at: Timestamp::now() };
    update(store, |record| {
        record.files.retain(|f| f.path != path);
        record.files.push(entry.clone());
        record.files.sort_by(|a, b| a.path.cmp(&b.path));
    })?;
    Ok(entry)
}

/// Revokes trust in `path`; returns whether it was trusted.
pub fn revoke(store: &Store, path: &Path) -> Result<bool, StoreError> {
    let mut found = false;
    update(store, |record| {
        let before = record.files.len();
        record.files.retain(|f| f.path != path);
        found = record.files.len() != before;
    })?;
    Ok(found)
}

/// Every trusted file.
pub fn list(store: &Store) -> Result<Vec<TrustedFile>, StoreError> {
    Ok(load(store)?.files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_is_for_exact_bytes_and_any_change_revokes_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("state")).unwrap();
        let path = Path::new("/work/repo/.pvisor.toml");
        assert_eq!(check(&store, path, b"[network]\n").unwrap(), Trust::Untrusted);
        trust(&store, path, b"[network]\n").unwrap();
        assert_eq!(check(&store, path, b"[network]\n").unwrap(), Trust::Trusted);
        assert_eq!(check(&store, path, b"[network]\nmode = \"host\"\n").unwrap(), Trust::Changed);
        assert_eq!(
            check(&store, Path::new("/elsewhere/.pvisor.toml"), b"[network]\n").unwrap(),
            Trust::Untrusted
        );
        assert_eq!(list(&store).unwrap().len(), 1);
        assert!(revoke(&store, path).unwrap());
        assert!(!revoke(&store, path).unwrap());
        assert_eq!(check(&store, path, b"[network]\n").unwrap(), Trust::Untrusted);
    }
}
