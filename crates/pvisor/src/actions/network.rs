//! Changing a running Job's network policy.

use pvisor_core::ids::JobId;
use pvisor_net::OrderedPolicy;

use super::{Action, Runtime, RuntimeError};
use crate::session::policy_control;

/// Replaces the ordered policy (`pvisor serve`'s `networkPolicy`) that the
/// running Job's proxy decides by: connections made from then on are
/// decided by `policy`, those already made finish as they were admitted,
/// and the Job's Trace records the change (`network.policy_changed`).
#[derive(Debug)]
pub struct ChangeNetworkPolicy {
    pub job: JobId,
    pub policy: OrderedPolicy,
}

impl Action for ChangeNetworkPolicy {
    const NAME: &'static str = "change-network-policy";
    type Outcome = ();

    fn perform(self, runtime: &Runtime) -> Result<(), RuntimeError> {
        let live = runtime.job(&self.job)?;
        runtime.require_running(&live, "only a running Job's policy can change")?;
        if live.run.operation.policy.network.ordered.is_none() {
            return Err(RuntimeError::PolicyChange {
                job: self.job,
                why: "its network is not an ordered policy (pvisor serve's networkPolicy), which alone can change while it runs".into(),
            });
        }
        policy_control::request(&live.attempt_dir, &self.policy)
            .map_err(|e| RuntimeError::PolicyChange { job: self.job, why: e.to_string() })
    }
}
