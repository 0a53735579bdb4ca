//! Execd bash sessions (`/session`): one long-lived `bash` per session in
//! the sandbox, chrooted like commands, whose state (cwd, variables,
//! functions) carries from one run to the next.
//!
//! Each run writes `cd CWD && eval 'COMMAND'` to the shell's stdin, then two
//! markers with a per-run nonce (the exit status on stdout, a bare marker on
//! stderr); output up to the markers is the run's. `eval` keeps a syntax
//! error from leaving the shell waiting for more input. A session lives in
//! the daemon's memory with its relay: a pause, a daemon restart or `exit`
//! in a run ends it, and later runs get 404.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pvisor_agent::Reply;
use pvisor_sandbox::vm::guest;

use crate::http::ApiError;
use crate::multipart::find;
use crate::sandbox::{command_env, SandboxRecord};

/// What the shell produced, as the reader thread saw it.
enum Out {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Ended(String),
}

/// One bash process in one sandbox.
pub struct BashSession {
    input: Mutex<guest::ExecSignaller>,
    output: Mutex<Receiver<Out>>,
    busy: Arc<AtomicBool>,
    ended: Arc<AtomicBool>,
}

impl std::fmt::Debug for BashSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BashSession").field("busy", &self.busy).field("ended", &self.ended).finish()
    }
}

/// Sessions by (sandbox id, session id).
pub type Sessions = Mutex<HashMap<(String, String), Arc<BashSession>>>;

/// One piece of a run's result, streamed as an SSE event.
#[derive(Debug)]
pub enum Piece {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exit(i32),
    Failed(String),
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl BashSession {
    /// Starts bash (sh when the image has none) in the sandbox.
    pub fn start(
        vm_dir: &std::path::Path,
        record: &SandboxRecord,
        exec_id: u32,
        cwd: Option<&str>,
    ) -> Result<Self, ApiError> {
        let shell = if record.rootfs.join("bin/bash").exists() { "/bin/bash" } else { "/bin/sh" };
        let mut argv = vec![shell.to_owned()];
        if shell.ends_with("bash") {
            argv.extend(["--norc".to_owned(), "--noprofile".to_owned()]);
        }
        let spec = guest::ExecSpec {
            id: exec_id,
            argv,
            env: command_env(record, &Default::default()),
            cwd: PathBuf::from(cwd.unwrap_or("/")),
            root: Some(record.rootfs.clone()),
            output: None,
        };
        let mut channel = guest::exec(vm_dir, spec).map_err(ApiError::internal)?;
        match channel.next_reply() {
            Ok(Some((Reply::Started { .. }, _))) => {}
            Ok(Some((Reply::ExecFailed { message, .. }, _))) => {
                return Err(ApiError::bad_request(format!("cannot start {shell}: {message}")))
            }
            other => return Err(ApiError::internal(format!("the guest answered {other:?}"))),
        }
        let input = channel.signaller().map_err(|e| ApiError::internal(e.to_string()))?;
        // Bounded, and output between runs (a background job's) is dropped:
        // a chatty session cannot grow the daemon; a slow client of a run
        // holds the shell back (and is cut off by the relay's stall limit).
        let (tx, rx) = mpsc::sync_channel(256);
        let ended = Arc::new(AtomicBool::new(false));
        let busy = Arc::new(AtomicBool::new(false));
        let (flag, running) = (ended.clone(), busy.clone());
        std::thread::Builder::new()
            .name("pvisor-bash-session".into())
            .spawn(move || {
                let why = loop {
                    match channel.next_reply() {
                        Ok(Some((Reply::Stdout { .. }, bytes))) if running.load(Ordering::SeqCst) => {
                            let _ = tx.send(Out::Stdout(bytes));
                        }
                        Ok(Some((Reply::Stderr { .. }, bytes))) if running.load(Ordering::SeqCst) => {
                            let _ = tx.send(Out::Stderr(bytes));
                        }
                        Ok(Some((Reply::Exited { code, signal, .. }, _))) => {
                            break format!("the session's shell exited (status {code:?}, signal {signal:?})")
                        }
                        Ok(Some(_)) => {}
                        Ok(None) | Err(_) => {
                            break "the session ended: the sandbox was paused or the daemon restarted".into()
                        }
                    }
                };
                flag.store(true, Ordering::SeqCst);
                let _ = tx.send(Out::Ended(why));
            })
            .map_err(|e| ApiError::internal(e.to_string()))?;
        Ok(Self { input: Mutex::new(input), output: Mutex::new(rx), busy, ended })
    }

    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// Runs `command`, handing each piece of output to `emit` as it comes.
    pub fn run(
        &self,
        command: &str,
        cwd: Option<&str>,
        timeout: Option<Duration>,
        mut emit: impl FnMut(Piece) -> bool,
    ) {
        if self.busy.swap(true, Ordering::SeqCst) {
            emit(Piece::Failed("another run is in progress in this session".into()));
            return;
        }
        let output = self.output.lock().unwrap_or_else(|p| p.into_inner());
        // Whatever background jobs printed between runs is not this run's.
        while let Ok(stale) = output.try_recv() {
            if let Out::Ended(why) = stale {
                emit(Piece::Failed(why));
                self.busy.store(false, Ordering::SeqCst);
                return;
            }
        }
        let nonce = crate::http::uuid4().replace('-', "");
        let (out_marker, err_marker) = (format!("\x1e{nonce}:"), format!("\x1e{nonce}\x1e\n"));
        let mut script = String::new();
        if let Some(cwd) = cwd {
            script.push_str(&format!("cd -- {} && ", shell_quote(cwd)));
        }
        script.push_str(&format!(
            "eval {}\nprintf '\\n\\036%s:%d\\036\\n' {nonce} $?; printf '\\036%s\\036\\n' {nonce} >&2\n",
            shell_quote(command)
        ));
        if self.input.lock().unwrap_or_else(|p| p.into_inner()).stdin(script.as_bytes()).is_err() {
            emit(Piece::Failed("the session's shell is gone".into()));
            self.busy.store(false, Ordering::SeqCst);
            return;
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let (mut status, mut err_done) = (None, false);
        while status.is_none() || !err_done {
            let wait =
                deadline.map_or(Duration::from_secs(3600), |d| d.saturating_duration_since(Instant::now()));
            match output.recv_timeout(wait) {
                Ok(Out::Stdout(bytes)) if status.is_none() => {
                    out.extend_from_slice(&bytes);
                    if let Some(pos) = find(&out, out_marker.as_bytes(), 0) {
                        let rest = &out[pos + out_marker.len()..];
                        if let Some(end) = rest.iter().position(|b| *b == 0x1e) {
                            status = std::str::from_utf8(&rest[..end])
                                .ok()
                                .and_then(|s| s.parse().ok())
                                .or(Some(-1));
                            // The marker's own leading newline is not output.
                            let mut body = out[..pos].to_vec();
                            if body.last() == Some(&b'\n') {
                                body.pop();
                            }
                            if !body.is_empty() && !emit(Piece::Stdout(body)) {
                                break;
                            }
                            out.clear();
                        }
                    } else if let Some(k) =
                        out[..out.len().saturating_sub(1)].iter().rposition(|b| *b == b'\n')
                    {
                        // Whole lines go out now; a final newline waits, as
                        // it may be the one the marker starts with.
                        let lines: Vec<u8> = out.drain(..=k).collect();
                        if !emit(Piece::Stdout(lines)) {
                            break;
                        }
                    }
                }
                Ok(Out::Stderr(bytes)) if !err_done => {
                    err.extend_from_slice(&bytes);
                    if let Some(pos) = find(&err, err_marker.as_bytes(), 0) {
                        err_done = true;
                        let body = err[..pos].to_vec();
                        if !body.is_empty() && !emit(Piece::Stderr(body)) {
                            break;
                        }
                        err.clear();
                    }
                }
                Ok(Out::Ended(why)) => {
                    for (piece, bytes) in [(true, &out), (false, &err)] {
                        if !bytes.is_empty() {
                            emit(if piece {
                                Piece::Stdout(bytes.clone())
                            } else {
                                Piece::Stderr(bytes.clone())
                            });
                        }
                    }
                    emit(Piece::Failed(why));
                    self.busy.store(false, Ordering::SeqCst);
                    return;
                }
                Ok(_) => {}
                Err(_) => {
                    // Timed out: interrupt the foreground job; the shell survives.
                    let _ = self.input.lock().unwrap_or_else(|p| p.into_inner()).signal(libc::SIGINT);
                    emit(Piece::Failed(format!(
                        "the run exceeded its timeout of {} ms",
                        timeout.unwrap_or_default().as_millis()
                    )));
                    self.busy.store(false, Ordering::SeqCst);
                    return;
                }
            }
        }
        if let Some(code) = status {
            emit(Piece::Exit(code));
        }
        self.busy.store(false, Ordering::SeqCst);
    }

    pub fn kill(&self) {
        let _ = self.input.lock().unwrap_or_else(|p| p.into_inner()).signal(libc::SIGKILL);
    }
}
