//! The vm executor's execution checkpoints: `pvisor checkpoint --kind
//! execution`, `pvisor suspend`, `pvisor resume` and `pvisor fork --state
//! execution`. Checkpoints of a live VM are taken by its supervisor (the
//! `pvisor run` that owns the Attempt) over the Attempt's control socket.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

use pvisor::admission::ExecutionFork;
use pvisor::runtime::job_service::views;
use pvisor::runtime::suspension;
use pvisor::JobService;
use pvisor_core::ids::{AttemptId, JobId};
use pvisor_core::records::{JobRecord, RunRecord};
use pvisor_core::state::JobState;
use pvisor_core::store::{OwnerLock, Store};
use pvisor_sandbox::vm::{self, ControlRequest, ControlResponse, ExecCheckpoint, VmExecutor};

use crate::cli::{ForkArgs, ResumeArgs, SuspendArgs};
use crate::output::json_line;

/// How long a checkpoint may take (a large guest under TCG is slow).
const CONTROL_TIMEOUT: Duration = Duration::from_secs(600);

fn records(store: &Store, job: &JobId) -> anyhow::Result<(JobRecord, RunRecord, AttemptId)> {
    let job_record: JobRecord = store.read(&store.job_file(job))?;
    let run: RunRecord = store.read(&store.run_file(&job_record.run))?;
    let executor = &run.operation.placement.executor;
    if executor != "vm" {
        bail!("Job {job} ran on the {executor} executor; execution checkpoints need a Job started with --executor vm");
    }
    let attempt = AttemptId::new(run.id.clone(), job_record.target_attempt);
    Ok((job_record, run, attempt))
}

/// Asks the live supervisor of `job` for a checkpoint (or a suspension).
fn request(store: &Store, job: &JobId, request: ControlRequest) -> anyhow::Result<ExecCheckpoint> {
    let (job_record, _, attempt) = records(store, job)?;
    if !OwnerLock::is_held(&store.lock_file(&attempt))? {
        let state = views::status(store, job)?.state;
        bail!("Job {job} is not running (state: {state}); only a running vm Job has execution state to save");
    }
    if !job_record.continuation {
        bail!("Job {job} is being killed; its execution can no longer be saved");
    }
    let dir = store.attempt_dir(&attempt).join("vm");
    match vm::control(&dir, &request, CONTROL_TIMEOUT).map_err(|e| anyhow!(e))? {
        ControlResponse::Checkpointed { manifest } => Ok(*manifest),
        ControlResponse::Forwarded => {
            bail!("the supervisor of job {job} answered a checkpoint request with `forwarded`")
        }
        ControlResponse::Error { message } => {
            bail!("Cannot save the execution state of job {job}: {message}")
        }
    }
}

fn print_manifest(manifest: &ExecCheckpoint, json: bool, verb: &str) -> anyhow::Result<()> {
    if json {
        json_line(&mut std::io::stdout().lock(), "checkpoint", manifest)?;
    } else {
        let state = manifest.files.iter().find(|f| f.name == vm::checkpoint::STATE).map_or(0, |f| f.size);
        println!(
            "{}: {verb} (guest paused {} ms, saved in {} ms; machine state {:.1} MB, {} MiB RAM, {})",
            manifest.id,
            manifest.paused_ms,
            manifest.save_ms,
            state as f64 / 1e6,
            manifest.machine.memory_mib,
            manifest.machine.accelerator.as_str()
        );
    }
    Ok(())
}

pub fn cmd_checkpoint_execution(store: &Store, job: &JobId, json: bool) -> anyhow::Result<i32> {
    let manifest = request(store, job, ControlRequest::Checkpoint)?;
    print_manifest(&manifest, json, &format!("execution checkpoint of {job}, which keeps running"))?;
    if !json {
        let me = crate::output::me();
        println!("next: {me} fork {job} --state execution --checkpoint {}", manifest.id);
    }
    Ok(0)
}

pub fn cmd_suspend(args: SuspendArgs) -> anyhow::Result<i32> {
    let store = super::open_store()?;
    let job = super::resolve_job(&store, args.job.as_deref())?;
    let manifest = request(&store, &job, ControlRequest::Suspend)?;
    // The supervisor reaps QEMU and commits the termination receipt; wait for it.
    let (_, _, attempt) = records(&store, &job)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while OwnerLock::is_held(&store.lock_file(&attempt))? {
        if Instant::now() > deadline {
            bail!(
                "the VM of {job} was saved as {}, but its supervisor has not finished after 120 s",
                manifest.id
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let state = views::status(&store, &job)?.state;
    if state != JobState::Suspended {
        bail!(
            "the VM of {job} was saved as {}, but the Job is {state}; see `pvisor events {job}`",
            manifest.id
        );
    }
    print_manifest(&manifest, args.json, &format!("{job} suspended; its VM has exited"))?;
    if !args.json {
        let me = crate::output::me();
        println!("next: {me} resume {job}  ·  {me} fork {job} --state execution  ·  {me} kill {job}");
    }
    Ok(0)
}

pub fn cmd_resume(args: ResumeArgs) -> anyhow::Result<i32> {
    let store = super::open_store()?;
    let job = super::resolve_job(&store, args.job.as_deref())?;
    let state = views::status(&store, &job)?.state;
    let (job_record, _, _) = records(&store, &job)?;
    if !job_record.continuation {
        bail!("Job {job} was killed; its continuation rights are withdrawn and it cannot be resumed");
    }
    let (_, _, manifest) = suspension::resumable(&store, &job_record)?.ok_or_else(|| {
        anyhow!("Job {job} is {state}, not suspended; only a suspended vm Job can be resumed (pvisor suspend {job})")
    })?;
    let executor = Arc::new(VmExecutor::for_checkpoint(store.root(), &manifest)?);
    let service = JobService::new(store, executor);
    super::run::drive(args.quiet, move || service.resume(&job).with_context(|| "Cannot resume"))
}

pub fn cmd_fork_execution(store: Store, args: &ForkArgs) -> anyhow::Result<i32> {
    if !args.command.is_empty() {
        bail!(
            "an execution fork continues the parent's command from its checkpoint and takes no COMMAND; \
             drop `-- {}` (or use --state workspace to run a new command over the parent's files)",
            args.command.join(" ")
        );
    }
    let parent = views::resolve_job(&store, Some(&args.from))?;
    let (job_record, run, attempt) = records(&store, &parent)?;
    if !job_record.continuation {
        bail!("Job {parent} was killed; its execution checkpoints can no longer be forked");
    }
    let live = OwnerLock::is_held(&store.lock_file(&attempt))?;
    let (dir, manifest) = match (&args.checkpoint, live) {
        (Some(id), _) => suspension::find_verified(&store, &parent, &run.id, Some(id))?,
        (None, true) => {
            let taken = request(&store, &parent, ControlRequest::Checkpoint)?;
            if !args.run.quiet {
                eprintln!(
                    "pvisor: checkpointed the running VM of {parent} as {} (paused {} ms)",
                    taken.id, taken.paused_ms
                );
            }
            suspension::find_verified(&store, &parent, &run.id, Some(taken.id.as_str()))?
        }
        (None, false) => match suspension::load(&store, &parent, &attempt)? {
            Some((receipt, _)) => {
                suspension::find_verified(&store, &parent, &run.id, Some(receipt.checkpoint.as_str()))?
            }
            None => suspension::find_verified(&store, &parent, &run.id, None)?,
        },
    };
    // Held until the fork is done, as a workspace checkpoint is: gc leaves it alone.
    let _hold = pvisor::runtime::checkpoint::hold(&store, &manifest.id)?;
    let executor = Arc::new(VmExecutor::for_checkpoint(store.root(), &manifest)?);
    if !args.run.quiet {
        eprintln!("pvisor: forking the execution of {parent} from {}", manifest.id);
    }
    let command: Vec<String> =
        std::iter::once(run.operation.program.clone()).chain(run.operation.args.iter().cloned()).collect();
    let workspace = manifest.workspace.clone();
    let fork = ExecutionFork { parent, dir, manifest };
    super::run::execute(store, executor, workspace, None, Some(fork), &args.run, &command)
}
