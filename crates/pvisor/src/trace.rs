//! Appends events to a Run's Trace (`events.jsonl`).

use std::path::PathBuf;

use pvisor_core::event::Event;
use pvisor_core::ids::RunId;
use pvisor_core::records::FORMAT;
use pvisor_core::store::{self, StoreError};
use pvisor_core::time::Timestamp;

/// The writer of one Run's Trace. Only the Attempt's owner writes it.
#[derive(Debug)]
pub(crate) struct Trace {
    path: PathBuf,
    run: RunId,
    next_seq: u64,
}

impl Trace {
    pub(crate) fn new(path: PathBuf, run: RunId) -> Self {
        Self { path, run, next_seq: 1 }
    }

    /// Reopens an existing Trace to append after its last complete event.
    /// Callers must hold the stage's apply lock (one writer at a time).
    pub(crate) fn resume(path: PathBuf, run: RunId, last_seq: u64) -> Self {
        Self { path, run, next_seq: last_seq + 1 }
    }

    /// Appends several events in one write, fsynced; returns the first seq.
    pub(crate) fn emit_batch(
        &mut self,
        events: Vec<(&str, Option<u32>, Option<u64>, serde_json::Value)>,
    ) -> Result<u64, StoreError> {
        let first = self.next_seq;
        if events.is_empty() {
            return Ok(first);
        }
        let mut buf = Vec::new();
        for (i, (kind, attempt, cause, data)) in events.into_iter().enumerate() {
            let seq = first + i as u64;
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
            buf.extend(serde_json::to_vec(&event).unwrap_or_default());
            buf.push(b'\n');
        }
        let count = buf.iter().filter(|&&b| b == b'\n').count() as u64;
        buf.pop();
        store::append_line(&self.path, &buf, true)?;
        self.next_seq = first + count;
        Ok(first)
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
        let seq = self.next_seq;
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
        let line = serde_json::to_vec(&event).unwrap_or_default();
        store::append_line(&self.path, &line, sync)?;
        self.next_seq += 1;
        Ok(seq)
    }
}
