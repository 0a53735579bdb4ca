//! What a frontend asks of a running Job's Session: a new network policy,
//! a credential vault, a note for its Trace.

use pvisor_core::ids::JobId;
use pvisor_net::vault::ActiveVault;
use pvisor_net::OrderedPolicy;

use super::{Action, Runtime, RuntimeError};
use crate::session::job_control::{self, FrontendNote};

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
        job_control::change_policy(&live.attempt_dir, &self.policy)
            .map_err(|e| RuntimeError::PolicyChange { job: self.job, why: e.to_string() })
    }
}

/// Puts a credential vault in force in the running Job's proxy (`None`:
/// none): requests that its bindings match get their headers from then
/// on. The values go to the Job's Session over its control socket and stay
/// in its memory; the Trace records the revision and binding names
/// (`network.vault_changed`). Nothing keeps the vault across a resume: the
/// frontend that holds it puts it in force again.
#[derive(Debug)]
pub struct ChangeCredentialVault {
    pub job: JobId,
    pub vault: Option<ActiveVault>,
}

impl Action for ChangeCredentialVault {
    const NAME: &'static str = "change-credential-vault";
    type Outcome = ();

    fn perform(self, runtime: &Runtime) -> Result<(), RuntimeError> {
        let live = runtime.job(&self.job)?;
        runtime.require_running(&live, "only a running Job's credential vault can change")?;
        job_control::change_vault(&live.attempt_dir, self.vault.as_ref())
            .map_err(|e| RuntimeError::VaultChange { job: self.job, why: e.to_string() })
    }
}

/// Has the running Job's Trace record what a frontend did through its
/// guest (a `frontend.command` event).
#[derive(Debug)]
pub struct NoteInTrace {
    pub job: JobId,
    pub note: FrontendNote,
}

impl Action for NoteInTrace {
    const NAME: &'static str = "note-in-trace";
    type Outcome = ();

    fn perform(mut self, runtime: &Runtime) -> Result<(), RuntimeError> {
        let live = runtime.job(&self.job)?;
        runtime.require_running(&live, "only a running Job's Trace takes notes")?;
        self.note.command = bounded(self.note.command);
        self.note.error = self.note.error.map(bounded);
        job_control::note(&live.attempt_dir, &self.note)
            .map_err(|e| RuntimeError::Note { job: self.job, why: e.to_string() })
    }
}

/// Texts longer than this (a client's code, a long command line) are cut
/// in the Trace, saying how long they were.
const MAX_NOTED_TEXT: usize = 4096;

fn bounded(text: String) -> String {
    if text.len() <= MAX_NOTED_TEXT {
        return text;
    }
    let mut end = MAX_NOTED_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..end], text.len())
}
