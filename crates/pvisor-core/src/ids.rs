//! Identifiers: `job-<ulid>`, `run-<ulid>`, `<run-id>.<n>` and `ckpt-<ulid>`.
//!
//! ULIDs sort by creation time, so a directory listing of `jobs/` is already in
//! creation order and "the most recent Job" needs no index file.

use std::fmt;
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
const ULID_LEN: usize = 26;

/// An identifier that failed to parse.
#[derive(Debug, thiserror::Error)]
#[error("invalid {kind} id {text:?}: expected {expected}")]
pub struct IdError {
    pub kind: &'static str,
    pub text: String,
    pub expected: &'static str,
}

/// Returns a new ULID string: 48 bits of milliseconds, 80 random bits.
pub fn new_ulid() -> String {
    let millis = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let random = crate::random::must::<10>();
    let mut value: u128 = (u128::from(millis) & ((1 << 48) - 1)) << 80;
    for (i, byte) in random.iter().enumerate() {
        value |= u128::from(*byte) << (8 * (9 - i));
    }
    let mut out = [0u8; ULID_LEN];
    for (i, slot) in out.iter_mut().enumerate() {
        let shift = 5 * (ULID_LEN - 1 - i);
        *slot = CROCKFORD[((value >> shift) & 0x1f) as usize];
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn is_ulid(s: &str) -> bool {
    s.len() == ULID_LEN && s.bytes().all(|b| CROCKFORD.contains(&b))
}

macro_rules! prefixed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// The prefix every id of this kind starts with.
            pub const PREFIX: &'static str = $prefix;

            /// Returns a fresh, time-ordered id.
            pub fn generate() -> Self {
                Self(format!("{}{}", $prefix, new_ulid()))
            }

            /// Returns the id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                match s.strip_prefix($prefix) {
                    Some(rest) if is_ulid(rest) => Ok(Self(s.to_owned())),
                    _ => Err(IdError {
                        kind: $kind,
                        text: s.to_owned(),
                        expected: concat!("\"", $prefix, "\" followed by a 26-character ULID"),
                    }),
                }
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                s.parse()
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

prefixed_id!(
    /// The user's persistent work: what the CLI lists and names.
    JobId, "job-", "job"
);
prefixed_id!(
    /// The Job's internal record; its on-disk name is a compatibility promise.
    RunId, "run-", "run"
);
prefixed_id!(
    /// A workspace or execution checkpoint.
    CheckpointId, "ckpt-", "checkpoint"
);

/// One execution of a Run by an executor: `<run-id>.<n>`, numbered from 1.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AttemptId {
    run: RunId,
    number: u32,
}

impl AttemptId {
    /// Returns the id of attempt `number` (1-based) of `run`.
    pub fn new(run: RunId, number: u32) -> Self {
        Self { run, number }
    }

    /// Returns the Run this attempt belongs to.
    pub fn run(&self) -> &RunId {
        &self.run
    }

    /// Returns the attempt's 1-based number.
    pub fn number(&self) -> u32 {
        self.number
    }
}

impl FromStr for AttemptId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        let err =
            || IdError { kind: "attempt", text: s.to_owned(), expected: "\"<run-id>.<n>\" with n ≥ 1" };
        let (run, n) = s.rsplit_once('.').ok_or_else(err)?;
        let number: u32 = n.parse().map_err(|_| err())?;
        if number == 0 {
            return Err(err());
        }
        Ok(Self { run: run.parse().map_err(|_| err())?, number })
    }
}

impl TryFrom<String> for AttemptId {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, IdError> {
        s.parse()
    }
}

impl From<AttemptId> for String {
    fn from(id: AttemptId) -> String {
        id.to_string()
    }
}

impl fmt::Display for AttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.run, self.number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulids_are_well_formed_and_distinct() {
        let a = new_ulid();
        let b = new_ulid();
        assert!(is_ulid(&a), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn ids_round_trip_and_reject_garbage() {
        let job = JobId::generate();
        assert_eq!(job.as_str().parse::<JobId>().unwrap(), job);
        assert!("run-01ARZ3NDEKTSV4RRFFQ69G5FAV".parse::<JobId>().is_err());
        assert!("job-short".parse::<JobId>().is_err());
        assert!("job-01ARZ3NDEKTSV4RRFFQ69G5FAU".parse::<JobId>().is_err(), "U is not Crockford");
        let attempt = AttemptId::new(RunId::generate(), 3);
        let text = attempt.to_string();
        assert_eq!(text.parse::<AttemptId>().unwrap(), attempt);
        assert!(format!("{}.0", attempt.run()).parse::<AttemptId>().is_err());
        let json = serde_json::to_string(&job).unwrap();
        assert_eq!(serde_json::from_str::<JobId>(&json).unwrap(), job);
        assert!(serde_json::from_str::<JobId>("\"job-x\"").is_err());
    }

    #[test]
    fn ids_sort_by_creation_time() {
        let first = JobId::generate();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let second = JobId::generate();
        assert!(first < second);
    }
}
