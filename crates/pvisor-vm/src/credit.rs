//! Flow control for host-to-guest data ([`Credits`]), shared by the agent
//! link (which frees a credit on each ack) and the proxy streams and stdin
//! (which take one per chunk they send).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// What a host-to-guest data chunk is charged to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Credit {
    Stdin,
    Stream(u32),
}

/// Flow control for host-to-guest data: at most [`pvisor_agent_proto::CREDITS`]
/// chunks in flight per exec or stream; the agent acks each one it wrote.
#[derive(Debug, Default)]
pub(super) struct Credits {
    in_flight: Mutex<HashMap<Credit, usize>>,
    freed: std::sync::Condvar,
}

impl Credits {
    /// Waits for room, then charges one chunk. False if `gone` says to stop.
    pub(super) fn take(&self, key: Credit, gone: impl Fn() -> bool) -> bool {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if gone() {
                return false;
            }
            let used = in_flight.entry(key).or_default();
            if *used < pvisor_agent_proto::CREDITS {
                *used += 1;
                return true;
            }
            in_flight = self
                .freed
                .wait_timeout(in_flight, Duration::from_millis(200))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    pub(super) fn release(&self, key: Credit) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(used) = in_flight.get_mut(&key) {
            *used = used.saturating_sub(1);
        }
        self.freed.notify_all();
    }

    pub(super) fn forget(&self, key: Credit) {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        self.freed.notify_all();
    }
}
