//! Actions on Jobs as a whole: start one, resume one, kill one, read them,
//! and collect garbage.

use std::sync::Arc;
use std::time::Duration;

use pvisor_core::event::Event;
use pvisor_core::ids::JobId;
use pvisor_core::records::JobRecord;
use pvisor_sandbox::Executor;

use super::{Action, Runtime, RuntimeError};
use crate::runtime::gc::{self, GcReport};
use crate::runtime::job_service::views::{self, JobListing, JobStatus};
use crate::runtime::kill::{self, Killed};
use crate::runtime::suspension;
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
        Ok(JobService::new(runtime.store.clone(), self.executor).submit(self.request)?)
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
        Ok(JobService::new(store.clone(), executor).resume(&job)?)
    }
}

/// Ends a Job: signals its live Attempt (SIGKILL after `grace`), or closes
/// a dead one honestly, and withdraws its continuation rights.
#[derive(Debug)]
pub struct Kill {
    pub job: JobId,
    pub grace: Duration,
}

impl Action for Kill {
    const NAME: &'static str = "kill";
    type Outcome = Killed;

    fn perform(self, runtime: &Runtime) -> Result<Killed, RuntimeError> {
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
        if let Some(templates) = kept.then(|| runtime.backends.templates("vm")).flatten() {
            report.freed.extend(templates.sweep(self.dry_run).into_iter().map(|s| gc::Freed {
                what: s.what,
                path: s.path,
                bytes: s.bytes,
            }));
        }
        Ok(report)
    }
}
