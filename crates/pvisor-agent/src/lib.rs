//! The guest agent's library half: the file operations it serves, in plain
//! std so they are unit-tested on the host. The protocol itself (messages,
//! framing, path resolution) is `pvisor-agent-proto`, shared with the host;
//! the binary (`src/bin/pvisor-agent/`) is the guest's PID 1.

pub mod files;
