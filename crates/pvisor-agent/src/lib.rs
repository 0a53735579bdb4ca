//! AgentCtl: the versioned protocol between the `vm` executor (host) and
//! `pvisor-agent`, the guest's PID 1.
//!
//! The transport is one virtio-serial port named [`PORT_NAME`]. Each frame is
//! `u32 header length | u32 payload length | JSON header | raw payload`, both
//! lengths big-endian. Headers are [`Request`]s (host → guest) or [`Reply`]s
//! (guest → host); bytes (stdin, output, file contents) travel as payload, so
//! nothing is base64-encoded and paths that are not UTF-8 survive.
//!
//! The guest writes replies in order on one thread, so for one exec every
//! output frame precedes its `Exited`. A frame is never split across a
//! checkpoint: QEMU migrates the virtqueues, and the host drains its socket
//! after `stop` (see the vm executor).

use std::io::{self, Read, Write};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The protocol version. A host refuses an agent that answers `Hello` with another.
pub const VERSION: u32 = 1;

/// The virtio-serial port name both sides agree on.
pub const PORT_NAME: &str = "org.pvisor.agent.0";

/// Guest disk serials: the read-only workspace image and the writable upper layer.
pub const LOWER_SERIAL: &str = "pvisor-lower";
pub const UPPER_SERIAL: &str = "pvisor-upper";

/// Largest header and payload accepted; a larger length is a corrupt stream.
pub const MAX_HEADER: u32 = 1 << 20;
pub const MAX_PAYLOAD: u32 = 16 << 20;

/// Host-to-guest data chunks (stdin, proxy data) in flight per exec or stream.
pub const CREDITS: usize = 16;

/// Host → guest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Hello {
        version: u32,
    },
    /// Mounts the workspace overlay at `workspace` (the host path), sets the
    /// clock, and with `proxy_port` listens on guest `127.0.0.1:port`, each
    /// connection becoming a stream to pvisor's proxy (the guest has no NIC).
    Setup {
        workspace: PathBuf,
        hostname: String,
        clock_unix_ns: i64,
        proxy_port: Option<u16>,
    },
    /// Payload: bytes from the proxy for guest connection `stream`.
    NetData {
        stream: u32,
    },
    /// The proxy closed `stream`.
    NetClose {
        stream: u32,
    },
    /// Starts a process in its own session and process group.
    Exec {
        id: u32,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: PathBuf,
    },
    /// Payload: bytes for the process's stdin.
    Stdin {
        id: u32,
    },
    CloseStdin {
        id: u32,
    },
    /// Sends `signal` to the process group of exec `id`.
    Signal {
        id: u32,
        signal: i32,
    },
    /// Replies with [`Reply::File`] carrying the contents (at most [`MAX_PAYLOAD`]).
    ReadFile {
        path: PathBuf,
    },
    /// Payload: the new contents.
    WriteFile {
        path: PathBuf,
        mode: u32,
    },
    /// `sync`, then freeze the writable filesystems. Writers block until `Thaw`.
    Quiesce,
    Thaw,
    /// Sent after a restore or fork. Payload: fresh entropy from the host.
    Restored {
        clock_unix_ns: i64,
    },
    /// Resends `Exited` for `id` if it has finished (it may have been sent to
    /// a host that no longer exists), then answers `Done`.
    Poll {
        id: u32,
    },
    /// Streams the overlay's upper layer as `Entry`/`Data` frames, then `ExportDone`.
    Export,
}

/// What a staged entry in the upper layer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    Dir,
    File,
    Symlink,
    /// A 0/0 character device: the lower path was deleted.
    Whiteout,
    Fifo,
}

/// Guest → host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    Hello {
        version: u32,
        agent: String,
        uptime_ms: u64,
    },
    Ready,
    Started {
        id: u32,
        pid: i32,
    },
    ExecFailed {
        id: u32,
        errno: i32,
        message: String,
    },
    /// Payload: output bytes.
    Stdout {
        id: u32,
    },
    Stderr {
        id: u32,
    },
    /// Sent after all output of `id` (or after a short grace if a background
    /// child keeps the pipes open).
    Exited {
        id: u32,
        code: Option<i32>,
        signal: Option<i32>,
    },
    /// Payload: file contents.
    File {
        path: PathBuf,
    },
    Done {
        op: String,
    },
    Quiesced {
        frozen: Vec<PathBuf>,
    },
    /// How far the clock was stepped and the entropy the kernel now credits.
    Restored {
        clock_step_ns: i64,
        entropy_avail: u32,
    },
    /// One upper-layer entry; a file's bytes follow as `Data` frames totalling `size`.
    Entry {
        path: Vec<u8>,
        kind: EntryKind,
        mode: u32,
        mtime_ns: i64,
        size: u64,
        target: Option<Vec<u8>>,
        opaque: bool,
    },
    Data,
    ExportDone {
        entries: u64,
        bytes: u64,
    },
    /// A guest process connected to the proxy port; the host opens `stream` to its proxy.
    NetOpen {
        stream: u32,
    },
    /// Payload: bytes the guest process sent on `stream`.
    NetData {
        stream: u32,
    },
    /// The guest process closed `stream`.
    NetClose {
        stream: u32,
    },
    /// One `Stdin` chunk of exec `id` was written to the process: the host
    /// may send another (flow control; the host keeps few chunks in flight).
    StdinAck {
        id: u32,
    },
    /// One `NetData` chunk of `stream` reached the guest process.
    NetAck {
        stream: u32,
    },
    Error {
        op: String,
        message: String,
    },
}

/// Writes one frame.
pub fn write_frame<T: Serialize>(w: &mut impl Write, header: &T, payload: &[u8]) -> io::Result<()> {
    let header = serde_json::to_vec(header).map_err(io::Error::other)?;
    let mut buf = Vec::with_capacity(8 + header.len() + payload.len());
    buf.extend_from_slice(&(header.len() as u32).to_be_bytes());
    buf.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    buf.extend_from_slice(&header);
    buf.extend_from_slice(payload);
    w.write_all(&buf)?;
    w.flush()
}

/// Reads one frame. `Ok(None)` is a clean end of stream before a frame began.
pub fn read_frame<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> io::Result<Option<(T, Vec<u8>)>> {
    let mut lens = [0u8; 8];
    let mut got = 0;
    while got < lens.len() {
        match r.read(&mut lens[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "stream ended inside a frame")),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let [h0, h1, h2, h3, p0, p1, p2, p3] = lens;
    let (hlen, plen) = (u32::from_be_bytes([h0, h1, h2, h3]), u32::from_be_bytes([p0, p1, p2, p3]));
    if hlen > MAX_HEADER || plen > MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame lengths {hlen}/{plen} exceed the protocol limits"),
        ));
    }
    let mut header = vec![0; hlen as usize];
    r.read_exact(&mut header)?;
    let mut payload = vec![0; plen as usize];
    r.read_exact(&mut payload)?;
    let header = serde_json::from_slice(&header)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("bad frame header: {e}")))?;
    Ok(Some((header, payload)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_with_binary_payload_and_paths() {
        let mut buf = Vec::new();
        let entry = Reply::Entry {
            path: b"a\nb\xff".to_vec(),
            kind: EntryKind::File,
            mode: 0o644,
            mtime_ns: -1,
            size: 3,
            target: None,
            opaque: false,
        };
        write_frame(&mut buf, &entry, &[0, 1, 2]).unwrap();
        write_frame(&mut buf, &Reply::Data, b"").unwrap();
        let mut r = &buf[..];
        let (h, p): (Reply, _) = read_frame(&mut r).unwrap().unwrap();
        assert_eq!((h, p), (entry, vec![0, 1, 2]));
        let (h, _): (Reply, _) = read_frame(&mut r).unwrap().unwrap();
        assert_eq!(h, Reply::Data);
        assert!(read_frame::<Reply>(&mut r).unwrap().is_none());
    }

    #[test]
    fn corrupt_lengths_and_truncation_are_errors() {
        let mut r = &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0][..];
        assert_eq!(read_frame::<Reply>(&mut r).unwrap_err().kind(), io::ErrorKind::InvalidData);
        let mut r = &[0, 0][..];
        assert_eq!(read_frame::<Reply>(&mut r).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        let mut buf = Vec::new();
        write_frame(&mut buf, &serde_json::json!({"type": "nope"}), b"").unwrap();
        assert!(read_frame::<Request>(&mut &buf[..]).is_err());
    }
}
