//! The `pvisor` binary: parses flags, builds the runtime, prints results.
//!
//! All behaviour lives in the library crates; each subcommand is one file in
//! `commands/`. Exit codes are documented in `docs/exit-codes.md` and defined
//! in `exit.rs`.

mod cli;
mod commands;
mod config;
mod doctor;
mod exit;
mod output;
mod prompt;

use clap::Parser;

fn main() {
    // Must come first: the sandbox helper is this binary re-executed.
    pvisor_ns::maybe_run_helper();
    crate::doctor::maybe_run_probe();
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::USAGE } else { exit::SUCCESS };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    // Operator logs for any command when asked for (serve has --log-level too).
    if std::env::var_os("PVISOR_LOG").is_some() {
        if let Err(e) = pvisor_server::logging::init(None) {
            eprintln!("pvisor: {e}");
            std::process::exit(exit::USAGE);
        }
    }
    let code = match commands::dispatch(cli) {
        Ok(code) => code,
        Err(err) => exit::report(&err),
    };
    std::process::exit(code);
}
