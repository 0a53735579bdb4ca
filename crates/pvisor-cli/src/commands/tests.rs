//! The CLI's commands driven through `dispatch` on a runtime over the
//! recording fake backend (`pvisor::testing`): what a user types, and what
//! they get back (exit codes, `--json` lines, files in the workspace). No
//! root, namespaces or VMs; real sandboxes are the end-to-end suite's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use clap::Parser;
use pvisor::actions::{ResolveJob, Status};
use pvisor::backends::Backends;
use pvisor::testing::{FakeBackends, FakeExecutor, Script};
use pvisor::Runtime;
use pvisor_core::ids::JobId;
use pvisor_core::store::Store;
use pvisor_sandbox::capabilities::{Checkpointable, GuestAccess};
use pvisor_sandbox::{Executor, Termination};
use serde_json::Value;

use crate::cli::Cli;

/// The fake backend under the name `ns`, the CLI's default `--executor`.
#[derive(Debug)]
struct AsDefault(FakeBackends);

impl Backends for AsDefault {
    fn executor(&self, name: &str) -> Option<Arc<dyn Executor>> {
        (name == "ns").then(|| self.0.executor("fake")).flatten()
    }

    fn checkpointable(&self, name: &str) -> Option<Arc<dyn Checkpointable>> {
        self.0.checkpointable(name)
    }

    fn guest_access(&self, name: &str) -> Option<Arc<dyn GuestAccess>> {
        self.0.guest_access(name)
    }
}

/// Runs hold this: a kill signals the process that owns the Attempt (this
/// one), and every run's signal handlers would see it.
static RUNS: Mutex<()> = Mutex::new(());

fn runs() -> MutexGuard<'static, ()> {
    RUNS.lock().unwrap_or_else(|p| p.into_inner())
}

struct Fixture {
    dir: tempfile::TempDir,
    ws: PathBuf,
    runtime: Runtime,
    fake: Arc<FakeExecutor>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("kept.txt"), "original\n").unwrap();
    let ws = std::fs::canonicalize(&ws).unwrap();
    // Past the coarse clock's tick (see pvisor's own action tests).
    std::thread::sleep(Duration::from_millis(20));
    let store = Store::open(dir.path().join("state")).unwrap();
    let fake = FakeExecutor::new([]);
    let backends = AsDefault(FakeBackends { executor: fake.clone(), capabilities: None });
    Fixture { runtime: Runtime::new(store, Arc::new(backends)), dir, ws, fake }
}

/// One `--json` line.
fn lines(out: &str) -> Vec<Value> {
    out.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

impl Fixture {
    /// `pvisor ARGS...` on the fake runtime: the exit code (or error) and
    /// what it printed on stdout.
    fn pvisor(&self, args: &[&str]) -> (anyhow::Result<i32>, String) {
        let cli = Cli::try_parse_from(std::iter::once("pvisor").chain(args.iter().copied())).unwrap();
        let runtime = self.runtime.clone();
        crate::output::capture(|| super::dispatch(cli, move || Ok(runtime)))
    }

    /// [`Fixture::pvisor`], and also the `--json` lines it wrote on stderr.
    fn pvisor_both(&self, args: &[&str]) -> (anyhow::Result<i32>, String, String) {
        let cli = Cli::try_parse_from(std::iter::once("pvisor").chain(args.iter().copied())).unwrap();
        let runtime = self.runtime.clone();
        crate::output::capture_both(|| super::dispatch(cli, move || Ok(runtime)))
    }

    /// `pvisor run --json -w WS FLAGS... -- fake-command` playing `script`:
    /// its exit code, and its `--json` lines on stderr (stdout must be
    /// empty: it is the command's).
    fn run_json(&self, script: Script, flags: &[&str]) -> (i32, Vec<Value>) {
        let _runs = runs();
        self.fake.push(script);
        let ws = self.ws.to_str().unwrap();
        let mut args = vec!["run", "--json", "-w", ws];
        args.extend(flags);
        args.extend(["--", "fake-command"]);
        let (code, out, err) = self.pvisor_both(&args);
        assert_eq!(out, "", "pvisor writes nothing on the command's stdout");
        (code.unwrap(), lines(&err))
    }

    /// `pvisor ARGS...` that must succeed: its exit code and stdout.
    fn ok(&self, args: &[&str]) -> (i32, String) {
        let (code, out) = self.pvisor(args);
        (code.unwrap(), out)
    }

    /// `pvisor ARGS...` that must fail: its error, as the user reads it.
    fn error(&self, args: &[&str]) -> String {
        format!("{:#}", self.pvisor(args).0.unwrap_err())
    }

    /// `pvisor run -w WS -- fake-command` playing `script`: the exit code
    /// and the new Job.
    fn run(&self, script: Script) -> (i32, JobId) {
        self.run_with(script, &[])
    }

    fn run_with(&self, script: Script, flags: &[&str]) -> (i32, JobId) {
        let _runs = runs();
        self.fake.push(script);
        let ws = self.ws.to_str().unwrap();
        let mut args = vec!["run", "-w", ws];
        args.extend(flags);
        args.extend(["--", "fake-command", "--flag"]);
        let (code, _) = self.ok(&args);
        (code, self.latest())
    }

    fn latest(&self) -> JobId {
        self.runtime.execute(ResolveJob { query: None }).unwrap()
    }

    /// `status JOB --json`'s record.
    fn status(&self, job: &JobId) -> Value {
        let (code, out) = self.ok(&["status", job.as_str(), "--json"]);
        assert_eq!(code, 0);
        let mut lines = lines(&out);
        assert_eq!(lines.len(), 1, "{out}");
        assert_eq!(lines[0]["type"], "status");
        lines.remove(0)["data"].take()
    }

    /// `review JOB --json`'s change records, by path.
    fn review(&self, job: &JobId) -> Vec<Value> {
        let (code, out) = self.ok(&["review", job.as_str(), "--json"]);
        assert_eq!(code, 0);
        lines(&out)
            .into_iter()
            .map(|mut l| {
                assert_eq!(l["type"], "change");
                l["data"].take()
            })
            .collect()
    }

    fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(self.ws.join(path)).ok()
    }
}

fn change<'a>(changes: &'a [Value], path: &str) -> &'a Value {
    changes.iter().find(|c| c["path"] == path).unwrap_or_else(|| panic!("no change {path} in {changes:?}"))
}

// ---- run ---------------------------------------------------------------------

#[test]
fn run_exits_with_the_commands_exit_code() {
    let f = fixture();
    assert_eq!(f.run(Script::exits(0, &[])).0, 0);
    assert_eq!(f.run(Script::exits(3, &[])).0, 3);
}

#[test]
fn run_of_a_command_killed_by_a_signal_exits_128_plus_it() {
    let f = fixture();
    let (code, job) = f.run(Script::ends(Termination::Signaled(libc::SIGSEGV)));
    assert_eq!(code, 128 + libc::SIGSEGV);
    assert_eq!(f.status(&job)["signal"], libc::SIGSEGV);
}

#[test]
fn run_stages_what_the_command_wrote_and_leaves_the_workspace_alone() {
    let f = fixture();
    let (code, job) = f.run(Script::exits(0, &[("new.txt", "hello\n"), ("kept.txt", "edited\n")]));
    assert_eq!(code, 0);
    assert_eq!(f.read("new.txt"), None, "staged, not written");
    assert_eq!(f.read("kept.txt").as_deref(), Some("original\n"));
    let changes = f.review(&job);
    assert_eq!(changes.len(), 2);
    assert_eq!(change(&changes, "new.txt")["kind"], "added");
    assert_eq!(change(&changes, "kept.txt")["kind"], "modified");
}

#[test]
fn run_records_the_command_and_labels_it_was_given() {
    let f = fixture();
    let (_, job) = f.run_with(Script::exits(0, &[]), &["--label", "team=infra"]);
    let status = f.status(&job);
    assert_eq!(status["program"], "fake-command");
    assert_eq!(status["args"], serde_json::json!(["--flag"]));
    assert_eq!(status["workspace"], f.ws.to_str().unwrap());
    assert_eq!(status["labels"]["team"], "infra");
    let spec = &f.fake.journal().started[0];
    assert_eq!(spec.program, "fake-command");
}

#[test]
fn run_that_fails_to_set_up_is_a_recorded_failure_with_pvisors_exit_code() {
    let f = fixture();
    let (code, job) = f.run(Script::setup_fails("mount", "no overlay here"));
    assert_eq!(code, crate::exit::PVISOR_ERROR);
    let status = f.status(&job);
    assert_eq!(status["state"], "failed");
    assert!(status["error"].as_str().unwrap().contains("no overlay here"), "{status}");
}

#[test]
fn run_refuses_host_mounts_on_a_backend_that_does_not_share_the_host_kernel() {
    let f = fixture();
    let ws = f.ws.to_str().unwrap();
    let cache = f.dir.path().to_str().unwrap();
    let e = f.error(&["run", "-w", ws, "--cache", cache, "--", "fake-command"]);
    assert!(e.contains("--cache, --expose-socket and --ro apply to the ns executor"), "{e}");
    let e = f.error(&["run", "-w", ws, "--ro", cache, "--", "fake-command"]);
    assert!(e.contains("--ro apply to the ns executor"), "{e}");
    let e = f.error(&["run", "-w", ws, "--disk", "1G", "--", "fake-command"]);
    assert!(e.contains("--disk applies to the ns executor"), "{e}");
    let e = f.error(&["run", "-w", ws, "--state", cache, "--", "fake-command"]);
    assert!(e.contains("(--state, --agent) applies to the ns executor"), "{e}");
    assert!(f.fake.journal().started.is_empty(), "nothing started");
}

#[test]
fn run_twice_gives_two_jobs_listed_oldest_first() {
    let f = fixture();
    let (_, first) = f.run(Script::exits(0, &[]));
    let (_, second) = f.run(Script::exits(1, &[]));
    let (code, out) = f.ok(&["jobs", "--json"]);
    assert_eq!(code, 0);
    let jobs: Vec<Value> = lines(&out).into_iter().map(|l| l["data"].clone()).collect();
    let ids: Vec<&str> = jobs.iter().map(|j| j["job"].as_str().unwrap()).collect();
    assert_eq!(ids, [first.as_str(), second.as_str()]);
    assert_eq!(jobs[0]["state"], "completed");
    assert_eq!(jobs[1]["state"], "failed");
}

#[test]
fn jobs_filters_by_label() {
    let f = fixture();
    f.run(Script::exits(0, &[]));
    let (_, labelled) = f.run_with(Script::exits(0, &[]), &["--label", "kind=nightly"]);
    let (_, out) = f.ok(&["jobs", "--json", "--label", "kind=nightly"]);
    let jobs = lines(&out);
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["data"]["job"], labelled.as_str());
}

// ---- status, review, events --------------------------------------------------

#[test]
fn status_json_says_the_result_its_receipt_confirms() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("a.txt", "a")]));
    let status = f.status(&job);
    assert_eq!(status["job"], job.as_str());
    assert_eq!(status["state"], "completed");
    assert_eq!(status["exit_code"], 0);
    assert_eq!(status["receipt"], "valid");
    assert_eq!(status["changes"], 1);
    assert_eq!(status["live"], false);
}

#[test]
fn status_with_review_lists_the_changes_after_the_status() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("a.txt", "a"), ("b.txt", "b")]));
    let (_, out) = f.ok(&["status", job.as_str(), "--review", "--json"]);
    let kinds: Vec<Value> = lines(&out).iter().map(|l| l["type"].clone()).collect();
    assert_eq!(kinds, ["status", "change", "change"]);
}

#[test]
fn review_text_names_each_pending_change_and_the_stage() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("src/main.rs", "fn main() {}\n")]));
    let (code, out) = f.ok(&["review", job.as_str()]);
    assert_eq!(code, 0);
    assert!(out.starts_with(&format!("{job}  completed (exit 0)")), "{out}");
    assert!(out.contains("pending") && out.contains("src/main.rs"), "{out}");
    let (_, empty) = f.run(Script::exits(0, &[]));
    assert!(f.ok(&["review", empty.as_str()]).1.contains("no staged changes"));
}

#[test]
fn review_of_a_path_lists_only_that_path() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("a.txt", "a"), ("b.txt", "b")]));
    let (_, out) = f.ok(&["review", job.as_str(), "b.txt", "--json"]);
    let changes = lines(&out);
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0]["data"]["path"], "b.txt");
}

#[test]
fn events_json_is_the_trace_in_order() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("a.txt", "a")]));
    let (code, out) = f.ok(&["events", job.as_str(), "--json"]);
    assert_eq!(code, 0);
    let events = lines(&out);
    assert!(events.len() >= 3, "{out}");
    assert!(events.iter().all(|e| e["type"] == "event"));
    let seqs: Vec<u64> = events.iter().map(|e| e["data"]["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let kinds: Vec<&str> = events.iter().map(|e| e["data"]["type"].as_str().unwrap()).collect();
    assert_eq!(kinds[0], "job.created", "{kinds:?}");
    assert!(kinds.contains(&"run.completed"), "{kinds:?}");
}

// ---- apply and drop -----------------------------------------------------------

#[test]
fn apply_all_writes_every_staged_change_into_the_workspace() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("new.txt", "hello\n"), ("kept.txt", "edited\n")]));
    let (code, _) = f.ok(&["apply", job.as_str(), "--all"]);
    assert_eq!(code, 0);
    assert_eq!(f.read("new.txt").as_deref(), Some("hello\n"));
    assert_eq!(f.read("kept.txt").as_deref(), Some("edited\n"));
    assert!(f.review(&job).iter().all(|c| c["applied"] == true));
}

#[test]
fn apply_of_one_path_leaves_the_others_staged() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("a.txt", "a"), ("b.txt", "b")]));
    assert_eq!(f.ok(&["apply", job.as_str(), "b.txt"]).0, 0);
    assert_eq!(f.read("a.txt"), None);
    assert_eq!(f.read("b.txt").as_deref(), Some("b"));
    let changes = f.review(&job);
    assert_eq!(change(&changes, "a.txt")["applied"], false);
    assert_eq!(change(&changes, "b.txt")["applied"], true);
}

#[test]
fn apply_without_paths_or_all_is_refused_and_changes_nothing() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("a.txt", "a")]));
    let e = f.error(&["apply", job.as_str()]);
    assert!(e.contains("Name the paths to apply, or pass --all"), "{e}");
    assert_eq!(f.read("a.txt"), None);
}

#[test]
fn apply_dry_run_writes_nothing() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("a.txt", "a")]));
    let (code, out) = f.ok(&["apply", job.as_str(), "--all", "--dry-run"]);
    assert_eq!(code, 0);
    assert!(out.contains("dry run"), "{out}");
    assert_eq!(f.read("a.txt"), None);
    assert_eq!(change(&f.review(&job), "a.txt")["applied"], false);
}

#[test]
fn apply_over_a_host_edit_is_refused_as_a_conflict() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("kept.txt", "from the sandbox\n")]));
    std::fs::write(f.ws.join("kept.txt"), "edited on the host meanwhile\n").unwrap();
    let (code, _) = f.ok(&["apply", job.as_str(), "--all"]);
    assert_eq!(code, 1, "refused");
    assert_eq!(f.read("kept.txt").as_deref(), Some("edited on the host meanwhile\n"));
    assert_eq!(change(&f.review(&job), "kept.txt")["conflict"], true);
}

#[test]
fn drop_discards_staged_changes_so_apply_has_nothing_to_write() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("a.txt", "a"), ("b.txt", "b")]));
    let (code, out) = f.ok(&["drop", job.as_str(), "a.txt"]);
    assert_eq!(code, 0);
    assert!(out.contains("1 change(s) dropped"), "{out}");
    assert_eq!(f.ok(&["apply", job.as_str(), "--all"]).0, 0);
    assert_eq!(f.read("a.txt"), None, "dropped");
    assert_eq!(f.read("b.txt").as_deref(), Some("b"));
    assert_eq!(change(&f.review(&job), "a.txt")["dropped"], true);
}

// ---- fork, kill ------------------------------------------------------------

#[test]
fn fork_runs_a_new_job_over_the_parents_staged_files() {
    let f = fixture();
    let (_, parent) = f.run(Script::exits(0, &[("a.txt", "from the parent\n")]));
    let code = {
        let _runs = runs();
        f.fake.push(Script::exits(0, &[("b.txt", "from the fork\n")]));
        f.ok(&["fork", parent.as_str(), "-q", "--", "fake-command"]).0
    };
    assert_eq!(code, 0);
    let fork = f.latest();
    assert_ne!(fork, parent);
    let status = f.status(&fork);
    assert_eq!(status["lineage"]["parent_job"], parent.as_str());
    // The fork's sandbox started over the parent's files; its own are staged.
    assert_eq!(f.fake.journal().started.len(), 2);
    assert_eq!(change(&f.review(&fork), "b.txt")["kind"], "added");
    let (_, out) = f.ok(&["checkpoints", "--json"]);
    let checkpoints = lines(&out);
    assert_eq!(checkpoints.len(), 1, "{out}");
    assert_eq!(checkpoints[0]["data"]["job"], parent.as_str());
}

#[test]
fn kill_ends_a_running_job_which_its_run_reports() {
    let f = fixture();
    let _runs = runs();
    f.fake.push(Script::runs_until(&[libc::SIGTERM]));
    let ws = f.ws.to_str().unwrap().to_owned();
    let runtime = f.runtime.clone();
    let run = std::thread::spawn(move || {
        let cli = Cli::try_parse_from(["pvisor", "run", "-q", "-w", &ws, "--", "sleep-forever"]).unwrap();
        super::dispatch(cli, move || Ok(runtime)).unwrap()
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let job = loop {
        assert!(Instant::now() < deadline, "the run never went live");
        if let Ok(job) = f.runtime.execute(ResolveJob { query: None }) {
            if f.runtime.execute(Status { job: job.clone() }).is_ok_and(|s| s.live) {
                break job;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (code, _) = f.ok(&["kill", job.as_str(), "--grace", "10s"]);
    assert_eq!(code, 0);
    assert_eq!(run.join().unwrap(), 128 + libc::SIGTERM, "the run ends with the signal it was cancelled by");
    let status = f.status(&job);
    assert_eq!(status["state"], "cancelled");
    assert_eq!(status["receipt"], "valid");
    // Killed: it cannot be continued, and killing it again says so.
    let (code, _) = f.ok(&["kill", job.as_str()]);
    assert_eq!(code, 0);
    assert!(f.fake.journal().signals.contains(&libc::SIGTERM));
}

#[test]
fn suspend_of_a_job_on_a_backend_that_cannot_save_its_execution_is_refused() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[]));
    let e = f.error(&["suspend", job.as_str()]);
    assert!(e.contains("not running") || e.contains("cannot"), "{e}");
}

// ---- export, verify, import, gc --------------------------------------------

#[test]
fn export_writes_a_bundle_that_verify_accepts_and_rejects_once_tampered() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("a.txt", "a\n")]));
    let bundle = f.dir.path().join("job.pvisor.tar");
    let bundle_arg = bundle.to_str().unwrap();
    assert_eq!(f.ok(&["export", job.as_str(), "-o", bundle_arg]).0, 0);
    assert!(bundle.is_file());
    assert_eq!(f.ok(&["verify", bundle_arg]).0, 0);
    assert_eq!(f.ok(&["verify", job.as_str()]).0, 0, "the Job in the state directory verifies too");
    // Flip one byte of the staged file's contents inside the archive.
    let mut bytes = std::fs::read(&bundle).unwrap();
    let at = bytes.windows(2).rposition(|w| w == b"a\n").unwrap();
    bytes[at] = b'b';
    let tampered = f.dir.path().join("tampered.pvisor.tar");
    std::fs::write(&tampered, bytes).unwrap();
    let (code, out) = f.ok(&["verify", tampered.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAILED"), "{out}");
}

#[test]
fn import_of_an_export_elsewhere_is_a_read_only_job_that_apply_refuses() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("a.txt", "a\n")]));
    let bundle = f.dir.path().join("job.pvisor.tar");
    f.ok(&["export", job.as_str(), "-o", bundle.to_str().unwrap()]);
    let e = f.error(&["import", bundle.to_str().unwrap()]);
    assert!(e.contains("already exists"), "{e}");
    let other = fixture();
    assert_eq!(other.ok(&["import", bundle.to_str().unwrap()]).0, 0);
    assert_eq!(other.latest(), job);
    assert!(!other.status(&job)["imported_from"].is_null());
    assert_eq!(change(&other.review(&job), "a.txt")["kind"], "added");
    let e = other.error(&["apply", job.as_str(), "--all"]);
    assert!(e.contains("import"), "{e}");
    assert_eq!(other.read("a.txt"), None);
    assert_eq!(f.read("a.txt"), None);
}

#[test]
fn gc_frees_the_stage_of_a_settled_job_and_says_so_in_json() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("a.txt", "a")]));
    f.ok(&["apply", job.as_str(), "--all"]);
    let (code, out) = f.ok(&["gc", "--older-than", "0s", "--dry-run", "--json"]);
    assert_eq!(code, 0);
    let records = lines(&out);
    assert!(records.iter().all(|r| ["freed", "kept", "failed"].contains(&r["type"].as_str().unwrap())));
    let would = records.iter().filter(|r| r["type"] == "freed").count();
    let stage = PathBuf::from(f.status(&job)["stage"].as_str().unwrap());
    assert!(stage.exists(), "a dry run frees nothing");
    let (code, out) = f.ok(&["gc", "--older-than", "0s", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(lines(&out).iter().filter(|r| r["type"] == "freed").count(), would, "{out}");
    assert!(would == 0 || !stage.exists() || !Path::new(&stage).join("upper").exists(), "{out}");
    assert_eq!(f.read("a.txt").as_deref(), Some("a"), "gc never touches the workspace");
}

// ---- --json of the commands that change something ------------------------------

/// The `result` line that must end `lines`, the only one.
fn result_of(lines: &[Value]) -> &Value {
    let last = lines.last().expect("no --json line at all");
    assert_eq!(last["type"], "result", "{lines:?}");
    assert_eq!(lines.iter().filter(|l| l["type"] == "result").count(), 1, "{lines:?}");
    &last["data"]
}

#[test]
fn run_json_ends_its_lines_on_stderr_with_the_result() {
    let f = fixture();
    let (code, lines) = f.run_json(Script::exits(3, &[("new.txt", "n\n"), ("kept.txt", "edited\n")]), &[]);
    assert_eq!(code, 3);
    let result = result_of(&lines);
    let job = f.latest();
    assert_eq!(result["job"], job.as_str());
    assert_eq!(result["state"], "failed");
    assert_eq!(result["exit_code"], 3);
    assert!(result["signal"].is_null());
    assert_eq!(result["receipt"]["valid"], true);
    let status = f.status(&job);
    assert_eq!(result["attempt"], status["attempt"]);
    assert_eq!(result["workspace"], f.ws.to_str().unwrap());
    let changes = &result["changes"];
    assert_eq!(changes["total"], 2);
    assert_eq!(changes["by_kind"], serde_json::json!({"added": 1, "modified": 1}));
    assert_eq!(changes["truncated"], false);
    let paths: Vec<&Value> = changes["paths"].as_array().unwrap().iter().collect();
    assert_eq!(paths.len(), 2);
    assert!(paths.contains(&&serde_json::json!({"path": "new.txt", "kind": "added"})), "{changes}");
    let next = lines.iter().find(|l| l["type"] == "next").expect("a next line");
    assert!(next["data"]["commands"][0].as_str().unwrap().contains(job.as_str()));
}

#[test]
fn run_json_lists_at_most_so_many_changed_paths_and_says_so() {
    let f = fixture();
    let files: Vec<(String, &str)> =
        (0..crate::results::CHANGED_PATHS + 5).map(|i| (format!("f{i:04}"), "x")).collect();
    let files: Vec<(&str, &str)> = files.iter().map(|(p, c)| (p.as_str(), *c)).collect();
    let (code, lines) = f.run_json(Script::exits(0, &files), &["-q"]);
    assert_eq!(code, 0);
    assert_eq!(lines.len(), 1, "-q leaves only the result: {lines:?}");
    let changes = &result_of(&lines)["changes"];
    assert_eq!(changes["total"], crate::results::CHANGED_PATHS + 5);
    assert_eq!(changes["paths"].as_array().unwrap().len(), crate::results::CHANGED_PATHS);
    assert_eq!(changes["truncated"], true);
}

#[test]
fn run_json_of_a_setup_failure_carries_its_error_in_the_result() {
    let f = fixture();
    let (code, lines) = f.run_json(Script::setup_fails("mount", "no overlay here"), &[]);
    assert_eq!(code, crate::exit::PVISOR_ERROR);
    let result = result_of(&lines);
    assert_eq!(result["state"], "failed");
    assert!(result["error"].as_str().unwrap().contains("no overlay here"), "{result}");
}

#[test]
fn run_json_refused_before_a_job_exists_ends_with_an_error_line() {
    let f = fixture();
    let ws = f.ws.to_str().unwrap();
    let (code, out, err) = f.pvisor_both(&["run", "--json", "-w", ws, "--disk", "1G", "--", "fake-command"]);
    assert_eq!(code.unwrap(), crate::exit::PVISOR_ERROR);
    assert_eq!(out, "");
    let lines = lines(&err);
    assert_eq!(lines.len(), 1, "{err}");
    assert_eq!(lines[0]["type"], "error");
    let message = lines[0]["data"]["message"].as_str().unwrap();
    assert!(message.contains("--disk applies to the ns executor"), "{message}");
    assert_eq!(lines[0]["data"]["exit_code"], crate::exit::PVISOR_ERROR);
    assert!(f.fake.journal().started.is_empty(), "nothing started");
}

#[test]
fn apply_json_says_each_path_applied_then_the_result() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("a.txt", "a"), ("b.txt", "b")]));
    let (code, out) = f.ok(&["apply", job.as_str(), "b.txt", "--json"]);
    assert_eq!(code, 0);
    let lines = lines(&out);
    assert_eq!(lines[0]["type"], "applied");
    assert_eq!(lines[0]["data"]["path"], "b.txt");
    assert_eq!(lines[0]["data"]["kind"], "added");
    let result = result_of(&lines);
    assert_eq!(result["job"], job.as_str());
    assert_eq!(result["applied"], 1);
    assert_eq!(result["skipped"], 0);
    assert_eq!(result["remaining"], 1);
    assert_eq!(result["staged"], true);
    assert_eq!(f.read("b.txt").as_deref(), Some("b"));
}

#[test]
fn apply_json_over_a_conflict_skips_it_with_its_reason_and_exits_1() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("kept.txt", "from the sandbox\n"), ("a.txt", "a")]));
    std::fs::write(f.ws.join("kept.txt"), "edited on the host meanwhile\n").unwrap();
    let (code, out) = f.ok(&["apply", job.as_str(), "--all", "--json"]);
    assert_eq!(code, 1);
    let lines = lines(&out);
    let skipped: Vec<&Value> = lines.iter().filter(|l| l["type"] == "skipped").collect();
    assert_eq!(skipped.len(), 1, "{out}");
    assert_eq!(skipped[0]["data"]["path"], "kept.txt");
    assert_eq!(skipped[0]["data"]["reason"], "conflict");
    assert!(!lines.iter().any(|l| l["type"] == "applied"), "nothing is applied over a conflict: {out}");
    let result = result_of(&lines);
    assert_eq!(result["conflicts"], 1);
    assert_eq!(result["applied"], 0);
    assert_eq!(result["remaining"], 2, "the stage is as it was");
    assert!(result["hints"][0].as_str().unwrap().contains("--force"), "{result}");
    assert_eq!(f.read("a.txt"), None);
}

#[test]
fn apply_json_never_asks_and_says_what_to_pass_instead() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("a.txt", "a")]));
    for flag in ["-i", "-p"] {
        let (code, out) = f.pvisor(&["apply", job.as_str(), flag, "--json"]);
        assert_eq!(code.unwrap(), crate::exit::PVISOR_ERROR);
        let lines = lines(&out);
        assert_eq!(lines.len(), 1, "{out}");
        assert_eq!(lines[0]["type"], "error");
        let message = lines[0]["data"]["message"].as_str().unwrap();
        assert!(message.contains("--all") && message.contains("--include-sensitive"), "{message}");
    }
    assert_eq!(f.read("a.txt"), None);
}

#[test]
fn drop_json_says_each_path_dropped_then_the_result() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("a.txt", "a"), ("b.txt", "b")]));
    f.ok(&["apply", job.as_str(), "a.txt"]);
    let (code, out) = f.ok(&["drop", job.as_str(), "--json"]);
    assert_eq!(code, 0);
    let lines = lines(&out);
    assert_eq!(lines[0], serde_json::json!({"type": "dropped", "data": {"path": "b.txt", "kind": "added"}}));
    let result = result_of(&lines);
    assert_eq!(result["dropped"], 1);
    assert_eq!(result["already_applied"], 1);
    assert_eq!(result["stage_state"], "applied");
}

#[test]
fn checkpoint_json_names_the_checkpoint_a_fork_starts_from() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("a.txt", "a")]));
    let (code, out) = f.ok(&["checkpoint", job.as_str(), "--json"]);
    assert_eq!(code, 0);
    let lines = lines(&out);
    let result = result_of(&lines);
    assert_eq!(result["job"], job.as_str());
    assert_eq!(result["kind"], "workspace");
    assert!(result["checkpoint"].as_str().unwrap().starts_with("ckpt-"), "{result}");
    let (_, listed) = f.ok(&["checkpoints", "--json"]);
    assert_eq!(crate::commands::tests::lines(&listed)[0]["data"]["id"], result["checkpoint"]);
}

#[test]
fn export_json_gives_the_archive_and_its_blake3() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[("a.txt", "a\n")]));
    let archive = f.dir.path().join("job.pvisor.tar");
    let (code, out) = f.ok(&["export", job.as_str(), "-o", archive.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0);
    let lines = lines(&out);
    assert_eq!(lines.len(), 1, "{out}");
    let result = result_of(&lines);
    assert_eq!(result["archive"], archive.to_str().unwrap());
    let bytes = std::fs::read(&archive).unwrap();
    assert_eq!(result["blake3"], blake3::hash(&bytes).to_hex().as_str());
    assert_eq!(result["bytes"], bytes.len());
    assert_eq!(result["confirmed"], true);
}

#[test]
fn kill_json_of_an_ended_job_says_its_state() {
    let f = fixture();
    let (_, job) = f.run(Script::exits(0, &[]));
    let (code, out) = f.ok(&["kill", job.as_str(), "--json"]);
    assert_eq!(code, 0);
    let lines = lines(&out);
    assert_eq!(lines.len(), 1, "{out}");
    let result = result_of(&lines);
    assert_eq!(result["job"], job.as_str());
    assert_eq!(result["state"], "completed");
    assert_eq!(result["already_ended"], true);
}

#[test]
fn a_json_error_of_a_command_on_stdout_ends_its_lines() {
    let f = fixture();
    let (code, out) = f.pvisor(&["kill", "job-01NOSUCHJOB0000000000000000", "--json"]);
    assert_eq!(code.unwrap(), crate::exit::PVISOR_ERROR);
    let lines = lines(&out);
    assert_eq!(lines.last().unwrap()["type"], "error", "{out}");
    assert!(lines.last().unwrap()["data"]["message"].is_string());
}
