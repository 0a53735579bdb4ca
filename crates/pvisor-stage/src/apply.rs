//! Applying staged changes to the workspace.
//!
//! Three steps, each usable alone (the CLI's `--dry-run` stops after the second):
//! 1. [`select`] turns paths and globs into change indices (a directory
//!    selects everything beneath it) and adds ancestors that must exist first;
//! 2. [`plan`] compares each selected path's host state with its preimage
//!    (and, where an entry is to be created, checks that the directories
//!    above it still lead there: see [`Parents`]) and gives a [`Verdict`]:
//!    apply, already applied, conflict, or unsupported;
//! 3. [`execute`] writes the plan beneath the workspace root (see
//!    `beneath.rs`), recording intents before and outcomes after in the ledger,
//!    with one `syncfs` between them.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use pvisor_core::records::{ChangeEntry, ChangeKind, EntryType};
use pvisor_core::store::RelPath;

use crate::beneath::{self, Kind, Root};
use crate::glob;
use crate::ledger::{Action, Entry, Ledger, Outcome, PartialState};
use crate::preimage::{host_state, same_state, staged_state, HostState, Preimage, Preimages};
use crate::StageError;

/// A selection pattern that matched no staged change, or is no pattern.
#[derive(Debug, thiserror::Error)]
pub enum NoMatch {
    #[error("No staged change matches {pattern:?}; `pvisor review` lists them")]
    Nothing { pattern: String },
    #[error(transparent)]
    BadPattern(#[from] glob::BadPattern),
}

/// Selects the changes named by `patterns` (workspace-relative paths or globs).
/// An empty pattern list selects everything. Returns sorted indices.
pub fn select(changes: &[ChangeEntry], patterns: &[String]) -> Result<Vec<usize>, NoMatch> {
    if patterns.is_empty() {
        return Ok((0..changes.len()).collect());
    }
    let mut chosen = std::collections::BTreeSet::new();
    for pattern in patterns {
        let trimmed = pattern.trim_end_matches('/');
        let trimmed = trimmed.strip_prefix("./").unwrap_or(trimmed);
        let compiled = glob::is_glob(trimmed).then(|| glob::Pattern::new(trimmed)).transpose()?;
        let before = chosen.len();
        let mut any = false;
        for (i, change) in changes.iter().enumerate() {
            let path = change.path.as_path().as_os_str().as_bytes();
            let hit = if let Some(glob) = &compiled {
                glob.matches(path)
            } else {
                trimmed.is_empty()
                    || path == trimmed.as_bytes()
                    || (path.starts_with(trimmed.as_bytes()) && path.get(trimmed.len()) == Some(&b'/'))
            };
            if hit {
                any = true;
                chosen.insert(i);
            }
        }
        if !any && chosen.len() == before {
            return Err(NoMatch::Nothing { pattern: pattern.clone() });
        }
    }
    Ok(chosen.into_iter().collect())
}

/// Adds the changes to ancestor directories that must be applied for a
/// selected child to have a parent on the host (an added directory, or a
/// file that became a directory). Returns `(index, implied)` sorted by path.
pub fn with_required_ancestors(
    ws: &Root,
    changes: &[ChangeEntry],
    selected: &[usize],
) -> Result<Vec<(usize, bool)>, StageError> {
    let by_path: BTreeMap<&Path, usize> =
        changes.iter().enumerate().map(|(i, c)| (c.path.as_path(), i)).collect();
    let mut out: BTreeMap<usize, bool> = selected.iter().map(|&i| (i, false)).collect();
    let mut host_is_dir: BTreeMap<&Path, bool> = BTreeMap::new();
    for &i in selected {
        let mut parent = changes[i].path.as_path().parent();
        while let Some(dir) = parent.filter(|p| !p.as_os_str().is_empty()) {
            if let Some(&j) = by_path.get(dir) {
                let is_dir = match host_is_dir.get(dir) {
                    Some(&known) => known,
                    None => {
                        let st = ws.stat(dir).map_err(|e| StageError::io("inspect", dir, e))?;
                        let known = st.map(|s| s.kind) == Some(Kind::Dir);
                        host_is_dir.insert(dir, known);
                        known
                    }
                };
                if !is_dir && changes[j].entry == EntryType::Dir {
                    out.entry(j).or_insert(true);
                }
            }
            parent = dir.parent();
        }
    }
    let mut list: Vec<(usize, bool)> = out.into_iter().collect();
    list.sort_by(|a, b| changes[a.0].path.cmp(&changes[b.0].path));
    Ok(list)
}

/// What apply will do with one change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The host still holds the baseline (or `--force`): write it.
    Apply { forced: bool },
    /// The host already holds exactly the staged state.
    AlreadyApplied,
    /// The host no longer holds the baseline; refused without `--force`.
    Conflict(String),
    /// Never applied (device nodes, fifos, sockets).
    Unsupported(String),
}

/// One planned change.
#[derive(Clone, Debug)]
pub struct Planned {
    pub change: ChangeEntry,
    pub verdict: Verdict,
    /// Included because a selected path needs it, not named by the user.
    pub implied: bool,
}

fn describe(state: &HostState) -> String {
    match state {
        HostState::Absent => "absent".into(),
        HostState::Present { entry, mode, size, blake3 } => {
            let kind = match entry {
                EntryType::File => "file",
                EntryType::Dir => "directory",
                EntryType::Symlink => "symlink",
                EntryType::Special => "special file",
                EntryType::None => "nothing",
            };
            let digest =
                blake3.as_deref().map(|d| format!(", blake3 {}…", &d[..d.len().min(12)])).unwrap_or_default();
            if *entry == EntryType::Dir {
                format!("{kind} {mode:o}{digest}")
            } else {
                format!("{kind} {mode:o}, {size} bytes{digest}")
            }
        }
    }
}

/// The directories staged changes hang from: a staged entry lands only
/// where each directory above it is a real directory on the host or one the
/// stage itself puts there. Host directories are looked at once each.
#[derive(Debug)]
pub struct Parents<'a> {
    /// Directories the stage puts in place (added, or replacing an entry).
    staged: BTreeSet<&'a Path>,
    /// Host directories looked at, with what stands in the way there.
    seen: BTreeMap<PathBuf, Option<String>>,
    /// Staged directories the host was found not to hold at all: nothing
    /// beneath them is looked for on the host (a stage that adds a tree of
    /// 10,000 files made 10,000 failed lookups of its directory).
    absent: BTreeSet<&'a Path>,
}

impl<'a> Parents<'a> {
    /// For `changes`: those an apply may still write (not yet applied or dropped).
    pub fn new(changes: impl IntoIterator<Item = &'a ChangeEntry>) -> Self {
        let staged =
            changes.into_iter().filter(|c| c.entry == EntryType::Dir).map(|c| c.path.as_path()).collect();
        Self { staged, seen: BTreeMap::new(), absent: BTreeSet::new() }
    }

    /// What the host holds at `change`: known to be nothing when a
    /// directory above it was found absent in this pass, else looked at.
    fn host_state(&mut self, ws: &Root, change: &'a ChangeEntry) -> Result<HostState, StageError> {
        let path = change.path.as_path();
        let host = match path.parent().is_some_and(|parent| self.absent.contains(parent)) {
            true => HostState::Absent,
            false => host_state(ws, change)?,
        };
        if change.entry == EntryType::Dir && matches!(host, HostState::Absent) {
            self.absent.insert(path);
        }
        Ok(host)
    }

    /// Why `rel` cannot land where the run wrote it: the directory above it
    /// is not one the stage creates, and the host no longer holds it as a
    /// directory (removed, or replaced by a symlink or a file, which apply
    /// never follows nor writes through).
    fn obstruction(&mut self, ws: &Root, rel: &Path) -> Result<Option<String>, StageError> {
        let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) else { return Ok(None) };
        if self.staged.contains(parent) {
            return Ok(None);
        }
        if let Some(known) = self.seen.get(parent) {
            return Ok(known.clone());
        }
        let found = match ws.stat(parent).map_err(|e| StageError::io("inspect", parent, e))? {
            Some(st) if st.kind == Kind::Dir => None,
            _ => Some(highest_not_a_directory(ws, parent)?),
        };
        self.seen.insert(parent.to_path_buf(), found.clone());
        Ok(found)
    }
}

/// What the host holds, from the top, at the first of `dir` and the
/// directories above it that is not a directory.
fn highest_not_a_directory(ws: &Root, dir: &Path) -> Result<String, StageError> {
    let mut ancestors: Vec<&Path> = dir.ancestors().filter(|a| !a.as_os_str().is_empty()).collect();
    ancestors.reverse();
    for at in ancestors {
        let held = match ws.stat(at).map_err(|e| StageError::io("inspect", at, e))?.map(|s| s.kind) {
            Some(Kind::Dir) => continue,
            None => "is no longer on the host",
            Some(Kind::Symlink) => "is now a symlink on the host",
            Some(Kind::File) => "is now a file on the host",
            Some(Kind::Special) => "is now a special file on the host",
        };
        return Ok(format!("its directory {} {held}", at.display()));
    }
    // Each was a directory when looked at again: changing as we look.
    Ok(format!("its directory {} changed on the host while apply looked at it", dir.display()))
}

/// Decides what to do with `change` given the host's current state.
pub fn verdict<'a>(
    ws: &Root,
    change: &'a ChangeEntry,
    parents: &mut Parents<'a>,
    preimage: Option<&Preimage>,
    outcome: Option<&Outcome>,
    force: bool,
) -> Result<Verdict, StageError> {
    if change.entry == EntryType::Special {
        return Ok(Verdict::Unsupported(
            "a device node, fifo or socket; pvisor never creates these in the workspace".into(),
        ));
    }
    if change.path.as_path().iter().any(beneath::is_temporary) {
        return Ok(Verdict::Unsupported(format!(
            "a name beginning with `{}` is apply's own temporary; pvisor never writes one (rename it in a new run to keep it)",
            beneath::TEMP_PREFIX
        )));
    }
    let host = parents.host_state(ws, change)?;
    if change.kind != ChangeKind::OpaqueDir && same_state(&host, &staged_state(change)) {
        return Ok(Verdict::AlreadyApplied);
    }
    // Where the host has nothing, an entry is to be created: its directories
    // must still lead to it (an absent baseline says nothing about them).
    let obstruction = match (&host, change.entry) {
        (HostState::Absent, entry) if entry != EntryType::None => {
            parents.obstruction(ws, change.path.as_path())?
        }
        _ => None,
    };
    Ok(match obstruction.or_else(|| baseline_conflict(&host, preimage, outcome)) {
        None => Verdict::Apply { forced: false },
        Some(_) if force => Verdict::Apply { forced: true },
        Some(reason) => Verdict::Conflict(reason),
    })
}

/// Why the host's state `host` is not the path's baseline, if it is not.
fn baseline_conflict(
    host: &HostState,
    preimage: Option<&Preimage>,
    outcome: Option<&Outcome>,
) -> Option<String> {
    let partial_baseline = baseline(preimage, outcome);
    match partial_baseline.as_ref().or(preimage) {
        None => Some("no baseline was recorded for this path".to_owned()),
        Some(Preimage::Unknown { reason }) => Some(format!("no baseline: {reason}")),
        Some(Preimage::Known(base)) if same_state(host, base) => None,
        Some(Preimage::Known(base)) => Some(match outcome {
            Some(Outcome::Interrupted { .. }) => {
                format!("an interrupted apply left this path in an unknown state (now {})", describe(host))
            }
            _ => {
                format!("changed on the host since the run: was {}, now {}", describe(base), describe(host))
            }
        }),
    }
}

/// The baseline of a path some of whose hunks were applied: the content
/// the hunk write left (mode and kind as the run found them). `None` for every
/// other path, whose baseline is its preimage.
pub fn baseline(preimage: Option<&Preimage>, outcome: Option<&Outcome>) -> Option<Preimage> {
    let (Some(Outcome::Partial(state)), Some(Preimage::Known(HostState::Present { entry, mode, .. }))) =
        (outcome, preimage)
    else {
        return None;
    };
    Some(Preimage::Known(HostState::Present {
        entry: *entry,
        mode: *mode,
        size: state.size,
        blake3: Some(state.blake3.clone()),
    }))
}

/// `preimages` with the baseline of every partially applied path replaced by
/// what its hunk write left (see [`baseline`]): the baselines a fork of this
/// stage must inherit, since the host holds that content now.
pub fn current_baselines(preimages: &Preimages, outcomes: &BTreeMap<RelPath, Outcome>) -> Preimages {
    let mut out = preimages.clone();
    for entry in &mut out.entries {
        if let Some(partial) = baseline(Some(&entry.preimage), outcomes.get(&entry.path)) {
            entry.preimage = partial;
        }
    }
    out
}

/// Whether the host holds exactly what a hunk write meant to leave.
fn holds_partial(host: &HostState, state: &PartialState) -> bool {
    matches!(host, HostState::Present { entry: EntryType::File, size, blake3: Some(digest), .. }
        if *size == state.size && *digest == state.blake3)
}

/// The ledger's outcomes, with what an interrupted apply left behind settled
/// against the workspace: a path whose intent was logged but whose outcome
/// was not counts as applied when the workspace holds exactly the staged
/// state (the write landed before the crash), as partially applied when it
/// holds what an interrupted hunk write meant to leave, and stays
/// interrupted otherwise. Returns the outcomes and the paths settled.
pub fn settle_interrupted(
    ws: &Root,
    changes: &[ChangeEntry],
    mut outcomes: BTreeMap<RelPath, Outcome>,
) -> Result<(BTreeMap<RelPath, Outcome>, Vec<Landed>), StageError> {
    let mut landed = Vec::new();
    for change in changes {
        let Some(Outcome::Interrupted { partial }) = outcomes.get(&change.path) else { continue };
        if change.entry == EntryType::Special {
            continue;
        }
        let partial = partial.clone();
        let host = host_state(ws, change)?;
        if change.kind != ChangeKind::OpaqueDir && same_state(&host, &staged_state(change)) {
            outcomes.insert(change.path.clone(), Outcome::Applied);
            landed.push(Landed::Whole(change.clone()));
        } else if let Some(state) = partial.filter(|state| holds_partial(&host, state)) {
            outcomes.insert(change.path.clone(), Outcome::Partial(state.clone()));
            landed.push(Landed::Hunks(change.clone(), state));
        }
    }
    Ok((outcomes, landed))
}

/// What an interrupted apply had already written.
#[derive(Clone, Debug)]
pub enum Landed {
    /// The whole staged change.
    Whole(ChangeEntry),
    /// Some of its hunks (`apply -p`).
    Hunks(ChangeEntry, PartialState),
}

impl Landed {
    pub fn change(&self) -> &ChangeEntry {
        match self {
            Self::Whole(change) | Self::Hunks(change, _) => change,
        }
    }
}

/// Records in the ledger what [`settle_interrupted`] found, and removes the
/// temporaries the interrupted apply left beside its paths. Call under the
/// stage and workspace locks.
pub fn reconcile_interrupted(
    ws: &Root,
    ledger: &Ledger,
    changes: &[ChangeEntry],
    outcomes: BTreeMap<RelPath, Outcome>,
) -> Result<(BTreeMap<RelPath, Outcome>, Vec<Landed>), StageError> {
    let interrupted: Vec<&ChangeEntry> = changes
        .iter()
        .filter(|c| matches!(outcomes.get(&c.path), Some(Outcome::Interrupted { .. })))
        .collect();
    for change in &interrupted {
        ws.remove_temporary(change.path.as_path())
            .map_err(|e| StageError::io("remove the temporary of", change.path.as_path(), e))?;
    }
    let (outcomes, landed) = settle_interrupted(ws, changes, outcomes)?;
    let records: Vec<Entry> = landed
        .iter()
        .map(|l| match l {
            Landed::Whole(c) => Entry::new(c.path.clone(), Action::Applied, c.blake3.clone(), false),
            Landed::Hunks(c, state) => Entry::partial(c.path.clone(), Action::Partial, state.clone()),
        })
        .collect();
    ledger.append(&records)?;
    Ok((outcomes, landed))
}

/// Plans `selection` (from [`with_required_ancestors`]).
pub fn plan(
    ws: &Root,
    changes: &[ChangeEntry],
    selection: &[(usize, bool)],
    preimages: &Preimages,
    outcomes: &BTreeMap<RelPath, Outcome>,
    force: bool,
) -> Result<Vec<Planned>, StageError> {
    let mut parents = Parents::new(changes);
    selection
        .iter()
        .map(|&(i, implied)| {
            let change = &changes[i];
            let (preimage, outcome) = (preimages.get(&change.path), outcomes.get(&change.path));
            let verdict = verdict(ws, change, &mut parents, preimage, outcome, force)?;
            Ok(Planned { change: change.clone(), verdict, implied })
        })
        .collect()
}

/// What [`execute`] did.
#[derive(Debug, Default)]
pub struct Executed {
    /// Paths written (or removed), with the digest that landed and whether forced.
    pub applied: Vec<(ChangeEntry, bool)>,
    /// Paths that already matched and were only recorded.
    pub already: Vec<ChangeEntry>,
    /// Paths that could not be written, and why. The others were applied
    /// regardless: one bad path never holds the rest back.
    pub failed: Vec<(ChangeEntry, String)>,
    pub warnings: Vec<String>,
}

/// Applies every `Apply` and `AlreadyApplied` item of `plan`. Call only when
/// the plan has no conflicts the caller wants to honour.
pub fn execute(
    ws: &Root,
    upper: &Root,
    ledger: &Ledger,
    plan: &[Planned],
    sealed_ns: i128,
    progress: impl FnMut(&ChangeEntry),
) -> Result<Executed, StageError> {
    let mut done = Executed::default();
    let link_targets = plan.iter().filter_map(|p| p.change.hardlink_of.clone()).collect();
    let contents = FileCopy { sealed_ns, reflinks: std::sync::atomic::AtomicBool::new(sealed_ns > 0) };
    let mut copy = Copy { contents, link_targets, written: BTreeMap::new() };
    let intents: Vec<_> = plan
        .iter()
        .filter(|p| matches!(p.verdict, Verdict::Apply { .. }))
        .map(|p| Entry::new(p.change.path.clone(), Action::Intent, p.change.blake3.clone(), false))
        .collect();
    ledger.append(&intents)?;
    let small_files: Vec<(usize, &Path)> = plan
        .iter()
        .enumerate()
        .filter(|(_, p)| matches!(p.verdict, Verdict::Apply { .. }))
        .map(|(i, p)| (i, &p.change))
        .filter(|(_, c)| {
            c.entry == EntryType::File && c.size <= crate::prefetch::LARGEST && c.hardlink_of.is_none()
        })
        .map(|(i, c)| (i, c.path.as_path()))
        .collect();
    crate::prefetch::while_reading(upper, &small_files, |cursor| {
        apply_all(ws, upper, plan, (&mut copy, &mut done), cursor, progress)
    });
    // Directories staged without owner access (`chmod 000`) get their mode
    // last, deepest first, after everything beneath them was written.
    for (change, _) in done.applied.iter().rev() {
        if change.entry == EntryType::Dir && change.mode & 0o700 != 0o700 {
            if let Err(e) = ws.set_dir_mode(change.path.as_path(), change.mode & 0o1777) {
                done.warnings.push(format!("{}: mode not set: {e}", change.path.display_escaped()));
            }
        }
    }
    // Whatever was written is made durable before the ledger says so.
    ws.sync().map_err(|e| StageError::io("sync", "the workspace", e))?;
    let outcomes: Vec<_> = done
        .applied
        .iter()
        .map(|(c, forced)| Entry::new(c.path.clone(), Action::Applied, c.blake3.clone(), *forced))
        .chain(
            done.already.iter().map(|c| Entry::new(c.path.clone(), Action::Applied, c.blake3.clone(), false)),
        )
        .collect();
    ledger.append(&outcomes)?;
    Ok(done)
}

/// Applies each `Apply` item of `plan` in order, and notes the ones
/// already applied. A long run of files nothing else depends on is written
/// by several threads (see `writers.rs`); what `done` and `progress` see
/// stays in the plan's order.
fn apply_all(
    ws: &Root,
    upper: &Root,
    plan: &[Planned],
    (copy, done): (&mut Copy, &mut Executed),
    cursor: &crate::prefetch::Cursor,
    mut progress: impl FnMut(&ChangeEntry),
) {
    let mut index = 0;
    while index < plan.len() {
        let run =
            plan[index..].iter().take_while(|p| copy.independent_file(p) && !parent_failed(done, p)).count();
        if run >= crate::writers::FEWEST {
            let files: Vec<(usize, &ChangeEntry)> =
                (index..index + run).map(|i| (i, &plan[i].change)).collect();
            crate::writers::write_all(ws, upper, &files, &copy.contents, cursor, |position, result| {
                record(done, &plan[files[position].0], result, &mut progress);
            });
            index += run;
            continue;
        }
        cursor.reached(index);
        let planned = &plan[index];
        match &planned.verdict {
            Verdict::Apply { .. } if parent_failed(done, planned) => {
                done.failed
                    .push((planned.change.clone(), "its parent directory could not be applied".into()));
            }
            Verdict::Apply { .. } => {
                let mut warnings = Vec::new();
                let result = apply_one(ws, upper, &planned.change, copy, &mut warnings).map(|()| warnings);
                record(done, planned, result, &mut progress);
            }
            Verdict::AlreadyApplied => done.already.push(planned.change.clone()),
            Verdict::Conflict(_) | Verdict::Unsupported(_) => {}
        }
        index += 1;
    }
}

/// Whether a directory above `planned` failed: a child of a path that
/// failed cannot land either.
fn parent_failed(done: &Executed, planned: &Planned) -> bool {
    done.failed.iter().any(|(f, _)| {
        f.entry == EntryType::Dir && planned.change.path.as_path().starts_with(f.path.as_path())
    })
}

/// Records how writing `planned` went (its warnings, if it was written).
fn record(
    done: &mut Executed,
    planned: &Planned,
    result: Result<Vec<String>, StageError>,
    progress: &mut impl FnMut(&ChangeEntry),
) {
    let Verdict::Apply { forced } = planned.verdict else { return };
    match result {
        Ok(warnings) => {
            done.warnings.extend(warnings);
            progress(&planned.change);
            done.applied.push((planned.change.clone(), forced));
        }
        Err(e) => done.failed.push((planned.change.clone(), error_chain(&e))),
    }
}

/// Writes `contents` (the host's file with some of the staged hunks in it,
/// from `hunks::Hunks::merge`) over `change`'s path, keeping the host file's
/// mode, and records it in the ledger as partially applied: intent, write,
/// `syncfs`, outcome, as [`execute`] does for whole changes. The caller has
/// checked, under the stage and workspace locks, that the host still holds
/// the text the hunks were taken from.
pub fn write_partial(
    ws: &Root,
    ledger: &Ledger,
    change: &ChangeEntry,
    contents: &[u8],
    mode: u32,
) -> Result<PartialState, StageError> {
    let rel = change.path.as_path();
    let state =
        PartialState { blake3: pvisor_core::digest::digest_bytes(contents), size: contents.len() as u64 };
    ledger.append(&[Entry::partial(change.path.clone(), Action::Intent, state.clone())])?;
    ws.write_file(rel, contents, mode & 0o1777, Some(&state.blake3))
        .map_err(|e| StageError::io("write", rel, e))?;
    ws.sync().map_err(|e| StageError::io("sync", "the workspace", e))?;
    pvisor_core::failpoint::hit("hunks-before-outcome");
    ledger.append(&[Entry::partial(change.path.clone(), Action::Partial, state.clone())])?;
    Ok(state)
}

/// An error and its causes on one line (`Cannot write x: File name too long`).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// How [`apply_one`] moves file contents, and which written files other
/// staged names are links of.
struct Copy {
    contents: FileCopy,
    /// The paths other staged files are hard links of.
    link_targets: std::collections::BTreeSet<RelPath>,
    /// Those of them written by this apply, with the (device, inode) written.
    written: BTreeMap<RelPath, (u64, u64)>,
}

impl Copy {
    /// Whether `planned` is a file to write that no other item depends on:
    /// not a directory (children follow it), not a hard link, and not the
    /// first name of one. Such files may be written in any order.
    fn independent_file(&self, planned: &Planned) -> bool {
        let change = &planned.change;
        matches!(planned.verdict, Verdict::Apply { .. })
            && change.entry == EntryType::File
            && change.hardlink_of.is_none()
            && !self.link_targets.contains(&change.path)
    }
}

/// How a staged file's contents land in the workspace; shared by the
/// threads of `writers.rs`.
pub(crate) struct FileCopy {
    /// From `Preimages::sealed_ns`: staged files older than this still hold
    /// their manifest digest.
    sealed_ns: i128,
    /// False once the workspace refused a reflink: copy from then on.
    reflinks: std::sync::atomic::AtomicBool,
}

impl FileCopy {
    /// Whether `staged` is unchanged since its manifest digest was taken:
    /// its ctime (which every write moves, and no user can set back) is
    /// older than the seal, and its size is the manifest's.
    fn sealed_unchanged(&self, staged: &std::fs::File, change: &ChangeEntry) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Ok(meta) = staged.metadata() else { return false };
        let ctime = i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec());
        ctime < self.sealed_ns && meta.len() == change.size
    }

    /// Writes the staged file `change` at its path, its contents checked
    /// against the manifest, setuid and setgid bits dropped (with a warning).
    pub(crate) fn write(
        &self,
        ws: &Root,
        upper: &Root,
        change: &ChangeEntry,
        warnings: &mut Vec<String>,
    ) -> Result<(), StageError> {
        use std::sync::atomic::Ordering;
        let rel = change.path.as_path();
        let io = |op: &'static str| move |e| StageError::io(op, rel, e);
        let staged = upper.open_file(rel).map_err(io("read the staged"))?;
        let mut mode = change.mode;
        if mode & 0o6000 != 0 {
            warnings.push(format!("{}: setuid/setgid bits dropped", change.path.display_escaped()));
            mode &= !0o6000;
        }
        // Where the stage and the workspace share a filesystem that can
        // reflink, an unchanged sealed file lands in constant time: no
        // data is read or written, and its manifest digest still holds.
        // Small files too: on XFS, 10,000 one-line files applied in
        // 0.47-0.66 s reflinked against 0.69-0.88 s copied and hashed.
        // A file last written in the clock tick the seal began in (a few
        // ms) cannot be told from one written after it, and is copied.
        if self.reflinks.load(Ordering::Relaxed) && self.sealed_unchanged(&staged, change) {
            if ws.clone_file(rel, &staged, mode).map_err(io("write"))? {
                return Ok(());
            }
            self.reflinks.store(false, Ordering::Relaxed);
        }
        ws.write_file(rel, &staged, mode, change.blake3.as_deref()).map_err(io("write"))?;
        Ok(())
    }
}

fn apply_one(
    ws: &Root,
    upper: &Root,
    change: &ChangeEntry,
    copy: &mut Copy,
    warnings: &mut Vec<String>,
) -> Result<(), StageError> {
    let rel = change.path.as_path();
    let io = |op: &'static str| move |e| StageError::io(op, rel, e);
    match change.entry {
        EntryType::None => ws.remove_all(rel).map_err(io("remove")),
        EntryType::File => {
            if link_to_written(ws, change, copy).map_err(io("link"))? {
                return Ok(());
            }
            copy.contents.write(ws, upper, change, warnings)?;
            note_written(ws, change, copy).map_err(io("inspect"))
        }
        EntryType::Symlink => {
            let target = upper.read_link(rel).map_err(io("read the staged link"))?;
            let digest = blake3::hash(&target).to_hex().to_string();
            if change.blake3.as_deref() != Some(digest.as_str()) {
                return Err(StageError::io(
                    "verify",
                    rel,
                    std::io::Error::new(std::io::ErrorKind::InvalidData, "staged link changed since sealing"),
                ));
            }
            ws.write_symlink(rel, &target).map_err(io("write link"))
        }
        EntryType::Dir => {
            if ws.stat(rel).map_err(io("inspect"))?.is_some_and(|s| s.kind != Kind::Dir) {
                ws.remove_all(rel).map_err(io("replace"))?;
            }
            // Created open to its owner, so its staged children can be
            // written; `execute` gives it its staged mode once they are.
            ws.mkdir(rel, (change.mode | 0o700) & 0o1777).map_err(io("create directory"))?;
            if change.kind == ChangeKind::OpaqueDir {
                remove_hidden(ws, upper, rel).map_err(io("remove replaced content"))?;
            }
            Ok(())
        }
        EntryType::Special => Ok(()),
    }
}

/// Remembers the inode just written at `change`'s path if other staged
/// files are links of it.
fn note_written(ws: &Root, change: &ChangeEntry, copy: &mut Copy) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    if copy.link_targets.contains(&change.path) {
        let meta = ws.open_file(change.path.as_path())?.metadata()?;
        copy.written.insert(change.path.clone(), (meta.dev(), meta.ino()));
    }
    Ok(())
}

/// Applies a staged hard link as a link: `change` becomes another name of
/// the file this apply wrote for its first name, so 200 links of a 50 MiB
/// file land as one file, as they were staged. False (nothing done) when
/// that file was not written by this apply (not selected, failed, or an old
/// manifest without links): the caller then writes the contents.
fn link_to_written(ws: &Root, change: &ChangeEntry, copy: &Copy) -> std::io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let Some(first) = &change.hardlink_of else { return Ok(false) };
    let Some(&inode) = copy.written.get(first) else { return Ok(false) };
    let file = ws.open_file(first.as_path())?;
    let meta = file.metadata()?;
    // Still the file this apply wrote (not replaced since), with the mode
    // the stage gave both names.
    if (meta.dev(), meta.ino()) != inode || meta.mode() & 0o7777 != change.mode & !0o6000 {
        return Ok(false);
    }
    ws.link_file(change.path.as_path(), &file)?;
    Ok(true)
}

/// Removes what the opaque directory `rel` hides: every host entry beneath
/// it that the stage does not re-create, at any depth where both hold a
/// directory. These are exactly the paths the scan names `deleted` beneath
/// it, so applying the directory removes what review showed and nothing
/// else. Iterative: a re-created tree may be deeper than the stack allows.
fn remove_hidden(ws: &Root, upper: &Root, rel: &Path) -> std::io::Result<()> {
    let is_dir = |root: &Root, path: &Path| -> std::io::Result<bool> {
        Ok(root.stat(path)?.is_some_and(|s| s.kind == Kind::Dir))
    };
    let mut dirs = vec![rel.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let keep: std::collections::BTreeSet<_> = upper.list(&dir)?.into_iter().collect();
        for name in ws.list(&dir)? {
            let path = dir.join(&name);
            if !keep.contains(&name) {
                ws.remove_all(&path)?;
            } else if is_dir(ws, &path)? && is_dir(upper, &path)? {
                dirs.push(path);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::preimage::{baseline_now, capture, CopyUps};

    /// Plans every change of `upper` against `ws` with the baselines taken
    /// while the host held nothing, as apply does.
    fn verdicts(changes: &[ChangeEntry], preimages: &Preimages, ws: &Path) -> Vec<(String, Verdict)> {
        let selection: Vec<(usize, bool)> = (0..changes.len()).map(|i| (i, false)).collect();
        let root = Root::open(ws).expect("ws root");
        let planned = plan(&root, changes, &selection, preimages, &BTreeMap::new(), false).expect("plan");
        planned.into_iter().map(|p| (p.change.path.display_escaped(), p.verdict)).collect()
    }

    /// A staged tree the host does not hold is planned without looking
    /// beneath it; once the host holds the same tree, each path is looked
    /// at again (and found already applied), so the shortcut never stands
    /// in for what is there.
    #[test]
    fn what_lies_beneath_a_directory_the_host_lacks_is_absent_and_nothing_else_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (upper, ws) = (dir.path().join("upper"), dir.path().join("ws"));
        fs::create_dir_all(upper.join("t/sub")).expect("upper");
        fs::create_dir(&ws).expect("ws");
        fs::write(upper.join("t/a"), "a\n").expect("a");
        fs::write(upper.join("t/sub/b"), "b\n").expect("b");
        let changes = crate::scan(&upper, &ws).expect("scan");
        let preimages = capture(&ws, &changes, CopyUps::Unmarked, baseline_now()).expect("baselines");
        let fresh = verdicts(&changes, &preimages, &ws);
        assert_eq!(fresh.len(), 4, "{fresh:?}");
        assert!(fresh.iter().all(|(_, v)| *v == Verdict::Apply { forced: false }), "{fresh:?}");

        fs::create_dir_all(ws.join("t/sub")).expect("host tree");
        fs::write(ws.join("t/a"), "a\n").expect("host a");
        fs::write(ws.join("t/sub/b"), "b\n").expect("host b");
        let held = verdicts(&changes, &preimages, &ws);
        // Beneath `t` (whose own mode the host chose): all looked at, all there.
        let beneath: Vec<&(String, Verdict)> = held.iter().filter(|(p, _)| p.contains('/')).collect();
        assert_eq!(beneath.len(), 3, "{held:?}");
        assert!(beneath.iter().all(|(_, v)| *v == Verdict::AlreadyApplied), "{held:?}");
    }
}
