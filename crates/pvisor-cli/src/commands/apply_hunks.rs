//! `pvisor apply -p [JOB] [PATH...]`: choose hunk by hunk, as `git add -p`.
//!
//! Only modified text files whose host file still equals its conflict
//! baseline offer hunks; every other selected change is named with the reason
//! and left alone. A file with every hunk taken is applied whole (mode
//! included); a file with some is written by the `ApplyHunks` action,
//! which keeps the rest staged against the new baseline.

use std::io::{Read, Write};

use pvisor::actions::{Apply, ApplyHunks, Review};
use pvisor::{ApplyOptions, HunkChoice, ReviewItem, Runtime, Selection, Sensitive};
use pvisor_core::ids::JobId;
use pvisor_core::records::{ChangeEntry, ChangeKind, EntryType};
use pvisor_core::store::RelPath;
use pvisor_stage::beneath::Root;
use pvisor_stage::hunks::Hunks;
use pvisor_stage::review::DIFF_LIMIT;

use crate::cli::ApplyArgs;
use crate::output::{shown, shown_path};
use crate::prompt::Answers;

/// Exit status when some chosen hunks could not be written.
const INCOMPLETE: i32 = 1;

const HELP: &str = "y - apply this hunk
n - leave this hunk staged
a - apply this hunk and every later hunk of this file
d - leave this hunk and every later hunk of this file staged
q - quit: apply the hunks chosen so far, leave the rest staged
? - this help";

/// A file whose hunks are offered.
struct Offered {
    change: ChangeEntry,
    hunks: Hunks,
    host_blake3: String,
    sensitive: Option<String>,
}

/// Reads a file beneath `root`, refusing anything over the diff limit.
fn read_capped(root: &Root, change: &ChangeEntry) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    root.open_file(change.path.as_path())?.take(DIFF_LIMIT + 1).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Why `change` offers no hunks, or its hunks.
/// (The reason is a String: it is shown to the reviewer as text, not a failure.)
fn offer(ws: &Root, upper: &Root, item: &ReviewItem) -> anyhow::Result<Result<Offered, String>> {
    let change = &item.change;
    if let Some(reason) = &item.forbidden {
        return Ok(Err(format!("never applied: {reason}")));
    }
    if let Some(reason) = &item.conflict {
        return Ok(Err(format!(
            "in conflict ({}); `pvisor review --diff` shows it, `apply --force PATH` overwrites",
            shown(reason)
        )));
    }
    if let Some(reason) = &item.unsupported {
        return Ok(Err(reason.clone()));
    }
    let modified = change.entry == EntryType::File && change.kind == ChangeKind::Modified;
    let host_is_file =
        ws.stat(change.path.as_path())?.is_some_and(|s| s.kind == pvisor_stage::beneath::Kind::File);
    if !modified || !host_is_file {
        return Ok(Err(format!("{}: no hunks; `apply -i` offers it whole", change.kind.as_str())));
    }
    let (host, staged) = (read_capped(ws, change)?, read_capped(upper, change)?);
    let hunks = match Hunks::new(&host, &staged) {
        Ok(hunks) if !hunks.is_empty() => hunks,
        Ok(_) => return Ok(Err("only its mode changed; `apply -i` offers it whole".into())),
        Err(why) => return Ok(Err(format!("{why}: no hunks; `apply -i` offers it whole"))),
    };
    Ok(Ok(Offered {
        change: change.clone(),
        hunks,
        host_blake3: pvisor_core::digest::digest_bytes(&host),
        sensitive: item.sensitive.clone(),
    }))
}

pub fn cmd_apply_hunks(runtime: &Runtime, args: ApplyArgs) -> anyhow::Result<i32> {
    let (job, paths, _session_hold) =
        super::target_and_paths_reviewed(runtime, args.session.as_deref(), args.job, args.paths, "apply")?;
    let sensitive = crate::config::sensitive(runtime.store())?;
    let stage = runtime.execute(Review { job: job.clone() })?;
    stage.require_confirmed()?;
    let items: Vec<_> = stage.review(&paths, &sensitive)?.into_iter().filter(|i| i.remaining()).collect();
    let (ws, upper) = stage.diff_roots()?;
    let color = super::use_color(args.color);
    let mut offered = Vec::new();
    let mut not_offered = Vec::new();
    for item in &items {
        match offer(&ws, &upper, item)? {
            Ok(o) => offered.push(o),
            Err(reason) => not_offered.push((item.change.path.display_escaped(), reason)),
        }
    }
    let mut out = crate::output::stdout();
    let chosen = ask(&mut out, &offered, color)?;
    writeln!(out)?;
    for (path, reason) in &not_offered {
        writeln!(out, "  not offered  {path}: {reason}")?;
    }
    drop(out);
    let (whole, partial) = split_chosen(&offered, &chosen);
    if whole.is_empty() && partial.is_empty() {
        eprintln!("pvisor: no hunk chosen; nothing applied");
        return Ok(0);
    }
    apply_chosen(runtime, &job, &sensitive, &offered, &chosen, whole, partial)
}

/// Shows each hunk of each offered file and asks about it, one key each
/// (see [`HELP`]); which hunks were taken, per file.
fn ask(out: &mut impl Write, offered: &[Offered], color: bool) -> anyhow::Result<Vec<Vec<bool>>> {
    let total: usize = offered.iter().map(|o| o.hunks.len()).sum();
    let mut answers = Answers::open();
    let mut chosen: Vec<Vec<bool>> = offered.iter().map(|o| vec![false; o.hunks.len()]).collect();
    let mut asked = 0;
    'files: for (f, file) in offered.iter().enumerate() {
        let path = file.change.path.display_escaped();
        let mut rest: Option<bool> = None;
        for (h, pick) in chosen[f].iter_mut().enumerate() {
            asked += 1;
            if let Some(take) = rest {
                *pick = take;
                continue;
            }
            writeln!(out)?;
            if h == 0 {
                writeln!(out, "diff {path} (modified)")?;
                writeln!(out, "--- a/{path}\n+++ b/{path}")?;
                if let Some(reason) = &file.sensitive {
                    writeln!(out, "SENSITIVE: {reason}")?;
                }
            }
            file.hunks.write_hunk(out, h, color)?;
            loop {
                write!(
                    out,
                    "({asked}/{total}) Apply this hunk to {path} ({}/{})? [y,n,a,d,q,?] ",
                    h + 1,
                    file.hunks.len()
                )?;
                out.flush()?;
                let Some(key) = answers.next()? else { break 'files };
                writeln!(out, "{key}")?;
                match key {
                    'y' => *pick = true,
                    'n' => {}
                    'a' | 'd' => {
                        *pick = key == 'a';
                        rest = Some(key == 'a');
                    }
                    'q' => break 'files,
                    _ => {
                        writeln!(out, "{HELP}")?;
                        continue;
                    }
                }
                break;
            }
        }
    }
    Ok(chosen)
}

/// The files with every hunk taken (the staged file itself, applied
/// whole), and those with some (their merged contents).
fn split_chosen(offered: &[Offered], chosen: &[Vec<bool>]) -> (Vec<RelPath>, Vec<HunkChoice>) {
    let mut whole = Vec::new();
    let mut partial = Vec::new();
    for (file, picks) in offered.iter().zip(chosen) {
        match picks.iter().filter(|&&p| p).count() {
            0 => {}
            n if n == picks.len() => whole.push(file.change.path.clone()),
            _ => partial.push(HunkChoice {
                path: file.change.path.clone(),
                host_blake3: file.host_blake3.clone(),
                contents: file.hunks.merge(picks),
            }),
        }
    }
    (whole, partial)
}

/// Applies the chosen hunks and whole files, and says what landed.
fn apply_chosen(
    runtime: &Runtime,
    job: &JobId,
    sensitive: &Sensitive,
    offered: &[Offered],
    chosen: &[Vec<bool>],
    whole: Vec<RelPath>,
    partial: Vec<HunkChoice>,
) -> anyhow::Result<i32> {
    let mut out = crate::output::stdout();
    let mut incomplete = false;
    let report =
        runtime.execute(ApplyHunks { job: job.clone(), choices: partial, sensitive: sensitive.clone() })?;
    for (change, _) in &report.written {
        let Some(file) = offered.iter().position(|o| o.change.path == change.path) else { continue };
        let picks = &chosen[file];
        let taken = picks.iter().filter(|&&p| p).count();
        writeln!(out, "  hunks      {taken} of {}  {}", picks.len(), change.path.display_escaped())?;
    }
    for (change, reason) in &report.refused {
        incomplete = true;
        writeln!(out, "  REFUSED    {}: {}", change.path.display_escaped(), shown(reason))?;
    }
    if !whole.is_empty() {
        let options = ApplyOptions { sensitive: sensitive.clone(), ..Default::default() };
        let apply = Apply {
            job: job.clone(),
            selection: Selection::Paths(whole),
            options,
            progress: Box::new(|_| {}),
        };
        let applied = runtime.execute(apply)?;
        for (change, reason) in applied.conflicts.iter().chain(&applied.failed).chain(&applied.refused) {
            incomplete = true;
            writeln!(out, "  REFUSED    {}: {}", change.path.display_escaped(), shown(reason))?;
        }
        if applied.executed {
            for planned in &applied.plan {
                if !applied.failed.iter().any(|(c, _)| c.path == planned.change.path) {
                    writeln!(out, "  applied    whole       {}", planned.change.path.display_escaped())?;
                }
            }
        }
    }
    let stage = runtime.execute(Review { job: job.clone() })?;
    writeln!(
        out,
        "hunks applied to {}; {} change(s) remaining; stage {}",
        shown_path(&stage.workspace),
        stage.remaining(),
        stage.state().as_str()
    )?;
    if incomplete {
        let me = crate::output::me();
        writeln!(out, "some choices were not applied (above); `{me} review {job} --diff` shows why")?;
    }
    Ok(if incomplete { INCOMPLETE } else { 0 })
}
