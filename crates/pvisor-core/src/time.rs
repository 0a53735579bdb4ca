//! Wall-clock timestamps as they appear in records: RFC 3339, UTC,
//! microseconds; and the coarse clock filesystems stamp ctime with.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// A UTC instant, serialized as RFC 3339 (`2026-11-30T11:04:56.123456Z`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Timestamp(SystemTime);

impl Timestamp {
    /// Returns the current time.
    pub fn now() -> Self {
        Self::from(SystemTime::now())
    }

    /// Returns the instant as a `SystemTime`.
    pub fn system_time(self) -> SystemTime {
        self.0
    }

    /// Returns whole microseconds since the Unix epoch (negative times clamp to 0).
    pub fn unix_micros(self) -> u128 {
        self.0.duration_since(UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0)
    }

    /// Returns the time elapsed from `earlier` to `self`, or zero if `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        self.0.duration_since(earlier.0).unwrap_or_default()
    }
}

impl From<SystemTime> for Timestamp {
    /// Truncates to whole microseconds, the precision records keep, so a
    /// timestamp compares equal to itself after a round trip through JSON.
    fn from(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Self(UNIX_EPOCH + Duration::from_micros(d.as_micros() as u64)),
            Err(_) => Self(UNIX_EPOCH),
        }
    }
}

impl TryFrom<String> for Timestamp {
    type Error = humantime::TimestampError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        humantime::parse_rfc3339(&s).map(Self)
    }
}

impl From<Timestamp> for String {
    fn from(t: Timestamp) -> String {
        t.to_string()
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_rfc3339_micros(self.0))
    }
}

/// `CLOCK_REALTIME_COARSE` now, in ns since the epoch: the clock the kernel
/// stamps file ctimes with (conflict baselines are taken on it).
pub fn coarse_realtime_ns() -> i128 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_json() {
        let t = Timestamp::now();
        let json = serde_json::to_string(&t).unwrap();
        let back: Timestamp = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t);
        assert!(json.ends_with("Z\""), "{json}");
    }
}
