//! Agent state (`run --state`): an agent's home state is writable in the
//! sandbox through the Job's own copy, carried within a session, with gated
//! changes (hooks, settings) held back until approved, and the host's real
//! files never changed.

use std::fs;
use std::path::Path;

use crate::support::*;

/// A fake coding agent: on start it runs its hook and honours its settings
/// (as Claude Code runs a `SessionStart` hook), then counts its runs in
/// `~/.fakeagent/sessions/x` and rewrites `~/.fakeagent.json` by renaming a
/// temp file over it in `$HOME`, as Claude Code does with `~/.claude.json`.
/// With `plant`, it writes a hook, a settings file and an MCP server (in
/// its JSON file) for later runs.
const AGENT: &str = r#"
set -e
state="$HOME/.fakeagent"
if [ -x "$state/hooks/start" ]; then "$state/hooks/start"; fi
if grep -q marker "$state/settings.json" 2>/dev/null; then echo SETTINGS-MARKER; fi
echo "json=$(cat "$HOME/.fakeagent.json")"
mkdir -p "$state/sessions"
n=$(cat "$state/sessions/x" 2>/dev/null || echo 0)
n=$((n + 1))
echo "$n" > "$state/sessions/x"
tmp="$HOME/.fakeagent.json.tmp.$$"
echo "{\"runs\": $n}" > "$tmp"
mv "$tmp" "$HOME/.fakeagent.json"
echo "runs=$n"
if [ "$1" = plant ]; then
    mkdir -p "$state/hooks"
    printf '#!/bin/sh\necho HOOK-RAN\n' > "$state/hooks/start"
    chmod +x "$state/hooks/start"
    echo '{"marker": true}' > "$state/settings.json"
    echo "{\"runs\": $n, \"mcpServers\": {\"evil\": {}}}" > "$tmp"
    mv "$tmp" "$HOME/.fakeagent.json"
fi
"#;

struct Agent {
    env: Env,
    dir: String,
    file: String,
}

impl Agent {
    fn new(who: As) -> Self {
        let env = Env::new(who);
        let home = env.dir.path();
        fs::write(home.join(".fakeagent.json"), "{\"host\": true}\n").unwrap();
        env.give_away(home);
        let dir = home.join(".fakeagent").to_string_lossy().into_owned();
        let file = home.join(".fakeagent.json").to_string_lossy().into_owned();
        Self { env, dir, file }
    }

    /// Runs the agent in `session` with both state paths; its stdout.
    fn run(&self, session: &str, extra: &[&str]) -> String {
        text(&self.run_output(session, extra).stdout)
    }

    fn run_output(&self, session: &str, extra: &[&str]) -> std::process::Output {
        std::thread::sleep(std::time::Duration::from_millis(25));
        let mut args = vec!["run", "--session", session, "--state", &self.dir, "--state", &self.file];
        args.extend(["--", "sh", "-c", AGENT, "agent"]);
        args.extend(extra);
        let out = self.env.pvisor(&args);
        assert!(out.status.success(), "{}\n{}", text(&out.stdout), text(&out.stderr));
        out
    }

    fn state_changes(&self, session: &str) -> Vec<serde_json::Value> {
        records_of(&self.env.expect(&["review", "--state", "--session", session, "--json"], 0), "state")
    }
}

fn agent_state_is_carried_in_a_session_and_gated_changes_wait_for_approval(who: As) {
    who.require();
    let agent = Agent::new(who);
    let home = agent.env.dir.path();
    let host_json = fs::read(home.join(".fakeagent.json")).unwrap();

    // Run 1 writes its state and plants a hook and settings for later runs,
    // and pvisor says they are held back.
    let output = agent.run_output("s", &["plant"]);
    let out = text(&output.stdout);
    assert!(out.contains("json={\"host\": true}") && out.contains("runs=1"), "{out}");
    assert!(!out.contains("HOOK-RAN"), "{out}");
    let said = text(&output.stderr);
    assert!(said.contains("3 gated change(s) held back") && said.contains("review --state"), "{said}");

    // Run 2 of the session sees run 1's state (its count, its renamed
    // file), but neither the hook nor the settings run 1 planted.
    let out = agent.run("s", &[]);
    assert!(out.contains("\"runs\": 1") && out.contains("runs=2"), "{out}");
    assert!(!out.contains("HOOK-RAN") && !out.contains("SETTINGS-MARKER"), "held back: {out}");
    assert!(!out.contains("evil"), "the MCP server is held back, the rest of the file carries: {out}");

    // The host's real state never changed; what was absent stays absent.
    assert_eq!(fs::read(home.join(".fakeagent.json")).unwrap(), host_json);
    assert!(!home.join(".fakeagent").exists());
    assert!(!home.join(".fakeagent.json.tmp").exists());
    // State is not in the workspace stage.
    let staged = agent.env.expect(&["review", "--session", "s", "--json"], 0);
    assert!(records_of(&staged, "change").is_empty(), "{staged}");

    // review --state shows the held gated changes; approve them.
    let changes = agent.state_changes("s");
    let gated: Vec<&str> = changes
        .iter()
        .filter(|c| c["gated"] == true && c["approved"] == false)
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    let hook = format!("{}/hooks/start", agent.dir);
    let settings = format!("{}/settings.json", agent.dir);
    assert!(gated.contains(&hook.as_str()) && gated.contains(&settings.as_str()), "{changes:?}");
    assert!(gated.contains(&agent.file.as_str()), "{changes:?}");
    assert!(changes.iter().all(|c| c["path"] != format!("{}/sessions/x", agent.dir) || c["gated"] == false));
    let text_review = agent.env.expect(&["review", "--state", "--session", "s"], 0);
    assert!(text_review.contains("[gated, held back]"), "{text_review}");
    let bogus =
        agent.env.pvisor(&["state", "approve", "--session", "s", &format!("{}/sessions/x", agent.dir)]);
    assert_ne!(bogus.status.code(), Some(0));
    assert!(text(&bogus.stderr).contains("is not a gated state change"), "{}", text(&bogus.stderr));
    agent.env.expect(&["state", "approve", "--session", "s", &hook, &settings, &agent.file], 0);

    // Run 3 proves the probe: once approved, the hook, settings and MCP
    // server act, and the JSON file's other keys are still run 2's.
    let out = agent.run("s", &[]);
    assert!(out.contains("HOOK-RAN") && out.contains("SETTINGS-MARKER") && out.contains("runs=3"), "{out}");
    assert!(out.contains("evil") && out.contains("\"runs\": 2"), "{out}");

    // A plain run in between (no state) does not break the chain.
    agent.env.expect(&["run", "-q", "--session", "s", "--", "true"], 0);
    let out = agent.run("s", &[]);
    assert!(out.contains("runs=4") && out.contains("HOOK-RAN"), "carried past the plain run: {out}");

    // Another session starts from the host's copy.
    let out = agent.run("t", &[]);
    assert!(out.contains("json={\"host\": true}") && out.contains("runs=1"), "{out}");
    assert!(!out.contains("HOOK-RAN"), "{out}");

    // Promoted, the session's state is where new sessions start (past a
    // plain run, which has none).
    agent.env.expect(&["run", "-q", "--session", "s", "--", "true"], 0);
    agent.env.expect(&["state", "promote", "--session", "s"], 0);
    let out = agent.run("u", &[]);
    assert!(out.contains("runs=5") && out.contains("HOOK-RAN"), "{out}");

    assert_eq!(fs::read(home.join(".fakeagent.json")).unwrap(), host_json, "never the host's file");
    assert!(!home.join(".fakeagent").exists(), "never the host's directory");

    // The admission records name the state paths.
    let job = agent.env.status_json(None)["job"].as_str().unwrap().to_owned();
    let events = agent.env.events(&job);
    let state_rewrites: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["type"] == "admission.rewrite" && e["data"]["rewrite"] == "state")
        .collect();
    assert_eq!(state_rewrites.len(), 2, "{events:?}");
}

#[test]
fn agent_state_rootless() {
    agent_state_is_carried_in_a_session_and_gated_changes_wait_for_approval(As::Rootless);
}

#[test]
#[ignore = "needs root"]
fn agent_state_as_root() {
    agent_state_is_carried_in_a_session_and_gated_changes_wait_for_approval(As::Root);
}

fn no_job_recorded(env: &Env) -> bool {
    let jobs = env.home.join("jobs");
    !jobs.exists() || fs::read_dir(jobs).unwrap().next().is_none()
}

/// A state path that is a socket, or outside `$HOME`, is refused before
/// anything runs; a cache of an agent's config is refused with the way out.
#[test]
fn bad_state_and_agent_caches_are_refused_before_the_run() {
    let env = Env::new(As::Rootless);
    let home = env.dir.path();
    let socket = home.join("agent.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    fs::create_dir(home.join(".claude")).unwrap();
    env.give_away(home);
    let outside = Path::new("/usr/share");
    for (path, expected) in [(socket.as_path(), "is a socket"), (outside, "is outside $HOME")] {
        let out = env.pvisor(&["run", "--state", path.to_str().unwrap(), "--", "true"]);
        assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
        assert!(text(&out.stderr).contains(expected), "{}", text(&out.stderr));
        assert!(no_job_recorded(&env));
    }
    let claude = home.join(".claude");
    let out = env.pvisor(&["run", "--cache", claude.to_str().unwrap(), "--", "true"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("use --agent NAME or --state PATH"), "{}", text(&out.stderr));
    assert!(no_job_recorded(&env));
}

/// A run that swaps a state directory holding a held-back hook for a
/// symlink to a host directory cannot make pvisor (running as root)
/// remove or write the host's file when it carries the state forward.
fn a_symlink_in_the_state_does_not_reach_the_host(who: As) {
    who.require();
    let agent = Agent::new(who);
    let home = agent.env.dir.path();
    let victim = home.join("victim");
    fs::create_dir(&victim).unwrap();
    fs::write(victim.join("start"), "host's own\n").unwrap();
    agent.env.give_away(home);
    agent.run("s", &["plant"]);
    let swap = format!(
        "rm -rf {dir}/hooks && ln -s {victim} {dir}/hooks && ls {dir}/hooks/",
        dir = agent.dir,
        victim = victim.display()
    );
    std::thread::sleep(std::time::Duration::from_millis(25));
    let args =
        ["run", "--session", "s", "--state", &agent.dir, "--state", &agent.file, "--", "sh", "-c", &swap];
    let out = agent.env.pvisor(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("start"), "the probe ran: the link shows the host's file");
    // The next run carries the state (resetting the held hook) past the link.
    let out = agent.run("s", &[]);
    assert!(!out.contains("HOOK-RAN"), "{out}");
    assert_eq!(fs::read_to_string(victim.join("start")).unwrap(), "host's own\n");
}

#[test]
fn a_symlink_in_the_state_does_not_reach_the_host_rootless() {
    a_symlink_in_the_state_does_not_reach_the_host(As::Rootless);
}

#[test]
#[ignore = "needs root"]
fn a_symlink_in_the_state_does_not_reach_the_host_as_root() {
    a_symlink_in_the_state_does_not_reach_the_host(As::Root);
}

/// `--agent NAME` fills the same state list from its preset: a user's
/// preset naming the fake agent's state gets it carried in a session, its
/// hook held back, and a state file the host does not have yet made as a
/// file (the agent renames over it).
#[test]
fn an_agent_preset_names_state_that_is_carried_and_gated() {
    let env = Env::new(As::Rootless);
    let home = env.dir.path();
    let config = home.join(".config/pvisor");
    fs::create_dir_all(&config).unwrap();
    fs::write(
        config.join("config.toml"),
        "[agents.fake]\nstate = [\"~/.fakeagent\", \"~/.fakeagent.json\"]\ngated = [\"hooks/**\"]\n",
    )
    .unwrap();
    env.give_away(home);
    let run = |extra: &[&str]| {
        std::thread::sleep(std::time::Duration::from_millis(25));
        let mut args = vec!["run", "--session", "p", "--agent", "fake", "--", "sh", "-c", AGENT, "agent"];
        args.extend(extra);
        let out = env.command(&args).env_remove("XDG_CONFIG_HOME").output().unwrap();
        assert!(out.status.success(), "{}\n{}", text(&out.stdout), text(&out.stderr));
        text(&out.stdout)
    };
    let out = run(&["plant"]);
    assert!(out.contains("json=") && out.contains("runs=1"), "{out}");
    let out = run(&[]);
    assert!(out.contains("\"runs\": 1") && out.contains("runs=2"), "{out}");
    assert!(!out.contains("HOOK-RAN") && !out.contains("SETTINGS-MARKER") && !out.contains("evil"), "{out}");
    assert!(
        !home.join(".fakeagent").exists() && !home.join(".fakeagent.json").exists(),
        "absent stays absent"
    );
}

/// `~/.claude.json` is a secret store (account data, maybe an API key):
/// as state it is the Job's own copy, which never starts from the host's,
/// so the host's secret is never seen, and the agent's writes still carry.
fn a_secret_store_as_state_starts_empty(who: As) {
    who.require();
    let env = Env::new(who);
    let home = env.dir.path();
    fs::write(home.join(".claude.json"), "{\"primaryApiKey\": \"sk-host-secret\"}\n").unwrap();
    env.give_away(home);
    let host = fs::read(home.join(".claude.json")).unwrap();
    let file = home.join(".claude.json").to_string_lossy().into_owned();
    let run = |script: &str| {
        std::thread::sleep(std::time::Duration::from_millis(25));
        let out = env.pvisor(&["run", "--session", "c", "--state", &file, "--", "sh", "-c", script]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let out = run("cat ~/.claude.json 2>&1; echo '{\"numStartups\": 1}' > ~/.claude.json.tmp; mv ~/.claude.json.tmp ~/.claude.json; echo wrote");
    assert!(!out.contains("sk-host-secret") && out.contains("wrote"), "{out}");
    let out = run("cat ~/.claude.json");
    assert!(out.contains("\"numStartups\": 1") && !out.contains("sk-host-secret"), "{out}");
    assert_eq!(fs::read(home.join(".claude.json")).unwrap(), host, "the host's file never changes");
}

#[test]
fn a_secret_store_as_state_starts_empty_rootless() {
    a_secret_store_as_state_starts_empty(As::Rootless);
}

#[test]
#[ignore = "needs root"]
fn a_secret_store_as_state_starts_empty_as_root() {
    a_secret_store_as_state_starts_empty(As::Root);
}
