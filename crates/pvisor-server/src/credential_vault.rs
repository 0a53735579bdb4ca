//! The egress sidecar's credential vault API (`/credential-vault`, reached
//! like `/policy` at a sandbox's port 18080): what the SDKs'
//! `sandbox.credential_vault.create/patch/get/delete` call.
//!
//! Boundary: the routes, and where a sandbox's vault lives — this daemon's
//! memory, never a record or a log, so a daemon restart forgets it (the
//! client creates it again). Every change goes to the running Job's proxy
//! ([`pvisor::actions::ChangeCredentialVault`]) before it is kept, so
//! nothing is accepted that is not in force, and a resumed sandbox gets its
//! vault again ([`reapply`]). The rules themselves are
//! [`pvisor_net::vault`]'s. The reference is components/egress/policy_server.go
//! (`handleCredentialVault*`: 201 on create, 204 on delete, 404 without a
//! vault, 409 for an existing one or a stale `expectedRevision`, 400
//! otherwise; `_active` is forbidden from outside).
//!
//! HTTPS: each such sandbox gets a CA of its own when it first runs
//! ([`install_ca`]): its certificate is written where the reference's
//! execd bootstrap puts its proxy's (`/opt/opensandbox/mitmproxy-ca-cert.pem`,
//! and a bundle of the image's roots plus it), and every command's
//! environment points TLS clients there ([`TRUST_ENV`]). Its key stays in
//! this daemon's memory and goes to the Job's proxy with each vault.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use hyper::body::Bytes;
use hyper::{HeaderMap, Method, StatusCode};
use pvisor_net::vault::{CreateRequest, MutationRequest, Vault, VaultCa, VaultError};
use serde::Serialize;
use serde_json::json;

use crate::http::{self, ApiError, ApiResult};
use crate::sandbox::{Daemon, SandboxRecord, SandboxState};

/// The largest request body read (the reference's `maxCredentialVaultBodyBytes`).
const MAX_BODY: usize = 1 << 20;

/// Where the sandbox's commands find the vault's CA.
pub const CA_FILE: &str = "/opt/opensandbox/mitmproxy-ca-cert.pem";
/// The image's trusted roots and the vault's CA, in one bundle.
pub const MERGED_BUNDLE: &str = "/opt/opensandbox/merged-ca-certificates.pem";
/// The image's own bundle (Debian's layout), merged into [`MERGED_BUNDLE`].
const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The largest system bundle merged (it is the guest's, so untrusted).
const MAX_SYSTEM_BUNDLE: u64 = 8 << 20;

/// What every command of a sandbox with a credential proxy gets: the
/// reference's bootstrap sets the first three; curl, git and pip read
/// their own variables, not OpenSSL's.
pub const TRUST_ENV: [(&str, &str); 6] = [
    ("NODE_EXTRA_CA_CERTS", CA_FILE),
    ("SSL_CERT_FILE", MERGED_BUNDLE),
    ("REQUESTS_CA_BUNDLE", MERGED_BUNDLE),
    ("CURL_CA_BUNDLE", MERGED_BUNDLE),
    ("GIT_SSL_CAINFO", MERGED_BUNDLE),
    ("PIP_CERT", MERGED_BUNDLE),
];

/// One sandbox's vault (once created) and CA (once installed).
#[derive(Debug, Default)]
struct Entry {
    vault: Option<Vault>,
    ca: Option<VaultCa>,
}

/// Every sandbox's vault and CA, by sandbox id, each behind a lock of its
/// own: a change is validated, put in force and kept under it (so two
/// clients cannot interleave), and a stalled guest holds up its own sandbox
/// alone.
#[derive(Debug, Default)]
pub struct Vaults {
    by_sandbox: Mutex<HashMap<String, Arc<Mutex<Entry>>>>,
}

impl Vaults {
    /// Runs `f` on the entry of `id` (empty if there is none), locked.
    fn with<T>(&self, id: &str, f: impl FnOnce(&mut Entry) -> T) -> T {
        let shared = {
            let mut map = self.by_sandbox.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(id.to_owned()).or_default().clone()
        };
        let mut entry = shared.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut entry)
    }

    /// Forgets the vault and CA of a sandbox that ended: its values go with it.
    pub fn forget(&self, id: &str) {
        self.by_sandbox.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    }

    /// Makes a policy change (`apply`) if the vault of `id` holds under
    /// `policy` (the reference's `ValidateActiveAgainstPolicy`: no binding
    /// may lose the allow rule that covers its host). Under the sandbox's
    /// vault lock, so no vault change is validated against the policy it replaces.
    pub fn change_policy<T>(
        &self,
        id: &str,
        policy: &pvisor_net::OrderedPolicy,
        apply: impl FnOnce() -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        self.with(id, |entry| {
            if let Some(vault) = &entry.vault {
                vault.validate(Some(policy)).map_err(|e| {
                    ApiError::bad_request(format!("the credential vault would not hold under it: {e}"))
                })?;
            }
            apply()
        })
    }
}

/// `/credential-vault[/...]` of sandbox `id`, authenticated like execd.
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
    let record = daemon.visible(id)?;
    crate::execd::check_token(&record, headers)?;
    let body = match *method {
        Method::POST | Method::PATCH => http::read_body(body, MAX_BODY).await?,
        _ => Bytes::new(),
    };
    let (daemon, id, method) = (daemon.clone(), id.to_owned(), method.clone());
    let rest: Vec<String> = rest.iter().map(|s| (*s).to_owned()).collect();
    tokio::task::spawn_blocking(move || answer(&daemon, &id, &method, &rest, &body))
        .await
        .map_err(|e| ApiError::internal(format!("worker failed: {e}")))?
}

fn answer(daemon: &Arc<Daemon>, id: &str, method: &Method, rest: &[String], body: &[u8]) -> ApiResult {
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    match (method, &rest[..]) {
        (&Method::GET, ["credential-vault"]) => read(daemon, id, |state| json!(state)),
        (&Method::POST, ["credential-vault"]) => create(daemon, id, body),
        (&Method::PATCH, ["credential-vault"]) => patch(daemon, id, body),
        (&Method::DELETE, ["credential-vault"]) => delete(daemon, id),
        (&Method::GET, ["credential-vault", "credentials"]) => {
            read(daemon, id, |s| json!({ "revision": s.revision, "credentials": s.credentials }))
        }
        (&Method::GET, ["credential-vault", "bindings"]) => {
            read(daemon, id, |s| json!({ "revision": s.revision, "bindings": s.bindings }))
        }
        (&Method::GET, ["credential-vault", "credentials", name]) => {
            one(daemon, id, "credential", |s| find(&s.credentials, name, |c| &c.name))
        }
        (&Method::GET, ["credential-vault", "bindings", name]) => {
            one(daemon, id, "binding", |s| find(&s.bindings, name, |b| &b.name))
        }
        (_, ["credential-vault", "_active"]) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "FORBIDDEN",
            "the active vault (with its values) is never served",
        )),
        (_, ["credential-vault", ..]) if rest.len() <= 3 => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "METHOD_NOT_ALLOWED",
            format!(
                "{method} /{}: /credential-vault answers GET, POST, PATCH and DELETE; its sub-resources GET",
                rest.join("/")
            ),
        )),
        _ => Err(ApiError::not_found(format!("/{}: no such credential vault resource", rest.join("/")))),
    }
}

fn find<T: Serialize>(items: &[T], name: &str, key: impl Fn(&T) -> &String) -> Option<serde_json::Value> {
    items.iter().find(|item| key(item) == name.trim()).map(|item| json!(item))
}

fn no_vault(id: &str) -> ApiError {
    ApiError::not_found(format!(
        "credential vault not found: sandbox {id} has none; POST /credential-vault creates it"
    ))
}

fn read(
    daemon: &Daemon,
    id: &str,
    view: impl Fn(&pvisor_net::vault::State) -> serde_json::Value,
) -> ApiResult {
    let state = daemon.vaults.with(id, |e| e.vault.as_ref().map(Vault::state)).ok_or_else(|| no_vault(id))?;
    Ok(http::json(StatusCode::OK, &view(&state)))
}

fn one(
    daemon: &Daemon,
    id: &str,
    what: &str,
    pick: impl Fn(&pvisor_net::vault::State) -> Option<serde_json::Value>,
) -> ApiResult {
    let state = daemon.vaults.with(id, |e| e.vault.as_ref().map(Vault::state)).ok_or_else(|| no_vault(id))?;
    let found = pick(&state).ok_or_else(|| ApiError::not_found(format!("{what} not found")))?;
    Ok(http::json(StatusCode::OK, &found))
}

/// The record of a sandbox whose vault may change now: created with
/// `credentialProxy.enabled` and Running (its Job's proxy takes the change).
fn writable(daemon: &Daemon, id: &str) -> Result<SandboxRecord, ApiError> {
    let record = daemon.visible(id)?;
    if !record.credential_proxy {
        return Err(ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "PRECONDITION_FAILED",
            format!("sandbox {id} was created without credentialProxy.enabled: create it with {{\"credentialProxy\": {{\"enabled\": true}}}} to use a credential vault"),
        ));
    }
    if record.state != SandboxState::Running {
        return Err(ApiError::conflict(format!(
            "sandbox {id} is {}; its credential vault changes while it is Running",
            record.state.as_str()
        )));
    }
    Ok(record)
}

fn refused(e: VaultError) -> ApiError {
    if e.is_conflict() {
        ApiError::conflict(e.to_string())
    } else {
        ApiError::bad_request(e.to_string())
    }
}

/// Puts `vault` in force in the sandbox's Job (`None`: no vault), its
/// https bindings terminated with `ca`.
fn put_in_force(
    daemon: &Daemon,
    record: &SandboxRecord,
    vault: Option<&Vault>,
    ca: Option<&VaultCa>,
) -> Result<(), ApiError> {
    let job = record
        .job
        .clone()
        .ok_or_else(|| ApiError::conflict(format!("sandbox {} has no Job yet", record.id)))?;
    let vault = vault.map(|v| match ca {
        Some(ca) => v.active().with_ca(ca.clone()),
        None => v.active(),
    });
    daemon
        .runtime
        .execute(pvisor::actions::ChangeCredentialVault { job, vault })
        .map_err(|e| ApiError::conflict(e.to_string()))
}

fn create(daemon: &Daemon, id: &str, body: &[u8]) -> ApiResult {
    let request: CreateRequest = parse(body, "credential vault request")?;
    daemon.vaults.with(id, |entry| {
        let record = writable(daemon, id)?;
        if entry.vault.is_some() {
            return Err(ApiError::conflict(
                "credential vault already exists; PATCH changes it, DELETE removes it",
            ));
        }
        let vault = Vault::create(request, record.network_policy.as_ref()).map_err(refused)?;
        if entry.ca.is_none() {
            // This daemon restarted since the sandbox first ran: a new CA.
            let attempt = record.generations.last().map_or(1, |g| g.attempt);
            entry.ca = Some(install(daemon, id, attempt)?);
        }
        put_in_force(daemon, &record, Some(&vault), entry.ca.as_ref())?;
        let state = vault.state();
        entry.vault = Some(vault);
        Ok(http::json(StatusCode::CREATED, &state))
    })
}

fn patch(daemon: &Daemon, id: &str, body: &[u8]) -> ApiResult {
    let request: MutationRequest = parse(body, "credential vault mutation request")?;
    daemon.vaults.with(id, |entry| {
        let record = writable(daemon, id)?;
        let current = entry.vault.as_ref().ok_or_else(|| no_vault(id))?;
        let next = current.patch(request, record.network_policy.as_ref()).map_err(refused)?;
        put_in_force(daemon, &record, Some(&next), entry.ca.as_ref())?;
        let state = next.state();
        entry.vault = Some(next);
        Ok(http::json(StatusCode::OK, &state))
    })
}

fn delete(daemon: &Daemon, id: &str) -> ApiResult {
    daemon.vaults.with(id, |entry| {
        let record = writable(daemon, id)?;
        if entry.vault.is_none() {
            return Err(no_vault(id));
        }
        put_in_force(daemon, &record, None, None)?;
        entry.vault = None;
        Ok(http::empty(StatusCode::NO_CONTENT))
    })
}

/// A request body, or a 400 that says where it is malformed and never
/// quotes it (serde's messages quote the offending value, which may be a
/// credential, and refusals are logged).
fn parse<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let kind = match e.classify() {
            serde_json::error::Category::Io | serde_json::error::Category::Eof => "it ends early",
            serde_json::error::Category::Syntax => "it is not JSON",
            serde_json::error::Category::Data => "a field is unknown, missing or of the wrong type",
        };
        ApiError::bad_request(format!(
            "invalid {what} at line {} column {}: {kind} (the spec's CredentialVaultCreateRequest or MutationRequest)",
            e.line(),
            e.column()
        ))
    })
}

/// Puts a resumed sandbox's vault in force again: the new Attempt's proxy
/// starts without one (its values were never recorded).
pub fn reapply(daemon: &Daemon, id: &str) {
    daemon.vaults.with(id, |entry| {
        let Some(vault) = &entry.vault else { return };
        let Ok(record) = daemon.get(id) else { return };
        if let Err(e) = put_in_force(daemon, &record, Some(vault), entry.ca.as_ref()) {
            tracing::warn!(sandbox = %id, "the credential vault is not in force after the resume: {}", e.message);
        }
    })
}

/// Withdraws the vault a sandbox's Job may still hold from before this
/// daemon started: its proxy outlived the daemon that put the vault in
/// force, whose values went with it. Left in force, credentials would be
/// injected while the API answers "no vault", and no DELETE could stop
/// them. A vault a client created since is kept.
pub fn withdraw_inherited(daemon: &Daemon, id: &str) {
    let Ok(record) = daemon.get(id) else { return };
    if !record.credential_proxy {
        return;
    }
    daemon.vaults.with(id, |entry| {
        if entry.vault.is_some() {
            return;
        }
        if let Err(e) = put_in_force(daemon, &record, None, None) {
            tracing::warn!(sandbox = %id, "a vault from before the restart may still be in force: {}", e.message);
        }
    })
}

/// Gives a sandbox created with `credentialProxy.enabled` its CA when its
/// first generation, `attempt`, is up (before it reads Running).
pub fn install_ca(daemon: &Daemon, id: &str, attempt: u32) {
    if !daemon.get(id).is_ok_and(|r| r.credential_proxy) {
        return;
    }
    daemon.vaults.with(id, |entry| {
        // A vault created the moment the sandbox ran has installed one already.
        if entry.ca.is_some() {
            return;
        }
        match install(daemon, id, attempt) {
            Ok(ca) => entry.ca = Some(ca),
            Err(e) => {
                tracing::warn!(sandbox = %id, "the credential vault's CA is not installed: {}", e.message)
            }
        }
    })
}

/// Mints a CA and writes it into the sandbox: the certificate alone, and
/// merged with the image's own roots.
fn install(daemon: &Daemon, id: &str, attempt: u32) -> Result<VaultCa, ApiError> {
    let ca = VaultCa::mint().map_err(|e| ApiError::internal(format!("cannot mint the vault's CA: {e}")))?;
    let files = crate::execd::DaemonFiles::of_generation(daemon, id, attempt)?;
    // An image without the bundle (or with one past the limit) gets the CA alone.
    let mut merged = files.read(SYSTEM_BUNDLE, MAX_SYSTEM_BUNDLE).ok().flatten().unwrap_or_default();
    if !merged.is_empty() && !merged.ends_with(b"\n") {
        merged.push(b'\n');
    }
    merged.extend_from_slice(ca.cert_pem().as_bytes());
    files.write(CA_FILE, ca.cert_pem().as_bytes(), 0o644)?;
    files.write(MERGED_BUNDLE, &merged, 0o644)?;
    Ok(ca)
}
