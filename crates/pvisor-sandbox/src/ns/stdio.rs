//! What the command gets on descriptors 0–2: an anonymous pipe, the
//! sandbox's own terminal or the sandbox's `/dev/null`, never a descriptor
//! of a host file.
//!
//! A descriptor is a capability past every mount: a file on fd 0–2 is the
//! host's inode on the host's read-write mount, not the sandbox's read-only
//! view of it. `/proc/self/fd/0` reopens it for writing, `fchmod(1, 04755)`
//! sets its mode (a setuid copy of a root binary, as root), and a
//! directory's `..` walks the host's tree. So each of pvisor's own fds 0–2
//! is classified (fstat, fstatfs) and given to the command as:
//! - an anonymous pipe: passed through (it names no file and has no mode
//!   anyone else relies on);
//! - a terminal: the sandbox's own terminal (see `terminal.rs`) when pvisor
//!   is the terminal's foreground job; otherwise stdin gets `/dev/null` and
//!   stdout/stderr a pipe whose bytes a [`PipeRelay`] copies, sanitised, to
//!   the terminal;
//! - `/dev/null`: the sandbox's `/dev/null`, opened inside;
//! - a regular file, a named FIFO, a socket or another device: a fresh pipe
//!   whose bytes a supervisor thread copies from (stdin, [`InputRelay`]) or
//!   to (stdout, stderr, [`PipeRelay`]) the original descriptor;
//! - a directory, or a descriptor with nothing to copy (an `O_PATH`, an
//!   anonymous inode): the sandbox's `/dev/null`, with one `pvisor:` warning
//!   line naming the descriptor.
//!
//! The stdin relay is never waited for: a FIFO whose writer keeps it open
//! must not hold the run open. The output relays are drained before the run
//! ends, so pvisor's summary follows everything the command printed.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rustix::fs::FileType;

use super::terminal::PipeRelay;
use crate::sys;

/// `f_type` of the kernel's anonymous-pipe filesystem.
const PIPEFS_MAGIC: i64 = 0x5049_5045;

/// What one of pvisor's standard descriptors is, for the command's sake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An anonymous pipe: passed through.
    Pipe,
    /// A terminal.
    Terminal,
    /// The null device.
    Null,
    /// Bytes can be copied through a pipe: a regular file, named FIFO,
    /// socket or another device.
    Relayed,
    /// Nothing to copy: a directory or something stranger (named here).
    Refused(&'static str),
}

/// Classifies `fd`. A descriptor fstat cannot read is refused.
// `f_type`'s width differs between architectures.
#[allow(clippy::unnecessary_cast)]
pub(crate) fn classify(fd: BorrowedFd<'_>) -> Kind {
    let Ok(stat) = rustix::fs::fstat(fd) else { return Kind::Refused("unreadable by fstat") };
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::Fifo => {
            let on_pipefs = rustix::fs::fstatfs(fd).is_ok_and(|fs| fs.f_type as i64 == PIPEFS_MAGIC);
            if on_pipefs {
                Kind::Pipe
            } else {
                Kind::Relayed
            }
        }
        FileType::CharacterDevice if rustix::termios::isatty(fd) => Kind::Terminal,
        FileType::CharacterDevice
            if rustix::fs::major(stat.st_rdev) == 1 && rustix::fs::minor(stat.st_rdev) == 3 =>
        {
            Kind::Null
        }
        FileType::RegularFile | FileType::CharacterDevice | FileType::BlockDevice | FileType::Socket => {
            Kind::Relayed
        }
        FileType::Directory => Kind::Refused("a directory"),
        _ => Kind::Refused("neither a file, a pipe, a socket nor a device"),
    }
}

/// The helper's (and so the command's) descriptors 0–2, and the relays
/// that stand in for pvisor's own.
#[derive(Debug)]
pub(crate) struct Plan {
    /// For the helper's fds 0, 1 and 2, in order.
    pub stdio: Vec<Stdio>,
    /// Which of 0–2 the command reopens as the sandbox's `/dev/null`.
    pub null_fds: Vec<i32>,
    pub outputs: Vec<PipeRelay>,
    pub input: Option<InputRelay>,
}

const NAMES: [&str; 3] = ["stdin", "stdout", "stderr"];

/// Plans fds 0–2; `terminal` says whether the command gets the sandbox's
/// own terminal (which replaces each terminal descriptor inside).
pub(crate) fn plan(terminal: bool) -> io::Result<Plan> {
    let mut plan = Plan { stdio: Vec::new(), null_fds: Vec::new(), outputs: Vec::new(), input: None };
    // stdout's relay pipe, kept for a stderr that is the same file (`2>&1`),
    // so the two streams stay in the order they were written.
    let mut stdout_relay: Option<(OwnedFd, (u64, u64))> = None;
    for fd in 0..3 {
        let own = sys::stdio(fd);
        let stdio = match classify(own) {
            Kind::Pipe => Stdio::inherit(),
            Kind::Terminal if terminal => Stdio::inherit(),
            Kind::Terminal if fd == 0 => plan.null(fd),
            Kind::Terminal => plan.output(fd, true)?.0,
            Kind::Null => plan.null(fd),
            Kind::Relayed if fd == 0 => {
                let (read, write) = sys::pipe()?;
                plan.input = Some(InputRelay::start(own, write));
                Stdio::from(read)
            }
            Kind::Relayed => match (&stdout_relay, identity(own)) {
                (Some((write, of_stdout)), Some(id)) if fd == 2 && *of_stdout == id => {
                    Stdio::from(write.try_clone()?)
                }
                (_, id) => {
                    let (stdio, write) = plan.output(fd, false)?;
                    if let (1, Some(id)) = (fd, id) {
                        stdout_relay = Some((write, id));
                    }
                    stdio
                }
            },
            Kind::Refused(what) => {
                warn_refused(fd, what);
                plan.null(fd)
            }
        };
        plan.stdio.push(stdio);
    }
    Ok(plan)
}

impl Plan {
    fn null(&mut self, fd: i32) -> Stdio {
        self.null_fds.push(fd);
        Stdio::null()
    }

    /// A pipe for output descriptor `fd`, relayed to pvisor's own; returns
    /// the command's end and a copy of it.
    fn output(&mut self, fd: i32, sanitise: bool) -> io::Result<(Stdio, OwnedFd)> {
        let (read, write) = sys::pipe()?;
        self.outputs.push(PipeRelay::start(read, sys::stdio(fd), sanitise));
        let copy = write.try_clone()?;
        Ok((Stdio::from(write), copy))
    }
}

/// The file `fd` is open on, as (device, inode).
fn identity(fd: BorrowedFd<'_>) -> Option<(u64, u64)> {
    rustix::fs::fstat(fd).ok().map(|s| (s.st_dev, s.st_ino))
}

fn warn_refused(fd: i32, what: &str) {
    let name = NAMES[fd as usize];
    let instead = if fd == 0 {
        "the command reads /dev/null instead"
    } else {
        "the command's output there is discarded"
    };
    // The warning goes to stderr unless stderr is what was refused.
    let line = format!(
        "pvisor: warning: {name} (fd {fd}) is {what}, which the sandbox cannot be given (it would reach the host's files past the read-only view); {instead}\n"
    );
    let _ = sys::write_all(sys::stdio(2), line.as_bytes());
}

/// Copies pvisor's stdin into the command's stdin pipe. It is stopped, not
/// waited for, when the run ends: a read that blocks (a FIFO nobody writes)
/// or a command that stopped reading must not hold the run open.
#[derive(Debug)]
pub(crate) struct InputRelay {
    stop: Arc<AtomicBool>,
}

impl InputRelay {
    /// Starts copying `from` to `to` (the pipe's write end) until `from`
    /// ends, the command's end is closed, or [`stop`](Self::stop).
    pub(crate) fn start(from: BorrowedFd<'static>, to: OwnedFd) -> InputRelay {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        // Non-blocking, so a full pipe (a command that does not read) is
        // waited on in `poll`, which notices `stop`.
        let _ = rustix::fs::fcntl_setfl(&to, rustix::fs::OFlags::NONBLOCK);
        let _ = std::thread::Builder::new().name("pvisor-in".into()).spawn(move || {
            let mut buf = [0u8; 16384];
            while !flag.load(Ordering::Relaxed) {
                if !super::terminal::poll(from, rustix::event::PollFlags::IN, 100) {
                    continue;
                }
                let n = super::terminal::read(from, &mut buf);
                // End of file, or pvisor's stdin cannot be read: the command sees end of file.
                if n == 0 || !write_all_until(to.as_fd(), &buf[..n], &flag) {
                    break;
                }
            }
        });
        InputRelay { stop }
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Drop for InputRelay {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Writes all of `buf` to the non-blocking `to`, waiting while it is full;
/// false once it is closed (the command's end is gone) or `stop` is set.
fn write_all_until(to: BorrowedFd<'_>, mut buf: &[u8], stop: &AtomicBool) -> bool {
    while !buf.is_empty() {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        match rustix::io::write(to, buf) {
            Ok(n) => buf = &buf[n..],
            Err(rustix::io::Errno::AGAIN) => {
                super::terminal::poll(to, rustix::event::PollFlags::OUT, 100);
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_are_classified_by_what_they_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(dir.path().join("f")).unwrap();
        let (read, _write) = sys::pipe().unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        let directory = std::fs::File::open(dir.path()).unwrap();
        let (socket, _) = std::os::unix::net::UnixStream::pair().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let named = rustix::fs::open(
            &fifo,
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        assert_eq!(classify(file.as_fd()), Kind::Relayed);
        assert_eq!(classify(read.as_fd()), Kind::Pipe);
        assert_eq!(classify(named.as_fd()), Kind::Relayed);
        assert_eq!(classify(null.as_fd()), Kind::Null);
        assert_eq!(classify(directory.as_fd()), Kind::Refused("a directory"));
        assert_eq!(classify(socket.as_fd()), Kind::Relayed);
    }
}
