//! The execd API (`execd-api.yaml`) of one sandbox, served by the daemon
//! under `/sandboxes/{id}/port/44772/` and carried into the guest through
//! [`crate::guest_link`]: commands stream as SSE, files go through the
//! agent's file operations, beneath the image rootfs the commands are
//! chrooted in. This module is the router and what every route shares (the
//! token check, the [`Guest`] handle, error mapping); each route group has
//! its own file.

mod commands;
mod events;
mod files;
mod metrics;
mod replace;
mod search;
mod sessions;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use hyper::{HeaderMap, Method, StatusCode};
use serde::Deserialize;
use serde_json::Value;

use crate::guest_link::{self, EntryKind, FileOp, FileStat, GuestError, Reply};
use crate::http::{self, json, ApiError, ApiResult};
use crate::sandbox::{Daemon, SandboxRecord, SandboxState};

pub(crate) use events::{complete_event, error_event, event, output_events, sse};

use commands::{command_logs, command_status, interrupt, run_command, RunCommand};
use files::{download, file_info, read_lines, upload, LineWindow, Names};
use metrics::metrics;
use replace::{replace, ReplaceItem};
use search::{join_display, list, search};
use sessions::{create_session, run_in_session, CreateSession, RunInSession};

/// Page size of file transfers through the agent (below its frame limit).
const CHUNK: u64 = 8 << 20;

#[derive(Debug, Deserialize)]
struct Permission {
    owner: Option<String>,
    group: Option<String>,
    #[serde(default = "default_mode")]
    mode: u32,
}

fn default_mode() -> u32 {
    755
}

#[derive(Debug, Deserialize)]
struct RenameItem {
    src: String,
    dest: String,
}

/// Runs a blocking guest operation off the async runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::internal(format!("worker failed: {e}")))?
}

/// The guest's error text as an HTTP error: missing files are 404.
fn guest_error(GuestError(message): GuestError) -> ApiError {
    if message.contains("No such file") || message.contains("os error 2") {
        // The reference's code and wording (execd `handleFileError`).
        ApiError::new(StatusCode::NOT_FOUND, "FILE_NOT_FOUND", format!("file not found. {message}"))
    } else if ["Is a directory", "Not a directory", "not empty", "not a regular file"]
        .iter()
        .any(|m| message.contains(m))
    {
        ApiError::bad_request(message)
    } else {
        ApiError::internal(message)
    }
}

struct Guest {
    record: SandboxRecord,
    link: crate::guest_link::Link,
    /// The image's user and group names, read only by the routes that show
    /// or set owners (not on every command).
    names: std::sync::OnceLock<Names>,
}

impl Guest {
    fn names(&self) -> &Names {
        self.names.get_or_init(|| Names::load(&self.record.rootfs))
    }

    fn op(&self, op: FileOp) -> Result<Reply, ApiError> {
        guest_link::file_op(&self.link, &self.record.rootfs, op).map_err(guest_error)
    }

    fn resolved(&self, op: FileOp) -> Result<PathBuf, ApiError> {
        match self.op(op)? {
            Reply::Resolved { path } => Ok(path),
            other => Err(ApiError::internal(format!("unexpected agent answer {other:?}"))),
        }
    }

    fn stat(&self, path: &str) -> Result<FileStat, ApiError> {
        match self.op(FileOp::Stat { path: path.into() })? {
            Reply::Stat { stat } => Ok(stat),
            other => Err(ApiError::internal(format!("unexpected agent answer {other:?}"))),
        }
    }

    fn read(&self, guest_path: &Path, offset: u64, len: u64) -> Result<Vec<u8>, ApiError> {
        guest_link::read(&self.link, guest_path, offset, len).map_err(guest_error)
    }

    /// Writes `data` to `path` (creating parents), in pages; then its mode and owner.
    fn write(
        &self,
        path: &str,
        data: &[u8],
        mode: u32,
        owner: Option<u32>,
        group: Option<u32>,
    ) -> Result<(), ApiError> {
        let mut file = self.create(path, mode)?;
        for chunk in data.chunks(CHUNK as usize) {
            file = self.write_page(file, chunk)?;
        }
        self.finish(file, owner, group)
    }

    /// Starts writing `path` (its parents created): nothing is written yet.
    fn create(&self, path: &str, mode: u32) -> Result<FileWrite, ApiError> {
        let target = self.resolved(FileOp::MkParents { path: path.into() })?;
        Ok(FileWrite { path: path.to_owned(), target, mode, started: false })
    }

    /// Writes the next page (at most [`CHUNK`] bytes): the first truncates.
    fn write_page(&self, mut file: FileWrite, page: &[u8]) -> Result<FileWrite, ApiError> {
        guest_link::write_chunk(&self.link, &file.target, file.mode, file.started, page)
            .map_err(guest_error)?;
        file.started = true;
        Ok(file)
    }

    /// Ends the file (empty if no page was written), then sets its mode and owner.
    fn finish(&self, file: FileWrite, owner: Option<u32>, group: Option<u32>) -> Result<(), ApiError> {
        if !file.started {
            guest_link::write_chunk(&self.link, &file.target, file.mode, false, &[]).map_err(guest_error)?;
        }
        self.op(FileOp::Chmod { path: file.path.into(), mode: Some(file.mode), uid: owner, gid: group })?;
        Ok(())
    }
}

/// A guest file being written page by page (see [`Guest::create`]).
struct FileWrite {
    /// As the client named it (for the mode and owner).
    path: String,
    /// Resolved beneath the rootfs (for the pages).
    target: PathBuf,
    mode: u32,
    /// A first page truncated it; the next ones append.
    started: bool,
}

/// The sandbox's execd access token, compared in constant time.
pub(crate) fn check_token(record: &SandboxRecord, headers: &HeaderMap) -> Result<(), ApiError> {
    let token = headers.get("x-execd-access-token").map(|v| v.as_bytes()).unwrap_or(b"");
    if http::constant_time_eq(token, record.token.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            "missing or wrong X-EXECD-ACCESS-TOKEN; use the headers that GET /sandboxes/{id}/endpoints/44772 returns",
        ))
    }
}

fn connect(daemon: &Arc<Daemon>, id: &str, headers: &HeaderMap) -> Result<Guest, ApiError> {
    check_token(&daemon.visible(id)?, headers)?;
    let (record, link) = daemon.live_link(id)?;
    Ok(Guest { record, link, names: std::sync::OnceLock::new() })
}

/// `755` (octal digits written in decimal, as the spec does) → 0o755.
fn octal_mode(mode: u32) -> Result<u32, ApiError> {
    u32::from_str_radix(&mode.to_string(), 8).ok().filter(|m| *m <= 0o7777).ok_or_else(|| {
        ApiError::bad_request(format!("mode {mode} is not an octal permission like 644 or 755"))
    })
}

/// A required query parameter is missing, in the reference execd's words
/// (`components/execd/pkg/web/controller`, e.g. `DownloadFile`:
/// `MISSING_QUERY`, "missing query parameter 'path'").
fn missing_query(name: &str) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "MISSING_QUERY", format!("missing query parameter '{name}'"))
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
        let small = |body: B| http::read_body(body, 16 << 20);
        match (method, rest) {
            (&Method::POST, ["command"]) => {
                let request: RunCommand = http::parse_json(&small(body).await?, "RunCommandRequest")?;
                run_command(daemon.clone(), guest, request).await
            }
            (&Method::DELETE, ["command"]) => {
                let cmd = http::query_one(&q, "id").ok_or_else(|| missing_query("id"))?.to_owned();
                interrupt(daemon, guest, &cmd).await
            }
            (&Method::GET, ["command", "status", cmd]) => command_status(guest, cmd).await,
            (&Method::GET, ["command", cmd, "logs"]) => command_logs(daemon, guest, cmd, http::query_one(&q, "cursor")).await,
            (&Method::GET, ["files", "info"]) => {
                let paths: Vec<String> = http::query_all(&q, "path").into_iter().map(str::to_owned).collect();
                if paths.is_empty() {
                    return Err(missing_query("path"));
                }
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
                let paths: Vec<String> = http::query_all(&q, "path").into_iter().map(str::to_owned).collect();
                blocking(move || {
                    for p in paths {
                        if guest.stat(&p).is_ok_and(|s| s.kind == EntryKind::Dir) {
                            return Err(ApiError::bad_request(format!("{p} is a directory; use DELETE /directories")));
                        }
                        guest.op(FileOp::Remove { path: p.into(), recursive: false })?;
                    }
                    Ok(http::empty(StatusCode::OK))
                })
                .await
            }
            (&Method::POST, ["files", "permissions"]) => {
                let map: BTreeMap<String, Permission> = http::parse_json(&small(body).await?, "permissions map")?;
                blocking(move || {
                    for (p, perm) in map {
                        let uid = perm.owner.as_deref().map(|o| guest.names().uid(o)).transpose()?;
                        let gid = perm.group.as_deref().map(|g| guest.names().gid(g)).transpose()?;
                        guest.op(FileOp::Chmod { path: p.into(), mode: Some(octal_mode(perm.mode)?), uid, gid })?;
                    }
                    Ok(http::empty(StatusCode::OK))
                })
                .await
            }
            (&Method::POST, ["files", "mv"]) => {
                let items: Vec<RenameItem> = http::parse_json(&small(body).await?, "rename list")?;
                blocking(move || {
                    for item in items {
                        guest.op(FileOp::Rename { from: item.src.into(), to: item.dest.into() })?;
                    }
                    Ok(http::empty(StatusCode::OK))
                })
                .await
            }
            (&Method::GET, ["files", "search"]) => {
                let root = http::query_one(&q, "path").ok_or_else(|| missing_query("path"))?.to_owned();
                let pattern = http::query_one(&q, "pattern").unwrap_or("**").to_owned();
                blocking(move || search(&guest, &root, &pattern)).await
            }
            (&Method::GET, ["directories", "list"]) => {
                let root = http::query_one(&q, "path").ok_or_else(|| missing_query("path"))?.to_owned();
                let depth: u32 = match http::query_one(&q, "depth") {
                    Some(d) => d.parse().map_err(|_| ApiError::bad_request("depth must be an integer"))?,
                    None => 1,
                };
                blocking(move || {
                    let entries = list(&guest, &root, depth.max(1))?;
                    let out: Vec<Value> = entries.iter().map(|e| file_info(&join_display(&root, &e.path), e, guest.names())).collect();
                    Ok(json(StatusCode::OK, &out))
                })
                .await
            }
            (&Method::POST, ["directories"]) => {
                let map: BTreeMap<String, Permission> = http::parse_json(&small(body).await?, "directories map")?;
                blocking(move || {
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
                .await
            }
            (&Method::DELETE, ["directories"]) => {
                let paths: Vec<String> = http::query_all(&q, "path").into_iter().map(str::to_owned).collect();
                blocking(move || {
                    for p in paths {
                        guest.op(FileOp::Remove { path: p.into(), recursive: true })?;
                    }
                    Ok(http::empty(StatusCode::OK))
                })
                .await
            }
            (&Method::POST, ["files", "upload"]) => {
                let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
                upload(guest, &content_type, body).await
            }
            (&Method::GET, ["files", "download"]) => {
                let path = http::query_one(&q, "path").ok_or_else(|| missing_query("path"))?.to_owned();
                let range = headers.get("range").and_then(|v| v.to_str().ok()).map(str::to_owned);
                let lines = LineWindow::from_query(&q)?;
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
            (&Method::GET, ["metrics"]) => blocking(move || metrics(&guest)).await,
            (&Method::POST, ["session"]) => {
                let bytes = small(body).await?;
                let request: CreateSession =
                    if bytes.iter().all(u8::is_ascii_whitespace) { CreateSession::default() } else { http::parse_json(&bytes, "CreateSessionRequest")? };
                create_session(daemon, guest, request).await
            }
            (&Method::POST, ["session", session, "run"]) => {
                let request: RunInSession = http::parse_json(&small(body).await?, "RunInSessionRequest")?;
                run_in_session(daemon, &guest.record.id, session, request)
            }
            (&Method::DELETE, ["session", session]) => {
                let removed = daemon.sessions.lock().unwrap_or_else(|p| p.into_inner()).remove(&(guest.record.id.clone(), (*session).to_owned()));
                match removed {
                    Some(s) => {
                        s.kill();
                        Ok(http::empty(StatusCode::OK))
                    }
                    None => Err(ApiError::not_found(format!("no session {session} in sandbox {}", guest.record.id))),
                }
            }
            (&Method::POST, ["code", "context"]) => {
                let bytes = small(body).await?;
                let request: crate::code_contexts::CreateContext =
                    if bytes.iter().all(u8::is_ascii_whitespace) { Default::default() } else { http::parse_json(&bytes, "CodeContextRequest")? };
                crate::code_contexts::create(daemon, guest.link, guest.record, request).await
            }
            (&Method::GET, ["code", "contexts"]) => {
                crate::code_contexts::list(daemon, &guest.record.id, http::query_one(&q, "language"))
            }
            (&Method::DELETE, ["code", "contexts"]) => {
                let language = http::query_one(&q, "language").filter(|l| !l.is_empty()).ok_or_else(|| missing_query("language"))?;
                crate::code_contexts::delete_language(daemon, &guest.record.id, language)
            }
            (&Method::GET, ["code", "contexts", context]) => crate::code_contexts::get(daemon, &guest.record.id, context),
            (&Method::DELETE, ["code", "contexts", context]) => {
                crate::code_contexts::delete(daemon, &guest.record.id, context)
            }
            (&Method::POST, ["code"]) => {
                let request: crate::code_contexts::RunCode = http::parse_json(&small(body).await?, "RunCodeRequest")?;
                crate::code_contexts::run(daemon, guest.link, guest.record, request).await
            }
            (&Method::DELETE, ["code"]) => {
                let id = http::query_one(&q, "id").filter(|i| !i.is_empty()).ok_or_else(|| missing_query("id"))?;
                crate::code_contexts::interrupt(daemon, &guest.record.id, id)
            }
            (&Method::POST, ["files", "replace"]) => {
                let verbose = http::query_one(&q, "verbose").is_some_and(|v| v == "true" || v == "1");
                let request: BTreeMap<String, ReplaceItem> =
                    http::parse_json(&small(body).await?, "ReplaceFileContentRequest")?;
                blocking(move || replace(&guest, request, verbose)).await
            }
            (_, ["metrics", "watch"]) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "NOT_SUPPORTED",
                "this execd route is not implemented by pvisor serve (docs/serve.md, \"Where the API stops\")",
            )),
            _ => Err(ApiError::not_found(format!("no execd route for {method} /{}", rest.join("/")))),
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

/// Whether the image has `path` (resolved beneath its rootfs, on the host).
pub fn in_image(rootfs: &Path, path: &str) -> bool {
    guest_link::resolve_in_root(rootfs, Path::new(path), true).is_ok_and(|p| p.exists())
}

/// How long `/ping` waits for a starting sandbox before answering 409.
const PING_WAIT: Duration = Duration::from_secs(10);

/// `GET /ping`: 200 once the sandbox is Running. While it is Pending or
/// Resuming the answer waits (up to [`PING_WAIT`]), so a client's readiness
/// loop sees the sandbox ready when it is, not at its next poll.
async fn ping(daemon: &Arc<Daemon>, id: &str, headers: &HeaderMap) -> ApiResult {
    let started = Instant::now();
    loop {
        let record = daemon.visible(id)?;
        check_token(&record, headers)?;
        match record.state {
            SandboxState::Running => return Ok(http::empty(StatusCode::OK)),
            SandboxState::Pending | SandboxState::Resuming if started.elapsed() < PING_WAIT => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            other => {
                return Err(ApiError::conflict(format!(
                    "sandbox {id} is {}; the execd API needs it Running",
                    other.as_str()
                )))
            }
        }
    }
}
