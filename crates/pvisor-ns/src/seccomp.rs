//! The command's seccomp filter: a deny-list of the escape and kernel-attack
//! surface, on top of the dropped capabilities (defence in depth against
//! kernel bugs reachable without privileges).
//!
//! Refused with `EPERM`, and why:
//! - `mount`, `umount2`, `pivot_root` and the new mount API (`open_tree`,
//!   `open_tree_attr`, `move_mount`, `fsopen`, `fsconfig`, `fsmount`,
//!   `fspick`, `mount_setattr`): reshaping the filesystem view is how
//!   sandboxes are escaped; `listmount` and `statmount`, which enumerate
//!   mounts by id, beyond what the sandbox's `/proc` shows;
//! - `file_setattr`: file attributes (immutable, append-only, project id)
//!   that no workload sets through a new interface; its reading half,
//!   `file_getattr`, stays allowed;
//! - `unshare`/`clone` with `CLONE_NEWUSER`, and `setns`: a new user namespace
//!   hands out fresh capabilities and a large kernel attack surface;
//! - `kexec_load`, `kexec_file_load`, `init_module`, `finit_module`,
//!   `delete_module`, `reboot`, `swapon`, `swapoff`, `acct`, `quotactl`: host
//!   administration, never a workload's business;
//! - `bpf`, `perf_event_open`, `userfaultfd`: frequent sources of kernel
//!   exploits (userfaultfd is the classic race amplifier);
//! - `keyctl`, `add_key`, `request_key`: the kernel keyring is not namespaced;
//! - `open_by_handle_at`: opens files by handle, bypassing the mount view
//!   (the "shocker" container escape);
//! - `settimeofday`, `clock_settime`, `clock_adjtime`: the host clock;
//! - `ioctl(TIOCSTI)` and `ioctl(TIOCLINUX)`: typing into a terminal;
//! - `io_uring_setup`, `io_uring_enter`, `io_uring_register`: a large kernel
//!   attack surface that also bypasses per-call filtering;
//! - `name_to_handle_at` (the other half of the "shocker" pair),
//!   `lookup_dcookie`, `syslog` (the kernel log), `vhangup`, `fanotify_init`,
//!   and on x86_64 `iopl`, `ioperm`, `uselib`, `ustat`, `sysfs`, `_sysctl`:
//!   what Docker's default profile refuses a container without the matching
//!   capability; docs/threat-model.md compares the two lists.
//!
//! `socket` and `socketpair` get `EAFNOSUPPORT` for every address family but
//! `AF_UNIX`, `AF_INET`, `AF_INET6` and `AF_NETLINK`: `AF_VSOCK` would reach
//! the hypervisor of a host that is itself a VM (vsock is not network
//! namespaced), and packet, Bluetooth, crypto (`AF_ALG`), XDP and the other
//! families are kernel surface no workload needs.
//!
//! `clone3` gets `ENOSYS`: its flags live in memory a filter cannot read, and
//! libc falls back to `clone`, which is checked. On x86_64, every x32-ABI call
//! gets `ENOSYS` too, since it would slip past the per-number rules. `ptrace` stays allowed: the
//! pid namespace already confines it to the sandbox, and debuggers need it.
//! Compilers, package managers, git, Python and Node use none of the above.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

/// Numbers newer than the `libc` crate knows. Since Linux 5.1 every
/// architecture but alpha, mips and ia64 numbers new calls alike, so these
/// hold on x86_64 and aarch64 (include/uapi/asm-generic/unistd.h).
const SYS_STATMOUNT: i64 = 457;
const SYS_LISTMOUNT: i64 = 458;
const SYS_OPEN_TREE_ATTR: i64 = 467;
const SYS_FILE_SETATTR: i64 = 469;

const DENIED: &[i64] = &[
    SYS_STATMOUNT,
    SYS_LISTMOUNT,
    SYS_OPEN_TREE_ATTR,
    SYS_FILE_SETATTR,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_setns,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_open_by_handle_at,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_name_to_handle_at,
    libc::SYS_lookup_dcookie,
    libc::SYS_syslog,
    libc::SYS_vhangup,
    libc::SYS_fanotify_init,
];

/// Calls only x86_64 has, refused for the same reasons as Docker's default
/// profile refuses them: port I/O, and obsolete interfaces with a history of bugs.
#[cfg(target_arch = "x86_64")]
const DENIED_X86_64: &[i64] = &[
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_uselib,
    libc::SYS_ustat,
    libc::SYS_sysfs,
    libc::SYS__sysctl,
];
#[cfg(not(target_arch = "x86_64"))]
const DENIED_X86_64: &[i64] = &[];

/// The socket address families a sandboxed command may create.
const ALLOWED_FAMILIES: [i32; 4] = [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK];

/// The programs to install: the `EPERM` deny-list, `ENOSYS` for clone3, and
/// `EAFNOSUPPORT` for socket families outside [`ALLOWED_FAMILIES`].
#[derive(Debug)]
pub(crate) struct Filters {
    deny: BpfProgram,
    no_clone3: BpfProgram,
    families: BpfProgram,
}

/// On x86_64, x32-ABI system calls carry the same audit arch with bit 30 set
/// in the number, so no per-number rule matches them; this four-instruction
/// guard answers every such call `ENOSYS`. It is the one program not built by
/// seccompiler, which has no way to say "numbers at or above".
#[cfg(target_arch = "x86_64")]
fn refuse_x32() -> Result<(), SeccompError> {
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    let stmt = |code: u16, k: u32| libc::sock_filter { code, jt: 0, jf: 0, k };
    let program = [
        stmt(0x20, 0),                                                      // ld [nr]
        libc::sock_filter { code: 0x35, jt: 0, jf: 1, k: X32_SYSCALL_BIT }, // jge X32 ? next : skip
        stmt(0x06, SECCOMP_RET_ERRNO | libc::ENOSYS as u32),                // ret ENOSYS
        stmt(0x06, SECCOMP_RET_ALLOW),                                      // ret ALLOW
    ];
    let prog =
        libc::sock_fprog { len: program.len() as u16, filter: program.as_ptr() as *mut libc::sock_filter };
    // SAFETY: PR_SET_SECCOMP with a valid program that outlives the call; the
    // kernel copies it.
    let rc = unsafe {
        libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const libc::sock_fprog)
    };
    if rc != 0 {
        return Err(SeccompError::X32(std::io::Error::last_os_error()));
    }
    Ok(())
}

fn arch() -> Result<seccompiler::TargetArch, SeccompError> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|e| SeccompError::Arch { arch: std::env::consts::ARCH, detail: format!("{e:?}") })
}

fn masked(arg: u8, bits: u64) -> Result<SeccompRule, SeccompError> {
    let cond = SeccompCondition::new(arg, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(bits), bits)?;
    Ok(SeccompRule::new(vec![cond])?)
}

fn equals(arg: u8, value: u64) -> Result<SeccompRule, SeccompError> {
    let cond = SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)?;
    Ok(SeccompRule::new(vec![cond])?)
}

/// Why the seccomp filters could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SeccompError {
    #[error("cannot install the x32 guard: {0}")]
    X32(#[source] std::io::Error),
    #[error("no seccomp support for {arch}: {detail}")]
    Arch { arch: &'static str, detail: String },
    #[error("{0}")]
    Backend(#[from] seccompiler::BackendError),
    #[error("{0}")]
    Apply(#[from] seccompiler::Error),
}

/// Builds the filters (before fork: this allocates).
// The ioctl request type is `c_ulong` on some targets and `c_int` on others.
#[allow(clippy::unnecessary_cast)]
pub(crate) fn build() -> Result<Filters, SeccompError> {
    let arch = arch()?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().chain(DENIED_X86_64).map(|&nr| (nr, Vec::new())).collect();
    let newuser = libc::CLONE_NEWUSER as u64;
    rules.insert(libc::SYS_unshare, vec![masked(0, newuser)?]);
    rules.insert(libc::SYS_clone, vec![masked(0, newuser)?]);
    rules.insert(libc::SYS_ioctl, vec![equals(1, libc::TIOCSTI as u64)?, equals(1, libc::TIOCLINUX as u64)?]);
    let deny =
        SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch)?;
    let mut clone3 = BTreeMap::new();
    clone3.insert(libc::SYS_clone3, Vec::new());
    let no_clone3 =
        SeccompFilter::new(clone3, SeccompAction::Allow, SeccompAction::Errno(libc::ENOSYS as u32), arch)?;
    // One rule, all conditions ANDed: the family is none of the allowed ones.
    let other_family = SeccompRule::new(
        ALLOWED_FAMILIES
            .iter()
            .map(|&family| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, family as u64))
            .collect::<Result<Vec<_>, _>>()?,
    )?;
    let mut sockets = BTreeMap::new();
    sockets.insert(libc::SYS_socket, vec![other_family.clone()]);
    sockets.insert(libc::SYS_socketpair, vec![other_family]);
    let families = SeccompFilter::new(
        sockets,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EAFNOSUPPORT as u32),
        arch,
    )?;
    Ok(Filters { deny: deny.try_into()?, no_clone3: no_clone3.try_into()?, families: families.try_into()? })
}

impl Filters {
    /// Installs both filters on the calling thread (needs `no_new_privs`).
    pub(crate) fn apply(&self) -> Result<(), SeccompError> {
        #[cfg(target_arch = "x86_64")]
        refuse_x32()?;
        seccompiler::apply_filter(&self.deny)?;
        seccompiler::apply_filter(&self.families)?;
        Ok(seccompiler::apply_filter(&self.no_clone3)?)
    }
}
