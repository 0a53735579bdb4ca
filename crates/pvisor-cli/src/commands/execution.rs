//! The vm executor's execution checkpoints: `pvisor checkpoint --kind
//! execution`, `pvisor suspend`, `pvisor resume` and `pvisor fork --state
//! execution`. Checkpoints of a live VM are taken by its supervisor (the
//! `pvisor run` that owns the Attempt) over the Attempt's control socket.

use anyhow::{bail, Context};

use pvisor::actions::{CheckpointExecution, PrepareExecutionFork, Resume, Suspend};
use pvisor::Runtime;
use pvisor_core::ids::JobId;
use pvisor_core::store::Store;
use pvisor_vm::{self as vm, ExecCheckpoint};

use crate::cli::{ForkArgs, ResumeArgs, SuspendArgs};
use crate::output::json_line;

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
    let manifest = Runtime::on_host(store.clone()).execute(CheckpointExecution { job: job.clone() })?;
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
    let manifest = Runtime::on_host(store).execute(Suspend { job: job.clone() })?;
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
    let runtime = Runtime::on_host(store);
    super::run::drive(args.quiet, move || runtime.execute(Resume { job }).context("Cannot resume"))
}

pub fn cmd_fork_execution(store: Store, args: &ForkArgs) -> anyhow::Result<i32> {
    if !args.command.is_empty() {
        bail!(
            "an execution fork continues the parent's command from its checkpoint and takes no COMMAND; \
             drop `-- {}` (or use --state workspace to run a new command over the parent's files)",
            args.command.join(" ")
        );
    }
    let parent = pvisor::runtime::job_service::views::resolve_job(&store, Some(&args.from))?;
    let runtime = Runtime::on_host(store.clone());
    let source = runtime
        .execute(PrepareExecutionFork { parent: parent.clone(), checkpoint: args.checkpoint.clone() })?;
    if let (Some(taken), false) = (&source.taken, args.run.quiet) {
        eprintln!(
            "pvisor: checkpointed the running VM of {parent} as {} (paused {} ms)",
            taken.id, taken.paused_ms
        );
    }
    if !args.run.quiet {
        eprintln!("pvisor: forking the execution of {parent} from {}", source.fork.manifest.id);
    }
    // The hold lives until this function returns: past admission.
    let _hold = source.hold;
    super::run::execute(
        store,
        source.executor,
        source.workspace,
        None,
        Some(source.fork),
        &args.run,
        &source.command,
    )
}
