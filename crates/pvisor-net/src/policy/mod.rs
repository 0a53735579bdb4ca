//! Network policy: modes, rules, the scoped merge, and per-request decisions.
//!
//! Matching: `example.com` matches exactly that name; `*.example.com` matches
//! every name below it (not the apex); `*` matches every *name*. A rule may
//! name a port (`example.com:443`, `127.0.0.1:8000`, `[::1]:8000`,
//! `localhost:8000`): it then matches that port alone. Deny beats allow. An
//! IP literal is allowed only by an allow rule naming that literal.
//! A name that resolves to a loopback, private, link-local or otherwise
//! internal address is refused (DNS rebinding) unless that address — or
//! `localhost`, for loopback — is allowed explicitly, on the port asked for
//! if the rule names one. A loopback rule must name a port: without one it
//! opened every service listening on the host's loopback.
//!
//! An ordered policy (OpenSandbox's `networkPolicy`, [`OrderedPolicy`])
//! decides differently, as the reference egress sidecar does
//! (`components/egress/pkg/policy/policy.go`, `domain_index.go`): the first
//! rule whose target matches wins, else the default action; targets are
//! names, `*.domain`, IP addresses and CIDR blocks. Internal addresses stay
//! refused unless an IP or CIDR allow rule (or `localhost`) covers them, even
//! under a default of allow: a sandbox never reaches the host's own services
//! by accident.
//!
//! This module holds the scoped policies, their merge and the allow/deny
//! decisions; the ordered policy's targets and decisions are in `ordered`.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

mod live;
mod ordered;

pub use live::{LiveChangeError, LivePolicy};
pub use ordered::{validate_ordered, InvalidTarget, TargetProblem};

pub use pvisor_core::records::{
    EffectiveNetwork, LoopbackForward, NetworkMode as Mode, NetworkRule as Rule, OrderedPolicy, OrderedRule,
    RuleAction,
};

/// Where a policy came from, highest precedence first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    CommandLine,
    Workspace,
    User,
}

/// One scope's settings, as written in a `[network]` table or given as flags.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    pub mode: Option<Mode>,
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
    /// An ordered policy, given by a program (`pvisor serve`), never by a
    /// file: it replaces the allow and deny rules of every scope.
    #[serde(skip)]
    pub ordered: Option<OrderedPolicy>,
}

/// A policy and where it came from (a file path, or "command line").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScopedPolicy {
    pub scope: Scope,
    pub source: String,
    pub spec: PolicySpec,
}

/// A bad policy, naming its source.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("{source_name}: {message}")]
    Invalid { source_name: String, message: String },
}

fn normalize(host: &str) -> String {
    let host = host.trim_end_matches('.').trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
    // inet_aton accepts 2130706433, 0x7f.1, 0177.0.0.1 …: getaddrinfo would
    // resolve those "names" to addresses, so they are addresses here too.
    match parse_inet_aton(&host) {
        Some(v4) => v4.to_string(),
        None => host,
    }
}

/// Parses the legacy IPv4 forms inet_aton(3) accepts: 1 to 4 parts, each
/// decimal, octal (leading 0) or hex (0x), the last filling the remaining bytes.
fn parse_inet_aton(s: &str) -> Option<std::net::Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(parts.len());
    for part in &parts {
        let (digits, radix) = if let Some(hex) = part.strip_prefix("0x") {
            (hex, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (*part, 10)
        };
        if digits.is_empty() && radix != 16 {
            return None;
        }
        values.push(if digits.is_empty() { 0 } else { u64::from_str_radix(digits, radix).ok()? });
    }
    let (last, head) = values.split_last()?;
    if head.iter().any(|&v| v > 255) || *last >= 1u64 << (8 * (4 - head.len())) {
        return None;
    }
    let mut addr: u64 = 0;
    for (i, v) in head.iter().enumerate() {
        addr |= v << (24 - 8 * i);
    }
    Some(std::net::Ipv4Addr::from((addr | last) as u32))
}

/// Splits a rule into its host part and its port, if it names one:
/// `host:port`, `[v6]:port`; a bare IPv6 address (several colons) has none.
fn split_port(pattern: &str) -> (&str, Option<&str>) {
    if let Some(rest) = pattern.strip_prefix('[') {
        if let Some((host, tail)) = rest.split_once(']') {
            return (host, tail.strip_prefix(':'));
        }
    }
    match pattern.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => (host, Some(port)),
        _ => (pattern, None),
    }
}

/// A rule as matched: its normalized host part and the port it names, if any.
fn rule_parts(pattern: &str) -> (String, Option<u16>) {
    let (host, port) = split_port(pattern);
    (normalize(host), port.and_then(|p| p.parse().ok()))
}

/// Whether an address (or the name `localhost`) is the host's loopback.
fn names_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|a| a.to_canonical().is_loopback())
}

/// Which list a rule is for: an allow rule on loopback must name a port, a
/// deny rule (which only narrows) need not.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Allow,
    Deny,
}

/// Checks one rule and returns it normalized (`host` or `host:port`, an
/// IPv6 address with a port in brackets).
fn validate(pattern: &str, source: &str, side: Side) -> Result<String, PolicyError> {
    let bad = |message: String| PolicyError::Invalid { source_name: source.to_owned(), message };
    let (host, port) = split_port(pattern.trim());
    let Some(port) = port else {
        let p = validate_host(pattern, source)?;
        if side == Side::Allow && names_loopback(&p) {
            return Err(bad(format!(
                "{pattern:?} would open every service on the host's loopback; name a port: \"{}:PORT\"",
                if p.contains(':') { format!("[{p}]") } else { p.clone() }
            )));
        }
        return Ok(p);
    };
    let port: u16 = port
        .parse()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| bad(format!("{pattern:?}: the port must be a number from 1 to 65535")))?;
    let host = validate_host(host, source)?;
    if host == "*" {
        return Err(bad(format!("{pattern:?}: a port rule names a host, \"*.domain\" or an IP address")));
    }
    Ok(if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") })
}

/// Checks a rule's host part: a name, `*.domain`, `*` or an IP address.
fn validate_host(pattern: &str, source: &str) -> Result<String, PolicyError> {
    let p = normalize(pattern);
    let bad = |message: String| PolicyError::Invalid { source_name: source.to_owned(), message };
    if p.is_empty() {
        return Err(bad("an empty network rule".into()));
    }
    if p.parse::<IpAddr>().is_ok() || p == "*" {
        return Ok(p);
    }
    let name = p.strip_prefix("*.").unwrap_or(&p);
    if name.contains('*') {
        return Err(bad(format!("{pattern:?}: a wildcard may only be a leading \"*.\"")));
    }
    if !name.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    }) {
        return Err(bad(format!("{pattern:?} is not a host name, \"*.domain\" or an IP address")));
    }
    Ok(p)
}

impl PolicySpec {
    /// The part of this spec that can only narrow a policy: deny rules, and
    /// `mode = "none"`. Returns it with a description of each thing dropped
    /// (a mode that opens the network, allow rules).
    pub fn narrowing_only(&self) -> (PolicySpec, Vec<String>) {
        let mut dropped = Vec::new();
        let mode = match self.mode {
            Some(Mode::None) | None => self.mode,
            Some(other) => {
                dropped.push(format!("mode = {:?}", other.as_str()));
                None
            }
        };
        if !self.allow.is_empty() {
            dropped.push(format!("allow = {:?}", self.allow));
        }
        if self.ordered.is_some() {
            dropped.push("an ordered policy".into());
        }
        (PolicySpec { mode, allow: Vec::new(), deny: self.deny.clone(), ordered: None }, dropped)
    }
}

/// Merges scoped policies: the mode comes from the highest-precedence scope
/// that sets one (default `none`; allow rules without any mode imply `proxy`);
/// allow and deny rules are the union of all scopes, each keeping its source.
pub fn resolve(scopes: &[ScopedPolicy]) -> Result<EffectiveNetwork, PolicyError> {
    let mut ordered: Vec<&ScopedPolicy> = scopes.iter().collect();
    ordered.sort_by_key(|s| s.scope);
    let mut allow = Vec::new();
    let mut deny = Vec::new();
    for scope in &ordered {
        for pattern in &scope.spec.allow {
            let pattern = validate(pattern, &scope.source, Side::Allow)?;
            allow.push(Rule { pattern, source: scope.source.clone() });
        }
        for pattern in &scope.spec.deny {
            let pattern = validate(pattern, &scope.source, Side::Deny)?;
            deny.push(Rule { pattern, source: scope.source.clone() });
        }
    }
    let (mode, mode_source) = match ordered.iter().find_map(|s| s.spec.mode.map(|m| (m, s.source.clone()))) {
        Some(found) => found,
        None if !allow.is_empty() => (Mode::Proxy, "implied by allow rules".to_owned()),
        None => (Mode::None, "default".to_owned()),
    };
    let rules = match ordered.iter().find_map(|s| s.spec.ordered.as_ref().map(|o| (o, &s.source))) {
        Some((policy, source)) => {
            validate_ordered(policy)
                .map_err(|e| PolicyError::Invalid { source_name: source.clone(), message: e.to_string() })?;
            // The ordered policy alone decides.
            allow.clear();
            deny.clear();
            Some(policy.clone())
        }
        None => None,
    };
    Ok(EffectiveNetwork { mode, mode_source, allow, deny, ordered: rules, namespace: None })
}

/// The loopback names a sandbox's programs normally reach directly (the
/// `NO_PROXY` list): `localhost`, `127.0.0.1` and `::1`.
pub const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Which of [`LOOPBACK_NAMES`] an allow rule opens on the host (they need a
/// port): the sandbox's own loopback is another, so requests for them must
/// go through the proxy, and `NO_PROXY` must not list them.
pub fn proxied_loopback_names(net: &EffectiveNetwork) -> Vec<&'static str> {
    LOOPBACK_NAMES
        .into_iter()
        .filter(|name| net.allow.iter().any(|r| rule_parts(&r.pattern).0 == *name))
        .collect()
}

/// The loopback ports the allow rules open on the host, one per sandbox
/// address: `127.0.0.1:PORT` and `[::1]:PORT` (and any other loopback
/// literal) listen on that address alone; `localhost:PORT` on both
/// `127.0.0.1` and `::1`, as a client resolving `localhost` may try either.
/// A port a deny rule closes again is left out (nothing listens, so a
/// connection is refused, as it is on every port no rule opens).
pub fn loopback_forwards(net: &EffectiveNetwork) -> Vec<LoopbackForward> {
    let mut out: Vec<LoopbackForward> = Vec::new();
    for rule in &net.allow {
        let (host, Some(port)) = rule_parts(&rule.pattern) else { continue };
        let listen: Vec<IpAddr> = match host.parse::<IpAddr>() {
            Ok(ip) if ip.to_canonical().is_loopback() => vec![ip.to_canonical()],
            Ok(_) => continue,
            Err(_) if host == "localhost" => {
                vec![IpAddr::from(std::net::Ipv4Addr::LOCALHOST), IpAddr::from(std::net::Ipv6Addr::LOCALHOST)]
            }
            Err(_) => continue,
        };
        if !matches!(net.decide(&host, port), Decision::Allow { .. }) {
            continue;
        }
        for ip in listen {
            let listen = std::net::SocketAddr::new(ip, port);
            if !out.iter().any(|f| f.listen == listen) {
                out.push(LoopbackForward { listen, host: host.clone() });
            }
        }
    }
    out
}

/// The outcome of checking one destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow { rule: String },
    Deny { rule: String, reason: String },
}

/// Whether a rule covers `host` on `port`: its host part matches, and its
/// port, if it names one, is `port`.
fn matches(rule: &str, host: &str, port: u16, host_is_ip: bool) -> bool {
    let (pattern, rule_port) = rule_parts(rule);
    rule_port.is_none_or(|p| p == port) && host_matches(&pattern, host, host_is_ip)
}

fn host_matches(pattern: &str, host: &str, host_is_ip: bool) -> bool {
    if pattern == host {
        return true;
    }
    if host_is_ip {
        // Only an exact literal covers an IP; wildcards are for names.
        return pattern.parse::<IpAddr>().ok().zip(host.parse::<IpAddr>().ok()).is_some_and(|(a, b)| a == b);
    }
    pattern == "*" || pattern.strip_prefix("*.").is_some_and(|suffix| host.ends_with(&format!(".{suffix}")))
}

/// Whether `addr` is internal: loopback, private, link-local, unique-local,
/// unspecified, multicast, broadcast or otherwise not a public destination.
pub fn is_internal(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(a) => {
            a.is_loopback()
                || a.is_private()
                || a.is_link_local()
                || a.is_unspecified()
                || a.is_multicast()
                || a.is_broadcast()
                || a.octets()[0] == 0
                || (a.octets()[0] == 100 && (a.octets()[1] & 0xc0) == 64) // CGNAT 100.64/10
        }
        IpAddr::V6(a) => {
            if let Some(v4) = a.to_ipv4_mapped() {
                return is_internal(IpAddr::V4(v4));
            }
            let seg0 = a.segments()[0];
            a.is_loopback()
                || a.is_unspecified()
                || a.is_multicast()
                || (seg0 & 0xfe00) == 0xfc00 // unique local
                || (seg0 & 0xffc0) == 0xfe80 // link local
                || (seg0 == 0x0064 && a.segments()[1] == 0xff9b) // NAT64 64:ff9b::/96
                || seg0 == 0x2002 // 6to4 embeds an IPv4 address
        }
    }
}

/// Why a resolved address of an allowed destination is refused (DNS
/// rebinding, or a deny rule that names the address).
#[derive(Debug, thiserror::Error)]
pub enum AddressRefused {
    /// A deny rule (`rule`, described with its source) covers the address.
    #[error("{host} resolves to {addr}, denied by {rule}")]
    Denied { host: String, addr: IpAddr, rule: String },
    /// An internal address no rule opens; `remedy` says which would.
    #[error("{host} resolves to the internal address {addr}; {remedy} to reach it")]
    Internal { host: String, addr: IpAddr, remedy: String },
}

/// Per-request decisions over the recorded [`EffectiveNetwork`].
pub trait Decide {
    /// Decides on a destination name (or IP literal) and port before the
    /// name is resolved.
    fn decide(&self, host: &str, port: u16) -> Decision;
    /// Checks a resolved address of an allowed `host` against DNS rebinding.
    fn check_address(&self, host: &str, port: u16, addr: IpAddr) -> Result<(), AddressRefused>;
}

impl Decide for EffectiveNetwork {
    fn decide(&self, host: &str, port: u16) -> Decision {
        let host = normalize(host);
        if let Some(ordered) = &self.ordered {
            return ordered.decide(&host, port);
        }
        let is_ip = host.parse::<IpAddr>().is_ok();
        if let Some(rule) = self.deny.iter().find(|r| matches(&r.pattern, &host, port, is_ip)) {
            return Decision::Deny {
                rule: format!("deny {} ({})", rule.pattern, rule.source),
                reason: "denied by rule".into(),
            };
        }
        match self.allow.iter().find(|r| matches(&r.pattern, &host, port, is_ip)) {
            Some(rule) => Decision::Allow { rule: format!("allow {} ({})", rule.pattern, rule.source) },
            None if is_ip => Decision::Deny {
                rule: "ip-literal".into(),
                reason: "IP addresses are refused unless allowed explicitly".into(),
            },
            None => Decision::Deny { rule: "default-deny".into(), reason: "not on the allow list".into() },
        }
    }

    fn check_address(&self, host: &str, port: u16, addr: IpAddr) -> Result<(), AddressRefused> {
        if let Some(ordered) = &self.ordered {
            return ordered.check_address(host, port, addr);
        }
        // An address rule covers `addr` on `port`: it names the address
        // (and the port, if any).
        let names_addr = |r: &Rule| {
            let (pattern, rule_port) = rule_parts(&r.pattern);
            pattern.parse::<IpAddr>().ok() == Some(addr) && rule_port.is_none_or(|p| p == port)
        };
        if let Some(rule) = self.deny.iter().find(|r| names_addr(r)) {
            return Err(AddressRefused::Denied {
                host: host.to_owned(),
                addr,
                rule: format!("deny {} ({})", rule.pattern, rule.source),
            });
        }
        if !is_internal(addr) {
            return Ok(());
        }
        let host = normalize(host);
        let explicit = self.allow.iter().any(|r| {
            let (pattern, rule_port) = rule_parts(&r.pattern);
            names_addr(r)
                || (pattern == "localhost"
                    && host == "localhost"
                    && addr.is_loopback()
                    && rule_port.is_none_or(|p| p == port))
        });
        if explicit {
            Ok(())
        } else {
            let shown = if addr.is_ipv6() { format!("[{addr}]") } else { addr.to_string() };
            Err(AddressRefused::Internal {
                host,
                addr,
                remedy: format!("allow it explicitly (--allow {shown}:{port})"),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scoped(scope: Scope, mode: Option<Mode>, allow: &[&str], deny: &[&str]) -> ScopedPolicy {
        ScopedPolicy {
            scope,
            source: format!("{scope:?}"),
            spec: PolicySpec {
                mode,
                allow: allow.iter().map(|s| s.to_string()).collect(),
                deny: deny.iter().map(|s| s.to_string()).collect(),
                ordered: None,
            },
        }
    }

    #[test]
    fn loopback_port_rules_are_forwarded_on_the_addresses_they_name() {
        let net = resolve(&[scoped(
            Scope::CommandLine,
            None,
            &[
                "127.0.0.1:8000",
                "[::1]:9000",
                "localhost:7000",
                "127.0.0.1:7000",
                "localhost:6000",
                "example.com:80",
                "*.test:5000",
            ],
            &["127.0.0.1:6000"],
        )])
        .unwrap();
        let forwards: Vec<(String, String)> =
            loopback_forwards(&net).into_iter().map(|f| (f.listen.to_string(), f.host)).collect();
        assert_eq!(
            forwards,
            [
                ("127.0.0.1:8000".to_owned(), "127.0.0.1".to_owned()),
                ("[::1]:9000".to_owned(), "::1".to_owned()),
                ("127.0.0.1:7000".to_owned(), "localhost".to_owned()),
                ("[::1]:7000".to_owned(), "localhost".to_owned()),
                // localhost:6000 is allowed by name; only its 127.0.0.1 is
                // denied, which the connection's resolution then refuses.
                ("127.0.0.1:6000".to_owned(), "localhost".to_owned()),
                ("[::1]:6000".to_owned(), "localhost".to_owned()),
            ]
        );
        let denied =
            resolve(&[scoped(Scope::CommandLine, None, &["127.0.0.1:8000"], &["127.0.0.1"])]).unwrap();
        assert!(loopback_forwards(&denied).is_empty(), "a port a deny rule closes is not forwarded");
    }

    #[test]
    fn the_command_line_wins_the_mode_and_rules_are_unioned() {
        let net = resolve(&[
            scoped(Scope::User, Some(Mode::Host), &["a.com"], &[]),
            scoped(Scope::CommandLine, Some(Mode::Proxy), &["b.com"], &["bad.b.com"]),
            scoped(Scope::Workspace, None, &["*.c.com"], &[]),
        ])
        .unwrap();
        assert_eq!(net.mode, Mode::Proxy);
        assert_eq!(net.mode_source, "CommandLine");
        assert_eq!(net.allow.len(), 3);
        assert_eq!(resolve(&[]).unwrap().mode, Mode::None);
        assert_eq!(resolve(&[scoped(Scope::CommandLine, None, &["x.com"], &[])]).unwrap().mode, Mode::Proxy);
    }

    #[test]
    fn wildcards_deny_beats_allow_and_ip_literals_need_exact_rules() {
        let net = resolve(&[scoped(
            Scope::CommandLine,
            Some(Mode::Proxy),
            &["*.example.com", "pypi.org", "10.1.2.3"],
            &["evil.example.com"],
        )])
        .unwrap();
        assert!(matches!(net.decide("api.example.com", 443), Decision::Allow { .. }));
        assert!(matches!(net.decide("A.B.Example.COM.", 443), Decision::Allow { .. }));
        assert!(
            matches!(net.decide("example.com", 443), Decision::Deny { .. }),
            "the apex is not a subdomain"
        );
        assert!(matches!(net.decide("evil.example.com", 443), Decision::Deny { .. }));
        assert!(matches!(net.decide("notexample.com", 443), Decision::Deny { .. }));
        assert!(matches!(net.decide("10.1.2.3", 443), Decision::Allow { .. }));
        assert!(
            matches!(net.decide("93.184.216.34", 443), Decision::Deny { rule, .. } if rule == "ip-literal")
        );
        assert!(matches!(net.decide("[::1]", 443), Decision::Deny { .. }));
    }

    #[test]
    fn legacy_ipv4_spellings_are_addresses_not_names() {
        let net =
            resolve(&[scoped(Scope::CommandLine, Some(Mode::Proxy), &["*"], &["203.0.113.5"])]).unwrap();
        for spelled in ["2130706433", "0x7f.1", "0177.0.0.1", "127.1", "0x7F000001"] {
            assert!(
                matches!(net.decide(spelled, 443), Decision::Deny { rule, .. } if rule == "ip-literal"),
                "{spelled}"
            );
        }
        assert!(matches!(net.decide("3405803781", 443), Decision::Deny { .. }), "203.0.113.5 as a number");
        assert!(matches!(net.decide("example.com", 443), Decision::Allow { .. }));
        assert!(
            net.check_address("evil.example", 443, "203.0.113.5".parse().unwrap()).is_err(),
            "deny applies after resolving"
        );
        assert!(
            is_internal("64:ff9b::7f00:1".parse().unwrap()) && is_internal("2002:7f00:1::".parse().unwrap())
        );
        assert_eq!(parse_inet_aton("1.2.3"), Some("1.2.0.3".parse().unwrap()));
        assert_eq!(parse_inet_aton("example"), None);
        assert_eq!(parse_inet_aton("256.1.1.1"), None);
    }

    #[test]
    fn internal_addresses_need_an_explicit_allow() {
        let net = resolve(&[scoped(
            Scope::CommandLine,
            Some(Mode::Proxy),
            &["pypi.org", "localhost:8000", "10.1.2.3"],
            &[],
        )])
        .unwrap();
        assert!(net.check_address("pypi.org", 443, "151.101.0.223".parse().unwrap()).is_ok());
        assert!(net.check_address("pypi.org", 443, "127.0.0.1".parse().unwrap()).is_err(), "rebinding");
        assert!(net.check_address("pypi.org", 443, "192.168.1.1".parse().unwrap()).is_err());
        assert!(net.check_address("pypi.org", 443, "::ffff:127.0.0.1".parse().unwrap()).is_err());
        assert!(net.check_address("pypi.org", 443, "fe80::1".parse().unwrap()).is_err());
        assert!(net.check_address("localhost", 8000, "127.0.0.1".parse().unwrap()).is_ok());
        assert!(net.check_address("localhost", 8001, "127.0.0.1".parse().unwrap()).is_err(), "another port");
        assert!(
            net.check_address("pypi.org", 443, "10.1.2.3".parse().unwrap()).is_ok(),
            "explicitly allowed address"
        );
    }

    #[test]
    fn port_rules_match_their_port_alone_and_loopback_needs_one() {
        let net = resolve(&[scoped(
            Scope::CommandLine,
            Some(Mode::Proxy),
            &["127.0.0.1:8000", "[::1]:9000", "example.com:443", "api.example.org"],
            &["api.example.org:25"],
        )])
        .unwrap();
        let allowed = |host: &str, port: u16| matches!(net.decide(host, port), Decision::Allow { .. });
        assert!(allowed("127.0.0.1", 8000) && !allowed("127.0.0.1", 8001));
        assert!(allowed("[::1]", 9000) && !allowed("::1", 9001));
        assert!(allowed("example.com", 443) && !allowed("example.com", 80));
        assert!(allowed("api.example.org", 443) && !allowed("api.example.org", 25), "a port deny rule");
        let lo = "127.0.0.1".parse().unwrap();
        assert!(net.check_address("127.0.0.1", 8000, lo).is_ok());
        assert!(net.check_address("127.0.0.1", 8001, lo).is_err());
        for bare in ["localhost", "127.0.0.1", "::1", "[::1]", "127.0.0.2", "0x7f.1"] {
            let err = resolve(&[scoped(Scope::CommandLine, Some(Mode::Proxy), &[bare], &[])]).unwrap_err();
            assert!(err.to_string().contains("name a port"), "{bare}: {err}");
        }
        let narrowed = resolve(&[scoped(Scope::CommandLine, None, &["example.com"], &["localhost", "::1"])]);
        assert!(narrowed.is_ok(), "a deny rule needs no port: {narrowed:?}");
        for bad in ["example.com:0", "example.com:70000", "example.com:http", "*:443"] {
            assert!(resolve(&[scoped(Scope::CommandLine, None, &[bad], &[])]).is_err(), "{bad}");
        }
        let spelled =
            resolve(&[scoped(Scope::CommandLine, None, &["LocalHost:8000", "[::1]:80"], &[])]).unwrap();
        let patterns: Vec<&str> = spelled.allow.iter().map(|r| r.pattern.as_str()).collect();
        assert_eq!(patterns, ["localhost:8000", "[::1]:80"]);
    }

    #[test]
    fn bad_rules_name_their_source() {
        let err = resolve(&[scoped(Scope::Workspace, None, &["ex*ample.com"], &[])]).unwrap_err();
        assert!(err.to_string().starts_with("Workspace:"), "{err}");
    }

    #[test]
    fn an_untrusted_spec_keeps_only_what_narrows() {
        let spec = PolicySpec {
            mode: Some(Mode::Host),
            allow: vec!["*".into()],
            deny: vec!["evil.com".into()],
            ordered: None,
        };
        let (narrow, dropped) = spec.narrowing_only();
        assert_eq!(
            narrow,
            PolicySpec { mode: None, allow: vec![], deny: vec!["evil.com".into()], ordered: None }
        );
        assert_eq!(dropped.len(), 2, "{dropped:?}");
        let none = PolicySpec { mode: Some(Mode::None), allow: vec![], deny: vec![], ordered: None };
        assert_eq!(none.narrowing_only(), (none.clone(), vec![]));
    }
}
