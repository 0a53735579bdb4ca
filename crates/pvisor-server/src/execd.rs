//! The execd API (`execd-api.yaml`) of one sandbox, served by the daemon
//! under `/sandboxes/{id}/port/44772/` and carried into the guest over the
//! VM's control socket ([`pvisor_sandbox::vm::guest`]): commands stream as
//! SSE, files go through the agent's file operations, beneath the image
//! rootfs the commands are chrooted in.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use hyper::{HeaderMap, Method, Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use pvisor_agent_proto::{EntryKind, FileOp, FileStat, Reply, Request};
use pvisor_core::time::Timestamp;

use crate::lines::Lines;
use pvisor_sandbox::vm::guest;

use crate::http::{self, json, ApiError, ApiResult, Body};
use crate::sandbox::{
    command_env, CommandRecord, Daemon, SandboxRecord, SandboxState, SharedSignaller, GUEST_LOG_DIR,
};

const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest command plus environment (an AgentCtl header is at most 1 MiB).
const MAX_COMMAND_BYTES: usize = 256 << 10;
/// Largest background log `GET /command/{id}/logs` reads.
const MAX_LOG_BYTES: u64 = 256 << 20;
/// Page size of file transfers through the agent (below its frame limit).
const CHUNK: u64 = 8 << 20;
/// The most a line-based download (`offset`/`limit`) holds in memory.
const MAX_LINE_READ: u64 = 16 << 20;

/// The execd request schemas allow unknown fields (no `additionalProperties:
/// false`), so these structs accept them; SDKs send newer ones (`argv`).
#[derive(Debug, Deserialize)]
struct RunCommand {
    command: Option<String>,
    argv: Option<Vec<String>>,
    cwd: Option<String>,
    #[serde(default)]
    background: bool,
    /// Milliseconds.
    timeout: Option<u64>,
    uid: Option<u32>,
    gid: Option<u32>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
}

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
fn guest_error(message: String) -> ApiError {
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
    vm_dir: PathBuf,
    /// The image's user and group names, read only by the routes that show
    /// or set owners (not on every command).
    names: std::sync::OnceLock<Names>,
}

impl Guest {
    fn names(&self) -> &Names {
        self.names.get_or_init(|| Names::load(&self.record.rootfs))
    }

    fn op(&self, op: FileOp) -> Result<Reply, ApiError> {
        let request = Request::FileOp { root: self.record.rootfs.clone(), op };
        guest::call(&self.vm_dir, &request, &[], CALL_TIMEOUT).map(|(r, _)| r).map_err(guest_error)
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
        let request = Request::ReadFile { path: guest_path.to_owned(), offset, len: Some(len) };
        guest::call(&self.vm_dir, &request, &[], CALL_TIMEOUT).map(|(_, b)| b).map_err(guest_error)
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
        let target = self.resolved(FileOp::MkParents { path: path.into() })?;
        let mut first = true;
        let mut chunks = data.chunks(CHUNK as usize).peekable();
        if chunks.peek().is_none() {
            let request = Request::WriteFile { path: target.clone(), mode, append: false };
            guest::call(&self.vm_dir, &request, &[], CALL_TIMEOUT).map_err(guest_error)?;
        }
        for chunk in chunks {
            let request = Request::WriteFile { path: target.clone(), mode, append: !first };
            guest::call(&self.vm_dir, &request, chunk, CALL_TIMEOUT).map_err(guest_error)?;
            first = false;
        }
        self.op(FileOp::Chmod { path: path.into(), mode: Some(mode), uid: owner, gid: group })?;
        Ok(())
    }
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
    let (record, vm_dir) = daemon.live_vm_dir(id)?;
    Ok(Guest { record, vm_dir, names: std::sync::OnceLock::new() })
}

/// The FileInfo schema; owner and group by name from the image's files.
fn file_info(display: &str, stat: &FileStat, names: &Names) -> Value {
    let kind = match stat.kind {
        EntryKind::Dir => "directory",
        EntryKind::File => "file",
        EntryKind::Symlink => "symlink",
        _ => "other",
    };
    let time =
        |ns: i64| Timestamp::from(std::time::UNIX_EPOCH + Duration::from_nanos(ns.max(0) as u64)).to_string();
    json!({
        "path": display,
        "type": kind,
        "size": stat.size,
        "modified_at": time(stat.mtime_ns),
        "created_at": time(stat.ctime_ns),
        "owner": names.user(stat.uid),
        "group": names.group(stat.gid),
        // The spec writes modes as octal digits in decimal (755).
        "mode": format!("{:o}", stat.mode).parse::<u32>().unwrap_or(0),
    })
}

/// User and group names of the image (its /etc/passwd and /etc/group).
struct Names {
    users: BTreeMap<u32, String>,
    groups: BTreeMap<u32, String>,
}

impl Names {
    fn load(rootfs: &Path) -> Self {
        let table = |file: &str| -> BTreeMap<u32, String> {
            // Beneath the rootfs: an image's absolute symlink must not make
            // the daemon read the host's own files.
            pvisor_agent_proto::resolve_in_root(rootfs, Path::new(file), true)
                .and_then(std::fs::read_to_string)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split(':').collect();
                    Some((f.get(2)?.parse().ok()?, (*f.first()?).to_owned()))
                })
                .collect()
        };
        Self { users: table("etc/passwd"), groups: table("etc/group") }
    }
    fn user(&self, uid: u32) -> String {
        self.users.get(&uid).cloned().unwrap_or_else(|| uid.to_string())
    }
    fn group(&self, gid: u32) -> String {
        self.groups.get(&gid).cloned().unwrap_or_else(|| gid.to_string())
    }
    fn uid(&self, name: &str) -> Result<u32, ApiError> {
        name.parse()
            .ok()
            .or_else(|| self.users.iter().find(|(_, n)| *n == name).map(|(id, _)| *id))
            .ok_or_else(|| ApiError::bad_request(format!("no user {name:?} in the image")))
    }
    fn gid(&self, name: &str) -> Result<u32, ApiError> {
        name.parse()
            .ok()
            .or_else(|| self.groups.iter().find(|(_, n)| *n == name).map(|(id, _)| *id))
            .ok_or_else(|| ApiError::bad_request(format!("no group {name:?} in the image")))
    }
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
            (&Method::GET, ["command", cmd, "logs"]) => command_logs(guest, cmd, http::query_one(&q, "cursor")).await,
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
                let bytes = http::read_body(body, 1 << 30).await?;
                blocking(move || upload(&guest, &content_type, &bytes)).await
            }
            (&Method::GET, ["files", "download"]) => {
                let path = http::query_one(&q, "path").ok_or_else(|| missing_query("path"))?.to_owned();
                let range = headers.get("range").and_then(|v| v.to_str().ok()).map(str::to_owned);
                let lines = LineWindow::from_query(&q)?;
                match (lines, range) {
                    (Some(_), Some(_)) => Err(ApiError::bad_request(
                        "offset/limit (lines) and a Range header (bytes) are mutually exclusive; send one",
                    )),
                    (Some(window), None) => blocking(move || read_lines(&guest, &path, window)).await,
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
                crate::code_contexts::create(daemon, guest.vm_dir, guest.record, request).await
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
                crate::code_contexts::run(daemon, guest.vm_dir, guest.record, request).await
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

#[derive(Debug, Default, Deserialize)]
struct CreateSession {
    cwd: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RunInSession {
    command: String,
    cwd: Option<String>,
    /// Milliseconds.
    timeout: Option<u64>,
}

async fn create_session(daemon: &Arc<Daemon>, guest: Guest, request: CreateSession) -> ApiResult {
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
            &guest.vm_dir,
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

fn run_in_session(daemon: &Arc<Daemon>, sandbox: &str, session: &str, request: RunInSession) -> ApiResult {
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
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let started = Instant::now();
        let _ = tx.blocking_send(event(json!({ "type": "init", "text": id })));
        let (mut out, mut err) = (Lines::default(), Lines::default());
        let mut tx = Some(tx);
        session.run(&request.command, request.cwd.as_deref(), request.timeout.map(Duration::from_millis), |piece| {
            let last = matches!(piece, Piece::Failed(_));
            let events = match piece {
                Piece::Stdout(b) => output_events("stdout", out.push(&b)),
                Piece::Stderr(b) => output_events("stderr", err.push(&b)),
                Piece::Done(status) => match status.parse().unwrap_or(-1) {
                    0 => ending(&mut out, &mut err, complete_event(started)),
                    code => ending(&mut out, &mut err, error_event(code, &format!("exit status {code}"))),
                },
                Piece::Failed(why) => ending(&mut out, &mut err, event(json!({ "type": "error", "error": { "ename": "SessionError", "evalue": "-1", "traceback": [why] } }))),
            };
            let sent = tx.as_ref().is_some_and(|tx| events.into_iter().all(|e| tx.blocking_send(e).is_ok()));
            if last {
                // The answer is complete: end the stream now, even while an
                // interrupted run is still being drained.
                tx = None;
            }
            sent
        });
    });
    Ok(sse(body))
}

/// Whether the image has `path` (resolved beneath its rootfs, on the host).
pub fn in_image(rootfs: &Path, path: &str) -> bool {
    pvisor_agent_proto::resolve_in_root(rootfs, Path::new(path), true).is_ok_and(|p| p.exists())
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

fn join_display(root: &str, relative: &Path) -> String {
    let root = root.trim_end_matches('/');
    format!("{root}/{}", relative.display())
}

fn list(guest: &Guest, root: &str, depth: u32) -> Result<Vec<FileStat>, ApiError> {
    match guest.op(FileOp::List { path: root.into(), depth })? {
        Reply::Listing { entries, .. } => Ok(entries),
        other => Err(ApiError::internal(format!("unexpected agent answer {other:?}"))),
    }
}

fn search(guest: &Guest, root: &str, pattern: &str) -> ApiResult {
    let glob = pvisor_stage::glob::Pattern::new(pattern).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let entries = list(guest, root, 64)?;
    let out: Vec<Value> = entries
        .iter()
        .filter(|e| e.kind != EntryKind::Dir)
        .filter(|e| {
            use std::os::unix::ffi::OsStrExt;
            // A pattern without a slash matches the file name at any depth, like `find -name`.
            let target = match e.path.file_name() {
                Some(name) if !pattern.contains('/') => name.as_bytes(),
                _ => e.path.as_os_str().as_bytes(),
            };
            glob.matches(target)
        })
        .map(|e| file_info(&join_display(root, &e.path), e, guest.names()))
        .collect();
    Ok(json(StatusCode::OK, &out))
}

fn upload(guest: &Guest, content_type: &str, body: &[u8]) -> ApiResult {
    let boundary = content_type
        .split(';')
        .filter_map(|p| p.trim().strip_prefix("boundary="))
        .next()
        .map(|b| b.trim_matches('"').to_owned())
        .ok_or_else(|| {
            ApiError::bad_request("files/upload needs a multipart/form-data body with a boundary")
        })?;
    let parts = crate::multipart::parse(body, &boundary).map_err(ApiError::bad_request)?;
    let mut pending: Option<Value> = None;
    let mut written = 0;
    for part in parts {
        match part.name.as_str() {
            "metadata" => {
                pending = Some(
                    serde_json::from_slice(&body[part.data.clone()])
                        .map_err(|e| ApiError::bad_request(format!("invalid metadata part: {e}")))?,
                )
            }
            "file" => {
                let meta = pending
                    .take()
                    .ok_or_else(|| ApiError::bad_request("a file part must follow its metadata part"))?;
                let path = meta["path"]
                    .as_str()
                    .ok_or_else(|| ApiError::bad_request("metadata.path is required"))?;
                let mode = octal_mode(meta["mode"].as_u64().unwrap_or(644) as u32)?;
                let owner = meta["owner"].as_str().map(|o| guest.names().uid(o)).transpose()?;
                let group = meta["group"].as_str().map(|g| guest.names().gid(g)).transpose()?;
                guest.write(path, &body[part.data.clone()], mode, owner, group)?;
                written += 1;
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "unexpected multipart field {other:?} (want metadata, file)"
                )))
            }
        }
    }
    if written == 0 {
        return Err(ApiError::bad_request("the upload contained no file part"));
    }
    Ok(http::empty(StatusCode::OK))
}

/// `bytes=a-b`, `bytes=a-`, `bytes=-n` → (start, end inclusive).
fn parse_range(header: &str, size: u64) -> Option<(u64, u64)> {
    let spec = header.strip_prefix("bytes=")?.split(',').next()?.trim();
    let (a, b) = spec.split_once('-')?;
    let (start, end) = match (a.trim(), b.trim()) {
        ("", n) => {
            let n: u64 = n.parse().ok()?;
            (size.saturating_sub(n), size.checked_sub(1)?)
        }
        (a, "") => (a.parse().ok()?, size.checked_sub(1)?),
        (a, b) => (a.parse().ok()?, b.parse::<u64>().ok()?.min(size.checked_sub(1)?)),
    };
    (start <= end && start < size).then_some((start, end))
}

/// One file's replacement in `POST /files/replace`.
#[derive(Debug, Deserialize)]
struct ReplaceItem {
    #[serde(default)]
    old: String,
    #[serde(default)]
    new: String,
}

/// The most of one file `POST /files/replace` holds in memory.
const MAX_REPLACE: u64 = 64 << 20;

/// `POST /files/replace`: every literal occurrence of `old` becomes `new`,
/// the file keeping its mode and owner; `?verbose=true` answers each path's
/// `replacedCount` (0 when `old` was not found, which is not an error).
/// Reference: `FilesystemController.ReplaceContent`, OpenSandbox
/// `components/execd/pkg/web/controller/filesystem.go` at 4db3a99 (a byte
/// replacement, as `strings.ReplaceAll`). Unlike the reference, every file is
/// checked and computed before any is written, so a bad path among several
/// changes none of them.
fn replace(guest: &Guest, request: BTreeMap<String, ReplaceItem>, verbose: bool) -> ApiResult {
    let mut planned = Vec::with_capacity(request.len());
    for (path, item) in &request {
        if item.old.is_empty() {
            return Err(ApiError::bad_request(format!("{path}: old content must not be empty")));
        }
        let stat = guest.stat(path)?;
        if stat.kind != EntryKind::File {
            return Err(ApiError::bad_request(format!("{path} is not a regular file")));
        }
        if stat.size > MAX_REPLACE {
            return Err(ApiError::bad_request(format!(
                "{path} is {} bytes; replace works on files up to {} MiB (download, edit and upload a larger one)",
                stat.size,
                MAX_REPLACE >> 20
            )));
        }
        let target = guest.resolved(FileOp::Resolve { path: path.into() })?;
        let mut content = Vec::with_capacity(stat.size as usize);
        while (content.len() as u64) < stat.size {
            let page = guest.read(&target, content.len() as u64, CHUNK)?;
            if page.is_empty() {
                break;
            }
            content.extend_from_slice(&page);
        }
        let (replaced, count) = replace_all(&content, item.old.as_bytes(), item.new.as_bytes());
        planned.push((path, stat, replaced, count));
    }
    let mut counts = serde_json::Map::new();
    for (path, stat, replaced, count) in planned {
        if count > 0 {
            guest.write(path, &replaced, stat.mode, Some(stat.uid), Some(stat.gid))?;
        }
        counts.insert(path.clone(), json!({ "replacedCount": count }));
    }
    Ok(if verbose { json(StatusCode::OK, &Value::Object(counts)) } else { http::empty(StatusCode::OK) })
}

/// `haystack` with every non-overlapping `old` (from the left) replaced by
/// `new`, and how many there were. Linear time whatever `old` is (a client
/// chooses it): memchr's two-way substring search.
fn replace_all(haystack: &[u8], old: &[u8], new: &[u8]) -> (Vec<u8>, usize) {
    let (mut out, mut count, mut at) = (Vec::with_capacity(haystack.len()), 0, 0);
    for found in memchr::memmem::find_iter(haystack, old) {
        if found < at {
            continue; // overlaps the previous match
        }
        out.extend_from_slice(&haystack[at..found]);
        out.extend_from_slice(new);
        at = found + old.len();
        count += 1;
    }
    out.extend_from_slice(&haystack[at..]);
    (out, count)
}

/// `offset`/`limit` of `GET /files/download`: lines, 1-based (execd-api.yaml,
/// `downloadFile`: "line-based reading … returns text/plain").
#[derive(Clone, Copy, Debug)]
struct LineWindow {
    /// The first line to return, from 1.
    offset: u64,
    /// How many lines at most; all the rest when absent.
    limit: Option<u64>,
}

impl LineWindow {
    fn from_query(q: &[(String, String)]) -> Result<Option<Self>, ApiError> {
        let number = |key: &str| -> Result<Option<u64>, ApiError> {
            http::query_one(q, key)
                .map(|v| {
                    v.parse::<u64>().ok().filter(|n| *n >= 1).ok_or_else(|| {
                        ApiError::bad_request(format!("{key} must be an integer >= 1, not {v:?}"))
                    })
                })
                .transpose()
        };
        let (offset, limit) = (number("offset")?, number("limit")?);
        Ok((offset.is_some() || limit.is_some()).then(|| Self { offset: offset.unwrap_or(1), limit }))
    }
}

/// The lines `window` selects of the file at `path`, as text/plain, each
/// with its own terminator. An offset past the last line is a 400 that says
/// how many lines there are (not an empty 200 an agent takes for an empty file).
fn read_lines(guest: &Guest, path: &str, window: LineWindow) -> ApiResult {
    let stat = guest.stat(path)?;
    if stat.kind != EntryKind::File {
        return Err(ApiError::bad_request(format!("{path} is not a regular file")));
    }
    let target = guest.resolved(FileOp::Resolve { path: path.into() })?;
    let (mut out, mut line, mut at, mut seen) = (Vec::new(), 1u64, 0u64, 0u64);
    let wanted = |line: u64| line >= window.offset && window.limit.is_none_or(|l| line < window.offset + l);
    'read: while at < stat.size {
        let bytes = guest.read(&target, at, CHUNK)?;
        if bytes.is_empty() {
            break;
        }
        at += bytes.len() as u64;
        for &b in &bytes {
            if wanted(line) {
                if out.len() as u64 >= MAX_LINE_READ {
                    return Err(ApiError::bad_request(format!(
                        "the selected lines exceed {} MiB; ask for fewer (limit) or use a Range",
                        MAX_LINE_READ >> 20
                    )));
                }
                out.push(b);
            }
            seen = line;
            if b == b'\n' {
                line += 1;
                if window.limit.is_some_and(|l| line >= window.offset + l) {
                    break 'read;
                }
            }
        }
    }
    // `seen` is the last line that had a byte (a final line without a
    // terminator counts; an empty file has none).
    if window.offset > seen {
        return Err(ApiError::bad_request(format!(
            "offset {} is past the end of {path}, which has {seen} line(s)",
            window.offset
        )));
    }
    let mut resp = Response::new(http::full(out));
    resp.headers_mut().insert("content-type", "text/plain; charset=utf-8".parse().expect("static"));
    Ok(resp)
}

async fn download(daemon: &Arc<Daemon>, guest: Guest, path: String, range: Option<String>) -> ApiResult {
    let slot = daemon.stream_slot(&guest.record.id)?;
    let (guest, stat, target) = blocking(move || {
        let stat = guest.stat(&path)?;
        match stat.kind {
            EntryKind::File => {}
            EntryKind::Dir => return Err(ApiError::bad_request(format!("{path} is a directory"))),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "{path} is not a regular file (a FIFO, socket or device)"
                )))
            }
        }
        let target = guest.resolved(FileOp::Resolve { path: path.into() })?;
        Ok((guest, stat, target))
    })
    .await?;
    let size = stat.size;
    let (status, start, end) = match range.as_deref() {
        None => (StatusCode::OK, 0, size),
        Some(r) => match parse_range(r, size) {
            Some((s, e)) => (StatusCode::PARTIAL_CONTENT, s, e + 1),
            None => {
                let mut resp = ApiError::new(
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    "RANGE_NOT_SATISFIABLE",
                    format!("range {r:?} does not fit a {size}-byte file"),
                )
                .into_response();
                resp.headers_mut().insert("content-range", format!("bytes */{size}").parse().expect("ascii"));
                return Ok(resp);
            }
        },
    };
    let (tx, body) = http::channel_body(4);
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let mut offset = start;
        while offset < end {
            let len = (end - offset).min(CHUNK);
            match guest.read(&target, offset, len) {
                Ok(bytes) if !bytes.is_empty() => {
                    offset += bytes.len() as u64;
                    if tx.blocking_send(Bytes::from(bytes)).is_err() {
                        return;
                    }
                }
                // Shrunk or unreadable mid-transfer: end the body short.
                _ => return,
            }
        }
    });
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert("content-type", "application/octet-stream".parse().expect("static"));
    h.insert("content-length", (end - start).to_string().parse().expect("ascii"));
    h.insert("accept-ranges", "bytes".parse().expect("static"));
    if status == StatusCode::PARTIAL_CONTENT {
        h.insert("content-range", format!("bytes {start}-{}/{size}", end - 1).parse().expect("ascii"));
    }
    Ok(resp)
}

fn metrics(guest: &Guest) -> ApiResult {
    let read = |p: &str| -> Result<String, ApiError> {
        Ok(String::from_utf8_lossy(&guest.read(Path::new(p), 0, 1 << 20)?).into_owned())
    };
    let meminfo = read("/proc/meminfo")?;
    let kib = |key: &str| -> f64 {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0.0)
    };
    let (total, available) = (kib("MemTotal:"), kib("MemAvailable:"));
    let cpu = || -> Result<(f64, f64), ApiError> {
        let stat = read("/proc/stat")?;
        let fields: Vec<f64> = stat
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .filter_map(|n| n.parse().ok())
            .collect();
        let idle = fields.get(3).copied().unwrap_or(0.0) + fields.get(4).copied().unwrap_or(0.0);
        Ok((fields.iter().sum(), idle))
    };
    let (t0, i0) = cpu()?;
    std::thread::sleep(Duration::from_millis(100));
    let (t1, i1) = cpu()?;
    let used = if t1 > t0 { 100.0 * (1.0 - (i1 - i0) / (t1 - t0)) } else { 0.0 };
    let cpus = read("/proc/stat")?.lines().filter(|l| l.starts_with("cpu") && !l.starts_with("cpu ")).count();
    Ok(json(
        StatusCode::OK,
        &json!({
            "cpu_count": cpus as f64,
            "cpu_used_pct": (used * 10.0).round() / 10.0,
            "mem_total_mib": total / 1024.0,
            "mem_used_mib": (total - available) / 1024.0,
            "timestamp": http::unix_ms(),
        }),
    ))
}

/// One SSE event: `data: {json}\n\n`, with the integer `timestamp` the SDK requires.
pub(crate) fn event(mut value: Value) -> Bytes {
    value["timestamp"] = json!(http::unix_ms());
    Bytes::from(format!("data: {value}\n\n"))
}

async fn run_command(daemon: Arc<Daemon>, guest: Guest, request: RunCommand) -> ApiResult {
    let id = guest.record.id.clone();
    let argv = match (&request.command, &request.argv) {
        (_, Some(argv)) if !argv.is_empty() => argv.clone(),
        (Some(cmd), _) if !cmd.is_empty() => {
            let shell = if in_image(&guest.record.rootfs, "bin/bash") { "/bin/bash" } else { "/bin/sh" };
            vec![shell.into(), "-c".into(), cmd.clone()]
        }
        _ => return Err(ApiError::bad_request("command (or argv) is required")),
    };
    if request.gid.is_some() && request.uid.is_none() {
        return Err(ApiError::bad_request("gid requires uid"));
    }
    let size: usize = argv.iter().map(String::len).sum::<usize>()
        + request.envs.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    if size > MAX_COMMAND_BYTES {
        return Err(ApiError::bad_request(format!(
            "the command and its environment are {size} bytes; the limit is {MAX_COMMAND_BYTES} (write a script with the file API and run that)"
        )));
    }
    let slot = if request.background { None } else { Some(daemon.stream_slot(&id)?) };
    let argv = match request.uid {
        // setpriv is not in every image; busybox-free: run through the agent's root, then drop.
        Some(uid) => {
            let gid = request.gid.unwrap_or(uid);
            let mut v = vec![
                "/usr/bin/setpriv".into(),
                format!("--reuid={uid}"),
                format!("--regid={gid}"),
                "--clear-groups".into(),
                "--".into(),
            ];
            if !in_image(&guest.record.rootfs, "usr/bin/setpriv") {
                return Err(ApiError::bad_request("uid/gid need setpriv (util-linux) in the image"));
            }
            v.extend(argv);
            v
        }
        None => argv,
    };
    let exec_id = {
        let (daemon, id) = (daemon.clone(), id.clone());
        blocking(move || Ok(daemon.next_exec_id(&id)?)).await?
    };
    let command_id = format!("cmd-{exec_id}");
    let text = request.command.clone().unwrap_or_else(|| argv.join(" "));
    let spec = guest::ExecSpec {
        id: exec_id,
        argv,
        env: command_env(&guest.record, &request.envs),
        cwd: request.cwd.clone().unwrap_or_else(|| "/".into()).into(),
        root: Some(guest.record.rootfs.clone()),
        output: request.background.then(|| PathBuf::from(format!("{GUEST_LOG_DIR}/{exec_id}.log"))),
    };
    let vm_dir = guest.vm_dir.clone();
    let (mut channel, first) = blocking(move || {
        let mut channel = guest::exec(&vm_dir, spec).map_err(ApiError::internal)?;
        let first = channel.next_reply().map_err(|e| ApiError::internal(e.to_string()))?;
        Ok((channel, first))
    })
    .await?;
    let started_at = Timestamp::now();
    let failed = match &first {
        Some((Reply::Started { .. }, _)) => None,
        Some((Reply::ExecFailed { errno, message, .. }, _)) => {
            Some((if *errno == libc::ENOENT { 127 } else { 126 }, message.clone()))
        }
        other => return Err(ApiError::internal(format!("the guest answered {other:?}"))),
    };
    let _ = daemon.update(&id, |r| {
        crate::sandbox::trim_commands(&mut r.commands);
        r.commands.insert(
            command_id.clone(),
            CommandRecord {
                exec_id,
                command: text.clone(),
                background: request.background,
                started_at,
                finished_at: failed.as_ref().map(|_| Timestamp::now()),
                exit_code: failed.as_ref().map(|f| f.0),
                error: failed.as_ref().map(|f| f.1.clone()),
            },
        );
        Ok(())
    });
    let (tx, body) = http::channel_body(64);
    let _ = tx.send(event(json!({ "type": "init", "text": command_id }))).await;
    if let Some((code, message)) = failed {
        let _ = tx.send(error_event(code, &message)).await;
        return Ok(sse(body));
    }
    if request.background {
        if let Some(timeout) = request.timeout.map(Duration::from_millis) {
            // The spec's background timeout: the server ends the process.
            // The VM at fire time: the sandbox may have been paused and
            // resumed (a new generation) meanwhile.
            let (daemon, sandbox) = (daemon.clone(), id.clone());
            std::thread::spawn(move || {
                std::thread::sleep(timeout);
                for signal in [libc::SIGTERM, libc::SIGKILL] {
                    if let Ok((_, vm_dir)) = daemon.live_vm_dir(&sandbox) {
                        let _ =
                            guest::call(&vm_dir, &Request::Signal { id: exec_id, signal }, &[], CALL_TIMEOUT);
                    }
                    std::thread::sleep(Duration::from_secs(2));
                }
            });
        }
        let _ = tx.send(event(json!({ "type": "execution_complete", "execution_time": 0 }))).await;
        return Ok(sse(body));
    }
    let signaller = Arc::new(Mutex::new(channel.signaller().ok()));
    daemon
        .running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert((id.clone(), command_id.clone()), signaller.clone());
    // Cancellation: a client that goes away (or a timeout) kills the command.
    let timed_out = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cancel = {
        let (tx, signaller, flag) = (tx.clone(), signaller.clone(), timed_out.clone());
        let timeout = request.timeout.map(Duration::from_millis);
        tokio::spawn(async move {
            if let Some(t) = timeout {
                if tokio::time::timeout(t, tx.closed()).await.is_err() {
                    flag.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            } else {
                tx.closed().await;
            }
            kill_exec(&signaller);
        })
    };
    let started = Instant::now();
    let daemon2 = daemon.clone();
    let kill_dir = guest.vm_dir.clone();
    tokio::task::spawn_blocking(move || {
        let (mut out_lines, mut err_lines) = (Lines::default(), Lines::default());
        let send = |kind: &str, texts: Vec<Vec<u8>>| {
            for e in output_events(kind, texts) {
                let _ = tx.blocking_send(e);
            }
        };
        let outcome = loop {
            match channel.next_reply() {
                Ok(Some((Reply::Stdout { .. }, bytes))) => send("stdout", out_lines.push(&bytes)),
                Ok(Some((Reply::Stderr { .. }, bytes))) => send("stderr", err_lines.push(&bytes)),
                Ok(Some((Reply::Exited { code, signal, .. }, _))) => {
                    break Ok(code.unwrap_or(128 + signal.unwrap_or(0)))
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    // Its output has no reader any more (the sandbox stopped,
                    // or this stream stalled and was cut off): end it.
                    let _ = guest::call(
                        &kill_dir,
                        &Request::Signal { id: exec_id, signal: libc::SIGKILL },
                        &[],
                        CALL_TIMEOUT,
                    );
                    break Err("the command's stream ended early (the sandbox was paused or stopped, or the client stalled for 30 s)".to_string());
                }
            }
        };
        send("stdout", out_lines.finish().into_iter().collect());
        send("stderr", err_lines.finish().into_iter().collect());
        let elapsed = started.elapsed().as_millis() as u64;
        let (exit_code, error) = match &outcome {
            Ok(code) => (Some(*code), None),
            Err(message) => (None, Some(message.clone())),
        };
        let _slot = slot;
        let final_event = match outcome {
            Ok(0) => event(json!({ "type": "execution_complete", "execution_time": elapsed })),
            Ok(code) if timed_out.load(std::sync::atomic::Ordering::SeqCst) => error_event(
                code,
                &format!(
                    "the command exceeded its timeout of {} ms and was killed (exit status {code})",
                    request.timeout.unwrap_or(0)
                ),
            ),
            Ok(code) => error_event(code, &format!("exit status {code}")),
            Err(message) => event(
                json!({ "type": "error", "error": { "ename": "SandboxError", "evalue": "-1", "traceback": [message] } }),
            ),
        };
        let _ = tx.blocking_send(final_event);
        cancel.abort();
        daemon2.running.lock().unwrap_or_else(|p| p.into_inner()).remove(&(id.clone(), command_id.clone()));
        let _ = daemon2.update(&id, |r| {
            if let Some(c) = r.commands.get_mut(&command_id) {
                c.finished_at = Some(Timestamp::now());
                c.exit_code = exit_code;
                c.error = error;
            }
            Ok(())
        });
    });
    Ok(sse(body))
}

/// SIGTERM, then SIGKILL after two seconds.
fn kill_exec(signaller: &SharedSignaller) {
    if let Some(s) = signaller.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        let _ = s.signal(libc::SIGTERM);
    }
    let signaller = signaller.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        if let Some(s) = signaller.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            let _ = s.signal(libc::SIGKILL);
        }
    });
}

/// stdout or stderr events, one per text (see `lines.rs`).
pub(crate) fn output_events(kind: &str, texts: Vec<Vec<u8>>) -> Vec<Bytes> {
    texts.iter().map(|t| event(json!({ "type": kind, "text": String::from_utf8_lossy(t) }))).collect()
}

/// The events that end a run: the unterminated tails, then `last`.
fn ending(out: &mut Lines, err: &mut Lines, last: Bytes) -> Vec<Bytes> {
    let mut events = output_events("stdout", out.finish().into_iter().collect());
    events.extend(output_events("stderr", err.finish().into_iter().collect()));
    events.push(last);
    events
}

pub(crate) fn complete_event(started: Instant) -> Bytes {
    event(json!({ "type": "execution_complete", "execution_time": started.elapsed().as_millis() as u64 }))
}

pub(crate) fn error_event(code: i32, message: &str) -> Bytes {
    event(json!({
        "type": "error",
        "error": { "ename": "CommandExecError", "evalue": code.to_string(), "traceback": [message] },
    }))
}

pub(crate) fn sse(body: Body) -> Response<Body> {
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert("content-type", "text/event-stream".parse().expect("static"));
    h.insert("cache-control", "no-cache".parse().expect("static"));
    resp
}

fn command_of(guest: &Guest, cmd: &str) -> Result<CommandRecord, ApiError> {
    guest
        .record
        .commands
        .get(cmd)
        .cloned()
        .ok_or_else(|| ApiError::not_found(format!("no command {cmd} in sandbox {}", guest.record.id)))
}

async fn interrupt(daemon: &Arc<Daemon>, guest: Guest, cmd: &str) -> ApiResult {
    let record = command_of(&guest, cmd)?;
    let key = (guest.record.id.clone(), cmd.to_owned());
    if let Some(signaller) = daemon.running.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned() {
        kill_exec(&signaller);
        return Ok(http::empty(StatusCode::OK));
    }
    blocking(move || {
        for signal in [libc::SIGTERM, libc::SIGKILL] {
            let request = Request::Signal { id: record.exec_id, signal };
            guest::call(&guest.vm_dir, &request, &[], CALL_TIMEOUT).map_err(guest_error)?;
            std::thread::sleep(Duration::from_millis(if signal == libc::SIGTERM { 500 } else { 0 }));
        }
        Ok(http::empty(StatusCode::OK))
    })
    .await
}

async fn command_status(guest: Guest, cmd: &str) -> ApiResult {
    let record = command_of(&guest, cmd)?;
    let cmd = cmd.to_owned();
    blocking(move || {
        let (running, exit_code) = if record.finished_at.is_some() {
            (false, record.exit_code)
        } else {
            match guest::call(&guest.vm_dir, &Request::Status { id: record.exec_id }, &[], CALL_TIMEOUT) {
                Ok((Reply::Status { running, code, signal, .. }, _)) => {
                    (running, code.or(signal.map(|s| 128 + s)))
                }
                Ok(other) => return Err(ApiError::internal(format!("unexpected agent answer {other:?}"))),
                Err(e) => return Err(guest_error(e)),
            }
        };
        let mut body = json!({
            "id": cmd,
            "content": record.command,
            "running": running,
            "exit_code": exit_code,
            "started_at": record.started_at.to_string(),
            "finished_at": record.finished_at.map(|t| t.to_string()),
        });
        if let Some(error) = record.error {
            body["error"] = json!(error);
        }
        Ok(json(StatusCode::OK, &body))
    })
    .await
}

async fn command_logs(guest: Guest, cmd: &str, cursor: Option<&str>) -> ApiResult {
    let record = command_of(&guest, cmd)?;
    if !record.background {
        return Err(ApiError::bad_request(format!(
            "{cmd} ran in the foreground; its output was streamed, not logged"
        )));
    }
    // A byte offset into the log, as the reference execd's is
    // (`GetBackgroundCommandOutput` → `SeekBackgroundCommandOutput`, which
    // seeks the log to `cursor`; the spec's "line cursor" is not what it
    // does): missing or not a number is 0, negative is refused.
    let cursor: i64 = cursor.and_then(|c| c.parse().ok()).unwrap_or(0);
    if cursor < 0 {
        return Err(ApiError::bad_request(format!("error seek file: cursor {cursor} is negative")));
    }
    let cursor = cursor as u64;
    blocking(move || {
        let path = PathBuf::from(format!("{GUEST_LOG_DIR}/{}.log", record.exec_id));
        let mut bytes = Vec::new();
        while (bytes.len() as u64) < MAX_LOG_BYTES {
            match guest.read(&path, cursor + bytes.len() as u64, CHUNK) {
                Ok(page) if page.is_empty() => break,
                Ok(page) => bytes.extend_from_slice(&page),
                Err(e) if e.status == StatusCode::NOT_FOUND => break,
                Err(e) => return Err(e),
            }
        }
        // The next cursor: where this read stopped (the end of the log, or
        // the cursor itself when it is past the end).
        let next = cursor + bytes.len() as u64;
        let mut resp = Response::new(http::full(bytes));
        resp.headers_mut().insert("content-type", "text/plain; charset=utf-8".parse().expect("static"));
        resp.headers_mut().insert("EXECD-COMMANDS-TAIL-CURSOR", next.to_string().parse().expect("ascii"));
        Ok(resp)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_all_is_literal_and_left_to_right() {
        assert_eq!(replace_all(b"a.b.a.b", b"a.b", b"X"), (b"X.X".to_vec(), 2));
        assert_eq!(replace_all(b"aaa", b"aa", b"b"), (b"ba".to_vec(), 1));
        assert_eq!(replace_all(b"none", b"zz", b"y"), (b"none".to_vec(), 0));
        assert_eq!(replace_all(b"x*y", b"*", b""), (b"xy".to_vec(), 1));
    }

    #[test]
    fn ranges_and_modes() {
        assert_eq!(parse_range("bytes=0-3", 10), Some((0, 3)));
        assert_eq!(parse_range("bytes=5-", 10), Some((5, 9)));
        assert_eq!(parse_range("bytes=-4", 10), Some((6, 9)));
        assert_eq!(parse_range("bytes=20-30", 10), None);
        assert_eq!(octal_mode(755).unwrap(), 0o755);
        assert!(octal_mode(789).is_err());
    }
}
