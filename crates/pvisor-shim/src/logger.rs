//! containerd's `binary://` stdio (a "shim logger", as nerdctl's logging
//! driver is): a program the shim starts for a process and hands the
//! process's output to. It follows containerd's runc shim
//! (`pkg/process/io.go`, `NewBinaryIO` and `NewBinaryCmd`):
//!
//! - `binary:///path/to/logger?key=value&flag` runs `/path/to/logger key
//!   value flag ""` (each query key, then its first value: Go's url.Values
//!   gives a bare key an empty one), with
//!   `CONTAINER_ID` and `CONTAINER_NAMESPACE` in its environment;
//! - the read ends of the stdout and stderr pipes are its fds 3 and 4, and
//!   fd 5 is the write end of a readiness pipe: the shim waits until the
//!   logger writes a byte to it or closes it before the process starts;
//! - the process's output goes to the pipes; once its relay has written
//!   the last byte the shim's ends close, and the logger reads EOF;
//! - at delete the logger gets SIGTERM and 12 s to exit, then SIGKILL.
//!
//! The shim waits at most [`READY_TIMEOUT`] for readiness (runc's waits
//! forever): a logger that never gets ready fails the create, clearly.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

/// How long the logger may take to signal readiness.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// containerd's `binaryIOProcTermTimeout`: SIGTERM, then this long, then SIGKILL.
const TERM_TIMEOUT: Duration = Duration::from_secs(12);
const SCHEME: &str = "binary://";

/// Whether a stdio path is a `binary://` URI.
pub fn is_binary(path: &str) -> bool {
    path.starts_with(SCHEME)
}

/// Why a `binary://` logger could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LoggerError {
    #[error("{uri:?} is not a binary:// URI")]
    NotBinary { uri: String },
    #[error("the logger path of {uri:?} is not UTF-8 once decoded")]
    NotUtf8 {
        uri: String,
        #[source]
        source: std::str::Utf8Error,
    },
    #[error(
        "the logging binary in {uri:?} must be an absolute path (binary:///usr/local/bin/logger?opt=value)"
    )]
    Relative { uri: String },
    /// A pipe to the logger could not be made.
    #[error(transparent)]
    Pipe(#[from] rustix::io::Errno),
    #[error("cannot start the logging binary {}: {source}", program.display())]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the logging binary {}: {source}", program.display())]
    NotReady {
        program: PathBuf,
        #[source]
        source: ReadyError,
    },
}

/// Why a started logger did not say it was ready.
#[derive(Debug, thiserror::Error)]
pub enum ReadyError {
    #[error("not ready after {seconds} s (it must write to or close fd 5)")]
    Timeout { seconds: u64 },
    #[error("readiness pipe: {0}")]
    Pipe(#[source] rustix::io::Errno),
}

/// The program and arguments a `binary://` URI names.
pub fn command_of(uri: &str) -> Result<(PathBuf, Vec<String>), LoggerError> {
    let rest = uri.strip_prefix(SCHEME).ok_or_else(|| LoggerError::NotBinary { uri: uri.into() })?;
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let path = percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .map_err(|source| LoggerError::NotUtf8 { uri: uri.into(), source })?;
    if !path.starts_with('/') {
        return Err(LoggerError::Relative { uri: uri.into() });
    }
    // Go's url.Values: each key once with its first value, the rest
    // dropped (Go's map order is random; this keeps the query's).
    let mut args: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        if seen.insert(key.to_string()) {
            args.push(key.into_owned());
            args.push(value.into_owned());
        }
    }
    Ok((PathBuf::from(path.into_owned()), args))
}

/// A started logger and the shim's ends of its output pipes.
#[derive(Debug)]
pub struct Logger {
    child: Child,
    stdout: Option<File>,
    stderr: Option<File>,
}

impl Logger {
    /// Starts the logger `uri` names for container `id` in `namespace` and
    /// waits until it is ready.
    pub fn start(uri: &str, id: &str, namespace: &str) -> Result<Logger, LoggerError> {
        let (program, args) = command_of(uri)?;
        let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC);
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let (ready_r, ready_w) = pipe()?;
        // Above 5, so the child's dup2 onto 3, 4 and 5 never overwrites a
        // source it still needs.
        let high = |fd: &OwnedFd| rustix::io::fcntl_dupfd_cloexec(fd, 10);
        let sources = [high(&out_r)?, high(&err_r)?, high(&ready_w)?];
        let raw: Vec<i32> = sources.iter().map(|fd| fd.as_raw_fd()).collect();
        let mut command = Command::new(&program);
        command
            .args(&args)
            .env("CONTAINER_ID", id)
            .env("CONTAINER_NAMESPACE", namespace)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: between fork and exec only dup2 runs, an async-signal-safe
        // syscall. It is libc's: rustix's dup2 wants the target as an
        // OwnedFd, and 3, 4 and 5 may not be open in the child. The sources
        // are inherited (CLOEXEC until the dup2, which clears it on the copy).
        unsafe {
            command.pre_exec(move || {
                for (target, source) in (3..).zip(&raw) {
                    if libc::dup2(*source, target) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = match command.spawn() {
            Ok(child) => child,
            Err(source) => return Err(LoggerError::Spawn { program, source }),
        };
        drop((sources, out_r, err_r, ready_w));
        let mut logger = Logger { child, stdout: Some(File::from(out_w)), stderr: Some(File::from(err_w)) };
        if let Err(source) = wait_ready(&ready_r) {
            logger.finish();
            return Err(LoggerError::NotReady { program, source });
        }
        Ok(logger)
    }

    /// The shim's ends of the stdout and stderr pipes (once).
    pub fn take_outputs(&mut self) -> (Option<File>, Option<File>) {
        (self.stdout.take(), self.stderr.take())
    }

    /// Closes the pipes, then SIGTERM, [`TERM_TIMEOUT`], SIGKILL (as
    /// containerd's binaryIO `Close`).
    pub fn finish(&mut self) {
        self.stdout = None;
        self.stderr = None;
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + TERM_TIMEOUT;
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        log::warn!("the logging binary did not exit {} s after SIGTERM; killing it", TERM_TIMEOUT.as_secs());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Logger {
    /// A logger is never left behind (a failed create, a duplicate exec).
    fn drop(&mut self) {
        self.finish();
    }
}

/// Waits for a byte or EOF on the readiness pipe.
fn wait_ready(ready: &OwnedFd) -> Result<(), ReadyError> {
    let mut fds = [PollFd::new(ready, PollFlags::IN)];
    // One deadline for the whole wait: a signal does not restart it.
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout =
            rustix::time::Timespec { tv_sec: left.as_secs() as i64, tv_nsec: left.subsec_nanos() as i64 };
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) => return Err(ReadyError::Timeout { seconds: READY_TIMEOUT.as_secs() }),
            Ok(_) => {
                let mut byte = [0u8; 1];
                return rustix::io::read(ready.as_fd(), &mut byte).map(|_| ()).map_err(ReadyError::Pipe);
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(ReadyError::Pipe(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::command_of;

    /// containerd's NewBinaryCmd: the path, then each query key and its
    /// first value (`pkg/process/io.go`).
    #[test]
    fn the_uri_becomes_the_loggers_command_line() {
        let (path, args) = command_of(
            "binary:///usr/local/bin/my%20logger?--log-dir=/var/log/x&flag&empty=&k=a+b%2Fc&k=dropped",
        )
        .unwrap();
        assert_eq!(path, std::path::PathBuf::from("/usr/local/bin/my logger"));
        assert_eq!(args, ["--log-dir", "/var/log/x", "flag", "", "empty", "", "k", "a b/c"]);
        assert_eq!(command_of("binary:///bin/logger").unwrap().1, Vec::<String>::new());
        assert!(command_of("binary://logger").unwrap_err().to_string().contains("absolute path"));
    }
}
