//! The credential vault, driven by the published Python SDK
//! (`tests/sdk/vault.py`, which cites the reference e2e test it follows)
//! against an echo server on the host: every auth type injected, runtime
//! mutations with their revisions, a pause and resume, and no value where
//! the sandbox, a record or a log could show it.

use super::*;

/// What the sandbox must never hold, and the records must never keep.
fn files_holding(dir: &Path, secrets: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() && entry.metadata().is_ok_and(|m| m.len() < 64 << 20) {
                let bytes = fs::read(&path).unwrap_or_default();
                let text = String::from_utf8_lossy(&bytes);
                if let Some(secret) = secrets.iter().find(|s| text.contains(s.as_str())) {
                    found.push(format!("{} holds {secret}", path.display()));
                }
            }
        }
    }
    found
}

#[test]
#[ignore = "needs root: the daemon gets its own /etc/hosts in a mount namespace, and the echo server port 80"]
fn the_credential_vault_injects_every_auth_type_and_no_value_is_kept() {
    // A loopback address of its own: the echo server takes port 80 there.
    let ip = format!("127.77.{}.1", std::process::id() % 200 + 1);
    let host = "credential-vault-e2e.pvisor.test";
    // The echo server's HTTPS certificate, from a CA the daemon's proxy
    // trusts as a host's public roots (`SSL_CERT_FILE`) and the sandbox does not.
    let certs = tempfile::tempdir().unwrap();
    let (upstream_ca, cert, key) = crate::secrets::upstream_certificates_for(certs.path(), host);
    let upstream_ca = upstream_ca.to_str().unwrap();
    let daemon = Daemon::with_hosts(&format!("{ip} {host}"), &[("SSL_CERT_FILE", upstream_ca)]);
    let out = Command::new(sdk_python())
        .env("TLS_CERT", &cert)
        .env("TLS_KEY", &key)
        .env("UPSTREAM_CA", upstream_ca)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/sdk/vault.py"))
        .env("PVISOR_URL", format!("127.0.0.1:{}", daemon.port))
        .env("PVISOR_KEY", &daemon.key)
        .env("TARGET_HOST", host)
        .env("TARGET_IP", &ip)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("https OK") && stdout.contains("credential vault OK"),
        "vault.py failed\nstdout: {stdout}\nstderr: {}\ndaemon: {}",
        text(&out.stderr),
        daemon.log()
    );
    let secrets: Vec<String> = stdout
        .lines()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .and_then(|v| serde_json::from_value(v["secrets"].clone()).ok())
        .expect("vault.py names its secrets");
    assert_eq!(secrets.len(), 7, "{secrets:?}");
    // No value in any record, Trace, bundle or log the daemon and its Jobs wrote.
    let leaks = files_holding(daemon.env.dir.path(), &secrets);
    assert!(leaks.is_empty(), "values were written down: {leaks:?}");
    // The Traces record each vault change and each injection, by name.
    let mut injected = Vec::new();
    let mut changes = 0;
    for job in daemon.jobs() {
        let job = job["job"].as_str().or(job["id"].as_str()).unwrap_or_default().to_owned();
        for event in daemon.env.events(&job) {
            match event["type"].as_str() {
                Some("network.credential_injected") => injected.push(event["data"]["binding"].clone()),
                Some("network.vault_changed") => changes += 1,
                _ => {}
            }
        }
    }
    for binding in ["bearer", "basic", "api-key", "custom-headers", "runtime-added", "runtime-replaced"] {
        assert!(injected.contains(&json!(binding)), "no injection of {binding} recorded: {injected:?}");
    }
    assert!(changes >= 8, "each vault change is in a Trace: {changes}");
}

/// A host server (ended when dropped) on `ip:80` that answers each
/// request with the `Authorization` header it got (`none` without one).
struct AuthorizationEcho(Child);

impl Drop for AuthorizationEcho {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn authorization_echo(ip: &str) -> AuthorizationEcho {
    let script = r#"
import http.server, sys
class Echo(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("auth=" + (self.headers.get("Authorization") or "none") + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer((sys.argv[1], 80), Echo).serve_forever()
"#;
    let child = Command::new("python3")
        .args(["-c", script, ip])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let echo = AuthorizationEcho(child);
    assert!(wait_until(Duration::from_secs(10), || std::net::TcpStream::connect((ip, 80)).is_ok()));
    echo
}

/// A restarted daemon knows no vault (values live in its memory only), and
/// the Job's proxy, which outlived the old daemon, must not keep injecting
/// one: the API would answer "no vault" while credentials still went out,
/// and no DELETE could stop them. A vault created after the restart is
/// injected as usual.
#[test]
#[ignore = "needs root: the daemon gets its own /etc/hosts in a mount namespace, and the echo server port 80"]
fn a_restarted_daemon_leaves_no_vault_in_force_that_its_api_cannot_see() {
    let ip = format!("127.78.{}.1", std::process::id() % 200 + 1);
    let host = "vault-restart-e2e.pvisor.test";
    let _echo = authorization_echo(&ip);
    let mut daemon = Daemon::with_hosts(&format!("{ip} {host}"), &[]);
    let rules = json!([{"action": "allow", "target": host}, {"action": "allow", "target": ip}]);
    let id = daemon.create(json!({
        "image": {"uri": "python"},
        "networkPolicy": {"defaultAction": "deny", "egress": rules},
        "credentialProxy": {"enabled": true},
    }));
    daemon.wait_state(&id, "Running", &["Pending"]);
    let vault = |daemon: &Daemon, method: &str, body: Option<Value>| -> (u16, Value) {
        let (code, ep) = daemon.curl("GET", &format!("/v1/sandboxes/{id}/endpoints/18080"), None);
        assert_eq!(code, 200, "{ep}");
        let (name, value) = ep["headers"].as_object().and_then(|h| h.iter().next()).expect("a token header");
        let mut cmd = Command::new("curl");
        cmd.args(["-s", "-X", method, "-w", "\n%{http_code}", "-H"])
            .arg(format!("{name}: {}", value.as_str().unwrap()));
        if let Some(body) = body {
            cmd.args(["-H", "content-type: application/json", "--data-binary", &body.to_string()]);
        }
        let out = cmd
            .arg(format!("http://{}/credential-vault", ep["endpoint"].as_str().unwrap()))
            .output()
            .unwrap();
        let out = text(&out.stdout);
        let (body, code) = out.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), serde_json::from_str(body).unwrap_or(Value::Null))
    };
    let create = |daemon: &Daemon, token: &str| {
        let body = json!({
            "credentials": [{"name": "t", "source": {"value": token}}],
            "bindings": [{"name": "b", "match": {"schemes": ["http"], "ports": [80], "hosts": [host], "paths": ["/*"]},
                          "auth": {"type": "bearer", "credential": "t"}}],
        });
        let (code, state) = vault(daemon, "POST", Some(body));
        assert_eq!(code, 201, "{state}\n{}", daemon.log());
    };
    // The first answer that reaches the echo server (a guest the restarted
    // daemon has not reattached yet runs no command).
    let fetch = |daemon: &Daemon| {
        let curl = format!("curl -sS --max-time 20 --resolve {host}:80:{ip} http://{host}/x");
        let mut last = String::new();
        let answered = wait_until(Duration::from_secs(60), || {
            last = daemon.run(&id, &curl);
            stdout_of(&last).starts_with("auth=")
        });
        assert!(answered, "the request did not reach the echo server: {last}\n{}", daemon.log());
        stdout_of(&last).trim().to_owned()
    };
    create(&daemon, "before-restart-token");
    assert_eq!(fetch(&daemon), "auth=Bearer before-restart-token");

    // The daemon answers only once it has recovered every sandbox.
    daemon.kill9();
    daemon.start();
    let (code, _) = vault(&daemon, "GET", None);
    assert_eq!(code, 404, "the restarted daemon knows no vault");
    assert_eq!(fetch(&daemon), "auth=none", "a vault the API cannot see is still in force");

    create(&daemon, "after-restart-token");
    assert_eq!(fetch(&daemon), "auth=Bearer after-restart-token");
}
