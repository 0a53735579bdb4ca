//! Releasing an ended Job's storage at once, for a frontend whose Jobs
//! are disposable (a deleted container): its stage, the VM disks a killed
//! supervisor left, and its execution checkpoints. `gc` does the same for
//! every Job, after an age.

use std::path::PathBuf;

use pvisor_core::ids::JobId;
use pvisor_core::records::JobRecord;
use pvisor_core::state::JobState;

use super::{Action, Runtime, RuntimeError};
use crate::records::views;
use crate::runtime::gc;

/// Drops the stage of an ended Job and removes its leftover VM disks and
/// execution checkpoints. A Job that is still live keeps everything.
#[derive(Debug)]
pub struct ReleaseStorage {
    pub job: JobId,
}

/// What [`ReleaseStorage`] removed, and what it could not.
#[derive(Debug, Default)]
pub struct Released {
    pub removed: Vec<PathBuf>,
    pub warnings: Vec<String>,
}

impl Action for ReleaseStorage {
    const NAME: &'static str = "release-storage";
    type Outcome = Released;

    fn perform(self, runtime: &Runtime) -> Result<Released, RuntimeError> {
        let store = &runtime.store;
        let status = views::status(store, &self.job)?;
        let mut released = Released::default();
        if status.live {
            released.warnings.push(format!("Job {} is still live; nothing was released", self.job));
            return Ok(released);
        }
        // Only a confirmed result has a stage to drop (a suspended Job that
        // was killed ends `lost`, its writes only in its checkpoints).
        if matches!(status.state, JobState::Completed | JobState::Failed | JobState::Cancelled) {
            if let Err(e) = crate::effects::drop_changes(store, &self.job, &[]) {
                released.warnings.push(format!("cannot drop the stage of {}: {e}", self.job));
            }
        }
        let record: JobRecord = store.read(&store.job_file(&self.job))?;
        for (what, path) in gc::leftover_vm_disks(store, &record) {
            match gc::remove_tree(&path) {
                Ok(()) => released.removed.push(path),
                Err((at, e)) => {
                    released.warnings.push(format!("cannot remove {what} ({}): {e}", at.display()))
                }
            }
        }
        let checkpoints = store.exec_checkpoints_dir(&record.run);
        match std::fs::remove_dir_all(&checkpoints) {
            Ok(()) => released.removed.push(checkpoints),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => released.warnings.push(format!("cannot remove {}: {e}", checkpoints.display())),
        }
        Ok(released)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Arc;

    use pvisor_core::store::Store;

    use super::*;
    use crate::actions::{Run, Status};
    use crate::testing::{FakeBackends, FakeExecutor, Script};
    use crate::{RunEnd, RunRequest};

    #[test]
    fn an_ended_jobs_stage_disks_and_checkpoints_are_released_and_its_records_kept() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("ws");
        std::fs::create_dir(&workspace).unwrap();
        let store = Store::open(dir.path().join("state")).unwrap();
        let fake = FakeExecutor::new(vec![Script::exits(0, &[("made.txt", "x")])]);
        let backends = Arc::new(FakeBackends { executor: fake, capabilities: None });
        let runtime = Runtime::new(store.clone(), backends);
        let request = RunRequest {
            caches: Vec::new(),
            state: Vec::new(),
            state_from: None,
            labels: Default::default(),
            network_namespace: None,
            shared_directories: Vec::new(),
            image: None,
            output: None,
            workspace: workspace.clone(),
            cwd: None,
            program: "fake-command".into(),
            args: Vec::new(),
            env: Vec::new(),
            kill_grace: std::time::Duration::from_millis(300),
            network: Vec::new(),
            fork: None,
            fork_execution: None,
            secrets: Default::default(),
            seccomp: true,
            limits: Default::default(),
        };
        let executor = runtime.executor("fake").unwrap();
        let outcome =
            tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
                let mut run = runtime.execute(Run { request, executor }).unwrap();
                match run.wait().await.unwrap() {
                    RunEnd::Finished(outcome) => outcome,
                    RunEnd::Suspended(s) => panic!("suspended: {s:?}"),
                }
            });
        // What a killed vm supervisor would have left.
        let vm_dir = store.attempt_dir(&outcome.attempt).join("vm");
        std::fs::create_dir_all(&vm_dir).unwrap();
        std::fs::write(vm_dir.join(pvisor_vm::checkpoint::UPPER), b"disk").unwrap();
        let checkpoints = store.exec_checkpoints_dir(&outcome.run);
        std::fs::create_dir_all(checkpoints.join("ckpt")).unwrap();

        let released = runtime.execute(ReleaseStorage { job: outcome.job.clone() }).unwrap();
        assert!(released.warnings.is_empty(), "{:?}", released.warnings);
        assert!(!vm_dir.join(pvisor_vm::checkpoint::UPPER).exists());
        assert!(!checkpoints.exists());
        let status = runtime.execute(Status { job: outcome.job.clone() }).unwrap();
        assert_eq!(status.state, JobState::Completed, "the records stay");
        assert_eq!(status.stage_state, Some(crate::effects::StageState::Dropped), "the stage is dropped");
        assert!(!workspace.join("made.txt").exists(), "nothing was applied");
    }
}
