//! The apply ledger: `stage/ledger.jsonl`, what has happened to each change.
//!
//! Append-only JSON Lines. Before files are written, an `intent` line for each
//! is made durable; after they are written and synced, an `applied` line with
//! the digest that landed. A crash between the two leaves intents without
//! outcomes, and the next apply knows those paths may hold pvisor's own
//! half-finished write rather than a user's edit. `dropped` lines record
//! discarded changes. `partial` lines record that some hunks of a modified
//! file were applied (`apply -p`): the host then holds content that is
//! neither the baseline nor the staged file, and that content (its digest and
//! size) is the path's baseline from then on; its intent says so too
//! (`partial: true`), so a crash between the two is settled by content. A torn final line (a crash mid-append) is ignored.
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
    /// Some hunks of the staged change are on the host (`blake3` and `size`
    /// are what the host now holds); the rest remain.
    Partial,
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
    /// Size of what was (or is about to be) written, on `partial` lines and
    /// their intents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// An intent of a partial (hunk) write.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
}

/// What the host holds at a path after some of its hunks were applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartialState {
    pub blake3: String,
    pub size: u64,
}

/// One line to append: what happened to `path`.
#[derive(Clone, Debug)]
pub struct Entry {
    pub path: RelPath,
    pub action: Action,
    pub blake3: Option<String>,
    pub forced: bool,
    /// For a hunk write's intent and outcome: what lands.
    pub partial: Option<PartialState>,
}

impl Entry {
    /// A whole-change line: intent, applied or dropped.
    pub fn new(path: RelPath, action: Action, blake3: Option<String>, forced: bool) -> Self {
        Self { path, action, blake3, forced, partial: None }
    }

    /// A hunk write's intent (`Action::Intent`) or outcome (`Action::Partial`).
    pub fn partial(path: RelPath, action: Action, state: PartialState) -> Self {
        Self { path, action, blake3: Some(state.blake3.clone()), forced: false, partial: Some(state) }
    }
}

/// The resolved state of one path according to the ledger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// An intent without an outcome: an apply was interrupted here. A hunk
    /// write's intent says what it was writing.
    Interrupted {
        partial: Option<PartialState>,
    },
    Applied,
    Dropped,
    /// Some hunks applied; the host holds this, the rest remain.
    Partial(PartialState),
}

impl Outcome {
    /// Applied or dropped: nothing of the change remains to decide.
    pub fn is_settled(&self) -> bool {
        matches!(self, Self::Applied | Self::Dropped)
    }
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
            let state = || PartialState {
                blake3: record.blake3.clone().unwrap_or_default(),
                size: record.size.unwrap_or_default(),
            };
            let outcome = match record.action {
                Action::Intent => Outcome::Interrupted { partial: record.partial.then(state) },
                Action::Applied => Outcome::Applied,
                Action::Dropped => Outcome::Dropped,
                Action::Partial => Outcome::Partial(state()),
            };
            out.insert(record.path, outcome);
        }
        Ok(out)
    }

    /// Appends records in one write, fsynced.
    pub fn append(&self, records: &[Entry]) -> Result<(), StageError> {
        if records.is_empty() {
            return Ok(());
        }
        let now = Timestamp::now();
        let mut buf = Vec::new();
        for entry in records {
            let record = LedgerRecord {
                format: FORMAT,
                time: now,
                path: entry.path.clone(),
                action: entry.action,
                blake3: entry.blake3.clone(),
                forced: entry.forced,
                run: Some(self.run.clone()),
                size: entry.partial.as_ref().map(|p| p.size),
                partial: entry.partial.is_some() && entry.action == Action::Intent,
            };
            buf.extend(serde_json::to_vec(&record).unwrap_or_default());
            buf.push(b'\n');
        }
        // append_line adds the final newline itself.
        buf.pop();
        store::append_line(&self.path, &buf, true).map_err(StageError::Record)
    }
}
