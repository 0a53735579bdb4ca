//! The fake execution-checkpoint and guest-access capabilities: refusing
//! by default, or working on the fake executor's sandboxes and a
//! [`FakeGuest`].

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pvisor_agent_proto::{Reply, Request};
use pvisor_core::ids::CheckpointId;
use pvisor_core::time::Timestamp;
use pvisor_sandbox::capabilities::{CapabilityError, Checkpointable, GuestAccess};
use pvisor_sandbox::{Executor, SandboxError};
use pvisor_vm::checkpoint::{CheckpointFile, KIND, LOWER, MANIFEST, STATE, UPPER};
use pvisor_vm::guest::{ExecChannel, ExecSpec};
use pvisor_vm::ExecCheckpoint;

use super::executor::{run_dir_of_attempt, Control};
use super::{lock, FakeExecutor, FakeGuest};

/// A fake [`Checkpointable`] + [`GuestAccess`]. [`Default`] answers every
/// request with a failure and records which Attempt directory it was asked
/// about; [`FakeCheckpointer::working`] does what a vm backend does, on the
/// fake executor's sandboxes and a [`FakeGuest`].
#[derive(Debug, Default)]
pub struct FakeCheckpointer {
    pub asked: Mutex<Vec<PathBuf>>,
    working: Option<Working>,
}

#[derive(Debug)]
struct Working {
    executor: Arc<FakeExecutor>,
    guest: Arc<FakeGuest>,
}

impl FakeCheckpointer {
    /// Checkpoints, suspends and restores the sandboxes `executor` runs
    /// (a script that runs until signalled is a live VM), and serves a
    /// [`FakeGuest`] that runs every exec as exit 0.
    pub fn working(executor: &Arc<FakeExecutor>) -> Self {
        Self::working_with(executor, Arc::new(FakeGuest::default()))
    }

    /// [`Self::working`] with the guest `guest` (scripted execs).
    pub fn working_with(executor: &Arc<FakeExecutor>, guest: Arc<FakeGuest>) -> Self {
        Self { asked: Mutex::default(), working: Some(Working { executor: executor.clone(), guest }) }
    }

    /// The guest of a working fake.
    pub fn guest(&self) -> Option<&Arc<FakeGuest>> {
        self.working.as_ref().map(|w| &w.guest)
    }

    fn refuse(&self, attempt_dir: &Path) -> CapabilityError {
        lock(&self.asked).push(attempt_dir.to_owned());
        CapabilityError::Failed("the fake backend refuses".into())
    }

    fn reach(&self, attempt_dir: &Path) -> Result<&Working, CapabilityError> {
        match &self.working {
            Some(w) => {
                lock(&self.asked).push(attempt_dir.to_owned());
                Ok(w)
            }
            None => Err(self.refuse(attempt_dir)),
        }
    }

    /// Writes a verifiable execution checkpoint of the live sandbox of
    /// `attempt_dir`; with `suspend`, that sandbox then ends `Suspended`.
    fn save(&self, attempt_dir: &Path, suspend: bool) -> Result<ExecCheckpoint, CapabilityError> {
        let working = self.reach(attempt_dir)?;
        let live = working.executor.live_of(attempt_dir).ok_or_else(|| {
            CapabilityError::Unreachable(format!("no fake sandbox runs for {}", attempt_dir.display()))
        })?;
        let id = CheckpointId::generate();
        let dir = run_dir_of_attempt(attempt_dir).join("exec-checkpoints").join(id.as_str());
        let failed =
            |e: std::io::Error| CapabilityError::Failed(format!("cannot write the fake checkpoint: {e}"));
        std::fs::create_dir_all(&dir).map_err(failed)?;
        let mut files = Vec::new();
        for name in [STATE, LOWER, UPPER] {
            let bytes = format!("fake {name} of {}", id.as_str()).into_bytes();
            std::fs::write(dir.join(name), &bytes).map_err(failed)?;
            files.push(CheckpointFile {
                name: name.into(),
                size: bytes.len() as u64,
                blake3: pvisor_core::store::blake3_hex(&bytes),
                sparse: false,
            });
        }
        let manifest = ExecCheckpoint {
            format: 1,
            id,
            kind: KIND.into(),
            created_at: Timestamp::now(),
            image: "fake".into(),
            machine: pvisor_vm::MachineConfig {
                memory_mib: 256,
                cpus: 1,
                accelerator: pvisor_vm::Accelerator::Tcg,
                ram: Default::default(),
                cpu: Default::default(),
                pit: Default::default(),
            },
            workspace: live.workspace.clone(),
            exec_id: 1,
            context: serde_json::Value::Null,
            files,
            disks: vec![LOWER.into(), UPPER.into()],
            userland: None,
            frozen: Vec::new(),
            nic: None,
            paused_ms: 1,
            save_ms: 1,
        };
        let bytes =
            serde_json::to_vec_pretty(&manifest).map_err(|e| CapabilityError::Failed(e.to_string()))?;
        std::fs::write(dir.join(MANIFEST), bytes).map_err(failed)?;
        if suspend {
            live.control
                .send(Control::Suspend(Box::new(manifest.clone())))
                .map_err(|_| CapabilityError::Unreachable("the fake sandbox ended meanwhile".into()))?;
        }
        Ok(manifest)
    }
}

impl Checkpointable for FakeCheckpointer {
    fn checkpoint(&self, attempt_dir: &Path, _: Duration) -> Result<ExecCheckpoint, CapabilityError> {
        self.save(attempt_dir, false)
    }

    fn suspend(&self, attempt_dir: &Path, _: Duration) -> Result<ExecCheckpoint, CapabilityError> {
        self.save(attempt_dir, true)
    }

    fn restorer(&self, _: &Path, _: &ExecCheckpoint) -> Result<Arc<dyn Executor>, SandboxError> {
        match &self.working {
            Some(w) => Ok(w.executor.clone()),
            None => Err(SandboxError::Protocol("the fake backend cannot restore".into())),
        }
    }
}

impl GuestAccess for FakeCheckpointer {
    fn exec(&self, attempt_dir: &Path, spec: ExecSpec) -> Result<ExecChannel, CapabilityError> {
        let working = self.reach(attempt_dir)?;
        reachable(working, attempt_dir)?;
        working.guest.exec(spec)
    }

    fn attach(&self, attempt_dir: &Path, id: u32) -> Result<ExecChannel, CapabilityError> {
        let working = self.reach(attempt_dir)?;
        reachable(working, attempt_dir)?;
        working.guest.attach(id)
    }

    fn call(
        &self,
        attempt_dir: &Path,
        request: &Request,
        payload: &[u8],
        _: Duration,
    ) -> Result<(Reply, Vec<u8>), CapabilityError> {
        let working = self.reach(attempt_dir)?;
        reachable(working, attempt_dir)?;
        working.guest.call(request, payload)
    }

    fn connect(&self, attempt_dir: &Path, port: u16) -> Result<UnixStream, CapabilityError> {
        let working = self.reach(attempt_dir)?;
        reachable(working, attempt_dir)?;
        working.guest.connect(port)
    }
}

/// A guest is reachable only while its fake sandbox runs, and (as a VM's
/// guest answers only once it has booted) once the Session has recorded
/// the start.
fn reachable(working: &Working, attempt_dir: &Path) -> Result<(), CapabilityError> {
    let unreachable = |why: &str| {
        Err(CapabilityError::Unreachable(format!(
            "the VM's supervisor is not reachable at {} ({why}); is the Job running?",
            attempt_dir.display()
        )))
    };
    if working.executor.live_of(attempt_dir).is_none() {
        return unreachable("no fake sandbox runs");
    }
    if !started(attempt_dir) {
        return unreachable("the fake VM is still booting");
    }
    Ok(())
}

/// Whether the Session recorded the start of the Attempt of `attempt_dir`
/// (`<root>/runs/<run>/attempts/<n>`): its Job is `running`.
fn started(attempt_dir: &Path) -> bool {
    use pvisor_core::records::{AttemptRecord, JobRecord};
    let read = |path: &Path| std::fs::read(path).ok();
    let Some(attempt) = read(&attempt_dir.join("attempt.json"))
        .and_then(|b| serde_json::from_slice::<AttemptRecord>(&b).ok())
        .filter(|a| a.started_at.is_some())
    else {
        return false;
    };
    let Some(root) = attempt_dir.ancestors().nth(4) else { return false };
    let Ok(store) = pvisor_core::store::Store::open(root) else { return false };
    store
        .read::<JobRecord>(&store.job_file(&attempt.job))
        .is_ok_and(|job| job.state == pvisor_core::state::JobState::Running)
}
