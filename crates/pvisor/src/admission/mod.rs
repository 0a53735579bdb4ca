//! Admission: the one place a request becomes a Job.
//!
//! Admission validates the request, resolves the effective policy exactly
//! once, applies pvisor's rewrites (hiding the state directory, marking the
//! environment), decides the Placement, and durably creates the Run, Job and
//! Attempt records, in that order, so a Job file never points at a missing Run.
//! Every later component consumes the recorded decision and never re-reads
//! the request.
//!
//! [`admit`] runs its steps in a fixed order, each in its own module:
//! [`fork`] (verify a checkpoint to start from), [`workspace`] (the
//! canonical workspace and cwd), [`secrets`] (scrubbed variables, hidden
//! secret stores), [`brokered`] (the `--secret` values the proxy puts
//! into requests, read here and never recorded), [`policy`] (sockets, caches, the effective policy and
//! its rewrites), [`placement`] (the Placement and the SandboxSpec) and
//! [`records`] (the Run, Attempt and Job files). Every refusal comes before
//! the first record; the order of the records and of the Trace events after
//! them is part of the crash-safety design. [`resume`] admits a new Attempt
//! of a suspended Job.

use std::path::PathBuf;
use std::time::Duration;

use pvisor_core::event::EventKind;
use pvisor_core::ids::{AttemptId, JobId, RunId};
use pvisor_core::records::{AttemptRecord, EffectivePolicy, JobRecord, Placement, RunRecord};
use pvisor_core::store::{OwnerLock, Store, StoreError};
use pvisor_core::time::Timestamp;
use pvisor_sandbox::{NetworkAttachment, SandboxSpec};

use crate::trace::{data, Trace};

mod brokered;
mod fork;
mod placement;
mod policy;
mod records;
mod resume;
mod secrets;
mod workspace;

pub use brokered::{Brokered, CA_VARIABLES};
pub use fork::ExecutionFork;
pub use policy::{proxy_env, PROXY_PORT};
pub use resume::admit_resume;
pub use secrets::{DEFAULT_HIDDEN, HIDDEN_NAME_PREFIXES};

/// What a frontend asks pvisor to run.
#[derive(Clone, Debug)]
pub struct RunRequest {
    /// The workspace directory; the sandbox sees it at its canonical path.
    pub workspace: PathBuf,
    /// The working directory, absolute or relative to the workspace. Defaults to it.
    pub cwd: Option<PathBuf>,
    pub program: String,
    pub args: Vec<String>,
    /// The environment to pass to the command (frontends usually pass their own).
    pub env: Vec<(String, String)>,
    /// How long a cancelled command gets to exit after the forwarded signal.
    pub kill_grace: Duration,
    /// The network policies in scope (command line, workspace file, user
    /// config); admission merges them once.
    pub network: Vec<pvisor_net::ScopedPolicy>,
    /// Start from a workspace checkpoint (a fork) instead of an empty stage.
    pub fork: Option<pvisor_core::ids::CheckpointId>,
    /// An execution fork (vm): the parent Job and its verified checkpoint.
    pub fork_execution: Option<ExecutionFork>,
    /// Secrets: the user's home (for the default secret stores), extra paths
    /// to hide, paths to expose anyway, and variables to pass despite their names.
    pub secrets: SecretPolicy,
    /// Install the seccomp deny-list (on unless the user turns it off).
    pub seccomp: bool,
    /// `--memory`, `--pids`, `--cpus`.
    pub limits: pvisor_core::records::ResourceLimits,
    /// `--cache PATH`: host directories the command may write, persistently
    /// and unstaged, through pvisor's cache store.
    pub caches: Vec<PathBuf>,
    /// `--state PATH` (and an agent preset's state paths): agent state the
    /// command may write through the Job's own layer, never the host's.
    pub state: Vec<crate::agent_state::StatePath>,
    /// The session run whose agent state this run carries forward (`None`:
    /// the promoted copy, else the host's).
    pub state_from: Option<JobId>,
    /// `key=value` labels recorded on the Job (`--label`; the containerd
    /// shim's container id). Checked at admission.
    pub labels: pvisor_core::labels::Labels,
    /// A network namespace the VM's NIC joins (a pod's, from the containerd
    /// shim), in place of pvisor's network policy: vm Jobs only, and the
    /// `network` policies must leave the mode unset or `none`.
    pub network_namespace: Option<PathBuf>,
    /// Host directories the VM mounts live, unstaged (a containerd pod's
    /// read-write volumes): vm Jobs only, as root (virtiofsd).
    pub shared_directories: Vec<pvisor_core::records::SharedDirectory>,
    /// The imported root filesystem a vm Job's command runs in (`--image`),
    /// resolved by the frontend; vm Jobs only.
    pub image: Option<pvisor_core::records::UserlandImage>,
    /// Capture the command's stdout and stderr into these pipes instead of
    /// handing it the frontend's descriptors 0–2 (stdin is then `/dev/null`).
    pub output: Option<pvisor_sandbox::CapturedOutput>,
}

/// What the sandbox must not see of the user's secrets, and the host paths
/// the user shows it anyway (`--expose`, `--expose-socket`, `--ro`).
#[derive(Clone, Debug, Default)]
pub struct SecretPolicy {
    pub home: Option<PathBuf>,
    pub hide: Vec<PathBuf>,
    pub expose: Vec<PathBuf>,
    pub pass_env: Vec<String>,
    /// Other pvisor state directories (their stages, records and VM
    /// control sockets): hidden like this run's own, and never exposable.
    pub other_state_dirs: Vec<PathBuf>,
    /// Host Unix sockets the command may connect to (`--expose-socket`);
    /// every other one is unreachable.
    pub expose_sockets: Vec<PathBuf>,
    /// Host files and directories to show read-only at their own path
    /// (`--ro`), where the sandbox would not see them otherwise (`/tmp`).
    pub read_only: Vec<PathBuf>,
    /// Variables the command may use but never hold (`--secret
    /// VAR@HOST`): their values are read from `env` and only the proxy
    /// sends them, to that host.
    pub brokered: Vec<pvisor_net::broker::BindingSpec>,
}

/// Why a request was not admitted. Nothing was recorded.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    #[error("Workspace {} does not exist; pass an existing directory with -w", path.display())]
    WorkspaceMissing { path: PathBuf },
    #[error("Workspace {} is not a directory", path.display())]
    WorkspaceNotDirectory { path: PathBuf },
    #[error("Cannot resolve workspace {}", path.display())]
    WorkspaceUnreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("The workspace cannot be / : pvisor stages a directory tree, pick a project directory")]
    WorkspaceIsRoot,
    #[error(
        "Workspace {} contains pvisor's state directory {}; overlayfs cannot stage a tree that holds its own stage. \
         Run on a subdirectory, or set PVISOR_HOME to a directory outside the workspace",
        workspace.display(), state.display()
    )]
    WorkspaceContainsState { workspace: PathBuf, state: PathBuf },
    #[error("Workspace {} is inside pvisor's state directory {}; choose a directory outside it", workspace.display(), state.display())]
    WorkspaceInsideState { workspace: PathBuf, state: PathBuf },
    #[error("Working directory {} is outside the workspace {}", cwd.display(), workspace.display())]
    CwdOutsideWorkspace { cwd: PathBuf, workspace: PathBuf },
    #[error("Path {} is not valid UTF-8; pvisor records paths as text", path.display())]
    NonUtf8Path { path: PathBuf },
    #[error("--expose-socket {}: {problem}", path.display())]
    ExposeSocket { path: PathBuf, problem: &'static str },
    #[error("--cache {}: {problem}", path.display())]
    Cache { path: PathBuf, problem: &'static str },
    #[error(transparent)]
    State(#[from] crate::agent_state::StateError),
    #[error(
        "Agent state (--state, --agent) applies to the ns executor (this Job's executor is {executor}); run with --executor ns"
    )]
    StateOnGuest { executor: String },
    #[error("--ro {}: {problem}", path.display())]
    ReadOnly { path: PathBuf, problem: &'static str },
    #[error("--secret {spec}: {problem}")]
    Secret { spec: String, problem: String },
    #[error("Cannot set up the credential broker")]
    Broker(#[from] pvisor_net::broker::BrokerError),
    #[error("Cannot write the run's CA bundle")]
    CaBundle {
        #[source]
        source: std::io::Error,
    },
    #[error("No program given: pvisor run [-w DIR] -- PROGRAM [ARGS...]")]
    EmptyProgram,
    #[error(transparent)]
    Label(#[from] pvisor_core::labels::LabelError),
    #[error("Network namespace {}: {problem}", path.display())]
    NetworkNamespace { path: PathBuf, problem: String },
    #[error("Shared directory {}: {problem}", path.display())]
    SharedDirectory { path: PathBuf, problem: String },
    #[error("Image {name}: {problem}")]
    Image { name: String, problem: String },
    #[error("Invalid network policy in {0}")]
    Network(#[from] pvisor_net::policy::PolicyError),
    #[error("Cannot fork from checkpoint {checkpoint}")]
    Checkpoint {
        checkpoint: pvisor_core::ids::CheckpointId,
        #[source]
        source: pvisor_stage::StageError,
    },
    #[error("Cannot record the new Job")]
    Store(#[from] StoreError),
    #[error("Job {job} cannot be resumed: {reason}")]
    NotResumable { job: JobId, reason: String },
    #[error("Cannot resume job {job}")]
    Suspension {
        job: JobId,
        #[source]
        source: crate::records::suspension::SuspensionError,
    },
}

/// A request that passed admission: its records exist and its owner lock is held.
#[derive(Debug)]
pub struct Admitted {
    pub(crate) job: JobRecord,
    pub(crate) run: RunRecord,
    pub(crate) attempt: AttemptRecord,
    pub(crate) trace: Trace,
    pub(crate) spec: SandboxSpec,
    pub(crate) lock: OwnerLock,
    /// The seq of `attempt.created`, the cause of everything the Session records.
    pub(crate) attempt_event: u64,
    /// The checkpoint directory a fork's stage is restored from.
    pub(crate) restore_from: Option<std::path::PathBuf>,
    /// The conflict baseline (ns since the epoch) when the workspace was
    /// captured by an earlier Attempt: a resumed or execution-forked VM still
    /// sees the workspace image of the original start.
    pub(crate) baseline: Option<i128>,
    /// For a resume: the suspended Attempt it continues.
    pub(crate) resumed_from: Option<u32>,
    /// The `--secret` broker the run's proxy uses, with the CA bundle file.
    pub(crate) brokered: Option<Brokered>,
    /// The agent state the Session makes before the sandbox starts.
    pub(crate) state: crate::agent_state::Plan,
}

impl Admitted {
    pub fn job_id(&self) -> &JobId {
        &self.job.id
    }
    pub fn attempt_id(&self) -> &AttemptId {
        &self.attempt.id
    }
}

/// The backend a Job is admitted to: its name (for records and messages)
/// and what its sandboxes are like (for every decision).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Backend<'a> {
    pub name: &'a str,
    pub traits: crate::backends::BackendTraits,
}

impl std::fmt::Display for Backend<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// Admits `request`: validates it, fixes the policy and Placement, and records
/// the Run, Job and Attempt. `traits` are the traits of `executor_impl`'s
/// backend.
/// Checks host directories that join a running keeper Job's guest through
/// a share it already has (a pod's later container's volumes, mounted
/// beneath the pod's directory), as admission checks a Job's own shares:
/// canonicalized, no kernel filesystem, no overlap with `workspace` (the
/// Job's) or a path hidden from a Job of `secrets`.
pub fn check_joining_shares(
    store: &Store,
    workspace: &std::path::Path,
    secrets: &SecretPolicy,
    shares: &[pvisor_core::records::SharedDirectory],
) -> Result<Vec<pvisor_core::records::SharedDirectory>, AdmissionError> {
    let (_, resolved) = secrets::resolve(Vec::new(), secrets, workspace)?;
    let executor = Backend { name: "vm", traits: crate::backends::host_traits("vm") };
    policy::shared_directories(
        shares,
        executor,
        workspace,
        &policy::hidden_now(store.root(), &resolved.hidden),
    )
}

pub fn admit(
    store: &Store,
    executor_impl: &dyn pvisor_sandbox::Executor,
    traits: crate::backends::BackendTraits,
    request: RunRequest,
) -> Result<Admitted, AdmissionError> {
    let executor = Backend { name: executor_impl.name(), traits };
    if request.program.is_empty() {
        return Err(AdmissionError::EmptyProgram);
    }
    pvisor_core::labels::check_all(&request.labels)?;
    let fork = fork::verify(store, request.fork.as_ref())?;
    let requested_workspace = fork::workspace(&fork, request.fork_execution.as_ref(), &request.workspace);
    let (workspace, state) = workspace::resolve(store, executor, &requested_workspace)?;
    let cwd = workspace::cwd(&workspace, request.cwd.as_deref())?;
    // Brokered secrets: read before the scrub below removes them by name.
    let bindings = brokered::bind(&request.secrets.brokered, &request.env, executor)?;
    let host_env = request.env.clone();
    // Secrets: scrub variables by name, hide secret stores; recorded by name only.
    let (env, mut secrets) = secrets::resolve(request.env.clone(), &request.secrets, &workspace)?;
    let host_paths =
        policy::host_paths(&request.secrets, &request.caches, &state, &workspace, &secrets.hidden)?;
    let agent_state = agent_state_plan(&request, executor, &workspace, &state, &secrets)?;
    // A secret store that is itself state shows the Job's copy, which
    // never starts from the host's.
    secrets.hidden.retain(|(path, _)| !agent_state.paths.iter().any(|s| s.secret_on_host && s.path == *path));

    let now = Timestamp::now();
    let job_id = JobId::generate();
    let run_id = RunId::generate();
    let attempt_id = AttemptId::new(run_id.clone(), 1);
    if let Some(path) = &request.network_namespace {
        policy::check_namespace(path, executor)?;
    }
    let shared_directories = policy::shared_directories(
        &request.shared_directories,
        executor,
        &workspace,
        &policy::hidden_now(&state, &secrets.hidden),
    )?;
    let image = match &request.fork_execution {
        // The forked guest runs on in the userland its checkpoint holds.
        Some(fork) => fork.manifest.userland.clone(),
        None => policy::image(request.image.as_ref(), executor)?,
    };
    let requested = policy::Requested {
        shared_directories,
        image,
        network: &request.network,
        namespace: request.network_namespace.as_deref(),
        kill_grace: request.kill_grace,
        seccomp: request.seccomp,
        limits: &request.limits,
    };
    let (policy, attachment) = policy::effective(requested, &state, &secrets, &host_paths)?;
    brokered::check_allowed(&bindings, &policy.network)?;
    let brokered = brokered::start(bindings, &host_env)?;
    drop(host_env);
    let placement = placement::decide(
        executor_impl,
        &request.limits,
        request.fork_execution.is_some(),
        policy.image.as_ref(),
    );
    let env_rewrites = policy::env_rewrites(&job_id, &policy.network);
    let env = policy::rewrite_env(env, &env_rewrites);
    let (env, copies) = match &brokered {
        Some(b) => brokered::rewrite_env(env, b),
        None => (env, Vec::new()),
    };
    let operation = records::operation(
        &request.program,
        &request.args,
        cwd.clone(),
        &env,
        policy.clone(),
        placement.clone(),
    );

    let new = records::NewJob {
        now,
        workspace: workspace.clone(),
        operation,
        lineage: fork::lineage(&fork, request.fork_execution.as_ref()),
        executor: executor.name.to_owned(),
        labels: request.labels,
    };
    let records::Created { job, run, attempt, lock } =
        records::create(store, &job_id, &run_id, &attempt_id, new)?;

    let mut trace = Trace::open(store, &run_id);
    let decided = Decided {
        job: &job,
        program: &request.program,
        args: &request.args,
        policy: &policy,
        placement: &placement,
        attachment,
    };
    let rewrites = policy::Rewrites {
        state: &state,
        secrets: &secrets,
        paths: &host_paths,
        agent_state: &agent_state,
        env_rewrites: &env_rewrites,
        brokered: brokered.as_ref(),
        copies: &copies,
    };
    let attempt_event = record_admission(&mut trace, executor_impl, decided, rewrites, &attempt_id)?;

    let caches = placement::cache_mounts(store, &host_paths.caches, &store.stage_dir(&run_id))?;
    let ids = placement::Ids { job: &job_id, run: &run_id, attempt: &attempt_id };
    let command = placement::Command {
        workspace,
        cwd,
        program: request.program,
        args: request.args,
        env,
        seccomp: request.seccomp,
        limits: request.limits,
        output: request.output,
    };
    let mut spec =
        placement::spec(store, executor, ids, command, &policy, caches, request.fork_execution.as_ref());
    // The CA bundle (public certificates) is shown read-only at its own
    // path, which the CA variables name, and over the system's bundles.
    spec.read_only.extend(brokered.as_ref().map(|b| b.bundle.clone()));
    spec.ca_bundle = brokered.as_ref().map(|b| b.bundle.clone());
    spec.state = crate::agent_state::mounts(store, &run_id, &agent_state);
    let restore_from = fork.map(|(dir, _)| dir);
    let baseline = request.fork_execution.as_ref().and_then(|f| fork::checkpoint_baseline(&f.manifest));
    Ok(Admitted {
        job,
        run,
        attempt,
        trace,
        spec,
        lock,
        attempt_event,
        restore_from,
        baseline,
        resumed_from: None,
        brokered,
        state: agent_state,
    })
}

/// Checks the request's agent state paths (ns only: a vm guest sees no
/// host directory) and plans them.
fn agent_state_plan(
    request: &RunRequest,
    executor: Backend<'_>,
    workspace: &std::path::Path,
    state_dir: &std::path::Path,
    secrets: &secrets::Secrets,
) -> Result<crate::agent_state::Plan, AdmissionError> {
    if request.state.is_empty() {
        return Ok(crate::agent_state::Plan::default());
    }
    if !executor.traits.shares_host_kernel {
        return Err(AdmissionError::StateOnGuest { executor: executor.name.to_owned() });
    }
    let (others, stores): (Vec<_>, Vec<_>) =
        secrets.hidden.iter().partition(|(_, reason)| *reason == secrets::OTHER_STATE_DIR);
    let state_dirs: Vec<PathBuf> =
        std::iter::once(state_dir.to_owned()).chain(others.into_iter().map(|(p, _)| p.clone())).collect();
    let secret_stores: Vec<PathBuf> = stores.into_iter().map(|(p, _)| p.clone()).collect();
    let hidden = crate::agent_state::Hidden { state_dirs: &state_dirs, secret_stores: &secret_stores };
    let paths =
        crate::agent_state::check(&request.state, request.secrets.home.as_deref(), workspace, hidden)?;
    Ok(crate::agent_state::Plan { paths, from: request.state_from.clone() })
}

/// The recorded decisions [`record_admission`] publishes.
struct Decided<'a> {
    job: &'a JobRecord,
    program: &'a str,
    args: &'a [String],
    policy: &'a EffectivePolicy,
    placement: &'a Placement,
    attachment: NetworkAttachment,
}

/// Publishes admission in the Trace, once the records exist: `job.created`,
/// the policy and its rewrites, the fork's lineage, `placement.decided`, and
/// `attempt.created` (whose seq, returned, causes everything the Session
/// records).
fn record_admission(
    trace: &mut Trace,
    executor: &dyn pvisor_sandbox::Executor,
    decided: Decided<'_>,
    rewrites: policy::Rewrites<'_>,
    attempt_id: &AttemptId,
) -> Result<u64, StoreError> {
    let Decided { job, program, args, policy, placement, attachment } = decided;
    let created = trace.emit(
        EventKind::JobCreated,
        None,
        None,
        &data::JobCreated { job: &job.id, workspace: &job.workspace, program, args, labels: &job.labels },
        false,
    )?;
    let policy_event = policy::record(trace, created, policy, executor, attachment, rewrites)?;
    if let Some(lineage) = &job.lineage {
        trace.emit(EventKind::ForkLineage, None, Some(created), lineage, false)?;
    }
    let placed = trace.emit(EventKind::PlacementDecided, None, Some(policy_event), placement, false)?;
    trace.emit(
        EventKind::AttemptCreated,
        Some(1),
        Some(placed),
        &data::AttemptCreated { attempt: attempt_id, executor: executor.name(), restore: None },
        false,
    )
}
