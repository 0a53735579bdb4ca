//! The spec's seccomp profile (`linux.seccomp`) compiled, on the host, into
//! the BPF programs the guest agent installs before the container's process
//! execs: the static agent carries no compiler, only the programs.
//!
//! A profile is libseccomp's model: a default action, and entries giving
//! syscalls (by name, with optional argument comparisons) an action each.
//! seccompiler builds one program per action, so the profile becomes
//! several programs, which the kernel runs together, answering each call
//! with the most restrictive of their results (seccomp(2), "multiple
//! filters"):
//! - the default program answers every call some entry matches `ALLOW`,
//!   every other the default action (left out when that is `ALLOW`);
//! - one program per other action answers what its entries match with that
//!   action and everything else `ALLOW`.
//!
//! A call no entry matches gets the default action; one that entries match
//! gets the most restrictive of their actions (of two `ERRNO`s, the later
//! entry's). As in runc (`libcontainer/seccomp/seccomp_linux.go`): an entry
//! whose action is the default is redundant and skipped; a name this
//! architecture does not have is skipped (profiles list every
//! architecture's names); `SCMP_ACT_KILL` is `KILL_THREAD`; `errnoRet`
//! defaults to `EPERM` for `ERRNO` and for `TRACE` (an untraced process
//! gets `ENOSYS` from `TRACE`, the kernel's rule); comparisons on distinct
//! arguments are ANDed, and several on one argument each make a rule of
//! their own (ORed). Comparisons are on the whole 64-bit argument, as
//! libseccomp's are.
//!
//! The programs are for the host's architecture, which is the guest's (KVM
//! runs the host's). A call through another ABI (i386's `int 0x80`) is
//! killed by each program's architecture check; on x86_64 an x32 call,
//! which carries x86_64's architecture, gets `ENOSYS` from a guard program,
//! since no rule by number would match it.
//!
//! Refused: `SCMP_ACT_NOTIFY` (its listener is a process on the host,
//! which a call inside a VM cannot reach), an `errnoRet` beyond Linux's
//! largest errno (the kernel would not return it as given), an argument
//! index beyond the sixth, and a profile larger than the kernel installs.

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
/// The kernel's limit on the instructions of all programs a call runs
/// through, each counting 4 more (`MAX_INSNS_PER_PATH`, kernel/seccomp.c).
const MAX_INSNS_PER_PATH: usize = 32768;

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
    let mut programs = guard();
    if default != SeccompAction::Allow {
        programs.push(program(listed, default, SeccompAction::Allow, arch)?);
    }
    for (act, matches) in by_action.into_iter().filter(|(a, m)| *a != SeccompAction::Allow && !m.is_empty()) {
        programs.push(program(matches, SeccompAction::Allow, act, arch)?);
    }
    let total: usize = programs.iter().map(|p| p.len() + 4).sum();
    if total > MAX_INSNS_PER_PATH {
        return Err(unsupported(format!("{total} BPF instructions, more than the kernel installs")));
    }
    Ok(Seccomp { programs, flags: flags(profile) })
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
    let filter = SeccompFilter::new(rules, mismatch, matched, arch).map_err(|e| unsupported(e.to_string()))?;
    let bpf: BpfProgram = filter.try_into().map_err(|e: seccompiler::BackendError| unsupported(e.to_string()))?;
    Ok(bpf.iter().map(|i| Seccomp::pack(i.code, i.jt, i.jf, i.k)).collect())
}

/// On x86_64, x32-ABI calls carry x86_64's architecture with bit 30 set in
/// the number, so no per-number rule matches them: this program answers
/// each `ENOSYS` (seccompiler cannot say "numbers at or above").
#[cfg(target_arch = "x86_64")]
fn guard() -> Vec<Vec<u64>> {
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
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
