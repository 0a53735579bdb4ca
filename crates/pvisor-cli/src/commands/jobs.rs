//! `pvisor jobs [--json]`.

use std::io::Write;

use pvisor::runtime::job_service::views;

use crate::cli::JobsArgs;
use crate::output::{ending, json_line, shell_words};

pub fn cmd_jobs(args: JobsArgs) -> anyhow::Result<i32> {
    let store = super::open_store()?;
    let mut out = std::io::stdout().lock();
    let mut broken = 0;
    if !args.json {
        writeln!(out, "{:<30}  {:<20}  {:>7}  {:<27}  COMMAND", "JOB", "STATE", "CHANGES", "CREATED")?;
    }
    for id in store.list_jobs()? {
        if let Err(e) = super::recover(&store, &id) {
            eprintln!("pvisor: warning: {id}: {e}");
        }
    }
    for (id, status) in views::list(&store)? {
        match status {
            Ok(s) if args.json => json_line(&mut out, "job", &s)?,
            Ok(s) => {
                let changes = s.changes.map_or("-".to_owned(), |n| n.to_string());
                writeln!(
                    out,
                    "{:<30}  {:<20}  {:>7}  {:<27}  {}",
                    s.job,
                    ending(s.state.as_str(), s.exit_code, s.signal),
                    changes,
                    s.created_at.to_string(),
                    shell_words(&s.program, &s.args)
                )?;
            }
            Err(e) => {
                broken += 1;
                if args.json {
                    json_line(&mut out, "error", &serde_json::json!({"job": id, "error": e.to_string()}))?;
                } else {
                    writeln!(out, "{id:<30}  error: {e}")?;
                }
            }
        }
    }
    Ok(if broken > 0 { crate::exit::PVISOR_ERROR } else { 0 })
}
