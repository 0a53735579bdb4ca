//! A child process with an `/etc/hosts` of its own: how the benchmarks and
//! the tests give `pvisor serve` a name for a host server (its proxy
//! resolves names on the host) without touching the host's file.

use std::path::Path;
use std::process::{Command, Stdio};

/// `cmd` run by `unshare` in a mount namespace of its own, where `hosts` is
/// bound over `/etc/hosts`; `exec`s all the way, so the child is `cmd` itself.
/// Its standard streams are not carried over: set them on what this returns.
pub fn in_own_hosts(cmd: Command, hosts: &Path) -> Command {
    let mut wrapped = Command::new("unshare");
    wrapped
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(r#"mount --bind "$0" /etc/hosts && exec "$@""#)
        .arg(hosts);
    let mut wrapped = running(wrapped, &cmd);
    wrapped.stdin(Stdio::null());
    wrapped
}

/// `wrapper` given `cmd`'s program and arguments as its last ones, and
/// `cmd`'s directory and environment: how a wrapper that ends in `exec`
/// (`unshare`, `nsenter`) runs `cmd` as it would have run.
pub fn running(mut wrapper: Command, cmd: &Command) -> Command {
    wrapper.arg(cmd.get_program()).args(cmd.get_args());
    if let Some(dir) = cmd.get_current_dir() {
        wrapper.current_dir(dir);
    }
    for (key, value) in cmd.get_envs() {
        match value {
            Some(value) => wrapper.env(key, value),
            None => wrapper.env_remove(key),
        };
    }
    wrapper
}
