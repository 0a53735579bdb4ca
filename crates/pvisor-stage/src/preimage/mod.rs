//! Preimages: the conflict baseline of every changed path.
//!
//! A preimage is what the host held at a path before the sandbox first
//! modified it: absent, or kind + mode + size + BLAKE3. The `ns` executor's
//! lower layer *is* the live workspace, so there is no snapshot to compare
//! with; instead the run's start is the baseline
//! ([`baseline_now`]: the next tick of the clock that stamps ctime):
//! at sealing, a host entry whose ctime is older than the start is exactly what
//! the sandbox saw, so it is hashed then; an entry changed during the run has
//! no trustworthy baseline and is recorded `unknown`, which apply treats as a
//! conflict. ctime is checked again after hashing to close the race. This costs
//! O(changes), not O(workspace).
//!
//! Baselines are per path, so runs side by side on one workspace, each
//! applied as it ends, do not conflict over the directories they share. A
//! path the host lacks at sealing has the baseline *absent*, which stays
//! valid while nothing creates that path: another writer's new entries
//! beside it are no conflict, and apply compares the path itself (and checks
//! that its directories still lead to it, see `apply`). The one absent path
//! that may not have been absent when the run wrote it is a directory the
//! run found on the host (it wrote into it) that the host removed or renamed
//! since: overlayfs marks each directory it copies up (see [`CopyUps`]), so
//! such a directory is `unknown`; a stage without the marks keeps the older,
//! coarser rule for added directories (unknown when the nearest host
//! directory above changed during the run). A file the host deleted during
//! the run after the sandbox rewrote it cannot be told from a new one: apply
//! writes it back, and never over anything.
//!
//! Directories whose apply would remove host content (deleted, replaced
//! wholesale, or turned into something else) get a *tree digest* over
//! everything beneath them, so a file the user edited inside such a directory
//! after the run is a conflict, not a casualty; an entry beneath changed
//! during the run makes the directory `unknown`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use pvisor_core::records::{ChangeEntry, ChangeKind, EntryType};
use pvisor_core::store::RelPath;

use crate::beneath::{Kind, Root};
use crate::StageError;

/// The run's baseline, in ns since the epoch on the clock filesystems stamp
/// ctime with (`CLOCK_REALTIME_COARSE`): the *next* tick of that clock.
///
/// An entry changed before the clock reaches it has a ctime below it; the
/// command must not start until the clock has reached it (see
/// [`pvisor_core::time::coarse_realtime_ns`]; the `ns` sandbox waits for it, a VM boots for longer), so
/// every change made while the command runs has a ctime at or after it, the
/// coarse clock never going back. Taking the current tick instead would count
/// an edit made just before the run, in the same tick, as made during it: a
/// false conflict on timestamps alone (git's "racy" entries), seen in 1 of
/// 6-17 run → fork → apply trials on a fresh workspace.
pub fn baseline_now() -> i128 {
    let resolution = rustix::time::clock_getres(rustix::time::ClockId::RealtimeCoarse);
    let tick = (i128::from(resolution.tv_sec) * 1_000_000_000 + i128::from(resolution.tv_nsec))
        .clamp(1, 100_000_000);
    pvisor_core::time::coarse_realtime_ns() + tick
}

/// What the host held at a path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum HostState {
    Absent,
    Present {
        entry: EntryType,
        mode: u32,
        size: u64,
        /// File contents, symlink target, or (for directories whose apply
        /// removes content) the tree digest; else null.
        blake3: Option<String>,
    },
}

/// A path's baseline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "baseline", rename_all = "snake_case")]
pub enum Preimage {
    Known(HostState),
    /// The host changed the path (or its directory) while the run was live.
    Unknown {
        reason: String,
    },
}

/// One line of `stage/preimages.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreimageEntry {
    pub path: RelPath,
    pub preimage: Preimage,
}

/// `stage/preimages.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preimages {
    pub format: u32,
    /// The baseline instant (ns since the epoch): entries older than it are trusted.
    pub baseline_ns: i128,
    pub entries: Vec<PreimageEntry>,
    /// `CLOCK_REALTIME_COARSE` when sealing began (0: unknown). A staged file
    /// whose ctime is older was last changed before the manifest hashed it,
    /// so its manifest digest still holds and apply may reflink it without
    /// reading it again (any later write would have moved its ctime past this).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sealed_ns: i128,
}

fn is_zero(n: &i128) -> bool {
    *n == 0
}

impl pvisor_core::records::Record for Preimages {
    const FILE: &'static str = "preimages.json";
    fn format(&self) -> u32 {
        self.format
    }
}

impl Preimages {
    /// No baselines at all (a stage sealed without them, or imported).
    pub fn none() -> Self {
        Self { format: 1, baseline_ns: 0, entries: Vec::new(), sealed_ns: 0 }
    }

    /// Returns the preimage of `path`, if one was captured.
    pub fn get(&self, path: &RelPath) -> Option<&Preimage> {
        self.entries.binary_search_by(|e| e.path.cmp(path)).ok().map(|i| &self.entries[i].preimage)
    }
}

fn entry_type(kind: Kind) -> EntryType {
    match kind {
        Kind::File => EntryType::File,
        Kind::Dir => EntryType::Dir,
        Kind::Symlink => EntryType::Symlink,
        Kind::Special => EntryType::Special,
    }
}

/// Whether applying `change` over a host *directory* would remove what is
/// beneath it: the staged entry is not a directory (a deletion, a type change,
/// or a file written where the host has a directory — e.g. inside an opaque
/// directory), or the directory replaces the host's wholesale.
fn removes_tree(change: &ChangeEntry) -> bool {
    change.entry != EntryType::Dir || change.kind == ChangeKind::OpaqueDir
}

/// What reading a path against a baseline found: its state, or that the
/// host changed it (or, for a directory, an entry `beneath` it) after the
/// baseline, so no state read now is its baseline.
#[derive(Debug)]
enum Observed<T> {
    Stable(T),
    ChangedLive { beneath: PathBuf },
}

/// Why a path changed live has no known preimage, as [`Preimage::Unknown`]
/// records it.
fn changed_live(beneath: &Path) -> String {
    if beneath.as_os_str().is_empty() {
        "changed on the host while the run was live".into()
    } else {
        format!("{} changed on the host while the run was live", beneath.display())
    }
}

/// Reads the host state of `rel`. Directories get a tree digest when
/// `tree` is set. With `baseline`, any entry newer than it makes the result
/// [`Observed::ChangedLive`] instead.
fn observe(
    root: &Root,
    rel: &Path,
    tree: bool,
    baseline: Option<i128>,
) -> Result<Observed<HostState>, StageError> {
    let io = |e| StageError::io("inspect", rel, e);
    let Some(st) = root.stat(rel).map_err(io)? else { return Ok(Observed::Stable(HostState::Absent)) };
    if let Some(b) = baseline {
        if st.ctime_ns >= b {
            return Ok(Observed::ChangedLive { beneath: PathBuf::new() });
        }
    }
    // A host directory that apply would remove is fingerprinted in full, so an
    // edit anywhere beneath it is a conflict rather than a casualty.
    let blake3 = match st.kind {
        Kind::File => Some(pvisor_core::digest::digest(&root.open_file(rel).map_err(io)?).map_err(io)?),
        Kind::Symlink => Some(blake3::hash(&root.read_link(rel).map_err(io)?).to_hex().to_string()),
        Kind::Dir if tree => match tree_digest(root, rel, baseline)? {
            Observed::Stable(d) => Some(d),
            Observed::ChangedLive { beneath } => return Ok(Observed::ChangedLive { beneath }),
        },
        Kind::Dir | Kind::Special => None,
    };
    let size = if st.kind == Kind::Dir { 0 } else { st.size };
    Ok(Observed::Stable(HostState::Present { entry: entry_type(st.kind), mode: st.mode, size, blake3 }))
}

/// BLAKE3 over every entry beneath `rel`: sorted names, kinds, modes and contents.
fn tree_digest(root: &Root, rel: &Path, baseline: Option<i128>) -> Result<Observed<String>, StageError> {
    let mut hasher = blake3::Hasher::new();
    let mut stack: Vec<PathBuf> = vec![PathBuf::new()];
    while let Some(sub) = stack.pop() {
        let dir = rel.join(&sub);
        let mut names = root.list(&dir).map_err(|e| StageError::io("list", &dir, e))?;
        names.sort();
        for name in names {
            let child_rel = sub.join(&name);
            match observe(root, &rel.join(&child_rel), false, baseline)? {
                // Entries beneath are read without a tree: what changed is the entry itself.
                Observed::ChangedLive { .. } => return Ok(Observed::ChangedLive { beneath: child_rel }),
                Observed::Stable(state) => {
                    use std::os::unix::ffi::OsStrExt;
                    hasher.update(child_rel.as_os_str().as_bytes());
                    hasher.update(&[0]);
                    hasher.update(serde_json::to_string(&state).unwrap_or_default().as_bytes());
                    if matches!(state, HostState::Present { entry: EntryType::Dir, .. }) {
                        stack.push(child_rel);
                    }
                }
            }
        }
    }
    Ok(Observed::Stable(hasher.finalize().to_hex().to_string()))
}

/// Returns the current host state of `change`'s path.
pub fn host_state(root: &Root, change: &ChangeEntry) -> Result<HostState, StageError> {
    // Without a baseline nothing is "changed live".
    Ok(match observe(root, change.path.as_path(), removes_tree(change), None)? {
        Observed::Stable(state) => state,
        Observed::ChangedLive { .. } => HostState::Absent,
    })
}

/// The state the stage holds for `change`, in the same terms as a host state.
pub fn staged_state(change: &ChangeEntry) -> HostState {
    match change.entry {
        EntryType::None => HostState::Absent,
        entry => HostState::Present {
            entry,
            mode: change.mode,
            size: if entry == EntryType::Dir { 0 } else { change.size },
            blake3: if entry == EntryType::Dir { None } else { change.blake3.clone() },
        },
    }
}

/// Whether two states are the same for conflict purposes: directories compare
/// by kind, mode and tree digest (present on both sides or on neither).
pub fn same_state(a: &HostState, b: &HostState) -> bool {
    match (a, b) {
        (HostState::Absent, HostState::Absent) => true,
        (
            HostState::Present { entry: ea, mode: ma, size: sa, blake3: ba },
            HostState::Present { entry: eb, mode: mb, size: sb, blake3: bb },
        ) => {
            if ea != eb || ma != mb {
                return false;
            }
            if *ea == EntryType::Dir {
                // A tree digest on one side only never matches: content that
                // apply would remove must be compared, not assumed.
                return ba == bb;
            }
            sa == sb && ba == bb
        }
        (HostState::Absent, HostState::Present { .. }) | (HostState::Present { .. }, HostState::Absent) => {
            false
        }
    }
}

/// What a stage tells of the added directories the run found on the host.
#[derive(Clone, Copy, Debug)]
pub enum CopyUps<'a> {
    /// The overlay wrote the stage and marked every directory it copied up
    /// from the workspace; these (sorted) are the ones the host no longer
    /// has: it removed or renamed them after the run wrote into them.
    Marked(&'a [RelPath]),
    /// The stage carries no marks (exported from a VM, or restored from a
    /// checkpoint): an added directory may be one the run found.
    Unmarked,
}

/// Why a directory the run wrote into has no baseline.
const LOST_DIRECTORY: &str =
    "the run wrote into this directory, which the host removed or renamed while the run was live";

/// Captures the preimage of every change, against `baseline` (from
/// [`baseline_now`] at the start of the run).
pub fn capture(
    workspace: &Path,
    changes: &[ChangeEntry],
    copy_ups: CopyUps<'_>,
    baseline: i128,
) -> Result<Preimages, StageError> {
    let root = Root::open(workspace).map_err(|e| StageError::io("open", workspace, e))?;
    let mut entries = Vec::with_capacity(changes.len());
    let mut missing = None;
    for change in changes {
        let rel = change.path.as_path();
        let first = observe(&root, rel, removes_tree(change), Some(baseline))?;
        let preimage = match first {
            Observed::ChangedLive { beneath } => Preimage::Unknown { reason: changed_live(&beneath) },
            Observed::Stable(HostState::Absent) => {
                absent_preimage(&root, change, copy_ups, baseline, &mut missing)?
            }
            Observed::Stable(state) => {
                // Re-check after hashing: an edit during the hash makes it untrustworthy.
                match root.stat(rel).map_err(|e| StageError::io("inspect", rel, e))? {
                    Some(st) if st.ctime_ns < baseline => Preimage::Known(state),
                    _ => {
                        Preimage::Unknown { reason: "changed on the host while its baseline was read".into() }
                    }
                }
            }
        };
        entries.push(PreimageEntry { path: change.path.clone(), preimage });
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Preimages { format: pvisor_core::records::FORMAT, baseline_ns: baseline, entries, sealed_ns: 0 })
}

/// The baseline of a change whose path the host lacks: absent, which stays
/// valid while nothing creates the path (apply checks the path itself, so
/// what others add beside it is no conflict), except where the host may
/// have held the path while the run wrote it:
/// - a change the scan found a host entry for, gone since;
/// - a directory the run wrote into that the host removed or renamed since
///   (marked copied up; without marks, any added directory whose nearest
///   host directory changed during the run).
fn absent_preimage(
    root: &Root,
    change: &ChangeEntry,
    copy_ups: CopyUps<'_>,
    baseline: i128,
    missing: &mut Option<Missing>,
) -> Result<Preimage, StageError> {
    if change.kind != ChangeKind::Added {
        return Ok(Preimage::Unknown { reason: "removed on the host while the run was sealed".into() });
    }
    if change.entry != EntryType::Dir {
        return Ok(Preimage::Known(HostState::Absent));
    }
    match copy_ups {
        CopyUps::Marked(lost) if lost.binary_search(&change.path).is_ok() => {
            Ok(Preimage::Unknown { reason: LOST_DIRECTORY.into() })
        }
        CopyUps::Marked(_) => Ok(Preimage::Known(HostState::Absent)),
        CopyUps::Unmarked => unmarked_directory(root, change.path.as_path(), baseline, missing),
    }
}

/// A directory the host lacks, the highest of the last absent path's, and
/// the verdict of the nearest existing directory above it: every path
/// beneath it shares that verdict.
struct Missing {
    top: PathBuf,
    verdict: Preimage,
}

/// An added directory of a stage without copy-up marks: absent is a
/// trustworthy baseline only if its nearest existing directory did not
/// change during the run (no create, delete or rename there), for it may
/// be a directory the run found and the host removed.
/// `missing` carries the last verdict, so the 10,000 directories of a new
/// tree 10,000 deep climb to their nearest existing directory once,
/// not once each (which was quadratic in the depth, cubic in all).
fn unmarked_directory(
    root: &Root,
    rel: &Path,
    baseline: i128,
    missing: &mut Option<Missing>,
) -> Result<Preimage, StageError> {
    if let (Some(m), Some(parent)) = (missing.as_ref(), rel.parent()) {
        if parent.starts_with(&m.top) {
            return Ok(m.verdict.clone());
        }
    }
    let mut top: Option<&Path> = None;
    let mut dir = rel.parent();
    let verdict = loop {
        let st = match dir {
            Some(d) if !d.as_os_str().is_empty() => {
                root.stat(d).map_err(|e| StageError::io("inspect", d, e))?
            }
            _ => Some(root.stat_root().map_err(|e| StageError::io("inspect", "workspace root", e))?),
        };
        match st {
            Some(st) if st.ctime_ns >= baseline => {
                let name = dir
                    .filter(|d| !d.as_os_str().is_empty())
                    .map_or("the workspace root".into(), |d| d.display().to_string());
                break Preimage::Unknown {
                    reason: format!("its directory {name} changed on the host while the run was live"),
                };
            }
            Some(_) => break Preimage::Known(HostState::Absent),
            None => {
                top = dir;
                dir = dir.and_then(Path::parent);
            }
        }
    };
    if let Some(top) = top.filter(|t| !t.as_os_str().is_empty()) {
        *missing = Some(Missing { top: top.to_path_buf(), verdict: verdict.clone() });
    }
    Ok(verdict)
}

#[cfg(test)]
mod tests;
