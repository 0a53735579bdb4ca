//! Explains why the sandbox's namespaces could not be created.
//!
//! When the combined `clone(2)` fails, each namespace is probed on its own in a
//! throw-away child, so the error names the one the host refuses and says how
//! to enable it. pvisor never falls back to running unsandboxed.

use std::io;

use super::helper::StepError;

pub const NAMESPACES: [(libc::c_int, &str, &str); 5] = [
    (libc::CLONE_NEWNS, "mount", "CONFIG_NAMESPACES"),
    (libc::CLONE_NEWPID, "pid", "CONFIG_PID_NS"),
    (libc::CLONE_NEWIPC, "ipc", "CONFIG_IPC_NS"),
    (libc::CLONE_NEWUTS, "uts", "CONFIG_UTS_NS"),
    (libc::CLONE_NEWNET, "network", "CONFIG_NET_NS"),
];

/// Returns the errno of `unshare(flags)` tried in a forked child, or 0.
pub fn probe(flags: libc::c_int) -> i32 {
    // SAFETY: the helper is single-threaded; the child only calls unshare and
    // _exit. Raw `libc` for all three: rustix has fork and _exit only in its
    // unstable runtime API.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: async-signal-safe calls only.
        unsafe {
            let rc = libc::unshare(flags);
            let errno = if rc == 0 { 0 } else { *libc::__errno_location() };
            libc::_exit(errno & 0xff);
        }
    }
    if pid < 0 {
        return -1;
    }
    let waited = pvisor_sandbox::sys::pid(pid)
        .and_then(|pid| Ok(rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty())?));
    match waited {
        Ok(Some((_, status))) => status.exit_status().unwrap_or(-1),
        _ => -1,
    }
}

pub fn user_namespace_hint(errno: i32) -> String {
    match errno {
        libc::ENOSPC => "user namespaces are disabled by a limit: `sysctl user.max_user_namespaces` is 0 (or exhausted); enable with `sysctl -w user.max_user_namespaces=15000`".into(),
        libc::EPERM => "unprivileged user namespaces are forbidden here: enable with `sysctl -w kernel.unprivileged_userns_clone=1` (Debian), `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (Ubuntu 24.04+), or allow unshare/clone in the container's seccomp profile".into(),
        libc::EINVAL => "this kernel was built without user namespaces (CONFIG_USER_NS)".into(),
        libc::EUSERS => "too many nested user namespaces (the kernel allows 32 levels)".into(),
        _ => "check the kernel's namespace configuration".into(),
    }
}

/// Builds the setup error for a failed namespace `clone(2)`.
pub(crate) fn clone_failure(err: io::Error) -> StepError {
    let user = probe(libc::CLONE_NEWUSER);
    if user != 0 {
        let cause = if user > 0 { io::Error::from_raw_os_error(user) } else { err };
        return StepError::new("user-namespace", format!("cannot create a user namespace: {cause}"))
            .hint(user_namespace_hint(user));
    }
    for (flag, name, config) in NAMESPACES {
        let errno = probe(libc::CLONE_NEWUSER | flag);
        if errno != 0 {
            let cause = if errno > 0 {
                io::Error::from_raw_os_error(errno)
            } else {
                io::Error::other("probe failed")
            };
            return StepError::new("namespaces", format!("cannot create a {name} namespace: {cause}")).hint(
                format!("the kernel must provide {name} namespaces ({config}) inside user namespaces"),
            );
        }
    }
    StepError::new("namespaces", format!("cannot create the sandbox namespaces: {err}"))
        .hint("each namespace works alone; check `ulimit -u` and memory limits")
}
