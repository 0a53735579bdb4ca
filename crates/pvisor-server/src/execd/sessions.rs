//! Execd bash sessions (`POST /session`, `POST /session/{id}/run`): one
//! long-lived shell per session ([`crate::repl`]), each run streamed as SSE.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::StatusCode;
use serde::Deserialize;
use serde_json::json;

use super::events::ending;
use super::{blocking, complete_event, error_event, event, output_events, sse, Guest};
use crate::http::{self, json, ApiError, ApiResult};
use crate::lines::Lines;
use crate::sandbox::Daemon;

#[derive(Debug, Default, Deserialize)]
pub(super) struct CreateSession {
    cwd: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RunInSession {
    command: String,
    cwd: Option<String>,
    /// Milliseconds.
    timeout: Option<u64>,
}

pub(super) async fn create_session(daemon: &Arc<Daemon>, guest: Guest, request: CreateSession) -> ApiResult {
    let open = daemon
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .keys()
        .filter(|(sb, _)| *sb == guest.record.id)
        .count();
    if open >= crate::sandbox::MAX_STREAMS {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "TOO_MANY_SESSIONS",
            format!("sandbox {} has {open} bash sessions; delete one first", guest.record.id),
        ));
    }
    let exec_id = daemon.next_exec_id(&guest.record.id)?;
    let sandbox = guest.record.id.clone();
    let session = blocking(move || {
        crate::repl::Repl::start(
            crate::repl::Dialect::Bash,
            &guest.link,
            &guest.record,
            exec_id,
            request.cwd.as_deref(),
        )
    })
    .await?;
    let id = format!("session-{exec_id}");
    daemon
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert((sandbox, id.clone()), Arc::new(session));
    Ok(json(StatusCode::OK, &json!({ "session_id": id })))
}

pub(super) fn run_in_session(
    daemon: &Arc<Daemon>,
    sandbox: &str,
    session: &str,
    request: RunInSession,
) -> ApiResult {
    use crate::repl::Piece;
    let key = (sandbox.to_owned(), session.to_owned());
    let found = daemon.sessions.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned();
    let session = match found {
        Some(s) if !s.ended() => s,
        Some(_) => {
            daemon.sessions.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
            return Err(ApiError::new(StatusCode::BAD_REQUEST, "SESSION_ENDED", format!("session {} has ended (its shell exited, or the sandbox was paused or the daemon restarted); create a new one", key.1)));
        }
        None => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "SESSION_NOT_FOUND",
                format!("no session {} in sandbox {sandbox}; create one with POST /session", key.1),
            ))
        }
    };
    let slot = daemon.stream_slot(sandbox)?;
    let (tx, body) = http::channel_body(64);
    let id = key.1.clone();
    let (daemon, sandbox) = (daemon.clone(), sandbox.to_owned());
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let started = Instant::now();
        let _ = tx.blocking_send(event(json!({ "type": "init", "text": id })));
        let (mut out, mut err) = (Lines::default(), Lines::default());
        let mut tx = Some(tx);
        let mut note = pvisor::FrontendNote {
            command: format!("session {id}: {}", request.command),
            uid: None,
            background: false,
            exit_code: None,
            error: None,
            duration_ms: 0,
        };
        session.run(&request.command, request.cwd.as_deref(), request.timeout.map(Duration::from_millis), |piece| {
            let last = matches!(piece, Piece::Failed(_));
            let events = match piece {
                Piece::Stdout(b) => output_events("stdout", out.push(&b)),
                Piece::Stderr(b) => output_events("stderr", err.push(&b)),
                Piece::Done(status) => match status.parse().unwrap_or(-1) {
                    0 => {
                        note.exit_code = Some(0);
                        ending(&mut out, &mut err, complete_event(started))
                    }
                    code => {
                        note.exit_code = Some(code);
                        ending(&mut out, &mut err, error_event(code, &format!("exit status {code}")))
                    }
                },
                Piece::Failed(why) => {
                    note.error = Some(why.clone());
                    ending(&mut out, &mut err, event(json!({ "type": "error", "error": { "ename": "SessionError", "evalue": "-1", "traceback": [why] } })))
                }
            };
            let sent = tx.as_ref().is_some_and(|tx| events.into_iter().all(|e| tx.blocking_send(e).is_ok()));
            if last {
                // The answer is complete: end the stream now, even while an
                // interrupted run is still being drained.
                tx = None;
            }
            sent
        });
        note.duration_ms = started.elapsed().as_millis() as u64;
        super::commands::note_in_trace(&daemon, &sandbox, note);
    });
    Ok(sse(body))
}
