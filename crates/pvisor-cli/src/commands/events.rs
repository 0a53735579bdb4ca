//! `pvisor events [JOB] [--json]`: the Trace.

use pvisor_core::text::{escape, Tabs};
use std::io::Write;

use pvisor::actions::{Events, Trace};
use pvisor::Runtime;
use pvisor_core::ids::JobId;

use crate::cli::EventsArgs;
use crate::json::{json_line, JsonType};

pub fn cmd_events(runtime: &Runtime, args: EventsArgs) -> anyhow::Result<i32> {
    let jobs = match &args.session {
        Some(name) => {
            anyhow::ensure!(args.job.is_none(), "give a JOB or --session NAME, not both");
            super::sessions::find(runtime, name)?.record.jobs
        }
        None => vec![super::resolve_job(runtime, args.job.as_deref())?],
    };
    let several = jobs.len() > 1;
    let mut out = crate::output::stdout();
    for job in jobs {
        super::recover(runtime, &job)?;
        if several && !args.json {
            writeln!(out, "{job}")?;
        }
        print_trace(runtime, &mut out, job, args.json)?;
    }
    Ok(0)
}

/// Prints one Job's Trace.
fn print_trace(runtime: &Runtime, out: &mut impl Write, job: JobId, json: bool) -> anyhow::Result<()> {
    let Trace { events, warnings } = runtime.execute(Events { job })?;
    for event in &events {
        if json {
            json_line(out, JsonType::Event, event)?;
        } else {
            let cause = event.cause.map(|c| format!(" ←{c}")).unwrap_or_default();
            let data = match &event.data {
                serde_json::Value::Null => String::new(),
                d => d.to_string(),
            };
            // Event data carries staged names and hosts the command chose.
            let (kind, data) = (escape(event.kind.as_str(), Tabs::Escape), escape(&data, Tabs::Escape));
            writeln!(out, "{:>3}{:<5} {}  {:<22} {}", event.seq, cause, event.time, kind, data)?;
        }
    }
    for warning in warnings {
        eprintln!("pvisor: warning: {warning}");
    }
    Ok(())
}
