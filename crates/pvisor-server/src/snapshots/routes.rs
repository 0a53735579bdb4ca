//! The snapshot routes of the lifecycle API: `POST /sandboxes/{id}/snapshots`,
//! `GET /snapshots`, `GET`/`DELETE /snapshots/{id}`; and the lookup a create
//! from `snapshotId` makes. Errors carry the reference's codes
//! (`SNAPSHOT::NOT_FOUND`, `SNAPSHOT::INVALID_STATE`, `SNAPSHOT::NOT_READY`;
//! server/opensandbox_server/services/snapshot_service.py and
//! snapshot_restore.py).

use std::sync::Arc;

use hyper::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{image_of, SnapshotRecord, SnapshotState};
use crate::http::{self, json, ApiError, ApiResult};
use crate::sandbox::{Daemon, SandboxState};

/// The spec's `CreateSnapshotRequest` (`additionalProperties: false`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    name: Option<String>,
}

/// Renders a record as the spec's `Snapshot`.
pub fn snapshot_json(r: &SnapshotRecord) -> Value {
    let mut v = json!({
        "id": r.id,
        "sandboxId": r.sandbox_id,
        "status": {
            "state": r.state.as_str(),
            "reason": r.reason,
            "message": r.message,
            "lastTransitionAt": r.last_transition_at.to_string(),
        },
        "createdAt": r.created_at.to_string(),
    });
    if let Some(name) = &r.name {
        v["name"] = json!(name);
    }
    v
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "SNAPSHOT::NOT_FOUND", format!("Snapshot {id} not found"))
}

/// Routes a snapshot request; `None` if `rest` is not a snapshot path.
pub fn route(
    daemon: &Arc<Daemon>,
    method: &Method,
    rest: &[&str],
    query: Option<&str>,
    body: &[u8],
) -> Option<ApiResult> {
    Some(match (method, rest) {
        (&Method::POST, ["sandboxes", sandbox, "snapshots"]) => create(daemon, sandbox, body),
        (&Method::GET, ["snapshots"]) => list(daemon, query),
        (&Method::GET, ["snapshots", id]) => daemon
            .snapshots
            .get(id)
            .map(|r| json(StatusCode::OK, &snapshot_json(&r)))
            .map_err(|_| not_found(id)),
        (&Method::DELETE, ["snapshots", id]) => delete(daemon, id),
        (_, ["sandboxes", _, "snapshots"] | ["snapshots", ..]) => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "METHOD_NOT_ALLOWED",
            format!("{method} is not allowed on this path"),
        )),
        _ => return None,
    })
}

/// `POST /sandboxes/{id}/snapshots`: 202 with the record in `Creating`; the
/// capture runs on a thread of its own while the sandbox keeps running.
fn create(daemon: &Arc<Daemon>, sandbox: &str, body: &[u8]) -> ApiResult {
    let body: CreateBody = if body.iter().all(u8::is_ascii_whitespace) {
        CreateBody::default()
    } else {
        http::parse_json(body, "CreateSnapshotRequest")?
    };
    if body.name.as_deref() == Some("") {
        return Err(ApiError::bad_request("name must not be empty; omit it for an unnamed snapshot"));
    }
    let source = daemon.visible(sandbox)?;
    if source.state != SandboxState::Running {
        return Err(ApiError::conflict(format!(
            "sandbox {sandbox} is {}; a snapshot is taken of a Running sandbox",
            source.state.as_str()
        )));
    }
    let now = pvisor_core::time::Timestamp::now();
    let id = http::uuid4();
    let record = SnapshotRecord {
        format: 1,
        id: id.clone(),
        sandbox_id: sandbox.to_owned(),
        name: body.name,
        state: SnapshotState::Creating,
        reason: "snapshot_accepted".into(),
        message: "Snapshot creation accepted.".into(),
        last_transition_at: now,
        created_at: now,
        image: image_of(&id),
    };
    super::capture::submit(daemon, record.clone())?;
    let mut response = json(StatusCode::ACCEPTED, &snapshot_json(&record));
    if let Ok(location) = format!("/v1/snapshots/{}", record.id).parse() {
        response.headers_mut().insert(hyper::header::LOCATION, location);
    }
    Ok(response)
}

/// `GET /snapshots`: filtered by `sandboxId` and `state` (repeated to OR
/// them, ignoring case, as sandbox states are), newest first, paginated.
fn list(daemon: &Arc<Daemon>, query: Option<&str>) -> ApiResult {
    let q = http::query_pairs(query)?;
    let sandbox = http::query_one(&q, "sandboxId");
    let states: Vec<String> = http::query_all(&q, "state").iter().map(|s| s.to_ascii_lowercase()).collect();
    let mut items: Vec<SnapshotRecord> = daemon
        .snapshots
        .list()
        .into_iter()
        .filter(|r| sandbox.is_none_or(|s| r.sandbox_id == s))
        .filter(|r| states.is_empty() || states.contains(&r.state.as_str().to_ascii_lowercase()))
        .collect();
    items.sort_by_key(|r| std::cmp::Reverse(r.created_at));
    let items: Vec<Value> = items.iter().map(snapshot_json).collect();
    Ok(json(StatusCode::OK, &http::page_of(&q, items)?))
}

/// `DELETE /snapshots/{id}`: 204 once its image and record are gone; 409
/// while it is being captured, or while a sandbox restored from it lives
/// (as Docker refuses to remove an image a container uses).
fn delete(daemon: &Arc<Daemon>, id: &str) -> ApiResult {
    let record = daemon.snapshots.get(id).map_err(|_| not_found(id))?;
    if record.state == SnapshotState::Creating {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "SNAPSHOT::INVALID_STATE",
            format!("Snapshot {id} is still being created and cannot be deleted"),
        ));
    }
    let in_use = || -> Vec<String> {
        daemon
            .list()
            .into_iter()
            .filter(|s| s.snapshot_id.as_deref() == Some(id) && !s.deleted)
            .filter(|s| !matches!(s.state, SandboxState::Terminated | SandboxState::Failed))
            .map(|s| s.id)
            .collect()
    };
    let conflict = |users: Vec<String>| {
        ApiError::new(
            StatusCode::CONFLICT,
            "SNAPSHOT::DELETE_CONFLICT",
            format!("Snapshot {id} is in use by sandbox(es) {}; delete them first", users.join(", ")),
        )
    };
    // Users first, with nothing written: a refused delete changes nothing.
    let users = in_use();
    if !users.is_empty() {
        return Err(conflict(users));
    }
    // Then claimed (in memory) and the users looked for again: a create
    // from it records its sandbox, then checks no delete has claimed the
    // snapshot (see `Daemon::create`), so of a create and a delete at once,
    // one sees the other. Only then is `Deleting` recorded.
    let Some(_claim) = daemon.snapshots.claim_delete(id) else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "SNAPSHOT::INVALID_STATE",
            format!("Snapshot {id} is already being deleted"),
        ));
    };
    let users = in_use();
    if !users.is_empty() {
        return Err(conflict(users));
    }
    daemon.snapshots.update(id, |r| {
        r.set(SnapshotState::Deleting, "snapshot_delete_requested", "Snapshot deletion requested.");
        Ok(())
    })?;
    daemon.snapshots.finish_delete(id, &daemon.images)?;
    Ok(http::empty(StatusCode::NO_CONTENT))
}

/// The image a create from `snapshotId` boots: the snapshot must exist
/// (404) and be `Ready` (409).
pub fn restore_image(daemon: &Daemon, id: &str) -> Result<String, ApiError> {
    let record = daemon.snapshots.get(id).map_err(|_| not_found(id))?;
    if !daemon.snapshots.restorable(id) {
        // Ready but claimed: a delete of it is under way.
        let state =
            if record.state == SnapshotState::Ready { "being deleted" } else { record.state.as_str() };
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "SNAPSHOT::NOT_READY",
            format!("Snapshot {id} is not ready for restore (it is {state})."),
        ));
    }
    Ok(record.image)
}
