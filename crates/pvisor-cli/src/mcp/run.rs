//! The `run` tool: one command in a sandbox, as `pvisor run` would run it,
//! with its output captured into pipes (the server's own stdout is the
//! protocol) and its last bytes returned with the result.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;

use pvisor::actions::{BeginSessionRun, Run, Status};
use pvisor::{RunEnd, Runtime};
use pvisor_sandbox::CapturedOutput;

use super::schema::{self, Network, NetworkMode, RunArgs, RunResult};
use super::{shown, shown_output, ToolError};
use crate::cli::{Cli, Command};

/// The default and largest tail of output returned.
const TAIL_DEFAULT: usize = 1024;
const TAIL_MAX: usize = 64 * 1024;

/// A run's cancellation, which the client's `notifications/cancelled` (or
/// its going away) sets, whether it comes before the Job exists or after.
#[derive(Clone, Default)]
pub struct Cancel(Arc<Mutex<(bool, Option<pvisor::CancelHandle>)>>);

impl Cancel {
    /// Cancels the run (SIGTERM, as `pvisor kill` does), now or once it starts.
    pub fn cancel(&self) {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        state.0 = true;
        if let Some(handle) = &state.1 {
            handle.cancel(libc::SIGTERM);
        }
    }

    fn arm(&self, handle: pvisor::CancelHandle) {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if state.0 {
            handle.cancel(libc::SIGTERM);
        }
        state.1 = Some(handle);
    }

    fn cancelled(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).0
    }
}

/// Runs the command and waits for its receipt. Blocking: call it off the
/// async executor, inside the Tokio runtime (the Job service spawns on it).
pub fn run(
    runtime: &Runtime,
    handle: &tokio::runtime::Handle,
    scope: &super::Scope,
    args: RunArgs,
    cancel: &Cancel,
) -> Result<RunResult, ToolError> {
    let command = command_line(&args)?;
    let workspace = super::workspace(runtime, args.place.workspace.as_deref(), scope)?;
    let options = run_options(&args)?;
    let executor = crate::commands::executor_for(runtime, options.executor)?;
    let tail = args.tail_bytes.unwrap_or(TAIL_DEFAULT).min(TAIL_MAX);
    let (stdout, stderr) = (Capture::start(tail)?, Capture::start(tail)?);
    let output = CapturedOutput { stdout: stdout.write_end.clone(), stderr: stderr.write_end.clone() };
    let mut turn = match &args.place.session {
        Some(name) => Some(runtime.execute(BeginSessionRun {
            workspace: workspace.clone(),
            name: name.clone(),
            waiting: Box::new(|| tracing::info!(session = %name, "waiting for the session's live run")),
        })?),
        None => None,
    };
    let fork = turn.as_ref().and_then(|t| t.fork.as_ref().map(|(id, _)| id.clone()));
    let mut request =
        crate::commands::request_for(runtime, &executor, workspace, fork, None, &options, &command)?;
    request.output = Some(output);
    if cancel.cancelled() {
        return Err(ToolError::Refused("the call was cancelled before its run started".into()));
    }
    let run = {
        let _entered = handle.enter();
        runtime.execute(Run { request, executor })?
    };
    if let Some(turn) = turn.as_mut() {
        turn.admitted(run.job())?;
    }
    cancel.arm(run.cancel_handle());
    let cancel = run.cancel_handle();
    let end = handle.block_on(async move {
        let mut run = run;
        match args.timeout {
            Some(secs) => tokio::select! {
                end = run.wait() => end,
                () = tokio::time::sleep(Duration::from_secs(secs)) => {
                    cancel.cancel(libc::SIGTERM);
                    run.wait().await
                }
            },
            None => run.wait().await,
        }
    })?;
    let RunEnd::Finished(outcome) = end else {
        return Err(ToolError::Refused(
            "the run was suspended from elsewhere; `pvisor resume` continues it".into(),
        ));
    };
    let receipt = runtime.execute(Status { job: outcome.job.clone() })?.receipt;
    let session =
        turn.map(|t| schema::SessionInfo { name: t.record.name.to_string(), run: t.record.jobs.len() });
    let result = &outcome.result;
    Ok(RunResult {
        job: outcome.job.to_string(),
        attempt: outcome.attempt.to_string(),
        state: result.state.as_str().into(),
        exit_code: result.exit_code,
        signal: result.signal,
        error: result.error.as_deref().map(shown),
        receipt: serde_json::to_value(receipt)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        bundle_blake3: outcome.bundle_blake3.clone(),
        stdout: stdout.finish(),
        stderr: stderr.finish(),
        changes: super::summary(&outcome.changes),
        session,
        warnings: outcome.warnings.iter().map(|w| shown(w)).collect(),
    })
}

/// The program and its arguments: `argv` as given, or `sh -c COMMAND`.
fn command_line(args: &RunArgs) -> Result<Vec<String>, ToolError> {
    match (&args.command, &args.argv) {
        (Some(text), None) => Ok(vec!["sh".into(), "-c".into(), text.clone()]),
        (None, Some(argv)) if !argv.is_empty() => Ok(argv.clone()),
        (Some(_), Some(_)) => {
            Err(ToolError::BadArgument("give `command` (shell text) or `argv`, not both".into()))
        }
        _ => Err(ToolError::BadArgument("give `command` (shell text) or `argv` (a non-empty list)".into())),
    }
}

/// The run's options, parsed by the same command line `pvisor run` takes,
/// so a run through MCP is checked and defaulted exactly as one typed is.
fn run_options(args: &RunArgs) -> Result<crate::cli::RunOptions, ToolError> {
    let mut argv: Vec<String> = vec!["pvisor".into(), "run".into(), "--quiet".into()];
    match &args.network {
        None | Some(Network::Mode(NetworkMode::None)) => {}
        Some(Network::Allow { allow }) => {
            for host in allow {
                argv.extend(["--allow".into(), host.clone()]);
            }
        }
    }
    if let Some(executor) = &args.executor {
        argv.extend(["--executor".into(), executor.clone()]);
    }
    argv.extend(["--".into(), "true".into()]);
    match Cli::try_parse_from(argv) {
        Ok(Cli { command: Command::Run(run), .. }) => Ok(run.options),
        Ok(_) => Err(ToolError::BadArgument("not a run".into())),
        Err(e) => Err(ToolError::BadArgument(
            shown(&e.kind().to_string()) + ": " + &shown(&first_line(&e.to_string())),
        )),
    }
}

fn first_line(text: &str) -> String {
    text.lines().find(|l| !l.trim().is_empty()).unwrap_or_default().trim().to_owned()
}

/// How long the reader waits for more output once the run has ended and
/// the pipe is quiet: the command and everything it started are gone, but a
/// write end may outlive them (the vm executor holds one until its link
/// closes), and the call must not wait on that.
const QUIET_AFTER_END: Duration = Duration::from_millis(100);
/// The most it drains after the run ended, however much keeps coming.
const DRAIN_AFTER_END: Duration = Duration::from_secs(2);

/// One captured stream: a pipe whose write end the sandbox gets and a
/// thread that keeps the last bytes read from it.
struct Capture {
    write_end: Arc<OwnedFd>,
    reader: std::thread::JoinHandle<()>,
    kept: Arc<Mutex<Kept>>,
    ended: Arc<AtomicBool>,
}

#[derive(Default)]
struct Kept {
    tail: std::collections::VecDeque<u8>,
    bytes: u64,
}

impl Kept {
    fn keep(&mut self, bytes: &[u8], keep: usize) {
        self.bytes += bytes.len() as u64;
        self.tail.extend(bytes);
        let excess = self.tail.len().saturating_sub(keep);
        self.tail.drain(..excess);
    }
}

impl Capture {
    fn start(keep: usize) -> Result<Self, ToolError> {
        let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| ToolError::Internal(format!("cannot make a pipe: {e}")))?;
        let kept = Arc::new(Mutex::new(Kept::default()));
        let ended = Arc::new(AtomicBool::new(false));
        let reader = std::thread::Builder::new()
            .name("pvisor-mcp-output".into())
            .spawn({
                let (kept, ended) = (kept.clone(), ended.clone());
                move || read_tail(&read, keep, &kept, &ended)
            })
            .map_err(|e| ToolError::Internal(format!("cannot start a reader: {e}")))?;
        Ok(Self { write_end: Arc::new(write), reader, kept, ended })
    }

    /// The tail, once the pipe is closed or quiet after the run's end.
    fn finish(self) -> schema::Output {
        drop(self.write_end);
        self.ended.store(true, Ordering::Release);
        let _ = self.reader.join();
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let bytes: Vec<u8> = kept.tail.iter().copied().collect();
        schema::Output { tail: shown_output(&bytes), bytes: kept.bytes }
    }
}

/// Reads until end of file, or once `ended` is set, until the pipe has been
/// quiet for [`QUIET_AFTER_END`] (at most [`DRAIN_AFTER_END`] in all),
/// keeping the last `keep` bytes.
fn read_tail(from: &OwnedFd, keep: usize, kept: &Mutex<Kept>, ended: &AtomicBool) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut ended_at: Option<std::time::Instant> = None;
    let tick = rustix::time::Timespec { tv_sec: 0, tv_nsec: QUIET_AFTER_END.as_nanos() as i64 };
    loop {
        if ended_at.is_none() && ended.load(Ordering::Acquire) {
            ended_at = Some(std::time::Instant::now());
        }
        if ended_at.is_some_and(|at| at.elapsed() > DRAIN_AFTER_END) {
            return;
        }
        let mut fds = [rustix::event::PollFd::new(from, rustix::event::PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&tick)) {
            Ok(0) if ended_at.is_some() => return,
            Ok(0) | Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => {}
            Err(_) => return,
        }
        match rustix::io::read(from, &mut buf) {
            Ok(0) => return,
            Ok(n) => kept.lock().unwrap_or_else(|p| p.into_inner()).keep(&buf[..n], keep),
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_end_held_elsewhere_does_not_hold_the_call() {
        let capture = Capture::start(4).unwrap();
        let held = capture.write_end.clone();
        rustix::io::write(&*held, b"hello world").unwrap();
        let started = std::time::Instant::now();
        let output = capture.finish();
        assert_eq!((output.tail.as_str(), output.bytes), ("orld", 11));
        assert!(started.elapsed() < DRAIN_AFTER_END + Duration::from_secs(1), "{:?}", started.elapsed());
        drop(held);
    }

    #[test]
    fn the_tail_keeps_lines_and_shows_escapes_as_text() {
        let capture = Capture::start(64).unwrap();
        rustix::io::write(&*capture.write_end, b"a\x1b]52;c;Zm9v\x07\nb\tc\r\n").unwrap();
        let output = capture.finish();
        assert!(!output.tail.contains('\u{1b}') && !output.tail.contains('\u{7}'), "{:?}", output.tail);
        assert!(output.tail.starts_with("a\\x1b]52") && output.tail.contains("\nb\tc"), "{:?}", output.tail);
    }
}
