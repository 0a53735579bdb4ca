//! The vm executor's execution checkpoints: `pvisor checkpoint --kind
//! execution`, `pvisor suspend`, `pvisor resume` and `pvisor fork --state
//! execution`. Checkpoints of a live VM are taken by its supervisor (the
//! `pvisor run` that owns the Attempt) over the Attempt's control socket.

use anyhow::{bail, Context};

use pvisor::actions::{CheckpointExecution, PrepareExecutionFork, ResolveJob, Resume, Suspend};
use pvisor::Runtime;
use pvisor_core::ids::JobId;
use pvisor_vm::{self as vm, ExecCheckpoint};

use crate::cli::{ForkArgs, ResumeArgs, SuspendArgs};
use crate::json::{json_line, JsonType};
use crate::results::{CheckpointResult, SuspendResult};
use pvisor_core::state::JobState;

/// A `fork` line: the Job and checkpoint a fork starts from, and what it
/// restores (`workspace` or `execution`).
#[derive(Debug, serde::Serialize)]
pub struct ForkLine<'a> {
    pub parent: &'a JobId,
    pub checkpoint: &'a str,
    pub state: &'static str,
}

fn print_manifest(manifest: &ExecCheckpoint, json: bool, verb: &str) -> anyhow::Result<()> {
    if json {
        json_line(&mut crate::output::stdout(), JsonType::Checkpoint, manifest)?;
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

pub fn cmd_checkpoint_execution(runtime: &Runtime, job: &JobId, json: bool) -> anyhow::Result<i32> {
    let manifest = runtime.execute(CheckpointExecution { job: job.clone() })?;
    print_manifest(&manifest, json, &format!("execution checkpoint of {job}, which keeps running"))?;
    if json {
        let result = CheckpointResult {
            job: job.clone(),
            checkpoint: manifest.id.to_string(),
            kind: "execution",
            entries: None,
            copy_method: None,
        };
        json_line(&mut crate::output::stdout(), JsonType::Result, &result)?;
    } else {
        let me = crate::output::me();
        println!("next: {me} fork {job} --state execution --checkpoint {}", manifest.id);
    }
    Ok(0)
}

pub fn cmd_suspend(runtime: &Runtime, args: SuspendArgs) -> anyhow::Result<i32> {
    let job = super::resolve_job(runtime, args.job.as_deref())?;
    super::containerd_owned::refuse_if_running(runtime, &job, super::containerd_owned::Change::Suspend)?;
    let manifest = runtime.execute(Suspend { job: job.clone() })?;
    print_manifest(&manifest, args.json, &format!("{job} suspended; its VM has exited"))?;
    if args.json {
        let result = SuspendResult { job, state: JobState::Suspended, checkpoint: manifest.id.to_string() };
        json_line(&mut crate::output::stdout(), JsonType::Result, &result)?;
    } else {
        let me = crate::output::me();
        println!("next: {me} resume {job}  ·  {me} fork {job} --state execution  ·  {me} kill {job}");
    }
    Ok(0)
}

pub fn cmd_resume(runtime: &Runtime, args: ResumeArgs) -> anyhow::Result<i32> {
    let job = super::resolve_job(runtime, args.job.as_deref())?;
    super::containerd_owned::refuse_if_running(runtime, &job, super::containerd_owned::Change::Resume)?;
    super::run::drive(runtime, super::run::Shown::quiet(args.quiet), move || {
        runtime.execute(Resume { job }).context("Cannot resume")
    })
}

pub fn cmd_fork_execution(runtime: &Runtime, args: &ForkArgs) -> anyhow::Result<i32> {
    if !args.command.is_empty() {
        bail!(
            "an execution fork continues the parent's command from its checkpoint and takes no COMMAND; \
             drop `-- {}` (or use --state workspace to run a new command over the parent's files)",
            args.command.join(" ")
        );
    }
    if let Some(image) = &args.run.image {
        bail!(
            "an execution fork continues in the userland its checkpoint holds; drop --image {image} \
             (or use --state workspace to run a new command in another image)"
        );
    }
    let parent = runtime.execute(ResolveJob { query: Some(args.from.clone()) })?;
    let source = runtime
        .execute(PrepareExecutionFork { parent: parent.clone(), checkpoint: args.checkpoint.clone() })?;
    if let (Some(taken), false) = (&source.taken, args.run.quiet) {
        crate::output::plain(
            JsonType::Note,
            &format!(
                "checkpointed the running VM of {parent} as {} (paused {} ms)",
                taken.id, taken.paused_ms
            ),
        );
    }
    if !args.run.quiet {
        let checkpoint = source.fork.manifest.id.to_string();
        let fork = ForkLine { parent: &parent, checkpoint: &checkpoint, state: "execution" };
        crate::output::say(JsonType::Fork, &fork, || {
            format!("pvisor: forking the execution of {parent} from {checkpoint}")
        });
    }
    // The hold lives until this function returns: past admission.
    let _hold = source.hold;
    super::run::execute(
        runtime,
        source.executor,
        source.workspace,
        None,
        Some(source.fork),
        &args.run,
        &source.command,
    )
}
