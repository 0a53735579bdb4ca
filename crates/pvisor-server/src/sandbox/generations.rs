//! One generation of a sandbox: the `pvisor sandbox-supervisor` process
//! the daemon starts for a create or a resume, waiting for it to admit its
//! Job and for the guest to answer, and watching it exit; the entrypoint
//! it then starts is `entrypoint`'s.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pvisor::actions::{Kill, Status};
use pvisor_core::ids::JobId;
use pvisor_core::state::JobState;
use pvisor_core::time::Timestamp;

use crate::guest_link::{self, GuestError};

/// Why a generation (a create or a resume) did not come up; the message
/// becomes the sandbox's `status.message`.
#[derive(Debug, thiserror::Error)]
pub enum GenerationError {
    #[error("the record vanished")]
    RecordVanished,
    #[error("cannot open {}: {source}", path.display())]
    OpenLog {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Policy(#[from] serde_json::Error),
    #[error("cannot start {}: {source}", pvisor.display())]
    Spawn {
        pvisor: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the sandbox supervisor exited before admitting the VM; see {}: {tail}", log.display())]
    NotAdmitted { log: PathBuf, tail: String },
    #[error("the VM did not become ready: {source}; see {}: {tail}", log.display())]
    NotReady {
        #[source]
        source: GuestError,
        log: PathBuf,
        tail: String,
    },
}

use super::{set_state, Binding, Daemon, Generation, OpError, SandboxRecord, SandboxState, READY_TIMEOUT};

impl Daemon {
    /// Starts (or, with `resume`, restores) the sandbox's VM and waits until
    /// its agent answers; then `Running`, or `Failed`/`Paused` saying why.
    pub(super) fn provision(self: &Arc<Self>, id: &str, resume: Option<JobId>) {
        let started = Instant::now();
        let outcome = self.start_generation(id, resume.as_ref());
        self.provisioned(id, resume, outcome, started);
    }

    /// Records the outcome of a generation's start (see [`Self::provision`]).
    pub(super) fn provisioned(
        self: &Arc<Self>,
        id: &str,
        resume: Option<JobId>,
        outcome: Result<u32, GenerationError>,
        started: Instant,
    ) {
        let ready_ms = started.elapsed().as_millis() as u64;
        let Ok(record) = self.get(id) else { return };
        match outcome {
            Ok(attempt) => {
                let first = resume.is_none();
                // Before the sandbox reads Running, so no command a client
                // sends then misses the CA or a resumed vault: a new
                // sandbox gets its CA; a resumed Job's proxy, which started
                // from the last policy change its Trace recorded, gets the
                // vault again (no record holds its values).
                if first {
                    crate::credential_vault::install_ca(self, id, attempt);
                } else {
                    crate::credential_vault::reapply(self, id);
                }
                // Whether a delete arrived while it was starting is decided
                // here, under the records lock, and nowhere later: once it
                // reads Running, the entrypoint may exit at once and its own
                // ending sets Stopping too, which is not a delete.
                let deleted_while_starting: Option<String> = self
                    .update(id, |r| {
                        r.generations.push(Generation {
                            attempt,
                            started_at: Timestamp::now(),
                            ready_ms: Some(ready_ms),
                        });
                        if r.state == SandboxState::Stopping {
                            return Ok(Some(r.reason.clone()));
                        }
                        let reason = if first { "ready" } else { "resumed" };
                        if let Err(e) = set_state(r, SandboxState::Running, reason, "") {
                            tracing::warn!(sandbox = %id, "{e}; the VM is up but not recorded Running");
                        }
                        Ok(None)
                    })
                    // Unrecorded (a full disk): what the state says decides.
                    .unwrap_or_else(|_| {
                        self.get(id).ok().filter(|r| r.state == SandboxState::Stopping).map(|r| r.reason)
                    });
                // Ended with the delete's reason: a user's, or the TTL's.
                if let Some(reason) = deleted_while_starting {
                    self.stop(id, &reason);
                } else if first {
                    if let Err(e) = self.start_entrypoint(id) {
                        tracing::warn!(sandbox = %id, "the entrypoint did not start: {e}");
                    }
                } else {
                    self.follow_entrypoint(id);
                }
            }
            Err(e) => {
                let message = e.to_string();
                tracing::error!(sandbox = %id, "{message}");
                // A supervisor that is still starting the VM must not finish
                // the job for a sandbox recorded as failed.
                let bind = self.bind_file(id);
                if let Some(pid) = record.supervisor.filter(|pid| liveness(*pid, &bind) == Liveness::Alive) {
                    stop_supervisor(pid, &bind);
                }
                let record = self.get(id).unwrap_or(record);
                let job_state = record
                    .job
                    .as_ref()
                    .and_then(|j| self.runtime.execute(Status { job: j.clone() }).ok())
                    .map(|s| s.state);
                if resume.is_some() && job_state == Some(JobState::Suspended) {
                    self.finish(id, SandboxState::Paused, "resume_failed", &message);
                } else {
                    if let Some(job) = &record.job {
                        let _ =
                            self.runtime.execute(Kill { job: job.clone(), grace: Duration::from_secs(10) });
                    }
                    self.finish(id, SandboxState::Failed, "runtime_error", &message);
                }
            }
        }
    }

    pub(super) fn start_generation(
        self: &Arc<Self>,
        id: &str,
        resume: Option<&JobId>,
    ) -> Result<u32, GenerationError> {
        let record = self.get(id).map_err(|_| GenerationError::RecordVanished)?;
        let bind = self.bind_file(id);
        let _ = fs::remove_file(&bind);
        let log_path = self.log_file(id);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|source| GenerationError::OpenLog { path: log_path.clone(), source })?;
        if let super::Supervisors::InProcess(tokio) = &self.supervisors {
            let options = crate::supervisor::SupervisorOptions {
                bind: bind.clone(),
                workspace: resume.is_none().then(|| record.rootfs.clone()),
                memory_mib: record.memory_mib,
                cpus: record.cpus,
                resume: resume.map(|j| j.as_str().to_owned()),
                network_policy: record.network_policy.as_ref().map(serde_json::to_string).transpose()?,
                volumes: (!record.volumes.is_empty())
                    .then(|| serde_json::to_string(&record.volumes))
                    .transpose()?,
            };
            let child = supervise_in_process(self.runtime.clone(), tokio.clone(), options, log)
                .map_err(|source| GenerationError::Spawn { pvisor: "sh".into(), source })?;
            return self.supervised(id, resume, child);
        }
        let mut command = Command::new(&self.config.pvisor);
        command.arg("sandbox-supervisor").arg("--bind").arg(&bind);
        if let Some(level) = &self.config.log_level {
            command.arg("--log-level").arg(level);
        }
        match resume {
            Some(job) => {
                command.arg("--resume").arg(job.as_str());
            }
            None => {
                command
                    .arg("--workspace")
                    .arg(&record.rootfs)
                    .arg("--memory-mib")
                    .arg(record.memory_mib.to_string())
                    .arg("--cpus")
                    .arg(record.cpus.to_string());
                if let Some(policy) = &record.network_policy {
                    command.arg("--network-policy").arg(serde_json::to_string(policy)?);
                }
                if !record.volumes.is_empty() {
                    command.arg("--volumes").arg(serde_json::to_string(&record.volumes)?);
                }
            }
        }
        command
            .env("PVISOR_HOME", &self.config.state_root)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // Its own process group: a Ctrl-C or SIGTERM aimed at the daemon
        // must not reach the VMs (the daemon's shutdown policy decides).
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command
            .spawn()
            .map_err(|source| GenerationError::Spawn { pvisor: self.config.pvisor.clone(), source })?;
        self.supervised(id, resume, child)
    }

    /// Records a started supervisor `child`, watches it, and waits for its
    /// generation to come up.
    fn supervised(
        self: &Arc<Self>,
        id: &str,
        resume: Option<&JobId>,
        mut child: std::process::Child,
    ) -> Result<u32, GenerationError> {
        let pid = child.id();
        // Recorded first, so a daemon that dies now can find this supervisor again.
        let _ = self.update(id, |r| {
            r.supervisor = Some(pid);
            Ok(())
        });
        tracing::info!(sandbox = %id, pid, resume = resume.map(JobId::as_str), "supervisor started");
        let sandbox = id.to_owned();
        std::thread::spawn(move || match child.wait() {
            Ok(status) => tracing::info!(sandbox, pid, %status, "supervisor exited"),
            Err(e) => tracing::warn!(sandbox, pid, "cannot wait for the supervisor: {e}"),
        });
        self.watch(id, pid);
        self.await_generation(id, pid)
    }

    /// Notices when a generation's supervisor exits on its own: a Running
    /// sandbox whose VM ended (a crash, or `kill -9 -1` inside it taking
    /// the Job's keeper) must not stay Running.
    pub(super) fn watch(self: &Arc<Self>, id: &str, pid: u32) {
        let (daemon, id, bind) = (self.clone(), id.to_owned(), self.bind_file(id));
        std::thread::spawn(move || {
            wait_for_exit(pid, &bind);
            let Some(record) = daemon.settled(&id, pid) else { return };
            // A pause, a delete or a later generation accounts for this exit.
            if record.supervisor != Some(pid) || record.state != SandboxState::Running {
                return;
            }
            let state = record
                .job
                .as_ref()
                .and_then(|j| daemon.runtime.execute(Status { job: j.clone() }).ok())
                .map(|s| s.state);
            match state {
                Some(JobState::Suspended) => {
                    daemon.finish(&id, SandboxState::Paused, "paused", "suspended outside the API")
                }
                other => {
                    let what = other.map_or("unknown".to_owned(), |s| s.to_string());
                    let failed = daemon.update(&id, |r| {
                        let ours = r.state == SandboxState::Running && r.supervisor == Some(pid);
                        if ours {
                            let why = format!(
                                "the VM ended on its own (Job {what}); was its keeper killed from inside?"
                            );
                            set_state(r, SandboxState::Failed, "runtime_exited", &why)
                                .map_err(|e| OpError::Conflict(e.to_string()))?;
                        }
                        Ok(ours)
                    });
                    // Nobody will continue it: close the Job and free its disks now.
                    if let (Ok(true), Some(job)) = (failed, &record.job) {
                        daemon.close_and_release(job);
                    }
                }
            }
        });
    }

    /// The record of `id` once it is no longer starting, pausing or
    /// resuming with supervisor `pid` (each of those ends within its own
    /// timeout): a VM that died while its start was being finished must not
    /// be taken for a pause, nor left Running once the start records it so.
    fn settled(&self, id: &str, pid: u32) -> Option<SandboxRecord> {
        let deadline = Instant::now() + 2 * READY_TIMEOUT;
        loop {
            let record = self.get(id).ok()?;
            let settling = matches!(
                record.state,
                SandboxState::Pending | SandboxState::Resuming | SandboxState::Pausing
            );
            if !settling || record.supervisor != Some(pid) || Instant::now() > deadline {
                return Some(record);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for the supervisor `pid` of `id` to admit its Job (the bind
    /// file) and for the guest agent to answer; returns the Attempt number.
    pub(super) fn await_generation(&self, id: &str, pid: u32) -> Result<u32, GenerationError> {
        let record = self.get(id).map_err(|_| GenerationError::RecordVanished)?;
        let (bind, log_path) = (self.bind_file(id), self.log_file(id));
        let read_bind = || fs::read(&bind).ok().and_then(|b| serde_json::from_slice::<Binding>(&b).ok());
        let deadline = Instant::now() + READY_TIMEOUT;
        let binding = loop {
            if let Some(b) = read_bind() {
                break b;
            }
            if Instant::now() > deadline || !supervisor_alive(pid, &bind) {
                // The bind file may have landed just before the exit.
                if let Some(b) = read_bind() {
                    break b;
                }
                let tail = tail(&log_path);
                return Err(GenerationError::NotAdmitted { log: log_path, tail });
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let _ = self.update(id, |r| {
            r.job = Some(binding.job.clone());
            Ok(())
        });
        let supervisor = bind.clone();
        let give_up: pvisor::actions::GiveUp = Box::new(move || {
            (!supervisor_alive(pid, &supervisor)).then(|| "its supervisor exited".to_owned())
        });
        let left = (deadline.saturating_duration_since(Instant::now()), Duration::from_millis(20));
        match guest_link::await_ready(
            &self.runtime,
            &binding.job,
            binding.attempt,
            &record.rootfs,
            left,
            Some(give_up),
        ) {
            Ok(_) => Ok(binding.attempt),
            Err(source) => {
                let tail = tail(&log_path);
                Err(GenerationError::NotReady { source, log: log_path, tail })
            }
        }
    }
}

/// Runs a generation's supervisor on a thread of this process over
/// `runtime` ([`crate::supervisor::Supervisor`], as the supervisor process
/// would), its Session on `tokio`. Returns the placeholder child that
/// stands for it: its command line names the bind file, it exits when the
/// run has ended, and its exit (a stop) cancels the run.
fn supervise_in_process(
    runtime: pvisor::Runtime,
    tokio: tokio::runtime::Handle,
    options: crate::supervisor::SupervisorOptions,
    mut log: fs::File,
) -> std::io::Result<std::process::Child> {
    use std::io::{Read, Write};
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("read line")
        .arg("pvisor-sandbox-supervisor")
        .arg("--bind")
        .arg(&options.bind)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let (Some(hold), Some(mut gone)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(std::io::Error::other("the placeholder has no pipes"));
    };
    std::thread::spawn(move || {
        let started = crate::supervisor::Supervisor::prepare_with(runtime, options).and_then(|supervisor| {
            let _inside = tokio.enter();
            supervisor.start()
        });
        match started {
            Ok(mut run) => {
                let cancel = run.cancel_handle();
                // The placeholder's end (the daemon stopped it) cancels the run.
                std::thread::spawn(move || {
                    let _ = gone.read_to_end(&mut Vec::new());
                    cancel.cancel(libc::SIGTERM);
                });
                let end = tokio.block_on(run.wait());
                let _ = writeln!(log, "the supervised run ended: {end:?}");
            }
            Err(e) => {
                let _ = writeln!(log, "pvisor: {e}");
            }
        }
        drop(hold);
    });
    Ok(child)
}

/// What the host can tell about a supervisor process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Liveness {
    /// Running, and ours.
    Alive,
    /// Gone, a zombie, or some other process now holds the pid.
    Dead,
    /// `/proc` could not be read (out of descriptors or memory): no verdict.
    Unknown,
}

/// Whether `pid` is still this sandbox's supervisor: alive (a zombie is
/// not), and its command line names our bind file (pids are reused). Only
/// a missing process is dead: a read that fails otherwise (EMFILE while
/// clients hold every descriptor) is [`Liveness::Unknown`].
pub(super) fn liveness(pid: u32, bind: &Path) -> Liveness {
    let gone = |e: &std::io::Error| {
        e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
    };
    let stat = match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s,
        Err(e) if gone(&e) => return Liveness::Dead,
        Err(_) => return Liveness::Unknown,
    };
    // After the command name: "<state> <ppid> ...".
    let mut fields = stat.rsplit(')').next().unwrap_or("").split_whitespace();
    let (state, ppid) = (fields.next().unwrap_or("Z"), fields.next().and_then(|p| p.parse::<u32>().ok()));
    if stat.is_empty() || state.starts_with('Z') {
        return Liveness::Dead;
    }
    // A child of this daemon is ours even before it has exec'd (its cmdline
    // is still the daemon's then); after a daemon restart the supervisor is
    // recognised by the bind file on its command line.
    if ppid == Some(std::process::id()) {
        return Liveness::Alive;
    }
    match fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(c) if c.split(|b| *b == 0).any(|arg| arg == bind.as_os_str().as_encoded_bytes()) => {
            Liveness::Alive
        }
        Ok(_) => Liveness::Dead,
        Err(e) if gone(&e) => Liveness::Dead,
        Err(_) => Liveness::Unknown,
    }
}

/// Whether `pid` may still be this sandbox's supervisor: only a definite
/// "dead" is false, so a full descriptor table never ends a wait early.
pub(super) fn supervisor_alive(pid: u32, bind: &Path) -> bool {
    liveness(pid, bind) != Liveness::Dead
}

/// Blocks until the supervisor `pid` has exited. A pidfd (opened once,
/// after the pid was seen to be ours, so it names that very process) turns
/// readable at its exit: no descriptor is needed per check, and a reused pid
/// cannot stand in for it. Without one (an old kernel, or no descriptor to
/// spare yet) `/proc` is polled, and only a definite "dead" counts.
fn wait_for_exit(pid: u32, bind: &Path) {
    let mut pidfd = None;
    loop {
        if pidfd.is_none() {
            if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                pidfd = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok();
            }
        }
        // Checked after the pidfd is open: if the pid is ours now, the pidfd is ours.
        match liveness(pid, bind) {
            Liveness::Dead => return,
            Liveness::Alive | Liveness::Unknown => {}
        }
        match &pidfd {
            Some(fd) => {
                let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
                let timeout = rustix::event::Timespec { tv_sec: 5, tv_nsec: 0 };
                if let Ok(n) = rustix::event::poll(&mut fds, Some(&timeout)) {
                    if n > 0 {
                        return;
                    }
                }
            }
            None => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

/// Asks a supervisor to cancel its Job (SIGTERM: it still publishes a
/// receipt), then SIGKILLs it after 15 s.
pub(super) fn stop_supervisor(pid: u32, bind: &Path) {
    use rustix::process::{kill_process, Pid, Signal};
    // The pid was just checked to be ours; one that is gone already needs nothing.
    let Some(target) = i32::try_from(pid).ok().and_then(Pid::from_raw) else { return };
    let _ = kill_process(target, Signal::TERM);
    let deadline = Instant::now() + Duration::from_secs(15);
    while supervisor_alive(pid, bind) {
        if Instant::now() > deadline {
            let _ = kill_process(target, Signal::KILL);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The live supervisor whose command line names `bind`, if any.
pub(super) fn find_supervisor(bind: &Path) -> Option<u32> {
    fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        (liveness(pid, bind) == Liveness::Alive).then_some(pid)
    })
}

pub(super) fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(3).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_supervisor_is_seen_alive_until_it_exits_and_its_exit_is_noticed_at_once() {
        let bind = Path::new("/nonexistent/sb-test.bind");
        // It exits when told (its stdin closes), not after a fixed time a
        // stalled test thread could outlast.
        let mut child = Command::new("cat").stdin(Stdio::piped()).stdout(Stdio::null()).spawn().unwrap();
        let pid = child.id();
        assert_eq!(liveness(pid, bind), Liveness::Alive, "a child of the daemon is ours");
        // Another process is never taken for a supervisor.
        assert_eq!(liveness(1, bind), Liveness::Dead);
        drop(child.stdin.take());
        let started = Instant::now();
        wait_for_exit(pid, bind);
        // The pidfd turns readable at the exit (a zombie until reaped).
        assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
        assert_eq!(liveness(pid, bind), Liveness::Dead);
        child.wait().unwrap();
        assert_eq!(liveness(pid, bind), Liveness::Dead);
    }
}
