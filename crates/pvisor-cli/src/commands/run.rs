//! `pvisor run [-w DIR] -- PROGRAM [ARGS...]`.
//!
//! The frontend side of a run: it submits the request to the Job service,
//! holds the wait adapter, turns SIGINT/SIGTERM/SIGHUP/SIGQUIT into
//! cancellation requests, and keeps the runtime alive until the outcome is
//! published, so even a cancelled run ends with a receipt.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use serde::Serialize;
use tokio::signal::unix::{signal, SignalKind};

use pvisor::actions::{BeginSessionRun, Run};
use pvisor::agent_state::StatePath;
use pvisor::{
    BackendTraits, ExecutionFork, ManagedJobRun, RunEnd, RunOutcome, RunRequest, Runtime, SecretPolicy,
    SuspendedOutcome,
};
use pvisor_core::state::ResultState;
use pvisor_sandbox::Executor;

use crate::cli::{ExecutorArg, NetArg, RunArgs, RunOptions};
use crate::config;
use crate::exit;
use crate::json::JsonType;
use crate::output::{ending, say, warning};
use crate::results::{NetworkSummary, RunResult};
use pvisor_net::broker::BindingSpec;
use pvisor_net::{Mode, PolicySpec, Scope, ScopedPolicy};

pub fn cmd_run(runtime: &Runtime, args: RunArgs) -> anyhow::Result<i32> {
    let workspace = match args.workspace.clone() {
        Some(w) => w,
        None => std::env::current_dir().context("Cannot read the current directory")?,
    };
    let executor = executor_for(runtime, args.options.executor)?;
    let Some(name) = &args.session else {
        let mut request =
            request_for(runtime, &executor, workspace, None, None, &args.options, &args.command)?;
        add_state(&mut request, &args.state);
        return drive(runtime, Shown::of(&args.options), move || {
            Ok(runtime.execute(Run { request, executor })?)
        });
    };
    let quiet = args.options.quiet;
    let mut turn = runtime.execute(BeginSessionRun {
        workspace: workspace.clone(),
        name: name.clone(),
        waiting: Box::new(|| {
            crate::output::note(&format!("session {name}: waiting for its live run to end"))
        }),
    })?;
    super::sessions::announce_turn(&turn, quiet);
    let fork = turn.fork.as_ref().map(|(id, _)| id.clone());
    let mut request = request_for(runtime, &executor, workspace, fork, None, &args.options, &args.command)?;
    add_state(&mut request, &args.state);
    request.state_from = turn.state_from.clone();
    // The session names the Job as soon as it exists; its lock (in `turn`)
    // is held until the run has ended.
    drive_in(runtime, Shown::of(&args.options), Some(name), || {
        let run = runtime.execute(Run { request, executor })?;
        turn.admitted(run.job())?;
        Ok(run)
    })
}

/// Builds the executor `--executor` names; `vm` installs the guest image
/// under the state directory and decides KVM or TCG (recorded in Placement).
/// A `vm` backend that cannot be prepared (no guest image) still admits the
/// Job, which then fails setup with that reason: every setup failure is a
/// recorded Job.
pub fn executor_for(runtime: &Runtime, which: ExecutorArg) -> anyhow::Result<Arc<dyn Executor>> {
    let name = match which {
        ExecutorArg::Ns => "ns",
        ExecutorArg::Vm => "vm",
    };
    Ok(runtime.executor(name)?)
}

/// Runs `command` as a new Job over `workspace` (or as a fork of `fork`, or
/// of a VM's execution checkpoint).
pub fn execute(
    runtime: &Runtime,
    executor: Arc<dyn Executor>,
    workspace: std::path::PathBuf,
    fork: Option<pvisor_core::ids::CheckpointId>,
    fork_execution: Option<ExecutionFork>,
    options: &RunOptions,
    command: &[String],
) -> anyhow::Result<i32> {
    let request = request_for(runtime, &executor, workspace, fork, fork_execution, options, command)?;
    drive(runtime, Shown::of(options), move || Ok(runtime.execute(Run { request, executor })?))
}

/// The request for a run of `command`: the environment, the policies in
/// scope and the limits, said before the command starts. Shared by `run`,
/// `fork` and the MCP server's `run` tool.
pub fn request_for(
    runtime: &Runtime,
    executor: &Arc<dyn Executor>,
    workspace: std::path::PathBuf,
    fork: Option<pvisor_core::ids::CheckpointId>,
    fork_execution: Option<ExecutionFork>,
    options: &RunOptions,
    command: &[String],
) -> anyhow::Result<RunRequest> {
    let (program, rest) = command.split_first().context("No program given")?;
    let AgentGrant { options: agent_options, env: agent_env, state: agent_state } = with_agent(options)?;
    let options = &agent_options;
    let store = runtime.store();
    let traits = runtime.traits(executor.name());
    let mut env = Vec::new();
    for (key, value) in std::env::vars_os() {
        match (key.into_string(), value.into_string()) {
            (Ok(k), Ok(v)) => env.push((k, v)),
            (Ok(k), Err(_)) | (Err(_), Ok(k)) => {
                warning(&format!("not passing {k:?}: its name or value is not UTF-8"))
            }
            (Err(_), Err(_)) => warning("not passing a variable that is not UTF-8"),
        }
    }
    for (key, value) in agent_env {
        env.retain(|(k, _)| *k != key);
        env.push((key, value));
    }
    config::warn_if_home(&workspace);
    let ws_config = workspace_config(&workspace)?;
    let network = network_scopes(store, options, ws_config.as_ref())?;
    announce_policy(&network, &options.secret)?;
    let limits = limits_for(traits, options, ws_config.as_ref().map(|c| &c.2))?;
    if traits.shares_host_kernel {
        if !limits.is_empty() {
            pvisor_sandbox::limits::warm_up();
        }
        announce_unenforceable(&limits, options.quiet);
    }
    let host_mounts =
        !(options.cache.is_empty() && options.expose_socket.is_empty() && options.read_only.is_empty());
    if host_mounts && !traits.shares_host_kernel {
        anyhow::bail!(
            "--cache, --expose-socket and --ro apply to the ns executor; a vm guest sees none of the host's directories or sockets (copy the tool into the workspace, or use --executor ns)"
        );
    }
    let caches = cache_paths(&options.cache)?;
    let image = userland(runtime, &traits, options.image.as_deref())?;
    let mut labels = pvisor_core::labels::Labels::new();
    for (key, value) in &options.label {
        if labels.insert(key.clone(), value.clone()).is_some() {
            anyhow::bail!("label {key} is given twice; give each --label KEY once");
        }
    }
    let request = RunRequest {
        caches,
        state: agent_state,
        state_from: None,
        secrets: SecretPolicy {
            home: std::env::var_os("HOME").filter(|h| !h.is_empty()).map(std::path::PathBuf::from),
            hide: options.hide.clone(),
            expose: options.expose.clone(),
            pass_env: options.env.clone(),
            other_state_dirs: super::other_state_dirs(store),
            expose_sockets: options.expose_socket.clone(),
            read_only: options.read_only.clone(),
            brokered: options.secret.clone(),
        },
        fork,
        fork_execution,
        seccomp: !options.no_seccomp,
        limits,
        network,
        workspace,
        cwd: None,
        program: program.clone(),
        args: rest.to_vec(),
        env,
        kill_grace: options.kill_grace,
        labels,
        network_namespace: None,
        shared_directories: Vec::new(),
        image,
        output: None,
    };
    Ok(request)
}

/// `--image NAME` as the root filesystem and digest a vm run's command runs
/// in, found before the run starts (a built-in image is imported now).
fn userland(
    runtime: &Runtime,
    traits: &BackendTraits,
    name: Option<&str>,
) -> anyhow::Result<Option<pvisor_core::records::UserlandImage>> {
    let Some(name) = name else { return Ok(None) };
    if !traits.guest_machine {
        anyhow::bail!("--image applies to --executor vm; an ns run uses the host's userland");
    }
    let images = pvisor_server::images::ImageStore::new(runtime.store())
        .with_built_in(pvisor_server::images::built_in_found());
    let image = images.userland(name)?.with_context(|| {
        format!(
            "No image {name:?} is imported: `pvisor image ls` lists the images there are, and `pvisor image import {name} DIR|TAR|OCI-LAYOUT` adds one"
        )
    })?;
    Ok(Some(image))
}

/// `options` with what `--agent`'s preset grants added to them (the same
/// lists the flags fill), the variables it sets and its state paths. Says
/// in one line what was granted.
fn with_agent(options: &RunOptions) -> anyhow::Result<AgentGrant> {
    let mut options = options.clone();
    let Some(name) = options.agent.clone() else {
        return Ok(AgentGrant { options, env: Vec::new(), state: Vec::new() });
    };
    let (path, user) = config::user_config()?;
    let path =
        path.or_else(config::user_config_path).unwrap_or_else(|| "~/.config/pvisor/config.toml".into());
    let preset = crate::agents::preset(&name, &user.agents, &path)?;
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(std::path::PathBuf::from)
        .context("--agent needs HOME, where the agent keeps its state")?;
    let mut grant = crate::agents::grant(&name, &preset, &|var| std::env::var(var).ok(), &home)?;
    if matches!(options.executor, ExecutorArg::Vm) {
        grant.for_vm();
    }
    options.allow.extend(grant.allow.iter().cloned());
    for binding in &grant.secrets {
        let spec: BindingSpec =
            binding.parse().with_context(|| format!("agent {name}'s secret {binding:?}"))?;
        options.secret.push(spec);
    }
    options.env.extend(grant.pass.iter().cloned());
    say(JsonType::Agent, &grant, || format!("pvisor: {}", crate::output::shown(&grant.summary())));
    let state = grant.state.iter().map(|path| preset_state(path, &grant.gated)).collect();
    Ok(AgentGrant { options, env: grant.env, state })
}

/// What `--agent` adds to a run: the options with its lists, the
/// variables it sets, its state paths.
struct AgentGrant {
    options: RunOptions,
    env: Vec<(String, String)>,
    state: Vec<StatePath>,
}

/// A preset's state path: gated by the preset's globs and pvisor's
/// defaults together (a preset may only add to what is held back). A path
/// the host does not have yet is a file when its name has an extension
/// (`~/.claude.json`), else a directory.
fn preset_state(path: &std::path::Path, gated: &[String]) -> StatePath {
    let mut state = StatePath::new(path);
    let extra: Vec<String> = gated.iter().filter(|g| !state.gated.contains(g)).cloned().collect();
    state.gated.extend(extra);
    if path.extension().is_some() {
        state.kind = Some(pvisor::agent_state::StateKind::File);
    }
    state
}

/// `request`'s state paths (an agent preset's) and `--state`'s, each once.
fn add_state(request: &mut RunRequest, requested: &[std::path::PathBuf]) {
    for path in requested {
        if !request.state.iter().any(|s| s.path == *path) {
            request.state.push(StatePath::new(path));
        }
    }
}

/// Starts a run with `start` on a fresh runtime, turns SIGINT/SIGTERM/SIGHUP/
/// SIGQUIT into cancellation requests, waits for the published end and
/// says how it ended (see [`finish`]). Used by `run`, `fork` and `resume`.
pub fn drive(
    runtime: &Runtime,
    shown: Shown,
    start: impl FnOnce() -> anyhow::Result<ManagedJobRun>,
) -> anyhow::Result<i32> {
    drive_in(runtime, shown, None, start)
}

/// What a driven run says besides its summary.
#[derive(Debug, Clone, Copy, Default)]
pub struct Shown {
    /// Nothing but the command's own output (and what was asked for).
    pub quiet: bool,
    /// `--timings`: where the time went.
    pub timings: bool,
}

impl Shown {
    pub fn of(options: &crate::cli::RunOptions) -> Self {
        Self { quiet: options.quiet, timings: options.timings }
    }

    pub fn quiet(quiet: bool) -> Self {
        Self { quiet, timings: false }
    }
}

/// [`drive`] for a run of `session` (whose name the next steps use).
fn drive_in(
    runtime: &Runtime,
    shown: Shown,
    session: Option<&str>,
    start: impl FnOnce() -> anyhow::Result<ManagedJobRun>,
) -> anyhow::Result<i32> {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .enable_io()
        .build()
        .context("Cannot start the async runtime")?;
    tokio.block_on(async move {
        let mut signals = Vec::new();
        for (kind, number) in [
            (SignalKind::interrupt(), libc::SIGINT),
            (SignalKind::terminate(), libc::SIGTERM),
            (SignalKind::hangup(), libc::SIGHUP),
            (SignalKind::quit(), libc::SIGQUIT),
        ] {
            signals.push((signal(kind).context("Cannot install signal handlers")?, number));
        }
        let [(int, _), (term, _), (hup, _), (quit, _)] = signals.as_mut_slice() else {
            unreachable!("four signals were installed")
        };
        let mut run = start()?;
        let cancel = run.cancel_handle();
        let end = loop {
            tokio::select! {
                end = run.wait() => break end,
                _ = int.recv() => cancel.cancel(libc::SIGINT),
                _ = term.recv() => cancel.cancel(libc::SIGTERM),
                _ = hup.recv() => cancel.cancel(libc::SIGHUP),
                _ = quit.recv() => cancel.cancel(libc::SIGQUIT),
            }
        }?;
        Ok(match &end {
            RunEnd::Finished(outcome) => {
                if !shown.quiet {
                    super::state::note_held(runtime, &outcome.job);
                }
                if shown.timings {
                    crate::timings::report(runtime, outcome);
                }
                finish(outcome, shown.quiet, session)
            }
            RunEnd::Suspended(suspended) => finish_suspended(runtime, suspended, shown.quiet)?,
        })
    })
}

/// The summary of an Attempt that was suspended from elsewhere.
fn finish_suspended(runtime: &Runtime, outcome: &SuspendedOutcome, quiet: bool) -> anyhow::Result<i32> {
    for gap in &outcome.audit_gaps {
        warning(&format!("audit gap (the termination receipt is valid): {gap}"));
    }
    let job = &outcome.job;
    if !quiet {
        if crate::json::mode().is_none() {
            eprintln!(
                "pvisor: {job} suspended to {} (VM {}; paused {} ms)",
                outcome.checkpoint.id, outcome.vm_exit, outcome.checkpoint.paused_ms
            );
        }
        let me = crate::output::me();
        say_next(
            "next",
            &[
                format!("{me} resume {job}"),
                format!("{me} fork {job} --state execution"),
                format!("{me} kill {job}"),
            ],
        );
    }
    if crate::json::mode().is_none() {
        return Ok(exit::SUSPENDED);
    }
    let store = runtime.store();
    let workspace = store.read::<pvisor_core::records::JobRecord>(&store.job_file(job))?.workspace;
    Ok(conclude(&RunResult::from_suspended(outcome, workspace)))
}

/// The commands that usually come next, said as `pvisor: WORD: A  ·  B`
/// or a `next` line.
fn say_next(word: &str, commands: &[String]) {
    #[derive(Serialize)]
    struct Next<'a> {
        commands: &'a [String],
    }
    say(JsonType::Next, &Next { commands }, || format!("pvisor: {word}: {}", commands.join("  ·  ")));
}

/// Under `--json`, the `result` line; returns pvisor's exit status.
fn conclude(result: &RunResult) -> i32 {
    // A result that cannot be written changes no exit status; the reader
    // sees the stream end without one.
    let _ = crate::json::emit(JsonType::Result, result);
    result.exit_status()
}

/// Gathers the network policies in scope: the command line, the workspace's
/// `.pvisor.toml`, and the user's config file. Admission merges them.
///
/// The workspace file is the repository's content: unless the user trusted
/// these exact bytes (`pvisor trust`), only what narrows the policy is kept
/// (`mode = "none"`, deny rules), and what was ignored is said before the
/// command starts, even with `-q`.
fn network_scopes(
    store: &pvisor_core::store::Store,
    args: &RunOptions,
    ws_config: Option<&WorkspaceConfig>,
) -> anyhow::Result<Vec<ScopedPolicy>> {
    let mut scopes = vec![ScopedPolicy {
        scope: Scope::CommandLine,
        source: "command line".into(),
        spec: PolicySpec {
            mode: args.net.map(|m| match m {
                NetArg::None => Mode::None,
                NetArg::Proxy => Mode::Proxy,
                NetArg::Host => Mode::Host,
            }),
            allow: args.allow.clone(),
            deny: args.deny.clone(),
            ordered: None,
        },
    }];
    if let Some((ws_file, bytes, parsed)) = ws_config {
        let (ws_file, parsed) = (ws_file.clone(), parsed.clone());
        if let Some(spec) = parsed.network {
            let source = ws_file.display().to_string();
            // Every rule must be valid, even one that is then ignored.
            pvisor_net::policy::resolve(&[ScopedPolicy {
                scope: Scope::Workspace,
                source,
                spec: spec.clone(),
            }])?;
            let trust = pvisor::trust::check(store, &ws_file, bytes)?;
            let spec = if trust == pvisor::trust::Trust::Trusted {
                spec
            } else {
                let (narrow, ignored) = spec.narrowing_only();
                if !ignored.is_empty() {
                    let why = match trust {
                        pvisor::trust::Trust::Changed => "it changed since you trusted it",
                        _ => "it is not trusted",
                    };
                    crate::output::plain(
                        JsonType::Warning,
                        &format!(
                            "ignoring {} from {}: {why}, so it may only narrow the policy; `pvisor trust {}` trusts this exact file",
                            crate::output::shown(&ignored.join(" and ")),
                            crate::output::shown_path(&ws_file),
                            crate::output::shown_path(&ws_file)
                        ),
                    );
                }
                narrow
            };
            scopes.push(ScopedPolicy {
                scope: Scope::Workspace,
                source: ws_file.display().to_string(),
                spec,
            });
        }
    }
    if let (Some(path), user) = config::user_config()? {
        if let Some(spec) = user.network {
            scopes.push(ScopedPolicy { scope: Scope::User, source: path.display().to_string(), spec });
        }
    }
    Ok(scopes)
}

/// The workspace's `.pvisor.toml`: its canonical path, exact bytes (what
/// trust is checked against) and contents. `None` when there is none.
type WorkspaceConfig = (std::path::PathBuf, Vec<u8>, config::ConfigFile);

fn workspace_config(workspace: &std::path::Path) -> anyhow::Result<Option<WorkspaceConfig>> {
    let workspace = std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_owned());
    let ws_file = workspace.join(config::WORKSPACE_FILE);
    let Some(bytes) = config::read(&ws_file)? else { return Ok(None) };
    let parsed = config::parse(&bytes, &ws_file)?;
    if parsed.apply.is_some() {
        warning(&format!(
            "ignoring [apply] in {}: sensitive paths are set in your own config only",
            ws_file.display()
        ));
    }
    if !parsed.agents.is_empty() {
        warning(&format!(
            "ignoring [agents] in {}: agent presets are set in your own config only (a repository must not widen what an agent gets)",
            ws_file.display()
        ));
    }
    Ok(Some((ws_file, bytes, parsed)))
}

/// The process limit every `ns` run gets unless told otherwise.
pub const DEFAULT_PIDS: u64 = 4096;

/// The run's resource limits: the flags, else the user config's `[limits]`,
/// else (for a backend whose sandbox shares the host's kernel, as `ns`'s
/// does) pvisor's defaults: 4096 processes and half the host's RAM. A vm's
/// memory is its guest's size, so it gets no default here. A workspace's
/// `[limits]` may only make each limit smaller (it is untrusted input).
fn limits_for(
    traits: BackendTraits,
    options: &RunOptions,
    workspace: Option<&config::ConfigFile>,
) -> anyhow::Result<pvisor_core::records::ResourceLimits> {
    let (_, user) = config::user_config()?;
    let configured = user.limits.unwrap_or_default();
    let memory = options.memory.or(configured.memory);
    let ns = traits.shares_host_kernel;
    let default_memory = (ns && memory.is_none()).then(half_the_ram).flatten();
    let pids = options.pids.or(configured.pids);
    let default_pids = (ns && pids.is_none()).then_some(DEFAULT_PIDS);
    // No default disk quota: the one mechanism every host has keeps the
    // stage in memory (see pvisor-sandbox's ns/memory_stage.rs).
    if options.disk.is_some() && !ns {
        anyhow::bail!("--disk applies to the ns executor; a vm Job's writes are bounded by its guest's disk");
    }
    let disk = options.disk.or(configured.disk).filter(|_| ns);
    let mut limits = pvisor_core::records::ResourceLimits {
        memory_bytes: memory.or(default_memory),
        pids: pids.or(default_pids),
        cpus: options.cpus.or(configured.cpus),
        memory_is_default: default_memory.is_some(),
        pids_is_default: default_pids.is_some(),
        disk_bytes: disk,
        disk_is_default: false,
    };
    if let Some(narrower) = workspace.and_then(|c| c.limits.clone()) {
        fn smaller<T: PartialOrd + Copy>(current: Option<T>, asked: Option<T>) -> Option<T> {
            match (current, asked) {
                (Some(c), Some(a)) if a < c => Some(a),
                (None, Some(a)) => Some(a),
                (c, _) => c,
            }
        }
        let memory = smaller(limits.memory_bytes, narrower.memory);
        if memory != limits.memory_bytes {
            limits.memory_is_default = false;
        }
        limits.memory_bytes = memory;
        let pids = smaller(limits.pids, narrower.pids);
        if pids != limits.pids {
            limits.pids_is_default = false;
        }
        limits.pids = pids;
        let disk = smaller(limits.disk_bytes, narrower.disk);
        if disk != limits.disk_bytes {
            limits.disk_is_default = false;
        }
        limits.disk_bytes = disk;
        // A CPU rate the kernel cannot enforce (cpu.cfs_quota_us < 1000) would
        // replace a usable one with "not enforced": it is no narrowing.
        let usable = narrower.cpus.filter(|c| c.is_finite() && *c >= 0.01);
        if usable.is_none() && narrower.cpus.is_some() {
            warning("ignoring the workspace's cpus: not a rate of at least 0.01 cores");
        }
        limits.cpus = smaller(limits.cpus, usable);
    }
    Ok(limits)
}

/// Expands `--cache` presets into the directories each tool caches in
/// (created if missing: the user asked for a cache there); other values are
/// paths.
fn cache_paths(requested: &[String]) -> anyhow::Result<Vec<std::path::PathBuf>> {
    use std::path::PathBuf;
    let env_dir = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let home = env_dir("HOME");
    let under_home = |rel: &str| -> anyhow::Result<PathBuf> {
        Ok(home.clone().context("--cache presets need $HOME")?.join(rel))
    };
    let mut out = Vec::new();
    for value in requested {
        let dirs = match value.as_str() {
            "cargo" => {
                let cargo_home = match env_dir("CARGO_HOME") {
                    Some(dir) => dir,
                    None => under_home(".cargo")?,
                };
                vec![cargo_home.join("registry"), cargo_home.join("git")]
            }
            "pip" => vec![match (env_dir("PIP_CACHE_DIR"), env_dir("XDG_CACHE_HOME")) {
                (Some(dir), _) => dir,
                (None, Some(cache)) => cache.join("pip"),
                (None, None) => under_home(".cache/pip")?,
            }],
            "npm" => vec![match env_dir("npm_config_cache") {
                Some(dir) => dir,
                None => under_home(".npm")?,
            }],
            path => {
                out.push(PathBuf::from(path));
                continue;
            }
        };
        for dir in dirs {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("--cache {value}: cannot create {}", dir.display()))?;
            out.push(dir);
        }
    }
    Ok(out)
}

/// The limits announced as not enforceable before the command started.
static ANNOUNCED: std::sync::OnceLock<Vec<pvisor_core::records::LimitKind>> = std::sync::OnceLock::new();

/// Says, before the command starts, which limits this host cannot enforce:
/// a limit the user asked for as a warning (even with `-q`), pvisor's own
/// defaults as one note (not with `-q`). `pvisor doctor` says why in full.
fn announce_unenforceable(limits: &pvisor_core::records::ResourceLimits, quiet: bool) {
    let missing = pvisor_sandbox::limits::unenforceable(limits);
    let (defaults, asked): (Vec<_>, Vec<_>) = missing.iter().partition(|l| limits.is_default(l.limit));
    for l in &asked {
        warning(&format!("--{} {} is {}", l.limit, l.value, l.by));
    }
    if !defaults.is_empty() && !quiet {
        let names: Vec<String> = defaults.iter().map(|l| format!("{} {}", l.limit, l.value)).collect();
        crate::output::note(&format!(
            "default limits not enforced on this host: {} (no cgroup this user may create; see `pvisor doctor`)",
            names.join(", ")
        ));
    }
    let _ = ANNOUNCED.set(asked.iter().map(|l| l.limit).collect());
}

/// Half of the host's physical memory.
fn half_the_ram() -> Option<u64> {
    // What sysconf(_SC_PHYS_PAGES) * page size is computed from.
    let info = rustix::system::sysinfo();
    let total = (info.totalram as u64).saturating_mul(u64::from(info.mem_unit));
    (total > 0).then_some(total / 2)
}

/// Says the effective network policy, with where each part came from, when
/// it is not the default (no network at all). One line on stderr (a
/// `policy` line under `--json`), even with `-q`: a policy that opens the
/// network is never silent.
fn announce_policy(scopes: &[ScopedPolicy], secrets: &[BindingSpec]) -> anyhow::Result<()> {
    /// The `policy` line's data: the network policy and the `--secret`
    /// bindings (variable and destination; the values are never said).
    #[derive(serde::Serialize)]
    struct Policy<'a> {
        #[serde(flatten)]
        network: &'a pvisor_net::EffectiveNetwork,
        #[serde(skip_serializing_if = "<[_]>::is_empty")]
        secrets: &'a [BindingSpec],
    }
    let network = pvisor_net::policy::resolve(scopes)?;
    if network.mode == Mode::None && network.allow.is_empty() && network.deny.is_empty() {
        return Ok(());
    }
    let rules = |rules: &[pvisor_core::records::NetworkRule]| {
        rules.iter().map(|r| format!("{} ({})", r.pattern, r.source)).collect::<Vec<_>>().join(", ")
    };
    let mut line = format!("pvisor: network {} ({})", network.mode.as_str(), network.mode_source);
    if !network.allow.is_empty() {
        line.push_str(&format!("; allow {}", rules(&network.allow)));
    }
    if !network.deny.is_empty() {
        line.push_str(&format!("; deny {}", rules(&network.deny)));
    }
    if !secrets.is_empty() {
        let bound: Vec<String> = secrets.iter().map(|s| s.to_string()).collect();
        line.push_str(&format!(
            "; secret {} (a placeholder inside; the proxy sends each value to its host alone)",
            bound.join(", ")
        ));
    }
    say(JsonType::Policy, &Policy { network: &network, secrets }, || {
        pvisor_core::text::escape(&line, pvisor_core::text::Tabs::Escape).into_owned()
    });
    Ok(())
}

/// Says how the run ended, on stderr: its problems, a one-line summary,
/// what comes next and what it did on the network; under `--json` the same
/// as lines, the last one its `result` (which is the summary). Returns
/// pvisor's exit code.
fn finish(outcome: &RunOutcome, quiet: bool, session: Option<&str>) -> i32 {
    let result = RunResult::from_outcome(outcome);
    let text = crate::json::mode().is_none();
    if text {
        say_error(&result);
    }
    for gap in &outcome.audit_gaps {
        warning(&format!("audit gap (the receipt is valid): {gap}"));
    }
    if let Some(previous) = outcome.restore_failed_from {
        crate::output::plain(
            JsonType::Warning,
            &format!(
                "{} is still suspended (attempt {previous}; its checkpoint is intact): fix the cause and run `pvisor resume {}` again",
                outcome.job, outcome.job
            ),
        );
        return conclude(&result);
    }
    for said in &outcome.warnings {
        // Said before the command started (announce_unenforceable).
        if ANNOUNCED.get().is_some_and(|names| names.iter().any(|n| said.starts_with(&format!("--{n} ")))) {
            continue;
        }
        warning(said);
    }
    if !quiet {
        if text {
            eprintln!("{}", summary(outcome));
        }
        next_after(outcome, session);
        say_network(outcome);
    }
    conclude(&result)
}

/// Why the command could not run or finish, on a terminal's own colours.
fn say_error(result: &RunResult) {
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        // An SGR reset first: the command's last colours or attributes
        // (conceal, say) must not dress or hide what pvisor says.
        eprint!("\x1b[0m");
    }
    if let Some(error) = &result.error {
        eprintln!(
            "pvisor: {}: {}",
            if result.failed_to_start() { "error" } else { "note" },
            crate::output::shown(error)
        );
    }
}

/// `pvisor: JOB failed (exit 3); 2 changes staged (1 added, 1 deleted); WS untouched`.
fn summary(outcome: &RunOutcome) -> String {
    let result = &outcome.result;
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for change in &outcome.changes {
        *kinds.entry(change.kind.as_str()).or_default() += 1;
    }
    let staged = if outcome.changes.is_empty() {
        "nothing staged".to_owned()
    } else {
        let parts: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
        format!("{} staged ({})", plural(outcome.changes.len(), "change"), parts.join(", "))
    };
    let state = ending(result.state.as_str(), result.exit_code, result.signal);
    format!(
        "pvisor: {} {state}; {staged}; {} untouched",
        outcome.job,
        crate::output::shown_path(&outcome.workspace)
    )
}

/// What to do next: review, apply or drop what was staged (all of a
/// session's, in one); the status of a run that staged nothing and did
/// not complete; nothing otherwise.
fn next_after(outcome: &RunOutcome, session: Option<&str>) {
    let (job, me) = (&outcome.job, crate::output::me());
    if let (Some(name), false) = (session, outcome.changes.is_empty()) {
        say_next(
            "next",
            &[
                format!("{me} review --session {name} --diff"),
                format!("{me} apply --session {name} --all"),
                format!("{me} drop --session {name}"),
                format!("{me} run --session {name} -- …"),
            ],
        );
    } else if !outcome.changes.is_empty() {
        say_next(
            "next",
            &[
                format!("{me} review {job} --diff"),
                format!("{me} apply {job} --all"),
                format!("{me} drop {job}"),
            ],
        );
    } else if outcome.result.state != ResultState::Completed {
        say_next("details", &[format!("{me} status {job}")]);
    }
}

/// What the run did on the network: a note, or with requests through the
/// proxy their counts, the names denied most and how to allow them.
fn say_network(outcome: &RunOutcome) {
    /// A `network` line: the summary, what it means, and the `--allow`
    /// flags for the names denied (see [`allow_hint`]).
    #[derive(Serialize)]
    struct NetworkLine<'a> {
        #[serde(flatten)]
        summary: NetworkSummary,
        message: &'a str,
        suggested_allow: Option<String>,
    }
    let line = |net, message, suggested_allow| NetworkLine {
        summary: NetworkSummary::from(net),
        message,
        suggested_allow,
    };
    match &outcome.network {
        Some(net) if !net.non_bypassable => {
            let message = format!(
                "the command shared the host network ({}); its requests are not staged and were not rolled back",
                net.attachment
            );
            say(JsonType::Network, &line(net, &message, None), || format!("pvisor: note: {message}"));
        }
        Some(net) if net.allowed + net.failed + net.denied > 0 => {
            let message = format!(
                "{} request(s) allowed and connected, {} allowed but failed, {} denied; requests are effects that staging neither delayed nor rolled back",
                net.allowed, net.failed, net.denied
            );
            // A client that could not reach a local model server often falls
            // back to a public API: suggesting that host would send the work
            // where the user did not mean it to go.
            let hint = if missed_loopback(net) { None } else { allow_hint(&net.top_denied) };
            say(JsonType::Network, &line(net, &message, hint.clone()), || network_text(net, &message, hint.as_deref()));
        }
        _ => crate::output::note("network requests and changes to outside services are not staged; staging neither delayed nor rolled them back"),
    }
}

/// The end-of-run network lines: how many requests connected, failed
/// (allowed, nothing reached) and were denied; the destinations that failed
/// and the hosts denied most; and which names to allow (`hint`), or, when
/// the command could not reach the host's loopback, how to open one port.
fn network_text(net: &pvisor_core::records::NetworkObservation, message: &str, hint: Option<&str>) -> String {
    let mut text = format!("pvisor: network: {message}");
    if !net.top_failed.is_empty() {
        let failed: Vec<String> = net
            .top_failed
            .iter()
            .map(|(h, p, n)| format!("{} ×{n}", crate::output::shown(&destination(h, *p))))
            .collect();
        text.push_str(&format!(
            "\npvisor: failed (allowed, not resolved or not connected; see network.failed events): {}",
            failed.join(", ")
        ));
    }
    if !net.top_denied.is_empty() {
        let hosts: Vec<String> =
            net.top_denied.iter().map(|(h, n)| format!("{} ×{n}", crate::output::shown(h))).collect();
        text.push_str(&format!("\npvisor: denied: {}", hosts.join(", ")));
    }
    if missed_loopback(net) {
        text.push_str("\npvisor: note: the command could not reach the host's loopback; no --allow is suggested; to reach a service there, check it is running and allow its one port with a HOST:PORT rule (e.g. 127.0.0.1:11434)");
    } else if let Some(flags) = hint {
        text.push_str(&format!(
            "\npvisor: to allow (these names came from the sandbox; check each first): {flags}"
        ));
    }
    text
}

/// `host:port`, with an IPv6 address in brackets.
fn destination(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Whether a request for the host's loopback failed or was denied.
fn missed_loopback(net: &pvisor_core::records::NetworkObservation) -> bool {
    let failed = net.top_failed.iter().map(|(h, _, _)| h);
    let denied = net.top_denied.iter().map(|(h, _)| h);
    failed.chain(denied).any(|h| names_loopback(h))
}

/// Whether `host` names this machine: `localhost` (or a name below it) or a
/// loopback address.
fn names_loopback(host: &str) -> bool {
    let lower = host.trim_end_matches('.').to_ascii_lowercase();
    lower == "localhost"
        || lower.ends_with(".localhost")
        || lower
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.to_canonical().is_loopback())
}

/// How many names the `--allow` hint suggests.
const ALLOW_HINTS: usize = 5;

/// `--allow NAME` for each denied name worth suggesting, quoted for
/// pasting, at most [`ALLOW_HINTS`]; `None` when there is none. The names
/// are the sandbox's choice, so only a plain public DNS name is suggested:
/// never a wildcard, an IP literal, a loopback or internal name, or
/// anything a shell or terminal would read as more than a name.
fn allow_hint(denied: &[(String, u64)]) -> Option<String> {
    let flags: Vec<String> = denied
        .iter()
        .map(|(host, _)| host.as_str())
        .filter(|host| suggestable(host))
        .take(ALLOW_HINTS)
        .map(|host| format!("--allow {}", crate::output::quote_word(host)))
        .collect();
    (!flags.is_empty()).then(|| flags.join(" "))
}

/// Whether `host` is a plain public DNS name: labels of letters, digits
/// and inner hyphens, at least two, the last not numeric (so no IP
/// literal), and not a name for this machine or a private network.
fn suggestable(host: &str) -> bool {
    let lower = host.to_ascii_lowercase();
    let labels: Vec<&str> = lower.split('.').collect();
    let label_ok = |l: &&str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let internal = ["localhost", "local", "internal", "intranet", "lan", "home", "corp", "arpa", "invalid"];
    lower.len() <= 253
        && labels.len() >= 2
        && labels.iter().all(label_ok)
        && labels
            .last()
            .is_some_and(|tld| !tld.bytes().all(|b| b.is_ascii_digit()) && !internal.contains(tld))
        && lower.parse::<std::net::IpAddr>().is_err()
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_public_names_are_suggested_to_allow() {
        let denied = |names: &[&str]| names.iter().map(|n| ((*n).to_owned(), 1)).collect::<Vec<_>>();
        let hostile = denied(&[
            "*",
            "*.example.com",
            "127.0.0.1",
            "::1",
            "[::1]",
            "localhost",
            "db.localhost",
            "printer.local",
            "x$(id)",
            "x$(touch /tmp/pwned).example.com",
            "a b.com",
            "-rf.com",
            "10.0.0.1.",
            "169.254.169.254",
            "metadata.google.internal",
            "a;b.com",
            "x\u{1b}[2J.com",
        ]);
        assert_eq!(allow_hint(&hostile), None);
        let mixed = denied(&["pypi.org", "x$(id)", "files.pythonhosted.org"]);
        assert_eq!(allow_hint(&mixed).unwrap(), "--allow pypi.org --allow files.pythonhosted.org");
        let many: Vec<String> = (0..9).map(|i| format!("h{i}.example.com")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(allow_hint(&denied(&many)).unwrap().matches("--allow").count(), ALLOW_HINTS);
    }

    #[test]
    fn a_missed_loopback_withholds_public_suggestions() {
        let net = |failed: &[(&str, u16)], denied: &[&str]| pvisor_core::records::NetworkObservation {
            top_failed: failed.iter().map(|(h, p)| ((*h).to_owned(), *p, 1)).collect(),
            top_denied: denied.iter().map(|h| ((*h).to_owned(), 1)).collect(),
            ..Default::default()
        };
        for looped in [
            net(&[("127.0.0.1", 11434)], &["api.openai.com"]),
            net(&[("localhost", 1234)], &["api.anthropic.com"]),
            net(&[], &["::1", "api.openai.com"]),
            net(&[], &["127.0.0.2", "api.openai.com"]),
            net(&[], &["ollama.localhost", "api.openai.com"]),
        ] {
            assert!(missed_loopback(&looped), "{looped:?}");
        }
        assert!(!missed_loopback(&net(&[("api.example.com", 443)], &["pypi.org"])));
        assert_eq!(destination("::1", 8000), "[::1]:8000");
        assert_eq!(destination("localhost", 8000), "localhost:8000");
    }
}
