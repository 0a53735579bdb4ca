//! The credential broker: a secret the sandbox uses but never holds.
//!
//! A [`Binding`] ties a host variable (`ANTHROPIC_API_KEY`) to one
//! destination (`api.anthropic.com`, optionally one port). The sandbox
//! gets a random placeholder in the variable instead of its value; the
//! proxy puts the value back into the headers of requests that go to that
//! destination, and nowhere else. A request carrying the placeholder to any
//! other host leaves with the placeholder, which is worthless there.
//!
//! Boundary: this module holds the values (in memory only, never
//! serialized: [`Binding`]'s `Debug` redacts it) and decides, per request,
//! what to substitute ([`Broker::substitute`]); it never opens a
//! connection. [`tls`] mints the per-run CA and the leaf certificates with
//! which the proxy terminates TLS for bound hosts; [`relay`] serves the
//! HTTP/1.1 exchanges of a bound connection (TLS-terminated or plain) and
//! forwards each request, substituted, to the destination.
//!
//! The same type backs every frontend: `pvisor run --secret` builds one at
//! admission, and a server's credential vault can build one from its own
//! store of values.

use base64::Engine;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use serde::Serialize;

pub(crate) mod relay;
pub mod tls;

/// The prefix of every placeholder: `pvisor-placeholder-` and 32 hex digits.
pub const PLACEHOLDER_PREFIX: &str = "pvisor-placeholder-";

/// Why a `--secret` (or a vault entry) cannot be bound. Never carries a value.
#[derive(Debug, thiserror::Error)]
pub enum BindingError {
    #[error("{spec:?} is not VAR@HOST or VAR@HOST:PORT (e.g. ANTHROPIC_API_KEY@api.anthropic.com)")]
    Syntax { spec: String },
    #[error("{spec:?}: {name:?} is not a variable name (letters, digits and _, not starting with a digit)")]
    Variable { spec: String, name: String },
    #[error(
        "{spec:?}: the host {host:?} is not a DNS name or IP address; a binding names one host, no wildcard"
    )]
    Host { spec: String, host: String },
    #[error("{spec:?}: the port must be a number from 1 to 65535")]
    Port { spec: String },
    #[error(
        "The value of {variable} has a control character or non-ASCII byte, which no HTTP header can carry; check the variable"
    )]
    Value { variable: String },
    #[error("Cannot read random bytes for a placeholder")]
    Random(#[source] getrandom::Error),
}

/// What a `VAR@HOST[:PORT]` asks for, before the value is read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BindingSpec {
    /// The host variable whose value the sandbox must never see.
    pub variable: String,
    /// The one destination the value is sent to (lowercase, no brackets).
    pub host: String,
    /// The port, or `None` for every port of `host`.
    pub port: Option<u16>,
}

impl std::str::FromStr for BindingSpec {
    type Err = BindingError;

    fn from_str(spec: &str) -> Result<Self, BindingError> {
        let syntax = || BindingError::Syntax { spec: spec.to_owned() };
        let (variable, destination) = spec.split_once('@').ok_or_else(syntax)?;
        let valid_name = !variable.is_empty()
            && !variable.starts_with(|c: char| c.is_ascii_digit())
            && variable.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_name {
            return Err(BindingError::Variable { spec: spec.to_owned(), name: variable.to_owned() });
        }
        let (host, port) = split_destination(destination).ok_or_else(syntax)?;
        let port = match port {
            None => None,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 => Some(n),
                _ => return Err(BindingError::Port { spec: spec.to_owned() }),
            },
        };
        let host = host.to_ascii_lowercase();
        let plausible = !host.is_empty()
            && (host.parse::<std::net::IpAddr>().is_ok()
                || host.split('.').all(|label| {
                    !label.is_empty() && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                }));
        if !plausible {
            return Err(BindingError::Host { spec: spec.to_owned(), host });
        }
        Ok(Self { variable: variable.to_owned(), host, port })
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`.
fn split_destination(destination: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = destination.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after {
            "" => Some((host, None)),
            _ => Some((host, Some(after.strip_prefix(':')?))),
        };
    }
    match destination.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => Some((host, Some(port))),
        Some(_) => None,
        None => Some((destination, None)),
    }
}

impl std::fmt::Display for BindingSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        match self.port {
            Some(port) => write!(f, "{}@{host}:{port}", self.variable),
            None => write!(f, "{}@{host}", self.variable),
        }
    }
}

/// One secret bound to one destination: the placeholder the sandbox sees
/// and the value the destination gets.
#[derive(Clone)]
pub struct Binding {
    pub spec: BindingSpec,
    /// What the sandbox's variable holds instead of the value.
    pub placeholder: String,
    value: String,
}

/// Redacts the value: a `Binding` may end up in a log line or a panic.
impl std::fmt::Debug for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binding")
            .field("spec", &self.spec)
            .field("placeholder", &self.placeholder)
            .field("value", &"<redacted>")
            .finish()
    }
}

impl Binding {
    /// Binds `value` to `spec` under a fresh random placeholder. The value
    /// must fit in an HTTP header (visible ASCII and spaces).
    pub fn new(spec: BindingSpec, value: String) -> Result<Self, BindingError> {
        if value.is_empty() || !value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(BindingError::Value { variable: spec.variable });
        }
        Ok(Self { spec, placeholder: placeholder()?, value })
    }

    /// The same variable (value and placeholder) bound to one more
    /// destination: an agent's key sent to its API and to a gateway.
    pub fn also_to(&self, spec: BindingSpec) -> Self {
        Self { spec, placeholder: self.placeholder.clone(), value: self.value.clone() }
    }

    /// Whether a request to `host:port` gets this binding's value.
    pub fn binds(&self, host: &str, port: u16) -> bool {
        self.spec.host.eq_ignore_ascii_case(host.trim_start_matches('[').trim_end_matches(']'))
            && self.spec.port.is_none_or(|p| p == port)
    }

    /// Whether a request to `host:port` in clear text (plain HTTP) gets
    /// the value: only on this machine's loopback, or on a port the
    /// binding names other than 443 (the user asked for that port in clear
    /// text). A binding for every port of a public host, or for its port
    /// 443 (how agent presets and `https://` base URLs bind), never sends
    /// its value unencrypted, whatever URL the command picks: a
    /// `http://api.example.com:443/` would otherwise put the key on the wire.
    pub fn binds_in_clear(&self, host: &str, port: u16) -> bool {
        let named_clear_port = self.spec.port.is_some_and(|p| p != 443);
        self.binds(host, port) && (named_clear_port || is_loopback(&self.spec.host))
    }

    /// The value: for the admission step that keeps it out of every
    /// other variable, never for a record.
    pub fn value(&self) -> &str {
        &self.value
    }
}

/// Whether a request with `method` has its headers echoed back in the
/// response (`TRACE`): sent to a bound host, it would hand the value back
/// to the sandbox, so the proxy refuses it there.
pub fn echoes_headers(method: &hyper::Method) -> bool {
    method.as_str().eq_ignore_ascii_case("TRACE")
}

/// Why a request to a bound host was refused for its method.
pub(crate) const ECHO_REFUSED: &str =
    "pvisor: TRACE to a host a --secret binds is refused: its response would echo the secret's value";

/// Whether `host` names this machine's loopback (`localhost`, 127.0.0.0/8, `::1`).
pub fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// A fresh placeholder: [`PLACEHOLDER_PREFIX`] and 128 random bits in hex,
/// unguessable so a request cannot forge another run's.
fn placeholder() -> Result<String, BindingError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(BindingError::Random)?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{PLACEHOLDER_PREFIX}{hex}"))
}

/// One substitution, as recorded in the Trace: the variable and where it
/// went, never the value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Substitution {
    pub variable: String,
    pub host: String,
    pub port: u16,
    /// The request's method.
    pub method: String,
    /// The names of the headers the value was put in.
    pub headers: Vec<String>,
}

/// Why the broker could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("Cannot mint the per-run certificate authority")]
    Mint(#[source] rcgen::Error),
    #[error("Cannot set up TLS for {host}")]
    Tls {
        host: String,
        #[source]
        source: rustls::Error,
    },
}

/// The bindings of one run (or sandbox), and the TLS authority that lets the
/// proxy read the requests to their hosts.
#[derive(Debug)]
pub struct Broker {
    bindings: Vec<Binding>,
    tls: tls::Authority,
}

impl Broker {
    /// Mints the per-run CA and a leaf certificate for each bound host, and
    /// loads the host's trusted roots to verify those hosts with.
    pub fn new(bindings: Vec<Binding>) -> Result<Self, BrokerError> {
        let hosts: Vec<&str> = bindings.iter().map(|b| b.spec.host.as_str()).collect();
        let tls = tls::Authority::new(&hosts)?;
        Ok(Self { bindings, tls })
    }

    pub fn bindings(&self) -> &[Binding] {
        &self.bindings
    }

    /// The per-run CA certificate (PEM), for the sandbox to trust. The key
    /// never leaves this process.
    pub fn ca_pem(&self) -> &str {
        self.tls.ca_pem()
    }

    /// Whether requests to `host:port` get a value (so the proxy must read
    /// them), over TLS or, with `clear`, in clear text.
    pub fn binds(&self, host: &str, port: u16, clear: bool) -> bool {
        self.bindings.iter().any(|b| if clear { b.binds_in_clear(host, port) } else { b.binds(host, port) })
    }

    pub(crate) fn tls(&self) -> &tls::Authority {
        &self.tls
    }

    /// Replaces the placeholder of every binding for `host:port` with its
    /// value, in every header (and inside `Authorization: Basic`'s base64);
    /// bodies are never touched. Other bindings' placeholders are left as
    /// they are, and so are those that may not travel in `clear` text
    /// ([`Binding::binds_in_clear`]). Returns what was substituted, by
    /// variable.
    pub fn substitute(
        &self,
        headers: &mut HeaderMap,
        host: &str,
        port: u16,
        method: &str,
        clear: bool,
    ) -> Vec<Substitution> {
        let mut done = Vec::new();
        let bound = |b: &&Binding| if clear { b.binds_in_clear(host, port) } else { b.binds(host, port) };
        for binding in self.bindings.iter().filter(bound) {
            let mut names = Vec::new();
            for (name, value) in headers.iter_mut() {
                if let Some(replaced) = replace_in(name, value, binding) {
                    *value = replaced;
                    names.push(name.as_str().to_owned());
                }
            }
            if !names.is_empty() {
                names.dedup();
                done.push(Substitution {
                    variable: binding.spec.variable.clone(),
                    host: host.to_owned(),
                    port,
                    method: method.to_owned(),
                    headers: names,
                });
            }
        }
        done
    }

    /// Puts the placeholder back wherever a bound host's response headers
    /// echo a value (a debugging endpoint, a `Set-Cookie` built from the
    /// key): the sandbox gets the placeholder, never the value. Bodies
    /// stream through as they are.
    pub fn mask(&self, headers: &mut HeaderMap) {
        for (_, value) in headers.iter_mut() {
            let Ok(text) = value.to_str() else { continue };
            let mut masked = text.to_owned();
            for binding in &self.bindings {
                masked = masked.replace(&binding.value, &binding.placeholder);
            }
            if masked != text {
                if let Some(replaced) = sensitive(masked) {
                    *value = replaced;
                }
            }
        }
    }
}

/// `value` with `binding`'s placeholder replaced, if it holds it: plainly,
/// or (for `Authorization: Basic`) inside the base64 credentials.
fn replace_in(
    name: &hyper::header::HeaderName,
    value: &HeaderValue,
    binding: &Binding,
) -> Option<HeaderValue> {
    let text = value.to_str().ok()?;
    if text.contains(&binding.placeholder) {
        return sensitive(text.replace(&binding.placeholder, &binding.value));
    }
    if name != AUTHORIZATION {
        return None;
    }
    let (scheme, credentials) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let decoded = String::from_utf8(b64.decode(credentials.trim()).ok()?).ok()?;
    if !decoded.contains(&binding.placeholder) {
        return None;
    }
    let encoded = b64.encode(decoded.replace(&binding.placeholder, &binding.value));
    sensitive(format!("{scheme} {encoded}"))
}

/// A header value marked sensitive, so no encoder ever indexes it.
fn sensitive(text: String) -> Option<HeaderValue> {
    let mut value = HeaderValue::from_str(&text).ok()?;
    value.set_sensitive(true);
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(spec: &str, value: &str) -> Binding {
        Binding::new(spec.parse().unwrap(), value.to_owned()).unwrap()
    }

    #[test]
    fn trace_is_refused_in_any_case() {
        for method in ["TRACE", "trace", "Trace"] {
            assert!(echoes_headers(&hyper::Method::from_bytes(method.as_bytes()).unwrap()), "{method}");
        }
        assert!(!echoes_headers(&hyper::Method::GET));
    }

    #[test]
    fn a_key_bound_to_port_443_of_a_public_host_never_travels_in_clear_text() {
        // How presets and https:// base URLs bind: `http://api.example.com:443/`
        // must not put the key on the wire.
        assert!(!binding("K@api.example.com:443", "v").binds_in_clear("api.example.com", 443));
        assert!(binding("K@api.example.com:443", "v").binds("api.example.com", 443));
        assert!(binding("K@api.example.com:8080", "v").binds_in_clear("api.example.com", 8080));
        assert!(binding("K@127.0.0.1:443", "v").binds_in_clear("127.0.0.1", 443));
        assert!(!binding("K@api.example.com", "v").binds_in_clear("api.example.com", 80));
    }

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        let s: BindingSpec = "ANTHROPIC_API_KEY@API.anthropic.com".parse().unwrap();
        assert_eq!(
            (s.variable.as_str(), s.host.as_str(), s.port),
            ("ANTHROPIC_API_KEY", "api.anthropic.com", None)
        );
        let s: BindingSpec = "K@127.0.0.1:8080".parse().unwrap();
        assert_eq!((s.host.as_str(), s.port), ("127.0.0.1", Some(8080)));
        let s: BindingSpec = "K@[::1]:9".parse().unwrap();
        assert_eq!((s.host.as_str(), s.port, s.to_string().as_str()), ("::1", Some(9), "K@[::1]:9"));
        for (bad, word) in [
            ("NOAT", "VAR@HOST"),
            ("1X@h", "variable name"),
            ("X-Y@h", "variable name"),
            ("K@*.example.com", "no wildcard"),
            ("K@h:0", "port"),
            ("K@h:99999", "port"),
            ("K@", "no wildcard"),
        ] {
            let err = bad.parse::<BindingSpec>().unwrap_err().to_string();
            assert!(err.contains(word), "{bad}: {err}");
        }
    }

    #[test]
    fn a_variable_bound_to_two_hosts_keeps_one_placeholder() {
        let api = binding("K@api.example.com:443", "real-value");
        let gateway = api.also_to("K@127.0.0.1:4000".parse().unwrap());
        assert_eq!(api.placeholder, gateway.placeholder);
        let placeholder = api.placeholder.clone();
        let broker = broker_of(vec![api, gateway]);
        for (host, port) in [("api.example.com", 443), ("127.0.0.1", 4000)] {
            let mut headers = HeaderMap::new();
            headers.insert("x-api-key", placeholder.parse().unwrap());
            assert_eq!(broker.substitute(&mut headers, host, port, "GET", false).len(), 1, "{host}");
            assert_eq!(headers["x-api-key"], "real-value");
        }
    }

    #[test]
    fn placeholders_are_random_and_values_are_redacted() {
        let a = binding("K@h", "real-value");
        let b = binding("K@h", "real-value");
        assert!(
            a.placeholder.starts_with(PLACEHOLDER_PREFIX)
                && a.placeholder.len() == PLACEHOLDER_PREFIX.len() + 32
        );
        assert_ne!(a.placeholder, b.placeholder);
        assert!(!format!("{a:?}").contains("real-value"));
        let err = Binding::new("K@h".parse().unwrap(), "a\r\nb".into()).unwrap_err().to_string();
        assert!(err.contains("K") && !err.contains("a\r\nb"), "{err}");
    }

    fn broker_of(bindings: Vec<Binding>) -> Broker {
        Broker { bindings, tls: tls::Authority::for_tests() }
    }

    #[test]
    fn the_bound_host_gets_the_value_in_every_header_and_others_keep_the_placeholder() {
        let k = binding("K@api.example.com", "real-value");
        let other = binding("O@other.example.com:8443", "other-value");
        let (pk, po) = (k.placeholder.clone(), other.placeholder.clone());
        let broker = broker_of(vec![k, other]);
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", pk.parse().unwrap());
        headers.insert(AUTHORIZATION, format!("Basic {}", b64.encode(format!("user:{pk}"))).parse().unwrap());
        headers.insert("x-other", po.parse().unwrap());
        headers.append("x-list", format!("a, Bearer {pk}").parse().unwrap());
        let done = broker.substitute(&mut headers, "API.example.com", 443, "POST", false);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].variable, "K");
        assert_eq!(done[0].headers, ["x-api-key", "authorization", "x-list"]);
        assert_eq!(headers["x-api-key"], "real-value");
        assert_eq!(headers[AUTHORIZATION], format!("Basic {}", b64.encode("user:real-value")));
        assert_eq!(headers["x-list"], "a, Bearer real-value");
        assert_eq!(headers["x-other"], po.as_str(), "another binding's host, another port: untouched");

        let mut elsewhere = HeaderMap::new();
        elsewhere.insert("x-api-key", pk.parse().unwrap());
        assert!(broker.substitute(&mut elsewhere, "evil.example.net", 443, "GET", false).is_empty());
        assert_eq!(elsewhere["x-api-key"], pk.as_str(), "another host gets the placeholder");
        assert!(broker.substitute(&mut elsewhere, "other.example.com", 443, "GET", false).is_empty());
    }

    #[test]
    fn a_response_header_echoing_a_value_gets_the_placeholder() {
        let k = binding("K@api.example.com", "real-value");
        let placeholder = k.placeholder.clone();
        let broker = broker_of(vec![k]);
        let mut headers = HeaderMap::new();
        headers.insert("x-echo", "key=real-value; again real-value".parse().unwrap());
        headers.insert("content-type", "text/plain".parse().unwrap());
        broker.mask(&mut headers);
        assert_eq!(headers["x-echo"], format!("key={placeholder}; again {placeholder}").as_str());
        assert_eq!(headers["content-type"], "text/plain");
    }

    #[test]
    fn a_value_travels_in_clear_text_only_to_loopback_or_a_port_the_binding_names() {
        let any_port = binding("A@api.example.com", "a-value");
        let named_port = binding("B@gateway.example.com:8080", "b-value");
        let local = binding("C@localhost", "c-value");
        assert!(!any_port.binds("other.example.com", 80) && any_port.binds("api.example.com", 80));
        assert!(!any_port.binds_in_clear("api.example.com", 80), "a public host, every port: TLS only");
        assert!(named_port.binds_in_clear("gateway.example.com", 8080));
        assert!(local.binds_in_clear("LOCALHOST", 11434));
        let placeholder = any_port.placeholder.clone();
        let broker = broker_of(vec![any_port]);
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", placeholder.parse().unwrap());
        assert!(broker.substitute(&mut headers, "api.example.com", 80, "GET", true).is_empty());
        assert_eq!(headers["x-api-key"], placeholder.as_str());
    }
}
