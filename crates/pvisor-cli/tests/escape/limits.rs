//! Resource limits hold inside the sandbox: a full stage, fork bombs,
//! memory, default limits, huge sparse files, disk quotas and hard links
//! cannot get past them, and a limit that cannot be enforced is said.

use super::*;

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
    who.require();
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
    who.require();
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
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn default_limits_hold_as_root() {
    default_limits_hold(As::Root);
}

#[test]
fn default_limits_hold_rootless() {
    default_limits_hold(As::Rootless);
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn a_fork_bomb_under_pids_is_contained_as_root() {
    fork_bomb_is_contained(As::Root);
}

#[test]
fn a_fork_bomb_under_pids_is_contained_rootless() {
    fork_bomb_is_contained(As::Rootless);
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn memory_exhaustion_under_memory_is_stopped_and_said() {
    As::Root.require();
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

/// A shell whose child the OOM killer ended passes that on as 137 (128 +
/// SIGKILL), as a container's keeper does in a VM: the result keeps the
/// status and says why, not just "exit 137".
#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn an_oom_kill_passed_on_as_137_is_said() {
    As::Root.require();
    let env = Env::new(As::Root);
    // One line of 400 MiB: tail keeps all of it, in anonymous memory.
    let hog = "head -c 400M /dev/zero | tail >/dev/null; status=$?; echo \"status $status\"; exit $status";
    let out = env.pvisor(&["run", "--memory", "64M", "--", "/bin/sh", "-c", hog]);
    assert!(text(&out.stdout).contains("status 137"), "the hog was not OOM-killed: {}", text(&out.stdout));
    let status = env.status_json(None);
    assert_eq!(
        (status["state"].as_str(), status["exit_code"].as_i64()),
        (Some("failed"), Some(137)),
        "{status}"
    );
    assert!(status["error"].as_str().is_some_and(|e| e.contains("OOM killer")), "{status}");
}

/// A 20 GiB sparse file (4 KiB on disk) cannot stall the seal or fill the
/// disk on apply: it is hashed without reading its holes and applied sparse,
/// with the same contents and the same digest as a dense copy would have.
fn a_huge_sparse_file_seals_and_applies_sparse(who: As) {
    who.require();
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
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
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
    who.require();
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
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
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
        // This host enforces --cpus for an unprivileged user: nothing to warn of.
        assert!(!stderr.contains("is not enforced"), "an enforced limit was said not to be: {cpus} {stderr}");
        return;
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

/// `--memory SIZE` covers the sandbox's tmpfs: `/tmp`, `/dev/shm`, `/run`
/// and `/dev` together stay within it (the rootless address-space rlimit
/// does not count tmpfs pages, and the kernel's default is half the host's
/// RAM per mount), so filling them fails with ENOSPC.
fn tmpfs_stays_within_the_memory_limit(who: As) {
    who.require();
    let env = Env::new(who);
    let out = env.pvisor(&[
        "run",
        "-q",
        "--memory",
        "64M",
        "--",
        "sh",
        "-c",
        "head -c 4M /dev/zero > /tmp/small && echo SMALL-OK; \
         for d in /tmp /dev/shm /run /dev; do err=$(head -c 65M /dev/zero 2>&1 > $d/fill); echo \"$d=$?\"; \
           case $err in *'No space left'*) echo ENOSPC;; esac; rm -f $d/fill; done; \
         df -k /tmp /dev/shm /run /dev | awk 'NR > 1 { sum += $2 } END { print \"total=\" sum }'",
    ]);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("SMALL-OK"), "{stdout} {}", text(&out.stderr));
    for dir in ["/tmp", "/dev/shm", "/run", "/dev"] {
        assert!(stdout.contains(&format!("{dir}=1\nENOSPC\n")), "{dir} took more than the limit: {stdout}");
    }
    let total: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("total="))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(total <= 64 << 10, "the tmpfs sizes add up to {total} KiB: {stdout}");
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn tmpfs_stays_within_the_memory_limit_as_root() {
    tmpfs_stays_within_the_memory_limit(As::Root);
}

#[test]
fn tmpfs_stays_within_the_memory_limit_rootless() {
    tmpfs_stays_within_the_memory_limit(As::Rootless);
}
