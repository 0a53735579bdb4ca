//! The running Job's policy socket: how [`crate::actions::ChangeNetworkPolicy`]
//! reaches the Session that serves the Job's proxy, to replace its ordered
//! policy while it runs.
//!
//! Boundary: the socket (`policy.sock` in the Attempt's directory, which
//! every sandbox has hidden, answering only its own user or root), one JSON
//! request line and one JSON reply line per connection, and the swap of
//! the [`LivePolicy`] the proxy decides by. The Session records each change
//! in the Trace; this module only tells it.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pvisor_net::{LivePolicy, OrderedPolicy};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

/// The socket's name in the Attempt's directory.
pub(crate) const POLICY_SOCKET: &str = "policy.sock";

/// The longest request line read.
const MAX_REQUEST: u64 = 1 << 20;

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    ordered: OrderedPolicy,
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
/// replaces `live`'s ordered policy and is sent on `changed`.
pub(super) fn serve(
    attempt_dir: &Path,
    live: Arc<LivePolicy>,
    changed: mpsc::UnboundedSender<OrderedPolicy>,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let _ = std::fs::remove_file(attempt_dir.join(POLICY_SOCKET));
    let (_dir, path) = short_path(attempt_dir, POLICY_SOCKET)?;
    let listener = std::os::unix::net::UnixListener::bind(&path)?;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::UnixListener::from_std(listener)?;
    let socket = attempt_dir.join(POLICY_SOCKET);
    Ok(tokio::spawn(async move {
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    if trusted(&stream) {
                        tokio::spawn(answer(stream, live.clone(), changed.clone()));
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

async fn answer(
    stream: tokio::net::UnixStream,
    live: Arc<LivePolicy>,
    changed: mpsc::UnboundedSender<OrderedPolicy>,
) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = tokio::io::BufReader::new(tokio::io::AsyncReadExt::take(read, MAX_REQUEST));
    let error = match reader.read_line(&mut line).await {
        Err(e) => Some(format!("cannot read the request: {e}")),
        Ok(_) => match serde_json::from_str::<Request>(&line) {
            Err(e) => Some(format!("not a policy request: {e}")),
            Ok(request) => match live.replace_ordered(request.ordered.clone()) {
                Ok(_) => {
                    let _ = changed.send(request.ordered);
                    None
                }
                Err(e) => Some(e.to_string()),
            },
        },
    };
    let reply = serde_json::to_string(&Reply { error }).unwrap_or_else(|_| "{}".into());
    let _ = write.write_all(format!("{reply}\n").as_bytes()).await;
}

/// Why a change could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PolicyControlError {
    /// No Session serves a policy socket for this Attempt (it has no
    /// ordered policy, or it is not running).
    #[error("cannot reach the running Job's proxy: {0}")]
    Unreachable(#[source] std::io::Error),
    #[error("{0}")]
    Refused(String),
}

/// Asks the Session of the Attempt in `attempt_dir` to decide by `ordered`
/// from now on.
pub(crate) fn request(attempt_dir: &Path, ordered: &OrderedPolicy) -> Result<(), PolicyControlError> {
    let unreachable = PolicyControlError::Unreachable;
    let (_dir, path) = short_path(attempt_dir, POLICY_SOCKET).map_err(unreachable)?;
    let mut stream = std::os::unix::net::UnixStream::connect(&path).map_err(unreachable)?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).map_err(unreachable)?;
    let line = serde_json::to_string(&Request { ordered: ordered.clone() })
        .map_err(|e| PolicyControlError::Refused(e.to_string()))?;
    stream.write_all(format!("{line}\n").as_bytes()).map_err(unreachable)?;
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply).map_err(unreachable)?;
    match serde_json::from_str::<Reply>(&reply) {
        Ok(Reply { error: None }) => Ok(()),
        Ok(Reply { error: Some(e) }) => Err(PolicyControlError::Refused(e)),
        Err(e) => Err(PolicyControlError::Refused(format!("an unreadable reply: {e}"))),
    }
}
