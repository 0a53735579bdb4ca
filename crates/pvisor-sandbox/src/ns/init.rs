//! Step 2 of the `ns` sandbox (see `helper.rs`): init, pid 1 inside the new
//! namespaces. It assembles the filesystem, hostname, network and terminal,
//! forks the command, forwards signals to it and reaps until it exits.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::command::Command;
use super::helper::{exit, status_to_code, HelperSpec, StepError, FORWARDED, SETUP_FAILED};
use super::protocol::{Report, FD_PASS_FD};
use super::{memory_stage, mounts};
use crate::{sys, NetworkAttachment};

/// pid 1 of the sandbox. Never returns.
pub(super) fn init(spec: HelperSpec, go_read: OwnedFd) -> ! {
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
