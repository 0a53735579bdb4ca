//! The syntax of the commands that read and change Jobs: status, review,
//! apply, drop, kill, checkpoints, forks, bundles, gc, doctor, trust, jobs
//! and events.

use std::path::PathBuf;

use clap::Args;

use super::run::{humantime_duration, label};
use super::RunOptions;

/// Show what a Job did: state, exit status, receipt and staged changes.
///
/// JOB is a job id, a unique prefix of one (with or without `job-`), or
/// nothing for the most recent Job. The state shown is confirmed by the
/// completion receipt; a Job whose supervisor vanished without one is `unknown`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor status\n  pvisor status 01JD4\n  pvisor status --json | jq .data.state"
)]
pub struct StatusArgs {
    pub job: Option<String>,
    /// The open session NAME of this workspace (the current directory or
    /// one above it) instead of a Job: its head, which holds everything the
    /// session's runs staged. A first argument is then a path.
    #[arg(long, value_name = "NAME")]
    pub session: Option<String>,
    /// One JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also list the staged changes, as `pvisor review` does.
    #[arg(long)]
    pub review: bool,
}

/// When to colour diffs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// On a terminal, unless NO_COLOR is set.
    Auto,
    Always,
    Never,
}

/// Show what a Job staged: every change with its kind, size and conflict state.
///
/// Changes come from the Run Bundle, bound by the completion receipt. A Job
/// without a confirmed result shows its staged files with no execution result.
/// A conflict means the workspace no longer holds what the sandbox started
/// from, so `apply` would refuse that path without --force. Nothing is ever
/// truncated: deletions and long lists are shown in full.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor review                    the last Job's changes\n  pvisor review --diff src/        unified diffs of everything under src/\n  pvisor review job-01JD4 --json   one JSON object per change\n  pvisor review --session fix      a session's changes, each with the run that made it\n  pvisor review --state --session fix   the session's agent state changes\n  pvisor diff                      same as review --diff"
)]
pub struct ReviewArgs {
    /// Show the Job's agent state changes (`run --state`) instead of its
    /// staged workspace changes: one line per path, gated ones (they make a
    /// later run execute something) marked, with whether they are approved.
    #[arg(long)]
    pub state: bool,
    pub job: Option<String>,
    /// The open session NAME of this workspace (the current directory or
    /// one above it) instead of a Job: its head, which holds everything the
    /// session's runs staged. A first argument is then a path.
    #[arg(long, value_name = "NAME")]
    pub session: Option<String>,
    /// Only these paths (a directory selects everything under it) or globs.
    pub paths: Vec<String>,
    /// Show unified diffs (binary files: sizes and digests).
    #[arg(long, short = 'd')]
    pub diff: bool,
    /// One JSON object per change.
    #[arg(long)]
    pub json: bool,
    /// Colour diffs: auto (on a terminal), always, never.
    #[arg(long, value_enum, default_value = "auto")]
    pub color: ColorChoice,
}

/// Apply staged changes to the workspace.
///
/// Each selected path is checked against its conflict baseline (what the host
/// held when the sandbox first changed it). If the workspace changed since,
/// the whole apply is refused (exit 1) unless --force. Files are replaced
/// atomically, beneath the workspace root, never through a symlink; symlinks
/// are applied as symlinks; device nodes, fifos and sockets are never created;
/// setuid/setgid bits are dropped. An interrupted apply resumes where it stopped.
///
/// Sensitive paths (`.git/`, `.envrc`, `.pvisor.toml`, editor and CI task
/// files, …: they make the host run code) are applied only when named
/// exactly, chosen with -i, or with --include-sensitive; --all, globs and
/// directories skip them and say so (exit 1). pvisor's own config and state
/// are never applied. A path that cannot be written does not stop the others.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor apply --all                apply every remaining change of the last Job\n  pvisor apply job-01JD4 src/ README.md\n  pvisor apply '**/*.rs' --dry-run  what would happen\n  pvisor apply -i                   choose change by change, with diffs\n  pvisor apply -p src/main.rs       choose hunk by hunk (like git add -p)\n  printf 'y\\nn\\n' | pvisor apply -p   answers from a pipe, one per line\n  pvisor apply .git/hooks/pre-push  a sensitive path, named exactly\n  pvisor apply --session fix --all  everything the session's runs staged; ends the session\n  pvisor apply --all --json         one JSON line per path, then a `result` line\n\nExit status: 0 applied; 1 refused because of conflicts (nothing applied), or some paths skipped\n(sensitive) or not writable (the rest applied); 125 error."
)]
pub struct ApplyArgs {
    /// The Job (id or unique prefix) [default: the most recent, refused if newer than the one last reviewed]. A first argument that is not a job is taken as a path.
    pub job: Option<String>,
    /// The open session NAME of this workspace (the current directory or
    /// one above it) instead of a Job: its head, which holds everything the
    /// session's runs staged. A first argument is then a path.
    #[arg(long, value_name = "NAME")]
    pub session: Option<String>,
    /// Paths (a directory selects everything under it) or globs to apply.
    pub paths: Vec<String>,
    /// Apply every remaining change.
    #[arg(long, short = 'a')]
    pub all: bool,
    /// Show what would be applied and any conflicts; change nothing.
    #[arg(long, short = 'n')]
    pub dry_run: bool,
    /// Overwrite conflicting paths (the host's newer version is lost).
    #[arg(long, short = 'f')]
    pub force: bool,
    /// Ask about each change in turn, showing its diff: single keys on a
    /// terminal (y n a d s q ?), one answer per line from a pipe.
    #[arg(long, short = 'i', conflicts_with = "patch")]
    pub interactive: bool,
    /// Ask about each hunk of each modified text file, as `git add -p` does
    /// (y n a d q ?). The rest of a file stays staged, its baseline updated;
    /// a file in conflict offers no hunks.
    #[arg(long, short = 'p', conflicts_with_all = ["all", "force", "dry_run"])]
    pub patch: bool,
    /// Also apply sensitive paths that --all, a glob or a directory selects.
    #[arg(long)]
    pub include_sensitive: bool,
    /// Apply from a stage marked incomplete (the executor could not take
    /// all of it out of the sandbox): what arrived, knowing the rest is missing.
    #[arg(long)]
    pub allow_incomplete: bool,
    /// Colour diffs: auto (on a terminal), always, never.
    #[arg(long, value_enum, default_value = "auto")]
    pub color: ColorChoice,
    /// List every path (by default more than 20 are summarised by directory).
    #[arg(long, short = 'v', conflicts_with = "quiet")]
    pub verbose: bool,
    /// Print no per-path lines, only problems and the one-line total.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// JSON Lines on stdout: one per path (`applied`, `planned`, `skipped`),
    /// then one `result` line (or `error`). Asks nothing: not with -i or -p.
    #[arg(long)]
    pub json: bool,
}

/// Discard staged changes: the remaining ones, or only those selected.
///
/// Drop never undoes changes already applied to the workspace.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor drop                 discard everything left in the last Job's stage\n  pvisor drop job-01JD4 build/\n  pvisor drop --session fix   discard the session's changes and end it\n  pvisor drop job-01JD4 --json   one `dropped` line per change, then a `result` line"
)]
pub struct DropArgs {
    pub job: Option<String>,
    /// The open session NAME of this workspace (the current directory or
    /// one above it) instead of a Job: its head, which holds everything the
    /// session's runs staged. A first argument is then a path.
    #[arg(long, value_name = "NAME")]
    pub session: Option<String>,
    /// Paths or globs to drop [default: every remaining change].
    pub paths: Vec<String>,
    /// List every path (by default more than 20 are summarised by directory).
    #[arg(long, short = 'v', conflicts_with = "quiet")]
    pub verbose: bool,
    /// Print no per-path lines, only the one-line total.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// JSON Lines on stdout: one `dropped` line per change, then one `result` line (or `error`).
    #[arg(long)]
    pub json: bool,
}

/// End a Job in any non-terminal state; the way out of `unknown`.
///
/// Kill first withdraws the Job's continuation rights. A live run is asked to
/// cancel (it still finalizes with a receipt) and is killed if it does not
/// stop within --grace. A Job with no confirmed result (`unknown`) is closed
/// as `lost`: recorded as lost, never as success. Its stage stays reviewable.
/// A live Job that the containerd shim runs (a container) is ended through
/// containerd (`ctr task kill`, `kubectl delete pod`), which pvisor names.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor kill job-01JD4\n  pvisor kill --grace 2s\n  pvisor kill --force job-01JD4   a container's Job, behind containerd's back\n  pvisor kill job-01JD4 --json   one `result` line: the Job and its state\n\nExit status: 0 when the Job has ended (or had already); 125 on error."
)]
pub struct KillArgs {
    pub job: Option<String>,
    /// How long a live run gets to cancel and publish its receipt before it is killed.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = humantime_duration)]
    pub grace: std::time::Duration,
    /// End a Job that a containerd shim runs even so (containerd then sees
    /// its container's task die); without it such a Job is left to `ctr`
    /// or `kubectl`.
    #[arg(long)]
    pub force: bool,
    /// One JSON `result` line on stdout (or `error`) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Snapshot a stopped Job's staged files and conflict baselines.
///
/// The checkpoint (`checkpoints/ckpt-<id>/`) holds the stage's upper layer,
/// its preimages and the Job's lineage, listed entry by entry with digests in a
/// manifest that is published only after everything is synced. It saves no
/// process memory and no external service state, and does not freeze the
/// workspace underneath.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor checkpoint\n  pvisor checkpoint job-01JD4\n  pvisor checkpoint --json | jq -r 'select(.type == \"result\") | .data.checkpoint'\n  pvisor fork ckpt-01JD5 -- make test"
)]
pub struct CheckpointArgs {
    pub job: Option<String>,
    /// The kind of checkpoint: `workspace` (staged files of a stopped Job) or
    /// `execution` (the whole running VM of a vm Job: CPU, RAM, devices, disks).
    #[arg(long, default_value = "workspace", value_parser = ["workspace", "execution"])]
    pub kind: String,
    /// JSON Lines on stdout: one `result` line with the checkpoint's id (after
    /// the manifest, for `--kind execution`), or `error`.
    #[arg(long)]
    pub json: bool,
}

/// List checkpoints, oldest first: workspace checkpoints, then the execution
/// checkpoints of vm Jobs.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  pvisor checkpoints\n  pvisor checkpoints --json")]
pub struct CheckpointsArgs {
    /// One JSON object per checkpoint.
    #[arg(long)]
    pub json: bool,
}

/// Start a new Job from another Job's staged files (or a checkpoint) and run a command.
///
/// The new sandbox sees the workspace plus the parent's staged changes. Its
/// stage starts as a copy of the checkpoint, conflict baselines included, so
/// applying the fork applies the parent's changes too and conflicts are still
/// judged against the original workspace. Forking a Job checkpoints it first.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor fork job-01JD4 -- sh -c 'make test'\n  pvisor fork ckpt-01JD5 --allow pypi.org -- pip install -e .\n  pvisor fork job-01JD4 --state execution        a second copy of a running VM\n  pvisor fork job-01JD4 --json -- make test      pvisor's lines on stderr as JSON, as `run --json`"
)]
pub struct ForkArgs {
    /// A Job (id or prefix) or a checkpoint (`ckpt-…`).
    pub from: String,
    /// What to restore: `workspace` (files and conflict baselines; runs a new
    /// COMMAND) or `execution` (a vm Job's running VM; the fork continues the
    /// parent's command from its checkpoint and takes no COMMAND).
    #[arg(long, default_value = "workspace", value_parser = ["workspace", "execution"])]
    pub state: String,
    /// With `--state execution`: the checkpoint to fork from (default: a new
    /// one of a running parent, or the one a suspended parent was saved to).
    #[arg(long, value_name = "CKPT")]
    pub checkpoint: Option<String>,
    #[command(flatten)]
    pub run: RunOptions,
    /// The program to run, and its arguments.
    #[arg(last = true, value_name = "PROGRAM [ARGS]...")]
    pub command: Vec<String>,
}

/// Write a Job's Run Bundle archive: records, receipt, Trace and staged files.
///
/// The archive (a tar file) carries a MANIFEST.json with the BLAKE3 of every
/// entry, so anyone can check it with `pvisor verify FILE`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor export                             the last Job, into $PVISOR_HOME/exports/\n  pvisor export -o run.pvisor.tar\n  pvisor export job-01JD4 -o /tmp/audit.tar\n  pvisor export --json                      one `result` line: the archive and its BLAKE3"
)]
pub struct ExportArgs {
    pub job: Option<String>,
    /// Where to write the archive [default: <job>.pvisor.tar in the state
    /// directory's exports/, never silently into the workspace].
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// One JSON `result` line on stdout (or `error`): the archive, its BLAKE3 and size.
    #[arg(long)]
    pub json: bool,
}

/// Check a Run Bundle archive or a local Job: every digest and the receipt binding.
///
/// Says exactly which file fails. Exit 0 when everything verifies, 1 otherwise.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  pvisor verify run.pvisor.tar\n  pvisor verify job-01JD4")]
pub struct VerifyArgs {
    /// An archive file, or a Job id/prefix.
    pub target: String,
    /// A `result` line (JSON): `ok`, and what failed.
    #[arg(long)]
    pub json: bool,
}

/// Bring an exported Run Bundle into this state directory as a read-only Job.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  PVISOR_HOME=/tmp/audit pvisor import run.pvisor.tar && PVISOR_HOME=/tmp/audit pvisor review --diff"
)]
pub struct ImportArgs {
    pub file: PathBuf,
    /// A `result` line (JSON) naming the imported Job.
    #[arg(long)]
    pub json: bool,
}

/// Free the space of stages and checkpoints nobody needs any more.
///
/// Removes the staged files of Jobs whose changes were all applied or dropped,
/// checkpoints no fork refers to, and temporaries of interrupted writes, older
/// than --older-than. Never removes an unreviewed stage, the stage of a Job
/// without a confirmed result, or a checkpoint a fork came from, unless
/// --force. Records are always kept. What cannot be removed is named and
/// skipped, and gc exits 1.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  pvisor gc --dry-run\n  pvisor gc --older-than 30d")]
pub struct GcArgs {
    /// Only what is at least this old (units: ms, s, m, h, d).
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = humantime_duration)]
    pub older_than: std::time::Duration,
    /// Say what would be freed; remove nothing.
    #[arg(long, short = 'n')]
    pub dry_run: bool,
    /// Also remove unreviewed stages and checkpoints forks came from.
    #[arg(long)]
    pub force: bool,
    /// One JSON object per item.
    #[arg(long)]
    pub json: bool,
}

/// Report what this host supports, and why not.
///
/// Probes the real thing: namespaces in throw-away children, and a real
/// sandbox (overlay workspace and staging) on the state directory's
/// filesystem — as root, also as an unprivileged user. Also reports cgroups,
/// seccomp, KVM, QEMU and the state directory's filesystem and free space.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor doctor\n  pvisor doctor --json | jq 'select(.data.status != \"ok\")'\n\nExit status: 0 when everything `pvisor run` needs works, 1 otherwise."
)]
pub struct DoctorArgs {
    /// One JSON object per check.
    #[arg(long)]
    pub json: bool,
}

/// Trust a workspace's `.pvisor.toml`, so it may widen the network policy.
///
/// A workspace's `.pvisor.toml` belongs to the repository, so pvisor treats
/// it as untrusted: until you trust it, it may only narrow the policy
/// (`mode = "none"`, deny rules); a mode that opens the network and allow
/// rules are ignored, and `pvisor run` says so before the command starts.
/// Trusting records the file's BLAKE3 in the state directory (like direnv's
/// `allow`): any change to the file, by you, a `git pull` or an applied
/// change, makes it untrusted again.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor trust                      trust ./.pvisor.toml as it is now\n  pvisor trust ~/src/app/.pvisor.toml\n  pvisor trust --list               every trusted file, and whether it changed since\n  pvisor trust --revoke             stop trusting ./.pvisor.toml"
)]
pub struct TrustArgs {
    /// The configuration file [default: .pvisor.toml in the current directory].
    pub file: Option<PathBuf>,
    /// List the trusted files.
    #[arg(long, conflicts_with = "revoke")]
    pub list: bool,
    /// Stop trusting the file.
    #[arg(long)]
    pub revoke: bool,
    /// With --list: one JSON object per line.
    #[arg(long)]
    pub json: bool,
}

/// List Jobs, oldest first.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor jobs\n  pvisor jobs --tree\n  pvisor jobs --json\n  pvisor jobs --label containerd.io/container=web-1"
)]
pub struct JobsArgs {
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Only Jobs with this label (repeatable: every one must match).
    #[arg(long, value_name = "KEY=VALUE", value_parser = label)]
    pub label: Vec<(String, String)>,
    /// Show forks under the Jobs they came from.
    #[arg(long)]
    pub tree: bool,
}

/// Show a Job's Trace: every recorded fact, in causal order.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  pvisor events\n  pvisor events job-01JD4 --json")]
pub struct EventsArgs {
    pub job: Option<String>,
    /// The open session NAME of this workspace (the current directory or
    /// one above it) instead of a Job: its head, which holds everything the
    /// session's runs staged. A first argument is then a path.
    #[arg(long, value_name = "NAME")]
    pub session: Option<String>,
    /// One JSON object per line (each events.jsonl record as its `data`) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Approve or promote agent state (`pvisor run --state PATH`).
///
/// A run's agent state is its own copy, never the host's files. A change to
/// settings, hooks, MCP server lists or instruction files (gated: it makes
/// a later run execute something) is held back from later runs until
/// approved; `pvisor review --state` lists the changes.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor review --state --session fix\n  pvisor state approve --session fix ~/.claude/settings.json\n  pvisor state promote --session fix     later sessions start from this state"
)]
pub struct StateArgs {
    #[command(subcommand)]
    pub action: StateAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum StateAction {
    /// Approve gated state changes, so the next run of the session has them.
    Approve {
        /// The changed paths, as `pvisor review --state` prints them.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// The Job (id or unique prefix) [default: the most recent of this workspace].
        #[arg(long, value_name = "JOB", conflicts_with = "session")]
        job: Option<String>,
        /// The open session NAME of this workspace: its last run with agent state (what its next run carries).
        #[arg(long, value_name = "NAME")]
        session: Option<String>,
        /// One `state` line per approved change, then a `result` line.
        #[arg(long)]
        json: bool,
    },
    /// Keep a Job's state (without unapproved gated changes) in pvisor's
    /// own store: runs outside its session start from it from now on. The
    /// host's real files are never written.
    Promote {
        /// The Job (id or unique prefix) [default: the most recent of this workspace].
        #[arg(long, value_name = "JOB", conflicts_with = "session")]
        job: Option<String>,
        /// The open session NAME of this workspace: its last run with agent state (what its next run carries).
        #[arg(long, value_name = "NAME")]
        session: Option<String>,
        /// A `result` line (JSON) instead of text.
        #[arg(long)]
        json: bool,
    },
}
