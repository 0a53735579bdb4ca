//! The sandbox side of the `ns` executor: a freshly exec'd, single-threaded
//! copy of the binary that builds the namespaces.
//!
//! Process tree and protocol:
//! 1. **helper** (host namespaces): reads its [`HelperSpec`], blocks the
//!    forwarded signals, and `clone(2)`s *init* into new user, mount, pid, ipc,
//!    uts and net namespaces. It writes init's uid/gid maps from outside (only
//!    the parent namespace may map a full range), then releases init through
//!    the `go` pipe and forwards every signal it receives to init.
//! 2. **init** (pid 1 in the sandbox): assembles the filesystem
//!    (`mounts.rs`) while the helper moves it into the run's cgroups, waits
//!    for that, brings up loopback, reports `Ready`, forks the command,
//!    forwards signals to it, reaps every orphan, and reports the command's
//!    exit. When init exits the kernel kills everything left in the pid
//!    namespace, so no sandboxed process outlives the command.
//! 3. **command** (pid 2): joins the terminal's foreground or a new session,
//!    restores default signal handling, sets `no_new_privs` and execs.
//!
//! Helper and init both die with their parent (`PR_SET_PDEATHSIG`), so killing
//! the supervisor kills the whole sandbox.
//!
//! This file is step 1 and what all three share; init is in `init.rs`, the
//! command's last steps before `execvp` in `command.rs`.

use std::fs::File;
use std::io::Read;
use std::os::fd::FromRawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::diagnose;
use super::init::init;
use super::protocol::{inherited, Report, FD_PASS_FD, REPORT_FD, SPEC_FD};
use pvisor_sandbox::{sys, NetworkAttachment, SandboxSpec};

/// What the supervisor tells the helper, on [`SPEC_FD`].
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct HelperSpec {
    pub sandbox: SandboxSpec,
    /// The supervisor's pid, to detect having been orphaned before `PR_SET_PDEATHSIG`.
    pub supervisor_pid: i32,
    /// Whether stdin is the user's terminal (and pvisor its foreground job):
    /// then the command gets a pseudo-terminal of its own, relayed by the
    /// supervisor, instead of the user's terminal.
    pub terminal: bool,
    /// Which of fds 0–2 the command reopens as the sandbox's `/dev/null`
    /// (see `stdio.rs`): a background job's terminal stdin (keystrokes meant
    /// for the foreground), pvisor's own `/dev/null`, a directory.
    pub null_fds: Vec<i32>,
    /// `cgroup.procs` files to join before the namespaces are made.
    pub cgroup_join: Vec<PathBuf>,
    /// `(resource, value)` rlimits, where no cgroup could enforce a limit.
    pub rlimits: Vec<(u32, u64)>,
}

/// Signals the helper and init pass on to the command instead of acting on them.
pub(super) const FORWARDED: [i32; 10] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
    libc::SIGCONT,
    libc::SIGALRM,
    libc::SIGPIPE,
];

/// Exit code of a helper that failed before the command could run.
pub(super) const SETUP_FAILED: i32 = 125;

/// A failed setup step, reported to the supervisor as [`Report::SetupError`].
#[derive(Debug)]
pub(crate) struct StepError {
    pub step: &'static str,
    pub message: String,
    pub hint: Option<String>,
}

impl StepError {
    pub(crate) fn new(step: &'static str, message: impl Into<String>) -> Self {
        Self { step, message: message.into(), hint: None }
    }
    pub(crate) fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
    pub(super) fn report_and_exit(self) -> ! {
        Report::SetupError { step: self.step.into(), message: self.message, hint: self.hint }.send();
        exit(SETUP_FAILED)
    }
}

pub(super) fn exit(code: i32) -> ! {
    // SAFETY: _exit never returns; nothing in this process needs flushing.
    // Raw `libc`: rustix has `exit_group` only in its unstable runtime API.
    unsafe { libc::_exit(code) }
}

/// The helper's entry point. Never returns.
pub(crate) fn main() -> ! {
    // The supervisor placed the report pipe at REPORT_FD; mark it
    // close-on-exec so the command never inherits it.
    for fd in [REPORT_FD, FD_PASS_FD] {
        let _ = rustix::io::fcntl_setfd(inherited(fd), rustix::io::FdFlags::CLOEXEC);
    }
    let spec = match read_spec() {
        Ok(spec) => spec,
        Err(e) => e.report_and_exit(),
    };
    // Every other descriptor pvisor was started with stays out of the sandbox:
    // an inherited directory descriptor would be a way back into the host's
    // writable tree (openat(fd, "..")), the runc CVE-2024-21626 class.
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags (raw:
    // rustix has no close_range).
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    match run_helper(spec) {
        Ok(never) => match never {},
        Err(e) => e.report_and_exit(),
    }
}

fn read_spec() -> Result<HelperSpec, StepError> {
    // SAFETY: the supervisor dup'ed the spec pipe onto SPEC_FD for us alone.
    let mut file = unsafe { File::from_raw_fd(SPEC_FD) };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| StepError::new("helper", format!("cannot read the sandbox spec: {e}")))?;
    serde_json::from_slice(&bytes).map_err(|e| StepError::new("helper", format!("invalid sandbox spec: {e}")))
}

enum Never {}

fn run_helper(spec: HelperSpec) -> Result<Never, StepError> {
    let helper_err = |what: &str, e: std::io::Error| StepError::new("helper", format!("{what}: {e}"));
    sys::die_with_parent().map_err(|e| helper_err("PR_SET_PDEATHSIG", e))?;
    if rustix::process::Pid::as_raw(rustix::process::getppid()) != spec.supervisor_pid {
        exit(SETUP_FAILED);
    }
    let mut waited: Vec<i32> = FORWARDED.to_vec();
    waited.push(libc::SIGCHLD);
    let mask = sys::sigset(&waited);
    sys::set_sigmask(libc::SIG_BLOCK, &mask).map_err(|e| helper_err("sigprocmask", e))?;

    let (go_read, go_write) = sys::pipe().map_err(|e| helper_err("pipe", e))?;
    let (uid, gid) = (rustix::process::getuid().as_raw(), rustix::process::getgid().as_raw());

    let mut flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    if spec.sandbox.network != NetworkAttachment::Host {
        flags |= libc::CLONE_NEWNET;
    }
    // SAFETY: a fork-style clone (no CLONE_VM, no new stack) of a single-threaded
    // process: the child continues on a private copy of this stack. Raw
    // `libc`: rustix has no clone with namespace flags.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        return Err(diagnose::clone_failure(std::io::Error::last_os_error()));
    }
    if pid == 0 {
        drop(go_write);
        init(spec, go_read);
    }
    let pid = pid as libc::pid_t;
    let child = sys::pid(pid).map_err(|e| helper_err("clone", e))?;
    drop(go_read);
    if let Err(e) = write_id_maps(pid, uid, gid) {
        // `pid` is our unreaped child, so it cannot have been recycled.
        let _ = rustix::process::kill_process(child, rustix::process::Signal::KILL);
        return Err(e);
    }
    let _ = sys::write_all(&go_write, b"1");
    // Init builds the sandbox's filesystem while it is moved into the run's
    // cgroups: on cgroup v1 each move waits for an RCU grace period (~7 ms
    // here), which this overlaps with the mounts. Init forks the command
    // only after the second byte, so every sandboxed process is inside.
    for procs in &spec.cgroup_join {
        #[allow(clippy::disallowed_methods)] // a cgroup's procs file, not a record
        if let Err(e) = std::fs::write(procs, pid.to_string()) {
            let _ = rustix::process::kill_process(child, rustix::process::Signal::KILL);
            return Err(StepError::new("limits", format!("cannot join {}: {e}", procs.display())));
        }
    }
    let _ = sys::write_all(&go_write, b"2");
    drop(go_write);

    loop {
        let sig = sys::sigwait(&mask).map_err(|e| helper_err("sigwaitinfo", e))?;
        if sig != libc::SIGCHLD {
            // `pid` is our child and not yet reaped, so it cannot be recycled.
            if let Ok(sig) = sys::signal(sig) {
                let _ = rustix::process::kill_process(child, sig);
            }
            continue;
        }
        if let Ok(Some((_, status))) =
            rustix::process::waitpid(Some(child), rustix::process::WaitOptions::NOHANG)
        {
            exit(status_to_code(status.as_raw()));
        }
    }
}

pub(super) fn status_to_code(status: i32) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    }
}

/// Maps the caller's ids into the sandbox. As root (of whatever namespace
/// pvisor itself runs in) every id that exists here is mapped to itself —
/// the whole range on a host, only what the outer namespace has when pvisor
/// is nested. Otherwise only the caller's own uid and gid (the unprivileged rule).
#[allow(clippy::disallowed_methods)] // /proc id maps, not records
fn write_id_maps(pid: libc::pid_t, uid: u32, gid: u32) -> Result<(), StepError> {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let write = |file: &str, contents: String| {
        std::fs::write(proc_dir.join(file), contents.as_bytes()).map_err(|e| {
            StepError::new("id-map", format!("cannot write /proc/{pid}/{file} ({contents:?}): {e}"))
                .hint("the kernel refused the user-namespace id mapping; check user.max_user_namespaces and any LSM restricting user namespaces")
        })
    };
    let identity = |own: &str| -> Option<String> {
        let text = std::fs::read_to_string(format!("/proc/self/{own}")).ok()?;
        let lines: Vec<String> = text
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 3).then(|| format!("{} {} {}", f[0], f[0], f[2]))
            })
            .collect();
        (!lines.is_empty()).then(|| lines.join("\n") + "\n")
    };
    match (uid, identity("uid_map"), identity("gid_map")) {
        (0, Some(uids), Some(gids)) => {
            write("uid_map", uids)?;
            write("gid_map", gids)?;
        }
        _ => {
            write("uid_map", format!("{uid} {uid} 1\n"))?;
            write("setgroups", "deny\n".into())?;
            write("gid_map", format!("{gid} {gid} 1\n"))?;
        }
    }
    Ok(())
}

/// Returns `path` re-rooted under `root` (`/a/b` → `<root>/a/b`).
pub(crate) fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}
