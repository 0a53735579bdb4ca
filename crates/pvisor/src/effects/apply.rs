//! Applying whole changes to the workspace: selection (sensitive paths only
//! when named), the plan with its conflicts, execution, and the `apply.*`
//! events. A commit made inside the sandbox is taken out of the selection
//! and landed as a commit (`pvisor_stage::commits`), after the files.

use std::path::PathBuf;

use pvisor_core::event::EventKind;
use pvisor_core::ids::JobId;
use pvisor_core::records::ChangeEntry;
use pvisor_core::store::{RelPath, Store};
use pvisor_stage::apply::{self, error_chain, Planned, Verdict};
use pvisor_stage::beneath::Root;
use pvisor_stage::commits::{self, Checked, RefMove};
use pvisor_stage::ledger::{Action, Entry, Ledger, Outcome};
use pvisor_stage::preimage::Preimages;

use super::commit_verdict::{judge_commit, CommitVerdict};
use super::writers::{open_for_apply, open_trace};
use super::{EffectsError, Sensitive, Stage, StageState};
use crate::trace::{data, Pending};

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
    /// Apply from a stage its Bundle marks incomplete (`--allow-incomplete`).
    pub allow_incomplete: bool,
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
    /// pvisor's own configuration or state: never applied, whatever the
    /// selection or flags, with the reason.
    pub refused: Vec<(ChangeEntry, String)>,
    /// Paths that could not be written (the rest were applied).
    pub failed: Vec<(ChangeEntry, String)>,
    pub warnings: Vec<String>,
    pub state: Option<StageState>,
    /// Changes neither applied nor dropped once this apply is done.
    pub remaining: usize,
    /// The workspace it applied to.
    pub workspace: PathBuf,
    /// The commit made inside the sandbox, when the selection took it.
    pub commit: Option<CommitReport>,
}

/// A commit made inside the sandbox that an apply took: the branches and
/// tags it moves, and the staged `.git/` paths settled with it.
#[derive(Debug, Default, Clone)]
pub struct CommitReport {
    /// Branches and tags moved (on a dry run, or when conflicts refused
    /// the apply: to move).
    pub moved: Vec<RefMove>,
    /// Those the host already held at the sandbox's value.
    pub already: Vec<RefMove>,
    /// Those git would not move (the host moved them meanwhile), with why.
    pub failed: Vec<(RefMove, String)>,
    /// The staged `.git/` paths that land (or are settled) with it: objects,
    /// packs, refs, reflogs, the index. None is ever copied.
    pub paths: Vec<ChangeEntry>,
    /// Objects the host lacked.
    pub new_objects: usize,
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

/// Applies the selected changes of `job`'s stage.
pub fn apply(
    store: &Store,
    job: &JobId,
    selection: &Selection,
    options: ApplyOptions,
    progress: impl FnMut(&ChangeEntry),
) -> Result<ApplyReport, EffectsError> {
    let (mut stage, _locks) = open_for_apply(store, job)?;
    if let (Some(why), false) = (&stage.incomplete, options.allow_incomplete) {
        return Err(EffectsError::Incomplete { job: job.clone(), why: why.clone() });
    }
    let (ws, upper) = stage.roots()?;
    let remaining: Vec<ChangeEntry> = stage
        .changes
        .iter()
        .filter(|c| !stage.outcomes.get(&c.path).is_some_and(Outcome::is_settled))
        .cloned()
        .collect();
    let mut selected = select(&stage, &remaining, selection)?;
    let commit = take_commit(&stage, (&ws, &upper), &remaining, &mut selected)?;
    // pvisor's own configuration and state are never applied; a sensitive
    // path is applied only when named exactly (or chosen one by one, or
    // with --include-sensitive): never swept in by --all or a glob.
    let sensitive = options.sensitive.bind(&stage.workspace, Some(&ws), Some(&upper), &stage.changes);
    let held = match &commit {
        Some(c) => {
            let verdict =
                judge_commit(c, &options.sensitive, (&stage.workspace, &stage.changes), (&ws, &upper));
            commit_held(c, verdict, &remaining, selection, &options)
        }
        None => CommitHeld::No,
    };
    let commit = commit.filter(|_| matches!(held, CommitHeld::No));
    let consent = consented(selected, &remaining, &sensitive, selection, &options);
    let mut report = plan(&stage, &ws, &remaining, consent, &options)?;
    match held {
        CommitHeld::No => {}
        CommitHeld::Skipped(refs) => report.skipped_sensitive.extend(refs),
        CommitHeld::Refused(refs) => report.refused.extend(refs),
    }
    if let Some(checked) = &commit {
        report_commit(&mut report, checked, &remaining, &stage.status.job);
    }
    if options.dry_run {
        return Ok(report);
    }
    let landing = commit.as_ref().map(|checked| (checked, remaining.as_slice()));
    execute(store, &mut stage, (&ws, &upper), options.force, report, landing, progress)
}

/// The commit made inside the sandbox, when `selected` takes any of its
/// paths (`--all`, `.git`, a ref named), checked against the host; its
/// paths leave `selected`: they land as a commit, never as files.
fn take_commit(
    stage: &Stage,
    (ws, upper): (&Root, &Root),
    remaining: &[ChangeEntry],
    selected: &mut Vec<usize>,
) -> Result<Option<Checked>, EffectsError> {
    let in_git_dir = |i: &usize| remaining[*i].path.as_path().starts_with(commits::GIT_DIR);
    if !selected.iter().any(in_git_dir) || !commits::host_repository(ws)? || !commits::git_available() {
        return Ok(None);
    }
    let Some(staged) = commits::find(remaining, ws, upper)? else { return Ok(None) };
    if !staged.members.iter().any(|m| selected.contains(m)) {
        return Ok(None);
    }
    selected.retain(|i| !staged.members.contains(i));
    Ok(Some(commits::verify(&stage.workspace, upper, remaining, staged, &stage.stage_dir)?))
}

/// Whether the commit is held back, and its refs with why.
enum CommitHeld {
    No,
    /// Needs consent the selection did not give.
    Skipped(Vec<(ChangeEntry, String)>),
    /// Never landed, whatever the flags.
    Refused(Vec<(ChangeEntry, String)>),
}

/// Holds the commit back when `verdict` says it is forbidden, or needs
/// consent that the selection did not give: `--include-sensitive`, the
/// `.git` directory or one of the commit's own paths named exactly, or a
/// path chosen one by one.
fn commit_held(
    checked: &Checked,
    verdict: CommitVerdict,
    remaining: &[ChangeEntry],
    selection: &Selection,
    options: &ApplyOptions,
) -> CommitHeld {
    // The refs stand for the commit: naming one (as the hint shows) lands it.
    let mut refs: Vec<usize> = checked.moves.iter().map(|m| m.change).collect();
    refs.sort_unstable();
    refs.dedup();
    let refs = |why: String| refs.iter().map(|&i| (remaining[i].clone(), why.clone())).collect();
    let why = match verdict {
        CommitVerdict::Free => return CommitHeld::No,
        CommitVerdict::Forbidden(why) => return CommitHeld::Refused(refs(why)),
        CommitVerdict::Sensitive(why) => why,
    };
    let member = |path: &RelPath| checked.members.iter().any(|&i| &remaining[i].path == path);
    let named = options.include_sensitive
        || match selection {
            Selection::Paths(paths) => paths.iter().any(member),
            Selection::Patterns(patterns) => patterns.iter().any(|p| {
                p.trim_end_matches('/') == commits::GIT_DIR
                    || checked.members.iter().any(|&i| names_exactly(p, &remaining[i].path))
            }),
        };
    if named {
        CommitHeld::No
    } else {
        CommitHeld::Skipped(refs(why))
    }
}

/// Puts the checked commit in the report: each ref that cannot land is a
/// conflict (which refuses the whole apply), with what to do.
fn report_commit(report: &mut ApplyReport, checked: &Checked, remaining: &[ChangeEntry], job: &JobId) {
    for refusal in &checked.refused {
        let reason = format!(
            "{}; the commit is never forced: to apply the files without the commit, `pvisor drop {job} .git` \
             then apply again",
            refusal.reason
        );
        report.conflicts.push((remaining[refusal.change].clone(), reason));
    }
    report.commit = Some(CommitReport {
        moved: checked.moves.clone(),
        already: checked.already.clone(),
        failed: Vec::new(),
        paths: checked.members.iter().map(|&i| remaining[i].clone()).collect(),
        new_objects: checked.new_objects,
    });
}

/// The indices in `remaining` that `selection` picks.
fn select(
    stage: &Stage,
    remaining: &[ChangeEntry],
    selection: &Selection,
) -> Result<Vec<usize>, EffectsError> {
    Ok(match selection {
        Selection::Patterns(patterns) => apply::select(remaining, patterns).or_else(|e| {
            // A pattern that names only already-applied changes is not an error.
            apply::select(&stage.changes, patterns).map(|_| Vec::new()).map_err(|_| e)
        })?,
        Selection::Paths(paths) => {
            (0..remaining.len()).filter(|&i| paths.contains(&remaining[i].path)).collect()
        }
    })
}

/// What the user consented to apply of what was selected.
struct Consent {
    selected: Vec<usize>,
    /// Never applied, whatever the flags.
    refused: Vec<(ChangeEntry, String)>,
    /// Sensitive, and not named exactly.
    skipped_sensitive: Vec<(ChangeEntry, String)>,
}

/// Keeps of `selected` what may be applied: never pvisor's own config and
/// state; a sensitive path only when named exactly, chosen one by one, or
/// with `include_sensitive`.
fn consented(
    selected: Vec<usize>,
    remaining: &[ChangeEntry],
    sensitive: &pvisor_stage::sensitive::Bound<'_>,
    selection: &Selection,
    options: &ApplyOptions,
) -> Consent {
    let mut refused = Vec::new();
    let mut skipped_sensitive = Vec::new();
    let selected: Vec<usize> = selected
        .into_iter()
        .filter(|&i| {
            let change = &remaining[i];
            if let Some(why) = sensitive.forbidden(change) {
                refused.push((change.clone(), why));
                return false;
            }
            let Some(reason) = sensitive.reason_for(change) else { return true };
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
    Consent { selected, refused, skipped_sensitive }
}

/// Plans the consented changes (and the directories they need) against
/// the workspace: each one's verdict, the conflicts, and the warnings.
fn plan(
    stage: &Stage,
    ws: &pvisor_stage::beneath::Root,
    remaining: &[ChangeEntry],
    consent: Consent,
    options: &ApplyOptions,
) -> Result<ApplyReport, EffectsError> {
    let with_parents = apply::with_required_ancestors(ws, remaining, &consent.selected)?;
    let empty = Preimages::none();
    let preimages = stage.preimages.as_ref().unwrap_or(&empty);
    let mut plan = apply::plan(ws, remaining, &with_parents, preimages, &stage.outcomes, options.force)?;
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
        skipped_sensitive: consent.skipped_sensitive,
        refused: consent.refused,
        workspace: stage.workspace.clone(),
        ..Default::default()
    };
    report.warnings.extend(report.plan.iter().filter_map(|p| match &p.verdict {
        Verdict::Unsupported(why) => Some(format!("{} not applied: {why}", p.change.path.display_escaped())),
        Verdict::Apply { .. } | Verdict::AlreadyApplied | Verdict::Conflict(_) => None,
    }));
    Ok(report)
}

/// Records the start of the apply, then refuses it on a conflict, or
/// writes the plan and records each file; the stage's state follows.
fn execute(
    store: &Store,
    stage: &mut Stage,
    (ws, upper): (&pvisor_stage::beneath::Root, &pvisor_stage::beneath::Root),
    force: bool,
    mut report: ApplyReport,
    commit: Option<(&Checked, &[ChangeEntry])>,
    progress: impl FnMut(&ChangeEntry),
) -> Result<ApplyReport, EffectsError> {
    let (mut trace, terminal) = open_trace(store, stage)?;
    let attempt = Some(stage.status.attempt.number());
    let begun = data::ApplyStarted { selected: report.plan.len(), force: Some(force), hunks: None };
    let started = trace.emit(EventKind::ApplyStarted, attempt, terminal, &begun, false)?;
    if !report.conflicts.is_empty() {
        let events = report
            .conflicts
            .iter()
            .map(|(c, reason)| {
                let refused =
                    data::ApplyConflict { path: &c.path, reason: Some(reason), refused: true, forced: None };
                Pending::new(EventKind::ApplyConflict, attempt, Some(started), &refused)
            })
            .collect();
        trace.emit_batch(events)?;
        report.state = Some(stage.state());
        return Ok(report);
    }
    let ledger = Ledger::new(&stage.stage_dir, &stage.status.run);
    let sealed_ns = stage.preimages.as_ref().map_or_else(|| Preimages::none().sealed_ns, |p| p.sealed_ns);
    let executed = apply::execute(ws, upper, &ledger, &report.plan, sealed_ns, progress);
    let done = match executed {
        Ok(done) => done,
        Err(e) => {
            let failed = data::ApplyFailed { path: None, error: &e.to_string() };
            let _ = trace.emit(EventKind::ApplyFailed, attempt, Some(started), &failed, true);
            return Err(e.into());
        }
    };
    trace.emit_batch(applied_events(&done, attempt, Some(started)))?;
    report.executed = true;
    report.failed = done.failed;
    report.warnings.extend(done.warnings);
    // The commit lands after the files, so the branch moves onto a work
    // tree that already holds what it records.
    let settled = match commit {
        Some((checked, remaining)) => {
            let message = format!("pvisor apply: the commit of job {}", stage.status.job);
            let settled = land_commit(ws, &ledger, checked, remaining, &mut report, &message)?;
            trace.emit_batch(commit_events(&report, (&settled, remaining), attempt, Some(started)))?;
            settled
        }
        None => Vec::new(),
    };
    let landed = done.applied.iter().map(|(c, _)| c).chain(&done.already).chain(&settled);
    let (state, remaining) = stage.after(landed.map(|c| (c.path.clone(), Outcome::Applied)));
    report.state = Some(state);
    report.remaining = remaining;
    Ok(report)
}

/// Lands the checked commit and, once every ref moved, records its paths
/// as applied (after a `syncfs`); returns them. A ref git would not move
/// (the host moved it since the check) is a failed path, and the commit's
/// paths stay pending: the next apply finds the moved refs already there.
fn land_commit(
    ws: &Root,
    ledger: &Ledger,
    checked: &Checked,
    remaining: &[ChangeEntry],
    report: &mut ApplyReport,
    message: &str,
) -> Result<Vec<ChangeEntry>, EffectsError> {
    let landed = match checked.land(ws, message) {
        Ok(landed) => landed,
        Err(e) => commits::Landed {
            failed: checked.moves.iter().map(|m| (m.clone(), error_chain(&e))).collect(),
            ..Default::default()
        },
    };
    report.warnings.extend(landed.warnings);
    for (mv, why) in &landed.failed {
        report.failed.push((remaining[mv.change].clone(), format!("{} was not moved: {why}", mv.name)));
    }
    let settled = landed.failed.is_empty();
    if let Some(commit) = report.commit.as_mut() {
        commit.moved = landed.moved;
        commit.failed = landed.failed;
    }
    if !settled {
        return Ok(Vec::new());
    }
    ws.sync().map_err(|e| pvisor_stage::StageError::io("sync", "the workspace", e))?;
    let paths: Vec<ChangeEntry> = checked.members.iter().map(|&i| remaining[i].clone()).collect();
    let entries: Vec<Entry> =
        paths.iter().map(|c| Entry::new(c.path.clone(), Action::Applied, c.blake3.clone(), false)).collect();
    ledger.append(&entries)?;
    Ok(paths)
}

/// The Trace's record of a landed commit: one `apply.file` per ref moved
/// (with the ref and both hashes) and per other path settled with it.
fn commit_events(
    report: &ApplyReport,
    (settled, remaining): (&[ChangeEntry], &[ChangeEntry]),
    attempt: Option<u32>,
    cause: Option<u64>,
) -> Vec<Pending> {
    let moved = report.commit.as_ref().map(|c| c.moved.as_slice()).unwrap_or_default();
    let mut events = Vec::new();
    for change in settled {
        let refs: Vec<&RefMove> = moved.iter().filter(|m| remaining[m.change].path == change.path).collect();
        if refs.is_empty() {
            events.push(Pending::new(EventKind::ApplyFile, attempt, cause, &commit_file(change, None)));
        }
        for mv in refs {
            events.push(Pending::new(EventKind::ApplyFile, attempt, cause, &commit_file(change, Some(mv))));
        }
    }
    events
}

fn commit_file<'a>(change: &'a ChangeEntry, mv: Option<&'a RefMove>) -> data::ApplyFile<'a> {
    data::ApplyFile::Commit {
        path: &change.path,
        kind: change.kind,
        with_commit: true,
        git_ref: mv.map(|m| m.name.as_str()),
        old: mv.and_then(|m| m.old.as_deref()),
        new: mv.map(|m| m.new.as_str()),
    }
}

/// The Trace's record of what an apply wrote, found applied, or failed.
fn applied_events(done: &apply::Executed, attempt: Option<u32>, cause: Option<u64>) -> Vec<Pending> {
    let mut events: Vec<Pending> = Vec::new();
    for (change, forced) in &done.applied {
        if *forced {
            let conflict =
                data::ApplyConflict { path: &change.path, reason: None, refused: false, forced: Some(true) };
            events.push(Pending::new(EventKind::ApplyConflict, attempt, cause, &conflict));
        }
        let file = data::ApplyFile::Written {
            path: &change.path,
            kind: change.kind,
            blake3: &change.blake3,
            forced: *forced,
        };
        events.push(Pending::new(EventKind::ApplyFile, attempt, cause, &file));
    }
    for change in &done.already {
        let file =
            data::ApplyFile::AlreadyApplied { path: &change.path, kind: change.kind, already_applied: true };
        events.push(Pending::new(EventKind::ApplyFile, attempt, cause, &file));
    }
    for (change, error) in &done.failed {
        let failed = data::ApplyFailed { path: Some(&change.path), error };
        events.push(Pending::new(EventKind::ApplyFailed, attempt, cause, &failed));
    }
    events
}
