//! `pvisor run [-w DIR] -- PROGRAM [ARGS...]`.
//!
//! The frontend side of a run: it submits the request to the Job service,
//! holds the wait adapter, turns SIGINT/SIGTERM/SIGHUP/SIGQUIT into
//! cancellation requests, and keeps the runtime alive until the outcome is
//! published, so even a cancelled run ends with a receipt.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};

use pvisor::{JobService, RunOutcome, RunRequest};
use pvisor_core::state::ResultState;
use pvisor_sandbox::ns::NsExecutor;

use crate::cli::RunArgs;
use crate::exit;
use crate::output::ending;

pub fn cmd_run(args: RunArgs) -> anyhow::Result<i32> {
    let store = super::open_store()?;
    let workspace = match args.workspace {
        Some(w) => w,
        None => std::env::current_dir().context("Cannot read the current directory")?,
    };
    let (program, rest) = args.command.split_first().context("No program given")?;
    let mut env = Vec::new();
    for (key, value) in std::env::vars_os() {
        match (key.into_string(), value.into_string()) {
            (Ok(k), Ok(v)) => env.push((k, v)),
            (Ok(k), Err(_)) | (Err(_), Ok(k)) => {
                eprintln!("pvisor: warning: not passing {k:?}: its name or value is not UTF-8")
            }
            (Err(_), Err(_)) => eprintln!("pvisor: warning: not passing a variable that is not UTF-8"),
        }
    }
    let request = RunRequest {
        workspace,
        cwd: None,
        program: program.clone(),
        args: rest.to_vec(),
        env,
        kill_grace: args.kill_grace,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .enable_io()
        .build()
        .context("Cannot start the async runtime")?;
    let quiet = args.quiet;
    runtime.block_on(async move {
        let mut signals = Vec::new();
        for (kind, number) in [
            (SignalKind::interrupt(), libc::SIGINT),
            (SignalKind::terminate(), libc::SIGTERM),
            (SignalKind::hangup(), libc::SIGHUP),
            (SignalKind::quit(), libc::SIGQUIT),
        ] {
            signals.push((signal(kind).context("Cannot install signal handlers")?, number));
        }
        let [(int, _), (term, _), (hup, _), (quit, _)] = signals.as_mut_slice() else {
            unreachable!("four signals were installed")
        };
        let service = JobService::new(store, Arc::new(NsExecutor));
        let mut run = service.submit(request)?;
        let cancel = run.cancel_handle();
        let outcome = loop {
            tokio::select! {
                outcome = run.wait() => break outcome,
                _ = int.recv() => cancel.cancel(libc::SIGINT),
                _ = term.recv() => cancel.cancel(libc::SIGTERM),
                _ = hup.recv() => cancel.cancel(libc::SIGHUP),
                _ = quit.recv() => cancel.cancel(libc::SIGQUIT),
            }
        }?;
        Ok(finish(&outcome, quiet))
    })
}

/// Prints the end-of-run summary on stderr and returns pvisor's exit code.
fn finish(outcome: &RunOutcome, quiet: bool) -> i32 {
    let result = &outcome.result;
    let code = match (result.exit_code, result.signal) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => exit::PVISOR_ERROR,
    };
    let failed_to_start =
        matches!(code, exit::CANNOT_EXECUTE | exit::NOT_FOUND | exit::PVISOR_ERROR) && result.error.is_some();
    if let Some(error) = &result.error {
        eprintln!("pvisor: {}: {error}", if failed_to_start { "error" } else { "note" });
    }
    for gap in &outcome.audit_gaps {
        eprintln!("pvisor: warning: audit gap (the receipt is valid): {gap}");
    }
    for warning in &outcome.warnings {
        eprintln!("pvisor: warning: {warning}");
    }
    if !quiet {
        let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
        for change in &outcome.changes {
            *kinds.entry(change.kind.as_str()).or_default() += 1;
        }
        let staged = if outcome.changes.is_empty() {
            "nothing staged".to_owned()
        } else {
            let parts: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
            format!("{} staged ({})", plural(outcome.changes.len(), "change"), parts.join(", "))
        };
        let state = ending(result.state.as_str(), result.exit_code, result.signal);
        eprintln!("pvisor: {} {state}; {staged}; {} untouched", outcome.job, outcome.workspace.display());
        let job = &outcome.job;
        if outcome.changes.is_empty() {
            if result.state != ResultState::Completed {
                eprintln!("pvisor: details: pvisor status {job}");
            }
        } else {
            eprintln!(
                "pvisor: next: pvisor review {job} --diff  ·  pvisor apply {job} --all  ·  pvisor drop {job}"
            );
        }
        eprintln!("pvisor: note: network requests and changes to outside services are not staged; staging neither delayed nor rolled them back");
    }
    code
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}
