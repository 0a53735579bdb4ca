//! `pvisor serve`: the real daemon on loopback, driven by real HTTP clients
//! (curl, and the published OpenSandbox Python SDK), booting real microVMs.
//! Crash tests SIGKILL the daemon mid-operation and check that, after a
//! restart, every sandbox's state is what is really true.
//!
//! Needs the guest image (`scripts/vm-image.sh`), the default sandbox image
//! (`scripts/sandbox-image.sh`) and the SDK venv (`scripts/sdk-env.sh`);
//! `scripts/test.sh` builds all three.
//!
//! This module is the harness (a restartable [`Daemon`] and its clients); the
//! tests are in `sdk`, `crash` and `sandboxes`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::*;

#[path = "../../../benches/support/hosts.rs"]
mod hosts;

mod crash;
mod hostile;
mod sandboxes;
mod sdk;
mod snapshots;
mod upgrades;
mod vault;
mod volumes;

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
    /// More `pvisor serve` arguments.
    args: Vec<String>,
    /// The daemon's own `/etc/hosts` (in a mount namespace of its own):
    /// names its proxy resolves for the sandboxes' requests.
    hosts: Option<PathBuf>,
    /// What holds that mount namespace, so a restarted daemon starts in
    /// the one its supervisors share (they answer no other).
    hosts_holder: Option<Child>,
    /// More variables for the daemon.
    envs: Vec<(String, String)>,
}

impl Daemon {
    fn new() -> Self {
        Self::new_as(As::Root)
    }

    fn new_as(who: As) -> Self {
        Self::with_args(who, &[])
    }

    fn with_args(who: As, args: &[&str]) -> Self {
        Self::on_env(Env::new(who), args)
    }

    /// A daemon over `env`, prepared by the caller (its state directory on
    /// a disk of its own, say).
    fn on_env(env: Env, args: &[&str]) -> Self {
        let mut daemon = Self::unstarted(env, args);
        daemon.start();
        daemon
    }

    fn unstarted(env: Env, args: &[&str]) -> Self {
        assert!(vm_image().is_some(), "no guest image: run scripts/vm-image.sh");
        let key = format!("test-key-{:016}-{}", std::process::id(), port_seed());
        fs::write(env.dir.path().join("key"), format!("{key}\n")).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let args = args.iter().map(|a| (*a).to_owned()).collect();
        Self { env, port, key, child: None, args, hosts: None, hosts_holder: None, envs: Vec::new() }
    }

    /// A daemon (as root) that resolves names by `hosts` (an `/etc/hosts`
    /// bound over the host's in a mount namespace of its own), with `envs`.
    fn with_hosts(hosts: &str, envs: &[(&str, &str)]) -> Self {
        let env = Env::new(As::Root);
        let file = env.dir.path().join("hosts");
        fs::write(&file, format!("127.0.0.1 localhost\n{hosts}\n")).unwrap();
        let mut daemon = Self::unstarted(env, &[]);
        daemon.hosts = Some(file);
        daemon.envs = envs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
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
        cmd.arg(&key_file).args(&self.args).env("PVISOR_SANDBOX_IMAGE", image);
        // As root the binary runs from a copy (support::bin), away from the
        // build tree where it would find the larger built-in images.
        for (built, variable) in [
            ("sandbox-image-python", "PVISOR_SANDBOX_IMAGE_PYTHON"),
            ("sandbox-image-code-interpreter", "PVISOR_SANDBOX_IMAGE_CODE_INTERPRETER"),
        ] {
            let rootfs = target_dir().join(built).join("rootfs");
            if self.env.who == As::Root && rootfs.join("bin/sh").exists() {
                cmd.env(variable, rootfs);
            }
        }
        for (key, value) in &self.envs {
            cmd.env(key, value);
        }
        if let Some(hosts) = &self.hosts {
            let holder = self.hosts_holder.get_or_insert_with(|| {
                let mut sleep = Command::new("sleep");
                sleep.arg("infinity");
                let holder = hosts::in_own_hosts(sleep, hosts).spawn().unwrap();
                let bound = format!("/proc/{}/root/etc/hosts", holder.id());
                let want = fs::read(hosts).unwrap();
                assert!(wait_until(Duration::from_secs(10), || fs::read(&bound).is_ok_and(|b| b == want)));
                holder
            });
            let mut nsenter = Command::new("nsenter");
            nsenter.arg(format!("--mount=/proc/{}/ns/mnt", holder.id())).arg("--");
            cmd = hosts::running(nsenter, &cmd);
        }
        cmd.stdout(log.try_clone().unwrap()).stderr(log);
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
        if let Some(mut holder) = self.hosts_holder.take() {
            let _ = holder.kill();
            let _ = holder.wait();
        }
    }
}

/// Distinguishes the keys of daemons one test process starts.
/// The stdout events of a command's SSE body, joined by newlines.
fn stdout_of(sse: &str) -> String {
    sse.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["type"] == "stdout")
        .map(|e| e["text"].as_str().unwrap_or("").to_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

fn port_seed() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
