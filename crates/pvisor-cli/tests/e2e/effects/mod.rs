//! The effects workflow: run → review → apply selected files → review
//! remaining → apply or drop. Adversarial cases first; choosing change by
//! change or hunk by hunk is in `interactive`.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Stdio;

use crate::support::*;

mod deception;
mod incomplete;
mod interactive;
mod parallel;

fn change<'a>(review: &'a [serde_json::Value], path: &str) -> &'a serde_json::Value {
    review.iter().find(|c| c["path"] == path).unwrap_or_else(|| panic!("no change {path} in {review:?}"))
}

// ---- adversarial: nothing is ever written outside the workspace ----

#[test]
fn a_staged_symlink_to_etc_is_applied_as_a_link_and_never_followed() {
    let env = Env::new(As::Root);
    let out = env
        .run_sh("ln -s /etc evil; echo x > evil/pwned 2>/dev/null; ln -s ../../../../etc/passwd rel; true");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let review = env.review();
    assert_eq!(change(&review, "evil")["entry"], "symlink");
    assert_eq!(review.len(), 2, "{review:?}");
    env.expect(&["apply", "--all"], 0);
    assert_eq!(fs::read_link(env.ws.join("evil")).unwrap(), Path::new("/etc"));
    assert_eq!(fs::read_link(env.ws.join("rel")).unwrap(), Path::new("../../../../etc/passwd"));
    assert!(!Path::new("/etc/pwned").exists());
}

#[test]
fn a_directory_swapped_for_a_symlink_after_the_run_cannot_redirect_apply() {
    let env = Env::new(As::Rootless);
    env.write("sub/file", "original\n");
    let outside = env.dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    env.give_away(&outside);
    let out = env.run_sh("echo staged > sub/file; echo new > sub/added");
    assert!(out.status.success());
    // After the run, the host replaces sub/ with a symlink pointing outside.
    fs::rename(env.ws.join("sub"), env.dir.path().join("sub.moved")).unwrap();
    std::os::unix::fs::symlink(&outside, env.ws.join("sub")).unwrap();
    env.give_away(&env.ws.join("sub"));

    let refused = env.pvisor(&["apply", "--all"]);
    assert_ne!(refused.status.code(), Some(0), "{}", text(&refused.stdout));
    let forced = env.pvisor(&["apply", "--all", "--force"]);
    assert_ne!(
        forced.status.code(),
        Some(0),
        "forced apply through a symlink must fail: {}",
        text(&forced.stdout)
    );
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0, "apply wrote through the symlink");
}

#[test]
fn paths_that_climb_out_of_the_workspace_are_refused() {
    let env = Env::new(As::Rootless);
    assert!(env.run_sh("echo x > f").status.success());
    for bad in ["../f", "/etc/passwd", "../../etc/passwd"] {
        let out = env.pvisor(&["apply", bad]);
        assert_eq!(out.status.code(), Some(125), "{bad}: {}", text(&out.stdout));
        assert!(text(&out.stderr).contains("is outside the workspace"), "{}", text(&out.stderr));
    }
    // A path that stays inside is matched against the stage as before.
    let out = env.pvisor(&["apply", "sub/../g"]);
    assert!(text(&out.stderr).contains("No staged change matches"), "{}", text(&out.stderr));
    assert!(!env.ws.join("f").exists());
}

#[test]
fn fifos_and_hard_links_are_handled_and_specials_never_created() {
    let env = Env::new(As::Rootless);
    let out = env.run_sh("echo shared > a; ln a b; mkfifo pipe");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let review = env.review();
    assert_eq!(change(&review, "pipe")["entry"], "special");
    assert!(change(&review, "pipe")["unsupported"].is_string());
    let out = env.pvisor(&["apply", "--all"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("pipe not applied"), "{}", text(&out.stderr));
    assert!(!env.ws.join("pipe").exists());
    assert_eq!(fs::read(env.ws.join("a")).unwrap(), b"shared\n");
    assert_eq!(fs::read(env.ws.join("b")).unwrap(), b"shared\n");
}

#[test]
fn odd_file_names_round_trip_exactly() {
    let env = Env::new(As::Rootless);
    let out = env.run_sh(r#"printf 1 > "with space"; printf 2 > "$(printf 'new\nline')"; printf 3 > "$(printf 'bad\377byte')"; printf 4 > '-dash'"#);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let human = env.expect(&["review"], 0);
    assert!(human.contains("new\\nline"), "newline must be escaped in listings: {human}");
    let review = env.review();
    assert_eq!(review.len(), 4, "{review:?}");
    assert!(review.iter().any(|c| c["path"]["hex"].is_string()), "non-UTF-8 names are hex: {review:?}");
    env.expect(&["apply", "--all"], 0);
    use std::os::unix::ffi::OsStrExt;
    let names: Vec<Vec<u8>> =
        fs::read_dir(&env.ws).unwrap().map(|e| e.unwrap().file_name().as_bytes().to_vec()).collect();
    for want in [&b"with space"[..], b"new\nline", b"bad\xffbyte", b"-dash"] {
        assert!(names.iter().any(|n| n == want), "missing {:?} in {names:?}", String::from_utf8_lossy(want));
    }
}

// ---- structure ----

#[test]
fn structural_changes_apply_exactly() {
    let env = Env::new(As::Rootless);
    env.write("dir_to_file/inner", "i\n");
    env.write("file_to_dir", "f\n");
    env.write("replaced/old1", "1\n");
    env.write("replaced/old2", "2\n");
    env.write("chmod_me", "c\n");
    let out = env.run_sh(
        "rm -r dir_to_file && echo now-a-file > dir_to_file; \
         rm file_to_dir && mkdir file_to_dir && echo inside > file_to_dir/x; \
         rm -rf replaced && mkdir replaced && echo fresh > replaced/new; \
         chmod 750 chmod_me",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let review = env.review();
    assert_eq!(change(&review, "dir_to_file")["kind"], "type-changed");
    assert_eq!(change(&review, "file_to_dir")["kind"], "type-changed");
    assert_eq!(change(&review, "replaced")["kind"], "opaque-dir");
    assert_eq!(change(&review, "chmod_me")["kind"], "mode-changed");
    env.expect(&["apply", "--all"], 0);
    assert_eq!(fs::read_to_string(env.ws.join("dir_to_file")).unwrap(), "now-a-file\n");
    assert_eq!(fs::read_to_string(env.ws.join("file_to_dir/x")).unwrap(), "inside\n");
    let replaced: Vec<_> =
        fs::read_dir(env.ws.join("replaced")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(replaced, vec![std::ffi::OsString::from("new")]);
    assert_eq!(fs::metadata(env.ws.join("chmod_me")).unwrap().permissions().mode() & 0o777, 0o750);
    assert_eq!(fs::read_to_string(env.ws.join("chmod_me")).unwrap(), "c\n");
    let after = env.review();
    assert!(after.iter().all(|c| c["applied"] == true), "{after:?}");
}

#[test]
fn setuid_bits_are_dropped_with_a_warning() {
    let env = Env::new(As::Rootless);
    assert!(env.run_sh("echo x > s; chmod 4755 s").status.success());
    let out = env.pvisor(&["apply", "--all"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stderr).contains("setuid/setgid bits dropped"), "{}", text(&out.stderr));
    assert_eq!(fs::metadata(env.ws.join("s")).unwrap().mode() & 0o7777, 0o755);
}

// ---- the workflow ----

#[test]
fn review_apply_some_review_the_rest_then_drop() {
    let env = Env::new(As::Rootless);
    env.write("existing", "old\n");
    env.write("tracked", "1\n2\n3\n4\n5\n6\n7\n8\n");
    let out = env.run_sh("echo x > new; rm existing; sed -i 's/^5$/five/' tracked; mkdir -p src/deep; echo code > src/deep/a.rs; echo b > src/b.rs; exit 2");
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("pvisor review") && stderr.contains("pvisor apply"), "next steps: {stderr}");
    assert!(stderr.contains("not staged"), "effects reminder: {stderr}");

    // Review: every change, deletions included; a real unified diff with context.
    let review = env.review();
    let paths: Vec<&str> = review.iter().map(|c| c["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["existing", "new", "src", "src/b.rs", "src/deep", "src/deep/a.rs", "tracked"]);
    for c in &review {
        for field in ["path", "kind", "size", "conflict", "applied"] {
            assert!(!c[field].is_null(), "{field} missing in {c}");
        }
    }
    let diff = env.expect(&["review", "--diff", "tracked", "existing"], 0);
    assert!(diff.contains("@@ -2,7 +2,7 @@"), "{diff}");
    assert!(diff.contains("-5\n+five\n"), "{diff}");
    assert!(diff.contains(" 4\n"), "context lines: {diff}");
    assert!(diff.contains("-old"), "deletion diff: {diff}");
    assert!(!diff.contains('\x1b'), "piped output must be plain");
    let colored = env.expect(&["review", "--diff", "--color", "always", "tracked"], 0);
    assert!(colored.contains("\x1b[32m+five"), "{colored}");
    // `pvisor diff` is `review --diff` (it used to be a plain alias of review).
    assert_eq!(env.expect(&["diff", "tracked", "existing"], 0), diff);

    // Apply a directory: everything under it, nothing else.
    env.expect(&["apply", "src"], 0);
    assert_eq!(fs::read_to_string(env.ws.join("src/deep/a.rs")).unwrap(), "code\n");
    assert!(!env.ws.join("new").exists());
    let status = env.status_json(None);
    assert_eq!(status["stage_state"], "partially-applied");
    assert_eq!(status["state"], "failed", "the run's result is separate from the stage");

    // A glob.
    env.expect(&["apply", "t*"], 0);
    assert!(fs::read_to_string(env.ws.join("tracked")).unwrap().contains("five"));

    // What remains, then drop it.
    let remaining: Vec<String> = env
        .review()
        .iter()
        .filter(|c| c["applied"] == false)
        .map(|c| c["path"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(remaining, ["existing", "new"]);
    let dropped = env.expect(&["drop"], 0);
    assert!(dropped.contains("already applied stay"), "{dropped}");
    assert_eq!(env.status_json(None)["stage_state"], "applied");
    assert!(env.ws.join("existing").exists(), "drop must not delete");
    assert!(env.ws.join("src/b.rs").exists(), "drop never undoes an apply");

    let job = status["job"].as_str().unwrap();
    let events = env.events(job);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"apply.file") && kinds.contains(&"stage.dropped"), "{kinds:?}");
    let started: Vec<u64> =
        events.iter().filter(|e| e["type"] == "apply.started").map(|e| e["seq"].as_u64().unwrap()).collect();
    for e in events.iter().filter(|e| e["type"] == "apply.file") {
        assert!(
            started.contains(&e["cause"].as_u64().unwrap()),
            "apply.file must be caused by apply.started: {e}"
        );
    }
}

#[test]
fn a_host_edit_after_the_run_is_a_conflict_until_forced() {
    let env = Env::new(As::Rootless);
    env.write("notes", "mine\n");
    env.write("other", "o\n");
    assert!(env.run_sh("echo agent >> notes; echo agent > other").status.success());
    fs::write(env.ws.join("notes"), "mine, edited meanwhile\n").unwrap();
    let review = env.review();
    assert_eq!(change(&review, "notes")["conflict"], true);
    assert_eq!(change(&review, "other")["conflict"], false);

    let out = env.expect(&["apply", "--all"], 1);
    assert!(out.contains("CONFLICT  notes"), "{out}");
    assert_eq!(fs::read_to_string(env.ws.join("notes")).unwrap(), "mine, edited meanwhile\n");
    assert_eq!(fs::read_to_string(env.ws.join("other")).unwrap(), "o\n", "a refused apply applies nothing");
    env.expect(&["apply", "other"], 0);
    env.expect(&["apply", "notes", "--force"], 0);
    assert_eq!(fs::read_to_string(env.ws.join("notes")).unwrap(), "mine\nagent\n");
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    let kinds: Vec<String> =
        env.events(&job).iter().map(|e| e["type"].as_str().unwrap().to_owned()).collect();
    assert!(kinds.iter().filter(|k| *k == "apply.conflict").count() >= 2, "{kinds:?}");
}

#[test]
fn a_host_change_during_the_run_has_no_baseline_and_is_never_silently_overwritten() {
    let env = Env::new(As::Rootless);
    env.write("racy", "before\n");
    let (racy, runs) = (env.ws.join("racy"), env.home.join("runs"));
    // The host edits the file while the sandboxed command runs: once the
    // command has read it (it says so by staging `started`), not after a
    // fixed delay, which a slow start on a loaded host can outlast.
    let editor = std::thread::spawn(move || {
        let started = || {
            let Ok(runs) = fs::read_dir(&runs) else { return false };
            runs.flatten().any(|run| run.path().join("stage/upper/started").exists())
        };
        assert!(wait_until(std::time::Duration::from_secs(20), started), "the run never started");
        fs::write(&racy, "host edit during run\n").unwrap();
    });
    let out = env.run_sh("cat racy > /dev/null; touch started; sleep 0.8; echo agent > racy");
    editor.join().unwrap();
    assert!(out.status.success());
    let review = env.review();
    assert_eq!(change(&review, "racy")["conflict"], true, "{review:?}");
    env.expect(&["apply", "racy"], 1);
    assert_eq!(fs::read_to_string(env.ws.join("racy")).unwrap(), "host edit during run\n");
}

/// Baselines are per path, but a directory the run wrote into that the host
/// renamed meanwhile is not taken for a new one (overlayfs marked it copied
/// up): apply would otherwise re-create it beside its new name.
#[test]
fn a_directory_the_host_renames_while_the_run_writes_in_it_is_a_conflict() {
    let env = Env::new(As::Rootless);
    env.write("src/a.rs", "a\n");
    let (ws, runs) = (env.ws.clone(), env.home.join("runs"));
    // Once the run's file is staged, the host renames its directory (the
    // run cannot watch for it: overlayfs does not see its lower layer change).
    let host = std::thread::spawn(move || {
        let staged = || {
            let Ok(runs) = fs::read_dir(&runs) else { return false };
            runs.flatten().any(|run| run.path().join("stage/upper/src/b.rs").exists())
        };
        assert!(wait_until(std::time::Duration::from_secs(20), staged), "the run never staged src/b.rs");
        fs::rename(ws.join("src"), ws.join("lib")).unwrap();
    });
    let out = env.run_sh("echo b > src/b.rs; sleep 1");
    host.join().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let refused = env.expect(&["apply", "--all"], 1);
    assert!(
        refused.contains("CONFLICT  src: no baseline: the run wrote into this directory, which the host removed or renamed"),
        "{refused}"
    );
    assert!(!env.ws.join("src").exists(), "a refused apply re-created the renamed directory");
    assert_eq!(fs::read_to_string(env.ws.join("lib/a.rs")).unwrap(), "a\n");
}

#[test]
fn two_applies_at_once_are_serialized_and_each_file_lands_once() {
    let env = Env::new(As::Rootless);
    assert!(env.run_sh("for i in $(seq 1 400); do echo $i > f$i; done").status.success());
    let a = env.command(&["apply", "--all"]).spawn().unwrap();
    let b = env.command(&["apply", "--all"]).spawn().unwrap();
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(a.status.success() && b.status.success(), "{} {}", text(&a.stderr), text(&b.stderr));
    for i in 1..=400 {
        assert_eq!(fs::read_to_string(env.ws.join(format!("f{i}"))).unwrap(), format!("{i}\n"));
    }
    let status = env.status_json(None);
    let ledger =
        fs::read_to_string(Path::new(status["stage"].as_str().unwrap()).join("ledger.jsonl")).unwrap();
    let applied = ledger.lines().filter(|l| l.contains("\"applied\"")).count();
    assert_eq!(applied, 400, "each path applied exactly once");
}

#[test]
fn a_killed_apply_resumes_consistently() {
    let env = Env::new(As::Rootless);
    assert!(env
        .run_sh("mkdir d; i=0; while [ $i -lt 20000 ]; do echo $i > d/f$i; i=$((i+1)); done")
        .status
        .success());
    let status = env.status_json(None);
    let ledger_path = Path::new(status["stage"].as_str().unwrap()).join("ledger.jsonl");
    let mut child = env.command(&["apply", "--all"]).spawn().unwrap();
    // Kill it once the intents are on disk, i.e. while files are being written.
    assert!(wait_until(std::time::Duration::from_secs(20), || ledger_path.exists()));
    child.kill().unwrap();
    let killed = child.wait().unwrap();
    let out = env.pvisor(&["apply", "--all"]);
    assert_eq!(out.status.code(), Some(0), "resume: {} {}", text(&out.stdout), text(&out.stderr));
    for i in (0..20000).step_by(997) {
        assert_eq!(fs::read_to_string(env.ws.join(format!("d/f{i}"))).unwrap(), format!("{i}\n"));
    }
    assert_eq!(fs::read_dir(env.ws.join("d")).unwrap().count(), 20000, "stray temporaries or missing files");
    assert!(env.review().iter().all(|c| c["applied"] == true));
    eprintln!("first apply ended with {killed:?}");
}

#[test]
fn an_unconfirmed_run_can_be_reviewed_but_not_applied_or_dropped() {
    let env = Env::new(As::Rootless);
    let mut child =
        env.command(&["run", "--", "sh", "-c", "echo partial > p; sleep 4105.5"]).spawn().unwrap();
    assert!(wait_until(std::time::Duration::from_secs(10), || !sleepers("4105.5").is_empty()));
    child.kill().unwrap();
    child.wait().unwrap();
    let review = env.expect(&["review"], 0);
    assert!(review.contains("no confirmed result"), "{review}");
    assert!(review.contains(" p"), "the staged file is listed: {review}");
    assert!(!review.contains("exit"), "no unconfirmed execution result: {review}");
    for cmd in [["apply", "--all"], ["drop", "p"]] {
        let out = env.pvisor(&cmd);
        assert_eq!(out.status.code(), Some(125));
        let stderr = text(&out.stderr);
        assert!(stderr.contains("no confirmed result") && stderr.contains("pvisor kill"), "{stderr}");
    }
    assert!(!env.ws.join("p").exists());
}

#[test]
fn ten_thousand_files_apply_and_review_in_full() {
    let env = Env::new(As::Rootless);
    assert!(env
        .run_sh("mkdir -p t; i=0; while [ $i -lt 10000 ]; do echo $i > t/$i; i=$((i+1)); done")
        .status
        .success());
    let human = env.expect(&["review"], 0);
    assert_eq!(human.lines().filter(|l| l.contains("  added ")).count(), 10001, "no silent truncation");
    env.expect(&["apply", "--all"], 0);
    assert_eq!(fs::read_dir(env.ws.join("t")).unwrap().count(), 10000);
}

#[test]
fn a_host_directory_replaced_by_a_staged_file_is_compared_in_full() {
    let env = Env::new(As::Rootless);
    env.write("d/x/inner", "host data\n");
    env.write("d/other", "o\n");
    // Inside an opaque directory, d/x becomes a file where the host has a directory.
    assert!(env.run_sh("rm -rf d; mkdir d; echo file > d/x").status.success());
    // The user edits something beneath d/x after the run.
    fs::write(env.ws.join("d/x/inner"), "edited after the run\n").unwrap();
    let out = env.expect(&["apply", "d/x"], 1);
    assert!(out.contains("CONFLICT  d/x"), "{out}");
    assert_eq!(fs::read_to_string(env.ws.join("d/x/inner")).unwrap(), "edited after the run\n");
    // Put it back as it was: now the baseline matches and apply replaces it.
    fs::write(env.ws.join("d/x/inner"), "host data\n").unwrap();
    env.expect(&["apply", "d/x"], 0);
    assert_eq!(fs::read_to_string(env.ws.join("d/x")).unwrap(), "file\n");
    assert!(env.ws.join("d/other").exists(), "only the selected path changed");
}

/// Without a JOB, commands act on the most recent Job of the workspace you
/// are in, not the most recent anywhere; paths are relative to the current
/// directory (once, `apply --all --dry-run` offered another
/// directory's Job, and `apply file` failed from a subdirectory).
#[test]
fn commands_act_on_the_workspace_you_are_in_with_paths_relative_to_it() {
    let env = Env::new(As::Rootless);
    env.write("sub/f", "1\n");
    assert!(env.run_sh("echo changed > sub/f; echo new > top").status.success());
    let mine = env.status_json(None)["job"].as_str().unwrap().to_owned();
    // Another workspace, same state directory, run later.
    let other = env.dir.path().join("other");
    fs::create_dir(&other).unwrap();
    env.give_away(&other);
    let out = env
        .command(&["run", "-q", "--", "sh", "-c", "echo x > elsewhere"])
        .current_dir(&other)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let sub = env.ws.join("sub");
    let in_sub = |args: &[&str]| env.command(args).current_dir(&sub).output().unwrap();
    let review = in_sub(&["review", "--json", "."]);
    let stdout = text(&review.stdout);
    assert!(
        stdout.contains("\"sub/f\"") && !stdout.contains("elsewhere") && !stdout.contains("\"top\""),
        "{stdout}"
    );
    assert!(
        text(&review.stderr).contains(&format!("{mine}: the most recent Job of this workspace")),
        "{}",
        text(&review.stderr)
    );
    let dry = in_sub(&["apply", "--all", "--dry-run"]);
    assert!(
        text(&dry.stdout).contains("sub/f") && !text(&dry.stdout).contains("elsewhere"),
        "{}",
        text(&dry.stdout)
    );
    let applied = in_sub(&["apply", "./f", "../top"]);
    assert_eq!(applied.status.code(), Some(0), "{}{}", text(&applied.stdout), text(&applied.stderr));
    assert_eq!(fs::read_to_string(sub.join("f")).unwrap(), "changed\n");
    assert!(env.ws.join("top").exists() && !other.join("elsewhere").exists());
    let outside = in_sub(&["apply", "../../other/elsewhere"]);
    assert_eq!(outside.status.code(), Some(125));
    assert!(text(&outside.stderr).contains("is outside the workspace"), "{}", text(&outside.stderr));
}

/// Apply and drop summarise long listings by directory; -v lists every
/// path, -q none (a `pip install` once listed 1,670 lines).
#[test]
fn long_apply_and_drop_listings_are_summarised() {
    let env = Env::new(As::Rootless);
    let stage = "mkdir -p lib/a; for i in $(seq 60); do echo $i > lib/a/f$i; done; echo r > readme";
    assert!(env.run_sh(stage).status.success());
    let summary = env.expect(&["apply", "--all", "--dry-run"], 0);
    assert!(summary.lines().count() <= 5, "{summary}");
    assert!(summary.contains("62 changes in lib/ (62 added)") && summary.contains("readme"), "{summary}");
    let every = env.expect(&["apply", "--all", "--dry-run", "-v"], 0);
    assert_eq!(every.lines().filter(|l| l.contains("would apply")).count(), 63, "{every}");
    let quiet = env.expect(&["apply", "--all", "-q"], 0);
    assert_eq!(quiet.lines().count(), 1, "only the total: {quiet}");
    assert!(quiet.starts_with("63 change(s) applied"), "{quiet}");
    assert!(env.run_sh("for i in $(seq 60); do echo again > lib/a/f$i; done").status.success());
    let dropped = env.expect(&["drop"], 0);
    assert!(dropped.lines().count() <= 5 && dropped.contains("changes in lib/"), "{dropped}");
}

/// Issue 17: where the stage and the workspace share a filesystem that can
/// reflink (XFS here, loop-mounted), apply reflinks sealed files instead of
/// copying them, and a staged file changed after sealing is still caught: it
/// is never reflinked, and apply refuses its bytes.
#[test]
fn on_a_reflink_filesystem_apply_shares_extents_and_still_catches_tampering() {
    assert!(is_root(), "this test mounts an XFS image (run as root, as scripts/test.sh does)");
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("xfs.img");
    let mount = dir.path().join("xfs");
    fs::create_dir(&mount).unwrap();
    let sh = |script: &str| {
        let out = std::process::Command::new("sh").arg("-c").arg(script).output().unwrap();
        assert!(out.status.success(), "{script}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    sh(&format!(
        "truncate -s 1G {img} && mkfs.xfs -q -m reflink=1 {img} && mount -o loop {img} {mnt}",
        img = image.display(),
        mnt = mount.display()
    ));
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mount.clone());
    let (ws, home) = (mount.join("ws"), mount.join("state"));
    fs::create_dir(&ws).unwrap();
    let pvisor = |args: &[&str]| {
        std::process::Command::new(bin())
            .args(args)
            .current_dir(&ws)
            .env("PVISOR_HOME", &home)
            .output()
            .unwrap()
    };
    let out = pvisor(&[
        "run",
        "--",
        "sh",
        "-c",
        // The sleep: a file changed in the clock tick the seal begins in
        // has a ctime no older than the seal's (`Preimages::sealed_ns`, the
        // coarse clock; the kernel's fine-grained ctimes even run ahead of
        // it), so apply rightly copies and hashes it instead of reflinking.
        // The reflink is what this test is about, so the files are older.
        "head -c 3000000 /dev/urandom > big; echo small > small; echo t > tampered; sleep 0.1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let upper = fs::read_dir(home.join("runs")).unwrap().next().unwrap().unwrap().path().join("stage/upper");
    // Changed after sealing, behind pvisor's back: same size, other bytes.
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::write(upper.join("tampered"), "x\n").unwrap();

    let out = pvisor(&["apply", "big", "small"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(fs::read(ws.join("big")).unwrap(), fs::read(upper.join("big")).unwrap());
    assert_eq!(fs::read_to_string(ws.join("small")).unwrap(), "small\n");
    let extents = sh(&format!("filefrag -v {}", ws.join("big").display()));
    assert!(extents.contains("shared"), "apply copied instead of reflinking:\n{extents}");
    // The workspace file is the user's own inode: writing it leaves the stage alone.
    fs::write(ws.join("big"), "edited\n").unwrap();
    assert_eq!(fs::metadata(upper.join("big")).unwrap().len(), 3_000_000);

    let out = pvisor(&["apply", "tampered"]);
    assert_ne!(out.status.code(), Some(0), "a tampered staged file was applied: {}", text(&out.stdout));
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(said.contains("changed since sealing"), "{said}");
    assert!(!ws.join("tampered").exists(), "tampered bytes reached the workspace");
}
