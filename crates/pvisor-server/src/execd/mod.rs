//! The execd API (`execd-api.yaml`) of one sandbox, served by the daemon
//! under `/sandboxes/{id}/port/44772/` and carried into the guest through
//! [`crate::guest_link`]: commands stream as SSE, files go through the
//! agent's file operations, beneath the image rootfs the commands are
//! chrooted in. This module is the router and what every route shares (the
//! token check, the [`Guest`] handle, error mapping); each route group has
//! its own file.

pub(crate) mod commands;
mod events;
mod files;
mod metrics;
mod replace;
mod routes;
mod search;
mod sessions;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::{HeaderMap, StatusCode};
use serde::Deserialize;

use crate::guest_link::{self, EntryKind, FileOp, FileStat, GuestError, Reply};
use crate::http::{self, ApiError, ApiResult};
use crate::sandbox::{Daemon, SandboxRecord, SandboxState};

pub(crate) use events::{complete_event, error_event, event, output_events, sse};

use files::{file_info, Names};
pub use routes::route;

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
    daemon.accessed(id);
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
        daemon.accessed(id);
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

/// A Running sandbox's files as the daemon itself reads and writes them
/// (as root, beneath the sandbox's root): how the credential vault's CA
/// reaches the sandbox. What it reads is the guest's, so untrusted: it is
/// read up to a limit.
pub(crate) struct DaemonFiles(Guest);

impl DaemonFiles {
    /// The files of generation `attempt` of sandbox `id`, whatever its
    /// state (one still starting, before it reads Running).
    pub(crate) fn of_generation(daemon: &Daemon, id: &str, attempt: u32) -> Result<Self, ApiError> {
        let record = daemon.get(id)?;
        let job =
            record.job.clone().ok_or_else(|| ApiError::conflict(format!("sandbox {id} has no Job yet")))?;
        let link = daemon.link_of(&job, attempt).map_err(|e| ApiError::conflict(e.to_string()))?;
        Ok(Self(Guest { record, link, names: std::sync::OnceLock::new() }))
    }

    /// The file at `path` (`None` when there is none), if it is a regular
    /// file of at most `limit` bytes.
    pub(crate) fn read(&self, path: &str, limit: u64) -> Result<Option<Vec<u8>>, ApiError> {
        let stat = match self.0.stat(path) {
            Ok(stat) => stat,
            Err(e) if e.status == StatusCode::NOT_FOUND => return Ok(None),
            Err(e) => return Err(e),
        };
        if stat.kind != EntryKind::File || stat.size > limit {
            return Err(ApiError::bad_request(format!(
                "{path} in the sandbox is not a regular file of at most {limit} bytes"
            )));
        }
        let target = self.0.resolved(FileOp::Resolve { path: path.into() })?;
        let mut out = Vec::new();
        while (out.len() as u64) < stat.size {
            let page = self.0.read(&target, out.len() as u64, CHUNK)?;
            if page.is_empty() {
                break;
            }
            out.extend_from_slice(&page);
        }
        Ok(Some(out))
    }

    /// Writes `data` to `path` (its parents created) with `mode`, owned by root.
    pub(crate) fn write(&self, path: &str, data: &[u8], mode: u32) -> Result<(), ApiError> {
        self.0.write(path, data, mode, None, None)
    }
}
