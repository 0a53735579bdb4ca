//! Commands and byte streams into a running guest, as
//! [`GuestAccess`](crate::capabilities::GuestAccess) hands them out: what to
//! start ([`ExecSpec`]) and the caller's end of a relayed exec
//! ([`ExecChannel`]), which carries agent protocol frames.

use std::io::{self, BufReader};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use pvisor_agent_proto::{read_frame, write_frame, Confinement, Reply, Request, TerminalSize};

/// A command to start inside a running VM (see [`Request::Exec`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecSpec {
    /// Chosen by the caller, unique for the guest's lifetime (it survives
    /// suspend and resume); the Attempt's own command is id 1.
    pub id: u32,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub root: Option<PathBuf>,
    pub output: Option<PathBuf>,
    /// A terminal of this size instead of pipes (its output is `Stdout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal: Option<TerminalSize>,
    /// What the process is confined to (see [`Confinement`]); `None`
    /// runs it as the agent's own root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confinement: Option<Box<Confinement>>,
}

/// The caller's end of a relayed exec.
#[derive(Debug)]
pub struct ExecChannel {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    id: u32,
}

impl ExecChannel {
    /// The channel of exec `id` over `stream`, a connection that already
    /// carries the exec's frames (the request to start or attach was sent).
    pub fn new(stream: UnixStream, id: u32) -> io::Result<Self> {
        let writer = stream.try_clone()?;
        Ok(Self { reader: BufReader::new(stream), writer, id })
    }

    /// The next reply of this exec; `None` when the supervisor went away.
    pub fn next_reply(&mut self) -> io::Result<Option<(Reply, Vec<u8>)>> {
        read_frame(&mut self.reader)
    }

    /// Bounds how long [`Self::next_reply`] waits for a frame to begin:
    /// past it the read fails with `WouldBlock` (nothing of a frame read,
    /// so the channel goes on). `None` waits for good.
    pub fn set_read_timeout(&self, timeout: Option<std::time::Duration>) -> io::Result<()> {
        self.reader.get_ref().set_read_timeout(timeout)
    }

    pub fn signal(&mut self, signal: i32) -> io::Result<()> {
        write_frame(&mut self.writer, &Request::Signal { id: self.id, signal }, &[])
    }

    pub fn close_stdin(&mut self) -> io::Result<()> {
        write_frame(&mut self.writer, &Request::CloseStdin { id: self.id }, &[])
    }

    /// A handle that can signal the exec while another thread reads it.
    pub fn signaller(&self) -> io::Result<ExecSignaller> {
        Ok(ExecSignaller { writer: self.writer.try_clone()?, id: self.id })
    }
}

/// Signals a relayed exec, or feeds its stdin, from another thread.
#[derive(Debug)]
pub struct ExecSignaller {
    writer: UnixStream,
    id: u32,
}

impl ExecSignaller {
    pub fn signal(&mut self, signal: i32) -> io::Result<()> {
        write_frame(&mut self.writer, &Request::Signal { id: self.id, signal }, &[])
    }

    /// Writes to the exec's stdin (small writes: the agent queues a few
    /// chunks per exec and drops stdin if a caller floods it).
    pub fn stdin(&mut self, bytes: &[u8]) -> io::Result<()> {
        write_frame(&mut self.writer, &Request::Stdin { id: self.id }, bytes)
    }

    /// Ends the exec's stdin: the process reads EOF.
    pub fn close_stdin(&mut self) -> io::Result<()> {
        write_frame(&mut self.writer, &Request::CloseStdin { id: self.id }, &[])
    }

    /// Sets the window size of the exec's terminal.
    pub fn resize(&mut self, size: TerminalSize) -> io::Result<()> {
        write_frame(&mut self.writer, &Request::Resize { id: self.id, size }, &[])
    }

    /// Ends the channel in both directions: its reader sees the end. The
    /// exec runs on (a later attach follows it again).
    pub fn hang_up(&self) {
        let _ = self.writer.shutdown(std::net::Shutdown::Both);
    }
}
