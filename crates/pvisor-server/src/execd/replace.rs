//! `POST /files/replace`: literal content replacement in guest files.

use std::collections::BTreeMap;

use hyper::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{EntryKind, FileOp, Guest, CHUNK};
use crate::http::{self, json, ApiError, ApiResult};

/// One file's replacement in `POST /files/replace`.
#[derive(Debug, Deserialize)]
pub(super) struct ReplaceItem {
    #[serde(default)]
    old: String,
    #[serde(default)]
    new: String,
}

/// The most of one file `POST /files/replace` holds in memory.
pub(super) const MAX_REPLACE: u64 = 64 << 20;

/// `POST /files/replace`: every literal occurrence of `old` becomes `new`,
/// the file keeping its mode and owner; `?verbose=true` answers each path's
/// `replacedCount` (0 when `old` was not found, which is not an error).
/// Reference: `FilesystemController.ReplaceContent`, OpenSandbox
/// `components/execd/pkg/web/controller/filesystem.go` at 4db3a99 (a byte
/// replacement, as `strings.ReplaceAll`). Unlike the reference, every file is
/// checked and computed before any is written, so a bad path among several
/// changes none of them.
pub(super) fn replace(guest: &Guest, request: BTreeMap<String, ReplaceItem>, verbose: bool) -> ApiResult {
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
pub(super) fn replace_all(haystack: &[u8], old: &[u8], new: &[u8]) -> (Vec<u8>, usize) {
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
}
