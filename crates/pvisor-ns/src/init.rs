//! Step 2 of the `ns` sandbox (see `helper.rs`): init, pid 1 inside the new
//! namespaces. It assembles the filesystem, hostname, network and terminal,
//! forks the command, forwards signals to it and reaps until it exits.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use super::command::Command;
use super::helper::{exit, status_to_code, HelperSpec, StepError, FORWARDED, SETUP_FAILED};
use super::protocol::{inherited, Report, FD_PASS_FD};
use super::{memory_stage, mounts};
use pvisor_core::records::LoopbackForward;
use pvisor_sandbox::timing::PhaseClock;
use pvisor_sandbox::{sys, NetworkAttachment};

/// pid 1 of the sandbox. Never returns.
pub(super) fn init(spec: HelperSpec, go_read: OwnedFd) -> ! {
    if sys::die_with_parent().is_err() {
        exit(SETUP_FAILED);
    }
    let mut go = [0u8; 1];
    if !matches!(rustix::io::read(&go_read, &mut go), Ok(1)) {
        // The helper died or gave up mapping ids; it reported why.
        exit(SETUP_FAILED);
    }
    let mut clock = PhaseClock::start();
    // Rlimits are set here, inside the new user namespace: set before the
    // clone, RLIMIT_NPROC would count every process the uid has on the host.
    for &(resource, value) in &spec.rlimits {
        let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
        // SAFETY: setrlimit with a valid resource number and struct. Raw
        // `libc`: the resource arrives as a number, which rustix's `Resource`
        // cannot be made from.
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
    clock.mark("mounts");
    if let Err(e) = set_hostname(&spec.sandbox.hostname)
        .and_then(|()| attach_network(spec.sandbox.network, &spec.sandbox.loopback_forwards))
    {
        e.report_and_exit();
    }
    // The command cannot read init's descriptors (the user's terminal among them)
    // through /proc/1/fd.
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    clock.mark("hostname_network");
    let mut command = Command::prepare(&spec);
    if spec.sandbox.seccomp {
        match super::seccomp::build() {
            Ok(filters) => command.seccomp = Some(filters),
            Err(e) => StepError::new("seccomp", format!("cannot build the seccomp filter: {e}"))
                .hint("run with --no-seccomp to go without it (recorded as such)")
                .report_and_exit(),
        }
    }
    clock.mark("seccomp_build");
    if spec.terminal {
        match open_pty() {
            Ok(slave) => command.pty_slave = Some(slave),
            Err(e) => e.report_and_exit(),
        }
    }
    clock.mark("terminal");
    // The helper has moved init into the run's cgroups (see run_helper).
    let n = rustix::io::read(&go_read, &mut go);
    drop(go_read);
    if !matches!(n, Ok(1)) {
        // The helper could not join a cgroup (it reported why) or died.
        exit(SETUP_FAILED);
    }
    clock.mark("cgroup_join_wait");
    // Bounded so the report stays one atomic pipe write.
    let sockets_reachable = view.sockets_reachable.into_iter().take(16).collect();
    Report::Ready { sockets_reachable, setup_us: clock.phases() }.send();

    if let Some(at) = spec.sandbox.start_at_coarse_ns {
        wait_for_coarse_clock(at);
    }
    // SAFETY: init is single-threaded, so the child may run arbitrary code.
    // Raw `libc`: rustix has fork only in its unstable runtime API.
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
            // `command` is unreaped (we exit as soon as it is reaped).
            if let (Ok(pid), Ok(sig)) = (sys::pid(command), sys::signal(sig)) {
                if rustix::process::kill_process_group(pid, sig).is_err() {
                    let _ = rustix::process::kill_process(pid, sig);
                }
            }
            continue;
        }
        while let Ok(Some((pid, status, usage))) = sys::wait4(-1, libc::WNOHANG) {
            user_us += usage.user_cpu.as_micros() as u64;
            system_us += usage.system_cpu.as_micros() as u64;
            max_rss_kib = max_rss_kib.max(usage.max_rss_kib);
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
                    memory_stage::copy_out(stage).err().map(|e| e.to_string().chars().take(1500).collect())
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
    // SAFETY: kill(-1) from pid 1 signals every other process in its
    // namespace. Raw `libc`: rustix has no kill(-1).
    unsafe { libc::kill(-1, libc::SIGKILL) };
    while let Ok(Some(_)) = rustix::process::wait(rustix::process::WaitOptions::empty()) {}
}

fn set_hostname(name: &str) -> Result<(), StepError> {
    rustix::system::sethostname(name.as_bytes()).map_err(|e| {
        StepError::new(
            "uts-namespace",
            format!("cannot set the sandbox hostname: {}", std::io::Error::from(e)),
        )
    })
}

/// Opens a pseudo-terminal in the sandbox's private devpts, copies the user's
/// window size onto it, hands the master to the supervisor (which relays it to
/// the user's terminal) and returns the slave's path for the command.
fn open_pty() -> Result<CString, StepError> {
    let err = |what: &str, e: rustix::io::Errno| {
        StepError::new("terminal", format!("{what}: {}", std::io::Error::from(e)))
    };
    use rustix::pty::OpenptFlags;
    let master = rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)
        .map_err(|e| err("cannot open /dev/ptmx", e))?;
    rustix::pty::unlockpt(&master).map_err(|e| err("cannot unlock the pseudo-terminal", e))?;
    let name = rustix::pty::ptsname(&master, Vec::with_capacity(128))
        .map_err(|e| err("cannot name the pseudo-terminal", e))?;
    if let Ok(size) = rustix::termios::tcgetwinsize(rustix::stdio::stdin()) {
        let _ = rustix::termios::tcsetwinsize(&master, size);
    }
    sys::send_fd(inherited(FD_PASS_FD), master.as_fd())
        .map_err(|e| StepError::new("terminal", format!("cannot hand the terminal over: {e}")))?;
    Ok(name)
}

/// Sets up the network the Placement asked for: nothing for the host
/// network; loopback for an own namespace; and for the proxy, a listening
/// socket inside the namespace that is handed to the supervisor, whose proxy
/// then accepts the sandbox's connections on the host side, followed by one
/// for each forwarded loopback port.
fn attach_network(network: NetworkAttachment, forwards: &[LoopbackForward]) -> Result<(), StepError> {
    match network {
        NetworkAttachment::Host => Ok(()),
        // Admission gives it only to vm Jobs.
        NetworkAttachment::Namespace => Err(StepError::new(
            "network",
            "the ns executor cannot join a network namespace; use --executor vm",
        )),
        NetworkAttachment::Isolated => loopback_up(),
        NetworkAttachment::ProxyListener { port } => {
            loopback_up()?;
            let listener = std::net::TcpListener::bind(("127.0.0.1", port)).map_err(|e| {
                StepError::new(
                    "network",
                    format!("cannot listen on 127.0.0.1:{port} inside the sandbox: {e}"),
                )
            })?;
            sys::send_fd(inherited(FD_PASS_FD), listener.as_fd()).map_err(|e| {
                StepError::new("network", format!("cannot hand the proxy listener over: {e}"))
            })?;
            forwards.iter().try_for_each(hand_over_forward)
        }
    }
}

/// Listens on a forwarded loopback port inside the namespace and hands the
/// listener to the supervisor, which relays its connections to the host's
/// port. `localhost` asks for `::1` too, which a namespace without IPv6
/// lacks: then a byte without a descriptor says so, and `localhost`
/// resolves to 127.0.0.1 alone there anyway.
fn hand_over_forward(forward: &LoopbackForward) -> Result<(), StepError> {
    let hand_over = |fd: Option<std::os::fd::BorrowedFd<'_>>| {
        let sent = match fd {
            Some(fd) => sys::send_fd(inherited(FD_PASS_FD), fd),
            None => rustix::io::write(inherited(FD_PASS_FD), &[0]).map(drop).map_err(Into::into),
        };
        sent.map_err(|e| {
            StepError::new("network", format!("cannot hand the listener on {} over: {e}", forward.listen))
        })
    };
    match std::net::TcpListener::bind(forward.listen) {
        Ok(listener) => hand_over(Some(listener.as_fd())),
        Err(e) if forward.host == "localhost" && e.kind() == std::io::ErrorKind::AddrNotAvailable => {
            hand_over(None)
        }
        Err(e) => Err(StepError::new(
            "network",
            format!("cannot listen on {} inside the sandbox to forward it to the host: {e}", forward.listen),
        )),
    }
}

/// Brings up `lo` in the sandbox's network namespace; it has no other interface.
fn loopback_up() -> Result<(), StepError> {
    let err =
        |what: &str| StepError::new("net-namespace", format!("{what}: {}", std::io::Error::last_os_error()));
    let sock = rustix::net::socket_with(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| {
        StepError::new(
            "net-namespace",
            format!("cannot open a socket to configure loopback: {}", std::io::Error::from(e)),
        )
    })?;
    // SAFETY: ifreq is plain data; zero is a valid initial value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write `req`, which is valid.
    // Raw `libc`: rustix has no interface-flags ioctl.
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
