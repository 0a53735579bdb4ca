//! Real coding agents inside pvisor: Claude Code and Codex, the pinned npm
//! releases `scripts/agents-env.sh` installs, each driven through one scripted
//! turn by `tests/agents/model_server.py` on the host's loopback: write a
//! file, run a command that commits, plant a hook in the agent's own
//! settings; then a second run in the same session resumes the conversation.
//!
//! What each asserts, as a user would check it: the edits are staged exactly
//! and the workspace is untouched; the agent's state is in neither the
//! workspace's stage nor the host's home; the model server received the real
//! key while the sandbox's environment, its files and pvisor's records never
//! held it; the resumed run continues the conversation; the commit applies
//! as a commit; the planted hook does not run in the next run (and, shown
//! on the host, would have).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::*;

/// The API key the host holds: it must reach the model server and nothing else.
const REAL_KEY: &str = "sk-ant-e2e-REAL-9f3b2c71d4e8a6";
const NEEDS: &str = "needs the coding agents from npm (scripts/agents-env.sh) and python3";

/// The agents' binaries, at a path every test user can execute and the
/// sandbox sees (a checkout may sit in a 0700 directory, and /tmp is the
/// sandbox's own): copied once to a shelf under /var/tmp.
fn agent_bin(name: &str) -> PathBuf {
    let built = Path::new(env!("CARGO_BIN_EXE_pvisor")).parent().unwrap().parent().unwrap().join("agents");
    let installed = fs::read_to_string(built.join(".installed"))
        .unwrap_or_else(|_| panic!("{NEEDS}: {} is missing", built.display()));
    let source = fs::canonicalize(built.join("bin").join(name)).unwrap();
    let key: String = installed.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    let shelf = Path::new("/var/tmp/pvisor-e2e-agents").join(key);
    let copy = shelf.join(name);
    if !copy.exists() {
        fs::create_dir_all(&shelf).unwrap();
        let tmp = shelf.join(format!("{name}.{}", std::process::id()));
        fs::copy(&source, &tmp).unwrap();
        fs::rename(&tmp, &copy).unwrap();
    }
    for dir in [shelf.parent().unwrap(), &shelf] {
        fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    copy
}

/// The scripted model server, stopped when dropped.
struct ModelServer {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl ModelServer {
    fn start(dir: &Path, script: &serde_json::Value) -> Self {
        let script_file = dir.join("script.json");
        fs::write(&script_file, script.to_string()).unwrap();
        let (log, port_file) = (dir.join("requests.jsonl"), dir.join("port"));
        let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/agents/model_server.py");
        let child = Command::new("python3")
            .arg(server)
            .arg("--script")
            .arg(&script_file)
            .arg("--log")
            .arg(&log)
            .arg("--port-file")
            .arg(&port_file)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{NEEDS}: {e}"));
        assert!(wait_until(Duration::from_secs(10), || port_file.exists()), "the model server did not start");
        let port = fs::read_to_string(&port_file).unwrap().trim().parse().unwrap();
        Self { child, port, log }
    }

    /// Every request the agent sent, in order.
    fn requests(&self) -> Vec<serde_json::Value> {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `path` holds `needle`: read a MiB at a time, skipping holes (a
/// VM's sparse disks are gigabytes of them).
fn file_holds(path: &Path, needle: &[u8]) -> bool {
    use rustix::fs::SeekFrom;
    use std::os::unix::fs::FileExt;
    let file = fs::File::open(path).unwrap();
    let len = file.metadata().unwrap().len();
    let (mut offset, mut buf) = (0u64, vec![0u8; 1 << 20]);
    while let Ok(data) = rustix::fs::seek(&file, SeekFrom::Data(offset)) {
        let end = rustix::fs::seek(&file, SeekFrom::Hole(data)).unwrap_or(len);
        // Each read starts a needle's length early, so no match straddles two.
        offset = data.saturating_sub(needle.len() as u64);
        while offset < end {
            let n = file.read_at(&mut buf, offset).unwrap();
            if n == 0 {
                break;
            }
            if buf[..n].windows(needle.len()).any(|w| w == needle) {
                return true;
            }
            offset += (n as u64).saturating_sub(needle.len() as u64).max(1);
        }
        offset = end;
    }
    false
}

/// A home outside /tmp (the sandbox's /tmp is its own), holding the
/// workspace (a git repository with one commit) and pvisor's state, with
/// host agent state that must come out unchanged.
fn agent_env(who: As) -> Env {
    let env = Env::new_in(who, Path::new("/var/tmp"));
    let home = env.dir.path();
    fs::create_dir_all(home.join(".claude")).unwrap();
    fs::write(home.join(".claude/settings.json"), "{\"theme\": \"dark\"}\n").unwrap();
    fs::write(home.join(".claude.json"), "{\"numStartups\": 1}\n").unwrap();
    fs::create_dir_all(home.join(".codex")).unwrap();
    fs::write(home.join(".codex/config.toml"), "# the user's own\n").unwrap();
    git(&env.ws, &["init", "-q", "-b", "main"]);
    git(&env.ws, &["commit", "-q", "--allow-empty", "-m", "init"]);
    env.give_away(home);
    env
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.email=e2e@example.invalid", "-c", "user.name=e2e", "-c", "safe.directory=*"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// The host's agent state: everything in the home but the workspace,
/// pvisor's own state directory and its registry of them, and the model
/// server's files.
fn host_state(env: &Env) -> BTreeMap<PathBuf, (u32, u64, i64, Vec<u8>)> {
    let (ws, state) =
        (env.ws.strip_prefix(env.dir.path()).unwrap(), env.home.strip_prefix(env.dir.path()).unwrap());
    let (requests, script) = (Path::new("requests.jsonl"), Path::new("script.json"));
    snapshot(env.dir.path())
        .into_iter()
        .filter(|(p, _)| !p.starts_with(ws) && !p.starts_with(state) && p != requests && p != script)
        .filter(|(p, _)| !p.starts_with(".local/state") && p != Path::new(".local"))
        .collect()
}

/// The turn both agents play. `ws` is the workspace; the hook step plants
/// `hook` (a settings file that makes the next start touch HOOK_RAN).
fn script(ws: &Path, hook: (&str, &str)) -> serde_json::Value {
    let ws = ws.display();
    serde_json::json!([
        {"write": {"path": format!("{ws}/hello.py"), "content": "print('hello')\n"}},
        {"bash": "python3 hello.py > out.txt && env > env.txt && tr '\\0' '\\n' < /proc/self/environ > environ.txt \
                  && git add hello.py out.txt && git -c user.email=agent@example.invalid -c user.name=agent commit -qm 'add hello'"},
        {"bash": format!("mkdir -p \"$(dirname {0})\" && printf '%s' '{1}' > {0}", hook.0, hook.1)},
        {"say": "Done."},
        {"bash": "echo resumed > resumed.txt"},
        {"say": "Resumed."},
    ])
}

fn claude_hook(ws: &Path) -> String {
    let command = format!("touch {}/HOOK_RAN", ws.display());
    serde_json::json!({"hooks": {"SessionStart": [{"hooks": [{"type": "command", "command": command}]}]}})
        .to_string()
}

/// The files a run staged (paths relative to the workspace), and the refs
/// its commits move (review's `commit` lines).
fn staged(env: &Env, session: &str) -> (BTreeMap<String, serde_json::Value>, Vec<serde_json::Value>) {
    let out = env.expect(&["review", "--session", session, "--json"], 0);
    let lines = json_lines(&out);
    let of = |kind: &str| lines.iter().filter(|(k, _)| k == kind).map(|(_, v)| v.clone()).collect::<Vec<_>>();
    let changes = of("change").into_iter().map(|c| (c["path"].as_str().unwrap().to_owned(), c)).collect();
    (changes, of("commit"))
}

/// Asserts no regular file under `root` holds `needle` (pvisor's records,
/// the stage, the VM's disks), never following a symlink.
fn nowhere_under(root: &Path, needle: &str) {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap().flatten() {
            let (path, kind) = (entry.path(), entry.file_type().unwrap());
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                assert!(!file_holds(&path, needle.as_bytes()), "{} holds the real key", path.display());
            }
        }
    }
}

fn claude_runs_a_turn_resumes_and_its_commit_applies(who: As) {
    who.require();
    let claude = agent_bin("claude");
    let env = agent_env(who);
    let server = ModelServer::start(
        env.dir.path(),
        &script(&env.ws, ("~/.claude/settings.json", &claude_hook(&env.ws))),
    );
    let host_before = host_state(&env);
    let ws_before = snapshot(&env.ws);
    let base_url = format!("http://127.0.0.1:{}", server.port);
    let claude = claude.to_str().unwrap();
    let turn = |prompt: &[&str]| {
        let mut args = vec!["run", "--agent", "claude", "--session", "agent", "--", claude, "-p"];
        args.extend(prompt);
        args.extend(["--dangerously-skip-permissions", "--output-format", "json"]);
        let out = env
            .command(&args)
            .env("ANTHROPIC_API_KEY", REAL_KEY)
            .env("ANTHROPIC_BASE_URL", &base_url)
            .output()
            .unwrap();
        assert!(out.status.success(), "claude {prompt:?}: {}\n{}", text(&out.stdout), text(&out.stderr));
        let stdout = text(&out.stdout);
        let result: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        (result["result"].as_str().unwrap_or_default().to_owned(), text(&out.stderr))
    };

    let (answer, said) = turn(&["write hello"]);
    assert_eq!(answer, "Done.", "the scripted turn ran to its end: {said}");
    assert!(said.contains("agent claude:"), "pvisor said what the preset granted: {said}");
    let (answer, _) = turn(&["go on", "--continue"]);
    assert_eq!(answer, "Resumed.", "--continue resumed the conversation (a fresh one starts at step 0)");

    // The edits are staged exactly; the workspace is untouched.
    assert_eq!(snapshot(&env.ws), ws_before, "the workspace is untouched until apply");
    let (changes, commits) = staged(&env, "agent");
    for path in ["hello.py", "out.txt", "env.txt", "environ.txt", "resumed.txt"] {
        assert!(changes.contains_key(path), "{path} is staged: {:?}", changes.keys());
    }
    assert!(
        commits.iter().any(|c| c["ref"] == "refs/heads/main"),
        "the commit is one line for its branch: {commits:?}"
    );
    assert!(!changes.contains_key("HOOK_RAN"), "the hook planted by the first run did not run in the second");
    assert!(
        changes.keys().all(|p| !p.contains(".claude")),
        "agent state is not in the stage: {:?}",
        changes.keys()
    );
    // The host's agent state is exactly as it was.
    assert_eq!(host_state(&env), host_before, "the host's ~/.claude and ~/.claude.json are unchanged");

    // The model server got the real key; the sandbox never held it.
    let requests = server.requests();
    let keyed: Vec<_> =
        requests.iter().filter(|r| r["path"].as_str().unwrap().starts_with("/v1/messages")).collect();
    assert!(keyed.len() >= 5, "one request per step: {}", keyed.len());
    for request in keyed {
        assert_eq!(request["headers"]["x-api-key"], REAL_KEY, "the proxy put the real key into the request");
    }
    nowhere_under(&env.home, REAL_KEY);

    // The commit applies as a commit; the hook never ran, here either.
    let out = env.pvisor(&["apply", "--session", "agent", "--all"]);
    assert!(out.status.success(), "apply: {}\n{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(git(&env.ws, &["log", "--format=%s", "-1"]).trim(), "add hello");
    git(&env.ws, &["fsck", "--strict"]);
    assert_eq!(
        git(&env.ws, &["status", "--porcelain", "--", "hello.py", "out.txt"]),
        "",
        "the commit's files match"
    );
    assert!(!env.ws.join("HOOK_RAN").exists());
    assert_eq!(host_state(&env), host_before);
}

#[test]
#[ignore = "needs root, and the coding agents from npm (scripts/agents-env.sh)"]
fn claude_code_as_root() {
    claude_runs_a_turn_resumes_and_its_commit_applies(As::Root);
}

#[test]
#[ignore = "needs the coding agents from npm (scripts/agents-env.sh)"]
fn claude_code_rootless() {
    claude_runs_a_turn_resumes_and_its_commit_applies(As::Rootless);
}

/// The probe behind "the hook did not run": the same settings file, in a
/// home the agent runs with on the host, does make Claude Code run it.
#[test]
#[ignore = "needs the coding agents from npm (scripts/agents-env.sh)"]
fn the_planted_claude_hook_runs_when_nothing_stops_it() {
    let claude = agent_bin("claude");
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    fs::create_dir_all(dir.path().join(".claude")).unwrap();
    fs::create_dir(&ws).unwrap();
    fs::write(dir.path().join(".claude/settings.json"), claude_hook(&ws)).unwrap();
    let server = ModelServer::start(dir.path(), &serde_json::json!([{"say": "Done."}]));
    let out = Command::new(claude)
        .args(["-p", "hi", "--dangerously-skip-permissions", "--output-format", "json"])
        .current_dir(&ws)
        .env("HOME", dir.path())
        .env("IS_SANDBOX", "1")
        .env("ANTHROPIC_API_KEY", "sk-probe")
        .env("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{}", server.port))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(ws.join("HOOK_RAN").exists(), "the hook ran on the host, so its absence inside means something");
}

fn codex_runs_a_turn_resumes_and_its_commit_applies(who: As) {
    who.require();
    let codex = agent_bin("codex");
    let env = agent_env(who);
    let notify = format!("notify = [\"touch\", \"{}/HOOK_RAN\"]\n", env.ws.display());
    let server = ModelServer::start(env.dir.path(), &script(&env.ws, ("~/.codex/config.toml", &notify)));
    let host_before = host_state(&env);
    let ws_before = snapshot(&env.ws);
    let base_url = format!("http://127.0.0.1:{}/v1", server.port);
    let provider = format!(
        "model_providers.scripted={{name=\"scripted\",base_url=\"{base_url}\",wire_api=\"responses\",env_key=\"OPENAI_API_KEY\",supports_websockets=false}}"
    );
    let codex = codex.to_str().unwrap();
    let turn = |tail: &[&str]| {
        let mut args = vec!["run", "--agent", "codex", "--session", "agent", "--", codex, "exec"];
        args.extend([
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "-m",
            "scripted-model",
        ]);
        args.extend(["-c", "model_provider=scripted", "-c", &provider]);
        args.extend(tail);
        let out = env
            .command(&args)
            .env("OPENAI_API_KEY", REAL_KEY)
            .env("OPENAI_BASE_URL", &base_url)
            .output()
            .unwrap();
        assert!(out.status.success(), "codex {tail:?}: {}\n{}", text(&out.stdout), text(&out.stderr));
        text(&out.stdout)
    };
    assert!(turn(&["write hello"]).contains("Done."));
    assert!(turn(&["resume", "--last", "go on"]).contains("Resumed."), "resume continued the conversation");

    assert_eq!(snapshot(&env.ws), ws_before, "the workspace is untouched until apply");
    let (changes, commits) = staged(&env, "agent");
    for path in ["hello.py", "out.txt", "env.txt", "environ.txt", "resumed.txt"] {
        assert!(changes.contains_key(path), "{path} is staged: {:?}", changes.keys());
    }
    assert!(
        commits.iter().any(|c| c["ref"] == "refs/heads/main"),
        "the commit is one line for its branch: {commits:?}"
    );
    assert!(
        changes.keys().all(|p| !p.contains(".codex")),
        "agent state is not in the stage: {:?}",
        changes.keys()
    );
    assert!(!changes.contains_key("HOOK_RAN"), "the notify program planted by the first run did not run");
    assert_eq!(host_state(&env), host_before, "the host's ~/.codex is unchanged");
    let requests = server.requests();
    let keyed: Vec<_> =
        requests.iter().filter(|r| r["path"].as_str().unwrap().ends_with("/responses")).collect();
    assert!(keyed.len() >= 5, "one request per step: {}", keyed.len());
    for request in keyed {
        assert_eq!(request["headers"]["authorization"], format!("Bearer {REAL_KEY}"));
    }
    nowhere_under(&env.home, REAL_KEY);

    let out = env.pvisor(&["apply", "--session", "agent", "--all"]);
    assert!(out.status.success(), "apply: {}\n{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(git(&env.ws, &["log", "--format=%s", "-1"]).trim(), "add hello");
    git(&env.ws, &["fsck", "--strict"]);
    assert_eq!(host_state(&env), host_before);
}

#[test]
#[ignore = "needs root, and the coding agents from npm (scripts/agents-env.sh)"]
fn codex_as_root() {
    codex_runs_a_turn_resumes_and_its_commit_applies(As::Root);
}

#[test]
#[ignore = "needs the coding agents from npm (scripts/agents-env.sh)"]
fn codex_rootless() {
    codex_runs_a_turn_resumes_and_its_commit_applies(As::Rootless);
}

/// The sandbox-image build's python userland with the agents' binaries in
/// `/usr/local/bin`, imported as `agents` into `env`'s state directory.
fn import_agents_image(env: &Env) {
    let built = Path::new(env!("CARGO_BIN_EXE_pvisor")).parent().unwrap().parent().unwrap();
    let source = built.join("sandbox-image-python/rootfs");
    assert!(
        source.join("bin/sh").exists(),
        "no python userland at {}: run scripts/sandbox-image.sh",
        source.display()
    );
    let rootfs = env.dir.path().join("agents-rootfs");
    let copied = Command::new("cp").arg("-a").arg(&source).arg(&rootfs).status().unwrap();
    assert!(copied.success());
    for agent in ["codex", "claude"] {
        fs::copy(agent_bin(agent), rootfs.join("usr/local/bin").join(agent)).unwrap();
    }
    env.give_away(&rootfs);
    let out = env.pvisor(&["image", "import", "agents", rootfs.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Codex (a static binary) in a microVM with a Debian userland: the model
/// server on the host's loopback gets the real key through the proxy, the
/// guest holds a placeholder, and the edits and the commit are staged and
/// apply. (The VM's home is its own, thrown away with it: no state carries.)
fn codex_in_a_vm_edits_commits_and_never_holds_the_key(who: As) {
    who.require();
    assert!(vm_image().is_some(), "needs the vm guest image: run scripts/vm-image.sh");
    let env = agent_env(who);
    import_agents_image(&env);
    let server = ModelServer::start(env.dir.path(), &script(&env.ws, ("/tmp/unused", "x")));
    let ws_before = snapshot(&env.ws);
    let base_url = format!("http://127.0.0.1:{}/v1", server.port);
    let provider = format!(
        "model_providers.scripted={{name=\"scripted\",base_url=\"{base_url}\",wire_api=\"responses\",env_key=\"OPENAI_API_KEY\",supports_websockets=false}}"
    );
    let mut args =
        vec!["run", "--executor", "vm", "--image", "agents", "--agent", "codex", "--", "codex", "exec"];
    args.extend([
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "-m",
        "scripted-model",
    ]);
    args.extend(["-c", "model_provider=scripted", "-c", &provider, "write hello"]);
    let out = env
        .command(&args)
        .env("OPENAI_API_KEY", REAL_KEY)
        .env("OPENAI_BASE_URL", &base_url)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("Done."), "{}", text(&out.stdout));
    assert!(text(&out.stderr).contains("vm: the agent's home is the VM's own"), "{}", text(&out.stderr));
    assert_eq!(snapshot(&env.ws), ws_before, "the workspace is untouched until apply");
    let keyed: Vec<_> = server.requests().into_iter().filter(|r| r["path"] == "/v1/responses").collect();
    assert!(keyed.len() >= 3, "one request per step: {}", keyed.len());
    for request in &keyed {
        assert_eq!(request["headers"]["authorization"], format!("Bearer {REAL_KEY}"));
    }
    nowhere_under(&env.home, REAL_KEY);
    let out = env.pvisor(&["apply", "--all"]);
    assert!(out.status.success(), "apply: {}\n{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(git(&env.ws, &["log", "--format=%s", "-1"]).trim(), "add hello");
    git(&env.ws, &["fsck", "--strict"]);
}

#[test]
#[ignore = "needs root, the vm guest and sandbox images, and the coding agents from npm (scripts/agents-env.sh)"]
fn codex_in_a_vm_as_root() {
    codex_in_a_vm_edits_commits_and_never_holds_the_key(As::Root);
}

#[test]
#[ignore = "needs the vm guest and sandbox images, and the coding agents from npm (scripts/agents-env.sh)"]
fn codex_in_a_vm_rootless() {
    codex_in_a_vm_edits_commits_and_never_holds_the_key(As::Rootless);
}

/// Claude Code (a glibc binary built past baseline x86-64) in a microVM
/// with a Debian userland: its turn runs, the model server gets the real
/// key through the proxy, and the commit applies.
fn claude_in_a_vm_edits_commits_and_never_holds_the_key(who: As) {
    who.require();
    assert!(vm_image().is_some(), "needs the vm guest image: run scripts/vm-image.sh");
    let env = agent_env(who);
    import_agents_image(&env);
    let server = ModelServer::start(env.dir.path(), &script(&env.ws, ("/tmp/unused", "x")));
    let base_url = format!("http://127.0.0.1:{}", server.port);
    let args =
        ["run", "--executor", "vm", "--image", "agents", "--agent", "claude", "--", "claude", "-p", "go"];
    let out = env
        .command(&args)
        .args(["--dangerously-skip-permissions", "--output-format", "json"])
        .env("ANTHROPIC_API_KEY", REAL_KEY)
        .env("ANTHROPIC_BASE_URL", &base_url)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}\n{}", text(&out.stdout), text(&out.stderr));
    let result: serde_json::Value = serde_json::from_str(text(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(result["result"], "Done.", "{result}");
    let keyed: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r["path"].as_str().unwrap().starts_with("/v1/messages"))
        .collect();
    assert!(keyed.len() >= 3, "one request per step: {}", keyed.len());
    for request in &keyed {
        assert_eq!(request["headers"]["x-api-key"], REAL_KEY);
    }
    nowhere_under(&env.home, REAL_KEY);
    let out = env.pvisor(&["apply", "--all"]);
    assert!(out.status.success(), "apply: {}\n{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(git(&env.ws, &["log", "--format=%s", "-1"]).trim(), "add hello");
}

#[test]
#[ignore = "needs root, the vm guest and sandbox images, and the coding agents from npm (scripts/agents-env.sh)"]
fn claude_code_in_a_vm_as_root() {
    claude_in_a_vm_edits_commits_and_never_holds_the_key(As::Root);
}

#[test]
#[ignore = "needs the vm guest and sandbox images, and the coding agents from npm (scripts/agents-env.sh)"]
fn claude_code_in_a_vm_rootless() {
    claude_in_a_vm_edits_commits_and_never_holds_the_key(As::Rootless);
}
