//! The image's entrypoint is the sandbox's main process, as upstream
//! OpenSandbox has it: started once the first generation is up, and when it
//! exits (or cannot be executed) the sandbox ends with it, `Terminated` for
//! exit 0 and `Failed` otherwise, with the reference reason and message.
//!
//! A watcher thread per sandbox learns the exit from the start's exec
//! channel, and asks the guest itself after [`SILENCE`] without a frame;
//! once that channel is gone (a pause cut the link, the daemon restarted)
//! it asks the guest every [`POLL`] instead, while the sandbox is Running. Only a Running sandbox ends with its entrypoint: a delete, a
//! pause or a failure that got there first stands.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pvisor_core::time::Timestamp;

use super::{command_env, set_state, CommandRecord, Daemon, OpError, SandboxState, GUEST_LOG_DIR};
use crate::guest_link::{self, ExecChannel, GuestError, Reply};

/// How often a watcher without its exec channel asks the guest.
const POLL: Duration = Duration::from_millis(500);

/// How long a watcher waits on a silent exec channel before it asks the
/// guest itself: an exit whose `Exited` never reaches the channel must not
/// leave the sandbox Running for good. Long enough that an idle sandbox's
/// guest is seldom woken.
const SILENCE: Duration = Duration::from_secs(10);

/// What a watcher learned of the entrypoint when it looked.
enum Watch {
    /// Not known to have exited: look again later.
    Running,
    /// It exited with this status.
    Exited(i32),
    /// The sandbox ended (or its entrypoint's end was recorded) otherwise.
    Over,
}

/// Why the image's entrypoint did not start (kept in its command record).
#[derive(Debug, thiserror::Error)]
pub enum EntrypointError {
    #[error(transparent)]
    NotLive(#[from] OpError),
    #[error(transparent)]
    Guest(#[from] GuestError),
    /// The guest could not execute it (its message); `code` is the exit
    /// status a shell would give (127 not found, 126 not executable).
    #[error("{message}")]
    ExecFailed { code: i32, message: String },
    #[error("unexpected answer {0}")]
    Unexpected(String),
}

/// How the entrypoint ended: the code a container runtime reports (128+N
/// for signal N, as docker does).
fn exit_status(code: Option<i32>, signal: Option<i32>) -> i32 {
    code.unwrap_or(128 + signal.unwrap_or(0))
}

/// The state, reason and message a sandbox ends with when its entrypoint
/// exits with `code`. Upstream's docker service
/// (server/opensandbox_server/services/docker.py, the container state
/// mapping): exit 0 → Terminated, `CONTAINER_EXITED`, "Sandbox container
/// exited successfully."; else Failed, `CONTAINER_EXITED_ERROR`, "Sandbox
/// container exited with code N."
pub fn ending(code: i32) -> (SandboxState, &'static str, String) {
    if code == 0 {
        (SandboxState::Terminated, "CONTAINER_EXITED", "Sandbox container exited successfully.".into())
    } else {
        (
            SandboxState::Failed,
            "CONTAINER_EXITED_ERROR",
            format!("Sandbox container exited with code {code}."),
        )
    }
}

impl Daemon {
    /// Starts the entrypoint and watches it; one that cannot be executed
    /// ends the sandbox at once, as its exit would.
    pub(super) fn start_entrypoint(self: &Arc<Self>, id: &str) -> Result<(), EntrypointError> {
        match self.exec_entrypoint(id) {
            Ok(Some((exec_id, channel))) => {
                self.watch_entrypoint(id, exec_id, Some(channel));
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(EntrypointError::ExecFailed { code, message }) => {
                tracing::warn!(sandbox = %id, "the entrypoint cannot be executed: {message}");
                self.entrypoint_exited(id, code, Some(message.clone()));
                Err(EntrypointError::ExecFailed { code, message })
            }
            Err(e) => Err(e),
        }
    }

    /// Starts the entrypoint in the guest and records it as the sandbox's
    /// `entrypoint` command; `None` for a sandbox that has none.
    fn exec_entrypoint(&self, id: &str) -> Result<Option<(u32, ExecChannel)>, EntrypointError> {
        let (record, link) = self.live_link(id)?;
        if record.entrypoint.is_empty() {
            return Ok(None);
        }
        // Claimed under the records lock: of two starts at once (the
        // provisioner's, and a resume's or a failed pause's), one starts it.
        let claimed = self.update(id, |r| {
            if r.commands.contains_key("entrypoint") {
                return Ok(None);
            }
            let exec_id = r.take_exec_id();
            r.commands.insert(
                "entrypoint".into(),
                CommandRecord {
                    exec_id,
                    command: r.entrypoint.join(" "),
                    background: true,
                    started_at: Timestamp::now(),
                    finished_at: None,
                    exit_code: None,
                    error: None,
                },
            );
            Ok(Some(exec_id))
        })?;
        let Some(exec_id) = claimed else { return Ok(None) };
        let spec = guest_link::ExecSpec {
            id: exec_id,
            argv: record.entrypoint.clone(),
            env: command_env(&record, &BTreeMap::new()),
            cwd: "/".into(),
            root: Some(record.rootfs.clone()),
            output: Some(PathBuf::from(format!("{GUEST_LOG_DIR}/{exec_id}.log"))),
            terminal: None,
            confinement: None,
        };
        let mut channel = guest_link::exec(&link, spec)?;
        let started = match channel.next_reply() {
            Ok(Some((Reply::Started { .. }, _))) => Ok(()),
            Ok(Some((Reply::ExecFailed { errno, message, .. }, _))) => {
                let code = if errno == libc::ENOENT { 127 } else { 126 };
                Err(EntrypointError::ExecFailed { code, message })
            }
            other => Err(EntrypointError::Unexpected(format!("{other:?}"))),
        };
        let _ = self.update(id, |r| {
            match &started {
                // The guest never took it (a pause cut the link): unclaimed,
                // so whatever brings the sandbox back to Running starts it.
                Err(EntrypointError::Unexpected(_)) => {
                    r.commands.remove("entrypoint");
                }
                Err(e) => {
                    if let Some(c) = r.commands.get_mut("entrypoint") {
                        c.error = Some(e.to_string());
                    }
                }
                Ok(()) => {}
            }
            Ok(())
        });
        started.map(|()| Some((exec_id, channel)))
    }

    /// Follows the entrypoint of a sandbox that is back to Running (resumed,
    /// reattached after a restart): started if it never was (a pause or a
    /// restart came between Running and its start), watched if it runs and
    /// no thread of this daemon watches it, and the sandbox ended if it
    /// exited meanwhile.
    pub(super) fn follow_entrypoint(self: &Arc<Self>, id: &str) {
        let Ok(record) = self.get(id) else { return };
        match record.commands.get("entrypoint") {
            None => {
                if let Err(e) = self.start_entrypoint(id) {
                    tracing::warn!(sandbox = %id, "the entrypoint did not start: {e}");
                }
            }
            Some(c) if c.finished_at.is_none() => self.watch_entrypoint(id, c.exec_id, None),
            Some(_) => self.end_if_entrypoint_exited(id),
        }
    }

    /// Watches the entrypoint (guest exec `exec_id`) on a thread until it
    /// exits, then ends the sandbox with it; `channel` is the start's, if
    /// this daemon has it. Nothing, if a thread already watches it.
    pub(super) fn watch_entrypoint(self: &Arc<Self>, id: &str, exec_id: u32, channel: Option<ExecChannel>) {
        let watchers = || self.entrypoint_watchers.lock().unwrap_or_else(|p| p.into_inner());
        if !watchers().insert(id.to_owned()) {
            return;
        }
        let (daemon, id) = (self.clone(), id.to_owned());
        std::thread::spawn(move || {
            let code = daemon.wait_entrypoint(&id, exec_id, channel);
            daemon.entrypoint_watchers.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            if let Some(code) = code {
                daemon.entrypoint_exited(&id, code, None);
            }
        });
    }

    /// The entrypoint's exit status, once it has one; `None` once the
    /// sandbox has ended (or been forgotten) without it.
    fn wait_entrypoint(&self, id: &str, exec_id: u32, mut channel: Option<ExecChannel>) -> Option<i32> {
        if let Some(open) = channel.as_ref() {
            let _ = open.set_read_timeout(Some(SILENCE));
        }
        while let Some(open) = channel.as_mut() {
            match open.next_reply() {
                Ok(Some((Reply::Exited { code, signal, .. }, _))) => return Some(exit_status(code, signal)),
                Ok(Some(_)) => {}
                Err(e)
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
                {
                    match self.entrypoint_watch(id, exec_id) {
                        Watch::Running => {}
                        Watch::Exited(code) => return Some(code),
                        Watch::Over => return None,
                    }
                }
                Ok(None) | Err(_) => channel = None,
            }
        }
        loop {
            match self.entrypoint_watch(id, exec_id) {
                Watch::Running => std::thread::sleep(POLL),
                Watch::Exited(code) => return Some(code),
                Watch::Over => return None,
            }
        }
    }

    /// What the records and the guest say of the entrypoint (guest exec
    /// `exec_id`) now: the guest is asked only while the sandbox is Running.
    fn entrypoint_watch(&self, id: &str, exec_id: u32) -> Watch {
        let Ok(record) = self.get(id) else { return Watch::Over };
        let finished = record.commands.get("entrypoint").is_none_or(|c| c.finished_at.is_some());
        if record.state.is_final() || record.state == SandboxState::Stopping || finished {
            return Watch::Over;
        }
        if record.state == SandboxState::Running {
            if let Ok((_, link)) = self.live_link(id) {
                if let Ok(Reply::Status { running: false, code, signal, .. }) =
                    guest_link::status(&link, exec_id)
                {
                    if code.is_some() || signal.is_some() {
                        return Watch::Exited(exit_status(code, signal));
                    }
                }
            }
        }
        Watch::Running
    }

    /// Ends a sandbox back to Running (resumed, reattached) whose
    /// entrypoint exited while it was not: during a pause, or with the
    /// daemon down. Its exit was recorded then and ended nothing.
    pub(super) fn end_if_entrypoint_exited(&self, id: &str) {
        let Ok(record) = self.get(id) else { return };
        let entrypoint = record.commands.get("entrypoint").filter(|c| c.finished_at.is_some());
        if let Some(code) = entrypoint.and_then(|c| c.exit_code) {
            self.entrypoint_exited(id, code, None);
        }
    }

    /// Records the entrypoint's end and, if the sandbox is still Running,
    /// ends it the way upstream does (see [`ending`]).
    fn entrypoint_exited(&self, id: &str, code: i32, error: Option<String>) {
        let ours = self.update(id, |r| {
            if let Some(c) = r.commands.get_mut("entrypoint") {
                c.finished_at.get_or_insert_with(Timestamp::now);
                c.exit_code = Some(code);
                c.error = error.clone().or(c.error.take());
            }
            if r.state != SandboxState::Running {
                return Ok(false);
            }
            // Stopping first: the supervisor's exit that the stop causes is
            // then this ending's, not a crash (see `watch`).
            set_state(r, SandboxState::Stopping, "entrypoint_exited", "")
                .map_err(|e| OpError::Conflict(e.to_string()))?;
            Ok(true)
        });
        if ours.unwrap_or(false) {
            let (to, reason, message) = ending(code);
            tracing::info!(sandbox = %id, code, "the entrypoint exited; the sandbox ends with it");
            self.end(id, to, reason, &message);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandbox_ends_as_upstream_reports_its_container() {
        assert_eq!(
            ending(0),
            (SandboxState::Terminated, "CONTAINER_EXITED", "Sandbox container exited successfully.".into())
        );
        assert_eq!(
            ending(3),
            (SandboxState::Failed, "CONTAINER_EXITED_ERROR", "Sandbox container exited with code 3.".into())
        );
        assert_eq!(exit_status(None, Some(9)), 137, "a signal reads as docker's 128+N");
        assert_eq!(exit_status(Some(0), None), 0);
    }
}
