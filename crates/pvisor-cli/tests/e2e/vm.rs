//! The `vm` executor: real QEMU microVMs (TCG here, KVM where a probe boot
//! works), the guest agent, the staged-changes flow, and execution
//! checkpoints: suspend, resume, fork, kill, crashes and corruption.
//!
//! The guest image must be built first (`scripts/vm-image.sh`, which
//! `scripts/test.sh` runs); without it these tests fail and say so.

use std::fs;
use std::io::Read;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;

/// A counter loop: prints `c N` and writes `counter` every 0.2 s for 12 s
/// (long enough for a suspend or fork on a loaded TCG host to land before
/// it ends), then a random tag (so copies of one VM can be told apart) and
/// a file named by it.
const COUNTER: &str =
    "i=0; while [ $i -lt 60 ]; do i=$((i+1)); echo \"c $i\"; echo $i > counter; sleep 0.2; done; \
     tag=$(head -c6 /dev/urandom | od -An -tx1 | tr -d ' \\n'); echo \"tag $tag\"; echo $tag > \"f-$tag\"";

pub(crate) fn require_image() {
    assert!(
        vm_image().is_some(),
        "no guest image beside {}: run scripts/vm-image.sh first",
        env!("CARGO_BIN_EXE_pvisor")
    );
}

/// A `pvisor run --executor vm` in the background whose stdout is collected.
pub(crate) struct Background {
    child: Child,
    out: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    pub(crate) fn start(env: &Env, args: &[&str], failpoint: Option<&str>) -> Self {
        let mut cmd = env.command(args);
        if let Some(point) = failpoint {
            cmd.env("PVISOR_FAILPOINT", point);
        }
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let out = Arc::new(Mutex::new(String::new()));
        let mut stdout = child.stdout.take().unwrap();
        let sink = out.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Self { child, out, reader: Some(reader) }
    }

    pub(crate) fn wait_for(&self, needle: &str) {
        let found = wait_until(Duration::from_secs(120), || self.out.lock().unwrap().contains(needle));
        assert!(found, "never printed {needle:?}; got {:?}", self.out.lock().unwrap());
    }

    /// Waits for exit; returns (code, stdout, stderr).
    pub(crate) fn finish(mut self) -> (Option<i32>, String, String) {
        let mut err = String::new();
        self.child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        let status = self.child.wait().unwrap();
        self.reader.take().unwrap().join().unwrap();
        let out = self.out.lock().unwrap().clone();
        (status.code(), out, err)
    }
}

/// `suspend --json`'s checkpoint manifest, checking the `result` line after it.
pub(crate) fn suspended_to(out: &str, job: &str) -> serde_json::Value {
    let mut lines = json_lines(out);
    assert_eq!(lines.len(), 2, "a manifest, then the result: {out}");
    let (kind, result) = lines.pop().unwrap();
    assert_eq!(kind, "result");
    assert_eq!(result["job"], job);
    assert_eq!(result["state"], "suspended");
    let (kind, manifest) = lines.pop().unwrap();
    assert_eq!(kind, "checkpoint");
    assert_eq!(result["checkpoint"], manifest["id"]);
    manifest
}

pub(crate) fn counts(out: &str) -> Vec<u32> {
    out.lines().filter_map(|l| l.strip_prefix("c ")).map(|n| n.parse().unwrap()).collect()
}

fn tag(out: &str) -> String {
    out.lines().find_map(|l| l.strip_prefix("tag ")).unwrap_or_else(|| panic!("no tag in {out:?}")).to_owned()
}

fn vm_run_stages_changes_like_ns(who: As) {
    who.require();
    require_image();
    let env = Env::new(who);
    env.write("existing", "old\n");
    env.write("tracked", "line 1\n");
    env.write("dir/a", "a\n");
    env.write("dir/b", "b\n");
    env.write("mode", "m\n");
    let before = snapshot(&env.ws);
    let script =
        "cat existing; echo x > new; rm existing; echo y >> tracked; rm -r dir; mkdir dir; echo c > dir/c; \
                  chmod 700 mode; ln -s /etc/passwd link; mkdir -p deep/er; printf 'nl' > 'deep/er/a\nb'; \
                  echo to-stderr >&2; exit 3";
    let out = env.pvisor(&["run", "--executor", "vm", "--", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(3), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "old\n", "the guest saw the workspace");
    assert!(text(&out.stderr).contains("to-stderr"));
    assert_eq!(snapshot(&env.ws), before, "the workspace changed");

    let status = env.status_json(None);
    assert_eq!((status["state"].as_str(), status["exit_code"].as_i64()), (Some("failed"), Some(3)));
    assert_eq!(status["receipt"], "valid");
    let kinds: Vec<(String, String)> = env
        .review()
        .iter()
        .map(|c| (c["path"].as_str().unwrap().to_owned(), c["kind"].as_str().unwrap().to_owned()))
        .collect();
    for (path, kind) in [
        ("existing", "deleted"),
        ("new", "added"),
        ("tracked", "modified"),
        ("link", "added"),
        ("deep/er/a\nb", "added"),
    ] {
        assert!(kinds.iter().any(|(p, k)| p == path && k == kind), "{path} {kind} missing from {kinds:?}");
    }
    assert!(kinds.iter().any(|(p, _)| p == "mode"), "mode change missing from {kinds:?}");
    assert!(kinds.iter().any(|(p, _)| p.starts_with("dir")), "the replaced directory is missing: {kinds:?}");

    // Placement says which accelerator and why; the trace has the VM's facts.
    let job = status["job"].as_str().unwrap().to_owned();
    let events = env.events(&job);
    let placement = events.iter().find(|e| e["type"] == "placement.decided").unwrap();
    let accel = placement["data"]["details"]["accelerator"].as_str().unwrap();
    assert!(accel == "tcg" || accel == "kvm", "{placement}");
    assert!(!placement["data"]["details"]["accelerator_reason"].as_str().unwrap().is_empty());
    assert!(events.iter().any(|e| e["type"] == "attempt.vm" && e["data"]["ready_ms"].as_u64().is_some()));

    // Apply brings the workspace to what the guest saw.
    env.expect(&["apply", "--all"], 0);
    assert!(!env.ws.join("existing").exists());
    assert_eq!(fs::read_to_string(env.ws.join("tracked")).unwrap(), "line 1\ny\n");
    assert_eq!(fs::read_to_string(env.ws.join("dir/c")).unwrap(), "c\n");
    assert!(!env.ws.join("dir/a").exists(), "the opaque directory kept a lower file");
    assert_eq!(fs::read_link(env.ws.join("link")).unwrap(), std::path::Path::new("/etc/passwd"));
    assert_eq!(fs::read(env.ws.join("deep/er/a\nb")).unwrap(), b"nl");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(fs::metadata(env.ws.join("mode")).unwrap().permissions().mode() & 0o777, 0o700);
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn vm_run_stages_changes_like_ns_as_root() {
    vm_run_stages_changes_like_ns(As::Root);
}

#[test]
fn vm_run_stages_changes_like_ns_rootless() {
    vm_run_stages_changes_like_ns(As::Rootless);
}

#[test]
fn vm_program_not_found_is_127_with_a_receipt() {
    require_image();
    let env = Env::new(As::Root);
    let out = env.pvisor(&["run", "--executor", "vm", "--", "no-such-program-here"]);
    assert_eq!(out.status.code(), Some(127), "stderr: {}", text(&out.stderr));
    let status = env.status_json(None);
    assert_eq!(status["state"], "failed");
    assert_eq!(status["receipt"], "valid");
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn suspend_then_resume_continues_the_counter_in_a_new_attempt() {
    suspend_then_resume(As::Root);
}

#[test]
fn suspend_then_resume_rootless() {
    suspend_then_resume(As::Rootless);
}

fn suspend_then_resume(who: As) {
    who.require();
    require_image();
    let env = Env::new(who);
    let run = Background::start(&env, &["run", "-q", "--executor", "vm", "--", "sh", "-c", COUNTER], None);
    run.wait_for("c 4\n");
    let job = only_job(&env);
    let out = env.expect(&["suspend", &job, "--json"], 0);
    let manifest = suspended_to(&out, &job);
    assert_eq!(manifest["kind"], "execution");
    let (code, before, _) = run.finish();
    assert_eq!(code, Some(75), "a suspended run exits 75 (EX_TEMPFAIL)");
    let last = *counts(&before).last().unwrap();

    let status = env.status_json(Some(&job));
    assert_eq!(status["state"], "suspended");
    assert!(!status["live"].as_bool().unwrap());
    let attempt1 = env.attempt_dir(&status);
    let termination: serde_json::Value =
        serde_json::from_slice(&fs::read(attempt1.join("termination.json")).unwrap()).unwrap();
    assert_eq!(termination["checkpoint"], manifest["id"]);
    assert_eq!(termination["vm_exit"], "exited 0");
    // Nothing to apply while the files are inside the saved VM.
    let refused = env.pvisor(&["apply", &job, "--all"]);
    assert_eq!(refused.status.code(), Some(125));
    assert!(text(&refused.stderr).contains("suspended"), "{}", text(&refused.stderr));

    let resumed = env.pvisor(&["resume", &job]);
    assert_eq!(resumed.status.code(), Some(0), "stderr: {}", text(&resumed.stderr));
    let after = counts(&text(&resumed.stdout));
    assert_eq!(after.first(), Some(&(last + 1)), "the counter did not continue: {before:?} then {after:?}");
    assert_eq!(after.last(), Some(&60));

    let status = env.status_json(Some(&job));
    assert_eq!(status["state"], "completed");
    assert_eq!(status["receipt"], "valid");
    assert!(status["attempt"].as_str().unwrap().ends_with(".2"), "{status}");
    let events = env.events(&job);
    let kinds: Vec<(&str, u64)> =
        events.iter().map(|e| (e["type"].as_str().unwrap(), e["attempt"].as_u64().unwrap_or(0))).collect();
    assert!(kinds.contains(&("run.hibernated", 1)), "{kinds:?}");
    assert!(kinds.contains(&("run.completed", 2)), "{kinds:?}");
    assert!(!kinds.contains(&("run.completed", 1)), "{kinds:?}");
    let restored = events.iter().find(|e| e["type"] == "attempt.vm" && e["attempt"] == 2).unwrap();
    assert_eq!(restored["data"]["restored"]["checkpoint"], manifest["id"]);
    // The file the counter wrote is staged once, with its final value.
    env.expect(&["apply", &job, "--all"], 0);
    assert_eq!(fs::read_to_string(env.ws.join("counter")).unwrap(), "60\n");
}

#[test]
fn an_execution_fork_diverges_with_private_stages_and_fresh_entropy() {
    require_image();
    let env = Env::new(As::Root);
    let parent = Background::start(&env, &["run", "-q", "--executor", "vm", "--", "sh", "-c", COUNTER], None);
    parent.wait_for("c 3\n");
    let parent_job = only_job(&env);
    let forked = env.pvisor(&["fork", &parent_job, "--state", "execution", "-q"]);
    assert_eq!(forked.status.code(), Some(0), "stderr: {}", text(&forked.stderr));
    let (code, parent_out, _) = parent.finish();
    assert_eq!(code, Some(0));
    let child_out = text(&forked.stdout);
    assert!(counts(&child_out)[0] > 1, "the fork restarted instead of continuing: {child_out:?}");
    let (parent_tag, child_tag) = (tag(&parent_out), tag(&child_out));
    assert_ne!(parent_tag, child_tag, "the fork repeated its parent's random stream");

    let jobs: Vec<String> = fs::read_dir(env.home.join("jobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let child_job = jobs.iter().find(|j| **j != parent_job).unwrap().clone();
    let status = env.status_json(Some(&child_job));
    assert_eq!(status["lineage"]["parent_job"], parent_job.as_str());
    assert_eq!(status["lineage"]["kind"], "execution");
    let staged = |job: &str| -> Vec<String> {
        let out = env.expect(&["review", job, "--json"], 0);
        records_of(&out, "change").iter().map(|c| c["path"].as_str().unwrap().to_owned()).collect()
    };
    let (p, c) = (staged(&parent_job), staged(&child_job));
    assert!(p.contains(&format!("f-{parent_tag}")) && !p.contains(&format!("f-{child_tag}")), "{p:?}");
    assert!(c.contains(&format!("f-{child_tag}")) && !c.contains(&format!("f-{parent_tag}")), "{c:?}");
}

#[test]
fn after_kill_a_suspended_job_cannot_be_resumed_or_forked() {
    require_image();
    let env = Env::new(As::Root);
    let run = Background::start(&env, &["run", "-q", "--executor", "vm", "--", "sh", "-c", COUNTER], None);
    run.wait_for("c 2\n");
    let job = only_job(&env);
    env.expect(&["suspend", &job], 0);
    assert_eq!(run.finish().0, Some(75));
    env.expect(&["kill", &job], 0);
    assert_eq!(env.status_json(Some(&job))["state"], "lost");
    for args in [vec!["resume", job.as_str()], vec!["fork", job.as_str(), "--state", "execution"]] {
        let out = env.pvisor(&args);
        assert_eq!(out.status.code(), Some(125), "{args:?} was not refused");
        assert!(text(&out.stderr).contains("killed"), "{args:?}: {}", text(&out.stderr));
    }
    assert_eq!(fs::read_dir(env.home.join("jobs")).unwrap().count(), 1, "a refused fork created a Job");
    // Nothing can continue from the checkpoint any more, so gc may free it.
    let freed = env.expect(&["gc", "--older-than", "0s", "--force"], 0);
    assert!(freed.contains("execution checkpoint"), "{freed}");
}

#[test]
fn checkpoints_need_a_running_vm_job() {
    let env = Env::new(As::Root);
    env.run_sh("true");
    let job = only_job(&env);
    let out = env.pvisor(&["checkpoint", &job, "--kind", "execution"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("--executor vm"), "{}", text(&out.stderr));
    let out = env.pvisor(&["suspend", &job]);
    assert_eq!(out.status.code(), Some(125));
    let out = env.pvisor(&["resume", &job]);
    assert_eq!(out.status.code(), Some(125));
}

/// Killing the supervisor at each step of a suspension: a Job reads
/// `suspended` only with a published manifest and a termination receipt, and
/// no QEMU outlives its supervisor.
#[test]
fn a_crash_during_suspend_never_leaves_a_false_suspension() {
    require_image();
    for (point, expect) in [
        ("vm-after-quiesce", "unknown"),
        ("vm-after-state", "unknown"),
        ("vm-after-publish", "unknown"),
        ("after-termination-receipt", "suspended"),
    ] {
        let env = Env::new(As::Root);
        let run = Background::start(
            &env,
            &["run", "-q", "--executor", "vm", "--", "sh", "-c", COUNTER],
            Some(point),
        );
        run.wait_for("c 2\n");
        let job = only_job(&env);
        let out = env.pvisor(&["suspend", &job]);
        assert_ne!(out.status.code(), None);
        let (code, _, _) = run.finish();
        assert_eq!(code, None, "{point}: the supervisor was not killed");
        let status = env.status_json(Some(&job));
        assert_eq!(status["state"], expect, "{point}: {status}");
        let termination = env.attempt_dir(&status).join("termination.json");
        assert_eq!(termination.exists(), expect == "suspended", "{point}");
        // No orphaned VM: QEMU dies with the supervisor.
        let vm_dir = env.attempt_dir(&status).join("vm");
        let orphan = wait_until(Duration::from_secs(10), || !qemu_running_in(&vm_dir));
        assert!(orphan, "{point}: a QEMU of this Job outlived its supervisor");
        if expect == "suspended" {
            let resumed = env.pvisor(&["resume", &job]);
            assert_eq!(resumed.status.code(), Some(0), "{point}: {}", text(&resumed.stderr));
            assert_eq!(counts(&text(&resumed.stdout)).last(), Some(&60));
        }
    }
}

fn qemu_running_in(vm_dir: &std::path::Path) -> bool {
    let needle = vm_dir.to_string_lossy().into_owned();
    fs::read_dir("/proc").unwrap().flatten().any(|e| {
        fs::read(e.path().join("cmdline"))
            .map(|c| {
                String::from_utf8_lossy(&c).contains("qemu-system")
                    && String::from_utf8_lossy(&c).contains(&needle)
            })
            .unwrap_or(false)
    })
}

#[test]
fn a_corrupt_checkpoint_is_refused_and_the_job_stays_suspended() {
    require_image();
    let env = Env::new(As::Root);
    let run = Background::start(&env, &["run", "-q", "--executor", "vm", "--", "sh", "-c", COUNTER], None);
    run.wait_for("c 2\n");
    let job = only_job(&env);
    let manifest = suspended_to(&env.expect(&["suspend", &job, "--json"], 0), &job);
    run.finish();
    let status = env.status_json(Some(&job));
    let run_dir = env.home.join("runs").join(status["run"].as_str().unwrap());
    let state = run_dir.join("exec-checkpoints").join(manifest["id"].as_str().unwrap()).join("state");
    let mut bytes = fs::read(&state).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    fs::write(&state, &bytes).unwrap();

    let out = env.pvisor(&["resume", &job]);
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(err.contains("corrupt") && err.contains(&state.display().to_string()), "{err}");
    let status = env.status_json(Some(&job));
    assert_eq!(status["state"], "suspended", "a refused resume changed the Job");
    assert!(status["attempt"].as_str().unwrap().ends_with(".1"), "a refused resume created an Attempt");
    assert!(!env.events(&job).iter().any(|e| e["type"] == "resume.requested"));

    // Repaired, but the restore itself fails (no QEMU): the failed Attempt is
    // recorded, and the Job stays suspended on its intact checkpoint.
    bytes[middle] ^= 0xff;
    fs::write(&state, &bytes).unwrap();
    let out = env.command(&["resume", &job]).env("PVISOR_QEMU", "/nonexistent/qemu").output().unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("still suspended"), "{}", text(&out.stderr));
    let status = env.status_json(Some(&job));
    assert_eq!(status["state"], "suspended", "{status}");
    let resumed = env.pvisor(&["resume", &job]);
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed.stderr));
    assert_eq!(counts(&text(&resumed.stdout)).last(), Some(&60));
    let status = env.status_json(Some(&job));
    assert!(status["attempt"].as_str().unwrap().ends_with(".3"), "{status}");
}

#[test]
fn a_hidden_path_inside_the_workspace_is_never_copied_into_a_vm() {
    require_image();
    let env = Env::new(As::Root);
    env.write("secret/key", "do not copy\n");
    let secret = env.ws.join("secret");
    let out = env.pvisor(&[
        "run",
        "--executor",
        "vm",
        "--hide",
        secret.to_str().unwrap(),
        "--",
        "cat",
        "secret/key",
    ]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stdout));
    assert!(!text(&out.stdout).contains("do not copy"));
    assert!(text(&out.stderr).contains("--expose"), "{}", text(&out.stderr));
}

/// The guest has no network device: its only way out is the agent's relay
/// from guest 127.0.0.1:3128 to pvisor's proxy, which applies the policy.
#[test]
fn a_vm_reaches_only_what_the_proxy_allows() {
    require_image();
    let env = Env::new(As::Rootless);
    let port = crate::network::http_server();
    let script = format!(
        "wget -q -O - http://allowed.test:{port}/; echo \" rc=$?\"; \
         wget -q -O - http://denied.test:{port}/; echo \" rc=$?\"; \
         env -u http_proxy -u HTTP_PROXY wget -q -T 3 -O - http://127.0.0.1:{port}/ 2>&1; echo \" direct rc=$?\"; \
         ls /sys/class/net"
    );
    let out = crate::network::with_hosts(
        &env,
        "127.0.0.1 allowed.test denied.test\n",
        &[
            "run",
            "--executor",
            "vm",
            "--allow",
            "allowed.test",
            "--allow",
            &format!("127.0.0.1:{port}"),
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert!(stdout.contains(&format!("hello from {port} rc=0")), "{stdout}");
    assert!(stdout.contains(" rc=1"), "denied.test was reached: {stdout}");
    // Without the proxy the guest's own loopback has nothing on that port,
    // and there is no other interface to try.
    assert!(!stdout.contains(&format!("hello from {port} direct")), "{stdout}");
    assert_eq!(stdout.lines().last(), Some("lo"), "the guest has a network device: {stdout}");
    let events = crate::network::network_events(&env);
    assert!(events.iter().any(|e| e["type"] == "network.allowed" && e["data"]["host"] == "allowed.test"));
    assert!(events.iter().any(|e| e["type"] == "network.denied" && e["data"]["host"] == "denied.test"));
    let status = env.status_json(None);
    let bundle: serde_json::Value =
        serde_json::from_slice(&fs::read(env.attempt_dir(&status).join("bundle.json")).unwrap()).unwrap();
    let network = &bundle["observations"]["network"];
    assert_eq!(network["non_bypassable"], true);
    assert!(network["attachment"].as_str().unwrap().contains("without a network device"), "{network}");
}

#[test]
fn a_vm_cannot_share_the_host_network() {
    require_image();
    let env = Env::new(As::Root);
    let out = env.pvisor(&["run", "--executor", "vm", "--net", "host", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("--net proxy"), "{}", text(&out.stderr));
}

/// Ctrl-C reaches the command inside the guest; a command that ignores it is
/// killed after --kill-grace through the agent, and its staged files are
/// still exported with a cancelled receipt.
#[test]
fn cancelling_a_vm_run_kills_the_command_and_keeps_its_stage() {
    require_image();
    let env = Env::new(As::Root);
    let script = "trap '' INT TERM; echo kept > staged; echo started; while true; do sleep 0.1; done";
    let run = Background::start(
        &env,
        &["run", "-q", "--executor", "vm", "--kill-grace", "1s", "--", "sh", "-c", script],
        None,
    );
    run.wait_for("started\n");
    send_signal(run.child.id(), rustix::process::Signal::INT).unwrap();
    let (code, _, err) = run.finish();
    assert_eq!(code, Some(137), "{err}");
    let status = env.status_json(None);
    assert_eq!(status["state"], "cancelled");
    assert_eq!(status["receipt"], "valid");
    let staged: Vec<String> = env.review().iter().map(|c| c["path"].as_str().unwrap().to_owned()).collect();
    assert_eq!(staged, ["staged"]);
}

/// Stdin is flow-controlled end to end: 8 MiB reach a command that only
/// starts reading after 2 s, byte for byte.
#[test]
fn stdin_reaches_a_slow_reader_in_the_guest_intact() {
    require_image();
    let env = Env::new(As::Root);
    let mut child = env
        .command(&["run", "-q", "--executor", "vm", "--", "sh", "-c", "sleep 2; wc -c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..8 {
            stdin.write_all(&chunk).unwrap();
        }
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), (8u64 << 20).to_string());
}

/// Issue 17: an installed binary (no build tree beside it, no
/// PVISOR_VM_IMAGE) finds the guest image where `scripts/install.sh` puts it:
/// `PREFIX/share/pvisor/vm-image`, or `$XDG_DATA_HOME/pvisor/vm-image` for a
/// binary elsewhere (a `cargo install`ed one in `~/.cargo/bin`).
#[test]
fn an_installed_binary_finds_its_guest_image() {
    require_image();
    let env = Env::new(As::Root);
    let image = vm_image().unwrap();
    let place = |dir: &std::path::Path| {
        fs::create_dir_all(dir).unwrap();
        for name in ["vmlinux", "initramfs.cpio", "manifest.json"] {
            fs::copy(image.join(name), dir.join(name)).unwrap();
        }
    };
    let install = |bin_dir: &std::path::Path| {
        fs::create_dir_all(bin_dir).unwrap();
        let exe = bin_dir.join("pvisor");
        fs::copy(bin(), &exe).unwrap();
        exe
    };
    let run = |exe: &std::path::Path, data_home: &std::path::Path, args: &[&str]| {
        std::process::Command::new(exe)
            .args(args)
            .current_dir(&env.ws)
            .env("PVISOR_HOME", &env.home)
            .env("HOME", env.dir.path())
            .env("XDG_DATA_HOME", data_home)
            .env("XDG_DATA_DIRS", env.dir.path().join("no-system-data"))
            .env_remove("PVISOR_VM_IMAGE")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let nowhere = env.dir.path().join("empty-data");

    // An install prefix: a real vm run boots from PREFIX/share/pvisor.
    let prefix = env.dir.path().join("prefix");
    place(&prefix.join("share/pvisor/vm-image"));
    let exe = install(&prefix.join("bin"));
    let out = run(&exe, &nowhere, &["run", "--executor", "vm", "--", "sh", "-c", "echo booted > proof"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(env.review().len(), 1);

    // A binary with nothing beside it finds $XDG_DATA_HOME/pvisor/vm-image.
    let data = env.dir.path().join("data");
    place(&data.join("pvisor/vm-image"));
    let lone = install(&env.dir.path().join("cargo-home/bin"));
    let doctor = text(&run(&lone, &data, &["doctor", "--json"]).stdout);
    let check = doctor.lines().find(|l| l.contains("vm guest image")).expect("a vm guest image check");
    assert!(check.contains(&*data.join("pvisor/vm-image").to_string_lossy()), "{check}");
    // And says where it looked when there is none.
    let doctor = text(&run(&lone, &nowhere, &["doctor", "--json"]).stdout);
    let check = doctor.lines().find(|l| l.contains("vm guest image")).unwrap();
    assert!(check.contains("not built") && check.contains("empty-data"), "{check}");
}
