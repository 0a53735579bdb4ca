//! Applying some hunks of modified text files (`apply -p`): each written
//! file stays a remaining change whose baseline is what was written.

use pvisor_core::event::EventKind;
use pvisor_core::ids::JobId;
use pvisor_core::records::ChangeEntry;
use pvisor_core::store::{RelPath, Store};
use pvisor_stage::apply::{self, NoMatch, Verdict};
use pvisor_stage::ledger::{Ledger, Outcome, PartialState};
use pvisor_stage::preimage::Preimages;

use super::writers::{open_for_apply, open_trace};
use super::{EffectsError, Sensitive, StageState};
use crate::trace::data;

/// The hunks chosen of one modified text file (`apply -p`): the file to
/// write, and the host content the hunks were shown against.
#[derive(Debug, Clone)]
pub struct HunkChoice {
    pub path: RelPath,
    /// Content digest of the host file the hunks were computed from.
    pub host_blake3: String,
    /// That host file with the chosen hunks in it.
    pub contents: Vec<u8>,
}

/// What [`apply_hunks`] did.
#[derive(Debug, Default)]
pub struct HunksReport {
    /// Paths now holding some of their hunks, and what the host holds.
    pub written: Vec<(ChangeEntry, PartialState)>,
    /// Paths not written, and why (the host file changed since the hunks were shown…).
    pub refused: Vec<(ChangeEntry, String)>,
    pub state: Option<StageState>,
}

/// Writes some hunks of modified text files (`apply -p`). Each path must be
/// a remaining change whose host file still equals its conflict baseline and
/// still holds exactly the text the hunks were shown against; otherwise it is
/// refused and nothing is written to it. The path stays a remaining change
/// whose baseline is now what was written, so its other hunks can be applied
/// or dropped later, and a host edit after this is still a conflict.
/// pvisor's own config and state (see [`Sensitive`]) are refused here too,
/// whatever the caller chose.
pub fn apply_hunks(
    store: &Store,
    job: &JobId,
    choices: &[HunkChoice],
    sensitive: &Sensitive,
) -> Result<HunksReport, EffectsError> {
    let (mut stage, _locks) = open_for_apply(store, job)?;
    let (ws, upper) = stage.roots()?;
    let bound = sensitive.bind(&stage.workspace, Some(&ws), Some(&upper), &stage.changes);
    let empty = Preimages::none();
    let preimages = stage.preimages.as_ref().unwrap_or(&empty);
    let ledger = Ledger::new(&stage.stage_dir, &stage.status.run);
    let (mut trace, terminal) = open_trace(store, &stage)?;
    let attempt = Some(stage.status.attempt.number());
    let mut report = HunksReport::default();
    let mut started = None;
    let mut parents = stage.parents();
    for choice in choices {
        let Some(change) = stage.changes.iter().find(|c| c.path == choice.path) else {
            return Err(
                NoMatch::Nothing { pattern: choice.path.as_path().to_string_lossy().into_owned() }.into()
            );
        };
        let outcome = stage.outcomes.get(&change.path);
        let refusal = if let Some(why) = bound.forbidden(change) {
            Some(format!("never applied: {why}"))
        } else if outcome.is_some_and(Outcome::is_settled) {
            Some("it was applied or dropped meanwhile".to_owned())
        } else {
            let preimage = preimages.get(&change.path);
            match apply::verdict(&ws, change, &mut parents, preimage, outcome, false)? {
                Verdict::Apply { forced: false } => None,
                Verdict::Conflict(reason) => Some(reason),
                Verdict::AlreadyApplied => Some("the host already holds the staged file".into()),
                Verdict::Apply { forced: true } | Verdict::Unsupported(_) => {
                    Some("not a modified text file".into())
                }
            }
        };
        let host = pvisor_stage::preimage::host_state(&ws, change)?;
        let (mode, digest) = match &host {
            pvisor_stage::preimage::HostState::Present { mode, blake3, .. } => (*mode, blake3.clone()),
            pvisor_stage::preimage::HostState::Absent => (0, None),
        };
        let refusal = refusal.or_else(|| {
            (digest.as_deref() != Some(choice.host_blake3.as_str()))
                .then(|| "the host file changed after its hunks were shown".to_owned())
        });
        if let Some(reason) = refusal {
            report.refused.push((change.clone(), reason));
            continue;
        }
        let cause = match started {
            Some(seq) => seq,
            None => {
                let begun = data::ApplyStarted { selected: choices.len(), force: None, hunks: Some(true) };
                let seq = trace.emit(EventKind::ApplyStarted, attempt, terminal, &begun, false)?;
                started = Some(seq);
                seq
            }
        };
        let state = apply::write_partial(&ws, &ledger, change, &choice.contents, mode)?;
        let written = data::ApplyHunks { path: &change.path, blake3: &state.blake3, size: state.size };
        trace.emit(EventKind::ApplyHunks, attempt, Some(cause), &written, true)?;
        report.written.push((change.clone(), state));
    }
    let written = report.written.iter().map(|(c, s)| (c.path.clone(), Outcome::Partial(s.clone())));
    report.state = Some(stage.after(written.collect::<Vec<_>>()).0);
    Ok(report)
}
