//! A create's `volumes` (upstream's volume e2e tests, `test_01b` to
//! `test_01e` of tests/python/tests/test_sandbox_e2e.py: a marker the host
//! put there is read, a write from the sandbox reaches the host, a
//! read-only mount refuses `touch`) through the real daemon and VM, plus
//! what upstream's Docker bind cannot show: a guest that remounts its
//! read-only volume writable still writes nothing on the host, and a path
//! outside the allowed roots, through `..` or through a symlink is refused.

use std::fs;

use serde_json::json;

use super::*;

#[test]
fn volumes_are_shared_live_and_read_only_ones_stay_unwritten() {
    let env = Env::new(As::Root);
    let roots = env.dir.path().join("volumes");
    let host = roots.join("host-data");
    fs::create_dir_all(&host).unwrap();
    fs::write(host.join("marker.txt"), "opensandbox-e2e-marker\n").unwrap();
    let named = env.dir.path().join("named");
    fs::create_dir_all(named.join("seeded")).unwrap();
    fs::write(named.join("seeded/marker.txt"), "pvc-marker-data\n").unwrap();
    fs::create_dir_all(env.dir.path().join("outside")).unwrap();
    std::os::unix::fs::symlink(env.dir.path().join("outside"), roots.join("link")).unwrap();
    let args = ["--volume-root", &roots.to_string_lossy(), "--volume-dir", &named.to_string_lossy()];
    let args: Vec<&str> = args.iter().map(|a| a.as_ref()).collect();
    let daemon = Daemon::on_env(env, &args);

    let volume = |name: &str, backend: serde_json::Value, mount: &str, ro: bool| {
        let mut v = json!({ "name": name, "mountPath": mount, "readOnly": ro });
        v.as_object_mut().unwrap().extend(backend.as_object().unwrap().clone());
        v
    };
    let host_backend = json!({ "host": { "path": host } });
    let id = daemon.create(json!({ "volumes": [
        volume("rw", host_backend.clone(), "/mnt/host-data", false),
        volume("ro", host_backend, "/mnt/host-data-ro", true),
        volume("pvc", json!({ "pvc": { "claimName": "seeded" } }), "/mnt/pvc-data", false),
        volume("fresh", json!({ "pvc": { "claimName": "fresh" } }), "/mnt/fresh", false),
    ]}));
    daemon.wait_state(&id, "Running", &["Pending"]);

    let out = stdout_of(
        &daemon
            .run(&id, "cat /mnt/host-data/marker.txt /mnt/pvc-data/marker.txt /mnt/host-data-ro/marker.txt"),
    );
    let lines: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines, ["opensandbox-e2e-marker", "pvc-marker-data", "opensandbox-e2e-marker"], "{out}");
    daemon.run(&id, "echo written-from-sandbox > /mnt/host-data/out.txt; echo fresh > /mnt/fresh/f");
    assert_eq!(fs::read_to_string(host.join("out.txt")).unwrap(), "written-from-sandbox\n");
    assert_eq!(
        fs::read_to_string(named.join("fresh/f")).unwrap(),
        "fresh\n",
        "a named volume made on first use"
    );

    // Read-only: refused in the guest, and still refused on the host once
    // the guest (root in its VM) remounts its mount writable.
    let probe = "touch /mnt/host-data-ro/should-fail.txt; echo touch=$?; \
                 busybox mount -o remount,rw /mnt/host-data-ro; echo remount=$?; \
                 echo x > /mnt/host-data-ro/after-remount; echo write=$?";
    let out = stdout_of(&daemon.run(&id, probe));
    assert!(out.contains("remount=") && out.contains("write="), "the probe ran: {out}");
    assert!(!out.contains("touch=0") && !out.contains("write=0"), "{out}");
    assert!(!host.join("should-fail.txt").exists() && !host.join("after-remount").exists());

    // `/metrics/watch`: a JSON line each second (the reference execd's
    // WatchMetrics), while the client stays.
    // Read until two samples came (a slow guest's reads stretch the
    // second past any short fixed time), then the client leaves.
    let (base, token) = daemon.execd(&id);
    let mut watch = std::process::Command::new("curl")
        .args(["-sN", "--max-time", "60", "-H", &token])
        .arg(format!("{base}/metrics/watch"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = std::io::BufRead::lines(std::io::BufReader::new(watch.stdout.take().unwrap()));
    let mut seen = Vec::new();
    let mut samples: Vec<serde_json::Value> = Vec::new();
    for line in lines.map_while(Result::ok) {
        samples.extend(serde_json::from_str(&line).ok());
        seen.push(line);
        if samples.len() >= 2 {
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(samples.len() >= 2, "{}", seen.join("\n"));
    assert!(samples
        .iter()
        .all(|m| m["cpu_count"].as_f64() >= Some(1.0) && m["mem_total_mib"].as_f64() > Some(0.0)));

    // What ran through execd is in the sandbox Job's Trace: each command's
    // text, exit status and duration (recorded off the request's path).
    daemon.run(&id, "exit 7");
    let job = daemon.record(&id)["job"].as_str().unwrap().to_owned();
    let noted = |want: &str| {
        let events = text(&daemon.env.pvisor(&["events", &job, "--json"]).stdout);
        events.lines().any(|l| l.contains("frontend.command") && l.contains(want))
    };
    assert!(
        wait_until(Duration::from_secs(10), || noted("\"exit_code\":7")),
        "no frontend.command for exit 7"
    );
    assert!(noted("written-from-sandbox"), "the write is in the Trace too");

    // So are the files changed through execd, and runs in a bash session
    // and a code context, each with how it ended.
    let local = daemon.env.dir.path().join("up.txt");
    std::fs::write(&local, "uploaded\n").unwrap();
    let call = |args: &[&str]| {
        let out = std::process::Command::new("curl").args(["-s", "-H", &token]).args(args).output().unwrap();
        text(&out.stdout)
    };
    let json = ["-H", "content-type: application/json", "--data-binary"];
    call(&[
        "--form-string",
        r#"metadata={"path":"/root/up.txt"}"#,
        "-F",
        &format!("file=@{}", local.display()),
        &format!("{base}/files/upload"),
    ]);
    call(&[
        json[0],
        json[1],
        json[2],
        r#"[{"src":"/root/up.txt","dest":"/root/moved.txt"}]"#,
        &format!("{base}/files/mv"),
    ]);
    let session: serde_json::Value =
        serde_json::from_str(&call(&[json[0], json[1], json[2], "{}", &format!("{base}/session")])).unwrap();
    let session = session["session_id"].as_str().expect("a session id").to_owned();
    call(&[json[0], json[1], json[2], r#"{"command":"(exit 3)"}"#, &format!("{base}/session/{session}/run")]);
    call(&[
        json[0],
        json[1],
        json[2],
        r#"{"context":{"language":"bash"},"code":"echo from-code"}"#,
        &format!("{base}/code"),
    ]);
    let session_run = format!("session {session}: (exit 3)");
    for want in [
        ["upload /root/up.txt (9 bytes)", "\"exit_code\":0"],
        ["mv /root/up.txt /root/moved.txt", "\"exit_code\":0"],
        [session_run.as_str(), "\"exit_code\":3"],
        ["code bash ", "\"exit_code\":0"],
    ] {
        let seen = || {
            let events = text(&daemon.env.pvisor(&["events", &job, "--json"]).stdout);
            events.lines().any(|l| l.contains("frontend.command") && want.iter().all(|w| l.contains(w)))
        };
        assert!(wait_until(Duration::from_secs(10), seen), "no frontend.command with {want:?}");
    }

    // A live share cannot be saved with the VM.
    let (code, body) = daemon.curl("POST", &format!("/v1/sandboxes/{id}/pause"), None);
    assert_eq!(code, 409, "{body}");

    // Paths that would leave the allowed directories, and bad volumes.
    let outside = daemon.env.dir.path().join("outside");
    for (backend, sub, says) in [
        (json!({ "host": { "path": outside } }), None, "outside the directories"),
        (json!({ "host": { "path": format!("{}/../outside", roots.display()) } }), None, "'..'"),
        (json!({ "host": { "path": roots.join("link") } }), None, "symlink"),
        (json!({ "host": { "path": host } }), Some("../../outside"), "'..'"),
        (json!({ "pvc": { "claimName": "absent", "createIfNotExists": false } }), None, "does not exist"),
        (json!({ "ossfs": { "bucket": "b" } }), None, "ossfs"),
    ] {
        let mut v = volume("bad", backend, "/mnt/bad", false);
        if let Some(sub) = sub {
            v["subPath"] = json!(sub);
        }
        let body = json!({ "image": { "uri": "default" }, "timeout": 3600, "volumes": [v] });
        let (code, answer) = daemon.curl("POST", "/v1/sandboxes", Some(body));
        assert_eq!(code, 400, "{answer}");
        assert!(answer["message"].as_str().unwrap_or("").contains(says), "{says}: {answer}");
    }

    let (code, _) = daemon.curl("DELETE", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(code, 204);
    daemon.wait_record(&id, "Terminated");
    assert!(
        host.join("marker.txt").exists() && named.join("seeded/marker.txt").exists(),
        "volumes outlive it"
    );
}
