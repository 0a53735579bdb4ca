//! Releasing an ended Job's storage at once, for a frontend whose Jobs
//! are disposable (a deleted container): its stage, the VM disks a killed
//! supervisor left, and its execution checkpoints. `gc` does the same for
//! every Job, after an age.

use std::path::PathBuf;

use pvisor_core::ids::JobId;
use pvisor_core::records::JobRecord;
use pvisor_core::state::JobState;

use super::{Action, Runtime, RuntimeError};
use crate::runtime::gc;
use crate::runtime::job_service::views;

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
            match std::fs::remove_file(&path) {
                Ok(()) => released.removed.push(path),
                Err(e) => released.warnings.push(format!("cannot remove {what} ({}): {e}", path.display())),
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
