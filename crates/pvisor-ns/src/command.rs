//! Step 3 of the `ns` sandbox (see `helper.rs`): the command's own process
//! between fork and `execvp` — session and terminal, signal dispositions,
//! capabilities, `no_new_privs`, seccomp and the environment.

use std::ffi::CString;
use std::os::fd::{AsRawFd, IntoRawFd};
use std::path::PathBuf;

use rustix::fs::{Mode, OFlags};

use super::helper::{exit, HelperSpec, StepError};
use super::protocol::Report;
use pvisor_sandbox::sys;

/// The command, with every C string built before fork.
pub(super) struct Command {
    program: CString,
    argv: Vec<CString>,
    env: Vec<(String, String)>,
    cwd: PathBuf,
    /// The sandbox's own terminal, when the user's stdin and stdout are one.
    pub(super) pty_slave: Option<CString>,
    /// Standard descriptors to replace with the sandbox's `/dev/null`.
    null_fds: Vec<i32>,
    pub(super) seccomp: Option<super::seccomp::Filters>,
    program_name: String,
    last_cap: u32,
}

impl Command {
    pub(super) fn prepare(spec: &HelperSpec) -> Self {
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
            null_fds: spec.null_fds.clone(),
            seccomp: None,
            program_name: sandbox.program.clone(),
            last_cap: std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(63),
        }
    }

    /// Runs in the forked command child. Never returns.
    pub(super) fn exec(self) -> ! {
        // A new session: the user's terminal is never the command's
        // controlling terminal, so TIOCSTI cannot type into the user's shell.
        let _ = rustix::process::setsid();
        if !self.null_fds.is_empty() {
            if let Ok(null) = rustix::fs::open(c"/dev/null", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty()) {
                for &fd in &self.null_fds {
                    let _ = match fd {
                        0 => rustix::stdio::dup2_stdin(&null),
                        1 => rustix::stdio::dup2_stdout(&null),
                        _ => rustix::stdio::dup2_stderr(&null),
                    };
                }
            }
        }
        if let Some(slave) = &self.pty_slave {
            if let Ok(fd) = rustix::fs::open(slave.as_c_str(), OFlags::RDWR, Mode::empty()) {
                let _ = rustix::process::ioctl_tiocsctty(&fd);
                if rustix::termios::isatty(rustix::stdio::stdin()) {
                    let _ = rustix::stdio::dup2_stdin(&fd);
                }
                if rustix::termios::isatty(rustix::stdio::stdout()) {
                    let _ = rustix::stdio::dup2_stdout(&fd);
                }
                if rustix::termios::isatty(rustix::stdio::stderr()) {
                    let _ = rustix::stdio::dup2_stderr(&fd);
                }
                if fd.as_raw_fd() <= 2 {
                    // It took a standard descriptor's place (one was closed): keep it.
                    let _ = fd.into_raw_fd();
                }
            }
        }
        // SAFETY: resetting dispositions and the mask in a single-threaded
        // child. Raw `libc`: rustix has no sigaction or sigprocmask outside
        // its unstable runtime API.
        unsafe {
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
        // no_new_privs also keeps setuid and file capabilities from granting
        // back what was just dropped.
        let _ = rustix::thread::set_no_new_privs(true);
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
        // execvp searches the PATH we just installed in `environ`. Raw
        // `libc`: rustix has no PATH-searching exec.
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
        // SAFETY: PR_CAPBSET_DROP takes a capability number. Raw `libc`:
        // rustix names only the capabilities it knows, and every number up
        // to the kernel's last must go.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if rc != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(std::io::Error::last_os_error());
        }
    }
    let _ = rustix::thread::clear_ambient_capability_set();
    let none = rustix::thread::CapabilitySet::empty();
    rustix::thread::set_capabilities(
        None,
        rustix::thread::CapabilitySets { effective: none, permitted: none, inheritable: none },
    )?;
    Ok(())
}

/// Returns whether `name` exists as a non-directory in some `$PATH` directory.
fn on_path(name: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path).any(|dir| std::fs::metadata(dir.join(name)).is_ok_and(|m| !m.is_dir()))
}
