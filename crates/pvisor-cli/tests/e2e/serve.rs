//! `pvisor serve`: the real daemon on loopback, driven by real HTTP clients
//! (curl, and the published OpenSandbox Python SDK), booting real microVMs.
//! Crash tests SIGKILL the daemon mid-operation and check that, after a
//! restart, every sandbox's state is what is really true.
//!
//! Needs the guest image (`scripts/vm-image.sh`), the default sandbox image
//! (`scripts/sandbox-image.sh`) and the SDK venv (`scripts/sdk-env.sh`);
//! `scripts/test.sh` builds all three.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::*;

const BOOT: Duration = Duration::from_secs(180);

fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_pvisor")).parent().unwrap().parent().unwrap().to_path_buf()
}

fn sandbox_image() -> PathBuf {
    let rootfs = target_dir().join("sandbox-image/rootfs");
    assert!(
        rootfs.join("bin/sh").exists(),
        "no default sandbox image at {}: run scripts/sandbox-image.sh",
        rootfs.display()
    );
    rootfs
}

fn sdk_python() -> PathBuf {
    let python = target_dir().join("sdk-venv/bin/python");
    assert!(python.exists(), "no SDK venv at {}: run scripts/sdk-env.sh", python.display());
    python
}

/// A `pvisor serve` on a free loopback port, restartable over one state directory.
struct Daemon {
    env: Env,
    port: u16,
    key: String,
    child: Option<Child>,
}

impl Daemon {
    fn new() -> Self {
        Self::new_as(As::Root)
    }

    fn new_as(who: As) -> Self {
        assert!(vm_image().is_some(), "no guest image: run scripts/vm-image.sh");
        let env = Env::new(who);
        let key = format!("test-key-{:016}-{}", std::process::id(), port_seed());
        fs::write(env.dir.path().join("key"), format!("{key}\n")).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut daemon = Self { env, port, key, child: None };
        daemon.start();
        daemon
    }

    fn start(&mut self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.env.dir.path().join("serve.log"))
            .unwrap();
        let key_file = self.env.dir.path().join("key");
        // The unprivileged user imports its own copy of the default image.
        let image = if self.env.who == As::Rootless && is_root() {
            let copy = self.env.dir.path().join("sandbox-image");
            if !copy.exists() {
                let ok =
                    Command::new("cp").arg("-a").arg(sandbox_image()).arg(&copy).status().unwrap().success();
                assert!(ok);
                self.env.give_away(&copy);
            }
            copy
        } else {
            sandbox_image()
        };
        let mut cmd =
            self.env.command(&["serve", "--listen", &format!("127.0.0.1:{}", self.port), "--api-key-file"]);
        cmd.arg(&key_file).env("PVISOR_SANDBOX_IMAGE", image).stdout(log.try_clone().unwrap()).stderr(log);
        // As root the binary runs from a copy (support::bin), away from the
        // build tree where it would find the `python` image.
        let python = target_dir().join("sandbox-image-python/rootfs");
        if self.env.who == As::Root && python.join("bin/sh").exists() {
            cmd.env("PVISOR_SANDBOX_IMAGE_PYTHON", python);
        }
        self.child = Some(cmd.spawn().unwrap());
        let up = wait_until(Duration::from_secs(60), || self.curl("GET", "/health", None).0 == 200);
        assert!(up, "the daemon did not come up: {}", self.log());
    }

    fn log(&self) -> String {
        fs::read_to_string(self.env.dir.path().join("serve.log")).unwrap_or_default()
    }

    fn kill9(&mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// `(status, body)` of a request with the API key.
    fn curl(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("http://127.0.0.1:{}{path}", self.port);
        let mut cmd = Command::new("curl");
        cmd.args([
            "-s",
            "-X",
            method,
            "-H",
            &format!("OPEN-SANDBOX-API-KEY: {}", self.key),
            "-w",
            "\n%{http_code}",
        ]);
        if let Some(body) = body {
            cmd.args(["-H", "content-type: application/json", "--data-binary", &body.to_string()]);
        }
        let out = cmd.arg(&url).output().unwrap();
        let text = text(&out.stdout);
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), serde_json::from_str(body).unwrap_or(Value::Null))
    }

    fn create(&self, extra: Value) -> String {
        let mut body = json!({ "image": { "uri": "default" }, "entrypoint": ["tail", "-f", "/dev/null"], "timeout": 3600 });
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (code, created) = self.curl("POST", "/v1/sandboxes", Some(body));
        assert_eq!(code, 202, "{created}");
        created["id"].as_str().unwrap().to_owned()
    }

    fn state(&self, id: &str) -> Value {
        self.curl("GET", &format!("/v1/sandboxes/{id}"), None).1
    }

    /// Waits for `want`; fails at once on a state outside `via`.
    fn wait_state(&self, id: &str, want: &str, via: &[&str]) -> Value {
        let start = Instant::now();
        loop {
            let got = self.state(id);
            let state = got["status"]["state"].as_str().unwrap_or("?").to_owned();
            if state == want {
                return got;
            }
            assert!(
                via.contains(&state.as_str()),
                "{id} went {state} while waiting for {want}: {got}\n{}",
                self.log()
            );
            assert!(start.elapsed() < BOOT, "{id} is still {state} after {BOOT:?}: {got}\n{}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The daemon's own record of a sandbox (kept after the API forgets a
    /// deleted one).
    fn record(&self, id: &str) -> Value {
        let path = self.env.home.join(format!("server/sandboxes/{id}.json"));
        serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
    }

    /// Waits until the daemon's record of `id` reads `want`.
    fn wait_record(&self, id: &str, want: &str) -> Value {
        let start = Instant::now();
        loop {
            let record = self.record(id);
            if record["state"] == want {
                return record;
            }
            assert!(
                start.elapsed() < BOOT,
                "{id} is still {} after {BOOT:?}\n{}",
                record["state"],
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The execd base URL and its token header.
    fn execd(&self, id: &str) -> (String, String) {
        let (code, ep) = self.curl("GET", &format!("/v1/sandboxes/{id}/endpoints/44772"), None);
        assert_eq!(code, 200, "{ep}");
        (
            format!("http://{}", ep["endpoint"].as_str().unwrap()),
            format!("X-EXECD-ACCESS-TOKEN: {}", ep["headers"]["X-EXECD-ACCESS-TOKEN"].as_str().unwrap()),
        )
    }

    /// Runs `command` to completion in the sandbox; returns the SSE body.
    fn run(&self, id: &str, command: &str) -> String {
        let (base, token) = self.execd(id);
        let out = Command::new("curl")
            .args(["-sN", "-H", &token, "-H", "content-type: application/json", "--data-binary"])
            .arg(json!({ "command": command }).to_string())
            .arg(format!("{base}/command"))
            .output()
            .unwrap();
        text(&out.stdout)
    }

    fn command_status(&self, id: &str, cmd: &str) -> Value {
        let (base, token) = self.execd(id);
        let out = Command::new("curl")
            .args(["-s", "-H", &token])
            .arg(format!("{base}/command/status/{cmd}"))
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    fn jobs(&self) -> Vec<Value> {
        let out = self.env.pvisor(&["jobs", "--json"]);
        json_lines(&text(&out.stdout))
            .into_iter()
            .filter(|(kind, _)| kind == "job")
            .map(|(_, job)| job)
            .collect()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Leave no VM behind: kill every sandbox's Job, then the daemon.
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for job in self.jobs() {
            if let Some(id) = job["job"].as_str().or(job["id"].as_str()) {
                let _ = self.env.pvisor(&["kill", id, "--grace", "2s"]);
            }
        }
    }
}

fn sdk(daemon: &Daemon, script: &str) -> String {
    let out = Command::new(sdk_python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/sdk").join(script))
        .env("PVISOR_URL", format!("127.0.0.1:{}", daemon.port))
        .env("PVISOR_KEY", &daemon.key)
        .env("SPECS", Path::new(env!("CARGO_MANIFEST_DIR")).join("../../specs/opensandbox"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} failed\nstdout: {}\nstderr: {}\ndaemon: {}",
        text(&out.stdout),
        text(&out.stderr),
        daemon.log()
    );
    text(&out.stdout)
}

#[test]
fn the_published_python_sdk_runs_its_flow_unchanged() {
    let daemon = Daemon::new();
    let out = sdk(&daemon, "flow.py");
    assert!(out.contains("SDK flow OK"), "{out}");
    // One vm Job behind the one sandbox that was created, two Attempts
    // (create, resume); sandbox ids are not Job ids.
    let jobs = daemon.jobs();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    // kill() returns at 204 and the sandbox is gone from the API at once
    // (the reference removes its container); the daemon's record reads
    // Terminated once its Job ended.
    let listing = daemon.curl("GET", "/v1/sandboxes", None).1;
    assert_eq!(listing["items"], json!([]), "{listing}");
    let records: Vec<_> = fs::read_dir(daemon.env.home.join("server/sandboxes"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .collect();
    assert_eq!(records.len(), 1, "{records:?}");
    let id = records[0].path().file_stem().unwrap().to_string_lossy().into_owned();
    let id = id.as_str();
    assert_eq!(daemon.curl("GET", &format!("/v1/sandboxes/{id}"), None).0, 404);
    let record = daemon.wait_record(id, "Terminated");
    assert_eq!(record["generations"].as_array().unwrap().len(), 2, "{record}");
    assert_ne!(record["job"], id);
    // A terminated sandbox leaves no execution checkpoint, and its stage is dropped.
    let runs = fs::read_dir(daemon.env.home.join("runs")).unwrap().flatten().collect::<Vec<_>>();
    assert!(runs.iter().all(|r| !r.path().join("exec-checkpoints").exists()), "checkpoints left behind");
    let status = text(&daemon.env.pvisor(&["status", "--json"]).stdout);
    assert!(status.contains("\"stage_state\":\"dropped\"") || status.contains("\"changes\":0"), "{status}");
}

/// Issue 20, item 7: code contexts, driven by the published code-interpreter
/// SDK (`tests/sdk/code.py`, which cites the reference e2e test it follows).
#[test]
fn the_code_interpreter_sdk_runs_python_and_bash_contexts() {
    let daemon = Daemon::new();
    let out = sdk(&daemon, "code.py");
    assert!(out.contains("code interpreter OK"), "{out}");
}

/// Issue 20: a client nobody here wrote in Python. The published TypeScript
/// SDK (`tests/sdk/flow.mjs`, installed by `scripts/sdk-env.sh`) creates,
/// runs commands, moves files, renews earlier, pauses, resumes and kills.
#[test]
fn the_published_typescript_sdk_runs_its_flow_unchanged() {
    let sdk = target_dir().join("ts-sdk/node_modules/@alibaba-group/opensandbox/dist/index.js");
    assert!(sdk.exists(), "no TypeScript SDK at {}: run scripts/sdk-env.sh", sdk.display());
    let daemon = Daemon::new();
    let out = Command::new("node")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/sdk/flow.mjs"))
        .env("PVISOR_URL", format!("127.0.0.1:{}", daemon.port))
        .env("PVISOR_KEY", &daemon.key)
        .env("OPENSANDBOX_TS_SDK", &sdk)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success() && text(&out.stdout).contains("TypeScript SDK flow OK"),
        "flow.mjs failed\nstdout: {}\nstderr: {}\ndaemon: {}",
        text(&out.stdout),
        text(&out.stderr),
        daemon.log()
    );
}

#[test]
fn the_sdk_flow_runs_rootless_too() {
    if !As::Rootless.available() {
        return;
    }
    let daemon = Daemon::new_as(As::Rootless);
    let out = sdk(&daemon, "flow.py");
    assert!(out.contains("SDK flow OK"), "{out}");
    // The supervisors and QEMU ran as the unprivileged user.
    let record = fs::read_dir(daemon.env.home.join("server/sandboxes"))
        .unwrap()
        .flatten()
        .find(|e| e.path().extension().is_some_and(|x| x == "json"))
        .unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&record.metadata().unwrap()), UNPRIVILEGED);
}

#[test]
fn every_route_answers_as_the_spec_says() {
    let daemon = Daemon::new();
    let out = sdk(&daemon, "contract.py");
    assert!(out.contains("contract OK"), "{out}");
}

#[test]
fn a_daemon_killed_during_create_finds_the_sandbox_running_after_restart() {
    let mut daemon = Daemon::new();
    let id = daemon.create(json!({}));
    // Killed once the supervisor is starting the VM (well before it is ready).
    let record = daemon.env.home.join(format!("server/sandboxes/{id}.json"));
    let spawned = || {
        fs::read(&record)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .is_some_and(|r| r["supervisor"].is_u64())
    };
    assert!(wait_until(Duration::from_secs(10), spawned));
    daemon.kill9();
    assert_eq!(daemon.curl("GET", "/health", None).0, 0, "the daemon is down");
    daemon.start();
    // Pending (booting, or being reattached) and then Running; never Failed.
    daemon.wait_state(&id, "Running", &["Pending"]);
    assert!(daemon.run(&id, "echo alive").contains(r#""text":"alive""#));
    assert_eq!(daemon.jobs().len(), 1, "the restart must not start a second VM");
    // The entrypoint was started exactly once.
    let record: Value = serde_json::from_slice(
        &fs::read(daemon.env.home.join(format!("server/sandboxes/{id}.json"))).unwrap(),
    )
    .unwrap();
    assert!(record["commands"]["entrypoint"].is_object(), "{record}");
}

#[test]
fn a_daemon_killed_during_pause_reports_paused_only_once_it_is() {
    let mut daemon = Daemon::new();
    let id = daemon.create(json!({}));
    daemon.wait_state(&id, "Running", &["Pending"]);
    daemon.run(&id, "echo before > /root/mark");
    let (code, body) = daemon.curl("POST", &format!("/v1/sandboxes/{id}/pause"), None);
    assert_eq!(code, 202, "{body}");
    daemon.kill9();
    daemon.start();
    // The supervisor finished the suspend on its own; the state says so only
    // once the termination receipt made the Job suspended.
    daemon.wait_state(&id, "Paused", &["Pausing", "Running"]);
    let status = daemon.env.pvisor(&["status", "--json"]);
    assert!(text(&status.stdout).contains("\"suspended\""), "{}", text(&status.stdout));
    assert_eq!(daemon.curl("POST", &format!("/v1/sandboxes/{id}/resume"), None).0, 202);
    daemon.wait_state(&id, "Running", &["Resuming", "Paused"]);
    assert!(daemon.run(&id, "cat /root/mark").contains(r#""text":"before""#));
}

#[test]
fn a_daemon_killed_during_a_streamed_command_reports_it_honestly() {
    let mut daemon = Daemon::new();
    let id = daemon.create(json!({}));
    daemon.wait_state(&id, "Running", &["Pending"]);
    let (base, token) = daemon.execd(&id);
    let mut stream = Command::new("curl")
        .args(["-sN", "-H", &token, "-H", "content-type: application/json", "--data-binary"])
        .arg(json!({ "command": "echo started; sleep 3; echo finished > /tmp/done" }).to_string())
        .arg(format!("{base}/command"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = String::new();
    let mut out = stream.stdout.take().unwrap();
    while !seen.contains("started") {
        let mut buf = [0u8; 4096];
        let n = std::io::Read::read(&mut out, &mut buf).unwrap();
        assert!(n > 0, "the stream ended early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let cmd = seen.split("\"text\":\"").nth(1).unwrap().split('"').next().unwrap().to_owned();
    daemon.kill9();
    let _ = stream.wait();
    daemon.start();
    daemon.wait_state(&id, "Running", &["Pending"]);
    // The command kept running in the guest; its status comes from the guest.
    assert!(
        wait_until(Duration::from_secs(30), || daemon.command_status(&id, &cmd)["running"] == false),
        "{}",
        daemon.command_status(&id, &cmd)
    );
    let status = daemon.command_status(&id, &cmd);
    assert_eq!(status["exit_code"], 0, "{status}");
    assert!(daemon.run(&id, "cat /tmp/done").contains("finished"));
}

#[test]
fn a_client_that_disconnects_cancels_its_command() {
    let daemon = Daemon::new();
    let id = daemon.create(json!({}));
    daemon.wait_state(&id, "Running", &["Pending"]);
    let (base, token) = daemon.execd(&id);
    let out = Command::new("curl")
        .args([
            "-sN",
            "--max-time",
            "3",
            "-H",
            &token,
            "-H",
            "content-type: application/json",
            "--data-binary",
        ])
        .arg(json!({ "command": "echo go; sleep 20; touch /tmp/never" }).to_string())
        .arg(format!("{base}/command"))
        .output()
        .unwrap();
    let seen = text(&out.stdout);
    let cmd = seen.split("\"text\":\"").nth(1).unwrap().split('"').next().unwrap().to_owned();
    assert!(
        wait_until(Duration::from_secs(15), || daemon.command_status(&id, &cmd)["running"] == false),
        "the command outlived its client: {}",
        daemon.command_status(&id, &cmd)
    );
    let status = daemon.command_status(&id, &cmd);
    assert_eq!(status["exit_code"], 128 + libc::SIGTERM, "{status}");
    std::thread::sleep(Duration::from_secs(1));
    assert!(daemon.run(&id, "ls /tmp/never 2>&1; true").contains("No such file"));
}

#[test]
fn an_expired_sandbox_is_killed_even_across_a_restart() {
    let mut daemon = Daemon::new();
    let id = daemon.create(json!({ "timeout": 60 }));
    daemon.wait_state(&id, "Running", &["Pending"]);
    daemon.kill9();
    daemon.start();
    let started = Instant::now();
    let ended = daemon.wait_record(&id, "Terminated");
    assert_eq!(ended["reason"], "ttl_expiry", "{ended}");
    // Expired is deleted: gone from the API, as the reference's
    // `_expire_sandbox` removes the container.
    assert_eq!(daemon.curl("GET", &format!("/v1/sandboxes/{id}"), None).0, 404);
    let expires = ended["expires_at"].as_str().unwrap_or_default().to_owned();
    assert!(started.elapsed() < Duration::from_secs(75), "expired late ({expires})");
    let jobs = daemon.jobs();
    assert!(jobs.iter().all(|j| j["state"] != "running"), "{jobs:?}");
}

#[test]
fn sigterm_pauses_running_sandboxes_and_they_resume_after_restart() {
    let mut daemon = Daemon::new();
    let id = daemon.create(json!({}));
    daemon.wait_state(&id, "Running", &["Pending"]);
    daemon.run(
        &id,
        "echo kept > /root/file; (while true; do date +%s%N > /tmp/beat; sleep 0.2; done) > /dev/null 2>&1 &",
    );
    let mut child = daemon.child.take().unwrap();
    send_signal(child.id(), rustix::process::Signal::TERM).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}: {}", daemon.log());
    daemon.start();
    assert_eq!(daemon.state(&id)["status"]["state"], "Paused", "{}", daemon.log());
    assert_eq!(daemon.curl("POST", &format!("/v1/sandboxes/{id}/resume"), None).0, 202);
    daemon.wait_state(&id, "Running", &["Resuming", "Paused"]);
    assert!(daemon.run(&id, "cat /root/file").contains("kept"));
    let beat = |d: &Daemon| d.run(&id, "cat /tmp/beat");
    let first = beat(&daemon);
    std::thread::sleep(Duration::from_millis(800));
    assert_ne!(first, beat(&daemon), "the background loop did not survive pause and resume");
}

/// Distinguishes the keys of daemons one test process starts.
fn port_seed() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn a_vm_that_ends_on_its_own_is_not_reported_running() {
    let daemon = Daemon::new();
    let id = daemon.create(json!({}));
    daemon.wait_state(&id, "Running", &["Pending"]);
    // Root in the guest can kill every process but PID 1, the Job's keeper included.
    daemon.run(&id, "kill -9 -1");
    let ended = daemon.wait_state(&id, "Failed", &["Running"]);
    assert_eq!(ended["status"]["reason"], "runtime_exited", "{ended}");
    assert!(ended["status"]["message"].as_str().unwrap().contains("keeper"), "{ended}");
    let (code, _) = daemon.curl("POST", &format!("/v1/sandboxes/{id}/pause"), None);
    assert_eq!(code, 409);
    assert_closed_and_freed(&daemon, &id);
}

/// The VM disk images left anywhere in the daemon's state directory.
fn vm_disks(daemon: &Daemon) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for run in fs::read_dir(daemon.env.home.join("runs")).into_iter().flatten().flatten() {
        for attempt in fs::read_dir(run.path().join("attempts")).into_iter().flatten().flatten() {
            for image in ["lower.img", "upper.img"] {
                let path = attempt.path().join("vm").join(image);
                if path.exists() {
                    found.push(path);
                }
            }
        }
    }
    found
}

/// A Failed sandbox: its Job is closed, its disks are freed, and DELETE
/// answers 204 (the reference server deletes a failed sandbox's container).
fn assert_closed_and_freed(daemon: &Daemon, id: &str) {
    assert!(
        wait_until(Duration::from_secs(60), || vm_disks(daemon).is_empty()),
        "VM disks left behind: {:?}",
        vm_disks(daemon)
    );
    let jobs = daemon.jobs();
    assert!(jobs.iter().all(|j| j["live"] == false && j["state"] != "running"), "{jobs:?}");
    let (code, _) = daemon.curl("DELETE", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(code, 204);
}

#[test]
fn a_killed_sandbox_supervisor_is_closed_and_its_disks_freed() {
    let daemon = Daemon::new();
    let id = daemon.create(json!({}));
    daemon.wait_state(&id, "Running", &["Pending"]);
    assert!(!vm_disks(&daemon).is_empty(), "a running VM has its disks");
    let record: Value = serde_json::from_slice(
        &fs::read(daemon.env.home.join("server/sandboxes").join(format!("{id}.json"))).unwrap(),
    )
    .unwrap();
    let pid = record["supervisor"].as_u64().expect("the supervisor's pid is recorded") as u32;
    // The sandbox's supervisor, a child process of this test's daemon.
    send_signal(pid, rustix::process::Signal::KILL).unwrap();
    let ended = daemon.wait_state(&id, "Failed", &["Running"]);
    assert_eq!(ended["status"]["reason"], "runtime_exited", "{ended}");
    assert_closed_and_freed(&daemon, &id);
}

/// Issue 18: `GET /files/search` compiles the client's pattern into an
/// automaton. A pattern of many stars against long names answers at once
/// (the old backtracking matcher took seconds per name: a client could pin
/// the daemon), and a malformed pattern is a 400 that names it.
#[test]
fn a_hostile_search_pattern_cannot_pin_the_daemon() {
    let daemon = Daemon::new();
    let id = daemon.create(json!({}));
    daemon.wait_state(&id, "Running", &["Pending"]);
    daemon.run(
        &id,
        &format!(
            "mkdir -p /tmp/s && cd /tmp/s && for i in 1 2 3 4 5 6 7 8; do touch {}$i; done",
            "a".repeat(40)
        ),
    );
    let (base, token) = daemon.execd(&id);
    let search = |pattern: &str| {
        let out = Command::new("curl")
            .args(["-s", "--max-time", "20", "-G", "-w", "\n%{http_code}", "-H", &token])
            .arg("--data-urlencode")
            .arg("path=/tmp/s")
            .arg("--data-urlencode")
            .arg(format!("pattern={pattern}"))
            .arg(format!("{base}/files/search"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "curl gave up on {pattern:?}: the daemon is pinned");
        let body = text(&out.stdout);
        let (body, code) = body.rsplit_once('\n').unwrap();
        (code.to_owned(), body.to_owned())
    };
    // Twelve stars; every name is forty `a`s and a digit.
    let (code, body) = search(&format!("{}b", "*a".repeat(12)));
    assert_eq!(code, "200", "{body}");
    assert_eq!(body.trim(), "[]", "no name ends in b");
    let (code, body) = search("*a1");
    assert_eq!(code, "200");
    assert!(body.contains("a1"), "{body}");
    let (code, body) = search("a[0-9");
    assert_eq!(code, "400", "{body}");
    assert!(body.contains("a[0-9"), "the error names the pattern: {body}");
}

/// Issue 20, item 8: images agents can use. `python` (imported when first
/// asked for) runs python3 with its standard library, a venv, pip, git and
/// curl; `default` has setpriv, so commands with uid/gid run as that user.
#[test]
fn the_built_in_images_run_python_and_commands_as_another_user() {
    let daemon = Daemon::new();
    let py = daemon.create(json!({ "image": { "uri": "python" } }));
    let plain = daemon.create(json!({}));
    daemon.wait_state(&py, "Running", &["Pending"]);
    daemon.wait_state(&plain, "Running", &["Pending"]);
    let out = daemon.run(
        &py,
        "python3 -c 'import json, sqlite3, ssl, ctypes; print(6 * 7)' && python3 -m venv /tmp/v && \
         /tmp/v/bin/python -m pip --version >/dev/null && git --version && curl --version | head -1 && \
         test -s /etc/ssl/certs/ca-certificates.crt && echo certs-ok",
    );
    for want in [r#""text":"42""#, "git version", "curl 7", "certs-ok"] {
        assert!(out.contains(want), "{want} missing from the python image's output: {out}");
    }
    assert!(!out.contains(r#""type":"error""#), "{out}");
    // uid/gid through the API (setpriv in `default`).
    let (base, token) = daemon.execd(&plain);
    let run_as = Command::new("curl")
        .args(["-sN", "-H", &token, "-H", "content-type: application/json", "--data-binary"])
        .arg(json!({ "command": "id -u; id -g", "uid": 1000, "gid": 1001 }).to_string())
        .arg(format!("{base}/command"))
        .output()
        .unwrap();
    let out = text(&run_as.stdout);
    assert!(out.contains(r#""text":"1000""#) && out.contains(r#""text":"1001""#), "{out}");
}

/// A static HTTP server on host loopback (`python3 -m http.server`), killed on drop.
struct HostServer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl HostServer {
    fn start(file: &str, contents: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(file), contents).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("python3")
            .args(["-m", "http.server", &port.to_string(), "--bind", "127.0.0.1", "--directory"])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        assert!(
            wait_until(Duration::from_secs(20), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok())
        );
        Self { child, port, _dir: dir }
    }
}

impl Drop for HostServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The stdout texts of a command's SSE body, joined.
fn stdout_of(sse: &str) -> String {
    sse.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["type"] == "stdout")
        .map(|e| e["text"].as_str().unwrap_or("").to_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Issue 20: `networkPolicy` is enforced by the sandbox Job's proxy, in the
/// reference egress sidecar's order (names: the first matching rule, then
/// `defaultAction`: components/egress/pkg/policy/policy.go, `Evaluate`, and
/// domain_index.go, `match`; addresses: deny sets before allow sets,
/// pkg/nftables/manager.go); a client that ignores the proxy variables
/// reaches nothing (the VM has no NIC); every decision is a Trace event.
#[test]
fn network_policy_is_enforced_in_order_and_every_decision_is_recorded() {
    let daemon = Daemon::new();
    // Bad policies: 400 naming the field, and no sandbox.
    for (policy, says) in [
        (json!({ "defaultAction": "maybe" }), "defaultAction"),
        (json!({ "egress": [{ "action": "permit", "target": "a.com" }] }), "egress[0].action"),
        (json!({ "egress": [{ "action": "allow", "target": "" }] }), "empty"),
        (
            json!({ "egress": [{ "action": "allow", "target": "a.com" }, { "action": "deny", "target": "10.0.0.0/33" }] }),
            "egress[1]",
        ),
        (json!({ "egress": [{ "action": "allow", "target": "300.1.2.0/24" }] }), "CIDR"),
        (json!({ "egress": [{ "action": "allow", "target": "*" }] }), "defaultAction"),
        (json!({ "egress": [{ "action": "allow", "target": "a.com", "port": 443 }] }), "unknown field"),
        (json!({ "default": "allow" }), "unknown field"),
    ] {
        let body = json!({ "image": { "uri": "python" }, "entrypoint": ["tail", "-f", "/dev/null"], "networkPolicy": policy });
        let (code, answer) = daemon.curl("POST", "/v1/sandboxes", Some(body));
        assert_eq!(code, 400, "{policy} was accepted: {answer}");
        assert!(answer["message"].as_str().unwrap_or("").contains(says), "{policy}: {answer}");
    }
    assert_eq!(daemon.curl("GET", "/v1/sandboxes", None).1["items"], json!([]));

    let server = HostServer::start("hello.txt", "from the host\n");
    let port = server.port;
    let only_localhost = daemon.create(json!({ "image": { "uri": "python" },
        "networkPolicy": { "defaultAction": "deny", "egress": [{ "action": "allow", "target": "localhost" }] } }));
    let first_match = daemon.create(json!({ "image": { "uri": "python" },
        "networkPolicy": { "defaultAction": "allow", "egress": [
            { "action": "deny", "target": "localhost" },
            { "action": "allow", "target": "127.0.0.0/8" },
            { "action": "deny", "target": "127.0.0.2" } ] } }));
    daemon.wait_state(&only_localhost, "Running", &["Pending"]);
    daemon.wait_state(&first_match, "Running", &["Pending"]);
    // Inside the guest, localhost and 127.0.0.1 are the guest itself and
    // bypass the proxy (NO_PROXY); `--noproxy ''` sends them to the proxy,
    // which resolves names on the host: a stand-in for a public name.
    let status = |sb: &str, url: &str| {
        stdout_of(&daemon.run(sb, &format!("curl -s --noproxy '' -o /dev/null -w '%{{http_code}}' {url}")))
            .trim()
            .to_owned()
    };
    let by_name = format!("http://localhost:{port}/hello.txt");
    let by_ip = format!("http://127.0.0.1:{port}/hello.txt");

    // Allowed by egress[0]: the file arrives through the proxy.
    let raw = daemon.run(&only_localhost, &format!("curl -sSf --noproxy '' {by_name}"));
    assert!(stdout_of(&raw).contains("from the host"), "an allowed request failed: {raw}");
    // Denied by defaultAction: the proxy answers 403 and nothing is fetched.
    assert_eq!(status(&only_localhost, &by_ip), "403");
    // A client that ignores the proxy reaches nothing: no NIC, and the
    // guest's own loopback has no such server.
    let direct = daemon.run(
        &only_localhost,
        &format!(
            "curl -s --noproxy '*' --max-time 5 {by_name} || echo curl-failed; \
             python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 3)\" 2>/dev/null || echo socket-failed; \
             python3 -c \"import socket; socket.create_connection(('10.0.2.2', {port}), 3)\" 2>/dev/null || echo route-failed"
        ),
    );
    let direct = stdout_of(&direct);
    assert!(!direct.contains("from the host"), "a direct connection got through: {direct}");
    for want in ["curl-failed", "socket-failed", "route-failed"] {
        assert!(direct.contains(want), "{want} missing: {direct}");
    }

    // Names: the first matching rule wins, so localhost is denied by
    // egress[0] though the default allows. Addresses: a deny rule beats an
    // allow rule whatever the order, as the reference's nftables sets do, so
    // 127.0.0.1 is allowed by egress[1] and 127.0.0.2 denied by egress[2].
    assert_eq!(status(&first_match, &by_name), "403");
    assert_eq!(status(&first_match, &by_ip), "200");
    assert_eq!(status(&first_match, &format!("http://127.0.0.2:{port}/hello.txt")), "403");

    // The egress sidecar's policy API (port 18080, what the SDKs'
    // get_egress_policy calls) reads the policy back; a change is refused.
    let (code, ep) = daemon.curl("GET", &format!("/v1/sandboxes/{first_match}/endpoints/18080"), None);
    assert_eq!(code, 200, "{ep}");
    let token = format!("X-EXECD-ACCESS-TOKEN: {}", ep["headers"]["X-EXECD-ACCESS-TOKEN"].as_str().unwrap());
    let policy_api = |method: &str, body: &str| {
        let out = Command::new("curl")
            .args([
                "-s",
                "-X",
                method,
                "-H",
                &token,
                "-H",
                "content-type: application/json",
                "-w",
                "\n%{http_code}",
            ])
            .args(if body.is_empty() { vec![] } else { vec!["--data-binary", body] })
            .arg(format!("http://{}/policy", ep["endpoint"].as_str().unwrap()))
            .output()
            .unwrap();
        text(&out.stdout)
    };
    let got = policy_api("GET", "");
    let (body, code) = got.rsplit_once('\n').unwrap();
    assert_eq!(code, "200", "{got}");
    let body: Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["mode"], "enforcing", "{body}");
    assert_eq!(body["policy"]["defaultAction"], "allow", "{body}");
    assert_eq!(body["policy"]["egress"][1], json!({ "action": "allow", "target": "127.0.0.0/8" }), "{body}");
    let refused = policy_api("PATCH", r#"[{"action":"allow","target":"example.com"}]"#);
    assert!(refused.ends_with("400") && refused.contains("fixed at create"), "{refused}");

    // The policy survives a pause and resume (a new Attempt of the same Job,
    // from the recorded decision): allowed still arrives, denied still 403.
    let (code, body) = daemon.curl("POST", &format!("/v1/sandboxes/{only_localhost}/pause"), None);
    assert_eq!(code, 202, "{body}");
    daemon.wait_state(&only_localhost, "Paused", &["Pausing", "Running"]);
    let (code, body) = daemon.curl("POST", &format!("/v1/sandboxes/{only_localhost}/resume"), None);
    assert_eq!(code, 202, "{body}");
    daemon.wait_state(&only_localhost, "Running", &["Resuming", "Paused"]);
    let raw = daemon.run(&only_localhost, &format!("curl -sSf --noproxy '' {by_name}"));
    assert!(stdout_of(&raw).contains("from the host"), "after resume, an allowed request failed: {raw}");
    assert_eq!(status(&only_localhost, &by_ip), "403", "after resume");

    // Every decision is in the sandbox Job's Trace, with the rule that made it.
    let job = daemon.record(&only_localhost)["job"].as_str().unwrap().to_owned();
    let events = text(&daemon.env.pvisor(&["events", &job, "--json"]).stdout);
    let network: Vec<Value> = records_of(&events, "event")
        .into_iter()
        .filter(|e| e.to_string().contains("network.allowed") || e.to_string().contains("network.denied"))
        .collect();
    let allowed =
        network.iter().find(|e| e.to_string().contains("network.allowed")).expect("no network.allowed event");
    assert!(allowed.to_string().contains("egress[0] allow localhost"), "{allowed}");
    let denied =
        network.iter().find(|e| e.to_string().contains("network.denied")).expect("no network.denied event");
    assert!(
        denied.to_string().contains("127.0.0.1") && denied.to_string().contains("defaultAction deny"),
        "{denied}"
    );
}
