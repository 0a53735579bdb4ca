//! Pseudo-terminals for execs that ask for one: the pair is allocated from
//! the devpts instance the process will see (a sandbox root has its own,
//! `newinstance`, mounted by the exec module), so `tty` inside it names a
//! `/dev/pts/N` that exists there. The slave becomes the process's stdio
//! and controlling terminal; the master is what the agent reads output
//! from, writes stdin to, and resizes.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use pvisor_agent_proto::TerminalSize;
use rustix::fs::{Mode, OFlags};
use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;

/// A pseudo-terminal pair, the master's window size already set.
pub(crate) struct Pty {
    pub(crate) master: OwnedFd,
    pub(crate) slave: OwnedFd,
}

/// Opens a pair in the devpts at `root`'s `/dev/pts` (the guest's own
/// without `root`).
pub(crate) fn open(root: Option<&Path>, size: TerminalSize) -> io::Result<Pty> {
    let ptmx = root.unwrap_or(Path::new("/")).join("dev/pts/ptmx");
    let master = rustix::fs::open(&ptmx, OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("{}: {e}", ptmx.display())))?;
    pair(master, size)
}

/// The pair of `master`, an open `ptmx` of the instance the process sees.
pub(crate) fn pair(master: OwnedFd, size: TerminalSize) -> io::Result<Pty> {
    rustix::pty::unlockpt(&master)?;
    // The peer straight from the master: no path lookup, so no chance of
    // opening another instance's slave of the same number.
    let slave = rustix::pty::ioctl_tiocgptpeer(&master, OpenptFlags::RDWR | OpenptFlags::NOCTTY)?;
    resize(&master, size)?;
    Ok(Pty { master, slave })
}

/// Sets the window size; the kernel sends SIGWINCH to the terminal's
/// foreground process group.
pub(crate) fn resize(master: impl AsFd, size: TerminalSize) -> io::Result<()> {
    let winsize = Winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 };
    Ok(rustix::termios::tcsetwinsize(master, winsize)?)
}

/// Another handle on the same terminal end, as a `File` for std's I/O.
pub(crate) fn dup(fd: &OwnedFd) -> io::Result<File> {
    Ok(File::from(fd.try_clone()?))
}
