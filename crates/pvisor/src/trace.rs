//! Appends events to a Run's Trace (`events.jsonl`).
//!
//! Sequence numbers come from the file, under its lock ([`Journal`]), never
//! from a counter in memory: the owner, `kill`, recovery, apply and drop may
//! append to one Trace at the same time and still get one strictly
//! increasing sequence.

use pvisor_core::event::Event;
use pvisor_core::ids::RunId;
use pvisor_core::journal::Journal;
use pvisor_core::records::FORMAT;
use pvisor_core::store::{Store, StoreError};

use pvisor_core::time::Timestamp;

/// A writer of one Run's Trace.
#[derive(Debug)]
pub(crate) struct Trace {
    journal: Journal,
    run: RunId,
}

impl Trace {
    pub(crate) fn open(store: &Store, run: &RunId) -> Self {
        Self { journal: Journal::new(store.events_file(run)), run: run.clone() }
    }

    fn line(
        &self,
        seq: u64,
        kind: &str,
        attempt: Option<u32>,
        cause: Option<u64>,
        data: serde_json::Value,
    ) -> Vec<u8> {
        let event = Event {
            format: FORMAT,
            id: Event::id_for(&self.run, seq),
            run: self.run.clone(),
            seq,
            time: Timestamp::now(),
            kind: kind.to_owned(),
            attempt,
            cause,
            data,
        };
        serde_json::to_vec(&event).unwrap_or_default()
    }

    /// Appends several events in one write, fsynced; returns the first seq.
    pub(crate) fn emit_batch(
        &mut self,
        events: Vec<(&str, Option<u32>, Option<u64>, serde_json::Value)>,
    ) -> Result<u64, StoreError> {
        let count = events.len() as u64;
        self.journal.append(count, true, |first| {
            let lines: Vec<Vec<u8>> = events
                .into_iter()
                .enumerate()
                .map(|(i, (kind, attempt, cause, data))| {
                    self.line(first + i as u64, kind, attempt, cause, data)
                })
                .collect();
            lines.join(&b'\n')
        })
    }

    /// Appends one event and returns its sequence number. `sync` makes it durable
    /// before returning (used for the facts recovery depends on).
    pub(crate) fn emit(
        &mut self,
        kind: &str,
        attempt: Option<u32>,
        cause: Option<u64>,
        data: serde_json::Value,
        sync: bool,
    ) -> Result<u64, StoreError> {
        self.journal.append(1, sync, |seq| self.line(seq, kind, attempt, cause, data))
    }
}
