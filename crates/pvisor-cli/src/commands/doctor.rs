//! `pvisor doctor [--json]`.

use std::io::Write;

use crate::doctor::{self, Status};

use crate::cli::DoctorArgs;
use crate::json::{json_line, JsonType};

pub fn cmd_doctor(runtime: &pvisor::Runtime, args: DoctorArgs) -> anyhow::Result<i32> {
    let checks = doctor::run_checks(runtime.store().root());
    let mut out = crate::output::stdout();
    for c in &checks {
        if args.json {
            json_line(&mut out, JsonType::Check, c)?;
            continue;
        }
        let mark = match c.status {
            Status::Ok => "ok",
            Status::Missing if c.essential => "MISSING",
            Status::Missing => "warning",
            Status::Info => "info",
        };
        writeln!(out, "  {mark:<8} {:<20} {}", c.name, c.detail)?;
        if let Some(fix) = &c.fix {
            if c.status != Status::Ok {
                writeln!(out, "  {:<8} {:<20} fix: {fix}", "", "")?;
            }
        }
    }
    let broken = checks.iter().filter(|c| c.essential && c.status == Status::Missing).count();
    if !args.json {
        if broken == 0 {
            writeln!(out, "pvisor run works on this host")?;
        } else {
            writeln!(out, "{broken} essential check(s) failed: pvisor run will refuse to start (it never runs unsandboxed)")?;
        }
    }
    Ok(if broken == 0 { 0 } else { 1 })
}
