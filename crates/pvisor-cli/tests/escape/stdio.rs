//! Descriptors 0–2: what pvisor was started with must not reach the command
//! as a host file. A file there is the host's inode on its read-write mount
//! (`/proc/self/fd/0` reopens it for writing, `fchmod` sets its mode), a
//! directory there leads to the host's `/` through `..`. The command gets a
//! pipe relayed to the original instead, or `/dev/null` for a directory.

use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use super::*;

/// Every byte value, several pipe buffers' worth.
fn binary_input() -> Vec<u8> {
    (0..300_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

/// `< file` (outside the workspace): the command reads it byte for byte and
/// cannot rewrite it through `/proc/self/fd/0`.
fn a_file_on_stdin_is_read_but_not_rewritten(who: As) {
    let env = Env::new(who);
    let input = env.dir.path().join("data.csv");
    let content = binary_input();
    fs::write(&input, &content).unwrap();
    env.give_away(&input);
    let out = env
        .command(&["run", "-q", "--", "sh", "-c", "cat; echo ESCAPED > /proc/self/fd/0; echo PROBE-RAN >&2"])
        .stdin(fs::File::open(&input).unwrap())
        .output()
        .unwrap();
    assert!(text(&out.stderr).contains("PROBE-RAN"), "{}", text(&out.stderr));
    assert_eq!(out.stdout, content, "stdin reaches the command byte-exact");
    assert_eq!(fs::read(&input).unwrap(), content, "the input file was rewritten");
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn a_file_on_stdin_is_read_but_not_rewritten_as_root() {
    a_file_on_stdin_is_read_but_not_rewritten(As::Root);
}

#[test]
fn a_file_on_stdin_is_read_but_not_rewritten_rootless() {
    a_file_on_stdin_is_read_but_not_rewritten(As::Rootless);
}

/// `> out.bin`: the output arrives, but `fchmod(1, 04755)` cannot turn it
/// into a setuid copy of a root binary; `2>&1` keeps the two streams in order.
fn a_file_on_stdout_gets_the_output_not_a_mode(who: As) {
    let env = Env::new(who);
    let target = env.dir.path().join("out.bin");
    let file = fs::File::create(&target).unwrap();
    fs::set_permissions(&target, fs::Permissions::from_mode(0o644)).unwrap();
    env.give_away(&target);
    let probe = "import os, sys\n\
                 os.write(1, open('/usr/bin/id', 'rb').read())\n\
                 try:\n    os.fchmod(1, 0o4755)\nexcept OSError as e:\n    pass\n\
                 try:\n    os.fchown(1, 0, 0)\nexcept OSError as e:\n    pass\n\
                 print('PROBE-RAN', file=sys.stderr)";
    let out = env
        .command(&["run", "-q", "--", "python3", "-c", probe])
        .stdout(file.try_clone().unwrap())
        .output()
        .unwrap();
    assert!(text(&out.stderr).contains("PROBE-RAN"), "{}", text(&out.stderr));
    assert_eq!(fs::read(&target).unwrap(), fs::read("/usr/bin/id").unwrap(), "the output arrives");
    let meta = fs::metadata(&target).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o644, "the command changed the host file's mode");
    let owner = if who == As::Root { 0 } else { UNPRIVILEGED };
    assert_eq!(meta.uid(), owner);

    let both = env.dir.path().join("both.txt");
    let file = fs::File::create(&both).unwrap();
    env.give_away(&both);
    let out = env
        .command(&["run", "-q", "--", "sh", "-c", "echo one; echo two >&2; echo three; echo four >&2"])
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(fs::read_to_string(&both).unwrap(), "one\ntwo\nthree\nfour\n", "2>&1 keeps its order");
}

#[test]
fn a_file_on_stdout_gets_the_output_not_a_mode_as_root() {
    a_file_on_stdout_gets_the_output_not_a_mode(As::Root);
}

#[test]
fn a_file_on_stdout_gets_the_output_not_a_mode_rootless() {
    a_file_on_stdout_gets_the_output_not_a_mode(As::Rootless);
}

const DIRECTORY_PROBE: &str = r#"import os, sys
fd = int(sys.argv[1])
try:
    os.close(os.open("../planted", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    print("ESCAPED-created", file=sys.stderr)
except OSError as e:
    print("create refused", e.errno, file=sys.stderr)
try:
    victim = os.open("../victim", os.O_WRONLY | os.O_TRUNC, dir_fd=fd)
    os.write(victim, b"overwritten")
    print("ESCAPED-overwrote", file=sys.stderr)
except OSError as e:
    print("overwrite refused", e.errno, file=sys.stderr)
for path in (f"/proc/self/fd/{fd}/../planted2",):
    try:
        open(path, "w").close()
        print("ESCAPED-proc-path", file=sys.stderr)
    except OSError as e:
        print("proc path refused", e.errno, file=sys.stderr)
print("PROBE-RAN", file=sys.stderr)
"#;

/// A directory on stdin (`< dir`) or on stdout (a `subprocess` caller's
/// `stdout=fd`): its `..` would reach the host's tree. The command gets
/// `/dev/null` there, and pvisor says so on one line.
fn a_directory_on_stdin_or_stdout_does_not_reach_the_host(who: As) {
    let env = Env::new(who);
    let outside = env.dir.path().join("outside");
    let inner = outside.join("inner");
    fs::create_dir_all(&inner).unwrap();
    env.give_away(&outside);
    // Root-owned 0644: only root could overwrite it.
    let victim = outside.join("victim");
    fs::write(&victim, "original").unwrap();
    std::os::unix::fs::chown(&victim, Some(0), Some(0)).unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o644)).unwrap();
    for (fd, name) in [(0, "stdin"), (1, "stdout")] {
        let dir = OwnedFd::from(fs::File::open(&inner).unwrap());
        // The probe works on a copy (fd 3): Python refuses to start with a
        // directory on its own stdin.
        let script = format!("exec 3<&{fd}; exec python3 -c \"$0\" 3 </dev/null >/dev/null");
        let mut command = env.command(&["run", "-q", "--", "sh", "-c", &script, DIRECTORY_PROBE]);
        if fd == 0 {
            command.stdin(dir);
        } else {
            command.stdout(dir);
        }
        let out = command.output().unwrap();
        let stderr = text(&out.stderr);
        assert!(stderr.contains("PROBE-RAN"), "{name}: {stderr}");
        assert!(!stderr.contains("ESCAPED"), "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("pvisor: warning: {name} (fd {fd}) is a directory")),
            "{name}: one clear warning: {stderr}"
        );
        for planted in ["planted", "planted2"] {
            assert!(!outside.join(planted).exists(), "{name}: a file was created outside: {stderr}");
        }
        assert_eq!(fs::read_to_string(&victim).unwrap(), "original", "{name}: {stderr}");
    }
}

#[test]
fn a_directory_on_stdin_or_stdout_does_not_reach_the_host_as_root() {
    a_directory_on_stdin_or_stdout_does_not_reach_the_host(As::Root);
}

#[test]
fn a_directory_on_stdin_or_stdout_does_not_reach_the_host_rootless() {
    a_directory_on_stdin_or_stdout_does_not_reach_the_host(As::Rootless);
}

/// stdin on a FIFO whose writer never closes it: its relay must not hold
/// the run open once the command has ended, and what was written arrives.
#[test]
fn a_stdin_fifo_that_never_ends_does_not_hold_the_run_open() {
    use rustix::fs::{Mode, OFlags};
    let env = Env::new(As::Rootless);
    let fifo = env.dir.path().join("fifo");
    rustix::fs::mknodat(rustix::fs::CWD, &fifo, rustix::fs::FileType::Fifo, Mode::from_raw_mode(0o600), 0)
        .unwrap();
    // Held open for writing by the test for the whole run.
    let writer = rustix::fs::open(&fifo, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty()).unwrap();
    rustix::io::write(&writer, b"first line\n").unwrap();
    let reader = rustix::fs::open(&fifo, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).unwrap();
    let started = Instant::now();
    let out = env
        .command(&["run", "-q", "--", "sh", "-c", "head -n 1; echo PROBE-RAN"])
        .stdin(reader)
        .output()
        .unwrap();
    let took = started.elapsed();
    drop(writer);
    assert_eq!(text(&out.stdout), "first line\nPROBE-RAN\n", "{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(0));
    assert!(took < Duration::from_secs(10), "the run waited for the FIFO: {took:?}");
}

/// Sandboxed root cannot `chmod` the host's `/dev/null` (or any device node
/// the sandbox's `/dev` binds): they are read-only binds, still usable.
#[test]
fn the_sandboxs_device_nodes_cannot_be_chmodded() {
    let env = Env::new(As::Root);
    let before: Vec<u32> =
        ["/dev/null", "/dev/zero"].iter().map(|p| fs::metadata(p).unwrap().permissions().mode()).collect();
    let out = env.run_sh(
        "chmod 0666 /dev/null 2>/dev/null && echo ESCAPED-null; chmod 0666 /dev/zero 2>/dev/null && echo ESCAPED-zero; \
         echo x > /dev/null && head -c 3 /dev/zero | wc -c && echo PROBE-RAN",
    );
    let stdout = text(&out.stdout);
    assert!(stdout.contains("3\nPROBE-RAN"), "the devices still work: {stdout} {}", text(&out.stderr));
    assert!(!escaped(&out), "{stdout}");
    let after: Vec<u32> =
        ["/dev/null", "/dev/zero"].iter().map(|p| fs::metadata(p).unwrap().permissions().mode()).collect();
    assert_eq!(before, after);
}

/// A background run's output on the user's terminal: clipboard writes
/// (OSC 52), device queries whose answers the terminal would type into the
/// shell, and conceal never reach it; text and colours do, and pvisor's
/// summary starts with an SGR reset.
#[test]
fn a_background_runs_terminal_output_is_sanitised() {
    let env = Env::new(As::Root);
    let hostile = r"\033]52;c;ZWNobyBwd25lZA==\007\033[6n\033[c\033P$qm\033\\\033[21t\033[8mHIDDEN\033[0m VISIBLE-OUT \033[31mRED\033[0m\n";
    let script = format!("printf '{hostile}'; printf '\\033]0;title\\007\\033[8mVISIBLE-ERR\\n' >&2");
    std::fs::write(env.ws.join("probe.sh"), script).unwrap();
    let pvisor = format!("PVISOR_HOME={} {} run -- sh probe.sh", env.home.display(), bin());
    let out = env.under_terminal(&env.in_background(&pvisor));
    let shown = text(&out.stdout);
    assert!(shown.contains("VISIBLE-OUT") && shown.contains("VISIBLE-ERR"), "the probe ran: {shown:?}");
    assert!(shown.contains("\x1b[31mRED\x1b[0m"), "colours pass: {shown:?}");
    for attack in ["\x1b]", "\x1b[6n", "\x1b[c", "\x1bP", "\x1b[21t", "\x1b[8m"] {
        assert!(!shown.contains(attack), "{attack:?} reached the terminal: {shown:?}");
    }
    assert!(shown.contains("\x1b[0mpvisor: job-"), "the summary starts with a reset: {shown:?}");
}

/// The stdin relay reads ahead, but a regular file's offset (shared with
/// the caller, as in `while read f; do pvisor run …; done < list`) is put
/// back where the command stopped reading.
#[test]
fn a_relayed_stdin_file_is_left_where_the_command_stopped_reading() {
    let env = Env::new(As::Root);
    let list = env.dir.path().join("list");
    fs::write(&list, "line1\nline2\nline3\n").unwrap();
    let pvisor = format!("PVISOR_HOME={} {} run -q --", env.home.display(), bin());
    let script = format!(
        "while read f; do echo \"got $f\"; {pvisor} true; done; \
         exec < \"$0\"; {pvisor} dd bs=1 count=3 2>/dev/null; echo; cat"
    );
    let out = std::process::Command::new("sh")
        .args(["-c", &script, &list.to_string_lossy()])
        .current_dir(&env.ws)
        .stdin(fs::File::open(&list).unwrap())
        .output()
        .unwrap();
    assert_eq!(
        text(&out.stdout),
        "got line1\ngot line2\ngot line3\nlin\ne1\nline2\nline3\n",
        "{}",
        text(&out.stderr)
    );
}

/// pvisor's peak RSS (KiB) over a run whose stdout is a terminal it does
/// not own (stdin is /dev/null), the command printing `script`.
fn peak_rss_of_a_sanitised_run(env: &Env, script: &str) -> (u64, String) {
    std::fs::write(env.ws.join("probe.sh"), script).unwrap();
    let measure = format!(
        "import resource, subprocess\n\
         subprocess.run(['{}', 'run', '-q', '--', 'sh', 'probe.sh'], stdin=subprocess.DEVNULL)\n\
         print('PEAK-RSS', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)",
        bin()
    );
    let as_user =
        if env.who == As::Rootless { "setpriv --reuid 4242 --regid 4242 --clear-groups" } else { "" };
    let home = env.home.display();
    let out = env.under_terminal(&format!("{as_user} env PVISOR_HOME={home} python3 -c \"{measure}\""));
    let shown = text(&out.stdout);
    let peak = shown.split("PEAK-RSS ").nth(1).and_then(|s| s.split_whitespace().next()?.parse().ok());
    (peak.unwrap_or_else(|| panic!("no measurement: {shown:?}")), shown)
}

/// An OSC string that never ends (`ESC ]` then megabytes) on a terminal the
/// command does not own: the sanitiser drops it without holding it, so
/// pvisor's memory does not grow with what the command prints.
fn an_endless_terminal_string_does_not_grow_pvisors_memory(who: As) {
    let env = Env::new(who);
    let (small, _) = peak_rss_of_a_sanitised_run(&env, "printf '\\033]0;x\\007SMALL-DONE\\n'");
    let (endless, shown) = peak_rss_of_a_sanitised_run(
        &env,
        "printf '\\033]0;'; head -c 8000000 /dev/zero | tr '\\0' a; printf '\\007PROBE-RAN\\n'",
    );
    assert!(shown.contains("PROBE-RAN") && !shown.contains("aaaa"), "{shown:?}");
    assert!(endless < small + 4096, "pvisor held the string: {small} KiB, then {endless} KiB");
}

#[test]
fn an_endless_terminal_string_does_not_grow_pvisors_memory_as_root() {
    an_endless_terminal_string_does_not_grow_pvisors_memory(As::Root);
}

#[test]
fn an_endless_terminal_string_does_not_grow_pvisors_memory_rootless() {
    an_endless_terminal_string_does_not_grow_pvisors_memory(As::Rootless);
}

/// stdout on a FIFO nobody reads (held open, so writes block rather than
/// fail): its relay must not hold a cancelled run open. pvisor forwards
/// SIGTERM, the command dies of it, and pvisor ends within its kill grace,
/// with the signal as its exit status, as when the command held the FIFO.
fn a_stdout_fifo_nobody_reads_does_not_hold_a_cancelled_run_open(who: As) {
    use rustix::fs::{Mode, OFlags};
    use std::io::Read;
    let env = Env::new(who);
    let fifo = env.dir.path().join("fifo");
    rustix::fs::mknodat(rustix::fs::CWD, &fifo, rustix::fs::FileType::Fifo, Mode::from_raw_mode(0o600), 0)
        .unwrap();
    // Read-write: it opens without a reader, and the test never reads it.
    let stuck = rustix::fs::open(&fifo, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty()).unwrap();
    let mut child = env
        .command(&["run", "--kill-grace", "1s", "--", "sh", "-c", "echo PROBE-RAN >&2; exec yes"])
        .stdout(stuck)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !text(&seen).contains("PROBE-RAN") && stderr.read(&mut byte).unwrap() == 1 {
        seen.push(byte[0]);
    }
    assert!(text(&seen).contains("PROBE-RAN"), "{}", text(&seen));
    // Let the FIFO and the relay's pipe fill up.
    std::thread::sleep(Duration::from_millis(500));
    rustix::process::kill_process(rustix::process::Pid::from_child(&child), rustix::process::Signal::TERM)
        .unwrap();
    let cancelled = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if cancelled.elapsed() > Duration::from_secs(8) {
            child.kill().unwrap();
            panic!("pvisor still runs {:?} after SIGTERM", cancelled.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = stderr.read_to_end(&mut seen);
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{}", text(&seen));
}

#[test]
fn a_stdout_fifo_nobody_reads_does_not_hold_a_cancelled_run_open_as_root() {
    a_stdout_fifo_nobody_reads_does_not_hold_a_cancelled_run_open(As::Root);
}

#[test]
fn a_stdout_fifo_nobody_reads_does_not_hold_a_cancelled_run_open_rootless() {
    a_stdout_fifo_nobody_reads_does_not_hold_a_cancelled_run_open(As::Rootless);
}

/// A foreground run (stdin the terminal pvisor is the foreground job of)
/// whose stdout is another terminal: that one is not the command's to
/// drive, so what reaches it is sanitised like a background run's (no
/// clipboard write, no query whose answer it would type into its shell).
fn another_terminal_on_stdout_gets_sanitised_output(who: As) {
    let env = Env::new(who);
    let probe =
        r"printf 'VISIBLE-OUT \033]52;c;ZWNobyBwd25lZA==\007\033[6n\033[31mRED\033[0m\n'; echo PROBE-RAN";
    std::fs::write(env.ws.join("probe.sh"), probe).unwrap();
    let driver = format!(
        "import os, select, subprocess\n\
         master, slave = os.openpty()\n\
         status = subprocess.run(['{}', 'run', '-q', '--', 'sh', 'probe.sh'], stdout=slave).returncode\n\
         os.close(slave)\n\
         shown = b''\n\
         while select.select([master], [], [], 0.5)[0]:\n    \
             try:\n        chunk = os.read(master, 4096)\n    \
             except OSError:\n        break\n    \
             if not chunk:\n        break\n    \
             shown += chunk\n\
         print('STATUS', status, 'OTHER-TERMINAL', repr(shown))",
        bin()
    );
    std::fs::write(env.ws.join("driver.py"), driver).unwrap();
    let as_user = if who == As::Rootless { "setpriv --reuid 4242 --regid 4242 --clear-groups" } else { "" };
    let home = env.home.display();
    let out = env.under_terminal(&format!("{as_user} env PVISOR_HOME={home} python3 driver.py"));
    let report = text(&out.stdout);
    let shown = report.split("OTHER-TERMINAL").nth(1).unwrap_or_else(|| panic!("no report: {report:?}"));
    assert!(report.contains("STATUS 0 "), "{report:?}");
    assert!(shown.contains("VISIBLE-OUT") && shown.contains("PROBE-RAN"), "{shown}");
    assert!(shown.contains(r"\x1b[31mRED\x1b[0m"), "colours pass: {shown}");
    for attack in [r"\x1b]", r"\x1b[6n"] {
        assert!(!shown.contains(attack), "{attack} reached the other terminal: {shown}");
    }
}

#[test]
fn another_terminal_on_stdout_gets_sanitised_output_as_root() {
    another_terminal_on_stdout_gets_sanitised_output(As::Root);
}

#[test]
fn another_terminal_on_stdout_gets_sanitised_output_rootless() {
    another_terminal_on_stdout_gets_sanitised_output(As::Rootless);
}

/// pvisor started with stdin closed and an eventfd (an anonymous inode:
/// nothing to copy) on stdout: neither slot is filled by one of pvisor's own
/// descriptors (its spec pipe, a state file); the command sees `/dev/null`
/// in both, and pvisor names the eventfd it refused.
fn a_closed_stdin_and_an_eventfd_stdout_are_dev_null(who: As) {
    use std::os::unix::process::CommandExt;
    let env = Env::new(who);
    let eventfd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    let probe = "for fd in 0 1; do echo \"fd$fd=$(readlink /proc/$$/fd/$fd)\" >&2; done; echo PROBE-RAN >&2";
    let mut command = env.command(&["run", "-q", "--", "sh", "-c", probe]);
    command.stdout(eventfd).stderr(Stdio::piped());
    // SAFETY: close is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            libc::close(0);
            Ok(())
        });
    }
    let out = command.output().unwrap();
    let stderr = text(&out.stderr);
    assert!(stderr.contains("PROBE-RAN"), "{stderr}");
    assert!(stderr.contains("fd0=/dev/null\nfd1=/dev/null\n"), "{stderr}");
    assert!(stderr.contains("pvisor: warning: stdout (fd 1) is neither a file"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

#[test]
fn a_closed_stdin_and_an_eventfd_stdout_are_dev_null_as_root() {
    a_closed_stdin_and_an_eventfd_stdout_are_dev_null(As::Root);
}

#[test]
fn a_closed_stdin_and_an_eventfd_stdout_are_dev_null_rootless() {
    a_closed_stdin_and_an_eventfd_stdout_are_dev_null(As::Rootless);
}

const SCM_RIGHTS_PROBE: &str = r#"import array, os, socket, sys
try:
    s = socket.socket(fileno=os.dup(1))
    root = os.open("/", os.O_RDONLY)
    s.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [root]))])
    print("ESCAPED-sent-a-descriptor", file=sys.stderr)
except OSError as e:
    print("sendmsg refused", e.errno, file=sys.stderr)
os.write(1, b"BYTES-ARRIVE\n")
print("PROBE-RAN", file=sys.stderr)
"#;

/// A socket on stdout (a `socketpair` caller): the command gets a pipe
/// relayed to it, so it cannot `sendmsg` a descriptor (`SCM_RIGHTS`) to
/// the caller; its bytes still arrive.
fn a_socket_on_stdout_takes_bytes_not_descriptors(who: As) {
    use std::io::Read;
    let env = Env::new(who);
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let out = env
        .command(&["run", "-q", "--", "python3", "-c", SCM_RIGHTS_PROBE])
        .stdout(OwnedFd::from(theirs))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert!(stderr.contains("PROBE-RAN") && stderr.contains("sendmsg refused"), "{stderr}");
    assert!(!stderr.contains("ESCAPED"), "{stderr}");
    let mut got = String::new();
    (&ours).read_to_string(&mut got).unwrap();
    assert_eq!(got, "BYTES-ARRIVE\n");
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn a_socket_on_stdout_takes_bytes_not_descriptors_as_root() {
    a_socket_on_stdout_takes_bytes_not_descriptors(As::Root);
}

#[test]
fn a_socket_on_stdout_takes_bytes_not_descriptors_rootless() {
    a_socket_on_stdout_takes_bytes_not_descriptors(As::Rootless);
}
