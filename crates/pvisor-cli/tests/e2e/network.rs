//! Network policy: adversarial cases first. No internet: every server is on
//! loopback, started by the test; names come from a hosts file bind-mounted
//! over /etc/hosts in a mount namespace the test creates.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Output;

use crate::support::*;

/// A tiny keep-alive HTTP server on 127.0.0.1 that answers every request with
/// `hello from <port>`. Returns its port.
pub(crate) fn http_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    buf.drain(..end);
                    let body = format!("hello from {port}");
                    let reply = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                    if stream.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// Runs `pvisor ARGS` with `hosts` as /etc/hosts (a private mount namespace).
pub(crate) fn with_hosts(env: &Env, hosts: &str, args: &[&str]) -> Output {
    let file = env.dir.path().join("hosts");
    std::fs::write(&file, hosts).unwrap();
    env.give_away(&file);
    let mut cmd = unshare_as_test_user();
    cmd.args(["-Urm", "sh", "-c", "mount --bind \"$1\" /etc/hosts && shift && exec \"$@\"", "sh"])
        .arg(&file)
        .arg(bin())
        .args(args)
        .current_dir(&env.ws)
        .env("PVISOR_HOME", &env.home)
        .env("HOME", env.dir.path())
        .env_remove("XDG_CONFIG_HOME");
    if let Some(image) = vm_image() {
        cmd.env("PVISOR_VM_IMAGE", image);
    }
    cmd.output().unwrap()
}

pub(crate) fn network_events(env: &Env) -> Vec<serde_json::Value> {
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    env.events(&job).into_iter().filter(|e| e["type"].as_str().unwrap().starts_with("network.")).collect()
}

/// A host process's abstract Unix socket: no file path, so only the network
/// namespace separates it from the sandbox.
fn abstract_listener(name: &str) -> std::os::unix::net::UnixListener {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    std::os::unix::net::UnixListener::bind_addr(&addr).unwrap()
}

const PY_UDP: &str = "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1); s.sendto(b'x', ('8.8.8.8', 53)); s.recvfrom(10)";

#[test]
fn none_mode_reaches_nothing_outside() {
    let env = Env::new(As::Rootless);
    let port = http_server();
    // A host process holding an abstract Unix socket.
    let name = format!("pvisor-e2e-abstract-{}", std::process::id());
    let _abstract = abstract_listener(&name);
    let script = format!(
        r#"
        fail() {{ echo "ESCAPE: $*"; }}
        curl -s -m 3 http://127.0.0.1:{port}/ && fail tcp-loopback
        curl -s -m 3 -g "http://[::1]:{port}/" && fail ipv6-loopback
        python3 -c "{PY_UDP}" 2>/dev/null && fail udp-dns
        python3 -c "import socket; s=socket.socket(socket.AF_INET6); s.settimeout(2); s.connect(('2001:db8::1', 80))" 2>/dev/null && fail ipv6
        python3 -c "import socket; s=socket.socket(socket.AF_UNIX); s.connect('\0{name}')" 2>/dev/null && fail abstract-socket
        echo checked
        "#
    );
    let out = env.run_sh(&script);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("checked"), "{stdout} {}", text(&out.stderr));
    assert!(!stdout.contains("ESCAPE"), "{stdout}");
}

#[test]
fn proxy_mode_allows_only_the_policy_and_records_every_request() {
    let env = Env::new(As::Rootless);
    let port = http_server();
    // A host loopback port no rule opens (127.0.0.1:{port} is allowed and
    // forwarded, so direct TCP to it is the policy, not a bypass).
    let other = http_server();
    let name = format!("pvisor-e2e-abstract-proxy-{}", std::process::id());
    let _abstract = abstract_listener(&name);
    let script = format!(
        r#"
        fail() {{ echo "ESCAPE: $*"; }}
        ok()   {{ echo "OK: $*"; }}
        # Allowed, through the proxy, with curl and with Python's standard client.
        [ "$(curl -s -m 5 http://allowed.test:{port}/)" = "hello from {port}" ] && ok curl
        python3 -c "import urllib.request; print(urllib.request.urlopen('http://allowed.test:{port}/', timeout=5).read().decode())" | grep -q "hello from {port}" && ok urllib
        # CONNECT tunnels work too (curl -p tunnels plain http through CONNECT).
        [ "$(curl -s -m 5 -p http://allowed.test:{port}/)" = "hello from {port}" ] && ok connect
        # Keep-alive: two requests on one connection.
        [ "$(curl -s -m 5 http://allowed.test:{port}/a http://allowed.test:{port}/b)" = "hello from {port}hello from {port}" ] && ok keepalive
        # Refused:
        curl -s -m 5 -f http://denied.test:{port}/ >/dev/null && fail denied-domain
        curl -s -m 5 -f -p http://denied.test:{port}/ >/dev/null && fail connect-denied
        curl -s -m 5 -f -H "Host: denied.test" http://allowed.test:{port}/ >/dev/null && fail host-header-smuggling
        curl -s -m 3 --noproxy '*' http://127.0.0.1:{other}/ && fail direct-tcp
        python3 -c "{PY_UDP}" 2>/dev/null && fail udp-dns
        python3 -c "import socket; s=socket.socket(socket.AF_UNIX); s.connect('\0{name}')" 2>/dev/null && fail abstract-socket
        echo checked
        "#
    );
    let hosts = "127.0.0.1 localhost\n127.0.0.1 allowed.test\n127.0.0.1 denied.test\n";
    let out = with_hosts(
        &env,
        hosts,
        &[
            "run",
            "--allow",
            "allowed.test",
            "--allow",
            &format!("127.0.0.1:{port}"),
            "--allow",
            "*.test",
            "--deny",
            "denied.test",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(stdout.contains("checked"), "{stdout}\n{stderr}");
    assert!(!stdout.contains("ESCAPE"), "{stdout}");
    for ok in ["curl", "urllib", "connect", "keepalive"] {
        assert!(stdout.contains(&format!("OK: {ok}")), "{ok} did not work: {stdout}\n{stderr}");
    }
    // DNS rebinding is its own test below: here 127.0.0.1 is allowed on purpose.
    let events = network_events(&env);
    let denied: Vec<&serde_json::Value> = events.iter().filter(|e| e["type"] == "network.denied").collect();
    assert!(
        denied.iter().any(|e| e["data"]["host"] == "denied.test" && e["data"]["method"] == "GET"),
        "{events:?}"
    );
    assert!(
        denied.iter().any(|e| e["data"]["host"] == "denied.test" && e["data"]["method"] == "CONNECT"),
        "{events:?}"
    );
    assert!(denied.iter().any(|e| e["data"]["rule"] == "host-mismatch"), "{events:?}");
    assert!(events
        .iter()
        .all(|e| !e["data"]["rule"].is_null() && !e["data"]["host"].is_null() && e["data"]["port"].is_u64()));
    assert!(stderr.contains("denied: denied.test"), "the summary names the top denied hosts: {stderr}");
    assert!(stderr.contains("--allow denied.test"), "{stderr}");
}

#[test]
fn a_name_that_resolves_to_an_internal_address_is_refused_unless_that_address_is_allowed() {
    let env = Env::new(As::Rootless);
    let port = http_server();
    let hosts = "127.0.0.1 localhost\n127.0.0.1 evil.test\n";
    // Also: CONNECT straight to the IP address of the allowed name.
    let script = format!(
        "curl -s -m 5 -f http://evil.test:{port}/ || echo REFUSED; \
         curl -s -m 5 -f -p http://evil.test:{port}/ || echo REFUSED-CONNECT; \
         curl -s -m 5 -f --noproxy '' -p http://127.0.0.1:{port}/ || echo REFUSED-IP"
    );
    let out = with_hosts(&env, hosts, &["run", "--allow", "evil.test", "--", "sh", "-c", &script]);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("REFUSED\n") && stdout.contains("REFUSED-CONNECT"),
        "{stdout}{}",
        text(&out.stderr)
    );
    let events = network_events(&env);
    assert!(events.iter().any(|e| e["data"]["rule"] == "internal-address"), "{events:?}");
    // With the address allowed explicitly, the same name works.
    let out = with_hosts(
        &env,
        hosts,
        &[
            "run",
            "--allow",
            "evil.test",
            "--allow",
            &format!("127.0.0.1:{port}"),
            "--",
            "curl",
            "-s",
            "-m",
            "5",
            &format!("http://evil.test:{port}/"),
        ],
    );
    assert_eq!(text(&out.stdout), format!("hello from {port}"), "{}", text(&out.stderr));
}

#[test]
fn policy_is_decided_once_from_scoped_sources_and_recorded() {
    let env = Env::new(As::Rootless);
    env.write(
        ".pvisor.toml",
        "[network]\nmode = \"proxy\"\nallow = [\"pypi.org\"]\ndeny = [\"bad.pypi.org\"]\n",
    );
    let config_dir = env.dir.path().join("config/pvisor");
    std::fs::create_dir_all(&config_dir).unwrap();
    std::fs::write(config_dir.join("config.toml"), "[network]\nallow = [\"crates.io\"]\n").unwrap();
    env.give_away(&env.dir.path().join("config"));
    // A workspace's config widens the policy only once trusted (see hostile_repo.rs).
    env.expect(&["trust"], 0);
    let out = env
        .command(&["run", "--allow", "example.org", "--", "sh", "-c", "env | grep -c _proxy="])
        .env("XDG_CONFIG_HOME", env.dir.path().join("config"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "4", "http_proxy, https_proxy, all_proxy and no_proxy are set");
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    let admission: Vec<serde_json::Value> =
        env.events(&job).into_iter().filter(|e| e["type"] == "admission.network").collect();
    assert_eq!(admission.len(), 1, "decided once");
    let data = &admission[0]["data"];
    assert_eq!(data["mode"], "proxy");
    assert!(data["mode_source"].as_str().unwrap().ends_with(".pvisor.toml"), "{data}");
    let sources: Vec<&str> =
        data["allow"].as_array().unwrap().iter().map(|r| r["source"].as_str().unwrap()).collect();
    assert_eq!(sources.len(), 3, "{data}");
    assert_eq!(sources[0], "command line");
    assert!(sources[1].ends_with(".pvisor.toml") && sources[2].ends_with("config.toml"), "{sources:?}");
    assert_eq!(data["non_bypassable"], true);

    // The command line wins the mode.
    let out = env
        .command(&["run", "--net", "none", "--", "sh", "-c", "env | grep -c _proxy= || true"])
        .output()
        .unwrap();
    assert_eq!(text(&out.stdout).trim(), "0");

    // A bad rule is an error naming its file, and nothing runs.
    env.write(".pvisor.toml", "[network]\nallow = [\"ex*mple.com\"]\n");
    let out = env.pvisor(&["run", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains(".pvisor.toml"), "{}", text(&out.stderr));
}

#[test]
fn host_mode_is_recorded_as_bypassable() {
    let env = Env::new(As::Rootless);
    let port = http_server();
    let out = env.pvisor(&[
        "run",
        "--net",
        "host",
        "--",
        "curl",
        "-s",
        "-m",
        "5",
        &format!("http://127.0.0.1:{port}/"),
    ]);
    assert_eq!(text(&out.stdout), format!("hello from {port}"));
    assert!(text(&out.stderr).contains("shared the host network"), "{}", text(&out.stderr));
    let status = env.status_json(None);
    let bundle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.attempt_dir(&status).join("bundle.json")).unwrap())
            .unwrap();
    assert_eq!(bundle["observations"]["network"]["non_bypassable"], false);
    assert!(bundle["observations"]["network"]["attachment"].as_str().unwrap().contains("host"));
}

/// A server on 127.0.0.1 that answers like [`http_server`] and counts the
/// requests it receives.
fn counting_server() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            counter.fetch_add(1, Ordering::SeqCst);
            let body = format!("hello from {port}");
            let reply = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(reply.as_bytes());
        }
    });
    (port, seen)
}

/// `--allow 127.0.0.1:A` opens the host's loopback on port A alone: a server
/// there is reached through the proxy (curl, which honours the proxy
/// variables: NO_PROXY no longer lists 127.0.0.1), one on port B is not,
/// plain or tunnelled; the name `localhost`, which curl connects to
/// directly, reaches A through the forward on 127.0.0.1:A, but not on
/// [::1]:A, which no rule opened; `--allow localhost:A` reaches it by that
/// name; a bare loopback rule, which opened every port, is refused with a
/// message asking for one.
fn a_loopback_rule_opens_its_port_alone(who: As) {
    who.require();
    let env = Env::new(who);
    let (a, b) = (http_server(), http_server());
    let script = format!(
        r#"echo "no_proxy=[$no_proxy]"
        curl -s -m 5 http://127.0.0.1:{a}/; echo
        curl -s -m 5 -f http://127.0.0.1:{b}/ || echo REFUSED-B
        curl -s -m 5 -f -p http://127.0.0.1:{b}/ || echo REFUSED-B-CONNECT
        curl -s -m 5 -f http://localhost:{a}/ && echo " by localhost"
        curl -s -m 5 -f -g --noproxy '*' http://[::1]:{a}/ || echo REFUSED-V6"#
    );
    let allow = format!("127.0.0.1:{a}");
    let out = env.pvisor(&["run", "-q", "--allow", &allow, "--", "sh", "-c", &script]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("no_proxy=[localhost,::1]"), "{stdout}");
    assert!(stdout.contains(&format!("hello from {a}\n")), "the allowed port was not reached: {stdout}");
    assert!(!stdout.contains(&format!("hello from {b}")), "another loopback port was reached: {stdout}");
    assert!(stdout.contains(&format!("hello from {a} by localhost")), "{stdout}");
    for refused in ["REFUSED-B\n", "REFUSED-B-CONNECT", "REFUSED-V6"] {
        assert!(stdout.contains(refused), "{refused}: {stdout}");
    }
    let denied: Vec<serde_json::Value> =
        network_events(&env).into_iter().filter(|e| e["type"] == "network.denied").collect();
    assert!(denied.iter().any(|e| e["data"]["port"] == b), "{denied:?}");
    // The name localhost, with its port: reached through the proxy too.
    let allow = format!("localhost:{a}");
    let script = format!("echo \"no_proxy=[$no_proxy]\"; curl -s -m 5 http://localhost:{a}/; echo");
    let out = env.pvisor(&["run", "-q", "--allow", &allow, "--", "sh", "-c", &script]);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("no_proxy=[127.0.0.1,::1]"), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains(&format!("hello from {a}\n")), "{stdout}{}", text(&out.stderr));
    for bare in ["localhost", "127.0.0.1", "[::1]"] {
        let out = env.pvisor(&["run", "-q", "--allow", bare, "--", "echo", "RAN"]);
        assert!(!out.status.success() && !text(&out.stdout).contains("RAN"), "{bare} was accepted");
        assert!(text(&out.stderr).contains("name a port"), "{bare}: {}", text(&out.stderr));
    }
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn a_loopback_rule_opens_its_port_alone_root() {
    a_loopback_rule_opens_its_port_alone(As::Root);
}

#[test]
fn a_loopback_rule_opens_its_port_alone_rootless() {
    a_loopback_rule_opens_its_port_alone(As::Rootless);
}

/// Two `Host` headers, or one that differs from the absolute URI, are
/// refused with 400 before any connection: the allowed server never sees
/// those requests, only the well-formed control request.
#[test]
fn a_duplicated_or_different_host_header_is_refused_before_the_server_sees_it() {
    let env = Env::new(As::Rootless);
    let (port, seen) = counting_server();
    let other = http_server();
    let script = format!(
        r#"
import socket
def send(request):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    s.sendall(request)
    print(s.recv(200).split(b"\r\n")[0].decode())
    s.close()
send(b"GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nHost: 127.0.0.1:{other}\r\n\r\n")
send(b"GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1:{other}\r\nHost: 127.0.0.1:{port}\r\n\r\n")
send(b"GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: elsewhere.test\r\n\r\n")
send(b"GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n")
"#
    );
    let allow = format!("127.0.0.1:{port}");
    let out = env.pvisor(&["run", "-q", "--allow", &allow, "--", "python3", "-c", &script]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "every request was answered: {stdout}");
    for refused in &lines[..3] {
        assert!(refused.starts_with("HTTP/1.1 400"), "{stdout}");
    }
    assert!(lines[3].starts_with("HTTP/1.1 200"), "the control request went through: {stdout}");
    assert_eq!(
        seen.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "only the control request reached the server"
    );
}

/// Connects to the host loopback port `argv[1]` with raw sockets, as a
/// client that ignores the proxy variables would: `argv[2]` requests to
/// 127.0.0.1, one each to `localhost` and ::1 if `argv[3]` says so, then
/// tries the ports that must stay closed (`argv[4:]` as HOST:PORT) and says
/// it tried.
const RAW_CLIENT: &str = r#"
import socket, sys
port, trials, names = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")
def get(host):
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(b"GET / HTTP/1.0\r\n\r\n")
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    s.close()
    return data.endswith(b"hello from %d" % port)
ok = sum(get("127.0.0.1") for _ in range(trials))
print("RAW-OK", ok)
for name in filter(None, names):
    print("NAME-OK" if get(name) else "NAME-BAD", name)
for target in sys.argv[4:]:
    host, _, p = target.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(p)), timeout=3).close()
        print("ESCAPE", target)
    except OSError as e:
        print("REFUSED", target, e.errno)
print("PROBED")
"#;

/// Raw TCP (Python sockets, `curl --noproxy '*'`) to an allowed host
/// loopback port goes through pvisor's forward inside the sandbox's
/// network namespace: 20 connections in one run all reach the server, and
/// each is counted as connected; another host loopback port, and the same
/// port on ::1 (only 127.0.0.1 was allowed), are refused, and that other
/// port's server saw no connection at all.
fn an_allowed_loopback_port_is_forwarded_for_raw_tcp(who: As) {
    who.require();
    let env = Env::new(who);
    let (a, seen_a) = counting_server();
    let (b, seen_b) = counting_server();
    env.write("raw.py", RAW_CLIENT);
    let trials = 20;
    let script = format!(
        r#"python3 raw.py {a} {trials} "" 127.0.0.1:{b} "[::1]:{a}" "[::1]:{b}"
        curl -s -m 5 --noproxy '*' http://127.0.0.1:{a}/; echo " noproxy"
        curl -s -m 5 http://127.0.0.1:{a}/; echo " proxied"
        curl -s -m 3 -f --noproxy '*' http://127.0.0.1:{b}/ || echo REFUSED-B-CURL
        echo CURL-PROBED"#
    );
    let allow = format!("127.0.0.1:{a}");
    let out = env.pvisor(&["run", "--allow", &allow, "--", "sh", "-c", &script]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        stdout.contains("PROBED") && stdout.contains("CURL-PROBED"),
        "the probes ran: {stdout}\n{stderr}"
    );
    assert!(stdout.contains(&format!("RAW-OK {trials}\n")), "{stdout}\n{stderr}");
    assert!(stdout.contains(&format!("hello from {a} noproxy")), "{stdout}\n{stderr}");
    assert!(stdout.contains(&format!("hello from {a} proxied")), "{stdout}\n{stderr}");
    assert!(!stdout.contains("ESCAPE"), "{stdout}");
    for refused in
        [format!("REFUSED 127.0.0.1:{b} 111"), format!("REFUSED [::1]:{a} 111"), "REFUSED-B-CURL".into()]
    {
        assert!(stdout.contains(&refused), "{refused}: {stdout}");
    }
    use std::sync::atomic::Ordering;
    assert_eq!(seen_a.load(Ordering::SeqCst), trials + 2, "every connection reached the allowed port");
    assert_eq!(seen_b.load(Ordering::SeqCst), 0, "the other port's server saw a connection");
    // Each forwarded connection is an event (the first 16 in full, the rest
    // counted) and in the summary; the proxied request is one more.
    let events = network_events(&env);
    let tcp = events.iter().filter(|e| e["data"]["method"] == "TCP" && e["data"]["outcome"] == "connected");
    assert_eq!(tcp.count(), 16, "{events:?}");
    let connected = trials + 2;
    assert!(
        stderr.contains(&format!(
            "network: {connected} request(s) allowed and connected, 0 allowed but failed"
        )),
        "{stderr}"
    );
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn an_allowed_loopback_port_is_forwarded_for_raw_tcp_root() {
    an_allowed_loopback_port_is_forwarded_for_raw_tcp(As::Root);
}

#[test]
fn an_allowed_loopback_port_is_forwarded_for_raw_tcp_rootless() {
    an_allowed_loopback_port_is_forwarded_for_raw_tcp(As::Rootless);
}

/// `--allow localhost:A` forwards both 127.0.0.1:A and [::1]:A, each to the
/// host's `localhost` (a server on 127.0.0.1 alone is still reached from
/// ::1); NO_PROXY keeps 127.0.0.1 and ::1 direct, which the forward serves.
#[test]
fn a_localhost_rule_forwards_both_loopback_addresses() {
    let env = Env::new(As::Rootless);
    let (a, seen) = counting_server();
    let (b, seen_b) = counting_server();
    env.write("raw.py", RAW_CLIENT);
    let script = format!(
        r#"python3 raw.py {a} 3 localhost,::1 "[::1]:{b}" 127.0.0.1:{b}
        curl -s -m 5 http://localhost:{a}/; echo " proxied"
        curl -s -m 5 http://127.0.0.1:{a}/; echo " direct""#
    );
    let allow = format!("localhost:{a}");
    let out = env.pvisor(&["run", "-q", "--allow", &allow, "--", "sh", "-c", &script]);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("PROBED"), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("RAW-OK 3\n")
            && stdout.contains("NAME-OK localhost")
            && stdout.contains("NAME-OK ::1"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("hello from {a} proxied"))
            && stdout.contains(&format!("hello from {a} direct")),
        "{stdout}"
    );
    assert!(!stdout.contains("ESCAPE"), "{stdout}");
    use std::sync::atomic::Ordering;
    assert_eq!(seen.load(Ordering::SeqCst), 7);
    assert_eq!(seen_b.load(Ordering::SeqCst), 0);
}

/// A request the policy allows but that cannot be resolved, or whose port
/// nothing listens on, reached nothing: it is a `network.failed` event with
/// the reason (never `network.allowed`), and the summary counts it as
/// failed; no public name is suggested when the host's loopback was missed.
#[test]
fn an_allowed_request_that_reaches_nothing_is_recorded_as_failed() {
    let env = Env::new(As::Rootless);
    // A host port nothing listens on.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let script = format!(
        "curl -s -m 5 http://nowhere.invalid/; curl -s -m 5 --noproxy '*' http://127.0.0.1:{closed}/; \
         curl -s -m 5 http://api.example.com/ >/dev/null; echo done"
    );
    let allow = format!("127.0.0.1:{closed}");
    let out =
        env.pvisor(&["run", "--allow", "nowhere.invalid", "--allow", &allow, "--", "sh", "-c", &script]);
    let stderr = text(&out.stderr);
    assert!(text(&out.stdout).contains("done"), "{stderr}");
    let events = network_events(&env);
    let failed: Vec<&serde_json::Value> = events.iter().filter(|e| e["type"] == "network.failed").collect();
    assert!(
        failed.iter().any(|e| e["data"]["host"] == "nowhere.invalid"
            && e["data"]["outcome"] == "failed"
            && e["data"]["reason"].as_str().unwrap().starts_with("cannot resolve")),
        "{events:?}"
    );
    assert!(
        failed.iter().any(|e| e["data"]["port"] == closed
            && e["data"]["method"] == "TCP"
            && e["data"]["reason"].as_str().unwrap().starts_with("cannot connect")),
        "{events:?}"
    );
    assert!(!events.iter().any(|e| e["type"] == "network.allowed"), "nothing was reached: {events:?}");
    assert!(
        stderr.contains("network: 0 request(s) allowed and connected, 2 allowed but failed, 1 denied"),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("127.0.0.1:{closed} ×1")), "{stderr}");
    assert!(
        !stderr.contains("--allow api.example.com"),
        "a public API was suggested for a missed loopback: {stderr}"
    );
}
