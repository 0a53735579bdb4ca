//! The guest agent's library half: the file operations it serves, in plain
//! std so they are unit-tested on the host. The protocol itself (messages,
//! framing, path resolution) is `pvisor-agent-proto`, shared with the host;
//! the binary (`src/bin/pvisor-agent/`) is the guest's PID 1.

// The lints of clippy.toml (durable record writes, no prints) are for the
// library's own code: its unit tests write fixtures and may say what they do.
#![cfg_attr(test, allow(clippy::disallowed_methods, clippy::disallowed_macros))]

pub mod files;
