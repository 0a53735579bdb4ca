//! Jobs run side by side on one workspace, each applied as soon as it
//! finishes, as parallel agents do: paths no two Jobs touch never conflict,
//! however many entries the others' applies add to a directory they share,
//! and a path two Jobs both create still does.

use std::collections::BTreeMap;
use std::fs;
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::support::*;

/// Jobs started at once in each trial.
const JOBS: usize = 6;
/// Parallel trials in one test, each on the workspace the last one left.
const TRIALS: usize = 5;

/// What Job `job` of trial `trial` writes: names no other Job uses, in the
/// workspace root, in a directory the workspace had before the trials, and
/// in one every Job creates. Half come after a pause that grows with the
/// Job's number, so they are written while earlier Jobs' applies add their
/// own files beside them.
fn script(trial: usize, job: usize) -> String {
    let name = format!("t{trial}-j{job}");
    format!(
        "printf %s \"$PVISOR_JOB\"; \
         echo {name} > {name}-a; echo {name} > shared/{name}-a; \
         sleep 0.{pause}; \
         mkdir -p made; echo {name} > made/{name}; echo {name} > {name}-b; echo {name} > shared/{name}-b",
        pause = 15 + 20 * job,
    )
}

/// The paths [`script`] writes.
fn written(trial: usize, job: usize) -> [String; 5] {
    let name = format!("t{trial}-j{job}");
    [
        format!("{name}-a"),
        format!("shared/{name}-a"),
        format!("made/{name}"),
        format!("{name}-b"),
        format!("shared/{name}-b"),
    ]
}

fn start(env: &Env, script: &str) -> Child {
    env.command(&["run", "-q", "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for a run to end; returns its Job (the command prints `$PVISOR_JOB`).
fn job_of(child: Child) -> String {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "run failed: {}", text(&out.stderr));
    let job = text(&out.stdout);
    assert!(!job.is_empty(), "no Job printed: {}", text(&out.stderr));
    job
}

/// What a trial did.
#[derive(Default)]
struct Applies {
    /// Applies that succeeded.
    done: usize,
    /// Of them, those made while another Job of the trial still ran.
    beside_live_runs: usize,
}

/// Starts [`JOBS`] runs at once and applies each as it finishes, while the
/// others still run.
fn trial(env: &Env, trial: usize) -> Applies {
    let mut running: BTreeMap<usize, Child> = (0..JOBS).map(|j| (j, start(env, &script(trial, j)))).collect();
    let mut applies = Applies::default();
    while !running.is_empty() {
        let done: Vec<usize> =
            running.iter_mut().filter_map(|(&j, child)| child.try_wait().unwrap().map(|_| j)).collect();
        for j in done {
            let job = job_of(running.remove(&j).unwrap());
            let out = env.pvisor(&["apply", &job, "--all"]);
            assert_eq!(
                out.status.code(),
                Some(0),
                "trial {trial}, Job {j} ({job}), {} still running:\n{}{}",
                running.len(),
                text(&out.stdout),
                text(&out.stderr)
            );
            applies.done += 1;
            applies.beside_live_runs += usize::from(!running.is_empty());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for j in 0..JOBS {
        for path in written(trial, j) {
            let landed = fs::read_to_string(env.ws.join(&path)).unwrap_or_else(|e| panic!("{path}: {e}"));
            assert_eq!(landed, format!("t{trial}-j{j}\n"), "{path}");
        }
    }
    applies
}

/// Two Jobs create the same new path: the second apply is refused with
/// exactly that one conflict, and writes nothing.
fn same_new_path_conflicts(env: &Env) {
    let both: Vec<Child> = ["first", "second"]
        .iter()
        .map(|who| {
            start(env, &format!("printf %s \"$PVISOR_JOB\"; echo {who} > clash; echo {who} > only-{who}"))
        })
        .collect();
    let jobs: Vec<String> = both.into_iter().map(job_of).collect();
    env.expect(&["apply", &jobs[0], "--all"], 0);
    let refused = env.expect(&["apply", &jobs[1], "--all"], 1);
    let conflicts: Vec<&str> = refused.lines().filter(|l| l.trim_start().starts_with("CONFLICT")).collect();
    assert_eq!(conflicts.len(), 1, "{refused}");
    assert!(conflicts[0].contains("CONFLICT  clash: "), "{refused}");
    assert_eq!(fs::read_to_string(env.ws.join("clash")).unwrap(), "first\n");
    assert!(!env.ws.join("only-second").exists(), "a refused apply wrote a file");
}

fn parallel_jobs_on_disjoint_paths_never_conflict(who: As) {
    who.require();
    let env = Env::new(who);
    env.write("shared/kept", "kept\n");
    let (mut applies, mut beside) = (0, 0);
    for t in 0..TRIALS {
        let done = trial(&env, t);
        (applies, beside) = (applies + done.done, beside + done.beside_live_runs);
    }
    assert_eq!(applies, TRIALS * JOBS);
    // What the test is about: applies landing while other runs still write.
    assert!(beside > 0, "no apply was made while another Job ran");
    eprintln!(
        "{TRIALS} trials of {JOBS} parallel Jobs: {applies} applies ({beside} while others ran), none refused"
    );
    same_new_path_conflicts(&env);
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn parallel_jobs_on_disjoint_paths_never_conflict_as_root() {
    parallel_jobs_on_disjoint_paths_never_conflict(As::Root);
}

#[test]
fn parallel_jobs_on_disjoint_paths_never_conflict_rootless() {
    parallel_jobs_on_disjoint_paths_never_conflict(As::Rootless);
}
