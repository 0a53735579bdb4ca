//! The egress sidecar's runtime policy API (`egress-api.yaml`, `/policy`),
//! which the SDKs reach at a sandbox's port 18080 (`get_egress_policy`,
//! `patch_egress_rules`, `delete_egress_rules`). pvisor has no sidecar: the
//! daemon answers from the sandbox record. The policy is decided once at
//! create and recorded in the Job, whose proxy enforces it, so `GET` reads
//! it in the reference's shape (`components/egress/policy_server.go`,
//! `handleGet`; `policy_utils.go`, `modeFromPolicy`) and a change is refused
//! with a 400 that says so, never accepted and then not enforced.

use std::sync::Arc;

use hyper::{HeaderMap, Method, StatusCode};
use serde_json::{json, Value};

use crate::http::{self, ApiError, ApiResult};
use crate::sandbox::Daemon;

/// The port the SDKs ask `endpoints/{port}` for (`DEFAULT_EGRESS_PORT`).
pub const EGRESS_PORT: u16 = 18080;

/// `/policy` of sandbox `id`, authenticated like execd.
pub fn route(
    daemon: &Arc<Daemon>,
    id: &str,
    method: &Method,
    rest: &[&str],
    headers: &HeaderMap,
) -> ApiResult {
    let record = daemon.visible(id)?;
    crate::execd::check_token(&record, headers)?;
    if rest != ["policy"] {
        return Err(ApiError::not_found(format!(
            "the egress API of sandbox {id} serves /policy only (no credential vault)"
        )));
    }
    match *method {
        Method::GET => {
            let Some(policy) = &record.network_policy else {
                return Ok(http::json(
                    StatusCode::OK,
                    &json!({
                        "status": "ok",
                        "mode": "deny_all",
                        "enforcementMode": "none",
                        "reason": "created without a networkPolicy: the VM has no network at all",
                        "policy": { "defaultAction": "deny", "egress": [] },
                    }),
                ));
            };
            let action = |a: pvisor_net::RuleAction| match a {
                pvisor_net::RuleAction::Allow => "allow",
                pvisor_net::RuleAction::Deny => "deny",
            };
            let egress: Vec<Value> = policy
                .rules
                .iter()
                .map(|r| json!({ "action": action(r.action), "target": r.target }))
                .collect();
            let mode = match (policy.default_action, egress.is_empty()) {
                (pvisor_net::RuleAction::Allow, true) => "allow_all",
                (pvisor_net::RuleAction::Deny, true) => "deny_all",
                _ => "enforcing",
            };
            Ok(http::json(
                StatusCode::OK,
                &json!({
                    "status": "ok",
                    "mode": mode,
                    "enforcementMode": "proxy",
                    "policy": { "defaultAction": action(policy.default_action), "egress": egress },
                }),
            ))
        }
        Method::PATCH | Method::DELETE => Err(ApiError::bad_request(format!(
            "the egress policy of sandbox {id} is fixed at create (it is recorded in the sandbox's Job and enforced by its proxy); create a new sandbox with the networkPolicy you need"
        ))),
        _ => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "METHOD_NOT_ALLOWED",
            format!("{method} /policy: the egress policy API answers GET (and refuses PATCH and DELETE)"),
        )),
    }
}
