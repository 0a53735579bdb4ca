//! The Session: the lifecycle owner of one Attempt.
//!
//! It prepares the stage, starts the executor, relays cancellation (forward
//! the signal, then SIGKILL after the grace period), and finalizes strictly in
//! one fixed order (seal, Bundle, receipt, terminal event). The Session and what every step shares are here; the
//! steps are [`prepare`] (the stage, the sandbox's start, the running
//! state), [`lifecycle`] (the run from start to end: cancellation and
//! proxied requests) and [`finalize`] (seal → Bundle → receipt → terminal
//! event).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use pvisor_core::event::EventKind;
use pvisor_core::records::{AttemptRecord, JobRecord, RunRecord};
use pvisor_core::store::{OwnerLock, Store, StoreError};
use pvisor_sandbox::{Executor, ExitReport, SandboxError, SandboxSpec};

use crate::admission::Admitted;
use crate::trace::Trace;
use outcome::RunError;

mod budget;
mod finalize;
pub(crate) mod job_control;
mod lifecycle;
pub(crate) mod outcome;
mod prepare;

/// How the sandbox ended, from the Session's point of view.
#[derive(Debug)]
enum Ending {
    /// The sandbox could not be set up; the command never ran.
    SetupFailed(SandboxError),
    Finished(ExitReport),
}

/// A started sandbox: its signaller, its proxy listener, and its exit report to come.
/// What a started sandbox handed over for its network: the proxy's
/// listener and those of its forwarded loopback ports, all made inside its
/// network namespace.
#[derive(Debug, Default)]
pub(super) struct NetworkListeners {
    pub(super) proxy: Option<std::net::TcpListener>,
    pub(super) forwards: Vec<std::net::TcpListener>,
}

type Started = (
    pvisor_sandbox::Signaller,
    NetworkListeners,
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
    /// Why the stage could not be saved whole, if it could not.
    stage_incomplete: Option<String>,
    network: NetworkTally,
    budget: budget::TraceBudget,
    restore_from: Option<PathBuf>,
    limits: Vec<pvisor_sandbox::limits::Enforcement>,
    baseline: Option<i128>,
    resumed_from: Option<u32>,
    /// The `--secret` broker, held for the run's proxy; its CA bundle's
    /// directory goes when the Session does.
    brokered: Option<crate::admission::Brokered>,
    /// The agent state made before the start and collected after the end.
    state: crate::agent_state::Plan,
}

/// What went through the proxy, for the Bundle and the end-of-run summary.
#[derive(Debug, Default)]
struct NetworkTally {
    /// Allowed and connected.
    allowed: u64,
    /// Allowed, but not resolved or not connected: nothing was reached.
    failed: u64,
    denied: u64,
    denied_hosts: std::collections::BTreeMap<String, u64>,
    failed_destinations: std::collections::BTreeMap<(String, u16), u64>,
}

impl Session {
    pub(crate) fn new(store: Store, executor: Arc<dyn Executor>, admitted: Admitted) -> Self {
        let kill_grace = Duration::from_millis(admitted.run.operation.policy.kill_grace_ms);
        let budget = budget::TraceBudget::new(admitted.spec.limits.disk_bytes);
        Self {
            store,
            executor,
            budget,
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
            stage_incomplete: None,
            network: NetworkTally::default(),
            restore_from: admitted.restore_from,
            limits: Vec::new(),
            baseline: admitted.baseline,
            resumed_from: admitted.resumed_from,
            brokered: admitted.brokered,
            state: admitted.state,
        }
    }

    fn emit(&mut self, kind: EventKind, data: &impl Serialize) -> Result<u64, StoreError> {
        let cause = Some(self.attempt_event);
        self.trace.emit(kind, Some(self.attempt.id.number()), cause, data, false)
    }

    /// Records a fact whose loss must not stop the run (it is repeated in the Bundle).
    pub(super) fn record_best_effort(&mut self, kind: EventKind, data: &impl Serialize) {
        if let Err(e) = self.emit(kind.clone(), data) {
            self.warnings.push(format!("could not record {kind}: {e}"));
        }
    }

    pub(super) fn finalize_error(&self, step: &'static str, source: outcome::FinalizeSource) -> RunError {
        RunError::Finalize {
            step,
            job: self.job.id.clone(),
            attempt: self.attempt.id.clone(),
            stage: self.store.stage_dir(&self.run.id),
            source: Box::new(source),
        }
    }
}
