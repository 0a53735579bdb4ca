//! The ordered policy (OpenSandbox's `networkPolicy`): its targets (names,
//! `*.domain`, IP addresses, CIDR blocks), their validation, and decisions
//! that take the first matching rule, else the default action.

use std::net::IpAddr;

use super::{
    is_internal, normalize, validate_host, AddressRefused, Decide, Decision, OrderedPolicy, OrderedRule,
    PolicyError, RuleAction,
};

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

/// An ordered policy's rule whose target is not one: `at` names the rule.
#[derive(Debug, thiserror::Error)]
#[error("{at}: {problem}")]
pub struct InvalidTarget {
    pub at: String,
    #[source]
    pub problem: TargetProblem,
}

/// What is wrong with a rule's target.
#[derive(Debug, thiserror::Error)]
pub enum TargetProblem {
    #[error("the target is empty; name a domain, *.domain, an IP address or a CIDR block")]
    Empty,
    /// `*` alone, in a rule whose action is `action`.
    #[error("\"*\" matches nothing here; say defaultAction: \"{action}\" to decide for every destination")]
    Star { action: &'static str },
    #[error("not a CIDR block (e.g. 10.0.0.0/8 or fd00::/8)")]
    NotCidr,
    /// Not a valid host name or address (the message says why).
    #[error("{0}")]
    Host(String),
}

/// Checks every target of an ordered policy: a name, `*.domain`, an IP
/// address or a CIDR block; `*` alone is refused
/// (the reference matches nothing with it; `defaultAction` says "all").
pub fn validate_ordered(policy: &OrderedPolicy) -> Result<(), InvalidTarget> {
    for (i, rule) in policy.rules.iter().enumerate() {
        let invalid = |problem| InvalidTarget { at: format!("egress[{i}] ({:?})", rule.target), problem };
        let target = rule.target.trim();
        if target.is_empty() {
            return Err(invalid(TargetProblem::Empty));
        }
        if normalize(target) == "*" {
            let action = match rule.action {
                RuleAction::Allow => "allow",
                RuleAction::Deny => "deny",
            };
            return Err(invalid(TargetProblem::Star { action }));
        }
        if target.contains('/') {
            // Host bits may be set (`10.0.0.1/8` is 10.0.0.0/8), as the
            // reference's netip.ParsePrefix accepts.
            target.parse::<ipnet::IpNet>().map_err(|_| invalid(TargetProblem::NotCidr))?;
            continue;
        }
        validate_host(target, "").map_err(|e| match e {
            PolicyError::Invalid { message, .. } => invalid(TargetProblem::Host(message)),
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
    fn decide(&self, host: &str, _port: u16) -> Decision {
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
    fn check_address(&self, host: &str, _port: u16, addr: IpAddr) -> Result<(), AddressRefused> {
        let host = normalize(host);
        if let Some((i, rule)) = address_rule(self, addr, RuleAction::Deny) {
            return Err(AddressRefused::Denied { host, addr, rule: describe(rule, i, &self.source) });
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
            Err(AddressRefused::Internal {
                host,
                addr,
                remedy: format!(
                    "add an egress rule {{\"action\": \"allow\", \"target\": \"{}\"}}",
                    addr.to_canonical()
                ),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{resolve, EffectiveNetwork, Mode, PolicySpec, Scope, ScopedPolicy};
    use super::*;

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
        matches!(net.decide(host, 443), Decision::Allow { .. })
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
        assert!(open.check_address("example.com", 443, lo).is_err(), "rebinding to loopback");
        assert!(open.check_address("127.0.0.1", 443, lo).is_err(), "an IP literal of the host");
        assert!(open.check_address("example.com", 443, "93.184.216.34".parse().unwrap()).is_ok());
        let lan = ordered(Deny, &[(Allow, "127.0.0.0/8"), (Allow, "localhost")]);
        assert!(lan.check_address("127.0.0.1", 443, lo).is_ok());
        assert!(ordered(Deny, &[(Allow, "localhost")]).check_address("localhost", 443, lo).is_ok());
        let blocked = ordered(Allow, &[(Deny, "93.184.216.0/24")]);
        assert!(blocked.check_address("example.com", 443, "93.184.216.34".parse().unwrap()).is_err());
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
        assert!(open.check_address("example.com", 443, mapped).is_err(), "a mapped AAAA answer");
        // An allow-everything block does not open the host's own addresses.
        let everything = ordered(Deny, &[(Allow, "0.0.0.0/0"), (Allow, "::/0")]);
        for internal in ["127.0.0.1", "::1", "10.1.2.3", "169.254.169.254", "::ffff:127.0.0.1"] {
            let addr: IpAddr = internal.parse().unwrap();
            assert!(everything.check_address(internal, 443, addr).is_err(), "{internal} opened by a /0");
        }
        assert!(everything.check_address("x", 443, "93.184.216.34".parse().unwrap()).is_ok());
        // Host bits are accepted, as the reference's ParsePrefix does.
        let loose = ordered(Deny, &[(Allow, "10.0.0.1/8")]);
        assert!(allowed(&loose, "10.9.9.9"));
        assert!(loose.check_address("10.9.9.9", 443, "10.9.9.9".parse().unwrap()).is_ok());
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
            let err = validate_ordered(&policy).unwrap_err().to_string();
            assert!(err.contains("egress[0]") && err.contains(says), "{target:?}: {err}");
        }
    }
}
