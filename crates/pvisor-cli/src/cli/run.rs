//! `pvisor run`'s syntax and the options it shares with suspend and resume,
//! with the value parsers (sizes, durations) every command's options use.

use std::path::PathBuf;

use clap::Args;

/// Run a command in a sandbox over a workspace; its writes are staged, not applied.
///
/// The workspace is mounted at its own path as an overlay: the command sees
/// your files and can change them freely, but every change lands in the Job's
/// stage. The rest of the filesystem is read-only, /tmp is private and the
/// network is loopback only. pvisor exits with the command's exit status.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  pvisor run -- sh -c 'echo hi > greeting'\n  pvisor run -w ../other-project -- cargo build\n  pvisor run --kill-grace 2s -- ./long-job.sh\n  pvisor run --session fix -- sh -c 'echo x > a'   then: pvisor run --session fix -- cat a\n  pvisor run --agent claude --session fix -- claude -p 'fix the failing test' --dangerously-skip-permissions\n  pvisor run --json -- make test 2>log   pvisor's lines as JSON; the `result` is last\n\nExit status: the command's own (128+N if killed by signal N); 125 if pvisor failed,\n126 if the program cannot be executed, 127 if it was not found."
)]
pub struct RunArgs {
    /// The workspace directory [default: the current directory].
    #[arg(short = 'w', long = "workspace", value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Run in session NAME: on top of everything its earlier runs in this
    /// workspace staged and nobody applied or dropped, adding this run's
    /// changes to them. Each run is its own Job; `review`, `diff`, `apply`,
    /// `drop`, `status` and `events` take `--session NAME` for all of them.
    /// Runs of one session wait for each other.
    #[arg(long, value_name = "NAME")]
    pub session: Option<String>,
    /// Agent state the command may write (e.g. ~/.claude, ~/.claude.json):
    /// a directory or regular file under $HOME (or not there yet: an empty
    /// directory). The run writes its own copy, never the host's; the next
    /// run of a --session carries it, except gated changes (settings,
    /// hooks, MCP servers, instruction files) until `pvisor state approve`.
    /// Not staged: `pvisor review --state` shows it. Repeatable.
    #[arg(long, value_name = "PATH")]
    pub state: Vec<PathBuf>,
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
    /// With --executor vm: run the command in the imported root filesystem
    /// NAME (`pvisor image ls`; built-in: default, python) instead of the
    /// guest's minimal one, so glibc programs run. The image is read-only
    /// underneath (writes outside the workspace are thrown away), the
    /// workspace is at its own path inside it and is the command's cwd.
    #[arg(long, value_name = "NAME")]
    pub image: Option<String>,
    /// How long a cancelled command may take to exit before it is killed.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime_duration)]
    pub kill_grace: std::time::Duration,
    /// Record a label on the Job (`pvisor jobs --label KEY=VALUE` finds it).
    /// Repeatable.
    #[arg(long, value_name = "KEY=VALUE", value_parser = pvisor_core::labels::parse_assigned)]
    pub label: Vec<(String, String)>,
    /// Print nothing but the command's own output.
    #[arg(short, long)]
    pub quiet: bool,
    /// After the run, say where its time went, phase by phase (startup,
    /// admission, sandbox setup and its steps, the command, sealing, the
    /// Bundle, finalization), read from its Trace; a `timings` line under
    /// --json. Shown even with --quiet.
    #[arg(long)]
    pub timings: bool,
    /// pvisor's own lines on stderr as JSON Lines, ending with one `result`
    /// (or `error`) line; the command's stdout and stderr pass through as they are.
    #[arg(long)]
    pub json: bool,
    /// Run a coding agent with its preset: claude, codex, gemini, opencode,
    /// aider, or your config's [agents.NAME]. Its home state gets a writable
    /// copy-on-write layer kept with the Job (never the host's files), its
    /// API hosts are allowed (and the host of a base URL you set, such as
    /// ANTHROPIC_BASE_URL), its API key is brokered by pvisor's proxy (the
    /// sandbox holds a placeholder), and its variables are set. pvisor says
    /// in one line what the preset granted.
    #[arg(long, value_name = "NAME")]
    pub agent: Option<String>,
    /// Network: none (loopback only, the default), proxy (only the --allow'ed
    /// domains, through pvisor's proxy), host (shared, bypassable).
    #[arg(long = "net", value_enum, value_name = "MODE")]
    pub net: Option<NetArg>,
    /// Allow a destination through the proxy: exact name, `*.example.com`, or
    /// an IP address, optionally with a port (`example.com:443`,
    /// `127.0.0.1:8000`, `[::1]:8000`); a loopback rule must name a port.
    /// Repeatable; implies --net proxy.
    #[arg(long, value_name = "RULE")]
    pub allow: Vec<String>,
    /// Deny a destination even if allowed (deny beats allow), in the same
    /// form as --allow. Repeatable.
    #[arg(long, value_name = "RULE")]
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
    /// Show a host file or directory read-only at its own path where the
    /// sandbox would not see it otherwise: a tool tree under /tmp or /run
    /// (e.g. --ro /tmp/node-v22/bin). Host sockets beneath stay
    /// unreachable and hidden secret stores stay hidden. Repeatable.
    #[arg(long = "ro", value_name = "PATH")]
    pub read_only: Vec<PathBuf>,
    /// Pass a variable that looks secret by name (*TOKEN*, *SECRET*,
    /// *PASSWORD*, *_PASS, *_PWD, *AUTH*, *CREDENTIALS*, *_KEY,
    /// *_CONNECTION_STRING, AWS_*, SSH_AUTH_SOCK) or by value (a URL with
    /// user:password@, a connection string's AccountKey=/Password=, a PEM
    /// private key, a ghp_/glpat-/xoxb-/sk-/AKIA/AIza token, a JWT): these
    /// are removed otherwise. Repeatable.
    #[arg(long = "env", value_name = "NAME")]
    pub env: Vec<String>,
    /// Let the command use the value of host variable VAR without holding
    /// it: inside, VAR is a placeholder, and pvisor's proxy puts the value
    /// into the headers of requests to HOST (on PORT, if given) alone,
    /// terminating TLS for that host with a per-run CA the sandbox trusts.
    /// HOST must be allowed (--allow) too. Repeatable; ns executor only.
    #[arg(long = "secret", value_name = "VAR@HOST[:PORT]")]
    pub secret: Vec<pvisor_net::broker::BindingSpec>,
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
#[command(
    after_help = "Examples:\n  pvisor suspend\n  pvisor suspend job-01JD4 && pvisor resume job-01JD4\n  pvisor suspend --json | jq 'select(.type == \"result\") | .data.checkpoint'"
)]
pub struct SuspendArgs {
    pub job: Option<String>,
    /// JSON Lines on stdout: the checkpoint manifest, then one `result` line.
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
#[command(
    after_help = "Examples:\n  pvisor resume\n  pvisor resume job-01JD4\n  pvisor resume job-01JD4 --json   pvisor's lines on stderr as JSON, as `run --json`"
)]
pub struct ResumeArgs {
    pub job: Option<String>,
    /// Print nothing but the command's own output.
    #[arg(short, long)]
    pub quiet: bool,
    /// pvisor's own lines on stderr as JSON Lines, ending with one `result`
    /// (or `error`) line, as `run --json`.
    #[arg(long)]
    pub json: bool,
}

/// A command-line value that does not parse; clap shows the message. (The
/// binary has no `thiserror`: docs/dependencies.md keeps it to libraries.)
#[derive(Debug)]
pub(super) enum ValueError {
    Size(String),
    Duration(String),
}

impl std::fmt::Display for ValueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Size(s) => write!(f, "{s:?} is not a size like 512M or 2G"),
            Self::Duration(s) => write!(f, "{s:?} is not a duration like 500ms, 10s or 2m"),
        }
    }
}

impl std::error::Error for ValueError {}

pub(super) fn size(s: &str) -> Result<u64, ValueError> {
    pvisor_sandbox::limits::parse_size(s).ok_or_else(|| ValueError::Size(s.to_owned()))
}

/// `KEY=VALUE`, checked as admission will check it: a selector.
pub(super) fn label(s: &str) -> Result<(String, String), pvisor_core::labels::LabelError> {
    pvisor_core::labels::parse(s)
}

pub(super) fn humantime_duration(s: &str) -> Result<std::time::Duration, ValueError> {
    parse_duration(s).ok_or_else(|| ValueError::Duration(s.to_owned()))
}

pub(super) fn parse_duration(s: &str) -> Option<std::time::Duration> {
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

/// Network modes on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NetArg {
    None,
    Proxy,
    Host,
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
}
