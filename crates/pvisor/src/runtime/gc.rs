//! `gc`: free the space of stages nobody needs any more.
//!
//! Removed: the staged files of Jobs whose changes were all applied or dropped
//! (or that staged nothing), checkpoints no Job's lineage refers to, and
//! temporaries left by interrupted writes — all older than the threshold.
//! Kept unless forced: unreviewed stages (pending or partially applied),
//! stages of Jobs without a confirmed result, and checkpoints a fork came
//! from. Live Jobs are never touched. Records are always kept.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde_json::json;

use pvisor_core::records::JobRecord;
use pvisor_core::state::JobState;
use pvisor_core::store::Store;

use super::checkpoint;
use super::job_service::views::{self, ViewError};
use crate::effects::StageState;
use crate::trace::Trace;

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

fn size_of(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return 0 };
    if !meta.is_dir() {
        // Space actually freed: sparse VM disks are mostly holes.
        use std::os::unix::fs::MetadataExt;
        return meta.len().min(meta.blocks() * 512);
    }
    std::fs::read_dir(path).map(|entries| entries.flatten().map(|e| size_of(&e.path())).sum()).unwrap_or(0)
}

/// Removes a tree, making directories writable first (overlay work dirs are
/// 000). An error names the entry that could not be removed.
fn remove_tree(path: &Path) -> Result<(), (PathBuf, std::io::Error)> {
    use std::os::unix::fs::PermissionsExt;
    let at = |e| (path.to_owned(), e);
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.is_dir() {
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700));
            for entry in std::fs::read_dir(path).map_err(at)?.flatten() {
                remove_tree(&entry.path())?;
            }
            return std::fs::remove_dir(path).map_err(at);
        }
        return std::fs::remove_file(path).map_err(at);
    }
    Ok(())
}

fn older_than(path: &Path, age: Duration) -> bool {
    std::fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .map(|t| SystemTime::now().duration_since(t).unwrap_or_default() >= age)
        .unwrap_or(false)
}

/// Collects garbage. `dry_run` only reports. A removal that fails (a file
/// the caller may not delete, a busy mount) is reported in `failed` and the
/// collection goes on: one stuck item must not keep every other one's space.
pub fn gc(store: &Store, age: Duration, dry_run: bool, force: bool) -> Result<GcReport, ViewError> {
    let mut report = GcReport::default();
    let mut needed_checkpoints = std::collections::BTreeSet::new();
    let free = |report: &mut GcReport, what: String, path: PathBuf| {
        let bytes = size_of(&path);
        match if dry_run { Ok(()) } else { remove_tree(&path) } {
            Ok(()) => report.freed.push(Freed { what, path, bytes }),
            Err((at, source)) => {
                let error = format!("cannot remove {}: {source}", at.display());
                report.failed.push(Failed { what, path, error });
            }
        }
    };
    for id in store.list_jobs()? {
        let _ = super::recovery::recover(store, &id);
        let job: JobRecord = match store.read(&store.job_file(&id)) {
            Ok(j) => j,
            Err(e) => {
                report.kept.push(Kept { what: id.to_string(), reason: format!("unreadable: {e}") });
                continue;
            }
        };
        if let Some(lineage) = &job.lineage {
            needed_checkpoints.insert(lineage.checkpoint.clone());
        }
        let stage = store.stage_dir(&job.run);
        if !stage.join("upper").exists() {
            continue;
        }
        let status = match views::status(store, &id) {
            Ok(s) => s,
            Err(e) => {
                report.kept.push(Kept { what: format!("stage of {id}"), reason: format!("unreadable: {e}") });
                continue;
            }
        };
        let keep = |reason: &str| Kept { what: format!("stage of {id}"), reason: reason.into() };
        if status.live {
            report.kept.push(keep("the run is live"));
            continue;
        }
        if status.state == JobState::Suspended {
            report.kept.push(keep("the Job is suspended; its run continues on resume (kill it first)"));
            continue;
        }
        if !older_than(&store.job_file(&id), age) {
            report.kept.push(keep("newer than the threshold"));
            continue;
        }
        let reviewed =
            matches!(status.stage_state, Some(StageState::Applied | StageState::Dropped | StageState::Empty));
        if !reviewed && !force {
            let why = match status.state {
                JobState::Unknown | JobState::Lost => {
                    "no confirmed result; its staged files are the only copy (use --force)"
                }
                _ => "changes not yet applied or dropped (use --force)",
            };
            report.kept.push(keep(why));
            continue;
        }
        // Hold the stage's apply lock, and mark the stage collected (durably)
        // before removing anything: an apply never works from a half-removed stage.
        let _lock = if dry_run {
            None
        } else {
            let lock = pvisor_core::store::OwnerLock::acquire_blocking(&stage.join("apply.lock"))?;
            pvisor_core::store::write_atomic(&stage.join("collected"), b"removed by pvisor gc\n")?;
            if let Ok(mut trace) = Trace::reopen(store, &job.run) {
                let _ =
                    trace.emit("stage.collected", Some(job.target_attempt), None, json!({"by": "gc"}), true);
            }
            Some(lock)
        };
        for part in ["upper", "work", "root", "empty"] {
            let path = stage.join(part);
            if path.exists() {
                free(&mut report, format!("stage of {id} ({part})"), path);
            }
        }
    }
    // Execution checkpoints (vm): a Job that can still continue keeps them all.
    for id in store.list_jobs()? {
        let Ok(job) = store.read::<JobRecord>(&store.job_file(&id)) else { continue };
        let live = views::status(store, &id).map(|s| s.live).unwrap_or(true);
        // Disk images a killed vm supervisor left in its Attempt directory.
        if !live {
            let attempts = store
                .read::<pvisor_core::records::RunRecord>(&store.run_file(&job.run))
                .map_or(job.target_attempt, |r| r.attempts.max(job.target_attempt));
            for n in 1..=attempts {
                let vm_dir =
                    store.attempt_dir(&pvisor_core::ids::AttemptId::new(job.run.clone(), n)).join("vm");
                for image in ["lower.img", "upper.img"] {
                    let path = vm_dir.join(image);
                    if path.exists() && older_than(&path, age) {
                        free(&mut report, format!("leftover VM disk {image} of {id} attempt {n}"), path);
                    }
                }
            }
        }
        let dir = store.exec_checkpoints_dir(&job.run);
        if !dir.exists() {
            continue;
        }
        for ckpt_dir in pvisor_sandbox::vm::checkpoint::list(&dir) {
            let name = ckpt_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let keep = |reason: &str| Kept {
                what: format!("execution checkpoint {name} of {id}"),
                reason: reason.into(),
            };
            if !job.state.is_terminal() || live {
                report.kept.push(keep("its Job can still continue from it (kill the Job first)"));
            } else if needed_checkpoints.iter().any(|c| c.as_str() == name) && !force {
                report.kept.push(keep("a fork's lineage refers to it (use --force)"));
            } else if !older_than(&ckpt_dir, age) {
                report.kept.push(keep("newer than the threshold"));
            } else {
                free(&mut report, format!("execution checkpoint {name} of {id}"), ckpt_dir);
            }
        }
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let partial = entry.file_name().to_string_lossy().starts_with(".partial-");
            if partial && !live && older_than(&entry.path(), age) {
                free(&mut report, format!("interrupted execution checkpoint of {id}"), entry.path());
            }
        }
    }
    for (ckpt, manifest) in checkpoint::list(store)? {
        let dir = store.checkpoint_dir(&ckpt);
        if needed_checkpoints.contains(&ckpt) && !force {
            report.kept.push(Kept {
                what: ckpt.to_string(),
                reason: "a fork's lineage refers to it (use --force)".into(),
            });
        } else if !older_than(&dir, age) {
            report.kept.push(Kept { what: ckpt.to_string(), reason: "newer than the threshold".into() });
        } else {
            let label = match manifest {
                Ok(m) => format!("checkpoint {ckpt} of {}", m.job),
                Err(_) => format!("checkpoint {ckpt} (damaged)"),
            };
            free(&mut report, label, dir);
        }
    }
    // Temporaries of interrupted writes: checkpoints in progress, records, restores.
    let mut temps = Vec::new();
    if let Ok(entries) = std::fs::read_dir(store.checkpoints_dir()) {
        temps.extend(
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(".tmp-"))),
        );
    }
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
    for temp in temps {
        // A minute is far longer than any write takes; younger ones may be in flight.
        if older_than(&temp, age.max(Duration::from_secs(60))) {
            free(&mut report, "temporary of an interrupted write".into(), temp);
        }
    }
    Ok(report)
}
