//! Command-line syntax. The doc comment on each argument struct is its help text.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// pvisor runs a command in a sandbox that cannot change your workspace.
///
/// Every file the command writes is staged in a copy-on-write layer; you review
/// the changes and apply what you want. Each run is recorded as a Job with a
/// verifiable completion receipt.
#[derive(Debug, Parser)]
#[command(name = "pvisor", version, about, long_about, propagate_version = true)]
#[command(
    after_help = "Examples:\n  pvisor run -- make test           run `make test` against the current directory\n  pvisor run -w ~/src/app -- bash   an interactive shell over ~/src/app\n  pvisor status                     what the last run did\n  pvisor jobs --json                every Job as JSON Lines\n\nState lives in $PVISOR_HOME (default: $XDG_STATE_HOME/pvisor or ~/.local/state/pvisor)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    Run(RunArgs),
    Status(StatusArgs),
    Jobs(JobsArgs),
    Events(EventsArgs),
}

/// Run a command in a sandbox over a workspace; its writes are staged, not applied.
///
/// The workspace is mounted at its own path as an overlay: the command sees
/// your files and can change them freely, but every change lands in the Job's
/// stage. The rest of the filesystem is read-only, /tmp is private and the
/// network is loopback only. pvisor exits with the command's exit status.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor run -- sh -c 'echo hi > greeting'\n  pvisor run -w ../other-project -- cargo build\n  pvisor run --kill-grace 2s -- ./long-job.sh\n\nExit status: the command's own (128+N if killed by signal N); 125 if pvisor failed,\n126 if the program cannot be executed, 127 if it was not found."
)]
pub struct RunArgs {
    /// The workspace directory [default: the current directory].
    #[arg(short = 'w', long = "workspace", value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// How long a cancelled command may take to exit before it is killed.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime_duration)]
    pub kill_grace: std::time::Duration,
    /// Print nothing but the command's own output.
    #[arg(short, long)]
    pub quiet: bool,
    /// The program to run, and its arguments.
    #[arg(required = true, last = true, value_name = "PROGRAM [ARGS]...")]
    pub command: Vec<String>,
}

fn humantime_duration(s: &str) -> Result<std::time::Duration, String> {
    parse_duration(s).ok_or_else(|| format!("{s:?} is not a duration like 500ms, 10s or 2m"))
}

fn parse_duration(s: &str) -> Option<std::time::Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let ms = match unit {
        "ms" => n,
        "s" => n.checked_mul(1000)?,
        "m" => n.checked_mul(60_000)?,
        _ => return None,
    };
    Some(std::time::Duration::from_millis(ms))
}

/// Show what a Job did: state, exit status, receipt and staged changes.
///
/// JOB is a job id, a unique prefix of one (with or without `job-`), or
/// nothing for the most recent Job. The state shown is confirmed by the
/// completion receipt; a Job whose supervisor vanished without one is `unknown`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor status\n  pvisor status 01JD4\n  pvisor status --json | jq .state"
)]
pub struct StatusArgs {
    pub job: Option<String>,
    /// One JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
}

/// List Jobs, oldest first.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  pvisor jobs\n  pvisor jobs --json")]
pub struct JobsArgs {
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Show a Job's Trace: every recorded fact, in causal order.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  pvisor events\n  pvisor events job-01JD4 --json")]
pub struct EventsArgs {
    pub job: Option<String>,
    /// One JSON object per line (the events.jsonl records) instead of text.
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_only() {
        assert_eq!(parse_duration("500ms"), Some(std::time::Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Some(std::time::Duration::from_secs(120)));
        assert_eq!(parse_duration("10"), None);
        assert_eq!(parse_duration("x1s"), None);
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
