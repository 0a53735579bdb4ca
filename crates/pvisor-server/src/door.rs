//! The runtime's answers the daemon reads, through its one door
//! ([`pvisor::Runtime::execute`]).

use std::time::Duration;

use pvisor::actions::{Kill, ResolveJob, Status};
use pvisor::{JobStatus, Killed, Runtime, RuntimeError};
use pvisor_core::ids::JobId;
use pvisor_core::store::Store;

/// The runtime of this machine's backends over `store`.
fn runtime(store: &Store) -> Runtime {
    Runtime::on_host(store.clone())
}

/// A Job's status, trusting only a valid receipt.
pub fn status(store: &Store, job: &JobId) -> Result<JobStatus, RuntimeError> {
    runtime(store).execute(Status { job: job.clone() })
}

/// Ends a Job (SIGKILL after `grace`) and withdraws its continuation.
pub fn kill(store: &Store, job: &JobId, grace: Duration) -> Result<Killed, RuntimeError> {
    runtime(store).execute(Kill { job: job.clone(), grace })
}

/// Resolves a Job's id or unique prefix.
pub fn resolve_job(store: &Store, query: Option<&str>) -> Result<JobId, RuntimeError> {
    runtime(store).execute(ResolveJob { query: query.map(str::to_owned) })
}
