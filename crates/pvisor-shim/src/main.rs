//! `containerd-shim-pvisor-v1`: the containerd runtime v2 shim that runs
//! each container as a pvisor vm Job (runtime `io.containerd.pvisor.v1`),
//! and each CRI pod as one: its containers share the pod's VM.
//!
//! containerd starts the binary with `start` (it spawns the serving shim
//! and prints its socket), then talks ttrpc to it, and runs it with
//! `delete` in the bundle directory to clean up after a shim that died.
//! The `containerd-shim` crate provides all of that plumbing; this crate
//! provides the Task service (service.rs) over pvisor's runtime.

// Unit tests write fixtures (clippy.toml's lints are for the shim's own code).
#![cfg_attr(test, allow(clippy::disallowed_methods, clippy::disallowed_macros))]

mod binds;
mod container;
mod logger;
mod pod;
mod process;
mod rootfs;
mod seccomp;
mod service;
mod spec;
mod stats;
mod vm;

fn main() {
    let config = containerd_shim::Config {
        // pvisor's Sessions wait for their own QEMU processes; the crate's
        // SIGCHLD reaper (waitpid(-1)) would take their exit statuses.
        no_reaper: true,
        // Without the reaper, adopted orphans would stay zombies here.
        no_sub_reaper: true,
        ..Default::default()
    };
    containerd_shim::run::<service::Service>("io.containerd.pvisor.v1", Some(config));
}
