//! The lifecycle operations on a sandbox: create, pause, resume, delete,
//! and the daemon-wide expiry and shutdown policies; each records its
//! state moves and does the slow part (a VM suspend, a Job kill) on a thread.

use std::collections::BTreeMap;
use std::fs;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use pvisor::actions::{Kill, Status};
use pvisor_core::ids::JobId;
use pvisor_core::state::JobState;
use pvisor_core::time::Timestamp;

use crate::guest_link::{self, GuestError};

use super::{set_state, CreateRequest, Daemon, OpError, SandboxRecord, SandboxState};

/// Why a pause did not leave the VM suspended.
#[derive(Debug, thiserror::Error)]
pub enum SuspendError {
    #[error("no VM to suspend")]
    NoVm,
    #[error(transparent)]
    Guest(#[from] GuestError),
}

/// How long a Terminated or Failed sandbox stays listed.
const KEEP_FINISHED: Duration = Duration::from_secs(3600);

impl Daemon {
    /// Creates a sandbox record in `Pending` and starts its VM in the background.
    pub fn create(self: &Arc<Self>, request: CreateRequest) -> Result<SandboxRecord, OpError> {
        crate::images::validate_name(&request.image).map_err(|e| OpError::Invalid(e.0))?;
        let rootfs = self.images.rootfs_importing(&request.image).map_err(|e| OpError::Invalid(e.0))?;
        let rootfs = rootfs.ok_or_else(|| {
            OpError::Invalid(format!(
                "image {:?} is not imported on this host (known: {}); import it with `pvisor image import {} DIR|TAR|OCI-LAYOUT` (no registry is contacted)",
                request.image,
                self.images.known_names().join(", "),
                request.image
            ))
        })?;
        let now = Timestamp::now();
        let expires_at = match request.timeout {
            None => None,
            Some(t) if t < 60 => {
                return Err(OpError::Invalid(format!("timeout {t} s is below the minimum of 60 s")))
            }
            Some(t) if Duration::from_secs(t) > self.config.max_timeout => {
                return Err(OpError::Invalid(format!(
                    "timeout {t} s exceeds this server's maximum of {} s",
                    self.config.max_timeout.as_secs()
                )))
            }
            Some(t) => Some(Timestamp::from(now.system_time() + Duration::from_secs(t))),
        };
        let record = SandboxRecord {
            format: 1,
            id: format!("sb-{}", pvisor_core::ids::new_ulid().to_ascii_lowercase()),
            image: request.image,
            snapshot_id: request.snapshot_id,
            entrypoint: request.entrypoint,
            env: request.env,
            metadata: request.metadata,
            resource_limits: request.resource_limits,
            platform: request.platform,
            created_at: now,
            expires_at,
            state: SandboxState::Pending,
            reason: "provisioning".into(),
            message: "starting the microVM".into(),
            last_transition_at: now,
            job: None,
            generations: Vec::new(),
            token: crate::http::uuid4(),
            next_exec: 2,
            commands: BTreeMap::new(),
            rootfs,
            supervisor: None,
            memory_mib: request.memory_mib,
            cpus: request.cpus,
            deleted: false,
            network_policy: request.network_policy,
            credential_proxy: request.credential_proxy,
            renew_on_access: request.renew_on_access,
            volumes: request.volumes,
        };
        self.persist(&record)?;
        self.records().insert(record.id.clone(), record.clone());
        // Its snapshot checked again now that this sandbox is recorded as
        // its user: a DELETE claims it before looking for users again.
        if let Some(snapshot) = &record.snapshot_id {
            if !self.snapshots.restorable(snapshot) {
                let _ = self.update(&record.id, |r| {
                    r.deleted = true;
                    set_state(r, SandboxState::Failed, "snapshot_deleted", "its snapshot was deleted")
                        .map_err(|e| OpError::Conflict(e.to_string()))
                });
                return Err(OpError::Conflict(format!(
                    "Snapshot {snapshot} was deleted while this sandbox was being created from it"
                )));
            }
        }
        let (daemon, id) = (self.clone(), record.id.clone());
        std::thread::Builder::new()
            .name("pvisor-sb-create".into())
            .spawn(move || daemon.provision(&id, None))
            .map_err(|e| OpError::Internal(e.to_string()))?;
        Ok(record)
    }

    /// `POST /pause`: Running → Pausing, then Paused once the VM's state is saved.
    pub fn pause(self: &Arc<Self>, id: &str) -> Result<(), OpError> {
        if self.get(id).is_ok_and(|r| !r.volumes.is_empty()) {
            return Err(OpError::Conflict(format!(
                "sandbox {id} has volumes, shared live with its VM (virtiofs), which cannot be saved with it: it cannot be paused"
            )));
        }
        let record =
            self.transition(id, &[SandboxState::Running], SandboxState::Pausing, "pause_requested")?;
        let (daemon, id) = (self.clone(), id.to_owned());
        std::thread::spawn(move || {
            let outcome = daemon.suspend_vm(&record);
            match outcome {
                Ok(()) => daemon.finish(&id, SandboxState::Paused, "paused", ""),
                Err(e) => {
                    let message = e.to_string();
                    tracing::warn!(sandbox = %id, "pause failed: {message}");
                    let alive = record
                        .job
                        .as_ref()
                        .and_then(|j| daemon.runtime.execute(Status { job: j.clone() }).ok());
                    match alive.map(|s| s.state) {
                        // Back to Running: an entrypoint that exited during
                        // the attempt ended nothing then, so it ends it now.
                        Some(JobState::Running) => {
                            daemon.finish(&id, SandboxState::Running, "pause_failed", &message);
                            daemon.follow_entrypoint(&id);
                        }
                        Some(JobState::Suspended) => daemon.finish(&id, SandboxState::Paused, "paused", ""),
                        _ => daemon.finish(&id, SandboxState::Failed, "pause_failed", &message),
                    }
                }
            }
        });
        Ok(())
    }

    pub(super) fn suspend_vm(&self, record: &SandboxRecord) -> Result<(), SuspendError> {
        let (Some(job), Some(generation)) = (&record.job, record.generations.last()) else {
            return Err(SuspendError::NoVm);
        };
        let _ = generation;
        // Paused only once the termination receipt makes the Job suspended:
        // the runtime's Suspend returns then, not when the VM is saved.
        guest_link::suspend(&self.runtime, job)?;
        Ok(())
    }

    /// `POST /resume`: Paused → Resuming, then Running in a new generation.
    pub fn resume(self: &Arc<Self>, id: &str) -> Result<(), OpError> {
        let record =
            self.transition(id, &[SandboxState::Paused], SandboxState::Resuming, "resume_requested")?;
        let job =
            record.job.clone().ok_or_else(|| OpError::Internal("a paused sandbox without a Job".into()))?;
        let (daemon, id) = (self.clone(), id.to_owned());
        std::thread::spawn(move || daemon.provision(&id, Some(job)));
        Ok(())
    }

    /// `DELETE`: → Stopping, then Terminated once the Job has ended.
    pub fn delete(self: &Arc<Self>, id: &str, reason: &str) -> Result<(), OpError> {
        self.delete_if(id, reason, |_| true)
    }

    /// [`Self::delete`], if `still` holds of the record under the records
    /// lock (a TTL expiry: a renewal accepted meanwhile wins).
    fn delete_if(
        self: &Arc<Self>,
        id: &str,
        reason: &str,
        still: impl FnOnce(&SandboxRecord) -> bool,
    ) -> Result<(), OpError> {
        // Decided under the records lock: a provisioner that sets Running
        // concurrently either sees Stopping (and stops it) or is seen here.
        let was = self.update(id, |r| {
            if r.deleted {
                return Err(OpError::NotFound(format!("Sandbox {id} not found.")));
            }
            if !still(r) {
                return Ok(None);
            }
            match r.state {
                SandboxState::Pending | SandboxState::Running | SandboxState::Paused => {}
                // The reference server removes an ended sandbox's container
                // too: DELETE frees what is left, answers 204, and the
                // sandbox is gone from the API.
                SandboxState::Failed | SandboxState::Terminated => {
                    r.deleted = true;
                    return Ok(Some(r.state));
                }
                SandboxState::Pausing | SandboxState::Resuming | SandboxState::Stopping => {
                    return Err(OpError::Conflict(format!(
                        "sandbox {id} is {}; delete it once that finishes",
                        r.state.as_str()
                    )))
                }
            }
            let was = r.state;
            r.deleted = true;
            set_state(r, SandboxState::Stopping, reason, "").map_err(|e| OpError::Conflict(e.to_string()))?;
            Ok(Some(was))
        })?;
        let Some(was) = was else { return Ok(()) };
        if was == SandboxState::Terminated {
            return Ok(());
        }
        if was == SandboxState::Failed {
            if let Some(job) = self.get(id).ok().and_then(|r| r.job) {
                let daemon = self.clone();
                std::thread::spawn(move || daemon.close_and_release(&job));
            }
            return Ok(());
        }
        if was != SandboxState::Pending {
            // A Pending sandbox is stopped by its provisioner once it is up.
            let (daemon, id, reason) = (self.clone(), id.to_owned(), reason.to_owned());
            std::thread::spawn(move || daemon.stop(&id, &reason));
        }
        Ok(())
    }

    /// Closes the Job of a sandbox that can never run again (its supervisor
    /// died) and frees its storage. Idempotent.
    pub(super) fn close_and_release(&self, job: &JobId) {
        if let Err(e) = self.runtime.execute(Kill { job: job.clone(), grace: Duration::from_secs(5) }) {
            tracing::warn!("cannot close {job}: {e}");
        }
        self.release_storage(job);
    }

    pub(super) fn stop(&self, id: &str, reason: &str) {
        self.end(id, SandboxState::Terminated, reason, "")
    }

    /// Stops the sandbox's VM and records it as ended in `to` (a stopping
    /// sandbox: a delete, or its entrypoint's exit) with `reason` and `message`.
    pub(super) fn end(&self, id: &str, to: SandboxState, reason: &str, message: &str) {
        let Ok(record) = self.get(id) else { return };
        // Killing the Job writes its receipt: on a (nearly) full disk, into
        // the space held back for it.
        if self.reserve.disk_low() {
            self.reserve.release();
        }
        let result = match &record.job {
            Some(job) => self
                .runtime
                .execute(Kill { job: job.clone(), grace: Duration::from_secs(15) })
                .map(|_| ())
                .map_err(|e| e.to_string()),
            None => Ok(()),
        };
        match result {
            Ok(()) => {
                if let Some(job) = &record.job {
                    self.release_storage(job);
                }
                self.finish(id, to, reason, message)
            }
            Err(e) => self.finish(id, SandboxState::Failed, "stop_failed", &e),
        }
        // Held back again for the next delete, if the room is there now.
        self.reserve.ensure();
    }

    /// A terminated sandbox's disk: its staged writes are dropped (there is
    /// no apply over this API; `pvisor gc` then frees them) and its execution
    /// checkpoints are deleted (the killed Job can never continue from them).
    /// The records and receipts stay.
    pub(super) fn release_storage(&self, job: &JobId) {
        let released = self.runtime.execute(pvisor::actions::ReleaseStorage { job: job.clone() });
        match released {
            Ok(released) => released.warnings.iter().for_each(|w| tracing::warn!("{w}")),
            Err(e) => tracing::warn!("cannot release the storage of {job}: {e}"),
        }
    }

    /// Kills sandboxes whose `expiresAt` passed (Running, Paused, or Pending).
    pub fn expire(self: &Arc<Self>) {
        let now = SystemTime::now();
        let due: Vec<String> = self
            .records()
            .values()
            .filter(|r| {
                matches!(r.state, SandboxState::Running | SandboxState::Paused | SandboxState::Pending)
            })
            .filter(|r| r.expires_at.is_some_and(|t| t.system_time() <= now))
            .map(|r| r.id.clone())
            .collect();
        for id in due {
            tracing::info!(sandbox = %id, "its timeout expired; stopping it");
            let still_due = |r: &SandboxRecord| r.expires_at.is_some_and(|t| t.system_time() <= now);
            let _ = self.delete_if(&id, "ttl_expiry", still_due);
        }
        // Finished sandboxes stay listed for a while, then their records go
        // (the Job's own records stay with pvisor's).
        let old: Vec<String> = self
            .records()
            .values()
            .filter(|r| r.state.is_final() && r.last_transition_at.system_time() + KEEP_FINISHED <= now)
            // Never forget a sandbox whose VM still runs (a failed stop).
            .filter(
                |r| !matches!(r.job.as_ref().map(|j| self.runtime.execute(Status { job: j.clone() })), Some(Ok(s)) if s.live),
            )
            .map(|r| r.id.clone())
            .collect();
        for id in old {
            self.records().remove(&id);
            for file in [format!("{id}.json"), format!("{id}.bind"), format!("{id}.log")] {
                let _ = fs::remove_file(self.dir.join(file));
            }
            self.sessions.lock().unwrap_or_else(|p| p.into_inner()).retain(|(sb, _), _| sb != &id);
            self.contexts.lock().unwrap_or_else(|p| p.into_inner()).retain(|(sb, _), _| sb != &id);
        }
    }

    /// The SIGTERM policy: every Running sandbox is paused (its execution
    /// saved to disk, the VM stopped), so a restarted daemon lists it Paused.
    pub fn shutdown(self: &Arc<Self>) {
        let running: Vec<SandboxRecord> =
            self.list().into_iter().filter(|r| r.state == SandboxState::Running).collect();
        let handles: Vec<_> = running
            .into_iter()
            .filter_map(|record| {
                let daemon = self.clone();
                let id = record.id.clone();
                daemon.transition(&id, &[SandboxState::Running], SandboxState::Pausing, "daemon_shutdown").ok()?;
                Some(std::thread::spawn(move || match daemon.suspend_vm(&record) {
                    Ok(()) => daemon.finish(&id, SandboxState::Paused, "daemon_shutdown", "paused when the daemon stopped"),
                    Err(e) => {
                        tracing::warn!(sandbox = %id, "could not pause at shutdown ({e}); it keeps running and is reattached on restart");
                        daemon.finish(&id, SandboxState::Running, "pause_failed", &e.to_string());
                    }
                }))
            })
            .collect();
        for h in handles {
            let _ = h.join();
        }
    }
}
