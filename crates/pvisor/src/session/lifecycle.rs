//! Session lifecycle: prepare → start → wait (with cancellation) → finalize.
//!
//! Finalization, strictly in this order:
//! 1. the sandbox is gone (its pid namespace died with the command); seal the
//!    stage (`syncfs`) and compute the change manifest;
//! 2. save the Bundle (result, observations, manifest, warnings), no-clobber;
//! 3. save the Run state projection, then commit the completion receipt;
//! 4. publish the terminal event. A failure here is an audit gap: reported,
//!    never answered by rewriting the Bundle or publishing another state.
//!
//! The Job state is published afterwards by the Job service.

use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::mpsc;

use pvisor_core::records::{
    AttemptRecord, Bundle, ChangeEntry, JobRecord, NetworkObservation, Observations, RunBinding, RunRecord,
    RunResult, FORMAT,
};
use pvisor_core::state::{AttemptState, JobState, ResultState};
use pvisor_core::store::{self, OwnerLock, Store, StoreError};
use pvisor_core::time::Timestamp;
use pvisor_sandbox::{Executor, ExitReport, SandboxError, SandboxSpec, Termination, Usage};

use crate::admission::Admitted;
use crate::failpoint;
use crate::runtime::attempt::{self, AttemptError};
use crate::runtime::completion;
use crate::runtime::job_service::{RunEnd, RunError, RunOutcome, SuspendedOutcome};
use crate::runtime::suspension;
use crate::trace::Trace;

/// How the sandbox ended, from the Session's point of view.
#[derive(Debug)]
enum Ending {
    /// The sandbox could not be set up; the command never ran.
    SetupFailed(SandboxError),
    Finished(ExitReport),
}

/// A started sandbox: its signaller, its proxy listener, and its exit report to come.
type Started = (
    pvisor_sandbox::Signaller,
    Option<std::net::TcpListener>,
    Vec<pvisor_sandbox::limits::Enforcement>,
    Option<serde_json::Value>,
    tokio::sync::oneshot::Receiver<Result<ExitReport, SandboxError>>,
);

#[derive(Debug)]
pub(crate) struct Session {
    store: Store,
    executor: Arc<dyn Executor>,
    pub(crate) job: JobRecord,
    run: RunRecord,
    attempt: AttemptRecord,
    trace: Trace,
    spec: SandboxSpec,
    _lock: OwnerLock,
    attempt_event: u64,
    kill_grace: Duration,
    cancel_requested: Option<i32>,
    warnings: Vec<String>,
    network: NetworkTally,
    restore_from: Option<PathBuf>,
    limits: Vec<pvisor_sandbox::limits::Enforcement>,
    baseline: Option<i128>,
    resumed_from: Option<u32>,
}

/// What went through the proxy, for the Bundle and the end-of-run summary.
#[derive(Debug, Default)]
struct NetworkTally {
    allowed: u64,
    denied: u64,
    denied_hosts: std::collections::BTreeMap<String, u64>,
}

impl Session {
    pub(crate) fn new(store: Store, executor: Arc<dyn Executor>, admitted: Admitted) -> Self {
        let kill_grace = Duration::from_millis(admitted.run.operation.policy.kill_grace_ms);
        Self {
            store,
            executor,
            job: admitted.job,
            run: admitted.run,
            attempt: admitted.attempt,
            trace: admitted.trace,
            spec: admitted.spec,
            _lock: admitted.lock,
            attempt_event: admitted.attempt_event,
            kill_grace,
            cancel_requested: None,
            warnings: Vec::new(),
            network: NetworkTally::default(),
            restore_from: admitted.restore_from,
            limits: Vec::new(),
            baseline: admitted.baseline,
            resumed_from: admitted.resumed_from,
        }
    }

    fn emit(&mut self, kind: &str, data: serde_json::Value) -> Result<u64, StoreError> {
        let cause = Some(self.attempt_event);
        self.trace.emit(kind, Some(self.attempt.id.number()), cause, data, false)
    }

    /// Creates `upper/`, `work/` and `root/`; the upper root takes the workspace
    /// root's mode (and owner, when we may chown) because overlay shows it as the
    /// workspace directory itself.
    fn prepare_stage(&self) -> Result<(), SandboxError> {
        let setup = |what: String, e: std::io::Error| SandboxError::Setup {
            step: "stage".into(),
            message: format!("{what}: {e}"),
            hint: Some("check that PVISOR_HOME is writable and has free space".into()),
        };
        let stage_err = |e: pvisor_core::store::StoreError| SandboxError::Setup {
            step: "stage".into(),
            message: e.to_string(),
            hint: None,
        };
        for dir in [&self.spec.work, &self.spec.root_mount] {
            store::create_dir_all_private(dir).map_err(stage_err)?;
        }
        if let Some(checkpoint) = &self.restore_from {
            // A fork: the parent's staged files and their original baselines, together.
            let inherited = self.inherited_preimages_path();
            return pvisor_stage::restore_logical_checkpoint(checkpoint, &self.spec.upper, &inherited)
                .map(|_| ())
                .map_err(|e| SandboxError::Setup {
                    step: "fork".into(),
                    message: e.to_string(),
                    hint: None,
                });
        }
        store::create_dir_all_private(&self.spec.upper).map_err(stage_err)?;
        let meta = std::fs::metadata(&self.spec.workspace)
            .map_err(|e| setup(format!("cannot inspect {}", self.spec.workspace.display()), e))?;
        std::fs::set_permissions(&self.spec.upper, std::fs::Permissions::from_mode(meta.mode() & 0o7777))
            .map_err(|e| setup(format!("cannot set the mode of {}", self.spec.upper.display()), e))?;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            chown(&self.spec.upper, Some(meta.uid()), Some(meta.gid()))
                .map_err(|e| setup(format!("cannot chown {}", self.spec.upper.display()), e))?;
        }
        Ok(())
    }

    fn inherited_preimages_path(&self) -> PathBuf {
        self.store.stage_dir(&self.run.id).join("preimages.inherited.json")
    }

    fn mark_running(&mut self) -> Result<(), RunError> {
        let step = "recording the start";
        attempt::advance(&self.store, &mut self.attempt, AttemptState::Running)
            .map_err(|e| self.finalize_error(step, e.into()))?;
        let now = Timestamp::now();
        let run_state = self
            .run
            .state
            .transition(JobState::Running)
            .map_err(|e| self.finalize_error(step, AttemptError::from(e).into()))?;
        (self.run.state, self.run.updated_at) = (run_state, now);
        self.store
            .write(&self.store.run_file(&self.run.id), &self.run)
            .map_err(|e| self.finalize_error(step, e.into()))?;
        // Read-modify-write under the Job's lock: a `kill` that already
        // withdrew continuation must not be overwritten by our copy.
        let updated = crate::runtime::recovery::update_job(&self.store, &self.job.id, |job| {
            match job.state.transition(JobState::Running) {
                Ok(state) => {
                    job.state = state;
                    true
                }
                // Closed by kill meanwhile: leave its state alone.
                Err(_) => false,
            }
        });
        match updated {
            Ok(job) => {
                self.job = job;
                Ok(())
            }
            Err(e) => Err(self.finalize_error(step, e.into())),
        }
    }

    /// Runs the Attempt to its end and finalizes it. `cancel` carries signals to
    /// forward; the first one marks the run as cancelled.
    pub(crate) async fn run(mut self, mut cancel: mpsc::UnboundedReceiver<i32>) -> Result<RunEnd, RunError> {
        // A resumed or forked VM still sees the workspace image of its first start.
        let baseline = self.baseline.unwrap_or_else(pvisor_stage::preimage::baseline_now);
        self.spec.start_at_coarse_ns = Some(baseline);
        if let Some(vm) = self.spec.vm.as_mut() {
            vm.context["baseline"] = json!(baseline.to_string());
        }
        let started_at = Timestamp::now();
        let clock = Instant::now();
        let started = match self.prepare_stage() {
            Ok(()) => self.start_sandbox().await,
            Err(e) => Err(e),
        };
        let ending = match started {
            Err(e) => Ending::SetupFailed(e),
            Ok((signaller, listener, limits, facts, mut wait)) => {
                self.mark_running()?;
                self.emit("attempt.started", json!({"executor": self.executor.name()}))
                    .map_err(|e| self.finalize_error("recording the start", e.into()))?;
                if let Some(facts) = facts {
                    if let Some(kept) = facts["caches_persistent"].as_array() {
                        for cache in &self.spec.caches {
                            if !kept.iter().any(|k| k.as_str() == cache.path.to_str()) {
                                self.warnings.push(format!(
                                    "--cache {}: another run holds it, so this run wrote to a private copy that is thrown away",
                                    cache.path.display()
                                ));
                            }
                        }
                    }
                    let kind = format!("attempt.{}", self.executor.name());
                    self.record_best_effort(&kind, facts);
                }
                if !limits.is_empty() {
                    self.record_best_effort("attempt.limits", json!({"limits": limits}));
                    // A limit the user asked for and did not get is warned
                    // about; pvisor's own default is recorded (attempt.limits,
                    // the Bundle) and shown by `pvisor doctor`, not on every run.
                    for l in &limits {
                        if !l.enforced() && !self.spec.limits.is_default(&l.limit) {
                            self.warnings.push(format!("--{} {} is {}", l.limit, l.value, l.by));
                        }
                    }
                    self.limits = limits;
                }
                let (proxy_events, mut proxy_rx) = mpsc::unbounded_channel();
                let (stop_proxy, proxy_stopped) = tokio::sync::watch::channel(false);
                let proxy = listener.map(|listener| {
                    let policy = Arc::new(self.run.operation.policy.network.clone());
                    tokio::spawn(pvisor_net::proxy::serve(
                        listener,
                        policy,
                        proxy_events.clone(),
                        proxy_stopped,
                    ))
                });
                drop(proxy_events);
                let mut proxy_open = proxy.is_some();
                let mut deadline: Option<tokio::time::Instant> = None;
                let mut cancel_open = true;
                let report = loop {
                    tokio::select! {
                        joined = &mut wait => {
                            break joined.unwrap_or_else(|_| Err(SandboxError::Protocol("the sandbox thread ended without a report".into())));
                        }
                        sig = cancel.recv(), if cancel_open => {
                            let Some(sig) = sig else { cancel_open = false; continue };
                            if self.cancel_requested.is_none() {
                                self.cancel_requested = Some(sig);
                                let _ = signaller.signal(sig);
                                deadline = Some(tokio::time::Instant::now() + self.kill_grace);
                                self.record_best_effort("run.cancel_requested", json!({"signal": sig, "grace_ms": self.kill_grace.as_millis() as u64}));
                            } else {
                                let _ = signaller.kill();
                                deadline = None;
                                self.record_best_effort("run.kill_escalated", json!({"reason": "second cancellation request"}));
                            }
                        }
                        event = proxy_rx.recv(), if proxy_open => match event {
                            Some(event) => self.record_network(event),
                            None => proxy_open = false,
                        },
                        () = sleep_until(deadline) => {
                            let _ = signaller.kill();
                            deadline = None;
                            self.record_best_effort("run.kill_escalated", json!({"reason": "grace period expired", "grace_ms": self.kill_grace.as_millis() as u64}));
                        }
                    }
                };
                let _ = stop_proxy.send(true);
                if let Some(proxy) = proxy {
                    let _ = proxy.await;
                }
                while let Ok(event) = proxy_rx.try_recv() {
                    self.record_network(event);
                }
                match report {
                    Ok(report) => {
                        if let Some(error) = &report.stage_error {
                            // The records say what the stage is missing; the
                            // seal then covers what did reach the disk.
                            self.record_best_effort("attempt.stage_incomplete", json!({"error": error}));
                            self.warnings.push(format!("the stage is incomplete: {error}"));
                        }
                        Ending::Finished(report)
                    }
                    Err(e) => Ending::SetupFailed(e),
                }
            }
        };
        if let Ending::Finished(ExitReport {
            termination: Termination::Suspended { checkpoint, qemu }, ..
        }) = ending
        {
            return self.finalize_suspended(*checkpoint, qemu);
        }
        self.finalize(ending, started_at, baseline, clock.elapsed()).map(RunEnd::Finished)
    }

    /// Ends a suspended Attempt: the checkpoint is published and QEMU reaped,
    /// so commit the termination receipt, then project it (attempt
    /// `hibernated`, Run `suspended`) and publish `run.hibernated`.
    fn finalize_suspended(
        mut self,
        checkpoint: pvisor_sandbox::vm::ExecCheckpoint,
        vm_exit: String,
    ) -> Result<RunEnd, RunError> {
        suspension::commit(&self.store, &self.job.id, &self.attempt.id, &checkpoint, &vm_exit)
            .map_err(|e| self.finalize_error("committing the termination receipt", e.into()))?;
        failpoint::hit("after-termination-receipt");
        let mut audit_gaps = Vec::new();
        if let Err(e) = attempt::advance(&self.store, &mut self.attempt, AttemptState::Hibernated) {
            audit_gaps.push(format!("attempt.json not updated: {e}"));
        }
        match self.run.state.transition(JobState::Suspended) {
            Ok(state) => {
                self.run.state = state;
                self.run.updated_at = Timestamp::now();
                if let Err(e) = self.store.write(&self.store.run_file(&self.run.id), &self.run) {
                    audit_gaps.push(format!("run.json not updated: {e}"));
                }
            }
            Err(e) => audit_gaps.push(format!("run state not updated: {e}")),
        }
        let data = json!({
            "checkpoint": checkpoint.id,
            "vm_exit": vm_exit,
            "paused_ms": checkpoint.paused_ms,
            "save_ms": checkpoint.save_ms,
            "receipt": "termination.json",
        });
        if let Err(e) = self.trace.emit(
            "run.hibernated",
            Some(self.attempt.id.number()),
            Some(self.attempt_event),
            data,
            true,
        ) {
            audit_gaps.push(format!("terminal event run.hibernated not written: {e}"));
        }
        Ok(RunEnd::Suspended(SuspendedOutcome {
            job: self.job.id.clone(),
            run: self.run.id.clone(),
            attempt: self.attempt.id.clone(),
            checkpoint: Box::new(checkpoint),
            vm_exit,
            audit_gaps,
            job_record: self.job,
        }))
    }

    /// Starts the sandbox on a dedicated thread that also waits for it.
    ///
    /// The helper dies with the *thread* that forked it (`PR_SET_PDEATHSIG`
    /// follows the parent thread), so starting on a pooled blocking thread that
    /// may retire while the sandbox runs would kill it; this thread lives
    /// exactly as long as the sandbox.
    async fn start_sandbox(&self) -> Result<Started, SandboxError> {
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let executor = self.executor.clone();
        let spec = self.spec.clone();
        std::thread::Builder::new()
            .name("pvisor-sandbox".into())
            .spawn(move || match executor.start(&spec) {
                Ok(mut process) => {
                    let _ = started_tx.send(Ok((
                        process.signaller(),
                        process.take_proxy_listener(),
                        process.limits(),
                        process.facts(),
                    )));
                    let _ = done_tx.send(process.wait());
                }
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                }
            })
            .map_err(SandboxError::Spawn)?;
        let (signaller, listener, limits, facts) = started_rx.await.unwrap_or_else(|_| {
            Err(SandboxError::Protocol("the sandbox thread ended before starting".into()))
        })?;
        Ok((signaller, listener, limits, facts, done_rx))
    }

    /// Records one proxied request in the Trace and the tally.
    fn record_network(&mut self, event: pvisor_net::proxy::ProxyEvent) {
        let kind = if event.allowed { "network.allowed" } else { "network.denied" };
        if event.allowed {
            self.network.allowed += 1;
        } else {
            self.network.denied += 1;
            *self.network.denied_hosts.entry(event.host.clone()).or_default() += 1;
        }
        self.record_best_effort(kind, json!(event));
    }

    fn network_observation(&self) -> NetworkObservation {
        let mut top: Vec<(String, u64)> =
            self.network.denied_hosts.iter().map(|(h, n)| (h.clone(), *n)).collect();
        top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        top.truncate(5);
        NetworkObservation {
            attachment: self.executor.describe_attachment(self.spec.network),
            non_bypassable: self.spec.network.non_bypassable(),
            allowed: self.network.allowed,
            denied: self.network.denied,
            top_denied: top,
        }
    }

    /// Records a fact whose loss must not stop the run (it is repeated in the Bundle).
    fn record_best_effort(&mut self, kind: &str, data: serde_json::Value) {
        if let Err(e) = self.emit(kind, data) {
            self.warnings.push(format!("could not record {kind}: {e}"));
        }
    }

    fn result_of(&self, ending: &Ending, started_at: Timestamp) -> RunResult {
        let finished_at = Timestamp::now();
        let cancelled = self.cancel_requested.is_some();
        let (mut state, exit_code, signal, error) = match ending {
            Ending::SetupFailed(e) => {
                let mut message = e.to_string();
                if let Some(hint) = e.hint() {
                    message.push_str(&format!(" (hint: {hint})"));
                }
                (ResultState::Failed, None, None, Some(message))
            }
            Ending::Finished(report) => match &report.termination {
                Termination::Exited(0) => (ResultState::Completed, Some(0), None, None),
                Termination::Exited(code) => (ResultState::Failed, Some(*code), None, None),
                Termination::Signaled(sig) if report.oom_killed => {
                    let limit = self
                        .limits
                        .iter()
                        .find(|l| l.limit == "memory")
                        .map_or("?".into(), |l| l.value.clone());
                    let error =
                        format!("killed by the kernel's OOM killer: the {limit} memory limit was reached");
                    (ResultState::Failed, None, Some(*sig), Some(error))
                }
                // Ctrl-C typed on the terminal: cancelled by the user, as documented.
                Termination::Signaled(sig) if *sig == libc::SIGINT && report.interrupted_at_terminal => {
                    (ResultState::Cancelled, None, Some(*sig), None)
                }
                Termination::Signaled(sig) => (ResultState::Failed, None, Some(*sig), None),
                Termination::ExecFailed { program, errno, message } => {
                    let (code, what) =
                        if *errno == libc::ENOENT { (127, "not found") } else { (126, "cannot be executed") };
                    (
                        ResultState::Failed,
                        Some(code),
                        None,
                        Some(format!("program {program:?} {what}: {message}")),
                    )
                }
                Termination::Vanished { detail } => (ResultState::Failed, None, None, Some(detail.clone())),
                // Handled by `finalize_suspended` before a result is ever formed.
                Termination::Suspended { .. } => {
                    (ResultState::Failed, None, None, Some("suspended without a termination receipt".into()))
                }
            },
        };
        if cancelled {
            state = ResultState::Cancelled;
        }
        RunResult { state, exit_code, signal, started_at, finished_at, error }
    }

    fn finalize_error(
        &self,
        step: &'static str,
        source: crate::runtime::job_service::FinalizeSource,
    ) -> RunError {
        RunError::Finalize {
            step,
            job: self.job.id.clone(),
            attempt: self.attempt.id.clone(),
            stage: self.store.stage_dir(&self.run.id),
            source: Box::new(source),
        }
    }

    fn finalize(
        mut self,
        ending: Ending,
        started_at: Timestamp,
        baseline: i128,
        wall: Duration,
    ) -> Result<RunOutcome, RunError> {
        let result = self.result_of(&ending, started_at);
        // A resume that could not even restore leaves the suspension usable.
        // Only before the Attempt started: until then the restored guest had
        // no stdin and no proxy, so it cannot have acted on anything outside.
        let restore_failed_from = match &ending {
            Ending::SetupFailed(_) if self.attempt.state == AttemptState::Preparing => self.resumed_from,
            Ending::SetupFailed(_) | Ending::Finished(_) => None,
        };
        let usage = match &ending {
            Ending::Finished(report) => report.usage.clone(),
            Ending::SetupFailed(_) => Usage::default(),
        };

        // Step 1: the sandbox is gone; seal the stage and take its manifest.
        attempt::advance(&self.store, &mut self.attempt, AttemptState::Finalizing)
            .map_err(|e| self.finalize_error("marking the attempt finalizing", e.into()))?;
        self.emit(
            "attempt.exited",
            json!({"exit_code": result.exit_code, "signal": result.signal, "error": result.error}),
        )
        .map_err(|e| self.finalize_error("recording the exit", e.into()))?;
        // Read before the first staged file is hashed: see `Preimages::sealed_ns`.
        let sealed_ns = pvisor_core::time::coarse_realtime_ns();
        let changes = self.seal_stage()?;
        let preimages = pvisor_stage::preimage::capture(&self.spec.workspace, &changes, baseline)
            .map_err(|e| self.finalize_error("recording the conflict baselines", e.into()))?;
        let mut preimages = preimages;
        preimages.sealed_ns = sealed_ns;
        if self.restore_from.is_some() {
            // Paths the parent changed keep the parent's baseline: what the host
            // held before the *first* sandbox touched them.
            let inherited: pvisor_stage::preimage::Preimages =
                store::read_record(&self.inherited_preimages_path())
                    .map_err(|e| self.finalize_error("reading the inherited conflict baselines", e.into()))?;
            for entry in &mut preimages.entries {
                if let Some(original) = inherited.get(&entry.path) {
                    entry.preimage = original.clone();
                }
            }
        }
        let without_baseline = preimages
            .entries
            .iter()
            .filter(|e| matches!(e.preimage, pvisor_stage::preimage::Preimage::Unknown { .. }))
            .count();
        let preimages_file = self.store.stage_dir(&self.run.id).join("preimages.json");
        let preimages_bytes = store::to_json_bytes(&preimages);
        store::write_atomic(&preimages_file, &preimages_bytes)
            .map_err(|e| self.finalize_error("saving the conflict baselines", e.into()))?;
        self.emit("stage.sealed", json!({"changes": changes.len(), "without_baseline": without_baseline}))
            .map_err(|e| self.finalize_error("recording the sealed stage", e.into()))?;
        failpoint::hit("after-seal");

        // Step 2: the Bundle fixes the result and observations, and binds
        // the Run, the baselines and the Trace so far.
        let trace = pvisor_core::journal::Journal::new(self.store.events_file(&self.run.id))
            .seal_prefix()
            .map_err(|e| self.finalize_error("sealing the Trace", e.into()))?;
        let bundle = Bundle {
            format: FORMAT,
            job: self.job.id.clone(),
            run: self.run.id.clone(),
            attempt: self.attempt.id.clone(),
            result: result.clone(),
            observations: Observations {
                wall_ms: wall.as_millis() as u64,
                user_cpu_ms: usage.user_cpu.as_millis() as u64,
                system_cpu_ms: usage.system_cpu.as_millis() as u64,
                max_rss_kib: usage.max_rss_kib,
                network: Some(self.network_observation()),
                extra: self
                    .limits
                    .iter()
                    .map(|l| (format!("limit.{}", l.limit), format!("{} via {}", l.value, l.by)))
                    .collect(),
            },
            changes: changes.clone(),
            warnings: self.warnings.clone(),
            binding: Some(RunBinding {
                run_blake3: self.run.fixed_digest(),
                preimages_blake3: Some(store::blake3_hex(&preimages_bytes)),
                trace: Some(trace),
            }),
        };
        let bundle_bytes = store::to_json_bytes(&bundle);
        store::commit_no_clobber(&self.store.bundle_file(&self.attempt.id), &bundle_bytes)
            .map_err(|e| self.finalize_error("saving the Bundle", e.into()))?;
        failpoint::hit("after-bundle");
        let receipt = completion::build(&self.job.id, &self.attempt.id, &result, &bundle_bytes);
        self.emit(
            "bundle.saved",
            json!({"file": "bundle.json", "size": receipt.bundle.size, "blake3": receipt.bundle.blake3}),
        )
        .map_err(|e| self.finalize_error("recording the Bundle", e.into()))?;

        // Step 3: the Run projection, then the receipt that makes it true.
        // A failed restore leaves the Run suspended: its result is still to come.
        if restore_failed_from.is_none() {
            self.run.state = result.state.job_state();
            self.run.result = Some(result.clone());
        }
        self.run.updated_at = Timestamp::now();
        self.store
            .write(&self.store.run_file(&self.run.id), &self.run)
            .map_err(|e| self.finalize_error("saving the Run state", e.into()))?;
        failpoint::hit("after-run-json");
        if let Some(previous) = restore_failed_from {
            // Before the receipt: from this point readers must see the Job
            // suspended on its previous Attempt, never this failed restore.
            let this = self.attempt.id.number();
            crate::runtime::recovery::update_job(&self.store, &self.job.id, |job| {
                let retarget = job.target_attempt == this;
                if retarget {
                    job.target_attempt = previous;
                }
                retarget
            })
            .map_err(|e| self.finalize_error("re-targeting the suspended Attempt", e.into()))?;
        }
        completion::commit(&self.store, &receipt)
            .map_err(|e| self.finalize_error("committing the completion receipt", e.into()))?;
        failpoint::hit("after-receipt");

        // Step 4: from here on, nothing may contradict the receipt.
        let mut audit_gaps = Vec::new();
        if let Err(e) = attempt::advance(&self.store, &mut self.attempt, result.state.attempt_state()) {
            audit_gaps.push(format!("attempt.json not updated: {e}"));
        }
        failpoint::hit("before-terminal-event");
        let terminal = result.state.terminal_event();
        let data = json!({"exit_code": result.exit_code, "signal": result.signal, "error": result.error, "changes": changes.len(), "receipt": "completion.json"});
        if let Err(e) =
            self.trace.emit(terminal, Some(self.attempt.id.number()), Some(self.attempt_event), data, true)
        {
            audit_gaps.push(format!("terminal event {terminal} not written: {e}"));
        }
        Ok(RunOutcome {
            job: self.job.id.clone(),
            run: self.run.id.clone(),
            attempt: self.attempt.id.clone(),
            workspace: self.run.workspace.clone(),
            result,
            changes,
            bundle_blake3: receipt.bundle.blake3,
            network: bundle.observations.network.clone(),
            warnings: self.warnings,
            audit_gaps,
            restore_failed_from,
            job_record: self.job,
        })
    }

    fn seal_stage(&mut self) -> Result<Vec<ChangeEntry>, RunError> {
        let upper: PathBuf = self.spec.upper.clone();
        if !upper.is_dir() {
            return Ok(Vec::new());
        }
        pvisor_stage::seal(&upper).map_err(|e| self.finalize_error("sealing the stage", e.into()))?;
        pvisor_stage::scan(&upper, &self.spec.workspace)
            .map_err(|e| self.finalize_error("reading the stage", e.into()))
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
