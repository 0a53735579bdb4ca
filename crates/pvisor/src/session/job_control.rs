//! The running Job's control socket: how a frontend reaches the Session of
//! a running Job, to replace the ordered policy its proxy decides by
//! ([`crate::actions::ChangeNetworkPolicy`]), to put a credential vault in
//! force ([`crate::actions::ChangeCredentialVault`]), or to have its Trace record
//! what the frontend did through the guest ([`crate::actions::NoteInTrace`]:
//! `pvisor serve`'s execd commands).
//!
//! Boundary: the socket (`job-control.sock` in the Attempt's directory,
//! which every sandbox has hidden, answering only its own user or root),
//! one JSON request line and one JSON reply line per connection, and the
//! swap of the [`LivePolicy`] the proxy decides by and of the [`LiveVault`]
//! it injects from. The Session records each change and note in the Trace
//! (a vault by revision and binding names: its values cross this socket,
//! and only it); this module only tells it.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pvisor_net::vault::{ActiveVault, LiveVault};
use pvisor_net::{LivePolicy, OrderedPolicy};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};

/// The socket's name in the Attempt's directory.
pub(crate) const CONTROL_SOCKET: &str = "job-control.sock";

/// The longest request line read: a vault of 1 MiB (the API's bound) comes
/// here about three times over (each value in its headers, its redactions
/// and a rendered `Bearer …`), and its CA.
const MAX_REQUEST: u64 = 8 << 20;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Request {
    Policy {
        ordered: OrderedPolicy,
    },
    Note {
        note: FrontendNote,
    },
    /// The vault now in force (`None`: deleted).
    Vault {
        vault: Option<ActiveVault>,
    },
}

/// A credential vault put in force, as the Trace records it: the
/// revision and the bindings' names (`None`: the vault was deleted).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VaultChanged {
    pub revision: Option<i64>,
    pub bindings: Vec<String>,
}

/// What a frontend did through a running Job's guest, for the Job's Trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrontendNote {
    /// The command as the client gave it (its text, or its argv joined).
    pub command: String,
    /// The user it ran as in the guest, when the client chose one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    pub background: bool,
    /// Its exit status, once known (a background command's is not, yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why it could not start, or how its relay failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How long it ran (0 for one started in the background).
    pub duration_ms: u64,
}

/// A policy change in force, and where the Session answers once its Trace
/// holds it: the frontend hears "changed" only after it is recorded, so a
/// resume (which starts from the last recorded change) cannot lose it.
pub(super) struct PolicyChange {
    pub(super) policy: OrderedPolicy,
    pub(super) recorded: oneshot::Sender<Result<(), String>>,
}

/// Where the Session hears of what came through the socket.
pub(super) struct Heard {
    pub(super) policies: mpsc::UnboundedSender<PolicyChange>,
    pub(super) notes: mpsc::UnboundedSender<FrontendNote>,
    pub(super) vaults: mpsc::UnboundedSender<VaultChanged>,
}

/// What the control socket may replace while the Job runs.
pub(super) struct Live {
    pub(super) policy: Arc<LivePolicy>,
    pub(super) vault: Arc<LiveVault>,
}

/// The Session's end of its control socket: what the socket may replace,
/// and where the Session hears of each change and note.
pub(super) struct Control {
    pub(super) live: Arc<Live>,
    pub(super) policies: mpsc::UnboundedReceiver<PolicyChange>,
    pub(super) notes: mpsc::UnboundedReceiver<FrontendNote>,
    pub(super) vaults: mpsc::UnboundedReceiver<VaultChanged>,
}

impl Control {
    /// `live` with nothing heard yet, and the ends the socket sends on.
    pub(super) fn new(live: Live) -> (Self, Heard) {
        let (policies, policy_rx) = mpsc::unbounded_channel();
        let (notes, note_rx) = mpsc::unbounded_channel();
        let (vaults, vault_rx) = mpsc::unbounded_channel();
        let control = Self { live: Arc::new(live), policies: policy_rx, notes: note_rx, vaults: vault_rx };
        (control, Heard { policies, notes, vaults })
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    error: Option<String>,
}

/// `name` in `dir`, reached through `/proc/self/fd` so a long state
/// directory cannot overflow a socket address; the directory's handle
/// must outlive the use of the path.
fn short_path(dir: &Path, name: &str) -> std::io::Result<(std::fs::File, PathBuf)> {
    let handle = std::fs::File::open(dir)?;
    let path = PathBuf::from(format!("/proc/self/fd/{}/{name}", handle.as_raw_fd()));
    Ok((handle, path))
}

/// Serves the socket in `attempt_dir` until `stop`: each accepted change
/// replaces `live`'s ordered policy or vault, and each change and note is sent on.
pub(super) fn serve(
    attempt_dir: &Path,
    live: Arc<Live>,
    heard: Heard,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let heard = Arc::new(heard);
    let _ = std::fs::remove_file(attempt_dir.join(CONTROL_SOCKET));
    let (_dir, path) = short_path(attempt_dir, CONTROL_SOCKET)?;
    let listener = std::os::unix::net::UnixListener::bind(&path)?;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::UnixListener::from_std(listener)?;
    let socket = attempt_dir.join(CONTROL_SOCKET);
    Ok(tokio::spawn(async move {
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    if trusted(&stream) {
                        tokio::spawn(answer(stream, live.clone(), heard.clone()));
                    }
                }
                _ = stop.changed() => break,
            }
        }
        let _ = std::fs::remove_file(socket);
    }))
}

/// Only the Job's own user, or root, may change its policy.
fn trusted(stream: &tokio::net::UnixStream) -> bool {
    let me = rustix::process::geteuid().as_raw();
    stream.peer_cred().is_ok_and(|peer| peer.uid() == me || peer.uid() == 0)
}

async fn answer(stream: tokio::net::UnixStream, live: Arc<Live>, heard: Arc<Heard>) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = tokio::io::BufReader::new(tokio::io::AsyncReadExt::take(read, MAX_REQUEST));
    let error = match reader.read_line(&mut line).await {
        Err(e) => Some(format!("cannot read the request: {e}")),
        Ok(_) => match serde_json::from_str::<Request>(&line) {
            Err(e) => Some(format!("not a policy request: {e}")),
            Ok(Request::Policy { ordered }) => change(&live.policy, &heard, ordered).await.err(),
            Ok(Request::Vault { vault }) => {
                let bindings = vault.as_ref().map(|v| v.binding_names()).unwrap_or_default();
                let revision = vault.as_ref().map(|v| v.revision());
                match live.vault.replace(vault) {
                    Ok(()) => {
                        let _ = heard.vaults.send(VaultChanged { revision, bindings });
                        None
                    }
                    Err(e) => Some(format!("the vault's CA is unusable: {e}")),
                }
            }
            Ok(Request::Note { note }) => {
                let _ = heard.notes.send(note);
                None
            }
        },
    };
    let reply = serde_json::to_string(&Reply { error }).unwrap_or_else(|_| "{}".into());
    let _ = write.write_all(format!("{reply}\n").as_bytes()).await;
}

/// Puts `ordered` in force and waits until the Session has recorded it.
async fn change(live: &LivePolicy, heard: &Heard, ordered: OrderedPolicy) -> Result<(), String> {
    live.replace_ordered(ordered.clone()).map_err(|e| e.to_string())?;
    let (recorded, heard_back) = oneshot::channel();
    let ended = || "the Job ended before the change was recorded".to_owned();
    heard.policies.send(PolicyChange { policy: ordered, recorded }).map_err(|_| ended())?;
    heard_back.await.map_err(|_| ended())?
}

/// Why a change could not be made.
#[derive(Debug, thiserror::Error)]
pub enum JobControlError {
    /// No Session serves a control socket for this Attempt (it is not running).
    #[error("cannot reach the running Job's proxy: {0}")]
    Unreachable(#[source] std::io::Error),
    #[error("{0}")]
    Refused(String),
}

/// Asks the Session of the Attempt in `attempt_dir` to decide by `ordered`
/// from now on.
pub(crate) fn change_policy(attempt_dir: &Path, ordered: &OrderedPolicy) -> Result<(), JobControlError> {
    request(attempt_dir, &Request::Policy { ordered: ordered.clone() })
}

/// Asks the Session of the Attempt in `attempt_dir` to inject from `vault`
/// from now on (`None`: from no vault).
pub(crate) fn change_vault(attempt_dir: &Path, vault: Option<&ActiveVault>) -> Result<(), JobControlError> {
    request(attempt_dir, &Request::Vault { vault: vault.cloned() })
}

/// Asks the Session of the Attempt in `attempt_dir` to record `note`.
pub(crate) fn note(attempt_dir: &Path, note: &FrontendNote) -> Result<(), JobControlError> {
    request(attempt_dir, &Request::Note { note: note.clone() })
}

fn request(attempt_dir: &Path, request: &Request) -> Result<(), JobControlError> {
    let unreachable = JobControlError::Unreachable;
    let (_dir, path) = short_path(attempt_dir, CONTROL_SOCKET).map_err(unreachable)?;
    let mut stream = std::os::unix::net::UnixStream::connect(&path).map_err(unreachable)?;
    // Only the Job's own Session (our user, or root) is told a vault's values.
    let peer = rustix::net::sockopt::socket_peercred(&stream).map_err(|e| unreachable(e.into()))?;
    let me = rustix::process::geteuid();
    if peer.uid != me && !peer.uid.is_root() {
        return Err(JobControlError::Refused(format!(
            "the control socket is served by uid {}, not this user or root",
            peer.uid.as_raw()
        )));
    }
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).map_err(unreachable)?;
    let line = serde_json::to_string(request).map_err(|e| JobControlError::Refused(e.to_string()))?;
    stream.write_all(format!("{line}\n").as_bytes()).map_err(unreachable)?;
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply).map_err(unreachable)?;
    match serde_json::from_str::<Reply>(&reply) {
        Ok(Reply { error: None }) => Ok(()),
        Ok(Reply { error: Some(e) }) => Err(JobControlError::Refused(e)),
        Err(e) => Err(JobControlError::Refused(format!("an unreadable reply: {e}"))),
    }
}
