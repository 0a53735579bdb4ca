//! A recording fake backend for unit tests of the runtime: admission, the
//! Session, the Job service, recovery, kill, gc and the action API, without
//! namespaces, overlays or VMs.
//!
//! [`FakeExecutor::start`] plays the next [`Script`]: it writes the
//! script's files into the stage's upper directory (as an overlay would
//! when a command writes), then ends the way the script says — at once, or
//! only when signalled. Every start and every signal is recorded, so a test
//! asserts what the runtime asked of the backend, not only what it wrote.
//! [`FakeBackends`] serves it under the backend name `fake`, optionally
//! with a [`FakeCheckpointer`] for the execution-checkpoint paths: one that
//! refuses every request ([`FakeCheckpointer::default`]), or one that works
//! ([`FakeCheckpointer::working`]): it writes real, verifiable execution
//! checkpoints, suspends a running fake sandbox (its Attempt ends
//! `Suspended`), restores on the same fake executor (a resume or an
//! execution fork is a new Attempt that plays the next script), and serves
//! a [`FakeGuest`]: guest execs with scripted output and exit codes, and
//! agent calls (file operations, reads, writes, signals, status) answered
//! from the host paths the requests name, as a guest would see them.
//!
//! What only real processes can show (isolation, overlay semantics, QEMU)
//! stays in the end-to-end suite.

mod backends;
mod checkpointer;
mod executor;
mod guest;

use std::sync::Mutex;

pub use backends::{FakeBackends, FakeVmBackends};
pub use checkpointer::FakeCheckpointer;
pub use executor::{End, FakeExecutor, Journal, Script};
pub use guest::{FakeGuest, GuestEnd, GuestRun};

/// The guard of `m`, poisoned or not.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
