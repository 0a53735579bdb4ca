//! `pvisor drop [JOB] [PATH...] [--json]`.

use std::io::Write;

use pvisor::actions::DropChanges;
use pvisor::Runtime;

use crate::cli::DropArgs;
use crate::json::{json_line, JsonType};
use crate::output::{path_lines, Detail, PathLine};
use crate::results::DropResult;

pub fn cmd_drop(runtime: &Runtime, args: DropArgs) -> anyhow::Result<i32> {
    let (job, paths, mut session_hold) =
        super::target_and_paths_reviewed(runtime, args.session.as_deref(), args.job, args.paths, "drop")?;
    let report = super::freeing_space(runtime.store(), || {
        Ok(runtime.execute(DropChanges { job: job.clone(), patterns: paths.clone() })?)
    })?;
    if args.json {
        let mut out = crate::output::stdout();
        for path in DropResult::paths(&report) {
            json_line(&mut out, JsonType::Dropped, &path)?;
        }
        super::drop_hold(&mut session_hold);
        super::end_session_if_done(runtime, args.session.as_deref(), &job)?;
        json_line(&mut out, JsonType::Result, &DropResult::from_report(&job, &report))?;
        return Ok(0);
    }
    let mut out = crate::output::stdout();
    let lines: Vec<PathLine> = report
        .dropped
        .iter()
        .map(|c| PathLine {
            word: "dropped".into(),
            kind: c.kind.as_str(),
            path: c.path.display_escaped(),
            note: String::new(),
        })
        .collect();
    path_lines(&mut out, &lines, Detail::of(args.quiet, args.verbose))?;
    writeln!(
        out,
        "{} change(s) dropped; stage {}",
        report.dropped.len(),
        report.state.map_or("?", |s| s.as_str())
    )?;
    if report.already_applied > 0 {
        writeln!(
            out,
            "{} change(s) already applied stay in the workspace: drop never undoes an apply",
            report.already_applied
        )?;
    }
    drop(out);
    super::drop_hold(&mut session_hold);
    super::end_session_if_done(runtime, args.session.as_deref(), &job)?;
    Ok(0)
}
