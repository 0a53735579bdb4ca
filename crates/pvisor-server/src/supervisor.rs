//! `pvisor sandbox-supervisor`, the process the daemon starts for each
//! generation of a sandbox: it submits the sandbox's vm Job (or resumes the
//! suspended one), writes the `{job, attempt}` binding the daemon waits for,
//! and then supervises the Attempt like any `pvisor run` would.
//!
//! The CLI parses the hidden subcommand into [`SupervisorOptions`], calls
//! [`Supervisor::prepare`], and drives [`Supervisor::start`]'s run with its
//! one run driver (signals become cancellations; the end is the exit code).

use std::path::PathBuf;

use pvisor::actions::{Hold, HoldGuest, Keeper, ResolveJob};
use pvisor::{ManagedJobRun, Runtime, RuntimeError};
use pvisor_core::ids::JobId;
use pvisor_core::store::{Store, StoreError};
use pvisor_net::{Mode, PolicySpec, Scope, ScopedPolicy};

use crate::sandbox::Binding;

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
    /// Host directories shared with the VM (a JSON list), for a new sandbox.
    pub volumes: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("--workspace or --resume is required")]
    NoWorkspace,
    #[error("--network-policy is not an ordered policy (JSON): {0}")]
    Policy(#[source] serde_json::Error),
    #[error("--volumes is not a list of shared directories (JSON): {0}")]
    Volumes(#[source] serde_json::Error),
    #[error("Cannot resume: {0}")]
    Resume(#[source] RuntimeError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// A supervisor ready to start its Attempt.
#[derive(Debug)]
pub struct Supervisor {
    runtime: Runtime,
    bind: PathBuf,
    start: Start,
}

#[derive(Debug)]
enum Start {
    Resume(JobId),
    New(Box<Keeper>),
}

impl Supervisor {
    /// Checks the options and sets up the vm executor (a resume restores
    /// with the one its checkpoint was taken with; see [`Resume`]).
    pub fn prepare(store: Store, options: SupervisorOptions) -> Result<Self, SupervisorError> {
        Self::prepare_with(Runtime::on_host(store), options)
    }

    /// [`Self::prepare`] over `runtime`, built once by the caller.
    pub fn prepare_with(runtime: Runtime, options: SupervisorOptions) -> Result<Self, SupervisorError> {
        if let Some(job) = &options.resume {
            let job =
                runtime.execute(ResolveJob { query: Some(job.clone()) }).map_err(SupervisorError::Runtime)?;
            return Ok(Self { runtime, bind: options.bind, start: Start::Resume(job) });
        }
        let workspace = options.workspace.ok_or(SupervisorError::NoWorkspace)?;
        let ordered: Option<pvisor_net::OrderedPolicy> = options
            .network_policy
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(SupervisorError::Policy)?;
        let shared_directories: Vec<pvisor_core::records::SharedDirectory> = options
            .volumes
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(SupervisorError::Volumes)?
            .unwrap_or_default();
        // The vm backend is checked before anything is started.
        runtime.executor("vm")?;
        // The Job names its sandbox, so a daemon that lost the record (deleted
        // or damaged) still finds the VM and stops it (`Daemon::recover`).
        let mut labels = pvisor_core::labels::Labels::new();
        if let Some(id) = options.bind.file_stem().and_then(|s| s.to_str()) {
            labels.insert(crate::sandbox::SANDBOX_LABEL.to_owned(), id.to_owned());
        }
        let keeper = Keeper {
            labels,
            network_namespace: None,
            shared_directories,
            workspace,
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
            limits: pvisor_core::records::ResourceLimits {
                memory_bytes: Some(options.memory_mib << 20),
                pids: None,
                cpus: Some(f64::from(options.cpus)),
                ..Default::default()
            },
        };
        Ok(Self { runtime, bind: options.bind, start: Start::New(Box::new(keeper)) })
    }

    /// Submits (or resumes) the Job and writes the binding; the caller
    /// drives the returned run to its end. Runs inside the caller's runtime.
    /// The daemon, not this process, waits for the guest to answer
    /// ([`pvisor::actions::AwaitGuest`]): the Session runs on the caller's
    /// thread, which must not block.
    pub fn start(self) -> Result<ManagedJobRun, SupervisorError> {
        let run = match self.start {
            Start::Resume(job) => {
                let hold = HoldGuest { hold: Hold::Resume(job), ready: None };
                self.runtime.execute(hold).map_err(SupervisorError::Resume)?.run
            }
            Start::New(keeper) => {
                let hold = HoldGuest { hold: Hold::New { keeper, backend: "vm".into() }, ready: None };
                self.runtime.execute(hold)?.run
            }
        };
        let binding = Binding { job: run.job().clone(), attempt: run.attempt().number() };
        pvisor_core::store::write_atomic(&self.bind, &pvisor_core::store::to_json_bytes(&binding))?;
        tracing::info!(job = %binding.job, attempt = binding.attempt, "supervisor: the Job is admitted");
        Ok(run)
    }
}
