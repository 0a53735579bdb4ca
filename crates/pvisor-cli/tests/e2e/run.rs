//! `pvisor run`: staging, records, receipts and the sandbox's walls.

use std::fs;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;

fn stages_changes_and_proves_how_the_run_ended(who: As) {
    who.require();
    let env = Env::new(who);
    env.write("existing", "old\n");
    env.write("tracked", "line 1\n");
    env.write("sub/kept", "k\n");
    let before = snapshot(&env.ws);

    let out = env.run_sh("echo x > new; rm existing; echo y >> tracked; exit 3");
    assert_eq!(out.status.code(), Some(3), "stderr: {}", text(&out.stderr));
    assert_eq!(snapshot(&env.ws), before, "the workspace changed");

    let status = env.status_json(None);
    assert_eq!(status["state"], "failed");
    assert_eq!(status["exit_code"], 3);
    assert_eq!(status["receipt"], "valid");
    assert_eq!(status["workspace"], fs::canonicalize(&env.ws).unwrap().to_str().unwrap());
    for field in ["job", "run", "attempt"] {
        assert!(status[field].is_string(), "status lacks {field}: {status}");
    }

    // The Bundle's manifest lists exactly the three changes.
    let attempt = env.attempt_dir(&status);
    let bundle: serde_json::Value =
        serde_json::from_slice(&fs::read(attempt.join("bundle.json")).unwrap()).unwrap();
    let changes: Vec<(String, String)> = bundle["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["path"].as_str().unwrap().to_owned(), c["kind"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(
        changes,
        vec![
            ("existing".into(), "deleted".into()),
            ("new".into(), "added".into()),
            ("tracked".into(), "modified".into())
        ]
    );
    let tracked = &bundle["changes"][2];
    assert_eq!(tracked["size"], 9);
    assert!(bundle["observations"]["wall_ms"].is_u64());
    assert!(bundle["observations"]["max_rss_kib"].as_u64().unwrap() > 0);

    // The receipt binds the exact Bundle bytes; check it with an independent BLAKE3 tool.
    let receipt: serde_json::Value =
        serde_json::from_slice(&fs::read(attempt.join("completion.json")).unwrap()).unwrap();
    let b3sum = Command::new("b3sum")
        .args(["--no-names"])
        .arg(attempt.join("bundle.json"))
        .output()
        .expect("b3sum is needed to verify receipts independently; scripts/setup.sh installs it");
    assert!(b3sum.status.success());
    assert_eq!(text(&b3sum.stdout).trim(), receipt["bundle"]["blake3"].as_str().unwrap());
    assert_eq!(receipt["bundle"]["size"], fs::metadata(attempt.join("bundle.json")).unwrap().len());
    assert_eq!(receipt["result"]["state"], "failed");
    assert_eq!(receipt["result"]["exit_code"], 3);
    assert_eq!(receipt["job"], status["job"]);
    assert_eq!(receipt["attempt"], status["attempt"]);
    let job = status["job"].as_str().unwrap();
    let job_record: serde_json::Value =
        serde_json::from_slice(&fs::read(env.home.join("jobs").join(job).join("job.json")).unwrap()).unwrap();
    assert_eq!(job_record["format"], 1);
    assert_eq!(job_record["state"], "failed");

    // The Trace is in causal order and ends with the terminal event.
    let events = env.events(status["job"].as_str().unwrap());
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event["seq"], i as u64 + 1);
        if let Some(cause) = event["cause"].as_u64() {
            assert!(cause < event["seq"].as_u64().unwrap(), "cause after effect: {event}");
        }
    }
    let order = [
        "job.created",
        "admission.policy",
        "placement.decided",
        "attempt.created",
        "attempt.started",
        "attempt.exited",
        "stage.sealed",
        "bundle.saved",
        "run.failed",
    ];
    let positions: Vec<usize> = order
        .iter()
        .map(|k| kinds.iter().position(|x| x == k).unwrap_or_else(|| panic!("no {k} in {kinds:?}")))
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"run.failed"));
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn stages_changes_and_proves_how_the_run_ended_as_root() {
    stages_changes_and_proves_how_the_run_ended(As::Root);
}

#[test]
fn stages_changes_and_proves_how_the_run_ended_rootless() {
    stages_changes_and_proves_how_the_run_ended(As::Rootless);
}

fn the_sandbox_walls_hold(who: As) {
    who.require();
    let env = Env::new(who);
    let host_tmp_marker = format!("/tmp/pvisor-e2e-leak-{}", std::process::id());
    // Host services listen on sockets under /run (docker, dbus, the user's session bus);
    // a read-only mount does not stop connect(2), so /run itself must be private.
    let run_marker = format!("/run/pvisor-e2e-socket-{:?}-{}", who, std::process::id());
    let _ = fs::write(&run_marker, "");
    let script = format!(
        r#"
        fail() {{ echo "FAIL: $*"; exit 1; }}
        touch /etc/pvisor-escape 2>/dev/null && fail "wrote /etc"
        touch /usr/pvisor-escape 2>/dev/null && fail "wrote /usr"
        echo leak > {host_tmp_marker} || fail "private /tmp not writable"
        [ -z "$(ls -A {home})" ] || fail "state directory visible: $(ls -A {home})"
        [ "$(hostname)" = pvisor ] || fail "hostname $(hostname)"
        [ "$(grep -c : /proc/net/dev)" = 1 ] || fail "interfaces: $(cat /proc/net/dev)"
        grep -q '^ *lo:' /proc/net/dev || fail "no loopback"
        [ "$(cat /proc/1/cmdline | tr '\0' ' ')" != "" ] || fail "no init"
        [ "$$" = 2 ] || fail "command pid is $$, not 2"
        [ "$PVISOR_SANDBOX" = 1 ] || fail "PVISOR_SANDBOX unset"
        [ "$(pwd)" = "{ws}" ] || fail "cwd $(pwd)"
        [ -c /dev/null ] && [ -c /dev/urandom ] || fail "minimal /dev"
        [ -e /dev/sda ] || [ -e /dev/vda ] && fail "host disks visible in /dev"
        echo ok > /dev/shm/x || fail "/dev/shm"
        [ -e {run_marker} ] && fail "host /run is visible"
        [ -d /run/lock ] || fail "no /run/lock"
        echo staged > in-workspace || fail "workspace not writable"
        echo ALL-OK
        "#,
        home = env.home.display(),
        ws = fs::canonicalize(&env.ws).unwrap().display(),
    );
    let out = env.run_sh(&script);
    let _ = fs::remove_file(&run_marker);
    assert!(
        text(&out.stdout).contains("ALL-OK"),
        "stdout: {} stderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0));
    assert!(!std::path::Path::new(&host_tmp_marker).exists(), "the sandbox wrote the host's /tmp");
    assert!(!std::path::Path::new("/etc/pvisor-escape").exists());
    assert!(!env.ws.join("in-workspace").exists(), "a staged file reached the workspace");
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn the_sandbox_walls_hold_as_root() {
    the_sandbox_walls_hold(As::Root);
}

#[test]
fn the_sandbox_walls_hold_rootless() {
    the_sandbox_walls_hold(As::Rootless);
}

/// The workspace overlay is `volatile`: a command's `fsync` and the
/// overlay's unmount pass no sync to the stage's filesystem (which would
/// flush everything dirty on it, another program's writes included); the
/// seal makes the staged files durable instead.
fn the_stage_is_made_durable_by_the_seal_not_the_overlay(who: As) {
    who.require();
    let env = Env::new(who);
    env.write("gone", "deleted in the run\n");
    let ws = fs::canonicalize(&env.ws).unwrap();
    let script = format!(
        r#"grep " {ws} " /proc/self/mountinfo | grep -Eq '[ ,](fsync=)?volatile(,|$)' || {{ echo "FAIL: $(grep " {ws} " /proc/self/mountinfo)"; exit 1; }}
        echo kept > synced && sync synced && rm gone && ln -s synced link && echo VOLATILE-OK"#,
        ws = ws.display()
    );
    let out = env.run_sh(&script);
    assert!(
        text(&out.stdout).contains("VOLATILE-OK"),
        "stdout: {} stderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let status = env.status_json(None);
    assert_eq!(status["receipt"], "valid", "{status}");
    let upper = env.home.join("runs").join(status["run"].as_str().unwrap()).join("stage/upper");
    assert_eq!(fs::read_to_string(upper.join("synced")).unwrap(), "kept\n");
    assert_eq!(fs::read_link(upper.join("link")).unwrap(), std::path::Path::new("synced"));
    // The deletion is staged (a whiteout), and the workspace still has the file.
    assert!(fs::symlink_metadata(upper.join("gone")).is_ok(), "no whiteout staged");
    assert!(env.ws.join("gone").exists(), "the deletion reached the workspace");
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn the_stage_is_made_durable_by_the_seal_not_the_overlay_as_root() {
    the_stage_is_made_durable_by_the_seal_not_the_overlay(As::Root);
}

#[test]
fn the_stage_is_made_durable_by_the_seal_not_the_overlay_rootless() {
    the_stage_is_made_durable_by_the_seal_not_the_overlay(As::Rootless);
}

#[test]
fn stdin_stdout_and_stderr_pass_through() {
    let env = Env::new(As::Rootless);
    let mut child = env
        .command(&["run", "-q", "--", "sh", "-c", "tr a-z A-Z; echo to-stderr >&2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"hello sandbox\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(text(&out.stdout), "HELLO SANDBOX\n");
    assert_eq!(text(&out.stderr), "to-stderr\n");
    assert!(out.status.success());
}

#[test]
fn a_terminal_reaches_the_command() {
    let env = Env::new(As::Root);
    // script(1) gives pvisor a real pseudo-terminal, as an interactive user has.
    let inner = format!(
        "PVISOR_HOME={} {} run -q -- sh -c 'test -t 0 && test -t 1 && echo TTY-OK; tty'",
        env.home.display(),
        bin()
    );
    let out = env.under_terminal(&inner);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("TTY-OK"), "{stdout}");
    assert!(stdout.contains("/dev/pts/"), "{stdout}");
}

#[test]
fn death_by_signal_exits_128_plus_n() {
    let env = Env::new(As::Rootless);
    let out = env.run_sh("kill -TERM $$");
    assert_eq!(out.status.code(), Some(143));
    let status = env.status_json(None);
    assert_eq!(status["state"], "failed");
    assert_eq!(status["signal"], 15);
    assert!(status["exit_code"].is_null());
}

#[test]
fn nothing_outlives_the_main_process() {
    let env = Env::new(As::Rootless);
    let marker = "31337.25";
    let out = env.run_sh(&format!("sleep {marker} & sleep {marker} & echo started"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        wait_until(std::time::Duration::from_secs(2), || sleepers(marker).is_empty()),
        "survivors: {:?}",
        sleepers(marker)
    );
    assert_eq!(env.status_json(None)["state"], "completed");
}

#[test]
fn a_successful_run_completes_with_an_empty_manifest() {
    let env = Env::new(As::Rootless);
    env.write("a", "a\n");
    let out = env.pvisor(&["run", "--", "cat", "a"]);
    assert_eq!(text(&out.stdout), "a\n");
    assert_eq!(out.status.code(), Some(0));
    let status = env.status_json(None);
    assert_eq!(status["state"], "completed");
    assert_eq!(status["changes"], 0);
    let events = env.events(status["job"].as_str().unwrap());
    assert_eq!(events.last().unwrap()["type"], "run.completed");
}

#[test]
fn the_sandbox_cannot_reach_the_hosts_other_terminals() {
    let env = Env::new(As::Rootless);
    let out = env.run_sh("ls /dev/pts");
    assert_eq!(text(&out.stdout).split_whitespace().collect::<Vec<_>>(), ["ptmx"], "{}", text(&out.stdout));
}

/// Hiding a directory that holds the workspace would blind the command to
/// its own work: the request is refused by name in the Trace, not dropped.
#[test]
fn hiding_the_workspace_itself_is_skipped_and_said() {
    let env = Env::new(As::Rootless);
    env.write("kept.txt", "still here\n");
    let parent = env.ws.parent().unwrap().to_str().unwrap().to_owned();
    let out = env.pvisor(&["run", "-q", "--hide", &parent, "--", "cat", "kept.txt"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "still here\n");
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    let skipped: Vec<serde_json::Value> = env
        .events(&job)
        .into_iter()
        .filter(|e| e["type"] == "admission.rewrite" && e["data"]["rewrite"] == "hide.skipped")
        .collect();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(skipped[0]["data"]["path"].as_str().unwrap().ends_with(parent.rsplit('/').next().unwrap()));
}

#[test]
fn secret_stores_and_secret_variables_stay_out_unless_asked_for() {
    let env = Env::new(As::Rootless);
    // A home outside /tmp: the sandbox's /tmp is private, which would hide it anyway.
    let home_dir = tempfile::Builder::new().prefix("pvisor-e2e-home-").tempdir_in("/var/tmp").unwrap();
    let home = home_dir.path();
    for (rel, content) in [
        (".ssh/id_ed25519", "PRIVATE KEY"),
        (".aws/credentials", "aws secret"),
        (".netrc", "machine x password p"),
        (".docker/config.json", "{\"auths\":{}}"),
        ("notes/plan.txt", "hide me too"),
    ] {
        let path = home.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, content).unwrap();
    }
    env.give_away(home);
    let script = r#"
        cat ~/.ssh/id_ed25519 ~/.aws/credentials ~/.netrc ~/.docker/config.json ~/notes/plan.txt 2>/dev/null
        ls -A ~/.ssh ~/.aws ~/.docker ~/notes 2>/dev/null
        echo "token=[$GH_TOKEN] pass=[$DB_PASSWORD] aws=[$AWS_SECRET_ACCESS_KEY] agent=[$SSH_AUTH_SOCK] plain=[$PLAIN] kept=[$KEEP_TOKEN]"
        touch ~/.ssh/planted 2>/dev/null && echo PLANTED; true
    "#;
    let out = env
        .command(&[
            "run",
            "--hide",
            home.join("notes").to_str().unwrap(),
            "--env",
            "KEEP_TOKEN",
            "--",
            "sh",
            "-c",
            script,
        ])
        .env("GH_TOKEN", "ghp-secret-value-1")
        .env("DB_PASSWORD", "hunter2-value")
        .env("AWS_SECRET_ACCESS_KEY", "aws-value-3")
        .env("SSH_AUTH_SOCK", "/tmp/agent.sock")
        .env("PLAIN", "visible")
        .env("KEEP_TOKEN", "passed-on-purpose")
        .env("HOME", home)
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout} {}", text(&out.stderr));
    for leaked in [
        "PRIVATE KEY",
        "aws secret",
        "password p",
        "auths",
        "hide me too",
        "id_ed25519",
        "credentials",
        "PLANTED",
    ] {
        assert!(!stdout.contains(leaked), "{leaked} leaked: {stdout}");
    }
    assert!(
        stdout.contains("token=[] pass=[] aws=[] agent=[] plain=[visible] kept=[passed-on-purpose]"),
        "{stdout}"
    );

    // Each hide and scrub is a rewrite recorded by name, never by value.
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    let events = env.events(&job);
    let rewrites: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["type"] == "admission.rewrite").map(|e| &e["data"]).collect();
    for name in ["GH_TOKEN", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY", "SSH_AUTH_SOCK"] {
        assert!(
            rewrites.iter().any(|r| r["rewrite"] == "env.remove" && r["name"] == name),
            "{name}: {rewrites:?}"
        );
    }
    assert!(rewrites
        .iter()
        .any(|r| r["rewrite"] == "hide" && r["path"].as_str().unwrap().ends_with("/.ssh")));
    assert!(rewrites.iter().any(|r| r["rewrite"] == "hide" && r["reason"] == "--hide"));
    let all = serde_json::to_string(&events).unwrap();
    for value in ["ghp-secret-value-1", "hunter2-value", "aws-value-3", "passed-on-purpose"] {
        assert!(!all.contains(value), "a secret value reached the Trace");
    }
    let run_json = fs::read_to_string(
        env.home.join("runs").join(env.status_json(None)["run"].as_str().unwrap()).join("run.json"),
    )
    .unwrap();
    assert!(!run_json.contains("ghp-secret-value-1") && !run_json.contains("passed-on-purpose"));

    // --expose brings one back.
    let out = env
        .command(&[
            "run",
            "-q",
            "--expose",
            home.join(".netrc").to_str().unwrap(),
            "--",
            "cat",
            home.join(".netrc").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(text(&out.stdout), "machine x password p");
}

/// The credentials of the agents people run under pvisor, database and
/// registry credentials and shell histories stay hidden; their variables are
/// scrubbed; look-alike settings pass; `--expose DIR` brings a store back.
#[test]
fn agent_credentials_and_more_secrets_stay_out_unless_exposed() {
    let env = Env::new(As::Rootless);
    let home_dir = tempfile::Builder::new().prefix("pvisor-e2e-home-").tempdir_in("/var/tmp").unwrap();
    let home = home_dir.path();
    let stores = [
        ".claude/.credentials.json",
        ".codex/auth.json",
        ".gemini/oauth_creds.json",
        ".config/github-copilot/hosts.json",
        ".config/git/credentials",
        ".pgpass",
        ".my.cnf",
        ".m2/settings.xml",
        ".yarnrc.yml",
        ".cache/huggingface/token",
        ".config/rclone/rclone.conf",
        ".bash_history",
        ".zsh_history",
    ];
    for rel in stores {
        let path = home.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, format!("SECRET-IN-{rel}")).unwrap();
    }
    fs::write(home.join(".claude/settings.json"), "visible settings").unwrap();
    env.give_away(home);
    let cat_all: Vec<String> = stores.iter().map(|r| format!("cat ~/{r} 2>/dev/null;")).collect();
    let script = format!(
        "{} cat ~/.claude/settings.json; echo; echo \"pg=[$PGPASSWORD] my=[$MYSQL_PWD] db=[$DATABASE_URL] oa=[$OPENAI_API_KEY] op=[$OP_SESSION_x] npm=[$npm_config__authToken] region=[$AWS_REGION] bundle=[$AWS_CA_BUNDLE]\"",
        cat_all.join(" ")
    );
    let out = env
        .command(&["run", "-q", "--", "sh", "-c", &script])
        .env("HOME", home)
        .env("PGPASSWORD", "v1")
        .env("MYSQL_PWD", "v2")
        .env("DATABASE_URL", "postgres://u:v3@h/db")
        .env("OPENAI_API_KEY", "v4")
        .env("OP_SESSION_x", "v5")
        .env("npm_config__authToken", "v6")
        .env("AWS_REGION", "eu-west-1")
        .env("AWS_CA_BUNDLE", "/etc/ssl/ca.pem")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout} {}", text(&out.stderr));
    assert!(!stdout.contains("SECRET-IN"), "a credential store was readable: {stdout}");
    assert!(stdout.contains("visible settings"), "only the credentials are hidden, not the agent's settings");
    assert!(
        stdout.contains("pg=[] my=[] db=[] oa=[] op=[] npm=[] region=[eu-west-1] bundle=[/etc/ssl/ca.pem]"),
        "{stdout}"
    );
    // The recipe for running an agent with its own credentials: expose its store.
    let out = env
        .command(&[
            "run",
            "-q",
            "--expose",
            home.join(".claude").to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "cat ~/.claude/.credentials.json",
        ])
        .env("HOME", home)
        .output()
        .unwrap();
    assert_eq!(text(&out.stdout), "SECRET-IN-.claude/.credentials.json");
}

/// Every default secret store (browser cookie and login stores, cloud and
/// registry credentials, agent keys, shell and REPL histories, ...) planted
/// in a fake home is unreadable inside; every variable that is secret by
/// name or by the shape of its value is absent while ordinary ones pass, and
/// `--env NAME` still passes one on purpose. Root and rootless.
fn every_default_secret_store_and_secret_variable_stays_out(who: As) {
    who.require();
    let env = Env::new(who);
    let home_dir = tempfile::Builder::new().prefix("pvisor-e2e-home-").tempdir_in("/var/tmp").unwrap();
    let home = home_dir.path();
    // The named stores, and copies known by the start of their names.
    let by_prefix =
        pvisor::HIDDEN_NAME_PREFIXES.iter().flat_map(|p| [p.to_string(), format!("{p}.1733400000")]);
    let stores: Vec<String> = pvisor::DEFAULT_HIDDEN.iter().map(|s| s.to_string()).chain(by_prefix).collect();
    let mut probe = String::new();
    for (i, rel) in stores.iter().enumerate() {
        let path = home.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, format!("SECRET-STORE-{i}\n")).unwrap();
        // The marker says the probe looked at the path; the content must not follow.
        probe.push_str(&format!("[ -e ~/'{rel}' ] && echo PROBED-{i}; cat ~/'{rel}' 2>/dev/null;\n"));
    }
    env.give_away(home);
    probe.push_str("env\n");
    let secrets_by_name = [
        ("PASSWORD", "name-1"),
        ("TOKEN", "name-2"),
        ("SECRET", "name-3"),
        ("SMTP_PASS", "name-4"),
        ("FTP_PWD", "name-5"),
        ("BW_SESSION", "name-6"),
        ("GOOGLE_CREDENTIALS", "name-7"),
        ("AZURE_STORAGE_CONNECTION_STRING", "name-8"),
        ("REGISTRY_AUTH", "name-9"),
        ("DEPLOY_CREDENTIALS", "name-10"),
    ];
    let secrets_by_value = [
        ("MIRROR", "https://bob:value-1@mirror.example.com/simple"),
        ("BACKUP_TARGET", "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=value-2=="),
        ("DB", "Server=db;User Id=sa;Password=value-3;"),
        ("DEPLOY", "-----BEGIN OPENSSH PRIVATE KEY-----\nvalue-4\n-----END OPENSSH PRIVATE KEY-----"),
        ("GHA", "ghp_value5value5value5value5value5value5"),
        ("GLA", "glpat-value6value6value6"),
        ("SLACK", "xoxb-0000000000-value7value7"),
        ("OPENAI", "sk-value8value8value8value8value8"),
        ("CLAUDE", "sk-ant-api03-value9value9value9value9"),
        ("AWSID", "AKIAVALUE10VALUE10XX"),
        ("GAPI", "AIzaValue11Value11Value11Value11Value11"),
        ("SESSION_JWT", "eyJhbGciOiJIUzI1NiJ9.eyJ2YWx1ZTEyIjoidmFsdWUxMiJ9.value12"),
    ];
    let mut cmd = env.command(&["run", "-q", "--env", "MIRROR", "--", "sh", "-c", &probe]);
    cmd.env("HOME", home).env("PLAIN", "ordinary-visible").env("SITE", "https://example.com/ordinary-url");
    for (name, value) in secrets_by_name.iter().chain(secrets_by_value.iter()) {
        cmd.env(name, value);
    }
    let out = cmd.output().unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout} {}", text(&out.stderr));
    for (i, rel) in stores.iter().enumerate() {
        assert!(stdout.contains(&format!("PROBED-{i}\n")), "{rel} was not probed: {stdout}");
        assert!(!stdout.contains(&format!("SECRET-STORE-{i}\n")), "{rel} was readable: {stdout}");
    }
    for (name, value) in secrets_by_name.iter().chain(secrets_by_value.iter().skip(1)) {
        assert!(!stdout.contains(&format!("{name}=")), "{name} reached the command: {stdout}");
        assert!(!stdout.contains(value.lines().next().unwrap()), "{name}'s value reached it: {stdout}");
    }
    for passed in [
        "PLAIN=ordinary-visible",
        "SITE=https://example.com/ordinary-url",
        "MIRROR=https://bob:value-1@mirror.example.com/simple",
    ] {
        assert!(stdout.contains(passed), "{passed} should pass: {stdout}");
    }
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn every_default_secret_store_and_secret_variable_stays_out_root() {
    every_default_secret_store_and_secret_variable_stays_out(As::Root);
}

#[test]
fn every_default_secret_store_and_secret_variable_stays_out_rootless() {
    every_default_secret_store_and_secret_variable_stays_out(As::Rootless);
}

/// `--cache PATH`: writable in the sandbox, kept for the next run, never
/// staged, and the host's directory never written; a run that finds the
/// cache in use gets a private copy, said; the workspace cannot be a cache
/// (once, cargo failed on a read-only ~/.cargo).
#[test]
fn a_cache_persists_between_runs_without_being_staged() {
    let env = Env::new(As::Rootless);
    let host = tempfile::Builder::new().prefix("pvisor-cache-").tempdir_in("/var/tmp").unwrap();
    let dir = host.path().to_owned();
    fs::write(dir.join("from-host"), "host\n").unwrap();
    env.give_away(&dir);
    let cache = dir.to_str().unwrap();
    let first = format!("cat {cache}/from-host && echo downloaded > {cache}/crate");
    let out = env.pvisor(&["run", "-q", "--cache", cache, "--", "sh", "-c", &first]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "host\n");
    assert!(!dir.join("crate").exists(), "the host's directory is never written");
    assert!(env.review().is_empty(), "a cache is not staged");
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    assert!(env.events(&job).iter().any(|e| e["data"]["rewrite"] == "cache" && e["data"]["path"] == cache));
    let second = env.pvisor(&["run", "-q", "--cache", cache, "--", "cat", &format!("{cache}/crate")]);
    assert_eq!(text(&second.stdout), "downloaded\n", "{}", text(&second.stderr));
    // Two at once: the second writes to a private copy, and is told so.
    let holder = env
        .command(&["run", "-q", "--cache", cache, "--", "sh", "-c", &format!("touch {cache}/held; sleep 3")])
        .spawn()
        .unwrap();
    let store = env.home.join("caches");
    assert!(wait_until(Duration::from_secs(10), || fs::read_dir(&store)
        .unwrap()
        .flatten()
        .any(|c| c.path().join("upper/held").exists())));
    let busy = env.pvisor(&[
        "run",
        "-q",
        "--cache",
        cache,
        "--",
        "sh",
        "-c",
        &format!("echo lost > {cache}/private"),
    ]);
    let _ = holder.wait_with_output();
    assert!(text(&busy.stderr).contains("another run holds it"), "{}", text(&busy.stderr));
    let listed = env.expect(&["cache", "ls", "--json"], 0);
    assert!(listed.contains(cache) && listed.contains("\"in_use\":false"), "{listed}");
    let third = env.pvisor(&["run", "-q", "--cache", cache, "--", "ls", cache]);
    assert_eq!(text(&third.stdout), "crate\nfrom-host\nheld\n", "the private copy was thrown away");
    // The workspace is never a cache.
    let ws = env.ws.to_str().unwrap();
    let refused = env.pvisor(&["run", "--cache", ws, "--", "true"]);
    assert_eq!(refused.status.code(), Some(125));
    assert!(text(&refused.stderr).contains("overlaps the workspace"), "{}", text(&refused.stderr));
    let vm = env.pvisor(&["run", "--executor", "vm", "--cache", cache, "--", "true"]);
    assert_eq!(vm.status.code(), Some(125), "{}", text(&vm.stderr));
    assert!(text(&vm.stderr).contains("apply to the ns executor"), "{}", text(&vm.stderr));
    assert!(env.expect(&["cache", "prune"], 0).contains("removed 1 cache"));
    let after = env.pvisor(&["run", "-q", "--cache", cache, "--", "ls", cache]);
    assert_eq!(text(&after.stdout), "from-host\n");
}
