//! Appends events to a Run's Trace (`events.jsonl`).
//!
//! Sequence numbers come from the file, under its lock ([`Journal`]), never
//! from a counter in memory: the owner, `kill`, recovery, apply and drop may
//! append to one Trace at the same time and still get one strictly
//! increasing sequence.
//!
//! Every event is an [`EventKind`] with its data, one type per kind in
//! [`data`]; nothing here takes a kind as a bare string.

use serde::Serialize;

use pvisor_core::event::{Event, EventKind};
use pvisor_core::ids::RunId;
use pvisor_core::journal::Journal;
use pvisor_core::records::FORMAT;
use pvisor_core::store::{Store, StoreError};
use pvisor_core::time::Timestamp;

pub(crate) mod data;

/// One event of a batch ([`Trace::emit_batch`]), its data already encoded.
#[derive(Debug)]
pub(crate) struct Pending {
    kind: EventKind,
    attempt: Option<u32>,
    cause: Option<u64>,
    data: serde_json::Value,
}

impl Pending {
    pub(crate) fn new(
        kind: EventKind,
        attempt: Option<u32>,
        cause: Option<u64>,
        data: &impl Serialize,
    ) -> Self {
        Self { kind, attempt, cause, data: encode(data) }
    }
}

/// The data as the Trace stores it: a JSON value, whose object keys are
/// sorted as they were when the emitters built `json!` values by hand. The
/// data types are structs of plain fields with string keys, which always
/// encode; were one not to, its event would still record its kind.
fn encode(data: &impl Serialize) -> serde_json::Value {
    serde_json::to_value(data).unwrap_or_default()
}

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

    fn line(&self, seq: u64, event: Pending) -> Vec<u8> {
        let Pending { kind, attempt, cause, data } = event;
        let event = Event {
            format: FORMAT,
            id: Event::id_for(&self.run, seq),
            run: self.run.clone(),
            seq,
            time: Timestamp::now(),
            kind,
            attempt,
            cause,
            data,
        };
        serde_json::to_vec(&event).unwrap_or_default()
    }

    /// Appends several events in one write, fsynced; returns the first seq.
    pub(crate) fn emit_batch(&mut self, events: Vec<Pending>) -> Result<u64, StoreError> {
        let count = events.len() as u64;
        self.journal.append(count, true, |first| {
            let lines: Vec<Vec<u8>> =
                events.into_iter().enumerate().map(|(i, event)| self.line(first + i as u64, event)).collect();
            lines.join(&b'\n')
        })
    }

    /// Appends one event and returns its sequence number. `sync` makes it durable
    /// before returning (used for the facts recovery depends on).
    pub(crate) fn emit(
        &mut self,
        kind: EventKind,
        attempt: Option<u32>,
        cause: Option<u64>,
        data: &impl Serialize,
        sync: bool,
    ) -> Result<u64, StoreError> {
        let event = Pending::new(kind, attempt, cause, data);
        self.journal.append(1, sync, |seq| self.line(seq, event))
    }
}
