//! The Trace: externally observable facts, one JSON object per line in
//! `runs/<run>/events.jsonl`.
//!
//! Events are not the operation and not log lines. Each has a per-Run sequence
//! number and optionally the sequence number of the event that caused it, so a
//! reader can rebuild causality without trusting timestamps.
//!
//! [`EventKind`] is the vocabulary: one variant per type pvisor writes,
//! each listed in `docs/operation-and-event.md`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ids::RunId;
use crate::time::Timestamp;

/// One fact in the Trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub format: u32,
    /// `<run-id>:<seq>`.
    pub id: String,
    pub run: RunId,
    /// 1-based, strictly increasing within a Run.
    pub seq: u64,
    pub time: Timestamp,
    /// e.g. `job.created`, `admission.policy`, `run.failed`; see `docs/operation-and-event.md`.
    #[serde(rename = "type")]
    pub kind: EventKind,
    /// The Attempt number this fact belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// The `seq` of the event that caused this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<u64>,
    #[serde(default)]
    pub data: serde_json::Value,
}

impl Event {
    /// Returns the Trace id for sequence number `seq` of `run`.
    pub fn id_for(run: &RunId, seq: u64) -> String {
        format!("{run}:{seq}")
    }
}

/// A type the Trace holds but this pvisor does not write (a newer pvisor's,
/// or a damaged line's): kept verbatim so the Trace still loads and its
/// type is shown as it was written. Only [`EventKind::from_str`] makes one,
/// and only for a string no known kind has, so a known type always compares
/// equal to its variant.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UnknownKind(String);

impl UnknownKind {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Declares [`EventKind`] and its dotted names once, so the enum, its
/// parser and [`EventKind::ALL`] cannot disagree.
macro_rules! event_kinds {
    ($($(#[$doc:meta])* $variant:ident => $name:literal,)*) => {
        /// The type of a Trace event, written as its dotted name (`"type"`
        /// in `events.jsonl`, unchanged from when it was a bare string).
        ///
        /// The record keeps an `EventKind`, not a `String`, so every writer
        /// names a kind that exists and every reader matches on variants;
        /// [`EventKind::Other`] keeps any type this pvisor does not know
        /// (written by a newer one), so an old or foreign Trace still loads.
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub enum EventKind {
            $($(#[$doc])* $variant,)*
            /// A type this pvisor does not write; see [`UnknownKind`].
            Other(UnknownKind),
        }

        impl EventKind {
            /// Every kind this pvisor writes.
            pub const ALL: &'static [EventKind] = &[$(EventKind::$variant,)*];

            /// The dotted name, as written in the Trace.
            pub fn as_str(&self) -> &str {
                match self {
                    $(Self::$variant => $name,)*
                    Self::Other(unknown) => unknown.as_str(),
                }
            }
        }

        impl FromStr for EventKind {
            type Err = std::convert::Infallible;

            /// Never fails: a name no kind has becomes [`EventKind::Other`].
            fn from_str(name: &str) -> Result<Self, Self::Err> {
                Ok(match name {
                    $($name => Self::$variant,)*
                    other => Self::Other(UnknownKind(other.to_owned())),
                })
            }
        }
    };
}

event_kinds! {
    /// Admission accepted the request.
    JobCreated => "job.created",
    /// The effective policy was resolved.
    AdmissionPolicy => "admission.policy",
    /// pvisor changed what the command gets (a hidden path, a variable…).
    AdmissionRewrite => "admission.rewrite",
    /// The network decision, made once.
    AdmissionNetwork => "admission.network",
    /// One request through the proxy (or connection to a forwarded
    /// loopback port) was allowed and connected.
    NetworkAllowed => "network.allowed",
    /// One request the policy allowed could not be resolved or connected:
    /// nothing was reached.
    NetworkFailed => "network.failed",
    /// One request through the proxy was denied.
    NetworkDenied => "network.denied",
    /// A `--secret`'s value was put into a request to its bound host
    /// (recorded by variable name, never the value).
    NetworkSecretSubstituted => "network.secret_substituted",
    /// The ordered policy was replaced while the Job ran (`pvisor serve`'s
    /// `PATCH`/`DELETE /policy`): what decides from then on.
    NetworkPolicyChanged => "network.policy_changed",
    /// A frontend put a credential vault in force, or deleted it (`pvisor
    /// serve`'s `/credential-vault`): its revision and binding names, never a value.
    NetworkVaultChanged => "network.vault_changed",
    /// A credential vault binding's headers were put into a request
    /// (recorded by binding and header names, never the values).
    NetworkCredentialInjected => "network.credential_injected",
    /// A command a frontend ran through the running Job's guest (`pvisor
    /// serve`'s execd): its text, user, exit status and duration.
    FrontendCommand => "frontend.command",
    /// Events the command caused past the Trace's bound, counted instead of written.
    TraceCoalesced => "trace.coalesced",
    /// The executor was chosen.
    PlacementDecided => "placement.decided",
    /// An Attempt exists.
    AttemptCreated => "attempt.created",
    /// The sandbox is ready and the program is being executed.
    AttemptStarted => "attempt.started",
    /// How each resource limit is enforced, or that it is not.
    AttemptLimits => "attempt.limits",
    /// A frontend asked to stop the run; the signal was forwarded.
    RunCancelRequested => "run.cancel_requested",
    /// The sandbox was SIGKILLed.
    RunKillEscalated => "run.kill_escalated",
    /// The sandbox is gone.
    AttemptExited => "attempt.exited",
    /// Staged files are fsynced and the manifest is taken.
    StageSealed => "stage.sealed",
    /// The Run Bundle is on disk.
    BundleSaved => "bundle.saved",
    /// Terminal: the command exited 0 and the receipt is committed.
    RunCompleted => "run.completed",
    /// Terminal: the command failed and the receipt is committed.
    RunFailed => "run.failed",
    /// Terminal: the run was cancelled and the receipt is committed.
    RunCancelled => "run.cancelled",
    /// A `--disk` stage could not be copied out of memory whole.
    AttemptStageIncomplete => "attempt.stage_incomplete",
    /// The ns executor's facts (how host Unix sockets are kept out).
    AttemptNs => "attempt.ns",
    /// The vm executor's facts (the guest answered; what a restore repaired).
    AttemptVm => "attempt.vm",
    /// Terminal for a vm Attempt: suspended, its termination receipt committed.
    RunHibernated => "run.hibernated",
    /// `pvisor resume` admitted a new Attempt of a suspended Job.
    ResumeRequested => "resume.requested",
    /// An apply began.
    ApplyStarted => "apply.started",
    /// A selected path no longer matched its baseline.
    ApplyConflict => "apply.conflict",
    /// A change is on the host.
    ApplyFile => "apply.file",
    /// Some hunks of a modified file are on the host.
    ApplyHunks => "apply.hunks",
    /// An apply stopped on an error, or one path could not be written.
    ApplyFailed => "apply.failed",
    /// A killed apply had already written these paths.
    ApplyReconciled => "apply.reconciled",
    /// Changes were discarded.
    StageDropped => "stage.dropped",
    /// This Job is a fork.
    ForkLineage => "fork.lineage",
    /// A checkpoint of this Run was published.
    CheckpointCreated => "checkpoint.created",
    /// gc removed the staged files.
    StageCollected => "stage.collected",
    /// A reader settled the records from a valid receipt whose owner had gone.
    RecoveryReconciled => "recovery.reconciled",
    /// A reader found neither an owner nor a receipt.
    RecoveryUnknown => "recovery.unknown",
    /// `kill` withdrew the Job's continuation rights.
    JobContinuationWithdrawn => "job.continuation_withdrawn",
    /// `kill` closed a Job without a receipt.
    JobLost => "job.lost",
}

impl EventKind {
    /// Whether this is the terminal event of a finished run (the receipt is
    /// committed): what every apply and drop is caused by.
    pub fn is_run_end(&self) -> bool {
        matches!(self, Self::RunCompleted | Self::RunFailed | Self::RunCancelled)
    }

    /// The kind of the facts executor `executor` reports once its sandbox
    /// is ready (`attempt.<executor>`).
    pub fn executor_facts(executor: &str) -> Self {
        let Ok(kind) = format!("attempt.{executor}").parse();
        kind
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for EventKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EventKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        let Ok(kind) = name.parse();
        Ok(kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_dotted_name() {
        for kind in EventKind::ALL {
            let json = serde_json::to_string(kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
            assert_eq!(&serde_json::from_str::<EventKind>(&json).unwrap(), kind);
            assert_eq!(&kind.as_str().parse::<EventKind>().unwrap(), kind);
            assert!(!matches!(kind, EventKind::Other(_)));
        }
    }

    #[test]
    fn an_unknown_kind_still_loads_and_is_written_back_unchanged() {
        let run = RunId::generate();
        let event = Event {
            format: 1,
            id: Event::id_for(&run, 1),
            run,
            seq: 1,
            time: Timestamp::now(),
            kind: EventKind::JobCreated,
            attempt: None,
            cause: None,
            data: serde_json::Value::Null,
        };
        let line = serde_json::to_string(&event).unwrap();
        assert!(line.contains(r#""type":"job.created""#));
        let line = line.replace(r#""type":"job.created""#, r#""type":"future.kind""#);
        let read: Event = serde_json::from_str(&line).unwrap();
        assert!(matches!(read.kind, EventKind::Other(_)));
        assert_eq!(read.kind.as_str(), "future.kind");
        assert_eq!(serde_json::to_string(&read).unwrap(), line);
    }

    /// The table of `docs/operation-and-event.md` and the enum list the same
    /// kinds: each kind has a row, and each row names only kinds.
    #[test]
    fn the_documented_kinds_are_the_enum() {
        let doc = include_str!("../../../docs/operation-and-event.md");
        let rows = doc.lines().filter_map(|l| l.strip_prefix("| `")).filter_map(|l| l.split(" |").next());
        let documented: std::collections::BTreeSet<&str> =
            rows.flat_map(|row| row.split(" / ")).map(|name| name.trim_matches('`')).collect();
        let kinds: std::collections::BTreeSet<&str> = EventKind::ALL.iter().map(EventKind::as_str).collect();
        assert_eq!(documented, kinds, "docs/operation-and-event.md and EventKind differ");
    }
}
