//! execd's router: [`route`] connects to the sandbox's guest, then hands
//! the request to the function of its route group (commands, files,
//! directories, sessions, code contexts, metrics).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use hyper::body::Bytes;
use hyper::{HeaderMap, Method, StatusCode};
use serde_json::Value;

use super::commands::{command_logs, command_status, interrupt, note_in_trace, run_command, RunCommand};
use super::files::{download, file_info, read_lines, upload, LineWindow};
use super::metrics::{metrics, watch};
use super::replace::{replace, ReplaceItem};
use super::search::{join_display, list, search};
use super::sessions::{create_session, run_in_session, CreateSession};
use super::{blocking, connect, missing_query, octal_mode, ping, Guest, Permission, RenameItem};
use crate::guest_link::{EntryKind, FileOp};
use crate::http::{self, json, ApiError, ApiResult};
use crate::sandbox::Daemon;

/// The largest JSON body a route reads.
const SMALL_BODY: usize = 16 << 20;

/// One execd request past its token check: the sandbox's guest, the
/// parsed query and what is left of the request.
struct Call<'a, B> {
    daemon: &'a Arc<Daemon>,
    method: &'a Method,
    rest: &'a [&'a str],
    q: Vec<(String, String)>,
    headers: &'a HeaderMap,
    body: B,
    guest: Guest,
}

impl<B> Call<'_, B>
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    fn query(&self, name: &str) -> Option<&str> {
        http::query_one(&self.q, name)
    }

    fn required(&self, name: &str) -> Result<String, ApiError> {
        self.query(name).map(str::to_owned).ok_or_else(|| missing_query(name))
    }

    fn paths(&self) -> Vec<String> {
        http::query_all(&self.q, "path").into_iter().map(str::to_owned).collect()
    }

    /// The body, as JSON naming `what` in its errors.
    async fn json<T: serde::de::DeserializeOwned>(self, what: &str) -> Result<(T, Guest), ApiError> {
        let bytes = http::read_body(self.body, SMALL_BODY).await?;
        Ok((http::parse_json(&bytes, what)?, self.guest))
    }

    /// The body as JSON, or `T::default()` for an empty one.
    async fn json_or_default<T: serde::de::DeserializeOwned + Default>(
        self,
        what: &str,
    ) -> Result<(T, Guest), ApiError> {
        let bytes = http::read_body(self.body, SMALL_BODY).await?;
        let value = if bytes.iter().all(u8::is_ascii_whitespace) {
            T::default()
        } else {
            http::parse_json(&bytes, what)?
        };
        Ok((value, self.guest))
    }

    fn no_route(&self) -> ApiError {
        ApiError::not_found(format!("no execd route for {} /{}", self.method, self.rest.join("/")))
    }
}

/// execd's routes. Errors are answered in the reference execd's code
/// vocabulary (`components/execd/pkg/web/model/error.go`), which differs
/// from the lifecycle API's: a bad request is `INVALID_REQUEST_BODY`, a
/// failure inside the sandbox `RUNTIME_ERROR`.
pub async fn route<B>(
    daemon: &Arc<Daemon>,
    id: &str,
    method: &Method,
    rest: &[&str],
    query: Option<&str>,
    headers: &HeaderMap,
    body: B,
) -> ApiResult
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let answered: ApiResult = async {
        if let (&Method::GET, ["ping"]) = (method, rest) {
            return ping(daemon, id, headers).await;
        }
        let guest = {
            let (daemon, id, headers) = (daemon.clone(), id.to_owned(), headers.clone());
            blocking(move || connect(&daemon, &id, &headers)).await?
        };
        let q = http::query_pairs(query)?;
        let call = Call { daemon, method, rest, q, headers, body, guest };
        match rest.first().copied() {
            Some("command") => commands(call).await,
            Some("files") => files(call).await,
            Some("directories") => directories(call).await,
            Some("session") => sessions(call).await,
            Some("code") => code(call).await,
            Some("metrics") => metrics_route(call).await,
            _ => Err(call.no_route()),
        }
    }
    .await;
    answered.map_err(|mut e| {
        e.code = match e.code {
            "INVALID_REQUEST" => "INVALID_REQUEST_BODY",
            "INTERNAL_ERROR" => "RUNTIME_ERROR",
            other => other,
        };
        e
    })
}

/// `/command…`: run, interrupt, status and logs.
async fn commands<B>(call: Call<'_, B>) -> ApiResult
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let daemon = call.daemon;
    match (call.method, call.rest) {
        (&Method::POST, ["command"]) => {
            let (request, guest): (RunCommand, _) = call.json("RunCommandRequest").await?;
            run_command(daemon.clone(), guest, request).await
        }
        (&Method::DELETE, ["command"]) => {
            let cmd = call.required("id")?;
            interrupt(daemon, call.guest, &cmd).await
        }
        (&Method::GET, ["command", "status", cmd]) => command_status(call.guest, cmd).await,
        (&Method::GET, ["command", cmd, "logs"]) => {
            let cursor = call.query("cursor").map(str::to_owned);
            command_logs(daemon, call.guest, cmd, cursor.as_deref()).await
        }
        _ => Err(call.no_route()),
    }
}

/// `/files…`: information, removal, permissions, moves, search, upload,
/// download and replacement.
async fn files<B>(call: Call<'_, B>) -> ApiResult
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let (daemon, sandbox, started) = (call.daemon.clone(), call.guest.record.id.clone(), Instant::now());
    let noted = |what: String, result: ApiResult| note_change(&daemon, &sandbox, what, started, result);
    match (call.method, call.rest) {
        (&Method::GET, ["files", "info"]) => {
            let paths = call.paths();
            if paths.is_empty() {
                return Err(missing_query("path"));
            }
            let guest = call.guest;
            blocking(move || {
                let mut out = serde_json::Map::new();
                for p in paths {
                    let stat = guest.stat(&p)?;
                    out.insert(p.clone(), file_info(&p, &stat, guest.names()));
                }
                Ok(json(StatusCode::OK, &out))
            })
            .await
        }
        (&Method::DELETE, ["files"]) => {
            let (paths, guest) = (call.paths(), call.guest);
            let what = format!("rm {}", paths.join(" "));
            let result = blocking(move || {
                for p in paths {
                    if guest.stat(&p).is_ok_and(|s| s.kind == EntryKind::Dir) {
                        return Err(ApiError::bad_request(format!(
                            "{p} is a directory; use DELETE /directories"
                        )));
                    }
                    guest.op(FileOp::Remove { path: p.into(), recursive: false })?;
                }
                Ok(http::empty(StatusCode::OK))
            })
            .await;
            noted(what, result)
        }
        (&Method::POST, ["files", "permissions"]) => {
            let (map, guest): (BTreeMap<String, Permission>, _) = call.json("permissions map").await?;
            let what = format!("chmod {}", map.keys().cloned().collect::<Vec<_>>().join(" "));
            let result = blocking(move || {
                for (p, perm) in map {
                    let uid = perm.owner.as_deref().map(|o| guest.names().uid(o)).transpose()?;
                    let gid = perm.group.as_deref().map(|g| guest.names().gid(g)).transpose()?;
                    guest.op(FileOp::Chmod {
                        path: p.into(),
                        mode: Some(octal_mode(perm.mode)?),
                        uid,
                        gid,
                    })?;
                }
                Ok(http::empty(StatusCode::OK))
            })
            .await;
            noted(what, result)
        }
        (&Method::POST, ["files", "mv"]) => {
            let (items, guest): (Vec<RenameItem>, _) = call.json("rename list").await?;
            let what =
                items.iter().map(|i| format!("mv {} {}", i.src, i.dest)).collect::<Vec<_>>().join("; ");
            let result = blocking(move || {
                for item in items {
                    guest.op(FileOp::Rename { from: item.src.into(), to: item.dest.into() })?;
                }
                Ok(http::empty(StatusCode::OK))
            })
            .await;
            noted(what, result)
        }
        (&Method::GET, ["files", "search"]) => {
            let root = call.required("path")?;
            let pattern = call.query("pattern").unwrap_or("**").to_owned();
            let guest = call.guest;
            blocking(move || search(&guest, &root, &pattern)).await
        }
        (&Method::POST, ["files", "upload"]) => {
            let content_type =
                call.headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
            let mut written = Vec::new();
            let result = upload(call.guest, &content_type, call.body, &mut written).await;
            noted(format!("upload {}", written.join(", ")), result)
        }
        (&Method::GET, ["files", "download"]) => download_route(call).await,
        (&Method::POST, ["files", "replace"]) => {
            let verbose = call.query("verbose").is_some_and(|v| v == "true" || v == "1");
            let (request, guest): (BTreeMap<String, ReplaceItem>, _) =
                call.json("ReplaceFileContentRequest").await?;
            let what = format!("replace in {}", request.keys().cloned().collect::<Vec<_>>().join(" "));
            noted(what, blocking(move || replace(&guest, request, verbose)).await)
        }
        _ => Err(call.no_route()),
    }
}

/// `GET /files/download`: bytes (optionally a Range), or a window of lines.
async fn download_route<B>(call: Call<'_, B>) -> ApiResult
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let path = call.required("path")?;
    let range = call.headers.get("range").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let lines = LineWindow::from_query(&call.q)?;
    let (daemon, guest) = (call.daemon, call.guest);
    match (lines, range) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "offset/limit (lines) and a Range header (bytes) are mutually exclusive; send one",
        )),
        (Some(window), None) => {
            // Held whole (up to 16 MiB): one of the sandbox's streams.
            let slot = daemon.stream_slot(&guest.record.id)?;
            blocking(move || {
                let _slot = slot;
                read_lines(&guest, &path, window)
            })
            .await
        }
        (None, range) => download(daemon, guest, path, range).await,
    }
}

/// `/directories…`: listing, creation and removal.
async fn directories<B>(call: Call<'_, B>) -> ApiResult
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let (daemon, sandbox, started) = (call.daemon.clone(), call.guest.record.id.clone(), Instant::now());
    let noted = |what: String, result: ApiResult| note_change(&daemon, &sandbox, what, started, result);
    match (call.method, call.rest) {
        (&Method::GET, ["directories", "list"]) => {
            let root = call.required("path")?;
            let depth: u32 = match call.query("depth") {
                Some(d) => d.parse().map_err(|_| ApiError::bad_request("depth must be an integer"))?,
                None => 1,
            };
            let guest = call.guest;
            blocking(move || {
                let entries = list(&guest, &root, depth.max(1))?;
                let out: Vec<Value> = entries
                    .iter()
                    .map(|e| file_info(&join_display(&root, &e.path), e, guest.names()))
                    .collect();
                Ok(json(StatusCode::OK, &out))
            })
            .await
        }
        (&Method::POST, ["directories"]) => {
            let (map, guest): (BTreeMap<String, Permission>, _) = call.json("directories map").await?;
            let what = format!("mkdir {}", map.keys().cloned().collect::<Vec<_>>().join(" "));
            let result = blocking(move || {
                for (p, perm) in map {
                    guest.op(FileOp::Mkdir { path: p.clone().into(), mode: octal_mode(perm.mode)? })?;
                    let uid = perm.owner.as_deref().map(|o| guest.names().uid(o)).transpose()?;
                    let gid = perm.group.as_deref().map(|g| guest.names().gid(g)).transpose()?;
                    if uid.is_some() || gid.is_some() {
                        guest.op(FileOp::Chmod { path: p.into(), mode: None, uid, gid })?;
                    }
                }
                Ok(http::empty(StatusCode::OK))
            })
            .await;
            noted(what, result)
        }
        (&Method::DELETE, ["directories"]) => {
            let (paths, guest) = (call.paths(), call.guest);
            let what = format!("rm -r {}", paths.join(" "));
            let result = blocking(move || {
                for p in paths {
                    guest.op(FileOp::Remove { path: p.into(), recursive: true })?;
                }
                Ok(http::empty(StatusCode::OK))
            })
            .await;
            noted(what, result)
        }
        _ => Err(call.no_route()),
    }
}

/// Has the sandbox Job's Trace record a change execd made to the guest's
/// files (a `frontend.command` event: `what`, and whether it worked).
fn note_change(
    daemon: &Arc<Daemon>,
    sandbox: &str,
    what: String,
    started: Instant,
    result: ApiResult,
) -> ApiResult {
    let note = pvisor::FrontendNote {
        command: what,
        uid: None,
        background: false,
        exit_code: Some(i32::from(result.is_err())),
        error: result.as_ref().err().map(|e| e.message.clone()),
        duration_ms: started.elapsed().as_millis() as u64,
    };
    note_in_trace(daemon, sandbox, note);
    result
}

/// `/session…`: bash sessions, created, run in and deleted.
async fn sessions<B>(call: Call<'_, B>) -> ApiResult
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let daemon = call.daemon;
    match (call.method, call.rest) {
        (&Method::POST, ["session"]) => {
            let (request, guest): (CreateSession, _) = call.json_or_default("CreateSessionRequest").await?;
            create_session(daemon, guest, request).await
        }
        (&Method::POST, ["session", session, "run"]) => {
            let (request, guest) = call.json("RunInSessionRequest").await?;
            run_in_session(daemon, &guest.record.id, session, request)
        }
        (&Method::DELETE, ["session", session]) => {
            let sandbox = call.guest.record.id;
            let key = (sandbox.clone(), (*session).to_owned());
            let removed = daemon.sessions.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
            match removed {
                Some(s) => {
                    s.kill();
                    Ok(http::empty(StatusCode::OK))
                }
                None => Err(ApiError::not_found(format!("no session {session} in sandbox {sandbox}"))),
            }
        }
        _ => Err(call.no_route()),
    }
}

/// `/code…`: code-interpreter contexts and runs.
async fn code<B>(call: Call<'_, B>) -> ApiResult
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    use crate::code_contexts::{self as contexts, CreateContext, RunCode};
    let daemon = call.daemon;
    match (call.method, call.rest) {
        (&Method::POST, ["code", "context"]) => {
            let (request, guest): (CreateContext, _) = call.json_or_default("CodeContextRequest").await?;
            contexts::create(daemon, guest.link, guest.record, request).await
        }
        (&Method::GET, ["code", "contexts"]) => {
            contexts::list(daemon, &call.guest.record.id, call.query("language"))
        }
        (&Method::DELETE, ["code", "contexts"]) => {
            let language =
                call.query("language").filter(|l| !l.is_empty()).ok_or_else(|| missing_query("language"))?;
            contexts::delete_language(daemon, &call.guest.record.id, language)
        }
        (&Method::GET, ["code", "contexts", context]) => {
            contexts::get(daemon, &call.guest.record.id, context)
        }
        (&Method::DELETE, ["code", "contexts", context]) => {
            contexts::delete(daemon, &call.guest.record.id, context)
        }
        (&Method::POST, ["code"]) => {
            let (request, guest): (RunCode, _) = call.json("RunCodeRequest").await?;
            contexts::run(daemon, guest.link, guest.record, request).await
        }
        (&Method::DELETE, ["code"]) => {
            let id = call.query("id").filter(|i| !i.is_empty()).ok_or_else(|| missing_query("id"))?;
            contexts::interrupt(daemon, &call.guest.record.id, id)
        }
        _ => Err(call.no_route()),
    }
}

/// `/metrics` and `/metrics/watch`.
async fn metrics_route<B>(call: Call<'_, B>) -> ApiResult
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    match (call.method, call.rest) {
        (&Method::GET, ["metrics"]) => {
            let guest = call.guest;
            blocking(move || metrics(&guest)).await
        }
        (&Method::GET, ["metrics", "watch"]) => Ok(watch(call.guest)),
        _ => Err(call.no_route()),
    }
}
