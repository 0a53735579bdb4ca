//! The OpenSandbox lifecycle API (`sandbox-lifecycle.yml`): create, list,
//! get, delete, metadata, pause, resume, renew-expiration, endpoints.

use std::collections::BTreeMap;
use std::sync::Arc;

use hyper::{HeaderMap, Method, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::http::{self, json, ApiError, ApiResult};
use crate::sandbox::{CreateRequest, Daemon, OpError, SandboxRecord, SandboxState};

impl From<OpError> for ApiError {
    fn from(e: OpError) -> Self {
        match e {
            OpError::NotFound(m) => ApiError::not_found(m),
            OpError::Conflict(m) => ApiError::conflict(m),
            OpError::Invalid(m) => ApiError::bad_request(m),
            OpError::Internal(m) => ApiError::internal(m),
            OpError::DiskFull(m) => {
                ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "INSUFFICIENT_STORAGE", m)
            }
        }
    }
}

/// Unknown fields are ignored here and refused in `image`, `platform` and
/// the renewal, exactly where the spec sets `additionalProperties: false`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateBody {
    image: Option<ImageSpec>,
    snapshot_id: Option<String>,
    platform: Option<PlatformSpec>,
    timeout: Option<i64>,
    resource_limits: Option<BTreeMap<String, String>>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    entrypoint: Option<Vec<String>>,
    network_policy: Option<Value>,
    credential_proxy: Option<Value>,
    #[serde(default)]
    secure_access: bool,
    volumes: Option<Vec<Value>>,
    extensions: Option<BTreeMap<String, String>>,
    /// Sent by SDKs when set; requests are not reservations on one node.
    resource_requests: Option<BTreeMap<String, String>>,
    lifecycle: Option<Value>,
    template_id: Option<String>,
}

#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct PlatformSpec {
    os: String,
    arch: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ImageSpec {
    uri: String,
    #[allow(dead_code)]
    auth: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RenewBody {
    expires_at: String,
}

/// Renders a record as the spec's `Sandbox`.
pub fn sandbox_json(r: &SandboxRecord) -> Value {
    let mut v = json!({
        "id": r.id,
        "status": {
            "state": r.state.as_str(),
            "reason": r.reason,
            "message": r.message,
            "lastTransitionAt": r.last_transition_at.to_string(),
        },
        "metadata": r.metadata,
        "entrypoint": r.entrypoint,
        "createdAt": r.created_at.to_string(),
    });
    match &r.snapshot_id {
        Some(snapshot) => v["snapshotId"] = json!(snapshot),
        None => v["image"] = json!({ "uri": r.image }),
    }
    if let Some(t) = r.expires_at {
        v["expiresAt"] = json!(t.to_string());
    }
    if let Some(p) = &r.platform {
        v["platform"] = p.clone();
    }
    v
}

/// Routes `rest` (the path after `/v1` or `/`) of a lifecycle request.
/// Blocking (records are fsynced): callers run it off the async workers.
pub fn route(
    daemon: &Arc<Daemon>,
    method: &Method,
    rest: &[&str],
    query: Option<&str>,
    headers: &HeaderMap,
    body: hyper::body::Bytes,
) -> ApiResult {
    // A deleted sandbox is gone for every route (reference: the Docker
    // server's `_get_container_by_sandbox_id` finds no container and
    // answers 404 SANDBOX_NOT_FOUND, server/opensandbox_server/services/
    // docker/docker_service.py at 4db3a99); DELETE says so itself.
    if let ["sandboxes", id, tail @ ..] = rest {
        if *method != Method::DELETE && tail.first() != Some(&"snapshots") {
            daemon.visible(id)?;
        }
    }
    if let Some(answer) = crate::snapshots::routes::route(daemon, method, rest, query, &body) {
        return answer;
    }
    match (method, rest) {
        (&Method::POST, ["sandboxes"]) => create(daemon, &body),
        (&Method::GET, ["sandboxes"]) => list(daemon, query),
        (&Method::GET, ["sandboxes", id]) => Ok(json(StatusCode::OK, &sandbox_json(&daemon.visible(id)?))),
        (&Method::DELETE, ["sandboxes", id]) => {
            daemon.delete(id, "user_delete")?;
            Ok(http::empty(StatusCode::NO_CONTENT))
        }
        (&Method::PATCH, ["sandboxes", id, "metadata"]) => patch_metadata(daemon, id, &body),
        (&Method::POST, ["sandboxes", id, "pause"]) => {
            daemon.pause(id)?;
            Ok(http::empty(StatusCode::ACCEPTED))
        }
        (&Method::POST, ["sandboxes", id, "resume"]) => {
            daemon.resume(id)?;
            Ok(http::empty(StatusCode::ACCEPTED))
        }
        (&Method::POST, ["sandboxes", id, "renew-expiration"]) => renew(daemon, id, &body),
        (&Method::GET, ["sandboxes", id, "endpoints", port]) => endpoint(daemon, id, port, query, headers),
        (&Method::GET, ["sandboxes", id, "diagnostics", what]) => {
            crate::diagnostics::route(daemon, id, what, query)
        }
        (&Method::POST, ["metrics", "events"]) => Ok(http::empty(StatusCode::NO_CONTENT)),
        (_, ["sandboxes", ..]) => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "METHOD_NOT_ALLOWED",
            format!("{method} is not allowed on this path"),
        )),
        _ => Err(ApiError::not_found(format!("no route for {method} /{}", rest.join("/")))),
    }
}

fn create(daemon: &Arc<Daemon>, body: &[u8]) -> ApiResult {
    let b: CreateBody = http::parse_json(body, "CreateSandboxRequest")?;
    // Accepted without effect: every endpoint already requires its token
    // (secureAccess), and on one node resource requests and lifecycle hints
    // reserve nothing. Extensions are opaque but for the well-known keys.
    let _accepted = (b.secure_access, b.resource_requests, b.lifecycle);
    let renew_on_access = crate::sandbox::renew_extension(b.extensions.as_ref())?;
    if let Some(t) = b.template_id {
        return Err(ApiError::bad_request(format!(
            "templateId {t:?} is not supported: pvisor serve has no templates; create from an image"
        )));
    }
    // Exactly one startup source (the reference's `CreateSandboxRequest`
    // validator, server/opensandbox_server/api/schema.py); a blank one is
    // none.
    let image = b.image.map(|i| i.uri).filter(|u| !u.trim().is_empty());
    let snapshot_id = b.snapshot_id.filter(|s| !s.trim().is_empty());
    let image = match (image, &snapshot_id) {
        (Some(_), Some(_)) | (None, None) => {
            return Err(ApiError::bad_request(
                "Exactly one of image or snapshotId must be provided (an image imported with `pvisor image import`, \"default\", or a Ready snapshot's id).",
            ))
        }
        (Some(image), None) => image,
        (None, Some(id)) => crate::snapshots::routes::restore_image(daemon, id)?,
    };
    let volumes = crate::volumes::resolve(b.volumes.unwrap_or_default(), &daemon.config.volumes)?;
    let network_policy = b.network_policy.filter(|v| !v.is_null()).map(parse_network_policy).transpose()?;
    let credential_proxy =
        b.credential_proxy.filter(|v| !v.is_null()).map(parse_credential_proxy).transpose()?;
    let credential_proxy = credential_proxy.unwrap_or(false);
    if credential_proxy && network_policy.is_none() {
        // The reference's CreateSandboxRequest validator (api/schema.py).
        return Err(ApiError::bad_request(
            "credentialProxy.enabled requires networkPolicy: a binding's hosts must be allowed by explicit egress rules",
        ));
    }
    if let Some(p) = &b.platform {
        if p.os != "linux" || p.arch != "amd64" {
            return Err(ApiError::bad_request(format!(
                "platform {}/{} cannot be satisfied: this host runs linux/amd64 guests only",
                p.os, p.arch
            )));
        }
    }
    for key in b.metadata.keys() {
        if key.starts_with("opensandbox.io/") {
            return Err(ApiError::bad_request(format!(
                "metadata key {key:?} uses the reserved opensandbox.io/ prefix"
            )));
        }
    }
    let limits = b.resource_limits.unwrap_or_default();
    if let Some(gpu) = limits.get("gpu") {
        return Err(ApiError::bad_request(format!(
            "resourceLimits.gpu {gpu:?} cannot be satisfied: pvisor sandboxes are microVMs without GPU passthrough; omit gpu"
        )));
    }
    let memory_mib = match limits.get("memory") {
        Some(m) => parse_memory_mib(m)?,
        None => 512,
    };
    let cpus = match limits.get("cpu") {
        Some(c) => parse_cpus(c)?,
        None => 1,
    };
    let timeout = match b.timeout {
        None => None,
        Some(t) if t < 0 => return Err(ApiError::bad_request("timeout must be positive")),
        Some(t) => Some(t as u64),
    };
    let entrypoint = b.entrypoint.unwrap_or_else(|| vec!["tail".into(), "-f".into(), "/dev/null".into()]);
    if entrypoint.is_empty() {
        return Err(ApiError::bad_request("entrypoint must have at least one element"));
    }
    let record = daemon.create(CreateRequest {
        image,
        snapshot_id,
        entrypoint,
        env: b.env,
        metadata: b.metadata,
        resource_limits: limits,
        platform: b.platform.map(|p| serde_json::json!({ "os": p.os, "arch": p.arch })),
        timeout,
        memory_mib,
        cpus,
        network_policy,
        credential_proxy,
        renew_on_access,
        volumes,
    })?;
    let mut v = sandbox_json(&record);
    // The create response carries no startup source (the spec).
    v.as_object_mut().map(|o| (o.remove("image"), o.remove("snapshotId")));
    Ok(json(StatusCode::ACCEPTED, &v))
}

/// The spec's `CredentialProxyConfig`: `{"enabled": bool}`.
fn parse_credential_proxy(value: Value) -> Result<bool, ApiError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct CredentialProxyBody {
        #[serde(default)]
        enabled: bool,
    }
    let body: CredentialProxyBody = serde_json::from_value(value).map_err(|e| {
        ApiError::bad_request(format!("invalid credentialProxy: {e} (expected {{\"enabled\": true}})"))
    })?;
    Ok(body.enabled)
}

/// The spec's `NetworkPolicy` (`additionalProperties: false`, as is each
/// `NetworkRule`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NetworkPolicyBody {
    default_action: Option<String>,
    /// SDKs send `null` for "no rules".
    egress: Option<Vec<NetworkRuleBody>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NetworkRuleBody {
    action: String,
    target: String,
}

/// `networkPolicy` as the reference egress sidecar reads it
/// (`components/egress/pkg/policy/policy.go`, `ParsePolicy` and
/// `normalizePolicy`): actions are trimmed and case-folded, an empty one is
/// deny, an omitted `defaultAction` is deny (so `{}` denies everything),
/// rules keep their order. Every target is checked before the sandbox exists.
fn parse_network_policy(value: Value) -> Result<pvisor_net::OrderedPolicy, ApiError> {
    use pvisor_net::{OrderedRule, RuleAction};
    let body: NetworkPolicyBody = serde_json::from_value(value).map_err(|e| {
        ApiError::bad_request(format!(
            "networkPolicy: {e} (fields: defaultAction, egress[{{action, target}}])"
        ))
    })?;
    let action = |raw: &str, at: &str| match raw.trim().to_ascii_lowercase().as_str() {
        "" | "deny" => Ok(RuleAction::Deny),
        "allow" => Ok(RuleAction::Allow),
        other => {
            Err(ApiError::bad_request(format!("networkPolicy.{at}: {other:?} is not \"allow\" or \"deny\"")))
        }
    };
    let default_action = action(body.default_action.as_deref().unwrap_or(""), "defaultAction")?;
    let rules = body
        .egress
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, r)| {
            Ok(OrderedRule {
                action: action(&r.action, &format!("egress[{i}].action"))?,
                target: r.target.trim().to_owned(),
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let policy = pvisor_net::OrderedPolicy { default_action, rules, source: "networkPolicy".into() };
    pvisor_net::policy::validate_ordered(&policy)
        .map_err(|e| ApiError::bad_request(format!("networkPolicy.{e}")))?;
    Ok(policy)
}

/// `512Mi`, `2Gi`, `1G`, `1048576` (bytes) → MiB, between 64 MiB and 16 GiB.
fn parse_memory_mib(s: &str) -> Result<u64, ApiError> {
    let bad =
        || ApiError::bad_request(format!("resourceLimits.memory {s:?} is not a size like 512Mi or 2Gi"));
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| bad())?;
    let mib = match unit {
        "Ki" => n / 1024.0,
        "Mi" => n,
        "Gi" => n * 1024.0,
        "K" | "k" => n * 1000.0 / 1048576.0,
        "M" => n * 1e6 / 1048576.0,
        "G" => n * 1e9 / 1048576.0,
        "" => n / 1048576.0,
        _ => return Err(bad()),
    };
    let mib = mib.ceil() as u64;
    if !(64..=16384).contains(&mib) {
        return Err(ApiError::bad_request(format!(
            "resourceLimits.memory {s:?} must be between 64Mi and 16Gi"
        )));
    }
    Ok(mib)
}

/// `500m` → 1, `2` → 2 (whole vCPUs, at least 1, at most the host's).
fn parse_cpus(s: &str) -> Result<u32, ApiError> {
    let bad =
        || ApiError::bad_request(format!("resourceLimits.cpu {s:?} is not a CPU amount like 500m or 2"));
    let cores = match s.strip_suffix('m') {
        Some(milli) => milli.parse::<f64>().map_err(|_| bad())? / 1000.0,
        None => s.parse::<f64>().map_err(|_| bad())?,
    };
    if cores.is_nan() || cores <= 0.0 {
        return Err(bad());
    }
    let host = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
    Ok((cores.ceil() as u32).clamp(1, host))
}

fn list(daemon: &Arc<Daemon>, query: Option<&str>) -> ApiResult {
    let q = http::query_pairs(query)?;
    // Free strings, matched ignoring case, repeated to OR them; a state
    // pvisor never uses (`Allocated`) matches nothing rather than failing
    // (reference: `matches_filter` in server/opensandbox_server/services/
    // helpers.py at 4db3a99; the spec asks clients and servers to tolerate
    // new states).
    let states: Vec<String> = http::query_all(&q, "state").iter().map(|s| s.to_ascii_lowercase()).collect();
    // `metadata=k%3Dv%26k2%3Dv2`: one already-decoded `k=v&k2=v2` string.
    let mut wanted = Vec::new();
    if let Some(m) = http::query_one(&q, "metadata") {
        for pair in m.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| ApiError::bad_request(format!("metadata filter {pair:?} is not key=value")))?;
            wanted.push((http::percent_decode(k)?, http::percent_decode(v)?));
        }
    }
    let mut items: Vec<SandboxRecord> = daemon
        .list()
        .into_iter()
        .filter(|r| !r.deleted)
        .filter(|r| states.is_empty() || states.contains(&r.state.as_str().to_ascii_lowercase()))
        .filter(|r| wanted.iter().all(|(k, v)| r.metadata.get(k) == Some(v)))
        .collect();
    items.sort_by_key(|r| std::cmp::Reverse(r.created_at));
    let items: Vec<Value> = items.iter().map(sandbox_json).collect();
    Ok(json(StatusCode::OK, &http::page_of(&q, items)?))
}

fn patch_metadata(daemon: &Arc<Daemon>, id: &str, body: &[u8]) -> ApiResult {
    let patch: BTreeMap<String, Option<String>> =
        http::parse_json(body, "metadata merge patch (string or null values)")?;
    for key in patch.keys() {
        if key.starts_with("opensandbox.io/") {
            return Err(ApiError::bad_request(format!(
                "metadata key {key:?} uses the reserved opensandbox.io/ prefix"
            )));
        }
    }
    let record = daemon.update(id, |r| {
        if r.state.is_final() {
            return Err(OpError::Conflict(format!("sandbox {id} is {}", r.state.as_str())));
        }
        for (k, v) in patch {
            match v {
                Some(v) => r.metadata.insert(k, v),
                None => r.metadata.remove(&k),
            };
        }
        Ok(r.clone())
    })?;
    Ok(json(StatusCode::OK, &sandbox_json(&record)))
}

fn renew(daemon: &Arc<Daemon>, id: &str, body: &[u8]) -> ApiResult {
    let b: RenewBody = http::parse_json(body, "RenewSandboxExpirationRequest")?;
    let at = http::parse_rfc3339(&b.expires_at).ok_or_else(|| {
        ApiError::bad_request(format!("expiresAt {:?} is not an RFC 3339 time", b.expires_at))
    })?;
    if at <= std::time::SystemTime::now() {
        return Err(ApiError::bad_request("New expiration time must be in the future."));
    }
    let max = daemon.config.max_timeout;
    if at.duration_since(std::time::SystemTime::now()).unwrap_or_default() > max {
        return Err(ApiError::bad_request(format!(
            "expiresAt is beyond this server's maximum timeout of {} s",
            max.as_secs()
        )));
    }
    let at = pvisor_core::time::Timestamp::from(at);
    let record = daemon.update(id, |r| {
        if !matches!(
            r.state,
            SandboxState::Running
                | SandboxState::Paused
                | SandboxState::Pending
                | SandboxState::Pausing
                | SandboxState::Resuming
        ) {
            return Err(OpError::Conflict(format!(
                "sandbox {id} is {}; only a live sandbox can be renewed",
                r.state.as_str()
            )));
        }
        // Any future time, earlier than the current expiry too: the
        // reference servers check only that it is in the future
        // (`ensure_future_expiration`, server/opensandbox_server/services/
        // validators.py at 4db3a99), and the SDK's SandboxPool renews warm
        // 24 h sandboxes down to the caller's timeout. The spec's "after the
        // current expiresAt" is not what they do (docs/serve.md).
        r.expires_at = Some(at);
        Ok(r.clone())
    })?;
    Ok(json(StatusCode::OK, &json!({ "expiresAt": record.expires_at.map(|t| t.to_string()) })))
}

fn endpoint(
    daemon: &Arc<Daemon>,
    id: &str,
    port: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> ApiResult {
    let record = daemon.get(id)?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p >= 1)
        .ok_or_else(|| ApiError::bad_request(format!("port {port:?} must be 1-65535")))?;
    let q = http::query_pairs(query)?;
    // `use_server_proxy=true`: the path through this server, as the
    // reference's `get_sandbox_endpoint` builds it (`{host}/sandboxes/{id}/
    // proxy/{port}`, server/opensandbox_server/api/lifecycle.py at 4db3a99).
    // pvisor relays every port through itself anyway; both paths work.
    let server_proxy =
        http::query_one(&q, "use_server_proxy").is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    if http::query_one(&q, "expires").is_some() {
        return Err(ApiError::bad_request(if server_proxy {
            "use_server_proxy cannot be combined with expires"
        } else {
            "signed endpoints (expires=) are not supported; endpoints carry an access token header instead"
        }));
    }
    if record.state.is_final() {
        return Err(ApiError::not_found(format!("sandbox {id} is {}", record.state.as_str())));
    }
    // The address the client reached us on, so the endpoint works through it.
    let host = headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or("127.0.0.1").to_owned();
    // Every port of the sandbox (execd, or a service it runs) needs its token.
    let body = json!({
        "endpoint": format!("{host}/sandboxes/{id}/{}/{port}", if server_proxy { "proxy" } else { "port" }),
        "headers": { "X-EXECD-ACCESS-TOKEN": record.token },
    });
    Ok(json(StatusCode::OK, &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_limits_parse_like_kubernetes() {
        assert_eq!(parse_memory_mib("512Mi").unwrap(), 512);
        assert_eq!(parse_memory_mib("2Gi").unwrap(), 2048);
        assert!(parse_memory_mib("1Ti").is_err());
        assert!(parse_memory_mib("lots").is_err());
        assert_eq!(parse_cpus("500m").unwrap(), 1);
        assert!(parse_cpus("0").is_err());
    }
}
