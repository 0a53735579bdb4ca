//! Appends events to a Run's Trace (`events.jsonl`).

use std::path::PathBuf;

use pvisor_core::event::Event;
use pvisor_core::ids::RunId;
use pvisor_core::records::FORMAT;
use pvisor_core::store::{self, Store, StoreError};

use crate::runtime::job_service::views::{self, ViewError};
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

    /// Reopens `run`'s Trace to append after its last complete event.
    /// Callers must be its only writer (they hold the apply or recovery lock).
    pub(crate) fn reopen(store: &Store, run: &RunId) -> Result<Self, ViewError> {
        let (events, _) = views::events(store, run)?;
        let last = events.last().map_or(0, |e| e.seq);
        Ok(Self { path: store.events_file(run), run: run.clone(), next_seq: last + 1 })
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
        let first = self.next_seq;
        if events.is_empty() {
            return Ok(first);
        }
        let count = events.len() as u64;
        let lines: Vec<Vec<u8>> = events
            .into_iter()
            .enumerate()
            .map(|(i, (kind, attempt, cause, data))| self.line(first + i as u64, kind, attempt, cause, data))
            .collect();
        store::append_line(&self.path, &lines.join(&b'\n'), true)?;
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
        store::append_line(&self.path, &self.line(seq, kind, attempt, cause, data), sync)?;
        self.next_seq += 1;
        Ok(seq)
    }
}
