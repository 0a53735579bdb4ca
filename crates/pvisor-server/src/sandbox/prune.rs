//! `pvisor gc`'s share of the daemon's state: the records
//! (`server/sandboxes/<id>.json`, `.log`, `.bind`) of sandboxes that ended
//! longer ago than gc's age and whose Job no longer runs.
//!
//! A running daemon prunes its own records (an hour after they end); gc
//! prunes only while no daemon holds `server/daemon.lock`, which it holds
//! itself meanwhile, so the two never race over one record. A record that
//! cannot be parsed is kept and named: it may be the only trace of a sandbox.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use pvisor_core::ids::JobId;
use pvisor_core::store::OwnerLock;

use super::SandboxRecord;

/// What gc did with the daemon's records.
#[derive(Debug, Default)]
pub struct Pruning {
    /// Each sandbox whose files went (or would go): its id, files and bytes.
    pub pruned: Vec<(String, Vec<PathBuf>, u64)>,
    /// What was kept, and why.
    pub kept: Vec<(String, String)>,
}

/// Prunes the records under `state_root` of sandboxes that ended more than
/// `age` ago and whose Job `is_live` does not call live. With `dry_run`,
/// only says what would go.
pub fn prune_records(
    state_root: &Path,
    age: Duration,
    dry_run: bool,
    is_live: &dyn Fn(&JobId) -> bool,
) -> std::io::Result<Pruning> {
    let server = state_root.join("server");
    let dir = server.join("sandboxes");
    let mut pruning = Pruning::default();
    if !dir.is_dir() {
        return Ok(pruning);
    }
    let Ok(_lock) = OwnerLock::acquire(&server.join("daemon.lock")) else {
        pruning
            .kept
            .push(("sandbox records".into(), "a pvisor serve daemon is running; it prunes its own".into()));
        return Ok(pruning);
    };
    let now = SystemTime::now();
    for entry in fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let id = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_owned();
        let record = match fs::read(&path).map(|b| serde_json::from_slice::<SandboxRecord>(&b)) {
            Ok(Ok(record)) => record,
            _ => {
                pruning.kept.push((
                    format!("sandbox record {id}"),
                    "unreadable; move it away if nothing runs it".into(),
                ));
                continue;
            }
        };
        let ended_long_ago = record.state.is_final() && record.last_transition_at.system_time() + age <= now;
        if !ended_long_ago || record.job.as_ref().is_some_and(is_live) {
            continue;
        }
        let files: Vec<PathBuf> = ["json", "log", "bind"]
            .iter()
            .map(|ext| dir.join(format!("{id}.{ext}")))
            .filter(|p| p.exists())
            .collect();
        let bytes = files.iter().filter_map(|p| fs::metadata(p).ok()).map(|m| m.len()).sum();
        if !dry_run {
            // The record last: a gc killed midway leaves it to be pruned again.
            for file in files.iter().rev() {
                fs::remove_file(file)?;
            }
        }
        pruning.pruned.push((id, files, bytes));
    }
    Ok(pruning)
}
