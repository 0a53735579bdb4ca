//! Run sessions: `run --session NAME` stacks runs; review, apply, drop,
//! status and events take the session as one unit.

use std::collections::BTreeMap;
use std::fs;
use std::process::Stdio;

use crate::support::*;

fn session_changes(env: &Env, name: &str) -> BTreeMap<String, serde_json::Value> {
    let out = env.expect(&["review", "--session", name, "--json"], 0);
    records_of(&out, "change").into_iter().map(|c| (c["path"].as_str().unwrap().to_owned(), c)).collect()
}

fn session_jobs(env: &Env, name: &str) -> Vec<String> {
    let out = env.expect(&["status", "--session", name, "--json"], 0);
    let lines = json_lines(&out);
    let (kind, session) = &lines[0];
    assert_eq!(kind, "session", "the session comes first, then its head's status: {out}");
    session["runs"].as_array().unwrap().iter().map(|r| r["job"].as_str().unwrap().to_owned()).collect()
}

fn run_in(env: &Env, session: &str, script: &str) -> std::process::Output {
    std::thread::sleep(std::time::Duration::from_millis(25));
    env.pvisor(&["run", "--session", session, "--", "sh", "-c", script])
}

fn a_session_stacks_its_runs_and_is_reviewed_applied_and_dropped_as_one(who: As) {
    who.require();
    let env = Env::new(who);
    env.write("base", "base\n");
    let before = snapshot(&env.ws);
    assert!(run_in(&env, "fix", "echo one > a").status.success());
    // The second run sees the first one's staged file.
    let out = run_in(&env, "fix", "cat a; echo two > b; echo more >> base");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "one\n");
    let out = run_in(&env, "fix", "cat a b base; echo edited > a");
    assert_eq!(text(&out.stdout), "one\ntwo\nbase\nmore\n", "{}", text(&out.stderr));
    assert_eq!(snapshot(&env.ws), before, "the workspace is untouched until apply");

    let jobs = session_jobs(&env, "fix");
    assert_eq!(jobs.len(), 3, "each run is its own Job");
    let changes = session_changes(&env, "fix");
    let made_by: BTreeMap<&str, &str> =
        changes.iter().map(|(path, c)| (path.as_str(), c["job"].as_str().unwrap())).collect();
    assert_eq!(
        made_by,
        BTreeMap::from([("a", jobs[2].as_str()), ("b", jobs[1].as_str()), ("base", jobs[1].as_str())]),
        "each change is attributed to the run that made it"
    );
    let text_review = env.expect(&["review", "--session", "fix"], 0);
    assert!(text_review.starts_with("session fix  ·  3 run(s)"), "{text_review}");

    // Apply one path from a subdirectory of the workspace, then drop the rest.
    fs::create_dir(env.ws.join("sub")).unwrap();
    env.give_away(&env.ws);
    let out =
        env.command(&["apply", "--session", "fix", "../a"]).current_dir(env.ws.join("sub")).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(fs::read_to_string(env.ws.join("a")).unwrap(), "edited\n");
    let out = env.expect(&["drop", "--session", "fix"], 0);
    assert!(out.contains("session fix ended (applied, 3 run(s))"), "{out}");
    assert!(!env.ws.join("b").exists());
    assert_eq!(fs::read_to_string(env.ws.join("base")).unwrap(), "base\n");
    // Every run's stage is settled, not left pending.
    for job in &jobs {
        let state = env.status_json(Some(job))["stage_state"].as_str().unwrap().to_owned();
        assert!(state == "applied" || state == "dropped", "{job}: {state}");
    }
    let out = env.pvisor(&["status", "--session", "fix"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("no open session \"fix\""), "{}", text(&out.stderr));

    // The same name starts a new session over the workspace as it is now.
    let out = run_in(&env, "fix", "cat a; test ! -e b && echo no-b");
    assert_eq!(text(&out.stdout), "edited\nno-b\n", "{}", text(&out.stderr));
    assert_eq!(session_jobs(&env, "fix").len(), 1);
}

#[test]
fn a_session_stacks_rootless() {
    a_session_stacks_its_runs_and_is_reviewed_applied_and_dropped_as_one(As::Rootless);
}

#[test]
#[ignore = "needs root"]
fn a_session_stacks_as_root() {
    a_session_stacks_its_runs_and_is_reviewed_applied_and_dropped_as_one(As::Root);
}

/// Conflicts are judged against what the workspace held when the
/// session's first run changed the path, however many runs came after.
#[test]
fn a_session_judges_conflicts_against_its_first_runs_baseline() {
    let env = Env::new(As::Rootless);
    env.write("shared", "v1\n");
    assert!(run_in(&env, "s", "echo sandbox > shared").status.success());
    env.write("shared", "host edit\n");
    assert!(run_in(&env, "s", "echo other > other").status.success());
    let changes = session_changes(&env, "s");
    assert_eq!(changes["shared"]["conflict"], true, "{changes:?}");
    assert_eq!(changes["other"]["conflict"], false);
    let out = env.pvisor(&["apply", "--session", "s", "--all"]);
    assert_eq!(out.status.code(), Some(1), "refused: {}", text(&out.stdout));
    assert_eq!(fs::read_to_string(env.ws.join("shared")).unwrap(), "host edit\n", "the host's edit survives");
}

/// Concurrent runs of one session wait for each other: each sees every
/// earlier run's writes, so a read-modify-write counter counts them all.
#[test]
fn concurrent_runs_of_a_session_are_serialized_not_merged() {
    const TRIALS: usize = 3;
    const RUNS: usize = 4;
    for trial in 0..TRIALS {
        let env = Env::new(As::Rootless);
        let script = "n=$(cat count 2>/dev/null || echo 0); sleep 0.2; echo $((n+1)) > count";
        let children: Vec<_> = (0..RUNS)
            .map(|_| {
                env.command(&["run", "--session", "c", "--", "sh", "-c", script])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "trial {trial}: {}", text(&out.stderr));
        }
        assert_eq!(session_jobs(&env, "c").len(), RUNS, "trial {trial}");
        env.expect(&["apply", "--session", "c", "--all"], 0);
        assert_eq!(fs::read_to_string(env.ws.join("count")).unwrap(), format!("{RUNS}\n"), "trial {trial}");
    }
}

#[test]
fn bad_session_names_and_missing_sessions_get_clear_errors() {
    let env = Env::new(As::Rootless);
    for bad in ["a/b", "../up", "\u{1b}[2Jx", "-x", ""] {
        let out = env.pvisor(&["run", &format!("--session={bad}"), "--", "true"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{bad:?}: {err}");
        assert!(err.contains("session name") && err.contains("--session fix-tests"), "{bad:?}: {err}");
        assert!(!err.contains('\u{1b}'), "no escape reaches the terminal: {err:?}");
    }
    assert!(
        !env.home.join("sessions").exists() || fs::read_dir(env.home.join("sessions")).unwrap().count() == 0
    );
    for cmd in ["review", "apply", "drop", "status", "events"] {
        let out = env.pvisor(&[cmd, "--session", "nope"]);
        assert_eq!(out.status.code(), Some(125), "{cmd}");
        let err = text(&out.stderr);
        assert!(
            err.contains("no open session \"nope\"") && err.contains("pvisor run --session nope"),
            "{cmd}: {err}"
        );
    }
}

/// Two sessions on one workspace, touching disjoint paths in shared
/// directories, apply one after the other without a conflict; a path both
/// created is still one.
#[test]
fn parallel_sessions_on_disjoint_paths_apply_one_after_the_other() {
    let env = Env::new(As::Rootless);
    env.write("shared/keep", "keep\n");
    for (session, name) in [("left", "l"), ("right", "r"), ("left", "l2"), ("right", "r2")] {
        let out = run_in(
            &env,
            session,
            &format!("echo {name} > {name}; echo {name} > shared/{name}; echo {session} > both-{session}"),
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    assert!(run_in(&env, "left", "echo left > clash").status.success());
    assert!(run_in(&env, "right", "echo right > clash").status.success());
    env.expect(&["apply", "--session", "left", "--all"], 0);
    let out = env.pvisor(&["apply", "--session", "right", "--all"]);
    assert_eq!(out.status.code(), Some(1), "the one real overlap conflicts: {}", text(&out.stdout));
    assert!(text(&out.stdout).contains("CONFLICT  clash"), "{}", text(&out.stdout));
    env.expect(&["apply", "--session", "right", "r", "r2", "shared", "both-right"], 0);
    for name in ["l", "r", "l2", "r2"] {
        assert_eq!(fs::read_to_string(env.ws.join(name)).unwrap(), format!("{name}\n"));
        assert_eq!(fs::read_to_string(env.ws.join("shared").join(name)).unwrap(), format!("{name}\n"));
    }
    assert_eq!(fs::read_to_string(env.ws.join("clash")).unwrap(), "left\n", "the first apply stands");
}

/// With `--json`, a session's run says which run it is as a `session` line,
/// and the apply that ends it says so before its `result`, which is last.
#[test]
fn a_session_speaks_json_lines_ending_with_the_result() {
    let env = Env::new(As::Rootless);
    let out = env.pvisor(&["run", "--session", "j", "--json", "--", "sh", "-c", "echo x > x"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = json_lines(&text(&out.stderr));
    assert_eq!(lines[0].0, "session", "{lines:?}");
    assert_eq!(lines[0].1["run"], 1);
    assert_eq!(lines.last().unwrap().0, "result");
    let out = env.pvisor(&["run", "--session", "j", "--json", "--", "true"]);
    let first = json_lines(&text(&out.stderr)).remove(0);
    assert_eq!((first.0.as_str(), &first.1["run"]), ("session", &serde_json::json!(2)));
    assert!(first.1["on_top_of"].is_string(), "{first:?}");
    let out = env.expect(&["apply", "--session", "j", "--all", "--json"], 0);
    let lines = json_lines(&out);
    let kinds: Vec<&str> = lines.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds.last(), Some(&"result"), "{kinds:?}");
    let ended = lines.iter().find(|(k, _)| k == "session").expect("the session's end is said");
    assert_eq!(ended.1["ended"], "applied");
    assert_eq!(ended.1["runs"].as_array().unwrap().len(), 2);
}

/// A session whose workspace was moved is not silently lost: review in the
/// new place says where it was, and a run there warns that it starts anew.
#[test]
fn a_session_whose_workspace_moved_is_named_not_lost() {
    let env = Env::new(As::Rootless);
    assert!(run_in(&env, "s", "echo 1 > one").status.success());
    let job = session_jobs(&env, "s").remove(0);
    let moved = env.dir.path().join("moved");
    fs::rename(&env.ws, &moved).unwrap();
    let out = env.command(&["review", "--session", "s"]).current_dir(&moved).output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("no longer exists"), "{err}");
    let out = env.command(&["run", "--session", "s", "--", "true"]).current_dir(&moved).output().unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("no longer exists") && err.contains(&job), "the stranded runs are named: {err}");
}
