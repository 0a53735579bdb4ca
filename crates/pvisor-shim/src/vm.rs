//! A container's VM: one pvisor vm Job, started and ended through the
//! runtime's action API ([`pvisor::Runtime::execute`]), exactly as `pvisor
//! serve` runs a sandbox: the Job's Operation is a keeper that holds the VM
//! up, and the container's processes are guest execs chrooted into the
//! container's rootfs (the Job's workspace, seen at its host path).
//!
//! The shim process is the Job's supervisor: the Session runs as a task on
//! the shim's Tokio runtime, so the VM lives exactly as long as the shim
//! serves the container, and a shim that dies takes its VM with it (the
//! Job's receipt then says so honestly, as for any crashed supervisor).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use pvisor::actions::{Guest, OpenGuest, Run};
use pvisor::runtime::job_service::CancelHandle;
use pvisor::{RunEnd, RunRequest, Runtime};
use pvisor_core::ids::JobId;
use pvisor_core::records::ResourceLimits;
use pvisor_net::{Mode, PolicySpec, Scope, ScopedPolicy};
use pvisor_sandbox::vm::guest::{ExecChannel, ExecSpec};

use crate::spec::ProcessSpec;

/// The Job's Operation: it only keeps the VM up (the container's own
/// process is a guest exec, so its stdio and exit are relayed exactly).
/// The same keeper as `pvisor serve`'s sandboxes.
const KEEPER: &str = "while :; do sleep 3600; done";
/// How long a VM may take to boot (TCG is slow) before create fails.
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the Job's keeper gets between SIGTERM and SIGKILL on delete.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// How long delete waits for the Job's supervisor task to finish it.
const END_TIMEOUT: Duration = Duration::from_secs(60);
/// The first exec id: the Attempt's own command is id 1.
const FIRST_EXEC_ID: u32 = 2;

/// How the Job ended, once it has.
#[derive(Debug, Default)]
struct Ended {
    summary: Option<String>,
}

/// A running container VM.
#[derive(Debug)]
pub struct Vm {
    job: JobId,
    cancel: CancelHandle,
    guest: Guest,
    rootfs: PathBuf,
    ended: Arc<(Mutex<Ended>, Condvar)>,
    next_exec: AtomicU32,
}

impl Vm {
    /// Admits the container's Job over `rootfs` and waits until its guest
    /// answers. `tokio` runs the Job's Session.
    pub fn boot(
        runtime: &Runtime,
        tokio: &tokio::runtime::Handle,
        container: &str,
        rootfs: PathBuf,
        limits: ResourceLimits,
    ) -> Result<Vm, String> {
        let executor = runtime.executor("vm").map_err(|e| e.to_string())?;
        let request = keeper_request(container, rootfs.clone(), limits);
        let mut run = {
            let _inside = tokio.enter();
            runtime
                .execute(Run { request, executor })
                .map_err(|e| format!("the Job was not admitted: {e}"))?
        };
        let job = run.job().clone();
        let cancel = run.cancel_handle();
        log::info!("container {container} is Job {job} (workspace {})", rootfs.display());
        let ended = Arc::new((Mutex::new(Ended::default()), Condvar::new()));
        let publish = ended.clone();
        tokio.spawn(async move {
            let summary = match run.wait().await {
                Ok(RunEnd::Finished(o)) => format!(
                    "ended {} (signal {:?}, exit {:?})",
                    o.result.state, o.result.signal, o.result.exit_code
                ),
                Ok(RunEnd::Suspended(s)) => format!("suspended to {}", s.checkpoint.id),
                Err(e) => format!("failed: {e}"),
            };
            let (lock, cvar) = &*publish;
            lock.lock().unwrap_or_else(|p| p.into_inner()).summary = Some(summary);
            cvar.notify_all();
        });
        let guest = wait_ready(runtime, &job, &rootfs, &ended)
            .inspect_err(|_| cancel.cancel(rustix::process::Signal::TERM.as_raw()))?;
        Ok(Vm { job, cancel, guest, rootfs, ended, next_exec: AtomicU32::new(FIRST_EXEC_ID) })
    }

    pub fn job(&self) -> &JobId {
        &self.job
    }

    /// Starts `process` chrooted into the container's rootfs; returns the
    /// channel (first reply already read) and the guest pid.
    pub fn exec(&self, process: &ProcessSpec) -> Result<(ExecChannel, u32, u32), ExecError> {
        let id = self.next_exec.fetch_add(1, Ordering::Relaxed);
        let spec = ExecSpec {
            id,
            argv: process.argv.clone(),
            env: process.env.clone(),
            cwd: process.cwd.clone(),
            root: Some(self.rootfs.clone()),
            output: None,
        };
        let mut channel = self.guest.exec(spec).map_err(|e| ExecError::Guest(e.to_string()))?;
        match channel.next_reply() {
            Ok(Some((pvisor_agent::Reply::Started { pid, .. }, _))) => Ok((channel, id, pid.max(0) as u32)),
            Ok(Some((pvisor_agent::Reply::ExecFailed { errno, message, .. }, _))) => {
                Err(ExecError::Failed { errno, message })
            }
            Ok(other) => Err(ExecError::Guest(format!("the guest answered {other:?}"))),
            Err(e) => Err(ExecError::Guest(e.to_string())),
        }
    }

    /// Ends the Job (SIGTERM to the keeper, SIGKILL after its grace) and
    /// waits until its Session has recorded the end. The shim is the Job's
    /// supervisor, so it cancels its own run: the `Kill` action would
    /// signal the supervisor, that is, the shim itself.
    pub fn stop(&self) -> Result<String, String> {
        self.cancel.cancel(rustix::process::Signal::TERM.as_raw());
        let (lock, cvar) = &*self.ended;
        let deadline = Instant::now() + END_TIMEOUT;
        let mut ended = lock.lock().unwrap_or_else(|p| p.into_inner());
        while ended.summary.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("Job {} did not end within {} s", self.job, END_TIMEOUT.as_secs()));
            }
            ended = cvar.wait_timeout(ended, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        Ok(ended.summary.clone().unwrap_or_default())
    }
}

/// Why a process did not start.
#[derive(Debug)]
pub enum ExecError {
    /// The guest could not be reached.
    Guest(String),
    /// The guest could not start it (`errno`: ENOENT for a missing program).
    Failed { errno: i32, message: String },
}

impl std::fmt::Display for ExecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Guest(e) => write!(f, "the container's VM is unreachable: {e}"),
            Self::Failed { message, .. } => write!(f, "cannot start the process: {message}"),
        }
    }
}

/// The Job that holds a container's VM up.
fn keeper_request(container: &str, workspace: PathBuf, limits: ResourceLimits) -> RunRequest {
    RunRequest {
        caches: Vec::new(),
        workspace,
        cwd: None,
        program: "/bin/sh".into(),
        args: vec!["-c".into(), KEEPER.into()],
        env: vec![("PATH".into(), "/bin:/sbin:/usr/bin:/usr/sbin".into())],
        kill_grace: KILL_GRACE,
        // Containers get no network yet: the guest has no NIC, and proxy
        // egress needs a policy (docs/kubernetes.md).
        network: vec![ScopedPolicy {
            scope: Scope::CommandLine,
            source: format!("containerd-shim-pvisor-v1 (container {container})"),
            spec: PolicySpec { mode: Some(Mode::None), allow: Vec::new(), deny: Vec::new(), ordered: None },
        }],
        fork: None,
        fork_execution: None,
        secrets: pvisor::admission::SecretPolicy::default(),
        seccomp: true,
        limits,
    }
}

/// Waits until the Job's guest answers a file operation in the rootfs.
fn wait_ready(
    runtime: &Runtime,
    job: &JobId,
    rootfs: &std::path::Path,
    ended: &(Mutex<Ended>, Condvar),
) -> Result<Guest, String> {
    let probe = pvisor_agent::Request::FileOp {
        root: rootfs.to_path_buf(),
        op: pvisor_agent::FileOp::Stat { path: "/".into() },
    };
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut last;
    loop {
        if let Some(summary) = &ended.0.lock().unwrap_or_else(|p| p.into_inner()).summary {
            return Err(format!(
                "Job {job} ended before its VM was ready ({summary}); see `pvisor events {job}`"
            ));
        }
        match runtime.execute(OpenGuest { job: job.clone() }) {
            Ok(guest) => match guest.call(&probe, &[], Duration::from_secs(10)) {
                Ok(_) => return Ok(guest),
                Err(e) => last = e.to_string(),
            },
            Err(e) => last = e.to_string(),
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the VM of Job {job} was not ready after {} s: {last}",
                READY_TIMEOUT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
