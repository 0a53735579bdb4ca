//! The credential vault (OpenSandbox's egress `/credential-vault` API): named
//! secrets and the bindings that say which requests get them, as which
//! headers.
//!
//! Boundary: the vault's rules only — normalizing what a client sends,
//! applying a mutation to a copy (so a refused one changes nothing),
//! validating the result against the sandbox's ordered network policy, and
//! the sanitized state a client may read. It holds values in memory and
//! never serializes them: [`Vault::state`] names credentials, and
//! [`Vault::active`] compiles the bindings into the [`ActiveVault`] the
//! proxy injects from ([`active`]). Where the values live between requests
//! (a daemon's memory) is the frontend's business.
//!
//! The reference is the egress sidecar's store
//! (components/egress/pkg/credentialvault/vault.go): its defaults (scheme
//! https, port 443, methods GET POST PUT PATCH DELETE, paths `/*`), its
//! reserved header names, its mutation order (delete, replace, add), its
//! ambiguity rule, and its requirement that an explicit egress allow rule
//! covers every bound host. One divergence: a value no HTTP header can
//! carry (a control character) is refused when it is stored, where the
//! reference would fail the request that carries it.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

use crate::policy::{Decide, Decision, OrderedPolicy, RuleAction};

pub mod active;
pub mod tls;

pub use active::{ActiveBinding, ActiveVault, Injection, LiveVault, Selection};
pub use tls::VaultCa;

/// The ports a binding may name: those the reference's proxy intercepts.
pub const INTERCEPT_PORTS: [u16; 2] = [80, 443];

/// Header names a credential may not be sent as (the reference's list):
/// they frame the message, route it, or belong to a proxy.
const RESERVED_HEADERS: [&str; 14] = [
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "proxy-authorization",
    "proxy-authenticate",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
];

/// Why a vault request was refused; the vault is unchanged. Never carries a value.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum VaultError {
    #[error("expectedRevision {expected} does not match current revision {current}")]
    RevisionMismatch { expected: i64, current: i64 },
    #[error("{what} name cannot be blank")]
    BlankName { what: &'static str },
    #[error("duplicate {what} name {name:?}")]
    Duplicate { what: &'static str, name: String },
    #[error("{what} {name:?} mentioned by multiple operations")]
    MentionedTwice { what: &'static str, name: String },
    #[error("{what} {name:?} does not exist")]
    Missing { what: &'static str, name: String },
    #[error("{what} {name:?} already exists")]
    AlreadyExists { what: &'static str, name: String },
    #[error("credential {name:?}: {why}")]
    Credential { name: String, why: String },
    #[error("binding {name:?}: {why}")]
    Binding { name: String, why: String },
    #[error("binding {binding:?} references unknown credential {credential:?}")]
    UnknownCredential { binding: String, credential: String },
    #[error("binding {binding:?} port {port} is not an intercepted port (80 or 443)")]
    Port { binding: String, port: i64 },
    #[error("credential bindings require explicit networkPolicy.egress allow rules")]
    NoEgressRules,
    #[error(
        "binding {binding:?} host {host:?} is not covered by an explicit allow egress rule; add {{\"action\": \"allow\", \"target\": \"{host}\"}} to the policy first"
    )]
    NotCovered { binding: String, host: String },
    #[error("bindings {0:?} and {1:?} can match the same request")]
    Ambiguous(String, String),
}

impl VaultError {
    /// Whether the reference answers 409 (a stale revision) rather than 400.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::RevisionMismatch { .. })
    }
}

/// `null` reads as the default, as Go's decoder leaves a field it cannot
/// fill: the SDKs send `null` for what they leave out.
fn nullable<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// `POST /credential-vault`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    #[serde(default, deserialize_with = "nullable")]
    pub credentials: Vec<CredentialInput>,
    #[serde(default, deserialize_with = "nullable")]
    pub bindings: Vec<BindingInput>,
}

/// `PATCH /credential-vault`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MutationRequest {
    #[serde(default)]
    pub expected_revision: Option<i64>,
    #[serde(default, deserialize_with = "nullable")]
    pub credentials: MutationSet<CredentialInput>,
    #[serde(default, deserialize_with = "nullable")]
    pub bindings: MutationSet<BindingInput>,
}

/// What one mutation adds, replaces and deletes (by name).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, bound(deserialize = "T: Deserialize<'de>"))]
pub struct MutationSet<T> {
    #[serde(default = "Vec::new", deserialize_with = "nullable")]
    pub add: Vec<T>,
    #[serde(default = "Vec::new", deserialize_with = "nullable")]
    pub replace: Vec<T>,
    #[serde(default, deserialize_with = "nullable")]
    pub delete: Vec<String>,
}

impl<T> Default for MutationSet<T> {
    fn default() -> Self {
        Self { add: Vec::new(), replace: Vec::new(), delete: Vec::new() }
    }
}

/// A credential as a client sends it. `Debug` redacts the value.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialInput {
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub source: SourceInput,
}

impl std::fmt::Debug for CredentialInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialInput").field("name", &self.name).finish_non_exhaustive()
    }
}

/// Where a credential's value comes from: inline, the only source there is.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceInput {
    #[serde(default, rename = "type", deserialize_with = "nullable")]
    pub kind: String,
    #[serde(default, deserialize_with = "nullable")]
    pub value: String,
}

impl std::fmt::Debug for SourceInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceInput").field("kind", &self.kind).finish_non_exhaustive()
    }
}

/// A binding as a client sends it (and, normalized, as it is stored).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindingInput {
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(default, rename = "match", deserialize_with = "nullable")]
    pub matcher: Match,
    #[serde(default, deserialize_with = "nullable")]
    pub auth: Auth,
}

/// Which requests a binding applies to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "Vec::is_empty")]
    pub schemes: Vec<String>,
    /// Wide enough to refuse a bad number by name rather than by type.
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<i64>,
    #[serde(default, deserialize_with = "nullable")]
    pub hosts: Vec<String>,
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
}

/// How a binding's credentials are sent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Auth {
    #[serde(default, rename = "type", deserialize_with = "nullable")]
    pub kind: String,
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "String::is_empty")]
    pub credential: String,
    /// The header of an `apiKey` auth.
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<CustomHeader>,
}

/// One header of a `customHeaders` auth.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomHeader {
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub credential: String,
}

/// A stored credential. `Debug` redacts the value.
#[derive(Clone)]
struct Credential {
    source_type: String,
    value: String,
    revision: i64,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential").field("revision", &self.revision).finish_non_exhaustive()
    }
}

/// The vault of one sandbox: credentials and bindings by name, and the
/// revision every accepted change advances.
#[derive(Clone, Debug)]
pub struct Vault {
    revision: i64,
    credentials: BTreeMap<String, Credential>,
    bindings: BTreeMap<String, BindingInput>,
}

/// What a client may read of a vault: names, revisions, matches and auth
/// types; never a value.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct State {
    pub revision: i64,
    pub credentials: Vec<CredentialMetadata>,
    pub bindings: Vec<BindingMetadata>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialMetadata {
    pub name: String,
    pub source_type: String,
    pub revision: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BindingMetadata {
    pub name: String,
    pub revision: i64,
    #[serde(rename = "match")]
    pub matcher: Match,
    pub auth: AuthMetadata,
}

/// An auth's type, and for `apiKey` its header name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AuthMetadata {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
}

impl Vault {
    /// A new vault at revision 1, or why `request` is refused.
    pub fn create(request: CreateRequest, policy: Option<&OrderedPolicy>) -> Result<Self, VaultError> {
        let mut vault = Self { revision: 1, credentials: BTreeMap::new(), bindings: BTreeMap::new() };
        for input in request.credentials {
            let (name, credential) = normalize_credential(input, 1)?;
            if vault.credentials.insert(name.clone(), credential).is_some() {
                return Err(VaultError::Duplicate { what: "credential", name });
            }
        }
        for input in request.bindings {
            let binding = normalize_binding(input)?;
            if let Some(old) = vault.bindings.insert(binding.name.clone(), binding) {
                return Err(VaultError::Duplicate { what: "binding", name: old.name });
            }
        }
        vault.validate(policy)?;
        Ok(vault)
    }

    /// This vault with `request` applied, at the next revision, or why not.
    pub fn patch(
        &self,
        request: MutationRequest,
        policy: Option<&OrderedPolicy>,
    ) -> Result<Self, VaultError> {
        if let Some(expected) = request.expected_revision {
            if expected != self.revision {
                return Err(VaultError::RevisionMismatch { expected, current: self.revision });
            }
        }
        let mut next = self.clone();
        next.revision += 1;
        let revision = next.revision;
        apply(&mut next.credentials, request.credentials, "credential", |input| {
            normalize_credential(input, revision)
        })?;
        apply(&mut next.bindings, request.bindings, "binding", |input| {
            normalize_binding(input).map(|b| (b.name.clone(), b))
        })?;
        next.validate(policy)?;
        Ok(next)
    }

    /// Checks the vault against `policy`: a policy change that would leave
    /// a bound host uncovered is refused with this.
    pub fn validate(&self, policy: Option<&OrderedPolicy>) -> Result<(), VaultError> {
        if self.bindings.is_empty() {
            return Ok(());
        }
        let policy = policy.filter(|p| !p.rules.is_empty()).ok_or(VaultError::NoEgressRules)?;
        for binding in self.bindings.values() {
            for credential in credential_refs(&binding.auth) {
                if !self.credentials.contains_key(credential) {
                    return Err(VaultError::UnknownCredential {
                        binding: binding.name.clone(),
                        credential: credential.to_owned(),
                    });
                }
            }
            if let Some(&port) =
                binding.matcher.ports.iter().find(|p| !INTERCEPT_PORTS.contains(&(**p as u16)))
            {
                return Err(VaultError::Port { binding: binding.name.clone(), port });
            }
            if let Some(host) = binding.matcher.hosts.iter().find(|h| !allow_rule_covers(policy, h)) {
                return Err(VaultError::NotCovered { binding: binding.name.clone(), host: host.clone() });
            }
        }
        let all: Vec<&BindingInput> = self.bindings.values().collect();
        for (i, a) in all.iter().enumerate() {
            if let Some(b) = all[i + 1..].iter().find(|b| ambiguous(&a.matcher, &b.matcher)) {
                return Err(VaultError::Ambiguous(a.name.clone(), b.name.clone()));
            }
        }
        Ok(())
    }

    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// The sanitized state, sorted by name; a binding's revision is the
    /// vault's (as the reference reports it).
    pub fn state(&self) -> State {
        let credentials = self.credentials.iter().map(|(name, c)| CredentialMetadata {
            name: name.clone(),
            source_type: c.source_type.clone(),
            revision: c.revision,
        });
        let bindings = self.bindings.values().map(|b| BindingMetadata {
            name: b.name.clone(),
            revision: self.revision,
            matcher: b.matcher.clone(),
            auth: AuthMetadata {
                kind: b.auth.kind.clone(),
                name: if b.auth.kind == "apiKey" { b.auth.name.clone() } else { String::new() },
            },
        });
        State { revision: self.revision, credentials: credentials.collect(), bindings: bindings.collect() }
    }

    /// The bindings compiled for the proxy: each with the headers it sets
    /// (values rendered), and every value to redact from responses.
    pub fn active(&self) -> ActiveVault {
        let value = |name: &str| self.credentials.get(name).map_or("", |c| c.value.as_str()).to_owned();
        let mut redactions = Vec::new();
        let bindings = self.bindings.values().map(|b| {
            let headers: Vec<(String, String)> = match b.auth.kind.as_str() {
                "bearer" | "basic" => {
                    let scheme = if b.auth.kind == "bearer" { "Bearer" } else { "Basic" };
                    let rendered = format!("{scheme} {}", value(&b.auth.credential));
                    redactions.extend([value(&b.auth.credential), rendered.clone()]);
                    vec![("Authorization".into(), rendered)]
                }
                "apiKey" => {
                    redactions.push(value(&b.auth.credential));
                    vec![(b.auth.name.clone(), value(&b.auth.credential))]
                }
                _ => b
                    .auth
                    .headers
                    .iter()
                    .map(|h| {
                        redactions.push(value(&h.credential));
                        (h.name.clone(), value(&h.credential))
                    })
                    .collect(),
            };
            ActiveBinding::new(b.name.clone(), b.matcher.clone(), headers)
        });
        let bindings = bindings.collect();
        ActiveVault::new(self.revision, bindings, redactions)
    }
}

/// Applies `set` to `map` in the reference's order: deletes, replaces,
/// adds; a name may appear in one operation only.
fn apply<T, I>(
    map: &mut BTreeMap<String, T>,
    set: MutationSet<I>,
    what: &'static str,
    normalize: impl Fn(I) -> Result<(String, T), VaultError>,
) -> Result<(), VaultError> {
    let mut mentioned: Vec<String> = Vec::new();
    let mut mention = |name: &str| {
        if mentioned.iter().any(|m| m == name) {
            return Err(VaultError::MentionedTwice { what, name: name.to_owned() });
        }
        mentioned.push(name.to_owned());
        Ok(())
    };
    for name in set.delete {
        let name = name.trim().to_owned();
        if name.is_empty() {
            return Err(VaultError::BlankName { what });
        }
        mention(&name)?;
        map.remove(&name).ok_or_else(|| VaultError::Missing { what, name: name.clone() })?;
    }
    for input in set.replace {
        let (name, item) = normalize(input)?;
        mention(&name)?;
        if !map.contains_key(&name) {
            return Err(VaultError::Missing { what, name });
        }
        map.insert(name, item);
    }
    let before_adds = mentioned.len();
    for input in set.add {
        let (name, item) = normalize(input)?;
        if mentioned[..before_adds].contains(&name) {
            return Err(VaultError::MentionedTwice { what, name });
        }
        if mentioned[before_adds..].contains(&name) {
            return Err(VaultError::Duplicate { what, name });
        }
        mentioned.push(name.clone());
        if map.contains_key(&name) {
            return Err(VaultError::AlreadyExists { what, name });
        }
        map.insert(name, item);
    }
    Ok(())
}

fn normalize_credential(input: CredentialInput, revision: i64) -> Result<(String, Credential), VaultError> {
    let name = input.name.trim().to_owned();
    if name.is_empty() {
        return Err(VaultError::BlankName { what: "credential" });
    }
    let why = |why: &str| VaultError::Credential { name: name.clone(), why: why.to_owned() };
    let source_type = match input.source.kind.trim() {
        "" | "inline" => "inline".to_owned(),
        // Not quoted: a client that swapped `type` and `value` would see its value logged.
        _ => return Err(why("unsupported credential source type (only \"inline\")")),
    };
    let value = input.source.value;
    if value.is_empty() {
        return Err(why("inline value cannot be empty"));
    }
    if hyper::header::HeaderValue::from_str(&value).is_err() {
        return Err(why(
            "the value has a control character or non-ASCII byte, which no HTTP header can carry",
        ));
    }
    Ok((name, Credential { source_type, value, revision }))
}

fn normalize_binding(mut b: BindingInput) -> Result<BindingInput, VaultError> {
    b.name = b.name.trim().to_owned();
    if b.name.is_empty() {
        return Err(VaultError::BlankName { what: "binding" });
    }
    let name = b.name.clone();
    let why = |why: String| VaultError::Binding { name: name.clone(), why };
    normalize_match(&mut b.matcher).map_err(why)?;
    normalize_auth(&mut b.auth).map_err(why)?;
    Ok(b)
}

fn normalize_match(m: &mut Match) -> Result<(), String> {
    let or_default = |v: &mut Vec<String>, default: &[&str]| {
        if v.is_empty() {
            *v = default.iter().map(|s| (*s).to_owned()).collect();
        }
    };
    or_default(&mut m.schemes, &["https"]);
    or_default(&mut m.methods, &["GET", "POST", "PUT", "PATCH", "DELETE"]);
    or_default(&mut m.paths, &["/*"]);
    if m.ports.is_empty() {
        m.ports = vec![443];
    }
    if m.hosts.is_empty() {
        return Err("match.hosts cannot be empty".into());
    }
    for scheme in &mut m.schemes {
        *scheme = scheme.trim().to_ascii_lowercase();
        if scheme != "https" && scheme != "http" {
            return Err(format!("unsupported scheme {scheme:?} (http or https)"));
        }
    }
    if let Some(port) = m.ports.iter().find(|p| !(1..=65535).contains(*p)) {
        return Err(format!("invalid port {port}"));
    }
    for host in &mut m.hosts {
        *host = normalize_host(host)?;
    }
    for method in &mut m.methods {
        *method = method.trim().to_ascii_uppercase();
        if method.is_empty() {
            return Err("method cannot be blank".into());
        }
    }
    for path in &mut m.paths {
        *path = path.trim().to_owned();
        if !path.starts_with('/') {
            return Err(format!("path pattern {path:?} must start with /"));
        }
    }
    dedupe(&mut m.schemes);
    dedupe(&mut m.ports);
    dedupe(&mut m.hosts);
    dedupe(&mut m.methods);
    dedupe(&mut m.paths);
    Ok(())
}

fn dedupe<T: PartialEq + Clone>(values: &mut Vec<T>) {
    let mut seen: Vec<T> = Vec::with_capacity(values.len());
    values.retain(|v| {
        let fresh = !seen.contains(v);
        if fresh {
            seen.push(v.clone());
        }
        fresh
    });
}

/// A bound host: a lowercase FQDN, or `*.` and one; never an address.
fn normalize_host(host: &str) -> Result<String, String> {
    let host = host.trim().trim_end_matches('.').to_ascii_lowercase();
    if host.is_empty() {
        return Err("host cannot be blank".into());
    }
    if host.contains('/') {
        return Err(format!("host {host:?} must not include scheme or path"));
    }
    let (wild, name) = match host.strip_prefix("*.") {
        Some(suffix) => (true, suffix),
        None => (false, host.as_str()),
    };
    if name.parse::<std::net::IpAddr>().is_ok() {
        return Err(format!("credential binding host {host:?} must be an FQDN, not an IP address"));
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.len() > 253 || !name.contains('.') || !name.split('.').all(label_ok) {
        let kind = if wild { "invalid wildcard host" } else { "credential binding host must be an FQDN:" };
        return Err(format!("{kind} {host:?}"));
    }
    Ok(host)
}

fn normalize_auth(a: &mut Auth) -> Result<(), String> {
    a.kind = a.kind.trim().to_owned();
    a.credential = a.credential.trim().to_owned();
    match a.kind.as_str() {
        "bearer" | "basic" | "apiKey" => {
            if a.kind == "apiKey" {
                a.name = header_name(&a.name)?;
            }
            if a.credential.is_empty() {
                return Err(format!("{} auth requires credential", a.kind));
            }
        }
        "customHeaders" => {
            if a.headers.is_empty() {
                return Err("customHeaders auth requires headers".into());
            }
            let mut seen = Vec::new();
            for h in &mut a.headers {
                h.name = header_name(&h.name)?;
                h.credential = h.credential.trim().to_owned();
                if seen.contains(&h.name.to_ascii_lowercase()) {
                    return Err(format!("duplicate custom header name {:?}", h.name));
                }
                seen.push(h.name.to_ascii_lowercase());
                if h.credential.is_empty() {
                    return Err(format!("customHeaders entry {:?} requires credential", h.name));
                }
            }
        }
        other => {
            return Err(format!("unsupported auth type {other:?} (bearer, basic, apiKey or customHeaders)"))
        }
    }
    Ok(())
}

/// A header name as the reference stores it (canonical case, as Go's
/// `CanonicalHeaderKey`), valid and not reserved.
fn header_name(name: &str) -> Result<String, String> {
    let name = name.trim();
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || !name.bytes().all(token) {
        return Err(format!("invalid credential header name {name:?}"));
    }
    if RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
        return Err(format!("reserved credential header name {name:?}"));
    }
    let mut upper = true;
    Ok(name
        .chars()
        .map(|c| {
            let out = if upper { c.to_ascii_uppercase() } else { c.to_ascii_lowercase() };
            upper = c == '-';
            out
        })
        .collect())
}

fn credential_refs(auth: &Auth) -> Vec<&str> {
    match auth.kind.as_str() {
        "customHeaders" => auth.headers.iter().map(|h| h.credential.as_str()).collect(),
        _ => vec![auth.credential.as_str()],
    }
}

/// The reference's `explicitAllowCoversHost`: an allow rule names the host
/// (or a `*.` rule covers it), and the policy as a whole allows it (a
/// deny rule before it would win).
fn allow_rule_covers(policy: &OrderedPolicy, host: &str) -> bool {
    let probe = match host.strip_prefix("*.") {
        Some(suffix) => format!("probe.{suffix}"),
        None => host.to_owned(),
    };
    let named = policy.rules.iter().any(|r| {
        let target = r.target.trim().trim_end_matches('.').to_ascii_lowercase();
        r.action == RuleAction::Allow
            && (target == host || (target.starts_with("*.") && host_matches(host, &target)))
    });
    named && matches!(policy.decide(&probe, 443), Decision::Allow { .. })
}

/// Whether `host` matches `pattern` (a name, or `*.suffix`, which its apex
/// does not match).
pub(crate) fn host_matches(host: &str, pattern: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(apex) => host.len() > apex.len() + 1 && host.ends_with(&pattern[1..]),
        None => host == pattern,
    }
}

/// The reference's `bindingsAmbiguous`: two bindings could both match one
/// request at the same host precedence.
fn ambiguous(a: &Match, b: &Match) -> bool {
    let overlap = |x: &[String], y: &[String]| x.iter().any(|v| y.contains(v));
    if !overlap(&a.schemes, &b.schemes)
        || !a.ports.iter().any(|p| b.ports.contains(p))
        || !overlap(&a.methods, &b.methods)
        || !a.paths.iter().any(|x| b.paths.iter().any(|y| paths_overlap(x, y)))
    {
        return false;
    }
    a.hosts.iter().any(|x| {
        b.hosts.iter().any(|y| match (x.strip_prefix("*."), y.strip_prefix("*.")) {
            (None, None) => x == y,
            (Some(sx), Some(sy)) => {
                sx == sy || sx.ends_with(&format!(".{sy}")) || sy.ends_with(&format!(".{sx}"))
            }
            _ => false,
        })
    })
}

fn paths_overlap(a: &str, b: &str) -> bool {
    a == b
        || a.strip_suffix('*').is_some_and(|pa| b.starts_with(pa))
        || b.strip_suffix('*').is_some_and(|pb| a.starts_with(pb))
}

#[cfg(test)]
mod tests;
