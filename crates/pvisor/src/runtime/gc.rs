//! `gc`: free the space of stages nobody needs any more.
//!
//! Removed: the staged files of Jobs whose changes were all applied or dropped
//! (or that staged nothing), checkpoints no Job's lineage refers to,
//! temporaries left by interrupted writes, and vm lower caches unused for as
//! long — all older than the threshold — plus lower caches of workspaces
//! that no longer exist.
//! Kept unless forced: unreviewed stages (pending or partially applied),
//! stages of Jobs without a confirmed result, and checkpoints a fork came
//! from. Live Jobs are never touched. Records are always kept.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use pvisor_core::event::EventKind;
use pvisor_core::records::JobRecord;
use pvisor_core::state::JobState;
use pvisor_core::store::Store;

use super::checkpoint;
use crate::effects::StageState;
use crate::records::views::{self, ViewError};
use crate::trace::{data, Trace};

/// One thing gc removed (or would remove).
#[derive(Debug, Clone, Serialize)]
pub struct Freed {
    pub what: String,
    pub path: PathBuf,
    pub bytes: u64,
}

/// One thing gc kept, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Kept {
    pub what: String,
    pub reason: String,
}

/// One thing gc meant to remove but could not; the rest went on regardless.
#[derive(Debug, Clone, Serialize)]
pub struct Failed {
    pub what: String,
    pub path: PathBuf,
    pub error: String,
}

#[derive(Debug, Default, Serialize)]
pub struct GcReport {
    pub freed: Vec<Freed>,
    pub kept: Vec<Kept>,
    pub failed: Vec<Failed>,
}

/// The space the tree at `path` frees when removed (sparse VM disks count
/// their blocks); walked without recursion, as a command shaped it.
pub fn size_of(path: &Path) -> u64 {
    pvisor_core::tree::allocated_bytes(path)
}

/// Removes a tree of any depth (see [`pvisor_core::tree::remove_tree`]). An
/// error names the entry.
pub fn remove_tree(path: &Path) -> Result<(), (PathBuf, std::io::Error)> {
    pvisor_core::tree::remove_tree(path)
}

/// How long a Job directory of an older pvisor (which wrote `job.json` in
/// place) may lack it before it counts as the leftover of a killed admission.
const UNLOCKED_GRACE: Duration = Duration::from_secs(60);

/// Whether any Attempt of the Run at `run_dir` has a live owner. Call with
/// the admission lock held exclusively: then no Run is between its creation
/// and its owner lock, and a Run without a held lock has no owner, ever.
fn run_is_owned(run_dir: &Path) -> bool {
    let attempts = run_dir.join("attempts");
    std::fs::read_dir(&attempts).into_iter().flatten().flatten().any(|attempt| {
        pvisor_core::store::OwnerLock::is_held(&attempt.path().join("owner.lock")).unwrap_or(true)
    })
}

/// Removes what a crash in admission (or import) left: a Run no Job refers to
/// whose owner is gone, a `jobs/.admitting-*` directory that was never
/// published, and a Job directory without `job.json`. Each is recognisable
/// and unowned, so it goes at once, whatever the age threshold.
fn collect_half_admitted(
    store: &Store,
    report: &mut GcReport,
    free: &impl Fn(&mut GcReport, String, PathBuf),
) {
    use pvisor_core::store::ADMITTING_PREFIX;
    // Admissions wait (for as long as this scan takes) rather than be mistaken for leftovers.
    let Ok(_no_admission) = pvisor_core::store::OwnerLock::acquire_blocking(&store.admission_lock_file())
    else {
        return;
    };
    let mut referenced = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(store.jobs_dir()).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let job_file = entry.path().join("job.json");
        if let Some(run) = name.strip_prefix(ADMITTING_PREFIX) {
            // Named after its Run: a publication whose admission died.
            let run_dir = store.root().join("runs").join(run);
            if run.parse::<pvisor_core::ids::RunId>().is_ok() && !run_is_owned(&run_dir) {
                free(report, format!("half-created Job of {run}"), entry.path());
            }
            continue;
        }
        match store.read::<JobRecord>(&job_file) {
            Ok(job) => {
                referenced.insert(job.run.to_string());
            }
            Err(e) if e.is_not_found() => {
                // Left by an older pvisor that wrote job.json in place.
                let is_job = name.parse::<pvisor_core::ids::JobId>().is_ok();
                if is_job && older_than(&entry.path(), UNLOCKED_GRACE) {
                    free(report, format!("half-created Job {name} (no job.json)"), entry.path());
                }
            }
            // A damaged job.json is evidence: kept, and `pvisor jobs` lists it.
            Err(_) => {}
        }
    }
    for entry in std::fs::read_dir(store.root().join("runs")).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.parse::<pvisor_core::ids::RunId>().is_err() || referenced.contains(&name) {
            continue;
        }
        // Ownership first, then publication: admission publishes the Job
        // before its owner can let go, so a Run found unowned here whose Job
        // exists was published before this check (after the listing above).
        if run_is_owned(&entry.path()) {
            continue;
        }
        let published = store
            .read::<pvisor_core::records::RunRecord>(&entry.path().join("run.json"))
            .is_ok_and(|run| store.job_file(&run.job).exists());
        if !published {
            free(report, format!("Run {name} of a Job whose admission was interrupted"), entry.path());
        }
    }
}

/// The vm executor's per-workspace lower caches are a speed-up only: each
/// running VM and checkpoint hard-linked the base image it uses, so
/// removing a cache never touches them (their blocks are freed when the
/// last link goes). A cache unused for `age`, or whose workspace is gone,
/// is retired under its lock; one a start holds right now is kept.
fn collect_lower_caches(
    store: &Store,
    age: Duration,
    dry_run: bool,
    report: &mut GcReport,
    free: &impl Fn(&mut GcReport, String, PathBuf),
) {
    let (caches, retired) = pvisor_vm::lower::lower_caches(store.root());
    for path in retired {
        free(report, "vm lower cache a gc was removing".into(), path);
    }
    for cache in caches {
        let what = match &cache.workspace {
            Some(ws) => format!("vm lower cache of {}", ws.display()),
            None => format!("vm lower cache {} (never published)", cache.dir.display()),
        };
        let gone = cache.workspace.as_ref().is_none_or(|ws| !ws.exists());
        let unused =
            cache.last_used.is_none_or(|t| SystemTime::now().duration_since(t).unwrap_or_default() >= age);
        if !gone && !unused {
            report.kept.push(Kept { what, reason: "a vm Job started from it within the threshold".into() });
        } else if dry_run {
            free(report, what, cache.dir);
        } else {
            match cache.retire() {
                Ok(Some(aside)) => free(report, what, aside),
                Ok(None) => report.kept.push(Kept { what, reason: "a vm Job is starting from it".into() }),
                Err(e) => report.failed.push(Failed { what, path: cache.dir, error: e.to_string() }),
            }
        }
    }
}

fn older_than(path: &Path, age: Duration) -> bool {
    std::fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .map(|t| SystemTime::now().duration_since(t).unwrap_or_default() >= age)
        .unwrap_or(false)
}

/// The VM disk images left in the Attempt directories of `job` (a vm
/// supervisor deletes them when it ends; one that was killed cannot).
/// Only for a Job with no live owner: a running VM still uses them.
pub fn leftover_vm_disks(store: &Store, job: &JobRecord) -> Vec<(String, PathBuf)> {
    let attempts = store
        .read::<pvisor_core::records::RunRecord>(&store.run_file(&job.run))
        .map_or(job.target_attempt, |r| r.attempts.max(job.target_attempt));
    let mut found = Vec::new();
    for n in 1..=attempts {
        let vm_dir = store.attempt_dir(&pvisor_core::ids::AttemptId::new(job.run.clone(), n)).join("vm");
        use pvisor_vm::checkpoint::{DELTA, LOWER, UPPER};
        // The staging tree of a delta is removed once imaged, unless the
        // supervisor was killed in between.
        for image in [LOWER, DELTA, UPPER, pvisor_vm::lower::DELTA_STAGING] {
            let path = vm_dir.join(image);
            if path.exists() {
                found.push((format!("leftover VM disk {image} of {} attempt {n}", job.id), path));
            }
        }
    }
    found
}

/// Collects garbage. `dry_run` only reports. A removal that fails (a file
/// the caller may not delete, a busy mount) is reported in `failed` and the
/// collection goes on: one stuck item must not keep every other one's space.
pub fn gc(store: &Store, age: Duration, dry_run: bool, force: bool) -> Result<GcReport, ViewError> {
    let mut gc =
        Collector { store, age, dry_run, force, report: GcReport::default(), needed: Default::default() };
    gc.stages()?;
    gc.execution_checkpoints()?;
    gc.workspace_checkpoints()?;
    let free = |report: &mut GcReport, what: String, path: PathBuf| free(dry_run, report, what, path);
    collect_lower_caches(store, age, dry_run, &mut gc.report, &free);
    collect_half_admitted(store, &mut gc.report, &free);
    gc.temporaries();
    Ok(gc.report)
}

/// Removes `path` (unless `dry_run`) and reports it freed, or failed.
fn free(dry_run: bool, report: &mut GcReport, what: String, path: PathBuf) {
    let bytes = size_of(&path);
    match if dry_run { Ok(()) } else { remove_tree(&path) } {
        Ok(()) => report.freed.push(Freed { what, path, bytes }),
        Err((at, source)) => {
            let error = format!("cannot remove {}: {source}", at.display());
            report.failed.push(Failed { what, path, error });
        }
    }
}

/// One collection: what it may remove, and what it found so far.
struct Collector<'a> {
    store: &'a Store,
    age: Duration,
    dry_run: bool,
    force: bool,
    report: GcReport,
    /// The checkpoints some Job's lineage refers to.
    needed: std::collections::BTreeSet<pvisor_core::ids::CheckpointId>,
}

impl Collector<'_> {
    fn free(&mut self, what: String, path: PathBuf) {
        free(self.dry_run, &mut self.report, what, path);
    }

    fn keep(&mut self, what: String, reason: &str) {
        self.report.kept.push(Kept { what, reason: reason.into() });
    }

    /// The stages of settled Jobs, and (on the way) which checkpoints a
    /// lineage needs.
    fn stages(&mut self) -> Result<(), ViewError> {
        let store = self.store;
        for id in store.list_jobs()? {
            let _ = crate::records::recovery::recover(store, &id);
            let job: JobRecord = match store.read(&store.job_file(&id)) {
                Ok(j) => j,
                Err(e) => {
                    self.keep(id.to_string(), &format!("unreadable: {e}"));
                    continue;
                }
            };
            if let Some(lineage) = &job.lineage {
                self.needed.insert(lineage.checkpoint.clone());
            }
            if store.stage_dir(&job.run).join("upper").exists() {
                self.stage(&job)?;
            }
        }
        Ok(())
    }

    /// The stage of `job`, if nothing needs it any more.
    fn stage(&mut self, job: &JobRecord) -> Result<(), ViewError> {
        let (store, id) = (self.store, &job.id);
        let stage = store.stage_dir(&job.run);
        let what = format!("stage of {id}");
        let status = match views::status(store, id) {
            Ok(s) => s,
            Err(e) => {
                self.keep(what, &format!("unreadable: {e}"));
                return Ok(());
            }
        };
        if status.live {
            self.keep(what, "the run is live");
            return Ok(());
        }
        if status.state == JobState::Suspended {
            self.keep(what, "the Job is suspended; its run continues on resume (kill it first)");
            return Ok(());
        }
        if !older_than(&store.job_file(id), self.age) {
            self.keep(what, "newer than the threshold");
            return Ok(());
        }
        if !reviewed(store, &status) && !self.force {
            let why = match status.state {
                JobState::Unknown | JobState::Lost => {
                    "no confirmed result; its staged files are the only copy (use --force)"
                }
                _ => "changes not yet applied or dropped (use --force)",
            };
            self.keep(what, why);
            return Ok(());
        }
        // Hold the stage's apply lock, and mark the stage collected (durably)
        // before removing anything: an apply never works from a half-removed stage.
        let _lock = if self.dry_run { None } else { Some(mark_collected(store, job, &stage)?) };
        for part in ["upper", "work", "root", "empty"] {
            let path = stage.join(part);
            if path.exists() {
                self.free(format!("stage of {id} ({part})"), path);
            }
        }
        Ok(())
    }

    /// Execution checkpoints (vm): a Job that can still continue keeps them
    /// all. Also the disk images a killed vm supervisor left.
    fn execution_checkpoints(&mut self) -> Result<(), ViewError> {
        let store = self.store;
        for id in store.list_jobs()? {
            let Ok(job) = store.read::<JobRecord>(&store.job_file(&id)) else { continue };
            let live = views::status(store, &id).map(|s| s.live).unwrap_or(true);
            // Disk images a killed vm supervisor left in its Attempt directory.
            if !live {
                for (what, path) in leftover_vm_disks(store, &job) {
                    if older_than(&path, self.age) {
                        self.free(what, path);
                    }
                }
            }
            let dir = store.exec_checkpoints_dir(&job.run);
            if dir.exists() {
                self.execution_checkpoints_of(&job, live, &dir);
            }
        }
        Ok(())
    }

    fn execution_checkpoints_of(&mut self, job: &JobRecord, live: bool, dir: &Path) {
        let id = &job.id;
        for ckpt_dir in pvisor_vm::checkpoint::list(dir) {
            let name = ckpt_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let what = format!("execution checkpoint {name} of {id}");
            if !job.state.is_terminal() || live {
                self.keep(what, "its Job can still continue from it (kill the Job first)");
            } else if self.needed.iter().any(|c| c.as_str() == name) && !self.force {
                self.keep(what, "a fork's lineage refers to it (use --force)");
            } else if !older_than(&ckpt_dir, self.age) {
                self.keep(what, "newer than the threshold");
            } else {
                // Held exclusively while removed: no execution fork starts from it meanwhile.
                match if self.dry_run { Ok(None) } else { checkpoint::try_claim(self.store, &name) } {
                    Ok(None) if !self.dry_run => self.keep(what, "in use by a running execution fork"),
                    _ => self.free(what, ckpt_dir),
                }
            }
        }
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let partial = entry.file_name().to_string_lossy().starts_with(".partial-");
            if partial && !live && older_than(&entry.path(), self.age) {
                self.free(format!("interrupted execution checkpoint of {id}"), entry.path());
            }
        }
    }

    /// Workspace checkpoints no lineage needs.
    fn workspace_checkpoints(&mut self) -> Result<(), ViewError> {
        let store = self.store;
        for (ckpt, manifest) in checkpoint::list(store)? {
            let dir = store.checkpoint_dir(&ckpt);
            // Held exclusively while removed, so no fork can start from it meanwhile.
            let claim = if self.dry_run { None } else { checkpoint::try_claim(store, ckpt.as_str())? };
            if claim.is_none() && !self.dry_run {
                self.keep(ckpt.to_string(), "in use by a running fork or checkpoint");
            } else if self.needed.contains(&ckpt) && !self.force {
                self.keep(ckpt.to_string(), "a fork's lineage refers to it (use --force)");
            } else if !older_than(&dir, self.age) {
                self.keep(ckpt.to_string(), "newer than the threshold");
            } else {
                let label = match manifest {
                    Ok(m) => format!("checkpoint {ckpt} of {}", m.job),
                    Err(_) => format!("checkpoint {ckpt} (damaged)"),
                };
                self.free(label, dir);
                if claim.is_some() {
                    let _ = std::fs::remove_file(store.checkpoints_dir().join(format!(".use-{ckpt}.lock")));
                }
            }
        }
        Ok(())
    }

    /// Temporaries of interrupted writes: checkpoints in progress, records, restores.
    fn temporaries(&mut self) {
        let mut temps = self.checkpoint_temporaries();
        temps.extend(record_temporaries(self.store));
        for temp in temps {
            // A minute is far longer than any write takes; younger ones may be in flight.
            if older_than(&temp, self.age.max(Duration::from_secs(60))) {
                self.free("temporary of an interrupted write".into(), temp);
            }
        }
    }

    /// Frees the temporaries of checkpoints nobody is writing; returns those
    /// it could not tell about (a dry run), for the age check.
    fn checkpoint_temporaries(&mut self) -> Vec<PathBuf> {
        let store = self.store;
        let mut temps = Vec::new();
        for entry in std::fs::read_dir(store.checkpoints_dir()).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(id) = name.strip_prefix(".tmp-") else { continue };
            // A checkpoint being written is held by its writer; one nobody holds
            // was killed, and its temporary goes at once.
            match if self.dry_run { Ok(None) } else { checkpoint::try_claim(store, id) } {
                Ok(Some(_claim)) => {
                    self.free("temporary of an interrupted checkpoint".into(), entry.path());
                    let _ = std::fs::remove_file(store.checkpoints_dir().join(format!(".use-{id}.lock")));
                }
                Ok(None) if !self.dry_run => self.keep(format!("checkpoint {id}"), "being written right now"),
                Ok(None) | Err(_) => temps.push(entry.path()),
            }
        }
        temps
    }
}

/// Whether `status`'s changes were all applied or dropped (or there were
/// none). A Job closed as lost has no confirmed stage state; once its
/// changes are all dropped (the only thing it allows), it is reviewed.
fn reviewed(store: &Store, status: &views::JobStatus) -> bool {
    let lost_and_dropped = status.state == JobState::Lost
        && crate::effects::Stage::open(store, &status.job)
            .is_ok_and(|stage| matches!(stage.state(), StageState::Dropped | StageState::Empty));
    lost_and_dropped
        || matches!(status.stage_state, Some(StageState::Applied | StageState::Dropped | StageState::Empty))
}

/// Takes `stage`'s apply lock and marks it collected, durably and in the
/// Trace, before anything in it is removed.
fn mark_collected(
    store: &Store,
    job: &JobRecord,
    stage: &Path,
) -> Result<pvisor_core::store::OwnerLock, ViewError> {
    let lock = pvisor_core::store::OwnerLock::acquire_blocking(&stage.join("apply.lock"))?;
    pvisor_core::store::write_atomic(&stage.join("collected"), b"removed by pvisor gc\n")?;
    let _ = Trace::open(store, &job.run).emit(
        EventKind::StageCollected,
        Some(job.target_attempt),
        None,
        &data::By { by: "gc" },
        true,
    );
    Ok(lock)
}

/// The temporaries of interrupted record writes and restores, in every
/// Job's and Run's directory and stage.
fn record_temporaries(store: &Store) -> Vec<PathBuf> {
    let mut temps = Vec::new();
    for dir in [store.jobs_dir(), store.root().join("runs")] {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            for inner in std::fs::read_dir(entry.path()).into_iter().flatten().flatten() {
                let name = inner.file_name().to_string_lossy().into_owned();
                if name.contains(".tmp-") || name.starts_with(".restore-") {
                    temps.push(inner.path());
                }
            }
            let stage = entry.path().join("stage");
            for inner in std::fs::read_dir(&stage).into_iter().flatten().flatten() {
                if inner.file_name().to_string_lossy().starts_with(".restore-") {
                    temps.push(inner.path());
                }
            }
        }
    }
    temps
}
