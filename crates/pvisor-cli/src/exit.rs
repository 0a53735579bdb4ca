//! Exit codes (see `docs/exit-codes.md`) and error reporting.
//!
//! `pvisor run` exits with the sandboxed command's own status (128+N for a
//! signal). pvisor's own failures use the codes container runtimes use.

use std::io::ErrorKind;

pub const SUCCESS: i32 = 0;
/// pvisor itself failed: bad input, setup, records.
pub const PVISOR_ERROR: i32 = 125;
/// The program exists but cannot be executed.
pub const CANNOT_EXECUTE: i32 = 126;
/// The program was not found.
pub const NOT_FOUND: i32 = 127;
/// `run`/`resume`: the Job was suspended before its command finished
/// (EX_TEMPFAIL: continue it with `pvisor resume`).
pub const SUSPENDED: i32 = 75;
/// Invalid command-line usage (a pvisor error too).
pub const USAGE: i32 = PVISOR_ERROR;

/// Prints `err` with its whole cause chain and any hint, and returns the exit
/// code. A closed stdout (`pvisor jobs | head`) is success, as in ripgrep.
pub fn report(err: &anyhow::Error) -> i32 {
    if is_broken_pipe(err) {
        return SUCCESS;
    }
    // Errors quote staged names and config lines: untrusted bytes.
    let safe = |text: String| pvisor_core::text::escape(&text, pvisor_core::text::Tabs::Keep).into_owned();
    eprintln!("pvisor: error: {}", safe(err.to_string()));
    for cause in err.chain().skip(1) {
        eprintln!("  caused by: {}", safe(cause.to_string()));
    }
    if let Some(hint) = hint_for(err) {
        eprintln!("  hint: {hint}");
    }
    PVISOR_ERROR
}

/// [`report`] for a command run with `--json`: `err` as the `error` line
/// that ends its JSON stream (see [`crate::results::ErrorResult`]).
pub fn report_json(err: &anyhow::Error) -> i32 {
    if is_broken_pipe(err) {
        return SUCCESS;
    }
    let error = crate::results::ErrorResult::from_error(err);
    if crate::json::emit(crate::json::JsonType::Error, &error).is_err() {
        // The JSON stream is gone; say it where a person may see it.
        return report(err);
    }
    error.exit_code
}

/// A usage error (clap's) for a command line that asked for `--json`:
/// an `error` line on `stream`, and the usage exit status.
pub fn report_usage_json(stream: crate::json::Stream, err: &clap::Error) -> i32 {
    let text = err.render().to_string();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let message = lines.next().unwrap_or_default();
    let error = crate::results::ErrorResult {
        message: message.strip_prefix("error: ").unwrap_or(message).to_owned(),
        causes: Vec::new(),
        hint: lines.find_map(|l| l.strip_prefix("tip: ")).map(str::to_owned),
        exit_code: USAGE,
    };
    let mut out = crate::output::sink(stream);
    if crate::json::json_line(&mut out, crate::json::JsonType::Error, &error).is_err() {
        let _ = err.print();
    }
    USAGE
}

/// Whether `err` comes from writing to a closed pipe (`pvisor jobs | head`).
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == ErrorKind::BrokenPipe))
}

/// What to do about `err`, when pvisor knows.
pub fn hint_for(err: &anyhow::Error) -> Option<String> {
    for cause in err.chain() {
        if let Some(e) = cause.downcast_ref::<pvisor_sandbox::SandboxError>() {
            return e.hint().map(str::to_owned);
        }
        if let Some(e) = cause.downcast_ref::<std::io::Error>() {
            match e.raw_os_error() {
                Some(libc::ENOSPC) => {
                    return Some(
                        "the disk holding PVISOR_HOME is full; free space or point PVISOR_HOME elsewhere"
                            .into(),
                    )
                }
                Some(libc::EACCES) | Some(libc::EROFS) | Some(libc::EPERM)
                    if err.chain().any(|c| c.to_string().contains("state directory")) =>
                {
                    return Some(
                        "PVISOR_HOME must be a writable directory; set PVISOR_HOME=/some/writable/dir".into(),
                    )
                }
                _ => {}
            }
        }
    }
    None
}
