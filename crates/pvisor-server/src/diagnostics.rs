//! The diagnostics routes, as the reference server answers them
//! (server/opensandbox_server/api/devops.py): the stable, `scope`d API is
//! 501 `DIAGNOSTICS_NOT_IMPLEMENTED`; without `scope` each route answers
//! the deprecated plain text (`Deprecation: true` on logs and events):
//! `logs` is the tail of the entrypoint's output (the container's logs),
//! `events` the sandbox's lifecycle, `inspect` what it is, `summary` all
//! three.
//!
//! Everything here is read from the daemon's record and, for logs, from
//! the guest while the sandbox is Running; no route changes anything.

use std::path::Path;
use std::sync::Arc;

use hyper::{Response, StatusCode};

use crate::guest_link;
use crate::http::{self, ApiError, ApiResult};
use crate::sandbox::{Daemon, SandboxRecord, SandboxState, GUEST_LOG_DIR};

/// The most log bytes read from the guest for one answer (its tail).
const LOG_WINDOW: u64 = 1 << 20;

/// Routes `GET /sandboxes/{id}/diagnostics/{what}`.
pub fn route(daemon: &Arc<Daemon>, id: &str, what: &str, query: Option<&str>) -> ApiResult {
    let pairs = http::query_pairs(query)?;
    let record = daemon.visible(id)?;
    let number = |key: &str, default: usize, max: usize| -> Result<usize, ApiError> {
        match http::query_one(&pairs, key) {
            None => Ok(default),
            Some(v) => v.parse().ok().filter(|n| (1..=max).contains(n)).ok_or_else(|| {
                ApiError::bad_request(format!("{key} must be an integer from 1 to {max}, got {v:?}"))
            }),
        }
    };
    let scoped = http::query_one(&pairs, "scope").is_some();
    match what {
        "logs" | "events" if scoped => Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "DIAGNOSTICS_NOT_IMPLEMENTED",
            "The stable Diagnostics API is not implemented by this OpenSandbox server.",
        )),
        "logs" => Ok(text(logs(daemon, &record, number("tail", 100, 10_000)?), true)),
        "events" => Ok(text(events(&record, number("limit", 50, 500)?), true)),
        "inspect" => Ok(text(inspect(&record), false)),
        "summary" => {
            let (tail, limit) = (number("tail", 50, 10_000)?, number("event_limit", 20, 500)?);
            Ok(text(summary(daemon, &record, tail, limit), false))
        }
        other => Err(ApiError::not_found(format!(
            "no diagnostics {other:?}: logs, events, inspect and summary are served"
        ))),
    }
}

fn text(body: String, deprecated: bool) -> Response<http::Body> {
    let mut response = Response::new(http::full(body));
    let headers = response.headers_mut();
    headers.insert("content-type", "text/plain; charset=utf-8".parse().expect("static header"));
    if deprecated {
        headers.insert("deprecation", "true".parse().expect("static header"));
    }
    response
}

/// The last `tail` lines of the entrypoint's output, read from the guest.
fn logs(daemon: &Daemon, record: &SandboxRecord, tail: usize) -> String {
    let Some(entrypoint) = record.commands.get("entrypoint") else { return "(no logs)".into() };
    if record.state != SandboxState::Running {
        return format!(
            "(no logs: the sandbox is {}; logs are read from its running VM)",
            record.state.as_str()
        );
    }
    let name = format!("{}.log", entrypoint.exec_id);
    let read = daemon.live_link(&record.id).map_err(|e| e.to_string()).and_then(|(_, link)| {
        let stat = guest_link::FileOp::Stat { path: format!("/{name}").into() };
        let size = match guest_link::file_op(&link, Path::new(GUEST_LOG_DIR), stat) {
            Ok(guest_link::Reply::Stat { stat }) => stat.size,
            _ => 0,
        };
        let start = size.saturating_sub(LOG_WINDOW);
        let path = Path::new(GUEST_LOG_DIR).join(&name);
        guest_link::read(&link, &path, start, size - start).map_err(|e| e.to_string())
    });
    match read {
        Ok(bytes) => last_lines(&String::from_utf8_lossy(&bytes), tail).unwrap_or_else(|| "(no logs)".into()),
        Err(e) => format!("(no logs: {e})"),
    }
}

/// The last `n` lines of `text`; `None` when it has none.
fn last_lines(text: &str, n: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    (!lines.is_empty()).then(|| lines[lines.len().saturating_sub(n)..].join("\n"))
}

/// The sandbox's lifecycle, oldest first: what it is, then at most
/// `limit` events (the latest).
fn events(record: &SandboxRecord, limit: usize) -> String {
    let header = [
        format!("Sandbox:    {} ({})", record.id, record.image),
        format!("Status:     {}", record.state.as_str()),
        format!("Created:    {}", record.created_at),
    ];
    let mut events = Vec::new();
    for (n, generation) in record.generations.iter().enumerate() {
        let what = if n == 0 { "started" } else { "resumed" };
        let ready = generation.ready_ms.map(|ms| format!(" (ready in {ms} ms)")).unwrap_or_default();
        events.push(format!("Event:      {} {what}{ready}", generation.started_at));
    }
    if let Some(entrypoint) = record.commands.get("entrypoint") {
        if let (Some(at), Some(code)) = (entrypoint.finished_at, entrypoint.exit_code) {
            events.push(format!("Event:      {at} entrypoint exited with code {code}"));
        }
        if let Some(error) = &entrypoint.error {
            events.push(format!("Event:      entrypoint error: {error}"));
        }
    }
    let last = (record.last_transition_at, record.state.as_str(), &record.reason, &record.message);
    events.push(format!("Event:      {} {} ({}) {}", last.0, last.1, last.2, last.3).trim_end().to_owned());
    let skip = events.len().saturating_sub(limit);
    header.into_iter().chain(events.into_iter().skip(skip)).collect::<Vec<_>>().join("\n")
}

/// What the sandbox is: the reference's container inspection, for a VM.
fn inspect(record: &SandboxRecord) -> String {
    let mut lines = vec![
        format!("Sandbox ID:     {}", record.id),
        format!("Image:          {}", record.image),
        format!("Status:         {}", record.state.as_str()),
        format!("Running:        {}", record.state == SandboxState::Running),
        format!("Paused:         {}", record.state == SandboxState::Paused),
        format!("Entrypoint:     {}", record.entrypoint.join(" ")),
        format!("Created At:     {}", record.created_at),
    ];
    if let Some(code) = record.commands.get("entrypoint").and_then(|c| c.exit_code) {
        lines.push(format!("Exit Code:      {code}"));
    }
    lines.push(String::new());
    lines.push("Resources:".into());
    lines.push(format!("  CPU:          {} cores", record.cpus));
    lines.push(format!("  Memory:       {} MiB", record.memory_mib));
    lines.push(String::new());
    lines.push(format!(
        "Network:        {}",
        if record.network_policy.is_some() {
            "egress through pvisor's proxy (networkPolicy)"
        } else {
            "none"
        }
    ));
    if !record.env.is_empty() {
        lines.push(String::new());
        lines.push("Environment:".into());
        for (key, value) in &record.env {
            let secret =
                ["SECRET", "TOKEN", "PASSWORD", "KEY"].iter().any(|s| key.to_uppercase().contains(s));
            lines.push(format!("  {key}={}", if secret { "***" } else { value }));
        }
    }
    lines.join("\n")
}

fn summary(daemon: &Daemon, record: &SandboxRecord, tail: usize, limit: usize) -> String {
    let rule = "=".repeat(72);
    let section =
        |title: &str, body: String| format!("\n{}\n{title}\n{}\n{body}", "-".repeat(40), "-".repeat(40));
    [
        format!("{rule}\nSANDBOX DIAGNOSTICS SUMMARY\nSandbox ID: {}\n{rule}", record.id),
        section("INSPECT", inspect(record)),
        section("EVENTS", events(record, limit)),
        section(&format!("LOGS (last {tail} lines)"), logs(daemon, record, tail)),
    ]
    .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_of_a_log_is_its_last_lines() {
        assert_eq!(last_lines("a\nb\nc\n", 2).as_deref(), Some("b\nc"));
        assert_eq!(last_lines("a", 5).as_deref(), Some("a"));
        assert_eq!(last_lines("", 5), None);
    }
}
