//! `pvisor checkpoint`, `pvisor checkpoints` and `pvisor fork`.

use std::io::Write;

use pvisor::actions::{
    CheckpointWorkspace, HoldCheckpoint, ListCheckpoints, ListExecutionCheckpoints, ReadCheckpoint,
    ResolveJob,
};
use pvisor::{Runtime, CHECKPOINT_LIMITS as LIMITS};
use pvisor_core::ids::CheckpointId;

use crate::cli::{CheckpointArgs, CheckpointsArgs, ForkArgs};
use crate::json::{json_line, JsonType};
use crate::results::CheckpointResult;

pub fn cmd_checkpoint(runtime: &Runtime, args: CheckpointArgs) -> anyhow::Result<i32> {
    let job = super::resolve_job(runtime, args.job.as_deref())?;
    if args.kind == "execution" {
        return super::execution::cmd_checkpoint_execution(runtime, &job, args.json);
    }
    let (manifest, _hold) = runtime.execute(CheckpointWorkspace { job: job.clone() })?;
    if args.json {
        let result = CheckpointResult {
            job,
            checkpoint: manifest.id.to_string(),
            kind: "workspace",
            entries: Some(manifest.entries.len()),
            copy_method: Some(manifest.copy_method),
        };
        json_line(&mut crate::output::stdout(), JsonType::Result, &result)?;
        return Ok(0);
    }
    println!("{}: {} entries of {} ({})", manifest.id, manifest.entries.len(), job, manifest.copy_method);
    println!("note: {LIMITS}");
    let me = crate::output::me();
    println!("next: {me} fork {} -- COMMAND", manifest.id);
    Ok(0)
}

pub fn cmd_checkpoints(runtime: &Runtime, args: CheckpointsArgs) -> anyhow::Result<i32> {
    let mut out = crate::output::stdout();
    let mut broken = 0;
    for (id, manifest) in runtime.execute(ListCheckpoints)? {
        match manifest {
            Ok(m) if args.json => json_line(&mut out, JsonType::Checkpoint, &m)?,
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
    for (job, dir, manifest) in runtime.execute(ListExecutionCheckpoints)? {
        match manifest {
            Ok(m) if args.json => json_line(&mut out, JsonType::Checkpoint, &m)?,
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

pub fn cmd_fork(runtime: &Runtime, args: ForkArgs) -> anyhow::Result<i32> {
    if args.state == "execution" {
        return super::execution::cmd_fork_execution(runtime, &args);
    }
    anyhow::ensure!(!args.command.is_empty(), "No program given: pvisor fork FROM -- PROGRAM [ARGS...]");
    // The hold lasts until the fork is done: gc leaves its checkpoint alone.
    let (checkpoint, _hold): (CheckpointId, _) = if args.from.starts_with(CheckpointId::PREFIX) {
        runtime.execute(HoldCheckpoint { query: args.from.clone() })?
    } else {
        let job = runtime.execute(ResolveJob { query: Some(args.from.clone()) })?;
        let (manifest, hold) = runtime.execute(CheckpointWorkspace { job: job.clone() })?;
        if !args.run.quiet {
            crate::output::plain(
                JsonType::Note,
                &format!("checkpointed {job} as {} ({})", manifest.id, manifest.copy_method),
            );
        }
        (manifest.id, hold)
    };
    // Admission verifies every file before the new Job exists.
    let manifest = runtime.execute(ReadCheckpoint { id: checkpoint.clone() })?;
    if !args.run.quiet {
        let checkpoint = manifest.id.to_string();
        let fork =
            super::execution::ForkLine { parent: &manifest.job, checkpoint: &checkpoint, state: "workspace" };
        crate::output::say(JsonType::Fork, &fork, || {
            format!("pvisor: forking {} from {checkpoint} ({LIMITS})", manifest.job)
        });
    }
    let executor = super::run::executor_for(runtime, args.run.executor)?;
    super::run::execute(
        runtime,
        executor,
        manifest.workspace.clone(),
        Some(checkpoint),
        None,
        &args.run,
        &args.command,
    )
}
