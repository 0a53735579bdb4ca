//! The live Attempts owned by this process.
//!
//! The owner lock on disk tells *other* processes that an Attempt is alive;
//! the registry tells this one, so a frontend (or the daemon) can list and
//! cancel what it runs without touching the disk.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use pvisor_core::ids::{AttemptId, JobId};

use super::job_service::CancelHandle;

/// One live Attempt.
#[derive(Clone, Debug)]
pub struct LiveAttempt {
    pub job: JobId,
    pub attempt: AttemptId,
    pub cancel: CancelHandle,
}

/// The registry of live Attempts. Cheap to clone; clones share the table.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    live: Arc<Mutex<BTreeMap<AttemptId, LiveAttempt>>>,
}

impl Registry {
    pub(crate) fn insert(&self, entry: LiveAttempt) {
        self.table().insert(entry.attempt.clone(), entry);
    }

    pub(crate) fn remove(&self, attempt: &AttemptId) {
        self.table().remove(attempt);
    }

    /// Returns the live Attempts, oldest first.
    pub fn list(&self) -> Vec<LiveAttempt> {
        self.table().values().cloned().collect()
    }

    /// Returns the live Attempt of `job`, if this process owns one.
    pub fn find_job(&self, job: &JobId) -> Option<LiveAttempt> {
        self.table().values().find(|l| &l.job == job).cloned()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, BTreeMap<AttemptId, LiveAttempt>> {
        // A panic while holding this lock cannot leave the map half-updated.
        self.live.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
