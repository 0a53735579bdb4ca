//! The Trace: externally observable facts, one JSON object per line in
//! `runs/<run>/events.jsonl`.
//!
//! Events are not the operation and not log lines. Each has a per-Run sequence
//! number and optionally the sequence number of the event that caused it, so a
//! reader can rebuild causality without trusting timestamps.

use serde::{Deserialize, Serialize};

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
    pub kind: String,
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
