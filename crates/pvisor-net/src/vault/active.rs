//! The vault as the proxy uses it: compiled bindings with their headers
//! rendered, chosen per request, and the values to redact from responses.
//!
//! Boundary: matching a request to at most one binding (the reference's
//! mitmproxy addon, components/egress/mitmscripts/system.py:
//! `_select_binding`, `request`, `_redact_response_headers`), putting its
//! headers in, and the live copy a running proxy reads. It travels from a
//! frontend to the Job's Session over the control socket (a local socket
//! only the Job's user or root may open), so it serializes, values
//! included; `Debug` never shows them and nothing records them.

use std::sync::{Arc, RwLock};

use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};

use super::tls::{VaultCa, VaultTls};
use super::{host_matches, Match};
use crate::broker::BrokerError;

/// What replaces a value a response header echoes.
pub const REDACTED: &str = "[REDACTED]";

/// The bindings of one vault revision, ready to inject.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct ActiveVault {
    revision: i64,
    bindings: Vec<ActiveBinding>,
    redactions: Vec<String>,
    /// The sandbox's CA, for https bindings (none: they are not terminated).
    #[serde(default)]
    ca: Option<VaultCa>,
}

/// One binding: what it matches, and the headers (name, value) it sets.
#[derive(Clone, Serialize, Deserialize)]
pub struct ActiveBinding {
    name: String,
    #[serde(rename = "match")]
    matcher: Match,
    headers: Vec<(String, String)>,
}

impl std::fmt::Debug for ActiveVault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.bindings.iter().map(|b| b.name.as_str()).collect();
        f.debug_struct("ActiveVault").field("revision", &self.revision).field("bindings", &names).finish()
    }
}

/// The request a binding is chosen for.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// `http` or `https`: what the sandbox spoke to the proxy.
    pub scheme: &'a str,
    pub host: &'a str,
    pub port: u16,
    pub method: &'a str,
    /// The path, query included or not (it is cut off here).
    pub path: &'a str,
}

/// What the vault says of a request.
#[derive(Debug)]
pub enum Selection<'a> {
    /// No binding matches: the request leaves as the sandbox sent it.
    None,
    Bound(&'a ActiveBinding),
    /// More than one binding matches at the best precedence: the reference
    /// refuses the request (403 "credential binding ambiguous").
    Ambiguous,
}

/// One injection, as recorded in the Trace: the binding and where it
/// went, never a value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Injection {
    pub binding: String,
    pub revision: i64,
    pub host: String,
    pub port: u16,
    pub method: String,
    pub headers: Vec<String>,
}

impl std::fmt::Debug for ActiveBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("ActiveBinding").field("name", &self.name).field("headers", &names).finish()
    }
}

impl ActiveBinding {
    pub(super) fn new(name: String, matcher: Match, headers: Vec<(String, String)>) -> Self {
        Self { name, matcher, headers }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host precedence at which this binding matches `request`: 2 for
    /// an exact host, 1 for a `*.` one, `None` when it does not match.
    fn precedence(&self, request: &Request<'_>) -> Option<u8> {
        let m = &self.matcher;
        let path = request.path.split('?').next().filter(|p| !p.is_empty()).unwrap_or("/");
        // A path the upstream may resolve elsewhere (`/v1/../admin`,
        // `%2e%2e`, `%2f`, `\\`, `;`) matches no narrower pattern than `/*`:
        // a prefix must not be escaped after the match.
        let ambiguous = ambiguous_path(path);
        let path_matches = |p: &String| match p.strip_suffix('*') {
            Some("/") => true,
            _ if ambiguous => false,
            Some(prefix) => path.starts_with(prefix),
            None => path == p,
        };
        let applies = m.schemes.iter().any(|s| s == request.scheme)
            && m.ports.contains(&i64::from(request.port))
            && m.methods.iter().any(|v| v.eq_ignore_ascii_case(request.method))
            && m.paths.iter().any(path_matches);
        if !applies {
            return None;
        }
        let host = normalized_host(request.host);
        m.hosts
            .iter()
            .filter(|pattern| host_matches(&host, pattern))
            .map(|pattern| if pattern.starts_with("*.") { 1 } else { 2 })
            .max()
    }
}

/// Whether `path` holds something an upstream may resolve to another path:
/// a dot segment, an encoded dot, slash or backslash, a backslash, or a
/// `;` parameter.
fn ambiguous_path(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    path.split('/').any(|segment| segment == "." || segment == "..")
        || ["%2e", "%2f", "%5c", "\\", ";"].iter().any(|s| lower.contains(s))
}

fn normalized_host(host: &str) -> String {
    host.trim_start_matches('[').trim_end_matches(']').trim_end_matches('.').to_ascii_lowercase()
}

impl ActiveVault {
    pub(super) fn new(revision: i64, bindings: Vec<ActiveBinding>, mut redactions: Vec<String>) -> Self {
        // An upstream may echo a value without the spaces it was stored with.
        let trimmed: Vec<String> = redactions.iter().map(|v| v.trim().to_owned()).collect();
        redactions.extend(trimmed);
        redactions.retain(|v| !v.is_empty());
        // Longest first: a rendered "Bearer v" goes before the bare "v" would split it.
        redactions.sort_by_key(|v| std::cmp::Reverse(v.len()));
        redactions.dedup();
        Self { revision, bindings, redactions, ca: None }
    }

    /// This vault, terminating TLS for its https bindings with `ca`.
    pub fn with_ca(mut self, ca: VaultCa) -> Self {
        self.ca = Some(ca);
        self
    }

    pub fn revision(&self) -> i64 {
        self.revision
    }

    pub fn binding_names(&self) -> Vec<String> {
        self.bindings.iter().map(|b| b.name.clone()).collect()
    }

    /// The one binding for `request`, if any (the reference's `_select_binding`).
    pub fn select(&self, request: &Request<'_>) -> Selection<'_> {
        let matched: Vec<(u8, &ActiveBinding)> =
            self.bindings.iter().filter_map(|b| b.precedence(request).map(|p| (p, b))).collect();
        let Some(best) = matched.iter().map(|(p, _)| *p).max() else { return Selection::None };
        let mut top = matched.iter().filter(|(p, _)| *p == best);
        match (top.next(), top.next()) {
            (Some((_, binding)), None) => Selection::Bound(binding),
            _ => Selection::Ambiguous,
        }
    }

    /// Whether a connection to `host:port` speaking `scheme` may carry a
    /// request some binding matches, so the proxy must read it: any binding
    /// for that scheme, host and port, whatever its methods and paths.
    pub fn intercepts(&self, scheme: &str, host: &str, port: u16) -> bool {
        let host = normalized_host(host);
        self.bindings.iter().any(|b| {
            b.matcher.schemes.iter().any(|s| s == scheme)
                && b.matcher.ports.contains(&i64::from(port))
                && b.matcher.hosts.iter().any(|p| host_matches(&host, p))
        })
    }

    /// Sets `binding`'s headers on `headers`, each replacing every header
    /// of that name the sandbox sent; returns what it records.
    pub fn inject(
        &self,
        binding: &ActiveBinding,
        headers: &mut HeaderMap,
        request: &Request<'_>,
    ) -> Injection {
        let mut names = Vec::new();
        for (name, value) in &binding.headers {
            let (Ok(name), Ok(mut value)) =
                (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value))
            else {
                continue;
            };
            value.set_sensitive(true);
            headers.insert(name.clone(), value);
            names.push(name.as_str().to_owned());
        }
        Injection {
            binding: binding.name.clone(),
            revision: self.revision,
            host: request.host.to_owned(),
            port: request.port,
            method: request.method.to_owned(),
            headers: names,
        }
    }

    /// Replaces every value (and rendered `Bearer`/`Basic` header) a
    /// response header echoes with [`REDACTED`].
    pub fn redact(&self, headers: &mut HeaderMap) {
        for (_, value) in headers.iter_mut() {
            // On bytes: a value beside a non-ASCII byte is redacted too.
            let mut redacted = value.as_bytes().to_vec();
            for secret in &self.redactions {
                redacted = replace_bytes(&redacted, secret.as_bytes(), REDACTED.as_bytes());
            }
            if redacted != value.as_bytes() {
                *value = HeaderValue::from_bytes(&redacted).unwrap_or(HeaderValue::from_static(REDACTED));
            }
        }
    }
}

fn replace_bytes(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut rest = haystack;
    while let Some(at) = rest.windows(needle.len()).position(|w| w == needle) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(with);
        rest = &rest[at + needle.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// The vault a running proxy injects from, replaceable as a whole; empty
/// until a frontend puts one in.
#[derive(Debug, Default)]
pub struct LiveVault {
    current: RwLock<Option<Arc<ActiveVault>>>,
    /// The TLS of the last CA put in force, kept across vault changes (its
    /// leaves with it) while the CA stays the same.
    tls: RwLock<Option<Arc<VaultTls>>>,
}

impl LiveVault {
    /// The vault now: what a request that asks now is decided by.
    pub fn current(&self) -> Option<Arc<ActiveVault>> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// What TLS to a vault-bound host is terminated with, if the vault in
    /// force has a CA.
    pub(crate) fn tls(&self) -> Option<Arc<VaultTls>> {
        self.current().and_then(|v| v.ca.as_ref().map(|_| ()))?;
        self.tls.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Puts `vault` in force (`None`: the vault was deleted); refused,
    /// changing nothing, if its CA's key is unusable.
    pub fn replace(&self, vault: Option<ActiveVault>) -> Result<(), BrokerError> {
        if let Some(ca) = vault.as_ref().and_then(|v| v.ca.as_ref()) {
            let mut tls = self.tls.write().unwrap_or_else(|p| p.into_inner());
            if tls.as_ref().is_none_or(|t| t.ca() != ca) {
                *tls = Some(Arc::new(VaultTls::new(ca)?));
            }
        }
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = vault.map(Arc::new);
        Ok(())
    }
}
