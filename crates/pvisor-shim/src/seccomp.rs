//! The spec's seccomp profile (`linux.seccomp`) compiled, on the host, into
//! the BPF program the guest agent installs before the container's process
//! execs: the static agent carries no compiler, only the program.
//!
//! A profile is libseccomp's model: a default action, and entries giving
//! syscalls (by name, with optional argument comparisons) an action each.
//! seccompiler builds a segment per action (what its entries match gets the
//! action, the rest `ALLOW`), and the segments are chained into one
//! program, most restrictive action first, each segment's `ALLOW` a jump to
//! the next; the last segment answers what any entry matches `ALLOW` and
//! everything else the default action. So a call no entry matches gets the
//! default action, and one that entries match gets the most restrictive of
//! their actions (of two `ERRNO`s, the earlier entry's). One program, not
//! one filter per action: the first filter installed would judge the
//! `seccomp` calls installing the others, and a profile need not allow
//! them.
//!
//! As in runc (`libcontainer/seccomp/seccomp_linux.go`): an entry whose
//! action is the default is redundant and skipped; a name this architecture
//! does not have is skipped (profiles list every architecture's names);
//! `SCMP_ACT_KILL` is `KILL_THREAD`; `errnoRet` defaults to `EPERM` for
//! `ERRNO` and for `TRACE` (an untraced process gets `ENOSYS` from
//! `TRACE`, the kernel's rule); comparisons on distinct arguments are
//! ANDed, and several on one argument each make a rule of their own (ORed).
//! Comparisons are on the whole 64-bit argument, as libseccomp's are.
//!
//! The programs are for the host's architecture, which is the guest's (KVM
//! runs the host's). A call through another ABI (i386's `int 0x80`) is
//! killed by the architecture check; on x86_64 an x32 call, which carries
//! x86_64's architecture, gets `ENOSYS` from a first guard segment, since
//! no rule by number would match it.
//!
//! Refused: `SCMP_ACT_NOTIFY` (its listener is a process on the host,
//! which a call inside a VM cannot reach), an `errnoRet` beyond Linux's
//! largest errno (the kernel would not return it as given), an argument
//! index beyond the sixth, and a program longer than the kernel installs.

use std::collections::BTreeMap;
use std::str::FromStr;

use oci_spec::runtime::{LinuxSeccomp, LinuxSeccompAction, LinuxSeccompFilterFlag, LinuxSeccompOperator};
use pvisor_agent_proto::Seccomp;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

use crate::spec::SpecError;

/// The largest errno Linux returns (`MAX_ERRNO`).
const MAX_ERRNO: u32 = 4095;
/// The most instructions one BPF program may have (`BPF_MAXINSNS`).
const BPF_MAXINSNS: usize = 4096;
/// `BPF_RET | BPF_K` and `BPF_JMP | BPF_JA`.
const BPF_RET: u16 = 0x06;
const BPF_JA: u16 = 0x05;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
/// The action part of a filter's answer.
const SECCOMP_RET_ACTION_FULL: u32 = 0xffff_0000;

/// Per syscall number, its rules; `None`: matched whatever the arguments.
type Matches = BTreeMap<i64, Option<Vec<SeccompRule>>>;

/// Compiles `profile` for the host's architecture.
pub fn compile(profile: &LinuxSeccomp) -> Result<Seccomp, SpecError> {
    let default = action(profile.default_action(), profile.default_errno_ret())?;
    let mut listed = Matches::new();
    let mut by_action: Vec<(SeccompAction, Matches)> = Vec::new();
    for entry in profile.syscalls().iter().flatten() {
        let act = action(entry.action(), entry.errno_ret())?;
        let rules = rules(entry.args().as_deref().unwrap_or_default())?;
        if act == default {
            continue;
        }
        let numbers: Vec<i64> = entry.names().iter().filter_map(|name| number(name)).collect();
        let slot = match by_action.iter().position(|(a, _)| *a == act) {
            Some(i) => i,
            None => {
                by_action.push((act, Matches::new()));
                by_action.len() - 1
            }
        };
        for nr in numbers {
            add(&mut listed, nr, rules.clone());
            add(&mut by_action[slot].1, nr, rules.clone());
        }
    }
    let arch = arch()?;
    by_action.retain(|(a, m)| *a != SeccompAction::Allow && !m.is_empty());
    // Most restrictive first (the kernel's order of actions, as signed
    // numbers); a stable sort keeps entries' order among equals.
    by_action.sort_by_key(|(a, _)| (u32::from(a.clone()) & SECCOMP_RET_ACTION_FULL) as i32);
    let mut segments = guard();
    for (act, matches) in by_action {
        segments.push(program(matches, SeccompAction::Allow, act, arch)?);
    }
    segments.push(match default {
        SeccompAction::Allow => vec![Seccomp::pack(BPF_RET, 0, 0, SECCOMP_RET_ALLOW)],
        _ => program(listed, default, SeccompAction::Allow, arch)?,
    });
    let program = chain(segments);
    if program.len() > BPF_MAXINSNS {
        return Err(unsupported(format!("{} BPF instructions, more than a filter may have", program.len())));
    }
    Ok(Seccomp { programs: vec![program], flags: flags(profile) })
}

/// One program of segments: each segment's `ALLOW` (all but the last
/// segment's, its "no match") becomes a jump to the next segment, so a call
/// gets the first segment's answer that is not `ALLOW`. One program rather
/// than one filter each: a filter installed first would judge the
/// `seccomp` calls installing the rest, and a profile need not allow them.
fn chain(segments: Vec<Vec<u64>>) -> Vec<u64> {
    let mut program = Vec::new();
    let count = segments.len();
    for (n, segment) in segments.into_iter().enumerate() {
        let end = program.len() + segment.len();
        let last = n + 1 == count;
        for insn in segment {
            let next = program.len() + 1;
            program.push(match Seccomp::unpack(insn) {
                (BPF_RET, _, _, SECCOMP_RET_ALLOW) if !last => {
                    Seccomp::pack(BPF_JA, 0, 0, (end - next) as u32)
                }
                _ => insn,
            });
        }
    }
    program
}

fn unsupported(what: String) -> SpecError {
    SpecError::Unsupported(format!("the seccomp profile: {what}"))
}

/// The kernel's action for an OCI one (runc's `getAction`).
fn action(action: LinuxSeccompAction, errno: Option<u32>) -> Result<SeccompAction, SpecError> {
    let errno = errno.unwrap_or(libc::EPERM as u32);
    if errno > MAX_ERRNO {
        return Err(unsupported(format!("errnoRet {errno}, beyond Linux's largest errno")));
    }
    Ok(match action {
        LinuxSeccompAction::ScmpActKill | LinuxSeccompAction::ScmpActKillThread => SeccompAction::KillThread,
        LinuxSeccompAction::ScmpActKillProcess => SeccompAction::KillProcess,
        LinuxSeccompAction::ScmpActTrap => SeccompAction::Trap,
        LinuxSeccompAction::ScmpActErrno => SeccompAction::Errno(errno),
        LinuxSeccompAction::ScmpActTrace => SeccompAction::Trace(errno),
        LinuxSeccompAction::ScmpActLog => SeccompAction::Log,
        LinuxSeccompAction::ScmpActAllow => SeccompAction::Allow,
        LinuxSeccompAction::ScmpActNotify => {
            return Err(unsupported(
                "SCMP_ACT_NOTIFY (its listener is on the host; a call in the VM cannot reach it)".into(),
            ))
        }
    })
}

/// An entry's argument comparisons as rules: `None` for none (the call
/// matches whatever its arguments); one rule ANDing them, or, when two
/// compare the same argument, one rule each (runc's `matchCall`).
fn rules(args: &[oci_spec::runtime::LinuxSeccompArg]) -> Result<Option<Vec<SeccompRule>>, SpecError> {
    if args.is_empty() {
        return Ok(None);
    }
    let conditions = args
        .iter()
        .map(|arg| {
            let index = u8::try_from(arg.index()).unwrap_or(u8::MAX);
            let op = match arg.op() {
                LinuxSeccompOperator::ScmpCmpNe => SeccompCmpOp::Ne,
                LinuxSeccompOperator::ScmpCmpLt => SeccompCmpOp::Lt,
                LinuxSeccompOperator::ScmpCmpLe => SeccompCmpOp::Le,
                LinuxSeccompOperator::ScmpCmpEq => SeccompCmpOp::Eq,
                LinuxSeccompOperator::ScmpCmpGe => SeccompCmpOp::Ge,
                LinuxSeccompOperator::ScmpCmpGt => SeccompCmpOp::Gt,
                // libseccomp's (arg & value) == valueTwo.
                LinuxSeccompOperator::ScmpCmpMaskedEq => SeccompCmpOp::MaskedEq(arg.value()),
            };
            let datum = match arg.op() {
                LinuxSeccompOperator::ScmpCmpMaskedEq => arg.value_two().unwrap_or(0),
                _ => arg.value(),
            };
            SeccompCondition::new(index, SeccompCmpArgLen::Qword, op, datum)
                .map_err(|e| unsupported(format!("argument {}: {e}", arg.index())))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut indexes: Vec<usize> = args.iter().map(|a| a.index()).collect();
    indexes.sort_unstable();
    indexes.dedup();
    let groups = if indexes.len() == args.len() {
        vec![conditions]
    } else {
        conditions.into_iter().map(|c| vec![c]).collect()
    };
    groups
        .into_iter()
        .map(|c| SeccompRule::new(c).map_err(|e| unsupported(e.to_string())))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The number of the call `name` on this architecture; `None` for a name
/// it does not have (logged: runc and libseccomp skip these too).
fn number(name: &str) -> Option<i64> {
    let found = syscalls::Sysno::from_str(name).ok().map(|s| i64::from(s.id()));
    if found.is_none() {
        log::debug!("seccomp: no syscall {name:?} on {}; its rule is skipped", std::env::consts::ARCH);
    }
    found
}

/// Adds rules for `nr`: matching whatever the arguments wins over matching
/// some.
fn add(matches: &mut Matches, nr: i64, rules: Option<Vec<SeccompRule>>) {
    let slot = matches.entry(nr).or_insert_with(|| Some(Vec::new()));
    match (slot.as_mut(), rules) {
        (Some(have), Some(more)) => have.extend(more),
        (Some(_), None) => *slot = None,
        (None, _) => {}
    }
}

fn arch() -> Result<seccompiler::TargetArch, SpecError> {
    std::env::consts::ARCH.try_into().map_err(|e| unsupported(format!("{e}")))
}

fn program(
    matches: Matches,
    mismatch: SeccompAction,
    matched: SeccompAction,
    arch: seccompiler::TargetArch,
) -> Result<Vec<u64>, SpecError> {
    let rules = matches.into_iter().map(|(nr, rules)| (nr, rules.unwrap_or_default())).collect();
    let filter =
        SeccompFilter::new(rules, mismatch, matched, arch).map_err(|e| unsupported(e.to_string()))?;
    let bpf: BpfProgram =
        filter.try_into().map_err(|e: seccompiler::BackendError| unsupported(e.to_string()))?;
    Ok(bpf.iter().map(|i| Seccomp::pack(i.code, i.jt, i.jf, i.k)).collect())
}

/// On x86_64, x32-ABI calls carry x86_64's architecture with bit 30 set in
/// the number, so no per-number rule matches them: this program answers
/// each `ENOSYS` (seccompiler cannot say "numbers at or above").
#[cfg(target_arch = "x86_64")]
fn guard() -> Vec<Vec<u64>> {
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    vec![vec![
        Seccomp::pack(0x20, 0, 0, 0),                                       // ld [nr]
        Seccomp::pack(0x35, 0, 1, X32_SYSCALL_BIT),                         // jge X32 ? next : skip
        Seccomp::pack(0x06, 0, 0, SECCOMP_RET_ERRNO | libc::ENOSYS as u32), // ret ENOSYS
        Seccomp::pack(0x06, 0, 0, SECCOMP_RET_ALLOW),                       // ret ALLOW
    ]]
}
#[cfg(not(target_arch = "x86_64"))]
fn guard() -> Vec<Vec<u64>> {
    Vec::new()
}

/// The profile's flags as `SECCOMP_FILTER_FLAG_*` bits. `TSYNC` is
/// harmless (the process is single-threaded when it installs).
fn flags(profile: &LinuxSeccomp) -> u32 {
    let mut bits = 0;
    for flag in profile.flags().iter().flatten() {
        bits |= match flag {
            LinuxSeccompFilterFlag::SeccompFilterFlagTsync => libc::SECCOMP_FILTER_FLAG_TSYNC,
            LinuxSeccompFilterFlag::SeccompFilterFlagLog => libc::SECCOMP_FILTER_FLAG_LOG,
            LinuxSeccompFilterFlag::SeccompFilterFlagSpecAllow => libc::SECCOMP_FILTER_FLAG_SPEC_ALLOW,
        } as u32;
    }
    bits
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn profile(json: serde_json::Value) -> LinuxSeccomp {
        serde_json::from_value(json).expect("a valid profile")
    }

    /// The shape of containerd's default profile (CRI's `RuntimeDefault`,
    /// `ctr run --seccomp`: containerd's `contrib/seccomp/seccomp_default.go`)
    /// for a container without `CAP_SYS_ADMIN`: `ERRNO` by default, every
    /// architecture's names allowed (here every x86_64 and aarch64 call, and
    /// i386-only names this architecture skips), `personality` allowed for
    /// three values, `clone` without namespace flags, `clone3` answered
    /// `ENOSYS`. It compiles within the kernel's limits.
    #[test]
    fn containerds_default_profile_compiles() {
        let mut names: Vec<String> = syscalls::Sysno::iter().map(|s| s.name().to_owned()).collect();
        names.retain(|n| !["clone", "clone3", "personality"].contains(&n.as_str()));
        names.extend(["chown32", "_llseek", "socketcall", "arm_fadvise64_64"].map(String::from));
        let namespaces = 0x7e02_0000_u64; // CLONE_NEWNS|UTS|IPC|USER|PID|NET|CGROUP
        let p = profile(serde_json::json!({
            "defaultAction": "SCMP_ACT_ERRNO",
            "defaultErrnoRet": 1,
            "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
            "syscalls": [
                {"names": names, "action": "SCMP_ACT_ALLOW"},
                {"names": ["personality"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 0, "op": "SCMP_CMP_EQ"}]},
                {"names": ["personality"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 8, "op": "SCMP_CMP_EQ"}]},
                {"names": ["personality"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 4294967295u64, "op": "SCMP_CMP_EQ"}]},
                {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
                 "args": [{"index": 0, "value": namespaces, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]},
                {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}
            ]
        }));
        let compiled = compile(&p).expect("compiles");
        assert_eq!(compiled.programs.len(), 1, "one program");
        let length = compiled.programs[0].len();
        assert!(length <= 4096, "{length} instructions, more than the kernel takes");
        assert_eq!(compiled.flags, 0);
    }

    /// What a VM cannot honour is refused, with its reason.
    #[test]
    fn notify_and_impossible_values_are_refused() {
        let refused = |json: serde_json::Value, reason: &str| {
            let err = compile(&profile(json)).expect_err(reason).to_string();
            assert!(err.contains(reason), "{err}");
        };
        refused(
            serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW",
                               "syscalls": [{"names": ["ioctl"], "action": "SCMP_ACT_NOTIFY"}]}),
            "SCMP_ACT_NOTIFY",
        );
        refused(serde_json::json!({"defaultAction": "SCMP_ACT_NOTIFY"}), "SCMP_ACT_NOTIFY");
        refused(
            serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW",
                               "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_ERRNO", "errnoRet": 65536}]}),
            "errnoRet 65536",
        );
        refused(
            serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW",
                               "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_ERRNO",
                                             "args": [{"index": 6, "value": 0, "op": "SCMP_CMP_EQ"}]}]}),
            "argument 6",
        );
    }

    /// Runs `probe` in a child under `seccomp` (installed as the agent
    /// does, after `no_new_privs`); its exit code.
    fn run_under(seccomp: &Seccomp, probe: fn() -> i32) -> i32 {
        let programs: Vec<Vec<libc::sock_filter>> = seccomp
            .programs
            .iter()
            .map(|p| {
                p.iter()
                    .map(|i| {
                        let (code, jt, jf, k) = Seccomp::unpack(*i);
                        libc::sock_filter { code, jt, jf, k }
                    })
                    .collect()
            })
            .collect();
        // SAFETY: the child makes bare syscalls only, then _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // SAFETY: as above; the programs were built before the fork.
            unsafe {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    libc::_exit(100);
                }
                for p in &programs {
                    let fprog = libc::sock_fprog { len: p.len() as u16, filter: p.as_ptr().cast_mut() };
                    let flags = libc::c_ulong::from(seccomp.flags);
                    if libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, flags, &fprog) != 0 {
                        libc::_exit(101);
                    }
                }
                libc::_exit(probe());
            }
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "the child was not killed: {status:#x}");
        libc::WEXITSTATUS(status)
    }

    /// The errno a bare syscall failed with, or 0 if it did not.
    fn errno_of(rc: libc::c_long) -> i32 {
        if rc < 0 {
            // SAFETY: reads the calling thread's errno.
            unsafe { *libc::__errno_location() }
        } else {
            0
        }
    }

    /// A profile that denies `mkdir` with its own errno and `getpriority`
    /// for one argument value only: installed, `mkdirat` fails with that
    /// errno and makes nothing, `getpriority` fails for that value alone,
    /// and other calls work; an unknown name is skipped, not an error.
    #[test]
    fn a_compiled_profile_denies_what_it_names_with_its_errno() {
        let p = profile(serde_json::json!({
            "defaultAction": "SCMP_ACT_ALLOW",
            "flags": ["SECCOMP_FILTER_FLAG_TSYNC"],
            "syscalls": [
                {"names": ["mkdir", "mkdirat", "no_such_call"], "action": "SCMP_ACT_ERRNO", "errnoRet": 28},
                {"names": ["getpriority"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13,
                 "args": [{"index": 0, "value": 42, "op": "SCMP_CMP_EQ"}]},
                {"names": ["getppid"], "action": "SCMP_ACT_ALLOW"}
            ]
        }));
        let compiled = compile(&p).expect("compiles, the unknown name skipped");
        fn probe() -> i32 {
            let path = c"/tmp/pvisor-seccomp-probe-dir";
            // SAFETY: bare syscalls with valid arguments.
            unsafe {
                if errno_of(libc::syscall(libc::SYS_mkdirat, libc::AT_FDCWD, path.as_ptr(), 0o700))
                    != libc::ENOSPC
                {
                    return 1;
                }
                if errno_of(libc::syscall(libc::SYS_getpriority, 42, 0)) != libc::EACCES {
                    return 2;
                }
                if errno_of(libc::syscall(libc::SYS_getpriority, libc::PRIO_PROCESS, 0)) != 0 {
                    return 3;
                }
                if errno_of(libc::syscall(libc::SYS_getppid)) != 0 {
                    return 4;
                }
            }
            0
        }
        let _ = std::fs::remove_dir("/tmp/pvisor-seccomp-probe-dir");
        assert_eq!(run_under(&compiled, probe), 0, "the probe's failed check");
        assert!(!Path::new("/tmp/pvisor-seccomp-probe-dir").exists(), "mkdir made nothing");
        // The same probe unconfined fails its first check: the profile did it.
        assert_eq!(run_under(&Seccomp::default(), probe), 1);
        let _ = std::fs::remove_dir("/tmp/pvisor-seccomp-probe-dir");
    }

    /// An allow-list profile (containerd's kind): what no entry names, and
    /// a named call whose argument conditions do not hold, gets the default
    /// errno; what entries allow works; of two matching entries the more
    /// restrictive action wins.
    #[test]
    fn an_allow_list_profile_answers_the_rest_with_its_default() {
        let p = profile(serde_json::json!({
            "defaultAction": "SCMP_ACT_ERRNO",
            "defaultErrnoRet": 28,
            "syscalls": [
                {"names": ["exit", "exit_group", "getppid", "getpid"], "action": "SCMP_ACT_ALLOW"},
                {"names": ["getpriority"], "action": "SCMP_ACT_ALLOW",
                 "args": [{"index": 0, "value": 0, "op": "SCMP_CMP_EQ"}]},
                {"names": ["getpid"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13}
            ]
        }));
        let compiled = compile(&p).expect("compiles");
        fn probe() -> i32 {
            let path = c"/tmp/pvisor-seccomp-allow-list-dir";
            // SAFETY: bare syscalls with valid arguments.
            unsafe {
                if errno_of(libc::syscall(libc::SYS_mkdirat, libc::AT_FDCWD, path.as_ptr(), 0o700))
                    != libc::ENOSPC
                {
                    return 1;
                }
                if errno_of(libc::syscall(libc::SYS_getpriority, libc::PRIO_PGRP, 0)) != libc::ENOSPC {
                    return 2;
                }
                if errno_of(libc::syscall(libc::SYS_getpriority, libc::PRIO_PROCESS, 0)) != 0 {
                    return 3;
                }
                if errno_of(libc::syscall(libc::SYS_getppid)) != 0 {
                    return 4;
                }
                if errno_of(libc::syscall(libc::SYS_getpid)) != libc::EACCES {
                    return 5;
                }
            }
            0
        }
        assert_eq!(run_under(&compiled, probe), 0, "the probe's failed check");
        assert!(!Path::new("/tmp/pvisor-seccomp-allow-list-dir").exists(), "mkdir made nothing");
    }
}
