//! The apply ledger: `stage/ledger.jsonl`, what has happened to each change.
//!
//! Append-only JSON Lines. Before files are written, an `intent` line for each
//! is made durable; after they are written and synced, an `applied` line with
//! the digest that landed. A crash between the two leaves intents without
//! outcomes, and the next apply knows those paths may hold pvisor's own
//! half-finished write rather than a user's edit. `dropped` lines record
//! discarded changes. A torn final line (a crash mid-append) is ignored.
//! Each line names its Run, so a ledger swapped in from another Job is
//! refused instead of telling this Job's story.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use pvisor_core::ids::RunId;
use pvisor_core::records::FORMAT;
use pvisor_core::store::{self, RelPath};
use pvisor_core::time::Timestamp;

use crate::StageError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// About to write this path.
    Intent,
    /// The staged change is on the host.
    Applied,
    /// The staged change was discarded.
    Dropped,
}

/// One ledger line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerRecord {
    pub format: u32,
    pub time: Timestamp,
    pub path: RelPath,
    pub action: Action,
    /// The digest of what was (or is about to be) written, when it is content.
    pub blake3: Option<String>,
    /// Applied over a conflict with `--force`.
    #[serde(default)]
    pub forced: bool,
    /// The Run whose stage this is (absent in ledgers written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunId>,
}

/// The resolved state of one path according to the ledger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// An intent without an outcome: an apply was interrupted here.
    Interrupted,
    Applied,
    Dropped,
}

/// The stage's ledger file.
#[derive(Debug, Clone)]
pub struct Ledger {
    path: PathBuf,
    run: RunId,
}

impl Ledger {
    /// The ledger of `run`'s stage directory.
    pub fn new(stage_dir: &Path, run: &RunId) -> Self {
        Self { path: stage_dir.join("ledger.jsonl"), run: run.clone() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads every path's latest outcome.
    pub fn outcomes(&self) -> Result<BTreeMap<RelPath, Outcome>, StageError> {
        let bytes = match store::read_capped(&self.path, store::RECORD_READ_CAP) {
            Ok(b) => b,
            Err(e) if e.is_not_found() => return Ok(BTreeMap::new()),
            Err(e) => return Err(StageError::Record(e)),
        };
        let mut out = BTreeMap::new();
        let lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()).collect();
        let torn_tail = !bytes.ends_with(b"\n");
        for (i, line) in lines.iter().enumerate() {
            let record: LedgerRecord = match serde_json::from_slice(line) {
                Ok(r) => r,
                Err(_) if torn_tail && i + 1 == lines.len() => break,
                Err(source) => {
                    return Err(StageError::Record(store::StoreError::Corrupt {
                        path: self.path.clone(),
                        what: "ledger.jsonl",
                        source,
                    }))
                }
            };
            if let Some(found) = record.run.as_ref().filter(|r| **r != self.run) {
                return Err(StageError::ForeignLedger {
                    path: self.path.clone(),
                    line: i + 1,
                    found: found.to_string(),
                    expected: self.run.to_string(),
                });
            }
            let outcome = match record.action {
                Action::Intent => Outcome::Interrupted,
                Action::Applied => Outcome::Applied,
                Action::Dropped => Outcome::Dropped,
            };
            out.insert(record.path, outcome);
        }
        Ok(out)
    }

    /// Appends records in one write, fsynced.
    pub fn append(&self, records: &[(RelPath, Action, Option<String>, bool)]) -> Result<(), StageError> {
        if records.is_empty() {
            return Ok(());
        }
        let now = Timestamp::now();
        let mut buf = Vec::new();
        for (path, action, blake3, forced) in records {
            let record = LedgerRecord {
                format: FORMAT,
                time: now,
                path: path.clone(),
                action: *action,
                blake3: blake3.clone(),
                forced: *forced,
                run: Some(self.run.clone()),
            };
            buf.extend(serde_json::to_vec(&record).unwrap_or_default());
            buf.push(b'\n');
        }
        // append_line adds the final newline itself.
        buf.pop();
        store::append_line(&self.path, &buf, true).map_err(StageError::Record)
    }
}
