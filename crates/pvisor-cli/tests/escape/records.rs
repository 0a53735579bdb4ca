//! Records a command cannot break: a staged tree of any depth, a full
//! filesystem and a flood of events still leave the Job its exit code, a
//! valid receipt, and a stage that can be reviewed, dropped and collected.

use super::*;

/// A command builds a chain of `depth` directories (a file at the bottom,
/// a path far past PATH_MAX), says it did, and exits 7.
fn a_deep_tree_keeps_the_exit_code_and_the_stage_stays_removable(who: As, depth: usize) {
    if !who.available() {
        return;
    }
    let env = Env::new(who);
    env.write(
        "deep.py",
        &format!(
            "import os, sys\nfor i in range({depth}):\n    os.mkdir('d'); os.chdir('d')\nopen('f', 'w').write('x')\nprint('BUILT', i + 1)\nsys.stdout.flush()\nos._exit(7)\n"
        ),
    );
    let out = env.pvisor(&["run", "--", "/usr/bin/python3", "deep.py"]);
    assert!(text(&out.stdout).contains(&format!("BUILT {depth}")), "the probe ran: {}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    // What lies past PATH_MAX is not in the records, and the run says so.
    assert!(text(&out.stderr).contains("longer than 4096 bytes"), "{}", text(&out.stderr));
    let status = env.status_json(None);
    let job = status["job"].as_str().unwrap().to_owned();
    assert_eq!(
        (status["state"].as_str(), status["exit_code"].as_i64(), status["receipt"].as_str()),
        (Some("failed"), Some(7), Some("valid")),
        "{status}"
    );
    env.expect(&["verify", &job], 0);
    // Review lists what fits in the records.
    let review = env.pvisor(&["review", &job]);
    assert!(review.status.success(), "{}", text(&review.stderr));
    assert!(text(&review.stdout).contains(" dir  d/d/d/d/d"), "review lists the stage");
    env.expect(&["drop", &job], 0);
    assert_eq!(
        env.status_json(Some(&job))["stage_state"].as_str(),
        Some("dropped"),
        "{}",
        env.status_json(Some(&job))
    );
    env.expect(&["gc", "--older-than", "0s"], 0);
    let stage = env.home.join("runs").join(status["run"].as_str().unwrap()).join("stage/upper");
    assert!(!stage.exists(), "gc removed the whole stage, however deep");
}

#[test]
fn a_2500_level_tree_keeps_the_exit_code_as_root() {
    a_deep_tree_keeps_the_exit_code_and_the_stage_stays_removable(As::Root, 2_500);
}

#[test]
fn a_2500_level_tree_keeps_the_exit_code_rootless() {
    a_deep_tree_keeps_the_exit_code_and_the_stage_stays_removable(As::Rootless, 2_500);
}

#[test]
fn a_12000_level_tree_keeps_the_exit_code_as_root() {
    a_deep_tree_keeps_the_exit_code_and_the_stage_stays_removable(As::Root, 12_000);
}

#[test]
fn a_12000_level_tree_keeps_the_exit_code_rootless() {
    a_deep_tree_keeps_the_exit_code_and_the_stage_stays_removable(As::Rootless, 12_000);
}
