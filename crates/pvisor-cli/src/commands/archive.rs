//! `pvisor export`, `verify`, `import` and `gc`.

use std::io::Write;

use anyhow::Context;

use pvisor::actions::{Export, Gc, Import, ResolveJob, VerifyArchive, VerifyJob};
use pvisor::{ArchiveError, Runtime, RuntimeError};

use crate::cli::{ExportArgs, GcArgs, ImportArgs, VerifyArgs};
use crate::json::{json_line, JsonType};
use crate::results::ExportResult;

pub fn cmd_export(runtime: &Runtime, args: ExportArgs) -> anyhow::Result<i32> {
    let store = runtime.store();
    let job = super::resolve_job(runtime, args.job.as_deref())?;
    super::recover(runtime, &job)?;
    // Not the current directory: that is usually the workspace, and an
    // archive there would be the next run's input (and a staged file).
    let out = match args.output {
        Some(out) => out,
        None => {
            let dir = store.root().join("exports");
            pvisor_core::store::create_dir_all_private(&dir)?;
            dir.join(format!("{job}.pvisor.tar"))
        }
    };
    let exported = runtime.execute(Export { job: job.clone(), out: out.clone() })?;
    if args.json {
        let result = ExportResult::new(&job, out.clone(), &exported)
            .with_context(|| format!("cannot read back the archive {}", out.display()))?;
        json_line(&mut crate::output::stdout(), JsonType::Result, &result)?;
        return Ok(0);
    }
    if exported.confirmed {
        println!(
            "{}: {} entries of {job}; check it with `pvisor verify {}`",
            out.display(),
            exported.manifest.files.len() + 1,
            out.display()
        );
    } else {
        println!(
            "{}: {} entries of {job}'s unconfirmed stage (the Job was lost: no receipt confirms it, so it \
             cannot be imported or applied); `tar -xf {}` unpacks it for inspection",
            out.display(),
            exported.manifest.files.len() + 1,
            out.display()
        );
    }
    Ok(0)
}

/// What a valid receipt of a `vm` run does not prove: the exit status and
/// the staged files came from the guest, which the command controls.
const GUEST_ASSERTED: &str = "  note: a vm run's exit status and staged files are what the guest reported: the receipt proves \
     pvisor recorded them, not that the command produced them (root in the guest can forge its agent's replies)";

pub fn cmd_verify(runtime: &Runtime, args: VerifyArgs) -> anyhow::Result<i32> {
    let path = std::path::Path::new(&args.target);
    let result = if path.is_file() {
        runtime.execute(VerifyArchive { path: path.to_owned() }).map(|checked| {
            let v = &checked.verified;
            let line = format!(
                "{}: ok — {} entries match MANIFEST.json; the receipt binds bundle.json (blake3 {}); {} staged change(s) match the Bundle",
                path.display(),
                v.manifest.files.len(),
                v.receipt.bundle.blake3,
                v.bundle.changes.len()
            );
            (line, checked.guest_reported)
        })
    } else {
        let job = runtime.execute(ResolveJob { query: Some(args.target.clone()) })?;
        runtime.execute(VerifyJob { job: job.clone() }).map(|checked| {
            let n = checked.remaining;
            (
                format!("{job}: ok — valid receipt and Bundle; {n} remaining staged file(s) match it"),
                checked.guest_reported,
            )
        })
    };
    if args.json {
        return verify_json(&args.target, result);
    }
    let mut out = crate::output::stdout();
    match result {
        Ok((line, guest_reported)) => {
            writeln!(out, "{line}")?;
            if guest_reported {
                writeln!(out, "{GUEST_ASSERTED}")?;
            }
            Ok(0)
        }
        Err(RuntimeError::Archive(ArchiveError::Failed { archive, failures })) => {
            writeln!(out, "{archive}: FAILED")?;
            for f in failures {
                writeln!(out, "  {f}")?;
            }
            Ok(1)
        }
        Err(e) => Err(e.into()),
    }
}

/// `verify --json`: one `result` line, `ok` and what failed (exit 1).
fn verify_json(target: &str, result: Result<(String, bool), RuntimeError>) -> anyhow::Result<i32> {
    let (ok, summary, guest_reported, failures) = match result {
        Ok((line, guest_reported)) => (true, Some(line), guest_reported, Vec::new()),
        Err(RuntimeError::Archive(ArchiveError::Failed { failures, .. })) => {
            (false, None, false, failures.iter().map(ToString::to_string).collect())
        }
        Err(e) => return Err(e.into()),
    };
    let line = serde_json::json!({
        "target": target, "ok": ok, "summary": summary, "guest_reported": guest_reported, "failures": failures,
    });
    json_line(&mut crate::output::stdout(), JsonType::Result, &line)?;
    Ok(if ok { 0 } else { 1 })
}

pub fn cmd_import(runtime: &Runtime, args: ImportArgs) -> anyhow::Result<i32> {
    let job = runtime.execute(Import { file: args.file.clone() })?;
    if args.json {
        let line = serde_json::json!({"job": job, "archive": args.file, "read_only": true});
        json_line(&mut crate::output::stdout(), JsonType::Result, &line)?;
        return Ok(0);
    }
    println!("imported {job} (read-only); review it with `pvisor review {job} --diff`");
    Ok(0)
}

pub fn cmd_gc(runtime: &Runtime, args: GcArgs) -> anyhow::Result<i32> {
    let mut report = super::freeing_space(runtime.store(), || {
        let gc = Gc { age: args.older_than, dry_run: args.dry_run, force: args.force };
        Ok(runtime.execute(gc)?)
    })?;
    prune_sandbox_records(runtime, &args, &mut report)?;
    let mut out = crate::output::stdout();
    if args.json {
        for f in &report.freed {
            json_line(&mut out, JsonType::Freed, f)?;
        }
        for k in &report.kept {
            json_line(&mut out, JsonType::Kept, k)?;
        }
        for f in &report.failed {
            json_line(&mut out, JsonType::Failed, f)?;
        }
        return Ok(if report.failed.is_empty() { 0 } else { 1 });
    }
    let verb = if args.dry_run { "would free" } else { "freed" };
    let total: u64 = report.freed.iter().map(|f| f.bytes).sum();
    for f in &report.freed {
        writeln!(out, "  {verb:<11} {:>10}  {}", human(f.bytes), f.what)?;
    }
    for k in &report.kept {
        writeln!(out, "  {:<11} {:>10}  {}: {}", "kept", "", k.what, k.reason)?;
    }
    writeln!(out, "{verb} {} in {} item(s)", human(total), report.freed.len())?;
    if report.failed.is_empty() {
        return Ok(0);
    }
    for f in &report.failed {
        eprintln!("pvisor: gc could not free {}: {}", f.what, f.error);
    }
    eprintln!(
        "pvisor: {} item(s) were not freed; everything else was. Fix the cause above and run gc again",
        report.failed.len()
    );
    Ok(1)
}

/// The records of `pvisor serve` sandboxes that ended before gc's age
/// (while no daemon runs; a running one prunes its own).
fn prune_sandbox_records(
    runtime: &Runtime,
    args: &GcArgs,
    report: &mut pvisor::GcReport,
) -> anyhow::Result<()> {
    let is_live = |job: &pvisor_core::ids::JobId| {
        runtime.execute(pvisor::actions::Status { job: job.clone() }).is_ok_and(|s| s.live)
    };
    let root = runtime.store().root();
    let pruning = pvisor_server::sandbox::prune_records(root, args.older_than, args.dry_run, &is_live)
        .with_context(|| {
            format!("cannot prune the sandbox records under {}", root.join("server").display())
        })?;
    for (id, files, bytes) in pruning.pruned {
        let path = files.first().cloned().unwrap_or_default();
        report.freed.push(pvisor::Freed { what: format!("sandbox record {id}"), path, bytes });
    }
    report.kept.extend(pruning.kept.into_iter().map(|(what, reason)| pvisor::Kept { what, reason }));
    Ok(())
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b < 1024 => format!("{b} B"),
        b if b < 1 << 20 => format!("{:.1} KiB", b as f64 / 1024.0),
        b if b < 1 << 30 => format!("{:.1} MiB", b as f64 / 1048576.0),
        b => format!("{:.2} GiB", b as f64 / 1073741824.0),
    }
}
