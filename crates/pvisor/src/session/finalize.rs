//! Finalizing an Attempt once its sandbox is gone (a suspended vm Attempt
//! commits its termination receipt instead).
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

use std::path::PathBuf;
use std::time::Duration;

use pvisor_core::event::EventKind;
use pvisor_core::records::{
    Bundle, ChangeEntry, CompletionReceipt, Observations, RunBinding, RunResult, FORMAT,
};
use pvisor_core::state::{AttemptState, JobState, ResultState};
use pvisor_core::store;
use pvisor_core::time::Timestamp;
use pvisor_sandbox::{Termination, Usage};

use super::outcome::{OwnerHold, RunEnd, RunError, RunOutcome, SuspendedOutcome};
use crate::failpoint;
use crate::records::attempt;
use crate::records::completion;
use crate::records::suspension;

use super::{Ending, Session};
use crate::trace::data;

impl Session {
    /// Ends a suspended Attempt: the checkpoint is published and QEMU reaped,
    /// so commit the termination receipt, then project it (attempt
    /// `hibernated`, Run `suspended`) and publish `run.hibernated`.
    pub(super) fn finalize_suspended(
        mut self,
        checkpoint: pvisor_vm::ExecCheckpoint,
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
        let data = data::RunHibernated {
            checkpoint: &checkpoint.id,
            vm_exit: &vm_exit,
            paused_ms: checkpoint.paused_ms,
            save_ms: checkpoint.save_ms,
            receipt: "termination.json",
        };
        if let Err(e) = self.trace.emit(
            EventKind::RunHibernated,
            Some(self.attempt.id.number()),
            Some(self.attempt_event),
            &data,
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
            owner: OwnerHold::new(self._lock),
        }))
    }

    /// Why the kernel's OOM killer acted, naming the memory limit.
    fn oom_error(&self) -> String {
        let limit = self
            .limits
            .iter()
            .find(|l| l.limit == pvisor_core::records::LimitKind::Memory)
            .map_or("?".into(), |l| l.value.clone());
        format!("killed by the kernel's OOM killer: the {limit} memory limit was reached")
    }

    pub(super) fn result_of(&self, ending: &Ending, started_at: Timestamp) -> RunResult {
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
                // A SIGKILL passed on as a status (a shell's child; a
                // container's exit that its VM's keeper ends with) is the
                // OOM killer's when the kernel reported one.
                Termination::Exited(code) if report.oom_killed && *code == 128 + libc::SIGKILL => {
                    (ResultState::Failed, Some(*code), None, Some(self.oom_error()))
                }
                Termination::Exited(code) => (ResultState::Failed, Some(*code), None, None),
                Termination::Signaled(sig) if report.oom_killed => {
                    (ResultState::Failed, None, Some(*sig), Some(self.oom_error()))
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

    /// Finalizes the Attempt in the documented order (see the module doc):
    /// seal the stage, save the Bundle, save the Run projection and commit
    /// the receipt, publish the terminal event.
    pub(super) fn finalize(
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
        self.use_reserve_if_full();
        // Step 1: the sandbox is gone; seal the stage and take its manifest.
        let (changes, preimages_bytes) = self.seal_step(&result, baseline)?;
        // Step 2: the Bundle fixes the result and observations.
        let observations = self.observations(wall, &usage);
        let receipt = self.save_bundle(&result, &changes, observations.clone(), &preimages_bytes)?;
        // Step 3: the Run projection, then the receipt that makes it true.
        self.commit_result(&result, restore_failed_from, &receipt)?;
        // Step 4: from here on, nothing may contradict the receipt.
        let audit_gaps = self.publish_terminal(&result, changes.len());
        Ok(RunOutcome {
            job: self.job.id.clone(),
            run: self.run.id.clone(),
            attempt: self.attempt.id.clone(),
            workspace: self.run.workspace.clone(),
            result,
            changes,
            bundle_blake3: receipt.bundle.blake3,
            network: observations.network,
            warnings: self.warnings,
            audit_gaps,
            restore_failed_from,
            job_record: self.job,
            owner: OwnerHold::new(self._lock),
        })
    }

    /// A command that filled the state directory's filesystem (bytes or
    /// inodes) must not cost the run its records: the reserve is for them.
    fn use_reserve_if_full(&mut self) {
        if self.store.is_short_of_space() && self.store.release_reserve() {
            self.warnings.push(
                "the state directory's filesystem is full: its reserve was released to record this run"
                    .into(),
            );
        }
    }

    /// Step 1: records the exit, seals the stage, takes its manifest and
    /// saves the conflict baselines (their bytes, which the Bundle binds).
    fn seal_step(
        &mut self,
        result: &RunResult,
        baseline: i128,
    ) -> Result<(Vec<ChangeEntry>, Vec<u8>), RunError> {
        attempt::advance(&self.store, &mut self.attempt, AttemptState::Finalizing)
            .map_err(|e| self.finalize_error("marking the attempt finalizing", e.into()))?;
        let exited = data::AttemptExited {
            exit_code: result.exit_code,
            signal: result.signal,
            error: result.error.as_deref(),
        };
        self.emit(EventKind::AttemptExited, &exited)
            .map_err(|e| self.finalize_error("recording the exit", e.into()))?;
        // Read before the first staged file is hashed: see `Preimages::sealed_ns`.
        let sealed_ns = pvisor_core::time::coarse_realtime_ns();
        if !self.state.paths.is_empty() {
            // Agent state is the Job's, never the stage's: only its single
            // files need taking out of their parents' layers.
            if let Err(e) = crate::agent_state::collect(&self.store, &self.run.id) {
                self.warnings
                    .push(format!("agent state not kept whole: {}", super::prepare::with_sources(&e)));
            }
        }
        let scanned = self.seal_stage()?;
        let preimages = self.baselines(&scanned, baseline, sealed_ns)?;
        let changes = scanned.changes;
        let without_baseline = preimages
            .entries
            .iter()
            .filter(|e| matches!(e.preimage, pvisor_stage::preimage::Preimage::Unknown { .. }))
            .count();
        let preimages_file = self.store.stage_dir(&self.run.id).join("preimages.json");
        let preimages_bytes = store::to_json_bytes(&preimages);
        store::write_atomic(&preimages_file, &preimages_bytes)
            .map_err(|e| self.finalize_error("saving the conflict baselines", e.into()))?;
        self.emit(EventKind::StageSealed, &data::StageSealed { changes: changes.len(), without_baseline })
            .map_err(|e| self.finalize_error("recording the sealed stage", e.into()))?;
        failpoint::hit("after-seal");
        Ok((changes, preimages_bytes))
    }

    /// The conflict baselines of the scanned changes: what the host held when
    /// the run started (for a fork, before the *first* sandbox touched a path
    /// the parent changed).
    fn baselines(
        &self,
        scanned: &pvisor_stage::Scanned,
        baseline: i128,
        sealed_ns: i128,
    ) -> Result<pvisor_stage::preimage::Preimages, RunError> {
        use pvisor_stage::preimage::{capture, CopyUps};
        // Only a stage the overlay wrote from the first has a copy-up mark on
        // every directory it took from the workspace: a VM's exported stage
        // has none, and a fork's restored one none on what the parent took.
        let copy_ups = match (&self.spec.vm, &self.restore_from) {
            (None, None) => CopyUps::Marked(&scanned.copied_up),
            _ => CopyUps::Unmarked,
        };
        let mut preimages = capture(&self.spec.workspace, &scanned.changes, copy_ups, baseline)
            .map_err(|e| self.finalize_error("recording the conflict baselines", e.into()))?;
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
        Ok(preimages)
    }

    /// What was observed of the run: time, CPU, memory, network, limits,
    /// and the userland a vm command ran in (`--image`).
    fn observations(&self, wall: Duration, usage: &Usage) -> Observations {
        let image = self.run.operation.policy.image.as_ref();
        let image = image.map(|i| ("image".to_owned(), format!("{} {}", i.name, i.digest)));
        Observations {
            wall_ms: wall.as_millis() as u64,
            user_cpu_ms: usage.user_cpu.as_millis() as u64,
            system_cpu_ms: usage.system_cpu.as_millis() as u64,
            max_rss_kib: usage.max_rss_kib,
            network: Some(self.network_observation()),
            extra: self
                .limits
                .iter()
                .map(|l| (format!("limit.{}", l.limit), format!("{} via {}", l.value, l.by)))
                .chain(image)
                .collect(),
        }
    }

    /// Step 2: the Bundle fixes the result and observations, and binds the
    /// Run, the baselines and the Trace so far; returns the receipt that
    /// will confirm it.
    fn save_bundle(
        &mut self,
        result: &RunResult,
        changes: &[ChangeEntry],
        observations: Observations,
        preimages_bytes: &[u8],
    ) -> Result<CompletionReceipt, RunError> {
        let trace = pvisor_core::journal::Journal::new(self.store.events_file(&self.run.id))
            .seal_prefix()
            .map_err(|e| self.finalize_error("sealing the Trace", e.into()))?;
        let bundle = Bundle {
            format: FORMAT,
            job: self.job.id.clone(),
            run: self.run.id.clone(),
            attempt: self.attempt.id.clone(),
            result: result.clone(),
            observations,
            changes: changes.to_vec(),
            warnings: self.warnings.clone(),
            incomplete: self.stage_incomplete.clone(),
            binding: Some(RunBinding {
                run_blake3: self.run.fixed_digest(),
                preimages_blake3: Some(store::blake3_hex(preimages_bytes)),
                trace: Some(trace),
            }),
        };
        let bundle_bytes = store::to_json_bytes(&bundle);
        store::commit_no_clobber(&self.store.bundle_file(&self.attempt.id), &bundle_bytes)
            .map_err(|e| self.finalize_error("saving the Bundle", e.into()))?;
        failpoint::hit("after-bundle");
        let receipt = completion::build(&self.job.id, &self.attempt.id, result, &bundle_bytes);
        let saved = data::BundleSaved {
            file: "bundle.json",
            size: receipt.bundle.size,
            blake3: &receipt.bundle.blake3,
        };
        self.emit(EventKind::BundleSaved, &saved)
            .map_err(|e| self.finalize_error("recording the Bundle", e.into()))?;
        Ok(receipt)
    }

    /// Step 3: the Run projection, then the receipt that makes it true. A
    /// failed restore leaves the Run suspended (its result is still to
    /// come) and the Job targeting its previous Attempt.
    fn commit_result(
        &mut self,
        result: &RunResult,
        restore_failed_from: Option<u32>,
        receipt: &CompletionReceipt,
    ) -> Result<(), RunError> {
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
            crate::records::recovery::update_job(&self.store, &self.job.id, |job| {
                let retarget = job.target_attempt == this;
                if retarget {
                    job.target_attempt = previous;
                }
                retarget
            })
            .map_err(|e| self.finalize_error("re-targeting the suspended Attempt", e.into()))?;
        }
        completion::commit(&self.store, receipt)
            .map_err(|e| self.finalize_error("committing the completion receipt", e.into()))?;
        failpoint::hit("after-receipt");
        Ok(())
    }

    /// Step 4: the Attempt's projection and the terminal event. Nothing here
    /// may contradict the receipt: a failure is an audit gap, returned.
    fn publish_terminal(&mut self, result: &RunResult, changes: usize) -> Vec<String> {
        let mut audit_gaps = Vec::new();
        if let Err(e) = attempt::advance(&self.store, &mut self.attempt, result.state.attempt_state()) {
            audit_gaps.push(format!("attempt.json not updated: {e}"));
        }
        failpoint::hit("before-terminal-event");
        let terminal = result.state.terminal_event();
        let data = data::RunEnded {
            exit_code: result.exit_code,
            signal: result.signal,
            error: result.error.as_deref(),
            changes,
            receipt: "completion.json",
        };
        let (attempt, cause) = (Some(self.attempt.id.number()), Some(self.attempt_event));
        if let Err(e) = self.trace.emit(terminal.clone(), attempt, cause, &data, true) {
            audit_gaps.push(format!("terminal event {terminal} not written: {e}"));
        }
        audit_gaps
    }

    pub(super) fn seal_stage(&mut self) -> Result<pvisor_stage::Scanned, RunError> {
        let upper: PathBuf = self.spec.upper.clone();
        if !upper.is_dir() {
            return Ok(pvisor_stage::Scanned::default());
        }
        pvisor_stage::seal(&upper).map_err(|e| self.finalize_error("sealing the stage", e.into()))?;
        let scanned = pvisor_stage::scan_counted(&upper, &self.spec.workspace)
            .map_err(|e| self.finalize_error("reading the stage", e.into()))?;
        if scanned.beyond_limit > 0 {
            self.warnings.push(format!(
                "{} staged entries lie at paths longer than {} bytes: they are not in the manifest, \
                 cannot be reviewed or applied, and are removed with the stage",
                scanned.beyond_limit,
                pvisor_stage::RECORDED_PATH_MAX
            ));
        }
        Ok(scanned)
    }
}
