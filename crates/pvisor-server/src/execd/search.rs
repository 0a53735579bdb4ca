//! `GET /directories/list` and `GET /files/search`: listings of a guest
//! directory, and the glob matches among them.

use std::path::Path;

use hyper::StatusCode;
use serde_json::Value;

use super::{file_info, EntryKind, FileOp, FileStat, Guest, Reply};
use crate::http::{json, ApiError, ApiResult};

pub(super) fn join_display(root: &str, relative: &Path) -> String {
    let root = root.trim_end_matches('/');
    format!("{root}/{}", relative.display())
}

pub(super) fn list(guest: &Guest, root: &str, depth: u32) -> Result<Vec<FileStat>, ApiError> {
    match guest.op(FileOp::List { path: root.into(), depth })? {
        Reply::Listing { entries, .. } => Ok(entries),
        other => Err(ApiError::internal(format!("unexpected agent answer {other:?}"))),
    }
}

pub(super) fn search(guest: &Guest, root: &str, pattern: &str) -> ApiResult {
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
