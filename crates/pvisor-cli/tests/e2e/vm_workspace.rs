//! The vm executor's workspace disks across Jobs: the cached base image and
//! the per-start delta. What the guest sees must be exactly the host
//! workspace of that moment, whatever changed since the base was built;
//! concurrent starts share one base; `gc` removes a cache whose workspace
//! is gone.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::process::Stdio;
use std::time::Duration;

use crate::support::*;
use crate::vm::require_image;

/// Lists the tree in the current directory: per path its raw mode, owner,
/// mtime, and a file's size and SHA-256 or a symlink's target. The same
/// script runs on the host (coreutils) and in the guest (busybox).
const LISTING: &str = r#"export LC_ALL=C; find . | sort | while IFS= read -r f; do
  line=$(stat -c '%n %f %u %g %Y' "$f")
  if [ -L "$f" ]; then line="$line -> $(readlink "$f")"
  elif [ -f "$f" ]; then line="$line $(stat -c %s "$f") $(sha256sum < "$f" | cut -d' ' -f1)"
  fi
  echo "$line"
done"#;

/// Entries stamped within this long before a base build count as changed
/// against it (the racy-clean margin, plus a tick).
const RACY: Duration = Duration::from_millis(2_200);

fn host_listing(env: &Env) -> String {
    let out = std::process::Command::new("sh").args(["-c", LISTING]).current_dir(&env.ws).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

/// Runs the listing in a vm Job; returns it and the Job's workspace-disk facts.
fn guest_listing(env: &Env) -> (String, serde_json::Value) {
    let out = env.pvisor(&["run", "-q", "--executor", "vm", "--", "sh", "-c", LISTING]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    (text(&out.stdout), disk_facts(env, &job))
}

fn disk_facts(env: &Env, job: &str) -> serde_json::Value {
    let events = env.events(job);
    let vm = events.iter().find(|e| e["type"] == "attempt.vm").unwrap_or_else(|| panic!("{events:?}"));
    vm["data"]["workspace_disks"].clone()
}

fn guest_sees_the_host_workspace_exactly_after_changes(who: As) {
    who.require();
    require_image();
    let env = Env::new(who);
    // Ballast, so the changes below stay a small delta over the base.
    env.write("ballast", &"b".repeat(256 << 10));
    for (path, text) in [
        ("src/main.c", "int main() { return 0; }\n"),
        ("same-size", "AAAA"),
        ("old.txt", "old\n"),
        ("gone/a", "a"),
        ("gone/deep/b", "b"),
        ("f2d", "file, then a directory"),
        ("d2f/x", "x"),
        ("d2f/sub/y", "y"),
        ("script.sh", "#!/bin/sh\n"),
        ("keep/k", "k"),
    ] {
        env.write(path, text);
    }
    fs::set_permissions(env.ws.join("script.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    symlink("src/main.c", env.ws.join("link")).unwrap();
    env.give_away(&env.ws);
    std::thread::sleep(RACY);
    let (first, facts) = guest_listing(&env);
    assert_eq!(first, host_listing(&env), "the first start's view ({facts})");
    assert!(facts["rebuilt"].is_string(), "the first start builds the base: {facts}");

    // Everything a workspace goes through between two Jobs. (Nothing else
    // is touched: even a chown to the same owner moves a ctime, and then the
    // entry honestly counts as changed.)
    let ws = &env.ws;
    let write = |rel: &str, text: &str| {
        let path = ws.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    };
    write("src/main.c", "int main() { return 1; }\n// edited\n");
    // Same size, mtime put back: only the ctime shows the change.
    let before = fs::metadata(ws.join("same-size")).unwrap();
    write("same-size", "BBBB");
    let mtime = rustix::fs::Timespec {
        tv_sec: std::os::unix::fs::MetadataExt::mtime(&before),
        tv_nsec: std::os::unix::fs::MetadataExt::mtime_nsec(&before),
    };
    let times = rustix::fs::Timestamps { last_access: mtime, last_modification: mtime };
    rustix::fs::utimensat(rustix::fs::CWD, ws.join("same-size"), &times, rustix::fs::AtFlags::empty())
        .unwrap();
    fs::remove_file(ws.join("old.txt")).unwrap();
    fs::remove_dir_all(ws.join("gone")).unwrap();
    fs::remove_file(ws.join("f2d")).unwrap();
    write("f2d/inner", "now inside a directory\n");
    fs::remove_dir_all(ws.join("d2f")).unwrap();
    write("d2f", "now a file\n");
    fs::set_permissions(ws.join("script.sh"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(ws.join("keep"), fs::Permissions::from_mode(0o750)).unwrap();
    fs::remove_file(ws.join("link")).unwrap();
    symlink("f2d/inner", ws.join("link")).unwrap();
    write("new/dir/file", "added\n");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        ws.join("new/pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o640),
        0,
    )
    .unwrap();
    // The new entries go to the test's user; as root, some to owners a
    // rootless host could not give its staging copy.
    for rel in ["f2d", "f2d/inner", "d2f", "link", "new", "new/dir", "new/dir/file", "new/pipe"] {
        if who == As::Rootless && is_root() {
            std::os::unix::fs::lchown(ws.join(rel), Some(UNPRIVILEGED), Some(UNPRIVILEGED)).unwrap();
        }
    }
    if who == As::Root {
        std::os::unix::fs::lchown(ws.join("new/dir/file"), Some(1234), Some(5678)).unwrap();
        std::os::unix::fs::lchown(ws.join("new/dir"), Some(4321), Some(8765)).unwrap();
    }

    let (second, facts) = guest_listing(&env);
    let host = host_listing(&env);
    assert_eq!(second, host, "the guest's view after the changes ({facts})");
    assert!(second.contains("./same-size") && host.contains("./f2d/inner"), "{second}");
    // The delta carried it, not a rebuild: otherwise this tested nothing new.
    assert!(facts["rebuilt"].is_null(), "{facts}");
    assert!(facts["delta_entries"].as_u64().unwrap() >= 10, "{facts}");
    assert!(facts["deleted"].as_u64().unwrap() >= 8, "{facts}");

    // Nothing changed since: the same view, from the same base.
    let (third, unchanged) = guest_listing(&env);
    assert_eq!(third, host);
    assert_eq!(unchanged["base"], facts["base"], "{unchanged}");
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn the_guest_sees_the_host_workspace_exactly_after_changes_as_root() {
    guest_sees_the_host_workspace_exactly_after_changes(As::Root);
}

#[test]
fn the_guest_sees_the_host_workspace_exactly_after_changes_rootless() {
    guest_sees_the_host_workspace_exactly_after_changes(As::Rootless);
}

#[test]
fn two_vm_jobs_started_at_once_share_one_base_and_gc_removes_it_with_the_workspace() {
    require_image();
    let env = Env::new(As::Rootless);
    for i in 0..50 {
        env.write(&format!("d{}/f{i}", i % 5), &format!("file {i}\n"));
    }
    std::thread::sleep(RACY);
    let script = "cat d1/f6; ls d3 | wc -l";
    let runs: Vec<_> = (0..2)
        .map(|_| {
            env.command(&["run", "-q", "--executor", "vm", "--", "sh", "-c", script])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for run in runs {
        let out = run.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout).split_whitespace().collect::<Vec<_>>(), ["file", "6", "10"]);
    }
    let mut jobs: Vec<String> = fs::read_dir(env.home.join("jobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    jobs.sort();
    assert_eq!(jobs.len(), 2);
    let facts: Vec<serde_json::Value> = jobs.iter().map(|j| disk_facts(&env, j)).collect();
    assert_eq!(facts[0]["base"], facts[1]["base"], "{facts:?}");
    assert_eq!(facts.iter().filter(|f| f["rebuilt"].is_string()).count(), 1, "one build: {facts:?}");

    // The cache outlives the Jobs until its workspace is gone.
    let lowers = env.home.join("vm-lowers");
    let caches = || fs::read_dir(&lowers).unwrap().count();
    env.expect(&["gc"], 0);
    assert_eq!(caches(), 1, "a recently used cache of an existing workspace stays");
    fs::remove_dir_all(&env.ws).unwrap();
    let out = env.command(&["gc", "--json"]).current_dir(env.dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("vm lower cache of"), "{}", text(&out.stdout));
    assert_eq!(caches(), 0, "{}", text(&out.stdout));
}
