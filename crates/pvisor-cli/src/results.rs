//! What the commands that change something did, as plain serializable
//! values: the `data` of the `result` line (and of the per-path lines) that
//! `run`, `apply`, `drop`, `kill`, `suspend`, `checkpoint` and `export`
//! print with `--json` (see `docs/cli-reference.md`).
//!
//! They are built from what the `pvisor` library returns and know nothing
//! of printing, so any frontend (the CLI's `--json`, an MCP server) can
//! return them as they are.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use pvisor::{ApplyReport, DropReport, Exported, Killed, RunOutcome, StageState, SuspendedOutcome};
use pvisor_core::ids::{AttemptId, JobId, RunId};
use pvisor_core::records::{ChangeEntry, ChangeKind, EntryType, NetworkObservation};
use pvisor_core::state::JobState;
use pvisor_core::store::RelPath;
use pvisor_core::time::Timestamp;
use pvisor_stage::apply::Verdict;

/// How many changed paths a [`ChangesSummary`] lists; past it the list is
/// cut (`truncated`), and `pvisor review --json` gives every one.
pub const CHANGED_PATHS: usize = 100;

/// How a run (`run`, `fork`, `resume`) ended: the `result` line of
/// `run --json`.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    pub job: JobId,
    pub run: RunId,
    /// `<run>.<n>`: the Attempt that ended.
    pub attempt: AttemptId,
    /// `completed`, `failed`, `cancelled`, or `suspended`.
    pub state: JobState,
    /// The command's exit code, when it exited (or 126/127 when it could not
    /// be executed or found).
    pub exit_code: Option<i32>,
    /// The signal that killed the command, when one did.
    pub signal: Option<i32>,
    /// Why the command could not run or finish, when pvisor knows.
    pub error: Option<String>,
    pub receipt: Receipt,
    /// What the command staged; `None` for a suspension (nothing is sealed yet).
    pub changes: Option<ChangesSummary>,
    /// What the command did on the network, when the executor observed it.
    pub network: Option<NetworkSummary>,
    pub workspace: PathBuf,
    /// Non-fatal problems recorded in the Bundle.
    pub warnings: Vec<String>,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    /// A suspension: the execution checkpoint the Job waits in.
    pub suspended: Option<Suspension>,
    /// A resume whose restore failed: the suspended Attempt the Job still
    /// waits in (its checkpoint is intact).
    pub restore_failed_from: Option<u32>,
}

impl RunResult {
    /// The result of a finished Attempt, as its receipt confirms it.
    pub fn from_outcome(outcome: &RunOutcome) -> RunResult {
        let result = &outcome.result;
        RunResult {
            job: outcome.job.clone(),
            run: outcome.run.clone(),
            attempt: outcome.attempt.clone(),
            state: result.state.job_state(),
            exit_code: result.exit_code,
            signal: result.signal,
            error: result.error.clone(),
            receipt: Receipt {
                valid: true,
                kind: ReceiptKind::Completion,
                bundle_blake3: Some(outcome.bundle_blake3.clone()),
                audit_gaps: outcome.audit_gaps.clone(),
            },
            changes: Some(ChangesSummary::of(&outcome.changes)),
            network: outcome.network.as_ref().map(NetworkSummary::from),
            workspace: outcome.workspace.clone(),
            warnings: outcome.warnings.clone(),
            started_at: Some(result.started_at),
            finished_at: Some(result.finished_at),
            suspended: None,
            restore_failed_from: outcome.restore_failed_from,
        }
    }

    /// The result of an Attempt that was suspended before its command finished.
    pub fn from_suspended(outcome: &SuspendedOutcome, workspace: PathBuf) -> RunResult {
        RunResult {
            job: outcome.job.clone(),
            run: outcome.run.clone(),
            attempt: outcome.attempt.clone(),
            state: JobState::Suspended,
            exit_code: None,
            signal: None,
            error: None,
            receipt: Receipt {
                valid: true,
                kind: ReceiptKind::Termination,
                bundle_blake3: None,
                audit_gaps: outcome.audit_gaps.clone(),
            },
            changes: None,
            network: None,
            workspace,
            warnings: Vec::new(),
            started_at: None,
            finished_at: None,
            suspended: Some(Suspension {
                checkpoint: outcome.checkpoint.id.to_string(),
                paused_ms: outcome.checkpoint.paused_ms,
                vm_exit: outcome.vm_exit.clone(),
            }),
            restore_failed_from: None,
        }
    }

    /// pvisor's exit status for this result: the command's own, 128+N for
    /// signal N, 75 for a suspension, 125 when there is neither.
    pub fn exit_status(&self) -> i32 {
        match (self.exit_code, self.signal, self.state) {
            (Some(code), _, _) => code,
            (None, Some(sig), _) => 128 + sig,
            (None, None, JobState::Suspended) => crate::exit::SUSPENDED,
            (None, None, _) => crate::exit::PVISOR_ERROR,
        }
    }

    /// Whether the command never ran: its error, with pvisor's status for
    /// "cannot execute", "not found" or a failed setup.
    pub fn failed_to_start(&self) -> bool {
        use crate::exit::{CANNOT_EXECUTE, NOT_FOUND, PVISOR_ERROR};
        self.error.is_some() && matches!(self.exit_status(), CANNOT_EXECUTE | NOT_FOUND | PVISOR_ERROR)
    }
}

/// What confirms a run's result.
#[derive(Clone, Debug, Serialize)]
pub struct Receipt {
    /// Whether the receipt was committed and binds what is reported. A
    /// result is only ever reported with a valid receipt.
    pub valid: bool,
    pub kind: ReceiptKind,
    /// The BLAKE3 of the Bundle the completion receipt binds.
    pub bundle_blake3: Option<String>,
    /// Facts that could not be recorded after the receipt was committed.
    pub audit_gaps: Vec<String>,
}

/// Which receipt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReceiptKind {
    /// `completion.json`: the command's result and its Bundle.
    Completion,
    /// A vm Attempt's termination receipt: suspended, to be resumed.
    Termination,
}

/// Where a suspended Attempt waits.
#[derive(Clone, Debug, Serialize)]
pub struct Suspension {
    /// The execution checkpoint (`pvisor resume JOB` continues from it).
    pub checkpoint: String,
    /// How long the guest was paused to save it.
    pub paused_ms: u64,
    /// How the QEMU process ended.
    pub vm_exit: String,
}

/// The staged changes of a run, in short.
#[derive(Clone, Debug, Serialize)]
pub struct ChangesSummary {
    pub total: usize,
    /// How many of each kind (`added`, `modified`, `deleted`, …).
    pub by_kind: BTreeMap<&'static str, usize>,
    /// The first [`CHANGED_PATHS`] changes, by path.
    pub paths: Vec<ChangedPath>,
    /// Whether `paths` stops short of `total`.
    pub truncated: bool,
}

impl ChangesSummary {
    pub fn of(changes: &[ChangeEntry]) -> ChangesSummary {
        let mut by_kind = BTreeMap::new();
        for change in changes {
            *by_kind.entry(change.kind.as_str()).or_default() += 1;
        }
        ChangesSummary {
            total: changes.len(),
            by_kind,
            paths: changes.iter().take(CHANGED_PATHS).map(ChangedPath::from).collect(),
            truncated: changes.len() > CHANGED_PATHS,
        }
    }
}

/// One staged change: its path (a string, or `{"hex": …}` for a name that
/// is not UTF-8) and kind.
#[derive(Clone, Debug, Serialize)]
pub struct ChangedPath {
    pub path: RelPath,
    pub kind: ChangeKind,
}

impl From<&ChangeEntry> for ChangedPath {
    fn from(change: &ChangeEntry) -> Self {
        ChangedPath { path: change.path.clone(), kind: change.kind }
    }
}

/// The network a run was attached to, and what went through pvisor's proxy.
#[derive(Clone, Debug, Serialize)]
pub struct NetworkSummary {
    /// e.g. "own network namespace, loopback only".
    pub attachment: String,
    /// False when the command shared the host network (nothing was filtered).
    pub non_bypassable: bool,
    /// Requests allowed that reached their destination.
    pub allowed: u64,
    /// Requests allowed that could not be resolved or connected.
    pub failed: u64,
    pub denied: u64,
    /// The most denied hosts, most first.
    pub top_denied: Vec<DeniedHost>,
    /// The destinations that failed most (`host:port`), most first.
    pub top_failed: Vec<DeniedHost>,
}

/// A host the proxy refused, and how often.
#[derive(Clone, Debug, Serialize)]
pub struct DeniedHost {
    pub host: String,
    pub count: u64,
}

impl From<&NetworkObservation> for NetworkSummary {
    fn from(net: &NetworkObservation) -> Self {
        NetworkSummary {
            attachment: net.attachment.clone(),
            non_bypassable: net.non_bypassable,
            allowed: net.allowed,
            failed: net.failed,
            denied: net.denied,
            top_denied: net
                .top_denied
                .iter()
                .map(|(host, count)| DeniedHost { host: host.clone(), count: *count })
                .collect(),
            top_failed: net
                .top_failed
                .iter()
                .map(|(host, port, count)| {
                    let host = if host.contains(':') {
                        format!("[{host}]:{port}")
                    } else {
                        format!("{host}:{port}")
                    };
                    DeniedHost { host, count: *count }
                })
                .collect(),
        }
    }
}

/// A command that failed before it could say what it did: the `error`
/// line every `--json` command ends with instead of its `result`.
#[derive(Clone, Debug, Serialize)]
pub struct ErrorResult {
    pub message: String,
    /// The causes under `message`, outermost first.
    pub causes: Vec<String>,
    /// What to do about it, when pvisor knows.
    pub hint: Option<String>,
    /// pvisor's exit status (125).
    pub exit_code: i32,
}

impl ErrorResult {
    pub fn from_error(err: &anyhow::Error) -> ErrorResult {
        ErrorResult {
            message: err.to_string(),
            causes: err.chain().skip(1).map(ToString::to_string).collect(),
            hint: crate::exit::hint_for(err),
            exit_code: crate::exit::PVISOR_ERROR,
        }
    }
}

/// A path an apply wrote (`applied`), or, in a dry run, would (`planned`).
#[derive(Clone, Debug, Serialize)]
pub struct AppliedPath {
    pub path: RelPath,
    pub kind: ChangeKind,
    pub entry: EntryType,
    /// Written over a conflict (`--force`).
    pub forced: bool,
    /// The workspace already held exactly this; nothing was written.
    pub already: bool,
    /// Not selected, but needed by a selected path (a parent directory).
    pub implied: bool,
}

impl AppliedPath {
    /// Every path `report` applied (or would), in the order planned. None
    /// when conflicts refused the apply.
    pub fn from_report(report: &ApplyReport) -> Vec<AppliedPath> {
        if !report.conflicts.is_empty() {
            return Vec::new();
        }
        let failed = |path: &RelPath| report.failed.iter().any(|(c, _)| &c.path == path);
        report
            .plan
            .iter()
            .filter(|p| !failed(&p.change.path))
            .filter_map(|p| {
                let (forced, already) = match p.verdict {
                    Verdict::Apply { forced } => (forced, false),
                    Verdict::AlreadyApplied => (false, true),
                    Verdict::Unsupported(_) | Verdict::Conflict(_) => return None,
                };
                let c = &p.change;
                Some(AppliedPath {
                    path: c.path.clone(),
                    kind: c.kind,
                    entry: c.entry,
                    forced,
                    already,
                    implied: p.implied,
                })
            })
            .collect()
    }
}

/// A branch or tag moved by a commit made in the sandbox: the `commit`
/// line of `apply --json`, one per ref.
#[derive(Clone, Debug, Serialize)]
pub struct MovedRef {
    /// The full ref name (`refs/heads/main`).
    #[serde(rename = "ref")]
    pub name: String,
    /// The host's value before (null: a new ref).
    pub old: Option<String>,
    pub new: String,
    /// The host already held it at `new`: nothing was moved.
    pub already: bool,
    /// Not moved: git refused the compare-and-swap (see the `skipped` line).
    pub failed: bool,
    /// Objects the host lacked (for the whole commit, on each line).
    pub new_objects: usize,
    /// Staged `.git/` paths settled with the commit (none copied).
    pub paths: usize,
}

impl MovedRef {
    /// Every ref `report`'s commit moved, found already moved, or could not move.
    pub fn from_report(report: &ApplyReport) -> Vec<MovedRef> {
        let Some(commit) = &report.commit else { return Vec::new() };
        let line = |m: &pvisor_stage::commits::RefMove, already: bool, failed: bool| MovedRef {
            name: m.name.clone(),
            old: m.old.clone(),
            new: m.new.clone(),
            already,
            failed,
            new_objects: commit.new_objects,
            paths: commit.paths.len(),
        };
        let mut out: Vec<MovedRef> = commit.moved.iter().map(|m| line(m, false, false)).collect();
        out.extend(commit.already.iter().map(|m| line(m, true, false)));
        out.extend(commit.failed.iter().map(|(m, _)| line(m, false, true)));
        out
    }
}

/// A selected path an apply did not apply, and why.
#[derive(Clone, Debug, Serialize)]
pub struct SkippedPath {
    pub path: RelPath,
    pub kind: ChangeKind,
    pub reason: SkipReason,
    /// The reason in words (the host's state, the sensitive rule, the error).
    pub detail: String,
}

/// Why a selected path was not applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// The workspace changed since the run; nothing was applied (`--force` overwrites).
    Conflict,
    /// It makes the host run code; selected only by `--all`, a glob or a
    /// directory (name it exactly, or pass `--include-sensitive`).
    Sensitive,
    /// pvisor's own config or state: never applied.
    Refused,
    /// A device node, fifo or socket: never created.
    Unsupported,
    /// It could not be written (the other paths were).
    Failed,
}

impl SkippedPath {
    /// Every selected path `report` did not apply: conflicts, sensitive,
    /// refused, unsupported, then failed.
    pub fn from_report(report: &ApplyReport) -> Vec<SkippedPath> {
        let with = |reason: SkipReason| {
            move |(c, detail): &(ChangeEntry, String)| SkippedPath {
                path: c.path.clone(),
                kind: c.kind,
                reason,
                detail: detail.clone(),
            }
        };
        let unsupported = report.plan.iter().filter_map(|p| match &p.verdict {
            Verdict::Unsupported(why) => Some((p.change.clone(), why.clone())),
            _ => None,
        });
        let unsupported: Vec<_> = unsupported.collect();
        let mut skipped: Vec<SkippedPath> = report.conflicts.iter().map(with(SkipReason::Conflict)).collect();
        skipped.extend(report.skipped_sensitive.iter().map(with(SkipReason::Sensitive)));
        skipped.extend(report.refused.iter().map(with(SkipReason::Refused)));
        skipped.extend(unsupported.iter().map(with(SkipReason::Unsupported)));
        skipped.extend(report.failed.iter().map(with(SkipReason::Failed)));
        skipped
    }
}

/// What an apply did: the `result` line of `apply --json`.
#[derive(Clone, Debug, Serialize)]
pub struct ApplyResult {
    pub job: JobId,
    pub dry_run: bool,
    /// Paths applied (or, in a dry run, that would be), including those the
    /// workspace already matched.
    pub applied: usize,
    /// Selected paths not applied, for any reason (the counts below).
    pub skipped: usize,
    /// Branches and tags a commit made in the sandbox moved (or would):
    /// each is a `commit` line, and its `.git/` paths are not counted in
    /// `applied`.
    pub refs_moved: usize,
    /// Paths in conflict: when there is one, nothing was applied.
    pub conflicts: usize,
    pub sensitive: usize,
    pub refused: usize,
    pub unsupported: usize,
    pub failed: usize,
    /// Changes neither applied nor dropped now.
    pub remaining: usize,
    /// Whether anything remains staged (`remaining > 0`).
    pub staged: bool,
    /// The stage's state (`pending`, `partially-applied`, `applied`, …).
    pub stage_state: Option<StageState>,
    pub workspace: PathBuf,
    /// What to pass or do for what was not applied.
    pub hints: Vec<String>,
}

impl ApplyResult {
    /// The counts of `report` for `job`. `remaining` and `stage_state` are
    /// the report's: after an apply that wrote nothing (a dry run, a
    /// conflict) give the stage's own with [`ApplyResult::with_stage`].
    pub fn from_report(job: &JobId, report: &ApplyReport, dry_run: bool) -> ApplyResult {
        let skipped = SkippedPath::from_report(report);
        let count = |reason| skipped.iter().filter(|s| s.reason == reason).count();
        let mut result = ApplyResult {
            job: job.clone(),
            dry_run,
            applied: AppliedPath::from_report(report).len(),
            skipped: skipped.len(),
            refs_moved: if report.conflicts.is_empty() {
                report.commit.as_ref().map_or(0, |c| c.moved.len())
            } else {
                0
            },
            conflicts: count(SkipReason::Conflict),
            sensitive: count(SkipReason::Sensitive),
            refused: count(SkipReason::Refused),
            unsupported: count(SkipReason::Unsupported),
            failed: count(SkipReason::Failed),
            remaining: 0,
            staged: false,
            stage_state: None,
            workspace: report.workspace.clone(),
            hints: Vec::new(),
        };
        result.hints = result.hints_for(job);
        result.with_stage(report.remaining, report.state)
    }

    /// The stage as it is after the apply.
    pub fn with_stage(mut self, remaining: usize, state: Option<StageState>) -> ApplyResult {
        self.remaining = remaining;
        self.staged = remaining > 0;
        self.stage_state = state;
        self
    }

    /// pvisor's exit status: 1 when conflicts refused the apply, or a
    /// selected path was skipped as sensitive, refused, or not written; else 0.
    pub fn exit_status(&self) -> i32 {
        i32::from(self.conflicts + self.sensitive + self.refused + self.failed > 0)
    }

    fn hints_for(&self, job: &JobId) -> Vec<String> {
        let mut hints = Vec::new();
        if self.conflicts > 0 {
            hints.push(format!("the workspace changed since the run: nothing was applied; review with `pvisor review {job} --diff`, then apply other paths or pass --force to overwrite"));
        }
        if self.sensitive > 0 {
            hints.push("sensitive paths make the host run code: review them, then name each exactly or pass --include-sensitive".into());
        }
        if self.refused > 0 {
            hints.push(format!(
                "pvisor never applies its own config or state: drop them with `pvisor drop {job} PATH`"
            ));
        }
        hints
    }
}

/// What a drop did: the `result` line of `drop --json`.
#[derive(Clone, Debug, Serialize)]
pub struct DropResult {
    pub job: JobId,
    /// Changes discarded (each also a `dropped` line: a [`ChangedPath`]).
    pub dropped: usize,
    /// Changes already applied, which stay in the workspace.
    pub already_applied: usize,
    pub stage_state: Option<StageState>,
}

impl DropResult {
    pub fn from_report(job: &JobId, report: &DropReport) -> DropResult {
        DropResult {
            job: job.clone(),
            dropped: report.dropped.len(),
            already_applied: report.already_applied,
            stage_state: report.state,
        }
    }

    /// Every change `report` dropped.
    pub fn paths(report: &DropReport) -> Vec<ChangedPath> {
        report.dropped.iter().map(ChangedPath::from).collect()
    }
}

/// What a kill did: the `result` line of `kill --json`.
#[derive(Clone, Debug, Serialize)]
pub struct KillResult {
    pub job: JobId,
    /// The state the Job is in now (`cancelled`, `lost`, …).
    pub state: JobState,
    /// Whether it had ended before: nothing was done.
    pub already_ended: bool,
    /// The supervisor that was stopped, when one was.
    pub stopped_owner: Option<i32>,
}

impl KillResult {
    pub fn new(job: &JobId, killed: &Killed) -> KillResult {
        let (state, already_ended, stopped_owner) = match *killed {
            Killed::AlreadyEnded(state) => (state, true, None),
            Killed::Ended { state, stopped_owner } => (state, false, stopped_owner),
        };
        KillResult { job: job.clone(), state, already_ended, stopped_owner }
    }
}

/// A suspension: the `result` line of `suspend --json`.
#[derive(Clone, Debug, Serialize)]
pub struct SuspendResult {
    pub job: JobId,
    /// `suspended`.
    pub state: JobState,
    /// The execution checkpoint it was saved to.
    pub checkpoint: String,
}

/// A checkpoint taken: the `result` line of `checkpoint --json`.
#[derive(Clone, Debug, Serialize)]
pub struct CheckpointResult {
    pub job: JobId,
    /// Its id (`ckpt-…`): `pvisor fork ID -- COMMAND` starts from it.
    pub checkpoint: String,
    /// `workspace` or `execution`.
    pub kind: &'static str,
    /// A workspace checkpoint's entries (staged files and baselines).
    pub entries: Option<usize>,
    /// A workspace checkpoint's copy method (`reflink` or `copy`).
    pub copy_method: Option<String>,
}

/// An archive written: the `result` line of `export --json`.
#[derive(Clone, Debug, Serialize)]
pub struct ExportResult {
    pub job: JobId,
    /// The archive file.
    pub archive: PathBuf,
    /// The BLAKE3 of the archive file (what `b3sum` prints).
    pub blake3: String,
    pub bytes: u64,
    /// Its entries, MANIFEST.json included.
    pub entries: usize,
    /// False for a lost Job's unconfirmed stage (inspect it; it cannot be
    /// imported or applied).
    pub confirmed: bool,
}

impl ExportResult {
    /// Reads `archive`, as `export` wrote it for `job`, to digest it.
    pub fn new(job: &JobId, archive: PathBuf, exported: &Exported) -> std::io::Result<ExportResult> {
        let mut hasher = blake3::Hasher::new();
        let bytes = std::io::copy(&mut std::fs::File::open(&archive)?, &mut hasher)?;
        Ok(ExportResult {
            job: job.clone(),
            archive,
            blake3: hasher.finalize().to_hex().to_string(),
            bytes,
            entries: exported.manifest.files.len() + 1,
            confirmed: exported.confirmed,
        })
    }
}
