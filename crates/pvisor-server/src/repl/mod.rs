//! Long-lived interpreters in a sandbox, driven over their stdin: execd bash
//! sessions (`/session`) and code contexts (`/code`, see
//! [`crate::code_contexts`]). One guest process per session or context,
//! chrooted like commands, whose state (cwd, variables, functions, Python
//! globals) carries from one run to the next.
//!
//! Each run writes one request to the interpreter's stdin, which ends it with
//! two markers carrying a per-run nonce: `\x1eNONCE:PAYLOAD\x1e\n` on
//! stdout (the payload is bash's exit status, or the Python driver's JSON
//! result) and `\x1eNONCE\x1e\n` on stderr; output up to the markers is the
//! run's. Bash runs `cd CWD && eval 'COMMAND'` (`eval` keeps a syntax error
//! from leaving the shell waiting for more input); Python runs
//! [`PYTHON_DRIVER`]. A session lives in the daemon's memory with its relay:
//! a pause, a daemon restart or `exit` in a run ends it, and later runs get
//! an error saying so.

mod tail;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::guest_link::{self, Reply};

use crate::http::ApiError;
use crate::sandbox::{command_env, SandboxRecord};
use tail::{Split, Tail};

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
    /// Whole Go programs, built and run per cell by [`PYTHON_DRIVER`].
    Go,
    /// TypeScript in node, run by [`TYPESCRIPT_DRIVER`].
    TypeScript,
    /// Java snippets in JShell, run by [`JAVA_DRIVER`].
    Java,
}

/// The TypeScript side of a code context (node): the protocol of
/// [`PYTHON_DRIVER`], with cells transpiled by the image's TypeScript and
/// run in one persistent V8 context.
pub const TYPESCRIPT_DRIVER: &str = include_str!("drivers/typescript.js");

/// The Java side of a code context: the protocol of [`PYTHON_DRIVER`], with
/// cells evaluated by the JDK's JShell in the driver's own JVM, started by
/// the JDK's source launcher (so any image with a JDK runs it).
pub const JAVA_DRIVER: &str = include_str!("drivers/JShellDriver.java");

/// The Python side of a code context, and with the argument `go` the Go
/// side (each cell a whole program: `go build`, then run; a build that
/// fails is a `CompilationError`, a program that fails an `ExitError`,
/// their messages on stderr). It reads one JSON request per line
/// (`{"nonce", "code"}`) from a private copy of stdin (the cell's own stdin
/// is /dev/null, so `input()` cannot eat requests), runs the cell like a
/// notebook (statements, then the value of a final expression) in a module
/// that is `__main__` (so `import __main__` is the cell's, not the driver's),
/// and ends it with the markers the module doc describes on private copies
/// of fds 1 and 2 (a cell that redirects or closes its stdout cannot lose
/// them), the payload being `{"count", "result", "error"}` as JSON (ASCII:
/// no 0x1e inside). SIGINT is blocked except while a cell runs; one sent
/// after the cell was asked for but before it started waits and ends it,
/// one that comes after it ended is discarded, so an interrupt ends the cell
/// it was aimed at (KeyboardInterrupt is its error) and never the driver.
pub const PYTHON_DRIVER: &str = r#"
import signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
import ast, json, os, sys, traceback, types

def describe(e):
    try:
        value = str(e)
    except Exception:
        value = "<unprintable>"
    lines = traceback.format_exception(type(e), e, e.__traceback__)
    if isinstance(e, (CompilationError, ExitError)):
        lines = []
    return {"ename": type(e).__name__, "evalue": value, "traceback": [l.rstrip("\n") for l in lines]}

def run_python(code, cell):
    tree = ast.parse(code, "<cell>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<cell>", "exec"), cell.__dict__)
    if last is not None:
        value = eval(compile(last, "<cell>", "eval"), cell.__dict__)
        if value is not None:
            return repr(value)
    return None

class CompilationError(Exception):
    pass

class ExitError(Exception):
    pass

def run_go(code):
    import subprocess, tempfile
    os.environ.setdefault("GOCACHE", os.path.join(tempfile.gettempdir(), "pvisor-go-cache"))
    with tempfile.TemporaryDirectory(prefix="pvisor-go-") as work:
        with open(os.path.join(work, "main.go"), "w", encoding="utf-8") as f:
            f.write(code)
        built = subprocess.run(["go", "build", "-o", "cell", "main.go"], cwd=work, stdin=subprocess.DEVNULL)
        if built.returncode != 0:
            raise CompilationError("go build failed (exit status %d); its errors are on stderr" % built.returncode)
        ran = subprocess.run([os.path.join(work, "cell")], stdin=subprocess.DEVNULL)
        if ran.returncode != 0:
            raise ExitError("exit status %d" % ran.returncode if ran.returncode > 0 else "killed by signal %d" % -ran.returncode)
    return None

def serve():
    go = sys.argv[1:] == ["go"]
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8", errors="replace")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(0, "r", closefd=False)
    marks = (os.dup(1), os.dup(2))
    cell = types.ModuleType("__main__")
    cell.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = cell
    block = {signal.SIGINT}
    count = 0
    os.write(marks[0], b"\x1eready\x1e\n")
    while True:
        try:
            line = requests.readline()
            if not line:
                return
            request = json.loads(line)
            code, nonce = request["code"], request["nonce"]
        except (KeyboardInterrupt, ValueError, KeyError, TypeError):
            continue
        count += 1
        result, error = None, None
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, block)
            try:
                result = run_go(code) if go else run_python(code, cell)
            finally:
                signal.pthread_sigmask(signal.SIG_BLOCK, block)
        except BaseException as e:
            error = e
        for attempt in range(3):
            try:
                if isinstance(error, BaseException):
                    error = describe(error)
                if result is not None and len(result) > 1048576:
                    result = result[:1048576] + "... (truncated)"
                payload = json.dumps({"count": count, "result": result, "error": error})
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except Exception:
                        pass
                os.write(marks[0], ("\x1e%s:%s\x1e\n" % (nonce, payload)).encode())
                os.write(marks[1], ("\x1e%s\x1e\n" % nonce).encode())
                break
            except KeyboardInterrupt:
                continue
        # An interrupt that came after the cell ended was for it, not the next.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.default_int_handler)

serve()
"#;

/// One interpreter process in one sandbox.
pub struct Repl {
    dialect: Dialect,
    /// The shell is bash (not a plain sh).
    bash: bool,
    input: Mutex<guest_link::ExecSignaller>,
    output: Mutex<Receiver<Out>>,
    busy: Arc<AtomicBool>,
    /// This run was interrupted already.
    interrupted: AtomicBool,
    ended: Arc<AtomicBool>,
    /// Why the interpreter ended, once it has.
    why: Arc<Mutex<Option<String>>>,
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

/// What an interpreter prints once it is ready for runs.
const READY: &[u8] = b"\x1eready\x1e\n";
/// How long a starting interpreter may take (Python under TCG is slow; a
/// JVM compiling its driver and warming JShell, slower still).
fn ready_wait(dialect: Dialect) -> Duration {
    Duration::from_secs(if dialect == Dialect::Java { 240 } else { 60 })
}

/// The first of `candidates` (paths inside the image) that exists, or an
/// error naming what the image lacks and the image that has it.
fn in_image_or(
    record: &SandboxRecord,
    candidates: &[&'static str],
    what: &str,
    image: &str,
) -> Result<&'static str, ApiError> {
    candidates.iter().copied().find(|p| crate::execd::in_image(&record.rootfs, p)).ok_or_else(|| {
        ApiError::bad_request(format!(
            "image {:?} has no {what}; create the sandbox with the built-in image {image:?} (or one that has {what}) for these contexts",
            record.image
        ))
    })
}

const PYTHONS: &[&str] = &["usr/bin/python3", "usr/local/bin/python3", "bin/python3"];

/// The interpreter of `dialect` in the sandbox's image: its name and argv.
fn interpreter(dialect: Dialect, record: &SandboxRecord) -> Result<(&'static str, Vec<String>), ApiError> {
    let chosen = match dialect {
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
            let python = in_image_or(record, PYTHONS, "python3", "python")?;
            ("python3", vec![format!("/{python}"), "-u".into(), "-c".into(), PYTHON_DRIVER.into()])
        }
        Dialect::Go => {
            in_image_or(record, &["usr/bin/go", "usr/local/go/bin/go"], "go", "code-interpreter")?;
            let python = in_image_or(record, PYTHONS, "python3", "code-interpreter")?;
            let argv =
                vec![format!("/{python}"), "-u".into(), "-c".into(), PYTHON_DRIVER.into(), "go".into()];
            ("go", argv)
        }
        Dialect::TypeScript => {
            let node =
                in_image_or(record, &["usr/bin/node", "usr/local/bin/node"], "node", "code-interpreter")?;
            ("node", vec![format!("/{node}"), "-e".into(), TYPESCRIPT_DRIVER.into()])
        }
        Dialect::Java => {
            let java =
                in_image_or(record, &["usr/bin/java", "usr/local/bin/java"], "java", "code-interpreter")?;
            // The source launcher needs a file: the driver is written to a
            // private directory, run from there, and removes it once ready.
            let script = format!(
                "d=$(mktemp -d) && printf '%s' \"$1\" >\"$d/JShellDriver.java\" && exec /{java} -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \"$d/JShellDriver.java\" \"$d\""
            );
            ("java", vec!["/bin/sh".into(), "-c".into(), script, "pvisor-java".into(), JAVA_DRIVER.into()])
        }
    };
    Ok(chosen)
}

/// Waits until the interpreter says it is ready (its READY marker on
/// stdout), for at most `wait`.
fn await_ready(channel: &mut guest_link::ExecChannel, shell: &str, wait: Duration) -> Result<(), ApiError> {
    let started = Instant::now();
    let mut seen = Vec::new();
    while memchr::memmem::find(&seen, READY).is_none() {
        if started.elapsed() > wait {
            return Err(ApiError::internal(format!("{shell} did not become ready within {wait:?}")));
        }
        match channel.next_reply() {
            Ok(Some((Reply::Stdout { .. }, bytes))) => seen.extend_from_slice(&bytes),
            Ok(Some((Reply::Exited { code, signal, .. }, _))) => {
                return Err(ApiError::bad_request(format!(
                    "{shell} exited as it started (status {code:?}, signal {signal:?})"
                )))
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                return Err(ApiError::internal(format!("{shell}'s relay closed as it started")))
            }
        }
    }
    Ok(())
}

impl Repl {
    /// Starts the interpreter in the sandbox: bash (sh when the image has
    /// none), or the image's python3 running [`PYTHON_DRIVER`].
    pub fn start(
        dialect: Dialect,
        link: &crate::guest_link::Link,
        record: &SandboxRecord,
        exec_id: u32,
        cwd: Option<&str>,
    ) -> Result<Self, ApiError> {
        let (shell, argv) = interpreter(dialect, record)?;
        let spec = guest_link::ExecSpec {
            id: exec_id,
            argv,
            env: command_env(record, &Default::default()),
            cwd: PathBuf::from(cwd.unwrap_or("/")),
            root: Some(record.rootfs.clone()),
            output: None,
            terminal: None,
            confinement: None,
        };
        let mut channel = guest_link::exec(link, spec).map_err(|e| ApiError::internal(e.0))?;
        match channel.next_reply() {
            Ok(Some((Reply::Started { .. }, _))) => {}
            Ok(Some((Reply::ExecFailed { message, .. }, _))) => {
                return Err(ApiError::bad_request(format!("cannot start {shell}: {message}")))
            }
            other => return Err(ApiError::internal(format!("the guest answered {other:?}"))),
        }
        let mut input = channel.signaller().map_err(|e| ApiError::internal(e.to_string()))?;
        if dialect == Dialect::Bash {
            // A non-interactive shell dies of SIGINT; with a trap it lives
            // (its children still get the default action). The markers'
            // own copies of stdout and stderr survive a run's `exec >file`.
            let init: &[u8] = if shell.ends_with("bash") {
                // bash: a run is a function, and the trap's `return` ends it
                // (the rest of the command line too, as at a prompt).
                b"__pvisor_run() { eval \"$__pvisor_cmd\"; }\ntrap 'return 130 2>/dev/null' INT\nexec 8>&1 9>&2\nprintf '\\036ready\\036\\n'\n"
            } else {
                b"trap : INT\nexec 8>&1 9>&2\nprintf '\\036ready\\036\\n'\n"
            };
            input.stdin(init).map_err(|e| ApiError::internal(e.to_string()))?;
        }
        // Ready only once the interpreter says so: an interrupt sent before
        // its SIGINT handling is in place (a Python still starting) would
        // end it instead of a cell.
        await_ready(&mut channel, shell, ready_wait(dialect))?;
        // Bounded, and output between runs (a background job's) is dropped:
        // a chatty session cannot grow the daemon; a slow client of a run
        // holds the shell back (and is cut off by the relay's stall limit).
        let (tx, rx) = mpsc::sync_channel(256);
        let ended = Arc::new(AtomicBool::new(false));
        let busy = Arc::new(AtomicBool::new(false));
        let why_ended = Arc::new(Mutex::new(None));
        let (flag, running, reason) = (ended.clone(), busy.clone(), why_ended.clone());
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
                *reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.clone());
                flag.store(true, Ordering::SeqCst);
                let _ = tx.send(Out::Ended(why));
            })
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let bash = dialect == Dialect::Bash && shell.ends_with("bash");
        Ok(Self {
            dialect,
            bash,
            input: Mutex::new(input),
            output: Mutex::new(rx),
            busy,
            interrupted: AtomicBool::new(false),
            ended,
            why: why_ended,
        })
    }

    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// Why the interpreter ended (its exit status, or the relay closing).
    pub fn ended_reason(&self) -> Option<String> {
        self.why.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Runs `command` (a shell command, or a Python cell), handing each piece
    /// of output to `emit` as it comes (`emit` answers false once its client
    /// is gone). A run whose client leaves, or that outlives `timeout`, is
    /// interrupted (SIGINT) and the interpreter stays busy, its output
    /// discarded, until that run's markers arrive: the next run never sees
    /// the previous one's output.
    pub fn run(
        &self,
        command: &str,
        cwd: Option<&str>,
        timeout: Option<Duration>,
        mut emit: impl FnMut(Piece) -> bool,
    ) {
        if self.busy.swap(true, Ordering::SeqCst) {
            emit(Piece::Failed(
                "another run is in progress in this session or context (interrupt it, or wait)".into(),
            ));
            return;
        }
        let output = self.output.lock().unwrap_or_else(|p| p.into_inner());
        // Only once the previous run has returned: its last acts cannot
        // spend this run's one interrupt.
        self.interrupted.store(false, Ordering::SeqCst);
        // Whatever background jobs printed between runs is not this run's.
        while let Ok(stale) = output.try_recv() {
            if let Out::Ended(why) = stale {
                self.busy.store(false, Ordering::SeqCst);
                emit(Piece::Failed(why));
                return;
            }
        }
        let nonce = crate::http::uuid4().replace('-', "");
        // Output is exactly what precedes a marker (0x1e does not occur in
        // text), so a last line keeps its newline or its lack of one.
        let (out_marker, err_marker) = (format!("\x1e{nonce}:"), format!("\x1e{nonce}\x1e\n"));
        let script = self.script(command, cwd, &nonce);
        if self.input.lock().unwrap_or_else(|p| p.into_inner()).stdin(script.as_bytes()).is_err() {
            self.busy.store(false, Ordering::SeqCst);
            emit(Piece::Failed("the interpreter is gone".into()));
            return;
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut emitting = true;
        let mut pieces = |piece: Piece, emitting: &mut bool| {
            if *emitting && !emit(piece) {
                // The client is gone: end its run, then drain it.
                *emitting = false;
                self.interrupt();
            }
        };
        let (mut out, mut err) = (Tail::default(), Tail::default());
        let (mut status, mut err_done): (Option<String>, bool) = (None, false);
        let mut oversized = false;
        while status.is_none() || !err_done {
            let next = match deadline.filter(|_| emitting) {
                Some(d) => output.recv_timeout(d.saturating_duration_since(Instant::now())),
                None => output.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match next {
                Ok(Out::Stdout(bytes)) if status.is_none() => {
                    for piece in out.push(&bytes, out_marker.as_bytes()) {
                        match piece {
                            Split::Output(b) => pieces(Piece::Stdout(b), &mut emitting),
                            Split::Marker(payload) => status = Some(payload),
                            Split::Oversized => {
                                oversized = true;
                                status = Some(String::new());
                            }
                        }
                    }
                }
                Ok(Out::Stderr(bytes)) if !err_done => {
                    for piece in err.push(&bytes, err_marker.as_bytes()) {
                        match piece {
                            Split::Output(b) => pieces(Piece::Stderr(b), &mut emitting),
                            Split::Marker(_) | Split::Oversized => err_done = true,
                        }
                    }
                }
                Ok(Out::Ended(why)) => {
                    for (is_out, rest) in [(true, out.rest()), (false, err.rest())] {
                        if !rest.is_empty() {
                            pieces(
                                if is_out { Piece::Stdout(rest) } else { Piece::Stderr(rest) },
                                &mut emitting,
                            );
                        }
                    }
                    self.busy.store(false, Ordering::SeqCst);
                    if emitting {
                        emit(Piece::Failed(why));
                    }
                    return;
                }
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    // Timed out: interrupt the foreground job (the cell);
                    // the interpreter survives, and the run is drained.
                    pieces(
                        Piece::Failed(format!(
                            "the run exceeded its timeout of {} ms",
                            timeout.unwrap_or_default().as_millis()
                        )),
                        &mut emitting,
                    );
                    emitting = false;
                    self.interrupt();
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.busy.store(false, Ordering::SeqCst);
                    if emitting {
                        emit(Piece::Failed("the interpreter's relay closed".into()));
                    }
                    return;
                }
            }
        }
        // The run is over before its answer goes out: a client that sends
        // its next run as soon as this answer ends must find the
        // interpreter free. (A later run waits on `output` until this one
        // returns, so the two never interleave.) The answer goes out with
        // plain `emit`: a client gone by now leaves nothing to interrupt,
        // and an interrupt here would land on the next run.
        self.busy.store(false, Ordering::SeqCst);
        let answer = match status {
            Some(_) if oversized => Piece::Failed(format!(
                "the run's answer (its value or its error) is over {} MiB; print a large value instead of returning it",
                tail::PAYLOAD_MAX >> 20
            )),
            Some(payload) => Piece::Done(payload),
            None => return,
        };
        if emitting {
            emit(answer);
        }
    }

    /// What the interpreter is sent for one run of `command`: the command
    /// (or cell) and the markers, carrying `nonce`, that end its stdout (with
    /// the status) and its stderr.
    fn script(&self, command: &str, cwd: Option<&str>, nonce: &str) -> String {
        match self.dialect {
            Dialect::Bash => {
                // One line, stdin from /dev/null: a command that reads stdin
                // cannot swallow the markers. They go to the copies of
                // stdout and stderr made at start (fds 8 and 9: dash takes
                // single digits only).
                let cd = cwd.map(|c| format!("cd -- {} && ", shell_quote(c))).unwrap_or_default();
                let body = if self.bash {
                    format!("{{ __pvisor_cmd={}; __pvisor_run; }}", shell_quote(command))
                } else {
                    format!("eval {}", shell_quote(command))
                };
                format!(
                    "{{ {cd}{body}\n}} </dev/null; printf '\\036%s:%d\\036\\n' {nonce} $? >&8; printf '\\036%s\\036\\n' {nonce} >&9\n"
                )
            }
            Dialect::Python | Dialect::Go | Dialect::TypeScript | Dialect::Java => {
                format!("{}\n", serde_json::json!({ "nonce": nonce, "code": command }))
            }
        }
    }

    /// Interrupts the run in progress (SIGINT); the interpreter survives.
    /// With no run in progress it does nothing, as the reference's kernel
    /// interrupt does (an idle signal would wait for the next cell).
    /// Once per run: a second signal could land after the cell ended and
    /// wait for the next one.
    pub fn interrupt(&self) {
        if self.busy.load(Ordering::SeqCst) && !self.interrupted.swap(true, Ordering::SeqCst) {
            let _ = self.input.lock().unwrap_or_else(|p| p.into_inner()).signal(libc::SIGINT);
        }
    }

    pub fn kill(&self) {
        let _ = self.input.lock().unwrap_or_else(|p| p.into_inner()).signal(libc::SIGKILL);
    }
}
