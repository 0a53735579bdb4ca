//! A session's record and its name: what is written under `sessions/`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use pvisor_core::ids::JobId;
use pvisor_core::records::Record;
use pvisor_core::time::Timestamp;

/// The longest session name.
const NAME_MAX: usize = 64;

/// A session name: 1 to 64 ASCII letters, digits, `.`, `_` or `-`, not
/// starting with `.` or `-` (it names files, and appears in commands a
/// user may paste).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SessionName(String);

/// Why a session name was refused.
#[derive(Debug, thiserror::Error)]
#[error("session name {shown}: {why}; use 1 to {NAME_MAX} letters, digits, '.', '_' or '-', not starting with '.' or '-' (e.g. --session fix-tests)")]
pub struct SessionNameError {
    shown: String,
    why: &'static str,
}

impl FromStr for SessionName {
    type Err = SessionNameError;

    fn from_str(s: &str) -> Result<Self, SessionNameError> {
        let refuse = |why| SessionNameError { shown: format!("{:?}", s.escape_default().to_string()), why };
        if s.is_empty() {
            return Err(refuse("is empty"));
        }
        if s.len() > NAME_MAX {
            return Err(refuse("is too long"));
        }
        if s.starts_with(['.', '-']) {
            return Err(refuse("starts with '.' or '-'"));
        }
        if !s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
            return Err(refuse("holds a character other than a letter, digit, '.', '_' or '-'"));
        }
        Ok(Self(s.to_owned()))
    }
}

impl TryFrom<String> for SessionName {
    type Error = SessionNameError;
    fn try_from(s: String) -> Result<Self, SessionNameError> {
        s.parse()
    }
}

impl From<SessionName> for String {
    fn from(name: SessionName) -> String {
        name.0
    }
}

impl fmt::Display for SessionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `sessions/<key>/<name>.json`: a session and its Jobs, oldest first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub format: u32,
    pub name: SessionName,
    /// The canonical workspace path.
    pub workspace: PathBuf,
    pub started_at: Timestamp,
    /// Every run of the session, in order; the last one is its head.
    pub jobs: Vec<JobId>,
    /// Set once the session's changes were all applied or dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed: Option<SessionClosed>,
}

/// How and when a session ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionClosed {
    pub at: Timestamp,
    /// `applied` (something was applied) or `dropped`.
    pub how: String,
}

impl Record for SessionRecord {
    const FILE: &'static str = "session.json";
    fn format(&self) -> u32 {
        self.format
    }
}

impl SessionRecord {
    /// A session with no run yet.
    pub fn new(name: SessionName, workspace: PathBuf) -> Self {
        Self {
            format: pvisor_core::records::FORMAT,
            name,
            workspace,
            started_at: Timestamp::now(),
            jobs: Vec::new(),
            closed: None,
        }
    }

    /// The session's last Job: what it has staged.
    pub fn head(&self) -> Option<&JobId> {
        self.jobs.last()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_leave_the_directory_or_fool_a_terminal_are_refused() {
        for bad in ["", "a/b", "..", ".hidden", "-rf", "a\u{1b}[2J", "tab\there", "é", &"x".repeat(65)] {
            let err = bad.parse::<SessionName>().unwrap_err().to_string();
            assert!(err.contains("--session fix-tests"), "{bad:?}: {err}");
            assert!(!err.contains('\u{1b}'), "the error echoes no escape: {err:?}");
        }
        for good in ["a", "fix-tests", "agent_1.v2", &"x".repeat(64)] {
            assert_eq!(good.parse::<SessionName>().unwrap().to_string(), good);
        }
    }
}
