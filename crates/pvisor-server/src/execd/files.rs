//! The execd file routes that move or describe file contents: `FileInfo`
//! and the image's owner names, `POST /files/upload`, `GET /files/download`
//! (bytes with a Range, or lines).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Bytes;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use pvisor_core::time::Timestamp;

use super::{blocking, octal_mode, EntryKind, FileOp, FileStat, Guest, CHUNK};
use crate::http::Body;
use crate::http::{self, ApiError, ApiResult};
use crate::sandbox::{Daemon, StreamSlot};

/// The most a line-based download (`offset`/`limit`) holds in memory.
const MAX_LINE_READ: u64 = 16 << 20;

/// The FileInfo schema; owner and group by name from the image's files.
pub(super) fn file_info(display: &str, stat: &FileStat, names: &Names) -> Value {
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
/// A table the host could not read safely (a FIFO, a device, a symlink,
/// too large) is empty, and looking a name up in it is an error naming why.
pub(super) struct Names {
    users: Table,
    groups: Table,
}

/// One name table; `unreadable` says why it could not be read.
struct Table {
    names: BTreeMap<u32, String>,
    unreadable: Option<String>,
}

/// The most of an image's /etc/passwd or /etc/group the daemon reads.
const MAX_NAME_TABLE: u64 = 4 << 20;

impl Table {
    fn load(rootfs: &Path, file: &str) -> Self {
        let (text, unreadable) = match crate::images::read_image_file(rootfs, Path::new(file), MAX_NAME_TABLE)
        {
            Ok(Some(bytes)) => (String::from_utf8_lossy(&bytes).into_owned(), None),
            Ok(None) => (String::new(), None),
            Err(e) => (String::new(), Some(e.to_string())),
        };
        let names = text
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                Some((f.get(2)?.parse().ok()?, (*f.first()?).to_owned()))
            })
            .collect();
        Self { names, unreadable }
    }

    fn id(&self, what: &str, name: &str) -> Result<u32, ApiError> {
        let found =
            name.parse().ok().or_else(|| self.names.iter().find(|(_, n)| *n == name).map(|(id, _)| *id));
        found.ok_or_else(|| match &self.unreadable {
            Some(why) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "IMAGE_UNREADABLE",
                format!("cannot look up the {what} {name:?}: {why}"),
            ),
            None => ApiError::bad_request(format!("no {what} {name:?} in the image")),
        })
    }
}

impl Names {
    pub(super) fn load(rootfs: &Path) -> Self {
        Self { users: Table::load(rootfs, "etc/passwd"), groups: Table::load(rootfs, "etc/group") }
    }
    pub(super) fn user(&self, uid: u32) -> String {
        self.users.names.get(&uid).cloned().unwrap_or_else(|| uid.to_string())
    }
    pub(super) fn group(&self, gid: u32) -> String {
        self.groups.names.get(&gid).cloned().unwrap_or_else(|| gid.to_string())
    }
    pub(super) fn uid(&self, name: &str) -> Result<u32, ApiError> {
        self.users.id("user", name)
    }
    pub(super) fn gid(&self, name: &str) -> Result<u32, ApiError> {
        self.groups.id("group", name)
    }
}

/// The largest upload body, as when it was read whole (the guest's disk
/// is the real bound; the daemon's memory no longer is).
const MAX_UPLOAD: u64 = 1 << 30;
/// The most a `metadata` part (JSON) may hold: it is read whole.
const MAX_METADATA: u64 = 1 << 20;

/// `POST /files/upload`: `multipart/form-data` read as a stream, each
/// `metadata` part naming the path, mode and owner of the `file` part that
/// follows it. A file's bytes go to the guest a page ([`CHUNK`]) at a time
/// as they arrive, so the daemon holds about one page per upload, whatever
/// the file's size. Files before a malformed part are written.
/// `written` collects each file written whole (`PATH (N bytes)`), for the Trace.
pub(super) async fn upload<B>(
    guest: Guest,
    content_type: &str,
    body: B,
    written: &mut Vec<String>,
) -> ApiResult
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let boundary = content_type
        .split(';')
        .filter_map(|p| p.trim().strip_prefix("boundary="))
        .next()
        .map(|b| b.trim_matches('"').to_owned())
        .ok_or_else(|| {
            ApiError::bad_request("files/upload needs a multipart/form-data body with a boundary")
        })?;
    let limits = multer::SizeLimit::new().whole_stream(MAX_UPLOAD).for_field("metadata", MAX_METADATA);
    let mut parts = multer::Multipart::with_constraints(
        http_body_util::BodyExt::into_data_stream(body),
        boundary,
        multer::Constraints::new().size_limit(limits),
    );
    let guest = Arc::new(guest);
    let mut pending: Option<Value> = None;
    while let Some(mut part) = parts.next_field().await.map_err(multipart_error)? {
        let name = part
            .name()
            .map(str::to_owned)
            .ok_or_else(|| ApiError::bad_request("a multipart part has no Content-Disposition name"))?;
        match name.as_str() {
            "metadata" => {
                let bytes = part.bytes().await.map_err(multipart_error)?;
                pending = Some(
                    serde_json::from_slice(&bytes)
                        .map_err(|e| ApiError::bad_request(format!("invalid metadata part: {e}")))?,
                )
            }
            "file" => {
                let meta = pending
                    .take()
                    .ok_or_else(|| ApiError::bad_request("a file part must follow its metadata part"))?;
                let path = meta["path"]
                    .as_str()
                    .ok_or_else(|| ApiError::bad_request("metadata.path is required"))?
                    .to_owned();
                let mode = octal_mode(meta["mode"].as_u64().unwrap_or(644) as u32)?;
                let (owner, group) =
                    (meta["owner"].as_str().map(str::to_owned), meta["group"].as_str().map(str::to_owned));
                let (g, p) = (guest.clone(), path.clone());
                let (mut file, owner, group) = blocking(move || {
                    let owner = owner.map(|o| g.names().uid(&o)).transpose()?;
                    let group = group.map(|o| g.names().gid(&o)).transpose()?;
                    Ok((g.create(&p, mode)?, owner, group))
                })
                .await?;
                let mut page: Vec<u8> = Vec::with_capacity(CHUNK as usize);
                let mut bytes = 0u64;
                loop {
                    let chunk = part.chunk().await.map_err(multipart_error)?;
                    let ended = chunk.is_none();
                    let mut rest = chunk.as_deref().unwrap_or_default();
                    bytes += rest.len() as u64;
                    // Whole pages go as soon as they are full; the last, short one at the end.
                    while !rest.is_empty() {
                        let take = rest.len().min(CHUNK as usize - page.len());
                        page.extend_from_slice(&rest[..take]);
                        rest = &rest[take..];
                        if page.len() == CHUNK as usize {
                            let (g, full) = (guest.clone(), std::mem::take(&mut page));
                            file = blocking(move || g.write_page(file, &full)).await?;
                            page.reserve(CHUNK as usize);
                        }
                    }
                    if ended {
                        break;
                    }
                }
                let g = guest.clone();
                blocking(move || {
                    let file = if page.is_empty() { file } else { g.write_page(file, &page)? };
                    g.finish(file, owner, group)
                })
                .await?;
                written.push(format!("{path} ({bytes} bytes)"));
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "unexpected multipart field {other:?} (want metadata, file)"
                )))
            }
        }
    }
    if written.is_empty() {
        return Err(ApiError::bad_request("the upload contained no file part"));
    }
    Ok(http::empty(StatusCode::OK))
}

/// A multipart body that cannot be read (or is too large) as a 400 (or 413),
/// in the words [`http::read_body`] uses for a body read whole.
fn multipart_error(e: multer::Error) -> ApiError {
    match e {
        multer::Error::StreamSizeExceeded { .. } => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "PAYLOAD_TOO_LARGE",
            format!("the request body exceeds {} MiB", MAX_UPLOAD >> 20),
        ),
        multer::Error::StreamReadFailed(e) => {
            ApiError::bad_request(format!("cannot read the request body: {e}"))
        }
        other => ApiError::bad_request(format!("invalid multipart body: {other}")),
    }
}

/// `bytes=a-b`, `bytes=a-`, `bytes=-n` → (start, end inclusive).
pub(super) fn parse_range(header: &str, size: u64) -> Option<(u64, u64)> {
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

/// `offset`/`limit` of `GET /files/download`: lines, 1-based (execd-api.yaml,
/// `downloadFile`: "line-based reading … returns text/plain").
#[derive(Clone, Copy, Debug)]
pub(super) struct LineWindow {
    /// The first line to return, from 1.
    offset: u64,
    /// How many lines at most; all the rest when absent.
    limit: Option<u64>,
}

impl LineWindow {
    pub(super) fn from_query(q: &[(String, String)]) -> Result<Option<Self>, ApiError> {
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
pub(super) fn read_lines(guest: &Guest, path: &str, window: LineWindow) -> ApiResult {
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

pub(super) async fn download(
    daemon: &Arc<Daemon>,
    guest: Guest,
    path: String,
    range: Option<String>,
) -> ApiResult {
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
    let body = stream_range(guest, target, start, end, slot);
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

/// Bytes a streamed read asks the guest for at once.
const STREAM_PAGE: u64 = 1 << 20;
/// Pages a streamed read holds ahead of a slow client.
const STREAM_AHEAD: usize = 2;

/// A body of the guest file `target` from `start` to `end`, read a page at
/// a time as the client takes it: the daemon holds at most
/// [`STREAM_AHEAD`] + 1 pages per body, however large the file and however
/// slow the client. A file that shrinks or fails mid-way ends the body short.
pub(super) fn stream_range(guest: Guest, target: PathBuf, start: u64, end: u64, slot: StreamSlot) -> Body {
    let (tx, body) = http::channel_body(STREAM_AHEAD);
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let mut offset = start;
        while offset < end {
            let len = (end - offset).min(STREAM_PAGE);
            match guest.read(&target, offset, len) {
                Ok(bytes) if !bytes.is_empty() => {
                    offset += bytes.len() as u64;
                    if tx.blocking_send(Bytes::from(bytes)).is_err() {
                        return;
                    }
                }
                _ => return,
            }
        }
    });
    body
}

#[cfg(test)]
mod tests {
    use super::*;

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
