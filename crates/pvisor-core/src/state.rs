//! Lifecycle states and their transition functions.
//!
//! Every verb that changes a state calls `transition` first and gets a typed
//! [`InvalidTransition`] back when the move is not allowed. The tables are
//! written per source state with no catch-all arm, so adding a state forces a
//! decision about every edge.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A state change that the lifecycle does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} cannot move from {from} to {to}")]
pub struct InvalidTransition {
    pub what: &'static str,
    pub from: String,
    pub to: String,
}

macro_rules! display_as_serde {
    ($t:ty) => {
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// The state of a Job (and of its Run, which projects the same lifecycle).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Admitted; the Attempt is being prepared.
    Pending,
    /// The sandboxed command is running.
    Running,
    /// Confirmed by a receipt: the command exited 0.
    Completed,
    /// Confirmed by a receipt: non-zero exit, a signal, or a failure to start.
    Failed,
    /// Confirmed by a receipt: the run was stopped on request.
    Cancelled,
    /// The owner is gone and no valid receipt exists; the stage is kept.
    Unknown,
    /// Closed out of `unknown` by `pvisor kill`; never a success.
    Lost,
    /// A vm Job saved to an execution checkpoint whose VM is stopped; valid
    /// only with a termination receipt. `pvisor resume` continues it.
    Suspended,
}

impl JobState {
    /// Returns the state's name as written in records.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Unknown => "unknown",
            Self::Lost => "lost",
            Self::Suspended => "suspended",
        }
    }

    /// Returns whether no further transition is possible.
    pub fn is_terminal(self) -> bool {
        match self {
            Self::Completed | Self::Failed | Self::Cancelled | Self::Lost => true,
            Self::Pending | Self::Running | Self::Unknown | Self::Suspended => false,
        }
    }

    /// Returns whether the lifecycle allows moving from `self` to `to`.
    pub fn can_transition(self, to: JobState) -> bool {
        use JobState::*;
        match self {
            Pending => matches!(to, Running | Failed | Cancelled | Unknown),
            Running => matches!(to, Completed | Failed | Cancelled | Unknown | Suspended),
            Unknown => matches!(to, Lost),
            // Resume starts a new Attempt (which may fail to restore, with a
            // receipt); kill closes it for good.
            Suspended => matches!(to, Running | Failed | Cancelled | Lost),
            Completed | Failed | Cancelled | Lost => false,
        }
    }

    /// Returns `to` if the move is allowed, else a typed error.
    pub fn transition(self, to: JobState) -> Result<JobState, InvalidTransition> {
        if self.can_transition(to) {
            Ok(to)
        } else {
            Err(InvalidTransition { what: "job", from: self.to_string(), to: to.to_string() })
        }
    }
}
display_as_serde!(JobState);

/// The state of one Attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptState {
    /// The executor is preparing the sandbox.
    Preparing,
    /// The command is running.
    Running,
    /// The command is gone; the Session is sealing the stage and writing the receipt.
    Finalizing,
    /// The receipt records an exit status of 0.
    Completed,
    /// The receipt records a failure.
    Failed,
    /// The receipt records a cancellation.
    Cancelled,
    /// The VM was checkpointed and stopped; a termination receipt records it.
    /// The Job continues in a later Attempt.
    Hibernated,
}

impl AttemptState {
    /// Returns the state's name as written in records.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Preparing => "preparing",
            Self::Running => "running",
            Self::Finalizing => "finalizing",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Hibernated => "hibernated",
        }
    }

    /// Returns whether no further transition is possible.
    pub fn is_terminal(self) -> bool {
        match self {
            Self::Completed | Self::Failed | Self::Cancelled | Self::Hibernated => true,
            Self::Preparing | Self::Running | Self::Finalizing => false,
        }
    }

    /// Returns whether the lifecycle allows moving from `self` to `to`.
    pub fn can_transition(self, to: AttemptState) -> bool {
        use AttemptState::*;
        match self {
            // A sandbox that never started still finalizes, to record why.
            Preparing => matches!(to, Running | Finalizing),
            Running => matches!(to, Finalizing | Hibernated),
            Finalizing => matches!(to, Completed | Failed | Cancelled),
            Completed | Failed | Cancelled | Hibernated => false,
        }
    }

    /// Returns `to` if the move is allowed, else a typed error.
    pub fn transition(self, to: AttemptState) -> Result<AttemptState, InvalidTransition> {
        if self.can_transition(to) {
            Ok(to)
        } else {
            Err(InvalidTransition { what: "attempt", from: self.to_string(), to: to.to_string() })
        }
    }
}
display_as_serde!(AttemptState);

/// How an Attempt ended, as fixed in its RunResult and receipt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultState {
    Completed,
    Failed,
    Cancelled,
}

impl ResultState {
    /// Returns the state's name as written in records.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Returns the Job/Run state that this result projects to.
    pub fn job_state(self) -> JobState {
        match self {
            Self::Completed => JobState::Completed,
            Self::Failed => JobState::Failed,
            Self::Cancelled => JobState::Cancelled,
        }
    }

    /// Returns the Attempt state that this result projects to.
    pub fn attempt_state(self) -> AttemptState {
        match self {
            Self::Completed => AttemptState::Completed,
            Self::Failed => AttemptState::Failed,
            Self::Cancelled => AttemptState::Cancelled,
        }
    }

    /// Returns the terminal event type published for this result.
    pub fn terminal_event(self) -> crate::event::EventKind {
        match self {
            Self::Completed => crate::event::EventKind::RunCompleted,
            Self::Failed => crate::event::EventKind::RunFailed,
            Self::Cancelled => crate::event::EventKind::RunCancelled,
        }
    }
}
display_as_serde!(ResultState);

#[cfg(test)]
mod tests {
    use super::*;

    const JOB_STATES: [JobState; 7] = [
        JobState::Pending,
        JobState::Running,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Unknown,
        JobState::Lost,
    ];

    #[test]
    fn terminal_job_states_have_no_exits() {
        for from in JOB_STATES {
            for to in JOB_STATES {
                if from.is_terminal() {
                    assert!(from.transition(to).is_err(), "{from} -> {to}");
                }
            }
        }
    }

    #[test]
    fn unknown_only_closes_as_lost() {
        assert_eq!(JobState::Unknown.transition(JobState::Lost), Ok(JobState::Lost));
        let err = JobState::Unknown.transition(JobState::Completed).unwrap_err();
        assert_eq!(err.to_string(), "job cannot move from unknown to completed");
    }

    #[test]
    fn attempts_always_finalize_before_a_result() {
        assert!(AttemptState::Running.transition(AttemptState::Completed).is_err());
        assert!(AttemptState::Preparing.can_transition(AttemptState::Finalizing));
        assert!(AttemptState::Finalizing.can_transition(AttemptState::Cancelled));
    }
}
