//! pvisor-sandbox: the [`Executor`] trait and what every backend shares.
//!
//! An executor turns a [`SandboxSpec`] (what to run, which workspace, where the
//! stage is) into a running, isolated process tree and reports how it ended.
//! It knows nothing about Jobs, records or receipts; the runtime (`pvisor`)
//! owns those. This crate is the boundary between the runtime and the
//! backends: the traits, the spec and the report, the errors, the
//! [`capabilities`] of a running sandbox and the neutral types they name
//! (execution checkpoints, guest commands, start templates), resource
//! [`limits`], setup [`timing`], [`notice`]s to the user, and the system-call wrappers both backends use. It holds no
//! backend. The backends are their own crates, and neither depends on the other:
//! - `pvisor-ns`: Linux user/mount/pid/ipc/uts/net namespaces with the
//!   workspace as an overlayfs whose upper layer is the Run's stage.
//! - `pvisor-vm`: a QEMU microVM per Attempt with `pvisor-agent` as its PID 1; the
//!   guest's overlay upper layer is exported into the same stage format, and
//!   a running VM can be checkpointed, suspended, resumed and forked.
//!
//! Binaries that embed the `ns` executor must call its `maybe_run_helper`
//! first thing in `main`: it re-executes the current binary as a small,
//! single-threaded helper that builds the namespaces.

// Unit tests write fixtures and print freely.
#![cfg_attr(test, allow(clippy::disallowed_methods, clippy::disallowed_macros))]

pub mod capabilities;
pub mod checkpoint;
pub mod guest;
pub mod limits;
pub mod notice;
pub mod sys;
pub mod templates;

/// Setup steps timed the same way by every executor and the guest agent.
pub use pvisor_agent_proto::timing;

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Everything an executor needs to start one sandboxed command.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// The canonical host path of the workspace; the sandbox sees it at the same path.
    pub workspace: PathBuf,
    /// The working directory of the command, inside the sandbox.
    pub cwd: PathBuf,
    /// The overlay upper directory (the stage) and its work directory.
    pub upper: PathBuf,
    pub work: PathBuf,
    /// An empty directory on which the sandbox's root is assembled.
    pub root_mount: PathBuf,
    /// Host directories the sandbox must not see (replaced by empty directories).
    pub hidden: Vec<PathBuf>,
    /// The command starts only once `CLOCK_REALTIME_COARSE` has reached this
    /// (ns since the epoch): the run's conflict baseline, so an edit on the
    /// host during the run is never stamped before it.
    #[serde(default)]
    pub start_at_coarse_ns: Option<i128>,
    /// Cache mounts (`--cache`): writable at their host path, persisted in
    /// pvisor's cache store, never staged (see `host_view.rs` in pvisor-ns).
    #[serde(default)]
    pub caches: Vec<CacheMount>,
    /// Host Unix sockets the command may connect to (`--expose-socket`);
    /// every other host socket is unreachable (see `host_view.rs` in pvisor-ns).
    #[serde(default)]
    pub exposed_sockets: Vec<PathBuf>,
    /// Host files and directories shown read-only at their own path where
    /// the sandbox would not see them otherwise (`--ro`: a tool tree under
    /// `/tmp`), socket-proof like the rest of the host view.
    #[serde(default)]
    pub read_only: Vec<PathBuf>,
    /// A CA bundle (a `--secret` run's: the host's roots and the run's CA)
    /// shown read-only over each system bundle file the host has
    /// (`/etc/ssl/certs/ca-certificates.crt`, …), for clients that read
    /// that path rather than the CA variables.
    #[serde(default)]
    pub ca_bundle: Option<PathBuf>,
    /// Agent state (`--state`): writable parents and the Job's own copies
    /// of state directories, mounted in this order before everything else
    /// under them; never staged (see [`StateMount`]).
    #[serde(default)]
    pub state: Vec<StateMount>,
    pub program: String,
    pub args: Vec<String>,
    /// The complete environment of the command.
    pub env: Vec<(String, String)>,
    pub hostname: String,
    pub network: NetworkAttachment,
    /// With [`NetworkAttachment::ProxyListener`]: the host loopback ports
    /// to forward, each listened on inside the sandbox's network namespace
    /// and handed to the supervisor like the proxy's listener. Executors
    /// that cannot listen there (vm) leave them to the proxy alone.
    #[serde(default)]
    pub loopback_forwards: Vec<pvisor_core::records::LoopbackForward>,
    /// Install the seccomp deny-list on the command (see `seccomp.rs` in pvisor-ns).
    pub seccomp: bool,
    /// Resource limits (see `limits.rs`).
    #[serde(default)]
    pub limits: limits::Limits,
    /// The `vm` backend's directories and restore source (`None` for `ns`).
    #[serde(default)]
    pub vm: Option<VmSpec>,
    /// Where the command's output goes when its frontend captures it;
    /// `None`: pvisor's own descriptors 0–2 (see `stdio.rs` in pvisor-ns).
    /// Descriptors do not cross the helper's spec pipe, so it is skipped there.
    #[serde(skip)]
    pub output: Option<CapturedOutput>,
}

/// The command's output captured by its frontend (an MCP server, whose own
/// stdout is its protocol): stdout and stderr go to these pipes' write
/// ends and stdin is the sandbox's `/dev/null`. Anonymous pipes only: a
/// descriptor of a host file would be a capability past every mount.
#[derive(Clone, Debug)]
pub struct CapturedOutput {
    pub stdout: std::sync::Arc<std::os::fd::OwnedFd>,
    pub stderr: std::sync::Arc<std::os::fd::OwnedFd>,
}

/// What the `vm` backend needs beyond the common spec.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VmSpec {
    /// The Attempt's private directory: disks, console log, control socket.
    pub dir: PathBuf,
    /// Where this Run's execution checkpoints are written.
    pub checkpoints: PathBuf,
    /// An execution checkpoint to restore instead of booting (resume, fork).
    pub restore: Option<PathBuf>,
    /// Opaque facts of the runtime (job, attempt, baseline), copied into
    /// every checkpoint manifest.
    pub context: serde_json::Value,
    /// The network namespace whose interface the guest's NIC takes over
    /// ([`NetworkAttachment::Namespace`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_namespace: Option<PathBuf>,
    /// Host directories the guest mounts live through virtiofs
    /// (virtiofs): such a VM boots (its RAM is shared with virtiofsd)
    /// and cannot be checkpointed (vhost-user-fs is not migratable).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_directories: Vec<pvisor_core::records::SharedDirectory>,
    /// The imported root filesystem the command runs in (`--image`): the
    /// guest assembles it read-only with a throw-away upper layer, the
    /// workspace at its own path inside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<pvisor_core::records::UserlandImage>,
}

/// One `--cache PATH`: the host directory is the read-only lower layer, and
/// what runs add lives in `store` (`upper/`, `work/`), shared by every Job
/// that uses the same cache, one at a time (`store/use.lock`); a run that
/// finds it in use gets a private, throw-away upper in `scratch` instead.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheMount {
    pub path: PathBuf,
    pub store: PathBuf,
    pub scratch: PathBuf,
    /// Set by the executor: whether this run holds the store (else scratch).
    #[serde(default)]
    pub persistent: bool,
}

impl CacheMount {
    /// Takes the cache store `store` for one run (`flock` on `use.lock`,
    /// never waiting); `None` while another process holds it. Dropping the
    /// file releases it.
    pub fn hold(store: &std::path::Path) -> Option<std::fs::File> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(store.join("use.lock"))
            .ok()?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok().then_some(file)
    }
}

/// One mount of agent state (`--state`). The runtime keeps the state
/// itself in the Job's directory; the executor only shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum StateMount {
    /// A host directory that holds state paths, made writable by an
    /// overlay whose upper is the Job's: an agent's temp file and rename
    /// beside a state file work, and the runtime keeps only the declared
    /// state files out of `upper` when the run has ended.
    Parent { path: PathBuf, upper: PathBuf, work: PathBuf },
    /// A state directory: the Job's own copy (`tree`), bound read-write
    /// over `path`.
    Directory { path: PathBuf, tree: PathBuf },
}

/// How the sandbox is attached to the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum NetworkAttachment {
    /// Its own network namespace with only loopback: no path out at all.
    Isolated,
    /// Its own network namespace with only loopback, plus a listening socket on
    /// `127.0.0.1:port` inside it that the supervisor's proxy accepts on.
    ProxyListener { port: u16 },
    /// The host's network namespace, shared.
    Host,
    /// A network namespace its caller made (a Kubernetes pod's, from the
    /// containerd shim), whose interface the VM's NIC takes over (the path
    /// is the VmSpec's `network_namespace`). The vm executor only.
    Namespace,
}

impl NetworkAttachment {
    /// Describes the path, as recorded in the Bundle.
    pub fn describe(self) -> String {
        match self {
            Self::Isolated => "own network namespace, loopback only".into(),
            Self::ProxyListener { port } => {
                format!("own network namespace, no route out; pvisor proxy listener on 127.0.0.1:{port}")
            }
            Self::Host => "host network namespace (shared)".into(),
            Self::Namespace => "the caller's network namespace (a pod's), joined through the VM's NIC".into(),
        }
    }

    /// Whether the command can reach the network other than as the policy says.
    pub fn non_bypassable(self) -> bool {
        match self {
            Self::Isolated | Self::ProxyListener { .. } => true,
            // The namespace's own policy (CNI, Kubernetes') decides, not pvisor's.
            Self::Host | Self::Namespace => false,
        }
    }
}

/// How the sandboxed command ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Termination {
    /// The command exited with this code.
    Exited(i32),
    /// The command was killed by this signal.
    Signaled(i32),
    /// The program could not be executed (`errno` from execve).
    ExecFailed { program: String, errno: i32, message: String },
    /// The sandbox vanished without reporting (e.g. killed from outside).
    Vanished { detail: String },
    /// The VM was saved to an execution checkpoint and then stopped; `qemu`
    /// says how the QEMU process ended (it has been reaped).
    Suspended { checkpoint: Box<checkpoint::ExecCheckpoint>, qemu: String },
}

/// What an executor observed about a finished command.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub user_cpu: Duration,
    pub system_cpu: Duration,
    pub max_rss_kib: u64,
}

/// The final report of a sandboxed command.
#[derive(Clone, Debug, PartialEq)]
pub struct ExitReport {
    pub termination: Termination,
    pub usage: Usage,
    /// The kernel's OOM killer acted in the run's memory cgroup (`ns`), or
    /// in the guest while the command ran (`vm`: the guest's RAM is the limit).
    pub oom_killed: bool,
    /// The user typed the interrupt character (Ctrl-C) on the terminal the
    /// command's own terminal is relayed to: a `SIGINT` death is theirs.
    pub interrupted_at_terminal: bool,
    /// The stage could not be saved whole (a memory stage that failed to
    /// copy out): what is staged is incomplete, and why.
    pub stage_error: Option<String>,
}

/// A failure to create or supervise a sandbox. The command never ran unsandboxed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("Cannot start the sandbox helper")]
    Spawn(#[source] io::Error),
    #[error("Sandbox setup failed: {message}")]
    Setup {
        /// Which setup step failed, e.g. `user-namespace`, `overlay`.
        step: String,
        message: String,
        /// What the user can do about it.
        hint: Option<String>,
    },
    #[error("Lost contact with the sandbox helper: {0}")]
    Protocol(String),
    #[error("Cannot wait for the sandbox")]
    Wait(#[source] io::Error),
}

impl SandboxError {
    /// Returns advice for the user, when there is some.
    pub fn hint(&self) -> Option<&str> {
        match self {
            Self::Setup { hint, .. } => hint.as_deref(),
            Self::Spawn(_) | Self::Protocol(_) | Self::Wait(_) => None,
        }
    }
}

/// A backend that runs commands in sandboxes.
pub trait Executor: Send + Sync + std::fmt::Debug {
    /// The executor's name as recorded in Placement (descriptive, not a capability).
    fn name(&self) -> &'static str;

    /// How `attachment` reaches the network with this backend, as recorded in
    /// the Trace and the Bundle.
    fn describe_attachment(&self, attachment: NetworkAttachment) -> String {
        attachment.describe()
    }

    /// Further facts for the Placement record of a start with `limits` and,
    /// for a vm Job, the userland `image` (the vm backend's accelerator, the
    /// image, and whether it restores a template or boots, and why).
    fn placement_details(
        &self,
        _limits: &limits::Limits,
        _image: Option<&pvisor_core::records::UserlandImage>,
    ) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Builds the sandbox and starts the command. Returns once the sandbox is
    /// set up, or with the precise reason it could not be.
    fn start(&self, spec: &SandboxSpec) -> Result<Box<dyn SandboxProcess>, SandboxError>;
}

/// A started sandbox.
pub trait SandboxProcess: Send + std::fmt::Debug {
    /// Returns a handle that can signal the sandbox from another thread.
    fn signaller(&self) -> Signaller;

    /// Takes the proxy listening socket created inside the sandbox's network
    /// namespace (only with [`NetworkAttachment::ProxyListener`]).
    fn take_proxy_listener(&mut self) -> Option<std::net::TcpListener> {
        None
    }

    /// Takes the listeners made inside the sandbox's network namespace for
    /// the spec's `loopback_forwards` (each one's local address says which);
    /// a forward the namespace could not listen for has none.
    fn take_forward_listeners(&mut self) -> Vec<std::net::TcpListener> {
        Vec::new()
    }

    /// How each requested resource limit is enforced (or why it is not).
    fn limits(&self) -> Vec<limits::Enforcement> {
        Vec::new()
    }

    /// Facts about the started sandbox worth an event (VM boot time, restore repairs).
    fn facts(&self) -> Option<serde_json::Value> {
        None
    }

    /// Blocks until the sandbox is gone and returns how the command ended.
    fn wait(self: Box<Self>) -> Result<ExitReport, SandboxError>;
}

/// Sends signals to a sandbox: through a pidfd (so a recycled pid is never
/// hit), or through the backend's own channel (the vm agent).
#[derive(Clone)]
pub struct Signaller {
    target: SignalTarget,
}

type SignalFn = dyn Fn(i32) -> io::Result<()> + Send + Sync;

#[derive(Clone)]
enum SignalTarget {
    /// The helper's pidfd, and a flag set before each signal (the runtime
    /// signals only to cancel the run).
    Pidfd(std::sync::Arc<std::os::fd::OwnedFd>, std::sync::Arc<std::sync::atomic::AtomicBool>),
    Custom(std::sync::Arc<SignalFn>),
}

impl std::fmt::Debug for Signaller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.target {
            SignalTarget::Pidfd(fd, _) => f.debug_struct("Signaller").field("pidfd", fd).finish(),
            SignalTarget::Custom(_) => f.debug_struct("Signaller").field("custom", &true).finish(),
        }
    }
}

impl Signaller {
    /// A signaller through the pidfd of the sandbox's helper; `signalled`
    /// is set before each signal.
    pub fn pidfd(
        pidfd: std::sync::Arc<std::os::fd::OwnedFd>,
        signalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> Self {
        Self { target: SignalTarget::Pidfd(pidfd, signalled) }
    }

    /// A signaller whose `SIGKILL` must end the whole sandbox at once.
    /// Public for backends outside this crate (tests' fake executors).
    pub fn custom(f: std::sync::Arc<SignalFn>) -> Self {
        Self { target: SignalTarget::Custom(f) }
    }

    /// Forwards `signal` to the sandboxed command.
    pub fn signal(&self, signal: i32) -> io::Result<()> {
        match &self.target {
            SignalTarget::Pidfd(fd, signalled) => {
                signalled.store(true, std::sync::atomic::Ordering::Relaxed);
                sys::pidfd_send_signal(fd, signal)
            }
            SignalTarget::Custom(f) => f(signal),
        }
    }

    /// Kills the whole sandbox at once: every process in it dies with it.
    pub fn kill(&self) -> io::Result<()> {
        self.signal(libc::SIGKILL)
    }
}

/// A backend that could not be prepared (the `vm` guest image is missing,
/// say). It still admits Jobs, so the failure is recorded like any other
/// setup failure, as docs/exit-codes.md promises: `start` returns the
/// preparation error, and the Job ends `failed` with it as its reason.
#[derive(Debug)]
pub struct Unavailable {
    name: &'static str,
    step: String,
    message: String,
    hint: Option<String>,
}

impl Unavailable {
    /// The backend `name`, which failed to prepare with `error`.
    pub fn new(name: &'static str, error: &SandboxError) -> Self {
        let (step, message) = match error {
            SandboxError::Setup { step, message, .. } => (step.clone(), message.clone()),
            other => ("prepare".to_owned(), other.to_string()),
        };
        Self { name, step, message, hint: error.hint().map(str::to_owned) }
    }
}

impl Executor for Unavailable {
    fn name(&self) -> &'static str {
        self.name
    }

    fn start(&self, _spec: &SandboxSpec) -> Result<Box<dyn SandboxProcess>, SandboxError> {
        Err(SandboxError::Setup {
            step: self.step.clone(),
            message: self.message.clone(),
            hint: self.hint.clone(),
        })
    }
}
