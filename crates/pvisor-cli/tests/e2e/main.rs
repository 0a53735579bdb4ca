//! End-to-end tests: the real `pvisor` binary, real namespaces, a real overlay.
//!
//! One test binary (as jj does) so the suite shares one build. Each test gets a
//! fresh workspace and state directory. Tests that need a particular privilege
//! run the binary as that user: as root the "rootless" variants switch to an
//! unprivileged uid with `setpriv`; as a normal user the root variants say why
//! they are skipped.

// A test (or benchmark) program: it writes fixtures and says what it measured
// or skipped; clippy.toml's lints are for the libraries' own code.
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod agent_state;
mod agents;
mod bad_input;
mod checkpoints;
mod collected;
mod effects;
mod git_commits;
mod hidden_runners;
mod hostile_apply;
mod hostile_repo;
mod json_output;
mod limits;
mod mcp;
mod network;
mod pasted_hints;
mod read_commands;
mod records;
mod recovery;
mod run;
mod secrets;
mod serve;
mod sessions;
mod signals;
mod vm;
mod vm_hostile;
mod vm_templates;
mod vm_userland;
mod vm_workspace;
