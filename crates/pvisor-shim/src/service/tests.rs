//! The Task service over the runtime's fakes: each container's VM is a
//! fake keeper Job with a scripted guest, so create, start, exec, kill,
//! pause, resume, checkpoint and delete run as containerd drives them,
//! without a VM, KVM or root. Assertions are on what containerd would see
//! (states, exit statuses, output files) and on the Job's records.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::Task;
use pvisor::actions::guest::Request;
use pvisor::actions::Status as JobStatusOf;
use pvisor::testing::{FakeGuest, FakeVmBackends, GuestRun, Script};
use pvisor_core::ids::JobId;
use pvisor_core::state::JobState;
use pvisor_core::store::Store;

use super::*;

const SIGTERM: u32 = 15;

struct Shim {
    dir: tempfile::TempDir,
    service: Service,
    runtime: Runtime,
    guest: Arc<FakeGuest>,
}

fn shim(rules: &[(&'static str, GuestRun)]) -> Shim {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("state")).unwrap();
    let guest = FakeGuest::new(rules.iter().cloned());
    let backends = FakeVmBackends::working(Script::runs_until(&[libc::SIGTERM]), guest.clone());
    let runtime = Runtime::new(store, Arc::new(backends));
    let service = Service::with_runtime("test", runtime.clone()).unwrap();
    Shim { dir, service, runtime, guest }
}

fn ctx() -> TtrpcContext {
    let (res_tx, _) = std::sync::mpsc::channel();
    TtrpcContext {
        fd: -1,
        cancel_rx: crossbeam_channel::never(),
        mh: Default::default(),
        res_tx,
        metadata: Default::default(),
        timeout_nano: 0,
    }
}

impl Shim {
    /// A bundle whose init process is `args`, with a rootfs in place.
    fn bundle(&self, id: &str, args: &[&str]) -> PathBuf {
        let bundle = self.dir.path().join(id);
        std::fs::create_dir_all(bundle.join("rootfs/etc")).unwrap();
        std::fs::write(bundle.join("rootfs/etc/hostname"), "box\n").unwrap();
        let config = serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"args": args, "env": ["PATH=/bin"], "cwd": "/", "user": {"uid": 0, "gid": 0}},
            "root": {"path": "rootfs"}
        });
        std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();
        bundle
    }

    fn stdout(&self, id: &str) -> PathBuf {
        self.dir.path().join(format!("{id}.out"))
    }

    fn create(&self, id: &str, args: &[&str]) -> TtrpcResult<api::CreateTaskResponse> {
        let bundle = self.bundle(id, args);
        let request = api::CreateTaskRequest {
            id: id.into(),
            bundle: bundle.display().to_string(),
            stdout: self.stdout(id).display().to_string(),
            ..Default::default()
        };
        self.service.create(&ctx(), request)
    }

    fn start(&self, id: &str, exec_id: &str) -> TtrpcResult<api::StartResponse> {
        self.service
            .start(&ctx(), api::StartRequest { id: id.into(), exec_id: exec_id.into(), ..Default::default() })
    }

    fn state(&self, id: &str, exec_id: &str) -> api::StateResponse {
        let request = api::StateRequest { id: id.into(), exec_id: exec_id.into(), ..Default::default() };
        self.service.state(&ctx(), request).unwrap()
    }

    fn status(&self, id: &str) -> api::Status {
        self.state(id, "").status.enum_value().unwrap()
    }

    fn wait(&self, id: &str, exec_id: &str) -> u32 {
        let request = api::WaitRequest { id: id.into(), exec_id: exec_id.into(), ..Default::default() };
        self.service.wait(&ctx(), request).unwrap().exit_status
    }

    fn kill(&self, id: &str, signal: u32) -> TtrpcResult<api::Empty> {
        self.service.kill(&ctx(), api::KillRequest { id: id.into(), signal, ..Default::default() })
    }

    fn delete(&self, id: &str, exec_id: &str) -> TtrpcResult<api::DeleteResponse> {
        let request = api::DeleteRequest { id: id.into(), exec_id: exec_id.into(), ..Default::default() };
        self.service.delete(&ctx(), request)
    }

    fn exec(&self, id: &str, exec_id: &str, args: &[&str]) -> TtrpcResult<api::Empty> {
        let process =
            serde_json::json!({"args": args, "env": ["PATH=/bin"], "cwd": "/", "user": {"uid": 0, "gid": 0}});
        let spec = Any {
            type_url: "types.containerd.io/opencontainers/runtime-spec/1/Process".into(),
            value: process.to_string().into_bytes(),
            ..Default::default()
        };
        let request = api::ExecProcessRequest {
            id: id.into(),
            exec_id: exec_id.into(),
            stdout: self.stdout(exec_id).display().to_string(),
            spec: MessageField::some(spec),
            ..Default::default()
        };
        self.service.exec(&ctx(), request)
    }

    /// The Job of container `id`, as its bundle names it.
    fn job(&self, id: &str) -> JobId {
        let named = std::fs::read_to_string(self.dir.path().join(id).join(container::JOB_FILE)).unwrap();
        named.trim().parse().unwrap()
    }

    fn job_state(&self, job: &JobId) -> JobState {
        self.runtime.execute(JobStatusOf { job: job.clone() }).unwrap().state
    }

    /// Waits until `job` is in `state`.
    fn await_job(&self, job: &JobId, state: JobState) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.job_state(job) != state {
            assert!(Instant::now() < deadline, "{job} is {}, not {state}", self.job_state(job));
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn output(&self, name: &str) -> String {
        std::fs::read_to_string(self.stdout(name)).unwrap_or_default()
    }

    /// Waits until the output file of `name` holds `text`.
    fn await_output(&self, name: &str, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.output(name).contains(text) {
            assert!(Instant::now() < deadline, "{name} wrote {:?}", self.output(name));
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn code(e: ttrpc::Error) -> Code {
    match e {
        ttrpc::Error::RpcStatus(status) => status.code(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn create_boots_the_containers_vm_and_the_task_is_created() {
    let s = shim(&[]);
    let created = s.create("c1", &["sleep", "1000"]).unwrap();
    assert_eq!(created.pid, std::process::id(), "the init's pid is the shim's");
    assert_eq!(s.status("c1"), api::Status::CREATED);
    let job = s.job("c1");
    // The fake's guest answers as soon as it starts; the Session records
    // the start just after.
    s.await_job(&job, JobState::Running);
    assert!(s.guest.started.lock().unwrap().is_empty(), "nothing runs in the guest before start");
}

#[test]
fn start_runs_the_init_process_and_its_output_and_exit_status_reach_containerd() {
    let s = shim(&[("echo hello", GuestRun::prints("hello\n", "", 3))]);
    s.create("c1", &["sh", "-c", "echo hello"]).unwrap();
    let started = s.start("c1", "").unwrap();
    assert_eq!(started.pid, std::process::id());
    assert_eq!(s.wait("c1", ""), 3);
    assert_eq!(s.output("c1"), "hello\n");
    let state = s.state("c1", "");
    assert_eq!((state.status.enum_value().unwrap(), state.exit_status), (api::Status::STOPPED, 3));
    let spec = s.guest.started.lock().unwrap()[0].clone();
    assert_eq!(
        spec.root.as_deref(),
        Some(s.dir.path().join("c1/rootfs").as_path()),
        "chrooted in the rootfs"
    );
    // The init's exit ends the VM.
    s.await_job(&s.job("c1"), JobState::Cancelled);
}

#[test]
fn a_missing_program_fails_start_and_stops_the_task_with_127() {
    let s = shim(&[("no-such-program", GuestRun::fails(libc::ENOENT, "no such file or directory"))]);
    s.create("c1", &["no-such-program"]).unwrap();
    let err = s.start("c1", "").unwrap_err();
    assert!(err.to_string().contains("no such file or directory"), "{err}");
    let state = s.state("c1", "");
    assert_eq!((state.status.enum_value().unwrap(), state.exit_status), (api::Status::STOPPED, 127));
}

#[test]
fn exec_runs_another_process_in_the_running_container() {
    let s = shim(&[("sleep", GuestRun::runs("")), ("cat /etc/hostname", GuestRun::exits(0, "box\n"))]);
    s.create("c1", &["sleep", "1000"]).unwrap();
    s.start("c1", "").unwrap();
    s.exec("c1", "e1", &["cat", "/etc/hostname"]).unwrap();
    assert_eq!(s.state("c1", "e1").status.enum_value().unwrap(), api::Status::CREATED);
    let started = s.start("c1", "e1").unwrap();
    assert_ne!(started.pid, std::process::id(), "an exec's pid is its guest pid");
    assert_eq!(s.wait("c1", "e1"), 0);
    assert_eq!(s.output("e1"), "box\n");
    let deleted = s.delete("c1", "e1").unwrap();
    assert_eq!(deleted.exit_status, 0);
    assert_eq!(s.status("c1"), api::Status::RUNNING, "the container runs on");
    let err = s.delete("c1", "e1").unwrap_err();
    assert_eq!(code(err), Code::NOT_FOUND);
    s.kill("c1", 9).unwrap();
    assert_eq!(s.wait("c1", ""), 137);
}

#[test]
fn an_exec_into_a_container_that_is_not_running_is_refused() {
    let s = shim(&[]);
    s.create("c1", &["sleep", "1000"]).unwrap();
    let err = s.exec("c1", "e1", &["true"]).unwrap_err();
    assert_eq!(code(err), Code::FAILED_PRECONDITION);
}

#[test]
fn kill_delivers_the_signal_to_the_process_in_the_guest() {
    let s = shim(&[("serve", GuestRun::runs("serving\n"))]);
    s.create("c1", &["serve"]).unwrap();
    s.start("c1", "").unwrap();
    s.await_output("c1", "serving\n");
    assert_eq!(s.status("c1"), api::Status::RUNNING);
    s.kill("c1", SIGTERM).unwrap();
    assert_eq!(s.wait("c1", ""), 128 + SIGTERM);
    assert!(s.guest.calls.lock().unwrap().iter().any(|c| matches!(c, Request::Signal { signal: 15, .. })));
    let err = s.kill("c1", SIGTERM).unwrap_err();
    assert_eq!(code(err), Code::NOT_FOUND, "a finished process is not found");
}

#[test]
fn pause_suspends_the_vm_and_resume_continues_it_in_a_new_attempt() {
    let s = shim(&[("serve", GuestRun::runs(""))]);
    s.create("c1", &["serve"]).unwrap();
    s.start("c1", "").unwrap();
    let job = s.job("c1");
    s.service.pause(&ctx(), api::PauseRequest { id: "c1".into(), ..Default::default() }).unwrap();
    assert_eq!(s.status("c1"), api::Status::PAUSED);
    assert_eq!(s.job_state(&job), JobState::Suspended, "a pause is an execution suspend");
    let err = s.kill("c1", SIGTERM).unwrap_err();
    assert_eq!(code(err), Code::FAILED_PRECONDITION, "only SIGKILL reaches a paused container");
    s.service.resume(&ctx(), api::ResumeRequest { id: "c1".into(), ..Default::default() }).unwrap();
    assert_eq!(s.status("c1"), api::Status::RUNNING);
    s.await_job(&job, JobState::Running);
    let record: pvisor_core::records::JobRecord =
        s.runtime.store().read(&s.runtime.store().job_file(&job)).unwrap();
    assert_eq!(record.target_attempt, 2, "resumed in a new Attempt of the same Job");
    s.kill("c1", SIGTERM).unwrap();
    assert_eq!(s.wait("c1", ""), 128 + SIGTERM, "the process kept across the pause is signalled");
}

#[test]
fn sigkill_to_a_paused_container_ends_its_job() {
    let s = shim(&[("serve", GuestRun::runs(""))]);
    s.create("c1", &["serve"]).unwrap();
    s.start("c1", "").unwrap();
    s.service.pause(&ctx(), api::PauseRequest { id: "c1".into(), ..Default::default() }).unwrap();
    s.kill("c1", 9).unwrap();
    assert_eq!(s.wait("c1", ""), 137);
    assert!(s.job_state(&s.job("c1")).is_terminal(), "{}", s.job_state(&s.job("c1")));
}

#[test]
fn checkpoint_records_a_verifiable_execution_checkpoint_and_the_task_runs_on() {
    let s = shim(&[("serve", GuestRun::runs(""))]);
    s.create("c1", &["serve"]).unwrap();
    s.start("c1", "").unwrap();
    let path = s.dir.path().join("checkpoint");
    let request = api::CheckpointTaskRequest {
        id: "c1".into(),
        path: path.display().to_string(),
        ..Default::default()
    };
    s.service.checkpoint(&ctx(), request).unwrap();
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path.join("pvisor-checkpoint.json")).unwrap()).unwrap();
    let job = s.job("c1");
    assert_eq!(record["job"], job.as_str());
    let run = s
        .runtime
        .store()
        .read::<pvisor_core::records::JobRecord>(&s.runtime.store().job_file(&job))
        .unwrap()
        .run;
    let dir = s.runtime.store().exec_checkpoints_dir(&run).join(record["checkpoint"].as_str().unwrap());
    pvisor_vm::checkpoint::verify(&dir).unwrap();
    assert_eq!(s.status("c1"), api::Status::RUNNING);
    s.kill("c1", 9).unwrap();
    s.wait("c1", "");
}

#[test]
fn delete_ends_the_vm_and_forgets_the_container() {
    let s = shim(&[("serve", GuestRun::runs(""))]);
    s.create("c1", &["serve"]).unwrap();
    s.start("c1", "").unwrap();
    let err = s.delete("c1", "").unwrap_err();
    assert_eq!(code(err), Code::FAILED_PRECONDITION, "a running container is not deleted");
    s.kill("c1", 9).unwrap();
    s.wait("c1", "");
    let deleted = s.delete("c1", "").unwrap();
    assert_eq!(deleted.exit_status, 137);
    let job = s.job_state_after_delete("c1");
    assert!(job.is_terminal(), "{job}");
    assert!(!s.dir.path().join("c1").join(container::JOB_FILE).exists());
    let request = api::StateRequest { id: "c1".into(), ..Default::default() };
    assert_eq!(code(s.service.state(&ctx(), request).unwrap_err()), Code::NOT_FOUND);
}

#[test]
fn a_created_container_that_never_started_is_deleted_with_its_vm() {
    let s = shim(&[]);
    s.create("c1", &["serve"]).unwrap();
    let job = s.job("c1");
    s.delete("c1", "").unwrap();
    s.await_job(&job, JobState::Cancelled);
}

impl Shim {
    /// The last Job of the store (the bundle's Job file is gone after a delete).
    fn job_state_after_delete(&self, _id: &str) -> JobState {
        let job = self.runtime.store().list_jobs().unwrap().pop().unwrap();
        self.job_state(&job)
    }
}

#[test]
fn stats_are_read_from_the_guest() {
    let s = shim(&[("serve", GuestRun::runs(""))]);
    s.create("c1", &["serve"]).unwrap();
    s.start("c1", "").unwrap();
    let stats = s.service.stats(&ctx(), api::StatsRequest { id: "c1".into(), ..Default::default() }).unwrap();
    assert!(stats.stats.is_some());
    let asked: Vec<PathBuf> = s
        .guest
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter_map(|c| match c {
            Request::ReadFile { path, .. } => Some(path.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(asked, [Path::new("/proc/stat"), Path::new("/proc/meminfo")]);
    s.kill("c1", 9).unwrap();
    s.wait("c1", "");
}
