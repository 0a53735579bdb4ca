//! One running microVM ([`VmProcess`]): booting or restoring it (disks,
//! QEMU, the agent handshake, the command's exec), forwarding stdin,
//! signalling, and waiting for its end (export, suspension, teardown).

use std::net::TcpListener;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pvisor_agent_proto::Request;

use super::control::serve_control;
use super::link::{AgentEvent, Credit, Shared};
use super::qemu::tail;
use super::start::{self, Scratch, Start};
use super::{checkpoint, export, setup, VmExecutor, EXEC_ID};
use pvisor_sandbox::timing::PhaseClock;
use pvisor_sandbox::{sys, ExitReport, SandboxError, SandboxProcess, SandboxSpec, Signaller, Termination};

/// After a SIGKILL sent through the agent, how long before QEMU itself is killed.
const VM_KILL_GRACE: Duration = Duration::from_secs(5);

/// A running microVM.
#[derive(Debug)]
pub struct VmProcess {
    shared: Arc<Shared>,
    events: Receiver<AgentEvent>,
    boot_ms: u64,
    restored: Option<serde_json::Value>,
    /// How the workspace and userland disks were made (a fresh start; a
    /// restore reuses the checkpoint's).
    disks: start::Prepared,
    /// How this VM started (template restore, boot and why, checkpoint restore).
    start: serde_json::Value,
    /// The command never started (the agent's exec failed).
    early: Option<Termination>,
    /// How long each start step took, for `run --timings`.
    setup_us: Vec<(String, u64)>,
    proxy_listener: Option<TcpListener>,
}

impl VmProcess {
    /// Starts the VM: restores `spec.vm.restore`, else a template, else boots
    /// (always, with `boot_reason`). While a template restore has not yet
    /// reached the command's exec, `restoring` names the template, so a
    /// failure there can be retried as a boot (no user code ran).
    pub(super) fn start(
        executor: &VmExecutor,
        spec: &SandboxSpec,
        boot_reason: Option<String>,
        restoring: &mut Option<String>,
    ) -> Result<Self, SandboxError> {
        let mut clock = PhaseClock::start();
        let checked = start::check(spec)?;
        let mut scratch = Scratch(Vec::new());
        let (start, disks) = start::prepare(executor, spec, &checked, boot_reason, &mut scratch)?;
        clock.mark("disks");
        let config = match &start {
            Start::Restore { manifest, .. } => manifest.machine,
            _ => executor.machine_config(&spec.limits),
        };
        let machine = start::spawn_machine(executor, &checked, &start, &config, &scratch.0)?;
        clock.mark("spawn_qemu");
        let (started, interface) = (machine.started, machine.interface.clone());
        let start::Linked { shared, events, proxy_listener } =
            start::link(executor, spec, &checked, machine, config, &start, scratch.0.clone())?;
        clock.mark("link");
        start::load_state(&shared, &start, started, restoring)?;
        // QEMU holds the template's files now (mapped and read): gc may go.
        let start = start.loaded();
        clock.mark(if matches!(start, Start::Boot { .. }) { "boot" } else { "load_state" });
        start::hello(&shared)?;
        clock.mark("hello");
        let boot_ms = started.elapsed().as_millis() as u64;
        tracing::info!(boot_ms, "agent link up");
        let restored = start::repair(&shared, &start)?;
        clock.mark("repair");
        let mut early = None;
        if !matches!(start, Start::Restore { .. }) {
            // From here on a failure is this Job's (its workspace, its command).
            *restoring = None;
            early = start::run_command(&shared, spec, &checked, interface, &mut clock)?;
        }
        if early.is_none() {
            if spec.output.is_none() {
                forward_stdin(shared.clone());
            } else {
                // A frontend that captures the output gives the command no
                // stdin: this process's stdin is not the command's (an MCP
                // server's is its protocol, which the forwarder would eat).
                let _ = shared.send(&Request::CloseStdin { id: EXEC_ID }, &[]);
            }
            serve_control(shared.clone()).map_err(|e| setup("control-socket", e))?;
        }
        clock.mark("handovers");
        scratch.0.clear(); // `wait` removes them after QEMU is gone
        let setup_us = clock.phases();
        Ok(Self {
            shared,
            events,
            boot_ms,
            restored,
            disks,
            start: start.facts(),
            early,
            setup_us,
            proxy_listener,
        })
    }
}

/// Copies our stdin to the command's stdin; EOF closes it.
fn forward_stdin(shared: Arc<Shared>) {
    let _ = std::thread::Builder::new().name("pvisor-vm-stdin".into()).spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match rustix::io::read(rustix::stdio::stdin(), &mut buf) {
                Err(rustix::io::Errno::INTR) => continue,
                Ok(n) if n > 0 => n,
                _ => {
                    let _ = shared.send(&Request::CloseStdin { id: EXEC_ID }, &[]);
                    return;
                }
            };
            let gone = || *shared.exited.lock().unwrap_or_else(|p| p.into_inner()) || !shared.qemu_running();
            if !shared.credits.take(Credit::Stdin, gone) {
                return;
            }
            if shared.send(&Request::Stdin { id: EXEC_ID }, &buf[..n]).is_err() {
                return;
            }
        }
    });
}

impl SandboxProcess for VmProcess {
    fn take_proxy_listener(&mut self) -> Option<std::net::TcpListener> {
        self.proxy_listener.take()
    }

    fn signaller(&self) -> Signaller {
        let shared = self.shared.clone();
        Signaller::custom(Arc::new(move |signal| {
            if signal == libc::SIGKILL {
                // Kill the command's process group inside the guest, so its
                // staged files can still be exported; if the agent does not
                // deliver within the grace, kill the whole VM.
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name("pvisor-vm-kill".into())
                    .spawn(move || {
                        let sender = shared.clone();
                        let _ =
                            std::thread::Builder::new().name("pvisor-vm-signal".into()).spawn(move || {
                                let _ =
                                    sender.send(&Request::Signal { id: EXEC_ID, signal: libc::SIGKILL }, &[]);
                            });
                        std::thread::sleep(VM_KILL_GRACE);
                        if !*shared.exited.lock().unwrap_or_else(|p| p.into_inner()) && shared.qemu_running()
                        {
                            let _ = sys::pidfd_send_signal(&shared.qemu_pidfd, libc::SIGKILL);
                        }
                    })
                    .map(|_| ())
            } else {
                // Never block the caller (the Session's event loop) on the
                // agent channel; the kill escalation must still fire.
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name("pvisor-vm-signal".into())
                    .spawn(move || {
                        let _ = shared.send(&Request::Signal { id: EXEC_ID, signal }, &[]);
                    })
                    .map(|_| ())
            }
        }))
    }

    fn limits(&self) -> Vec<pvisor_sandbox::limits::Enforcement> {
        let requested = &self.shared.spec.limits;
        let config = &self.shared.config;
        let mut out = Vec::new();
        if let Some(bytes) = requested.memory_bytes {
            out.push(pvisor_sandbox::limits::Enforcement {
                limit: pvisor_sandbox::limits::LimitKind::Memory,
                value: bytes.to_string(),
                by: pvisor_sandbox::limits::Mechanism::Enforced(format!(
                    "guest RAM of {} MiB (the guest kernel's OOM killer acts inside it)",
                    config.memory_mib
                )),
            });
        }
        if let Some(cpus) = requested.cpus {
            out.push(pvisor_sandbox::limits::Enforcement {
                limit: pvisor_sandbox::limits::LimitKind::Cpus,
                value: cpus.to_string(),
                by: pvisor_sandbox::limits::Mechanism::Enforced(format!("{} vCPU(s)", config.cpus)),
            });
        }
        if let Some(pids) = requested.pids {
            out.push(pvisor_sandbox::limits::Enforcement {
                limit: pvisor_sandbox::limits::LimitKind::Pids,
                value: pids.to_string(),
                by: pvisor_sandbox::limits::Mechanism::NotEnforced(
                    "the vm executor does not limit processes inside the guest".into(),
                ),
            });
        }
        out
    }

    fn facts(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({
            "accelerator": self.shared.config.accelerator.as_str(),
            "memory_mib": self.shared.config.memory_mib,
            "cpus": self.shared.config.cpus,
            "image": self.shared.image.digest,
            "ready_ms": self.boot_ms,
            "setup_us": self.setup_us,
            "restored": self.restored,
            "start": self.start,
            "workspace_disks": self.disks.workspace,
            "userland": self.shared.vm.image.as_ref().map(|image| serde_json::json!({
                "name": image.name,
                "digest": image.digest,
                "disks": self.disks.image,
            })),
        }))
    }

    fn wait(self: Box<Self>) -> Result<ExitReport, SandboxError> {
        let shared = self.shared;
        if let Some(termination) = self.early {
            let (_, usage) = shared.quit_and_reap();
            shared.remove_disks();
            return Ok(ExitReport {
                termination,
                usage,
                oom_killed: false,
                interrupted_at_terminal: false,
                stage_error: None,
            });
        }
        let mut oom_killed = false;
        let mut ticks = 0u32;
        let ending = loop {
            match self.events.recv_timeout(Duration::from_millis(100)) {
                Ok(AgentEvent::OomKill) => oom_killed = true,
                Ok(AgentEvent::Exited { code, signal }) => {
                    *shared.exited.lock().unwrap_or_else(|p| p.into_inner()) = true;
                    break Ok((code, signal));
                }
                Ok(AgentEvent::Gone(why)) => break Err(why),
                Err(RecvTimeoutError::Timeout) if shared.qemu_running() => {
                    // Once a second: a VM QEMU stopped on a full disk would
                    // otherwise be waited for for ever.
                    ticks += 1;
                    if ticks.is_multiple_of(10) {
                        if let Some(why) = shared.disk_error() {
                            break Err(why);
                        }
                    }
                }
                Err(_) => break Err("the VM stopped".into()),
            }
        };
        // A checkpoint or suspension in progress finishes first.
        let _op = shared.op.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(manifest) = shared.suspended.lock().unwrap_or_else(|p| p.into_inner()).take() {
            tracing::info!(checkpoint = %manifest.id, "suspend: waiting for QEMU to quit");
            let (qemu, usage) = shared.quit_and_reap();
            // The checkpoint holds its own copies; these were this Attempt's scratch.
            shared.remove_disks();
            return Ok(ExitReport {
                termination: Termination::Suspended { checkpoint: Box::new(manifest), qemu },
                usage,
                oom_killed: false,
                interrupted_at_terminal: false,
                stage_error: None,
            });
        }
        // An export that fails leaves a partial stage: the result says so
        // (the Bundle marks it incomplete), and the guest disk is kept.
        let mut stage_error = None;
        let termination = match ending {
            Ok((code, signal)) => {
                tracing::info!(?code, ?signal, "the command exited in the guest; exporting its staged files");
                let exporting = Instant::now();
                if let Err(e) = export::export_stage(&shared, &shared.spec.upper) {
                    let e = match shared.disk_error() {
                        Some(why) => format!("{why} ({e})"),
                        None => e.to_string(),
                    };
                    tracing::info!(error = %e, "export of the staged files failed");
                    stage_error = Some(format!(
                        "cannot take the staged files out of the VM: {e}; the guest disk is kept at {}",
                        shared.vm.dir.join(checkpoint::UPPER).display()
                    ));
                }
                tracing::debug!(elapsed_ms = exporting.elapsed().as_millis() as u64, "staged files exported");
                match (code, signal) {
                    (Some(code), _) => Termination::Exited(code),
                    (None, Some(signal)) => Termination::Signaled(signal),
                    (None, None) => Termination::Vanished { detail: "the agent reported no status".into() },
                }
            }
            Err(why) => {
                tracing::info!(reason = %why, "the VM ended without the command's exit");
                let console = tail(&shared.vm.dir.join("console.log"), 3);
                if shared.qemu_running() {
                    Termination::Vanished { detail: format!("{why}; console: {console}") }
                } else {
                    // Killed from outside (or by cancellation): nothing left to export.
                    Termination::Signaled(libc::SIGKILL)
                }
            }
        };
        let (_, usage) = shared.quit_and_reap();
        if stage_error.is_none() {
            // The disks are the Attempt's scratch; the stage now holds the result.
            shared.remove_disks();
        }
        Ok(ExitReport { termination, usage, oom_killed, interrupted_at_terminal: false, stage_error })
    }
}
