//! Volumes: a read-write bind shared live between the host and two
//! containers, and a hostile image and volume against the shim's copy.

use super::*;

/// A read-write directory bind is one directory for the host and every
/// container that mounts it, live (virtiofs), as a pod's `emptyDir` is
/// under runc: what OpenSandbox's execd injection needs (an init container
/// copies a binary into the volume, the sandbox's container runs it).
/// The guest reaches nothing of the host beyond the directory; a pause,
/// which would have to save the share's state, is refused and the
/// container runs on; nothing is left once the containers are deleted.
#[test]
#[ignore = "needs root, containerd and the vm guest image: scripts/test.sh runs it as root, with --include-ignored"]
fn a_read_write_volume_is_shared_live_between_the_host_and_two_containers() {
    require();
    let c = start(NAMESPACE);
    let volume = c.dir.path().join("volume");
    std::fs::create_dir_all(&volume).expect("mkdir");
    std::fs::write(volume.join("from-host"), "host\n").expect("write");
    // A secret beside the volume, and a symlink in it that points there.
    let secret = c.dir.path().join("secret");
    std::fs::write(&secret, "the-host-secret\n").expect("write");
    std::os::unix::fs::symlink(&secret, volume.join("to-secret")).expect("symlink");
    let mount = format!("type=bind,src={},dst=/data,options=rbind:rw", volume.display());

    // A fills the volume and waits for B; it copies a program in, as an
    // init container copies execd.
    // It also tries to make a block device in the volume (the host's loop
    // device, were it made on the host) and says how that went.
    let a = "mknod /data/blk b 7 0 2>/dev/null; [ -b /data/blk ] && echo made > /data/mknod || echo refused > /data/mknod; \
             cp /bin/busybox /data/echo && echo a > /data/from-a; \
             while [ ! -e /data/from-b ]; do sleep 0.1; done; cat /data/from-b > /data/a-saw-b; \
             while :; do sleep 1; done";
    c.ok(&["run", "-d", "--runtime", RUNTIME, "--mount", &mount, IMAGE, "share-a", "sh", "-c", a]);
    let holds =
        |name: &str, content: &str| std::fs::read_to_string(volume.join(name)).is_ok_and(|t| t == content);
    eventually("the host sees A's write", Duration::from_secs(120), || holds("from-a", "a\n"));
    assert!(holds("mknod", "refused\n"), "the guest could not make a device node in the share");
    assert!(std::fs::symlink_metadata(volume.join("blk")).is_err(), "no device node appeared on the host");

    let b = "cat /data/from-host /data/from-a; /data/echo ran-from-the-volume; \
             cat /data/to-secret 2>/dev/null || echo no-secret; cat /data/../secret 2>/dev/null || echo no-parent; \
             echo b > /data/from-b";
    let out =
        c.ctr(&["run", "--rm", "--runtime", RUNTIME, "--mount", &mount, IMAGE, "share-b", "sh", "-c", b]);
    assert!(out.status.success(), "B: {}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "host\na\nran-from-the-volume\nno-secret\nno-parent\n",
        "B sees the host's and A's files, runs A's program, and reaches nothing beyond the volume"
    );
    eventually("A saw B's write", Duration::from_secs(60), || holds("a-saw-b", "b\n"));
    assert_eq!(std::fs::read_to_string(&secret).expect("read"), "the-host-secret\n");

    // The Trace says the volume was shared, unstaged.
    let listed = pvisor(&c, &["jobs", "--json", "--label", "containerd.io/container=share-a"]);
    let job: serde_json::Value =
        serde_json::from_str(listed.lines().next().unwrap_or_default()).expect("one Job");
    let job = job["data"]["job"].as_str().expect("its id").to_owned();
    let events = pvisor(&c, &["events", "--json", &job]);
    assert!(
        events.contains(r#""rewrite":"share""#) && events.contains(&volume.display().to_string()),
        "{events}"
    );

    // QEMU cannot save a vhost-user-fs device: the pause is refused, clearly,
    // and the container runs on.
    let paused = c.ctr(&["task", "pause", "share-a"]);
    assert!(!paused.status.success(), "a sharing container cannot be paused");
    assert!(text(&paused.stderr).contains("shares host directories"), "{}", text(&paused.stderr));
    assert_eq!(c.task_status("share-a").as_deref(), Some("RUNNING"));
    let exec = c.ctr(&["task", "exec", "--exec-id", "after-pause", "share-a", "cat", "/data/from-b"]);
    assert_eq!(text(&exec.stdout), "b\n", "the VM still serves after the refused pause");

    c.ok(&["task", "kill", "-s", "KILL", "share-a"]);
    eventually("the task stops", Duration::from_secs(60), || {
        c.task_status("share-a").as_deref() == Some("STOPPED")
    });
    let _ = c.ctr(&["task", "delete", "share-a"]);
    c.ok(&["container", "rm", "share-a"]);
    eventually("every VM and file server is gone", Duration::from_secs(30), || {
        processes_naming(&c.home()).is_empty() && processes_naming(&volume).is_empty()
    });
    // The volume outlives its containers, as a pod's does until the pod goes.
    assert_eq!(std::fs::read_to_string(volume.join("from-b")).expect("read"), "b\n");
}

/// The capabilities of ctr's default spec, each dropped with `--cap-drop`.
const DEFAULT_CAPABILITIES: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// A hostile image and a hostile volume against the shim's copy, and a
/// bundle whose capability sets are empty, in one container: the image's
/// snapshot holds `/data/sub -> VICTIM` (a host directory), and a read-only
/// bind at `/data` holds `sub/authorized_keys`, `sub/keep`, a FIFO, a
/// setuid-root file and a symlink to the victim (what a guest plants
/// through a read-write share of the same directory). The create neither
/// blocks on the FIFO nor writes through either symlink; the container has
/// no capability, so `mount` and `mknod` fail in it; and its seccomp
/// profile, which denies `mkdir` with `ENOSPC`, is in force: `mkdir` fails
/// with that errno.
#[test]
#[ignore = "needs root, containerd and the vm guest image: scripts/test.sh runs it as root, with --include-ignored"]
fn a_hostile_image_and_volume_reach_no_host_file_and_empty_capability_sets_are_kept() {
    require();
    use std::os::unix::fs::{symlink, PermissionsExt};
    let c = start(NAMESPACE);
    let victim = c.dir.path().join("victim");
    std::fs::create_dir_all(&victim).expect("mkdir");
    std::fs::write(victim.join("keep"), "host\n").expect("write");
    let volume = c.dir.path().join("ro-volume");
    std::fs::create_dir_all(volume.join("sub")).expect("mkdir");
    std::fs::write(volume.join("sub/authorized_keys"), "ssh-ed25519 attacker\n").expect("write");
    std::fs::write(volume.join("sub/keep"), "overwritten\n").expect("write");
    std::fs::write(volume.join("suid"), "#!/bin/sh\n").expect("write");
    std::fs::set_permissions(volume.join("suid"), std::fs::Permissions::from_mode(0o4755)).expect("chmod");
    symlink(&victim, volume.join("link")).expect("symlink");
    let fifo = Command::new("mkfifo").arg(volume.join("fifo")).status().expect("mkfifo runs");
    assert!(fifo.success());

    let mount = format!("type=bind,src={},dst=/data,options=rbind:ro", volume.display());
    let probe = "cat /data/sub/authorized_keys; ls -l /data/suid | cut -c1-10; readlink /data/link; \
                 [ -e /data/fifo ] || echo no-fifo; grep CapEff /proc/self/status; \
                 mount -t tmpfs t /tmp 2>/dev/null && echo mounted || echo mount-refused; \
                 mknod /tmp/n c 1 3 2>/dev/null && echo mknod-made || echo mknod-refused; \
                 mkdir /tmp/denied 2>&1; [ -d /tmp/denied ] && echo made; grep '^Seccomp:' /proc/self/status";
    let profile = c.dir.path().join("seccomp.json");
    let denied = serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
        {"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO", "errnoRet": libc::ENOSPC}]});
    std::fs::write(&profile, denied.to_string()).expect("write");
    let profile = profile.display().to_string();
    let mut create = vec!["container", "create", "--runtime", RUNTIME, "--mount", &mount];
    create.extend(["--seccomp", "--seccomp-profile", &profile]);
    for cap in DEFAULT_CAPABILITIES {
        create.extend(["--cap-drop", cap]);
    }
    // `container create` reorders flags (`run` does not): `--` keeps
    // `sh -c` the container's.
    create.extend(["--", IMAGE, "hostile", "sh", "-c", probe]);
    c.ok(&create);
    // The image's symlink, planted in the container's snapshot.
    let mounts = c.ok(&["snapshots", "mounts", "/unused", "hostile"]);
    let layer = match mounts.split("upperdir=").nth(1) {
        Some(rest) => rest.split([',', ' ']).next().unwrap_or_default().to_owned(),
        None => mounts.split_whitespace().nth(3).unwrap_or_default().to_owned(),
    };
    assert!(Path::new(&layer).is_dir(), "the snapshot's writable layer: {mounts}");
    std::fs::create_dir_all(Path::new(&layer).join("data")).expect("mkdir");
    symlink(&victim, Path::new(&layer).join("data/sub")).expect("symlink");

    let started = Instant::now();
    let out = c.ctr(&["task", "start", "hostile"]);
    assert!(started.elapsed() < Duration::from_secs(120), "the create did not block on the FIFO");
    let _ = c.ctr(&["task", "delete", "hostile"]);
    let _ = c.ctr(&["container", "rm", "hostile"]);
    assert_eq!(
        text(&out.stdout).replace('\r', ""),
        format!(
            "ssh-ed25519 attacker\n-rwxr-xr-x\n{}\nno-fifo\nCapEff:\t0000000000000000\nmount-refused\nmknod-refused\n\
             mkdir: can't create directory '/tmp/denied': No space left on device\nSeccomp:\t2\n",
            victim.display()
        ),
        "the copy is in the VM, without setuid, the link a link, the FIFO skipped, no capability, the filter on: {}",
        text(&out.stderr)
    );
    let left: Vec<_> =
        std::fs::read_dir(&victim).expect("list").map(|e| e.expect("entry").file_name()).collect();
    assert_eq!(left, ["keep"], "nothing was created in the host directory");
    assert_eq!(std::fs::read_to_string(victim.join("keep")).expect("read"), "host\n", "nor overwritten");
}
