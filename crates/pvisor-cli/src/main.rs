//! The `pvisor` binary: parses flags, builds the runtime, prints results.
//!
//! The commands live in this package's library (`lib.rs`); this file only
//! starts the helpers, parses, builds the host runtime and exits.

// The binary is the terminal's end: it prints what the user asked for.
#![allow(clippy::disallowed_macros, clippy::disallowed_methods)]

use clap::Parser;
use pvisor_cli::{cli, commands, exit, json};

fn main() {
    pvisor_cli::timings::mark_process_start();
    // Must come first: the sandbox helper is this binary re-executed.
    pvisor_ns::maybe_run_helper();
    pvisor_cli::doctor::maybe_run_probe();
    pvisor_cli::route_executor_notices();
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            if let (true, Some(stream)) = (e.use_stderr(), json::requested(std::env::args_os())) {
                std::process::exit(exit::report_usage_json(stream, &e));
            }
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
    // The one runtime of this process: this machine's backends over the
    // state directory, built once, by `dispatch`, for the commands that use it.
    let host = || Ok(pvisor::Runtime::on_host(commands::open_store()?));
    let code = match commands::dispatch(cli, host) {
        Ok(code) => code,
        Err(err) => exit::report(&err),
    };
    std::process::exit(code);
}
