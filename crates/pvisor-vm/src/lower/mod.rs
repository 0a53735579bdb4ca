//! The workspace's disks for a vm Job: a cached base image per workspace
//! ([`base`]), and a small per-start delta of what changed since it was
//! built ([`delta`]), found by comparing a stat-only walk against the
//! base's metadata [`index`]. A start costs a walk plus a copy of the
//! changed files instead of an image of the whole workspace.
//!
//! The honesty rule: the guest must never see a stale file. An entry counts
//! as unchanged only if its stat is identical to the index's and it was
//! stamped before the base build started (less [`base::RACY_MARGIN_NS`]);
//! anything else goes into the delta. When the delta grows past
//! [`REBASE_ENTRIES`] entries or a quarter of the base's bytes, the base is
//! rebuilt instead (a `tracing` info line says so and why).

mod base;
mod delta;
mod index;

use std::fs;
use std::io;
use std::path::Path;
use std::time::Instant;

use serde::Serialize;

pub use base::{lower_caches, LowerCache, LOWERS_DIR};

use base::{BaseManifest, CacheLock};
use index::{Diff, Entry};

/// The staging tree of the delta, in the Attempt's `vm/` directory.
pub const DELTA_STAGING: &str = "delta-staging";
/// The staging tree of a userland image's delta (`--image`), beside it.
pub const IMAGE_DELTA_STAGING: &str = "image-delta-staging";

/// A delta of more entries than this (changed plus deleted) rebuilds the base.
pub(crate) const REBASE_ENTRIES: usize = 2000;
/// A delta copying more than `1 / REBASE_FRACTION` of the base's file bytes rebuilds it.
const REBASE_FRACTION: u64 = 4;

/// What one start did, for the Attempt's facts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Prepared {
    /// The base image used.
    pub base: String,
    /// Why the base was built during this start (none: it was reused).
    pub rebuilt: Option<String>,
    /// Entries in the delta layer, and bytes of the files copied into it.
    pub delta_entries: usize,
    pub delta_bytes: u64,
    /// Index paths gone from the workspace (whited out by the guest).
    pub deleted: usize,
    pub prepare_ms: u64,
}

/// A base that can be used, and the workspace compared against it.
struct Ready {
    base: BaseManifest,
    current: Vec<Entry>,
    diff: Diff,
}

/// Makes `lower` (a hard link to the workspace's published base image) and
/// `delta` (this start's delta image, staged in `staging`) for a vm Job on
/// `workspace`, rebuilding the cached base under `state_root` when needed.
pub(crate) fn prepare(
    state_root: &Path,
    workspace: &Path,
    lower: &Path,
    delta: &Path,
    staging: &Path,
) -> io::Result<Prepared> {
    let started = Instant::now();
    let workspace = fs::canonicalize(workspace)?;
    let dir = base::cache_dir(state_root, &workspace);
    // A file that vanishes between the walk and its copy: the workspace
    // changed underfoot, and a fresh walk gives a consistent picture.
    let mut tries = 0;
    loop {
        match attempt(&dir, &workspace, lower, delta, staging) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && tries < 2 => tries += 1,
            Err(e) => return Err(e),
            Ok(mut prepared) => {
                prepared.prepare_ms = started.elapsed().as_millis() as u64;
                tracing::info!(
                    base = %prepared.base,
                    rebuilt = prepared.rebuilt.as_deref().unwrap_or("no"),
                    delta_entries = prepared.delta_entries,
                    delta_bytes = prepared.delta_bytes,
                    deleted = prepared.deleted,
                    elapsed_ms = prepared.prepare_ms,
                    "workspace disks ready"
                );
                return Ok(prepared);
            }
        }
    }
}

fn attempt(dir: &Path, workspace: &Path, lower: &Path, delta: &Path, staging: &Path) -> io::Result<Prepared> {
    let began_ns = base::now_ns();
    let mut lock = CacheLock::take(dir, false)?;
    let mut exclusive = false;
    let mut rebuilt = None;
    let ready = loop {
        let (ready, why) = judge(base::load(dir, workspace), index::walk(workspace)?);
        match (ready, why) {
            (Some(ready), None) => break ready,
            // Built since this start began (by us, or by another start we
            // waited for), and still over the threshold: what changed is
            // racy against any base built now (the workspace was written in
            // the last seconds). The delta carries it; a later start rebases.
            (Some(ready), Some(_)) if ready.base.build_start_ns >= began_ns => break ready,
            (_, Some(why)) if !exclusive => {
                // Judge again under the exclusive lock: another start may
                // have rebuilt while we waited.
                drop(lock);
                lock = CacheLock::take(dir, true)?;
                exclusive = true;
                tracing::debug!(reason = %why, "workspace base unusable; taking the build lock");
            }
            (_, Some(why)) if rebuilt.is_none() => {
                tracing::info!(workspace = %workspace.display(), reason = %why, "rebuilding the workspace base image");
                base::build(dir, workspace)?;
                rebuilt = Some(why);
            }
            (_, why) => {
                let why = why.unwrap_or_default();
                return Err(io::Error::other(format!("the freshly built base image cannot be used: {why}")));
            }
        }
    };
    let _ = fs::remove_file(lower);
    crate::disk::link_or_copy(&base::image_path(dir, &ready.base.id), lower)?;
    lock.touch();
    drop(lock);
    let size = delta::build(workspace, &ready.current, &ready.diff, staging, delta)?;
    Ok(Prepared {
        base: ready.base.id,
        rebuilt,
        delta_entries: size.entries,
        delta_bytes: size.bytes,
        deleted: ready.diff.deleted.len(),
        prepare_ms: 0,
    })
}

/// Whether the base can serve this start: the comparison if there is a
/// base, and a reason to rebuild if it should not be used as is.
fn judge(
    found: Result<(BaseManifest, Vec<Entry>), base::BaseError>,
    current: Vec<Entry>,
) -> (Option<Ready>, Option<String>) {
    let (base, index) = match found {
        Ok(found) => found,
        Err(why) => return (None, Some(why.to_string())),
    };
    let diff = index::diff(&index, &current, base.clean_before_ns);
    let entries = diff.changed.len() + diff.deleted.len();
    let why = rebase_reason(entries, delta::changed_bytes(&current, &diff), base.file_bytes);
    (Some(Ready { base, current, diff }), why)
}

/// Why a delta of `entries` entries and `bytes` file bytes over a base of
/// `base_bytes` should be a new base instead, if it should.
fn rebase_reason(entries: usize, bytes: u64, base_bytes: u64) -> Option<String> {
    if entries > REBASE_ENTRIES {
        Some(format!("{entries} entries changed since the base was built (over {REBASE_ENTRIES})"))
    } else if bytes > base_bytes / REBASE_FRACTION {
        Some(format!("{bytes} bytes changed since the base was built (over a quarter of its {base_bytes})"))
    } else {
        None
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
