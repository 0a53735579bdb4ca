//! Brokered secrets (`run --secret VAR@HOST[:PORT]`), adversarially: the
//! bound host gets the value, in every header form and by every path a
//! client may take (the proxy, the forwarded loopback port, a TLS
//! connection the proxy terminates), while the sandbox, every other host,
//! the records and pvisor's own output only ever see the placeholder.
//! The servers are on loopback, started by the test; they record the
//! headers they got, so each assertion is about what left the sandbox.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use base64::Engine;

use crate::support::*;

/// A Python HTTP(S) server on 127.0.0.1 that appends each request's path
/// and headers to a file as JSON, and echoes the `x-api-key` it got in
/// an `X-Echo` response header; killed on drop.
struct HeaderServer {
    child: Child,
    port: u16,
    log: PathBuf,
    /// Outside the test's Env: the one place the value is meant to reach.
    _dir: tempfile::TempDir,
}

const SERVER: &str = r#"
import http.server, json, ssl, sys
log = open(sys.argv[1], "a")
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        log.write(json.dumps({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}) + "\n")
        log.flush()
        body = b"served " + self.path.encode() + b"\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Echo", self.headers.get("x-api-key", ""))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
if len(sys.argv) > 2:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(sys.argv[2], sys.argv[3])
    server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

impl HeaderServer {
    /// Starts a server; with `tls` (certificate and key PEM files), HTTPS.
    fn start(tls: Option<(&Path, &Path)>) -> Self {
        let dir = tempfile::Builder::new().prefix("pvisor-e2e-server-").tempdir().unwrap();
        let log = dir.path().join("requests.log");
        let mut cmd = Command::new("python3");
        cmd.args(["-c", SERVER]).arg(&log).stdout(Stdio::piped()).stdin(Stdio::null());
        if let Some((cert, key)) = tls {
            cmd.arg(cert).arg(key);
        }
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line)
            .unwrap();
        Self { child, port: line.trim().parse().unwrap(), log, _dir: dir }
    }

    /// Each request it served: its path and headers.
    fn requests(&self) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    /// The headers of the request for `path`.
    fn headers(&self, path: &str) -> serde_json::Value {
        let all = self.requests();
        let found = all.iter().find(|r| r["path"] == path);
        found.unwrap_or_else(|| panic!("{path} never reached the server: {all:?}"))["headers"].clone()
    }
}

impl Drop for HeaderServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A value no file or record could hold by chance.
fn real_value() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("sk-e2e-real-{}-{nanos}", std::process::id())
}

/// Every file under `root` (the workspace, the stage, the state directory,
/// the Bundle, the logs) that holds `needle`.
fn files_holding(root: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() {
                let bytes = std::fs::read(&path).unwrap_or_default();
                if bytes.windows(needle.len()).any(|w| w == needle) {
                    found.push(path);
                }
            }
        }
    }
    found
}

/// The placeholder the command printed as `inside=...`.
fn placeholder_in(stdout: &str) -> String {
    let line = stdout.lines().find_map(|l| l.strip_prefix("inside=")).unwrap_or_default();
    assert!(line.starts_with("pvisor-placeholder-") && line.len() == 51, "no placeholder inside: {stdout}");
    line.to_owned()
}

/// Asserts `value` is nowhere pvisor wrote or printed, in plain or base64.
fn assert_never_recorded(env: &Env, value: &str, output: &std::process::Output) {
    let b64 = base64::engine::general_purpose::STANDARD.encode(format!("user:{value}"));
    for needle in [value, b64.as_str()] {
        let files = files_holding(env.dir.path(), needle.as_bytes());
        assert!(files.is_empty(), "the value is on disk: {files:?}");
        assert!(!text(&output.stdout).contains(needle) && !text(&output.stderr).contains(needle));
    }
}

fn run_with_secret(
    env: &Env,
    value: &str,
    extra_env: &[(&str, &Path)],
    args: &[&str],
) -> std::process::Output {
    let mut cmd = env.command(args);
    cmd.env("BROKERED_KEY", value);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// Plain HTTP to a bound loopback port: through the proxy (absolute form
/// and inside a `CONNECT`) and through the forwarded port (`--noproxy`),
/// with the value in
/// `x-api-key`, `Authorization: Bearer` and `Authorization: Basic`; the
/// same placeholder sent to another allowed port arrives unreplaced. The
/// command's environment, `/proc` and files hold only the placeholder,
/// and no file under the state directory or workspace holds the value.
fn a_secret_reaches_its_host_alone(who: As) {
    who.require();
    let env = Env::new(who);
    let (bound, other) = (HeaderServer::start(None), HeaderServer::start(None));
    let (a, b) = (bound.port, other.port);
    let value = real_value();
    let script = format!(
        r#"echo "inside=$BROKERED_KEY"
        curl -sS -m 10 -H "x-api-key: $BROKERED_KEY" http://127.0.0.1:{a}/proxied
        curl -sS -m 10 --noproxy '*' -H "Authorization: Bearer $BROKERED_KEY" http://127.0.0.1:{a}/forwarded
        curl -sS -m 10 -u "user:$BROKERED_KEY" http://127.0.0.1:{a}/basic
        curl -sS -m 10 -p -H "x-api-key: $BROKERED_KEY" http://127.0.0.1:{a}/tunnelled
        curl -sS -m 10 -D - -o /dev/null -H "x-api-key: $BROKERED_KEY" http://127.0.0.1:{a}/echo | grep -i '^x-echo'
        curl -sS -m 10 --noproxy '*' -D - -o /dev/null -H "x-api-key: $BROKERED_KEY" http://127.0.0.1:{a}/echo-raw | grep -i '^x-echo'
        curl -sS -m 10 -o /dev/null -w "trace=%{{http_code}}\n" -X TRACE -H "x-api-key: $BROKERED_KEY" http://127.0.0.1:{a}/trace
        curl -sS -m 10 --noproxy '*' -o /dev/null -w "trace-raw=%{{http_code}}\n" -X TRACE -H "x-api-key: $BROKERED_KEY" http://127.0.0.1:{a}/trace
        curl -sS -m 10 -p -H "x-api-key: $BROKERED_KEY" http://127.0.0.1:{b}/elsewhere-tunnelled
        curl -sS -m 10 -H "x-api-key: $BROKERED_KEY" http://127.0.0.1:{b}/elsewhere
        curl -sS -m 10 --noproxy '*' -H "x-api-key: $BROKERED_KEY" http://127.0.0.1:{b}/elsewhere-raw
        env > env.txt
        cat /proc/self/environ > environ.txt
        cat /proc/[0-9]*/environ > all-environ.txt 2>/dev/null
        cat /proc/[0-9]*/cmdline > all-cmdline.txt 2>/dev/null
        grep -c BROKERED_KEY=pvisor-placeholder- env.txt"#
    );
    let (allow_a, allow_b, secret) =
        (format!("127.0.0.1:{a}"), format!("127.0.0.1:{b}"), format!("BROKERED_KEY@127.0.0.1:{a}"));
    let args =
        ["run", "--allow", &allow_a, "--allow", &allow_b, "--secret", &secret, "--", "sh", "-c", &script];
    let out = run_with_secret(&env, &value, &[], &args);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let placeholder = placeholder_in(&stdout);
    let paths = [
        "/proxied",
        "/forwarded",
        "/basic",
        "/tunnelled",
        "/elsewhere",
        "/elsewhere-raw",
        "/elsewhere-tunnelled",
    ];
    for path in paths {
        assert!(stdout.contains(&format!("served {path}")), "{path} was not served: {stdout}");
    }
    // The bound host got the value, in each header form.
    assert_eq!(bound.headers("/proxied")["x-api-key"], value.as_str());
    assert_eq!(bound.headers("/forwarded")["authorization"], format!("Bearer {value}").as_str());
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("user:{value}"));
    assert_eq!(bound.headers("/basic")["authorization"], format!("Basic {basic}").as_str());
    // A response header echoing the value carries the placeholder back.
    assert_eq!(bound.headers("/echo")["x-api-key"], value.as_str());
    let echoes = stdout.lines().filter(|l| l.to_lowercase().starts_with("x-echo:")).collect::<Vec<_>>();
    assert_eq!(echoes.len(), 2, "{stdout}");
    assert!(echoes.iter().all(|l| l.trim_end().ends_with(&placeholder)), "{echoes:?}");
    // TRACE would echo the value back: refused by either path.
    assert!(stdout.contains("trace=405") && stdout.contains("trace-raw=405"), "{stdout}");
    // Plain HTTP inside a CONNECT (how Node's proxy agents send http://).
    assert_eq!(bound.headers("/tunnelled")["x-api-key"], value.as_str());
    // Another host (port) got the placeholder, by either path.
    assert_eq!(other.headers("/elsewhere")["x-api-key"], placeholder.as_str());
    assert_eq!(other.headers("/elsewhere-raw")["x-api-key"], placeholder.as_str());
    assert_eq!(other.headers("/elsewhere-tunnelled")["x-api-key"], placeholder.as_str());
    // The probes ran (the environment dump names the placeholder) and no
    // file they wrote, nor any record, log or Bundle, holds the value.
    assert!(stdout.lines().any(|l| l == "1"), "the env probe did not run: {stdout}");
    // The Bundle, exported into the state directory, is searched with it.
    env.expect(&["export"], 0);
    let exports = std::fs::read_dir(env.home.join("exports")).unwrap().count();
    assert_eq!(exports, 1, "no Bundle was exported");
    assert_never_recorded(&env, &value, &out);
    let review = env.review();
    assert!(
        review.iter().any(|c| c["path"].as_str().is_some_and(|p| p.ends_with("all-environ.txt"))),
        "{review:?}"
    );
    // Each substitution is an event naming the variable, never the value.
    let events = crate::network::network_events(&env);
    let substituted: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["type"] == "network.secret_substituted").collect();
    assert_eq!(substituted.len(), 6, "{events:?}");
    assert!(substituted.iter().all(|e| e["data"]["variable"] == "BROKERED_KEY" && e["data"]["port"] == a));
    // Admission recorded the binding by name and destination.
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    let bound_event = env.events(&job).into_iter().find(|e| e["data"]["rewrite"] == "secret");
    let bound_event = bound_event.expect("an admission.rewrite secret event");
    assert_eq!(
        (&bound_event["data"]["name"], &bound_event["data"]["port"]),
        (&"BROKERED_KEY".into(), &a.into())
    );
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn a_secret_reaches_its_host_alone_root() {
    a_secret_reaches_its_host_alone(As::Root);
}

#[test]
fn a_secret_reaches_its_host_alone_rootless() {
    a_secret_reaches_its_host_alone(As::Rootless);
}

/// Writes a CA and a leaf for 127.0.0.1 it signed (the test's stand-in for
/// a real host's certificate and the public roots), returning the CA's
/// PEM file and the leaf's certificate and key files.
fn upstream_certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    upstream_certificates_for(dir, "127.0.0.1")
}

/// The same for a leaf naming `name`.
pub(crate) fn upstream_certificates_for(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "e2e upstream CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let mut leaf_params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
    leaf_params.distinguished_name.push(rcgen::DnType::CommonName, "e2e upstream");
    let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key).unwrap();
    let files = (dir.join("upstream-ca.pem"), dir.join("upstream.pem"), dir.join("upstream.key"));
    std::fs::write(&files.0, ca.pem()).unwrap();
    std::fs::write(&files.1, leaf.pem()).unwrap();
    std::fs::write(&files.2, leaf_key.serialize_pem()).unwrap();
    files
}

/// HTTPS: the proxy terminates TLS for the bound host with the run's CA
/// (which curl inside trusts through `SSL_CERT_FILE`), verifies the real
/// host with the host's roots (here the supervisor's `SSL_CERT_FILE`) and
/// sends the value; another HTTPS host is tunnelled untouched (curl sees
/// its own certificate) and gets the placeholder; a request naming another
/// `Host` behind the bound host's TLS is refused.
fn a_secret_over_https_is_substituted_behind_the_runs_ca(who: As) {
    who.require();
    let env = Env::new(who);
    let (ca, cert, key) = upstream_certificates(env.dir.path());
    env.give_away(env.dir.path());
    let bound = HeaderServer::start(Some((&cert, &key)));
    let other = HeaderServer::start(Some((&cert, &key)));
    let (a, b) = (bound.port, other.port);
    let value = real_value();
    let script = format!(
        r#"echo "inside=$BROKERED_KEY"
        curl -sS -m 10 -v -H "x-api-key: $BROKERED_KEY" https://127.0.0.1:{a}/tls 2>bound.err; grep -i "issuer:" bound.err
        curl -sS -m 10 -v -H "x-api-key: $BROKERED_KEY" https://127.0.0.1:{b}/tls-elsewhere 2>other.err; grep -i "issuer:" other.err
        [ -f /etc/ssl/certs/ca-certificates.crt ] && env -u CURL_CA_BUNDLE -u SSL_CERT_FILE curl -sS -m 10 --cacert /etc/ssl/certs/ca-certificates.crt -H "x-api-key: $BROKERED_KEY" https://127.0.0.1:{a}/system-bundle
        curl -sS -m 10 -o /dev/null -w "fronted=%{{http_code}}\n" -H "Host: elsewhere.test" -H "x-api-key: $BROKERED_KEY" https://127.0.0.1:{a}/fronted"#
    );
    let (allow_a, allow_b, secret) =
        (format!("127.0.0.1:{a}"), format!("127.0.0.1:{b}"), format!("BROKERED_KEY@127.0.0.1:{a}"));
    let args =
        ["run", "--allow", &allow_a, "--allow", &allow_b, "--secret", &secret, "--", "sh", "-c", &script];
    let out = run_with_secret(&env, &value, &[("SSL_CERT_FILE", &ca)], &args);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let placeholder = placeholder_in(&stdout);
    assert!(stdout.contains("served /tls\n") && stdout.contains("served /tls-elsewhere\n"), "{stdout}");
    let issuers: Vec<&str> = stdout.lines().filter(|l| l.to_lowercase().contains("issuer:")).collect();
    assert!(issuers.len() == 2, "{stdout}");
    assert!(
        issuers[0].contains("pvisor per-run broker CA"),
        "the bound host's TLS was not terminated: {stdout}"
    );
    assert!(issuers[1].contains("e2e upstream CA"), "another host's TLS was not passed through: {stdout}");
    assert_eq!(bound.headers("/tls")["x-api-key"], value.as_str());
    // A client that reads the system bundle's path trusts the run's CA too.
    if Path::new("/etc/ssl/certs/ca-certificates.crt").is_file() {
        assert_eq!(bound.headers("/system-bundle")["x-api-key"], value.as_str());
    }
    // Another Host behind the bound host's TLS (domain fronting through a
    // shared front end) is refused before anything is sent.
    assert!(stdout.contains("fronted=400"), "{stdout}");
    assert!(bound.requests().iter().all(|r| r["path"] != "/fronted"), "{:?}", bound.requests());
    assert_eq!(other.headers("/tls-elsewhere")["x-api-key"], placeholder.as_str());
    assert_never_recorded(&env, &value, &out);
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn a_secret_over_https_is_substituted_behind_the_runs_ca_root() {
    a_secret_over_https_is_substituted_behind_the_runs_ca(As::Root);
}

#[test]
fn a_secret_over_https_is_substituted_behind_the_runs_ca_rootless() {
    a_secret_over_https_is_substituted_behind_the_runs_ca(As::Rootless);
}

/// A `--secret` that cannot be honoured is refused before the command
/// runs and before any Job exists, naming the variable and what to do:
/// an unset variable, a host no rule allows, the vm executor, bad syntax.
#[test]
fn a_secret_that_cannot_be_brokered_is_refused_before_the_run() {
    let env = Env::new(As::Rootless);
    let cases: [(&[&str], &str); 4] = [
        (
            &["--allow", "127.0.0.1:9", "--secret", "PVISOR_E2E_UNSET@127.0.0.1:9"],
            "PVISOR_E2E_UNSET is not set",
        ),
        (&["--allow", "127.0.0.1:9", "--secret", "BROKERED_KEY@127.0.0.1:10"], "--allow 127.0.0.1:10"),
        (
            // A vm brokers only a loopback port over plain HTTP (no CA in the guest).
            &[
                "--executor",
                "vm",
                "--allow",
                "api.example.com:443",
                "--secret",
                "BROKERED_KEY@api.example.com:443",
            ],
            "--executor ns",
        ),
        (&["--allow", "127.0.0.1:9", "--secret", "BROKERED_KEY"], "VAR@HOST"),
    ];
    let value = real_value();
    for (flags, says) in cases {
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.extend(["--", "echo", "RAN"]);
        let out = run_with_secret(&env, &value, &[], &args);
        let stderr = text(&out.stderr);
        assert!(!out.status.success() && !text(&out.stdout).contains("RAN"), "{flags:?} ran: {stderr}");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
        assert!(!stderr.contains(&value), "{flags:?} printed the value: {stderr}");
    }
    let jobs = env.home.join("jobs");
    let count = std::fs::read_dir(&jobs).map(|d| d.count()).unwrap_or(0);
    assert_eq!(count, 0, "a refused --secret left a Job");
}

/// An agent preset's `secrets` are brokered like `--secret`: a user's
/// `[agents.probe]` binds a key to a loopback server, which gets the
/// value while the command holds the placeholder.
#[test]
fn an_agent_presets_secrets_are_brokered() {
    let env = Env::new(As::Rootless);
    let server = HeaderServer::start(None);
    let port = server.port;
    let config = env.dir.path().join(".config/pvisor/config.toml");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(
        &config,
        format!(
            "[agents.probe]\nallow = [\"127.0.0.1:{port}\"]\nsecrets = [\"BROKERED_KEY@127.0.0.1:{port}\"]\n"
        ),
    )
    .unwrap();
    env.give_away(env.dir.path());
    let value = real_value();
    let script = format!(
        r#"echo "inside=$BROKERED_KEY"; curl -sS -m 10 -H "x-api-key: $BROKERED_KEY" http://127.0.0.1:{port}/agent"#
    );
    let mut cmd = env.command(&["run", "--agent", "probe", "--", "sh", "-c", &script]);
    cmd.env("BROKERED_KEY", &value).env("XDG_CONFIG_HOME", env.dir.path().join(".config"));
    let out = cmd.output().unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    placeholder_in(&stdout);
    assert_eq!(server.headers("/agent")["x-api-key"], value.as_str());
    assert_never_recorded(&env, &value, &out);
}
