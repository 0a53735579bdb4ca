//! Bad input: each case gets a clear error and leaves the records consistent.

use crate::support::*;

#[test]
fn a_missing_workspace_is_refused_before_anything_is_recorded() {
    let env = Env::new(As::Rootless);
    let missing = env.dir.path().join("nope");
    let out = env.pvisor(&["run", "-w", missing.to_str().unwrap(), "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("does not exist"), "{}", text(&out.stderr));
    assert!(
        !env.home.join("jobs").exists() || std::fs::read_dir(env.home.join("jobs")).unwrap().next().is_none()
    );
}

#[test]
fn a_missing_program_exits_127_and_is_recorded_as_failed() {
    let env = Env::new(As::Rootless);
    let out = env.pvisor(&["run", "--", "no-such-program-pvisor"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(text(&out.stderr).contains("not found"), "{}", text(&out.stderr));
    let status = env.status_json(None);
    assert_eq!(status["state"], "failed");
    assert_eq!(status["exit_code"], 127);
    assert_eq!(status["receipt"], "valid");
}

#[test]
fn a_program_that_is_not_executable_exits_126() {
    let env = Env::new(As::Rootless);
    env.write("script.sh", "#!/bin/sh\necho hi\n");
    let out = env.pvisor(&["run", "--", "./script.sh"]);
    assert_eq!(out.status.code(), Some(126));
    assert!(text(&out.stderr).contains("cannot be executed"), "{}", text(&out.stderr));
    assert_eq!(env.status_json(None)["exit_code"], 126);
}

#[test]
fn an_unwritable_state_directory_is_named() {
    // Root can write anywhere, so this runs as the unprivileged user.
    let env = Env::new(As::Rootless);
    let out = env
        .command(&["run", "--", "true"])
        .env("PVISOR_HOME", "/pvisor-e2e-unwritable/state")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("/pvisor-e2e-unwritable/state"), "{stderr}");
    assert!(stderr.contains("Permission denied"), "{stderr}");
    assert!(stderr.contains("PVISOR_HOME"), "{stderr}");
}

#[test]
fn a_workspace_containing_the_state_directory_is_explained() {
    let env = Env::new(As::Rootless);
    let out =
        env.command(&["run", "--", "true"]).env("PVISOR_HOME", env.ws.join(".pvisor")).output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("contains pvisor's state directory"), "{stderr}");
    assert!(stderr.contains("set PVISOR_HOME to a directory outside the workspace"), "{stderr}");
    assert!(!stderr.contains("Too many levels of symbolic links"), "{stderr}");
}

#[test]
fn disabled_user_namespaces_fail_closed_with_the_fix() {
    // Inside a user namespace whose limit is 0, no further user namespace can be made:
    // exactly what a host with user.max_user_namespaces=0 looks like.
    let env = Env::new(As::Rootless);
    let inner = format!(
        "echo 0 > /proc/sys/user/max_user_namespaces && exec {} run -- sh -c 'echo RAN-UNSANDBOXED'",
        bin()
    );
    let mut cmd = unshare_as_test_user();
    let out = cmd
        .args(["-Ur", "sh", "-c", &inner])
        .current_dir(&env.ws)
        .env("PVISOR_HOME", &env.home)
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(!text(&out.stdout).contains("RAN-UNSANDBOXED"), "ran without a sandbox");
    assert!(stderr.contains("user namespace"), "{stderr}");
    assert!(stderr.contains("max_user_namespaces"), "{stderr}");
    // The attempt is recorded as failed, with the reason, under a valid receipt.
    let status = env.status_json(None);
    assert_eq!(status["state"], "failed");
    assert_eq!(status["receipt"], "valid");
    assert!(status["error"].as_str().unwrap().contains("user namespace"));
}

#[test]
fn a_full_disk_while_writing_records_is_reported_and_leaves_no_false_success() {
    let env = Env::new(As::Rootless);
    // A private 16 KiB tmpfs as the state directory, mounted in our own namespaces.
    std::fs::create_dir(&env.home).unwrap();
    env.give_away(&env.home);
    let inner = format!(
        "mount -t tmpfs -o size=16k tmpfs {home} && cd {ws} && {bin} run -- sh -c 'head -c 65536 /dev/zero > big; exit 0'; echo RUN-EXIT=$?; {bin} jobs --json; echo JOBS-EXIT=$?",
        home = env.home.display(),
        ws = env.ws.display(),
        bin = bin()
    );
    let mut cmd = unshare_as_test_user();
    let out = cmd.args(["-Urm", "sh", "-c", &inner]).env("PVISOR_HOME", &env.home).output().unwrap();
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(stdout.contains("RUN-EXIT=125"), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(stderr.contains("hint:") || stderr.contains("unconfirmed"), "{stderr}");
    // Whatever was recorded is readable and claims no success.
    assert!(!stdout.contains("\"state\":\"completed\""), "{stdout}");
    assert!(!stdout.contains("\"type\":\"error\""), "a record was left corrupt: {stdout}");
}

/// docs/exit-codes.md: "A setup failure (125 from `run`) is recorded too".
/// A missing vm guest image is one: the Job exists, reads `failed`, and its
/// reason says how to build the image.
#[test]
fn a_missing_vm_guest_image_is_a_recorded_failed_job() {
    let env = Env::new(As::Root);
    let missing = env.dir.path().join("no-image-here");
    let out = env
        .command(&["run", "--executor", "vm", "--", "true"])
        .env("PVISOR_VM_IMAGE", &missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("vm-image.sh"), "the error says how to get an image: {stderr}");
    let status = env.status_json(None);
    assert_eq!(status["state"], "failed", "{status}");
    assert_eq!(status["receipt"], "valid", "{status}");
    let shown = env.expect(&["status"], 0);
    assert!(shown.contains("no-image-here") || shown.contains("guest image"), "{shown}");
}
