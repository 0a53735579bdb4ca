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
