//! The supervisor's side of the sandbox's own terminal, as `ssh -t` does it,
//! and of output relays: the command never holds a descriptor of the user's
//! terminal, on any of fds 0–2.
//!
//! When the user's stdin is a terminal and pvisor is its foreground job, the
//! command gets a pseudo-terminal of its own inside the sandbox (so `TIOCSTI`
//! and job control act on that, never on the user's shell). The supervisor
//! puts the user's terminal in raw mode and relays bytes both ways;
//! window-size changes are copied across. The user's terminal settings are
//! restored when the relay stops.
//!
//! Otherwise (a background run, or stdin redirected) a stdout or stderr that
//! is the user's terminal reaches the command as a pipe, copied to the
//! terminal by a [`PipeRelay`]: the terminal descriptors are opened read-write,
//! so passing one would let the command read keystrokes typed at the shell
//! and change the terminal's modes. That copy is sanitised (`sanitise.rs`):
//! the terminal is not the command's to drive.
//!
//! The user's terminal is raw, so Ctrl-C reaches pvisor as a byte, not a
//! signal: it is passed on (the sandbox's terminal turns it into `SIGINT`
//! for its foreground job, as a shell expects) and remembered, so a command
//! that then dies of `SIGINT` is recorded as cancelled by the user.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::termios::{LocalModes, OptionalActions, SpecialCodeIndex, Termios, Winsize};

/// A running relay between the user's terminal and the sandbox's.
#[derive(Debug)]
pub(crate) struct Relay {
    saved: Option<Termios>,
    stop: Arc<AtomicBool>,
    /// Set once the user typed the sandbox terminal's interrupt character.
    interrupted: Arc<AtomicBool>,
    input: Option<JoinHandle<()>>,
    output: Option<JoinHandle<()>>,
}

fn poll_readable(fd: BorrowedFd<'_>, timeout_ms: i32) -> bool {
    poll(fd, rustix::event::PollFlags::IN, timeout_ms)
}

/// Waits up to `timeout_ms` for `events` on `fd`; true if they (or a hang-up
/// or error, which the next read or write reports) happened.
pub(super) fn poll(fd: BorrowedFd<'_>, events: rustix::event::PollFlags, timeout_ms: i32) -> bool {
    use rustix::event::{PollFd, PollFlags};
    let mut pfd = [PollFd::new(&fd, events)];
    let timeout = rustix::event::Timespec { tv_sec: 0, tv_nsec: i64::from(timeout_ms) * 1_000_000 };
    let n = rustix::event::poll(&mut pfd, Some(&timeout)).unwrap_or(0);
    n > 0 && pfd[0].revents().intersects(events | PollFlags::HUP | PollFlags::ERR)
}

/// Writes all of `buf`; false once `fd` cannot be written. A non-blocking
/// `fd` (pvisor's own descriptor, shared with a program that set
/// `O_NONBLOCK`) is waited on rather than given up.
fn write_all(fd: BorrowedFd<'_>, mut buf: &[u8]) -> bool {
    while !buf.is_empty() {
        match rustix::io::write(fd, buf) {
            Ok(n) => buf = &buf[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => {
                poll(fd, rustix::event::PollFlags::OUT, 100);
            }
            Err(_) => return false,
        }
    }
    true
}

/// The sandbox terminal's interrupt character, if it generates signals
/// (`ISIG`); the master reads the settings the command's side has set.
fn interrupt_char(master: BorrowedFd<'_>) -> Option<u8> {
    let t = rustix::termios::tcgetattr(master).ok()?;
    if !t.local_modes.contains(LocalModes::ISIG) {
        return None;
    }
    Some(t.special_codes[SpecialCodeIndex::VINTR]).filter(|&c| c != 0)
}

fn window_size(fd: BorrowedFd<'_>) -> Option<(u16, u16)> {
    rustix::termios::tcgetwinsize(fd).ok().map(|ws| (ws.ws_row, ws.ws_col))
}

/// Reads into `buf`, retrying on EINTR; 0 at end of file or on an error.
pub(super) fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> usize {
    loop {
        match rustix::io::read(fd, &mut *buf) {
            Err(rustix::io::Errno::INTR) => continue,
            other => return other.unwrap_or(0),
        }
    }
}

impl Relay {
    /// Starts relaying between the user's stdin and `master`; what the
    /// sandbox's terminal prints goes to `output` (the user's terminal).
    pub(crate) fn start(master: OwnedFd, output: BorrowedFd<'static>) -> Relay {
        let master = Arc::new(master);
        let stdin = rustix::stdio::stdin();
        let saved = rustix::termios::tcgetattr(stdin).ok().inspect(|t| {
            let mut raw = t.clone();
            raw.make_raw();
            let _ = rustix::termios::tcsetattr(stdin, OptionalActions::Now, &raw);
        });
        let stop = Arc::new(AtomicBool::new(false));
        let interrupted = Arc::new(AtomicBool::new(false));
        let input = {
            let (master, stop, interrupted) = (master.clone(), stop.clone(), interrupted.clone());
            std::thread::Builder::new()
                .name("pvisor-tty-in".into())
                .spawn(move || {
                    let mut buf = [0u8; 4096];
                    while !stop.load(Ordering::Relaxed) {
                        if !poll_readable(stdin, 100) {
                            continue;
                        }
                        let n = match rustix::io::read(stdin, &mut buf) {
                            Ok(n) if n > 0 => n,
                            _ => break,
                        };
                        let typed = &buf[..n];
                        if interrupt_char(master.as_fd()).is_some_and(|c| typed.contains(&c)) {
                            interrupted.store(true, Ordering::Relaxed);
                        }
                        if !write_all(master.as_fd(), typed) {
                            break;
                        }
                    }
                })
                .ok()
        };
        let output = {
            let (master, stop) = (master.clone(), stop.clone());
            std::thread::Builder::new()
                .name("pvisor-tty-out".into())
                .spawn(move || {
                    let mut buf = [0u8; 16384];
                    let mut size = window_size(output);
                    loop {
                        let readable = poll_readable(master.as_fd(), 100);
                        let now = window_size(output);
                        if now != size {
                            size = now;
                            if let Some((rows, cols)) = now {
                                let ws = Winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
                                let _ = rustix::termios::tcsetwinsize(&*master, ws);
                            }
                        }
                        if !readable {
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                            continue;
                        }
                        // EIO: every slave descriptor is closed; the sandbox is gone.
                        let n = match rustix::io::read(&*master, &mut buf) {
                            Ok(n) if n > 0 => n,
                            _ => break,
                        };
                        if !write_all(output, &buf[..n]) {
                            break;
                        }
                    }
                })
                .ok()
        };
        Relay { saved, stop, interrupted, input, output }
    }
    /// Whether the user typed the interrupt character since the relay started.
    pub(crate) fn interrupt_typed(&self) -> bool {
        self.interrupted.load(Ordering::Relaxed)
    }

    /// Drains what the sandbox wrote, stops relaying and restores the terminal.
    pub(crate) fn finish(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for handle in [self.output.take(), self.input.take()].into_iter().flatten() {
            let _ = handle.join();
        }
        if let Some(saved) = self.saved.take() {
            let _ = rustix::termios::tcsetattr(rustix::stdio::stdin(), OptionalActions::Drain, &saved);
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Copies what the command writes into a pipe to one of pvisor's own
/// descriptors (the user's terminal, or a file: see `stdio.rs`), until the
/// pipe's last writer closes it.
#[derive(Debug)]
pub(crate) struct PipeRelay {
    copier: Option<JoinHandle<()>>,
    /// Disconnected when the copy ends.
    done: std::sync::mpsc::Receiver<()>,
    /// Bytes taken from the pipe so far: whether the copy still progresses.
    copied: Arc<AtomicU64>,
}

/// How long a cancelled run waits for a destination that takes nothing more.
const STALLED: Duration = Duration::from_secs(1);

/// Copies `from` to `to` until end of file or an unwritable `to`.
fn copy(from: BorrowedFd<'_>, to: BorrowedFd<'_>, copied: &AtomicU64) {
    let mut buf = [0u8; 65536];
    loop {
        let n = read(from, &mut buf);
        // End of file (every writer is gone) or an unwritable descriptor.
        if n == 0 || !write_all(to, &buf[..n]) {
            return;
        }
        copied.fetch_add(n as u64, Ordering::Relaxed);
    }
}

fn copy_sanitised(from: BorrowedFd<'_>, to: BorrowedFd<'_>, copied: &AtomicU64) {
    let mut buf = [0u8; 16384];
    let mut filter = super::sanitise::Sanitiser::default();
    let mut clean = Vec::new();
    loop {
        let n = read(from, &mut buf);
        clean.clear();
        filter.feed(&buf[..n], &mut clean);
        if n == 0 || !write_all(to, &clean) {
            return;
        }
        copied.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Moves `from` (a pipe) to `to` inside the kernel with `splice`, until end
/// of file or an unwritable `to`; true if `to` cannot take a splice (an
/// `O_APPEND` file, say) and the rest is left for [`copy`].
pub(super) fn spliced(from: BorrowedFd<'_>, to: BorrowedFd<'_>, copied: &AtomicU64) -> bool {
    use rustix::io::Errno;
    loop {
        match rustix::pipe::splice(from, None, to, None, 1 << 20, rustix::pipe::SpliceFlags::MOVE) {
            Ok(0) => return false,
            Ok(n) => {
                copied.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => {
                poll(to, rustix::event::PollFlags::OUT, 100);
            }
            Err(Errno::INVAL | Errno::NOSYS) => return true,
            Err(_) => return false,
        }
    }
}

impl PipeRelay {
    /// Starts copying `from` (a pipe's read end) to `to`; `sanitise` when
    /// `to` is a terminal the command does not own (see `sanitise.rs`).
    pub(crate) fn start(from: OwnedFd, to: BorrowedFd<'static>, sanitise: bool) -> PipeRelay {
        let (done_tx, done) = std::sync::mpsc::channel::<()>();
        let copied = Arc::new(AtomicU64::new(0));
        let count = copied.clone();
        let copier = std::thread::Builder::new()
            .name("pvisor-out".into())
            .spawn(move || {
                let _done = done_tx;
                if sanitise {
                    copy_sanitised(from.as_fd(), to, &count);
                } else if spliced(from.as_fd(), to, &count) {
                    copy(from.as_fd(), to, &count);
                }
            })
            .ok();
        PipeRelay { copier, done, copied }
    }

    /// Waits until everything the command wrote has been copied. Once the
    /// run is `cancelled`, only while the destination still takes it: a
    /// FIFO or socket nobody reads must not hold a cancelled run open (the
    /// command writing there itself would have died with its output
    /// unwritten). An abandoned copy ends with pvisor.
    pub(crate) fn finish(&mut self, cancelled: &AtomicBool) {
        let Some(handle) = self.copier.take() else { return };
        let mut progress = (self.copied.load(Ordering::Relaxed), Instant::now());
        let waiting = std::sync::mpsc::RecvTimeoutError::Timeout;
        while self.done.recv_timeout(Duration::from_millis(100)) == Err(waiting) {
            let now = self.copied.load(Ordering::Relaxed);
            if now != progress.0 {
                progress = (now, Instant::now());
            } else if cancelled.load(Ordering::Relaxed) && progress.1.elapsed() >= STALLED {
                return;
            }
        }
        let _ = handle.join();
    }
}
