//! The effects workflow: review, apply selected files, drop.
//!
//! ```text
//! run → stop → review → apply selected files → review remaining changes → apply or drop
//! ```
//!
//! The list of changes is the Bundle's manifest, bound by the receipt. Apply
//! and drop need that receipt: a run without one (`unknown`, or still live)
//! can be reviewed from its stage, but nothing is applied or dropped. Each
//! apply or drop holds the stage's `apply.lock` and then the workspace's
//! lock, so two at once serialize even across Jobs, reconciles what an
//! interrupted apply left, and records every step in the ledger and the Trace.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::json;

use pvisor_core::ids::JobId;
use pvisor_core::records::{ChangeEntry, JobRecord};
use pvisor_core::state::JobState;
use pvisor_core::store::{self, OwnerLock, RelPath, Store, StoreError};
use pvisor_stage::apply::{self, NoMatch, Planned, Verdict};
use pvisor_stage::beneath::Root;
use pvisor_stage::ledger::{self, Action, Ledger, Outcome, PartialState};
use pvisor_stage::preimage::Preimages;
pub use pvisor_stage::sensitive::Sensitive;
use pvisor_stage::StageError;

use crate::runtime::completion;
use crate::runtime::job_service::views::{self, JobStatus, ViewError};
use crate::trace::Trace;

/// Why an effects command could not proceed. Nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum EffectsError {
    #[error(
        "Job {job} has no confirmed result (state: {state}): apply needs an Attempt confirmed stopped by a valid receipt, \
         and drop a Job that is closed. `pvisor review {job} --diff` shows its staged files; `pvisor kill {job}` closes \
         it as lost, after which `pvisor drop {job}` can discard them"
    )]
    Unconfirmed { job: JobId, state: JobState },
    #[error(
        "Job {job} was closed as lost: no receipt confirms how its command ended, so its staged files are never \
         applied. `pvisor review {job} --diff` shows them; `pvisor export {job}` saves them to a tar for inspection \
         (copy what you need by hand); `pvisor drop {job}` discards them, and `pvisor gc` then frees the space"
    )]
    Lost { job: JobId },
    #[error("Job {job} is still running; wait for it to finish (or cancel it) before applying or dropping")]
    Live { job: JobId },
    #[error(
        "Job {job} is suspended: its staged files are inside the saved VM. `pvisor resume {job}` continues it \
         (apply after it finishes); `pvisor kill {job}` gives it up"
    )]
    Suspended { job: JobId },
    #[error(
        "The staged files of job {job} were removed by `pvisor gc`; its records remain (status, events)"
    )]
    Collected { job: JobId },
    #[error("Job {job} was imported from {origin}: it is read-only here (review it; apply it where it ran)")]
    Imported { job: JobId, origin: String },
    #[error("Workspace {} no longer exists; nothing can be applied to it", path.display())]
    WorkspaceMissing { path: PathBuf },
    #[error(transparent)]
    NoMatch(#[from] NoMatch),
    #[error(transparent)]
    View(#[from] ViewError),
    #[error(transparent)]
    Stage(#[from] StageError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Where a stage stands, separately from how the run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StageState {
    /// The run staged nothing.
    Empty,
    /// Nothing applied or dropped yet.
    Pending,
    /// Some changes applied or dropped, some remain.
    PartiallyApplied,
    /// Nothing remains, and something was applied.
    Applied,
    /// Nothing remains, and nothing was applied.
    Dropped,
}

impl StageState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::Pending => "pending",
            Self::PartiallyApplied => "partially-applied",
            Self::Applied => "applied",
            Self::Dropped => "dropped",
        }
    }

    /// Derives the state from the change list and the ledger.
    pub fn of(changes: &[ChangeEntry], outcomes: &BTreeMap<RelPath, Outcome>) -> Self {
        if changes.is_empty() {
            return Self::Empty;
        }
        let (mut applied, mut dropped, mut partial) = (0, 0, false);
        for change in changes {
            match outcomes.get(&change.path) {
                Some(Outcome::Applied) => applied += 1,
                Some(Outcome::Dropped) => dropped += 1,
                // Some hunks are on the host: the stage is partly applied.
                Some(Outcome::Partial(_)) => partial = true,
                Some(Outcome::Interrupted { .. }) | None => {}
            }
        }
        match (applied + dropped == changes.len(), applied, dropped) {
            (false, 0, 0) if !partial => Self::Pending,
            (false, _, _) => Self::PartiallyApplied,
            (true, 0, _) => Self::Dropped,
            (true, _, _) => Self::Applied,
        }
    }
}

/// A Job's stage, ready to review or apply.
#[derive(Debug)]
pub struct Stage {
    pub status: JobStatus,
    pub job: JobRecord,
    /// The changes: the Bundle's manifest, or a live scan when unconfirmed.
    pub changes: Vec<ChangeEntry>,
    /// Whether `changes` comes from a Bundle bound by a valid receipt.
    pub confirmed: bool,
    pub preimages: Option<Preimages>,
    pub outcomes: BTreeMap<RelPath, Outcome>,
    pub stage_dir: PathBuf,
    pub workspace: PathBuf,
}

impl Stage {
    /// Opens the stage of `job`.
    pub fn open(store: &Store, job: &JobId) -> Result<Self, EffectsError> {
        crate::runtime::recovery::recover(store, job)?;
        let status = views::status(store, job)?;
        let job_record: JobRecord = store.read(&store.job_file(job))?;
        let stage_dir = store.stage_dir(&status.run);
        let upper = stage_dir.join("upper");
        let mut binding = None;
        let (changes, confirmed) =
            match completion::load(store, job, &status.attempt).map_err(ViewError::from)? {
                Some((_, bundle)) => {
                    binding = bundle.binding;
                    (bundle.changes, true)
                }
                None if upper.is_dir() && status.workspace.is_dir() => {
                    (pvisor_stage::scan(&upper, &status.workspace)?, false)
                }
                None => (Vec::new(), false),
            };
        let preimages_path = stage_dir.join("preimages.json");
        let preimages = match store::read_capped(&preimages_path, store::RECORD_READ_CAP) {
            Ok(bytes) => {
                // The conflict baselines decide what apply may overwrite:
                // only the ones the Bundle bound are trusted.
                let bound = binding.as_ref().and_then(|b| b.preimages_blake3.as_deref());
                if bound.is_some_and(|digest| digest != store::blake3_hex(&bytes)) {
                    return Err(ViewError::Unbound {
                        path: preimages_path,
                        reason: "its conflict baselines differ from the ones the Bundle binds".into(),
                    }
                    .into());
                }
                Some(store::parse_record::<Preimages>(&preimages_path, &bytes)?)
            }
            Err(e) if e.is_not_found() && binding.as_ref().is_some_and(|b| b.preimages_blake3.is_some()) => {
                return Err(ViewError::Unbound {
                    path: preimages_path,
                    reason: "it is missing, but the Bundle binds it".into(),
                }
                .into());
            }
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e.into()),
        };
        let workspace = status.workspace.clone();
        let mut outcomes = Ledger::new(&stage_dir, &status.run).outcomes()?;
        // What an interrupted apply already wrote is applied, whatever the
        // ledger's missing outcome line says (recorded by the next apply or drop).
        if let (true, Ok(ws)) = (confirmed, Root::open(&workspace)) {
            outcomes = apply::settle_interrupted(&ws, &changes, outcomes)?.0;
        }
        Ok(Self { status, job: job_record, changes, confirmed, preimages, outcomes, stage_dir, workspace })
    }

    /// How many changes are neither applied nor dropped.
    pub fn remaining(&self) -> usize {
        self.changes.iter().filter(|c| !self.outcomes.get(&c.path).is_some_and(Outcome::is_settled)).count()
    }

    pub fn state(&self) -> StageState {
        StageState::of(&self.changes, &self.outcomes)
    }

    /// The stage as it is once `outcomes` (just appended to the ledger by
    /// this process, under the writer locks) are in: its state and how many
    /// changes remain, without reading the stage again.
    fn after(&mut self, outcomes: impl IntoIterator<Item = (RelPath, Outcome)>) -> (StageState, usize) {
        self.outcomes.extend(outcomes);
        (self.state(), self.remaining())
    }

    fn roots(&self) -> Result<(Root, Root), EffectsError> {
        if self.stage_dir.join("collected").exists() {
            return Err(EffectsError::Collected { job: self.status.job.clone() });
        }
        let ws = Root::open(&self.workspace)
            .map_err(|_| EffectsError::WorkspaceMissing { path: self.workspace.clone() })?;
        let upper_path = self.stage_dir.join("upper");
        let upper = Root::open(&upper_path).map_err(|e| StageError::io("open", &upper_path, e))?;
        Ok((ws, upper))
    }

    /// The review of every change: remaining ones with their conflict state,
    /// applied and dropped ones marked, sensitive ones with the reason.
    pub fn review(
        &self,
        patterns: &[String],
        sensitive: &Sensitive,
    ) -> Result<Vec<ReviewItem>, EffectsError> {
        let selected = apply::select(&self.changes, patterns)?;
        let ws = Root::open(&self.workspace).ok();
        let empty = Preimages::none();
        let preimages = self.preimages.as_ref().unwrap_or(&empty);
        let mut items = Vec::with_capacity(selected.len());
        for i in selected {
            let change = &self.changes[i];
            let outcome = self.outcomes.get(&change.path);
            let applied = outcome == Some(&Outcome::Applied);
            let dropped = outcome == Some(&Outcome::Dropped);
            let (conflict, unsupported) = match (&ws, applied || dropped) {
                (_, true) => (None, None),
                (None, false) => (Some("the workspace no longer exists".to_owned()), None),
                (Some(ws), false) => {
                    match apply::verdict(ws, change, preimages.get(&change.path), outcome, false)? {
                        Verdict::Conflict(reason) => (Some(reason), None),
                        Verdict::Unsupported(reason) => (None, Some(reason)),
                        Verdict::Apply { .. } | Verdict::AlreadyApplied => (None, None),
                    }
                }
            };
            let sensitive = sensitive.reason_for(change);
            items.push(ReviewItem {
                change: change.clone(),
                applied,
                dropped,
                partly_applied: matches!(outcome, Some(Outcome::Partial(_))),
                conflict,
                unsupported,
                sensitive,
            });
        }
        Ok(items)
    }

    /// Opens the workspace and stage roots for rendering diffs. A workspace
    /// that does not exist here (an imported Job) diffs against nothing.
    pub fn diff_roots(&self) -> Result<(Root, Root), EffectsError> {
        if self.workspace.is_dir() || self.stage_dir.join("collected").exists() {
            return self.roots();
        }
        let empty = self.stage_dir.join("empty");
        store::create_dir_all_private(&empty)?;
        let ws = Root::open(&empty).map_err(|e| StageError::io("open", &empty, e))?;
        let upper_path = self.stage_dir.join("upper");
        let upper = Root::open(&upper_path).map_err(|e| StageError::io("open", &upper_path, e))?;
        Ok((ws, upper))
    }
}

/// One change as review shows it.
#[derive(Debug, Clone)]
pub struct ReviewItem {
    pub change: ChangeEntry,
    pub applied: bool,
    pub dropped: bool,
    /// Some of its hunks are on the host (`apply -p`); the rest remain.
    pub partly_applied: bool,
    /// Why apply would refuse this change without `--force`.
    pub conflict: Option<String>,
    /// Why apply never writes this change (device nodes, fifos, sockets).
    pub unsupported: Option<String>,
    /// Why applying this change needs explicit consent (it makes the host run code).
    pub sensitive: Option<String>,
}

impl ReviewItem {
    pub fn remaining(&self) -> bool {
        !self.applied && !self.dropped
    }
}

/// Options for [`apply`].
#[derive(Debug, Clone, Default)]
pub struct ApplyOptions {
    pub force: bool,
    /// Paths to apply over a conflict, each chosen explicitly (`apply -i`).
    pub force_paths: Vec<RelPath>,
    pub dry_run: bool,
    /// Apply sensitive paths that `--all`, a glob or a directory selects.
    pub include_sensitive: bool,
    /// Which paths are sensitive.
    pub sensitive: Sensitive,
}

/// What an apply did (or, with `dry_run`, would do).
#[derive(Debug, Default)]
pub struct ApplyReport {
    pub plan: Vec<Planned>,
    /// Whether anything was written. False on a dry run or when conflicts refused the apply.
    pub executed: bool,
    pub conflicts: Vec<(ChangeEntry, String)>,
    /// Sensitive paths the selection named only by `--all`, a glob or a
    /// directory: not applied, with the reason.
    pub skipped_sensitive: Vec<(ChangeEntry, String)>,
    /// Paths that could not be written (the rest were applied).
    pub failed: Vec<(ChangeEntry, String)>,
    pub warnings: Vec<String>,
    pub state: Option<StageState>,
    /// Changes neither applied nor dropped once this apply is done.
    pub remaining: usize,
    /// The workspace it applied to.
    pub workspace: PathBuf,
}

/// The stage's writer lock: one apply or drop at a time.
pub(crate) fn lock_stage(stage_dir: &Path) -> Result<OwnerLock, EffectsError> {
    Ok(OwnerLock::acquire_blocking(&stage_dir.join("apply.lock"))?)
}

/// The workspace's writer lock, taken after the stage's: the preimage check
/// and the writes of one apply happen with no other apply or drop (of any
/// Job, from any state directory) in between, so two Jobs can never both
/// "win" the same file. It is an exclusive `flock` on the workspace
/// directory itself (no file in the workspace; shared by every pvisor), after
/// shared ones on each of its ancestors, taken from `/` down: a Job whose
/// workspace is a parent or a child of this one waits too, while sibling
/// workspaces do not.
pub(crate) fn lock_workspace(workspace: &Path) -> Result<Vec<OwnerLock>, EffectsError> {
    let missing = |e: StoreError| match e {
        StoreError::Io { ref source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            EffectsError::WorkspaceMissing { path: workspace.to_owned() }
        }
        other => other.into(),
    };
    let mut ancestors: Vec<&Path> = workspace.ancestors().skip(1).collect();
    ancestors.reverse();
    let mut locks = Vec::with_capacity(ancestors.len() + 1);
    for dir in ancestors {
        // An ancestor pvisor may not open (another user's home above a
        // shared workspace) cannot hold a nested workspace of ours either.
        if let Ok(lock) = OwnerLock::acquire_directory_shared(dir) {
            locks.push(lock);
        }
    }
    locks.push(OwnerLock::acquire_directory(workspace).map_err(missing)?);
    Ok(locks)
}

/// Under both writer locks: records what an interrupted apply already wrote
/// as applied (and removes its temporaries), so nothing that is in the
/// workspace is ever recorded as dropped, then reopens the stage.
fn reconcile(store: &Store, job: &JobId, stage: Stage) -> Result<Stage, EffectsError> {
    let ledger = Ledger::new(&stage.stage_dir, &stage.status.run);
    let raw = ledger.outcomes()?;
    if !raw.values().any(|o| matches!(o, Outcome::Interrupted { .. })) {
        return Ok(stage);
    }
    let (ws, _) = stage.roots()?;
    let (_, landed) = apply::reconcile_interrupted(&ws, &ledger, &stage.changes, raw)?;
    if !landed.is_empty() {
        let (mut trace, terminal) = open_trace(store, &stage)?;
        let paths: Vec<&RelPath> = landed.iter().map(|l| &l.change().path).collect();
        trace.emit(
            "apply.reconciled",
            Some(stage.status.attempt.number()),
            terminal,
            json!({"paths": paths, "reason": "an interrupted apply had already written them"}),
            true,
        )?;
    }
    Stage::open(store, job)
}

/// Refuses a stage that may not be applied: imported, live, suspended,
/// lost or otherwise unconfirmed, each with what to do instead.
pub fn require_confirmed(stage: &Stage) -> Result<(), EffectsError> {
    if let Some(origin) = &stage.job.imported_from {
        return Err(EffectsError::Imported { job: stage.status.job.clone(), origin: origin.clone() });
    }
    if stage.status.live {
        return Err(EffectsError::Live { job: stage.status.job.clone() });
    }
    if stage.status.state == JobState::Suspended {
        return Err(EffectsError::Suspended { job: stage.status.job.clone() });
    }
    if !stage.confirmed && stage.status.state == JobState::Lost {
        return Err(EffectsError::Lost { job: stage.status.job.clone() });
    }
    if !stage.confirmed {
        return Err(EffectsError::Unconfirmed { job: stage.status.job.clone(), state: stage.status.state });
    }
    Ok(())
}

/// What `drop` needs: a stage nobody writes any more. A Job closed as lost
/// qualifies (dropping writes nothing to the workspace), though it can
/// never be applied.
fn require_closed(stage: &Stage) -> Result<(), EffectsError> {
    match require_confirmed(stage) {
        Err(EffectsError::Lost { .. }) => Ok(()),
        other => other,
    }
}

/// Reopens the Trace for an apply or drop; returns it with the seq of the
/// run's terminal event, the cause of everything that follows.
fn open_trace(store: &Store, stage: &Stage) -> Result<(Trace, Option<u64>), EffectsError> {
    let (events, _) = views::events(store, &stage.status.run)?;
    let terminal = events
        .iter()
        .rev()
        .find(|e| matches!(e.kind.as_str(), "run.completed" | "run.failed" | "run.cancelled"))
        .map(|e| e.seq);
    Ok((Trace::open(store, &stage.status.run), terminal))
}

/// Whether selection pattern `pattern` names `path` itself (not by a glob,
/// nor as a directory above it).
fn names_exactly(pattern: &str, path: &RelPath) -> bool {
    let trimmed = pattern.trim_end_matches('/');
    let trimmed = trimmed.strip_prefix("./").unwrap_or(trimmed);
    !pvisor_stage::glob::is_glob(trimmed)
        && trimmed.as_bytes() == path.as_path().as_os_str().as_encoded_bytes()
}

/// Which changes to apply.
#[derive(Debug, Clone)]
pub enum Selection {
    /// Paths (a directory selects everything beneath) and globs; empty = all.
    Patterns(Vec<String>),
    /// Exactly these changes (e.g. chosen one by one).
    Paths(Vec<RelPath>),
}

/// Both writer locks of an apply, released when dropped (the workspace's
/// first, as they were taken in the other order).
struct WriterLocks {
    _workspace: Vec<OwnerLock>,
    _stage: OwnerLock,
}

/// Opens `job`'s stage for writing to the workspace: confirmed, both writer
/// locks taken, then re-read under them (another apply may have just
/// finished) with what an interrupted apply left reconciled.
fn open_for_apply(store: &Store, job: &JobId) -> Result<(Stage, WriterLocks), EffectsError> {
    let stage = Stage::open(store, job)?;
    require_confirmed(&stage)?;
    let stage_lock = lock_stage(&stage.stage_dir)?;
    let locks = WriterLocks { _workspace: lock_workspace(&stage.workspace)?, _stage: stage_lock };
    let stage = reconcile(store, job, Stage::open(store, job)?)?;
    Ok((stage, locks))
}

/// Applies the selected changes of `job`'s stage.
pub fn apply(
    store: &Store,
    job: &JobId,
    selection: &Selection,
    options: ApplyOptions,
    progress: impl FnMut(&ChangeEntry),
) -> Result<ApplyReport, EffectsError> {
    let (mut stage, _locks) = open_for_apply(store, job)?;
    let (ws, upper) = stage.roots()?;
    let remaining: Vec<ChangeEntry> = stage
        .changes
        .iter()
        .filter(|c| !stage.outcomes.get(&c.path).is_some_and(Outcome::is_settled))
        .cloned()
        .collect();
    let selected = match selection {
        Selection::Patterns(patterns) => apply::select(&remaining, patterns).or_else(|e| {
            // A pattern that names only already-applied changes is not an error.
            apply::select(&stage.changes, patterns).map(|_| Vec::new()).map_err(|_| e)
        })?,
        Selection::Paths(paths) => {
            (0..remaining.len()).filter(|&i| paths.contains(&remaining[i].path)).collect()
        }
    };
    // A sensitive path is applied only when named exactly (or chosen one by
    // one, or with --include-sensitive): never swept in by --all or a glob.
    let mut skipped_sensitive = Vec::new();
    let selected: Vec<usize> = selected
        .into_iter()
        .filter(|&i| {
            let change = &remaining[i];
            let Some(reason) = options.sensitive.reason_for(change) else { return true };
            let consented = options.include_sensitive
                || match selection {
                    Selection::Paths(_) => true,
                    Selection::Patterns(patterns) => patterns.iter().any(|p| names_exactly(p, &change.path)),
                };
            if !consented {
                skipped_sensitive.push((change.clone(), reason));
            }
            consented
        })
        .collect();
    let with_parents = apply::with_required_ancestors(&ws, &remaining, &selected)?;
    let empty = Preimages::none();
    let preimages = stage.preimages.as_ref().unwrap_or(&empty);
    let mut plan = apply::plan(&ws, &remaining, &with_parents, preimages, &stage.outcomes, options.force)?;
    for planned in &mut plan {
        if matches!(planned.verdict, Verdict::Conflict(_))
            && options.force_paths.contains(&planned.change.path)
        {
            planned.verdict = Verdict::Apply { forced: true };
        }
    }
    let conflicts: Vec<(ChangeEntry, String)> = plan
        .iter()
        .filter_map(|p| match &p.verdict {
            Verdict::Conflict(reason) => Some((p.change.clone(), reason.clone())),
            Verdict::Apply { .. } | Verdict::AlreadyApplied | Verdict::Unsupported(_) => None,
        })
        .collect();
    let mut report = ApplyReport {
        plan,
        conflicts,
        skipped_sensitive,
        workspace: stage.workspace.clone(),
        ..Default::default()
    };
    report.warnings.extend(report.plan.iter().filter_map(|p| match &p.verdict {
        Verdict::Unsupported(why) => Some(format!("{} not applied: {why}", p.change.path.display_escaped())),
        Verdict::Apply { .. } | Verdict::AlreadyApplied | Verdict::Conflict(_) => None,
    }));
    if options.dry_run {
        return Ok(report);
    }
    let (mut trace, terminal) = open_trace(store, &stage)?;
    let attempt = Some(stage.status.attempt.number());
    let started = trace.emit(
        "apply.started",
        attempt,
        terminal,
        json!({"selected": report.plan.len(), "force": options.force}),
        false,
    )?;
    if !report.conflicts.is_empty() {
        let events = report
            .conflicts
            .iter()
            .map(|(c, reason)| {
                (
                    "apply.conflict",
                    attempt,
                    Some(started),
                    json!({"path": c.path, "reason": reason, "refused": true}),
                )
            })
            .collect();
        trace.emit_batch(events)?;
        report.state = Some(stage.state());
        return Ok(report);
    }
    let ledger = Ledger::new(&stage.stage_dir, &stage.status.run);
    let executed = apply::execute(&ws, &upper, &ledger, &report.plan, preimages.sealed_ns, progress);
    let done = match executed {
        Ok(done) => done,
        Err(e) => {
            let _ = trace.emit("apply.failed", attempt, Some(started), json!({"error": e.to_string()}), true);
            return Err(e.into());
        }
    };
    let mut events: Vec<(&str, Option<u32>, Option<u64>, serde_json::Value)> = Vec::new();
    for (change, forced) in &done.applied {
        if *forced {
            events.push((
                "apply.conflict",
                attempt,
                Some(started),
                json!({"path": change.path, "refused": false, "forced": true}),
            ));
        }
        events.push((
            "apply.file",
            attempt,
            Some(started),
            json!({"path": change.path, "kind": change.kind, "blake3": change.blake3, "forced": forced}),
        ));
    }
    for change in &done.already {
        events.push((
            "apply.file",
            attempt,
            Some(started),
            json!({"path": change.path, "kind": change.kind, "already_applied": true}),
        ));
    }
    for (change, error) in &done.failed {
        events.push(("apply.failed", attempt, Some(started), json!({"path": change.path, "error": error})));
    }
    trace.emit_batch(events)?;
    report.executed = true;
    report.failed = done.failed;
    report.warnings.extend(done.warnings);
    let landed = done.applied.iter().map(|(c, _)| c).chain(&done.already);
    let (state, remaining) = stage.after(landed.map(|c| (c.path.clone(), Outcome::Applied)));
    report.state = Some(state);
    report.remaining = remaining;
    Ok(report)
}

/// The hunks chosen of one modified text file (`apply -p`): the file to
/// write, and the host content the hunks were shown against.
#[derive(Debug, Clone)]
pub struct HunkChoice {
    pub path: RelPath,
    /// Content digest of the host file the hunks were computed from.
    pub host_blake3: String,
    /// That host file with the chosen hunks in it.
    pub contents: Vec<u8>,
}

/// What [`apply_hunks`] did.
#[derive(Debug, Default)]
pub struct HunksReport {
    /// Paths now holding some of their hunks, and what the host holds.
    pub written: Vec<(ChangeEntry, PartialState)>,
    /// Paths not written, and why (the host file changed since the hunks were shown…).
    pub refused: Vec<(ChangeEntry, String)>,
    pub state: Option<StageState>,
}

/// Writes some hunks of modified text files (`apply -p`). Each path must be
/// a remaining change whose host file still equals its conflict baseline and
/// still holds exactly the text the hunks were shown against; otherwise it is
/// refused and nothing is written to it. The path stays a remaining change
/// whose baseline is now what was written, so its other hunks can be applied
/// or dropped later, and a host edit after this is still a conflict.
pub fn apply_hunks(store: &Store, job: &JobId, choices: &[HunkChoice]) -> Result<HunksReport, EffectsError> {
    let (mut stage, _locks) = open_for_apply(store, job)?;
    let (ws, _) = stage.roots()?;
    let empty = Preimages::none();
    let preimages = stage.preimages.as_ref().unwrap_or(&empty);
    let ledger = Ledger::new(&stage.stage_dir, &stage.status.run);
    let (mut trace, terminal) = open_trace(store, &stage)?;
    let attempt = Some(stage.status.attempt.number());
    let mut report = HunksReport::default();
    let mut started = None;
    for choice in choices {
        let Some(change) = stage.changes.iter().find(|c| c.path == choice.path) else {
            return Err(
                NoMatch::Nothing { pattern: choice.path.as_path().to_string_lossy().into_owned() }.into()
            );
        };
        let outcome = stage.outcomes.get(&change.path);
        let refusal = if outcome.is_some_and(Outcome::is_settled) {
            Some("it was applied or dropped meanwhile".to_owned())
        } else {
            match apply::verdict(&ws, change, preimages.get(&change.path), outcome, false)? {
                Verdict::Apply { forced: false } => None,
                Verdict::Conflict(reason) => Some(reason),
                Verdict::AlreadyApplied => Some("the host already holds the staged file".into()),
                Verdict::Apply { forced: true } | Verdict::Unsupported(_) => {
                    Some("not a modified text file".into())
                }
            }
        };
        let host = pvisor_stage::preimage::host_state(&ws, change)?;
        let (mode, digest) = match &host {
            pvisor_stage::preimage::HostState::Present { mode, blake3, .. } => (*mode, blake3.clone()),
            pvisor_stage::preimage::HostState::Absent => (0, None),
        };
        let refusal = refusal.or_else(|| {
            (digest.as_deref() != Some(choice.host_blake3.as_str()))
                .then(|| "the host file changed after its hunks were shown".to_owned())
        });
        if let Some(reason) = refusal {
            report.refused.push((change.clone(), reason));
            continue;
        }
        let cause = match started {
            Some(seq) => seq,
            None => {
                let seq = trace.emit(
                    "apply.started",
                    attempt,
                    terminal,
                    json!({"selected": choices.len(), "hunks": true}),
                    false,
                )?;
                started = Some(seq);
                seq
            }
        };
        let state = apply::write_partial(&ws, &ledger, change, &choice.contents, mode)?;
        trace.emit(
            "apply.hunks",
            attempt,
            Some(cause),
            json!({"path": change.path, "blake3": state.blake3, "size": state.size}),
            true,
        )?;
        report.written.push((change.clone(), state));
    }
    let written = report.written.iter().map(|(c, s)| (c.path.clone(), Outcome::Partial(s.clone())));
    report.state = Some(stage.after(written.collect::<Vec<_>>()).0);
    Ok(report)
}

/// What a drop did.
#[derive(Debug, Default)]
pub struct DropReport {
    pub dropped: Vec<ChangeEntry>,
    /// Already applied changes stay applied; drop never undoes them.
    pub already_applied: usize,
    pub state: Option<StageState>,
}

/// Discards the remaining staged changes of `job` (or only those selected).
pub fn drop_changes(store: &Store, job: &JobId, patterns: &[String]) -> Result<DropReport, EffectsError> {
    let stage = Stage::open(store, job)?;
    require_closed(&stage)?;
    let _lock = lock_stage(&stage.stage_dir)?;
    // A workspace that is gone can be written by nobody: nothing to lock or
    // reconcile, and its stage can still be dropped.
    let workspace_exists = stage.workspace.is_dir();
    let _workspace_lock = if workspace_exists { Some(lock_workspace(&stage.workspace)?) } else { None };
    let mut stage = if workspace_exists {
        reconcile(store, job, Stage::open(store, job)?)?
    } else {
        Stage::open(store, job)?
    };
    let selected = apply::select(&stage.changes, patterns)?;
    let mut report = DropReport::default();
    for i in selected {
        let change = &stage.changes[i];
        match stage.outcomes.get(&change.path) {
            Some(Outcome::Applied) => report.already_applied += 1,
            Some(Outcome::Dropped) => {}
            Some(Outcome::Interrupted { .. } | Outcome::Partial(_)) | None => {
                report.dropped.push(change.clone())
            }
        }
    }
    let ledger = Ledger::new(&stage.stage_dir, &stage.status.run);
    let records: Vec<_> = report
        .dropped
        .iter()
        .map(|c| ledger::Entry::new(c.path.clone(), Action::Dropped, None, false))
        .collect();
    ledger.append(&records)?;
    if !report.dropped.is_empty() {
        let (mut trace, terminal) = open_trace(store, &stage)?;
        let paths: Vec<&RelPath> = report.dropped.iter().map(|c| &c.path).collect();
        trace.emit(
            "stage.dropped",
            Some(stage.status.attempt.number()),
            terminal,
            json!({"paths": paths, "already_applied": report.already_applied}),
            true,
        )?;
    }
    let dropped: Vec<_> = report.dropped.iter().map(|c| (c.path.clone(), Outcome::Dropped)).collect();
    report.state = Some(stage.after(dropped).0);
    Ok(report)
}
