//! A stage `gc --force` removed is called collected everywhere, and the read
//! commands answer from a state directory nobody may write.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use crate::support::*;

fn set_writable(path: &std::path::Path, writable: bool) {
    for entry in walk(path) {
        let meta = fs::symlink_metadata(&entry).unwrap();
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode();
        let mode = if writable { mode | 0o200 } else { mode & !0o222 };
        fs::set_permissions(&entry, fs::Permissions::from_mode(mode)).unwrap();
    }
}

fn walk(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![root.to_owned()];
    let mut i = 0;
    while i < out.len() {
        if out[i].is_dir() && !out[i].is_symlink() {
            let children: Vec<_> = fs::read_dir(&out[i]).unwrap().map(|e| e.unwrap().path()).collect();
            out.extend(children);
        }
        i += 1;
    }
    out
}

fn collected_stage_is_never_called_pending(who: As) {
    who.require();
    let env = Env::new(who);
    env.expect(&["run", "-q", "--", "sh", "-c", "echo x > staged"], 0);
    let job = only_job(&env);
    env.expect(&["gc", "--older-than", "0s", "--force"], 0);
    assert_eq!(env.status_json(Some(&job))["stage_state"].as_str(), Some("collected"));
    let jobs = env.expect(&["jobs"], 0);
    assert!(!jobs.contains("pending"), "{jobs}");
    let review = env.expect(&["review", &job], 0);
    assert!(review.contains("stage collected") && review.contains("staged"), "{review}");
    let verify = env.expect(&["verify", &job], 0);
    assert!(!verify.contains("No such file"), "{verify}");
    // Apply has nothing to work from, and says so.
    let out = env.pvisor(&["apply", &job, "--yes"]);
    assert!(!out.status.success() && !env.ws.join("staged").exists(), "{}", text(&out.stderr));
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn a_collected_stage_is_never_called_pending_as_root() {
    collected_stage_is_never_called_pending(As::Root);
}

#[test]
fn a_collected_stage_is_never_called_pending_rootless() {
    collected_stage_is_never_called_pending(As::Rootless);
}

#[test]
fn review_status_and_jobs_answer_from_a_read_only_state_directory() {
    let env = Env::new(As::Rootless);
    env.expect(&["run", "-q", "--", "sh", "-c", "echo x > staged"], 0);
    let job = only_job(&env);
    set_writable(&env.home, false);
    let review = env.expect(&["review", &job], 0);
    let status = env.pvisor(&["status", &job]);
    let jobs = env.pvisor(&["jobs"]);
    set_writable(&env.home, true);
    assert!(review.contains("staged"), "{review}");
    assert!(status.status.success() && jobs.status.success(), "{status:?} {jobs:?}");
}
