//! The escape corpus: every case runs a hostile action inside the real
//! sandbox and asserts that it failed to get out. Each case is a test.
//!
//! Symlinks planted against apply are next to the effects tests
//! (`e2e effects::a_staged_symlink_*`, `effects::a_directory_swapped_*`), and
//! the network's walls next to the network tests (`e2e network::*`).

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

#[path = "../e2e/support.rs"]
mod support;

use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::*;

fn escaped(out: &std::process::Output) -> bool {
    text(&out.stdout).contains("ESCAPED")
}

#[test]
fn writing_outside_through_proc_self_root() {
    let env = Env::new(As::Root);
    let target = format!("/etc/pvisor-escape-root-{}", std::process::id());
    let out = env.run_sh(&format!("echo x > /proc/self/root{target} 2>/dev/null && echo ESCAPED; true"));
    assert!(!escaped(&out) && !Path::new(&target).exists());
}

#[test]
fn writing_outside_through_proc_1_cwd_and_root() {
    let env = Env::new(As::Rootless);
    let out = env.run_sh(
        "ls /proc/1/cwd/ >/dev/null 2>&1 && echo ESCAPED-cwd-readable; \
         ls /proc/1/root/ >/dev/null 2>&1 && echo ESCAPED-root-readable; \
         ls -l /proc/1/fd/ 2>/dev/null | grep -q . && echo ESCAPED-fds; true",
    );
    assert!(!escaped(&out), "{}", text(&out.stdout));
}

const SUPERVISOR_PROBE: &str = r#"
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
for _ in range(100):
    if os.path.exists('supervisor.pid'):
        break
    time.sleep(0.05)
sup = int(open('supervisor.pid').read())
def argv(p):
    try:
        return open(f'/proc/{p}/cmdline', 'rb').read().split(b'\0')
    except OSError:
        return []
visible = [p for p in os.listdir('/proc') if p.isdigit() and argv(p)[:2] and argv(p)[0].endswith(b'pvisor') and argv(p)[1:2] == [b'run']]
print('ESCAPED-visible' if visible else 'hidden')
rc = libc.ptrace(16, sup, 0, 0)
print('ESCAPED-ptrace' if rc == 0 else 'ptrace refused', ctypes.get_errno())
print('ESCAPED-proc' if os.path.exists(f'/proc/{sup}/environ') and os.access(f'/proc/{sup}/environ', os.R_OK) else 'proc refused')
"#;

#[test]
fn the_supervisor_is_out_of_sight_and_out_of_reach() {
    let env = Env::new(As::Rootless);
    env.write("probe.py", SUPERVISOR_PROBE);
    let child =
        env.command(&["run", "--", "/usr/bin/python3", "probe.py"]).stdout(Stdio::piped()).spawn().unwrap();
    // The sandbox learns the supervisor's host pid from a file the test writes.
    fs::write(env.ws.join("supervisor.pid"), child.id().to_string()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("ptrace refused") && stdout.contains("hidden"),
        "the probe did not run: {stdout}"
    );
    assert!(!escaped(&out), "{stdout}");
}

#[test]
fn regaining_capabilities_through_a_new_user_namespace() {
    let env = Env::new(As::Rootless);
    let out = env.run_sh(
        "unshare -Ur true 2>/dev/null && echo ESCAPED-unshare; \
         unshare -Urm sh -c 'mount -t tmpfs t /mnt' 2>/dev/null && echo ESCAPED-mount; \
         mount -o remount,rw / 2>/dev/null && echo ESCAPED-remount; true",
    );
    assert!(!escaped(&out), "{}", text(&out.stdout));
}

#[test]
fn a_symlink_race_against_apply_never_writes_outside() {
    let env = Env::new(As::Rootless);
    assert!(env
        .run_sh("mkdir d; i=0; while [ $i -lt 3000 ]; do echo $i > d/f$i; i=$((i+1)); done")
        .status
        .success());
    let outside = env.dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    env.give_away(&outside);
    let apply = env
        .command(&["apply", "--all", "--force"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Swap the workspace directory for a symlink to `outside`, over and over,
    // while apply runs.
    let (d, real) = (env.ws.join("d"), env.ws.join("d.real"));
    let start = Instant::now();
    let mut apply = apply;
    while start.elapsed() < Duration::from_secs(5) {
        if apply.try_wait().unwrap().is_some() {
            break;
        }
        if d.is_dir() && !d.is_symlink() {
            let _ = fs::rename(&d, &real);
            let _ = std::os::unix::fs::symlink(&outside, &d);
        } else {
            let _ = fs::remove_file(&d);
            let _ = fs::rename(&real, &d);
        }
    }
    let _ = apply.wait();
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0, "apply wrote through the swapped symlink");
}

#[test]
fn filling_the_disk_through_the_stage_loses_nothing_recorded() {
    // A 2 MiB state directory: the command's writes fail with ENOSPC; whatever
    // pvisor recorded stays readable and never claims an unconfirmed success.
    let env = Env::new(As::Rootless);
    fs::create_dir(&env.home).unwrap();
    env.give_away(&env.home);
    let inner = format!(
        "mount -t tmpfs -o size=2m tmpfs {home} && cd {ws} && {bin} run -- sh -c 'head -c 8388608 /dev/zero > big; echo wrote=$?'; echo RUN=$?; {bin} status --json; echo STATUS=$?",
        home = env.home.display(),
        ws = env.ws.display(),
        bin = bin()
    );
    let out = unshare_as_test_user()
        .args(["-Urm", "sh", "-c", &inner])
        .env("PVISOR_HOME", &env.home)
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(stdout.contains("wrote=1") || stdout.contains("RUN=125"), "the write must fail: {stdout}");
    assert!(stdout.contains("STATUS=0"), "the records stay readable: {stdout}\n{}", text(&out.stderr));
    if stdout.contains("\"state\":\"completed\"") {
        assert!(stdout.contains("\"receipt\":\"valid\""), "{stdout}");
    }
}

fn fork_bomb_is_contained(who: As) {
    if !who.available() {
        return;
    }
    let env = Env::new(who);
    let start = Instant::now();
    // The bomb fills the sandbox's process budget; the main process then exits
    // and init takes every bomb process with it.
    let out = env.pvisor(&["run", "--pids", "32", "--", "sh", "-c", "f() { f | f & }; f & exec sleep 2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(start.elapsed() < Duration::from_secs(30));
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    let limits = env.events(&job).into_iter().find(|e| e["type"] == "attempt.limits").unwrap();
    assert!(limits["data"]["limits"].as_array().unwrap().iter().any(|l| l["limit"] == "pids"), "{limits}");

    // The attack failed: forks past the budget are refused with EAGAIN.
    env.write(
        "forks.py",
        "import os, time\nok = 0\nerr = None\nfor _ in range(100):\n    try:\n        if os.fork() == 0:\n            time.sleep(5); os._exit(0)\n        ok += 1\n    except OSError as e:\n        err = e.errno; break\nprint('forked', ok, 'errno', err)\n",
    );
    let out = env.pvisor(&["run", "-q", "--pids", "32", "--", "/usr/bin/python3", "forks.py"]);
    let said = text(&out.stdout);
    let forked: usize = said.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(usize::MAX);
    assert!(forked < 32, "{said}");
    assert!(said.contains(&format!("errno {}", libc::EAGAIN)), "{said}");
}

/// With no flags at all, a run still has a process limit that holds (4096),
/// and a memory limit where a cgroup can enforce one. The values are read
/// from the kernel inside the sandbox, not from pvisor's record.
fn default_limits_hold(who: As) {
    if !who.available() {
        return;
    }
    let env = Env::new(who);
    let script = r#"awk '/^Max processes/ {print $3}' /proc/self/limits
        if [ -e /sys/fs/cgroup/cgroup.controllers ]; then
            p=$(grep '^0::' /proc/self/cgroup | cut -d: -f3)
            cat /sys/fs/cgroup$p/pids.max /sys/fs/cgroup$p/memory.max 2>/dev/null || echo none none
        else
            p=$(grep ':pids:' /proc/self/cgroup | cut -d: -f3); m=$(grep ':memory:' /proc/self/cgroup | cut -d: -f3)
            cat /sys/fs/cgroup/pids$p/pids.max 2>/dev/null || echo none
            cat /sys/fs/cgroup/memory$m/memory.limit_in_bytes 2>/dev/null || echo none
        fi"#;
    let out = env.run_sh(script);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    let limits = env.events(&job).into_iter().find(|e| e["type"] == "attempt.limits").unwrap();
    let list = limits["data"]["limits"].as_array().unwrap().clone();
    let pids = list.iter().find(|l| l["limit"] == "pids").expect("a default pids limit");
    assert_eq!(pids["value"], "4096", "{limits}");
    assert!(!pids["by"].as_str().unwrap().starts_with("not enforced"), "{limits}");
    let memory = list.iter().find(|l| l["limit"] == "memory").expect("a default memory limit");
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().map(str::trim).collect();
    if pids["by"].as_str().unwrap().starts_with("cgroup") {
        assert_eq!(lines[1], "4096", "the kernel's pids.max for the sandbox: {stdout}");
        let info = rustix::system::sysinfo();
        let ram = (info.totalram as u64) * u64::from(info.mem_unit);
        let set: u64 = lines[2].parse().unwrap_or_else(|_| panic!("no memory limit in the kernel: {stdout}"));
        assert!(
            set <= ram / 2 && set > ram / 2 - (1 << 20),
            "memory limit {set} is not half of {ram}: {limits}"
        );
        assert!(memory["by"].as_str().unwrap().starts_with("cgroup"), "{limits}");
    } else {
        assert_eq!(lines[0], "4096", "RLIMIT_NPROC in the sandbox: {stdout}");
        assert!(memory["by"].as_str().unwrap().starts_with("not enforced"), "said, not pretended: {limits}");
    }
}

#[test]
fn default_limits_hold_as_root() {
    default_limits_hold(As::Root);
}

#[test]
fn default_limits_hold_rootless() {
    default_limits_hold(As::Rootless);
}

#[test]
fn a_fork_bomb_under_pids_is_contained_as_root() {
    fork_bomb_is_contained(As::Root);
}

#[test]
fn a_fork_bomb_under_pids_is_contained_rootless() {
    fork_bomb_is_contained(As::Rootless);
}

#[test]
fn memory_exhaustion_under_memory_is_stopped_and_said() {
    if !As::Root.available() {
        return;
    }
    let env = Env::new(As::Root);
    let out = env.pvisor(&[
        "run",
        "--memory",
        "64M",
        "--",
        "/usr/bin/python3",
        "-c",
        "x = bytearray(400 * 1024 * 1024); print('survived')",
    ]);
    assert!(!text(&out.stdout).contains("survived"));
    let status = env.status_json(None);
    assert_eq!(status["state"], "failed", "{status}");
    assert!(
        status["error"].as_str().is_some_and(|e| e.contains("OOM killer")) || status["exit_code"] == 1,
        "{status}"
    );
}

/// Real root maps to uid 0 in the sandbox; with capabilities it could simply
/// remount the read-only host tree read-write. Every such door must be shut.
#[test]
fn root_in_the_sandbox_cannot_make_the_host_writable() {
    if !As::Root.available() {
        return;
    }
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
         "name_to_handle_at": (303, -100, 0, 0, 0, 0), "vhangup": (153,)}
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
    assert_eq!(stdout.matches("refused 1\n").count(), 20, "every call refused with EPERM: {stdout}");
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
    let inner = format!(
        "bash -c 'set -m; (PVISOR_HOME={} {} run -q -- sh -c \"test -t 0 && echo TTY-STDIN || echo NO-TTY-STDIN\" &) ; sleep 2'",
        env.home.display(),
        bin()
    );
    let out = env.under_terminal(&inner);
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
    for (label, launch) in [
        ("background", "bash -c 'set -m; ({pvisor} &) ; sleep 3'"),
        ("stdin redirected", "{pvisor} < /dev/null"),
    ] {
        let pvisor = format!("PVISOR_HOME={} {} run -q -- sh probe.sh", env.home.display(), bin());
        let inner = launch.replace("{pvisor}", &pvisor);
        let out = env.under_terminal(&inner);
        let stdout = text(&out.stdout);
        for attack in ["TTY-ON-", "CHANGED-MODES", "READ-THROUGH"] {
            assert!(!stdout.contains(attack), "{label}: {attack}: {stdout}");
        }
        assert!(stdout.contains("VISIBLE-OUT") && stdout.contains("VISIBLE-ERR"), "{label}: {stdout}");
    }
}

/// Another state directory of the same user (its staged files, records and
/// the control socket of a live vm Job) is hidden from every sandbox, not
/// only the current state directory.
#[test]
fn another_state_directory_and_its_vm_control_socket_are_out_of_reach() {
    let env = Env::new(As::Rootless);
    // Outside /tmp: the sandbox's /tmp is private, which would hide it anyway.
    let other_dir = tempfile::Builder::new().prefix("pvisor-e2e-other-").tempdir_in("/var/tmp").unwrap();
    env.give_away(other_dir.path());
    let other = other_dir.path().join("state");
    let in_other = |args: &[&str]| {
        let mut cmd = env.command(args);
        cmd.env("PVISOR_HOME", &other);
        cmd
    };
    let out = in_other(&["run", "-q", "--", "sh", "-c", "echo STAGED-SECRET > secret.txt"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut vm = None;
    if vm_image().is_some() {
        vm = Some(in_other(&["run", "-q", "--executor", "vm", "--", "sleep", "120"]).spawn().unwrap());
    } else {
        eprintln!("no guest image: checking the staged files only");
    }
    let control = || -> Option<std::path::PathBuf> {
        let runs = fs::read_dir(other.join("runs")).ok()?;
        runs.flatten().map(|r| r.path().join("attempts/1/vm/control.sock")).find(|p| p.exists())
    };
    let socket = vm.as_ref().map(|_| {
        assert!(wait_until(Duration::from_secs(180), || control().is_some()), "the vm Job never started");
        control().unwrap()
    });
    let stage_glob = format!("{}/runs/*/stage/upper/secret.txt", other.display());
    let connect = socket.as_ref().map_or(String::new(), |s| {
        format!(
            "/usr/bin/python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect('{}'); print('CONNECTED-TO-CONTROL')\" 2>/dev/null;",
            s.display()
        )
    });
    let script = format!(
        "cat {stage_glob} 2>/dev/null; ls {} 2>/dev/null | grep -q runs && echo LISTED-OTHER; {connect} true",
        other.display()
    );
    // Positive control: outside a sandbox the same script does reach it all.
    let unsandboxed = text(&std::process::Command::new("sh").args(["-c", &script]).output().unwrap().stdout);
    assert!(unsandboxed.contains("STAGED-SECRET") && unsandboxed.contains("LISTED-OTHER"), "{unsandboxed}");
    if socket.is_some() {
        assert!(unsandboxed.contains("CONNECTED-TO-CONTROL"), "{unsandboxed}");
    }
    let out = env.pvisor(&["run", "-q", "--", "sh", "-c", &script]);
    let stdout = text(&out.stdout);
    if let Some(mut vm) = vm {
        let _ = in_other(&["kill", "--grace", "1s"]).output();
        let _ = vm.kill();
        let _ = vm.wait();
    }
    assert!(out.status.success(), "{}", text(&out.stderr));
    for leaked in ["STAGED-SECRET", "LISTED-OTHER", "CONNECTED-TO-CONTROL"] {
        assert!(!stdout.contains(leaked), "{leaked}: {stdout}");
    }
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    let hidden = env
        .events(&job)
        .into_iter()
        .any(|e| e["type"] == "admission.rewrite" && e["data"]["reason"] == "another pvisor state directory");
    assert!(hidden, "the other state directory is hidden and recorded");
}

/// The last run failed as its command did, with a valid receipt and `changes` staged.
fn sealed_with_receipt(env: &Env, changes: u64) {
    let status = env.status_json(None);
    assert_eq!(
        (status["state"].as_str(), status["receipt"].as_str()),
        (Some("failed"), Some("valid")),
        "{status}"
    );
    assert_eq!(status["changes"], changes, "{status}");
}

/// A command cannot make its own run impossible to seal: directories and
/// files it made unreadable, and a tree deeper than PATH_MAX, are sealed,
/// the exit code and receipt are recorded, apply and gc still work.
fn sealing_cannot_be_blocked(who: As) {
    if !who.available() {
        return;
    }
    let env = Env::new(who);
    let out = env
        .run_sh("mkdir -p a/b && echo x > a/b/f && echo y > secret && chmod 000 a/b/f a/b a secret; exit 3");
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    sealed_with_receipt(&env, 4);
    env.expect(&["apply", "--all"], 0);
    let mode = |rel: &str| fs::symlink_metadata(env.ws.join(rel)).unwrap().permissions().mode() & 0o7777;
    use std::os::unix::fs::PermissionsExt;
    assert_eq!((mode("a"), mode("secret")), (0, 0), "the staged modes are applied, last");

    // Deeper than PATH_MAX (220 levels of 20-character names: 4,620 bytes).
    let deep = "import os, sys\nfor _ in range(220):\n    os.mkdir('d' * 20)\n    os.chdir('d' * 20)\nopen('f', 'w').write('deep')\nsys.exit(4)\n";
    env.write("deep.py", deep);
    std::thread::sleep(Duration::from_millis(25));
    let out = env.pvisor(&["run", "--", "/usr/bin/python3", "deep.py"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    sealed_with_receipt(&env, 221);
    // Its stage (and the unreadable one's) can be freed with pvisor alone.
    let gc = env.pvisor(&["gc", "--force", "--older-than", "0s", "--json"]);
    assert_eq!(gc.status.code(), Some(0), "{}", text(&gc.stdout));
    assert!(!text(&gc.stdout).contains("\"failed\""), "{}", text(&gc.stdout));
    for run in fs::read_dir(env.home.join("runs")).unwrap().flatten() {
        assert!(!run.path().join("stage/upper").exists(), "{} kept its stage", run.path().display());
    }
    // Make the workspace removable again for the test's own cleanup.
    for rel in ["a/b", "a", "secret"] {
        let _ = fs::set_permissions(env.ws.join(rel), fs::Permissions::from_mode(0o700));
    }
    let _ = fs::set_permissions(env.ws.join("a/b"), fs::Permissions::from_mode(0o700));
}

#[test]
fn sealing_cannot_be_blocked_as_root() {
    sealing_cannot_be_blocked(As::Root);
}

#[test]
fn sealing_cannot_be_blocked_rootless() {
    sealing_cannot_be_blocked(As::Rootless);
}

/// A host service listening on a Unix socket in a world-writable, read-only
/// (to the sandbox) place: `connect(2)` and `sendto(2)` ignore read-only
/// mounts, so only the overlay view stops them (`ns/host_view.rs`).
const SOCKET_SERVER: &str = r#"
import os, socket, sys, time
d = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.bind(d + '/stream.sock'); s.listen(64)
g = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); g.bind(d + '/dgram.sock')
q = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); q.bind(d + '/seqpacket.sock'); q.listen(64)
for name in ('stream', 'dgram', 'seqpacket'):
    os.chmod(d + '/' + name + '.sock', 0o777)
open(d + '/ready', 'w').close()
time.sleep(120)
"#;

const SOCKET_PROBE: &str = r#"
import socket, sys
d = sys.argv[1]
for kind, name in ((socket.SOCK_STREAM, 'stream'), (socket.SOCK_SEQPACKET, 'seqpacket')):
    s = socket.socket(socket.AF_UNIX, kind)
    try:
        s.connect(d + '/' + name + '.sock'); print('ESCAPED-' + name)
    except OSError as e:
        print(name, 'refused', e.errno)
g = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
try:
    g.sendto(b'x', d + '/dgram.sock'); print('ESCAPED-dgram')
except OSError as e:
    print('dgram refused', e.errno)
"#;

fn host_sockets_are_unreachable(who: As) {
    if !who.available() {
        return;
    }
    let env = Env::new(who);
    // Outside the workspace and outside /tmp and /run (which the sandbox gets
    // fresh): a directory the sandbox sees read-only.
    let service = tempfile::Builder::new().prefix("pvisor-escape-").tempdir_in("/var/tmp").unwrap();
    let dir = service.path().to_owned();
    fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut server = std::process::Command::new("python3")
        .args(["-c", SOCKET_SERVER, dir.to_str().unwrap()])
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || dir.join("ready").exists()), "the server never started");
    env.write("probe.py", SOCKET_PROBE);
    let probe = |extra: &[&str]| {
        let mut args = vec!["run", "-q"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "/usr/bin/python3", "probe.py", dir.to_str().unwrap()]);
        let out = env.pvisor(&args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    // Positive control: the same probe outside a sandbox reaches all three.
    let bare = std::process::Command::new("python3")
        .args(["-c", SOCKET_PROBE, dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(text(&bare.stdout).matches("ESCAPED").count(), 3, "{}", text(&bare.stdout));

    let sandboxed = probe(&[]);
    // ECONNREFUSED: the overlay's copy of the socket has no listener (not a
    // permission error, which the exposed case below rules out).
    assert_eq!(sandboxed.matches(" refused 111").count(), 3, "{sandboxed}");
    assert!(!sandboxed.contains("ESCAPED"), "{sandboxed}");
    // --expose-socket lets exactly the named one through, and says so.
    let stream = dir.join("stream.sock");
    let exposed = probe(&["--expose-socket", stream.to_str().unwrap()]);
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    let _ = server.kill();
    let _ = server.wait();
    assert!(exposed.contains("ESCAPED-stream"), "{exposed}");
    assert!(!exposed.contains("ESCAPED-seqpacket") && !exposed.contains("ESCAPED-dgram"), "{exposed}");
    let events = env.events(&job);
    assert!(
        events.iter().any(|e| e["type"] == "admission.rewrite"
            && e["data"]["rewrite"] == "expose.socket"
            && e["data"]["path"] == stream.to_str().unwrap()),
        "the exposure is not in the Trace"
    );
    let facts = events.iter().find(|e| e["type"] == "attempt.ns").expect("attempt.ns");
    assert_eq!(facts["data"]["sockets_reachable_under"], serde_json::json!([]), "{facts}");
}

#[test]
fn host_sockets_are_unreachable_as_root() {
    host_sockets_are_unreachable(As::Root);
}

#[test]
fn host_sockets_are_unreachable_rootless() {
    host_sockets_are_unreachable(As::Rootless);
}

#[test]
fn exposing_a_non_socket_or_pvisors_own_socket_is_refused() {
    let env = Env::new(As::Rootless);
    let file = env.dir.path().join("plain");
    fs::write(&file, "").unwrap();
    for (path, says) in [
        (file.to_str().unwrap().to_owned(), "is not a Unix socket"),
        ("/nonexistent/agent.sock".to_owned(), "no such socket"),
    ] {
        let out = env.pvisor(&["run", "--expose-socket", &path, "--", "true"]);
        assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
        assert!(text(&out.stderr).contains(says), "{}", text(&out.stderr));
    }
}

/// A 20 GiB sparse file (4 KiB on disk) cannot stall the seal or fill the
/// disk on apply: it is hashed without reading its holes and applied sparse,
/// with the same contents and the same digest as a dense copy would have.
fn a_huge_sparse_file_seals_and_applies_sparse(who: As) {
    if !who.available() {
        return;
    }
    let env = Env::new(who);
    let out = env.run_sh(
        "truncate -s 20G huge && printf x | dd of=huge bs=1 seek=10737418240 conv=notrunc 2>/dev/null && \
         dd if=/dev/zero of=zeros bs=1M count=2 2>/dev/null && exit 5",
    );
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    sealed_with_receipt(&env, 2);
    let staged = env.review();
    let huge = staged.iter().find(|c| c["path"] == "huge").expect("huge staged");
    assert_eq!(huge["size"], 20u64 << 30);
    env.expect(&["apply", "--all"], 0);
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(env.ws.join("huge")).unwrap();
    assert_eq!(meta.len(), 20 << 30);
    assert!(meta.blocks() * 512 <= 1 << 20, "apply wrote {} bytes of a sparse file", meta.blocks() * 512);
    let mut byte = [0u8; 1];
    std::os::unix::fs::FileExt::read_exact_at(
        &fs::File::open(env.ws.join("huge")).unwrap(),
        &mut byte,
        10 << 30,
    )
    .unwrap();
    assert_eq!(&byte, b"x");
    // The applied file has the digest the Bundle recorded (a hole and written
    // zeros hash alike), and so does a dense copy of the zeros file.
    let applied = pvisor_digest(&env.ws.join("huge"));
    assert_eq!(huge["blake3"].as_str(), Some(applied.as_str()));
    let zeros = staged.iter().find(|c| c["path"] == "zeros").unwrap();
    assert_eq!(zeros["size"], 2u64 << 20);
    assert_eq!(zeros["blake3"].as_str(), Some(pvisor_digest(&env.ws.join("zeros")).as_str()));
    let _ = fs::remove_file(env.ws.join("huge"));
}

fn pvisor_digest(path: &Path) -> String {
    pvisor_core::digest::digest(&fs::File::open(path).unwrap()).unwrap()
}

#[test]
fn a_huge_sparse_file_seals_and_applies_sparse_as_root() {
    a_huge_sparse_file_seals_and_applies_sparse(As::Root);
}

#[test]
fn a_huge_sparse_file_seals_and_applies_sparse_rootless() {
    a_huge_sparse_file_seals_and_applies_sparse(As::Rootless);
}

/// `--disk SIZE`: writing past it fails with ENOSPC inside the sandbox, the
/// run still seals with its exit code, and what was staged (a deletion, a
/// directory the command locked, the part of the file that fit) is whole.
fn a_disk_quota_holds_inside_the_sandbox(who: As) {
    if !who.available() {
        return;
    }
    let env = Env::new(who);
    env.write("doomed", "delete me\n");
    let out = env.pvisor(&[
        "run",
        "-q",
        "--disk",
        "8M",
        "--",
        "sh",
        "-c",
        "rm doomed; mkdir -p locked/in && echo kept > locked/in/f && chmod 000 locked; \
         dd if=/dev/zero of=big bs=1M count=32 2>/tmp/ddlog; echo dd=$?; grep -c 'No space left' /tmp/ddlog; exit 7",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    assert!(
        stdout.contains("dd=1") && stdout.contains("\n1\n"),
        "the write past the quota did not fail with ENOSPC: {stdout}"
    );
    let staged = env.review();
    let size =
        |path: &str| staged.iter().find(|c| c["path"] == path).map(|c| c["size"].as_u64().unwrap_or(0));
    let big = size("big").expect("big is staged");
    assert!(big > 0 && big <= 8 << 20, "big is {big} bytes");
    assert!(staged.iter().any(|c| c["path"] == "doomed" && c["kind"] == "deleted"), "{staged:?}");
    let status = env.status_json(None);
    assert_eq!(
        (status["exit_code"].as_i64(), status["receipt"].as_str()),
        (Some(7), Some("valid")),
        "{status}"
    );
    let job = status["job"].as_str().unwrap().to_owned();
    let limits = env.events(&job).into_iter().find(|e| e["type"] == "attempt.limits").unwrap();
    assert!(limits.to_string().contains("tmpfs size="), "{limits}");
    env.expect(&["apply", "--all"], 0);
    assert!(!env.ws.join("doomed").exists());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(fs::symlink_metadata(env.ws.join("locked")).unwrap().permissions().mode() & 0o777, 0);
    fs::set_permissions(env.ws.join("locked"), fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(fs::read_to_string(env.ws.join("locked/in/f")).unwrap(), "kept\n");
}

#[test]
fn a_disk_quota_holds_inside_the_sandbox_as_root() {
    a_disk_quota_holds_inside_the_sandbox(As::Root);
}

#[test]
fn a_disk_quota_holds_inside_the_sandbox_rootless() {
    a_disk_quota_holds_inside_the_sandbox(As::Rootless);
}

/// A limit the host cannot enforce is said before the command starts (here:
/// a CPU rate, rootless on a host that delegates no cgroup), not only in the
/// records afterwards.
#[test]
fn an_unenforceable_limit_is_said_before_the_command_starts() {
    let env = Env::new(As::Rootless);
    let out = env.pvisor(&["run", "--cpus", "0.5", "--", "sh", "-c", "echo COMMAND-STARTED >&2"]);
    let stderr = text(&out.stderr);
    let started = stderr.find("COMMAND-STARTED").expect("the command ran");
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    let limits = env.events(&job).into_iter().find(|e| e["type"] == "attempt.limits").unwrap();
    let cpus =
        limits["data"]["limits"].as_array().unwrap().iter().find(|l| l["limit"] == "cpus").unwrap().clone();
    if !cpus["by"].as_str().unwrap().starts_with("not enforced") {
        return eprintln!("skipped: this host enforces --cpus for an unprivileged user ({cpus})");
    }
    let warned = stderr.find("--cpus 0.5 is not enforced").unwrap_or_else(|| panic!("no warning: {stderr}"));
    assert!(warned < started, "the warning came after the command started: {stderr}");
    assert_eq!(stderr.matches("--cpus 0.5 is not enforced").count(), 1, "said twice: {stderr}");
}

/// Hard links share blocks in the `--disk` tmpfs but would be copied out as
/// files: a command must not multiply its quota on the host's disk by
/// linking. The copy stops at the quota and the records say so.
#[test]
fn hard_links_cannot_multiply_the_disk_quota() {
    let env = Env::new(As::Rootless);
    let out = env.pvisor(&[
        "run",
        "-q",
        "--disk",
        "8M",
        "--",
        "sh",
        "-c",
        "head -c 4000000 /dev/urandom > big && for i in $(seq 40); do ln big link$i; done; exit 0",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("the stage is incomplete"), "{}", text(&out.stderr));
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    assert!(env.events(&job).iter().any(|e| e["type"] == "attempt.stage_incomplete"));
    let staged: u64 = fs::read_dir(env.home.join("runs"))
        .unwrap()
        .flatten()
        .flat_map(|r| fs::read_dir(r.path().join("stage/upper")).unwrap().flatten())
        .map(|f| f.metadata().map(|m| m.len()).unwrap_or(0))
        .sum();
    assert!(staged <= 8 << 20, "{staged} bytes reached the host's disk for an 8 MiB quota");
}

/// A fifo in a skeleton directory of the host view (here `/`) is shown as
/// an empty read-only file: opening a fifo ignores read-only mounts, so
/// binding it would give the sandbox a channel to a host process.
#[test]
fn a_host_fifo_is_not_a_channel_out() {
    use std::os::unix::fs::OpenOptionsExt;
    if !As::Root.available() {
        return;
    }
    let env = Env::new(As::Root);
    let fifo = format!("/pvisor-escape-fifo-{}", std::process::id());
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let reader = fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&fifo).unwrap();
    let script = format!("printf ESCAPED > {fifo} 2>/dev/null; true");
    let out = env.run_sh(&script);
    let mut got = Vec::new();
    let _ = std::io::Read::read_to_end(&mut &reader, &mut got);
    let _ = fs::remove_file(&fifo);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(got.is_empty(), "the sandbox wrote to a host fifo: {:?}", String::from_utf8_lossy(&got));
}
