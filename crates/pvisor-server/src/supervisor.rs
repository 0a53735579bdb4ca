//! `pvisor sandbox-supervisor`, the process the daemon starts for each
//! generation of a sandbox: it submits the sandbox's vm Job (or resumes the
//! suspended one), writes the `{job, attempt}` binding the daemon waits for,
//! and then supervises the Attempt like any `pvisor run` would.
//!
//! The CLI parses the hidden subcommand into [`SupervisorOptions`], calls
//! [`Supervisor::prepare`], and drives [`Supervisor::start`]'s run with its
//! one run driver (signals become cancellations; the end is the exit code).

use std::path::PathBuf;
use std::sync::Arc;

use pvisor::runtime::job_service::views::{self, ViewError};
use pvisor::runtime::suspension::{self, SuspensionError};
use pvisor::{AdmissionError, JobService, ManagedJobRun, RunRequest};
use pvisor_core::ids::JobId;
use pvisor_core::records::JobRecord;
use pvisor_core::store::{Store, StoreError};
use pvisor_net::{Mode, PolicySpec, Scope, ScopedPolicy};
use pvisor_sandbox::vm::VmExecutor;
use pvisor_sandbox::SandboxError;

use crate::sandbox::{Binding, KEEPER};

/// What the daemon asks of one supervisor (its command line).
#[derive(Debug, Clone)]
pub struct SupervisorOptions {
    /// Where to write `{job, attempt}` once the Job is admitted.
    pub bind: PathBuf,
    /// The image rootfs (the Job's workspace), for a new sandbox.
    pub workspace: Option<PathBuf>,
    pub memory_mib: u64,
    pub cpus: u32,
    /// Resume this suspended Job instead.
    pub resume: Option<String>,
    /// The sandbox's egress policy (an ordered policy, JSON), for a new sandbox.
    pub network_policy: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error(transparent)]
    View(#[from] ViewError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Suspension(#[from] SuspensionError),
    #[error("Job {0} is not suspended; nothing to resume")]
    NotSuspended(JobId),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("--workspace or --resume is required")]
    NoWorkspace,
    #[error("--network-policy is not an ordered policy (JSON): {0}")]
    Policy(#[source] serde_json::Error),
    #[error("Cannot resume: {0}")]
    Resume(#[source] AdmissionError),
    #[error(transparent)]
    Admission(#[from] AdmissionError),
}

/// A supervisor ready to start its Attempt.
#[derive(Debug)]
pub struct Supervisor {
    service: JobService,
    bind: PathBuf,
    start: Start,
}

#[derive(Debug)]
enum Start {
    Resume(JobId),
    New(Box<RunRequest>),
}

impl Supervisor {
    /// Checks the options and sets up the vm executor (for a resume, the
    /// one the checkpoint was taken with).
    pub fn prepare(store: Store, options: SupervisorOptions) -> Result<Self, SupervisorError> {
        if let Some(job) = &options.resume {
            let job = views::resolve_job(&store, Some(job))?;
            let record: JobRecord = store.read(&store.job_file(&job))?;
            let (_, _, manifest) = suspension::resumable(&store, &record)?
                .ok_or_else(|| SupervisorError::NotSuspended(job.clone()))?;
            let executor = Arc::new(VmExecutor::for_checkpoint(store.root(), &manifest)?);
            let service = JobService::new(store, executor);
            return Ok(Self { service, bind: options.bind, start: Start::Resume(job) });
        }
        let workspace = options.workspace.ok_or(SupervisorError::NoWorkspace)?;
        let ordered: Option<pvisor_net::OrderedPolicy> = options
            .network_policy
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(SupervisorError::Policy)?;
        let executor = Arc::new(VmExecutor::prepare(store.root())?);
        let request = RunRequest {
            caches: Vec::new(),
            workspace,
            cwd: None,
            program: "/bin/sh".into(),
            args: vec!["-c".into(), KEEPER.into()],
            env: vec![("PATH".into(), "/bin:/sbin:/usr/bin:/usr/sbin".into())],
            kill_grace: std::time::Duration::from_secs(5),
            network: vec![ScopedPolicy {
                scope: Scope::CommandLine,
                source: "pvisor serve".into(),
                spec: PolicySpec {
                    mode: Some(if ordered.is_some() { Mode::Proxy } else { Mode::None }),
                    allow: Vec::new(),
                    deny: Vec::new(),
                    ordered,
                },
            }],
            fork: None,
            fork_execution: None,
            secrets: pvisor::admission::SecretPolicy::default(),
            seccomp: true,
            limits: pvisor_core::records::ResourceLimits {
                memory_bytes: Some(options.memory_mib << 20),
                pids: None,
                cpus: Some(f64::from(options.cpus)),
                ..Default::default()
            },
        };
        let service = JobService::new(store, executor);
        Ok(Self { service, bind: options.bind, start: Start::New(Box::new(request)) })
    }

    /// Submits (or resumes) the Job and writes the binding; the caller
    /// drives the returned run to its end. Runs inside the caller's runtime.
    pub fn start(self) -> Result<ManagedJobRun, SupervisorError> {
        let run = match self.start {
            Start::Resume(job) => self.service.resume(&job).map_err(SupervisorError::Resume)?,
            Start::New(request) => self.service.submit(*request)?,
        };
        let binding = Binding { job: run.job().clone(), attempt: run.attempt().number() };
        pvisor_core::store::write_atomic(&self.bind, &pvisor_core::store::to_json_bytes(&binding))?;
        tracing::info!(job = %binding.job, attempt = binding.attempt, "supervisor: the Job is admitted");
        Ok(run)
    }
}
