//! Actions on run sessions (see [`crate::run_sessions`]): begin a session's
//! next run, read a session with each change attributed to its run, and
//! close a session whose head has nothing left.

use std::path::PathBuf;

use pvisor_core::ids::{CheckpointId, JobId};
use pvisor_core::records::ChangeEntry;
use pvisor_core::store::{OwnerLock, StoreError};

use super::{Action, Runtime, RuntimeError};
use crate::effects::{self, Stage, StageState};
use crate::run_sessions::{attribute, Attributed, SessionError, SessionName, SessionPlace, SessionRecord};
use crate::runtime::checkpoint::{self, CheckpointHold};

/// Begins the next run of session `name` in `workspace`: takes its run lock
/// (calling `waiting` first when another run of it is live, then blocking),
/// starts a new session when the name has none open (or its head has
/// nothing left, which closes it), and checkpoints the head's staged
/// changes for the new run to fork from.
pub struct BeginSessionRun<'a> {
    pub workspace: PathBuf,
    pub name: String,
    pub waiting: Box<dyn FnOnce() + 'a>,
}

impl std::fmt::Debug for BeginSessionRun<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BeginSessionRun")
            .field("workspace", &self.workspace)
            .field("name", &self.name)
            .finish()
    }
}

/// A session's run in progress: holds the session's run lock until dropped.
#[derive(Debug)]
pub struct SessionTurn {
    place: SessionPlace,
    pub record: SessionRecord,
    /// The head's checkpoint the run forks from; `None` when the session
    /// has nothing staged yet. The hold keeps `gc` away until the run ends.
    pub fork: Option<(CheckpointId, CheckpointHold)>,
    /// The run whose stage the fork copies (`fork`'s Job).
    pub stands_on: Option<JobId>,
    /// The run whose agent state (`--state`) this run carries forward: the
    /// session's newest run that ran with agent state, staged or not.
    pub state_from: Option<JobId>,
    /// The session this name had before, closed because its head had
    /// nothing left.
    pub closed_before: Option<SessionRecord>,
    /// Starting a new session: open sessions of the same name whose
    /// workspace no longer exists (moved or removed), whose staged work
    /// this run does not see.
    pub stranded: Vec<SessionRecord>,
    _lock: OwnerLock,
}

impl SessionTurn {
    /// Durably records `job` as the session's newest run; call it as soon
    /// as the run is admitted.
    pub fn admitted(&mut self, job: &JobId) -> Result<(), StoreError> {
        self.record.jobs.push(job.clone());
        self.place.save(&self.record)
    }
}

impl Action for BeginSessionRun<'_> {
    const NAME: &'static str = "begin-session-run";
    type Outcome = SessionTurn;

    fn perform(self, runtime: &Runtime) -> Result<SessionTurn, RuntimeError> {
        let store = &runtime.store;
        let name: SessionName = self.name.parse().map_err(SessionError::from)?;
        let place = SessionPlace::of(store, &self.workspace)?;
        let lock = place.lock(&name, self.waiting)?;
        let mut closed_before = None;
        let mut fork = None;
        let mut stands_on = None;
        let record = match place.open_session(&name)? {
            Some(record) => match fork_source(runtime, &record)? {
                Source::Closed(how) => {
                    closed_before = Some(close(runtime, &place, record, how)?);
                    SessionRecord::new(name, place.workspace.clone())
                }
                Source::Nothing => record,
                Source::Job(job) => {
                    let (manifest, hold) = checkpoint::checkpoint(store, &job)?;
                    fork = Some((manifest.id, hold));
                    stands_on = Some(job);
                    record
                }
            },
            None => SessionRecord::new(name, place.workspace.clone()),
        };
        let state_from = state_source(runtime, &record)?;
        let stranded = if record.jobs.is_empty() {
            crate::run_sessions::stranded(store, &record.name)
        } else {
            Vec::new()
        };
        Ok(SessionTurn { place, record, fork, stands_on, state_from, closed_before, stranded, _lock: lock })
    }
}

/// What the next run of a session starts from.
enum Source {
    /// The session's changes were all applied or dropped: it is over.
    Closed(StageState),
    /// Nothing is staged yet: the workspace alone.
    Nothing,
    /// This Job's stage.
    Job(JobId),
}

/// The newest run whose stage the session stands on, with its stage, and
/// the runs it stepped over. A run that never started its command (a setup
/// failure) or was closed as lost (its supervisor died) holds at most a
/// copy of what came before it, or a part of it: the run before it stands
/// instead. `None` when no run stands (all were stepped over).
fn standing(runtime: &Runtime, record: &SessionRecord) -> Result<Option<Stage>, RuntimeError> {
    for job in record.jobs.iter().rev() {
        let stage = Stage::open(&runtime.store, job)?;
        if stepped_over(&stage) {
            continue;
        }
        return Ok(Some(stage));
    }
    Ok(None)
}

/// Whether the session steps over this run: it never started its command
/// (a setup failure), or it was closed as lost.
fn stepped_over(stage: &Stage) -> bool {
    let never_ran = stage.confirmed && stage.status.exit_code.is_none() && stage.status.signal.is_none();
    never_ran || stage.status.state == pvisor_core::state::JobState::Lost
}

/// The newest run of the session that ran with agent state: what the next
/// run's state carries from, past runs without any (a plain command
/// between two agent runs).
fn state_source(runtime: &Runtime, record: &SessionRecord) -> Result<Option<JobId>, RuntimeError> {
    for job in record.jobs.iter().rev() {
        if !crate::agent_state::has_state(&runtime.store, job) {
            continue;
        }
        if !stepped_over(&Stage::open(&runtime.store, job)?) {
            return Ok(Some(job.clone()));
        }
    }
    Ok(None)
}

/// What the next run of a session starts from: the standing run's stage,
/// which must have a confirmed result.
fn fork_source(runtime: &Runtime, record: &SessionRecord) -> Result<Source, RuntimeError> {
    let Some(stage) = standing(runtime, record)? else { return Ok(Source::Nothing) };
    if !stage.confirmed {
        return Err(SessionError::HeadUnconfirmed {
            name: record.name.to_string(),
            job: stage.status.job.clone(),
            state: stage.status.state.to_string(),
        }
        .into());
    }
    Ok(match stage.state() {
        state @ (StageState::Applied | StageState::Dropped | StageState::Collected) => Source::Closed(state),
        StageState::Empty => Source::Nothing,
        StageState::Pending | StageState::PartiallyApplied => Source::Job(stage.status.job.clone()),
    })
}

/// Closes a session: the earlier runs' stages, which the head superseded,
/// are dropped (what they held was applied or dropped through the head),
/// then the record moves to `closed/`.
fn close(
    runtime: &Runtime,
    place: &SessionPlace,
    record: SessionRecord,
    how: StageState,
) -> Result<SessionRecord, RuntimeError> {
    let head = standing(runtime, &record)?.map(|stage| stage.status.job);
    for job in record.jobs.iter().filter(|job| Some(*job) != head.as_ref()) {
        let stage = Stage::open(&runtime.store, job)?;
        if matches!(stage.state(), StageState::Pending | StageState::PartiallyApplied) {
            effects::drop_changes(&runtime.store, job, &[])?;
        }
    }
    Ok(place.close(record, how.as_str())?)
}

/// Reads session `name` of `workspace`: its record and every run's changes.
#[derive(Debug)]
pub struct ReadSession {
    pub workspace: PathBuf,
    pub name: String,
}

/// A session as it stands.
#[derive(Debug)]
pub struct SessionView {
    pub record: SessionRecord,
    /// Each run's full change list, oldest first.
    pub runs: Vec<(JobId, Vec<ChangeEntry>)>,
    /// The standing head's stage (see `standing`): what the session has
    /// staged now.
    pub head: Option<Stage>,
    /// The run whose agent state the session's next run carries (see
    /// `state_source`): what `review --state`, `state approve` and
    /// `state promote` act on.
    pub state_head: Option<JobId>,
}

impl SessionView {
    /// The Job the session stands on: what review, apply and drop act on.
    pub fn head_job(&self) -> Option<&JobId> {
        self.head.as_ref().map(|stage| &stage.status.job)
    }

    /// Every change the session still holds (neither applied nor dropped),
    /// with the run that made it.
    pub fn remaining(&self) -> Vec<Attributed<'_>> {
        let Some(head) = &self.head else { return Vec::new() };
        attribute(&self.runs).into_iter().filter(|a| !head.outcomes.contains_key(&a.change.path)).collect()
    }
}

impl Action for ReadSession {
    const NAME: &'static str = "read-session";
    type Outcome = SessionView;

    fn perform(self, runtime: &Runtime) -> Result<SessionView, RuntimeError> {
        let name: SessionName = self.name.parse().map_err(SessionError::from)?;
        let place = SessionPlace::of(&runtime.store, &self.workspace)?;
        let record = place.require(&runtime.store, &name)?;
        let head = standing(runtime, &record)?;
        let mut runs = Vec::new();
        for job in &record.jobs {
            let stage = Stage::open(&runtime.store, job)?;
            if !stepped_over(&stage) {
                runs.push((job.clone(), stage.changes.clone()));
            }
            if head.as_ref().is_some_and(|h| &h.status.job == job) {
                break;
            }
        }
        let state_head = state_source(runtime, &record)?;
        Ok(SessionView { record, runs, head, state_head })
    }
}

/// Closes session `name` of `workspace` if its head has nothing left
/// (everything applied or dropped); the outcome is the closed record.
/// While a run of the session is live, that run's turn decides instead.
#[derive(Debug)]
pub struct CloseSessionIfDone {
    pub workspace: PathBuf,
    pub name: String,
}

impl Action for CloseSessionIfDone {
    const NAME: &'static str = "close-session-if-done";
    type Outcome = Option<SessionRecord>;

    fn perform(self, runtime: &Runtime) -> Result<Option<SessionRecord>, RuntimeError> {
        let name: SessionName = self.name.parse().map_err(SessionError::from)?;
        let place = SessionPlace::of(&runtime.store, &self.workspace)?;
        let Some(_lock) = place.try_lock(&name)? else { return Ok(None) };
        let Some(record) = place.open_session(&name)? else { return Ok(None) };
        // Called after an apply or drop of the session: a head with nothing
        // left (nothing staged counts: a drop of everything) ends it.
        let state = standing(runtime, &record)?.filter(|stage| stage.confirmed).map(|stage| stage.state());
        match state {
            Some(
                how @ (StageState::Applied | StageState::Dropped | StageState::Collected | StageState::Empty),
            ) => Ok(Some(close(runtime, &place, record, how)?)),
            _ => Ok(None),
        }
    }
}

/// The open sessions of `workspace`, by name.
#[derive(Debug)]
pub struct ListSessions {
    pub workspace: PathBuf,
}

impl Action for ListSessions {
    const NAME: &'static str = "list-sessions";
    type Outcome = Vec<SessionRecord>;

    fn perform(self, runtime: &Runtime) -> Result<Vec<SessionRecord>, RuntimeError> {
        let place = SessionPlace::of(&runtime.store, &self.workspace)?;
        Ok(place.list()?)
    }
}

/// Holds session `name` of `workspace` against new runs while an apply or
/// drop acts on its head; refused while a run of it is live (its head is
/// about to change, and a drop could come back with the new run's fork).
#[derive(Debug)]
pub struct HoldSession {
    pub workspace: PathBuf,
    pub name: String,
}

/// The hold of [`HoldSession`]; released when dropped.
#[derive(Debug)]
pub struct SessionHold {
    _lock: OwnerLock,
}

impl Action for HoldSession {
    const NAME: &'static str = "hold-session";
    type Outcome = SessionHold;

    fn perform(self, runtime: &Runtime) -> Result<SessionHold, RuntimeError> {
        let name: SessionName = self.name.parse().map_err(SessionError::from)?;
        let place = SessionPlace::of(&runtime.store, &self.workspace)?;
        match place.try_lock(&name)? {
            Some(lock) => Ok(SessionHold { _lock: lock }),
            None => Err(SessionError::Busy { name: name.to_string() }.into()),
        }
    }
}
