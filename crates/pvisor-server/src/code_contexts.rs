//! Execd code contexts (`/code/context`, `/code/contexts`, `/code`): a
//! persistent interpreter per context (Python, bash, Java, Go, TypeScript) in the sandbox
//! ([`crate::repl`]), answering in the reference execd's shapes
//! (OpenSandbox `components/execd/pkg/web/controller/codeinterpreting.go`
//! and `pkg/runtime/jupyter.go`): context ids are 32 hex digits; a run
//! without a context id uses (and first creates) the language's default
//! context; a run streams `init` (the context id), `stdout`/`stderr`,
//! `execution_count`, `result` (`{"text": repr}` of a final expression, the
//! `text/plain` Jupyter gives) and then `execution_complete`, or `error`
//! (`ename`, `evalue`, `traceback`) as its last event.
//!
//! The reference runs Jupyter kernels; pvisor needs none: the image's own
//! interpreter runs a small driver per language ([`crate::repl`]: python3
//! for Python, and for Go, which builds and runs each cell as a whole
//! program; node with the image's TypeScript; the JDK's JShell for Java),
//! and bash runs as a session does. The `code-interpreter` built-in image
//! has all of them. Contexts live in the daemon's memory and end with the
//! sandbox's relay (pause, daemon restart), as bash sessions do.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hyper::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::execd::{complete_event, error_event, event, output_events, sse};
use crate::http::{self, ApiError, ApiResult};
use crate::repl::{Dialect, Piece, Repl};
use crate::sandbox::{Daemon, SandboxRecord};

/// The interpreters a context can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Language {
    Python,
    Bash,
    Java,
    Go,
    TypeScript,
}

impl Language {
    /// The language a request names; `None` when the request names none.
    fn parse(name: Option<&str>) -> Result<Self, ApiError> {
        match name.map(str::to_ascii_lowercase).as_deref() {
            None | Some("") | Some("python") | Some("python3") => Ok(Self::Python),
            Some("bash") | Some("shell") | Some("sh") => Ok(Self::Bash),
            Some("java") => Ok(Self::Java),
            Some("go") | Some("golang") => Ok(Self::Go),
            Some("typescript") | Some("ts") => Ok(Self::TypeScript),
            Some(other) => Err(ApiError::bad_request(format!(
                "code contexts run python, bash, java, go or typescript in pvisor serve, not {other:?}; for other languages run their interpreter with POST /command"
            ))),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Python => "python",
            Self::Bash => "bash",
            Self::Java => "java",
            Self::Go => "go",
            Self::TypeScript => "typescript",
        }
    }

    fn dialect(self) -> Dialect {
        match self {
            Self::Python => Dialect::Python,
            Self::Bash => Dialect::Bash,
            Self::Java => Dialect::Java,
            Self::Go => Dialect::Go,
            Self::TypeScript => Dialect::TypeScript,
        }
    }
}

/// One context: its interpreter, and whether it is its language's default.
#[derive(Debug)]
pub struct CodeContext {
    language: Language,
    default: bool,
    repl: Repl,
}

/// Contexts by (sandbox id, context id).
pub type Contexts = Mutex<HashMap<(String, String), Arc<CodeContext>>>;

/// `POST /code/context` (`CodeContextRequest`).
#[derive(Debug, Default, Deserialize)]
pub struct CreateContext {
    language: Option<String>,
    cwd: Option<String>,
}

/// `CodeContext` as a request names it (`RunCodeRequest.context`).
#[derive(Debug, Default, Deserialize)]
pub struct ContextRef {
    id: Option<String>,
    language: Option<String>,
}

/// `POST /code` (`RunCodeRequest`).
#[derive(Debug, Deserialize)]
pub struct RunCode {
    #[serde(default)]
    context: ContextRef,
    code: String,
}

fn lock(daemon: &Daemon) -> std::sync::MutexGuard<'_, HashMap<(String, String), Arc<CodeContext>>> {
    daemon.contexts.lock().unwrap_or_else(|p| p.into_inner())
}

fn not_found(sandbox: &str, id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "CONTEXT_NOT_FOUND",
        format!("context {id} not found in sandbox {sandbox}; create one with POST /code/context"),
    )
}

/// The live context `id` of `sandbox`; an ended one is forgotten, and the
/// error says why it ended.
fn find(daemon: &Daemon, sandbox: &str, id: &str) -> Result<Arc<CodeContext>, ApiError> {
    let mut contexts = lock(daemon);
    let key = (sandbox.to_owned(), id.to_owned());
    match contexts.get(&key) {
        Some(c) if c.repl.ended() => {
            let why = c.repl.ended_reason().unwrap_or_else(|| "its interpreter ended".into());
            contexts.remove(&key);
            Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "CONTEXT_NOT_FOUND",
                format!("context {id} has ended ({why}); create a new one with POST /code/context"),
            ))
        }
        Some(found) => Ok(found.clone()),
        None => Err(not_found(sandbox, id)),
    }
}

/// Starts a context's interpreter and registers it.
async fn start(
    daemon: &Arc<Daemon>,
    link: crate::guest_link::Link,
    record: SandboxRecord,
    language: Language,
    cwd: Option<String>,
    default: bool,
) -> Result<(String, Arc<CodeContext>), ApiError> {
    let sandbox = record.id.clone();
    let open = lock(daemon).keys().filter(|(sb, _)| *sb == sandbox).count();
    if open >= crate::sandbox::MAX_STREAMS {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "TOO_MANY_CONTEXTS",
            format!(
                "sandbox {sandbox} has {open} code contexts; delete one first (DELETE /code/contexts/{{id}})"
            ),
        ));
    }
    let exec_id = daemon.next_exec_id(&sandbox)?;
    let repl = tokio::task::spawn_blocking(move || {
        Repl::start(language.dialect(), &link, &record, exec_id, cwd.as_deref())
    })
    .await
    .map_err(|e| ApiError::internal(format!("worker failed: {e}")))??;
    let id = http::uuid4().replace('-', "");
    let context = Arc::new(CodeContext { language, default, repl });
    if !default {
        // A default is registered by its caller, which checks for a rival.
        lock(daemon).insert((sandbox, id.clone()), context.clone());
    }
    Ok((id, context))
}

fn describe(id: &str, context: &CodeContext) -> Value {
    json!({ "id": id, "language": context.language.as_str() })
}

/// `POST /code/context`.
pub async fn create(
    daemon: &Arc<Daemon>,
    link: crate::guest_link::Link,
    record: SandboxRecord,
    request: CreateContext,
) -> ApiResult {
    let language = Language::parse(request.language.as_deref())?;
    let (id, context) = start(daemon, link, record, language, request.cwd, false).await?;
    Ok(http::json(StatusCode::OK, &describe(&id, &context)))
}

/// `GET /code/contexts[?language=]`: every live context of the sandbox, or
/// those of one language (a language pvisor does not run has none; the
/// reference lists all when the query is empty, though the spec requires it).
pub fn list(daemon: &Daemon, sandbox: &str, language: Option<&str>) -> ApiResult {
    let wanted = language.filter(|l| !l.is_empty()).map(|l| Language::parse(Some(l)).ok());
    let mut contexts = lock(daemon);
    contexts.retain(|_, c| !c.repl.ended());
    let mut found: Vec<Value> = contexts
        .iter()
        .filter(|((sb, _), c)| sb == sandbox && wanted.is_none_or(|w| w == Some(c.language)))
        .map(|((_, id), c)| describe(id, c))
        .collect();
    found.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    Ok(http::json(StatusCode::OK, &Value::Array(found)))
}

/// `GET /code/contexts/{id}`.
pub fn get(daemon: &Daemon, sandbox: &str, id: &str) -> ApiResult {
    let context = find(daemon, sandbox, id)?;
    Ok(http::json(StatusCode::OK, &describe(id, &context)))
}

/// `DELETE /code/contexts/{id}`: ends its interpreter.
pub fn delete(daemon: &Daemon, sandbox: &str, id: &str) -> ApiResult {
    let removed = lock(daemon).remove(&(sandbox.to_owned(), id.to_owned()));
    let context = removed.ok_or_else(|| not_found(sandbox, id))?;
    context.repl.kill();
    Ok(http::empty(StatusCode::OK))
}

/// `DELETE /code/contexts?language=`: ends every context of that language.
pub fn delete_language(daemon: &Daemon, sandbox: &str, language: &str) -> ApiResult {
    let Ok(language) = Language::parse(Some(language)) else {
        return Ok(http::empty(StatusCode::OK));
    };
    let mut contexts = lock(daemon);
    contexts.retain(|(sb, _), c| {
        let doomed = sb == sandbox && c.language == language;
        if doomed {
            c.repl.kill();
        }
        !doomed
    });
    Ok(http::empty(StatusCode::OK))
}

/// `DELETE /code?id=`: interrupts the context's run in progress (SIGINT;
/// a Python cell ends with a KeyboardInterrupt error), keeping its state.
pub fn interrupt(daemon: &Daemon, sandbox: &str, id: &str) -> ApiResult {
    let context = find(daemon, sandbox, id)?;
    context.repl.interrupt();
    Ok(http::empty(StatusCode::OK))
}

/// What a cell driver (python, go, typescript, java) says of a finished cell.
#[derive(Debug, Deserialize)]
struct CellEnd {
    count: u64,
    result: Option<String>,
    error: Option<Value>,
}

/// `POST /code`: runs `code` in the named context, or in the language's
/// default context (created on first use), streaming SSE events.
pub async fn run(
    daemon: &Arc<Daemon>,
    link: crate::guest_link::Link,
    record: SandboxRecord,
    request: RunCode,
) -> ApiResult {
    let sandbox = record.id.clone();
    let named = request.context.language.as_deref().filter(|l| !l.is_empty());
    let (id, context) = match request.context.id.as_deref().filter(|i| !i.is_empty()) {
        Some(id) => {
            // Documented statuses of POST /code are 400 and 500; an unknown
            // context is the client's mistake (the reference answers 500).
            let context = find(daemon, &sandbox, id).map_err(|mut e| {
                e.status = StatusCode::BAD_REQUEST;
                e
            })?;
            if let Some(name) = named {
                if Language::parse(Some(name))? != context.language {
                    return Err(ApiError::bad_request(format!(
                        "context {id} runs {}, not {name}",
                        context.language.as_str()
                    )));
                }
            }
            (id.to_owned(), context)
        }
        None => {
            let language = Language::parse(named)?;
            let existing = {
                let mut contexts = lock(daemon);
                contexts.retain(|_, c| !c.repl.ended());
                contexts
                    .iter()
                    .find(|((sb, _), c)| *sb == sandbox && c.default && c.language == language)
                    .map(|((_, id), c)| (id.clone(), c.clone()))
            };
            match existing {
                Some(found) => found,
                None => {
                    let (id, started) = start(daemon, link, record, language, None, true).await?;
                    // Two first runs at once each start one; the first to
                    // register it is the default, the other's is ended.
                    let mut contexts = lock(daemon);
                    let rival = contexts
                        .iter()
                        .find(|((sb, _), c)| {
                            *sb == sandbox && c.default && c.language == language && !c.repl.ended()
                        })
                        .map(|((_, other), c)| (other.clone(), c.clone()));
                    match rival {
                        Some(found) => {
                            started.repl.kill();
                            found
                        }
                        None => {
                            contexts.insert((sandbox.clone(), id.clone()), started.clone());
                            (id, started)
                        }
                    }
                }
            }
        }
    };
    let slot = daemon.stream_slot(&sandbox)?;
    let (tx, body) = http::channel_body(64);
    let daemon = daemon.clone();
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let started = Instant::now();
        if tx.blocking_send(event(json!({ "type": "init", "text": id }))).is_err() {
            return;
        }
        let language = context.language;
        let mut tx = Some(tx);
        // The Trace gets the code and how its run ended (a bash status; a
        // python run's error is in its stream, not here).
        let mut note = pvisor::FrontendNote {
            command: format!("code {} {id}: {}", language.as_str(), request.code),
            uid: None,
            background: false,
            exit_code: None,
            error: None,
            duration_ms: 0,
        };
        context.repl.run(&request.code, None, None, |piece| {
            let last = matches!(piece, Piece::Failed(_));
            let events = match piece {
                // Jupyter's streams are chunks, not lines: sent as they come.
                Piece::Stdout(b) => output_events("stdout", vec![b]),
                Piece::Stderr(b) => output_events("stderr", vec![b]),
                Piece::Done(payload) => match language {
                    Language::Bash => match payload.parse().unwrap_or(-1) {
                        0 => {
                            note.exit_code = Some(0);
                            vec![complete_event(started)]
                        }
                        code => {
                            note.exit_code = Some(code);
                            vec![error_event(code, &format!("exit status {code}"))]
                        }
                    },
                    _ => cell_ending(&payload, started),
                },
                Piece::Failed(why) => {
                    note.error = Some(why.clone());
                    vec![event(
                        json!({ "type": "error", "error": { "ename": "ContextError", "evalue": why, "traceback": [] } }),
                    )]
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
        crate::execd::commands::note_in_trace(&daemon, &sandbox, note);
    });
    Ok(sse(body))
}

/// The events that end a cell (every driver's payload): its count, its value, then complete
/// or its error (the reference's `dispatchExecutionResultHooks` order).
fn cell_ending(payload: &str, started: Instant) -> Vec<hyper::body::Bytes> {
    let end: CellEnd = match serde_json::from_str(payload) {
        Ok(end) => end,
        Err(e) => {
            return vec![event(json!({
                "type": "error",
                "error": { "ename": "ContextError", "evalue": format!("the interpreter's answer is unreadable: {e}"), "traceback": [] },
            }))]
        }
    };
    let mut events = vec![event(json!({ "type": "execution_count", "execution_count": end.count }))];
    if let Some(text) = end.result {
        events.push(event(json!({ "type": "result", "results": { "text": text } })));
    }
    events.push(match end.error {
        Some(error) => event(json!({ "type": "error", "error": error })),
        None => complete_event(started),
    });
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(events: &[hyper::body::Bytes]) -> Vec<Value> {
        events
            .iter()
            .map(|e| {
                let text = std::str::from_utf8(e).unwrap();
                serde_json::from_str::<Value>(text.trim().strip_prefix("data: ").unwrap()).unwrap()
            })
            .collect()
    }

    #[test]
    fn a_cell_ends_with_its_count_its_value_then_complete_or_its_error() {
        let ok = kinds(&cell_ending(r#"{"count": 3, "result": "4", "error": null}"#, Instant::now()));
        let types: Vec<_> = ok.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["execution_count", "result", "execution_complete"]);
        assert_eq!(ok[0]["execution_count"], 3);
        assert_eq!(ok[1]["results"], json!({ "text": "4" }));
        let failed = kinds(&cell_ending(
            r#"{"count": 1, "result": null, "error": {"ename": "NameError", "evalue": "x", "traceback": ["t"]}}"#,
            Instant::now(),
        ));
        let types: Vec<_> = failed.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["execution_count", "error"]);
        assert_eq!(failed[1]["error"]["ename"], "NameError");
        let garbled = kinds(&cell_ending("not json", Instant::now()));
        assert_eq!(garbled.len(), 1);
        assert_eq!(garbled[0]["error"]["ename"], "ContextError");
    }

    #[test]
    fn languages_are_python_by_default_and_others_are_refused_by_name() {
        assert_eq!(Language::parse(None).unwrap(), Language::Python);
        assert_eq!(Language::parse(Some("Bash")).unwrap(), Language::Bash);
        // The names the code-interpreter SDK's SupportedLanguage sends.
        for (name, language) in
            [("java", Language::Java), ("go", Language::Go), ("typescript", Language::TypeScript)]
        {
            assert_eq!(Language::parse(Some(name)).unwrap(), language);
            assert_eq!(language.as_str(), name);
        }
        let refused = Language::parse(Some("cobol")).unwrap_err();
        assert_eq!(refused.status, StatusCode::BAD_REQUEST);
        assert!(refused.message.contains("cobol"), "{}", refused.message);
    }
}
