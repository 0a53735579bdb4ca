//! Placement: where and how the Attempt runs.
//!
//! The [`Placement`] record (executor, rootless or not, the sandbox uid,
//! host and kernel) is decided once and recorded in the Operation and as
//! `placement.decided`; the [`SandboxSpec`] is what the executor is handed,
//! built from the recorded decisions only.

use std::path::{Path, PathBuf};

use serde_json::json;

use pvisor_core::ids::{AttemptId, JobId, RunId};
use pvisor_core::records::{EffectivePolicy, Placement, ResourceLimits};
use pvisor_core::store::{self, Store, StoreError};
use pvisor_sandbox::{CacheMount, SandboxSpec};

use super::policy::attachment_for;
use super::ExecutionFork;

/// Decides the Placement: the executor, the effective uid the sandbox maps
/// to (rootless unless pvisor runs as root), this host's name and kernel,
/// and whatever the executor adds. An execution fork restores its parent's
/// checkpoint, so whatever the executor would plan for a fresh start (a
/// template) does not apply to it. A vm Job's userland `image` is the
/// executor's to name (and plan the start with: its disks are a template
/// shape of their own).
pub(super) fn decide(
    executor: &dyn pvisor_sandbox::Executor,
    limits: &ResourceLimits,
    execution_fork: bool,
    image: Option<&pvisor_core::records::UserlandImage>,
) -> Placement {
    let mut details: std::collections::BTreeMap<String, String> =
        executor.placement_details(limits, image).into_iter().collect();
    if execution_fork {
        details.remove("template");
        details.remove("boot_reason");
        details.insert("start".into(), "restore of the parent's execution checkpoint".into());
    }
    let (host, kernel) = uname();
    let euid = rustix::process::geteuid().as_raw();
    Placement {
        executor: executor.name().to_owned(),
        rootless: euid != 0,
        sandbox_uid: euid,
        host,
        kernel,
        details: details.into_iter().collect(),
    }
}

fn uname() -> (String, String) {
    let u = rustix::system::uname();
    let field = |f: &std::ffi::CStr| f.to_string_lossy().into_owned();
    (field(u.nodename()), field(u.release()))
}

/// Makes each cache's persistent store (`upper/`, `work/`, and a note of
/// the host path it serves) and returns the mounts, each with a per-run
/// scratch directory in the stage.
pub(super) fn cache_mounts(
    store: &Store,
    cache_paths: &[PathBuf],
    stage: &Path,
) -> Result<Vec<CacheMount>, StoreError> {
    cache_paths
        .iter()
        .enumerate()
        .map(|(i, path)| {
            let store_dir = store.cache_dir(path);
            for sub in ["upper", "work"] {
                store::create_dir_all_private(&store_dir.join(sub))?;
            }
            // A label for whoever browses the cache directory, rewritten at
            // every admission and read by nothing: not a record.
            #[allow(clippy::disallowed_methods)]
            let _ = std::fs::write(store_dir.join("path"), path.as_os_str().as_encoded_bytes());
            Ok(CacheMount {
                path: path.clone(),
                store: store_dir,
                scratch: stage.join(format!("cache-{i}")),
                persistent: false,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()
}

/// The Job's ids, for paths and the vm's context.
pub(super) struct Ids<'a> {
    pub(super) job: &'a JobId,
    pub(super) run: &'a RunId,
    pub(super) attempt: &'a AttemptId,
}

/// What the command is, as admitted.
pub(super) struct Command {
    pub(super) workspace: PathBuf,
    pub(super) cwd: PathBuf,
    pub(super) program: String,
    pub(super) args: Vec<String>,
    pub(super) env: Vec<(String, String)>,
    pub(super) seccomp: bool,
    pub(super) limits: ResourceLimits,
    pub(super) output: Option<pvisor_sandbox::CapturedOutput>,
}

/// The spec the executor is handed for Attempt 1: the stage's paths, the
/// hidden paths of `policy`, the caches and sockets, and (for vm) where
/// its state lives and, for an execution fork, what it restores.
pub(super) fn spec(
    store: &Store,
    executor: super::Backend<'_>,
    ids: Ids<'_>,
    command: Command,
    policy: &EffectivePolicy,
    caches: Vec<CacheMount>,
    fork_execution: Option<&ExecutionFork>,
) -> SandboxSpec {
    let stage = store.stage_dir(ids.run);
    SandboxSpec {
        workspace: command.workspace,
        cwd: command.cwd,
        upper: stage.join("upper"),
        work: stage.join("work"),
        root_mount: stage.join("root"),
        hidden: policy.hidden_paths.clone(),
        start_at_coarse_ns: None,
        caches,
        exposed_sockets: policy.exposed_sockets.clone(),
        read_only: policy.read_only.clone(),
        ca_bundle: None,
        state: Vec::new(),
        program: command.program,
        args: command.args,
        env: command.env,
        hostname: "pvisor".into(),
        network: attachment_for(policy.network.mode),
        loopback_forwards: super::policy::loopback_forwards(&policy.network),
        seccomp: command.seccomp,
        limits: command.limits,
        vm: executor.traits.guest_machine.then(|| pvisor_vm::VmSpec {
            dir: store.attempt_dir(ids.attempt).join("vm"),
            checkpoints: store.exec_checkpoints_dir(ids.run),
            restore: fork_execution.map(|f| f.dir.clone()),
            context: json!({"job": ids.job, "run": ids.run, "attempt": ids.attempt}),
            network_namespace: policy.network.namespace.clone(),
            shared_directories: policy.shared_directories.clone(),
            image: policy.image.clone(),
        }),
        output: command.output,
    }
}
