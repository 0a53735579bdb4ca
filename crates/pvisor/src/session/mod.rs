//! The Session: the lifecycle owner of one Attempt.
//!
//! It prepares the stage, starts the executor, relays cancellation (forward
//! the signal, then SIGKILL after the grace period), and finalizes strictly in
//! DESIGN.md's order. See `lifecycle.rs`.

mod lifecycle;

pub(crate) use lifecycle::Session;
