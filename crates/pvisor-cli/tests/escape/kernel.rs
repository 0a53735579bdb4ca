//! What the kernel would hand a sandboxed process: root's powers over the
//! host, calls seccomp refuses, descriptors pvisor was started with, and the
//! user's terminal (TIOCSTI, background reads, fds 0-2).

use super::*;

/// Real root maps to uid 0 in the sandbox; with capabilities it could simply
/// remount the read-only host tree read-write. Every such door must be shut.
#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn root_in_the_sandbox_cannot_make_the_host_writable() {
    As::Root.require();
    let env = Env::new(As::Root);
    let ws = fs::canonicalize(&env.ws).unwrap();
    let escape = format!("/etc/pvisor-escape-{}", std::process::id());
    let script = format!(
        r#"
        mount -o remount,rw,bind / 2>/dev/null && echo ESCAPE-remount-root
        mount -o remount,rw,bind /etc 2>/dev/null && echo ESCAPE-remount-etc
        umount -l {ws} 2>/dev/null && echo ESCAPE-unmounted-workspace
        umount -l {home} 2>/dev/null && echo ESCAPE-unmounted-state-cover
        mount -t tmpfs tmpfs /mnt 2>/dev/null && echo ESCAPE-mounted
        unshare -m sh -c 'mount -o remount,rw,bind /etc' 2>/dev/null && echo ESCAPE-unshare-m
        unshare -Urm sh -c 'mount -o remount,rw,bind /etc && touch {escape}' 2>/dev/null && echo ESCAPE-nested-userns
        touch {escape} 2>/dev/null && echo ESCAPE-wrote-etc
        echo core > /proc/sys/kernel/core_pattern 2>/dev/null && echo ESCAPE-sysctl-core-pattern
        echo 1 > /proc/sys/vm/drop_caches 2>/dev/null && echo ESCAPE-sysctl-vm
        echo h > /proc/sysrq-trigger 2>/dev/null && echo ESCAPE-sysrq
        head -c 1 /proc/kcore 2>/dev/null | grep -q . && echo ESCAPE-kcore
        grep -E '^Cap(Eff|Prm|Bnd|Amb):' /proc/self/status
        grep NoNewPrivs /proc/self/status
        "#,
        ws = ws.display(),
        home = env.home.display(),
    );
    let out = env.run_sh(&script);
    let stdout = text(&out.stdout);
    assert!(!stdout.contains("ESCAPE"), "{stdout}");
    assert!(!std::path::Path::new(&escape).exists(), "wrote the host's /etc");
    for line in [
        "CapEff:\t0000000000000000",
        "CapPrm:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "CapAmb:\t0000000000000000",
        "NoNewPrivs:\t1",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in {stdout}");
    }
}

/// TIOCSTI pushes bytes into a terminal's input queue. Run from the sandbox, it
/// must reach only the sandbox's own terminal, never the shell that started pvisor.
#[test]
fn tiocsti_cannot_type_into_the_users_shell() {
    let env = Env::new(As::Root);
    env.write(
        "inject.py",
        "import fcntl, termios\ntry:\n    for c in 'echo PWNED\\n':\n        fcntl.ioctl(0, termios.TIOCSTI, c)\n    print('injected')\nexcept OSError as e:\n    print('refused', e.errno)\n",
    );
    // Two layers, each tested alone: seccomp refuses TIOCSTI outright; without
    // it, the sandbox's own pseudo-terminal is the only one it can reach.
    for (flags, expect) in [("", "refused 1"), ("--no-seccomp", "injected")] {
        // After pvisor exits, the outer shell reads whatever is in its terminal's queue.
        let inner = format!(
            "bash -c 'PVISOR_HOME={} {} run -q {flags} -- /usr/bin/python3 inject.py; read -t 1 line; echo \"GOT:[$line]\"'",
            env.home.display(),
            bin()
        );
        let out = env.under_terminal(&inner);
        let stdout = text(&out.stdout);
        assert!(stdout.contains(expect), "{flags}: {stdout}");
        assert!(stdout.contains("GOT:[]"), "{flags}: the injected line reached the user's shell: {stdout}");
    }
}

/// The seccomp deny-list refuses the escape and kernel-attack surface, while
/// ordinary developer workloads (a compiler, git, Python) keep working.
/// (The probe uses x86_64 syscall numbers.)
#[cfg(target_arch = "x86_64")]
#[test]
fn seccomp_refuses_the_attack_surface_and_keeps_workloads_working() {
    let env = Env::new(As::Rootless);
    env.write(
        "probe.py",
        r#"import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
calls = {"keyctl": (250, 0, 0, 0, 0), "add_key": (248, 0, 0, 0, 0, 0), "bpf": (321, 0, 0, 0),
         "userfaultfd": (323, 0), "perf_event_open": (298, 0, 0, 0, 0, 0), "open_by_handle_at": (304, 0, 0, 0),
         "kexec_load": (246, 0, 0, 0, 0), "init_module": (175, 0, 0, 0), "mount": (165, 0, 0, 0, 0, 0),
         "pivot_root": (155, 0, 0), "unshare_user": (272, 0x10000000), "settimeofday": (164, 0, 0),
         "swapon": (167, 0, 0), "reboot": (169, 0, 0, 0, 0), "setns": (308, 0, 0),
         "io_uring_setup": (425, 8, 0), "io_uring_enter": (426, 0, 0, 0, 0, 0), "io_uring_register": (427, 0, 0, 0, 0),
         "name_to_handle_at": (303, -100, 0, 0, 0, 0), "vhangup": (153,),
         "statmount": (457, 0, 0, 0, 0), "listmount": (458, 0, 0, 0, 0), "open_tree_attr": (467, -100, 0, 0, 0, 0),
         "file_setattr": (469, -100, 0, 0, 0, 0)}
for name, args in calls.items():
    rc = libc.syscall(*args)
    print(name, "ALLOWED" if rc >= 0 else "refused", ctypes.get_errno())
rc = libc.syscall(0x40000000 | 250, 0, 0, 0, 0)
print("x32_keyctl", "ALLOWED" if rc >= 0 else "refused", ctypes.get_errno())
# Socket families: vsock (a route to the hypervisor), packet, Bluetooth, AF_ALG, AF_KEY, XDP, CAN.
for family in (40, 17, 31, 38, 15, 44, 29):
    rc = libc.socket(family, 1, 0)
    rc2 = libc.socket(family, 2, 0)
    print("family", family, "ALLOWED" if rc >= 0 or rc2 >= 0 else "refused", ctypes.get_errno())
pair = (ctypes.c_int * 2)()
rc = libc.socketpair(40, 1, 0, pair)
print("socketpair_vsock", "ALLOWED" if rc >= 0 else "refused", ctypes.get_errno())
import socket
for family in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK):
    socket.socket(family, socket.SOCK_DGRAM).close()
print("FAMILIES-OK")
"#,
    );
    let out = env.run_sh(
        "/usr/bin/python3 probe.py; \
         printf 'int main(void){return 0;}' > /tmp/t.c && cc /tmp/t.c -o /tmp/t && /tmp/t && echo CC-OK; \
         git init -q /tmp/r && git -C /tmp/r -c user.name=a -c user.email=b commit --allow-empty -qm m && echo GIT-OK; \
         /usr/bin/python3 -c 'import subprocess, threading; threading.Thread(target=print).start(); print(subprocess.run([\"true\"]).returncode)'",
    );
    let stdout = text(&out.stdout);
    assert!(!stdout.contains("ALLOWED"), "{stdout}");
    assert_eq!(stdout.matches("refused 1\n").count(), 24, "every call refused with EPERM: {stdout}");
    // Positive control: outside the sandbox the kernel answers the newest
    // calls itself (EFAULT, EINVAL, ENOSYS on an older kernel), never EPERM.
    let host = std::process::Command::new("/usr/bin/python3")
        .args(["-c", "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nfor a in ((457, 0, 0, 0, 0), (458, 0, 0, 0, 0), (467, -100, 0, 0, 0, 0), (469, -100, 0, 0, 0, 0)):\n    libc.syscall(*a); print(ctypes.get_errno())"])
        .output()
        .unwrap();
    let errnos = text(&host.stdout);
    assert_eq!(errnos.lines().count(), 4, "{errnos}");
    assert!(
        !errnos.lines().any(|e| e == "1"),
        "the host refuses these itself: the check proves nothing: {errnos}"
    );
    assert_eq!(stdout.matches("refused 97\n").count(), 8, "other socket families: EAFNOSUPPORT: {stdout}");
    assert!(stdout.contains("FAMILIES-OK"), "unix, inet, inet6 and netlink still work: {stdout}");
    // Positive control: the refusal is the filter's, not a missing module:
    // as root the host itself creates at least one of these families.
    if is_root() {
        let host = std::process::Command::new("/usr/bin/python3")
            .args(["-c", "import ctypes\nlibc = ctypes.CDLL(None)\nprint(sum(libc.socket(f, t, 0) >= 0 for f in (40, 17, 31, 38, 15, 44, 29) for t in (1, 2, 3)))"])
            .output()
            .unwrap();
        let creatable: u32 = text(&host.stdout).trim().parse().unwrap_or(0);
        assert!(creatable > 0, "no probed family exists on this host: the check would prove nothing");
    }
    assert!(
        stdout.contains("x32_keyctl refused 38"),
        "the x32 ABI is closed, not a way around the filter: {stdout}"
    );
    assert!(stdout.contains("CC-OK") && stdout.contains("GIT-OK"), "{stdout} {}", text(&out.stderr));
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    let policy = env.events(&job).into_iter().find(|e| e["type"] == "admission.policy").unwrap();
    assert_eq!(policy["data"]["seccomp"], true);

    let off = env.pvisor(&["run", "-q", "--no-seccomp", "--", "grep", "Seccomp:", "/proc/self/status"]);
    assert!(text(&off.stdout).contains("0"), "{}", text(&off.stdout));
}

/// Descriptors pvisor was started with never reach the command: an inherited
/// directory descriptor would lead back into the host's writable tree.
#[test]
fn inherited_descriptors_do_not_reach_the_command() {
    use rustix::fs::{Mode, OFlags};
    use std::os::fd::AsRawFd;
    let env = Env::new(As::Rootless);
    // Without O_CLOEXEC, on purpose: it is inherited.
    let dir = rustix::fs::open(env.dir.path(), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    let fd = dir.as_raw_fd();
    assert!(fd > 2);
    let out = env.run_sh(&format!("ls /proc/self/fd/{fd} >/dev/null 2>&1 && echo ESCAPED-fd-{fd}; true"));
    drop(dir);
    assert!(!escaped(&out), "{}", text(&out.stdout));
}

/// A background pvisor must not let the command read keystrokes typed into
/// the foreground shell: its stdin becomes /dev/null.
#[test]
fn a_background_run_cannot_read_the_terminal() {
    let env = Env::new(As::Root);
    let pvisor = format!(
        "PVISOR_HOME={} {} run -q -- sh -c \"test -t 0 && echo TTY-STDIN || echo NO-TTY-STDIN\"",
        env.home.display(),
        bin()
    );
    let out = env.under_terminal(&env.in_background(&pvisor));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("NO-TTY-STDIN"), "{stdout}");
}

/// Neither in the background nor with stdin redirected does the command get
/// the user's terminal on stdout or stderr (those descriptors are opened
/// read-write): it cannot read keystrokes through them or change the
/// terminal's modes, and its output still reaches the terminal.
#[test]
fn the_command_never_holds_the_users_terminal_on_any_descriptor() {
    let env = Env::new(As::Root);
    let probe = r#"for fd in 0 1 2; do test -t $fd && echo TTY-ON-$fd; done
        stty -echo <&1 2>/dev/null && echo CHANGED-MODES-1
        stty -echo <&2 2>/dev/null && echo CHANGED-MODES-2
        (read -t 1 x <&1) 2>/dev/null && echo READ-THROUGH-1
        (read -t 1 x <&2) 2>/dev/null && echo READ-THROUGH-2
        echo VISIBLE-OUT; echo VISIBLE-ERR >&2"#;
    std::fs::write(env.ws.join("probe.sh"), probe).unwrap();
    let pvisor = format!("PVISOR_HOME={} {} run -q -- sh probe.sh", env.home.display(), bin());
    for (label, inner) in
        [("background", env.in_background(&pvisor)), ("stdin redirected", format!("{pvisor} < /dev/null"))]
    {
        let out = env.under_terminal(&inner);
        let stdout = text(&out.stdout);
        for attack in ["TTY-ON-", "CHANGED-MODES", "READ-THROUGH"] {
            assert!(!stdout.contains(attack), "{label}: {attack}: {stdout}");
        }
        assert!(stdout.contains("VISIBLE-OUT") && stdout.contains("VISIBLE-ERR"), "{label}: {stdout}");
    }
}
