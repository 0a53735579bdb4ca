//! Actions on Jobs as a whole: start one, resume one, kill one, read them,
//! and collect garbage.

use std::sync::Arc;
use std::time::Duration;

use pvisor_core::event::Event;
use pvisor_core::ids::JobId;
use pvisor_core::records::JobRecord;
use pvisor_core::store::OwnerLock;
use pvisor_sandbox::Executor;

use super::{Action, Runtime, RuntimeError};
use crate::records::suspension;
use crate::records::views::{self, JobListing, JobStatus};
use crate::runtime::gc::{self, GcReport};
use crate::runtime::kill::{self, Killed};
use crate::{JobService, ManagedJobRun, RunRequest};

/// Admits `request` and starts it on `executor` (from [`Runtime::executor`],
/// or the restorer of an execution fork). Needs a Tokio runtime: the
/// Session runs as a task on it, and the outcome is awaited on the handle.
#[derive(Debug)]
pub struct Run {
    pub request: RunRequest,
    pub executor: Arc<dyn Executor>,
}

impl Action for Run {
    const NAME: &'static str = "run";
    type Outcome = ManagedJobRun;

    fn perform(self, runtime: &Runtime) -> Result<ManagedJobRun, RuntimeError> {
        let traits = runtime.backends.traits(self.executor.name());
        let run =
            JobService::new(runtime.store.clone(), self.executor).with_traits(traits).submit(self.request)?;
        runtime.own(&run);
        Ok(run)
    }
}

/// Resumes a suspended vm Job from its suspension checkpoint, in a new
/// Attempt of the same Job. Needs a Tokio runtime, as [`Run`] does.
#[derive(Debug)]
pub struct Resume {
    pub job: JobId,
}

impl Action for Resume {
    const NAME: &'static str = "resume";
    type Outcome = ManagedJobRun;

    fn perform(self, runtime: &Runtime) -> Result<ManagedJobRun, RuntimeError> {
        let store = &runtime.store;
        let job = self.job;
        let found = runtime.job(&job)?;
        let restorer =
            runtime.backends.checkpointable(found.executor()).ok_or_else(|| RuntimeError::Unsupported {
                job: job.clone(),
                executor: found.executor().to_owned(),
                what: "restore an execution checkpoint",
                hint: "only a vm Job is suspended and resumed (pvisor suspend, then pvisor resume)",
            })?;
        if !found.record.continuation {
            return Err(RuntimeError::ContinuationWithdrawn {
                job,
                why: "was killed; its continuation rights are withdrawn and it cannot be resumed",
            });
        }
        let Some((_, _, manifest)) = suspension::resumable(store, &found.record)? else {
            let state = views::status(store, &job)?.state;
            return Err(RuntimeError::NotSuspended { job, state });
        };
        let executor = restorer.restorer(store.root(), &manifest)?;
        let run = JobService::new(store.clone(), executor).resume(&job)?;
        runtime.own(&run);
        Ok(run)
    }
}

/// Ends a Job: signals its live Attempt (SIGKILL after `grace`), or closes
/// a dead one honestly, and withdraws its continuation rights. A Job this
/// process supervises (its run was started through this runtime) is
/// cancelled here: its lock holder is this very process, which a signal
/// would end.
#[derive(Debug)]
pub struct Kill {
    pub job: JobId,
    pub grace: Duration,
}

impl Action for Kill {
    const NAME: &'static str = "kill";
    type Outcome = Killed;

    fn perform(self, runtime: &Runtime) -> Result<Killed, RuntimeError> {
        if let Some(cancel) = runtime.owned(&self.job) {
            let live = runtime.job(&self.job)?;
            let lock = runtime.store.lock_file(&live.attempt);
            let released = |within: Duration| -> Result<bool, RuntimeError> {
                let deadline = std::time::Instant::now() + within;
                while OwnerLock::is_held(&lock)? {
                    if std::time::Instant::now() > deadline {
                        return Ok(false);
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(true)
            };
            if OwnerLock::is_held(&lock)? {
                cancel.cancel(libc::SIGTERM);
                if !released(self.grace)? {
                    // A second request kills it.
                    cancel.cancel(libc::SIGKILL);
                    released(Duration::from_secs(10))?;
                }
            }
            runtime.disown(&self.job);
        }
        Ok(kill::kill(&runtime.store, &self.job, self.grace)?)
    }
}

/// A Job's status, trusting only a valid receipt.
#[derive(Debug)]
pub struct Status {
    pub job: JobId,
}

impl Action for Status {
    const NAME: &'static str = "status";
    type Outcome = JobStatus;

    fn perform(self, runtime: &Runtime) -> Result<JobStatus, RuntimeError> {
        Ok(views::status(&runtime.store, &self.job)?)
    }
}

/// A Job's Trace, with the lines that could not be read.
#[derive(Debug)]
pub struct Events {
    pub job: JobId,
}

/// What [`Events`] read.
#[derive(Debug)]
pub struct Trace {
    pub events: Vec<Event>,
    /// Lines of the Trace that are damaged, each saying where and how.
    pub warnings: Vec<String>,
}

impl Action for Events {
    const NAME: &'static str = "events";
    type Outcome = Trace;

    fn perform(self, runtime: &Runtime) -> Result<Trace, RuntimeError> {
        let store = &runtime.store;
        let record: JobRecord = store.read(&store.job_file(&self.job))?;
        let (events, warnings) = views::events(store, &record.run)?;
        Ok(Trace { events, warnings })
    }
}

/// Every Job's status, oldest first; a broken one is listed with its error.
#[derive(Debug)]
pub struct ListJobs;

impl Action for ListJobs {
    const NAME: &'static str = "list-jobs";
    type Outcome = Vec<JobListing>;

    fn perform(self, runtime: &Runtime) -> Result<Vec<JobListing>, RuntimeError> {
        Ok(views::list(&runtime.store)?)
    }
}

/// Removes what ended Jobs left behind, older than `age`.
#[derive(Debug)]
pub struct Gc {
    pub age: Duration,
    pub dry_run: bool,
    pub force: bool,
}

impl Action for Gc {
    const NAME: &'static str = "gc";
    type Outcome = GcReport;

    fn perform(self, runtime: &Runtime) -> Result<GcReport, RuntimeError> {
        let mut report = gc::gc(&runtime.store, self.age, self.dry_run, self.force)?;
        // Templates nothing can restore any more: stale, corrupt, half-built.
        let kept = runtime.store.root().join(pvisor_vm::template::DIR).is_dir();
        if let Some(templates) = kept.then(|| super::templates::kept(runtime)).flatten() {
            report.freed.extend(templates.sweep(self.dry_run).into_iter().map(|s| gc::Freed {
                what: s.what,
                path: s.path,
                bytes: s.bytes,
            }));
        }
        Ok(report)
    }
}
