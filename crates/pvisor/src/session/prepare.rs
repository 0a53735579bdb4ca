//! Preparing an Attempt: the stage directories (or a fork's restored
//! stage), the sandbox started on its own thread, and the Attempt, Run and
//! Job marked running.

use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
use std::path::PathBuf;

use pvisor_core::event::EventKind;
use pvisor_core::state::{AttemptState, JobState};
use pvisor_core::store;
use pvisor_core::time::Timestamp;
use pvisor_sandbox::SandboxError;

use super::outcome::RunError;
use crate::records::attempt::{self, AttemptError};
use crate::trace::data;

use super::{Session, Started};

impl Session {
    /// Creates `upper/`, `work/` and `root/`; the upper root takes the workspace
    /// root's mode (and owner, when we may chown) because overlay shows it as the
    /// workspace directory itself.
    pub(super) fn prepare_stage(&self) -> Result<(), SandboxError> {
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
        if rustix::process::geteuid().is_root() {
            chown(&self.spec.upper, Some(meta.uid()), Some(meta.gid()))
                .map_err(|e| setup(format!("cannot chown {}", self.spec.upper.display()), e))?;
        }
        Ok(())
    }

    /// Makes the Job's agent state (`--state`) before the sandbox starts:
    /// carried, promoted or the host's, gated changes held back.
    pub(super) fn prepare_state(&self) -> Result<(), SandboxError> {
        crate::agent_state::prepare(&self.store, &self.run.id, &self.state, &self.spec.hidden).map_err(|e| {
            SandboxError::Setup {
                step: "state".into(),
                message: with_sources(&e),
                hint: Some("check that PVISOR_HOME is writable and has free space".into()),
            }
        })
    }

    pub(super) fn inherited_preimages_path(&self) -> PathBuf {
        self.store.stage_dir(&self.run.id).join("preimages.inherited.json")
    }

    pub(super) fn mark_running(&mut self) -> Result<(), RunError> {
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
        let updated = crate::records::recovery::update_job(&self.store, &self.job.id, |job| {
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

    /// Starts the sandbox on a dedicated thread that also waits for it.
    ///
    /// The helper dies with the *thread* that forked it (`PR_SET_PDEATHSIG`
    /// follows the parent thread), so starting on a pooled blocking thread that
    /// may retire while the sandbox runs would kill it; this thread lives
    /// exactly as long as the sandbox.
    pub(super) async fn start_sandbox(&self) -> Result<Started, SandboxError> {
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
                        super::NetworkListeners {
                            proxy: process.take_proxy_listener(),
                            forwards: process.take_forward_listeners(),
                        },
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

    /// Records that the command runs: the Attempt, Run and Job marked
    /// running, `attempt.started`, the executor's facts and how each limit
    /// is enforced (warning about a requested one that is not).
    pub(super) fn record_start(
        &mut self,
        limits: Vec<pvisor_sandbox::limits::Enforcement>,
        facts: Option<serde_json::Value>,
    ) -> Result<(), RunError> {
        self.mark_running()?;
        self.emit(EventKind::AttemptStarted, &data::AttemptStarted { executor: self.executor.name() })
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
            let kind = EventKind::executor_facts(self.executor.name());
            self.record_best_effort(kind, &facts);
        }
        if !limits.is_empty() {
            self.record_best_effort(EventKind::AttemptLimits, &data::AttemptLimits { limits: &limits });
            // A limit the user asked for and did not get is warned
            // about; pvisor's own default is recorded (attempt.limits,
            // the Bundle) and shown by `pvisor doctor`, not on every run.
            for l in &limits {
                if !l.enforced() && !self.spec.limits.is_default(l.limit) {
                    self.warnings.push(format!("--{} {} is {}", l.limit, l.value, l.by));
                }
            }
            self.limits = limits;
        }
        Ok(())
    }
}

/// `e` with each of its sources, as a setup failure carries one message.
pub(super) fn with_sources(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        message.push_str(&format!(": {s}"));
        source = s.source();
    }
    message
}
