//! Choosing what to apply as a person does: `apply -i` change by change,
//! `apply -p` hunk by hunk (keys from a pipe or a terminal), with the
//! conflict baseline, a killed hunk write, and a fork of what remains.

use super::*;

/// `apply -i` keeps every answer: a path in conflict is applied only if its
/// overwrite is confirmed on its own, so declining it never loses the other
/// answers; `d` drops, `q` applies nothing. Answers come one per line from
/// a pipe (once, a `y` on a conflict refused everything).
#[test]
fn interactive_apply_keeps_every_answer() {
    let env = Env::new(As::Rootless);
    env.write("c", "orig\n");
    assert!(env
        .run_sh("echo agent > c; echo one > one; echo three > three; echo two > two")
        .status
        .success());
    fs::write(env.ws.join("c"), "host edit\n").unwrap();
    let answer = |keys: &str, extra: &[&str]| {
        let mut args = vec!["apply", "-i", "--color", "never"];
        args.extend_from_slice(extra);
        let mut child = env.command(&args).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(keys.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    };
    // q: nothing applied, nothing dropped.
    let quit = answer("y\nq\n", &[]);
    assert!(quit.status.success(), "{}", text(&quit.stderr));
    assert_eq!(fs::read_to_string(env.ws.join("c")).unwrap(), "host edit\n");
    assert!(!env.ws.join("one").exists());
    // c: y then decline the overwrite; one: n; three: d; two: y.
    let out = answer("y\nn\nn\nd\ny\n", &[]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(fs::read_to_string(env.ws.join("c")).unwrap(), "host edit\n", "declined overwrite");
    assert!(env.ws.join("two").exists() && !env.ws.join("one").exists() && !env.ws.join("three").exists());
    let state = |path: &str| {
        let review = env.review();
        let c = review.iter().find(|c| c["path"] == path).unwrap().clone();
        (c["applied"].as_bool().unwrap(), c["dropped"].as_bool().unwrap())
    };
    assert_eq!(state("three"), (false, true));
    assert_eq!(state("one"), (false, false));
    // Confirming the overwrite applies it, forced, alone.
    let forced = answer("y\ny\ns\n", &[]);
    assert_eq!(forced.status.code(), Some(0), "{}", text(&forced.stdout));
    assert_eq!(fs::read_to_string(env.ws.join("c")).unwrap(), "agent\n");
    assert!(text(&forced.stdout).contains("forced over a conflict"), "{}", text(&forced.stdout));
    assert!(!env.ws.join("one").exists(), "s skipped the rest");
}

/// On a terminal, `apply -i` takes single keys: no Enter.
#[test]
fn interactive_apply_takes_single_keys_on_a_terminal() {
    let env = Env::new(As::Rootless);
    assert!(env.run_sh("echo 1 > m1; echo 2 > m2").status.success());
    let inner = format!(
        "printf 'ny' | script -qec 'PVISOR_HOME={} {} apply -i --color never' /dev/null",
        env.home.display(),
        bin()
    );
    let out = std::process::Command::new("sh").args(["-c", &inner]).current_dir(&env.ws).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!env.ws.join("m1").exists() && env.ws.join("m2").exists(), "{}", text(&out.stdout));
}

/// A file of 30 numbered lines, and the agent's edit of lines 2, 15 and 28:
/// three hunks far enough apart that each is its own.
fn three_hunk_file(env: &Env) -> (String, String) {
    let host: String = (1..=30).map(|i| format!("line {i}\n")).collect();
    env.write("notes.txt", &host);
    assert!(env
        .run_sh("sed -i -e 's/^line 2$/LINE TWO/' -e 's/^line 15$/LINE FIFTEEN/' -e 's/^line 28$/LINE 28/' notes.txt")
        .status
        .success());
    let staged = host
        .replace("line 2\n", "LINE TWO\n")
        .replace("line 15\n", "LINE FIFTEEN\n")
        .replace("line 28\n", "LINE 28\n");
    (host, staged)
}

fn answer_hunks(env: &Env, keys: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["apply", "-p", "--color", "never"];
    args.extend_from_slice(extra);
    let mut child = env
        .command(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(keys.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// Issue 17: `apply -p` takes hunks one by one; the rest stays staged, is
/// offered again, and the path's baseline is what was written.
#[test]
fn hunks_apply_one_by_one_and_the_rest_stays_staged() {
    let env = Env::new(As::Rootless);
    let (host, staged) = three_hunk_file(&env);
    // y n y: the first and last hunks land, the middle one stays staged.
    let out = answer_hunks(&env, "y\nn\ny\n", &[]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let shown = text(&out.stdout);
    assert_eq!(shown.matches("Apply this hunk").count(), 3, "{shown}");
    assert!(shown.contains("hunks      2 of 3"), "{shown}");
    let now = fs::read_to_string(env.ws.join("notes.txt")).unwrap();
    assert_eq!(now, host.replace("line 2\n", "LINE TWO\n").replace("line 28\n", "LINE 28\n"));
    let review = env.review();
    let c = change(&review, "notes.txt");
    assert_eq!((c["applied"].as_bool(), c["partly_applied"].as_bool()), (Some(false), Some(true)), "{c}");
    assert_eq!(c["conflict"], false, "what pvisor wrote is the new baseline, not a conflict: {c}");
    // review --diff shows only what remains.
    let diff = env.expect(&["review", "--diff", "--color", "never"], 0);
    assert!(diff.contains("+LINE FIFTEEN") && !diff.contains("+LINE TWO"), "{diff}");
    // The remaining hunk is offered again, alone; taking it completes the file.
    let out = answer_hunks(&env, "y\n", &[]);
    assert_eq!(text(&out.stdout).matches("Apply this hunk").count(), 1, "{}", text(&out.stdout));
    assert_eq!(fs::read_to_string(env.ws.join("notes.txt")).unwrap(), staged);
    let review = env.review();
    assert_eq!(change(&review, "notes.txt")["applied"], true);
}

/// A host edit after some hunks were applied is a conflict (the baseline is
/// what pvisor wrote), and a file in conflict offers no hunks at all.
#[test]
fn hunks_respect_the_conflict_baseline() {
    let env = Env::new(As::Rootless);
    let (_, _) = three_hunk_file(&env);
    let out = answer_hunks(&env, "y\nd\n", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let after_hunk = fs::read_to_string(env.ws.join("notes.txt")).unwrap();
    fs::write(env.ws.join("notes.txt"), format!("{after_hunk}host edit\n")).unwrap();
    let out = answer_hunks(&env, "y\ny\ny\n", &[]);
    let shown = text(&out.stdout);
    assert!(!shown.contains("Apply this hunk"), "a conflicting file offered hunks: {shown}");
    assert!(shown.contains("not offered") && shown.contains("conflict"), "{shown}");
    assert_eq!(fs::read_to_string(env.ws.join("notes.txt")).unwrap(), format!("{after_hunk}host edit\n"));
    let refused = env.pvisor(&["apply", "notes.txt"]);
    assert_eq!(refused.status.code(), Some(1), "a host edit after a hunk write is a conflict");
}

/// Killed after the hunk write but before its outcome line: the next command
/// settles it by content as partly applied, not as an unknown state.
#[test]
fn a_hunk_write_killed_before_its_outcome_is_settled_by_content() {
    let env = Env::new(As::Rootless);
    let (_, staged) = three_hunk_file(&env);
    let mut child = env
        .command(&["apply", "-p", "--color", "never"])
        .env("PVISOR_FAILPOINT", "hunks-before-outcome")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"n\ny\nn\n").unwrap();
    let killed = child.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&killed), Some(libc::SIGKILL));
    let review = env.review();
    let c = change(&review, "notes.txt");
    assert_eq!((c["partly_applied"].as_bool(), c["conflict"].as_bool()), (Some(true), Some(false)), "{c}");
    env.expect(&["apply", "notes.txt"], 0);
    assert_eq!(fs::read_to_string(env.ws.join("notes.txt")).unwrap(), staged);
}

/// A fork of a partly applied Job starts from what remains, with the new
/// baseline: its apply --all finishes the file without a false conflict.
#[test]
fn a_fork_of_a_partly_applied_job_carries_the_remaining_hunks() {
    let env = Env::new(As::Rootless);
    let (_, staged) = three_hunk_file(&env);
    let out = answer_hunks(&env, "y\nn\nn\n", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let parent = only_job(&env);
    let out = env.pvisor(&["fork", &parent, "--", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let jobs = env.expect(&["jobs", "--json"], 0);
    let fork = records_of(&jobs, "job").into_iter().find(|j| j["job"] != parent.as_str()).unwrap()["job"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = env.pvisor(&["apply", &fork, "--all"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(fs::read_to_string(env.ws.join("notes.txt")).unwrap(), staged);
}
