//! Effects (apply and drop of a run's staged changes), workspace
//! checkpoints and gc.

use super::*;

#[test]
fn apply_writes_the_selected_change_and_leaves_the_rest_staged() {
    let f = fixture(vec![Script::exits(0, &[("one.txt", "1\n"), ("two.txt", "2\n")])]);
    let outcome = f.run();
    let mut seen = Vec::new();
    let report = f
        .runtime
        .execute(Apply {
            job: outcome.job.clone(),
            selection: Selection::Patterns(vec!["one.txt".into()]),
            options: ApplyOptions::default(),
            progress: Box::new(|c| seen.push(c.path.display_escaped())),
        })
        .unwrap();
    assert!(report.executed && report.conflicts.is_empty() && report.failed.is_empty(), "{report:?}");
    assert_eq!(seen, vec!["one.txt".to_owned()]);
    assert_eq!(std::fs::read_to_string(f.workspace.join("one.txt")).unwrap(), "1\n");
    assert!(!f.workspace.join("two.txt").exists());
}

#[test]
fn apply_refuses_a_change_the_host_edited_since_the_run() {
    let f = fixture(vec![Script::exits(0, &[("kept.txt", "from the sandbox\n")])]);
    let outcome = f.run();
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(f.workspace.join("kept.txt"), "edited on the host\n").unwrap();
    let report = f
        .runtime
        .execute(Apply {
            job: outcome.job.clone(),
            selection: Selection::Patterns(Vec::new()),
            options: ApplyOptions::default(),
            progress: Box::new(|_| {}),
        })
        .unwrap();
    assert!(!report.executed, "a conflict refuses the apply");
    assert_eq!(report.conflicts.len(), 1, "{report:?}");
    assert_eq!(std::fs::read_to_string(f.workspace.join("kept.txt")).unwrap(), "edited on the host\n");
}

#[test]
fn a_dry_run_apply_plans_but_writes_nothing() {
    let f = fixture(vec![Script::exits(0, &[("new.txt", "x")])]);
    let outcome = f.run();
    let options = ApplyOptions { dry_run: true, ..Default::default() };
    let report = f
        .runtime
        .execute(Apply {
            job: outcome.job,
            selection: Selection::Patterns(Vec::new()),
            options,
            progress: Box::new(|_| {}),
        })
        .unwrap();
    assert!(!report.executed);
    assert_eq!(report.plan.len(), 1);
    assert!(!f.workspace.join("new.txt").exists());
}

#[test]
fn drop_discards_what_is_left_and_never_undoes_an_apply() {
    let f = fixture(vec![Script::exits(0, &[("one.txt", "1"), ("two.txt", "2")])]);
    let outcome = f.run();
    let applied = f
        .runtime
        .execute(Apply {
            job: outcome.job.clone(),
            selection: Selection::Patterns(vec!["one.txt".into()]),
            options: ApplyOptions::default(),
            progress: Box::new(|_| {}),
        })
        .unwrap();
    assert!(applied.executed && applied.conflicts.is_empty() && applied.failed.is_empty(), "{applied:?}");
    let report = f.runtime.execute(DropChanges { job: outcome.job.clone(), patterns: Vec::new() }).unwrap();
    assert_eq!(report.dropped.iter().map(|c| c.path.display_escaped()).collect::<Vec<_>>(), vec!["two.txt"]);
    assert_eq!(report.already_applied, 1);
    assert!(f.workspace.join("one.txt").exists(), "the applied change stays");
    assert!(!f.workspace.join("two.txt").exists());
}

#[test]
fn effects_of_a_job_that_does_not_exist_name_it() {
    let f = fixture(vec![]);
    let missing: JobId = "j-000000000000".parse().unwrap_or_else(|_| JobId::generate());
    let err = f.runtime.execute(DropChanges { job: missing.clone(), patterns: Vec::new() }).unwrap_err();
    assert!(err.to_string().contains(&missing.to_string()) || err.to_string().contains("job"), "{err}");
}

#[test]
fn a_workspace_checkpoint_forks_a_job_that_sees_the_parents_files() {
    let f = fixture(vec![Script::exits(0, &[("from-parent.txt", "p")]), Script::exits(0, &[])]);
    let parent = f.run();
    let (manifest, _hold) = f.runtime.execute(CheckpointWorkspace { job: parent.job.clone() }).unwrap();
    let mut fork = request(&f.workspace);
    fork.fork = Some(manifest.id.clone());
    let child = f.run_request(fork);
    let journal = f.fake.journal();
    let child_upper = &journal.started[1].upper;
    assert!(child_upper.join("from-parent.txt").exists(), "the fork starts from the parent's stage");
    drop(journal);
    let status = f.status(&child.job);
    assert!(status.lineage.is_some(), "the fork records its parent");
}

#[test]
fn a_running_job_cannot_be_checkpointed_as_a_workspace() {
    let f = fixture(vec![Script::runs_until(&[libc::SIGTERM])]);
    block_on(async {
        let run = f.start();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let err = f.runtime.execute(CheckpointWorkspace { job: run.job().clone() }).unwrap_err();
        assert!(err.to_string().contains("running") || err.to_string().contains("confirmed"), "{err}");
        f.cancel(run).await;
    });
}

#[test]
fn gc_frees_a_dropped_stage_and_a_dry_run_frees_nothing() {
    let f = fixture(vec![Script::exits(0, &[("big.bin", "0123456789")])]);
    let outcome = f.run();
    f.runtime.execute(DropChanges { job: outcome.job.clone(), patterns: Vec::new() }).unwrap();
    let stage = f.status(&outcome.job).stage.join("upper");
    let dry = f.runtime.execute(Gc { age: Duration::ZERO, dry_run: true, force: true }).unwrap();
    assert!(!dry.freed.is_empty(), "{dry:?}");
    assert!(stage.exists(), "a dry run removes nothing");
    let report = f.runtime.execute(Gc { age: Duration::ZERO, dry_run: false, force: true }).unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    assert!(!stage.exists(), "{report:?}");
}
