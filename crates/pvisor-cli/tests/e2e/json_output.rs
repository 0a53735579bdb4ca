//! `--json` of the commands that change something, read as a harness reads
//! it: `run` leaves the command's bytes alone and puts its own lines, JSON
//! ending with one `result`, on stderr; `apply`, `drop`, `kill`,
//! `checkpoint` and `export` print JSON lines on stdout ending the same way;
//! a failure ends with one `error` line instead (docs/cli-reference.md,
//! "--json lines").

use std::fs;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

/// The lines of a `run --json` stderr that are not the command's own
/// (`own`, which must all be there, in order): each must be a JSON
/// envelope. Returns them as (type, data).
fn pvisor_lines(stderr: &str, own: &[&str]) -> Vec<(String, Value)> {
    let mut own = own.iter().peekable();
    let mut lines = Vec::new();
    for line in stderr.lines() {
        if own.peek() == Some(&&line) {
            own.next();
            continue;
        }
        lines.push(line);
    }
    assert!(
        own.peek().is_none(),
        "the command's stderr lines {:?} are missing from {stderr:?}",
        own.collect::<Vec<_>>()
    );
    json_lines(&lines.join("\n"))
}

/// The `result` that must be the last of `lines`, and the only one.
fn the_result(lines: &[(String, Value)]) -> &Value {
    let (kind, data) = lines.last().expect("no --json line");
    assert_eq!(kind, "result", "the last line is the result: {lines:?}");
    assert_eq!(lines.iter().filter(|(k, _)| k == "result").count(), 1, "{lines:?}");
    data
}

/// The lines of a `--json` stdout: all JSON, the last the only `result`.
fn stdout_lines(out: &std::process::Output) -> Vec<(String, Value)> {
    json_lines(&text(&out.stdout))
}

#[test]
fn run_json_passes_the_commands_output_through_and_ends_with_its_result() {
    let env = Env::new(As::Rootless);
    env.write("kept", "k\n");
    let script = "printf 'to stdout\\n\\033[1mbold\\033[0m \\001\\n'; echo 'to stderr' >&2; \
                  echo '{\"type\":\"result\",\"data\":{}}' >&2; echo n > new; rm kept; echo done";
    std::thread::sleep(Duration::from_millis(25));
    let out = env.pvisor(&["run", "--json", "--", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(out.stdout, b"to stdout\n\x1b[1mbold\x1b[0m \x01\ndone\n", "the command's bytes, unchanged");
    let stderr = text(&out.stderr);
    let lines = pvisor_lines(&stderr, &["to stderr", "{\"type\":\"result\",\"data\":{}}"]);
    let result = the_result(&lines);
    let job = only_job(&env);
    assert_eq!(result["job"], job.as_str());
    assert_eq!(result["state"], "completed");
    assert_eq!(result["exit_code"], 0);
    assert!(result["signal"].is_null());
    assert!(result["error"].is_null());
    let status = env.status_json(Some(&job));
    assert_eq!(result["attempt"], status["attempt"]);
    assert_eq!(result["workspace"], status["workspace"]);
    assert_eq!(result["receipt"]["valid"], true);
    let receipt: Value =
        serde_json::from_slice(&fs::read(env.attempt_dir(&status).join("completion.json")).unwrap()).unwrap();
    assert_eq!(result["receipt"]["bundle_blake3"], receipt["bundle"]["blake3"]);
    let changes = &result["changes"];
    assert_eq!(changes["total"], 2);
    assert_eq!(changes["by_kind"], serde_json::json!({"added": 1, "deleted": 1}));
    assert_eq!(
        changes["paths"],
        serde_json::json!([{"path": "kept", "kind": "deleted"}, {"path": "new", "kind": "added"}])
    );
    assert_eq!(changes["truncated"], false);
    assert_eq!(result["network"]["non_bypassable"], true);
    let next = lines.iter().find(|(k, _)| k == "next").expect("a next line");
    assert!(next.1["commands"][1].as_str().unwrap().contains(&format!("apply {job} --all")), "{next:?}");
}

#[test]
fn run_json_of_a_failing_command_exits_with_its_status() {
    let env = Env::new(As::Rootless);
    let out = env.pvisor(&["run", "--json", "--", "sh", "-c", "echo oops >&2; exit 3"]);
    assert_eq!(out.status.code(), Some(3), "stderr: {}", text(&out.stderr));
    assert!(out.stdout.is_empty());
    let lines = pvisor_lines(&text(&out.stderr), &["oops"]);
    let result = the_result(&lines);
    assert_eq!(result["state"], "failed");
    assert_eq!(result["exit_code"], 3);
    assert_eq!(result["job"], only_job(&env).as_str());
    assert_eq!(result["changes"]["total"], 0);
}

/// A command whose stderr ends without a newline runs into pvisor's next
/// line; the result is still found from its last `{"type":"result",`.
#[test]
fn run_json_result_is_found_after_an_unterminated_last_line() {
    let env = Env::new(As::Rootless);
    let out = env.pvisor(&["run", "--json", "-q", "--", "sh", "-c", "printf 'progress 50%%' >&2; exit 4"]);
    assert_eq!(out.status.code(), Some(4));
    let stderr = text(&out.stderr);
    let last = stderr.lines().last().unwrap();
    let (before, _) = last.rsplit_once("{\"type\":\"result\",").unwrap();
    assert_eq!(before, "progress 50%", "{stderr}");
    let result: Value = serde_json::from_str(&last[before.len()..]).unwrap();
    assert_eq!(result["data"]["exit_code"], 4);
}

#[test]
fn run_json_of_a_program_that_is_not_there_says_why_in_its_result() {
    let env = Env::new(As::Rootless);
    let out = env.pvisor(&["run", "--json", "--", "no-such-program-here"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(out.stdout.is_empty());
    let lines = pvisor_lines(&text(&out.stderr), &[]);
    let result = the_result(&lines);
    assert_eq!(result["state"], "failed");
    assert_eq!(result["exit_code"], 127);
    assert!(result["error"].as_str().unwrap().contains("not found"), "{result}");
}

#[test]
fn run_json_that_cannot_start_ends_with_one_error_line() {
    let env = Env::new(As::Rootless);
    for (args, says) in [
        (&["run", "--json", "--no-such-flag", "--", "true"][..], "--no-such-flag"),
        (&["run", "--json", "-w", "/no/such/dir", "--", "true"][..], "/no/such/dir"),
        (&["run", "--json", "--label", "no good=1", "--", "true"][..], "no good"),
    ] {
        let out = env.pvisor(args);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {}", text(&out.stderr));
        assert!(out.stdout.is_empty());
        let lines = json_lines(&text(&out.stderr));
        assert_eq!(lines.len(), 1, "{args:?}: {lines:?}");
        assert_eq!(lines[0].0, "error");
        assert!(lines[0].1["message"].as_str().unwrap().contains(says), "{args:?}: {lines:?}");
        assert_eq!(lines[0].1["exit_code"], 125);
    }
    assert!(!env.home.join("jobs").exists() || fs::read_dir(env.home.join("jobs")).unwrap().count() == 0);
}

#[test]
fn apply_json_of_one_path_then_drop_json_of_the_rest() {
    let env = Env::new(As::Rootless);
    assert!(env.run_sh("echo a > a; echo b > b; mkdir d; echo c > d/c").status.success());
    let job = only_job(&env);

    let out = env.pvisor(&["apply", &job, "a", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let lines = stdout_lines(&out);
    assert_eq!(lines[0].0, "applied");
    assert_eq!(lines[0].1["path"], "a");
    assert_eq!(lines[0].1["kind"], "added");
    let result = the_result(&lines);
    assert_eq!(result["job"], job.as_str());
    assert_eq!((result["applied"].as_u64(), result["skipped"].as_u64()), (Some(1), Some(0)));
    assert_eq!(result["remaining"], 3);
    assert_eq!(result["staged"], true);
    assert_eq!(fs::read_to_string(env.ws.join("a")).unwrap(), "a\n");

    let out = env.pvisor(&["drop", &job, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let lines = stdout_lines(&out);
    let dropped: Vec<&Value> =
        lines.iter().filter(|(k, _)| k == "dropped").map(|(_, d)| &d["path"]).collect();
    assert_eq!(dropped, ["b", "d", "d/c"]);
    let result = the_result(&lines);
    assert_eq!(result["dropped"], 3);
    assert_eq!(result["already_applied"], 1);
    assert!(!env.ws.join("b").exists());
}

#[test]
fn apply_json_skips_a_sensitive_path_with_its_reason_and_asks_nothing() {
    let env = Env::new(As::Rootless);
    assert!(env.run_sh("echo x > .envrc; echo y > plain").status.success());
    let job = only_job(&env);
    let out = env.pvisor(&["apply", &job, "-i", "--json"]);
    assert_eq!(out.status.code(), Some(125));
    let lines = stdout_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].0, "error");
    assert!(lines[0].1["message"].as_str().unwrap().contains("--all"), "{lines:?}");

    let out = env.pvisor(&["apply", &job, "--all", "--json"]);
    assert_eq!(out.status.code(), Some(1), "a skipped path exits 1: {}", text(&out.stdout));
    let lines = stdout_lines(&out);
    let skipped = lines.iter().find(|(k, _)| k == "skipped").expect("a skipped line");
    assert_eq!(skipped.1["path"], ".envrc");
    assert_eq!(skipped.1["reason"], "sensitive");
    let result = the_result(&lines);
    assert_eq!(result["sensitive"], 1);
    assert_eq!(result["applied"], 1);
    assert!(result["hints"][0].as_str().unwrap().contains("--include-sensitive"), "{result}");
    assert!(!env.ws.join(".envrc").exists());
}

#[test]
fn kill_json_ends_a_running_job_whose_run_reports_it() {
    let env = Env::new(As::Rootless);
    let marker = "4107.75";
    let child = env
        .command(&["run", "--json", "--", "sleep", marker])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || !sleepers(marker).is_empty()));
    let job = only_job(&env);
    let out = env.pvisor(&["kill", &job, "--grace", "10s", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let lines = stdout_lines(&out);
    let result = the_result(&lines);
    assert_eq!(result["job"], job.as_str());
    assert_eq!(result["state"], "cancelled");
    assert_eq!(result["already_ended"], false);

    let run = child.wait_with_output().unwrap();
    assert_eq!(run.status.code(), Some(143));
    let lines = pvisor_lines(&text(&run.stderr), &[]);
    let result = the_result(&lines);
    assert_eq!(result["state"], "cancelled");
    assert_eq!(result["signal"], 15);
    assert!(result["exit_code"].is_null());
}

#[test]
fn checkpoint_json_names_a_checkpoint_that_fork_json_starts_from() {
    let env = Env::new(As::Rootless);
    assert!(env.run_sh("echo from-parent > a").status.success());
    let job = only_job(&env);
    let out = env.pvisor(&["checkpoint", &job, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let lines = stdout_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let result = the_result(&lines);
    assert_eq!(result["job"], job.as_str());
    assert_eq!(result["kind"], "workspace");
    let checkpoint = result["checkpoint"].as_str().unwrap();
    assert!(env.home.join("checkpoints").join(checkpoint).join("manifest.json").is_file());

    let out = env.pvisor(&["fork", checkpoint, "--json", "--", "cat", "a"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "from-parent\n");
    let lines = pvisor_lines(&text(&out.stderr), &[]);
    let fork = lines.iter().find(|(k, _)| k == "fork").expect("a fork line");
    assert_eq!(fork.1["parent"], job.as_str());
    assert_eq!(fork.1["checkpoint"], checkpoint);
    assert_ne!(the_result(&lines)["job"], job.as_str());
}

#[test]
fn export_json_gives_the_archive_and_a_blake3_that_matches_it() {
    let env = Env::new(As::Rootless);
    assert!(env.run_sh("echo x > f").status.success());
    let job = only_job(&env);
    let archive = env.dir.path().join("run.pvisor.tar");
    let out = env.pvisor(&["export", &job, "-o", archive.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let lines = stdout_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let result = the_result(&lines);
    assert_eq!(result["archive"], archive.to_str().unwrap());
    let bytes = fs::read(&archive).unwrap();
    assert_eq!(result["blake3"], blake3::hash(&bytes).to_hex().as_str());
    assert_eq!(result["bytes"], bytes.len());
    assert_eq!(result["confirmed"], true);
    env.expect(&["verify", archive.to_str().unwrap()], 0);
}

/// `verify`, `import` and `cache prune` end with one `result` line too; a
/// tampered archive is `ok: false` with what failed, and exit 1.
#[test]
fn verify_import_and_cache_prune_json_end_with_a_result() {
    let env = Env::new(As::Rootless);
    assert!(env.run_sh("echo x > f").status.success());
    let job = only_job(&env);
    let archive = env.dir.path().join("run.pvisor.tar");
    env.expect(&["export", &job, "-o", archive.to_str().unwrap()], 0);
    let out = env.pvisor(&["verify", archive.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let lines = stdout_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(the_result(&lines)["ok"], true);

    let mut bytes = fs::read(&archive).unwrap();
    // The staged file's contents, "x\n" padded with NULs in its tar block.
    let at = bytes.windows(3).position(|w| w == b"x\n\0").expect("the staged file is in the archive");
    bytes[at] ^= 0x20;
    let tampered = env.dir.path().join("tampered.pvisor.tar");
    fs::write(&tampered, &bytes).unwrap();
    env.give_away(&tampered);
    let out = env.pvisor(&["verify", tampered.to_str().unwrap(), "--json"]);
    let lines = stdout_lines(&out);
    let result = the_result(&lines);
    assert_eq!(out.status.code(), Some(1), "{lines:?}");
    assert_eq!(result["ok"], false);
    assert!(!result["failures"].as_array().unwrap().is_empty(), "{result}");

    let other = Env::new(As::Rootless);
    other.give_away(&archive);
    let out = other.pvisor(&["import", archive.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(the_result(&stdout_lines(&out))["job"], job.as_str());

    let out = env.pvisor(&["cache", "prune", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(the_result(&stdout_lines(&out))["removed"], 0);
}

/// `run --timings`: each phase from one recorded milestone to the next, the
/// ns executor's own setup steps inside `sandbox setup`, adding up to the
/// whole; under `--json` a `timings` line before the result. As root (who
/// also joins cgroups) and as a normal user.
#[test]
fn run_timings_rootless() {
    run_timings_shows_where_the_time_went_phase_by_phase(As::Rootless);
}

#[test]
#[ignore = "needs root"]
fn run_timings_as_root() {
    run_timings_shows_where_the_time_went_phase_by_phase(As::Root);
}

/// `run --executor vm --timings`: the vm executor's start steps inside
/// `sandbox setup`, in order, from the spec's check and disks to the exec,
/// and the guest agent's own steps inside `guest_setup`.
#[test]
fn run_timings_of_a_vm_run_show_its_start_steps() {
    crate::vm::require_image();
    let env = Env::new(As::Root);
    let out = env.pvisor(&["run", "--executor", "vm", "--json", "--timings", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let lines = pvisor_lines(&text(&out.stderr), &[]);
    let (_, timings) = lines.iter().find(|(k, _)| k == "timings").expect("a timings line");
    let setup = &timings["phases"][2];
    assert_eq!(setup["phase"], "sandbox setup", "{timings}");
    let all: Vec<(&str, f64)> = setup["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["step"].as_str().unwrap(), s["ms"].as_f64().unwrap()))
        .collect();
    let (nested, steps): (Vec<_>, Vec<_>) = all.iter().partition(|(name, _)| name.contains('.'));
    let names: Vec<&str> = steps.iter().map(|(name, _)| *name).collect();
    // A template restore (the first run builds the template, then restores
    // it) or a boot: either way these steps, in this order.
    let start = if names.contains(&"boot") { "boot" } else { "load_state" };
    let expected = [
        "disks",
        "spawn_qemu",
        "link",
        start,
        "hello",
        "repair",
        "guest_setup",
        "exec",
        "handovers",
        "other",
    ];
    assert_eq!(names, expected, "{timings}");
    let sum: f64 = steps.iter().map(|(_, ms)| ms).sum();
    let phase = setup["ms"].as_f64().unwrap();
    assert!(sum >= phase - 1.0, "the steps cover the phase: {sum} of {phase}");
    // The guest's own steps, within `guest_setup` and adding up to no more.
    let guest: Vec<&str> = nested.iter().map(|(name, _)| *name).collect();
    for step in ["guest.base_mount", "guest.upper_mount", "guest.overlay"] {
        assert!(guest.contains(&step), "{step} in {guest:?}");
    }
    let guest_ms: f64 = nested.iter().map(|(_, ms)| ms).sum();
    let guest_setup = steps.iter().find(|(name, _)| *name == "guest_setup").unwrap().1;
    assert!(
        guest_ms <= guest_setup + 1.0,
        "the guest's steps fit in guest_setup: {guest_ms} of {guest_setup}"
    );
}

fn run_timings_shows_where_the_time_went_phase_by_phase(who: As) {
    who.require();
    {
        let env = Env::new(who);
        let out = env.pvisor(&["run", "--json", "--timings", "--", "sh", "-c", "sleep 0.2; echo n > new"]);
        assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
        let lines = pvisor_lines(&text(&out.stderr), &[]);
        the_result(&lines);
        let (_, timings) = lines.iter().find(|(k, _)| k == "timings").expect("a timings line");
        let phases: Vec<&str> =
            timings["phases"].as_array().unwrap().iter().map(|p| p["phase"].as_str().unwrap()).collect();
        assert_eq!(
            phases,
            ["startup", "admission", "sandbox setup", "command", "seal", "bundle", "finalize", "report"],
            "{timings}"
        );
        let ms = |p: &Value| p["ms"].as_f64().unwrap();
        let sum: f64 = timings["phases"].as_array().unwrap().iter().map(ms).sum();
        let total = timings["total_ms"].as_f64().unwrap();
        assert!((sum - total).abs() < 1.0, "the phases add up to the whole: {sum} vs {total}");
        let command = ms(&timings["phases"][3]);
        let step_ms = |name: &str| {
            timings["phases"][2]["steps"].as_array().unwrap().iter().find(|s| s["step"] == name).map(ms)
        };
        // The command is already running while the supervisor records it as
        // running (`attempt.started` is stamped after those writes), so on a
        // loaded host part of its sleep falls in setup's `other` step; the two
        // together hold all of it.
        let other = step_ms("other").expect("an `other` step");
        assert!(
            command + other >= 200.0,
            "the command's sleep is in `command` and setup's `other`: {timings}"
        );
        let steps: Vec<&str> = timings["phases"][2]["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["step"].as_str().unwrap())
            .collect();
        for step in [
            "spawn_helper",
            "sandbox_ready",
            "init.mounts",
            "init.seccomp_build",
            "init.cgroup_join_wait",
            "other",
        ] {
            assert!(steps.contains(&step), "{step} in {steps:?}");
        }

        // As text: a table on stderr, even with --quiet.
        let out = env.pvisor(&["run", "-q", "--timings", "--", "true"]);
        let stderr = text(&out.stderr);
        assert!(stderr.starts_with("pvisor: timings, ") && stderr.contains("init.mounts"), "{stderr}");
    }
}
