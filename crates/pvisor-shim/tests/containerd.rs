//! The shim under a real containerd: Debian's containerd package, started
//! by scripts/containerd-env.sh with its own root, state and socket
//! directories, driven with `ctr`. Each container is a pvisor vm Job, so
//! this needs target/vm-image (scripts/vm-image.sh) and takes a VM boot per
//! container (seconds under TCG).
//!
//! The same through CRI: containerd's CRI plugin driven by a small CRI
//! client in Python (tests/cri/cri_flow.py, grpcio from
//! scripts/cri-env.sh), as the kubelet would drive it.
//!
//! The tests are ignored unless included (`--include-ignored`, as
//! scripts/test.sh does as root): they need root (containerd mounts
//! snapshots), containerd and the guest image, and fail, saying which is
//! missing, when included without them.

// A test (or benchmark) program: it writes fixtures and says what it measured
// or skipped; clippy.toml's lints are for the libraries' own code.
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

#[path = "containerd/harness.rs"]
mod harness;
#[path = "containerd/network.rs"]
mod network;
#[path = "containerd/terminal.rs"]
mod terminal;
#[path = "containerd/volumes.rs"]
mod volumes;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use harness::*;
use terminal::{check_sizes, Tty, SIZES};

#[test]
#[ignore = "needs root, containerd and the vm guest image: scripts/test.sh runs it as root, with --include-ignored"]
fn containerd_runs_containers_as_pvisor_vm_jobs() {
    require();
    let c = start(NAMESPACE);
    ctr_run_relays_output_and_exit_code(&c);
    a_running_container_execs_pauses_and_ends(&c);
    sigkill_closes_a_paused_container(&c);
    a_dead_shims_container_is_cleaned_up(&c);
    nothing_of_the_vms_is_left(&c);
}

/// `ctr run`: stdout, stderr and the exit code, exactly; a read-only bind
/// mount is copied into the VM; the capabilities are ctr's default set.
fn ctr_run_relays_output_and_exit_code(c: &Containerd) {
    // ctr run: stdout, stderr and the exit code, exactly; a read-only
    // bind mount is copied into the VM.
    let data = c.dir.path().join("data");
    std::fs::create_dir_all(&data).expect("mkdir");
    std::fs::write(data.join("f"), "from the host\n").expect("write");
    let out = c.ctr(&[
        "run",
        "--rm",
        "--runtime",
        RUNTIME,
        "--mount",
        &format!("type=bind,src={},dst=/data,options=rbind:ro", data.display()),
        IMAGE,
        "exit3",
        "sh",
        "-c",
        "echo out; cat /data/f; grep CapEff /proc/self/status; echo err >&2; exit 3",
    ]);
    // Exactly the capabilities of ctr's default spec (containerd's default
    // set), not every one the guest's root has.
    assert_eq!(
        text(&out.stdout),
        "out\nfrom the host\nCapEff:\t00000000a80425fb\n",
        "stderr: {}",
        text(&out.stderr)
    );
    assert_eq!(text(&out.stderr), "err\n");
    assert_eq!(out.status.code(), Some(3));
}

/// A running container outlives a containerd restart, runs execs (under
/// its seccomp filter, with stdin), pauses, resumes, is checkpointed and
/// ends with SIGTERM.
fn a_running_container_execs_pauses_and_ends(c: &Containerd) {
    // A running container survives a containerd restart; exec into it,
    // then kill it with a signal. It runs under containerd's default
    // seccomp profile (what CRI gives `RuntimeDefault`), and so do its execs.
    c.ok(&["run", "-d", "--seccomp", "--runtime", RUNTIME, IMAGE, "long", "sh", "-c", COUNTER]);
    eventually("the task runs", Duration::from_secs(30), || {
        c.task_status("long").as_deref() == Some("RUNNING")
    });
    c.restart();
    assert_eq!(c.task_status("long").as_deref(), Some("RUNNING"), "the task outlives containerd's restart");
    let exec = c.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "e1",
        "long",
        "sh",
        "-c",
        "echo in; head -1 /etc/passwd; exit 5",
    ]);
    assert_eq!(text(&exec.stdout), "in\nroot:x:0:0:root:/root:/bin/sh\n", "stderr: {}", text(&exec.stderr));
    assert_eq!(exec.status.code(), Some(5));
    pvisors_own_commands_leave_a_running_container_to_containerd(c, "long");
    let filtered =
        c.ok(&["task", "exec", "--exec-id", "sc", "long", "grep", "^Seccomp:", "/proc/self/status"]);
    assert_eq!(filtered, "Seccomp:\t2\n", "the exec runs under the container's filter");
    // Stdin reaches the process, and so does its end: `cat` exits.
    let mut cat = Command::new("ctr")
        .args(["-a", &c.sock, "-n", NAMESPACE, "task", "exec", "--exec-id", "e0", "long", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("ctr runs");
    cat.stdin.take().expect("stdin").write_all(b"through stdin\n").expect("write");
    let cat = cat.wait_with_output().expect("ctr ends");
    assert_eq!(text(&cat.stdout), "through stdin\n");
    assert_eq!(cat.status.code(), Some(0), "cat saw the end of its stdin");
    let count = c.ok(&["task", "exec", "--exec-id", "e2", "long", "cat", "/tmp/count"]);
    assert!(count.trim().parse::<u32>().is_ok_and(|n| n >= 1), "the counter runs: {count:?}");
    let metrics = c.ok(&["task", "metrics", "long"]);
    assert!(
        metrics.contains("memory.usage_in_bytes")
            && metrics.contains("pids.current")
            && metrics.contains("cpuacct.usage"),
        "metrics from the guest: {metrics}"
    );
    let missing = c.ctr(&["task", "exec", "--exec-id", "e3", "long", "/no/such/program"]);
    assert!(!missing.status.success(), "a missing program fails to start");

    // Pause and resume (an execution suspend and a new Attempt): the
    // counter lives on. ctr's checkpoint pauses, checkpoints and resumes.
    let counted = |exec: &str| -> u32 {
        let n = c.ok(&["task", "exec", "--exec-id", exec, "long", "cat", "/tmp/count"]);
        n.trim().parse().unwrap_or_else(|_| panic!("a count: {n:?}"))
    };
    let before = counted("e4");
    c.ok(&["task", "pause", "long"]);
    assert_eq!(c.task_status("long").as_deref(), Some("PAUSED"));
    c.ok(&["task", "resume", "long"]);
    assert_eq!(c.task_status("long").as_deref(), Some("RUNNING"));
    let after = counted("e5");
    assert!(after >= before, "the counter kept its count across the pause: {before} then {after}");
    let mut n = 6;
    eventually("the counter counts on", Duration::from_secs(30), || {
        n += 1;
        counted(&format!("e{n}")) > after
    });
    c.ok(&["task", "checkpoint", "long"]);
    assert!(c.ok(&["images", "ls", "-q"]).contains("checkpoint/long"), "ctr recorded the checkpoint");
    assert_eq!(c.task_status("long").as_deref(), Some("RUNNING"));
    c.ok(&["task", "kill", "-s", "SIGTERM", "long"]);
    eventually("the task stops", Duration::from_secs(30), || {
        c.task_status("long").as_deref() == Some("STOPPED")
    });
    let deleted = c.ctr(&["task", "delete", "long"]);
    assert!(deleted.status.success(), "{}", text(&deleted.stderr));
    assert!(
        text(&deleted.stderr).contains("exit code 143"),
        "SIGTERM is 128 + 15: {}",
        text(&deleted.stderr)
    );
    c.ok(&["container", "rm", "long"]);
}

/// `pvisor kill`, `suspend` and `resume` of a running container's Job are
/// refused, naming the `ctr` command that does it; the container runs on.
fn pvisors_own_commands_leave_a_running_container_to_containerd(c: &Containerd, id: &str) {
    let job = job_of(c, id);
    for (verb, how) in [("kill", "task kill"), ("suspend", "task pause"), ("resume", "task resume")] {
        let out = Command::new(repo().join("target/debug/pvisor"))
            .args([verb, &job])
            .env("PVISOR_HOME", c.home())
            .output()
            .expect("target/debug/pvisor runs");
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "pvisor {verb} of a container's Job is refused: {stderr}");
        assert!(
            stderr.contains(&format!("ctr -n {NAMESPACE} {how} {id}")) && stderr.contains("containerd"),
            "pvisor {verb} names the ctr command: {stderr}"
        );
    }
    assert_eq!(c.task_status(id).as_deref(), Some("RUNNING"), "the container runs on");
}

/// The Job of container `id`.
fn job_of(c: &Containerd, id: &str) -> String {
    let listing = pvisor(c, &["jobs", "--json", "--label", &format!("containerd.io/container={id}")]);
    let jobs: Vec<serde_json::Value> = listing.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert_eq!(jobs.len(), 1, "one Job for container {id}: {jobs:?}");
    jobs[0]["data"]["job"].as_str().expect("a job id").to_owned()
}

/// SIGKILL reaches a paused container: its Job is closed.
fn sigkill_closes_a_paused_container(c: &Containerd) {
    // SIGKILL reaches a paused container: its Job is closed.
    c.ok(&["run", "-d", "--runtime", RUNTIME, IMAGE, "frozen", "sh", "-c", COUNTER]);
    c.ok(&["task", "pause", "frozen"]);
    assert!(
        !c.ctr(&["task", "kill", "-s", "SIGTERM", "frozen"]).status.success(),
        "only SIGKILL reaches a paused VM"
    );
    c.ok(&["task", "kill", "-s", "SIGKILL", "frozen"]);
    eventually("the paused task stops", Duration::from_secs(30), || {
        c.task_status("frozen").as_deref() == Some("STOPPED")
    });
    let deleted = c.ctr(&["task", "delete", "frozen"]);
    assert!(text(&deleted.stderr).contains("exit code 137"), "{}", text(&deleted.stderr));
    c.ok(&["container", "rm", "frozen"]);
}

/// A shim that dies takes its VM with it; containerd's cleanup (the
/// shim's `delete` action) records the Job honestly and frees its disks.
fn a_dead_shims_container_is_cleaned_up(c: &Containerd) {
    // A shim that dies takes its VM with it; containerd's cleanup (the
    // shim's `delete` action) records the Job honestly and frees its disks.
    c.ok(&["run", "-d", "--runtime", RUNTIME, IMAGE, "orphan", "sh", "-c", COUNTER]);
    let list = c.ok(&["task", "ls"]);
    let shim: i32 = list
        .lines()
        .find(|l| l.starts_with("orphan "))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .expect("the task's pid (the shim's)");
    let pid = rustix::process::Pid::from_raw(shim).expect("a pid");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("SIGKILL to the shim");
    eventually("containerd cleans up the dead shim", Duration::from_secs(30), || {
        c.task_status("orphan").is_none()
    });
    c.ok(&["container", "rm", "orphan"]);
}

/// Nothing of the VMs is left: no process, no task, no disk; every
/// container was a Job, labelled with its container and namespace.
fn nothing_of_the_vms_is_left(c: &Containerd) {
    // Nothing of the VMs is left running.
    eventually("every VM is gone", Duration::from_secs(30), || processes_naming(&c.home()).is_empty());
    assert!(c.ok(&["task", "ls"]).lines().count() <= 1, "no task is left");
    // No disk is left: VM disks and checkpoints' images are released. A dead
    // shim's cleanup (`shim delete`, run by containerd) is asynchronous to
    // the task's removal, so it gets its time; it must still happen.
    let disks = || -> Vec<_> {
        walk(&c.home().join("runs"))
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "img"))
            .collect()
    };
    eventually("every VM disk is released", Duration::from_secs(30), || {
        let left = disks();
        if !left.is_empty() {
            eprintln!("waiting for the release of {left:?}");
        }
        left.is_empty()
    });
    let jobs =
        Command::new(repo().join("target/debug/pvisor")).arg("jobs").env("PVISOR_HOME", c.home()).output();
    if let Some(jobs) = jobs.ok().filter(|j| j.status.success()) {
        // Every container was a Job; the orphan's is recorded as lost.
        let listing = text(&jobs.stdout);
        assert!(listing.lines().count() >= 5 && listing.contains("lost"), "pvisor jobs: {listing}");
    }
    // Each Job carries its container's id and namespace as labels.
    let long = pvisor(c, &["jobs", "--json", "--label", "containerd.io/container=long"]);
    let long: Vec<serde_json::Value> = long.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert_eq!(long.len(), 1, "one Job for container long: {long:?}");
    assert_eq!(long[0]["data"]["labels"]["containerd.io/namespace"], NAMESPACE, "{long:?}");
    let job = long[0]["data"]["job"].as_str().expect("a job id");
    assert!(pvisor(c, &["status", job]).contains("containerd.io/container=long"));
    // Its Trace says what containerd ran there: the container's process and
    // each exec, with its start and its exit status.
    let events = pvisor(c, &["events", job, "--json"]);
    let noted = |want: &[&str]| {
        events.lines().any(|l| l.contains("frontend.command") && want.iter().all(|w| l.contains(w)))
    };
    assert!(noted(&["container long: sh -c", "\"background\":true"]), "the start of long: {events}");
    assert!(noted(&["container long: sh -c", "\"exit_code\":143"]), "long's end by SIGTERM: {events}");
    assert!(noted(&["exec in long: sh -c echo in", "\"exit_code\":5"]), "exec e1's exit: {events}");
    assert!(noted(&["exec in long: /no/such/program", "\"error\""]), "exec e3 could not start: {events}");
    // The Job's result carries its container's exit status: 143 for long,
    // stopped by SIGTERM (so `cancelled`, not a failure), 3 for exit3.
    for (container, state, code) in [("long", "cancelled", 143), ("exit3", "cancelled", 3)] {
        let job = job_of(c, container);
        let status = pvisor(c, &["status", "--json", &job]);
        let status: serde_json::Value = serde_json::from_str(status.trim()).expect("one status line");
        assert_eq!(
            (status["data"]["state"].as_str(), status["data"]["exit_code"].as_i64()),
            (Some(state), Some(code)),
            "the Job of {container} ends with its status: {status}"
        );
    }
}

#[test]
#[ignore = "needs root, containerd, the vm guest image and grpcio: scripts/test.sh runs it as root, with --include-ignored"]
fn cri_runs_a_pod_with_the_pvisor_handler() {
    let python = unable().map_or_else(cri_python, Err);
    let python = python.unwrap_or_else(|why| panic!("this machine cannot run the CRI test: {why}"));
    // containerd-env.sh names this image as CRI's sandbox_image: no
    // registry is reachable for a pause image, and the shim runs a pod
    // sandbox's process as its keeper, whatever the image.
    let c = start(CRI_NAMESPACE);
    let logs = c.dir.path().join("pod-logs");
    std::fs::create_dir_all(&logs).expect("mkdir");
    let out = Command::new(python)
        .arg(repo().join("tests/cri/cri_flow.py"))
        .args([&c.sock, IMAGE])
        .arg(&logs)
        .arg(c.home())
        .arg(repo().join("target/agent/x86_64-unknown-linux-gnu/release/pvisor-guest-probe"))
        .stdin(Stdio::null())
        .output()
        .expect("cri_flow.py runs");
    assert!(out.status.success(), "cri_flow.py: {}", text(&out.stderr));
    let seen: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("cri_flow.py's JSON ({e}): {}{}", text(&out.stdout), text(&out.stderr)));
    let at = |key: &str| seen.get(key).cloned().unwrap_or(serde_json::Value::Null);
    assert_eq!(at("error"), serde_json::Value::Null, "a CRI call failed: {seen}");
    assert_eq!(at("cleanup_errors"), serde_json::Value::Null, "{seen}");
    assert_eq!(at("pod_state"), "SANDBOX_READY", "{seen}");
    assert_eq!(at("pod_handler"), "pvisor", "{seen}");
    assert_eq!(at("pod_runtime_type"), RUNTIME, "{seen}");
    assert_eq!(at("container_state"), "CONTAINER_RUNNING", "{seen}");
    // The pod network (CNI's bridge): the pod's IP is the container VM's
    // own, reached from the node, and the VM reaches the node's gateway.
    let pod_ip = at("pod_ip").as_str().unwrap_or_default().to_owned();
    assert!(pod_ip.starts_with("10.232.0."), "CNI gave the pod an address: {seen}");
    assert_eq!(at("inbound"), "served-by-pod\n", "a connection to the pod's IP reached its server: {seen}");
    assert_eq!(
        at("outbound"),
        serde_json::json!({"stdout": "served-by-node\n", "code": 0, "got": "hi\n"}),
        "the pod reached a server on its gateway"
    );
    assert!(
        at("guest_addresses").as_str().is_some_and(|a| a.contains(&format!("inet {pod_ip}/24"))),
        "{seen}"
    );
    assert_eq!(at("echo"), serde_json::json!({"stdout": "hello from cri\n", "stderr": "", "code": 0}));
    assert_eq!(at("fail"), serde_json::json!({"stdout": "", "stderr": "oops\n", "code": 7}));
    // A second container joins the pod's VM (one QEMU for the pod), reaches
    // the first on localhost, has its own root, and its exit code is its
    // own while the first runs on.
    assert_eq!(at("vms_with_two_containers"), 1, "the pod is one VM: {seen}");
    assert_eq!(at("c2_localhost")["stdout"], "served-by-pod\n", "c2 reached c1 on localhost: {seen}");
    assert_eq!(at("c2_own_file"), serde_json::json!({"stdout": "c2\n", "stderr": "", "code": 0}), "{seen}");
    assert_eq!(at("c1_sees_c2_file"), 1, "c1's root is not c2's: {seen}");
    assert!(
        at("c2_pid1").as_str().is_some_and(|p| p.contains("echo c2-started")),
        "c2's init is its PID 1: {seen}"
    );
    assert_eq!(at("c2_sees_c1"), "", "c1's processes are not in c2's pid namespace: {seen}");
    assert_eq!(
        at("c2_dev"),
        serde_json::json!([
            "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty",
            "urandom", "zero"
        ]),
        "c2's /dev has the standard devices only: {seen}"
    );
    assert_eq!(at("c2_in_its_cgroup"), true, "c2's processes are in its own cgroup (cpu.max): {seen}");
    // An exec on a terminal (kubectl exec -it) gets one from c2's own devpts.
    assert!(at("c2_tty").as_str().is_some_and(|t| t.contains("/dev/pts/")), "{seen}");
    assert_eq!(at("c2_exit"), serde_json::json!({"state": "CONTAINER_EXITED", "code": 5}), "{seen}");
    assert_eq!(at("c1_after_c2"), "CONTAINER_RUNNING", "{seen}");
    assert_eq!(at("c1_after_c2_exec")["stdout"], "still-here\n", "{seen}");
    eprintln!("the pod's second container started in {} s", at("second_start_s"));
    // A container over its own memory limit is OOM-killed alone.
    assert_eq!(at("hog_exit"), serde_json::json!({"state": "CONTAINER_EXITED", "code": 137}), "{seen}");
    assert_eq!(at("hog_reason"), "OOMKilled", "{seen}");
    assert_eq!(at("c1_after_hog"), "CONTAINER_RUNNING", "{seen}");
    assert_eq!(at("c1_after_hog_exec")["stdout"], "alive\n", "{seen}");
    let missing = at("missing_command").as_str().unwrap_or_default().to_owned();
    assert!(missing.contains("/no/such/program"), "a missing command is named: {seen}");
    let too_big = at("too_big").as_str().unwrap_or_default().to_owned();
    assert!(too_big.contains("more than its pod's VM has"), "a clear refusal: {seen}");
    assert_eq!(at("stopped_state"), "CONTAINER_EXITED", "{seen}");
    assert_eq!(at("stopped_code"), 143, "StopContainer's SIGTERM is 128 + 15: {seen}");
    // The execd injection: the init container's files reached the node's
    // volume, the container started through them, and its own write to the
    // volume is on the node at once.
    assert_eq!(at("init"), serde_json::json!({"state": "CONTAINER_EXITED", "code": 0}), "{seen}");
    assert_eq!(at("volume_after_init"), serde_json::json!(["bootstrap.sh", "echo"]), "{seen}");
    assert_eq!(at("volume_from_c1"), serde_json::json!({"code": 0, "host": "from-c1\n"}), "{seen}");
    // The probe's climb out of its chroot ends where it began, in the
    // container's own root (the busybox image's, not the guest's, whose
    // /init is the agent): no guest process in its /proc, nothing of the
    // guest's /run (where the workspace, the pod's directory and the other
    // containers' roots are mounted), no agent port to take.
    let escape = at("escape")["stdout"].as_str().unwrap_or_default().to_owned();
    assert_eq!(at("escape")["code"], 0, "the probe ran: {seen}");
    let line = |name: &str| escape.lines().find_map(|l| l.strip_prefix(name)).map(str::to_owned);
    let root = line("root: ").unwrap_or_default();
    let names: Vec<&str> = root.split(' ').collect();
    assert!(names.contains(&"bin") && !names.contains(&"init"), "it stayed in its root: {escape}");
    let pids = line("proc: ").unwrap_or_default();
    let pids = pids.split(' ').filter(|n| n.bytes().all(|b| b.is_ascii_digit())).count();
    assert!((1..=4).contains(&pids), "its /proc shows its own processes only: {escape}");
    assert_eq!(line("run: ").as_deref(), Some(""), "{escape}");
    assert!(line("agent port: ").is_some_and(|p| p != "taken"), "{escape}");
    // Nor can it set the guest kernel's core_pattern (a program the kernel
    // would run as the guest's root), or open a guest disk through a node.
    assert!(line("core_pattern: ").is_some_and(|p| p.contains("Read-only")), "{escape}");
    assert_eq!(line("disk: ").as_deref(), Some("not opened"), "{escape}");
    // CRI's log format: TIMESTAMP STREAM TAG LINE.
    let log = at("log").as_str().unwrap_or_default().to_owned();
    assert!(log.contains(" stdout F injected-started\n"), "the injected program ran first: {seen}");
    // c1's server printed what c2 sent it over the pod's localhost.
    assert!(log.contains(" stdout F started\n"), "{seen}");
    assert!(log.contains(" stdout F from-c2\n"), "c1 got c2's line on localhost: {seen}");
    assert_eq!(at("containers_left"), 0, "{seen}");
    assert_eq!(at("stopped_pod_state"), "SANDBOX_NOTREADY", "{seen}");
    assert_eq!(at("pods_left"), 0, "{seen}");
    // The pod's VM is gone, and nothing of the pod stays mounted.
    eventually("every VM is gone", Duration::from_secs(30), || processes_naming(&c.home()).is_empty());
    assert!(c.ctr_in(CRI_NAMESPACE, &["task", "ls", "-q"]).stdout.is_empty(), "no task is left");
    let disks: Vec<PathBuf> = walk(&c.home().join("runs"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "img"))
        .collect();
    assert!(disks.is_empty(), "the pod's VM disks are released: {disks:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let state = c.dir.path().join("state").display().to_string();
    let pods = format!("/run/pvisor-shim/pods/{CRI_NAMESPACE}/");
    let left: Vec<&str> = mounts.lines().filter(|l| l.contains(&state) || l.contains(&pods)).collect();
    assert!(left.is_empty(), "the pod's directory and roots are unmounted: {left:?}");
    // The pod is one Job, found by its name: the sandbox's, whose Trace
    // records what each of the pod's containers ran.
    let pod = pvisor(&c, &["jobs", "--json", "--label", "io.kubernetes.cri.sandbox-name=cri-pod"]);
    let jobs: Vec<serde_json::Value> =
        pod.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).collect();
    assert_eq!(jobs.len(), 1, "{pod}");
    assert_eq!(jobs[0]["data"]["labels"]["io.kubernetes.cri.container-type"], "sandbox", "{pod}");
    let job = jobs[0]["data"]["job"].as_str().expect("a job id");
    let events = pvisor(&c, &["events", job, "--json"]);
    let noted = |want: &[&str]| {
        events.lines().any(|l| l.contains("frontend.command") && want.iter().all(|w| l.contains(w)))
    };
    assert!(
        noted(&["sh -c echo c2-started", "\"exit_code\":5"]),
        "c2's own exit, in the pod's Job: {events}"
    );
    assert!(noted(&["echo from-c2", "\"exit_code\":0"]), "an exec in c2: {events}");
    assert!(noted(&["served-by-pod", "\"exit_code\":143"]), "c1 stopped by SIGTERM: {events}");
    // The kubelet stopped the pod: it reads as stopped, not as a failure.
    let status: serde_json::Value =
        serde_json::from_str(pvisor(&c, &["status", "--json", job]).trim()).expect("one status line");
    assert_eq!(status["data"]["state"], "cancelled", "{status}");
}

/// The CRI client's python (scripts/cri-env.sh), or why there is none.
fn cri_python() -> Result<PathBuf, String> {
    let out = Command::new(repo().join("scripts/cri-env.sh"))
        .output()
        .map_err(|e| format!("scripts/cri-env.sh does not run: {e}"))?;
    if !out.status.success() {
        return Err(format!("scripts/cri-env.sh failed (grpcio from PyPI): {}", text(&out.stderr)));
    }
    Ok(PathBuf::from(text(&out.stdout).trim()))
}

#[test]
#[ignore = "needs root, containerd and the vm guest image: scripts/test.sh runs it as root, with --include-ignored"]
fn terminals_for_the_init_process_and_an_exec() {
    require();
    let c = start(NAMESPACE);
    let run = ["run", "-t", "--rm", "--runtime", RUNTIME, IMAGE, "tty-init", "sh", "-c", SIZES];
    check_sizes(Tty::spawn(&c, &run, 30, 90));
    c.ok(&["run", "-d", "--runtime", RUNTIME, IMAGE, "tty-exec", "sh", "-c", COUNTER]);
    eventually("the task runs", Duration::from_secs(30), || {
        c.task_status("tty-exec").as_deref() == Some("RUNNING")
    });
    let exec = ["task", "exec", "-t", "--exec-id", "t1", "tty-exec", "sh", "-c", SIZES];
    check_sizes(Tty::spawn(&c, &exec, 30, 90));
    c.ok(&["task", "kill", "-s", "SIGKILL", "tty-exec"]);
    eventually("the task stops", Duration::from_secs(30), || {
        c.task_status("tty-exec").as_deref() == Some("STOPPED")
    });
    c.ok(&["task", "delete", "tty-exec"]);
    c.ok(&["container", "rm", "tty-exec"]);
}

#[test]
#[ignore = "needs root, containerd and the vm guest image: scripts/test.sh runs it as root, with --include-ignored"]
fn a_vm_that_ends_under_its_container_ends_the_containers_processes() {
    require();
    let c = start(NAMESPACE);
    // The container kills its Job's keeper (it may: the guest is its own),
    // so the VM ends under a running init and a running exec. Before, the
    // supervisor kept their relays open with no guest behind them and the
    // shim waited for their exits forever (seen when the guest's OOM killer
    // took the keeper). The pattern is split so the script does not match
    // itself.
    // The killer waits until the waiting exec runs (it says so in the
    // container's /tmp), not a fixed time a slow guest can outlast.
    let kill_keeper = "i=0; while [ ! -e /tmp/waiting ] && [ $i -lt 600 ]; do i=$((i+1)); sleep 0.1; done; \
                       k='do sleep 36'; for p in /proc/[0-9]*; do \
                       grep -q \"${k}00\" $p/cmdline 2>/dev/null && kill -9 ${p#/proc/}; done; sleep 100";
    c.ok(&["run", "-d", "--runtime", RUNTIME, IMAGE, "doomed", "sh", "-c", "sleep 100"]);
    let exec_in = |id: &str, argv: &[&str]| {
        Command::new("ctr")
            .args(["-a", &c.sock, "-n", NAMESPACE, "task", "exec", "--exec-id", id, "doomed"])
            .args(argv)
            .stdin(Stdio::null())
            .spawn()
            .expect("ctr task exec runs")
    };
    let exec = exec_in("waiting", &["sh", "-c", "touch /tmp/waiting; exec sleep 100"]);
    let killer = exec_in("killer", &["sh", "-c", kill_keeper]);
    // Bounded waits: the failure this guards against is a hang.
    let killer_exit = exits_within(killer, Duration::from_secs(60), "the killing exec");
    assert_eq!(killer_exit.code(), Some(255), "the killing exec ended with its VM");
    eventually("the init process is reported ended", Duration::from_secs(60), || {
        c.task_status("doomed").as_deref() == Some("STOPPED")
    });
    let exec_exit = exits_within(exec, Duration::from_secs(60), "the waiting exec");
    // 255: the VM went away without reporting their exits.
    assert_eq!(exec_exit.code(), Some(255), "the exec's status");
    let deleted = c.ctr(&["task", "delete", "doomed"]);
    assert!(text(&deleted.stderr).contains("exit code 255"), "{}", text(&deleted.stderr));
    c.ok(&["container", "rm", "doomed"]);
    eventually("the VM is gone", Duration::from_secs(30), || processes_naming(&c.home()).is_empty());
}

#[test]
#[ignore = "needs root, containerd and the vm guest image: scripts/test.sh runs it as root, with --include-ignored"]
fn a_binary_logger_gets_the_output_as_runcs_shim_hands_it_over() {
    require();
    let c = start(NAMESPACE);
    // A shim logger as containerd's runc shim runs one (pkg/process/io.go,
    // NewBinaryIO/NewBinaryCmd; nerdctl's logging driver is one): stdout
    // on fd 3, stderr on fd 4, readiness on fd 5, the query as arguments,
    // the container in the environment. It ignores the SIGTERM of delete,
    // so its files are whole only if the pipes reached EOF.
    let dir = c.dir.path().join("logger");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let logger = dir.join("logger.sh");
    std::fs::write(
        &logger,
        "#!/bin/sh\ntrap '' TERM\nd=\"$2\"\ncat <&3 >\"$d/out\" &\ncat <&4 >\"$d/err\" &\n\
         echo \"$CONTAINER_NAMESPACE/$CONTAINER_ID $*\" >\"$d/env\"\nprintf x >&5\nexec 5>&-\nwait\ntouch \"$d/done\"\n",
    )
    .expect("write the logger");
    std::fs::set_permissions(&logger, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let uri = format!("binary://{}?dir={}", logger.display(), dir.display());
    let script = "echo out; echo err >&2; exit 3";
    let out =
        c.ctr(&["run", "--rm", "--log-uri", &uri, "--runtime", RUNTIME, IMAGE, "logged", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    eventually("the logger has finished", Duration::from_secs(30), || dir.join("done").exists());
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    assert_eq!(read("out"), "out\n");
    assert_eq!(read("err"), "err\n");
    assert_eq!(read("env"), format!("{NAMESPACE}/logged dir {}\n", dir.display()));
    // A logger the shim cannot run is the create's error, named.
    let bad = c.ctr(&[
        "run",
        "--rm",
        "--log-uri",
        "binary://relative/logger",
        "--runtime",
        RUNTIME,
        IMAGE,
        "nolog",
        "true",
    ]);
    assert!(!bad.status.success());
    assert!(text(&bad.stderr).contains("must be an absolute path"), "{}", text(&bad.stderr));
    let _ = c.ctr(&["container", "rm", "nolog"]);
    eventually("no VM is left", Duration::from_secs(30), || processes_naming(&c.home()).is_empty());
}

#[test]
#[ignore = "needs root, containerd and the vm guest image: scripts/test.sh runs it as root, with --include-ignored"]
fn output_and_stdin_go_on_after_a_pause() {
    require();
    let c = start(NAMESPACE);
    let log = c.dir.path().join("ticks.log");
    let ticks = "i=0; while :; do i=$((i+1)); echo $i; sleep 0.2; done";
    let uri = format!("file://{}", log.display());
    c.ok(&["run", "-d", "--log-uri", &uri, "--runtime", RUNTIME, IMAGE, "ticks", "sh", "-c", ticks]);
    let lines = || std::fs::read_to_string(&log).unwrap_or_default().lines().count();
    eventually("the counter prints", Duration::from_secs(60), || lines() >= 5);
    // An exec reading stdin, fed before and after the pause.
    let mut cat = Command::new("ctr")
        .args(["-a", &c.sock, "-n", NAMESPACE, "task", "exec", "--exec-id", "cat", "ticks", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("ctr runs");
    let mut stdin = cat.stdin.take().expect("stdin");
    let echoed = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (mut stdout, seen) = (cat.stdout.take().expect("stdout"), echoed.clone());
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        while let Ok(n) = std::io::Read::read(&mut stdout, &mut buf) {
            if n == 0 {
                break;
            }
            seen.lock().expect("the echo lock").push_str(&text(&buf[..n]));
        }
    });
    stdin.write_all(b"before\n").expect("write");
    eventually("cat echoes its stdin", Duration::from_secs(60), || {
        echoed.lock().expect("the echo lock").contains("before")
    });
    c.ok(&["task", "pause", "ticks"]);
    let paused = lines();
    std::thread::sleep(Duration::from_secs(2));
    assert!(lines() <= paused + 1, "a paused VM prints nothing: {paused} then {}", lines());
    c.ok(&["task", "resume", "ticks"]);
    stdin.write_all(b"after\n").expect("write");
    drop(stdin);
    let code = cat.wait().expect("ctr ends").code();
    reader.join().expect("the reader");
    assert_eq!(
        *echoed.lock().expect("the echo lock"),
        "before\nafter\n",
        "stdin reaches the process across the pause"
    );
    assert_eq!(code, Some(0), "and so does its end");
    eventually("the counter prints on after the resume", Duration::from_secs(60), || lines() >= paused + 10);
    // Every count once, in order: nothing lost or repeated across the pause.
    let printed = std::fs::read_to_string(&log).expect("the log");
    let counts: Vec<u32> = printed.lines().map(|l| l.parse().unwrap_or(0)).collect();
    let expected: Vec<u32> = (1..=counts.len() as u32).collect();
    assert_eq!(counts, expected, "the counter's output across the pause");
    c.ok(&["task", "kill", "-s", "SIGKILL", "ticks"]);
    eventually("the task stops", Duration::from_secs(30), || {
        c.task_status("ticks").as_deref() == Some("STOPPED")
    });
    c.ok(&["task", "delete", "ticks"]);
    c.ok(&["container", "rm", "ticks"]);
}

/// `pvisor ARGS` over the shim's state directory.
/// The child's exit status; panics (killing it) if it runs past `timeout`.
fn exits_within(mut child: std::process::Child, timeout: Duration, what: &str) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        match child.try_wait().expect("wait for a child") {
            Some(status) => return status,
            None if start.elapsed() > timeout => {
                let _ = child.kill();
                panic!("{what} never ended after its VM did");
            }
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// A container whose VM cannot boot fails its start with the Job's own
/// reason and hint (here: no guest image, and where the shim looked), not
/// a summary of Rust values: what `ctr` prints and `kubectl describe pod`
/// shows. The shim runs from a directory of its own, so no build tree's
/// image is beside it, and the data directories it searches are empty.
#[test]
#[ignore = "needs root, containerd and the vm guest image: scripts/test.sh runs it as root, with --include-ignored"]
fn a_container_whose_vm_cannot_boot_fails_saying_why() {
    require();
    let alone = tempfile::tempdir().expect("tempdir");
    let bin = alone.path().join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    std::fs::copy(env!("CARGO_BIN_EXE_containerd-shim-pvisor-v1"), bin.join("containerd-shim-pvisor-v1"))
        .expect("copy the shim");
    let empty = alone.path().join("share");
    let empty = empty.to_str().expect("a UTF-8 path");
    let c = start_with(NAMESPACE, &bin, &[("XDG_DATA_DIRS", empty), ("XDG_DATA_HOME", empty)]);
    let out = c.ctr(&["run", "--rm", "--runtime", RUNTIME, IMAGE, "noimage", "true"]);
    let stderr = text(&out.stderr);
    eprintln!("ctr run without a guest image said: {stderr}");
    assert!(!out.status.success(), "the container cannot start without a guest image: {stderr}");
    assert!(stderr.contains("no guest image found (looked in"), "the cause reaches ctr: {stderr}");
    assert!(stderr.contains("scripts/vm-image.sh"), "and what to do: {stderr}");
    assert!(!stderr.contains("None"), "no Rust debug output: {stderr}");
    eventually("nothing of the container is left", Duration::from_secs(30), || {
        processes_naming(&c.home()).is_empty()
    });
}
