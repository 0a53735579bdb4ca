//! `pvisor events [JOB] [--json]`: the Trace.

use pvisor_core::text::{escape, Tabs};
use std::io::Write;

use pvisor::actions::{Events, Trace};
use pvisor::Runtime;

use crate::cli::EventsArgs;
use crate::json::{json_line, JsonType};

pub fn cmd_events(runtime: &Runtime, args: EventsArgs) -> anyhow::Result<i32> {
    let job = super::resolve_job(runtime, args.job.as_deref())?;
    super::recover(runtime, &job)?;
    let Trace { events, warnings } = runtime.execute(Events { job })?;
    let mut out = crate::output::stdout();
    for event in &events {
        if args.json {
            json_line(&mut out, JsonType::Event, event)?;
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
    Ok(0)
}
