//! Admission: the one place a request becomes a Job.
//!
//! Admission validates the request, resolves the effective policy exactly
//! once, applies pvisor's rewrites (hiding the state directory, marking the
//! environment), decides the Placement, and durably creates the Run, Job and
//! Attempt records, in that order, so a Job file never points at a missing Run.
//! Every later component consumes the recorded decision and never re-reads
//! the request.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use pvisor_core::ids::{AttemptId, JobId, RunId};
use pvisor_core::records::{
    AttemptRecord, EffectivePolicy, JobRecord, NetworkMode, Operation, Placement, RunRecord, FORMAT,
};
use pvisor_core::state::{AttemptState, JobState};
use pvisor_core::store::{self, OwnerLock, Store, StoreError};
use pvisor_core::time::Timestamp;
use pvisor_sandbox::{NetworkAttachment, SandboxSpec};

use crate::trace::Trace;

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
}

/// What the sandbox must not see of the user's secrets.
/// Where an execution fork starts: a running VM's saved state.
#[derive(Clone, Debug)]
pub struct ExecutionFork {
    pub parent: JobId,
    pub dir: PathBuf,
    pub manifest: pvisor_sandbox::vm::ExecCheckpoint,
}

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
}

/// Resolves and checks each `--cache` path: an existing host directory that
/// is not the workspace (nor holds or sits in it), not hidden, and not under
/// `/tmp` or `/run` (the sandbox has its own).
fn cache_paths(
    requested: &[PathBuf],
    workspace: &Path,
    hidden: &[PathBuf],
) -> Result<Vec<PathBuf>, AdmissionError> {
    let mut out = Vec::new();
    for path in requested {
        let problem = |problem| AdmissionError::Cache { path: path.clone(), problem };
        let real = std::fs::canonicalize(path)
            .map_err(|_| problem("no such directory; create it first (mkdir -p)"))?;
        if !real.is_dir() {
            return Err(problem("is not a directory"));
        }
        if real.starts_with(workspace) || workspace.starts_with(&real) {
            return Err(problem(
                "overlaps the workspace; a cache is never the workspace, whose changes are staged",
            ));
        }
        if hidden.iter().any(|h| real.starts_with(h) || h.starts_with(&real)) {
            return Err(problem("overlaps a hidden path (a secret store or a pvisor state directory)"));
        }
        if ["/tmp", "/run", "/proc", "/dev", "/sys"].iter().any(|p| real.starts_with(p))
            || real == Path::new("/")
        {
            return Err(problem(
                "is in a part of the tree the sandbox gets fresh (/tmp, /run, /dev, /proc, /sys)",
            ));
        }
        if real.to_str().is_none() {
            return Err(AdmissionError::NonUtf8Path { path: real });
        }
        if !out.contains(&real) {
            out.push(real);
        }
    }
    Ok(out)
}

/// Resolves and checks each `--expose-socket` path: it must be a host Unix
/// socket, and never one of pvisor's own (a state directory's control sockets).
fn exposable_sockets(
    secrets: &SecretPolicy,
    state: &Path,
    workspace: &Path,
) -> Result<Vec<PathBuf>, AdmissionError> {
    use std::os::unix::fs::FileTypeExt;
    let mut sockets = Vec::new();
    for path in &secrets.expose_sockets {
        let problem = |problem| AdmissionError::ExposeSocket { path: path.clone(), problem };
        let real = std::fs::canonicalize(path)
            .map_err(|_| problem("no such socket; give the path of a listening Unix socket"))?;
        let meta = std::fs::metadata(&real).map_err(|_| problem("cannot be inspected"))?;
        if !meta.file_type().is_socket() {
            return Err(problem("is not a Unix socket"));
        }
        if real.starts_with(state) || secrets.other_state_dirs.iter().any(|d| real.starts_with(d)) {
            return Err(problem(
                "is inside a pvisor state directory; pvisor's own sockets are never exposed",
            ));
        }
        if real.starts_with(workspace) {
            return Err(problem("is inside the workspace, which the sandbox sees through its overlay; give a socket outside it"));
        }
        if real.to_str().is_none() {
            return Err(AdmissionError::NonUtf8Path { path: real });
        }
        if !sockets.contains(&real) {
            sockets.push(real);
        }
    }
    Ok(sockets)
}

/// Secret stores hidden by default, relative to the home directory: cloud,
/// package-registry and database credentials, the credentials of the AI
/// agents people run under pvisor, and shell histories (they hold pasted
/// tokens). `--expose PATH` shows one (or everything beneath PATH) anyway.
pub const DEFAULT_HIDDEN: [&str; 47] = [
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".config/gh",
    ".config/hub",
    ".netrc",
    ".git-credentials",
    ".docker",
    ".kube",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".password-store",
    ".local/share/keyrings",
    ".vault-token",
    ".terraform.d/credentials.tfrc.json",
    ".config/git/credentials",
    ".pgpass",
    ".my.cnf",
    ".m2/settings.xml",
    ".yarnrc.yml",
    ".gem/credentials",
    ".cache/huggingface/token",
    ".huggingface/token",
    ".config/rclone",
    ".config/op",
    ".env",
    // AI agents: Claude Code, Codex, Gemini CLI, Copilot, Cursor, Aider, goose.
    ".claude/.credentials.json",
    ".claude.json",
    ".codex/auth.json",
    ".gemini/oauth_creds.json",
    ".gemini/.env",
    ".config/github-copilot",
    ".cursor/mcp.json",
    ".config/Cursor/User/globalStorage",
    ".aider.conf.yml",
    ".config/goose",
    // Shell and REPL histories.
    ".bash_history",
    ".zsh_history",
    ".python_history",
    ".psql_history",
    ".mysql_history",
    ".node_repl_history",
    ".local/share/fish/fish_history",
];

/// Whether a variable's name marks it as a secret (scrubbed unless passed).
/// Settings that only look like secrets (`AWS_REGION`, `*_CA_BUNDLE`,
/// `*_CERT_FILE`) pass: scrubbing them breaks tools and protects nothing.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    let harmless = ["AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_CONFIG_FILE"]
        .contains(&upper.as_str())
        || ["_CA_BUNDLE", "_CERT_FILE", "_CERT_DIR"].iter().any(|s| upper.ends_with(s));
    if harmless {
        return false;
    }
    ["SSH_AUTH_SOCK", "PGPASSWORD", "MYSQL_PWD", "DATABASE_URL", "API_KEY"].contains(&upper.as_str())
        || upper.starts_with("AWS_")
        || upper.starts_with("OP_SESSION_")
        || upper.contains("_AUTHTOKEN")
        || ["_TOKEN", "_SECRET", "_PASSWORD", "_PASSWD", "_KEY", "_DATABASE_URL"]
            .iter()
            .any(|s| upper.ends_with(s))
}

/// The loopback port the proxy listens on inside the sandbox.
pub const PROXY_PORT: u16 = 3128;

/// The variables that point a sandbox's programs at the proxy listener
/// (ordinary tools — curl, pip, npm, cargo, git — honour them).
pub fn proxy_env() -> Vec<(&'static str, String)> {
    let url = format!("http://127.0.0.1:{PROXY_PORT}");
    let mut env: Vec<(&'static str, String)> =
        ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"]
            .into_iter()
            .map(|name| (name, url.clone()))
            .collect();
    env.extend(["NO_PROXY", "no_proxy"].map(|name| (name, "localhost,127.0.0.1,::1".to_owned())));
    env
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
    #[error("No program given: pvisor run [-w DIR] -- PROGRAM [ARGS...]")]
    EmptyProgram,
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
        source: crate::runtime::suspension::SuspensionError,
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
}

impl Admitted {
    pub fn job_id(&self) -> &JobId {
        &self.job.id
    }
    pub fn attempt_id(&self) -> &AttemptId {
        &self.attempt.id
    }
}

fn canonical_workspace(path: &Path) -> Result<PathBuf, AdmissionError> {
    let canonical = std::fs::canonicalize(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => AdmissionError::WorkspaceMissing { path: path.to_owned() },
        _ => AdmissionError::WorkspaceUnreadable { path: path.to_owned(), source },
    })?;
    if !canonical.is_dir() {
        return Err(AdmissionError::WorkspaceNotDirectory { path: path.to_owned() });
    }
    if canonical == Path::new("/") {
        return Err(AdmissionError::WorkspaceIsRoot);
    }
    if canonical.to_str().is_none() {
        return Err(AdmissionError::NonUtf8Path { path: canonical });
    }
    Ok(canonical)
}

fn uname() -> (String, String) {
    // SAFETY: utsname is plain data and uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid out-parameter.
    if unsafe { libc::uname(&mut u) } != 0 {
        return ("unknown".into(), "unknown".into());
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    (field(&u.nodename), field(&u.release))
}

/// Admits `request`: validates it, fixes the policy and Placement, and records
/// the Run, Job and Attempt.
pub fn admit(
    store: &Store,
    executor_impl: &dyn pvisor_sandbox::Executor,
    request: RunRequest,
) -> Result<Admitted, AdmissionError> {
    let executor = executor_impl.name();
    if request.program.is_empty() {
        return Err(AdmissionError::EmptyProgram);
    }
    // A fork runs over its checkpoint's workspace, with the parent's stage restored.
    let fork = match &request.fork {
        None => None,
        Some(id) => {
            let dir = store.checkpoint_dir(id);
            let manifest = pvisor_stage::checkpoint::verify_checkpoint(&dir)
                .map_err(|source| AdmissionError::Checkpoint { checkpoint: id.clone(), source })?;
            Some((dir, manifest))
        }
    };
    let requested_workspace = match (&fork, &request.fork_execution) {
        (Some((_, m)), _) => m.workspace.clone(),
        (None, Some(f)) => f.manifest.workspace.clone(),
        (None, None) => request.workspace.clone(),
    };
    let workspace = canonical_workspace(&requested_workspace)?;
    let state = store.root().to_owned();
    if state.starts_with(&workspace) {
        return Err(AdmissionError::WorkspaceContainsState { workspace, state });
    }
    // A vm guest sees only an ext4 copy of its workspace, so a sandbox
    // image's rootfs (which holds no state) may be one.
    let image_rootfs = executor == "vm" && workspace.starts_with(store.sandbox_images_dir());
    if workspace.starts_with(&state) && !image_rootfs {
        return Err(AdmissionError::WorkspaceInsideState { workspace, state });
    }
    let cwd = match &request.cwd {
        None => workspace.clone(),
        Some(cwd) => {
            let joined = workspace.join(cwd);
            let resolved = std::fs::canonicalize(&joined).unwrap_or(joined);
            if !resolved.starts_with(&workspace) {
                return Err(AdmissionError::CwdOutsideWorkspace { cwd: resolved, workspace });
            }
            resolved
        }
    };

    // Secrets: scrub variables by name, hide secret stores; recorded by name only.
    type Vars = Vec<(String, String)>;
    let (env, scrubbed): (Vars, Vars) = request
        .env
        .into_iter()
        .partition(|(k, _)| !is_secret_name(k) || request.secrets.pass_env.iter().any(|p| p == k));
    let scrubbed: Vec<String> = scrubbed.into_iter().map(|(k, _)| k).collect();
    let mut hidden_secrets: Vec<(PathBuf, &'static str)> = Vec::new();
    let mut skipped_hides: Vec<PathBuf> = Vec::new();
    // Most candidates (47 default secret stores, other state directories)
    // do not exist: one lstat says so, where realpath would walk each
    // component first.
    let canonical = |p: &Path| std::fs::symlink_metadata(p).ok().and_then(|_| std::fs::canonicalize(p).ok());
    let exposed: Vec<PathBuf> =
        request.secrets.expose.iter().map(|p| canonical(p).unwrap_or_else(|| p.clone())).collect();
    let defaults =
        request.secrets.home.iter().flat_map(|home| DEFAULT_HIDDEN.iter().map(move |rel| home.join(rel)));
    let candidates = defaults
        .map(|p| (p, "secret store"))
        .chain(request.secrets.hide.iter().map(|p| (p.clone(), "--hide")))
        .chain(
            request.secrets.other_state_dirs.iter().map(|p| (p.clone(), "another pvisor state directory")),
        );
    for (path, reason) in candidates {
        let Some(real) = canonical(&path) else { continue };
        let state_dir = reason == "another pvisor state directory";
        // `--expose DIR` shows the secrets beneath DIR too (`--expose ~/.claude`);
        // no exposure reaches into a pvisor state directory.
        if (!state_dir && exposed.iter().any(|e| real.starts_with(e)))
            || hidden_secrets.iter().any(|(p, _)| *p == real)
        {
            continue;
        }
        // The workspace itself can never be hidden from the command; say so
        // rather than drop the request silently.
        if workspace.starts_with(&real) {
            skipped_hides.push(real);
            continue;
        }
        if real.to_str().is_none() {
            return Err(AdmissionError::NonUtf8Path { path: real });
        }
        hidden_secrets.push((real, reason));
    }

    let exposed_sockets = exposable_sockets(&request.secrets, &state, &workspace)?;
    let hidden_now: Vec<PathBuf> =
        std::iter::once(state.clone()).chain(hidden_secrets.iter().map(|(p, _)| p.clone())).collect();
    let cache_paths = cache_paths(&request.caches, &workspace, &hidden_now)?;
    // A cache's upper is written by earlier runs: a place for the socket
    // would be made through whatever they left there.
    if let Some(path) = exposed_sockets.iter().find(|s| cache_paths.iter().any(|c| s.starts_with(c))) {
        return Err(AdmissionError::ExposeSocket {
            path: path.clone(),
            problem: "is inside a --cache directory; expose it without the cache, or cache another directory",
        });
    }

    let now = Timestamp::now();
    let job_id = JobId::generate();
    let run_id = RunId::generate();
    let attempt_id = AttemptId::new(run_id.clone(), 1);
    let (host, kernel) = uname();
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };

    let network = pvisor_net::policy::resolve(&request.network)?;
    let attachment = attachment_for(network.mode);
    let policy = EffectivePolicy {
        network: network.clone(),
        kill_grace_ms: request.kill_grace.as_millis() as u64,
        seccomp: request.seccomp,
        limits: request.limits.clone(),
        hidden_paths: std::iter::once(state.clone())
            .chain(hidden_secrets.iter().map(|(p, _)| p.clone()))
            .collect(),
        exposed_sockets: exposed_sockets.clone(),
        caches: cache_paths.clone(),
    };
    let placement = Placement {
        executor: executor.to_owned(),
        rootless: euid != 0,
        sandbox_uid: euid,
        host,
        kernel,
        details: executor_impl.placement_details().into_iter().collect(),
    };
    let mut env = env;
    let mut env_rewrites = vec![("PVISOR_SANDBOX", "1".to_owned()), ("PVISOR_JOB", job_id.to_string())];
    if network.mode == NetworkMode::Proxy {
        env_rewrites.extend(proxy_env());
    }
    let rewritten: Vec<&str> = env_rewrites.iter().map(|(k, _)| *k).collect();
    env.retain(|(k, _)| !rewritten.contains(&k.as_str()));
    env.extend(env_rewrites.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    let operation = Operation {
        kind: "run.execute".into(),
        program: request.program.clone(),
        args: request.args.clone(),
        cwd: cwd.clone(),
        env_names: {
            let mut names: Vec<String> = env.iter().map(|(k, _)| k.clone()).collect();
            names.sort();
            names
        },
        policy: policy.clone(),
        placement: placement.clone(),
    };

    // The owner lock comes first: from the moment any record of this Job
    // exists, a reader sees a live owner and never "recovers" a starting run.
    let creating = OwnerLock::acquire_shared_blocking(&store.admission_lock_file())?;
    store::create_dir_all_private(&store.attempt_dir(&attempt_id))?;
    let lock = OwnerLock::acquire(&store.lock_file(&attempt_id))?;
    drop(creating);
    let stage = store.stage_dir(&run_id);
    let run = RunRecord {
        format: FORMAT,
        id: run_id.clone(),
        job: job_id.clone(),
        created_at: now,
        updated_at: now,
        workspace: workspace.clone(),
        operation,
        state: JobState::Pending,
        attempts: 1,
        result: None,
    };
    store.write(&store.run_file(&run_id), &run)?;
    let job = JobRecord {
        format: FORMAT,
        id: job_id.clone(),
        created_at: now,
        updated_at: now,
        workspace: workspace.clone(),
        run: run_id.clone(),
        state: JobState::Pending,
        target_attempt: 1,
        continuation: true,
        lineage: match (&fork, &request.fork_execution) {
            (Some((_, m)), _) => Some(pvisor_core::records::Lineage {
                parent_job: m.job.clone(),
                checkpoint: m.id.clone(),
                kind: m.kind.clone(),
            }),
            (None, Some(f)) => Some(pvisor_core::records::Lineage {
                parent_job: f.parent.clone(),
                checkpoint: f.manifest.id.clone(),
                kind: f.manifest.kind.clone(),
            }),
            (None, None) => None,
        },
        imported_from: None,
    };
    let attempt = AttemptRecord {
        format: FORMAT,
        id: attempt_id.clone(),
        job: job_id.clone(),
        executor: executor.to_owned(),
        state: AttemptState::Preparing,
        created_at: now,
        updated_at: now,
        started_at: None,
        owner_pid: std::process::id(),
    };
    store.write(&store.attempt_file(&attempt_id), &attempt)?;
    // The Job appears last and whole: its directory is renamed into place
    // with job.json inside, so `pvisor jobs` never meets a half-made Job.
    // A crash before this leaves an unreferenced Run that gc removes.
    store.publish_job(&job)?;

    let mut trace = Trace::open(store, &run_id);
    let created = trace.emit(
        "job.created",
        None,
        None,
        json!({"job": job_id, "workspace": workspace, "program": request.program, "args": request.args}),
        false,
    )?;
    let policy_event = trace.emit("admission.policy", None, Some(created), json!(policy), false)?;
    trace.emit(
        "admission.network",
        None,
        Some(policy_event),
        json!({"mode": network.mode, "mode_source": network.mode_source, "allow": network.allow, "deny": network.deny, "attachment": executor_impl.describe_attachment(attachment), "non_bypassable": attachment.non_bypassable()}),
        false,
    )?;
    trace.emit(
        "admission.rewrite",
        None,
        Some(policy_event),
        json!({"rewrite": "hide", "path": state, "reason": "the sandbox must not read or forge pvisor's records"}),
        false,
    )?;
    for (path, reason) in &hidden_secrets {
        trace.emit(
            "admission.rewrite",
            None,
            Some(policy_event),
            json!({"rewrite": "hide", "path": path, "reason": reason}),
            false,
        )?;
    }
    for path in &skipped_hides {
        trace.emit(
            "admission.rewrite",
            None,
            Some(policy_event),
            json!({"rewrite": "hide.skipped", "path": path, "reason": "it contains the workspace, which the command must see"}),
            false,
        )?;
    }
    for path in &cache_paths {
        trace.emit(
            "admission.rewrite",
            None,
            Some(policy_event),
            json!({"rewrite": "cache", "path": path, "reason": "--cache: writable, persisted in pvisor's cache store, not staged"}),
            false,
        )?;
    }
    for path in &exposed_sockets {
        trace.emit(
            "admission.rewrite",
            None,
            Some(policy_event),
            json!({"rewrite": "expose.socket", "path": path, "reason": "--expose-socket"}),
            false,
        )?;
    }
    for name in &scrubbed {
        trace.emit(
            "admission.rewrite",
            None,
            Some(policy_event),
            json!({"rewrite": "env.remove", "name": name, "reason": "named like a secret; pass it with --env"}),
            false,
        )?;
    }
    for (name, _) in &env_rewrites {
        trace.emit(
            "admission.rewrite",
            None,
            Some(policy_event),
            json!({"rewrite": "env.set", "name": name}),
            false,
        )?;
    }
    if let Some(lineage) = &job.lineage {
        trace.emit("fork.lineage", None, Some(created), json!(lineage), false)?;
    }
    let placed = trace.emit("placement.decided", None, Some(policy_event), json!(placement), false)?;
    let attempt_event = trace.emit(
        "attempt.created",
        Some(1),
        Some(placed),
        json!({"attempt": attempt_id, "executor": executor}),
        false,
    )?;

    let caches = cache_paths
        .iter()
        .enumerate()
        .map(|(i, path)| {
            let store_dir = store.cache_dir(path);
            for sub in ["upper", "work"] {
                store::create_dir_all_private(&store_dir.join(sub))?;
            }
            let _ = std::fs::write(store_dir.join("path"), path.as_os_str().as_encoded_bytes());
            Ok(pvisor_sandbox::CacheMount {
                path: path.clone(),
                store: store_dir,
                scratch: stage.join(format!("cache-{i}")),
                persistent: false,
            })
        })
        .collect::<Result<Vec<_>, store::StoreError>>()?;
    let spec = SandboxSpec {
        workspace,
        cwd,
        upper: stage.join("upper"),
        work: stage.join("work"),
        root_mount: stage.join("root"),
        hidden: policy.hidden_paths.clone(),
        start_at_coarse_ns: None,
        caches: caches.clone(),
        exposed_sockets,
        program: request.program,
        args: request.args,
        env,
        hostname: "pvisor".into(),
        network: attachment,
        seccomp: request.seccomp,
        limits: request.limits,
        vm: (executor == "vm").then(|| pvisor_sandbox::vm::VmSpec {
            dir: store.attempt_dir(&attempt_id).join("vm"),
            checkpoints: store.exec_checkpoints_dir(&run_id),
            restore: request.fork_execution.as_ref().map(|f| f.dir.clone()),
            context: json!({"job": job_id, "run": run_id, "attempt": attempt_id}),
        }),
    };
    let restore_from = fork.map(|(dir, _)| dir);
    let baseline = request.fork_execution.as_ref().and_then(|f| checkpoint_baseline(&f.manifest));
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
    })
}

fn attachment_for(mode: NetworkMode) -> NetworkAttachment {
    match mode {
        NetworkMode::None => NetworkAttachment::Isolated,
        NetworkMode::Proxy => NetworkAttachment::ProxyListener { port: PROXY_PORT },
        NetworkMode::Host => NetworkAttachment::Host,
    }
}

/// The conflict baseline recorded in an execution checkpoint's context.
fn checkpoint_baseline(manifest: &pvisor_sandbox::vm::ExecCheckpoint) -> Option<i128> {
    manifest.context.get("baseline").and_then(|b| b.as_str()).and_then(|b| b.parse().ok())
}

/// Admits the resumption of a suspended vm Job: a new Attempt of the same
/// Run that restores the checkpoint named by the termination receipt. Every
/// check (continuation, owner, receipt, every checkpoint file's digest) runs
/// before any record changes, so a refused resume leaves the Job `suspended`.
pub fn admit_resume(
    store: &Store,
    executor: &dyn pvisor_sandbox::Executor,
    job_id: &JobId,
) -> Result<Admitted, AdmissionError> {
    use crate::runtime::suspension;
    let not = |reason: String| AdmissionError::NotResumable { job: job_id.clone(), reason };
    // Finish the records of a supervisor that died after its termination receipt.
    crate::runtime::recovery::recover(store, job_id).map_err(|e| match e {
        crate::runtime::job_service::views::ViewError::Store(s) => AdmissionError::Store(s),
        other => not(other.to_string()),
    })?;
    let _guard = OwnerLock::acquire_blocking(&store.job_dir(job_id).join("recover.lock"))?;
    let mut job: JobRecord = store.read(&store.job_file(job_id))?;
    if !job.continuation {
        return Err(not("it was killed; its continuation rights are withdrawn".into()));
    }
    let target = AttemptId::new(job.run.clone(), job.target_attempt);
    if OwnerLock::is_held(&store.lock_file(&target))? {
        return Err(not(format!("{target} is still live; suspend it first (pvisor suspend {job_id})")));
    }
    let (previous, receipt, _) = suspension::resumable(store, &job)
        .map_err(|source| AdmissionError::Suspension { job: job_id.clone(), source })?
        .ok_or_else(|| {
            not(format!("it is {}, not suspended (no termination receipt to resume from)", job.state))
        })?;
    let dir = suspension::checkpoint_dir(store, &job.run, &receipt.checkpoint);
    let manifest = pvisor_sandbox::vm::checkpoint::verify(&dir).map_err(|e| AdmissionError::Suspension {
        job: job_id.clone(),
        source: suspension::SuspensionError::Checkpoint(e),
    })?;

    let now = Timestamp::now();
    let mut run: RunRecord = store.read(&store.run_file(&job.run))?;
    let number = run.attempts.max(job.target_attempt) + 1;
    let attempt_id = AttemptId::new(run.id.clone(), number);
    store::create_dir_all_private(&store.attempt_dir(&attempt_id))?;
    let lock = OwnerLock::acquire(&store.lock_file(&attempt_id))?;
    let attempt = AttemptRecord {
        format: FORMAT,
        id: attempt_id.clone(),
        job: job_id.clone(),
        executor: executor.name().to_owned(),
        state: AttemptState::Preparing,
        created_at: now,
        updated_at: now,
        started_at: None,
        owner_pid: std::process::id(),
    };
    store.write(&store.attempt_file(&attempt_id), &attempt)?;
    run.attempts = number;
    run.updated_at = now;
    store.write(&store.run_file(&run.id), &run)?;
    job.target_attempt = number;
    job.updated_at = now;
    store.write(&store.job_file(job_id), &job)?;

    let mut trace = Trace::open(store, &run.id);
    let requested = trace.emit(
        "resume.requested",
        Some(number),
        None,
        json!({"from_attempt": previous, "checkpoint": manifest.id}),
        false,
    )?;
    let attempt_event = trace.emit(
        "attempt.created",
        Some(number),
        Some(requested),
        json!({"attempt": attempt_id, "executor": executor.name(), "restore": manifest.id}),
        false,
    )?;
    let operation = &run.operation;
    let stage = store.stage_dir(&run.id);
    let mut context = manifest.context.clone();
    context["attempt"] = json!(attempt_id);
    let spec = SandboxSpec {
        workspace: run.workspace.clone(),
        cwd: operation.cwd.clone(),
        upper: stage.join("upper"),
        work: stage.join("work"),
        root_mount: stage.join("root"),
        hidden: operation.policy.hidden_paths.clone(),
        start_at_coarse_ns: None,
        caches: Vec::new(),
        exposed_sockets: operation.policy.exposed_sockets.clone(),
        program: operation.program.clone(),
        args: operation.args.clone(),
        // The command's environment lives on inside the restored guest.
        env: Vec::new(),
        hostname: "pvisor".into(),
        network: attachment_for(operation.policy.network.mode),
        seccomp: operation.policy.seccomp,
        limits: operation.policy.limits.clone(),
        vm: Some(pvisor_sandbox::vm::VmSpec {
            dir: store.attempt_dir(&attempt_id).join("vm"),
            checkpoints: store.exec_checkpoints_dir(&run.id),
            restore: Some(dir),
            context,
        }),
    };
    let baseline = checkpoint_baseline(&manifest);
    let resumed_from = Some(previous.number());
    Ok(Admitted {
        job,
        run,
        attempt,
        trace,
        spec,
        lock,
        attempt_event,
        restore_from: None,
        baseline,
        resumed_from,
    })
}

#[cfg(test)]
mod tests {
    use super::is_secret_name;

    #[test]
    fn secret_names_are_scrubbed_and_lookalike_settings_pass() {
        for secret in [
            "GH_TOKEN",
            "DB_PASSWORD",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "SSH_AUTH_SOCK",
            "PGPASSWORD",
            "MYSQL_PWD",
            "DATABASE_URL",
            "REPLICA_DATABASE_URL",
            "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY",
            "API_KEY",
            "STRIPE_KEY",
            "OP_SESSION_my",
            "npm_config__authToken",
            "NPM_CONFIG_//registry.npmjs.org/:_authToken",
        ] {
            assert!(is_secret_name(secret), "{secret} should be scrubbed");
        }
        for harmless in [
            "AWS_REGION",
            "AWS_DEFAULT_REGION",
            "AWS_PROFILE",
            "AWS_CA_BUNDLE",
            "REQUESTS_CA_BUNDLE",
            "SSL_CERT_FILE",
            "PATH",
            "HOME",
            "KEYMAP",
        ] {
            assert!(!is_secret_name(harmless), "{harmless} should pass");
        }
    }
}
