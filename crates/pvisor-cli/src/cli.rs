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
    Review(ReviewArgs),
    /// Show a Job's staged changes as unified diffs: `pvisor review --diff`.
    #[command(
        after_help = "Examples:\n  pvisor diff                  the last Job's changes, as diffs\n  pvisor diff src/             only under src/\n  pvisor diff job-01JD4 --color never"
    )]
    Diff(ReviewArgs),
    Apply(ApplyArgs),
    Drop(DropArgs),
    Kill(KillArgs),
    Checkpoint(CheckpointArgs),
    Checkpoints(CheckpointsArgs),
    Fork(ForkArgs),
    Suspend(SuspendArgs),
    Resume(ResumeArgs),
    Export(ExportArgs),
    Verify(VerifyArgs),
    Import(ImportArgs),
    Gc(GcArgs),
    Doctor(DoctorArgs),
    Jobs(JobsArgs),
    Events(EventsArgs),
    Serve(ServeArgs),
    Image(ImageArgs),
    Trust(TrustArgs),
    Cache(CacheArgs),
    Completions(CompletionsArgs),
    Man(ManArgs),
    #[command(hide = true)]
    SandboxSupervisor(SandboxSupervisorArgs),
}

/// List or remove the caches `pvisor run --cache` keeps.
///
/// A cache holds what runs added under a host directory (downloaded crates,
/// wheels, packages). It is shared by every run that names the directory, so
/// one run can influence the next through it: prune it when in doubt.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor cache ls\n  pvisor cache prune ~/.cargo/registry\n  pvisor cache prune              every cache not in use"
)]
pub struct CacheArgs {
    #[command(subcommand)]
    pub action: CacheAction,
}

#[derive(Debug, Subcommand)]
pub enum CacheAction {
    /// Every cache: its host directory, size, and whether a run holds it.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Remove caches not in use (all, or those of the given host directories).
    Prune { paths: Vec<PathBuf> },
}

/// Print a shell completion script for pvisor.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor completions bash > ~/.local/share/bash-completion/completions/pvisor\n  pvisor completions zsh > ~/.zfunc/_pvisor      (with fpath+=~/.zfunc)\n  pvisor completions fish > ~/.config/fish/completions/pvisor.fish"
)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Print pvisor's man page (roff), or write one page per command into DIR.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor man | man -l -\n  pvisor man --dir ~/.local/share/man/man1     (then: man pvisor-apply)"
)]
pub struct ManArgs {
    /// Write pvisor.1 and pvisor-<command>.1 into this directory.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Serve the OpenSandbox lifecycle and execd APIs over pvisor microVMs.
///
/// Each sandbox (`sb-<id>`) is a vm Job: a QEMU microVM (KVM when usable,
/// else TCG) booting the named image's root filesystem, with no network
/// device. Pause saves its execution state to disk and stops the VM; resume
/// restores it. A sandbox's execd API is served under
/// `/sandboxes/{id}/port/44772/` on the same listener, and needs the access
/// token that `GET /v1/sandboxes/{id}/endpoints/44772` returns.
///
/// On SIGTERM or Ctrl-C, every Running sandbox is paused, then the daemon
/// exits; after a restart they are listed Paused and resume on request.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor serve                                  http://127.0.0.1:8080, no API key\n  pvisor serve --api-key-file ~/.pvisor-key     require OPEN-SANDBOX-API-KEY\n  pvisor serve --listen 0.0.0.0:8080 --api-key-file key\n\nPython: SandboxSync.create(\"default\", connection_config=ConnectionConfigSync(\n          domain=\"127.0.0.1:8080\", protocol=\"http\", api_key=KEY))"
)]
pub struct ServeArgs {
    /// The address to listen on. Without --api-key-file only loopback is allowed.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: std::net::SocketAddr,
    /// A file whose first line is the API key clients send as OPEN-SANDBOX-API-KEY.
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
    /// The longest `timeout` (and renewal) a sandbox may ask for.
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = humantime_duration)]
    pub max_timeout: std::time::Duration,
    /// What the daemon and its sandbox supervisors log to stderr: a level or
    /// EnvFilter directives (`debug`, `warn,pvisor_server=debug`). Overrides
    /// PVISOR_LOG; the default is `info` (one access line per request).
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
}

/// Manage the root filesystems `pvisor serve` sandboxes boot (the `image` of a create).
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor image import python:3.11 ./rootfs-dir\n  pvisor image import alpine rootfs.tar.gz\n  pvisor image import myapp:1 ./oci-layout     (skopeo copy ... oci:DIR)\n  pvisor image ls --json\n\nThe image `default` (sh, bash, coreutils) is imported by `pvisor serve` from\nscripts/sandbox-image.sh's build."
)]
pub struct ImageArgs {
    #[command(subcommand)]
    pub command: ImageCommand,
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Import a root filesystem as NAME: a directory, a tar archive (plain,
    /// gzip, xz or zstd), or an OCI image layout directory. Replaces an image
    /// of the same name; sandboxes already running keep what they booted.
    Import {
        /// The name clients pass as `image.uri` (e.g. python:3.11).
        name: String,
        /// DIR, TAR or OCI-LAYOUT.
        source: PathBuf,
    },
    /// List imported images.
    Ls {
        /// One JSON object per image.
        #[arg(long)]
        json: bool,
    },
}

/// Internal: supervises one `pvisor serve` sandbox's vm Job (started by the daemon).
#[derive(Debug, Args)]
pub struct SandboxSupervisorArgs {
    /// Where to write `{job, attempt}` once the Job is admitted.
    #[arg(long)]
    pub bind: PathBuf,
    /// The image rootfs (the Job's workspace), for a new sandbox.
    #[arg(long)]
    pub workspace: Option<PathBuf>,
    #[arg(long, default_value = "512")]
    pub memory_mib: u64,
    #[arg(long, default_value = "1")]
    pub cpus: u32,
    /// Resume this suspended Job instead.
    #[arg(long)]
    pub resume: Option<String>,
    /// The sandbox's egress policy (an ordered policy, JSON), for a new sandbox.
    #[arg(long)]
    pub network_policy: Option<String>,
    /// The daemon's --log-level, passed down (else PVISOR_LOG, else info).
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
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
    #[command(flatten)]
    pub options: RunOptions,
    /// The program to run, and its arguments.
    #[arg(required = true, last = true, value_name = "PROGRAM [ARGS]...")]
    pub command: Vec<String>,
}

/// Options shared by `run` and `fork`.
#[derive(Debug, Args, Clone)]
pub struct RunOptions {
    /// The sandbox backend: ns (Linux namespaces, the default) or vm (a QEMU
    /// microVM per run: a separate kernel, and execution checkpoints with
    /// suspend/resume/fork; KVM where it works, else TCG).
    #[arg(long, value_enum, value_name = "BACKEND", default_value = "ns")]
    pub executor: ExecutorArg,
    /// How long a cancelled command may take to exit before it is killed.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime_duration)]
    pub kill_grace: std::time::Duration,
    /// Print nothing but the command's own output.
    #[arg(short, long)]
    pub quiet: bool,
    /// Network: none (loopback only, the default), proxy (only the --allow'ed
    /// domains, through pvisor's proxy), host (shared, bypassable).
    #[arg(long = "net", value_enum, value_name = "MODE")]
    pub net: Option<NetArg>,
    /// Allow a domain through the proxy: exact name, `*.example.com`, or an IP
    /// address. Repeatable; implies --net proxy.
    #[arg(long, value_name = "DOMAIN")]
    pub allow: Vec<String>,
    /// Deny a domain even if allowed (deny beats allow). Repeatable.
    #[arg(long, value_name = "DOMAIN")]
    pub deny: Vec<String>,
    /// Hide a file or directory from the command (in addition to the secret
    /// stores hidden by default: ~/.ssh, ~/.aws, ~/.gnupg, ~/.netrc, …). Repeatable.
    #[arg(long, value_name = "PATH")]
    pub hide: Vec<PathBuf>,
    /// Show a path that is hidden by default (e.g. --expose ~/.npmrc). Repeatable.
    #[arg(long, value_name = "PATH")]
    pub expose: Vec<PathBuf>,
    /// A writable, persistent cache at PATH that is not staged: the host's
    /// directory is read-only underneath, what runs add is kept in pvisor's
    /// cache store and shared by later runs (BuildKit's cache mounts).
    /// Presets: cargo, pip, npm. Repeatable. Never the workspace.
    #[arg(long, value_name = "PATH|PRESET")]
    pub cache: Vec<String>,
    /// Let the command connect to one host Unix socket (e.g. --expose-socket
    /// "$SSH_AUTH_SOCK"). Every other host socket is unreachable. Recorded in
    /// the Trace. Repeatable.
    #[arg(long, value_name = "PATH")]
    pub expose_socket: Vec<PathBuf>,
    /// Pass a variable whose name looks secret (*_TOKEN, *_SECRET, *_PASSWORD,
    /// *_API_KEY, AWS_*, SSH_AUTH_SOCK are removed otherwise). Repeatable.
    #[arg(long = "env", value_name = "NAME")]
    pub env: Vec<String>,
    /// Run without pvisor's seccomp filter (for tools that need user
    /// namespaces or mounts of their own). Recorded in the run's policy.
    #[arg(long)]
    pub no_seccomp: bool,
    /// Memory limit (e.g. 512M, 2G): a cgroup where possible, else an
    /// address-space rlimit. The run says how it was enforced.
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub memory: Option<u64>,
    /// Maximum number of processes and threads in the sandbox.
    #[arg(long, value_name = "N")]
    pub pids: Option<u64>,
    /// CPU limit in cores (e.g. 0.5, 2); needs a cgroup, else it is reported
    /// as not enforced.
    #[arg(long, value_name = "CORES")]
    pub cpus: Option<f64>,
    /// Disk quota for what the command writes (e.g. 500M, 20G): writes past
    /// it fail inside the sandbox with ENOSPC (XFS) or EDQUOT (ext4). Needs
    /// root and project quotas on the state directory's filesystem; the run
    /// says before it starts when the host cannot enforce it.
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub disk: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExecutorArg {
    Ns,
    Vm,
}

/// Suspend a running vm Job: save its execution state, then stop its VM.
///
/// The VM is quiesced (sync, filesystems frozen), stopped and saved as an
/// execution checkpoint (machine state, disks, a manifest with digests). Once
/// QEMU has exited, a termination receipt makes the Job `suspended`: apply and
/// drop wait until it is resumed and finished. Only vm Jobs can be suspended.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  pvisor suspend\n  pvisor suspend job-01JD4 && pvisor resume job-01JD4")]
pub struct SuspendArgs {
    pub job: Option<String>,
    /// Print the checkpoint manifest as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Resume a suspended vm Job in a new Attempt, in the foreground.
///
/// The saved VM is restored from its checkpoint (every file is verified
/// first), its filesystems are thawed, its clock is stepped and its entropy
/// reseeded; the command's output continues here and the final receipt belongs
/// to the new Attempt. Refused after `pvisor kill`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  pvisor resume\n  pvisor resume job-01JD4")]
pub struct ResumeArgs {
    pub job: Option<String>,
    /// Print nothing but the command's own output.
    #[arg(short, long)]
    pub quiet: bool,
}

fn size(s: &str) -> Result<u64, String> {
    pvisor_sandbox::limits::parse_size(s).ok_or_else(|| format!("{s:?} is not a size like 512M or 2G"))
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
        "h" => n.checked_mul(3_600_000)?,
        "d" => n.checked_mul(86_400_000)?,
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
    /// Also list the staged changes, as `pvisor review` does.
    #[arg(long)]
    pub review: bool,
}

/// Network modes on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NetArg {
    None,
    Proxy,
    Host,
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
    after_help = "Examples:\n  pvisor review                    the last Job's changes\n  pvisor review --diff src/        unified diffs of everything under src/\n  pvisor review job-01JD4 --json   one JSON object per change\n  pvisor diff                      same as review --diff"
)]
pub struct ReviewArgs {
    pub job: Option<String>,
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
/// directories skip them and say so (exit 1). A path that cannot be written
/// does not stop the others.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor apply --all                apply every remaining change of the last Job\n  pvisor apply job-01JD4 src/ README.md\n  pvisor apply '**/*.rs' --dry-run  what would happen\n  pvisor apply -i                   choose change by change, with diffs\n  pvisor apply -p src/main.rs       choose hunk by hunk (like git add -p)\n  printf 'y\\nn\\n' | pvisor apply -p   answers from a pipe, one per line\n  pvisor apply .git/hooks/pre-push  a sensitive path, named exactly\n\nExit status: 0 applied; 1 refused because of conflicts (nothing applied), or some paths skipped\n(sensitive) or not writable (the rest applied); 125 error."
)]
pub struct ApplyArgs {
    /// The Job (id or unique prefix) [default: the most recent]. A first argument that is not a job is taken as a path.
    pub job: Option<String>,
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
    /// Colour diffs: auto (on a terminal), always, never.
    #[arg(long, value_enum, default_value = "auto")]
    pub color: ColorChoice,
    /// List every path (by default more than 20 are summarised by directory).
    #[arg(long, short = 'v', conflicts_with = "quiet")]
    pub verbose: bool,
    /// Print no per-path lines, only problems and the one-line total.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// Discard staged changes: the remaining ones, or only those selected.
///
/// Drop never undoes changes already applied to the workspace.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor drop                 discard everything left in the last Job's stage\n  pvisor drop job-01JD4 build/"
)]
pub struct DropArgs {
    pub job: Option<String>,
    /// Paths or globs to drop [default: every remaining change].
    pub paths: Vec<String>,
    /// List every path (by default more than 20 are summarised by directory).
    #[arg(long, short = 'v', conflicts_with = "quiet")]
    pub verbose: bool,
    /// Print no per-path lines, only the one-line total.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// End a Job in any non-terminal state; the way out of `unknown`.
///
/// Kill first withdraws the Job's continuation rights. A live run is asked to
/// cancel (it still finalizes with a receipt) and is killed if it does not
/// stop within --grace. A Job with no confirmed result (`unknown`) is closed
/// as `lost`: recorded as lost, never as success. Its stage stays reviewable.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor kill job-01JD4\n  pvisor kill --grace 2s\n\nExit status: 0 when the Job has ended (or had already); 125 on error."
)]
pub struct KillArgs {
    pub job: Option<String>,
    /// How long a live run gets to cancel and publish its receipt before it is killed.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = humantime_duration)]
    pub grace: std::time::Duration,
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
    after_help = "Examples:\n  pvisor checkpoint\n  pvisor checkpoint job-01JD4\n  pvisor fork ckpt-01JD5 -- make test"
)]
pub struct CheckpointArgs {
    pub job: Option<String>,
    /// The kind of checkpoint: `workspace` (staged files of a stopped Job) or
    /// `execution` (the whole running VM of a vm Job: CPU, RAM, devices, disks).
    #[arg(long, default_value = "workspace", value_parser = ["workspace", "execution"])]
    pub kind: String,
    /// Print the execution checkpoint manifest as JSON.
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
    after_help = "Examples:\n  pvisor fork job-01JD4 -- sh -c 'make test'\n  pvisor fork ckpt-01JD5 --allow pypi.org -- pip install -e .\n  pvisor fork job-01JD4 --state execution        a second copy of a running VM"
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
    after_help = "Examples:\n  pvisor export                             the last Job, into $PVISOR_HOME/exports/\n  pvisor export -o run.pvisor.tar\n  pvisor export job-01JD4 -o /tmp/audit.tar"
)]
pub struct ExportArgs {
    pub job: Option<String>,
    /// Where to write the archive [default: <job>.pvisor.tar in the state
    /// directory's exports/, never silently into the workspace].
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Check a Run Bundle archive or a local Job: every digest and the receipt binding.
///
/// Says exactly which file fails. Exit 0 when everything verifies, 1 otherwise.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  pvisor verify run.pvisor.tar\n  pvisor verify job-01JD4")]
pub struct VerifyArgs {
    /// An archive file, or a Job id/prefix.
    pub target: String,
}

/// Bring an exported Run Bundle into this state directory as a read-only Job.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  PVISOR_HOME=/tmp/audit pvisor import run.pvisor.tar && PVISOR_HOME=/tmp/audit pvisor review --diff"
)]
pub struct ImportArgs {
    pub file: PathBuf,
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
    after_help = "Examples:\n  pvisor doctor\n  pvisor doctor --json | jq 'select(.status != \"ok\")'\n\nExit status: 0 when everything `pvisor run` needs works, 1 otherwise."
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
#[command(after_help = "Examples:\n  pvisor jobs\n  pvisor jobs --tree\n  pvisor jobs --json")]
pub struct JobsArgs {
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Show forks under the Jobs they came from.
    #[arg(long)]
    pub tree: bool,
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
