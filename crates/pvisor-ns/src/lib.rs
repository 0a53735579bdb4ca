//! pvisor-ns: the `ns` executor, Linux namespaces plus an overlayfs workspace.
//!
//! Boundary: this crate implements `pvisor-sandbox`'s [`Executor`] with a
//! process tree in its own namespaces; it offers none of the capabilities of
//! a running sandbox (no checkpoints, no agent). It does not know the `vm`
//! backend, nor Jobs and records (the runtime, `pvisor`, does). Binaries
//! that embed it call [`maybe_run_helper`] first thing in `main`.
//!
//! The supervisor side (this file) re-executes the current binary as the
//! helper (`helper.rs`), hands it the [`SandboxSpec`] over a pipe, and reads
//! the helper's [`Report`]s until the sandbox is gone. Starting returns once
//! the sandbox reports `Ready` or a precise setup error.

// Unit tests write fixtures and print freely.
#![cfg_attr(test, allow(clippy::disallowed_methods, clippy::disallowed_macros))]

mod command;
pub mod diagnose;
mod helper;
mod host_view;
mod init;
mod memory_stage;
mod mounts;
mod protocol;
mod sanitise;
mod seccomp;
mod stdio;
mod terminal;

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use protocol::{Report, FD_PASS_FD, REPORT_FD, SPEC_FD};

use pvisor_sandbox::{
    sys, Executor, ExitReport, SandboxError, SandboxProcess, SandboxSpec, Signaller, Termination, Usage,
};

/// The hidden first argument that turns the binary into the sandbox helper.
pub const HELPER_ARG: &str = "__pvisor-ns-helper";

/// Runs the sandbox helper and exits if this process was started as one.
///
/// Call it first thing in `main`, before any thread is spawned: the helper
/// forks and must be single-threaded.
pub fn maybe_run_helper() {
    if std::env::args_os().nth(1).is_some_and(|a| a == HELPER_ARG) {
        helper::main();
    }
}

/// The namespace executor. Stateless: each [`start`](Executor::start) is independent.
#[derive(Debug, Default, Clone, Copy)]
pub struct NsExecutor;

impl Executor for NsExecutor {
    fn name(&self) -> &'static str {
        "ns"
    }

    fn start(&self, spec: &SandboxSpec) -> Result<Box<dyn SandboxProcess>, SandboxError> {
        let mut clock = pvisor_sandbox::timing::PhaseClock::start();
        let (spec_read, spec_write) = sys::pipe().map_err(SandboxError::Spawn)?;
        let (report_read, report_write) = sys::pipe().map_err(SandboxError::Spawn)?;
        // Move the helper's ends above the fixed slots so dup2 cannot clobber them.
        let (fd_pass, fd_pass_child) = std::os::unix::net::UnixStream::pair().map_err(SandboxError::Spawn)?;
        let spec_read = dup_above(&spec_read, 10)?;
        let report_write = dup_above(&report_write, 10)?;
        let fd_pass_child = dup_above(&OwnedFd::from(fd_pass_child), 10)?;
        let (spec_fd, report_fd, pass_fd) =
            (spec_read.as_raw_fd(), report_write.as_raw_fd(), fd_pass_child.as_raw_fd());

        // Where the user's terminal is on fd 0–2, the command gets the
        // sandbox's own terminal (foreground, stdin a terminal), /dev/null
        // (stdin of a background run) or a pipe relayed to it (stdout,
        // stderr): never the terminal itself (see terminal.rs). Nor does it
        // get a host file there: see stdio.rs.
        // Captured output (an MCP server's run) never gets a terminal.
        let terminal = spec.output.is_none() && stdin_is_foreground_tty();
        let planned = match &spec.output {
            Some(output) => stdio::plan_captured(output),
            None => stdio::plan(terminal),
        };
        let stdio::Plan { stdio, null_fds, outputs: output_relays, input: input_relay } =
            planned.map_err(SandboxError::Spawn)?;
        let [stdin, stdout, stderr]: [Stdio; 3] =
            stdio.try_into().map_err(|_| SandboxError::Protocol("fds 0–2 were not all planned".into()))?;
        let mut command = Command::new("/proc/self/exe");
        command.arg0("pvisor-sandbox").arg(HELPER_ARG).env_clear().stdin(stdin).stdout(stdout).stderr(stderr);
        // SAFETY: dup2 is async-signal-safe; both descriptors are open in the child.
        unsafe {
            command.pre_exec(move || {
                if libc::dup2(spec_fd, SPEC_FD) < 0
                    || libc::dup2(report_fd, REPORT_FD) < 0
                    || libc::dup2(pass_fd, FD_PASS_FD) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().map_err(SandboxError::Spawn)?;
        // Our copies of the pipes' write ends go, so a relay ends with the sandbox.
        drop(command);
        drop(spec_read);
        drop(report_write);
        drop(fd_pass_child);
        let pidfd = sys::pidfd_open(child.id() as libc::pid_t).map_err(SandboxError::Spawn)?;
        clock.mark("spawn_helper");

        let mut limits = pvisor_sandbox::limits::apply(&spec.limits, &cgroup_name(spec));
        if let Some(bytes) = spec.limits.disk_bytes {
            limits.report.push(pvisor_sandbox::limits::disk(bytes));
        }
        clock.mark("cgroup_create");
        let mut sandbox = spec.clone();
        let cache_locks = lock_caches(&mut sandbox.caches);
        let helper_spec = helper::HelperSpec {
            cgroup_join: std::mem::take(&mut limits.join),
            rlimits: std::mem::take(&mut limits.rlimits),
            sandbox,
            supervisor_pid: std::process::id() as i32,
            terminal,
            null_fds,
        };
        let bytes = serde_json::to_vec(&helper_spec)
            .map_err(|e| SandboxError::Protocol(format!("cannot encode the sandbox spec: {e}")))?;
        // A helper that died early closes its end; its report says why.
        let _ = File::from(spec_write).write_all(&bytes);

        let cancelled = Arc::new(AtomicBool::new(false));
        let mut process = NsProcess {
            limits,
            fd_pass,
            proxy_listener: None,
            forward_listeners: Vec::new(),
            child,
            reports: BufReader::new(File::from(report_read)),
            signaller: Signaller::pidfd(Arc::new(pidfd), cancelled.clone()),
            cancelled,
            relay: None,
            output_relays,
            input_relay,
            sockets_reachable: Vec::new(),
            exposed_sockets: spec.exposed_sockets.clone(),
            cache_locks,
            setup_us: Vec::new(),
        };
        clock.mark("send_spec");
        match process.next_report()? {
            Some(Report::Ready { sockets_reachable, setup_us }) => {
                clock.mark("sandbox_ready");
                process.sockets_reachable = sockets_reachable;
                process.take_handovers(spec.network, &spec.loopback_forwards, helper_spec.terminal)?;
                clock.mark("handovers");
                // The supervisor's steps, with init's (inside its wait for
                // `Ready`) after them.
                process.setup_us = clock.phases();
                process.setup_us.extend(setup_us.into_iter().map(|(name, us)| (format!("init.{name}"), us)));
                Ok(Box::new(process))
            }
            Some(Report::SetupError { step, message, hint }) => {
                let _ = process.child.wait();
                process.restore_terminal();
                Err(SandboxError::Setup { step, message, hint })
            }
            Some(other) => Err(SandboxError::Protocol(format!("unexpected first report {other:?}"))),
            None => {
                let status = process.child.wait().map_err(SandboxError::Wait)?;
                Err(SandboxError::Protocol(format!(
                    "the helper exited ({status}) before the sandbox was ready"
                )))
            }
        }
    }
}

impl NsProcess {
    /// Receives what the helper hands over once the sandbox is ready: the
    /// proxy listener made in its network namespace, one listener per
    /// forwarded loopback port (in the spec's order), and its terminal,
    /// whose output is then relayed to the user's.
    fn take_handovers(
        &mut self,
        network: pvisor_sandbox::NetworkAttachment,
        forwards: &[pvisor_core::records::LoopbackForward],
        terminal: bool,
    ) -> Result<(), SandboxError> {
        if let pvisor_sandbox::NetworkAttachment::ProxyListener { .. } = network {
            let fd = sys::recv_fd(&self.fd_pass)
                .map_err(|e| SandboxError::Protocol(format!("cannot receive the proxy listener: {e}")))?
                .ok_or_else(|| {
                    SandboxError::Protocol("the sandbox did not hand over its proxy listener".into())
                })?;
            self.proxy_listener = Some(std::net::TcpListener::from(fd));
            for forward in forwards {
                // None: the namespace had no such address (see `init.rs`).
                let fd = sys::recv_fd(&self.fd_pass).map_err(|e| {
                    SandboxError::Protocol(format!("cannot receive the listener on {}: {e}", forward.listen))
                })?;
                self.forward_listeners.extend(fd.map(std::net::TcpListener::from));
            }
        }
        if terminal {
            let master = sys::recv_fd(&self.fd_pass)
                .map_err(|e| SandboxError::Protocol(format!("cannot receive the sandbox's terminal: {e}")))?
                .ok_or_else(|| SandboxError::Protocol("the sandbox did not hand over its terminal".into()))?;
            // What the sandbox's terminal prints goes to the user's
            // terminal: stdout if it is that one, else stderr, else stdin.
            let output =
                [1, 2].into_iter().find(|&fd| stdio::is_stdins_terminal(sys::stdio(fd))).unwrap_or(0);
            self.relay = Some(terminal::Relay::start(master, sys::stdio(output)));
        }
        Ok(())
    }
}

/// A cgroup name unique to this start: the stage's run directory, else pid and time.
fn cgroup_name(spec: &SandboxSpec) -> String {
    let run = spec
        .upper
        .parent()
        .and_then(Path::parent)
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned());
    run.unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!("pvisor-{}-{nanos}", std::process::id())
    })
}

fn dup_above(fd: &OwnedFd, min: i32) -> Result<OwnedFd, SandboxError> {
    rustix::io::fcntl_dupfd_cloexec(fd, min).map_err(|e| SandboxError::Spawn(e.into()))
}

/// Whether stdin is a terminal whose foreground process group is ours; only
/// then does the command get a terminal of its own, relayed to the user's (a
/// background pvisor must not put the user's terminal in raw mode).
fn stdin_is_foreground_tty() -> bool {
    let stdin = rustix::stdio::stdin();
    rustix::termios::isatty(stdin) && rustix::termios::tcgetpgrp(stdin) == Ok(rustix::process::getpgrp())
}

/// Takes each cache store for this run (`flock` on `use.lock`, never
/// waiting): one that another run holds is marked non-persistent, and the
/// run gets a private, throw-away layer for it instead.
fn lock_caches(caches: &mut [pvisor_sandbox::CacheMount]) -> Vec<(std::path::PathBuf, File)> {
    let mut held = Vec::new();
    for cache in caches.iter_mut() {
        cache.persistent = match pvisor_sandbox::CacheMount::hold(&cache.store) {
            Some(file) => {
                held.push((cache.path.clone(), file));
                true
            }
            None => {
                let _ = std::fs::create_dir_all(&cache.scratch);
                false
            }
        };
    }
    held
}

/// A running `ns` sandbox.
#[derive(Debug)]
struct NsProcess {
    /// The run's cgroups (removed when the sandbox is gone).
    limits: pvisor_sandbox::limits::Applied,
    /// The supervisor's end of the descriptor-passing socket.
    fd_pass: std::os::unix::net::UnixStream,
    proxy_listener: Option<std::net::TcpListener>,
    /// The listeners of the forwarded loopback ports, made in the same namespace.
    forward_listeners: Vec<std::net::TcpListener>,
    child: Child,
    reports: BufReader<File>,
    signaller: Signaller,
    /// The relay to the sandbox's own terminal, when stdin is the user's.
    relay: Option<terminal::Relay>,
    /// Copies of the command's stdout/stderr to pvisor's (see stdio.rs).
    output_relays: Vec<terminal::PipeRelay>,
    /// The copy of pvisor's stdin to the command's, if it is relayed.
    input_relay: Option<stdio::InputRelay>,
    /// Set once the run is being cancelled (the runtime signals the
    /// sandbox only then): the output relays stop waiting on a destination
    /// that takes nothing more.
    cancelled: Arc<AtomicBool>,
    /// Host mounts whose sockets the command can still reach (see `host_view.rs`).
    sockets_reachable: Vec<std::path::PathBuf>,
    /// How long each setup step took, in µs, in order (`run --timings`).
    setup_us: Vec<(String, u64)>,
    exposed_sockets: Vec<std::path::PathBuf>,
    /// Each cache store this run holds (`flock`), with its path; released
    /// when the sandbox is gone.
    cache_locks: Vec<(std::path::PathBuf, File)>,
}

impl NsProcess {
    fn next_report(&mut self) -> Result<Option<Report>, SandboxError> {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self
                .reports
                .read_line(&mut line)
                .map_err(|e| SandboxError::Protocol(format!("cannot read the helper's report: {e}")))?;
            if n == 0 {
                return Ok(None);
            }
            if line.trim().is_empty() {
                continue;
            }
            return serde_json::from_str(&line)
                .map(Some)
                .map_err(|e| SandboxError::Protocol(format!("bad report {line:?}: {e}")));
        }
    }

    /// Stops relaying the sandbox's terminal and restores the user's; waits
    /// until the command's relayed output has been copied. The stdin relay
    /// is stopped, never waited for.
    fn restore_terminal(&mut self) {
        if let Some(mut input) = self.input_relay.take() {
            input.stop();
        }
        if let Some(mut relay) = self.relay.take() {
            relay.finish();
        }
        for relay in &mut self.output_relays {
            relay.finish(&self.cancelled);
        }
    }
}

impl SandboxProcess for NsProcess {
    fn signaller(&self) -> Signaller {
        self.signaller.clone()
    }

    fn limits(&self) -> Vec<pvisor_sandbox::limits::Enforcement> {
        self.limits.report.clone()
    }

    fn take_proxy_listener(&mut self) -> Option<std::net::TcpListener> {
        self.proxy_listener.take()
    }

    fn take_forward_listeners(&mut self) -> Vec<std::net::TcpListener> {
        std::mem::take(&mut self.forward_listeners)
    }

    fn facts(&self) -> Option<serde_json::Value> {
        let host_sockets = if self.sockets_reachable.is_empty() {
            "unreachable: every host filesystem is shown through a read-only overlay"
        } else {
            "reachable under the listed mounts, which the kernel would not show through an overlay"
        };
        let persistent: Vec<&std::path::PathBuf> = self.cache_locks.iter().map(|(p, _)| p).collect();
        Some(serde_json::json!({
            "host_sockets": host_sockets,
            "sockets_reachable_under": self.sockets_reachable,
            "exposed_sockets": self.exposed_sockets,
            "caches_persistent": persistent,
            "setup_us": self.setup_us,
        }))
    }

    fn wait(mut self: Box<Self>) -> Result<ExitReport, SandboxError> {
        let mut exec_error = None;
        let mut exit = None;
        let mut stage_error = None;
        while let Some(report) = self.next_report()? {
            match report {
                Report::ExecError { program, errno } => exec_error = Some((program, errno)),
                Report::Exit { code, signal, user_us, system_us, max_rss_kib, stage_error: lost } => {
                    stage_error = lost;
                    exit = Some((
                        code,
                        signal,
                        Usage {
                            user_cpu: Duration::from_micros(user_us),
                            system_cpu: Duration::from_micros(system_us),
                            max_rss_kib,
                        },
                    ))
                }
                Report::SetupError { step, message, hint } => {
                    let _ = self.child.wait();
                    self.restore_terminal();
                    return Err(SandboxError::Setup { step, message, hint });
                }
                Report::Ready { .. } => {}
            }
        }
        let status = self.child.wait().map_err(SandboxError::Wait)?;
        let interrupted_at_terminal = self.relay.as_ref().is_some_and(|r| r.interrupt_typed());
        self.restore_terminal();
        let oom_killed = self.limits.oom_killed();
        self.limits.remove();
        let (termination, usage) = match (exec_error, exit) {
            (Some((program, errno)), exit) => {
                let message = std::io::Error::from_raw_os_error(errno).to_string();
                let usage = exit.map(|(_, _, u)| u).unwrap_or_default();
                (Termination::ExecFailed { program, errno, message }, usage)
            }
            (None, Some((Some(code), _, usage))) => (Termination::Exited(code), usage),
            (None, Some((None, Some(signal), usage))) => (Termination::Signaled(signal), usage),
            (None, Some((None, None, usage))) => {
                (Termination::Vanished { detail: "init reported no status".into() }, usage)
            }
            // Killed from outside before init could report: the whole pid namespace died.
            (None, None) => match status.signal() {
                Some(signal) => (Termination::Signaled(signal), Usage::default()),
                None => (
                    Termination::Vanished {
                        detail: format!("the sandbox helper exited ({status}) without a report"),
                    },
                    Usage::default(),
                ),
            },
        };
        Ok(ExitReport { termination, usage, oom_killed, interrupted_at_terminal, stage_error })
    }
}
