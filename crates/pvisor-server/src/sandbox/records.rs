//! A sandbox's private record (`server/sandboxes/<id>.json`), its
//! OpenSandbox state and the table of the moves between states, and the
//! small pure helpers over a record (its commands, its environment).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use pvisor_core::ids::JobId;
use pvisor_core::state::InvalidTransition;
use pvisor_core::time::Timestamp;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SandboxState {
    Pending,
    Running,
    Pausing,
    Paused,
    Resuming,
    Stopping,
    Terminated,
    Failed,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Pausing => "Pausing",
            Self::Paused => "Paused",
            Self::Resuming => "Resuming",
            Self::Stopping => "Stopping",
            Self::Terminated => "Terminated",
            Self::Failed => "Failed",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Pending,
            Self::Running,
            Self::Pausing,
            Self::Paused,
            Self::Resuming,
            Self::Stopping,
            Self::Terminated,
            Self::Failed,
        ]
        .into_iter()
        .find(|st| st.as_str().eq_ignore_ascii_case(s))
    }
    pub fn is_final(self) -> bool {
        matches!(self, Self::Terminated | Self::Failed)
    }

    /// Whether the daemon may move a sandbox from `self` to `to`. Written
    /// per source state with no catch-all arm (as the core's Job table), so
    /// a new state forces a decision about every edge. A move to the same
    /// state is a refresh of the reason (a reattach, a recovery that found
    /// the VM suspended as recorded).
    pub fn can_transition(self, to: SandboxState) -> bool {
        use SandboxState::*;
        match self {
            // Up; failed to come up; deleted while starting; or, found by a
            // recovery, its Job was suspended outside the API.
            Pending => matches!(to, Running | Failed | Stopping | Paused),
            // A pause; a delete; the VM ended (crashed, or suspended from
            // outside the API); a reattach after a daemon restart.
            Running => matches!(to, Running | Pausing | Paused | Stopping | Failed),
            // Saved; the pause failed with the VM alive (Running) or not.
            Pausing => matches!(to, Paused | Running | Failed),
            // A resume; a delete; a recovery that found it suspended, or its
            // Job unreadable or ended.
            Paused => matches!(to, Resuming | Stopping | Paused | Failed),
            // Restored; the restore failed and the checkpoint stands (Paused)
            // or it did not (Failed).
            Resuming => matches!(to, Running | Paused | Failed),
            // A stopping sandbox only ends.
            Stopping => matches!(to, Terminated | Failed),
            Terminated | Failed => false,
        }
    }

    /// Returns `to` if [`Self::can_transition`] allows it, else an error
    /// naming both states.
    pub fn transition(self, to: SandboxState) -> Result<SandboxState, InvalidTransition> {
        if self.can_transition(to) {
            Ok(to)
        } else {
            Err(InvalidTransition { what: "sandbox", from: self.as_str().into(), to: to.as_str().into() })
        }
    }
}

/// One generation: the Attempt that ran the sandbox from a create or a resume.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Generation {
    pub attempt: u32,
    pub started_at: Timestamp,
    /// Milliseconds from the request to a ready agent.
    pub ready_ms: Option<u64>,
}

/// An execd command: its guest exec id and, for background ones, its log.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CommandRecord {
    pub exec_id: u32,
    pub command: String,
    pub background: bool,
    pub started_at: Timestamp,
    pub finished_at: Option<Timestamp>,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
}

/// The private record of a sandbox (`server/sandboxes/<id>.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub format: u32,
    pub id: String,
    pub image: String,
    /// The snapshot it was restored from (`image` is then the snapshot's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    pub entrypoint: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    pub resource_limits: BTreeMap<String, String>,
    pub platform: Option<serde_json::Value>,
    pub created_at: Timestamp,
    pub expires_at: Option<Timestamp>,
    pub state: SandboxState,
    pub reason: String,
    pub message: String,
    pub last_transition_at: Timestamp,
    /// The vm Job behind the sandbox, once its supervisor admitted it.
    pub job: Option<JobId>,
    pub generations: Vec<Generation>,
    /// The execd access token the endpoint hands out.
    pub token: String,
    /// Guest exec ids are unique for the guest's life (they survive resume).
    pub next_exec: u32,
    pub commands: BTreeMap<String, CommandRecord>,
    /// The rootfs path: the Job's workspace, and the root commands are confined to.
    pub rootfs: PathBuf,
    /// The pid of the current generation's supervisor (to find it after a daemon restart).
    #[serde(default)]
    pub supervisor: Option<u32>,
    pub memory_mib: u64,
    pub cpus: u32,
    /// A client deleted it (or its timeout did): the API answers 404 for it
    /// from then on, as the reference server does once a sandbox's container
    /// is removed, while the daemon still stops its Job and keeps the record.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    /// The create request's `networkPolicy`: the Job's proxy enforces it, and
    /// commands get the proxy variables. None: the VM reaches nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<pvisor_net::OrderedPolicy>,
    /// `credentialProxy.enabled`: the sandbox takes a credential vault
    /// (`crate::credential_vault`), whose values live in the daemon's memory only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub credential_proxy: bool,
    /// `extensions["access.renew.extend.seconds"]`: each access through this
    /// daemon moves `expires_at` to at least now plus this (see `renew`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_on_access: Option<u64>,
    /// The create request's `volumes`: host directories shared with the VM
    /// live (see `crate::volumes`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<pvisor_core::records::SharedDirectory>,
}

impl SandboxRecord {
    /// A new guest exec id, from the record's counter.
    pub fn take_exec_id(&mut self) -> u32 {
        let n = self.next_exec;
        self.next_exec += 1;
        n
    }
}

/// Finished commands a record keeps (status and logs of older ones go).
const KEPT_COMMANDS: usize = 500;

/// Drops the oldest finished commands beyond [`KEPT_COMMANDS`].
pub fn trim_commands(commands: &mut BTreeMap<String, CommandRecord>) {
    let mut finished: Vec<(Timestamp, String)> = commands
        .iter()
        .filter(|(_, c)| c.finished_at.is_some())
        .map(|(k, c)| (c.started_at, k.clone()))
        .collect();
    if finished.len() <= KEPT_COMMANDS {
        return;
    }
    finished.sort();
    for (_, key) in finished.iter().take(finished.len() - KEPT_COMMANDS) {
        commands.remove(key);
    }
}

/// What the supervisor writes once its Job is admitted.
#[derive(Debug, Serialize, Deserialize)]
pub struct Binding {
    pub job: JobId,
    pub attempt: u32,
}

/// The validated parts of a create request.
#[derive(Debug)]
pub struct CreateRequest {
    pub image: String,
    pub snapshot_id: Option<String>,
    pub entrypoint: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    pub resource_limits: BTreeMap<String, String>,
    pub platform: Option<serde_json::Value>,
    pub timeout: Option<u64>,
    pub memory_mib: u64,
    pub cpus: u32,
    pub network_policy: Option<pvisor_net::OrderedPolicy>,
    pub credential_proxy: bool,
    pub renew_on_access: Option<u64>,
    pub volumes: Vec<pvisor_core::records::SharedDirectory>,
}

/// Moves the record to `to` (saying why), if the state table allows it.
pub fn set_state(
    r: &mut SandboxRecord,
    to: SandboxState,
    reason: &str,
    message: &str,
) -> Result<(), InvalidTransition> {
    let from = r.state;
    r.state = from.transition(to)?;
    tracing::info!(sandbox = %r.id, from = from.as_str(), to = to.as_str(), reason, message, "state");
    r.reason = reason.into();
    r.message = message.into();
    r.last_transition_at = Timestamp::now();
    Ok(())
}

/// The environment of a command in the sandbox: a standard PATH and HOME,
/// the sandbox's env, then the request's.
pub fn command_env(record: &SandboxRecord, extra: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let mut env: BTreeMap<String, String> = [
        ("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
        ("HOME", "/root"),
        ("TERM", "xterm"),
        ("LANG", "C.UTF-8"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    env.insert("HOSTNAME".into(), record.id.clone());
    if record.network_policy.is_some() {
        // What the Job's own command gets: the agent's relay to the proxy.
        env.extend(pvisor::proxy_env(&[]).into_iter().map(|(k, v)| (k.to_owned(), v)));
    }
    if record.credential_proxy {
        let trust = crate::credential_vault::TRUST_ENV.iter();
        env.extend(trust.map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    }
    env.extend(record.env.clone());
    env.extend(extra.clone());
    env.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::SandboxState::{self, *};

    const ALL: [SandboxState; 8] =
        [Pending, Running, Pausing, Paused, Resuming, Stopping, Terminated, Failed];

    /// Every allowed move, written out once more: the table must match it
    /// exactly, for all 64 pairs.
    const ALLOWED: &[(SandboxState, SandboxState)] = &[
        (Pending, Running),
        (Pending, Failed),
        (Pending, Stopping),
        (Pending, Paused),
        (Running, Running),
        (Running, Pausing),
        (Running, Paused),
        (Running, Stopping),
        (Running, Failed),
        (Pausing, Paused),
        (Pausing, Running),
        (Pausing, Failed),
        (Paused, Resuming),
        (Paused, Stopping),
        (Paused, Paused),
        (Paused, Failed),
        (Resuming, Running),
        (Resuming, Paused),
        (Resuming, Failed),
        (Stopping, Terminated),
        (Stopping, Failed),
    ];

    #[test]
    fn every_pair_is_decided_by_the_table() {
        for from in ALL {
            for to in ALL {
                let allowed = ALLOWED.contains(&(from, to));
                assert_eq!(from.can_transition(to), allowed, "{} -> {}", from.as_str(), to.as_str());
                assert_eq!(from.transition(to).is_ok(), allowed);
            }
        }
    }

    #[test]
    fn final_states_have_no_exits_and_refusals_name_both_states() {
        for to in ALL {
            assert!(!Terminated.can_transition(to) && !Failed.can_transition(to));
        }
        let e = Stopping.transition(Running).unwrap_err();
        assert_eq!(e.to_string(), "sandbox cannot move from Stopping to Running");
        assert_eq!(ALL.iter().filter(|s| s.is_final()).count(), 2);
        assert_eq!(ALL.map(|s| SandboxState::parse(s.as_str())), ALL.map(Some));
    }
}
