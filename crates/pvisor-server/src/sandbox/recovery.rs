//! What a (re)started daemon does with the records it finds: every
//! unfinished sandbox is reconciled with its Job, and work a dead daemon
//! left in flight is awaited or finished.

use std::collections::BTreeSet;
use std::fs;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pvisor::actions::{Kill, ListJobs, Status};
use pvisor_core::ids::JobId;
use pvisor_core::state::JobState;
use pvisor_core::time::Timestamp;

use crate::guest_link;
use crate::sandbox::SandboxRecord;

use super::entrypoint::ending;
use super::generations::{find_supervisor, supervisor_alive};
use super::{set_state, Binding, Daemon, Generation, OpError, SandboxState, READY_TIMEOUT, SANDBOX_LABEL};

impl Daemon {
    /// Reconciles every unfinished record with what is on disk after a
    /// (re)start: a state is only kept when the Job confirms it. Work a dead
    /// daemon left in flight (a create, pause or resume its supervisor is
    /// still doing) is awaited in the background.
    pub fn recover(self: &Arc<Self>) {
        self.stop_orphans();
        for record in self.list() {
            if record.state.is_final() {
                continue;
            }
            let id = record.id.clone();
            let bind = self.bind_file(&id);
            // The pid is recorded just after the spawn; a daemon killed in
            // between is covered by looking for the bind file in /proc.
            let supervisor = record
                .supervisor
                .filter(|pid| supervisor_alive(*pid, &bind))
                .or_else(|| find_supervisor(&bind));
            let binding = fs::read(&bind).ok().and_then(|b| serde_json::from_slice::<Binding>(&b).ok());
            // A create or resume whose supervisor is still starting the VM
            // (Stopping: a create deleted before its Job was admitted; the
            // provisioner stops it once it is up, as it would have).
            let starting = matches!(record.state, SandboxState::Pending | SandboxState::Resuming)
                || (record.state == SandboxState::Stopping && record.job.is_none());
            if starting {
                if let Some(pid) = supervisor {
                    tracing::info!(sandbox = %id, pid, state = record.state.as_str(), "recovery: its supervisor is still starting the VM; awaiting it");
                    let daemon = self.clone();
                    let resume =
                        (record.state == SandboxState::Resuming).then(|| record.job.clone()).flatten();
                    std::thread::spawn(move || {
                        let outcome = daemon.await_generation(&id, pid);
                        // The dead daemon may have put its vault in force
                        // again in the resumed Job before it died.
                        if resume.is_some() && outcome.is_ok() {
                            crate::credential_vault::withdraw_inherited(&daemon, &id);
                        }
                        daemon.provisioned(&id, resume, outcome, Instant::now());
                    });
                    continue;
                }
            }
            let Some(job) = binding.map(|b| b.job).or(record.job.clone()) else {
                tracing::info!(sandbox = %id, state = record.state.as_str(), "recovery: no Job was admitted and no supervisor is left");
                self.finish(&id, SandboxState::Failed, "daemon_restart", "the daemon stopped before this sandbox's VM was admitted, and its supervisor is gone; nothing is running");
                continue;
            };
            let status = match self.runtime.execute(Status { job: job.clone() }) {
                Ok(s) => s,
                Err(e) => {
                    self.finish(
                        &id,
                        SandboxState::Failed,
                        "record_unreadable",
                        &format!("its Job {job} cannot be read: {e}"),
                    );
                    continue;
                }
            };
            let attempt = status.attempt.number();
            tracing::info!(
                sandbox = %id,
                state = record.state.as_str(),
                job = %job,
                job_state = %status.state,
                supervisor,
                "recovery: reconciling the record with its Job"
            );
            let _ = self.update(&id, |r| {
                r.job = Some(job.clone());
                if r.generations.last().map(|g| g.attempt) != Some(attempt)
                    && status.state == JobState::Running
                {
                    r.generations.push(Generation { attempt, started_at: Timestamp::now(), ready_ms: None });
                }
                Ok(())
            });
            match (record.state, status.state) {
                // A dead daemon was ending it: for a delete, or for its
                // entrypoint's exit, whose code the record kept.
                (SandboxState::Stopping, _) => {
                    let exit = record.commands.get("entrypoint").and_then(|c| c.exit_code);
                    let (to, reason, message) = match (exit, record.reason.as_str()) {
                        (Some(code), "entrypoint_exited") => {
                            let (to, reason, message) = ending(code);
                            (to, reason.to_owned(), message)
                        }
                        // A reattach that gave up on its silent guest.
                        (_, "daemon_restart") => (
                            SandboxState::Failed,
                            record.reason.clone(),
                            "its VM did not answer after a daemon restart; it was stopped".to_owned(),
                        ),
                        // The delete's own reason: a user's, or the TTL's.
                        _ => (SandboxState::Terminated, record.reason.clone(), String::new()),
                    };
                    let daemon = self.clone();
                    std::thread::spawn(move || daemon.end(&id, to, &reason, &message));
                }
                (_, JobState::Suspended) => {
                    self.finish(
                        &id,
                        SandboxState::Paused,
                        "paused",
                        "recovered from disk: the VM is suspended",
                    );
                }
                // An accepted pause is finished: asked again (a suspend the
                // supervisor already began answers at once, and is waited out).
                (SandboxState::Pausing, JobState::Running) => {
                    // A pause that fails leaves it Running: with no vault
                    // this daemon cannot see.
                    crate::credential_vault::withdraw_inherited(self, &id);
                    let (daemon, mut record) = (self.clone(), record.clone());
                    record.job = Some(job.clone());
                    std::thread::spawn(move || match daemon.suspend_vm(&record) {
                        Ok(()) => daemon.finish(&id, SandboxState::Paused, "paused", ""),
                        Err(_) => daemon.settle_pause(&id, &job),
                    });
                }
                (_, JobState::Running | JobState::Pending) => {
                    // Before the API answers, so no client sees "no vault"
                    // while the old one is in force.
                    if status.state == JobState::Running {
                        crate::credential_vault::withdraw_inherited(self, &id);
                    }
                    // Probed in the background, with patience: a busy or slow
                    // (TCG) guest is not a dead one.
                    let (daemon, record) = (self.clone(), record.clone());
                    std::thread::spawn(move || daemon.reattach(&record, &job, attempt, supervisor));
                }
                (_, other) => {
                    let message = format!("its VM ended while the daemon was away (Job state {other})");
                    if matches!(other, JobState::Unknown) {
                        let _ =
                            self.runtime.execute(Kill { job: job.clone(), grace: Duration::from_secs(10) });
                    }
                    self.finish(&id, SandboxState::Failed, "runtime_exited", &message);
                }
            }
        }
    }

    /// Stops the live Jobs of sandboxes this daemon has no unfinished record
    /// of: a record deleted or damaged while the daemon was down would
    /// otherwise leave its VM running where neither the API nor the daemon
    /// could reach or stop it. Each is logged with its sandbox and Job.
    fn stop_orphans(self: &Arc<Self>) {
        let known: BTreeSet<String> =
            self.list().into_iter().filter(|r| !r.state.is_final()).map(|r| r.id).collect();
        let jobs = match self.runtime.execute(ListJobs) {
            Ok(jobs) => jobs,
            Err(e) => return tracing::warn!("recovery: cannot list Jobs to find orphaned sandboxes: {e}"),
        };
        for (job, status) in jobs {
            let Ok(status) = status else { continue };
            let Some(sandbox) = status.labels.get(SANDBOX_LABEL) else { continue };
            let alive = status.live || status.state == JobState::Suspended;
            if !alive || known.contains(sandbox) {
                continue;
            }
            tracing::warn!(sandbox = %sandbox, job = %job, state = %status.state, "recovery: a live Job runs a sandbox this daemon has no record of (deleted or damaged); stopping it");
            let daemon = self.clone();
            std::thread::spawn(move || daemon.close_and_release(&job));
        }
    }

    /// Reattaches to a sandbox whose VM its Job says is running, once its
    /// guest answers (within [`READY_TIMEOUT`]); a guest that never does is
    /// stopped and the sandbox failed.
    fn reattach(
        self: &Arc<Self>,
        record: &SandboxRecord,
        job: &JobId,
        attempt: u32,
        supervisor: Option<u32>,
    ) {
        let id = &record.id;
        let patience = (READY_TIMEOUT, Duration::from_millis(200));
        let probed = guest_link::await_ready(&self.runtime, job, attempt, &record.rootfs, patience, None);
        let last = match probed {
            Ok(_) => {
                // Only if nothing happened to it meanwhile (a pause, a delete).
                let _ = self.update(id, |r| {
                    let same_vm = r.generations.last().map(|g| g.attempt) == Some(attempt);
                    if r.state == SandboxState::Running && same_vm {
                        r.supervisor = supervisor.or(r.supervisor);
                        set_state(
                            r,
                            SandboxState::Running,
                            "reattached",
                            "the daemon restarted; the VM kept running",
                        )
                        .map_err(|e| OpError::Conflict(e.to_string()))?;
                    }
                    Ok(())
                });
                if let Some(pid) = supervisor {
                    self.watch(id, pid);
                }
                self.follow_entrypoint(id);
                return;
            }
            Err(e) => e.0,
        };
        // A sandbox paused, resumed or deleted meanwhile is not this probe's
        // to end. Decided under the records lock, and Stopping from then on,
        // so no pause or delete comes between the decision and the kill.
        let ours = self.update(id, |r| {
            let same_vm = r.generations.last().map(|g| g.attempt) == Some(attempt);
            if r.state != SandboxState::Running || !same_vm {
                return Ok(false);
            }
            set_state(r, SandboxState::Stopping, "daemon_restart", "")
                .map_err(|e| OpError::Conflict(e.to_string()))?;
            Ok(true)
        });
        if ours.unwrap_or(false) {
            let _ = self.runtime.execute(Kill { job: job.clone(), grace: Duration::from_secs(10) });
            self.finish(
                id,
                SandboxState::Failed,
                "daemon_restart",
                &format!(
                    "its VM did not answer for {READY_TIMEOUT:?} after the restart ({last}); it was stopped"
                ),
            );
        }
    }

    /// Waits out a suspend another daemon instance requested.
    pub(super) fn settle_pause(self: &Arc<Self>, id: &str, job: &JobId) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            match self.runtime.execute(Status { job: job.clone() }).map(|s| s.state) {
                Ok(JobState::Suspended) => return self.finish(id, SandboxState::Paused, "paused", ""),
                Ok(JobState::Running) => {}
                Ok(other) => {
                    return self.finish(
                        id,
                        SandboxState::Failed,
                        "pause_failed",
                        &format!("the Job ended {other}"),
                    )
                }
                Err(e) => return self.finish(id, SandboxState::Failed, "pause_failed", &e.to_string()),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Still running: the suspend was never taken (or failed); the VM is live.
        self.finish(
            id,
            SandboxState::Running,
            "pause_failed",
            "the pause did not complete before the daemon restarted",
        );
        self.follow_entrypoint(id);
    }
}
