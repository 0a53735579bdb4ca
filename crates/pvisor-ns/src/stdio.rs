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
//! - a terminal: the sandbox's own terminal (see `terminal.rs`) when it is
//!   stdin's and pvisor is its foreground job; otherwise stdin gets `/dev/null` and
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
//! The stdin relay is stopped, never waited for, when the run ends: a FIFO
//! whose writer keeps it open must not hold the run open (a regular file's
//! offset is put back where the command stopped reading). The output relays
//! are drained before the run ends, so pvisor's summary follows everything
//! the command printed; once the run is cancelled, only while their
//! destination still takes it (a FIFO nobody reads must not turn a
//! cancellation into a hang).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rustix::fs::FileType;

use super::terminal::PipeRelay;
use pvisor_sandbox::sys;

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
            // Only the terminal pvisor is the foreground job of becomes the
            // sandbox's own; another one on stdout or stderr is not the
            // command's to drive (its answers to queries would be typed into
            // whatever runs there).
            Kind::Terminal if terminal && is_stdins_terminal(own) => Stdio::inherit(),
            Kind::Terminal if fd == 0 => plan.null(fd),
            Kind::Terminal => plan.output(fd, true)?.0,
            Kind::Null => plan.null(fd),
            Kind::Relayed if fd == 0 => {
                let (read, write) = sys::pipe()?;
                plan.input = Some(InputRelay::start(own, write, &read)?);
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

/// Plans fds 0–2 for a frontend that captures the command's output:
/// stdin is the sandbox's `/dev/null`, stdout and stderr the frontend's
/// pipes (anonymous pipes, passed through as pvisor's own would be).
pub(crate) fn plan_captured(output: &pvisor_sandbox::CapturedOutput) -> io::Result<Plan> {
    let mut plan = Plan { stdio: Vec::new(), null_fds: Vec::new(), outputs: Vec::new(), input: None };
    for fd in [&output.stdout, &output.stderr] {
        if classify(fd.as_fd()) != Kind::Pipe {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "captured output must be an anonymous pipe",
            ));
        }
    }
    let stdin = plan.null(0);
    plan.stdio =
        vec![stdin, Stdio::from(output.stdout.try_clone()?), Stdio::from(output.stderr.try_clone()?)];
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

/// Whether `fd` is a terminal, the same one as pvisor's stdin.
pub(crate) fn is_stdins_terminal(fd: BorrowedFd<'_>) -> bool {
    let device = |fd| Some(rustix::fs::fstat(fd).ok()?.st_rdev).filter(|_| rustix::termios::isatty(fd));
    device(fd).is_some() && device(fd) == device(sys::stdio(0))
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
///
/// The copy reads ahead of the command. For a regular file, whose offset
/// the caller shares (`while read f; do pvisor run …; done < list`), the
/// offset is put back where the command stopped reading when the run ends:
/// what was copied less what is still unread in the pipe.
#[derive(Debug)]
pub(crate) struct InputRelay {
    /// Written to stop the copy at once, wherever it waits.
    wake: Option<OwnedFd>,
    copier: Option<std::thread::JoinHandle<()>>,
    rewind: Option<Rewind>,
}

/// What is needed to put a regular file's offset back.
#[derive(Debug)]
struct Rewind {
    from: BorrowedFd<'static>,
    start: u64,
    copied: Arc<AtomicU64>,
    /// A read end of the command's pipe, kept to count what is unread
    /// (`FIONREAD`); holding it does not delay the command's end of file.
    pipe: OwnedFd,
}

impl InputRelay {
    /// Starts copying `from` to `to`, the write end of the pipe whose read
    /// end is `pipe`, until `from` ends, the command's end is closed, or
    /// [`stop`](Self::stop).
    pub(crate) fn start(from: BorrowedFd<'static>, to: OwnedFd, pipe: &OwnedFd) -> io::Result<InputRelay> {
        let (wake_read, wake) = sys::pipe()?;
        // Non-blocking, so a full pipe (a command that does not read) is
        // waited on in `poll`, beside the wake pipe.
        rustix::fs::fcntl_setfl(&to, rustix::fs::OFlags::NONBLOCK)?;
        let copied = Arc::new(AtomicU64::new(0));
        let regular = rustix::fs::fstat(from).is_ok_and(|s| FileType::from_raw_mode(s.st_mode).is_file());
        let rewind = match rustix::fs::seek(from, rustix::fs::SeekFrom::Current(0)) {
            Ok(start) if regular => {
                Some(Rewind { from, start, copied: copied.clone(), pipe: pipe.try_clone()? })
            }
            _ => None,
        };
        let copier = std::thread::Builder::new()
            .name("pvisor-in".into())
            .spawn(move || copy_in(from, &to, &wake_read, &copied))?;
        Ok(InputRelay { wake: Some(wake), copier: Some(copier), rewind })
    }

    /// Stops the copy; for a regular file, waits for it (it never blocks
    /// long) and puts the file's offset back where the command stopped.
    pub(crate) fn stop(&mut self) {
        if let Some(wake) = self.wake.take() {
            let _ = rustix::io::write(&wake, b"x");
        }
        let copier = self.copier.take();
        let Some(rewind) = self.rewind.take() else { return };
        if let Some(copier) = copier {
            let _ = copier.join();
        }
        let unread = rustix::io::ioctl_fionread(&rewind.pipe).unwrap_or(0);
        let consumed = rewind.copied.load(Ordering::Relaxed).saturating_sub(unread);
        let _ = rustix::fs::seek(rewind.from, rustix::fs::SeekFrom::Start(rewind.start + consumed));
    }
}

impl Drop for InputRelay {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The copy: until `from` ends or fails, `to` is closed, or `wake` is written.
fn copy_in(from: BorrowedFd<'_>, to: &OwnedFd, wake: &OwnedFd, copied: &AtomicU64) {
    use rustix::event::PollFlags;
    let mut buf = [0u8; 65536];
    // In the kernel while `from` takes a splice (a file, a pipe, TCP).
    let mut splice = true;
    loop {
        if !ready(from, PollFlags::IN, wake.as_fd()) {
            return;
        }
        if splice {
            let flags = rustix::pipe::SpliceFlags::NONBLOCK;
            match rustix::pipe::splice(from, None, to, None, 1 << 20, flags) {
                Ok(0) => return,
                Ok(n) => {
                    copied.fetch_add(n as u64, Ordering::Relaxed);
                }
                // The pipe is full, or a FIFO `from` is empty: wait for room,
                // then (above) for input.
                Err(rustix::io::Errno::AGAIN) => {
                    if !ready(to.as_fd(), PollFlags::OUT, wake.as_fd()) {
                        return;
                    }
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS) => splice = false,
                Err(_) => return,
            }
            continue;
        }
        let n = match rustix::io::read(from, &mut buf) {
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => continue,
            // End of file, or pvisor's stdin cannot be read: the command sees end of file.
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            match rustix::io::write(to, rest) {
                Ok(n) => {
                    rest = &rest[n..];
                    copied.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {
                    if !ready(to.as_fd(), PollFlags::OUT, wake.as_fd()) {
                        return;
                    }
                }
                // The command's end is closed.
                Err(_) => return,
            }
        }
    }
}

/// Waits until `fd` has `events` (or a hang-up or error, which the next
/// read or write reports); false once `wake` is readable instead.
fn ready(fd: BorrowedFd<'_>, events: rustix::event::PollFlags, wake: BorrowedFd<'_>) -> bool {
    use rustix::event::{PollFd, PollFlags};
    loop {
        let mut fds = [PollFd::new(&fd, events), PollFd::new(&wake, PollFlags::IN)];
        match rustix::event::poll(&mut fds, None) {
            Ok(_) if !fds[1].revents().is_empty() => return false,
            Ok(_) if !fds[0].revents().is_empty() => return true,
            Ok(_) | Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return false,
        }
    }
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
