//! The egress sidecar's runtime policy API (`egress-api.yaml`, `/policy`),
//! which the SDKs reach at a sandbox's port 18080 (`get_egress_policy`,
//! `patch_egress_rules`, `delete_egress_rules`). pvisor has no sidecar: the
//! daemon answers from the sandbox record, and a change goes to the running
//! Job's proxy ([`pvisor::actions::ChangeNetworkPolicy`]) before it is
//! recorded, so nothing is accepted that is not enforced. The reference is
//! `components/egress/policy_server.go` (`handleGet`, `handlePatch`,
//! `handleDelete`) and `policy_utils.go` (`modeFromPolicy`,
//! `mergeEgressRules`: the patch's rules first, the first of a target
//! winning, then the current ones whose target the patch does not name;
//! `removeRulesByTarget`: targets matched without regard to case).

use std::sync::Arc;

use hyper::body::Bytes;
use hyper::{HeaderMap, Method, StatusCode};
use pvisor_net::{OrderedPolicy, OrderedRule, RuleAction};
use serde_json::{json, Value};

use crate::http::{self, ApiError, ApiResult};
use crate::sandbox::{Daemon, SandboxState};

/// The port the SDKs ask `endpoints/{port}` for (`DEFAULT_EGRESS_PORT`).
pub const EGRESS_PORT: u16 = 18080;

/// `/policy` of sandbox `id`, authenticated like execd.
pub async fn route<B>(
    daemon: &Arc<Daemon>,
    id: &str,
    method: &Method,
    rest: &[&str],
    headers: &HeaderMap,
    body: B,
) -> ApiResult
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    if rest.first() == Some(&"credential-vault") {
        return crate::credential_vault::route(daemon, id, method, rest, headers, body).await;
    }
    let record = daemon.visible(id)?;
    crate::execd::check_token(&record, headers)?;
    if rest != ["policy"] {
        return Err(ApiError::not_found(format!(
            "the egress API of sandbox {id} serves /policy and /credential-vault"
        )));
    }
    match *method {
        Method::GET => Ok(http::json(StatusCode::OK, &status(record.network_policy.as_ref(), None))),
        Method::PATCH | Method::DELETE => {
            let body = http::read_body(body, 1 << 20).await?;
            let (daemon, id, method) = (daemon.clone(), id.to_owned(), method.clone());
            tokio::task::spawn_blocking(move || change(&daemon, &id, &method, &body))
                .await
                .map_err(|e| ApiError::internal(format!("worker failed: {e}")))?
        }
        _ => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "METHOD_NOT_ALLOWED",
            format!("{method} /policy: the egress policy API answers GET, PATCH and DELETE"),
        )),
    }
}

/// The reference's `PolicyStatusResponse` for `policy` (`None`: created
/// without a `networkPolicy`, so the VM has no network at all).
fn status(policy: Option<&OrderedPolicy>, reason: Option<&str>) -> Value {
    let Some(policy) = policy else {
        return json!({
            "status": "ok",
            "mode": "deny_all",
            "enforcementMode": "none",
            "reason": "created without a networkPolicy: the VM has no network at all",
            "policy": { "defaultAction": "deny", "egress": [] },
        });
    };
    let egress: Vec<Value> =
        policy.rules.iter().map(|r| json!({ "action": action(r.action), "target": r.target })).collect();
    let mode = match (policy.default_action, egress.is_empty()) {
        (RuleAction::Allow, true) => "allow_all",
        (RuleAction::Deny, true) => "deny_all",
        _ => "enforcing",
    };
    let mut v = json!({
        "status": "ok",
        "mode": mode,
        "enforcementMode": "proxy",
        "policy": { "defaultAction": action(policy.default_action), "egress": egress },
    });
    if let Some(reason) = reason {
        v["reason"] = json!(reason);
    }
    v
}

fn action(a: RuleAction) -> &'static str {
    match a {
        RuleAction::Allow => "allow",
        RuleAction::Deny => "deny",
    }
}

/// `PATCH` (rules to merge) or `DELETE` (targets to remove): the new policy
/// goes to the running Job's proxy, then into the record.
fn change(daemon: &Arc<Daemon>, id: &str, method: &Method, body: &[u8]) -> ApiResult {
    let record = daemon.visible(id)?;
    let Some(current) = record.network_policy.clone() else {
        return Err(ApiError::conflict(format!(
            "sandbox {id} was created without a networkPolicy: its VM has no network to change; create it with one"
        )));
    };
    if record.state != SandboxState::Running {
        return Err(ApiError::conflict(format!(
            "sandbox {id} is {}; its policy changes while it is Running",
            record.state.as_str()
        )));
    }
    let next = if *method == Method::PATCH { patched(&current, body)? } else { deleted(&current, body)? };
    let Some(next) = next else {
        return Ok(http::json(StatusCode::OK, &status(Some(&current), Some("no matching targets found"))));
    };
    pvisor_net::policy::validate_ordered(&next)
        .map_err(|e| ApiError::bad_request(format!("invalid merged policy: {e}")))?;
    let job = record.job.clone().ok_or_else(|| ApiError::conflict(format!("sandbox {id} has no Job yet")))?;
    daemon.vaults.change_policy(id, &next, || {
        daemon
            .runtime
            .execute(pvisor::actions::ChangeNetworkPolicy { job, policy: next.clone() })
            .map_err(|e| ApiError::conflict(e.to_string()))?;
        daemon.update(id, |r| {
            r.network_policy = Some(next.clone());
            Ok(())
        })?;
        Ok(())
    })?;
    Ok(http::json(StatusCode::OK, &status(Some(&next), None)))
}

/// The reference's `mergeEgressRules`: the patch's rules first (the first
/// of a target wins), then the current ones whose target it does not name.
fn patched(current: &OrderedPolicy, body: &[u8]) -> Result<Option<OrderedPolicy>, ApiError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Rule {
        action: String,
        target: String,
    }
    let rules: Vec<Rule> = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("invalid patch rules: {e} (a JSON array of {{action, target}})"))
    })?;
    if rules.is_empty() {
        return Err(ApiError::bad_request("invalid patch rules: empty array"));
    }
    let mut seen: Vec<String> = Vec::new();
    let mut merged = Vec::new();
    let incoming = rules.iter().map(|r| {
        let action = match r.action.trim().to_ascii_lowercase().as_str() {
            "allow" => RuleAction::Allow,
            "deny" => RuleAction::Deny,
            other => {
                return Err(ApiError::bad_request(format!(
                    "invalid patch rules: {other:?} is not \"allow\" or \"deny\""
                )))
            }
        };
        Ok(OrderedRule { action, target: r.target.trim().to_owned() })
    });
    let incoming: Vec<OrderedRule> = incoming.collect::<Result<_, _>>()?;
    for rule in incoming.into_iter().chain(current.rules.iter().cloned()) {
        let key = rule.target.to_ascii_lowercase();
        if !seen.contains(&key) {
            seen.push(key);
            merged.push(rule);
        }
    }
    Ok(Some(OrderedPolicy { rules: merged, ..current.clone() }))
}

/// The reference's `removeRulesByTarget`; `None` when nothing matched.
fn deleted(current: &OrderedPolicy, body: &[u8]) -> Result<Option<OrderedPolicy>, ApiError> {
    let targets: Vec<String> = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("invalid delete targets: {e} (a JSON array of targets)"))
    })?;
    if targets.is_empty() {
        return Err(ApiError::bad_request("invalid delete targets: empty array"));
    }
    let gone: Vec<String> =
        targets.iter().map(|t| t.trim().to_ascii_lowercase()).filter(|t| !t.is_empty()).collect();
    let kept: Vec<OrderedRule> =
        current.rules.iter().filter(|r| !gone.contains(&r.target.to_ascii_lowercase())).cloned().collect();
    if kept.len() == current.rules.len() {
        return Ok(None);
    }
    Ok(Some(OrderedPolicy { rules: kept, ..current.clone() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(rules: &[(RuleAction, &str)]) -> OrderedPolicy {
        let rules =
            rules.iter().map(|(action, target)| OrderedRule { action: *action, target: (*target).into() });
        OrderedPolicy {
            default_action: RuleAction::Deny,
            rules: rules.collect(),
            source: "networkPolicy".into(),
        }
    }

    /// The reference's merge (policy_utils.go, `mergeEgressRules`) and
    /// removal (`removeRulesByTarget`), and its refusals of empty arrays.
    #[test]
    fn patches_merge_first_wins_and_deletes_ignore_case() {
        use RuleAction::{Allow, Deny};
        let current = policy(&[(Allow, "a.example.com"), (Deny, "b.example.com")]);
        let body = br#"[{"action":"allow","target":"b.example.com"},{"action":"deny","target":"B.example.com"},{"action":"allow","target":"c.example.com"}]"#;
        let next = patched(&current, body).unwrap().unwrap();
        assert_eq!(
            next,
            policy(&[(Allow, "b.example.com"), (Allow, "c.example.com"), (Allow, "a.example.com")])
        );
        let next = deleted(&next, br#"["A.EXAMPLE.COM"," c.example.com "]"#).unwrap().unwrap();
        assert_eq!(next, policy(&[(Allow, "b.example.com")]));
        assert_eq!(deleted(&next, br#"["nothing.example.com"]"#).unwrap(), None);
        assert!(patched(&current, b"[]").is_err() && deleted(&current, b"[]").is_err());
        assert!(patched(&current, br#"[{"action":"maybe","target":"x"}]"#).is_err());
    }
}
