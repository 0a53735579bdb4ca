//! Records a command cannot break: a staged tree of any depth, a full
//! filesystem and a flood of events still leave the Job its exit code, a
//! valid receipt, and a stage that can be reviewed, dropped and collected.

use super::*;

/// A command builds a chain of `depth` directories (a file at the bottom,
/// a path far past PATH_MAX), says it did, and exits 7.
fn a_deep_tree_keeps_the_exit_code_and_the_stage_stays_removable(who: As, depth: usize) {
    who.require();
    // In memory where there is a tmpfs: removing 12,000 directories is
    // otherwise seconds of journal writes on a busy disk, whatever pvisor does.
    let shm = Path::new("/dev/shm");
    let env = if shm.is_dir() { Env::new_in(who, shm) } else { Env::new(who) };
    env.write(
        "deep.py",
        &format!(
            "import os, sys\nfor i in range({depth}):\n    os.mkdir('d'); os.chdir('d')\nopen('f', 'w').write('x')\nprint('BUILT', i + 1)\nsys.stdout.flush()\nos._exit(7)\n"
        ),
    );
    let out = env.pvisor(&["run", "--", "/usr/bin/python3", "deep.py"]);
    assert!(text(&out.stdout).contains(&format!("BUILT {depth}")), "the probe ran: {}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    // What lies past PATH_MAX is not in the records, and the run says so.
    assert!(text(&out.stderr).contains("longer than 4096 bytes"), "{}", text(&out.stderr));
    let status = env.status_json(None);
    let job = status["job"].as_str().unwrap().to_owned();
    assert_eq!(
        (status["state"].as_str(), status["exit_code"].as_i64(), status["receipt"].as_str()),
        (Some("failed"), Some(7), Some("valid")),
        "{status}"
    );
    env.expect(&["verify", &job], 0);
    // Review lists what fits in the records.
    let review = env.pvisor(&["review", &job]);
    assert!(review.status.success(), "{}", text(&review.stderr));
    assert!(text(&review.stdout).contains(" dir  d/d/d/d/d"), "review lists the stage");
    env.expect(&["drop", &job], 0);
    assert_eq!(
        env.status_json(Some(&job))["stage_state"].as_str(),
        Some("dropped"),
        "{}",
        env.status_json(Some(&job))
    );
    env.expect(&["gc", "--older-than", "0s"], 0);
    let stage = env.home.join("runs").join(status["run"].as_str().unwrap()).join("stage/upper");
    assert!(!stage.exists(), "gc removed the whole stage, however deep");
}

#[test]
fn a_2500_level_tree_keeps_the_exit_code_as_root() {
    a_deep_tree_keeps_the_exit_code_and_the_stage_stays_removable(As::Root, 2_500);
}

#[test]
fn a_2500_level_tree_keeps_the_exit_code_rootless() {
    a_deep_tree_keeps_the_exit_code_and_the_stage_stays_removable(As::Rootless, 2_500);
}

#[test]
fn a_12000_level_tree_keeps_the_exit_code_as_root() {
    a_deep_tree_keeps_the_exit_code_and_the_stage_stays_removable(As::Root, 12_000);
}

#[test]
fn a_12000_level_tree_keeps_the_exit_code_rootless() {
    a_deep_tree_keeps_the_exit_code_and_the_stage_stays_removable(As::Rootless, 12_000);
}

/// Sends `n` CONNECT requests for hosts off the allowlist through the run's
/// proxy, alternating between two, and prints how many were refused.
const DENIED_FLOOD: &str = r#"
import os, socket, sys
from urllib.parse import urlparse
proxy = urlparse(os.environ['http_proxy'])
refused = 0
for i in range(int(sys.argv[1])):
    host = 'flood%d.invalid' % (i % 2)
    s = socket.create_connection((proxy.hostname, proxy.port))
    s.sendall(b'CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n' % (host.encode(), host.encode()))
    if s.recv(64).split(b' ')[1:2] == [b'403']:
        refused += 1
    s.close()
print('REFUSED', refused)
"#;

fn a_flood_of_denied_requests_is_coalesced(who: As) {
    who.require();
    let env = Env::new(who);
    env.write("flood.py", DENIED_FLOOD);
    let n = 3_000;
    let out = env.pvisor(&[
        "run",
        "--allow",
        "allowed.invalid",
        "--",
        "/usr/bin/python3",
        "flood.py",
        &n.to_string(),
    ]);
    assert!(
        text(&out.stdout).contains(&format!("REFUSED {n}")),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let status = env.status_json(None);
    assert_eq!(
        (status["state"].as_str(), status["receipt"].as_str()),
        (Some("completed"), Some("valid")),
        "{status}"
    );
    let job = status["job"].as_str().unwrap().to_owned();
    env.expect(&["verify", &job], 0);
    let events = env.events(&job);
    let denied = events.iter().filter(|e| e["type"] == "network.denied").count();
    assert_eq!(denied, 2 * 16, "the first 16 per host are written in full");
    let coalesced: Vec<_> = events.iter().filter(|e| e["type"] == "trace.coalesced").collect();
    assert_eq!(coalesced.len(), 1, "one summary");
    let counted: u64 = coalesced[0]["data"]["coalesced"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["count"].as_u64().unwrap())
        .sum();
    assert_eq!(counted + denied as u64, n, "{}", coalesced[0]);
    let trace = env.home.join("runs").join(status["run"].as_str().unwrap()).join("events.jsonl");
    assert!(fs::metadata(trace).unwrap().len() < 64 * 1024, "the Trace stays small");
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn a_flood_of_denied_requests_is_coalesced_as_root() {
    a_flood_of_denied_requests_is_coalesced(As::Root);
}

#[test]
fn a_flood_of_denied_requests_is_coalesced_rootless() {
    a_flood_of_denied_requests_is_coalesced(As::Rootless);
}

/// Opens `n` connections to an allowed host loopback port nothing listens
/// on (each one forwarded, then closed by pvisor) and prints how many ended
/// without data.
const FORWARD_FLOOD: &str = r#"
import socket, sys
closed = 0
for i in range(int(sys.argv[2])):
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    if s.recv(1) == b"":
        closed += 1
    s.close()
print("CLOSED", closed)
"#;

/// A flood of connections to a forwarded loopback port that reaches nothing
/// is counted whole (the summary's failed count) but written in the Trace
/// only up to the per-host bound, like the proxy's requests.
fn a_flood_of_failed_forwarded_connections_is_coalesced(who: As) {
    who.require();
    let env = Env::new(who);
    env.write("flood.py", FORWARD_FLOOD);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let n = 1_000;
    let allow = format!("127.0.0.1:{port}");
    let out = env.pvisor(&[
        "run",
        "--allow",
        &allow,
        "--",
        "/usr/bin/python3",
        "flood.py",
        &port.to_string(),
        &n.to_string(),
    ]);
    let stderr = text(&out.stderr);
    assert!(text(&out.stdout).contains(&format!("CLOSED {n}")), "{}\n{stderr}", text(&out.stdout));
    assert!(
        stderr.contains(&format!("0 request(s) allowed and connected, {n} allowed but failed")),
        "{stderr}"
    );
    let status = env.status_json(None);
    assert_eq!(status["receipt"].as_str(), Some("valid"), "{status}");
    let events = env.events(status["job"].as_str().unwrap());
    let failed = events.iter().filter(|e| e["type"] == "network.failed").count();
    assert_eq!(failed, 16, "the first 16 to the host are written in full");
    assert!(!events.iter().any(|e| e["type"] == "network.allowed"), "nothing was reached");
    let coalesced = events.iter().find(|e| e["type"] == "trace.coalesced").expect("one summary");
    assert_eq!(coalesced["data"]["coalesced"][0]["count"].as_u64(), Some(n - 16), "{coalesced}");
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn a_flood_of_failed_forwarded_connections_is_coalesced_as_root() {
    a_flood_of_failed_forwarded_connections_is_coalesced(As::Root);
}

#[test]
fn a_flood_of_failed_forwarded_connections_is_coalesced_rootless() {
    a_flood_of_failed_forwarded_connections_is_coalesced(As::Rootless);
}

/// A command that uses up the state directory's inodes (its files land in
/// the stage there) gets ENOSPC inside; its Job still records exit 7 with a
/// valid receipt, the reserve's inodes having made room for the records.
#[test]
fn running_the_state_directory_out_of_inodes_keeps_the_exit_code() {
    let env = Env::new(As::Rootless);
    fs::create_dir(&env.home).unwrap();
    env.give_away(&env.home);
    env.write(
        "inodes.py",
        "import os, sys\nn = 0\ntry:\n    while True:\n        open('f%d' % n, 'w').close(); n += 1\nexcept OSError as e:\n    print('FULL', e.errno, n)\nsys.stdout.flush()\nos._exit(7)\n",
    );
    let inner = format!(
        "mount -t tmpfs -o size=64m,nr_inodes=600 tmpfs {home} && cd {ws} && {bin} run -- /usr/bin/python3 inodes.py; echo RUN=$?; {bin} status --json",
        home = env.home.display(),
        ws = env.ws.display(),
        bin = bin()
    );
    let out = unshare_as_test_user()
        .args(["-Urm", "sh", "-c", &inner])
        .env("PVISOR_HOME", &env.home)
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!("FULL {}", libc::ENOSPC)),
        "the probe filled the inodes: {stdout}\n{}",
        text(&out.stderr)
    );
    assert!(stdout.contains("RUN=7"), "{stdout}\n{}", text(&out.stderr));
    let json: String = stdout.lines().filter(|l| l.starts_with('{')).collect::<Vec<_>>().join("\n");
    let status = records_of(&json, "status").remove(0);
    assert_eq!(
        (status["state"].as_str(), status["exit_code"].as_i64(), status["receipt"].as_str()),
        (Some("failed"), Some(7), Some("valid")),
        "{status}"
    );
}
