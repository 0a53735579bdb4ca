//! Confining a container's process as its OCI spec asks (a
//! [`Confinement`]): the guest kernel is the container's alone, so what a
//! spec restricts is applied here, inside the VM, as runc applies it on a
//! host. Sysctls are written before the fork (they are the guest kernel's
//! and the container's only); everything else runs between fork and exec,
//! in runc's order:
//!
//! 1. resource limits (raising a hard limit needs `CAP_SYS_RESOURCE`, still held);
//! 2. the bounding set (dropping needs `CAP_SETPCAP`, still held);
//! 3. the user: supplementary groups, gid, uid, with `PR_SET_KEEPCAPS` so
//!    the permitted set survives the switch;
//! 4. effective, permitted and inheritable sets (`capset`), then the ambient set;
//! 5. `no_new_privs`;
//! 6. the seccomp filter, compiled by the host (its programs installed in
//!    order), as close to the exec as can be, so the profile need not allow
//!    the calls of the steps above. Without `no_new_privs` installing a
//!    filter needs `CAP_SYS_ADMIN`, so it goes in first instead, after the
//!    rlimits, while the process still has every capability, and the
//!    steps above must then pass it. This is runc's order
//!    (`libcontainer/standard_init_linux.go`, `linuxStandardInit.Init`:
//!    `InitSeccomp` before `finalizeNamespace` when `NoNewPrivileges` is
//!    off, last otherwise).
//!
//! Before all of them, while the process is still root, it joins its
//! cgroup, if it has one ([`crate::cgroup`]).
//!
//! A process of uid 0 regains its bounding set at exec (the kernel's rule
//! for root), so the bounding set is what bounds a root container: an
//! empty one leaves it no capability.

use std::io;

use pvisor_agent_proto::{Capabilities, Confinement, Seccomp};
use rustix::process::{Gid, Uid};
use rustix::thread::{CapabilitySet, CapabilitySets};

/// The highest capability number a bounding set can hold.
const LAST_CAP: u32 = 63;
/// The most instructions one BPF program may have (`BPF_MAXINSNS`).
const BPF_MAXINSNS: usize = 4096;

/// A confinement made ready before the fork: nothing after it allocates.
pub(crate) struct Ready {
    uid: Uid,
    gid: Gid,
    groups: Vec<Gid>,
    capabilities: Option<Capabilities>,
    no_new_privileges: bool,
    rlimits: Vec<(u32, libc::rlimit)>,
    /// The seccomp programs and the flags to install each with.
    seccomp: Option<(Vec<Vec<libc::sock_filter>>, libc::c_ulong)>,
    /// The `cgroup.procs` of the cgroup the process joins.
    cgroup: Option<std::fs::File>,
}

/// Writes the sysctls and readies the rest; a key that does not name a
/// plain `/proc/sys` entry is refused.
pub(crate) fn prepare(confinement: &Confinement) -> io::Result<Ready> {
    for (key, value) in &confinement.sysctl {
        let path = sysctl_path(key)?;
        std::fs::write(&path, value)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot set the sysctl {key}: {e}")))?;
    }
    let rlimits = confinement
        .rlimits
        .iter()
        .map(|r| (r.resource, libc::rlimit { rlim_cur: r.soft, rlim_max: r.hard }))
        .collect();
    Ok(Ready {
        uid: Uid::from_raw(confinement.uid),
        gid: Gid::from_raw(confinement.gid),
        groups: confinement.additional_gids.iter().map(|g| Gid::from_raw(*g)).collect(),
        capabilities: confinement.capabilities,
        no_new_privileges: confinement.no_new_privileges,
        rlimits,
        seccomp: confinement.seccomp.as_ref().map(programs).transpose()?,
        cgroup: confinement.container.as_ref().map(crate::cgroup::open).transpose()?.flatten(),
    })
}

/// The filter's programs as the kernel takes them; an empty program or
/// one longer than the kernel's limit is refused (its length travels in
/// 16 bits, so a longer one would be cut, not refused, by the kernel).
fn programs(seccomp: &Seccomp) -> io::Result<(Vec<Vec<libc::sock_filter>>, libc::c_ulong)> {
    let programs = seccomp
        .programs
        .iter()
        .map(|program| {
            if program.is_empty() || program.len() > BPF_MAXINSNS {
                let why = format!("a seccomp program of {} instructions", program.len());
                return Err(io::Error::new(io::ErrorKind::InvalidInput, why));
            }
            let insns = program.iter().map(|insn| {
                let (code, jt, jf, k) = Seccomp::unpack(*insn);
                libc::sock_filter { code, jt, jf, k }
            });
            Ok(insns.collect())
        })
        .collect::<io::Result<_>>()?;
    Ok((programs, libc::c_ulong::from(seccomp.flags)))
}

/// `/proc/sys/` and the dotted key as a path; only letters, digits, `_`
/// and `-` between the dots.
fn sysctl_path(key: &str) -> io::Result<String> {
    let plain = key.split('.').all(|part| {
        !part.is_empty() && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    });
    if !plain {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{key:?} is not a sysctl")));
    }
    Ok(format!("/proc/sys/{}", key.replace('.', "/")))
}

impl Ready {
    /// Applies the confinement to the calling (forked, single-threaded)
    /// process. Only bare syscalls: it runs between fork and exec.
    pub(crate) fn apply(&self) -> io::Result<()> {
        if let Some(procs) = &self.cgroup {
            // First, as root: `0` is the writer itself.
            rustix::io::write(procs, b"0")?;
        }
        for (resource, limit) in &self.rlimits {
            // SAFETY: setrlimit reads the rlimit it is given and nothing else.
            if unsafe { libc::setrlimit(*resource as _, limit) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if !self.no_new_privileges {
            self.install_seccomp()?;
        }
        if let Some(caps) = &self.capabilities {
            drop_bounding(caps.bounding)?;
            rustix::thread::set_keep_capabilities(true)?;
        }
        rustix::thread::set_thread_groups(&self.groups)?;
        rustix::thread::set_thread_res_gid(self.gid, self.gid, self.gid)?;
        rustix::thread::set_thread_res_uid(self.uid, self.uid, self.uid)?;
        if let Some(caps) = &self.capabilities {
            rustix::thread::set_keep_capabilities(false)?;
            let set = CapabilitySet::from_bits_retain;
            rustix::thread::set_capabilities(
                None,
                CapabilitySets {
                    effective: set(caps.effective),
                    permitted: set(caps.permitted),
                    inheritable: set(caps.inheritable),
                },
            )?;
            set_ambient(caps.ambient)?;
        }
        if self.no_new_privileges {
            rustix::thread::set_no_new_privs(true)?;
            self.install_seccomp()?;
        }
        Ok(())
    }

    /// Installs the seccomp programs, if any, in order.
    fn install_seccomp(&self) -> io::Result<()> {
        let Some((programs, flags)) = &self.seccomp else { return Ok(()) };
        for program in programs {
            let fprog = libc::sock_fprog { len: program.len() as u16, filter: program.as_ptr().cast_mut() };
            // SAFETY: the kernel copies the program, which outlives the call.
            let rc = unsafe {
                libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, *flags, &fprog as *const _)
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// Drops from the bounding set every capability not in `keep`; a number
/// the kernel does not know (`EINVAL`) is not in its set anyway.
fn drop_bounding(keep: u64) -> io::Result<()> {
    for cap in 0..=LAST_CAP {
        if keep & (1 << cap) != 0 {
            continue;
        }
        // SAFETY: PR_CAPBSET_DROP takes a capability number, no pointers.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Makes the ambient set exactly `ambient` (each must be permitted and
/// inheritable by now, or the kernel refuses it).
fn set_ambient(ambient: u64) -> io::Result<()> {
    // SAFETY: PR_CAP_AMBIENT takes numbers, no pointers.
    let ambient_op = |op: libc::c_int, cap: u32| unsafe {
        libc::prctl(libc::PR_CAP_AMBIENT, op as libc::c_ulong, cap as libc::c_ulong, 0, 0)
    };
    if ambient_op(libc::PR_CAP_AMBIENT_CLEAR_ALL, 0) != 0 {
        return Err(io::Error::last_os_error());
    }
    for cap in (0..=LAST_CAP).filter(|c| ambient & (1 << c) != 0) {
        if ambient_op(libc::PR_CAP_AMBIENT_RAISE, cap) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysctl_keys_name_plain_proc_sys_entries() {
        assert_eq!(sysctl_path("net.ipv4.ip_forward").unwrap(), "/proc/sys/net/ipv4/ip_forward");
        for bad in ["", "net..x", "../../etc/passwd", "net/ipv4", "kernel.x y", ".net"] {
            assert!(sysctl_path(bad).is_err(), "{bad:?}");
        }
    }

    /// `script` run by `/bin/sh` under `confinement`: its output.
    fn run_confined(confinement: Confinement, script: &str) -> String {
        use std::os::unix::process::CommandExt;
        let ready = prepare(&confinement).expect("ready");
        let mut command = std::process::Command::new("/bin/sh");
        command.args(["-c", script]);
        // SAFETY: apply makes bare syscalls only (see its documentation).
        unsafe { command.pre_exec(move || ready.apply()) };
        let out = command.output().expect("runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("text")
    }

    /// A filter denying `mkdir` and `mkdirat` with `EPERM` (what the shim
    /// compiles from such a profile).
    fn deny_mkdir() -> Seccomp {
        use seccompiler::{BpfProgram, SeccompAction, SeccompFilter};
        let arch = std::env::consts::ARCH.try_into().expect("a seccomp architecture");
        #[cfg(target_arch = "x86_64")]
        let denied = [libc::SYS_mkdirat, libc::SYS_mkdir];
        #[cfg(not(target_arch = "x86_64"))]
        let denied = [libc::SYS_mkdirat];
        let rules = denied.into_iter().map(|nr| (nr, Vec::new())).collect();
        let filter =
            SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch)
                .expect("a filter");
        let bpf: BpfProgram = filter.try_into().expect("compiles");
        let program = bpf.iter().map(|i| Seccomp::pack(i.code, i.jt, i.jf, i.k)).collect();
        Seccomp { programs: vec![program], flags: 0 }
    }

    /// A confined process under a filter denying `mkdir` gets `EPERM` from
    /// it, though root, and its other calls work; with `no_new_privs` (the
    /// filter installed last) and without it (installed first, while the
    /// process may, then passed by the switch to another user).
    #[test]
    #[ignore = "needs root (a filter without no_new_privs): scripts/test.sh runs it as root, with --include-ignored"]
    fn a_seccomp_filter_denies_what_it_names_and_nothing_else() {
        assert!(
            rustix::process::geteuid().is_root(),
            "installing a filter without no_new_privs needs root (ignored unless included)"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .expect("chmod");
        let target = dir.path().join("made");
        let script = format!(
            "mkdir {0} 2>&1 || echo refused; echo > {0}.file && echo wrote; grep '^Seccomp:' /proc/self/status; id -u",
            target.display()
        );
        for (no_new_privileges, uid) in [(true, 0), (false, 4242)] {
            let confinement = Confinement {
                uid,
                gid: uid,
                no_new_privileges,
                seccomp: Some(deny_mkdir()),
                ..Confinement::default()
            };
            let seen = run_confined(confinement, &script);
            assert!(seen.contains("Operation not permitted\nrefused\n"), "{seen}");
            assert!(seen.contains("wrote\nSeccomp:\t2\n") && seen.ends_with(&format!("{uid}\n")), "{seen}");
            assert!(!target.exists(), "mkdir made nothing");
            std::fs::remove_file(dir.path().join("made.file")).expect("the write happened");
        }
    }

    /// A process confined to empty sets, `no_new_privs`, a user and an
    /// rlimit shows exactly that in its own `/proc/self/status`.
    #[test]
    #[ignore = "needs root (another user): scripts/test.sh runs it as root, with --include-ignored"]
    fn a_confined_process_has_what_it_was_given_and_nothing_more() {
        assert!(
            rustix::process::geteuid().is_root(),
            "confining a process to another user needs root (ignored unless included)"
        );
        let status = |confinement: Confinement| -> String {
            run_confined(
                confinement,
                "grep -E '^(Uid|CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs)' /proc/self/status; ulimit -n",
            )
        };
        let none = Capabilities::default();
        let empty = Confinement {
            capabilities: Some(none),
            no_new_privileges: true,
            rlimits: vec![pvisor_agent_proto::Rlimit { resource: 7, soft: 64, hard: 64 }],
            ..Confinement::default()
        };
        let seen = status(empty);
        for line in [
            "CapEff:\t0000000000000000",
            "CapPrm:\t0000000000000000",
            "CapBnd:\t0000000000000000",
            "NoNewPrivs:\t1",
            "\n64\n",
        ] {
            assert!(seen.contains(line), "{line:?} in {seen}");
        }
        // A user keeps only its ambient capabilities across exec.
        let net_bind = 1 << 10;
        let user = Confinement {
            uid: 4242,
            gid: 4242,
            capabilities: Some(Capabilities {
                bounding: net_bind,
                effective: net_bind,
                permitted: net_bind,
                inheritable: net_bind,
                ambient: net_bind,
            }),
            ..Confinement::default()
        };
        let seen = status(user);
        assert!(seen.contains("Uid:\t4242\t4242\t4242"), "{seen}");
        assert!(
            seen.contains("CapEff:\t0000000000000400") && seen.contains("CapAmb:\t0000000000000400"),
            "{seen}"
        );
    }
}
