//! The host's own things stay out of reach: other state directories and
//! their VM control sockets, host sockets, host fifos, and sealing, which a
//! command cannot block.

use super::*;

/// Another state directory of the same user (its staged files, records and
/// the control socket of a live vm Job) is hidden from every sandbox, not
/// only the current state directory.
#[test]
fn another_state_directory_and_its_vm_control_socket_are_out_of_reach() {
    let env = Env::new(As::Rootless);
    // Outside /tmp: the sandbox's /tmp is private, which would hide it anyway.
    let other_dir = tempfile::Builder::new().prefix("pvisor-e2e-other-").tempdir_in("/var/tmp").unwrap();
    env.give_away(other_dir.path());
    let other = other_dir.path().join("state");
    let in_other = |args: &[&str]| {
        let mut cmd = env.command(args);
        cmd.env("PVISOR_HOME", &other);
        cmd
    };
    let out = in_other(&["run", "-q", "--", "sh", "-c", "echo STAGED-SECRET > secret.txt"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut vm = None;
    if vm_image().is_some() {
        vm = Some(in_other(&["run", "-q", "--executor", "vm", "--", "sleep", "120"]).spawn().unwrap());
    } else {
        eprintln!("no guest image: checking the staged files only");
    }
    let control = || -> Option<std::path::PathBuf> {
        let runs = fs::read_dir(other.join("runs")).ok()?;
        runs.flatten().map(|r| r.path().join("attempts/1/vm/control.sock")).find(|p| p.exists())
    };
    let socket = vm.as_ref().map(|_| {
        assert!(wait_until(Duration::from_secs(180), || control().is_some()), "the vm Job never started");
        control().unwrap()
    });
    let stage_glob = format!("{}/runs/*/stage/upper/secret.txt", other.display());
    let connect = socket.as_ref().map_or(String::new(), |s| {
        format!(
            "/usr/bin/python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect('{}'); print('CONNECTED-TO-CONTROL')\" 2>/dev/null;",
            s.display()
        )
    });
    let script = format!(
        "cat {stage_glob} 2>/dev/null; ls {} 2>/dev/null | grep -q runs && echo LISTED-OTHER; {connect} true",
        other.display()
    );
    // Positive control: outside a sandbox the same script does reach it all.
    let unsandboxed = text(&std::process::Command::new("sh").args(["-c", &script]).output().unwrap().stdout);
    assert!(unsandboxed.contains("STAGED-SECRET") && unsandboxed.contains("LISTED-OTHER"), "{unsandboxed}");
    if socket.is_some() {
        assert!(unsandboxed.contains("CONNECTED-TO-CONTROL"), "{unsandboxed}");
    }
    let out = env.pvisor(&["run", "-q", "--", "sh", "-c", &script]);
    let stdout = text(&out.stdout);
    if let Some(mut vm) = vm {
        let _ = in_other(&["kill", "--grace", "1s"]).output();
        let _ = vm.kill();
        let _ = vm.wait();
    }
    assert!(out.status.success(), "{}", text(&out.stderr));
    for leaked in ["STAGED-SECRET", "LISTED-OTHER", "CONNECTED-TO-CONTROL"] {
        assert!(!stdout.contains(leaked), "{leaked}: {stdout}");
    }
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    let hidden = env
        .events(&job)
        .into_iter()
        .any(|e| e["type"] == "admission.rewrite" && e["data"]["reason"] == "another pvisor state directory");
    assert!(hidden, "the other state directory is hidden and recorded");
}

/// A command cannot make its own run impossible to seal: directories and
/// files it made unreadable, and a tree deeper than PATH_MAX, are sealed
/// (the manifest records paths up to PATH_MAX and counts what lies deeper),
/// the exit code and receipt are recorded, apply and gc still work.
fn sealing_cannot_be_blocked(who: As) {
    who.require();
    let env = Env::new(who);
    let out = env
        .run_sh("mkdir -p a/b && echo x > a/b/f && echo y > secret && chmod 000 a/b/f a/b a secret; exit 3");
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    sealed_with_receipt(&env, 4);
    env.expect(&["apply", "--all"], 0);
    let mode = |rel: &str| fs::symlink_metadata(env.ws.join(rel)).unwrap().permissions().mode() & 0o7777;
    use std::os::unix::fs::PermissionsExt;
    assert_eq!((mode("a"), mode("secret")), (0, 0), "the staged modes are applied, last");

    // Deeper than PATH_MAX (220 levels of 20-character names: 4,620 bytes).
    let deep = "import os, sys\nfor _ in range(220):\n    os.mkdir('d' * 20)\n    os.chdir('d' * 20)\nopen('f', 'w').write('deep')\nsys.exit(4)\n";
    env.write("deep.py", deep);
    std::thread::sleep(Duration::from_millis(25));
    let out = env.pvisor(&["run", "--", "/usr/bin/python3", "deep.py"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    // The manifest holds the 195 levels whose paths fit in 4,096 bytes; the
    // 26 entries below are counted and said, and go with the stage.
    assert!(
        text(&out.stderr).contains("26 staged entries lie at paths longer than 4096 bytes"),
        "{}",
        text(&out.stderr)
    );
    sealed_with_receipt(&env, 195);
    // Its stage (and the unreadable one's) can be freed with pvisor alone.
    let gc = env.pvisor(&["gc", "--force", "--older-than", "0s", "--json"]);
    assert_eq!(gc.status.code(), Some(0), "{}", text(&gc.stdout));
    assert!(!text(&gc.stdout).contains("\"failed\""), "{}", text(&gc.stdout));
    for run in fs::read_dir(env.home.join("runs")).unwrap().flatten() {
        assert!(!run.path().join("stage/upper").exists(), "{} kept its stage", run.path().display());
    }
    // Make the workspace removable again for the test's own cleanup.
    for rel in ["a/b", "a", "secret"] {
        let _ = fs::set_permissions(env.ws.join(rel), fs::Permissions::from_mode(0o700));
    }
    let _ = fs::set_permissions(env.ws.join("a/b"), fs::Permissions::from_mode(0o700));
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn sealing_cannot_be_blocked_as_root() {
    sealing_cannot_be_blocked(As::Root);
}

#[test]
fn sealing_cannot_be_blocked_rootless() {
    sealing_cannot_be_blocked(As::Rootless);
}

/// A host service listening on a Unix socket in a world-writable, read-only
/// (to the sandbox) place: `connect(2)` and `sendto(2)` ignore read-only
/// mounts, so only the overlay view stops them (`ns/host_view.rs`).
const SOCKET_SERVER: &str = r#"
import os, socket, sys, time
d = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.bind(d + '/stream.sock'); s.listen(64)
g = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); g.bind(d + '/dgram.sock')
q = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); q.bind(d + '/seqpacket.sock'); q.listen(64)
for name in ('stream', 'dgram', 'seqpacket'):
    os.chmod(d + '/' + name + '.sock', 0o777)
open(d + '/ready', 'w').close()
time.sleep(120)
"#;

const SOCKET_PROBE: &str = r#"
import socket, sys
d = sys.argv[1]
for kind, name in ((socket.SOCK_STREAM, 'stream'), (socket.SOCK_SEQPACKET, 'seqpacket')):
    s = socket.socket(socket.AF_UNIX, kind)
    try:
        s.connect(d + '/' + name + '.sock'); print('ESCAPED-' + name)
    except OSError as e:
        print(name, 'refused', e.errno)
g = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
try:
    g.sendto(b'x', d + '/dgram.sock'); print('ESCAPED-dgram')
except OSError as e:
    print('dgram refused', e.errno)
"#;

fn host_sockets_are_unreachable(who: As) {
    who.require();
    let env = Env::new(who);
    // Outside the workspace and outside /tmp and /run (which the sandbox gets
    // fresh): a directory the sandbox sees read-only.
    let service = tempfile::Builder::new().prefix("pvisor-escape-").tempdir_in("/var/tmp").unwrap();
    let dir = service.path().to_owned();
    fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut server = std::process::Command::new("python3")
        .args(["-c", SOCKET_SERVER, dir.to_str().unwrap()])
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || dir.join("ready").exists()), "the server never started");
    env.write("probe.py", SOCKET_PROBE);
    let probe = |extra: &[&str]| {
        let mut args = vec!["run", "-q"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "/usr/bin/python3", "probe.py", dir.to_str().unwrap()]);
        let out = env.pvisor(&args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    // Positive control: the same probe outside a sandbox reaches all three.
    let bare = std::process::Command::new("python3")
        .args(["-c", SOCKET_PROBE, dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(text(&bare.stdout).matches("ESCAPED").count(), 3, "{}", text(&bare.stdout));

    let sandboxed = probe(&[]);
    // ECONNREFUSED: the overlay's copy of the socket has no listener (not a
    // permission error, which the exposed case below rules out).
    assert_eq!(sandboxed.matches(" refused 111").count(), 3, "{sandboxed}");
    assert!(!sandboxed.contains("ESCAPED"), "{sandboxed}");
    // --expose-socket lets exactly the named one through, and says so.
    let stream = dir.join("stream.sock");
    let exposed = probe(&["--expose-socket", stream.to_str().unwrap()]);
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    let _ = server.kill();
    let _ = server.wait();
    assert!(exposed.contains("ESCAPED-stream"), "{exposed}");
    assert!(!exposed.contains("ESCAPED-seqpacket") && !exposed.contains("ESCAPED-dgram"), "{exposed}");
    let events = env.events(&job);
    assert!(
        events.iter().any(|e| e["type"] == "admission.rewrite"
            && e["data"]["rewrite"] == "expose.socket"
            && e["data"]["path"] == stream.to_str().unwrap()),
        "the exposure is not in the Trace"
    );
    let facts = events.iter().find(|e| e["type"] == "attempt.ns").expect("attempt.ns");
    assert_eq!(facts["data"]["sockets_reachable_under"], serde_json::json!([]), "{facts}");
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn host_sockets_are_unreachable_as_root() {
    host_sockets_are_unreachable(As::Root);
}

#[test]
fn host_sockets_are_unreachable_rootless() {
    host_sockets_are_unreachable(As::Rootless);
}

#[test]
fn exposing_a_non_socket_or_pvisors_own_socket_is_refused() {
    let env = Env::new(As::Rootless);
    let file = env.dir.path().join("plain");
    fs::write(&file, "").unwrap();
    for (path, says) in [
        (file.to_str().unwrap().to_owned(), "is not a Unix socket"),
        ("/nonexistent/agent.sock".to_owned(), "no such socket"),
    ] {
        let out = env.pvisor(&["run", "--expose-socket", &path, "--", "true"]);
        assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
        assert!(text(&out.stderr).contains(says), "{}", text(&out.stderr));
    }
}

/// A fifo in a skeleton directory of the host view (here `/`) is shown as
/// an empty read-only file: opening a fifo ignores read-only mounts, so
/// binding it would give the sandbox a channel to a host process.
#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn a_host_fifo_is_not_a_channel_out() {
    use std::os::unix::fs::OpenOptionsExt;
    As::Root.require();
    let env = Env::new(As::Root);
    let fifo = format!("/pvisor-escape-fifo-{}", std::process::id());
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let reader = fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&fifo).unwrap();
    let script = format!("printf ESCAPED > {fifo} 2>/dev/null; true");
    let out = env.run_sh(&script);
    let mut got = Vec::new();
    let _ = std::io::Read::read_to_end(&mut &reader, &mut got);
    let _ = fs::remove_file(&fifo);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(got.is_empty(), "the sandbox wrote to a host fifo: {:?}", String::from_utf8_lossy(&got));
}

/// `--ro DIR` shows a host tool tree the sandbox would not see (here under
/// `/tmp`, which it gets fresh): the tool runs, the tree cannot be written,
/// a host service's sockets in it stay unreachable, and a hidden secret
/// store beneath it stays hidden.
fn read_only_tool_tree(who: As) {
    use std::os::unix::fs::PermissionsExt;
    who.require();
    let env = Env::new(who);
    let tools = tempfile::Builder::new().prefix("pvisor-ro-").tempdir_in("/tmp").unwrap();
    let dir = tools.path().to_owned();
    fs::create_dir(dir.join("bin")).unwrap();
    fs::write(dir.join("bin/tool"), "#!/bin/sh\necho TOOL-RAN\n").unwrap();
    fs::set_permissions(dir.join("bin/tool"), fs::Permissions::from_mode(0o755)).unwrap();
    for d in [&dir, &dir.join("bin")] {
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut server = std::process::Command::new("python3")
        .args(["-c", SOCKET_SERVER, dir.to_str().unwrap()])
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || dir.join("ready").exists()), "the server never started");
    env.write("probe.py", SOCKET_PROBE);
    let bare = std::process::Command::new("python3")
        .args(["-c", SOCKET_PROBE, dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(text(&bare.stdout).matches("ESCAPED").count(), 3, "{}", text(&bare.stdout));

    let tool = dir.join("bin/tool");
    let script = format!(
        "{tool}; touch {bin}/planted 2>/dev/null && echo WROTE; /usr/bin/python3 probe.py {dir}",
        tool = tool.display(),
        bin = dir.join("bin").display(),
        dir = dir.display()
    );
    // Without --ro the tree is not there: the flag is what shows it.
    let out = env.pvisor(&["run", "-q", "--", "sh", "-c", &script]);
    assert!(!text(&out.stdout).contains("TOOL-RAN"), "{}", text(&out.stdout));
    let out = env.pvisor(&["run", "-q", "--ro", dir.to_str().unwrap(), "--", "sh", "-c", &script]);
    let _ = server.kill();
    let _ = server.wait();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}\n{}", stdout, text(&out.stderr));
    assert!(stdout.contains("TOOL-RAN"), "{stdout}");
    assert!(!stdout.contains("WROTE") && !dir.join("bin/planted").exists(), "{stdout}");
    assert_eq!(stdout.matches(" refused 111").count(), 3, "{stdout}");
    assert!(!stdout.contains("ESCAPED"), "{stdout}");
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    assert!(
        env.events(&job)
            .iter()
            .any(|e| e["data"]["rewrite"] == "read.only" && e["data"]["path"] == dir.to_str().unwrap()),
        "the --ro path is not in the Trace"
    );
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn a_read_only_tool_tree_as_root() {
    read_only_tool_tree(As::Root);
}

#[test]
fn a_read_only_tool_tree_rootless() {
    read_only_tool_tree(As::Rootless);
}

/// A secret store stays hidden under a `--ro` parent, and `--ro` of a path
/// that would widen what the sandbox reaches is refused before anything runs.
#[test]
fn read_only_paths_never_widen_past_secrets_sockets_or_the_workspace() {
    let env = Env::new(As::Rootless);
    let home = env.dir.path();
    fs::create_dir(home.join(".ssh")).unwrap();
    fs::write(home.join(".ssh/id_ed25519"), "PRIVATE-KEY").unwrap();
    env.give_away(home);
    let out = env.pvisor(&[
        "run",
        "-q",
        "--ro",
        home.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &format!("cat {}/.ssh/id_ed25519; ls {}", home.display(), home.display()),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("ws"), "the probe saw nothing: {}", text(&out.stdout));
    assert!(!text(&out.stdout).contains("PRIVATE-KEY"), "{}", text(&out.stdout));

    let socket = home.join("s.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    for (path, says) in [
        (home.join(".ssh"), "is hidden"),
        (env.ws.join("probe"), "no such file"),
        (env.ws.clone(), "is in the workspace"),
        (socket, "neither a directory nor a regular file"),
        ("/".into(), "is the whole host"),
        ("/proc/self".into(), "/proc"),
    ] {
        let out = env.pvisor(&["run", "--ro", path.to_str().unwrap(), "--", "true"]);
        assert_eq!(out.status.code(), Some(125), "{path:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains(says), "{path:?}: {}", text(&out.stderr));
    }
}
