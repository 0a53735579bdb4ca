//! pvisor-net: network policy for sandboxes.
//!
//! - [`policy`]: the modes (`none`, `proxy`, `host`), allow/deny rules, the
//!   merge of scoped policies (command line > workspace `.pvisor.toml` > user
//!   config) that admission performs exactly once, and per-request decisions;
//! - [`proxy`]: pvisor's own HTTP forward + CONNECT proxy. It runs on the host
//!   side and accepts connections on a listening socket that lives *inside* the
//!   sandbox's network namespace (created there and handed over), so the
//!   sandbox has no route out except through it;
//! - [`forward`]: the host loopback ports `HOST:PORT` rules open, forwarded
//!   as raw TCP into the sandbox's network namespace through the same
//!   decisions and records, for clients that ignore the proxy variables;
//! - [`broker`]: credential brokering (`--secret VAR@HOST`): the sandbox
//!   holds a placeholder, and the proxy puts the value into the headers of
//!   requests to that host alone, terminating TLS for it with a per-run CA.

pub mod broker;
pub mod forward;
pub mod policy;
pub mod proxy;
pub mod vault;

pub use policy::{
    Decide, EffectiveNetwork, LivePolicy, Mode, OrderedPolicy, OrderedRule, PolicySpec, RuleAction, Scope,
    ScopedPolicy,
};
