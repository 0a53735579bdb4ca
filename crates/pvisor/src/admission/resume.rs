//! Resume: admitting a new Attempt of a suspended vm Job.
//!
//! The new Attempt continues the same Run from the checkpoint its
//! termination receipt names, under the Operation and policy recorded at
//! the first admission; nothing of the original request is re-read.

use serde_json::json;

use pvisor_core::event::EventKind;
use pvisor_core::ids::{AttemptId, JobId};
use pvisor_core::records::{JobRecord, RunRecord};
use pvisor_core::store::{self, OwnerLock, Store};
use pvisor_core::time::Timestamp;
use pvisor_sandbox::SandboxSpec;

use super::{fork, policy, records, AdmissionError, Admitted};
use crate::trace::{data, Trace};

/// Admits the resumption of a suspended vm Job: a new Attempt of the same
/// Run that restores the checkpoint named by the termination receipt. Every
/// check (continuation, owner, receipt, every checkpoint file's digest) runs
/// before any record changes, so a refused resume leaves the Job `suspended`.
pub fn admit_resume(
    store: &Store,
    executor: &dyn pvisor_sandbox::Executor,
    job_id: &JobId,
) -> Result<Admitted, AdmissionError> {
    use crate::records::suspension;
    let not = |reason: String| AdmissionError::NotResumable { job: job_id.clone(), reason };
    // Finish the records of a supervisor that died after its termination receipt.
    crate::records::recovery::recover(store, job_id).map_err(|e| match e {
        crate::records::views::ViewError::Store(s) => AdmissionError::Store(s),
        other => not(other.to_string()),
    })?;
    let _guard = OwnerLock::acquire_blocking(&store.job_dir(job_id).join("recover.lock"))?;
    let mut job: JobRecord = store.read(&store.job_file(job_id))?;
    if !job.continuation {
        return Err(not("it was killed; its continuation rights are withdrawn".into()));
    }
    let target = AttemptId::new(job.run.clone(), job.target_attempt);
    if OwnerLock::is_held(&store.lock_file(&target))? {
        return Err(not(format!("{target} is still live; suspend it first (pvisor suspend {job_id})")));
    }
    let (previous, receipt, _) = suspension::resumable(store, &job)
        .map_err(|source| AdmissionError::Suspension { job: job_id.clone(), source })?
        .ok_or_else(|| {
            not(format!("it is {}, not suspended (no termination receipt to resume from)", job.state))
        })?;
    let dir = suspension::checkpoint_dir(store, &job.run, &receipt.checkpoint);
    let manifest = pvisor_vm::checkpoint::verify(&dir).map_err(|e| AdmissionError::Suspension {
        job: job_id.clone(),
        source: suspension::SuspensionError::Checkpoint(e.to_string()),
    })?;

    let now = Timestamp::now();
    let mut run: RunRecord = store.read(&store.run_file(&job.run))?;
    let number = run.attempts.max(job.target_attempt) + 1;
    let attempt_id = AttemptId::new(run.id.clone(), number);
    store::create_dir_all_durable(&store.attempt_dir(&attempt_id))?;
    let lock = OwnerLock::acquire(&store.lock_file(&attempt_id))?;
    let attempt = records::new_attempt(&attempt_id, job_id, executor.name(), now);
    store.write(&store.attempt_file(&attempt_id), &attempt)?;
    run.attempts = number;
    run.updated_at = now;
    store.write(&store.run_file(&run.id), &run)?;
    job.target_attempt = number;
    job.updated_at = now;
    store.write(&store.job_file(job_id), &job)?;

    let mut trace = Trace::open(store, &run.id);
    let requested = trace.emit(
        EventKind::ResumeRequested,
        Some(number),
        None,
        &data::ResumeRequested { from_attempt: &previous, checkpoint: &manifest.id },
        false,
    )?;
    let created =
        data::AttemptCreated { attempt: &attempt_id, executor: executor.name(), restore: Some(&manifest.id) };
    let attempt_event =
        trace.emit(EventKind::AttemptCreated, Some(number), Some(requested), &created, false)?;
    let operation = &run.operation;
    let stage = store.stage_dir(&run.id);
    let mut context = manifest.context.clone();
    context["attempt"] = json!(attempt_id);
    let spec = SandboxSpec {
        workspace: run.workspace.clone(),
        cwd: operation.cwd.clone(),
        upper: stage.join("upper"),
        work: stage.join("work"),
        root_mount: stage.join("root"),
        hidden: operation.policy.hidden_paths.clone(),
        start_at_coarse_ns: None,
        caches: Vec::new(),
        exposed_sockets: operation.policy.exposed_sockets.clone(),
        read_only: operation.policy.read_only.clone(),
        ca_bundle: None,
        state: Vec::new(),
        program: operation.program.clone(),
        args: operation.args.clone(),
        // The command's environment lives on inside the restored guest.
        env: Vec::new(),
        hostname: "pvisor".into(),
        network: policy::attachment_for(operation.policy.network.mode),
        loopback_forwards: policy::loopback_forwards(&operation.policy.network),
        seccomp: operation.policy.seccomp,
        limits: operation.policy.limits.clone(),
        vm: Some(pvisor_vm::VmSpec {
            dir: store.attempt_dir(&attempt_id).join("vm"),
            checkpoints: store.exec_checkpoints_dir(&run.id),
            restore: Some(dir),
            context,
            network_namespace: operation.policy.network.namespace.clone(),
            shared_directories: operation.policy.shared_directories.clone(),
            image: operation.policy.image.clone(),
        }),
        // A resumed VM's output goes to whoever resumed it.
        output: None,
    };
    let baseline = fork::checkpoint_baseline(&manifest);
    let resumed_from = Some(previous.number());
    Ok(Admitted {
        job,
        run,
        attempt,
        trace,
        spec,
        lock,
        attempt_event,
        restore_from: None,
        baseline,
        resumed_from,
        // A resumed VM never had a broker (vm runs refuse --secret).
        brokered: None,
        state: crate::agent_state::Plan::default(),
    })
}
