//! What a sandbox holds to: a hostile search pattern cannot pin the daemon,
//! the built-in images run what agents need, and `networkPolicy` is
//! enforced in order with every decision recorded.

use super::*;

/// Issue 18: `GET /files/search` compiles the client's pattern into an
/// automaton. A pattern of many stars against long names answers at once
/// (the old backtracking matcher took seconds per name: a client could pin
/// the daemon), and a malformed pattern is a 400 that names it.
#[test]
fn a_hostile_search_pattern_cannot_pin_the_daemon() {
    let daemon = Daemon::new();
    let id = daemon.create(json!({}));
    daemon.wait_state(&id, "Running", &["Pending"]);
    daemon.run(
        &id,
        &format!(
            "mkdir -p /tmp/s && cd /tmp/s && for i in 1 2 3 4 5 6 7 8; do touch {}$i; done",
            "a".repeat(40)
        ),
    );
    let (base, token) = daemon.execd(&id);
    let search = |pattern: &str| {
        let out = Command::new("curl")
            .args(["-s", "--max-time", "20", "-G", "-w", "\n%{http_code}", "-H", &token])
            .arg("--data-urlencode")
            .arg("path=/tmp/s")
            .arg("--data-urlencode")
            .arg(format!("pattern={pattern}"))
            .arg(format!("{base}/files/search"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "curl gave up on {pattern:?}: the daemon is pinned");
        let body = text(&out.stdout);
        let (body, code) = body.rsplit_once('\n').unwrap();
        (code.to_owned(), body.to_owned())
    };
    // Twelve stars; every name is forty `a`s and a digit.
    let (code, body) = search(&format!("{}b", "*a".repeat(12)));
    assert_eq!(code, "200", "{body}");
    assert_eq!(body.trim(), "[]", "no name ends in b");
    let (code, body) = search("*a1");
    assert_eq!(code, "200");
    assert!(body.contains("a1"), "{body}");
    let (code, body) = search("a[0-9");
    assert_eq!(code, "400", "{body}");
    assert!(body.contains("a[0-9"), "the error names the pattern: {body}");
}

/// Issue 20, item 8: images agents can use. `python` (imported when first
/// asked for) runs python3 with its standard library, a venv, pip, git and
/// curl; `default` has setpriv, so commands with uid/gid run as that user.
#[test]
fn the_built_in_images_run_python_and_commands_as_another_user() {
    let daemon = Daemon::new();
    let py = daemon.create(json!({ "image": { "uri": "python" } }));
    let plain = daemon.create(json!({}));
    daemon.wait_state(&py, "Running", &["Pending"]);
    daemon.wait_state(&plain, "Running", &["Pending"]);
    let out = daemon.run(
        &py,
        "python3 -c 'import json, sqlite3, ssl, ctypes; print(6 * 7)' && python3 -m venv /tmp/v && \
         /tmp/v/bin/python -m pip --version >/dev/null && git --version && curl --version | head -1 && \
         test -s /etc/ssl/certs/ca-certificates.crt && echo certs-ok",
    );
    for want in [r#""text":"42""#, "git version", "curl 7", "certs-ok"] {
        assert!(out.contains(want), "{want} missing from the python image's output: {out}");
    }
    assert!(!out.contains(r#""type":"error""#), "{out}");
    // uid/gid through the API (setpriv in `default`).
    let (base, token) = daemon.execd(&plain);
    let run_as = Command::new("curl")
        .args(["-sN", "-H", &token, "-H", "content-type: application/json", "--data-binary"])
        .arg(json!({ "command": "id -u; id -g", "uid": 1000, "gid": 1001 }).to_string())
        .arg(format!("{base}/command"))
        .output()
        .unwrap();
    let out = text(&run_as.stdout);
    assert!(out.contains(r#""text":"1000""#) && out.contains(r#""text":"1001""#), "{out}");
}

/// A static HTTP server on host loopback (`python3 -m http.server`), killed on drop.
struct HostServer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl HostServer {
    fn start(file: &str, contents: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(file), contents).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("python3")
            .args(["-m", "http.server", &port.to_string(), "--bind", "127.0.0.1", "--directory"])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        assert!(
            wait_until(Duration::from_secs(20), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok())
        );
        Self { child, port, _dir: dir }
    }
}

impl Drop for HostServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The stdout texts of a command's SSE body, joined.
/// Issue 20: `networkPolicy` is enforced by the sandbox Job's proxy, in the
/// reference egress sidecar's order (names: the first matching rule, then
/// `defaultAction`: components/egress/pkg/policy/policy.go, `Evaluate`, and
/// domain_index.go, `match`; addresses: deny sets before allow sets,
/// pkg/nftables/manager.go); a client that ignores the proxy variables
/// reaches nothing (the VM has no NIC); the policy changes while the
/// sandbox runs (PATCH/DELETE /policy) and across a pause; every decision
/// and change is a Trace event.
#[test]
fn network_policy_is_enforced_in_order_and_every_decision_is_recorded() {
    let daemon = Daemon::new();
    // Bad policies: 400 naming the field, and no sandbox.
    for (policy, says) in [
        (json!({ "defaultAction": "maybe" }), "defaultAction"),
        (json!({ "egress": [{ "action": "permit", "target": "a.com" }] }), "egress[0].action"),
        (json!({ "egress": [{ "action": "allow", "target": "" }] }), "empty"),
        (
            json!({ "egress": [{ "action": "allow", "target": "a.com" }, { "action": "deny", "target": "10.0.0.0/33" }] }),
            "egress[1]",
        ),
        (json!({ "egress": [{ "action": "allow", "target": "300.1.2.0/24" }] }), "CIDR"),
        (json!({ "egress": [{ "action": "allow", "target": "*" }] }), "defaultAction"),
        (json!({ "egress": [{ "action": "allow", "target": "a.com", "port": 443 }] }), "unknown field"),
        (json!({ "default": "allow" }), "unknown field"),
    ] {
        let body = json!({ "image": { "uri": "python" }, "entrypoint": ["tail", "-f", "/dev/null"], "networkPolicy": policy });
        let (code, answer) = daemon.curl("POST", "/v1/sandboxes", Some(body));
        assert_eq!(code, 400, "{policy} was accepted: {answer}");
        assert!(answer["message"].as_str().unwrap_or("").contains(says), "{policy}: {answer}");
    }
    assert_eq!(daemon.curl("GET", "/v1/sandboxes", None).1["items"], json!([]));

    let server = HostServer::start("hello.txt", "from the host\n");
    let port = server.port;
    let only_localhost = daemon.create(json!({ "image": { "uri": "python" },
        "networkPolicy": { "defaultAction": "deny", "egress": [{ "action": "allow", "target": "localhost" }] } }));
    let first_match = daemon.create(json!({ "image": { "uri": "python" },
        "networkPolicy": { "defaultAction": "allow", "egress": [
            { "action": "deny", "target": "localhost" },
            { "action": "allow", "target": "127.0.0.0/8" },
            { "action": "deny", "target": "127.0.0.2" } ] } }));
    daemon.wait_state(&only_localhost, "Running", &["Pending"]);
    daemon.wait_state(&first_match, "Running", &["Pending"]);
    // Inside the guest, localhost and 127.0.0.1 are the guest itself and
    // bypass the proxy (NO_PROXY); `--noproxy ''` sends them to the proxy,
    // which resolves names on the host: a stand-in for a public name.
    let status = |sb: &str, url: &str| {
        stdout_of(&daemon.run(sb, &format!("curl -s --noproxy '' -o /dev/null -w '%{{http_code}}' {url}")))
            .trim()
            .to_owned()
    };
    let by_name = format!("http://localhost:{port}/hello.txt");
    let by_ip = format!("http://127.0.0.1:{port}/hello.txt");

    // Allowed by egress[0]: the file arrives through the proxy.
    let raw = daemon.run(&only_localhost, &format!("curl -sSf --noproxy '' {by_name}"));
    assert!(stdout_of(&raw).contains("from the host"), "an allowed request failed: {raw}");
    // Denied by defaultAction: the proxy closes the connection without an
    // answer (curl's 000), so the client fails as under the reference
    // egress, and nothing is fetched.
    assert_eq!(status(&only_localhost, &by_ip), "000");
    // A client that ignores the proxy reaches nothing: no NIC, and the
    // guest's own loopback has no such server.
    let direct = daemon.run(
        &only_localhost,
        &format!(
            "curl -s --noproxy '*' --max-time 5 {by_name} || echo curl-failed; \
             python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 3)\" 2>/dev/null || echo socket-failed; \
             python3 -c \"import socket; socket.create_connection(('10.0.2.2', {port}), 3)\" 2>/dev/null || echo route-failed"
        ),
    );
    let direct = stdout_of(&direct);
    assert!(!direct.contains("from the host"), "a direct connection got through: {direct}");
    for want in ["curl-failed", "socket-failed", "route-failed"] {
        assert!(direct.contains(want), "{want} missing: {direct}");
    }

    // Names: the first matching rule wins, so localhost is denied by
    // egress[0] though the default allows. Addresses: a deny rule beats an
    // allow rule whatever the order, as the reference's nftables sets do, so
    // 127.0.0.1 is allowed by egress[1] and 127.0.0.2 denied by egress[2].
    assert_eq!(status(&first_match, &by_name), "000");
    assert_eq!(status(&first_match, &by_ip), "200");
    assert_eq!(status(&first_match, &format!("http://127.0.0.2:{port}/hello.txt")), "000");

    // The egress sidecar's policy API (port 18080, what the SDKs'
    // get_egress_policy, patch_egress_rules and delete_egress_rules call).
    let policy_api = |sb: &str, method: &str, body: &str| {
        let (code, ep) = daemon.curl("GET", &format!("/v1/sandboxes/{sb}/endpoints/18080"), None);
        assert_eq!(code, 200, "{ep}");
        let token =
            format!("X-EXECD-ACCESS-TOKEN: {}", ep["headers"]["X-EXECD-ACCESS-TOKEN"].as_str().unwrap());
        let out = Command::new("curl")
            .args([
                "-s",
                "-X",
                method,
                "-H",
                &token,
                "-H",
                "content-type: application/json",
                "-w",
                "\n%{http_code}",
            ])
            .args(if body.is_empty() { vec![] } else { vec!["--data-binary", body] })
            .arg(format!("http://{}/policy", ep["endpoint"].as_str().unwrap()))
            .output()
            .unwrap();
        let got = text(&out.stdout);
        let (body, code) = got.rsplit_once('\n').unwrap();
        (code.to_owned(), serde_json::from_str::<Value>(body).unwrap_or(Value::String(body.to_owned())))
    };
    let (code, body) = policy_api(&first_match, "GET", "");
    assert_eq!(code, "200", "{body}");
    assert_eq!(body["mode"], "enforcing", "{body}");
    assert_eq!(body["policy"]["defaultAction"], "allow", "{body}");
    assert_eq!(body["policy"]["egress"][1], json!({ "action": "allow", "target": "127.0.0.0/8" }), "{body}");

    // Live changes, merged and removed as the reference sidecar does
    // (policy_utils.go): the next request is decided by the new rules.
    let (code, body) = policy_api(&only_localhost, "PATCH", r#"[{"action":"allow","target":"127.0.0.1"}]"#);
    assert_eq!(code, "200", "{body}");
    assert_eq!(body["policy"]["egress"][0], json!({ "action": "allow", "target": "127.0.0.1" }), "{body}");
    assert_eq!(status(&only_localhost, &by_ip), "200", "allowed by the patch");
    let (code, body) = policy_api(&only_localhost, "DELETE", r#"["LOCALHOST"]"#);
    assert_eq!(code, "200", "{body}");
    assert_eq!(body["policy"]["egress"], json!([{ "action": "allow", "target": "127.0.0.1" }]), "{body}");
    assert_eq!(status(&only_localhost, &by_name), "000", "denied once its rule is deleted");
    let (code, body) = policy_api(&only_localhost, "DELETE", r#"["nothing.example.com"]"#);
    assert_eq!(
        (code.as_str(), body["reason"].as_str()),
        ("200", Some("no matching targets found")),
        "{body}"
    );
    // Bad changes: 400, and the policy stays.
    for bad in
        ["[]", r#"[{"action":"allow","target":""}]"#, r#"[{"action":"permit","target":"a.com"}]"#, "{}"]
    {
        let (code, body) = policy_api(&only_localhost, "PATCH", bad);
        assert_eq!(code, "400", "{bad}: {body}");
    }
    assert_eq!(status(&only_localhost, &by_ip), "200", "a refused change changed nothing");

    // The changed policy survives a pause and resume (a new Attempt of the
    // same Job, which recorded the first policy: the daemon applies the
    // changed one again).
    let (code, body) = daemon.curl("POST", &format!("/v1/sandboxes/{only_localhost}/pause"), None);
    assert_eq!(code, 202, "{body}");
    daemon.wait_state(&only_localhost, "Paused", &["Pausing", "Running"]);
    let (code, body) = policy_api(&only_localhost, "PATCH", r#"[{"action":"allow","target":"localhost"}]"#);
    assert_eq!(code, "409", "no change while paused: {body}");
    let (code, body) = daemon.curl("POST", &format!("/v1/sandboxes/{only_localhost}/resume"), None);
    assert_eq!(code, 202, "{body}");
    daemon.wait_state(&only_localhost, "Running", &["Resuming", "Paused"]);
    // The resumed proxy starts from the change its Trace recorded: the
    // first request after resume is decided by it (curl's error, if any,
    // says whether the proxy refused or could not be reached).
    let raw = daemon
        .run(&only_localhost, &format!("curl -sS --noproxy '' -o /dev/null -w '%{{http_code}}' {by_ip}"));
    assert_eq!(stdout_of(&raw).trim(), "200", "after resume, the patched rule holds: {raw}");
    assert_eq!(status(&only_localhost, &by_name), "000", "after resume, the deleted rule stays deleted");

    // Every decision is in the sandbox Job's Trace, with the rule that made it.
    let job = daemon.record(&only_localhost)["job"].as_str().unwrap().to_owned();
    let events = text(&daemon.env.pvisor(&["events", &job, "--json"]).stdout);
    let network: Vec<Value> = records_of(&events, "event")
        .into_iter()
        .filter(|e| e.to_string().contains("network.allowed") || e.to_string().contains("network.denied"))
        .collect();
    let allowed =
        network.iter().find(|e| e.to_string().contains("network.allowed")).expect("no network.allowed event");
    assert!(allowed.to_string().contains("egress[0] allow localhost"), "{allowed}");
    let denied =
        network.iter().find(|e| e.to_string().contains("network.denied")).expect("no network.denied event");
    assert!(
        denied.to_string().contains("127.0.0.1") && denied.to_string().contains("defaultAction deny"),
        "{denied}"
    );
    let changes = records_of(&events, "event")
        .into_iter()
        .filter(|e| e.to_string().contains("network.policy_changed"))
        .count();
    assert!(changes >= 2, "each live change is in the Trace: {changes}");
}

/// The entrypoint is the sandbox's main process, as upstream has it
/// (server/opensandbox_server/services/docker.py maps an exited container:
/// 0 → Terminated `CONTAINER_EXITED`, N → Failed `CONTAINER_EXITED_ERROR`
/// "Sandbox container exited with code N."). An entrypoint that exits, or
/// cannot be executed (127, as a shell says), ends its sandbox and its VM;
/// one that keeps running keeps the sandbox Running.
#[test]
fn a_sandbox_ends_with_its_entrypoint() {
    let daemon = Daemon::new();
    let cases = [
        (
            json!(["sh", "-c", "sleep 1; exit 3"]),
            "Failed",
            "CONTAINER_EXITED_ERROR",
            "Sandbox container exited with code 3.",
        ),
        (json!(["true"]), "Terminated", "CONTAINER_EXITED", "Sandbox container exited successfully."),
        (
            json!(["/no/such/entrypoint"]),
            "Failed",
            "CONTAINER_EXITED_ERROR",
            "Sandbox container exited with code 127.",
        ),
    ];
    let ids: Vec<String> =
        cases.iter().map(|(entrypoint, ..)| daemon.create(json!({ "entrypoint": entrypoint }))).collect();
    let alive = daemon.create(json!({}));
    for (id, (entrypoint, state, reason, message)) in ids.iter().zip(&cases) {
        let got = daemon.wait_state(id, state, &["Pending", "Running", "Stopping"]);
        assert_eq!(got["status"]["reason"], *reason, "{entrypoint}: {got}");
        assert_eq!(got["status"]["message"], *message, "{entrypoint}: {got}");
        let job = daemon.record(id)["job"].as_str().unwrap().to_owned();
        let status = daemon.env.status_json(Some(&job));
        assert_ne!(status["state"], "running", "{entrypoint}: its VM was stopped: {status}");
    }
    assert_eq!(daemon.wait_state(&alive, "Running", &["Pending"])["status"]["state"], "Running");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(daemon.state(&alive)["status"]["state"], "Running", "a running entrypoint keeps its sandbox");
}

/// Renew on access (OSEP-0009; values validated as upstream's
/// server/opensandbox_server/extensions/validation.py does): a sandbox
/// created with `extensions["access.renew.extend.seconds"]` has its expiry
/// moved to now + that much by a request through the daemon; an invalid
/// value, and a GPU request pvisor cannot satisfy, are 400s that name them.
#[test]
fn a_sandbox_that_asked_for_it_renews_on_access_and_bad_values_are_refused() {
    let daemon = Daemon::new();
    let create = |extra: Value| {
        let mut body = json!({ "image": { "uri": "default" }, "entrypoint": ["tail", "-f", "/dev/null"], "timeout": 120 });
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        daemon.curl("POST", "/v1/sandboxes", Some(body))
    };
    for (extra, says) in [
        (json!({ "extensions": { "access.renew.extend.seconds": "10" } }), "between 300 and 86400 seconds"),
        (json!({ "extensions": { "access.renew.extend.seconds": "soon" } }), "base-10 integer"),
        (json!({ "resourceLimits": { "gpu": "1" } }), "GPU"),
    ] {
        let (code, body) = create(extra.clone());
        assert_eq!(code, 400, "{extra}: {body}");
        assert!(body["message"].as_str().unwrap().contains(says), "{extra}: {body}");
    }
    let expiry = |id: &str| daemon.state(id)["expiresAt"].as_str().unwrap().to_owned();
    let (code, body) = create(json!({ "extensions": { "access.renew.extend.seconds": "3600" } }));
    assert_eq!(code, 202, "{body}");
    let renewing = body["id"].as_str().unwrap().to_owned();
    let plain = daemon.create(json!({ "timeout": 120 }));
    daemon.wait_state(&renewing, "Running", &["Pending"]);
    daemon.wait_state(&plain, "Running", &["Pending"]);
    let (before, plain_before) = (expiry(&renewing), expiry(&plain));
    for id in [&renewing, &plain] {
        daemon.run(id, "true");
    }
    let (after, plain_after) = (expiry(&renewing), expiry(&plain));
    assert!(after > before, "an access renewed it: {before} → {after}");
    let hours = |t: &str| t[11..13].parse::<i64>().unwrap() * 60 + t[14..16].parse::<i64>().unwrap();
    let gained = (hours(&after) - hours(&before)).rem_euclid(24 * 60);
    assert!((55..=60).contains(&gained), "about an hour more ({before} → {after})");
    assert_eq!(plain_after, plain_before, "a sandbox that did not ask keeps its expiry");
}

/// The diagnostics routes answer as the reference server's do
/// (server/opensandbox_server/api/devops.py): the stable `scope`d API is
/// 501 `DIAGNOSTICS_NOT_IMPLEMENTED`; without `scope`, plain text marked
/// deprecated: the entrypoint's output as the container's logs, the
/// lifecycle as events, and inspect and summary.
#[test]
fn diagnostics_answer_as_the_reference_does() {
    let daemon = Daemon::new();
    let id = daemon
        .create(json!({ "entrypoint": ["sh", "-c", "echo hello-from-entrypoint; exec tail -f /dev/null"] }));
    daemon.wait_state(&id, "Running", &["Pending"]);
    let get = |path: &str| {
        let out = Command::new("curl")
            .args(["-s", "-i", "-H", &format!("OPEN-SANDBOX-API-KEY: {}", daemon.key)])
            .arg(format!("http://127.0.0.1:{}/v1/sandboxes/{id}/diagnostics/{path}", daemon.port))
            .output()
            .unwrap();
        text(&out.stdout)
    };
    for scoped in ["logs?scope=container", "events?scope=all"] {
        let answer = get(scoped);
        assert!(answer.starts_with("HTTP/1.1 501"), "{scoped}: {answer}");
        assert!(answer.contains("DIAGNOSTICS_NOT_IMPLEMENTED"), "{scoped}: {answer}");
    }
    let logs = wait_until(Duration::from_secs(20), || get("logs").contains("hello-from-entrypoint"));
    assert!(logs, "the entrypoint's output is the sandbox's log: {}", get("logs"));
    assert!(get("logs").to_lowercase().contains("deprecation: true"));
    let events = get("events?limit=5");
    assert!(events.contains("started") && events.contains("Running"), "{events}");
    assert!(get("inspect").contains(&format!("Sandbox ID:     {id}")));
    assert!(get("summary").contains("SANDBOX DIAGNOSTICS SUMMARY"));
    assert!(get("logs?tail=0").starts_with("HTTP/1.1 400"), "a tail of 0 names the parameter");
    assert!(get("nonsense").starts_with("HTTP/1.1 404"));
}
