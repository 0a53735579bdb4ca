//! Guest access on the working fakes: execs, signals and file calls, and
//! holding a guest until it answers.

use super::*;

#[test]
fn a_guest_exec_relays_its_scripted_output_and_exit_code() {
    let guest = FakeGuest::new([
        ("echo hello", GuestRun::prints("hello\n", "a warning\n", 3)),
        ("missing-program", GuestRun::fails(libc::ENOENT, "no such file")),
    ]);
    let (f, tokio) = working(vec![Script::runs_until(&[libc::SIGTERM])], guest.clone());
    let run = f.start_live(&tokio);
    let link = f.runtime.execute(OpenGuest { job: run.job().clone(), attempt: None }).unwrap();
    let mut channel = link.exec(exec_spec(2, &["sh", "-c", "echo hello"])).unwrap();
    let got = replies(&mut channel);
    assert!(matches!(got[0].0, Reply::Started { id: 2, .. }), "{got:?}");
    assert_eq!(got[1], (Reply::Stdout { id: 2 }, b"hello\n".to_vec()));
    assert_eq!(got[2], (Reply::Stderr { id: 2 }, b"a warning\n".to_vec()));
    assert_eq!(got[3].0, Reply::Exited { id: 2, code: Some(3), signal: None });
    let mut channel = link.exec(exec_spec(3, &["missing-program"])).unwrap();
    let got = replies(&mut channel);
    assert!(matches!(&got[0].0, Reply::ExecFailed { id: 3, errno, .. } if *errno == libc::ENOENT), "{got:?}");
    assert_eq!(guest.started.lock().unwrap().len(), 2, "both execs reached the guest");
    tokio.block_on(f.cancel(run));
}

#[test]
fn a_running_guest_exec_is_signalled_by_an_agent_call_and_attached_to_again() {
    let guest = FakeGuest::new([("sleep", GuestRun::runs("started\n"))]);
    let (f, tokio) = working(vec![Script::runs_until(&[libc::SIGTERM])], guest);
    let run = f.start_live(&tokio);
    let link = f.runtime.execute(OpenGuest { job: run.job().clone(), attempt: None }).unwrap();
    let mut channel = link.exec(exec_spec(5, &["sleep", "100"])).unwrap();
    assert!(matches!(channel.next_reply().unwrap().unwrap().0, Reply::Started { id: 5, .. }));
    assert_eq!(channel.next_reply().unwrap().unwrap(), (Reply::Stdout { id: 5 }, b"started\n".to_vec()));
    let timeout = Duration::from_secs(5);
    let (status, _) = link.call(&Request::Status { id: 5 }, &[], timeout).unwrap();
    assert_eq!(status, Reply::Status { id: 5, running: true, code: None, signal: None });
    link.call(&Request::Signal { id: 5, signal: libc::SIGTERM }, &[], timeout).unwrap();
    assert_eq!(
        channel.next_reply().unwrap().unwrap().0,
        Reply::Exited { id: 5, code: None, signal: Some(libc::SIGTERM) }
    );
    let (status, _) = link.call(&Request::Status { id: 5 }, &[], timeout).unwrap();
    assert_eq!(status, Reply::Status { id: 5, running: false, code: None, signal: Some(libc::SIGTERM) });
    let mut again = link.attach(5).unwrap();
    assert_eq!(
        again.next_reply().unwrap().unwrap().0,
        Reply::Exited { id: 5, code: None, signal: Some(libc::SIGTERM) }
    );
    tokio.block_on(f.cancel(run));
}

#[test]
fn guest_file_calls_act_beneath_the_root_they_name() {
    let (f, tokio) = working(vec![Script::runs_until(&[libc::SIGTERM])], Arc::default());
    let run = f.start_live(&tokio);
    let link = f.runtime.execute(OpenGuest { job: run.job().clone(), attempt: None }).unwrap();
    let (root, timeout) = (f.workspace.clone(), Duration::from_secs(5));
    let op = |op| Request::FileOp { root: root.clone(), op };
    link.call(&op(FileOp::Mkdir { path: "/data".into(), mode: 0o755 }), &[], timeout).unwrap();
    let write = Request::WriteFile { path: root.join("data/a.txt"), mode: 0o600, append: false };
    link.call(&write, b"one ", timeout).unwrap();
    let append = Request::WriteFile { path: root.join("data/a.txt"), mode: 0o600, append: true };
    link.call(&append, b"two", timeout).unwrap();
    let read = Request::ReadFile { path: root.join("data/a.txt"), offset: 4, len: Some(3) };
    assert_eq!(link.call(&read, &[], timeout).unwrap().1, b"two");
    match link.call(&op(FileOp::Stat { path: "/data/a.txt".into() }), &[], timeout).unwrap().0 {
        Reply::Stat { stat } => assert_eq!((stat.size, stat.mode), (7, 0o600)),
        other => panic!("{other:?}"),
    }
    match link.call(&op(FileOp::List { path: "/".into(), depth: 2 }), &[], timeout).unwrap().0 {
        Reply::Listing { entries, .. } => {
            let names: Vec<_> = entries.iter().map(|e| e.path.display().to_string()).collect();
            assert_eq!(names, ["data", "data/a.txt", "kept.txt"]);
        }
        other => panic!("{other:?}"),
    }
    // `..` stops at the root, as in the guest.
    let escape = op(FileOp::Stat { path: "/../../kept.txt".into() });
    assert!(matches!(link.call(&escape, &[], timeout).unwrap().0, Reply::Stat { .. }));
    link.call(&op(FileOp::Remove { path: "/data".into(), recursive: true }), &[], timeout).unwrap();
    assert!(!f.workspace.join("data").exists());
    tokio.block_on(f.cancel(run));
    // An ended Job's guest is not reachable.
    assert!(matches!(
        link.call(&read, &[], timeout),
        Err(pvisor_sandbox::capabilities::CapabilityError::Unreachable(_))
    ));
}

fn keeper(workspace: &std::path::Path) -> Box<Keeper> {
    Box::new(Keeper {
        workspace: workspace.to_owned(),
        limits: Default::default(),
        labels: Default::default(),
        network: Vec::new(),
        network_namespace: None,
        shared_directories: Vec::new(),
        kill_grace: Duration::from_millis(300),
    })
}

fn ready(root: &std::path::Path) -> Readiness {
    Readiness { root: root.to_owned(), timeout: Duration::from_secs(20), poll: Duration::from_millis(5) }
}

#[test]
fn a_held_guest_answers_when_the_hold_returns_and_a_resumed_hold_is_a_new_attempt() {
    let (f, tokio) = working(Vec::new(), Arc::default());
    f.fake.push(Script::runs_until(&[libc::SIGTERM]));
    f.fake.push(Script::runs_until(&[libc::SIGTERM]));
    let hold = Hold::New { keeper: keeper(&f.workspace), backend: "fake".into() };
    let held = {
        let _inside = tokio.enter();
        f.runtime.execute(HoldGuest { hold, ready: Some(ready(&f.workspace)) }).unwrap()
    };
    let job = held.job().clone();
    let spec = f.fake.journal().started[0].clone();
    assert_eq!((spec.program.as_str(), spec.args[1].as_str()), ("/bin/sh", guest::KEEPER), "the keeper runs");
    let guest = held.guest.clone().expect("the hold waited for the guest");
    let probe = Request::FileOp { root: f.workspace.clone(), op: FileOp::Stat { path: "/kept.txt".into() } };
    assert!(matches!(guest.call(&probe, &[], Duration::from_secs(5)).unwrap().0, Reply::Stat { .. }));
    f.runtime.execute(Suspend { job: job.clone() }).unwrap();
    let resumed = {
        let _inside = tokio.enter();
        f.runtime
            .execute(HoldGuest { hold: Hold::Resume(job.clone()), ready: Some(ready(&f.workspace)) })
            .unwrap()
    };
    assert_eq!(resumed.job(), &job);
    assert_eq!(resumed.guest.as_ref().unwrap().attempt().number(), 2, "the guest of the new Attempt");
    resumed.cancel_handle().cancel(libc::SIGTERM);
    let mut run = resumed.run;
    let end = tokio.block_on(run.wait());
    assert!(end.is_ok(), "{end:?}");
    assert_eq!(f.status(&job).state, JobState::Cancelled);
}

#[test]
fn a_hold_whose_keeper_ends_before_its_guest_answers_fails_naming_the_end() {
    let (f, tokio) = working(vec![Script::exits(1, &[])], Arc::default());
    let hold = Hold::New { keeper: keeper(&f.workspace), backend: "fake".into() };
    let err = {
        let _inside = tokio.enter();
        f.runtime.execute(HoldGuest { hold, ready: Some(ready(&f.workspace)) }).unwrap_err()
    };
    match err {
        RuntimeError::GuestNotReady { why: NotReady::Ended(state), .. } => {
            assert_eq!(state, JobState::Failed)
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_awaited_guest_stops_waiting_when_the_caller_gives_up() {
    let (f, tokio) = working(vec![Script::runs_until(&[libc::SIGTERM])], Arc::default());
    let run = f.start_live(&tokio);
    let wait = AwaitGuest {
        job: run.job().clone(),
        attempt: Some(7),
        ready: ready(&f.workspace),
        give_up: Some(Box::new(|| Some("its supervisor exited".into()))),
    };
    let err = f.runtime.execute(wait).unwrap_err();
    assert!(
        matches!(&err, RuntimeError::GuestNotReady { why: NotReady::GaveUp(w), .. } if w == "its supervisor exited"),
        "{err:?}"
    );
    tokio.block_on(f.cancel(run));
}
