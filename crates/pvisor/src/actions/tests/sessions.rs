//! Run sessions on the fake backend: runs stack as forks of the head, each
//! change is attributed to its run, a session ends when its head has
//! nothing left, and a run that never started is stepped over.

use super::*;
use crate::run_sessions::SessionError;

impl Fixture {
    /// Runs one Job in session `name`, as `run --session` does.
    fn run_in_session(&self, name: &str) -> (RunOutcome, usize) {
        let mut turn = self
            .runtime
            .execute(BeginSessionRun {
                workspace: self.workspace.clone(),
                name: name.into(),
                waiting: Box::new(|| {}),
            })
            .unwrap();
        let mut request = request(&self.workspace);
        request.fork = turn.fork.as_ref().map(|(id, _)| id.clone());
        let outcome = block_on(async {
            let mut run = self.runtime.execute(Run { request, executor: self.executor() }).unwrap();
            turn.admitted(run.job()).unwrap();
            match run.wait().await.unwrap() {
                RunEnd::Finished(outcome) => outcome,
                RunEnd::Suspended(s) => panic!("suspended: {s:?}"),
            }
        });
        (outcome, turn.record.jobs.len())
    }

    fn session(&self, name: &str) -> Result<SessionView, RuntimeError> {
        self.runtime.execute(ReadSession { workspace: self.workspace.clone(), name: name.into() })
    }
}

fn attributed(view: &SessionView) -> Vec<(String, JobId)> {
    view.remaining().into_iter().map(|a| (a.change.path.display_escaped(), a.job.clone())).collect()
}

#[test]
fn a_sessions_runs_stack_and_each_change_names_its_run() {
    let f = fixture(vec![
        Script::exits(0, &[("a", "1\n")]),
        Script::exits(0, &[("b", "2\n")]),
        Script::exits(0, &[("a", "edited\n")]),
    ]);
    let (first, _) = f.run_in_session("s");
    let (second, _) = f.run_in_session("s");
    let (third, runs) = f.run_in_session("s");
    assert_eq!(runs, 3);
    assert!(f.job_record(&second.job).lineage.is_some(), "the second run forks the first");
    let view = f.session("s").unwrap();
    assert_eq!(view.record.jobs, vec![first.job.clone(), second.job.clone(), third.job.clone()]);
    assert_eq!(attributed(&view), vec![("a".into(), third.job.clone()), ("b".into(), second.job.clone())]);
}

#[test]
fn a_session_ends_when_its_head_has_nothing_left_and_the_name_starts_anew() {
    let f = fixture(vec![
        Script::exits(0, &[("a", "1\n")]),
        Script::exits(0, &[("b", "2\n")]),
        Script::exits(0, &[]),
    ]);
    let (first, _) = f.run_in_session("s");
    let (second, _) = f.run_in_session("s");
    let close = || {
        f.runtime.execute(CloseSessionIfDone { workspace: f.workspace.clone(), name: "s".into() }).unwrap()
    };
    assert!(close().is_none(), "nothing applied yet: the session stays open");
    f.runtime.execute(DropChanges { job: second.job.clone(), patterns: Vec::new() }).unwrap();
    let closed = close().expect("the head has nothing left");
    assert_eq!(closed.closed.unwrap().how, "dropped");
    // The first run's stage, which the head superseded, is settled too.
    assert_eq!(f.status(&first.job).stage_state, Some(crate::records::StageState::Dropped));
    assert!(matches!(f.session("s"), Err(RuntimeError::Session(SessionError::NotFound { .. }))));
    let (_, runs) = f.run_in_session("s");
    assert_eq!(runs, 1, "the name starts a new session");
}

#[test]
fn a_run_that_never_started_is_stepped_over() {
    let setup_fails = Script {
        end: crate::testing::End::SetupFails { step: "mounts".into(), message: "boom".into(), hint: None },
        ..Script::exits(0, &[])
    };
    let f = fixture(vec![Script::exits(0, &[("a", "1\n")]), setup_fails, Script::exits(0, &[("b", "2\n")])]);
    let (first, _) = f.run_in_session("s");
    let (failed, _) = f.run_in_session("s");
    assert!(failed.result.exit_code.is_none() && failed.result.error.is_some(), "{:?}", failed.result);
    let (third, runs) = f.run_in_session("s");
    assert_eq!(runs, 3);
    assert_eq!(
        f.job_record(&third.job).lineage.unwrap().parent_job,
        first.job,
        "it stacks on the run before"
    );
    let paths: Vec<String> = attributed(&f.session("s").unwrap()).into_iter().map(|(p, _)| p).collect();
    assert_eq!(paths, vec!["a".to_owned(), "b".to_owned()]);
}

#[test]
fn bad_names_are_refused_before_anything_is_recorded() {
    let f = fixture(Vec::new());
    for bad in ["a/b", "", "..", "\u{7}bell"] {
        let err = f
            .runtime
            .execute(BeginSessionRun {
                workspace: f.workspace.clone(),
                name: bad.into(),
                waiting: Box::new(|| {}),
            })
            .unwrap_err();
        assert!(matches!(err, RuntimeError::Session(SessionError::Name(_))), "{bad:?}: {err}");
    }
    assert!(!f.store().root().join("sessions").exists());
}
