//! A Job's stage as effects see it: its change list (the Bundle's manifest
//! when a receipt binds it, a live scan otherwise), its conflict baselines
//! and ledger, and the review of each change. Opening and reviewing write
//! nothing.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use pvisor_core::ids::JobId;
use pvisor_core::records::{ChangeEntry, EntryType, JobRecord};
use pvisor_core::store::{self, RelPath, Store};
use pvisor_stage::apply::{self, Verdict};
use pvisor_stage::beneath::Root;
use pvisor_stage::commits;
use pvisor_stage::ledger::{Ledger, Outcome};
use pvisor_stage::names::Siblings;
use pvisor_stage::preimage::Preimages;
use pvisor_stage::StageError;

use super::commit_verdict::{judge_commit, CommitVerdict};
use super::{EffectsError, Sensitive, StageState};
use crate::records::views::{self, JobStatus, ViewError};

/// A Job's stage, ready to review or apply.
#[derive(Debug)]
pub struct Stage {
    pub status: JobStatus,
    pub job: JobRecord,
    /// The changes: the Bundle's manifest, or a live scan when unconfirmed.
    pub changes: Vec<ChangeEntry>,
    /// Whether `changes` comes from a Bundle bound by a valid receipt.
    pub confirmed: bool,
    /// Why the stage is not whole, as its Bundle records (see [`pvisor_core::records::Bundle::incomplete`]).
    pub incomplete: Option<String>,
    pub preimages: Option<Preimages>,
    pub outcomes: BTreeMap<RelPath, Outcome>,
    pub stage_dir: PathBuf,
    pub workspace: PathBuf,
}

impl Stage {
    /// Opens the stage of `job`.
    pub fn open(store: &Store, job: &JobId) -> Result<Self, EffectsError> {
        crate::records::recovery::recover(store, job)?;
        let (status, bundle) = views::status_with_bundle(store, job)?;
        let job_record: JobRecord = store.read(&store.job_file(job))?;
        let stage_dir = store.stage_dir(&status.run);
        let upper = stage_dir.join("upper");
        let mut binding = None;
        let mut incomplete = None;
        let (changes, confirmed) = match bundle {
            Some(bundle) => {
                binding = bundle.binding;
                incomplete = bundle.incomplete;
                (bundle.changes, true)
            }
            None if upper.is_dir() && status.workspace.is_dir() => {
                (pvisor_stage::scan(&upper, &status.workspace)?, false)
            }
            None => (Vec::new(), false),
        };
        let preimages_path = stage_dir.join("preimages.json");
        let preimages = match store::read_capped(&preimages_path, store::RECORD_READ_CAP) {
            Ok(bytes) => {
                // The conflict baselines decide what apply may overwrite:
                // only the ones the Bundle bound are trusted.
                let bound = binding.as_ref().and_then(|b| b.preimages_blake3.as_deref());
                if bound.is_some_and(|digest| digest != store::blake3_hex(&bytes)) {
                    return Err(ViewError::Unbound {
                        path: preimages_path,
                        reason: "its conflict baselines differ from the ones the Bundle binds".into(),
                    }
                    .into());
                }
                Some(store::parse_record::<Preimages>(&preimages_path, &bytes)?)
            }
            Err(e) if e.is_not_found() && binding.as_ref().is_some_and(|b| b.preimages_blake3.is_some()) => {
                return Err(ViewError::Unbound {
                    path: preimages_path,
                    reason: "it is missing, but the Bundle binds it".into(),
                }
                .into());
            }
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e.into()),
        };
        let workspace = status.workspace.clone();
        let mut outcomes = Ledger::new(&stage_dir, &status.run).outcomes()?;
        // What an interrupted apply already wrote is applied, whatever the
        // ledger's missing outcome line says (recorded by the next apply or drop).
        if let (true, Ok(ws)) = (confirmed, Root::open(&workspace)) {
            outcomes = apply::settle_interrupted(&ws, &changes, outcomes)?.0;
        }
        Ok(Self {
            status,
            job: job_record,
            changes,
            confirmed,
            incomplete,
            preimages,
            outcomes,
            stage_dir,
            workspace,
        })
    }

    /// How many changes are neither applied nor dropped.
    /// Refuses a stage that may not be applied: imported, live, suspended,
    /// lost or otherwise unconfirmed, each with what to do instead.
    pub fn require_confirmed(&self) -> Result<(), EffectsError> {
        super::require_confirmed(self)
    }

    pub fn remaining(&self) -> usize {
        if self.state() == StageState::Collected {
            return 0;
        }
        self.changes.iter().filter(|c| !self.outcomes.get(&c.path).is_some_and(Outcome::is_settled)).count()
    }

    pub fn state(&self) -> StageState {
        StageState::of_stage(&self.changes, &self.outcomes, &self.stage_dir)
    }

    /// The stage as it is once `outcomes` (just appended to the ledger by
    /// this process, under the writer locks) are in: its state and how many
    /// changes remain, without reading the stage again.
    pub(super) fn after(
        &mut self,
        outcomes: impl IntoIterator<Item = (RelPath, Outcome)>,
    ) -> (StageState, usize) {
        self.outcomes.extend(outcomes);
        (self.state(), self.remaining())
    }

    /// The directories the changes an apply may still write hang from
    /// (see [`apply::Parents`]).
    pub(super) fn parents(&self) -> apply::Parents<'_> {
        apply::Parents::new(
            self.changes.iter().filter(|c| !self.outcomes.get(&c.path).is_some_and(Outcome::is_settled)),
        )
    }

    pub(super) fn roots(&self) -> Result<(Root, Root), EffectsError> {
        if self.stage_dir.join("collected").exists() {
            return Err(EffectsError::Collected { job: self.status.job.clone() });
        }
        let ws = Root::open(&self.workspace)
            .map_err(|_| EffectsError::WorkspaceMissing { path: self.workspace.clone() })?;
        let upper_path = self.stage_dir.join("upper");
        let upper = Root::open(&upper_path).map_err(|e| StageError::io("open", &upper_path, e))?;
        Ok((ws, upper))
    }

    /// The review of every change: remaining ones with their conflict state,
    /// applied and dropped ones marked, sensitive ones with the reason.
    pub fn review(
        &self,
        patterns: &[String],
        sensitive: &Sensitive,
    ) -> Result<Vec<ReviewItem>, EffectsError> {
        let base_sensitive = sensitive;
        let selected = apply::select(&self.changes, patterns)?;
        let ws = Root::open(&self.workspace).ok();
        let upper = Root::open(&self.stage_dir.join("upper")).ok();
        let sensitive = sensitive.bind(&self.workspace, ws.as_ref(), upper.as_ref(), &self.changes);
        let empty = Preimages::none();
        let preimages = self.preimages.as_ref().unwrap_or(&empty);
        let mut items = Vec::with_capacity(selected.len());
        let mut host_names = NamesByDir::default();
        let mut parents = self.parents();
        let in_commit = self.commit_paths(ws.as_ref(), upper.as_ref(), base_sensitive);
        for i in selected {
            let change = &self.changes[i];
            let commit = in_commit.get(&change.path).cloned();
            let outcome = self.outcomes.get(&change.path);
            let applied = outcome == Some(&Outcome::Applied);
            let dropped = outcome == Some(&Outcome::Dropped);
            let (conflict, unsupported) = match (&ws, applied || dropped) {
                // A commit's paths are checked as a commit, when applied.
                (_, true) => (None, None),
                _ if commit.is_some() => (None, None),
                (None, false) => (Some("the workspace no longer exists".to_owned()), None),
                (Some(ws), false) => {
                    let preimage = preimages.get(&change.path);
                    match apply::verdict(ws, change, &mut parents, preimage, outcome, false)? {
                        Verdict::Conflict(reason) => (Some(reason), None),
                        Verdict::Unsupported(reason) => (None, Some(reason)),
                        Verdict::Apply { .. } | Verdict::AlreadyApplied => (None, None),
                    }
                }
            };
            let forbidden = sensitive.forbidden(change);
            let sensitive = match &commit {
                Some(commit) => commit.sensitive.clone(),
                None => sensitive.reason_for(change),
            };
            let confusable = self.confusable(ws.as_ref(), change, &mut host_names);
            items.push(ReviewItem {
                forbidden,
                change: change.clone(),
                applied,
                dropped,
                partly_applied: matches!(outcome, Some(Outcome::Partial(_))),
                conflict,
                unsupported,
                sensitive,
                confusable,
                commit,
            });
        }
        Ok(items)
    }

    /// The staged paths that make up a commit made in the sandbox (see
    /// `pvisor_stage::commits`), each with the refs it sets. Empty when the
    /// workspace has no repository of its own or the stage cannot be read:
    /// review then shows those paths one by one, as sensitive.
    fn commit_paths(
        &self,
        ws: Option<&Root>,
        upper: Option<&Root>,
        sensitive: &Sensitive,
    ) -> BTreeMap<RelPath, InCommit> {
        let (Some(ws), Some(upper)) = (ws, upper) else { return BTreeMap::new() };
        if !commits::host_repository(ws).unwrap_or(false) || !commits::git_available() {
            return BTreeMap::new();
        }
        let Ok(Some(staged)) = commits::find(&self.changes, ws, upper) else { return BTreeMap::new() };
        // What the commit carries is judged as apply judges it; one that
        // cannot be checked here is refused there, so it is not marked.
        let checked = commits::verify(&self.workspace, upper, &self.changes, staged.clone(), &self.stage_dir);
        let staged_changes = (self.workspace.as_path(), self.changes.as_slice());
        let why = checked.ok().and_then(|c| match judge_commit(&c, sensitive, staged_changes, (ws, upper)) {
            CommitVerdict::Free => None,
            CommitVerdict::Sensitive(why) => Some(why),
            CommitVerdict::Forbidden(why) => Some(format!("never applied: {why}")),
        });
        staged
            .members
            .iter()
            .map(|&i| {
                let refs = staged.refs.iter().filter(|r| r.change == i);
                let refs = refs.map(|r| (r.name.clone(), r.new.clone())).collect();
                let commit = InCommit { refs, paths: staged.members.len(), sensitive: why.clone() };
                (self.changes[i].path.clone(), commit)
            })
            .collect()
    }

    /// Why `change`'s name could be mistaken for another (see
    /// `pvisor_stage::names`): compared with the host directory's entries
    /// and the staged names beside it, gathered once per directory in
    /// `seen`. A deletion names a host entry as it is and is not marked.
    fn confusable(&self, ws: Option<&Root>, change: &ChangeEntry, seen: &mut NamesByDir) -> Option<String> {
        let path = change.path.as_path();
        let name = path.file_name()?;
        if change.entry == EntryType::None {
            return None;
        }
        let parent = path.parent().unwrap_or(Path::new(""));
        if seen.staged.is_empty() {
            for c in &self.changes {
                let p = c.path.as_path();
                if let Some(n) = p.file_name() {
                    let dir = p.parent().unwrap_or(Path::new("")).to_path_buf();
                    seen.staged.entry(dir).or_default().push(n.to_os_string());
                }
            }
        }
        let staged = &seen.staged;
        let siblings = seen.dirs.entry(parent.to_path_buf()).or_insert_with(|| {
            let host = ws.and_then(|ws| ws.list(parent).ok()).unwrap_or_default();
            let here = staged.get(parent).map(Vec::as_slice).unwrap_or_default();
            Siblings::new(host.iter().chain(here).map(|n| n.as_os_str()))
        });
        siblings.confusable(name)
    }

    /// Opens the workspace and stage roots for rendering diffs. A workspace
    /// that does not exist here (an imported Job) diffs against nothing.
    pub fn diff_roots(&self) -> Result<(Root, Root), EffectsError> {
        if self.workspace.is_dir() || self.stage_dir.join("collected").exists() {
            return self.roots();
        }
        let empty = self.stage_dir.join("empty");
        store::create_dir_all_private(&empty)?;
        let ws = Root::open(&empty).map_err(|e| StageError::io("open", &empty, e))?;
        let upper_path = self.stage_dir.join("upper");
        let upper = Root::open(&upper_path).map_err(|e| StageError::io("open", &upper_path, e))?;
        Ok((ws, upper))
    }
}

/// One change as review shows it.
#[derive(Debug, Clone)]
pub struct ReviewItem {
    pub change: ChangeEntry,
    pub applied: bool,
    pub dropped: bool,
    /// Some of its hunks are on the host (`apply -p`); the rest remain.
    pub partly_applied: bool,
    /// Why apply would refuse this change without `--force`.
    pub conflict: Option<String>,
    /// Why apply never writes this change (device nodes, fifos, sockets).
    pub unsupported: Option<String>,
    /// Why applying this change needs explicit consent (it makes the host run code).
    pub sensitive: Option<String>,
    /// Why this change is never applied (it is pvisor's own configuration or state).
    pub forbidden: Option<String>,
    /// Why its name could be mistaken for another (a trailing or no-break
    /// space, an invisible character, a sibling that differs only so).
    pub confusable: Option<String>,
    /// Part of a commit made in the sandbox: applied as that commit (see
    /// `pvisor_stage::commits`), never as a file.
    pub commit: Option<InCommit>,
}

/// How a staged path belongs to a commit made in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InCommit {
    /// The branches and tags this path sets, with the sandbox's value.
    pub refs: Vec<(String, String)>,
    /// How many staged paths the commit is made of.
    pub paths: usize,
    /// Why landing the commit needs consent (a path it changes is
    /// sensitive), or `None`.
    pub sensitive: Option<String>,
}

/// The names beside each reviewed path, for [`ReviewItem::confusable`].
#[derive(Default)]
struct NamesByDir {
    staged: HashMap<PathBuf, Vec<std::ffi::OsString>>,
    dirs: HashMap<PathBuf, Siblings>,
}

impl ReviewItem {
    pub fn remaining(&self) -> bool {
        !self.applied && !self.dropped
    }
}
