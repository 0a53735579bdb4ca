//! `pvisor run --executor vm --image NAME`: the command runs in an imported
//! root filesystem (the python image `scripts/sandbox-image.sh` builds from
//! Debian packages), with the workspace staged as in every vm run and the
//! image's own files read-only underneath: writes to `/usr` or `/etc` are
//! neither staged nor kept for the next run, nor reach the imported tree.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;
use crate::vm::{counts, require_image, suspended_to, Background};

/// The name the tests import the python image as: not a built-in's name,
/// so the import is the test's own, never a build found beside the binary.
const IMAGE: &str = "debian-python";

/// `scripts/sandbox-image.sh`'s python root filesystem.
fn python_rootfs() -> PathBuf {
    let target = Path::new(env!("CARGO_BIN_EXE_pvisor")).parent().unwrap().parent().unwrap();
    let rootfs = target.join("sandbox-image-python/rootfs");
    assert!(
        rootfs.join("usr/bin/python3").exists(),
        "no python sandbox image at {}: run scripts/sandbox-image.sh",
        rootfs.display()
    );
    rootfs
}

/// Imports the python image into `env`'s state directory as [`IMAGE`] (the
/// unprivileged user imports a copy it owns); returns the imported tree.
fn import_python(env: &Env) -> PathBuf {
    let source = if env.who == As::Rootless && is_root() {
        let copy = env.dir.path().join("python-rootfs");
        assert!(Command::new("cp").arg("-a").arg(python_rootfs()).arg(&copy).status().unwrap().success());
        env.give_away(&copy);
        copy
    } else {
        python_rootfs()
    };
    let out = env.expect(&["image", "import", IMAGE, source.to_str().unwrap(), "--json"], 0);
    let (_, record) = json_lines(&out).pop().unwrap();
    assert!(record["digest"].as_str().unwrap().starts_with("blake3:"), "{record}");
    let slots = fs::read_dir(env.home.join("sandbox-images")).unwrap();
    slots.flatten().map(|e| e.path().join("rootfs")).find(|r| r.is_dir()).unwrap()
}

/// A probe that proves a glibc userland ran (the loader and python3 are
/// Debian's), writes one workspace file, and writes to the image's `/usr`
/// and `/etc`, which must not outlive the run.
const PROBE: &str = "set -e; /lib64/ld-linux-x86-64.so.2 --version | head -1; \
    python3 -c 'import platform; print(\"libc\", *platform.libc_ver()); open(\"out\", \"w\").write(\"x\")'; \
    echo probe > /usr/pvisor-probe; echo probe >> /etc/os-release; echo \"cwd $(pwd)\"; \
    echo \"avx2 $(grep -c avx2 /proc/cpuinfo || true)\"";

fn a_glibc_userland_runs_with_the_workspace_staged(who: As) {
    who.require();
    require_image();
    let env = Env::new(who);
    let imported = import_python(&env);
    env.write("existing", "old\n");
    let before = snapshot(&env.ws);

    let out = env.pvisor(&["run", "--executor", "vm", "--image", IMAGE, "--", "sh", "-c", PROBE]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "stdout: {stdout}\nstderr: {}", text(&out.stderr));
    assert!(stdout.contains("GLIBC"), "the image's glibc loader ran: {stdout}");
    assert!(stdout.contains("libc glibc 2."), "python3 ran on glibc: {stdout}");
    assert!(stdout.contains(&format!("cwd {}\n", env.ws.display())), "the cwd is the workspace: {stdout}");
    assert_eq!(snapshot(&env.ws), before, "the workspace changed before apply");

    // Only the workspace file is staged: nothing of /usr or /etc.
    let staged: Vec<(String, String)> = env
        .review()
        .iter()
        .map(|c| (c["path"].as_str().unwrap().to_owned(), c["kind"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(staged, [("out".to_owned(), "added".to_owned())]);
    let status = env.status_json(None);
    assert_eq!(status["receipt"], "valid");
    let upper = env.home.join("runs").join(status["run"].as_str().unwrap()).join("stage/upper");
    let mut names: Vec<_> = fs::read_dir(&upper).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["out"], "the stage holds the workspace's write alone");

    // The records name the userland: status, the admission policy, the VM's facts, the Bundle.
    let digest = status["image"]["digest"].as_str().unwrap().to_owned();
    assert_eq!(status["image"]["name"], IMAGE);
    let job = status["job"].as_str().unwrap().to_owned();
    let events = env.events(&job);
    let policy = events.iter().find(|e| e["type"] == "admission.policy").unwrap();
    assert_eq!(policy["data"]["image"]["digest"], digest.as_str(), "{policy}");
    let placement = &events.iter().find(|e| e["type"] == "placement.decided").unwrap()["data"]["details"];
    assert_eq!(placement["userland"], format!("{IMAGE} {digest}"), "{placement}");
    // Under TCG the guest CPU is QEMU's `max`: programs built for x86-64-v3
    // (Claude Code's native binary) do not die of SIGILL.
    if placement["accelerator"] == "tcg" {
        assert!(stdout.contains("avx2 1\n"), "the emulated CPU has AVX2: {stdout}");
    }
    // A template of the workspace's and the image's disks, built on this first use.
    assert_eq!(placement["start"], "template", "{placement}");
    let vm = events.iter().find(|e| e["type"] == "attempt.vm").unwrap();
    assert_eq!(
        vm["data"]["start"]["mode"], "template-restore",
        "the Placement's plan is what happened: {vm}"
    );
    assert_eq!(vm["data"]["userland"]["digest"], digest.as_str(), "{vm}");
    let bundle = env.home.join("runs").join(status["run"].as_str().unwrap()).join("attempts/1/bundle.json");
    let bundle: serde_json::Value = serde_json::from_slice(&fs::read(bundle).unwrap()).unwrap();
    assert_eq!(bundle["observations"]["extra"]["image"], format!("{IMAGE} {digest}"));
    // That template is current: listed, not stale, kept by gc.
    let templates = records_of(&env.expect(&["image", "templates", "--json"], 0), "template");
    // (The Placement names it, "built on this first use".)
    let planned = placement["template"].as_str().unwrap();
    let current =
        |t: &&serde_json::Value| t["stale"] == false && planned.starts_with(t["id"].as_str().unwrap());
    assert!(templates.iter().any(|t| current(&t)), "{planned}: {templates:?}");
    let shown = env.expect(&["status"], 0);
    assert!(shown.contains(&format!("image      {IMAGE} ({digest})")), "{shown}");

    // The image was read-only underneath: the next run starts clean, and
    // the imported tree never saw the writes.
    let again = "test ! -e /usr/pvisor-probe && ! grep -q probe /etc/os-release && echo clean";
    let out = env.pvisor(&["run", "-q", "--executor", "vm", "--image", IMAGE, "--", "sh", "-c", again]);
    assert_eq!(text(&out.stdout), "clean\n", "stderr: {}", text(&out.stderr));
    assert!(!imported.join("usr/pvisor-probe").exists());
    assert!(!fs::read_to_string(imported.join("etc/os-release")).unwrap().contains("probe"));

    env.expect(&["apply", &job, "--all"], 0);
    assert_eq!(fs::read_to_string(env.ws.join("out")).unwrap(), "x");
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn a_glibc_userland_runs_with_the_workspace_staged_as_root() {
    a_glibc_userland_runs_with_the_workspace_staged(As::Root);
}

#[test]
fn a_glibc_userland_runs_with_the_workspace_staged_rootless() {
    a_glibc_userland_runs_with_the_workspace_staged(As::Rootless);
}

/// Writes to the image's `/usr`, then counts (`c N`, into `counter`) for
/// 12 s (long enough for a suspend or fork on a loaded host to land), then
/// shows that write and runs python3: after a restore the userland, its
/// throw-away layer included, is the one it was saved with.
const COUNTER: &str = "echo kept > /usr/pvisor-probe; i=0; while [ $i -lt 60 ]; do i=$((i+1)); \
    echo \"c $i\"; echo $i > counter; sleep 0.2; done; cat /usr/pvisor-probe; python3 -c 'print(\"py\", 1 + 1)'";

fn checkpoints_keep_the_userland(who: As) {
    who.require();
    require_image();
    let env = Env::new(who);
    import_python(&env);
    let args = ["run", "-q", "--executor", "vm", "--image", IMAGE, "--", "sh", "-c", COUNTER];
    let run = Background::start(&env, &args, None);
    run.wait_for("c 3\n");
    let job = only_job(&env);

    // Suspend: the checkpoint records the userland it holds.
    let out = env.expect(&["suspend", &job, "--json"], 0);
    let manifest = suspended_to(&out, &job);
    let (code, before, _) = run.finish();
    assert_eq!(code, Some(75), "a suspended run exits 75");
    let digest = env.status_json(Some(&job))["image"]["digest"].as_str().unwrap().to_owned();
    assert_eq!(manifest["userland"]["digest"], digest.as_str(), "{manifest}");

    // An execution fork of that checkpoint continues in its own copy of the
    // userland, never another image.
    let other = env.pvisor(&["fork", &job, "--state", "execution", "--image", "default"]);
    assert_ne!(other.status.code(), Some(0));
    assert!(
        text(&other.stderr).contains("continues in the userland its checkpoint holds"),
        "{}",
        text(&other.stderr)
    );
    let forked = env.pvisor(&["fork", &job, "--state", "execution", "-q"]);
    let child_out = text(&forked.stdout);
    assert_eq!(forked.status.code(), Some(0), "stderr: {}", text(&forked.stderr));
    assert!(counts(&child_out)[0] > 1, "the fork restarted instead of continuing: {child_out:?}");
    assert!(child_out.ends_with("kept\npy 2\n"), "{child_out:?}");

    // Resume: the counter goes on, the image is still the root.
    let resumed = env.pvisor(&["resume", &job]);
    let after = text(&resumed.stdout);
    assert_eq!(resumed.status.code(), Some(0), "stderr: {}", text(&resumed.stderr));
    assert_eq!(
        counts(&after).first(),
        Some(&(counts(&before).last().unwrap() + 1)),
        "{before:?} then {after:?}"
    );
    assert!(after.ends_with("kept\npy 2\n"), "{after:?}");

    // Both Jobs name the userland and stage the workspace's file alone.
    let jobs: Vec<String> = fs::read_dir(env.home.join("jobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    for job in &jobs {
        let status = env.status_json(Some(job));
        assert_eq!(status["image"]["digest"], digest.as_str(), "{status}");
        let out = env.expect(&["review", job, "--json"], 0);
        let staged: Vec<_> =
            records_of(&out, "change").iter().map(|c| c["path"].as_str().unwrap().to_owned()).collect();
        assert_eq!(staged, ["counter"], "{job}");
    }
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn checkpoints_keep_the_userland_as_root() {
    checkpoints_keep_the_userland(As::Root);
}

#[test]
fn checkpoints_keep_the_userland_rootless() {
    checkpoints_keep_the_userland(As::Rootless);
}

/// An image whose `/tmp` is a symlink out of itself (`/tmp -> ../../..`)
/// cannot move the workspace's mount out of the root the command sees: the
/// mount point is resolved beneath the image's root, so the command finds
/// the workspace at its own path (under `/tmp` here, which leads to the
/// root's `/`) and its write is staged.
#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn an_images_symlink_cannot_move_the_workspace_out_of_its_root() {
    require_image();
    let env = Env::new(As::Root);
    assert!(env.ws.starts_with("/tmp"), "the test needs a workspace under /tmp: {}", env.ws.display());
    let target = Path::new(env!("CARGO_BIN_EXE_pvisor")).parent().unwrap().parent().unwrap();
    let hostile = env.dir.path().join("hostile-rootfs");
    let default = target.join("sandbox-image/rootfs");
    assert!(default.join("bin/sh").exists(), "no default sandbox image: run scripts/sandbox-image.sh");
    assert!(Command::new("cp").arg("-a").arg(&default).arg(&hostile).status().unwrap().success());
    fs::remove_dir_all(hostile.join("tmp")).unwrap();
    std::os::unix::fs::symlink("../../..", hostile.join("tmp")).unwrap();
    env.expect(&["image", "import", "hostile", hostile.to_str().unwrap()], 0);
    env.write("existing", "seen\n");

    let script = "cat existing && echo x > out && echo \"cwd $(pwd)\"";
    let out = env.pvisor(&["run", "--executor", "vm", "--image", "hostile", "--", "sh", "-c", script]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "stdout: {stdout}\nstderr: {}", text(&out.stderr));
    // The shell names its cwd by where the image's /tmp leads: its own root.
    let inside = Path::new("/").join(env.ws.strip_prefix("/tmp").unwrap());
    assert_eq!(stdout, format!("seen\ncwd {}\n", inside.display()));
    let staged: Vec<_> = env.review().iter().map(|c| c["path"].as_str().unwrap().to_owned()).collect();
    assert_eq!(staged, ["out"]);
}

/// The built-in `python` image needs no import: the first run that names
/// it imports the build `scripts/sandbox-image.sh` made (found through
/// `PVISOR_SANDBOX_IMAGE_PYTHON`, as an installed binary finds its assets).
#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn the_built_in_python_image_is_imported_on_first_use() {
    require_image();
    let env = Env::new(As::Root);
    let mut cmd = env.command(&[
        "run",
        "-q",
        "--executor",
        "vm",
        "--image",
        "python",
        "--",
        "python3",
        "-c",
        "print(6 * 7)",
    ]);
    let out = cmd.env("PVISOR_SANDBOX_IMAGE_PYTHON", python_rootfs()).output().unwrap();
    assert_eq!(text(&out.stdout), "42\n", "stderr: {}", text(&out.stderr));
    let listed = env.expect(&["image", "ls", "--json"], 0);
    let images = records_of(&listed, "image");
    assert_eq!(images.len(), 1, "{listed}");
    assert_eq!(images[0]["name"], "python");
    assert_eq!(env.status_json(None)["image"]["digest"], images[0]["digest"]);
}

/// No Job was recorded: the refusal came before the run started.
fn no_jobs(env: &Env) {
    assert_eq!(env.expect(&["jobs", "--json"], 0).trim(), "", "a Job was recorded");
}

#[test]
fn an_image_is_refused_for_an_ns_run_before_it_starts() {
    let env = Env::new(As::Root);
    let out = env.pvisor(&["run", "--image", IMAGE, "--", "true"]);
    assert_ne!(out.status.code(), Some(0));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("--image applies to --executor vm; an ns run uses the host's userland"),
        "{stderr}"
    );
    no_jobs(&env);
}

#[test]
fn an_unknown_image_is_refused_before_the_run_starts() {
    let env = Env::new(As::Root);
    let out = env.pvisor(&["run", "--executor", "vm", "--image", "no-such-image", "--", "true"]);
    assert_ne!(out.status.code(), Some(0));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("no-such-image")
            && stderr.contains("pvisor image ls")
            && stderr.contains("pvisor image import no-such-image"),
        "{stderr}"
    );
    no_jobs(&env);
}
