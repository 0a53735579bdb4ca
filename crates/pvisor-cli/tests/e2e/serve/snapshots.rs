//! Snapshots through the API, as the reference server's Docker runtime
//! makes them (server/opensandbox_server/services/snapshot_service.py,
//! snapshot_restore.py, docker/snapshot_runtime.py): a point-in-time copy
//! of the sandbox's filesystem, `Creating` then `Ready`, that outlives its
//! sandbox and boots new ones with `snapshotId` (entrypoint defaulting to
//! `tail -f /dev/null`); a snapshot still being created, or used by a
//! live sandbox, cannot be deleted.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{stdout_of, Daemon};
use crate::support::*;

impl Daemon {
    /// Waits until snapshot `id` leaves `Creating`; returns it.
    fn wait_snapshot(&self, id: &str) -> Value {
        let start = Instant::now();
        loop {
            let (code, snapshot) = self.curl("GET", &format!("/v1/snapshots/{id}"), None);
            assert_eq!(code, 200, "{snapshot}");
            if snapshot["status"]["state"] != "Creating" {
                return snapshot;
            }
            assert!(start.elapsed() < Duration::from_secs(300), "{id} is still Creating\n{}", self.log());
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[test]
fn a_snapshot_outlives_its_sandbox_and_boots_new_ones_at_that_moment() {
    let daemon = Daemon::new();
    let source = daemon.create(json!({}));
    daemon.wait_state(&source, "Running", &["Pending"]);
    let setup = daemon.run(
        &source,
        "echo before > /root/note.txt && mkdir -p /srv/app && echo kept > /srv/app/data && \
         rm /etc/xattr.conf && echo scratch > /tmp/scratch && echo shm > /dev/shm/x && echo ok",
    );
    assert_eq!(stdout_of(&setup).trim(), "ok", "{setup}");

    // Bad requests: 400 naming the field, 404 for a missing sandbox.
    let path = format!("/v1/sandboxes/{source}/snapshots");
    for (body, says) in [(json!({ "name": "" }), "name"), (json!({ "label": "x" }), "unknown field")] {
        let (code, answer) = daemon.curl("POST", &path, Some(body.clone()));
        assert_eq!(code, 400, "{body}: {answer}");
        assert!(answer["message"].as_str().unwrap_or("").contains(says), "{body}: {answer}");
    }
    let (code, _) = daemon.curl("POST", "/v1/sandboxes/sb-nosuch/snapshots", Some(json!({})));
    assert_eq!(code, 404);

    // Accepted in Creating; Ready once the filesystem is out of the guest.
    let (code, created) = daemon.curl("POST", &path, Some(json!({ "name": "before-change" })));
    assert_eq!(code, 202, "{created}");
    assert_eq!(created["status"]["state"], "Creating", "{created}");
    assert_eq!(
        (created["sandboxId"].as_str(), created["name"].as_str()),
        (Some(source.as_str()), Some("before-change"))
    );
    let snapshot = created["id"].as_str().unwrap().to_owned();
    // Being created: it cannot be deleted (the capture under TCG takes
    // seconds; this request, milliseconds).
    let (code, answer) = daemon.curl("DELETE", &format!("/v1/snapshots/{snapshot}"), None);
    assert_eq!((code, answer["code"].as_str()), (409, Some("SNAPSHOT::INVALID_STATE")), "{answer}");
    let ready = daemon.wait_snapshot(&snapshot);
    assert_eq!(ready["status"]["state"], "Ready", "{ready}\n{}", daemon.log());

    // Three at once: two captures run, the third waits its turn in
    // Creating, and all end Ready (deleted again to keep the store small).
    let burst: Vec<String> = (0..3)
        .map(|_| {
            let (code, queued) = daemon.curl("POST", &path, Some(json!({})));
            assert_eq!((code, queued["status"]["state"].as_str()), (202, Some("Creating")), "{queued}");
            queued["id"].as_str().unwrap().to_owned()
        })
        .collect();
    for id in &burst {
        let ready = daemon.wait_snapshot(id);
        assert_eq!(ready["status"]["state"], "Ready", "{ready}\n{}", daemon.log());
        let (code, _) = daemon.curl("DELETE", &format!("/v1/snapshots/{id}"), None);
        assert_eq!(code, 204);
    }

    // The source goes on and changes; then it is deleted: the snapshot stays.
    let after = daemon.run(&source, "echo after > /root/note.txt && echo ok");
    assert_eq!(stdout_of(&after).trim(), "ok", "{after}");
    let (code, _) = daemon.curl("DELETE", &format!("/v1/sandboxes/{source}"), None);
    assert_eq!(code, 204);

    // Listing, by source and by state (ignoring case, ORed).
    let (code, listed) =
        daemon.curl("GET", &format!("/v1/snapshots?sandboxId={source}&state=ready&state=Failed"), None);
    assert_eq!(code, 200, "{listed}");
    assert_eq!(listed["items"].as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed["pagination"]["totalItems"], 1, "{listed}");
    let (_, none) = daemon.curl("GET", "/v1/snapshots?sandboxId=sb-other", None);
    assert_eq!(none["items"], json!([]), "{none}");

    // Exactly one startup source; an unknown snapshot is 404.
    let both = json!({ "image": { "uri": "default" }, "snapshotId": snapshot, "entrypoint": ["true"] });
    let (code, answer) = daemon.curl("POST", "/v1/sandboxes", Some(both));
    assert_eq!(code, 400, "{answer}");
    assert!(answer["message"].as_str().unwrap_or("").contains("Exactly one"), "{answer}");
    let (code, answer) = daemon.curl("POST", "/v1/sandboxes", Some(json!({ "snapshotId": "nosuch" })));
    assert_eq!((code, answer["code"].as_str()), (404, Some("SNAPSHOT::NOT_FOUND")), "{answer}");

    // Restored: the files of that moment, not the later change; /tmp, a
    // directory of the rootfs (as in a Docker container, which `docker
    // commit` keeps); not what a mount on top held (/dev/shm); the deletion
    // kept.
    let (code, restored) =
        daemon.curl("POST", "/v1/sandboxes", Some(json!({ "snapshotId": snapshot, "timeout": 3600 })));
    assert_eq!(code, 202, "{restored}");
    assert!(restored.get("snapshotId").is_none() && restored.get("image").is_none(), "{restored}");
    assert_eq!(restored["entrypoint"], json!(["tail", "-f", "/dev/null"]), "{restored}");
    let restored = restored["id"].as_str().unwrap().to_owned();
    let shown = daemon.wait_state(&restored, "Running", &["Pending"]);
    assert_eq!(shown["snapshotId"], json!(snapshot), "{shown}");
    assert!(shown.get("image").is_none(), "{shown}");
    let look = daemon.run(
        &restored,
        "cat /root/note.txt /srv/app/data; test -e /etc/xattr.conf && echo deleted-file-back; \
         cat /tmp/scratch; test -e /dev/shm/x && echo shm-copied; echo done",
    );
    assert_eq!(stdout_of(&look).trim(), "before\nkept\nscratch\ndone", "{look}");

    // In use by a live sandbox: not deleted, not even marked; once that is
    // gone, it is.
    let before = daemon.curl("GET", &format!("/v1/snapshots/{snapshot}"), None).1;
    let (code, answer) = daemon.curl("DELETE", &format!("/v1/snapshots/{snapshot}"), None);
    assert_eq!((code, answer["code"].as_str()), (409, Some("SNAPSHOT::DELETE_CONFLICT")), "{answer}");
    let after = daemon.curl("GET", &format!("/v1/snapshots/{snapshot}"), None).1;
    assert_eq!(after, before, "a refused delete changes nothing");
    let (code, _) = daemon.curl("DELETE", &format!("/v1/sandboxes/{restored}"), None);
    assert_eq!(code, 204);
    let (code, answer) = daemon.curl("DELETE", &format!("/v1/snapshots/{snapshot}"), None);
    assert_eq!(code, 204, "{answer}");
    assert_eq!(daemon.curl("GET", &format!("/v1/snapshots/{snapshot}"), None).0, 404);
    let images = text(&daemon.env.pvisor(&["image", "ls", "--json"]).stdout);
    assert!(!images.contains(&snapshot), "the snapshot's image was left behind: {images}");

    // The source Job's Trace says a snapshot was taken.
    let job = daemon.record(&source)["job"].as_str().unwrap().to_owned();
    let events = text(&daemon.env.pvisor(&["events", &job, "--json"]).stdout);
    assert!(
        events.contains(&format!("snapshot {snapshot}")),
        "no frontend.command for the snapshot: {events}"
    );
}

/// A daemon killed while it captures: on restart the snapshot is `Failed`
/// saying why (the reference's `recover_unfinished_snapshots`), never
/// `Creating` forever, and no half-written archive is left.
#[test]
fn a_capture_interrupted_by_a_daemon_crash_fails_clearly_after_restart() {
    let mut daemon = Daemon::new();
    let source = daemon.create(json!({}));
    daemon.wait_state(&source, "Running", &["Pending"]);
    let (code, created) = daemon.curl("POST", &format!("/v1/sandboxes/{source}/snapshots"), Some(json!({})));
    assert_eq!(code, 202, "{created}");
    let snapshot = created["id"].as_str().unwrap().to_owned();
    daemon.kill9();
    daemon.start();
    let after = daemon.wait_snapshot(&snapshot);
    let state = after["status"]["state"].as_str().unwrap_or("?");
    // The kill may land after the image was published (then Ready, as the
    // reference recovers it); either way nothing is left Creating.
    assert!(matches!(state, "Failed" | "Ready"), "{after}");
    if state == "Failed" {
        assert_eq!(after["status"]["reason"], "snapshot_recovery_interrupted", "{after}");
        let images = text(&daemon.env.pvisor(&["image", "ls", "--json"]).stdout);
        assert!(!images.contains(&snapshot), "a failed snapshot has an image: {images}");
    }
    let leftovers: Vec<_> = std::fs::read_dir(daemon.env.home.join("server/snapshots"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".partial"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // A failed snapshot can be deleted; the sandbox snapshots again.
    let (code, _) = daemon.curl("DELETE", &format!("/v1/snapshots/{snapshot}"), None);
    assert_eq!(code, 204);
    let (code, again) = daemon.curl("POST", &format!("/v1/sandboxes/{source}/snapshots"), Some(json!({})));
    assert_eq!(code, 202, "{again}");
    let again = daemon.wait_snapshot(again["id"].as_str().unwrap());
    assert_eq!(again["status"]["state"], "Ready", "{again}");
}
