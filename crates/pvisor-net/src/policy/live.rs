//! The policy a running proxy decides by, which a frontend may change
//! while it runs (`pvisor serve`'s `PATCH`/`DELETE /policy`, as the
//! reference egress sidecar's runtime policy API allows).
//!
//! Each connection decides by the policy current when it asked
//! ([`LivePolicy::current`]): one already admitted finishes under the rules
//! it was admitted by, and the next asks the new ones. Only an ordered
//! policy (OpenSandbox's `networkPolicy`) is replaced, and only by another
//! valid one, whole; everything else of the recorded decision (the mode,
//! its source) stays as admission made it.

use std::sync::{Arc, RwLock};

use super::{validate_ordered, EffectiveNetwork, InvalidTarget, OrderedPolicy};

/// The current policy, replaceable as a whole.
#[derive(Debug)]
pub struct LivePolicy {
    current: RwLock<Arc<EffectiveNetwork>>,
}

/// Why a policy change was refused; the policy is unchanged.
#[derive(Debug, thiserror::Error)]
pub enum LiveChangeError {
    #[error("this Job's network is not an ordered policy (pvisor serve's networkPolicy): it cannot change while it runs")]
    NotOrdered,
    #[error("invalid policy: {0}")]
    Invalid(#[from] InvalidTarget),
}

impl LivePolicy {
    pub fn new(policy: EffectiveNetwork) -> Self {
        Self { current: RwLock::new(Arc::new(policy)) }
    }

    /// The policy now: what a connection that asks now is decided by.
    pub fn current(&self) -> Arc<EffectiveNetwork> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the ordered policy with `ordered`, checked first; returns
    /// the policy now in force.
    pub fn replace_ordered(&self, ordered: OrderedPolicy) -> Result<Arc<EffectiveNetwork>, LiveChangeError> {
        validate_ordered(&ordered)?;
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        if current.ordered.is_none() {
            return Err(LiveChangeError::NotOrdered);
        }
        let mut next = EffectiveNetwork::clone(&current);
        next.ordered = Some(ordered);
        *current = Arc::new(next);
        Ok(current.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{
        resolve, Decide, Decision, OrderedRule, PolicySpec, RuleAction, Scope, ScopedPolicy,
    };

    fn ordered(default_action: RuleAction, rules: &[(RuleAction, &str)]) -> OrderedPolicy {
        let rules =
            rules.iter().map(|(action, target)| OrderedRule { action: *action, target: (*target).into() });
        OrderedPolicy { default_action, rules: rules.collect(), source: "test".into() }
    }

    fn allowed(policy: &EffectiveNetwork, host: &str) -> bool {
        matches!(policy.decide(host, 443), Decision::Allow { .. })
    }

    #[test]
    fn a_change_takes_the_next_decision_and_leaves_the_one_in_flight() {
        let first = ordered(RuleAction::Deny, &[(RuleAction::Allow, "a.example.com")]);
        let spec = PolicySpec { mode: None, allow: vec![], deny: vec![], ordered: Some(first) };
        let admitted =
            resolve(&[ScopedPolicy { scope: Scope::CommandLine, source: "t".into(), spec }]).unwrap();
        let live = LivePolicy::new(admitted);
        let in_flight = live.current();
        assert!(allowed(&in_flight, "a.example.com") && !allowed(&in_flight, "b.example.com"));
        live.replace_ordered(ordered(RuleAction::Deny, &[(RuleAction::Allow, "b.example.com")])).unwrap();
        assert!(allowed(&live.current(), "b.example.com") && !allowed(&live.current(), "a.example.com"));
        assert!(allowed(&in_flight, "a.example.com"), "a decision already taken keeps its policy");
        let bad = ordered(RuleAction::Deny, &[(RuleAction::Allow, "")]);
        assert!(matches!(live.replace_ordered(bad), Err(LiveChangeError::Invalid(_))));
        assert!(allowed(&live.current(), "b.example.com"), "a refused change changes nothing");
    }

    #[test]
    fn only_an_ordered_policy_changes() {
        let spec =
            PolicySpec { mode: None, allow: vec!["a.example.com".into()], deny: vec![], ordered: None };
        let admitted =
            resolve(&[ScopedPolicy { scope: Scope::CommandLine, source: "t".into(), spec }]).unwrap();
        let live = LivePolicy::new(admitted);
        let change = ordered(RuleAction::Allow, &[]);
        assert!(matches!(live.replace_ordered(change), Err(LiveChangeError::NotOrdered)));
    }
}
