//! Read projections: job lookup, status, lists and the Trace.
//!
//! A view never trusts a terminal field on its own. The state it reports is
//! the one confirmed by a valid receipt; without one, a live owner (its lock
//! is held) means `pending`/`running`, and an absent owner means `unknown`.
//! Corrupt records are errors that name the file, never a guess.

use std::path::PathBuf;

use serde::Serialize;

use pvisor_core::event::Event;
use pvisor_core::ids::{AttemptId, JobId, RunId};
use pvisor_core::records::{AttemptRecord, Bundle, JobRecord, RunRecord};
use pvisor_core::state::JobState;
use pvisor_core::store::{self, OwnerLock, Store, StoreError};
use pvisor_core::time::Timestamp;

use crate::records::completion::{self, ReceiptError};

/// A failed read.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("No job matches {query:?}; `pvisor jobs` lists them")]
    NotFound { query: String },
    #[error("{query:?} matches several jobs ({}); give more characters", candidates.join(", "))]
    Ambiguous { query: String, candidates: Vec<String> },
    #[error("There are no jobs yet in {}; start one with `pvisor run -- COMMAND`", root.display())]
    NoJobs { root: PathBuf },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Receipt(#[from] ReceiptError),
    #[error(transparent)]
    Stage(pvisor_stage::StageError),
    #[error(transparent)]
    Suspension(Box<crate::records::suspension::SuspensionError>),
    #[error(
        "{} does not match the records that bind it: {reason}. It was changed outside pvisor; \
         nothing is applied from it (restore it from a backup, or `pvisor export` another copy)",
        path.display()
    )]
    Unbound { path: PathBuf, reason: String },
    /// The Trace no longer begins with the prefix its Bundle binds.
    #[error(
        "{} does not match the records that bind it: {source}. It was changed outside pvisor; \
         nothing is applied from it (restore it from a backup, or `pvisor export` another copy)",
        path.display()
    )]
    TraceUnbound {
        path: PathBuf,
        #[source]
        source: pvisor_core::journal::PrefixError,
    },
}

/// Checks that `job.json`, `run.json` and `attempt.json` name each other,
/// so a record swapped in from another Job is refused by name.
fn check_identity(
    store: &Store,
    job_id: &JobId,
    job: &JobRecord,
    run: &RunRecord,
    attempt_id: &AttemptId,
    attempt: &AttemptRecord,
) -> Result<(), ViewError> {
    let unbound = |path: PathBuf, reason: String| Err(ViewError::Unbound { path, reason });
    if &job.id != job_id {
        return unbound(store.job_file(job_id), format!("it names {}", job.id));
    }
    if run.id != job.run || &run.job != job_id {
        return unbound(store.run_file(&job.run), format!("it names {} of {}", run.id, run.job));
    }
    if &attempt.id != attempt_id || &attempt.job != job_id {
        return unbound(
            store.attempt_file(attempt_id),
            format!("it names {} of {}", attempt.id, attempt.job),
        );
    }
    Ok(())
}

/// Checks `run.json` and the Trace's sealed prefix against the digests its
/// Bundle fixed at finalization.
pub(crate) fn check_run_binding(
    store: &Store,
    run: &RunRecord,
    bundle: &pvisor_core::records::Bundle,
) -> Result<(), ViewError> {
    match &bundle.binding {
        Some(binding) if binding.run_blake3 != run.fixed_digest() => Err(ViewError::Unbound {
            path: store.run_file(&run.id),
            reason: "its workspace, command or policy differs from the one its Bundle and receipt bind"
                .into(),
        }),
        Some(binding) => match &binding.trace {
            Some(prefix) => pvisor_core::journal::Journal::new(store.events_file(&run.id))
                .check_prefix(prefix)
                .map_err(|source| ViewError::TraceUnbound { path: store.events_file(&run.id), source }),
            None => Ok(()),
        },
        // Bundles written before the binding existed bind nothing here.
        None => Ok(()),
    }
}

/// Resolves a job reference: an id, a unique prefix (with or without `job-`),
/// or nothing for the most recent Job.
/// The most recent Job whose workspace contains `dir` (canonical), newest
/// first; `None` when no Job's does (or none can be read).
pub fn latest_job_in(store: &Store, dir: &std::path::Path) -> Result<Option<(JobId, PathBuf)>, ViewError> {
    for job in store.list_jobs()?.into_iter().rev() {
        let Ok(record) = store.read::<JobRecord>(&store.job_file(&job)) else { continue };
        if dir.starts_with(&record.workspace) {
            return Ok(Some((job, record.workspace)));
        }
    }
    Ok(None)
}

pub fn resolve_job(store: &Store, query: Option<&str>) -> Result<JobId, ViewError> {
    let jobs = store.list_jobs()?;
    let Some(query) = query else {
        return jobs.last().cloned().ok_or_else(|| ViewError::NoJobs { root: store.root().to_owned() });
    };
    let wanted = if query.starts_with(JobId::PREFIX) {
        query.to_owned()
    } else {
        format!("{}{}", JobId::PREFIX, query.to_ascii_uppercase())
    };
    if let Some(exact) = jobs.iter().find(|j| j.as_str() == wanted) {
        return Ok(exact.clone());
    }
    let matches: Vec<&JobId> = jobs.iter().filter(|j| j.as_str().starts_with(&wanted)).collect();
    match matches.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(ViewError::NotFound { query: query.to_owned() }),
        many => Err(ViewError::Ambiguous {
            query: query.to_owned(),
            candidates: many.iter().take(5).map(|j| j.to_string()).collect(),
        }),
    }
}

/// What is known about a receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReceiptStatus {
    /// Present and valid: the result below is confirmed.
    Valid,
    /// Not (yet) written.
    Missing,
}

/// The status of one Job, as `pvisor status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct JobStatus {
    pub job: JobId,
    pub run: RunId,
    pub attempt: AttemptId,
    /// The confirmed or derived state (see the module doc).
    pub state: JobState,
    /// Whether a live process owns the Attempt right now.
    pub live: bool,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub error: Option<String>,
    pub workspace: PathBuf,
    pub program: String,
    pub args: Vec<String>,
    pub created_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub receipt: ReceiptStatus,
    /// Changed paths in the Bundle's manifest (confirmed runs only).
    pub changes: Option<usize>,
    pub stage: PathBuf,
    /// Where the staged changes stand (confirmed runs only).
    pub stage_state: Option<crate::records::StageState>,
    /// Facts the Trace is missing even though the receipt is valid.
    pub audit_gaps: Vec<String>,
    /// The parent Job and checkpoint, for a fork.
    pub lineage: Option<pvisor_core::records::Lineage>,
    /// The archive a read-only, imported Job came from.
    pub imported_from: Option<String>,
    /// The executor backend (`ns` or `vm`).
    pub executor: String,
    /// The userland a vm Job's command ran in (`--image`): name and digest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<pvisor_core::records::UserlandImage>,
    /// For a suspended vm Job: the execution checkpoint its termination receipt names.
    pub suspended_to: Option<pvisor_core::ids::CheckpointId>,
    /// The labels given at admission (`--label`, the containerd shim's).
    pub labels: pvisor_core::labels::Labels,
}

/// Builds the status of `job`.
pub fn status(store: &Store, job_id: &JobId) -> Result<JobStatus, ViewError> {
    Ok(status_with_bundle(store, job_id)?.0)
}

/// Builds the status of `job`, with the Run Bundle its valid receipt binds
/// (checked against the receipt and the Run once, for a caller that needs
/// the changes too: a Bundle of 10,000 changes is 2 MB to parse).
pub fn status_with_bundle(store: &Store, job_id: &JobId) -> Result<(JobStatus, Option<Bundle>), ViewError> {
    let job: JobRecord = store.read(&store.job_file(job_id))?;
    let run: RunRecord = store.read(&store.run_file(&job.run))?;
    let attempt_id = AttemptId::new(run.id.clone(), job.target_attempt);
    let attempt: AttemptRecord = store.read(&store.attempt_file(&attempt_id))?;
    check_identity(store, job_id, &job, &run, &attempt_id, &attempt)?;
    let live = OwnerLock::is_held(&store.lock_file(&attempt_id))?;
    let mut status = JobStatus {
        job: job.id.clone(),
        run: run.id.clone(),
        attempt: attempt_id.clone(),
        state: job.state,
        live,
        exit_code: None,
        signal: None,
        error: None,
        workspace: run.workspace.clone(),
        program: run.operation.program.clone(),
        args: run.operation.args.clone(),
        created_at: job.created_at,
        started_at: attempt.started_at,
        finished_at: None,
        receipt: ReceiptStatus::Missing,
        changes: None,
        stage: store.stage_dir(&run.id),
        stage_state: None,
        audit_gaps: Vec::new(),
        lineage: job.lineage.clone(),
        imported_from: job.imported_from.clone(),
        executor: run.operation.placement.executor.clone(),
        image: run.operation.policy.image.clone(),
        suspended_to: None,
        labels: job.labels.clone(),
    };
    let mut bound = None;
    match completion::load(store, &job.id, &attempt_id)? {
        Some((receipt, bundle)) => {
            check_run_binding(store, &run, &bundle)?;
            let result = receipt.result;
            status.state =
                if job.state == JobState::Lost { JobState::Lost } else { result.state.job_state() };
            status.exit_code = result.exit_code;
            status.signal = result.signal;
            status.error = result.error;
            status.finished_at = Some(result.finished_at);
            status.receipt = ReceiptStatus::Valid;
            status.changes = Some(bundle.changes.len());
            let outcomes = pvisor_stage::ledger::Ledger::new(&status.stage, &status.run).outcomes().map_err(
                |e| match e {
                    pvisor_stage::StageError::Record(s) => ViewError::Store(s),
                    other => ViewError::Stage(other),
                },
            )?;
            status.stage_state =
                Some(crate::records::StageState::of_stage(&bundle.changes, &outcomes, &status.stage));
            let terminal = result.state.terminal_event();
            let (events, _) = events(store, &run.id)?;
            if !events.iter().any(|e| e.kind == terminal) {
                status.audit_gaps.push(format!("receipt valid, terminal event {terminal} missing"));
            }
            bound = Some(bundle);
        }
        None if live => {}
        None if job.state != JobState::Lost => {
            // A resume that died while preparing leaves the suspension usable.
            let suspension = if job.state == JobState::Suspended {
                crate::records::suspension::resumable(store, &job).map(|f| f.map(|(_, r, m)| (r, m)))
            } else {
                crate::records::suspension::load(store, &job.id, &attempt_id)
            };
            match suspension.map_err(|e| ViewError::Suspension(Box::new(e)))? {
                Some((receipt, _)) => {
                    status.state = JobState::Suspended;
                    status.suspended_to = Some(receipt.checkpoint);
                }
                // No owner and no receipt: whatever the records say, the result is unknown.
                None => status.state = JobState::Unknown,
            }
        }
        None => {}
    }
    Ok((status, bound))
}

/// Reads a Run's Trace. A torn final line (a crash mid-append) is skipped and
/// reported; a corrupt line elsewhere is an error naming the file and line.
pub fn events(store: &Store, run: &RunId) -> Result<(Vec<Event>, Vec<String>), ViewError> {
    let path = store.events_file(run);
    let bytes = match store::read_capped(&path, store::RECORD_READ_CAP) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok((Vec::new(), Vec::new())),
        Err(e) => return Err(e.into()),
    };
    let mut events = Vec::new();
    let mut warnings = Vec::new();
    let lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()).collect();
    let torn_tail = !bytes.ends_with(b"\n");
    let mut last_seq = 0;
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_slice::<Event>(line) {
            Ok(event) if &event.run != run => {
                return Err(ViewError::Unbound {
                    path,
                    reason: format!("line {} is an event of {}, not of {run}", i + 1, event.run),
                });
            }
            Ok(event) => {
                if event.seq <= last_seq {
                    warnings.push(format!(
                        "{}: line {} has seq {} after seq {last_seq}: the Trace is out of order",
                        path.display(),
                        i + 1,
                        event.seq
                    ));
                }
                last_seq = last_seq.max(event.seq);
                events.push(event);
            }
            Err(_) if torn_tail && i + 1 == lines.len() => warnings
                .push(format!("{}: last line is incomplete (interrupted write); skipped", path.display())),
            Err(source) => {
                return Err(StoreError::Corrupt { path: path.clone(), what: "events.jsonl", source }.into());
            }
        }
    }
    Ok((events, warnings))
}

/// One row of [`list`]: a Job id and its status, or why it cannot be read.
pub type JobListing = (JobId, Result<JobStatus, ViewError>);

/// Lists every Job's status, oldest first. A Job whose records are broken is
/// returned as an error beside the others instead of hiding them.
pub fn list(store: &Store) -> Result<Vec<JobListing>, ViewError> {
    Ok(store
        .list_jobs()?
        .into_iter()
        .map(|id| {
            let status = status(store, &id);
            (id, status)
        })
        .collect())
}
