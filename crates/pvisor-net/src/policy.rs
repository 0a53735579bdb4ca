//! Network policy: modes, rules, the scoped merge, and per-request decisions.
//!
//! Matching: `example.com` matches exactly that name; `*.example.com` matches
//! every name below it (not the apex); `*` matches every *name*. Deny beats
//! allow. An IP literal is allowed only by an allow rule naming that literal.
//! A name that resolves to a loopback, private, link-local or otherwise
//! internal address is refused (DNS rebinding) unless that address — or
//! `localhost`, for loopback — is allowed explicitly.
//!
//! An ordered policy (OpenSandbox's `networkPolicy`, [`OrderedPolicy`])
//! decides differently, as the reference egress sidecar does
//! (`components/egress/pkg/policy/policy.go`, `domain_index.go`): the first
//! rule whose target matches wins, else the default action; targets are
//! names, `*.domain`, IP addresses and CIDR blocks. Internal addresses stay
//! refused unless an IP or CIDR allow rule (or `localhost`) covers them, even
//! under a default of allow: a sandbox never reaches the host's own services
//! by accident.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

pub use pvisor_core::records::{
    EffectiveNetwork, NetworkMode as Mode, NetworkRule as Rule, OrderedPolicy, OrderedRule, RuleAction,
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

fn validate(pattern: &str, source: &str) -> Result<String, PolicyError> {
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
            allow.push(Rule { pattern: validate(pattern, &scope.source)?, source: scope.source.clone() });
        }
        for pattern in &scope.spec.deny {
            deny.push(Rule { pattern: validate(pattern, &scope.source)?, source: scope.source.clone() });
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
                .map_err(|message| PolicyError::Invalid { source_name: source.clone(), message })?;
            // The ordered policy alone decides.
            allow.clear();
            deny.clear();
            Some(policy.clone())
        }
        None => None,
    };
    Ok(EffectiveNetwork { mode, mode_source, allow, deny, ordered: rules })
}

/// What an ordered rule's target is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Ip(IpAddr),
    Cidr(ipnet::IpNet),
    /// A name or `*.domain` (normalized).
    Name,
}

fn target_kind(target: &str) -> Target {
    let t = normalize(target);
    if let Ok(ip) = t.parse::<IpAddr>() {
        return Target::Ip(ip);
    }
    match t.parse::<ipnet::IpNet>() {
        Ok(net) => Target::Cidr(net),
        Err(_) => Target::Name,
    }
}

/// Checks every target of an ordered policy: a name, `*.domain`, an IP
/// address or a CIDR block; `*` alone is refused
/// (the reference matches nothing with it; `defaultAction` says "all").
pub fn validate_ordered(policy: &OrderedPolicy) -> Result<(), String> {
    for (i, rule) in policy.rules.iter().enumerate() {
        let at = format!("egress[{i}] ({:?})", rule.target);
        let target = rule.target.trim();
        if target.is_empty() {
            return Err(format!(
                "{at}: the target is empty; name a domain, *.domain, an IP address or a CIDR block"
            ));
        }
        if normalize(target) == "*" {
            return Err(format!(
                "{at}: \"*\" matches nothing here; say defaultAction: \"{}\" to decide for every destination",
                match rule.action {
                    RuleAction::Allow => "allow",
                    RuleAction::Deny => "deny",
                }
            ));
        }
        if target.contains('/') {
            // Host bits may be set (`10.0.0.1/8` is 10.0.0.0/8), as the
            // reference's netip.ParsePrefix accepts.
            target
                .parse::<ipnet::IpNet>()
                .map_err(|_| format!("{at}: not a CIDR block (e.g. 10.0.0.0/8 or fd00::/8)"))?;
            continue;
        }
        validate(target, "").map_err(|e| match e {
            PolicyError::Invalid { message, .. } => format!("{at}: {message}"),
        })?;
    }
    Ok(())
}

fn ordered_matches(target: &str, host: &str, host_ip: Option<IpAddr>) -> bool {
    match host_ip {
        Some(addr) => address_covers(target, addr),
        None => {
            target_kind(target) == Target::Name && {
                let pattern = normalize(target);
                pattern == host
                    || pattern.strip_prefix("*.").is_some_and(|suffix| host.ends_with(&format!(".{suffix}")))
            }
        }
    }
}

fn describe(rule: &OrderedRule, index: usize, source: &str) -> String {
    let action = match rule.action {
        RuleAction::Allow => "allow",
        RuleAction::Deny => "deny",
    };
    format!("egress[{index}] {action} {} ({source})", rule.target)
}

/// Whether the IP or CIDR `target` covers `addr` (IPv4-mapped IPv6 is its
/// IPv4 address, as the host's dual-stack socket would connect to it).
fn address_covers(target: &str, addr: IpAddr) -> bool {
    let canonical = addr.to_canonical();
    match target_kind(target) {
        Target::Ip(ip) => ip.to_canonical() == canonical,
        Target::Cidr(net) => net.contains(&canonical) || net.contains(&addr),
        Target::Name => false,
    }
}

/// The ranges [`is_internal`] calls internal, as blocks: an address rule
/// opens an internal address only if its whole block lies in one of them
/// (`10.0.0.0/8` does, `0.0.0.0/0` does not).
fn inside_internal_range(target: &str) -> bool {
    const RANGES: [&str; 11] = [
        "127.0.0.0/8",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",
        "100.64.0.0/10",
        "0.0.0.0/8",
        "::1/128",
        "fc00::/7",
        "fe80::/10",
        "64:ff9b::/96",
    ];
    let block = match target_kind(target) {
        Target::Ip(ip) => ipnet::IpNet::from(ip.to_canonical()),
        Target::Cidr(net) => net.trunc(),
        Target::Name => return false,
    };
    RANGES.iter().filter_map(|r| r.parse::<ipnet::IpNet>().ok()).any(|r| r.contains(&block))
}

/// The first rule of `action` in `policy` whose IP or CIDR target covers `addr`.
fn address_rule(policy: &OrderedPolicy, addr: IpAddr, action: RuleAction) -> Option<(usize, &OrderedRule)> {
    policy.rules.iter().enumerate().find(|(_, r)| r.action == action && address_covers(&r.target, addr))
}

impl Decide for OrderedPolicy {
    /// Names: the first matching name rule, in order (the reference's
    /// `domain_index.go`). Addresses: a covering deny rule, then a covering
    /// allow rule, whatever their order (its nftables deny sets come before
    /// the allow sets). Else `defaultAction`.
    fn decide(&self, host: &str) -> Decision {
        let host = &normalize(host);
        let found = match host.parse::<IpAddr>() {
            Ok(addr) => address_rule(self, addr, RuleAction::Deny)
                .or_else(|| address_rule(self, addr, RuleAction::Allow)),
            Err(_) => self.rules.iter().enumerate().find(|(_, r)| ordered_matches(&r.target, host, None)),
        };
        match found {
            Some((i, rule)) if rule.action == RuleAction::Allow => {
                Decision::Allow { rule: describe(rule, i, &self.source) }
            }
            Some((i, rule)) => {
                Decision::Deny { rule: describe(rule, i, &self.source), reason: "denied by rule".into() }
            }
            None if self.default_action == RuleAction::Allow => {
                Decision::Allow { rule: format!("defaultAction allow ({})", self.source) }
            }
            None => Decision::Deny {
                rule: format!("defaultAction deny ({})", self.source),
                reason: "no rule allows it".into(),
            },
        }
    }

    /// An address the proxy is about to connect to (an allowed name's, or
    /// an allowed literal): a covering deny rule refuses it; an internal one
    /// needs an allow rule whose whole block is internal (or the rule
    /// `localhost`, for the name localhost), whatever the default.
    fn check_address(&self, host: &str, addr: IpAddr) -> Result<(), String> {
        let host = &normalize(host);
        if let Some((i, rule)) = address_rule(self, addr, RuleAction::Deny) {
            return Err(format!("{host} resolves to {addr}, denied by {}", describe(rule, i, &self.source)));
        }
        if !is_internal(addr) {
            return Ok(());
        }
        let opened = self.rules.iter().any(|r| {
            r.action == RuleAction::Allow
                && ((address_covers(&r.target, addr) && inside_internal_range(&r.target))
                    || (normalize(&r.target) == "localhost" && host == "localhost" && addr.is_loopback()))
        });
        if opened {
            Ok(())
        } else {
            Err(format!(
                "{host} resolves to the internal address {addr}; add an egress rule {{\"action\": \"allow\", \"target\": \"{}\"}} to reach it",
                addr.to_canonical()
            ))
        }
    }
}

/// The outcome of checking one destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow { rule: String },
    Deny { rule: String, reason: String },
}

fn matches(pattern: &str, host: &str, host_is_ip: bool) -> bool {
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

/// Per-request decisions over the recorded [`EffectiveNetwork`].
pub trait Decide {
    /// Decides on a destination name (or IP literal) before it is resolved.
    fn decide(&self, host: &str) -> Decision;
    /// Checks a resolved address of an allowed `host` against DNS rebinding.
    fn check_address(&self, host: &str, addr: IpAddr) -> Result<(), String>;
}

impl Decide for EffectiveNetwork {
    fn decide(&self, host: &str) -> Decision {
        let host = normalize(host);
        if let Some(ordered) = &self.ordered {
            return ordered.decide(&host);
        }
        let is_ip = host.parse::<IpAddr>().is_ok();
        if let Some(rule) = self.deny.iter().find(|r| matches(&r.pattern, &host, is_ip)) {
            return Decision::Deny {
                rule: format!("deny {} ({})", rule.pattern, rule.source),
                reason: "denied by rule".into(),
            };
        }
        match self.allow.iter().find(|r| matches(&r.pattern, &host, is_ip)) {
            Some(rule) => Decision::Allow { rule: format!("allow {} ({})", rule.pattern, rule.source) },
            None if is_ip => Decision::Deny {
                rule: "ip-literal".into(),
                reason: "IP addresses are refused unless allowed explicitly".into(),
            },
            None => Decision::Deny { rule: "default-deny".into(), reason: "not on the allow list".into() },
        }
    }

    fn check_address(&self, host: &str, addr: IpAddr) -> Result<(), String> {
        if let Some(ordered) = &self.ordered {
            return ordered.check_address(host, addr);
        }
        if let Some(rule) = self.deny.iter().find(|r| r.pattern.parse::<IpAddr>().ok() == Some(addr)) {
            return Err(format!(
                "{host} resolves to {addr}, denied by deny {} ({})",
                rule.pattern, rule.source
            ));
        }
        if !is_internal(addr) {
            return Ok(());
        }
        let host = normalize(host);
        let explicit = self.allow.iter().any(|r| {
            r.pattern.parse::<IpAddr>().ok() == Some(addr)
                || (r.pattern == "localhost" && host == "localhost" && addr.is_loopback())
        });
        if explicit {
            Ok(())
        } else {
            Err(format!(
                "{host} resolves to the internal address {addr}; allow it explicitly (--allow {addr}) to reach it"
            ))
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
        assert!(matches!(net.decide("api.example.com"), Decision::Allow { .. }));
        assert!(matches!(net.decide("A.B.Example.COM."), Decision::Allow { .. }));
        assert!(matches!(net.decide("example.com"), Decision::Deny { .. }), "the apex is not a subdomain");
        assert!(matches!(net.decide("evil.example.com"), Decision::Deny { .. }));
        assert!(matches!(net.decide("notexample.com"), Decision::Deny { .. }));
        assert!(matches!(net.decide("10.1.2.3"), Decision::Allow { .. }));
        assert!(matches!(net.decide("93.184.216.34"), Decision::Deny { rule, .. } if rule == "ip-literal"));
        assert!(matches!(net.decide("[::1]"), Decision::Deny { .. }));
    }

    #[test]
    fn legacy_ipv4_spellings_are_addresses_not_names() {
        let net =
            resolve(&[scoped(Scope::CommandLine, Some(Mode::Proxy), &["*"], &["203.0.113.5"])]).unwrap();
        for spelled in ["2130706433", "0x7f.1", "0177.0.0.1", "127.1", "0x7F000001"] {
            assert!(
                matches!(net.decide(spelled), Decision::Deny { rule, .. } if rule == "ip-literal"),
                "{spelled}"
            );
        }
        assert!(matches!(net.decide("3405803781"), Decision::Deny { .. }), "203.0.113.5 as a number");
        assert!(matches!(net.decide("example.com"), Decision::Allow { .. }));
        assert!(
            net.check_address("evil.example", "203.0.113.5".parse().unwrap()).is_err(),
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
            &["pypi.org", "localhost", "10.1.2.3"],
            &[],
        )])
        .unwrap();
        assert!(net.check_address("pypi.org", "151.101.0.223".parse().unwrap()).is_ok());
        assert!(net.check_address("pypi.org", "127.0.0.1".parse().unwrap()).is_err(), "rebinding");
        assert!(net.check_address("pypi.org", "192.168.1.1".parse().unwrap()).is_err());
        assert!(net.check_address("pypi.org", "::ffff:127.0.0.1".parse().unwrap()).is_err());
        assert!(net.check_address("pypi.org", "fe80::1".parse().unwrap()).is_err());
        assert!(net.check_address("localhost", "127.0.0.1".parse().unwrap()).is_ok());
        assert!(
            net.check_address("pypi.org", "10.1.2.3".parse().unwrap()).is_ok(),
            "explicitly allowed address"
        );
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

    fn ordered(default_action: RuleAction, rules: &[(RuleAction, &str)]) -> EffectiveNetwork {
        let policy = OrderedPolicy {
            default_action,
            rules: rules
                .iter()
                .map(|(action, target)| OrderedRule { action: *action, target: target.to_string() })
                .collect(),
            source: "test".into(),
        };
        let spec = PolicySpec { mode: Some(Mode::Proxy), ordered: Some(policy), ..Default::default() };
        resolve(&[ScopedPolicy { scope: Scope::CommandLine, source: "test".into(), spec }]).unwrap()
    }

    fn allowed(net: &EffectiveNetwork, host: &str) -> bool {
        matches!(net.decide(host), Decision::Allow { .. })
    }

    /// The reference egress sidecar's order: the first matching rule wins
    /// (components/egress/pkg/policy/domain_index.go, `match`: the lowest
    /// index among the exact and wildcard rules that match).
    #[test]
    fn an_ordered_policy_takes_the_first_matching_rule_then_the_default() {
        use RuleAction::{Allow, Deny};
        let net =
            ordered(Deny, &[(Allow, "api.example.com"), (Deny, "*.example.com"), (Allow, "*.example.com")]);
        assert!(allowed(&net, "api.example.com"));
        assert!(allowed(&net, "API.Example.com."));
        assert!(!allowed(&net, "www.example.com"), "the earlier deny wins");
        assert!(!allowed(&net, "example.com"), "a wildcard is not its apex; the default denies");
        let open = ordered(Allow, &[(Deny, "evil.com"), (Deny, "10.0.0.0/8")]);
        assert!(allowed(&open, "anything.org") && !allowed(&open, "evil.com"));
        assert!(!allowed(&open, "10.1.2.3") && allowed(&open, "93.184.216.34"));
        // IP rules match addresses, name rules names.
        let ips = ordered(Deny, &[(Allow, "203.0.113.0/24"), (Allow, "2001:db8::1")]);
        assert!(
            allowed(&ips, "203.0.113.9") && allowed(&ips, "[2001:db8::1]") && !allowed(&ips, "203.0.114.1")
        );
    }

    #[test]
    fn internal_addresses_need_an_ip_rule_even_when_the_default_allows() {
        use RuleAction::{Allow, Deny};
        let open = ordered(Allow, &[]);
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        assert!(open.check_address("example.com", lo).is_err(), "rebinding to loopback");
        assert!(open.check_address("127.0.0.1", lo).is_err(), "an IP literal of the host");
        assert!(open.check_address("example.com", "93.184.216.34".parse().unwrap()).is_ok());
        let lan = ordered(Deny, &[(Allow, "127.0.0.0/8"), (Allow, "localhost")]);
        assert!(lan.check_address("127.0.0.1", lo).is_ok());
        assert!(ordered(Deny, &[(Allow, "localhost")]).check_address("localhost", lo).is_ok());
        let blocked = ordered(Allow, &[(Deny, "93.184.216.0/24")]);
        assert!(blocked.check_address("example.com", "93.184.216.34".parse().unwrap()).is_err());
    }

    /// Address rules as the reference's nftables sets: deny before allow,
    /// whatever the order (components/egress/pkg/nftables/manager.go).
    #[test]
    fn address_rules_deny_before_allow_and_mapped_addresses_are_their_ipv4() {
        use RuleAction::{Allow, Deny};
        let net = ordered(Deny, &[(Allow, "203.0.113.0/24"), (Deny, "203.0.113.5")]);
        assert!(allowed(&net, "203.0.113.6") && !allowed(&net, "203.0.113.5"));
        let open = ordered(Allow, &[(Deny, "203.0.113.0/24")]);
        assert!(!allowed(&open, "[::ffff:203.0.113.5]"), "IPv4-mapped IPv6 is the IPv4 address");
        assert!(!allowed(&open, "::ffff:cb00:7105"));
        let mapped: IpAddr = "::ffff:203.0.113.5".parse().unwrap();
        assert!(open.check_address("example.com", mapped).is_err(), "a mapped AAAA answer");
        // An allow-everything block does not open the host's own addresses.
        let everything = ordered(Deny, &[(Allow, "0.0.0.0/0"), (Allow, "::/0")]);
        for internal in ["127.0.0.1", "::1", "10.1.2.3", "169.254.169.254", "::ffff:127.0.0.1"] {
            let addr: IpAddr = internal.parse().unwrap();
            assert!(everything.check_address(internal, addr).is_err(), "{internal} opened by a /0");
        }
        assert!(everything.check_address("x", "93.184.216.34".parse().unwrap()).is_ok());
        // Host bits are accepted, as the reference's ParsePrefix does.
        let loose = ordered(Deny, &[(Allow, "10.0.0.1/8")]);
        assert!(allowed(&loose, "10.9.9.9"));
        assert!(loose.check_address("10.9.9.9", "10.9.9.9".parse().unwrap()).is_ok());
        assert!(validate_ordered(&OrderedPolicy {
            default_action: Allow,
            rules: vec![OrderedRule { action: Allow, target: "[*]".into() }],
            source: "s".into()
        })
        .is_err());
    }

    #[test]
    fn bad_ordered_targets_are_refused_by_index_and_value() {
        use RuleAction::Allow;
        for (target, says) in [
            ("", "empty"),
            ("*", "defaultAction"),
            ("10.0.0.0/33", "CIDR"),
            ("exa mple.com", "not a host name"),
            ("a.*.com", "wildcard"),
        ] {
            let policy = OrderedPolicy {
                default_action: Allow,
                rules: vec![OrderedRule { action: Allow, target: target.into() }],
                source: "s".into(),
            };
            let err = validate_ordered(&policy).unwrap_err();
            assert!(err.contains("egress[0]") && err.contains(says), "{target:?}: {err}");
        }
    }
}
