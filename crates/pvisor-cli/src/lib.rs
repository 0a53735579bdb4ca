//! The `pvisor` command line: parsing (`cli`), one file per subcommand in
//! `commands/` (routed by [`commands::dispatch`], which takes the runtime to
//! run them on, so tests hand it one over fake backends), and exit codes
//! (`exit.rs`, documented in `docs/exit-codes.md`). `--json` lines are
//! written by `json.rs`, and what the commands that change something did is
//! in `results.rs`, whose types other frontends reuse. All behaviour lives
//! in the library crates; `main.rs` builds the host runtime.

// The command line is the terminal's end: it prints what the user asked for,
// and writes the files the user names (archives, patches, manuals), which are
// not records; records are written by the library crates, durably.
#![allow(clippy::disallowed_macros, clippy::disallowed_methods)]

pub mod agents;
pub mod cli;
pub mod commands;
mod config;
pub mod doctor;
pub mod exit;
pub mod json;
pub mod mcp;
mod output;
mod prompt;
pub mod results;
pub mod timings;

pub use output::route_executor_notices;
