//! The tools on staged changes and records: review, diff, apply, drop,
//! status and jobs. Each resolves its target (a session's head, a Job, or
//! the newest Job of the workspace) and goes through one runtime action.

use std::collections::BTreeMap;

use pvisor::actions::{
    Apply, CloseSessionIfDone, DropChanges, HoldSession, LatestJobIn, ListJobs, ReadSession, ResolveJob,
    Review, Status,
};
use pvisor::{ApplyOptions, ReviewItem, Runtime, Selection};
use pvisor_core::ids::JobId;
use pvisor_core::store::RelPath;

use super::schema::*;
use super::{shown, ToolError};

/// The most changes a review lists.
const REVIEW_MAX: usize = 2000;
/// The most bytes of diff in one answer, and per path by default.
const DIFF_TOTAL_MAX: usize = 512 * 1024;
const DIFF_PATH_DEFAULT: usize = 16 * 1024;

/// A resolved target: the Job, its session's attribution, and the session name.
struct Resolved {
    job: JobId,
    made_by: BTreeMap<RelPath, JobId>,
    session: Option<(String, std::path::PathBuf)>,
    /// For apply and drop: the session held against a new run meanwhile.
    hold: Option<pvisor::actions::SessionHold>,
}

fn resolve(runtime: &Runtime, scope: &super::Scope, target: &Target) -> Result<Resolved, ToolError> {
    let workspace = super::workspace(runtime, target.workspace.as_deref(), scope)?;
    match (&target.session, &target.job) {
        (Some(_), Some(_)) => Err(ToolError::BadArgument("give `session` or `job`, not both".into())),
        (Some(name), None) => {
            let view = runtime.execute(ReadSession { workspace: workspace.clone(), name: name.clone() })?;
            let made_by =
                view.remaining().into_iter().map(|a| (a.change.path.clone(), a.job.clone())).collect();
            let job = view.head_job().cloned().ok_or_else(|| {
                ToolError::Refused(format!(
                    "session {name} has no run yet; the run tool with session {name:?} starts one"
                ))
            })?;
            Ok(Resolved { job, made_by, session: Some((name.clone(), workspace)), hold: None })
        }
        (None, Some(query)) => {
            let job = runtime.execute(ResolveJob { query: Some(query.clone()) })?;
            // A Job of another workspace is as out of reach as that workspace.
            let status = runtime.execute(Status { job: job.clone() })?;
            let canonical = status.workspace.canonicalize().unwrap_or(status.workspace);
            super::in_scope(runtime, &canonical, scope)?;
            Ok(Resolved { job, made_by: BTreeMap::new(), session: None, hold: None })
        }
        (None, None) => match runtime.execute(LatestJobIn { dir: workspace.clone() })? {
            Some((job, _)) => Ok(Resolved { job, made_by: BTreeMap::new(), session: None, hold: None }),
            None => Err(ToolError::Refused(format!(
                "no Job ran over {}; call run first, or name a job or session",
                shown(&workspace.display().to_string())
            ))),
        },
    }
}

pub fn review(runtime: &Runtime, scope: &super::Scope, target: Target) -> Result<ReviewResult, ToolError> {
    let resolved = resolve(runtime, scope, &target)?;
    let stage = runtime.execute(Review { job: resolved.job.clone() })?;
    let items = stage.review(&[], &crate::config::sensitive(runtime.store())?)?;
    let changes = items.iter().take(REVIEW_MAX).map(|item| change(item, &resolved.made_by)).collect();
    Ok(ReviewResult {
        job: resolved.job.to_string(),
        session: resolved.session.map(|(name, _)| name),
        stage: stage.state().as_str().into(),
        confirmed: stage.confirmed,
        changes,
        truncated: items.len() > REVIEW_MAX,
    })
}

fn change(item: &ReviewItem, made_by: &BTreeMap<RelPath, JobId>) -> Change {
    let status = if item.applied {
        "applied"
    } else if item.dropped {
        "dropped"
    } else if item.conflict.is_some() {
        "conflict"
    } else if item.partly_applied {
        "partly-applied"
    } else {
        "pending"
    };
    let remaining = item.remaining();
    let reason = |r: &Option<String>| r.as_deref().filter(|_| remaining).map(shown);
    Change {
        path: item.change.path.display_escaped(),
        kind: item.change.kind.as_str().into(),
        size: item.change.size,
        status: status.into(),
        conflict: reason(&item.conflict),
        sensitive: reason(&item.sensitive),
        refused: reason(&item.forbidden),
        confusable: reason(&item.confusable),
        job: made_by.get(&item.change.path).map(ToString::to_string),
    }
}

pub fn diff(runtime: &Runtime, scope: &super::Scope, args: DiffArgs) -> Result<DiffResult, ToolError> {
    let resolved = resolve(runtime, scope, &args.target)?;
    let stage = runtime.execute(Review { job: resolved.job.clone() })?;
    let items = stage.review(&args.paths, &crate::config::sensitive(runtime.store())?)?;
    let (ws, upper) = stage.diff_roots()?;
    let per_path = args.max_bytes_per_path.unwrap_or(DIFF_PATH_DEFAULT).min(DIFF_TOTAL_MAX);
    let (mut diffs, mut total, mut omitted) = (Vec::new(), 0usize, 0usize);
    for item in items.iter().filter(|i| i.remaining()) {
        if total >= DIFF_TOTAL_MAX {
            omitted += 1;
            continue;
        }
        let mut bytes = Vec::new();
        pvisor_stage::review::write_diff(
            &mut bytes,
            &ws,
            &upper,
            &item.change,
            item.confusable.as_deref(),
            false,
        )
        .map_err(|e| {
            ToolError::Internal(format!("cannot diff {}: {e}", item.change.path.display_escaped()))
        })?;
        let truncated = bytes.len() > per_path;
        bytes.truncate(per_path);
        total += bytes.len();
        diffs.push(FileDiff {
            path: item.change.path.display_escaped(),
            diff: super::shown_output(&bytes),
            truncated,
        });
    }
    Ok(DiffResult { job: resolved.job.to_string(), diffs, omitted })
}

pub fn apply(runtime: &Runtime, scope: &super::Scope, args: ApplyArgs) -> Result<ApplyResult, ToolError> {
    if args.all != args.paths.is_empty() {
        return Err(ToolError::BadArgument("give `paths` to apply, or `all: true` (not both)".into()));
    }
    let mut resolved = resolve_held(runtime, scope, &args.target)?;
    let sensitive = crate::config::sensitive(runtime.store())?;
    let stage = runtime.execute(Review { job: resolved.job.clone() })?;
    let selected: Vec<ReviewItem> =
        stage.review(&args.paths, &sensitive)?.into_iter().filter(|i| i.remaining()).collect();
    // Consent to a sensitive path is the argument, never the way it was named.
    let (chosen, held_back): (Vec<&ReviewItem>, Vec<&ReviewItem>) =
        selected.iter().partition(|i| args.include_sensitive || i.sensitive.is_none());
    let mut skipped: Vec<PathReason> = held_back
        .iter()
        .map(|i| PathReason {
            path: i.change.path.display_escaped(),
            reason: format!(
                "sensitive ({}): pass include_sensitive: true to apply it",
                shown(i.sensitive.as_deref().unwrap_or_default())
            ),
        })
        .collect();
    let options = ApplyOptions {
        force: false,
        force_paths: Vec::new(),
        dry_run: args.dry_run,
        include_sensitive: args.include_sensitive,
        sensitive,
        allow_incomplete: false,
    };
    let selection = Selection::Paths(chosen.iter().map(|i| i.change.path.clone()).collect());
    let report = if chosen.is_empty() {
        None
    } else {
        Some(runtime.execute(Apply {
            job: resolved.job.clone(),
            selection,
            options,
            progress: Box::new(|_| {}),
        })?)
    };
    let mut result = ApplyResult {
        job: resolved.job.to_string(),
        dry_run: args.dry_run,
        applied: Vec::new(),
        skipped: Vec::new(),
        conflicts: Vec::new(),
        remaining: stage.remaining(),
        stage: stage.state().as_str().into(),
        session_ended: false,
    };
    if let Some(report) = report {
        let reasons = |list: &[(pvisor_core::records::ChangeEntry, String)]| -> Vec<PathReason> {
            list.iter()
                .map(|(c, r)| PathReason { path: c.path.display_escaped(), reason: shown(r) })
                .collect()
        };
        result.conflicts = reasons(&report.conflicts);
        skipped.extend(reasons(&report.skipped_sensitive));
        skipped.extend(reasons(&report.refused));
        skipped.extend(reasons(&report.failed));
        if report.executed || args.dry_run {
            result.applied = report
                .plan
                .iter()
                .filter(|p| matches!(p.verdict, pvisor_stage::apply::Verdict::Apply { .. }))
                .map(|p| PathKind {
                    path: p.change.path.display_escaped(),
                    kind: p.change.kind.as_str().into(),
                })
                .collect();
        }
        // Set only once an apply has written (not on a refusal or a dry run).
        if report.executed {
            result.remaining = report.remaining;
            result.stage = report.state.map_or("?", |s| s.as_str()).into();
        }
    }
    result.skipped = skipped;
    if !args.dry_run {
        result.session_ended = end_session(runtime, &mut resolved)?;
    }
    Ok(result)
}

pub fn drop(runtime: &Runtime, scope: &super::Scope, args: DropArgs) -> Result<DropResult, ToolError> {
    let mut resolved = resolve_held(runtime, scope, &args.target)?;
    let report = runtime.execute(DropChanges { job: resolved.job.clone(), patterns: args.paths })?;
    let session_ended = end_session(runtime, &mut resolved)?;
    Ok(DropResult {
        job: resolved.job.to_string(),
        dropped: report
            .dropped
            .iter()
            .map(|c| PathKind { path: c.path.display_escaped(), kind: c.kind.as_str().into() })
            .collect(),
        stage: report.state.map_or("?", |s| s.as_str()).into(),
        session_ended,
    })
}

/// `resolve` for apply and drop: a session is held against a new run
/// until the change is done (refused while one is live).
fn resolve_held(runtime: &Runtime, scope: &super::Scope, target: &Target) -> Result<Resolved, ToolError> {
    let mut resolved = resolve(runtime, scope, target)?;
    if let Some((name, workspace)) = &resolved.session {
        let hold = HoldSession { workspace: workspace.clone(), name: name.clone() };
        resolved.hold = Some(runtime.execute(hold)?);
    }
    Ok(resolved)
}

/// Ends the target's session if nothing is left in it.
fn end_session(runtime: &Runtime, resolved: &mut Resolved) -> Result<bool, ToolError> {
    // The close takes the session's lock itself.
    resolved.hold.take();
    let Some((name, workspace)) = &resolved.session else { return Ok(false) };
    let closed = runtime.execute(CloseSessionIfDone { workspace: workspace.clone(), name: name.clone() })?;
    Ok(closed.is_some())
}

pub fn status(runtime: &Runtime, scope: &super::Scope, target: Target) -> Result<StatusResult, ToolError> {
    let resolved = resolve(runtime, scope, &target)?;
    crate::commands::recover(runtime, &resolved.job).map_err(|e| ToolError::Internal(e.to_string()))?;
    let status = runtime.execute(Status { job: resolved.job.clone() })?;
    Ok(StatusResult { job: resolved.job.to_string(), status: super::sanitised_json(&status) })
}

pub fn jobs(runtime: &Runtime, args: JobsArgs) -> Result<JobsResult, ToolError> {
    let mut jobs = runtime.execute(ListJobs)?;
    jobs.reverse();
    jobs.truncate(args.limit.unwrap_or(20));
    let jobs = jobs
        .iter()
        .map(|(job, status)| match status {
            Ok(status) => super::sanitised_json(status),
            Err(e) => super::sanitised_json(&serde_json::json!({"job": job, "error": e.to_string()})),
        })
        .collect();
    Ok(JobsResult { jobs })
}
