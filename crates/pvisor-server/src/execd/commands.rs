//! Execd commands: `POST /command` (foreground, streamed as SSE, or in the
//! background with its output logged in the guest), its interrupt, status
//! and logs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use hyper::{Response, StatusCode};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc::Sender;

use pvisor_core::time::Timestamp;

use super::events::{error_event, event, output_events, sse};
use super::files::stream_range;
use super::{blocking, guest_error, guest_link, in_image, FileOp, Guest, Reply};
use crate::guest_link::ExecChannel;
use crate::http::{self, json, ApiError, ApiResult};
use crate::lines::Lines;
use crate::sandbox::{command_env, CommandRecord, Daemon, SharedSignaller, StreamSlot, GUEST_LOG_DIR};

/// Largest command plus environment (an AgentCtl header is at most 1 MiB).
const MAX_COMMAND_BYTES: usize = 256 << 10;
/// Largest background log `GET /command/{id}/logs` reads.
const MAX_LOG_BYTES: u64 = 256 << 20;

/// The execd request schemas allow unknown fields (no `additionalProperties:
/// false`), so these structs accept them; SDKs send newer ones (`argv`).
#[derive(Debug, Deserialize)]
pub(super) struct RunCommand {
    command: Option<String>,
    argv: Option<Vec<String>>,
    cwd: Option<String>,
    #[serde(default)]
    background: bool,
    /// Milliseconds.
    timeout: Option<u64>,
    uid: Option<u32>,
    gid: Option<u32>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
}

/// A command started in the guest: its ids, its reply channel, and, when the
/// guest could not start it, the exit code and message to report.
struct Started {
    exec_id: u32,
    command_id: String,
    channel: ExecChannel,
    started_at: Timestamp,
    failed: Option<(i32, String)>,
}

/// `POST /command`: checks the request, starts the exec in the guest, records
/// it, and answers with its SSE stream (a foreground command's output, live).
pub(super) async fn run_command(daemon: Arc<Daemon>, guest: Guest, request: RunCommand) -> ApiResult {
    let id = guest.record.id.clone();
    let argv = command_argv(&guest, &request)?;
    let slot = if request.background { None } else { Some(daemon.stream_slot(&id)?) };
    let argv = as_user(&guest, &request, argv)?;
    let text = request.command.clone().unwrap_or_else(|| argv.join(" "));
    let started = start_exec(&daemon, &guest, &request, argv).await?;
    record_start(&daemon, &id, &started, text.clone(), request.background);
    let note = pvisor::FrontendNote {
        command: text,
        uid: request.uid,
        background: request.background,
        exit_code: started.failed.as_ref().map(|f| f.0),
        error: started.failed.as_ref().map(|f| f.1.clone()),
        duration_ms: 0,
    };
    if request.background || started.failed.is_some() {
        note_in_trace(&daemon, &id, note.clone());
    }
    let (tx, body) = http::channel_body(64);
    let _ = tx.send(event(json!({ "type": "init", "text": started.command_id }))).await;
    if let Some((code, message)) = started.failed {
        let _ = tx.send(error_event(code, &message)).await;
        return Ok(sse(body));
    }
    if request.background {
        if let Some(timeout) = request.timeout.map(Duration::from_millis) {
            end_background_after(&daemon, id, started.exec_id, timeout);
        }
        let _ = tx.send(event(json!({ "type": "execution_complete", "execution_time": 0 }))).await;
        return Ok(sse(body));
    }
    stream_foreground(daemon, guest.link, id, started, (request.timeout, note), tx, slot);
    Ok(sse(body))
}

/// The argv the request names (its `argv`, or its `command` through the
/// image's shell), refused when incomplete or over [`MAX_COMMAND_BYTES`].
fn command_argv(guest: &Guest, request: &RunCommand) -> Result<Vec<String>, ApiError> {
    let argv = match (&request.command, &request.argv) {
        (_, Some(argv)) if !argv.is_empty() => argv.clone(),
        (Some(cmd), _) if !cmd.is_empty() => {
            let shell = if in_image(&guest.record.rootfs, "bin/bash") { "/bin/bash" } else { "/bin/sh" };
            vec![shell.into(), "-c".into(), cmd.clone()]
        }
        _ => return Err(ApiError::bad_request("command (or argv) is required")),
    };
    if request.gid.is_some() && request.uid.is_none() {
        return Err(ApiError::bad_request("gid requires uid"));
    }
    let size: usize = argv.iter().map(String::len).sum::<usize>()
        + request.envs.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    if size > MAX_COMMAND_BYTES {
        return Err(ApiError::bad_request(format!(
            "the command and its environment are {size} bytes; the limit is {MAX_COMMAND_BYTES} (write a script with the file API and run that)"
        )));
    }
    Ok(argv)
}

/// `argv` run as the request's uid/gid (through the image's setpriv), or as is.
fn as_user(guest: &Guest, request: &RunCommand, argv: Vec<String>) -> Result<Vec<String>, ApiError> {
    let Some(uid) = request.uid else { return Ok(argv) };
    // setpriv is not in every image; busybox-free: run through the agent's root, then drop.
    let gid = request.gid.unwrap_or(uid);
    let mut v = vec![
        "/usr/bin/setpriv".into(),
        format!("--reuid={uid}"),
        format!("--regid={gid}"),
        "--clear-groups".into(),
        "--".into(),
    ];
    if !in_image(&guest.record.rootfs, "usr/bin/setpriv") {
        return Err(ApiError::bad_request("uid/gid need setpriv (util-linux) in the image"));
    }
    v.extend(argv);
    Ok(v)
}

/// Starts `argv` in the guest and reads its first reply: started, or failed to start.
async fn start_exec(
    daemon: &Arc<Daemon>,
    guest: &Guest,
    request: &RunCommand,
    argv: Vec<String>,
) -> Result<Started, ApiError> {
    let id = &guest.record.id;
    let exec_id = {
        let (daemon, id) = (daemon.clone(), id.clone());
        blocking(move || Ok(daemon.next_exec_id(&id)?)).await?
    };
    let spec = guest_link::ExecSpec {
        id: exec_id,
        argv,
        env: command_env(&guest.record, &request.envs),
        cwd: request.cwd.clone().unwrap_or_else(|| "/".into()).into(),
        root: Some(guest.record.rootfs.clone()),
        output: request.background.then(|| PathBuf::from(format!("{GUEST_LOG_DIR}/{exec_id}.log"))),
        terminal: None,
        confinement: None,
    };
    let link = guest.link.clone();
    let (channel, first) = blocking(move || {
        let mut channel = guest_link::exec(&link, spec).map_err(|e| ApiError::internal(e.0))?;
        let first = channel.next_reply().map_err(|e| ApiError::internal(e.to_string()))?;
        Ok((channel, first))
    })
    .await?;
    let started_at = Timestamp::now();
    let failed = match &first {
        Some((Reply::Started { .. }, _)) => None,
        Some((Reply::ExecFailed { errno, message, .. }, _)) => {
            Some((if *errno == libc::ENOENT { 127 } else { 126 }, message.clone()))
        }
        other => return Err(ApiError::internal(format!("the guest answered {other:?}"))),
    };
    Ok(Started { exec_id, command_id: format!("cmd-{exec_id}"), channel, started_at, failed })
}

/// Records the started command in the sandbox's record (finished already if it failed to start).
fn record_start(daemon: &Daemon, id: &str, started: &Started, text: String, background: bool) {
    let failed = &started.failed;
    let _ = daemon.update(id, |r| {
        crate::sandbox::trim_commands(&mut r.commands);
        r.commands.insert(
            started.command_id.clone(),
            CommandRecord {
                exec_id: started.exec_id,
                command: text.clone(),
                background,
                started_at: started.started_at,
                finished_at: failed.as_ref().map(|_| Timestamp::now()),
                exit_code: failed.as_ref().map(|f| f.0),
                error: failed.as_ref().map(|f| f.1.clone()),
            },
        );
        Ok(())
    });
}

/// The spec's background timeout: the server ends the process after `timeout`.
fn end_background_after(daemon: &Arc<Daemon>, sandbox: String, exec_id: u32, timeout: Duration) {
    // The VM at fire time: the sandbox may have been paused and resumed (a
    // new generation) meanwhile.
    let daemon = daemon.clone();
    std::thread::spawn(move || {
        std::thread::sleep(timeout);
        for signal in [libc::SIGTERM, libc::SIGKILL] {
            if let Ok((_, link)) = daemon.live_link(&sandbox) {
                let _ = guest_link::signal(&link, exec_id, signal);
            }
            std::thread::sleep(Duration::from_secs(2));
        }
    });
}

/// Streams a foreground command's output as SSE events until it exits, then
/// sends its final event and records its exit; the stream slot is held till then.
fn stream_foreground(
    daemon: Arc<Daemon>,
    kill_link: guest_link::Link,
    id: String,
    started: Started,
    (timeout_ms, mut note): (Option<u64>, pvisor::FrontendNote),
    tx: Sender<Bytes>,
    slot: Option<StreamSlot>,
) {
    let Started { exec_id, command_id, mut channel, .. } = started;
    let signaller = Arc::new(Mutex::new(channel.signaller().ok()));
    daemon
        .running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert((id.clone(), command_id.clone()), signaller.clone());
    let (cancel, timed_out) = kill_on_cancel(&tx, &signaller, timeout_ms.map(Duration::from_millis));
    let started = Instant::now();
    tokio::task::spawn_blocking(move || {
        let outcome = relay_output(&mut channel, &tx, &kill_link, exec_id);
        let elapsed = started.elapsed().as_millis() as u64;
        let (exit_code, error) = match &outcome {
            Ok(code) => (Some(*code), None),
            Err(message) => (None, Some(message.clone())),
        };
        let _slot = slot;
        let timed_out = timed_out.load(Ordering::SeqCst);
        let _ = tx.blocking_send(final_event(outcome, elapsed, timed_out, timeout_ms));
        cancel.abort();
        daemon.running.lock().unwrap_or_else(|p| p.into_inner()).remove(&(id.clone(), command_id.clone()));
        (note.exit_code, note.error, note.duration_ms) = (exit_code, error.clone(), elapsed);
        let _ = daemon.update(&id, |r| {
            if let Some(c) = r.commands.get_mut(&command_id) {
                c.finished_at = Some(Timestamp::now());
                c.exit_code = exit_code;
                c.error = error;
            }
            Ok(())
        });
        note_in_trace(&daemon, &id, note);
    });
}

/// Has the sandbox Job's Trace record a command (`frontend.command`), on a
/// thread of its own: a response never waits for the record.
pub(crate) fn note_in_trace(daemon: &Arc<Daemon>, id: &str, note: pvisor::FrontendNote) {
    let Some(job) = daemon.get(id).ok().and_then(|r| r.job) else { return };
    let (runtime, id) = (daemon.runtime.clone(), id.to_owned());
    let noted = std::thread::Builder::new().name("trace-note".into()).spawn(move || {
        if let Err(e) = runtime.execute(pvisor::actions::NoteInTrace { job, note }) {
            tracing::warn!(sandbox = %id, "a command is missing from the Trace: {e}");
        }
    });
    if let Err(e) = noted {
        tracing::warn!("a command is missing from the Trace: no thread to record it: {e}");
    }
}

/// Cancellation: a client that goes away (or a timeout) kills the command;
/// the flag says whether it was the timeout.
fn kill_on_cancel(
    tx: &Sender<Bytes>,
    signaller: &SharedSignaller,
    timeout: Option<Duration>,
) -> (tokio::task::JoinHandle<()>, Arc<AtomicBool>) {
    let timed_out = Arc::new(AtomicBool::new(false));
    let (tx, signaller, flag) = (tx.clone(), signaller.clone(), timed_out.clone());
    let cancel = tokio::spawn(async move {
        if let Some(t) = timeout {
            if tokio::time::timeout(t, tx.closed()).await.is_err() {
                flag.store(true, Ordering::SeqCst);
            }
        } else {
            tx.closed().await;
        }
        kill_exec(&signaller);
    });
    (cancel, timed_out)
}

/// Relays the command's stdout and stderr as line events until it exits (its
/// exit code) or its stream ends early (why).
fn relay_output(
    channel: &mut ExecChannel,
    tx: &Sender<Bytes>,
    kill_link: &guest_link::Link,
    exec_id: u32,
) -> Result<i32, String> {
    let (mut out_lines, mut err_lines) = (Lines::default(), Lines::default());
    let send = |kind: &str, texts: Vec<Vec<u8>>| {
        for e in output_events(kind, texts) {
            let _ = tx.blocking_send(e);
        }
    };
    let outcome = loop {
        match channel.next_reply() {
            Ok(Some((Reply::Stdout { .. }, bytes))) => send("stdout", out_lines.push(&bytes)),
            Ok(Some((Reply::Stderr { .. }, bytes))) => send("stderr", err_lines.push(&bytes)),
            Ok(Some((Reply::Exited { code, signal, .. }, _))) => {
                break Ok(code.unwrap_or(128 + signal.unwrap_or(0)))
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                // Its output has no reader any more (the sandbox stopped,
                // or this stream stalled and was cut off): end it.
                let _ = guest_link::signal(kill_link, exec_id, libc::SIGKILL);
                break Err("the command's stream ended early (the sandbox was paused or stopped, or the client stalled for 30 s)".to_string());
            }
        }
    };
    send("stdout", out_lines.finish().into_iter().collect());
    send("stderr", err_lines.finish().into_iter().collect());
    outcome
}

/// The event that ends a foreground command's stream.
fn final_event(
    outcome: Result<i32, String>,
    elapsed: u64,
    timed_out: bool,
    timeout_ms: Option<u64>,
) -> Bytes {
    match outcome {
        Ok(0) => event(json!({ "type": "execution_complete", "execution_time": elapsed })),
        Ok(code) if timed_out => error_event(
            code,
            &format!(
                "the command exceeded its timeout of {} ms and was killed (exit status {code})",
                timeout_ms.unwrap_or(0)
            ),
        ),
        Ok(code) => error_event(code, &format!("exit status {code}")),
        Err(message) => event(
            json!({ "type": "error", "error": { "ename": "SandboxError", "evalue": "-1", "traceback": [message] } }),
        ),
    }
}

/// SIGTERM, then SIGKILL after two seconds.
pub(super) fn kill_exec(signaller: &SharedSignaller) {
    if let Some(s) = signaller.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        let _ = s.signal(libc::SIGTERM);
    }
    let signaller = signaller.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        if let Some(s) = signaller.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            let _ = s.signal(libc::SIGKILL);
        }
    });
}

pub(super) fn command_of(guest: &Guest, cmd: &str) -> Result<CommandRecord, ApiError> {
    guest
        .record
        .commands
        .get(cmd)
        .cloned()
        .ok_or_else(|| ApiError::not_found(format!("no command {cmd} in sandbox {}", guest.record.id)))
}

pub(super) async fn interrupt(daemon: &Arc<Daemon>, guest: Guest, cmd: &str) -> ApiResult {
    let record = command_of(&guest, cmd)?;
    let key = (guest.record.id.clone(), cmd.to_owned());
    if let Some(signaller) = daemon.running.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned() {
        kill_exec(&signaller);
        return Ok(http::empty(StatusCode::OK));
    }
    blocking(move || {
        for signal in [libc::SIGTERM, libc::SIGKILL] {
            guest_link::signal(&guest.link, record.exec_id, signal).map_err(guest_error)?;
            std::thread::sleep(Duration::from_millis(if signal == libc::SIGTERM { 500 } else { 0 }));
        }
        Ok(http::empty(StatusCode::OK))
    })
    .await
}

pub(super) async fn command_status(guest: Guest, cmd: &str) -> ApiResult {
    let record = command_of(&guest, cmd)?;
    let cmd = cmd.to_owned();
    blocking(move || {
        let (running, exit_code) = if record.finished_at.is_some() {
            (false, record.exit_code)
        } else {
            match guest_link::status(&guest.link, record.exec_id) {
                Ok(Reply::Status { running, code, signal, .. }) => {
                    (running, code.or(signal.map(|s| 128 + s)))
                }
                Ok(other) => return Err(ApiError::internal(format!("unexpected agent answer {other:?}"))),
                Err(e) => return Err(guest_error(e)),
            }
        };
        let mut body = json!({
            "id": cmd,
            "content": record.command,
            "running": running,
            "exit_code": exit_code,
            "started_at": record.started_at.to_string(),
            "finished_at": record.finished_at.map(|t| t.to_string()),
        });
        if let Some(error) = record.error {
            body["error"] = json!(error);
        }
        Ok(json(StatusCode::OK, &body))
    })
    .await
}

pub(super) async fn command_logs(
    daemon: &Arc<Daemon>,
    guest: Guest,
    cmd: &str,
    cursor: Option<&str>,
) -> ApiResult {
    let record = command_of(&guest, cmd)?;
    if !record.background {
        return Err(ApiError::bad_request(format!(
            "{cmd} ran in the foreground; its output was streamed, not logged"
        )));
    }
    // A byte offset into the log, as the reference execd's is
    // (`GetBackgroundCommandOutput` → `SeekBackgroundCommandOutput`, which
    // seeks the log to `cursor`; the spec's "line cursor" is not what it
    // does): missing or not a number is 0, negative is refused.
    let cursor: i64 = cursor.and_then(|c| c.parse().ok()).unwrap_or(0);
    if cursor < 0 {
        return Err(ApiError::bad_request(format!("error seek file: cursor {cursor} is negative")));
    }
    let cursor = cursor as u64;
    let slot = daemon.stream_slot(&guest.record.id)?;
    let name = format!("{}.log", record.exec_id);
    // The log's length now fixes the response (and the next cursor); the
    // bytes then stream a page at a time, so a guest that wrote a huge log
    // costs the daemon one page per reader, not the log.
    let (guest, size) = blocking(move || {
        let op = FileOp::Stat { path: format!("/{name}").into() };
        let size = match guest_link::file_op(&guest.link, std::path::Path::new(GUEST_LOG_DIR), op) {
            Ok(Reply::Stat { stat }) => stat.size,
            Ok(other) => return Err(ApiError::internal(format!("unexpected agent answer {other:?}"))),
            Err(e) => match guest_error(e) {
                e if e.status == StatusCode::NOT_FOUND => 0,
                e => return Err(e),
            },
        };
        Ok((guest, size))
    })
    .await?;
    // The next cursor: where this read stops (the end of the log, or the
    // cursor itself when it is past the end).
    let end = size.min(cursor.saturating_add(MAX_LOG_BYTES)).max(cursor);
    let path = PathBuf::from(format!("{GUEST_LOG_DIR}/{}.log", record.exec_id));
    let body = stream_range(guest, path, cursor, end, slot);
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert("content-type", "text/plain; charset=utf-8".parse().expect("static"));
    h.insert("content-length", (end - cursor).to_string().parse().expect("ascii"));
    h.insert("EXECD-COMMANDS-TAIL-CURSOR", end.to_string().parse().expect("ascii"));
    Ok(resp)
}
