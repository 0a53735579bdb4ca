//! The bound on what a command can make pvisor write to its Trace.
//!
//! Every request through the proxy is a `network.allowed`, `network.failed` or
//! `network.denied` event, and the command decides how many there are (a
//! loop of denied requests wrote megabytes a second). So, per run: the
//! first [`REPEATS_WRITTEN`] events of one kind to one host are written,
//! later ones only counted; and no event the command causes is written once
//! the Trace holds [`DEFAULT_CAP_BYTES`] (or the `--disk` quota, if smaller:
//! the Trace counts against it). One `trace.coalesced` event then gives the
//! counts. pvisor's own lifecycle events (exit, seal, Bundle, terminal
//! event) are never held back: a flood can cost a run its detail, never its
//! result. The Bundle's network tally counts every request regardless.

use std::collections::{BTreeMap, HashMap};

use pvisor_core::event::EventKind;

/// How many events of one kind to one host a run writes in full.
pub(crate) const REPEATS_WRITTEN: u64 = 16;

/// The size past which a run's Trace takes no more command-driven events.
pub(crate) const DEFAULT_CAP_BYTES: u64 = 4 * 1024 * 1024;

/// How many distinct (kind, host) pairs are tracked; events of further
/// pairs are counted as dropped (the tracking must not grow without bound either).
const KEYS_TRACKED: usize = 4096;

#[derive(Debug)]
pub(crate) struct TraceBudget {
    cap_bytes: u64,
    seen: HashMap<(EventKind, String), u64>,
    coalesced: BTreeMap<(String, String), u64>,
    dropped: u64,
}

impl TraceBudget {
    /// A budget of [`DEFAULT_CAP_BYTES`], or `disk_quota` if smaller.
    pub(crate) fn new(disk_quota: Option<u64>) -> Self {
        let cap_bytes = disk_quota.map_or(DEFAULT_CAP_BYTES, |q| q.min(DEFAULT_CAP_BYTES));
        Self { cap_bytes, seen: HashMap::new(), coalesced: BTreeMap::new(), dropped: 0 }
    }

    /// Whether the event `kind` about `host` is written; `trace_bytes`
    /// tells the Trace's size now. An event not written is counted.
    pub(crate) fn admit(&mut self, kind: &EventKind, host: &str, trace_bytes: impl FnOnce() -> u64) -> bool {
        let key = (kind.clone(), host.to_owned());
        if !self.seen.contains_key(&key) && self.seen.len() >= KEYS_TRACKED {
            self.dropped += 1;
            return false;
        }
        let seen = self.seen.entry(key).or_default();
        *seen += 1;
        if *seen > REPEATS_WRITTEN {
            *self.coalesced.entry((kind.to_string(), host.to_owned())).or_default() += 1;
            return false;
        }
        if trace_bytes() >= self.cap_bytes {
            self.dropped += 1;
            return false;
        }
        true
    }

    /// The `trace.coalesced` event's data, if any event was held back.
    pub(crate) fn summary(&self) -> Option<crate::trace::data::TraceCoalesced<'_>> {
        if self.coalesced.is_empty() && self.dropped == 0 {
            return None;
        }
        let coalesced = self
            .coalesced
            .iter()
            .map(|((kind, host), count)| crate::trace::data::CoalescedEvents { kind, host, count: *count })
            .collect();
        Some(crate::trace::data::TraceCoalesced {
            coalesced,
            written_per_host: REPEATS_WRITTEN,
            dropped: self.dropped,
            cap_bytes: self.cap_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_are_counted_after_the_first_few_and_the_cap_holds() {
        let mut budget = TraceBudget::new(Some(1000));
        let written = (0..100).filter(|_| budget.admit(&EventKind::NetworkDenied, "a.test", || 0)).count();
        assert_eq!(written as u64, REPEATS_WRITTEN);
        assert!(!budget.admit(&EventKind::NetworkDenied, "b.test", || 1000), "past the cap");
        let summary = budget.summary().unwrap();
        assert_eq!((summary.coalesced[0].count, summary.dropped, summary.cap_bytes), (84, 1, 1000));
    }
}
