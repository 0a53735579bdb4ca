//! `kill`: the documented way out of any non-terminal state.
//!
//! 1. Withdraw the Job's continuation rights (durably, first), so nothing
//!    can resume it and no stale result can revive it.
//! 2. If an owner process still holds the Attempt, ask it to cancel (SIGTERM:
//!    it forwards the signal into the sandbox and finalizes with a receipt);
//!    if it does not let go in time, SIGKILL it (the sandbox dies with it).
//! 3. Recover: a valid receipt settles the Job with its confirmed result; no
//!    receipt closes the Job as `lost` — recorded as lost, never as success.

use std::time::{Duration, Instant};

use pvisor_core::event::EventKind;
use pvisor_core::ids::{AttemptId, JobId};
use pvisor_core::records::JobRecord;
use pvisor_core::state::JobState;
use pvisor_core::store::{OwnerLock, Store};
use pvisor_core::time::Timestamp;

use crate::records::recovery::{self, Recovered};
use crate::records::views::ViewError;
use crate::trace::data::{By, JobLost};

/// How a kill ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Killed {
    /// The Job had already ended in this state; nothing was done.
    AlreadyEnded(JobState),
    /// The Job ended with this state (confirmed by a receipt, or `lost`).
    Ended { state: JobState, stopped_owner: Option<i32> },
}

/// Returns the pid holding the `flock` on `path`, from `/proc/locks`.
fn lock_holder(path: &std::path::Path) -> Option<i32> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    let (ino, dev) = (meta.ino(), meta.dev());
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    // "1: FLOCK  ADVISORY  WRITE 1234 fd:00:5678 0 EOF" (major:minor in hex)
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (kind, pid, id) = (fields.get(1)?, fields.get(4)?, fields.get(5)?);
        let mut parts = id.split(':');
        let maj = u32::from_str_radix(parts.next()?, 16).ok()?;
        let min = u32::from_str_radix(parts.next()?, 16).ok()?;
        let inode: u64 = parts.next()?.parse().ok()?;
        (*kind == "FLOCK" && inode == ino && maj == major && min == minor).then(|| pid.parse().ok()).flatten()
    })
}

fn wait_released(lock: &std::path::Path, timeout: Duration) -> Result<bool, ViewError> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if !OwnerLock::is_held(lock)? {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(!OwnerLock::is_held(lock)?)
}

/// Kills `job` (see the module doc). `grace` is how long a live owner gets to
/// cancel and publish its receipt before it is killed.
pub fn kill(store: &Store, job_id: &JobId, grace: Duration) -> Result<Killed, ViewError> {
    let job: JobRecord = store.read(&store.job_file(job_id))?;
    if job.state.is_terminal() {
        return Ok(Killed::AlreadyEnded(job.state));
    }
    // Withdrawing continuation comes first, but a failure to record it (a
    // full disk a live command keeps filling) must not keep that command
    // running: the owner is stopped regardless, then the error is returned
    // (and `pvisor kill` retries it with the state directory's reserve).
    let withdrawn = (|| -> Result<(), ViewError> {
        let _guard = recovery::lock_job(store, job_id)?;
        let mut job: JobRecord = store.read(&store.job_file(job_id))?;
        if job.continuation {
            job.continuation = false;
            job.updated_at = Timestamp::now();
            store.write(&store.job_file(job_id), &job)?;
            recovery::append_event(store, &job, EventKind::JobContinuationWithdrawn, &By { by: "kill" })?;
        }
        Ok(())
    })();
    let attempt = AttemptId::new(job.run.clone(), job.target_attempt);
    let lock = store.lock_file(&attempt);
    let mut stopped_owner = None;
    if OwnerLock::is_held(&lock)? {
        if let Some(pid) = lock_holder(&lock) {
            stopped_owner = Some(pid);
            // The process that holds the Attempt's lock: its supervisor.
            let owner = rustix::process::Pid::from_raw(pid);
            let signal = |s| owner.map(|p| rustix::process::kill_process(p, s));
            let _ = signal(rustix::process::Signal::TERM);
            if !wait_released(&lock, grace)? {
                // The sandbox dies with its supervisor.
                let _ = signal(rustix::process::Signal::KILL);
                wait_released(&lock, Duration::from_secs(10))?;
            }
        }
    }
    withdrawn?;
    let state = match recovery::recover(store, job_id)? {
        Recovered::Reconciled(state) => state,
        Recovered::Live => JobState::Running,
        Recovered::Settled | Recovered::Unknown => {
            let _guard = recovery::lock_job(store, job_id)?;
            let mut job: JobRecord = store.read(&store.job_file(job_id))?;
            if job.state.can_transition(JobState::Lost) {
                job.state = JobState::Lost;
                job.updated_at = Timestamp::now();
                store.write(&store.job_file(job_id), &job)?;
                let lost = JobLost { reason: "closed by kill without a completion receipt" };
                recovery::append_event(store, &job, EventKind::JobLost, &lost)?;
            }
            job.state
        }
    };
    Ok(Killed::Ended { state, stopped_owner })
}
