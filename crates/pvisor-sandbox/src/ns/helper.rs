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

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::protocol::{Report, FD_PASS_FD, REPORT_FD, SPEC_FD};
use super::{diagnose, memory_stage, mounts};
use crate::{sys, NetworkAttachment, SandboxSpec};

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
    /// stdin is the user's terminal but pvisor is a background job: the
    /// command must not read keystrokes meant for the foreground; it gets
    /// /dev/null instead.
    pub detach_stdin: bool,
    /// `cgroup.procs` files to join before the namespaces are made.
    pub cgroup_join: Vec<PathBuf>,
    /// `(resource, value)` rlimits, where no cgroup could enforce a limit.
    pub rlimits: Vec<(u32, u64)>,
}

/// Signals the helper and init pass on to the command instead of acting on them.
const FORWARDED: [i32; 10] = [
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
const SETUP_FAILED: i32 = 125;

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
    fn report_and_exit(self) -> ! {
        Report::SetupError { step: self.step.into(), message: self.message, hint: self.hint }.send();
        exit(SETUP_FAILED)
    }
}

fn exit(code: i32) -> ! {
    // SAFETY: _exit never returns; nothing in this process needs flushing.
    unsafe { libc::_exit(code) }
}

/// The helper's entry point. Never returns.
pub(crate) fn main() -> ! {
    // SAFETY: the supervisor placed the report pipe at REPORT_FD; mark it
    // close-on-exec so the command never inherits it.
    unsafe {
        libc::fcntl(REPORT_FD, libc::F_SETFD, libc::FD_CLOEXEC);
        libc::fcntl(FD_PASS_FD, libc::F_SETFD, libc::FD_CLOEXEC);
    }
    let spec = match read_spec() {
        Ok(spec) => spec,
        Err(e) => e.report_and_exit(),
    };
    // Every other descriptor pvisor was started with stays out of the sandbox:
    // an inherited directory descriptor would be a way back into the host's
    // writable tree (openat(fd, "..")), the runc CVE-2024-21626 class.
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags.
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
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } != spec.supervisor_pid {
        exit(SETUP_FAILED);
    }
    let mut waited: Vec<i32> = FORWARDED.to_vec();
    waited.push(libc::SIGCHLD);
    let mask = sys::sigset(&waited);
    sys::set_sigmask(libc::SIG_BLOCK, &mask).map_err(|e| helper_err("sigprocmask", e))?;

    let (go_read, go_write) = sys::pipe().map_err(|e| helper_err("pipe", e))?;
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };

    let mut flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    if spec.sandbox.network != NetworkAttachment::Host {
        flags |= libc::CLONE_NEWNET;
    }
    // SAFETY: a fork-style clone (no CLONE_VM, no new stack) of a single-threaded
    // process: the child continues on a private copy of this stack.
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
    drop(go_read);
    if let Err(e) = write_id_maps(pid, uid, gid) {
        // SAFETY: `pid` is our unreaped child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        return Err(e);
    }
    let _ = sys::write_all(go_write.as_raw_fd(), b"1");
    // Init builds the sandbox's filesystem while it is moved into the run's
    // cgroups: on cgroup v1 each move waits for an RCU grace period (~7 ms
    // here), which this overlaps with the mounts. Init forks the command
    // only after the second byte, so every sandboxed process is inside.
    for procs in &spec.cgroup_join {
        if let Err(e) = std::fs::write(procs, pid.to_string()) {
            // SAFETY: `pid` is our unreaped child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return Err(StepError::new("limits", format!("cannot join {}: {e}", procs.display())));
        }
    }
    let _ = sys::write_all(go_write.as_raw_fd(), b"2");
    drop(go_write);

    loop {
        let sig = sys::sigwait(&mask).map_err(|e| helper_err("sigwaitinfo", e))?;
        if sig != libc::SIGCHLD {
            // SAFETY: `pid` is our child and not yet reaped, so it cannot be recycled.
            unsafe { libc::kill(pid, sig) };
            continue;
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            exit(status_to_code(status));
        }
    }
}

fn status_to_code(status: i32) -> i32 {
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

/// pid 1 of the sandbox. Never returns.
fn init(spec: HelperSpec, go_read: OwnedFd) -> ! {
    if sys::die_with_parent().is_err() {
        exit(SETUP_FAILED);
    }
    let mut go = [0u8; 1];
    // SAFETY: reading one byte into a local buffer.
    let n = unsafe { libc::read(go_read.as_raw_fd(), go.as_mut_ptr().cast(), 1) };
    if n != 1 {
        // The helper died or gave up mapping ids; it reported why.
        exit(SETUP_FAILED);
    }
    // Rlimits are set here, inside the new user namespace: set before the
    // clone, RLIMIT_NPROC would count every process the uid has on the host.
    for &(resource, value) in &spec.rlimits {
        let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
        // SAFETY: setrlimit with a valid resource number and struct.
        if unsafe { libc::setrlimit(resource as _, &limit) } != 0 {
            StepError::new(
                "limits",
                format!("cannot set rlimit {resource}: {}", std::io::Error::last_os_error()),
            )
            .report_and_exit();
        }
    }
    let mounts::Assembled { view, memory_stage } = match mounts::assemble(&spec.sandbox) {
        Ok(assembled) => assembled,
        Err(e) => e.report_and_exit(),
    };
    if let Err(e) = set_hostname(&spec.sandbox.hostname).and_then(|()| attach_network(spec.sandbox.network)) {
        e.report_and_exit();
    }
    // The command cannot read init's descriptors (the user's terminal among them)
    // through /proc/1/fd.
    // SAFETY: a plain prctl.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    let mut command = Command::prepare(&spec);
    if spec.sandbox.seccomp {
        match super::seccomp::build() {
            Ok(filters) => command.seccomp = Some(filters),
            Err(e) => StepError::new("seccomp", format!("cannot build the seccomp filter: {e}"))
                .hint("run with --no-seccomp to go without it (recorded as such)")
                .report_and_exit(),
        }
    }
    if spec.terminal {
        match open_pty() {
            Ok(slave) => command.pty_slave = Some(slave),
            Err(e) => e.report_and_exit(),
        }
    }
    // The helper has moved init into the run's cgroups (see run_helper).
    // SAFETY: reading one byte into a local buffer.
    let n = unsafe { libc::read(go_read.as_raw_fd(), go.as_mut_ptr().cast(), 1) };
    drop(go_read);
    if n != 1 {
        // The helper could not join a cgroup (it reported why) or died.
        exit(SETUP_FAILED);
    }
    // Bounded so the report stays one atomic pipe write.
    let sockets_reachable = view.sockets_reachable.into_iter().take(16).collect();
    Report::Ready { sockets_reachable }.send();

    if let Some(at) = spec.sandbox.start_at_coarse_ns {
        wait_for_coarse_clock(at);
    }
    // SAFETY: init is single-threaded, so the child may run arbitrary code.
    let child = unsafe { libc::fork() };
    if child < 0 {
        StepError::new("fork", format!("cannot fork the command: {}", std::io::Error::last_os_error()))
            .report_and_exit();
    }
    if child == 0 {
        command.exec();
    }
    supervise(child, memory_stage)
}

/// Forwards signals to the command and reaps everything until the command exits.
fn supervise(command: libc::pid_t, memory_stage: Option<memory_stage::MemoryStage>) -> ! {
    let mut waited: Vec<i32> = FORWARDED.to_vec();
    waited.push(libc::SIGCHLD);
    let mask = sys::sigset(&waited);
    let (mut user_us, mut system_us, mut max_rss_kib) = (0u64, 0u64, 0u64);
    loop {
        let sig = match sys::sigwait(&mask) {
            Ok(sig) => sig,
            Err(_) => exit(SETUP_FAILED),
        };
        if sig != libc::SIGCHLD {
            // Like a terminal, signal the command's whole process group (it leads
            // one), so `sh -c 'sleep 100'` stops on SIGINT; fall back to the
            // command alone if it moved to another group.
            // SAFETY: `command` is unreaped (we exit as soon as it is reaped).
            unsafe {
                if libc::kill(-command, sig) != 0 {
                    libc::kill(command, sig);
                }
            }
            continue;
        }
        loop {
            let mut status = 0;
            // SAFETY: zeroed rusage is a valid out-parameter.
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: reaping any child; both out-pointers are valid.
            let pid = unsafe { libc::wait4(-1, &mut status, libc::WNOHANG, &mut usage) };
            if pid <= 0 {
                break;
            }
            let micros = |tv: libc::timeval| tv.tv_sec as u64 * 1_000_000 + tv.tv_usec as u64;
            user_us += micros(usage.ru_utime);
            system_us += micros(usage.ru_stime);
            max_rss_kib = max_rss_kib.max(usage.ru_maxrss as u64);
            if pid == command {
                let (code, signal) = if libc::WIFEXITED(status) {
                    (Some(libc::WEXITSTATUS(status)), None)
                } else {
                    (None, Some(libc::WTERMSIG(status)))
                };
                let stage_error = memory_stage.as_ref().and_then(|stage| {
                    // Nothing may write the stage while it is copied: end
                    // every process left in the sandbox first.
                    end_the_rest();
                    // Bounded: the report must stay one atomic pipe write.
                    memory_stage::copy_out(stage).err().map(|e| e.chars().take(1500).collect())
                });
                Report::Exit { code, signal, user_us, system_us, max_rss_kib, stage_error }.send();
                exit(status_to_code(status));
            }
        }
    }
}

/// Sleeps until `CLOCK_REALTIME_COARSE` reaches `at` (the run's conflict
/// baseline; usually passed already, the sandbox's setup being longer than
/// a clock tick).
fn wait_for_coarse_clock(at: i128) {
    for _ in 0..1000 {
        let left = at - pvisor_core::time::coarse_realtime_ns();
        if left <= 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_nanos(left.clamp(100_000, 100_000_000) as u64));
    }
}

/// Kills every other process in the sandbox's pid namespace (init is exempt
/// from its own `kill(-1)`) and reaps them.
fn end_the_rest() {
    // SAFETY: kill(-1) from pid 1 signals every other process in its namespace.
    unsafe { libc::kill(-1, libc::SIGKILL) };
    loop {
        let mut status = 0;
        // SAFETY: reaping any child, blocking.
        if unsafe { libc::waitpid(-1, &mut status, 0) } <= 0 {
            break;
        }
    }
}

fn set_hostname(name: &str) -> Result<(), StepError> {
    // SAFETY: a valid pointer and length.
    let rc = unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) };
    if rc != 0 {
        return Err(StepError::new(
            "uts-namespace",
            format!("cannot set the sandbox hostname: {}", std::io::Error::last_os_error()),
        ));
    }
    Ok(())
}

/// Opens a pseudo-terminal in the sandbox's private devpts, copies the user's
/// window size onto it, hands the master to the supervisor (which relays it to
/// the user's terminal) and returns the slave's path for the command.
fn open_pty() -> Result<CString, StepError> {
    let err = |what: &str| StepError::new("terminal", format!("{what}: {}", std::io::Error::last_os_error()));
    // SAFETY: posix_openpt/unlockpt/ptsname_r/ioctl on a descriptor we own,
    // with buffers of the stated sizes.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if master < 0 {
            return Err(err("cannot open /dev/ptmx"));
        }
        let master = OwnedFd::from_raw_fd(master);
        if libc::unlockpt(master.as_raw_fd()) != 0 {
            return Err(err("cannot unlock the pseudo-terminal"));
        }
        let mut name = [0 as libc::c_char; 128];
        if libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()) != 0 {
            return Err(err("cannot name the pseudo-terminal"));
        }
        let mut size: libc::winsize = std::mem::zeroed();
        if libc::ioctl(libc::STDIN_FILENO, libc::TIOCGWINSZ, &mut size) == 0 {
            libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &size);
        }
        sys::send_fd(FD_PASS_FD, master.as_raw_fd())
            .map_err(|e| StepError::new("terminal", format!("cannot hand the terminal over: {e}")))?;
        Ok(std::ffi::CStr::from_ptr(name.as_ptr()).to_owned())
    }
}

/// Sets up the network the Placement asked for: nothing for the host
/// network; loopback for an own namespace; and for the proxy, a listening
/// socket inside the namespace that is handed to the supervisor, whose proxy
/// then accepts the sandbox's connections on the host side.
fn attach_network(network: NetworkAttachment) -> Result<(), StepError> {
    match network {
        NetworkAttachment::Host => Ok(()),
        NetworkAttachment::Isolated => loopback_up(),
        NetworkAttachment::ProxyListener { port } => {
            loopback_up()?;
            let listener = std::net::TcpListener::bind(("127.0.0.1", port)).map_err(|e| {
                StepError::new(
                    "network",
                    format!("cannot listen on 127.0.0.1:{port} inside the sandbox: {e}"),
                )
            })?;
            use std::os::fd::AsRawFd as _;
            sys::send_fd(FD_PASS_FD, listener.as_raw_fd())
                .map_err(|e| StepError::new("network", format!("cannot hand the proxy listener over: {e}")))
        }
    }
}

/// Brings up `lo` in the sandbox's network namespace; it has no other interface.
fn loopback_up() -> Result<(), StepError> {
    let err =
        |what: &str| StepError::new("net-namespace", format!("{what}: {}", std::io::Error::last_os_error()));
    // SAFETY: creating a datagram socket for interface ioctls.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return Err(err("cannot open a socket to configure loopback"));
    }
    // SAFETY: the socket was just created and is owned here.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    // SAFETY: ifreq is plain data; zero is a valid initial value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write `req`, which is valid.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) != 0 {
            return Err(err("cannot read loopback flags"));
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) != 0 {
            return Err(err("cannot bring up loopback"));
        }
    }
    Ok(())
}

/// The command, with every C string built before fork.
struct Command {
    program: CString,
    argv: Vec<CString>,
    env: Vec<(String, String)>,
    cwd: PathBuf,
    /// The sandbox's own terminal, when the user's stdin and stdout are one.
    pty_slave: Option<CString>,
    detach_stdin: bool,
    seccomp: Option<super::seccomp::Filters>,
    program_name: String,
    last_cap: u32,
}

impl Command {
    fn prepare(spec: &HelperSpec) -> Self {
        let to_c = |s: &str| CString::new(s).unwrap_or_default();
        let sandbox = &spec.sandbox;
        let mut argv = vec![to_c(&sandbox.program)];
        argv.extend(sandbox.args.iter().map(|a| to_c(a)));
        Self {
            program: to_c(&sandbox.program),
            argv,
            env: sandbox.env.clone(),
            cwd: sandbox.cwd.clone(),
            pty_slave: None,
            detach_stdin: spec.detach_stdin,
            seccomp: None,
            program_name: sandbox.program.clone(),
            last_cap: std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(63),
        }
    }

    /// Runs in the forked command child. Never returns.
    fn exec(self) -> ! {
        // SAFETY: plain process-attribute calls in a single-threaded child.
        unsafe {
            // A new session: the user's terminal is never the command's
            // controlling terminal, so TIOCSTI cannot type into the user's shell.
            libc::setsid();
            if self.detach_stdin {
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
                if null >= 0 {
                    libc::dup2(null, 0);
                    libc::close(null);
                }
            }
            if let Some(slave) = &self.pty_slave {
                let fd = libc::open(slave.as_ptr(), libc::O_RDWR);
                if fd >= 0 {
                    libc::ioctl(fd, libc::TIOCSCTTY, 0);
                    for target in 0..=2 {
                        if libc::isatty(target) == 1 {
                            libc::dup2(fd, target);
                        }
                    }
                    if fd > 2 {
                        libc::close(fd);
                    }
                }
            }
            for sig in 1..libc::SIGRTMIN() {
                if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                    libc::signal(sig, libc::SIG_DFL);
                }
            }
            let empty = sys::sigset(&[]);
            libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        }
        if let Err(e) = std::env::set_current_dir(&self.cwd) {
            StepError::new("cwd", format!("cannot enter {}: {e}", self.cwd.display())).report_and_exit();
        }
        // Without this, uid 0 in the sandbox (real root's identity map) could
        // remount the read-only host tree read-write. Nested user namespaces
        // cannot undo it: their copies of our mounts are locked read-only.
        if let Err(e) = drop_all_capabilities(self.last_cap) {
            StepError::new("capabilities", format!("cannot drop capabilities: {e}")).report_and_exit();
        }
        // SAFETY: a plain prctl; no_new_privs also keeps setuid and file
        // capabilities from granting back what was just dropped.
        unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
        if let Some(filters) = &self.seccomp {
            if let Err(e) = filters.apply() {
                StepError::new("seccomp", format!("cannot install the seccomp filter: {e}"))
                    .report_and_exit();
            }
        }
        for (key, _) in std::env::vars_os() {
            std::env::remove_var(key);
        }
        for (key, value) in &self.env {
            if !key.is_empty() && !key.contains('=') && !key.contains('\0') && !value.contains('\0') {
                std::env::set_var(key, value);
            }
        }
        let mut argv: Vec<*const libc::c_char> = self.argv.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        // SAFETY: `program` and `argv` are NUL-terminated and outlive the call;
        // execvp searches the PATH we just installed in `environ`.
        unsafe { libc::execvp(self.program.as_ptr(), argv.as_ptr()) };
        let mut errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOENT);
        if errno == libc::EACCES && !self.program_name.contains('/') && !on_path(&self.program_name) {
            // execvp reports EACCES when some PATH entry was unreadable, even if the
            // program exists nowhere; "not found" is the truth the user needs.
            errno = libc::ENOENT;
        }
        Report::ExecError { program: self.program_name, errno }.send();
        exit(if errno == libc::ENOENT { 127 } else { 126 })
    }
}

/// Empties the bounding, ambient, effective, permitted and inheritable sets.
fn drop_all_capabilities(last_cap: u32) -> std::io::Result<()> {
    for cap in 0..=last_cap {
        // SAFETY: PR_CAPBSET_DROP takes a capability number.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if rc != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: a plain prctl.
    unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0) };
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let header = Header { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
    // SAFETY: capset(2) with a v3 header and the two data words it expects.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) };
    sys::check(rc)?;
    Ok(())
}

/// Returns whether `name` exists as a non-directory in some `$PATH` directory.
fn on_path(name: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path).any(|dir| std::fs::metadata(dir.join(name)).is_ok_and(|m| !m.is_dir()))
}

/// Returns `path` re-rooted under `root` (`/a/b` → `<root>/a/b`).
pub(crate) fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}
