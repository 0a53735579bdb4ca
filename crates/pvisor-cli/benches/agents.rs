//! A coding agent's scripted turn, on the host and inside pvisor.
//!
//! `cargo bench -p pvisor-cli --bench agents` plays one scripted turn (write
//! a file, run a command, answer) of Claude Code and of Codex against
//! `tests/agents/model_server.py` on loopback: directly on the host (the
//! yardstick) and inside `pvisor run --agent NAME` (ns). It prints the median of each with its spread and the ratio to the host turn
//! measured in the same run.
//!
//! It needs the agents `scripts/agents-env.sh` installs; without them it
//! says so and measures nothing. Under `cargo test` (no `--bench`) it plays
//! each turn once, as a smoke test.

// A benchmark program: it writes fixtures and says what it measured or
// skipped; clippy.toml's lints are for the libraries' own code.
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

#[path = "support/table.rs"]
mod table;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const KEY: &str = "sk-bench-key";

struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn server(dir: &Path, ws: &Path) -> Server {
    let script = serde_json::json!([
        {"write": {"path": ws.join("hello.py"), "content": "print('hello')\n"}},
        {"bash": "python3 hello.py > out.txt"},
        {"say": "Done."},
    ]);
    std::fs::write(dir.join("script.json"), script.to_string()).expect("write the script");
    let port_file = dir.join("port");
    let child = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/agents/model_server.py"))
        .args(["--script", "script.json", "--log", "requests.jsonl", "--port-file", "port"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .spawn()
        .expect("python3");
    let started = Instant::now();
    while !port_file.exists() && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let port = std::fs::read_to_string(&port_file)
        .expect("the model server's port")
        .trim()
        .parse()
        .expect("a port number");
    Server { child, port }
}

/// How one agent is run: its program and arguments, and its variables.
struct Agent {
    name: &'static str,
    argv: Vec<String>,
    env: Vec<(String, String)>,
}

fn agents(bin: &Path, port: u16) -> Vec<Agent> {
    let claude = Agent {
        name: "claude",
        argv: ["-p", "go", "--dangerously-skip-permissions", "--output-format", "json"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        env: vec![
            ("ANTHROPIC_API_KEY".into(), KEY.into()),
            ("ANTHROPIC_BASE_URL".into(), format!("http://127.0.0.1:{port}")),
            ("IS_SANDBOX".into(), "1".into()),
        ],
    };
    let base_url = format!("http://127.0.0.1:{port}/v1");
    let provider = format!(
        "model_providers.scripted={{name=\"scripted\",base_url=\"{base_url}\",wire_api=\"responses\",env_key=\"OPENAI_API_KEY\",supports_websockets=false}}"
    );
    let codex = Agent {
        name: "codex",
        argv: [
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "-m",
            "scripted-model",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(["-c".into(), "model_provider=scripted".into(), "-c".into(), provider, "go".into()])
        .collect(),
        env: vec![("OPENAI_API_KEY".into(), KEY.into()), ("OPENAI_BASE_URL".into(), base_url)],
    };
    let mut both = vec![claude, codex];
    for agent in &mut both {
        agent.argv.insert(0, bin.join(agent.name).to_string_lossy().into_owned());
    }
    both
}

/// Runs `prefix` + the agent's command in `ws` with `home`; returns how long it took.
fn turn(agent: &Agent, prefix: &[String], ws: &Path, home: &Path) -> Duration {
    let _ = std::fs::remove_file(ws.join("hello.py"));
    let argv: Vec<&String> = prefix.iter().chain(&agent.argv).collect();
    let started = Instant::now();
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .current_dir(ws)
        .env("HOME", home)
        .env("PVISOR_HOME", home.join("state"))
        .envs(agent.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .expect("run");
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("Done."),
        "{} {:?}: {}\n{}",
        agent.name,
        prefix,
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

fn median(mut times: Vec<Duration>) -> (Duration, Duration, Duration) {
    times.sort();
    (times[times.len() / 2], times[0], times[times.len() - 1])
}

/// The agents' binaries at `shelf`, which the sandbox sees: a checkout
/// under /tmp is hidden by the sandbox's own /tmp. Hard links where the
/// filesystem allows (the binaries are hundreds of MB), else copies.
fn visible_in_the_sandbox(bin: &Path, shelf: &Path) -> std::path::PathBuf {
    std::fs::create_dir_all(shelf).expect("the agents' shelf");
    for name in ["claude", "codex"] {
        let source = std::fs::canonicalize(bin.join(name)).expect("an installed agent");
        let target = shelf.join(name);
        std::fs::hard_link(&source, &target)
            .or_else(|_| std::fs::copy(&source, &target).map(drop))
            .expect("the agent on its shelf");
    }
    shelf.to_owned()
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let iterations = if benching { 9 } else { 1 };
    let bin = Path::new(env!("CARGO_BIN_EXE_pvisor"))
        .parent()
        .and_then(Path::parent)
        .expect("target/")
        .join("agents/bin");
    if !bin.join("claude").exists() {
        println!("agents: skipped: the coding agents are not installed (scripts/agents-env.sh)");
        return;
    }
    // A home outside /tmp, which a sandbox has its own of.
    let dir = tempfile::Builder::new()
        .prefix("pvisor-bench-agents-")
        .tempdir_in("/var/tmp")
        .expect("a directory under /var/tmp");
    let (ws, home) = (dir.path().join("ws"), dir.path().join("home"));
    for d in [&ws, &home] {
        std::fs::create_dir_all(d).expect("create the workspace and home");
    }
    let bin = visible_in_the_sandbox(&bin, &dir.path().join("bin"));
    let server = server(dir.path(), &ws);
    let pvisor = env!("CARGO_BIN_EXE_pvisor").to_owned();
    println!("{:<8} {:<28} {:>10} {:>20} {:>8}", "agent", "where", "median", "spread", "ratio");
    for agent in agents(&bin, server.port) {
        let ns: Vec<String> =
            [&pvisor, "run", "-q", "--agent", agent.name, "--"].iter().map(|s| s.to_string()).collect();
        let wheres: [(&str, Vec<String>); 2] =
            [("host (yardstick)", Vec::new()), ("pvisor run --agent (ns)", ns)];
        let mut host = None;
        for (label, prefix) in wheres {
            let times: Vec<Duration> = (0..iterations).map(|_| turn(&agent, &prefix, &ws, &home)).collect();
            let (mid, low, high) = median(times);
            let base = *host.get_or_insert(mid);
            if !prefix.is_empty() {
                let ms = |d: Duration| d.as_secs_f64() * 1e3;
                let measure = format!("{} turn, pvisor run --agent", agent.name);
                table::row(
                    &measure,
                    "ms",
                    ms(mid),
                    Some((ms(low), ms(high))),
                    "the same turn on the host",
                    ms(base),
                );
            }
            println!(
                "{:<8} {:<28} {:>8.0}ms {:>9.0}–{:.0}ms {:>7.2}×",
                agent.name,
                label,
                mid.as_secs_f64() * 1e3,
                low.as_secs_f64() * 1e3,
                high.as_secs_f64() * 1e3,
                mid.as_secs_f64() / base.as_secs_f64()
            );
        }
        // pvisor's Jobs from this agent's turns are not what is measured.
        let _ = std::fs::remove_dir_all(home.join("state"));
    }
}
