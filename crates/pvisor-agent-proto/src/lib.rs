//! AgentCtl: the versioned protocol between the `vm` executor (host) and
//! `pvisor-agent`, the guest's PID 1.
//!
//! The transport is one virtio-serial port named [`PORT_NAME`]. Each frame is
//! `u32 header length | u32 payload length | JSON header | raw payload`, both
//! lengths big-endian. A header may also carry a request id beside the
//! message's fields ([`write_tagged`]). Headers are [`Request`]s (host → guest) or [`Reply`]s
//! (guest → host); bytes (stdin, output, file contents) travel as payload, so
//! nothing is base64-encoded and paths that are not UTF-8 survive.
//!
//! The guest writes replies in order on one thread, so for one exec every
//! output frame precedes its `Exited`. A frame is never split across a
//! checkpoint: QEMU migrates the virtqueues, and the host drains its socket
//! after `stop` (see the vm executor).

mod delta;
mod framing;
mod messages;
mod paths;
pub mod timing;

pub use delta::{
    DeltaEntry, DeltaManifest, DeltaManifestError, DeltaNode, DELTA_FORMAT, DELTA_LAYER, DELTA_MANIFEST,
};
pub use framing::{
    read_frame, read_tagged, write_frame, write_tagged, ANSWERS, MAX_HEADER, MAX_PAYLOAD, REQUEST_ID,
};
pub use messages::{
    Capabilities, Confinement, EntryKind, FileOp, FileStat, GuestContainer, Interface, Reply, Request,
    Rlimit, Seccomp, Share, TerminalSize, MAX_LISTING, RLIMITS,
};
pub use paths::resolve_in_root;

/// The protocol version. A host refuses an agent that answers `Hello` with another.
///
/// Version 2: every request the host waits on carries an id
/// ([`REQUEST_ID`]) and each reply to it names that id ([`ANSWERS`]), so
/// a reply left over from an earlier call, or one the guest sent unasked,
/// is never taken for a later call's answer; `Hello` stays untagged, so an
/// agent of another version can still say which it speaks. A file's holes
/// travel as [`Reply::Hole`] instead of zeros.
pub const VERSION: u32 = 2;

/// The virtio-serial port name both sides agree on.
pub const PORT_NAME: &str = "org.pvisor.agent.0";

/// Guest disk serials: the read-only base image of the workspace, the
/// delta of what changed since it was built ([`DeltaManifest`]), and the
/// writable upper layer. The host attaches them in this order.
pub const LOWER_SERIAL: &str = "pvisor-lower";
pub const DELTA_SERIAL: &str = "pvisor-delta";
pub const UPPER_SERIAL: &str = "pvisor-upper";
/// A userland image's base and delta disks (`Setup { userland: true }`),
/// attached after the workspace's three: the same pair, of a root filesystem.
pub const IMAGE_LOWER_SERIAL: &str = "pvisor-image-lower";
pub const IMAGE_DELTA_SERIAL: &str = "pvisor-image-delta";
/// Where the agent assembles a userland image's root (the image read-only,
/// a tmpfs above it, the workspace at its own path inside); the command is
/// chrooted there (`Exec { root }`).
pub const USERLAND_ROOT: &str = "/run/pvisor/root";

/// Host-initiated stream ids ([`Request::NetConnect`]) have this bit set;
/// guest-initiated ones (the proxy port) never do.
pub const HOST_STREAM: u32 = 1 << 31;
/// Host-to-guest data chunks (stdin, proxy data) in flight per exec or stream.
pub const CREDITS: usize = 16;
