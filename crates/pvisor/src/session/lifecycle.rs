//! Session lifecycle: prepare → start → wait (with cancellation) → finalize.
//!
//! [`Session::run`] drives the steps; while the command runs it forwards
//! cancellation (SIGKILL after the grace period) and records each proxied
//! request.
//!
//! Finalization is [`super::finalize`], in its fixed order; the
//! Job state is published afterwards by the Job service.

use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use tokio::sync::mpsc;

use pvisor_core::event::EventKind;
use pvisor_core::records::NetworkObservation;
use pvisor_core::time::Timestamp;
use pvisor_sandbox::{ExitReport, SandboxError, Termination};

use super::outcome::{RunEnd, RunError};

use super::job_control::Control;
use super::{Ending, Session};
use crate::trace::data;

/// What [`Session::supervise`] needs of a started sandbox.
type SandboxStarted = (
    pvisor_sandbox::Signaller,
    super::NetworkListeners,
    tokio::sync::oneshot::Receiver<Result<ExitReport, SandboxError>>,
);

impl Session {
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
        let (session, prepared) = blocking(move || {
            let prepared = self.prepare_stage().and_then(|()| self.prepare_state());
            (self, prepared)
        })
        .await;
        self = session;
        // The control socket is up before the sandbox starts: a frontend
        // that can reach the guest (a resumed VM answers at once) can reach
        // this Session too, to put its vault in force again or take a note.
        // Dropping `stop_serving` closes it.
        let (stop_serving, serving_stopped) = tokio::sync::watch::channel(false);
        let control = self.open_control(&serving_stopped);
        let started = match prepared {
            Ok(()) => self.start_sandbox().await,
            Err(e) => Err(e),
        };
        let ending = match started {
            Err(e) => {
                drop((control, stop_serving));
                Ending::SetupFailed(e)
            }
            Ok((signaller, listener, limits, facts, wait)) => {
                self.record_start(limits, facts)?;
                let serving = (stop_serving, serving_stopped);
                self.supervise((signaller, listener, wait), control, serving, &mut cancel).await
            }
        };
        if let Ending::Finished(ExitReport {
            termination: Termination::Suspended { checkpoint, qemu }, ..
        }) = ending
        {
            return blocking(move || self.finalize_suspended(*checkpoint, qemu)).await;
        }
        let elapsed = clock.elapsed();
        blocking(move || self.finalize(ending, started_at, baseline, elapsed)).await.map(RunEnd::Finished)
    }

    /// Waits for the sandbox to end while serving its proxy and forwarded
    /// loopback ports: forwards the first cancellation signal, SIGKILLs on a
    /// second one or when the grace period expires, and records each
    /// proxied request and forwarded connection.
    async fn supervise(
        &mut self,
        started: SandboxStarted,
        control: Control,
        (stop_proxy, proxy_stopped): (tokio::sync::watch::Sender<bool>, tokio::sync::watch::Receiver<bool>),
        cancel: &mut mpsc::UnboundedReceiver<i32>,
    ) -> Ending {
        let (signaller, listeners, mut wait) = started;
        let (proxy_events, mut proxy_rx) = mpsc::unbounded_channel();
        let Control { live, policies: mut policy_rx, notes: mut note_rx, vaults: mut vault_rx } = control;
        let (mut policy_open, mut notes_open, mut vaults_open) = (true, true, true);
        let proxy = self.serve_network(listeners, live, &proxy_events, &proxy_stopped);
        drop(proxy_events);
        let mut proxy_open = !proxy.is_empty();
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
                        let grace_ms = self.kill_grace.as_millis() as u64;
                        self.record_best_effort(EventKind::RunCancelRequested, &data::RunCancelRequested { signal: sig, grace_ms });
                    } else {
                        let _ = signaller.kill();
                        deadline = None;
                        self.record_best_effort(EventKind::RunKillEscalated, &data::RunKillEscalated { reason: "second cancellation request", grace_ms: None });
                    }
                }
                event = proxy_rx.recv(), if proxy_open => match event {
                    Some(event) => self.record_net_event(event),
                    None => proxy_open = false,
                },
                changed = policy_rx.recv(), if policy_open => match changed {
                    Some(change) => self.record_policy_change(change),
                    None => policy_open = false,
                },
                note = note_rx.recv(), if notes_open => match note {
                    Some(note) => self.record_note(&note),
                    None => notes_open = false,
                },
                changed = vault_rx.recv(), if vaults_open => match changed {
                    Some(changed) => self.record_best_effort(EventKind::NetworkVaultChanged, &changed),
                    None => vaults_open = false,
                },
                () = sleep_until(deadline) => {
                    let _ = signaller.kill();
                    deadline = None;
                    let grace_ms = Some(self.kill_grace.as_millis() as u64);
                    self.record_best_effort(EventKind::RunKillEscalated, &data::RunKillEscalated { reason: "grace period expired", grace_ms });
                }
            }
        };
        let _ = stop_proxy.send(true);
        for task in proxy {
            let _ = task.await;
        }
        while let Ok(event) = proxy_rx.try_recv() {
            self.record_net_event(event);
        }
        // What the socket answered before the sandbox ended is recorded too.
        while let Ok(change) = policy_rx.try_recv() {
            self.record_policy_change(change);
        }
        while let Ok(note) = note_rx.try_recv() {
            self.record_note(&note);
        }
        while let Ok(changed) = vault_rx.try_recv() {
            self.record_best_effort(EventKind::NetworkVaultChanged, &changed);
        }
        self.record_coalesced();
        match report {
            Ok(report) => {
                if let Some(error) = &report.stage_error {
                    // The records say what the stage is missing; the
                    // seal then covers what did reach the disk.
                    self.record_best_effort(
                        EventKind::AttemptStageIncomplete,
                        &data::AttemptStageIncomplete { error },
                    );
                    self.warnings.push(format!("the stage is incomplete: {error}"));
                    self.stage_incomplete = Some(error.clone());
                }
                Ending::Finished(report)
            }
            Err(e) => Ending::SetupFailed(e),
        }
    }

    /// The proxy's live policy and vault, and the control socket that may
    /// replace them until `stop`: a VM's frontend (pvisor serve, the shim)
    /// notes what it runs in the guest; an ordered policy (pvisor serve's)
    /// may change while it runs. Other Jobs get no socket.
    fn open_control(&mut self, stop: &tokio::sync::watch::Receiver<bool>) -> Control {
        let live = super::job_control::Live {
            policy: Arc::new(pvisor_net::LivePolicy::new(self.starting_network())),
            vault: Arc::default(),
        };
        let (control, heard) = Control::new(live);
        if self.spec.vm.is_some() || self.run.operation.policy.network.ordered.is_some() {
            let dir = self.store.attempt_dir(&self.attempt.id);
            if let Err(e) = super::job_control::serve(&dir, control.live.clone(), heard, stop.clone()) {
                self.warnings.push(format!("no frontend can reach this Job while it runs: {e}"));
            }
        }
        control
    }

    /// Serves the proxy on its listener and each forwarded loopback port on
    /// its own (matched to the spec's forward by its address), all under the
    /// recorded policy, reporting to `events` until `stop`.
    fn serve_network(
        &self,
        listeners: super::NetworkListeners,
        live: Arc<super::job_control::Live>,
        events: &mpsc::UnboundedSender<pvisor_net::proxy::NetEvent>,
        stop: &tokio::sync::watch::Receiver<bool>,
    ) -> Vec<tokio::task::JoinHandle<std::io::Result<()>>> {
        let shared = pvisor_net::proxy::Shared {
            policy: live.policy.clone(),
            vault: live.vault.clone(),
            broker: self.brokered.as_ref().map(|b| b.broker.clone()),
            events: events.clone(),
        };
        let mut tasks = Vec::new();
        if let Some(listener) = listeners.proxy {
            let serve = pvisor_net::proxy::serve(listener, shared.clone(), stop.clone());
            tasks.push(tokio::spawn(serve));
        }
        for listener in listeners.forwards {
            let local = listener.local_addr().ok();
            let Some(forward) = self.spec.loopback_forwards.iter().find(|f| Some(f.listen) == local) else {
                continue;
            };
            let serve = pvisor_net::forward::serve(listener, forward.clone(), shared.clone(), stop.clone());
            tasks.push(tokio::spawn(serve));
        }
        tasks
    }

    /// The network this Attempt's proxy starts from: the recorded policy,
    /// or, when an earlier Attempt of the Job changed its ordered policy
    /// while running, the last change its Trace holds. A Trace that cannot
    /// be read leaves an ordered policy denying everything, never the
    /// create-time rules a change may have removed.
    fn starting_network(&mut self) -> pvisor_core::records::EffectiveNetwork {
        let mut network = self.run.operation.policy.network.clone();
        let Some(ordered) = network.ordered.as_mut() else { return network };
        if self.attempt.id.number() <= 1 {
            return network;
        }
        match crate::records::views::events(&self.store, &self.run.id) {
            Ok((events, _)) => {
                let last = events
                    .iter()
                    .rev()
                    .filter(|e| e.kind == EventKind::NetworkPolicyChanged)
                    .find_map(|e| serde_json::from_value(e.data["policy"].clone()).ok());
                if let Some(changed) = last {
                    *ordered = changed;
                }
            }
            Err(e) => {
                self.warnings.push(format!(
                    "the Trace's policy changes cannot be read ({e}): every connection is denied"
                ));
                ordered.default_action = pvisor_core::records::RuleAction::Deny;
                ordered.rules.clear();
            }
        }
        network
    }

    /// Records a policy change the control socket put in force, and tells
    /// the frontend once it is recorded (or why it is not).
    fn record_policy_change(&mut self, change: super::job_control::PolicyChange) {
        let data = data::NetworkPolicyChanged { policy: &change.policy };
        let recorded = self.emit(EventKind::NetworkPolicyChanged, &data).map(|_| ()).map_err(|e| {
            format!("the change is in force but not recorded, so a resume would not keep it: {e}")
        });
        let _ = change.recorded.send(recorded);
    }

    /// Records a command a frontend ran through the guest, within the
    /// Trace's bound: the same command text counts as one key (its first
    /// runs written, the rest counted), like requests to one host.
    fn record_note(&mut self, note: &super::job_control::FrontendNote) {
        self.record_within_bound(EventKind::FrontendCommand, &note.command, note);
    }

    /// Records what the proxy reported: a request (or forwarded
    /// connection), or a `--secret` put into one (by variable, never value).
    fn record_net_event(&mut self, event: pvisor_net::proxy::NetEvent) {
        use pvisor_net::proxy::NetEvent;
        match event {
            NetEvent::Request(event) => self.record_network(event),
            NetEvent::Substituted(substitution) => {
                let host = substitution.host.clone();
                self.record_within_bound(EventKind::NetworkSecretSubstituted, &host, &substitution);
            }
            NetEvent::Injected(injection) => {
                let host = injection.host.clone();
                self.record_within_bound(EventKind::NetworkCredentialInjected, &host, &injection);
            }
        }
    }

    /// Records `data` as a `kind` event if the Trace's bound admits one
    /// more of that kind for `key` (a host, a command), else counts it.
    fn record_within_bound(&mut self, kind: EventKind, key: &str, data: &impl serde::Serialize) {
        let events = self.store.events_file(&self.run.id);
        let size = || std::fs::metadata(&events).map_or(0, |m| m.len());
        if self.budget.admit(&kind, key, size) {
            self.record_best_effort(kind, data);
        }
    }

    /// Records one proxied request (or forwarded connection) in the Trace
    /// and the tally: connected, failed (allowed, nothing reached) or denied.
    pub(super) fn record_network(&mut self, event: pvisor_net::proxy::ProxyEvent) {
        use pvisor_net::proxy::Outcome;
        let kind = match event.outcome {
            Outcome::Connected => {
                self.network.allowed += 1;
                EventKind::NetworkAllowed
            }
            Outcome::Failed => {
                self.network.failed += 1;
                let destination = (event.host.clone(), event.port);
                *self.network.failed_destinations.entry(destination).or_default() += 1;
                EventKind::NetworkFailed
            }
            Outcome::Denied => {
                self.network.denied += 1;
                *self.network.denied_hosts.entry(event.host.clone()).or_default() += 1;
                EventKind::NetworkDenied
            }
        };
        let events = self.store.events_file(&self.run.id);
        let size = || std::fs::metadata(&events).map_or(0, |m| m.len());
        if self.budget.admit(&kind, &event.host, size) {
            self.record_best_effort(kind, &event);
        }
    }

    /// Says what the Trace's bound held back, once the proxy is drained.
    fn record_coalesced(&mut self) {
        let Some(summary) = self.budget.summary() else { return };
        let data = serde_json::to_value(&summary).unwrap_or_default();
        self.record_best_effort(EventKind::TraceCoalesced, &data);
    }

    pub(super) fn network_observation(&self) -> NetworkObservation {
        let mut top: Vec<(String, u64)> =
            self.network.denied_hosts.iter().map(|(h, n)| (h.clone(), *n)).collect();
        top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        top.truncate(5);
        let mut failed: Vec<(String, u16, u64)> =
            self.network.failed_destinations.iter().map(|((h, p), n)| (h.clone(), *p, *n)).collect();
        failed.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| (&a.0, a.1).cmp(&(&b.0, b.1))));
        failed.truncate(5);
        NetworkObservation {
            attachment: self.executor.describe_attachment(self.spec.network),
            non_bypassable: self.spec.network.non_bypassable(),
            allowed: self.network.allowed,
            failed: self.network.failed,
            denied: self.network.denied,
            top_denied: top,
            top_failed: failed,
        }
    }
}

/// Runs blocking Session work (copying a checkpoint into the stage,
/// scanning and sealing it, hashing, fsyncs) on Tokio's blocking pool, so
/// the runtime's own threads keep serving other Jobs' tasks (the daemon's
/// streams, the proxies) meanwhile. A panic in `work` is resumed here.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
