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

mod delta;
mod framing;
mod messages;
mod paths;

pub use delta::{DeltaEntry, DeltaManifest, DeltaNode, DELTA_FORMAT, DELTA_LAYER, DELTA_MANIFEST};
pub use framing::{read_frame, write_frame, MAX_HEADER, MAX_PAYLOAD};
pub use messages::{
    Capabilities, Confinement, EntryKind, FileOp, FileStat, Interface, Reply, Request, Rlimit, Seccomp,
    Share, TerminalSize, MAX_LISTING, RLIMITS,
};
pub use paths::resolve_in_root;

/// The protocol version. A host refuses an agent that answers `Hello` with another.
pub const VERSION: u32 = 1;

/// The virtio-serial port name both sides agree on.
pub const PORT_NAME: &str = "org.pvisor.agent.0";

/// Guest disk serials: the read-only base image of the workspace, the
/// delta of what changed since it was built ([`DeltaManifest`]), and the
/// writable upper layer. The host attaches them in this order.
pub const LOWER_SERIAL: &str = "pvisor-lower";
pub const DELTA_SERIAL: &str = "pvisor-delta";
pub const UPPER_SERIAL: &str = "pvisor-upper";

/// Host-initiated stream ids ([`Request::NetConnect`]) have this bit set;
/// guest-initiated ones (the proxy port) never do.
pub const HOST_STREAM: u32 = 1 << 31;
/// Host-to-guest data chunks (stdin, proxy data) in flight per exec or stream.
pub const CREDITS: usize = 16;
