//! A sandbox's private record (`server/sandboxes/<id>.json`), its
//! OpenSandbox state and the table of the moves between states, and the
//! small pure helpers over a record (its commands, its environment).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use pvisor_core::ids::JobId;
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
    pub entrypoint: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    pub resource_limits: BTreeMap<String, String>,
    pub platform: Option<serde_json::Value>,
    pub timeout: Option<u64>,
    pub memory_mib: u64,
    pub cpus: u32,
    pub network_policy: Option<pvisor_net::OrderedPolicy>,
}

pub fn set_state(r: &mut SandboxRecord, to: SandboxState, reason: &str, message: &str) {
    r.state = to;
    r.reason = reason.into();
    r.message = message.into();
    r.last_transition_at = Timestamp::now();
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
        env.extend(pvisor::admission::proxy_env().into_iter().map(|(k, v)| (k.to_owned(), v)));
    }
    env.extend(record.env.clone());
    env.extend(extra.clone());
    env.into_iter().collect()
}
