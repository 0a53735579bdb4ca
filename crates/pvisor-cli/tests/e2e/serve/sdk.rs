//! The published SDKs (Python, its code interpreter, TypeScript) run their
//! flows unchanged against the daemon, and every route answers as the spec
//! says.

use super::*;

fn sdk(daemon: &Daemon, script: &str) -> String {
    let out = Command::new(sdk_python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/sdk").join(script))
        .env("PVISOR_URL", format!("127.0.0.1:{}", daemon.port))
        .env("PVISOR_KEY", &daemon.key)
        .env("SPECS", Path::new(env!("CARGO_MANIFEST_DIR")).join("../../specs/opensandbox"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} failed\nstdout: {}\nstderr: {}\ndaemon: {}",
        text(&out.stdout),
        text(&out.stderr),
        daemon.log()
    );
    text(&out.stdout)
}

#[test]
fn the_published_python_sdk_runs_its_flow_unchanged() {
    let daemon = Daemon::new();
    let out = sdk(&daemon, "flow.py");
    assert!(out.contains("SDK flow OK"), "{out}");
    // One vm Job behind the one sandbox that was created, two Attempts
    // (create, resume); sandbox ids are not Job ids.
    let jobs = daemon.jobs();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    // kill() returns at 204 and the sandbox is gone from the API at once
    // (the reference removes its container); the daemon's record reads
    // Terminated once its Job ended.
    let listing = daemon.curl("GET", "/v1/sandboxes", None).1;
    assert_eq!(listing["items"], json!([]), "{listing}");
    let records: Vec<_> = fs::read_dir(daemon.env.home.join("server/sandboxes"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .collect();
    assert_eq!(records.len(), 1, "{records:?}");
    let id = records[0].path().file_stem().unwrap().to_string_lossy().into_owned();
    let id = id.as_str();
    assert_eq!(daemon.curl("GET", &format!("/v1/sandboxes/{id}"), None).0, 404);
    let record = daemon.wait_record(id, "Terminated");
    assert_eq!(record["generations"].as_array().unwrap().len(), 2, "{record}");
    assert_ne!(record["job"], id);
    // A terminated sandbox leaves no execution checkpoint, and its stage is dropped.
    let runs = fs::read_dir(daemon.env.home.join("runs")).unwrap().flatten().collect::<Vec<_>>();
    assert!(runs.iter().all(|r| !r.path().join("exec-checkpoints").exists()), "checkpoints left behind");
    let status = text(&daemon.env.pvisor(&["status", "--json"]).stdout);
    assert!(status.contains("\"stage_state\":\"dropped\"") || status.contains("\"changes\":0"), "{status}");
}

/// Issue 20, item 7: code contexts, driven by the published code-interpreter
/// SDK (`tests/sdk/code.py`, which cites the reference e2e test it follows).
#[test]
fn the_code_interpreter_sdk_runs_python_and_bash_contexts() {
    let daemon = Daemon::new();
    let out = sdk(&daemon, "code.py");
    assert!(out.contains("code interpreter OK"), "{out}");
}

/// Code contexts in java, go and typescript, in the built-in
/// `code-interpreter` image started with its entrypoint, through the
/// published SDK with its strict health check (`tests/sdk/code_languages.py`,
/// which cites the reference e2e tests it follows).
#[test]
fn the_code_interpreter_sdk_runs_java_go_and_typescript_contexts() {
    let daemon = Daemon::new();
    let out = sdk(&daemon, "code_languages.py");
    assert!(out.contains("code interpreter languages OK"), "{out}");
}

/// Issue 20: a client nobody here wrote in Python. The published TypeScript
/// SDK (`tests/sdk/flow.mjs`, installed by `scripts/sdk-env.sh`) creates,
/// runs commands, moves files, renews earlier, pauses, resumes and kills.
#[test]
fn the_published_typescript_sdk_runs_its_flow_unchanged() {
    let sdk = target_dir().join("ts-sdk/node_modules/@alibaba-group/opensandbox/dist/index.js");
    assert!(sdk.exists(), "no TypeScript SDK at {}: run scripts/sdk-env.sh", sdk.display());
    let daemon = Daemon::new();
    let out = Command::new("node")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/sdk/flow.mjs"))
        .env("PVISOR_URL", format!("127.0.0.1:{}", daemon.port))
        .env("PVISOR_KEY", &daemon.key)
        .env("OPENSANDBOX_TS_SDK", &sdk)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success() && text(&out.stdout).contains("TypeScript SDK flow OK"),
        "flow.mjs failed\nstdout: {}\nstderr: {}\ndaemon: {}",
        text(&out.stdout),
        text(&out.stderr),
        daemon.log()
    );
}

#[test]
fn the_sdk_flow_runs_rootless_too() {
    As::Rootless.require();
    let daemon = Daemon::new_as(As::Rootless);
    let out = sdk(&daemon, "flow.py");
    assert!(out.contains("SDK flow OK"), "{out}");
    // The supervisors and QEMU ran as the unprivileged user.
    let record = fs::read_dir(daemon.env.home.join("server/sandboxes"))
        .unwrap()
        .flatten()
        .find(|e| e.path().extension().is_some_and(|x| x == "json"))
        .unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&record.metadata().unwrap()), UNPRIVILEGED);
}

#[test]
fn every_route_answers_as_the_spec_says() {
    let daemon = Daemon::new();
    let out = sdk(&daemon, "contract.py");
    assert!(out.contains("contract OK"), "{out}");
}
