//! The daemon over the runtime's fakes: every route runs through
//! [`handle`] (the daemon's real HTTP handling, without a socket), each
//! sandbox's supervisor on a thread of this process
//! ([`Supervisors::InProcess`]), and its VM a fake keeper Job with a
//! scripted guest. No VM, KVM or root. Assertions are on what a client
//! sees (states, exit codes, output, files) and on the sandbox's Job.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use pvisor::actions::{Kill, Status};
use pvisor::testing::{FakeGuest, FakeVmBackends, GuestRun, Script};
use pvisor::Runtime;
use pvisor_core::ids::JobId;
use pvisor_core::state::JobState;
use pvisor_core::store::Store;
use serde_json::{json, Value};

use crate::sandbox::{SandboxState, EXECD_PORT};
use crate::{handle, Config, Daemon, Supervisors};

struct Serve {
    dir: tempfile::TempDir,
    daemon: Arc<Daemon>,
    runtime: Runtime,
    sessions: tokio::runtime::Handle,
    guest: Arc<FakeGuest>,
    http: tokio::runtime::Runtime,
}

/// A Tokio runtime on a thread of its own, for the supervisors' Sessions.
fn sessions() -> tokio::runtime::Handle {
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let handle = tokio.handle().clone();
    std::thread::spawn(move || tokio.block_on(std::future::pending::<()>()));
    handle
}

fn config(dir: &std::path::Path) -> Config {
    Config {
        volumes: Default::default(),
        state_root: dir.join("state"),
        pvisor: "/nonexistent/pvisor".into(),
        max_timeout: Duration::from_secs(3600),
        log_level: None,
    }
}

fn serve(rules: &[(&'static str, GuestRun)]) -> Serve {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("image");
    std::fs::create_dir_all(image.join("bin")).unwrap();
    std::fs::create_dir_all(image.join("etc")).unwrap();
    std::fs::write(image.join("bin/sh"), "").unwrap();
    std::fs::write(image.join("etc/hostname"), "box\n").unwrap();
    let guest = FakeGuest::new(rules.iter().cloned());
    // The default entrypoint runs until the sandbox ends, as a real one does
    // (a sandbox ends with its entrypoint).
    guest.on("tail -f /dev/null", GuestRun::runs(""));
    let backends = FakeVmBackends::working(Script::runs_until(&[libc::SIGTERM]), guest.clone());
    let runtime = Runtime::new(Store::open(dir.path().join("state")).unwrap(), Arc::new(backends));
    let sessions = sessions();
    let supervisors = Supervisors::InProcess(sessions.clone());
    let built_in = vec![("default".to_owned(), image)];
    let daemon = Daemon::open_with(runtime.clone(), supervisors, config(dir.path()), built_in).unwrap();
    let http = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    Serve { dir, daemon, runtime, sessions, guest, http }
}

impl Serve {
    /// One request through the daemon's router; the whole body.
    fn call(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> (StatusCode, Vec<u8>) {
        let mut request = Request::builder().method(method).uri(path).header("host", "127.0.0.1:8080");
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let request = request.body(Full::new(Bytes::from(body))).unwrap();
        self.http.block_on(async {
            let response = handle(self.daemon.clone(), None, request).await;
            let (parts, body) = response.into_parts();
            (parts.status, body.collect().await.unwrap().to_bytes().to_vec())
        })
    }

    fn json(&self, method: Method, path: &str, body: Value) -> (StatusCode, Value) {
        let bytes = if body.is_null() { Vec::new() } else { body.to_string().into_bytes() };
        let (status, out) = self.call(method, path, &[("content-type", "application/json")], bytes);
        (status, serde_json::from_slice(&out).unwrap_or(Value::Null))
    }

    /// Creates a sandbox of the `default` image and waits until it runs.
    fn create(&self, body: Value) -> String {
        let (status, created) = self.json(Method::POST, "/v1/sandboxes", body);
        assert_eq!(status, StatusCode::ACCEPTED, "{created}");
        let id = created["id"].as_str().unwrap().to_owned();
        self.await_state(&id, "Running");
        id
    }

    fn state(&self, id: &str) -> Value {
        self.json(Method::GET, &format!("/v1/sandboxes/{id}"), Value::Null).1
    }

    fn await_state(&self, id: &str, want: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = self.state(id);
            if got["status"]["state"] == want {
                return got;
            }
            assert!(Instant::now() < deadline, "{id} never became {want}: {got}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A request to the sandbox's execd, with its access token.
    fn execd(
        &self,
        id: &str,
        method: Method,
        rest: &str,
        body: Vec<u8>,
        content_type: &str,
    ) -> (StatusCode, Vec<u8>) {
        let (_, endpoint) =
            self.json(Method::GET, &format!("/v1/sandboxes/{id}/endpoints/{EXECD_PORT}"), Value::Null);
        let token = endpoint["headers"]["X-EXECD-ACCESS-TOKEN"]
            .as_str()
            .unwrap_or_else(|| panic!("{endpoint}"))
            .to_owned();
        let headers = [("x-execd-access-token", token.as_str()), ("content-type", content_type)];
        self.call(method, &format!("/sandboxes/{id}/port/{EXECD_PORT}/{rest}"), &headers, body)
    }

    /// Runs `command` in the foreground; its SSE events.
    fn command(&self, id: &str, command: &str) -> Vec<Value> {
        let body = json!({ "command": command }).to_string().into_bytes();
        let (status, out) = self.execd(id, Method::POST, "command", body, "application/json");
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
        String::from_utf8(out)
            .unwrap()
            .lines()
            .filter_map(|l| {
                l.strip_prefix("data:").or(Some(l)).and_then(|l| serde_json::from_str(l.trim()).ok())
            })
            .collect()
    }

    fn job(&self, id: &str) -> JobId {
        self.daemon.get(id).unwrap().job.unwrap()
    }

    fn job_state(&self, job: &JobId) -> JobState {
        self.runtime.execute(Status { job: job.clone() }).unwrap().state
    }

    fn rootfs(&self, id: &str) -> PathBuf {
        self.daemon.get(id).unwrap().rootfs
    }

    /// A new daemon over the same state directory and runtime, not yet
    /// recovered (the old one is forgotten, as a dead daemon is).
    fn reopened(self) -> Serve {
        let supervisors = Supervisors::InProcess(self.sessions.clone());
        let daemon =
            Daemon::open_with(self.runtime.clone(), supervisors, config(self.dir.path()), Vec::new())
                .unwrap();
        Serve { daemon, ..self }
    }

    /// [`Self::reopened`], and recovered.
    fn restarted(self) -> Serve {
        let s = self.reopened();
        s.daemon.recover();
        s
    }

    /// Pauses or resumes `id` (`action`) and waits until it is `then`.
    fn pause_or_resume(&self, id: &str, action: &str, then: &str) {
        let (status, _) = self.json(Method::POST, &format!("/v1/sandboxes/{id}/{action}"), Value::Null);
        assert_eq!(status, StatusCode::ACCEPTED);
        self.await_state(id, then);
    }

    /// Kills guest exec `exec` with `signal`; the sandbox once it failed.
    fn kill_exec(&self, id: &str, exec: u32, signal: i32) -> Value {
        let (_, link) = self.daemon.live_link(id).unwrap();
        crate::guest_link::signal(&link, exec, signal).unwrap();
        self.await_state(id, "Failed")
    }
}

fn stdout_of(events: &[Value]) -> String {
    events
        .iter()
        .filter(|e| e["type"] == "stdout")
        .filter_map(|e| e["text"].as_str())
        .collect::<Vec<_>>()
        .join("")
}

/// A sandbox ends with its entrypoint: exit 0 → Terminated, else Failed
/// with upstream's reason and message; one that cannot be executed → 127.
#[test]
fn a_sandbox_ends_with_its_entrypoint_on_fakes() {
    let s = serve(&[
        ("exit-3", GuestRun::exits(3, "")),
        ("missing", GuestRun::fails(libc::ENOENT, "no such file")),
    ]);
    for (entrypoint, state, message) in [
        ("exit-3", "Failed", "Sandbox container exited with code 3."),
        ("missing", "Failed", "Sandbox container exited with code 127."),
        ("true", "Terminated", "Sandbox container exited successfully."),
    ] {
        let body = serde_json::json!({ "image": { "uri": "default" }, "entrypoint": [entrypoint] });
        let (status, created) = s.json(Method::POST, "/v1/sandboxes", body);
        assert_eq!(status, StatusCode::ACCEPTED, "{created}");
        let got = s.await_state(created["id"].as_str().unwrap(), state);
        assert_eq!(got["status"]["message"], message, "{entrypoint}: {got}");
        // Not a delete: an entrypoint that exits as soon as it starts once
        // raced its provisioner into ending as `user_delete`.
        assert_ne!(got["status"]["reason"], "user_delete", "{entrypoint}: {got}");
    }
}

/// An entrypoint whose `Exited` never reaches its channel (which stays
/// open) still ends its sandbox: the watcher asks the guest once the
/// channel has been silent a while.
#[test]
fn an_entrypoint_whose_exit_frame_is_lost_still_ends_the_sandbox_on_fakes() {
    let s = serve(&[("quiet", GuestRun::exits_unheard(5))]);
    let id = s.create(json!({ "image": { "uri": "default" }, "entrypoint": ["quiet"] }));
    let got = s.await_state(&id, "Failed");
    assert_eq!(got["status"]["message"], "Sandbox container exited with code 5.", "{got}");
}

#[test]
fn a_created_sandbox_runs_its_vm_and_is_listed_and_got() {
    let s = serve(&[]);
    let id = s.create(json!({ "image": { "uri": "default" }, "timeout": 600, "metadata": { "team": "a" } }));
    let got = s.state(&id);
    assert_eq!(got["status"]["reason"], "ready");
    assert_eq!(got["metadata"]["team"], "a");
    let (status, list) = s.json(Method::GET, "/v1/sandboxes", Value::Null);
    assert_eq!(status, StatusCode::OK);
    let listed: Vec<&str> =
        list["items"].as_array().unwrap().iter().filter_map(|i| i["id"].as_str()).collect();
    assert_eq!(listed, [id.as_str()]);
    let job = s.job(&id);
    assert_eq!(s.job_state(&job), JobState::Running, "its keeper Job holds the VM up");
    let (status, _) = s.json(Method::GET, "/v1/sandboxes/sb-nonexistent", Value::Null);
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[test]
fn a_foreground_command_streams_its_output_and_exit_code() {
    let s = serve(&[("echo hello", GuestRun::prints("hello\n", "oops\n", 4))]);
    let id = s.create(json!({ "image": { "uri": "default" } }));
    let events = s.command(&id, "echo hello");
    assert_eq!(stdout_of(&events), "hello", "one line, as an event: {events:?}");
    assert!(events.iter().any(|e| e["type"] == "stderr" && e["text"] == "oops"), "{events:?}");
    let error = events.iter().find(|e| e["type"] == "error").unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(error["error"]["evalue"], "4", "a nonzero exit is the error event");
    // Found by its command, not as the last start: the sandbox's entrypoint
    // starts in the background and may come after it.
    let started = s.guest.started.lock().unwrap().clone();
    let spec = started
        .iter()
        .find(|spec| spec.argv.last().map(String::as_str) == Some("echo hello"))
        .unwrap_or_else(|| panic!("the command was started: {started:?}"));
    assert_eq!(spec.root, Some(s.rootfs(&id)), "chrooted in the image");
    let cmd = events.iter().find(|e| e["type"] == "init").unwrap()["text"].as_str().unwrap().to_owned();
    let (_, status) =
        s.execd(&id, Method::GET, &format!("command/status/{cmd}"), Vec::new(), "application/json");
    let status: Value = serde_json::from_slice(&status).unwrap();
    assert_eq!(
        (status["running"].clone(), status["exit_code"].clone()),
        (json!(false), json!(4)),
        "{status}"
    );
}

#[test]
fn a_command_the_guest_cannot_start_reports_127() {
    let s = serve(&[("no-such", GuestRun::fails(libc::ENOENT, "no such file or directory"))]);
    let id = s.create(json!({ "image": { "uri": "default" } }));
    let events = s.command(&id, "no-such");
    let error = events.iter().find(|e| e["type"] == "error").unwrap_or_else(|| panic!("{events:?}"));
    assert!(error.to_string().contains("127"), "{error}");
}

#[test]
fn files_are_written_read_listed_and_removed_in_the_sandbox() {
    let s = serve(&[]);
    let id = s.create(json!({ "image": { "uri": "default" } }));
    let dirs = json!({ "/data": { "mode": 755 } }).to_string().into_bytes();
    let (status, out) = s.execd(&id, Method::POST, "directories", dirs, "application/json");
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    let boundary = "XyZ";
    let upload = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n{{\"path\":\"/data/notes.txt\"}}\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"notes.txt\"\r\n\r\nfirst line\n\r\n--{boundary}--\r\n"
    );
    let (status, out) = s.execd(
        &id,
        Method::POST,
        "files/upload",
        upload.into_bytes(),
        &format!("multipart/form-data; boundary={boundary}"),
    );
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    assert_eq!(std::fs::read_to_string(s.rootfs(&id).join("data/notes.txt")).unwrap(), "first line\n");
    let (status, bytes) = s.execd(&id, Method::GET, "files/download?path=/data/notes.txt", Vec::new(), "");
    assert_eq!((status, bytes.as_slice()), (StatusCode::OK, b"first line\n".as_slice()));
    let (_, info) = s.execd(&id, Method::GET, "files/info?path=/etc/hostname", Vec::new(), "");
    let info: Value = serde_json::from_slice(&info).unwrap();
    assert_eq!(info["/etc/hostname"]["size"], 4, "{info}");
    let (_, listing) = s.execd(&id, Method::GET, "directories/list?path=/data", Vec::new(), "");
    assert!(String::from_utf8_lossy(&listing).contains("notes.txt"), "{}", String::from_utf8_lossy(&listing));
    let (status, _) = s.execd(&id, Method::DELETE, "files?path=/data/notes.txt", Vec::new(), "");
    assert_eq!(status, StatusCode::OK);
    assert!(!s.rootfs(&id).join("data/notes.txt").exists());
}

#[test]
fn pause_suspends_the_vm_and_resume_runs_a_new_generation() {
    let s = serve(&[("echo again", GuestRun::exits(0, "again\n"))]);
    let id = s.create(json!({ "image": { "uri": "default" } }));
    let job = s.job(&id);
    let (status, _) = s.json(Method::POST, &format!("/v1/sandboxes/{id}/pause"), Value::Null);
    assert_eq!(status, StatusCode::ACCEPTED);
    s.await_state(&id, "Paused");
    assert_eq!(s.job_state(&job), JobState::Suspended, "a pause is an execution suspend");
    let (status, _) = s.execd(
        &id,
        Method::POST,
        "command",
        json!({"command": "true"}).to_string().into_bytes(),
        "application/json",
    );
    assert_eq!(status, StatusCode::CONFLICT, "no commands while paused");
    let (status, _) = s.json(Method::POST, &format!("/v1/sandboxes/{id}/resume"), Value::Null);
    assert_eq!(status, StatusCode::ACCEPTED);
    let got = s.await_state(&id, "Running");
    assert_eq!(got["status"]["reason"], "resumed");
    let record = s.daemon.get(&id).unwrap();
    assert_eq!(record.generations.iter().map(|g| g.attempt).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(record.job.as_ref(), Some(&job), "the same Job continues");
    assert_eq!(stdout_of(&s.command(&id, "echo again")), "again");
}

/// An entrypoint that exits while the sandbox is pausing is recorded then
/// and ends nothing (only a Running sandbox ends with it); the resume ends
/// the sandbox with that exit, rather than leave it Running without its
/// main process.
#[test]
fn an_entrypoint_that_exited_during_a_pause_ends_the_sandbox_on_resume() {
    let s = serve(&[]);
    let id = s.create(json!({ "image": { "uri": "default" } }));
    // The entrypoint starts once the sandbox is Running; pause after it has
    // been recorded (pausing first, on a loaded host, left none to end).
    s.await_state(&id, "Running");
    let recorded = Instant::now();
    while !s.daemon.get(&id).unwrap().commands.contains_key("entrypoint") {
        assert!(recorded.elapsed() < Duration::from_secs(30), "the entrypoint was never recorded");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, _) = s.json(Method::POST, &format!("/v1/sandboxes/{id}/pause"), Value::Null);
    assert_eq!(status, StatusCode::ACCEPTED);
    s.await_state(&id, "Paused");
    s.daemon
        .update(&id, |r| {
            let entrypoint = r.commands.get_mut("entrypoint").expect("the entrypoint's record");
            entrypoint.finished_at = Some(pvisor_core::time::Timestamp::now());
            entrypoint.exit_code = Some(4);
            Ok(())
        })
        .unwrap();
    let (status, _) = s.json(Method::POST, &format!("/v1/sandboxes/{id}/resume"), Value::Null);
    assert_eq!(status, StatusCode::ACCEPTED);
    let got = s.await_state(&id, "Failed");
    assert_eq!(got["status"]["reason"], "CONTAINER_EXITED_ERROR", "{got}");
    assert_eq!(got["status"]["message"], "Sandbox container exited with code 4.");
}

/// The exec id of the sandbox's entrypoint, once it is recorded.
fn entrypoint_exec(s: &Serve, id: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(c) = s.daemon.get(id).unwrap().commands.get("entrypoint") {
            return c.exec_id;
        }
        assert!(Instant::now() < deadline, "the entrypoint was never recorded");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A pause that lands between Running and the entrypoint's start (the
/// provisioner then finds no live guest to start it in) leaves no
/// entrypoint; the resume starts it, and watches it: its exit ends the
/// sandbox. (On a restarted daemon, so no older watcher stands in.)
#[test]
fn a_sandbox_paused_before_its_entrypoint_started_starts_it_on_resume() {
    let s = serve(&[]);
    let id = s.create(json!({ "image": { "uri": "default" } }));
    let first = entrypoint_exec(&s, &id);
    s.pause_or_resume(&id, "pause", "Paused");
    let s = s.restarted();
    s.await_state(&id, "Paused");
    // What that race leaves: no entrypoint record.
    s.daemon.update(&id, |r| Ok(r.commands.remove("entrypoint"))).unwrap();
    let starts = || {
        let started = s.guest.started.lock().unwrap();
        started.iter().filter(|spec| spec.argv.join(" ").contains("tail -f /dev/null")).count()
    };
    let before = starts();
    s.pause_or_resume(&id, "resume", "Running");
    let second = entrypoint_exec(&s, &id);
    assert_ne!(second, first, "a new exec");
    assert_eq!(starts(), before + 1, "the resume started the entrypoint once");
    let got = s.kill_exec(&id, second, libc::SIGKILL);
    assert_eq!(got["status"]["message"], "Sandbox container exited with code 137.", "{got}");
}

/// A daemon restarted while a sandbox was paused watches its entrypoint
/// again once it is resumed: the entrypoint's exit ends the sandbox.
#[test]
fn a_sandbox_resumed_after_a_restart_still_ends_with_its_entrypoint() {
    let s = serve(&[]);
    let id = s.create(json!({ "image": { "uri": "default" } }));
    let exec_id = entrypoint_exec(&s, &id);
    s.pause_or_resume(&id, "pause", "Paused");
    let s = s.restarted();
    s.await_state(&id, "Paused");
    s.pause_or_resume(&id, "resume", "Running");
    let got = s.kill_exec(&id, exec_id, libc::SIGTERM);
    assert_eq!(got["status"]["message"], "Sandbox container exited with code 143.", "{got}");
}

#[test]
fn delete_terminates_the_sandbox_and_ends_its_job() {
    let s = serve(&[]);
    let id = s.create(json!({ "image": { "uri": "default" } }));
    let job = s.job(&id);
    let (status, _) = s.json(Method::DELETE, &format!("/v1/sandboxes/{id}"), Value::Null);
    assert_eq!(status, StatusCode::NO_CONTENT);
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.daemon.get(&id).unwrap().state != SandboxState::Terminated {
        assert!(Instant::now() < deadline, "{:?}", s.daemon.get(&id).unwrap().state);
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(s.job_state(&job).is_terminal(), "{}", s.job_state(&job));
    let (status, _) = s.json(Method::GET, &format!("/v1/sandboxes/{id}"), Value::Null);
    assert_eq!(status, StatusCode::NOT_FOUND, "a deleted sandbox is gone");
    let (status, _) = s.json(Method::DELETE, &format!("/v1/sandboxes/{id}"), Value::Null);
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[test]
fn renew_moves_the_expiry_and_refuses_the_past() {
    let s = serve(&[]);
    let id = s.create(json!({ "image": { "uri": "default" }, "timeout": 600 }));
    let later = pvisor_core::time::Timestamp::from(std::time::SystemTime::now() + Duration::from_secs(1800));
    let (status, body) = s.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/renew-expiration"),
        json!({ "expiresAt": later.to_string() }),
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(s.state(&id)["expiresAt"], body["expiresAt"]);
    let past = pvisor_core::time::Timestamp::from(std::time::SystemTime::now() - Duration::from_secs(10));
    let (status, _) = s.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/renew-expiration"),
        json!({ "expiresAt": past.to_string() }),
    );
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[test]
fn a_restarted_daemon_reattaches_a_running_sandbox_and_keeps_a_paused_one_paused() {
    let s = serve(&[("echo still", GuestRun::exits(0, "still here\n"))]);
    let running = s.create(json!({ "image": { "uri": "default" } }));
    let paused = s.create(json!({ "image": { "uri": "default" } }));
    s.pause_or_resume(&paused, "pause", "Paused");
    let s = s.restarted();
    let got = s.await_state(&running, "Running");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = got;
    while got["status"]["reason"] != "reattached" {
        assert!(Instant::now() < deadline, "{got}");
        std::thread::sleep(Duration::from_millis(10));
        got = s.state(&running);
    }
    assert_eq!(stdout_of(&s.command(&running, "echo still")), "still here");
    assert_eq!(s.state(&paused)["status"]["state"], "Paused");
    s.pause_or_resume(&paused, "resume", "Running");
}

#[test]
fn a_restarted_daemon_fails_a_sandbox_whose_vm_ended_while_it_was_away() {
    let s = serve(&[]);
    let id = s.create(json!({ "image": { "uri": "default" } }));
    let job = s.job(&id);
    // The VM ends while no daemon watches (the old one is forgotten).
    let s = s.reopened();
    s.runtime.execute(Kill { job: job.clone(), grace: Duration::from_millis(100) }).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !s.job_state(&job).is_terminal() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    s.daemon.recover();
    let got = s.await_state(&id, "Failed");
    assert_eq!(got["status"]["reason"], "runtime_exited", "{got}");
}

/// A daemon that died while ending a sandbox for its entrypoint's exit
/// leaves it Stopping; the next one ends it as that exit, not as a delete.
#[test]
fn a_restarted_daemon_ends_a_stopping_sandbox_as_its_entrypoint_did() {
    let s = serve(&[]);
    let id = s.create(json!({ "image": { "uri": "default" } }));
    entrypoint_exec(&s, &id);
    let s = s.reopened();
    // What the dead daemon had recorded when it died: the exit, and Stopping.
    s.daemon
        .update(&id, |r| {
            let entrypoint = r.commands.get_mut("entrypoint").unwrap();
            entrypoint.finished_at = Some(pvisor_core::time::Timestamp::now());
            entrypoint.exit_code = Some(3);
            crate::sandbox::set_state(r, SandboxState::Stopping, "entrypoint_exited", "").unwrap();
            Ok(())
        })
        .unwrap();
    s.daemon.recover();
    let got = s.await_state(&id, "Failed");
    assert_eq!(got["status"]["reason"], "CONTAINER_EXITED_ERROR", "{got}");
    assert_eq!(got["status"]["message"], "Sandbox container exited with code 3.", "{got}");
}

#[test]
fn a_vm_that_ends_on_its_own_fails_the_sandbox() {
    let s = serve(&[]);
    let id = s.create(json!({ "image": { "uri": "default" } }));
    let job = s.job(&id);
    s.runtime.execute(Kill { job, grace: Duration::from_millis(100) }).unwrap();
    let got = s.await_state(&id, "Failed");
    assert_eq!(got["status"]["reason"], "runtime_exited", "{got}");
}
