//! `pvisor checkpoint`, `pvisor checkpoints` and `pvisor fork`.

use std::io::Write;

use pvisor::runtime::checkpoint::{self, LIMITS};
use pvisor::runtime::job_service::views;
use pvisor_core::ids::CheckpointId;

use crate::cli::{CheckpointArgs, CheckpointsArgs, ForkArgs};
use crate::output::json_line;

pub fn cmd_checkpoint(args: CheckpointArgs) -> anyhow::Result<i32> {
    let store = super::open_store()?;
    let job = super::resolve_job(&store, args.job.as_deref())?;
    if args.kind == "execution" {
        return super::execution::cmd_checkpoint_execution(&store, &job, args.json);
    }
    let (manifest, _hold) = pvisor::Runtime::on_host(store.clone())
        .execute(pvisor::actions::CheckpointWorkspace { job: job.clone() })?;
    println!("{}: {} entries of {} ({})", manifest.id, manifest.entries.len(), job, manifest.copy_method);
    println!("note: {LIMITS}");
    let me = crate::output::me();
    println!("next: {me} fork {} -- COMMAND", manifest.id);
    Ok(0)
}

pub fn cmd_checkpoints(args: CheckpointsArgs) -> anyhow::Result<i32> {
    let store = super::open_store()?;
    let mut out = std::io::stdout().lock();
    let mut broken = 0;
    for (id, manifest) in checkpoint::list(&store)? {
        match manifest {
            Ok(m) if args.json => json_line(&mut out, "checkpoint", &m)?,
            Ok(m) => writeln!(
                out,
                "{}  {}  {}  {:>6} entries  {}  {}",
                m.id,
                m.kind,
                m.created_at,
                m.entries.len(),
                m.job,
                m.lineage.map(|l| format!("(fork of {})", l.parent_job)).unwrap_or_default()
            )?,
            Err(e) => {
                broken += 1;
                writeln!(out, "{id}  error: {e}")?;
            }
        }
    }
    for (job, dir, manifest) in pvisor::runtime::suspension::list_all(&store)? {
        match manifest {
            Ok(m) if args.json => json_line(&mut out, "checkpoint", &m)?,
            Ok(m) => writeln!(
                out,
                "{}  {}  {}  {} MiB RAM, {}, guest paused {} ms  {}",
                m.id,
                m.kind,
                m.created_at,
                m.machine.memory_mib,
                m.machine.accelerator.as_str(),
                m.paused_ms,
                job
            )?,
            Err(e) => {
                broken += 1;
                writeln!(out, "{}  error: {e}", dir.display())?;
            }
        }
    }
    Ok(if broken > 0 { crate::exit::PVISOR_ERROR } else { 0 })
}

pub fn cmd_fork(args: ForkArgs) -> anyhow::Result<i32> {
    let store = super::open_store()?;
    if args.state == "execution" {
        return super::execution::cmd_fork_execution(store, &args);
    }
    anyhow::ensure!(!args.command.is_empty(), "No program given: pvisor fork FROM -- PROGRAM [ARGS...]");
    // The hold lasts until the fork is done: gc leaves its checkpoint alone.
    let (checkpoint, _hold): (CheckpointId, _) = if args.from.starts_with(CheckpointId::PREFIX) {
        let id = checkpoint::resolve(&store, &args.from)?;
        let hold = checkpoint::hold(&store, &id)?;
        (id, hold)
    } else {
        let job = views::resolve_job(&store, Some(&args.from))?;
        let (manifest, hold) = pvisor::Runtime::on_host(store.clone())
            .execute(pvisor::actions::CheckpointWorkspace { job: job.clone() })?;
        if !args.run.quiet {
            eprintln!("pvisor: checkpointed {job} as {} ({})", manifest.id, manifest.copy_method);
        }
        (manifest.id, hold)
    };
    // Admission verifies every file before the new Job exists.
    let manifest = checkpoint::manifest(&store, &checkpoint)?;
    if !args.run.quiet {
        eprintln!("pvisor: forking {} from {} ({LIMITS})", manifest.job, manifest.id);
    }
    let executor = super::run::executor_for(&store, args.run.executor)?;
    super::run::execute(
        store,
        executor,
        manifest.workspace.clone(),
        Some(checkpoint),
        None,
        &args.run,
        &args.command,
    )
}
