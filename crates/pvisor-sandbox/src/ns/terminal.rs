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
//! and change the terminal's modes.
//!
//! The user's terminal is raw, so Ctrl-C reaches pvisor as a byte, not a
//! signal: it is passed on (the sandbox's terminal turns it into `SIGINT`
//! for its foreground job, as a shell expects) and remembered, so a command
//! that then dies of `SIGINT` is recorded as cancelled by the user.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A running relay between the user's terminal and the sandbox's.
#[derive(Debug)]
pub(crate) struct Relay {
    saved: Option<libc::termios>,
    stop: Arc<AtomicBool>,
    /// Set once the user typed the sandbox terminal's interrupt character.
    interrupted: Arc<AtomicBool>,
    input: Option<JoinHandle<()>>,
    output: Option<JoinHandle<()>>,
}

fn poll_readable(fd: RawFd, timeout_ms: i32) -> bool {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    n > 0 && pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
}

fn write_all(fd: RawFd, mut buf: &[u8]) -> bool {
    while !buf.is_empty() {
        // SAFETY: writing from a valid slice.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        buf = &buf[n as usize..];
    }
    true
}

/// The sandbox terminal's interrupt character, if it generates signals
/// (`ISIG`); the master reads the settings the command's side has set.
fn interrupt_char(master: RawFd) -> Option<u8> {
    // SAFETY: zeroed termios is a valid out-parameter.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: tcgetattr fills `t` from a valid descriptor.
    if unsafe { libc::tcgetattr(master, &mut t) } != 0 || t.c_lflag & libc::ISIG == 0 {
        return None;
    }
    Some(t.c_cc[libc::VINTR]).filter(|&c| c != 0)
}

fn window_size(fd: RawFd) -> Option<(u16, u16)> {
    // SAFETY: zeroed winsize is a valid out-parameter.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ fills `ws`.
    (unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0).then_some((ws.ws_row, ws.ws_col))
}

impl Relay {
    /// Starts relaying between the user's stdin and `master`; what the
    /// sandbox's terminal prints goes to `output` (the user's terminal).
    pub(crate) fn start(master: OwnedFd, output: RawFd) -> Relay {
        let master = Arc::new(master);
        // SAFETY: zeroed termios is a valid out-parameter; cfmakeraw edits a copy.
        let saved = unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut t) == 0 {
                let mut raw = t;
                libc::cfmakeraw(&mut raw);
                libc::tcsetattr(0, libc::TCSANOW, &raw);
                Some(t)
            } else {
                None
            }
        };
        let stop = Arc::new(AtomicBool::new(false));
        let interrupted = Arc::new(AtomicBool::new(false));
        let input = {
            let (master, stop, interrupted) = (master.clone(), stop.clone(), interrupted.clone());
            std::thread::Builder::new()
                .name("pvisor-tty-in".into())
                .spawn(move || {
                    let mut buf = [0u8; 4096];
                    while !stop.load(Ordering::Relaxed) {
                        if !poll_readable(0, 100) {
                            continue;
                        }
                        // SAFETY: reading into a local buffer.
                        let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
                        if n <= 0 {
                            break;
                        }
                        let typed = &buf[..n as usize];
                        if interrupt_char(master.as_raw_fd()).is_some_and(|c| typed.contains(&c)) {
                            interrupted.store(true, Ordering::Relaxed);
                        }
                        if !write_all(master.as_raw_fd(), typed) {
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
                        let readable = poll_readable(master.as_raw_fd(), 100);
                        let now = window_size(output);
                        if now != size {
                            size = now;
                            if let Some((rows, cols)) = now {
                                let ws =
                                    libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
                                // SAFETY: TIOCSWINSZ reads `ws`.
                                unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
                            }
                        }
                        if !readable {
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                            continue;
                        }
                        // SAFETY: reading into a local buffer.
                        let n = unsafe { libc::read(master.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                        // EIO: every slave descriptor is closed; the sandbox is gone.
                        if n <= 0 || !write_all(output, &buf[..n as usize]) {
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
            // SAFETY: restoring the settings read in `start`.
            unsafe { libc::tcsetattr(0, libc::TCSADRAIN, &saved) };
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Copies what the command writes into a pipe to one of pvisor's own
/// descriptors (the user's terminal), until the pipe's last writer closes it.
#[derive(Debug)]
pub(crate) struct PipeRelay {
    copier: Option<JoinHandle<()>>,
}

impl PipeRelay {
    /// Starts copying `from` (a pipe's read end) to `to`.
    pub(crate) fn start(from: OwnedFd, to: RawFd) -> PipeRelay {
        let copier = std::thread::Builder::new()
            .name("pvisor-out".into())
            .spawn(move || {
                let mut buf = [0u8; 16384];
                loop {
                    // SAFETY: reading into a local buffer from an owned descriptor.
                    let n = unsafe { libc::read(from.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                    if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    // End of file (every writer is gone) or an unwritable terminal.
                    if n <= 0 || !write_all(to, &buf[..n as usize]) {
                        break;
                    }
                }
            })
            .ok();
        PipeRelay { copier }
    }

    /// Waits until everything the command wrote has been copied.
    pub(crate) fn finish(&mut self) {
        if let Some(handle) = self.copier.take() {
            let _ = handle.join();
        }
    }
}
