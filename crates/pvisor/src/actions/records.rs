//! Actions that find, recover, export, import and verify Jobs' records, and
//! list what the state directory keeps (checkpoints, caches): what a
//! frontend reads around the Jobs it runs.

use std::path::PathBuf;

use pvisor_core::ids::{CheckpointId, JobId};
use pvisor_core::records::{AttemptRecord, CheckpointManifest};
use pvisor_core::store::Store;

use super::{Action, Runtime, RuntimeError};
use crate::records::recovery::{self, Recovered};
use crate::records::suspension;
use crate::records::views;
use crate::runtime::archive::{self, Exported, Verified};
use crate::runtime::checkpoint::{self, CheckpointHold, CheckpointListing};
use crate::runtime::gc;

/// Resolves a Job's id or unique prefix; without one, the most recent Job.
#[derive(Debug)]
pub struct ResolveJob {
    pub query: Option<String>,
}

impl Action for ResolveJob {
    const NAME: &'static str = "resolve-job";
    type Outcome = JobId;

    fn perform(self, runtime: &Runtime) -> Result<JobId, RuntimeError> {
        Ok(views::resolve_job(&runtime.store, self.query.as_deref())?)
    }
}

/// The most recent Job whose workspace contains `dir`, with that workspace.
#[derive(Debug)]
pub struct LatestJobIn {
    pub dir: PathBuf,
}

impl Action for LatestJobIn {
    const NAME: &'static str = "latest-job-in";
    type Outcome = Option<(JobId, PathBuf)>;

    fn perform(self, runtime: &Runtime) -> Result<Self::Outcome, RuntimeError> {
        Ok(views::latest_job_in(&runtime.store, &self.dir)?)
    }
}

/// Reconciles a Job's records with its receipts and owner before it is
/// read: a Job whose supervisor died is closed honestly.
#[derive(Debug)]
pub struct Recover {
    pub job: JobId,
}

impl Action for Recover {
    const NAME: &'static str = "recover";
    type Outcome = Recovered;

    fn perform(self, runtime: &Runtime) -> Result<Recovered, RuntimeError> {
        Ok(recovery::recover(&runtime.store, &self.job)?)
    }
}

/// Writes the Run Bundle archive of a Job to `out` (a lost Job's stage,
/// marked unconfirmed).
#[derive(Debug)]
pub struct Export {
    pub job: JobId,
    pub out: PathBuf,
}

impl Action for Export {
    const NAME: &'static str = "export";
    type Outcome = Exported;

    fn perform(self, runtime: &Runtime) -> Result<Exported, RuntimeError> {
        Ok(archive::export(&runtime.store, &self.job, &self.out)?)
    }
}

/// Imports an archive as a read-only Job.
#[derive(Debug)]
pub struct Import {
    pub file: PathBuf,
}

impl Action for Import {
    const NAME: &'static str = "import";
    type Outcome = JobId;

    fn perform(self, runtime: &Runtime) -> Result<JobId, RuntimeError> {
        Ok(archive::import(&runtime.store, &self.file)?)
    }
}

/// Verifies an archive file: every digest, the receipt binding, every
/// staged file.
#[derive(Debug)]
pub struct VerifyArchive {
    pub path: PathBuf,
}

/// What [`VerifyArchive`] found.
#[derive(Debug)]
pub struct ArchiveVerified {
    pub verified: Verified,
    /// The archived run's result is what its guest reported (see
    /// [`BackendTraits::guest_reported`](crate::backends::BackendTraits)).
    pub guest_reported: bool,
}

impl Action for VerifyArchive {
    const NAME: &'static str = "verify-archive";
    type Outcome = ArchiveVerified;

    fn perform(self, runtime: &Runtime) -> Result<ArchiveVerified, RuntimeError> {
        let verified = archive::verify_archive(&self.path)?;
        let guest_reported = verified
            .entries
            .get(b"pvisor-bundle/attempt.json".as_slice())
            .and_then(|bytes| serde_json::from_slice::<AttemptRecord>(bytes).ok())
            .is_some_and(|attempt| runtime.backends.traits(&attempt.executor).guest_reported);
        Ok(ArchiveVerified { verified, guest_reported })
    }
}

/// Verifies a Job in the state directory: a valid receipt and Bundle, and
/// every remaining staged file.
#[derive(Debug)]
pub struct VerifyJob {
    pub job: JobId,
}

/// What [`VerifyJob`] found.
#[derive(Debug)]
pub struct JobVerified {
    /// The staged files still in the stage, each matching the Bundle.
    pub remaining: usize,
    /// The Job's result is what its guest reported.
    pub guest_reported: bool,
}

impl Action for VerifyJob {
    const NAME: &'static str = "verify-job";
    type Outcome = JobVerified;

    fn perform(self, runtime: &Runtime) -> Result<JobVerified, RuntimeError> {
        let store = &runtime.store;
        let guest_reported = views::status(store, &self.job)
            .ok()
            .and_then(|status| store.read::<AttemptRecord>(&store.attempt_file(&status.attempt)).ok())
            .is_some_and(|attempt| runtime.backends.traits(&attempt.executor).guest_reported);
        let remaining = archive::verify_job(store, &self.job)?;
        Ok(JobVerified { remaining, guest_reported })
    }
}

/// Every workspace checkpoint, a broken one with its error.
#[derive(Debug)]
pub struct ListCheckpoints;

impl Action for ListCheckpoints {
    const NAME: &'static str = "list-checkpoints";
    type Outcome = Vec<CheckpointListing>;

    fn perform(self, runtime: &Runtime) -> Result<Vec<CheckpointListing>, RuntimeError> {
        Ok(checkpoint::list(&runtime.store)?)
    }
}

/// Every execution checkpoint of every Job, a broken one with its error.
#[derive(Debug)]
pub struct ListExecutionCheckpoints;

impl Action for ListExecutionCheckpoints {
    const NAME: &'static str = "list-execution-checkpoints";
    type Outcome = Vec<suspension::Listing>;

    fn perform(self, runtime: &Runtime) -> Result<Vec<suspension::Listing>, RuntimeError> {
        Ok(suspension::list_all(&runtime.store)?)
    }
}

/// Resolves a workspace checkpoint's id or prefix and holds it against
/// `gc` until the hold is dropped.
#[derive(Debug)]
pub struct HoldCheckpoint {
    pub query: String,
}

impl Action for HoldCheckpoint {
    const NAME: &'static str = "hold-checkpoint";
    type Outcome = (CheckpointId, CheckpointHold);

    fn perform(self, runtime: &Runtime) -> Result<Self::Outcome, RuntimeError> {
        let id = checkpoint::resolve(&runtime.store, &self.query)?;
        let hold = checkpoint::hold(&runtime.store, &id)?;
        Ok((id, hold))
    }
}

/// A workspace checkpoint's manifest.
#[derive(Debug)]
pub struct ReadCheckpoint {
    pub id: CheckpointId,
}

impl Action for ReadCheckpoint {
    const NAME: &'static str = "read-checkpoint";
    type Outcome = CheckpointManifest;

    fn perform(self, runtime: &Runtime) -> Result<CheckpointManifest, RuntimeError> {
        Ok(checkpoint::manifest(&runtime.store, &self.id)?)
    }
}

/// One store `pvisor run --cache` keeps a cached directory's additions in.
#[derive(Debug)]
pub struct Cache {
    /// The store's directory under the state directory.
    pub store: PathBuf,
    /// The host directory it caches for.
    pub path: PathBuf,
    pub bytes: u64,
    /// A run is using it.
    pub in_use: bool,
}

/// Every cache store, by the path it caches for.
#[derive(Debug)]
pub struct ListCaches;

impl Action for ListCaches {
    const NAME: &'static str = "list-caches";
    type Outcome = Vec<Cache>;

    fn perform(self, runtime: &Runtime) -> Result<Vec<Cache>, RuntimeError> {
        caches(&runtime.store)
    }
}

fn caches(store: &Store) -> Result<Vec<Cache>, RuntimeError> {
    let dir = store.caches_dir();
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(RuntimeError::Cache(format!("cannot list {}: {e}", dir.display()))),
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let store_dir = entry.path();
        let path = std::fs::read(store_dir.join("path"))
            .map(|b| PathBuf::from(std::ffi::OsString::from(String::from_utf8_lossy(&b).into_owned())))
            .unwrap_or_default();
        let in_use = pvisor_sandbox::CacheMount::hold(&store_dir).is_none();
        out.push(Cache { bytes: gc::size_of(&store_dir.join("upper")), store: store_dir, path, in_use });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Removes one cache store unless a run is using it; whether it was removed.
#[derive(Debug)]
pub struct PruneCache {
    pub store: PathBuf,
}

impl Action for PruneCache {
    const NAME: &'static str = "prune-cache";
    type Outcome = bool;

    fn perform(self, _runtime: &Runtime) -> Result<bool, RuntimeError> {
        let Some(_held) = pvisor_sandbox::CacheMount::hold(&self.store) else { return Ok(false) };
        gc::remove_tree(&self.store)
            .map_err(|(at, e)| RuntimeError::Cache(format!("cannot remove {}: {e}", at.display())))?;
        Ok(true)
    }
}

/// A Job's completion receipt, validated against its Bundle; `None` while
/// no Attempt of it has one.
#[derive(Debug)]
pub struct ReadReceipt {
    pub job: JobId,
}

impl Action for ReadReceipt {
    const NAME: &'static str = "read-receipt";
    type Outcome = Option<pvisor_core::records::CompletionReceipt>;

    fn perform(self, runtime: &Runtime) -> Result<Self::Outcome, RuntimeError> {
        let store = &runtime.store;
        let status = views::status(store, &self.job)?;
        let loaded = crate::records::completion::load(store, &self.job, &status.attempt)
            .map_err(crate::ViewError::from)?;
        Ok(loaded.map(|(receipt, _)| receipt))
    }
}
