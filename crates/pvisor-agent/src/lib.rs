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

pub mod files;

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

/// Host-initiated stream ids ([`Request::NetConnect`]) have this bit set;
/// guest-initiated ones (the proxy port) never do.
pub const HOST_STREAM: u32 = 1 << 31;
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
    /// Connects `stream` to guest `127.0.0.1:port` (a host-initiated stream,
    /// for a service in the guest); answers `Done` or `Error`. Its bytes then
    /// travel as `NetData`/`NetClose` both ways, like proxy streams.
    NetConnect {
        stream: u32,
        port: u16,
    },
    /// One guest `NetData` chunk of `stream` was written to its host end:
    /// the guest may send another (flow control, as `Reply::NetAck` the
    /// other way; at most [`CREDITS`] chunks in flight per stream).
    NetAck {
        stream: u32,
    },
    /// Starts a process in its own session and process group. With `root`
    /// it runs chrooted there (the agent first mounts `/proc`, `/dev` and
    /// `/tmp` inside it); `cwd` is then relative to `root`. With `output`,
    /// stdout and stderr are appended to that guest file instead of being
    /// streamed (a background command whose log outlives its host).
    Exec {
        id: u32,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: PathBuf,
        #[serde(default)]
        root: Option<PathBuf>,
        #[serde(default)]
        output: Option<PathBuf>,
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
    /// Replies with [`Reply::File`] carrying the contents from `offset`, at
    /// most `len` bytes and never more than [`MAX_PAYLOAD`] (callers page).
    ReadFile {
        path: PathBuf,
        #[serde(default)]
        offset: u64,
        #[serde(default)]
        len: Option<u64>,
    },
    /// Payload: the new contents (appended with `append`, for paged uploads).
    WriteFile {
        path: PathBuf,
        mode: u32,
        #[serde(default)]
        append: bool,
    },
    /// File operations for the sandbox file API. Paths are resolved beneath
    /// `root` ([`resolve_in_root`]): `..` and absolute symlinks stop at it.
    /// Each answers [`Reply::Done`], [`Reply::Stat`] or [`Reply::Listing`].
    FileOp {
        root: PathBuf,
        op: FileOp,
    },
    /// `sync`, then freeze the writable filesystems. Writers block until `Thaw`.
    Quiesce,
    Thaw,
    /// Sent after a restore or fork. Payload: fresh entropy from the host.
    Restored {
        clock_unix_ns: i64,
    },
    /// Answers [`Reply::Status`] for exec `id`.
    Status {
        id: u32,
    },
    /// Resends `Exited` for `id` if it has finished (it may have been sent to
    /// a host that no longer exists), then answers `Done`.
    Poll {
        id: u32,
    },
    /// Streams the overlay's upper layer as `Entry`/`Data` frames, then `ExportDone`.
    Export,
}

/// A file operation inside a sandbox root (see [`Request::FileOp`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum FileOp {
    /// Follows a final symlink.
    Stat {
        path: PathBuf,
    },
    /// Entries of a directory; with `depth` > 1, of its subdirectories too
    /// (at most [`MAX_LISTING`] entries). Names are relative to `path`.
    List {
        path: PathBuf,
        depth: u32,
    },
    /// Creates the directory and its parents, then sets `mode` on it.
    Mkdir {
        path: PathBuf,
        mode: u32,
    },
    /// Removes a file or symlink; a directory only with `recursive`.
    Remove {
        path: PathBuf,
        recursive: bool,
    },
    Rename {
        from: PathBuf,
        to: PathBuf,
    },
    /// `mode`, then (when given) owner and group.
    Chmod {
        path: PathBuf,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
    },
    /// Creates the parent directories of a file about to be written; both
    /// this and `Resolve` answer [`Reply::Resolved`] with the guest path.
    MkParents {
        path: PathBuf,
    },
    Resolve {
        path: PathBuf,
    },
}

/// Metadata of one file, as the sandbox file API reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileStat {
    /// The path relative to the listed directory (a `List`), or as asked (`Stat`).
    pub path: PathBuf,
    pub kind: EntryKind,
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

/// Most entries one `List` returns.
pub const MAX_LISTING: usize = 100_000;

/// Resolves `path` beneath `root` like `openat2(RESOLVE_IN_ROOT)`: `..` never
/// climbs above `root`, and absolute symlink targets restart at `root`. The
/// final component is followed only with `follow`. Returns the guest path.
pub fn resolve_in_root(root: &std::path::Path, path: &std::path::Path, follow: bool) -> io::Result<PathBuf> {
    use std::path::Component;
    let mut pending: Vec<std::ffi::OsString> = path
        .components()
        .rev()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    let mut resolved: Vec<std::ffi::OsString> = Vec::new();
    let mut hops = 0;
    while let Some(part) = pending.pop() {
        if part == ".." {
            resolved.pop();
            continue;
        }
        let mut candidate = root.to_path_buf();
        candidate.extend(&resolved);
        candidate.push(&part);
        let last = pending.is_empty();
        match std::fs::symlink_metadata(&candidate) {
            Ok(meta) if meta.file_type().is_symlink() && (follow || !last) => {
                hops += 1;
                if hops > 40 {
                    return Err(io::Error::from_raw_os_error(libc::ELOOP));
                }
                let target = std::fs::read_link(&candidate)?;
                if target.is_absolute() {
                    resolved.clear();
                }
                pending.extend(target.components().rev().filter_map(|c| match c {
                    Component::Normal(n) => Some(n.to_os_string()),
                    Component::ParentDir => Some("..".into()),
                    _ => None,
                }));
            }
            _ => resolved.push(part),
        }
    }
    let mut out = root.to_path_buf();
    out.extend(&resolved);
    Ok(out)
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
    Stat {
        stat: FileStat,
    },
    /// The guest path a `MkParents` or `Resolve` resolved to.
    Resolved {
        path: PathBuf,
    },
    /// `running` while its process group leader lives; `code`/`signal` once
    /// it exited; neither for an id this guest never ran.
    Status {
        id: u32,
        running: bool,
        code: Option<i32>,
        signal: Option<i32>,
    },
    Listing {
        entries: Vec<FileStat>,
        truncated: bool,
    },
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
    // The reader would reject it and lose its place in the stream: refuse here.
    if header.len() > MAX_HEADER as usize || payload.len() > MAX_PAYLOAD as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a {}-byte header or {}-byte payload exceeds the protocol limits",
                header.len(),
                payload.len()
            ),
        ));
    }
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
