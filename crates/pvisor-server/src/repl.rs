//! Long-lived interpreters in a sandbox, driven over their stdin: execd bash
//! sessions (`/session`) and code contexts (`/code`, see
//! [`crate::code_contexts`]). One guest process per session or context,
//! chrooted like commands, whose state (cwd, variables, functions, Python
//! globals) carries from one run to the next.
//!
//! Each run writes one request to the interpreter's stdin, which ends it with
//! two markers carrying a per-run nonce: `\n\x1eNONCE:PAYLOAD\x1e\n` on
//! stdout (the payload is bash's exit status, or the Python driver's JSON
//! result) and `\x1eNONCE\x1e\n` on stderr; output up to the markers is the
//! run's. Bash runs `cd CWD && eval 'COMMAND'` (`eval` keeps a syntax error
//! from leaving the shell waiting for more input); Python runs
//! [`PYTHON_DRIVER`]. A session lives in the daemon's memory with its relay:
//! a pause, a daemon restart or `exit` in a run ends it, and later runs get
//! an error saying so.

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

/// Which interpreter a [`Repl`] runs, and so how a request is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Bash,
    Python,
}

/// The Python side of a code context: reads one JSON request per line
/// (`{"nonce", "code"}`) from a private copy of stdin (the cell's own stdin
/// is /dev/null, so `input()` cannot eat requests), runs the cell like a
/// notebook (statements, then the value of a final expression), and ends it
/// with the markers the module doc describes, the payload being
/// `{"count", "result", "error"}` as JSON (ASCII: no 0x1e inside).
/// SIGINT interrupts the cell (KeyboardInterrupt is its error) and never the
/// driver.
pub const PYTHON_DRIVER: &str = r#"
import ast, json, os, signal, sys, traceback
requests = os.fdopen(os.dup(0), "r", encoding="utf-8", errors="replace")
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
sys.stdin = open(0, "r", closefd=False)
cell_globals = {"__name__": "__main__", "__builtins__": __builtins__}
count = 0
while True:
    try:
        line = requests.readline()
        if not line:
            break
        request = json.loads(line)
    except KeyboardInterrupt:
        continue
    except ValueError:
        continue
    count += 1
    result, error = None, None
    try:
        tree = ast.parse(request["code"], "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<cell>", "exec"), cell_globals)
        if last is not None:
            value = eval(compile(last, "<cell>", "eval"), cell_globals)
            if value is not None:
                result = repr(value)
    except BaseException as e:
        lines = traceback.format_exception(type(e), e, e.__traceback__)
        error = {"ename": type(e).__name__, "evalue": str(e), "traceback": [l.rstrip("\n") for l in lines]}
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        payload = json.dumps({"count": count, "result": result, "error": error})
        os.write(1, ("\n\x1e%s:%s\x1e\n" % (request["nonce"], payload)).encode())
        os.write(2, ("\x1e%s\x1e\n" % request["nonce"]).encode())
        signal.signal(signal.SIGINT, signal.default_int_handler)
"#;

/// One interpreter process in one sandbox.
pub struct Repl {
    dialect: Dialect,
    input: Mutex<guest::ExecSignaller>,
    output: Mutex<Receiver<Out>>,
    busy: Arc<AtomicBool>,
    ended: Arc<AtomicBool>,
}

impl std::fmt::Debug for Repl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Repl")
            .field("dialect", &self.dialect)
            .field("busy", &self.busy)
            .field("ended", &self.ended)
            .finish()
    }
}

/// Bash sessions by (sandbox id, session id).
pub type Sessions = Mutex<HashMap<(String, String), Arc<Repl>>>;

/// One piece of a run's result, streamed as an SSE event.
#[derive(Debug)]
pub enum Piece {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// The run ended; the end marker's payload (bash: the exit status;
    /// Python: the driver's JSON result).
    Done(String),
    Failed(String),
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl Repl {
    /// Starts the interpreter in the sandbox: bash (sh when the image has
    /// none), or the image's python3 running [`PYTHON_DRIVER`].
    pub fn start(
        dialect: Dialect,
        vm_dir: &std::path::Path,
        record: &SandboxRecord,
        exec_id: u32,
        cwd: Option<&str>,
    ) -> Result<Self, ApiError> {
        let (shell, argv) = match dialect {
            Dialect::Bash => {
                let shell =
                    if crate::execd::in_image(&record.rootfs, "bin/bash") { "/bin/bash" } else { "/bin/sh" };
                let mut argv = vec![shell.to_owned()];
                if shell.ends_with("bash") {
                    argv.extend(["--norc".to_owned(), "--noprofile".to_owned()]);
                }
                (shell, argv)
            }
            Dialect::Python => {
                let python = ["usr/bin/python3", "usr/local/bin/python3", "bin/python3"]
                    .into_iter()
                    .find(|p| crate::execd::in_image(&record.rootfs, p))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "image {:?} has no python3; create the sandbox with the built-in image \"python\" (or one that has python3) for python contexts",
                            record.image
                        ))
                    })?;
                (
                    "python3",
                    vec![format!("/{python}"), "-u".to_owned(), "-c".to_owned(), PYTHON_DRIVER.to_owned()],
                )
            }
        };
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
                            break format!("the interpreter exited (status {code:?}, signal {signal:?})")
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
        Ok(Self { dialect, input: Mutex::new(input), output: Mutex::new(rx), busy, ended })
    }

    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// Runs `command` (a shell command, or a Python cell), handing each piece
    /// of output to `emit` as it comes.
    pub fn run(
        &self,
        command: &str,
        cwd: Option<&str>,
        timeout: Option<Duration>,
        mut emit: impl FnMut(Piece) -> bool,
    ) {
        if self.busy.swap(true, Ordering::SeqCst) {
            emit(Piece::Failed("another run is in progress in this session or context".into()));
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
        let script = match self.dialect {
            Dialect::Bash => {
                let mut script = String::new();
                if let Some(cwd) = cwd {
                    script.push_str(&format!("cd -- {} && ", shell_quote(cwd)));
                }
                script.push_str(&format!(
                    "eval {}\nprintf '\\n\\036%s:%d\\036\\n' {nonce} $?; printf '\\036%s\\036\\n' {nonce} >&2\n",
                    shell_quote(command)
                ));
                script
            }
            Dialect::Python => format!("{}\n", serde_json::json!({ "nonce": nonce, "code": command })),
        };
        if self.input.lock().unwrap_or_else(|p| p.into_inner()).stdin(script.as_bytes()).is_err() {
            emit(Piece::Failed("the interpreter is gone".into()));
            self.busy.store(false, Ordering::SeqCst);
            return;
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let (mut status, mut err_done): (Option<String>, bool) = (None, false);
        while status.is_none() || !err_done {
            let wait =
                deadline.map_or(Duration::from_secs(3600), |d| d.saturating_duration_since(Instant::now()));
            match output.recv_timeout(wait) {
                Ok(Out::Stdout(bytes)) if status.is_none() => {
                    out.extend_from_slice(&bytes);
                    if let Some(pos) = find(&out, out_marker.as_bytes(), 0) {
                        let rest = &out[pos + out_marker.len()..];
                        if let Some(end) = rest.iter().position(|b| *b == 0x1e) {
                            status = Some(String::from_utf8_lossy(&rest[..end]).into_owned());
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
                    // Timed out: interrupt the foreground job (the cell);
                    // the interpreter survives.
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
        if let Some(payload) = status {
            emit(Piece::Done(payload));
        }
        self.busy.store(false, Ordering::SeqCst);
    }

    /// Interrupts the run in progress (SIGINT); the interpreter survives.
    pub fn interrupt(&self) {
        let _ = self.input.lock().unwrap_or_else(|p| p.into_inner()).signal(libc::SIGINT);
    }

    pub fn kill(&self) {
        let _ = self.input.lock().unwrap_or_else(|p| p.into_inner()).signal(libc::SIGKILL);
    }
}
