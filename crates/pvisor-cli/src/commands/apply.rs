//! `pvisor apply [JOB] [PATH|GLOB...] [--all] [--dry-run] [--force] [-i]`.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::bail;

use pvisor::effects::{self, ApplyOptions, Selection, Stage};
use pvisor_stage::apply::Verdict;

use crate::cli::ApplyArgs;
use crate::output::{path_lines, shown, shown_path, Detail, PathLine};

/// Exit status when conflicts refused the apply.
const REFUSED: i32 = 1;

pub fn cmd_apply(args: ApplyArgs) -> anyhow::Result<i32> {
    let store = super::open_store()?;
    let (job, paths) = super::job_and_paths(&store, args.job, args.paths)?;
    if paths.is_empty() && !args.all && !args.interactive {
        bail!("Name the paths to apply, or pass --all (see `pvisor review {job}` for the list)");
    }
    if args.all && !paths.is_empty() {
        bail!("--all applies everything; drop it to apply only {}", paths.join(" "));
    }
    let sensitive = crate::config::sensitive()?;
    let options = ApplyOptions {
        force: args.force,
        dry_run: args.dry_run,
        include_sensitive: args.include_sensitive,
        sensitive: sensitive.clone(),
    };
    let selection = if args.interactive {
        match choose_interactively(&store, &job, &paths, &sensitive, args.color)? {
            Some(chosen) if !chosen.is_empty() => Selection::Paths(chosen),
            _ => {
                eprintln!("pvisor: nothing chosen; nothing applied");
                return Ok(0);
            }
        }
    } else {
        Selection::Patterns(paths)
    };
    let stderr_tty = std::io::stderr().is_terminal();
    let mut written = 0usize;
    let report = effects::apply(&store, &job, &selection, options, |_| {
        written += 1;
        if stderr_tty && written.is_multiple_of(500) {
            eprint!("\rpvisor: applied {written} files…");
        }
    })?;
    if stderr_tty && written >= 500 {
        eprintln!();
    }
    let mut out = std::io::stdout().lock();
    for warning in &report.warnings {
        eprintln!("pvisor: warning: {warning}");
    }
    if !report.conflicts.is_empty() {
        writeln!(out, "refused: {} conflict(s); nothing was applied", report.conflicts.len())?;
        for (change, reason) in &report.conflicts {
            writeln!(out, "  CONFLICT  {}: {}", change.path.display_escaped(), shown(reason))?;
        }
        writeln!(out, "the workspace changed since the run; review with `pvisor review {job} --diff`, then apply other paths or pass --force to overwrite")?;
        return Ok(REFUSED);
    }
    // Not applied, but the rest was: each is said, and the exit status is 1.
    let mut incomplete = false;
    if !report.skipped_sensitive.is_empty() {
        incomplete = true;
        writeln!(
            out,
            "skipped {} sensitive path(s): applying them makes the host run code",
            report.skipped_sensitive.len()
        )?;
        for (change, reason) in &report.skipped_sensitive {
            writeln!(out, "  SENSITIVE {}: {reason}", change.path.display_escaped())?;
        }
        writeln!(out, "review them with `pvisor review {job} --diff`; apply one by naming it exactly, or pass --include-sensitive")?;
    }
    for (change, error) in &report.failed {
        incomplete = true;
        writeln!(out, "  FAILED    {}: {}", change.path.display_escaped(), shown(error))?;
    }
    let verb = if args.dry_run { "would apply" } else { "applied" };
    let mut count = 0;
    let mut lines = Vec::new();
    for planned in &report.plan {
        if report.failed.iter().any(|(c, _)| c.path == planned.change.path) {
            continue;
        }
        let (word, note) = match &planned.verdict {
            Verdict::Apply { forced: true } => (verb, " (forced over a conflict)"),
            Verdict::Apply { forced: false } => (verb, ""),
            Verdict::AlreadyApplied => ("already", " (the workspace already matches)"),
            Verdict::Unsupported(_) | Verdict::Conflict(_) => continue,
        };
        count += 1;
        let implied = if planned.implied { " (needed by a selected path)" } else { "" };
        lines.push(PathLine {
            word: word.into(),
            kind: planned.change.kind.as_str(),
            path: planned.change.path.display_escaped(),
            note: format!("{note}{implied}"),
        });
    }
    path_lines(&mut out, &lines, Detail::of(args.quiet, args.verbose))?;
    if args.dry_run {
        writeln!(out, "dry run: {count} change(s) would be applied; nothing was changed")?;
        return Ok(if incomplete { REFUSED } else { 0 });
    }
    let stage = Stage::open(&store, &job)?;
    let remaining = stage.remaining();
    writeln!(
        out,
        "{count} change(s) applied to {}; {remaining} remaining; stage {}",
        shown_path(&stage.workspace),
        report.state.map_or("?", |s| s.as_str())
    )?;
    if remaining > 0 {
        writeln!(out, "next: pvisor review {job}  ·  pvisor apply {job} --all  ·  pvisor drop {job}")?;
    }
    Ok(if incomplete { REFUSED } else { 0 })
}

/// Shows each remaining selected change with its diff and asks about it.
fn choose_interactively(
    store: &pvisor_core::store::Store,
    job: &pvisor_core::ids::JobId,
    paths: &[String],
    sensitive: &pvisor::effects::Sensitive,
    color: crate::cli::ColorChoice,
) -> anyhow::Result<Option<Vec<pvisor_core::store::RelPath>>> {
    if !std::io::stdin().is_terminal() {
        bail!("-i asks on a terminal, but stdin is not one; name the paths to apply instead");
    }
    let stage = Stage::open(store, job)?;
    let items: Vec<_> = stage.review(paths, sensitive)?.into_iter().filter(|i| i.remaining()).collect();
    let (ws, upper) = stage.diff_roots()?;
    let color = super::use_color(color);
    let mut chosen = Vec::new();
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut all_rest = false;
    for (n, item) in items.iter().enumerate() {
        if all_rest && item.sensitive.is_none() {
            chosen.push(item.change.path.clone());
            continue;
        }
        let mut out = std::io::stdout().lock();
        writeln!(out)?;
        pvisor_stage::review::write_diff(&mut out, &ws, &upper, &item.change, color)?;
        if let Some(reason) = &item.conflict {
            writeln!(out, "CONFLICT: {}", shown(reason))?;
        }
        if let Some(reason) = &item.sensitive {
            writeln!(out, "SENSITIVE: {reason}")?;
        }
        loop {
            write!(
                out,
                "({}/{}) Apply {}? [y]es [n]o [a]ll remaining [q]uit: ",
                n + 1,
                items.len(),
                item.change.path.display_escaped()
            )?;
            out.flush()?;
            let Some(line) = lines.next().transpose()? else { return Ok(Some(chosen)) };
            match line.trim() {
                "y" | "yes" if item.sensitive.is_some() => {
                    // Asked separately: "all remaining" never covers it either.
                    write!(
                        out,
                        "{} makes the host run code. Apply it? Type 'yes': ",
                        item.change.path.display_escaped()
                    )?;
                    out.flush()?;
                    let Some(confirm) = lines.next().transpose()? else { return Ok(Some(chosen)) };
                    if confirm.trim() == "yes" {
                        chosen.push(item.change.path.clone());
                    }
                    break;
                }
                "y" | "yes" => {
                    chosen.push(item.change.path.clone());
                    break;
                }
                "n" | "no" | "" => break,
                "a" | "all" => {
                    if item.sensitive.is_none() {
                        chosen.push(item.change.path.clone());
                    }
                    all_rest = true;
                    break;
                }
                "q" | "quit" => return Ok(Some(chosen)),
                _ => writeln!(out, "answer y, n, a or q")?,
            }
        }
    }
    Ok(Some(chosen))
}
