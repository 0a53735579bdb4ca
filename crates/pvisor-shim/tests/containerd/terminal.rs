//! `ctr run -t` and `ctr task exec -t`: processes on a terminal of their
//! own in the guest. ctr insists that its stdin is a terminal, so each runs
//! on a pseudo-terminal this test opens, and is resized the way a terminal
//! window is: TIOCSWINSZ on the master, SIGWINCH to ctr, ResizePty to the
//! shim, TIOCSWINSZ in the guest.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};
use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;

use super::harness::{text, Containerd, NAMESPACE};

/// ctr on a pseudo-terminal, its output collected.
pub struct Tty {
    master: File,
    child: Child,
    output: Arc<Mutex<Vec<u8>>>,
}

fn winsize(rows: u16, cols: u16) -> Winsize {
    Winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 }
}

impl Tty {
    /// Runs `ctr ARGS` against `c` with a `rows` x `cols` terminal as its
    /// controlling terminal and stdio.
    pub fn spawn(c: &Containerd, args: &[&str], rows: u16, cols: u16) -> Tty {
        let master = rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).expect("openpt");
        rustix::pty::grantpt(&master).expect("grantpt");
        rustix::pty::unlockpt(&master).expect("unlockpt");
        let name = rustix::pty::ptsname(&master, Vec::new()).expect("ptsname");
        let slave: OwnedFd = rustix::fs::open(name.as_c_str(), OFlags::RDWR | OFlags::NOCTTY, Mode::empty())
            .expect("the slave");
        rustix::termios::tcsetwinsize(&master, winsize(rows, cols)).expect("TIOCSWINSZ");
        let slave = File::from(slave);
        let mut command = Command::new("ctr");
        command
            .args(["-a", &c.sock, "-n", NAMESPACE])
            .args(args)
            .stdin(slave.try_clone().expect("dup"))
            .stdout(slave.try_clone().expect("dup"))
            .stderr(slave);
        // SAFETY: setsid and the ioctl are bare syscalls, safe between fork and exec.
        unsafe {
            command.pre_exec(|| {
                rustix::process::setsid()?;
                rustix::process::ioctl_tiocsctty(rustix::stdio::stdin())?;
                Ok(())
            });
        }
        let child = command.spawn().expect("ctr runs");
        let master = File::from(master);
        let output = Arc::new(Mutex::new(Vec::new()));
        let (mut reader, collected) = (master.try_clone().expect("dup"), output.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // EIO once ctr, the last holder of the slave, is gone.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                collected.lock().expect("the output lock").extend_from_slice(&buf[..n]);
            }
        });
        Tty { master, child, output }
    }

    pub fn output(&self) -> String {
        text(&self.output.lock().expect("the output lock"))
    }

    /// Resizes the terminal, as a window manager does.
    pub fn resize(&self, rows: u16, cols: u16) {
        rustix::termios::tcsetwinsize(&self.master, winsize(rows, cols)).expect("TIOCSWINSZ");
    }

    /// Types `line` and Enter.
    pub fn type_line(&mut self, line: &str) {
        self.master.write_all(format!("{line}\r").as_bytes()).expect("write to the terminal");
    }

    /// Types `poke` every half second until the output after `from` has a
    /// line `line`; returns where that output ends.
    pub fn poke_until(&mut self, poke: &str, from: usize, line: &str) -> usize {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = self.output();
            if out.get(from..).unwrap_or_default().lines().any(|l| l.trim_end_matches('\r') == line) {
                return out.len();
            }
            assert!(Instant::now() < deadline, "no line {line:?} on the terminal: {out:?}");
            self.type_line(poke);
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Waits for ctr's exit code.
    pub fn wait(mut self) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for ctr") {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("ctr did not exit: {:?}", self.output());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A shell that names its terminal, then prints its size for each line it
/// reads, and exits 4 at `q`.
pub const SIZES: &str = "tty; while read line; do [ \"$line\" = q ] && exit 4; stty size; done";

/// Drives a [`SIZES`] shell: its terminal, the size ctr sent first, a
/// resize, and the exit code.
pub fn check_sizes(mut tty: Tty) {
    let at = tty.poke_until("x", 0, "30 90");
    let named = tty.output();
    let pts = named.lines().map(|l| l.trim_end_matches('\r')).find(|l| l.starts_with("/dev/"));
    assert!(
        pts.is_some_and(|p| p.strip_prefix("/dev/pts/").is_some_and(|n| n.parse::<u32>().is_ok())),
        "tty names a /dev/pts/N of the container: {named:?}"
    );
    tty.resize(40, 120);
    tty.poke_until("x", at, "40 120");
    tty.type_line("q");
    assert_eq!(tty.wait(), Some(4), "the shell's exit code");
}
