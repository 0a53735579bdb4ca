//! Command-line syntax. The doc comment on each argument struct is its help text.
//!
//! This module holds the top level (`Cli`, `Command`) and the commands that
//! manage pvisor itself (serve, image, cache, completions, man); `run` holds
//! `pvisor run` and what shares its options (suspend, resume), and `jobs` the
//! commands that read and change Jobs.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

mod jobs;
mod run;

use run::humantime_duration;

pub use jobs::*;
pub use run::*;

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
    Mcp(McpArgs),
    Image(ImageArgs),
    Trust(TrustArgs),
    Cache(CacheArgs),
    State(StateArgs),
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
    Prune {
        paths: Vec<PathBuf>,
        /// A `result` line (JSON) instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Serve pvisor to an agent over the Model Context Protocol (stdio).
///
/// Tools: run (alone or in a session, whose runs stack), review, diff,
/// apply, drop, status, jobs; resources: each Job's Trace and receipt.
/// Every run is staged: nothing reaches the workspace until apply. The
/// command's output is captured and returned, sanitised, with its result;
/// pvisor's own log goes to stderr.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  claude mcp add pvisor -- pvisor mcp            Claude Code, in the project directory\n  codex mcp add pvisor -- pvisor mcp             Codex\n  pvisor mcp -w ~/src/app                        the default workspace of every tool\n\nCursor (.cursor/mcp.json): {\"mcpServers\": {\"pvisor\": {\"command\": \"pvisor\", \"args\": [\"mcp\"]}}}"
)]
pub struct McpArgs {
    /// The workspace tools use when a call names none, and the directory
    /// every workspace a call names must lie in [default: the current directory].
    #[arg(short = 'w', long = "workspace", value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Let calls name any workspace, not only the one of -w and what lies
    /// beneath it (never pvisor's state, nor a secret store such as ~/.ssh).
    #[arg(long)]
    pub any_workspace: bool,
    /// The log level on stderr (error, warn, info, debug, trace) [default: warn].
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
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
    /// The most client connections held open at once (at most a quarter of
    /// one from a single address). Over it, a new connection takes the place
    /// of the oldest idle one. Default: what the descriptor limit allows, up to 1024.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(4..=65536))]
    pub max_connections: Option<u32>,
    /// A host directory a create's `host` volumes may name (it, or a
    /// directory below it). Repeatable. Without one, host volumes are off.
    #[arg(long, value_name = "DIR")]
    pub volume_root: Vec<PathBuf>,
    /// Where named (`pvc`) volumes live, one directory each, made on first
    /// use. Default: beside the state directory (`<PVISOR_HOME>-volumes`).
    #[arg(long, value_name = "DIR")]
    pub volume_dir: Option<PathBuf>,
}

/// Manage the root filesystems `pvisor serve` sandboxes boot (the `image` of a create).
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor image import python:3.11 ./rootfs-dir\n  pvisor image import alpine rootfs.tar.gz\n  pvisor image import myapp:1 ./oci-layout     (skopeo copy ... oci:DIR)\n  pvisor image ls --json\n  pvisor image warm                 build the vm template (once per machine shape)\n  pvisor image templates --json\n\nThe image `default` (sh, bash, coreutils) is imported by `pvisor serve` from\nscripts/sandbox-image.sh's build."
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
        /// A `result` line (JSON) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List imported images.
    Ls {
        /// One JSON object per image.
        #[arg(long)]
        json: bool,
    },
    /// Build the vm template new sandboxes start from (a saved, freshly
    /// booted guest), so the first start does not boot. One template serves
    /// every image of one machine shape; NAME, if given, must be imported.
    Warm {
        /// An imported image whose sandboxes will use it (default: any).
        name: Option<String>,
        /// The guest RAM of the sandboxes to warm for.
        #[arg(long, default_value = "512")]
        memory_mib: u64,
        #[arg(long, default_value = "1")]
        cpus: u32,
        /// A `result` line (JSON) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List the vm templates kept: size, machine shape, and whether stale.
    Templates {
        #[arg(long)]
        json: bool,
    },
    /// Remove a vm template (the next vm start rebuilds it).
    RmTemplate {
        /// A template id from `pvisor image templates`.
        id: String,
        /// A `result` line (JSON) instead of text.
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
    /// Host directories shared with the VM (a JSON list), for a new sandbox.
    #[arg(long)]
    pub volumes: Option<String>,
    /// The daemon's --log-level, passed down (else PVISOR_LOG, else info).
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
