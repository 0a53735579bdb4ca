//! The data of each Trace event kind, as the runtime writes it.
//!
//! One type per kind (or per shape, where a kind has several); kinds whose
//! data is a record already (`admission.policy`: the EffectivePolicy,
//! `placement.decided`: the Placement, `fork.lineage`: the Lineage,
//! `network.*`: the proxy's event, `attempt.<executor>`: the executor's
//! facts) pass that record. Fields serialize as the JSON objects the
//! emitters used to build by hand, so `docs/operation-and-event.md` and
//! every existing Trace still describe them: an absent value that was
//! written as `null` stays `null`, a key that was left out stays out.

use std::path::Path;

use serde::Serialize;

use pvisor_core::ids::{AttemptId, CheckpointId, JobId};
use pvisor_core::records::{ChangeKind, NetworkMode, NetworkRule};
use pvisor_core::state::JobState;
use pvisor_core::store::RelPath;

/// `job.created`.
#[derive(Debug, Serialize)]
pub(crate) struct JobCreated<'a> {
    pub job: &'a JobId,
    pub workspace: &'a Path,
    pub program: &'a str,
    pub args: &'a [String],
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: &'a pvisor_core::labels::Labels,
}

/// `network.policy_changed`: the ordered policy the proxy decides by from
/// now on, replaced while the Job runs.
#[derive(Debug, Serialize)]
pub(crate) struct NetworkPolicyChanged<'a> {
    pub policy: &'a pvisor_core::records::OrderedPolicy,
}

/// `admission.network`: the network decision, made once.
#[derive(Debug, Serialize)]
pub(crate) struct AdmissionNetwork<'a> {
    pub mode: NetworkMode,
    pub mode_source: &'a str,
    /// With mode `namespace`: the network namespace the VM's NIC joined.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<&'a Path>,
    pub allow: &'a [NetworkRule],
    pub deny: &'a [NetworkRule],
    /// How the executor attaches the sandbox, in words.
    pub attachment: String,
    pub non_bypassable: bool,
}

/// `admission.rewrite`: one change pvisor made to what the command gets.
#[derive(Debug, Serialize)]
#[serde(tag = "rewrite")]
pub(crate) enum AdmissionRewrite<'a> {
    #[serde(rename = "hide")]
    Hide { path: &'a Path, reason: &'a str },
    #[serde(rename = "hide.skipped")]
    HideSkipped { path: &'a Path, reason: &'a str },
    #[serde(rename = "cache")]
    Cache { path: &'a Path, reason: &'a str },
    #[serde(rename = "state")]
    State { path: &'a Path, reason: &'a str },
    #[serde(rename = "expose.socket")]
    ExposeSocket { path: &'a Path, reason: &'a str },
    #[serde(rename = "read.only")]
    ReadOnly { path: &'a Path, reason: &'a str },
    #[serde(rename = "share")]
    Share { path: &'a Path, target: &'a Path, reason: &'a str },
    #[serde(rename = "env.remove")]
    EnvRemove { name: &'a str, reason: &'a str },
    #[serde(rename = "env.set")]
    EnvSet { name: &'a str },
    /// A `--secret`: the variable and the one destination its value goes to.
    #[serde(rename = "secret")]
    Secret { name: &'a str, host: &'a str, port: Option<u16>, reason: &'a str },
}

/// `attempt.created`.
#[derive(Debug, Serialize)]
pub(crate) struct AttemptCreated<'a> {
    pub attempt: &'a AttemptId,
    pub executor: &'a str,
    /// For a resume: the execution checkpoint it restores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore: Option<&'a CheckpointId>,
}

/// `resume.requested`.
#[derive(Debug, Serialize)]
pub(crate) struct ResumeRequested<'a> {
    pub from_attempt: &'a AttemptId,
    pub checkpoint: &'a CheckpointId,
}

/// `attempt.started`.
#[derive(Debug, Serialize)]
pub(crate) struct AttemptStarted<'a> {
    pub executor: &'a str,
}

/// `attempt.limits`.
#[derive(Debug, Serialize)]
pub(crate) struct AttemptLimits<'a> {
    pub limits: &'a [pvisor_sandbox::limits::Enforcement],
}

/// `attempt.stage_incomplete`.
#[derive(Debug, Serialize)]
pub(crate) struct AttemptStageIncomplete<'a> {
    pub error: &'a str,
}

/// `run.cancel_requested`.
#[derive(Debug, Serialize)]
pub(crate) struct RunCancelRequested {
    pub signal: i32,
    pub grace_ms: u64,
}

/// `run.kill_escalated`.
#[derive(Debug, Serialize)]
pub(crate) struct RunKillEscalated<'a> {
    pub reason: &'a str,
    /// Set when the grace period expired.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grace_ms: Option<u64>,
}

/// `attempt.exited`.
#[derive(Debug, Serialize)]
pub(crate) struct AttemptExited<'a> {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub error: Option<&'a str>,
}

/// `stage.sealed`.
#[derive(Debug, Serialize)]
pub(crate) struct StageSealed {
    pub changes: usize,
    /// Changes with no conflict baseline (their host file could not be read).
    pub without_baseline: usize,
}

/// `bundle.saved`.
#[derive(Debug, Serialize)]
pub(crate) struct BundleSaved<'a> {
    pub file: &'a str,
    pub size: u64,
    pub blake3: &'a str,
}

/// `run.completed`, `run.failed`, `run.cancelled`: the receipt is committed.
#[derive(Debug, Serialize)]
pub(crate) struct RunEnded<'a> {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub error: Option<&'a str>,
    pub changes: usize,
    pub receipt: &'a str,
}

/// `run.hibernated`: the termination receipt is committed.
#[derive(Debug, Serialize)]
pub(crate) struct RunHibernated<'a> {
    pub checkpoint: &'a CheckpointId,
    pub vm_exit: &'a str,
    pub paused_ms: u64,
    pub save_ms: u64,
    pub receipt: &'a str,
}

/// `apply.started`.
#[derive(Debug, Serialize)]
pub(crate) struct ApplyStarted {
    pub selected: usize,
    /// Whole files: whether `--force` was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub force: Option<bool>,
    /// Set for `apply -p` (some hunks of files).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hunks: Option<bool>,
}

/// `apply.conflict`: refused (with the reason), or forced.
#[derive(Debug, Serialize)]
pub(crate) struct ApplyConflict<'a> {
    pub path: &'a RelPath,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'a str>,
    pub refused: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forced: Option<bool>,
}

/// `apply.file`: written now, or found already on the host.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum ApplyFile<'a> {
    Written {
        path: &'a RelPath,
        kind: ChangeKind,
        blake3: &'a Option<String>,
        forced: bool,
    },
    AlreadyApplied {
        path: &'a RelPath,
        kind: ChangeKind,
        already_applied: bool,
    },
    /// A path of a commit made inside the sandbox, settled when the commit
    /// landed (never copied); `git_ref`, `old` and `new` on the ref it moved.
    Commit {
        path: &'a RelPath,
        kind: ChangeKind,
        with_commit: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        git_ref: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        old: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        new: Option<&'a str>,
    },
}

/// `apply.failed`: the whole apply (no path) or one path.
#[derive(Debug, Serialize)]
pub(crate) struct ApplyFailed<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<&'a RelPath>,
    pub error: &'a str,
}

/// `apply.hunks`.
#[derive(Debug, Serialize)]
pub(crate) struct ApplyHunks<'a> {
    pub path: &'a RelPath,
    pub blake3: &'a str,
    pub size: u64,
}

/// `apply.reconciled`.
#[derive(Debug, Serialize)]
pub(crate) struct ApplyReconciled<'a> {
    pub paths: Vec<&'a RelPath>,
    pub reason: &'a str,
}

/// `stage.dropped`.
#[derive(Debug, Serialize)]
pub(crate) struct StageDropped<'a> {
    pub paths: Vec<&'a RelPath>,
    pub already_applied: usize,
}

/// `checkpoint.created`.
#[derive(Debug, Serialize)]
pub(crate) struct CheckpointCreated<'a> {
    pub checkpoint: &'a CheckpointId,
    pub kind: &'a str,
    pub entries: usize,
    pub copy_method: &'a str,
    pub left_out: &'a [pvisor_core::records::LeftOut],
}

/// `stage.collected`, `job.continuation_withdrawn`: who did it.
#[derive(Debug, Serialize)]
pub(crate) struct By<'a> {
    pub by: &'a str,
}

/// `recovery.reconciled`.
#[derive(Debug, Serialize)]
pub(crate) struct RecoveryReconciled<'a> {
    pub state: JobState,
    pub attempt: &'a AttemptId,
}

/// `recovery.unknown`.
#[derive(Debug, Serialize)]
pub(crate) struct RecoveryUnknown<'a> {
    pub attempt: &'a AttemptId,
    pub reason: &'a str,
}

/// `job.lost`.
#[derive(Debug, Serialize)]
pub(crate) struct JobLost<'a> {
    pub reason: &'a str,
}

#[cfg(test)]
mod tests {
    use serde_json::{json, to_value};

    use super::*;

    /// The shapes with optional or variant keys encode exactly as the
    /// `json!` objects the emitters wrote before these types existed.
    #[test]
    fn each_shape_encodes_as_the_object_it_replaces() {
        let path = Path::new("/home/u/.ssh");
        let rel = RelPath::new(Path::new("src/a.rs"));
        let pairs = [
            (
                to_value(AdmissionRewrite::HideSkipped { path, reason: "r" }).unwrap(),
                json!({"rewrite": "hide.skipped", "path": path, "reason": "r"}),
            ),
            (
                to_value(AdmissionRewrite::EnvSet { name: "PVISOR_JOB" }).unwrap(),
                json!({"rewrite": "env.set", "name": "PVISOR_JOB"}),
            ),
            (
                to_value(RunKillEscalated { reason: "second cancellation request", grace_ms: None }).unwrap(),
                json!({"reason": "second cancellation request"}),
            ),
            (
                to_value(AttemptExited { exit_code: None, signal: Some(9), error: None }).unwrap(),
                json!({"exit_code": null, "signal": 9, "error": null}),
            ),
            (
                to_value(ApplyStarted { selected: 2, force: None, hunks: Some(true) }).unwrap(),
                json!({"selected": 2, "hunks": true}),
            ),
            (
                to_value(ApplyConflict { path: &rel, reason: None, refused: false, forced: Some(true) })
                    .unwrap(),
                json!({"path": rel, "refused": false, "forced": true}),
            ),
            (
                to_value(ApplyFile::Written {
                    path: &rel,
                    kind: ChangeKind::Modified,
                    blake3: &None,
                    forced: false,
                })
                .unwrap(),
                json!({"path": rel, "kind": ChangeKind::Modified, "blake3": null, "forced": false}),
            ),
            (
                to_value(ApplyFile::AlreadyApplied {
                    path: &rel,
                    kind: ChangeKind::Added,
                    already_applied: true,
                })
                .unwrap(),
                json!({"path": rel, "kind": ChangeKind::Added, "already_applied": true}),
            ),
            (
                to_value(ApplyFile::Commit {
                    path: &rel,
                    kind: ChangeKind::Modified,
                    with_commit: true,
                    git_ref: Some("refs/heads/main"),
                    old: None,
                    new: Some("abc"),
                })
                .unwrap(),
                json!({"path": rel, "kind": ChangeKind::Modified, "with_commit": true, "git_ref": "refs/heads/main", "new": "abc"}),
            ),
            (to_value(ApplyFailed { path: None, error: "e" }).unwrap(), json!({"error": "e"})),
        ];
        for (new, old) in pairs {
            assert_eq!(new, old);
        }
    }
}

/// `trace.coalesced`: events the command caused that were counted rather
/// than written (see `session::budget`).
#[derive(Debug, Serialize)]
pub(crate) struct TraceCoalesced<'a> {
    /// Per kind and host, the events past the first `written_per_host`.
    pub coalesced: Vec<CoalescedEvents<'a>>,
    pub written_per_host: u64,
    /// Events not written because the Trace had reached `cap_bytes`.
    pub dropped: u64,
    pub cap_bytes: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct CoalescedEvents<'a> {
    pub kind: &'a str,
    pub host: &'a str,
    pub count: u64,
}
