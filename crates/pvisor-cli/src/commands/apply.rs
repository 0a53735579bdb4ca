//! `pvisor apply [JOB] [PATH|GLOB...] [--all] [--dry-run] [--force] [-i] [--json]`.

use std::io::{IsTerminal, Write};

use anyhow::bail;

use pvisor::actions::{Apply, DropChanges, Review};
use pvisor::{ApplyOptions, ApplyReport, Runtime, Selection, Sensitive};
use pvisor_core::ids::JobId;
use pvisor_stage::apply::Verdict;

use crate::cli::ApplyArgs;
use crate::json::{json_line, JsonType};
use crate::output::{path_lines, shown, shown_path, Detail, PathLine};
use crate::prompt::{confirm, Answers};
use crate::results::{AppliedPath, ApplyResult, MovedRef, SkippedPath};

/// Exit status when conflicts refused the apply.
const REFUSED: i32 = 1;

pub fn cmd_apply(runtime: &Runtime, args: ApplyArgs) -> anyhow::Result<i32> {
    if args.json && (args.patch || args.interactive) {
        let flag = if args.patch { "--patch" } else { "--interactive" };
        return Err(crate::json::JsonRefusal::Interactive { flag }.into());
    }
    if args.patch {
        return super::apply_hunks::cmd_apply_hunks(runtime, args);
    }
    let (job, paths, mut session_hold) = super::target_and_paths_reviewed(
        runtime,
        args.session.as_deref(),
        args.job.clone(),
        args.paths.clone(),
        "apply",
    )?;
    if paths.is_empty() && !args.all && !args.interactive {
        bail!("Name the paths to apply, or pass --all (see `pvisor review {job}` for the list)");
    }
    if args.all && !paths.is_empty() {
        bail!("--all applies everything; drop it to apply only {}", paths.join(" "));
    }
    let sensitive = crate::config::sensitive(runtime.store())?;
    let mut options = ApplyOptions {
        force: args.force,
        force_paths: Vec::new(),
        dry_run: args.dry_run,
        include_sensitive: args.include_sensitive,
        sensitive: sensitive.clone(),
        allow_incomplete: args.allow_incomplete,
    };
    let mut to_drop = Vec::new();
    let selection = if args.interactive {
        let choices = choose_interactively(runtime, &job, &paths, &sensitive, args.color)?;
        if choices.quit {
            eprintln!("pvisor: quit; nothing applied or dropped");
            return Ok(0);
        }
        to_drop = choices.drop;
        options.force_paths = choices.force;
        if choices.apply.is_empty() {
            drop_chosen(runtime, &job, &to_drop)?;
            eprintln!("pvisor: nothing chosen to apply");
            return Ok(0);
        }
        Selection::Paths(choices.apply)
    } else {
        Selection::Patterns(paths)
    };
    let report = apply_showing_progress(runtime, &job, selection, options, !args.json)?;
    crate::config::warn_if_home(&report.workspace);
    if args.json {
        // The session's end is said before the `result`, which is last.
        if !args.dry_run {
            super::drop_hold(&mut session_hold);
            super::end_session_if_done(runtime, args.session.as_deref(), &job)?;
        }
        return report_apply_json(runtime, &job, &args, &report);
    }
    let code = report_apply(runtime, &job, &args, &report, &to_drop)?;
    if !args.dry_run {
        super::drop_hold(&mut session_hold);
        super::end_session_if_done(runtime, args.session.as_deref(), &job)?;
    }
    Ok(code)
}

/// Applies `selection`, counting the files written on a terminal (if `show`).
fn apply_showing_progress(
    runtime: &Runtime,
    job: &JobId,
    selection: Selection,
    options: ApplyOptions,
    show: bool,
) -> anyhow::Result<ApplyReport> {
    let stderr_tty = show && std::io::stderr().is_terminal();
    let mut written = 0usize;
    let progress = Box::new(|_: &pvisor_core::records::ChangeEntry| {
        written += 1;
        if stderr_tty && written.is_multiple_of(500) {
            eprint!("\rpvisor: applied {written} files…");
        }
    });
    let report = runtime.execute(Apply { job: job.clone(), selection, options, progress })?;
    if stderr_tty && written >= 500 {
        eprintln!();
    }
    Ok(report)
}

/// Says what the apply did (or, for a dry run, would do), drops what
/// `apply -i` was told to drop, and returns the exit status.
fn report_apply(
    runtime: &Runtime,
    job: &JobId,
    args: &ApplyArgs,
    report: &ApplyReport,
    to_drop: &[pvisor_core::store::RelPath],
) -> anyhow::Result<i32> {
    let mut out = crate::output::stdout();
    for warning in &report.warnings {
        eprintln!("pvisor: warning: {warning}");
    }
    if !report.conflicts.is_empty() {
        writeln!(out, "refused: {} conflict(s); nothing was applied", report.conflicts.len())?;
        for (change, reason) in &report.conflicts {
            writeln!(out, "  CONFLICT  {}: {}", change.path.display_escaped(), shown(reason))?;
        }
        let of_commit = |path: &pvisor_core::store::RelPath| {
            report.commit.as_ref().is_some_and(|c| c.paths.iter().any(|p| &p.path == path))
        };
        if report.conflicts.iter().all(|(c, _)| of_commit(&c.path)) {
            // --force overwrites files, never a branch: say what does help.
            writeln!(out, "the repository's branch cannot take the sandbox's commit as it is; each conflict says what to do")?;
        } else {
            writeln!(out, "the workspace changed since the run; review with `pvisor review {job} --diff`, then apply other paths or pass --force to overwrite")?;
        }
        return Ok(REFUSED);
    }
    // Not applied, but the rest was: each is said, and the exit status is 1.
    let incomplete = write_not_applied(&mut out, job, report)?;
    let count = write_applied(&mut out, report, args)? + write_commit(&mut out, report, args)?;
    if args.dry_run {
        writeln!(out, "dry run: {count} change(s) would be applied; nothing was changed")?;
        return Ok(if incomplete { REFUSED } else { 0 });
    }
    drop(out);
    let (remaining, state) = if to_drop.is_empty() {
        (report.remaining, report.state)
    } else {
        drop_chosen(runtime, job, to_drop)?;
        let stage = runtime.execute(Review { job: job.clone() })?;
        (stage.remaining(), Some(stage.state()))
    };
    let mut out = crate::output::stdout();
    writeln!(
        out,
        "{count} change(s) applied to {}; {remaining} remaining; stage {}",
        shown_path(&report.workspace),
        state.map_or("?", |s| s.as_str())
    )?;
    if remaining > 0 {
        let me = crate::output::me();
        writeln!(out, "next: {me} review {job}  ·  {me} apply {job} --all  ·  {me} drop {job}")?;
    }
    Ok(if incomplete { REFUSED } else { 0 })
}

/// `apply --json`: its warnings, one line per path applied (`applied`, or
/// `planned` in a dry run) and per path not (`skipped`), then the `result`;
/// returns the exit status, as [`report_apply`] would.
fn report_apply_json(
    runtime: &Runtime,
    job: &JobId,
    args: &ApplyArgs,
    report: &ApplyReport,
) -> anyhow::Result<i32> {
    for warning in &report.warnings {
        crate::output::warning(warning);
    }
    let mut out = crate::output::stdout();
    let kind = if args.dry_run { JsonType::Planned } else { JsonType::Applied };
    for path in AppliedPath::from_report(report) {
        json_line(&mut out, kind, &path)?;
    }
    for path in SkippedPath::from_report(report) {
        json_line(&mut out, JsonType::Skipped, &path)?;
    }
    if report.conflicts.is_empty() {
        for moved in MovedRef::from_report(report) {
            json_line(&mut out, JsonType::Commit, &moved)?;
        }
    }
    let mut result = ApplyResult::from_report(job, report, args.dry_run);
    if !report.executed {
        // Nothing was written: the stage is as it was.
        let stage = runtime.execute(Review { job: job.clone() })?;
        result = result.with_stage(stage.remaining(), Some(stage.state()));
    }
    json_line(&mut out, JsonType::Result, &result)?;
    Ok(result.exit_status())
}

/// Names what was selected but not applied (refused, sensitive, failed);
/// whether there was any.
fn write_not_applied(out: &mut impl Write, job: &JobId, report: &ApplyReport) -> anyhow::Result<bool> {
    let mut incomplete = false;
    if !report.refused.is_empty() {
        incomplete = true;
        writeln!(
            out,
            "refused {} path(s) that pvisor never applies, whatever the flags:",
            report.refused.len()
        )?;
        for (change, reason) in &report.refused {
            writeln!(out, "  REFUSED   {}: {}", change.path.display_escaped(), shown(reason))?;
        }
        let me = crate::output::me();
        writeln!(out, "a sandboxed command may not change pvisor's own config or state; drop them with `{me} drop {job} PATH`, and make any change you want yourself, outside a sandbox")?;
    }
    if !report.skipped_sensitive.is_empty() {
        incomplete = true;
        writeln!(
            out,
            "skipped {} sensitive path(s): applying them makes the host run code",
            report.skipped_sensitive.len()
        )?;
        for (change, reason) in &report.skipped_sensitive {
            writeln!(out, "  SENSITIVE {}: {}", change.path.display_escaped(), shown(reason))?;
        }
        write_sensitive_hint(out, job, &report.skipped_sensitive)?;
    }
    for (change, error) in &report.failed {
        incomplete = true;
        writeln!(out, "  FAILED    {}: {}", change.path.display_escaped(), shown(error))?;
    }
    Ok(incomplete)
}

/// Lists what was applied (or would be); returns how many.
fn write_applied(out: &mut impl Write, report: &ApplyReport, args: &ApplyArgs) -> anyhow::Result<usize> {
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
    path_lines(out, &lines, Detail::of(args.quiet, args.verbose))?;
    Ok(count)
}

/// Says, one line per ref, what the commit made in the sandbox moved (or
/// would move), instead of its object paths; returns how many staged
/// paths it settled (0 when it did not land).
fn write_commit(out: &mut impl Write, report: &ApplyReport, args: &ApplyArgs) -> anyhow::Result<usize> {
    let Some(commit) = &report.commit else { return Ok(0) };
    let verb = if args.dry_run { "would move" } else { "moved" };
    for mv in &commit.moved {
        writeln!(out, "  {verb:<11} {} (a commit made in the sandbox)", shown(&mv.summary()))?;
    }
    for mv in &commit.already {
        writeln!(out, "  already     {} (the repository already holds it)", shown(&mv.summary()))?;
    }
    let landed = commit.failed.is_empty();
    if landed && !(commit.moved.is_empty() && commit.already.is_empty()) {
        writeln!(
            out,
            "  with it     {} .git path(s) (objects, refs, reflogs, index), {} new object(s); no hook, config or info/ file",
            commit.paths.len(),
            commit.new_objects
        )?;
    }
    Ok(if landed { commit.paths.len() } else { 0 })
}

/// How many apply commands the sensitive-path hint lists.
const HINTS: usize = 5;

/// How to apply a skipped sensitive path: a command per path, quoted so
/// that pasting it runs exactly that (a name the terminal cannot show as
/// it is gets no command: `apply -i` offers it), at most [`HINTS`].
fn write_sensitive_hint(
    out: &mut impl Write,
    job: &pvisor_core::ids::JobId,
    skipped: &[(pvisor_core::records::ChangeEntry, String)],
) -> std::io::Result<()> {
    let me = crate::output::me();
    writeln!(out, "review them with `{me} review {job} --diff`; apply one by naming it exactly (paths are from the workspace's top; the names came from the sandbox), or pass --include-sensitive:")?;
    let mut unshown = 0;
    for (change, _) in skipped.iter().take(HINTS) {
        match change.path.as_path().to_str().and_then(crate::output::pasteable) {
            Some(quoted) => writeln!(out, "  {me} apply {job} -- {quoted}")?,
            None => unshown += 1,
        }
    }
    if unshown > 0 {
        writeln!(
            out,
            "  ({unshown} with a name a terminal cannot show as it is: `{me} apply -i {job}` offers each)"
        )?;
    }
    if skipped.len() > HINTS {
        writeln!(out, "  (and {} more: `{me} review {job}` lists them)", skipped.len() - HINTS)?;
    }
    Ok(())
}

/// Drops the changes `apply -i` was told to drop (`d`).
fn drop_chosen(
    runtime: &Runtime,
    job: &pvisor_core::ids::JobId,
    paths: &[pvisor_core::store::RelPath],
) -> anyhow::Result<()> {
    if paths.is_empty() {
        return Ok(());
    }
    let patterns: Vec<String> = paths.iter().map(|p| p.as_path().to_string_lossy().into_owned()).collect();
    let report = runtime.execute(DropChanges { job: job.clone(), patterns })?;
    for change in &report.dropped {
        println!("  dropped     {:<12} {}", change.kind.as_str(), change.path.display_escaped());
    }
    Ok(())
}

/// What `apply -i` was told.
#[derive(Default)]
struct Choices {
    apply: Vec<pvisor_core::store::RelPath>,
    /// Chosen over a conflict, each confirmed on its own.
    force: Vec<pvisor_core::store::RelPath>,
    drop: Vec<pvisor_core::store::RelPath>,
    quit: bool,
}

const HELP: &str = "y - apply this change
n - leave it for later
a - apply this and every later change (conflicts and sensitive paths are still asked)
d - drop this change (discard it from the stage)
s - skip the rest: leave them for later, and apply what was chosen
q - quit: apply and drop nothing
? - this help";

/// Shows each remaining selected change with its diff and asks about it,
/// one key each (see [`HELP`]). Every answer is kept: a path in conflict is
/// applied only if its overwrite is confirmed on its own, so a conflict
/// never refuses the other answers.
fn choose_interactively(
    runtime: &Runtime,
    job: &pvisor_core::ids::JobId,
    paths: &[String],
    sensitive: &Sensitive,
    color: crate::cli::ColorChoice,
) -> anyhow::Result<Choices> {
    let stage = runtime.execute(Review { job: job.clone() })?;
    let items: Vec<_> = stage.review(paths, sensitive)?.into_iter().filter(|i| i.remaining()).collect();
    let (ws, upper) = stage.diff_roots()?;
    let color = super::use_color(color);
    let mut choices = Choices::default();
    let mut answers = Answers::open();
    let mut all_rest = false;
    let mut out = crate::output::stdout();
    for (n, item) in items.iter().enumerate() {
        let path = item.change.path.display_escaped();
        if let Some(reason) = &item.forbidden {
            writeln!(out, "REFUSED {path}: {}; never applied", shown(reason))?;
            continue;
        }
        let plain = item.conflict.is_none() && item.sensitive.is_none();
        if all_rest && plain {
            choices.apply.push(item.change.path.clone());
            continue;
        }
        writeln!(out)?;
        pvisor_stage::review::write_diff(
            &mut out,
            &ws,
            &upper,
            &item.change,
            item.confusable.as_deref(),
            color,
        )?;
        if let Some(reason) = &item.conflict {
            writeln!(out, "CONFLICT: {}", shown(reason))?;
        }
        if let Some(reason) = &item.sensitive {
            writeln!(out, "SENSITIVE: {reason}")?;
        }
        loop {
            write!(out, "({}/{}) Apply {path}? [y,n,a,d,s,q,?] ", n + 1, items.len())?;
            out.flush()?;
            let Some(key) = answers.next()? else { return Ok(choices) };
            writeln!(out, "{key}")?;
            match key {
                'y' | 'a' => {
                    if key == 'a' {
                        all_rest = true;
                    }
                    let overwrite = item.conflict.is_some();
                    if overwrite
                        && !confirm(
                            &mut out,
                            &mut answers,
                            &format!(
                                "{path} changed on the host since the run: overwrite the host's version?"
                            ),
                        )?
                    {
                        break;
                    }
                    if item.sensitive.is_some()
                        && !confirm(
                            &mut out,
                            &mut answers,
                            &format!("{path} makes the host run code: apply it anyway?"),
                        )?
                    {
                        break;
                    }
                    choices.apply.push(item.change.path.clone());
                    if overwrite {
                        choices.force.push(item.change.path.clone());
                    }
                    break;
                }
                'n' => break,
                'd' => {
                    choices.drop.push(item.change.path.clone());
                    break;
                }
                's' => return Ok(choices),
                'q' => {
                    choices.quit = true;
                    return Ok(choices);
                }
                _ => writeln!(out, "{HELP}")?,
            }
        }
    }
    Ok(choices)
}
