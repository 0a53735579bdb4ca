//! Run Bundle archives: export, verify, import.
//!
//! An archive is a tar file whose entries all live under `pvisor-bundle/`:
//!
//! ```text
//! MANIFEST.json            format, identity, and {path, size, blake3} of every other entry
//! records/job.json run.json attempt.json bundle.json completion.json events.jsonl
//! stage/preimages.json     the conflict baselines
//! stage/files/<path>       contents of every staged file in the Bundle's manifest
//! stage/links/<path>       targets of every staged symlink
//! ```
//!
//! Verification needs nothing but the archive: every entry's digest against
//! `MANIFEST.json`, the receipt's binding to `bundle.json`'s exact bytes, and
//! every staged file against the Bundle's change manifest. Import turns a
//! verified archive into a read-only Job that can be reviewed elsewhere.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use pvisor_core::ids::{AttemptId, JobId};
use pvisor_core::records::{Bundle, CompletionReceipt, EntryType, JobRecord, RunRecord, FORMAT};
use pvisor_core::state::JobState;
use pvisor_core::store::{self, Store, StoreError};
use pvisor_core::time::Timestamp;

use crate::records::completion;
use crate::records::views::{self, ViewError};

const ROOT: &str = "pvisor-bundle";

/// What went wrong with an archive. Names the entry at fault.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("Cannot {op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{archive} is not a pvisor Run Bundle archive: {reason}")]
    NotABundle { archive: String, reason: String },
    #[error("{archive} failed verification:\n  {}", failures.join("\n  "))]
    Failed { archive: String, failures: Vec<String> },
    #[error("Job {job} already exists in {}; nothing was imported", root.display())]
    Exists { job: JobId, root: PathBuf },
    #[error(transparent)]
    View(#[from] ViewError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// `MANIFEST.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArchiveManifest {
    pub format: u32,
    pub kind: String,
    pub job: JobId,
    pub attempt: AttemptId,
    pub created_at: Timestamp,
    pub files: Vec<ArchiveFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveFile {
    pub path: String,
    pub size: u64,
    pub blake3: String,
}

fn staged_name(kind: &str, rel: &Path) -> Vec<u8> {
    let mut name = format!("{ROOT}/stage/{kind}/").into_bytes();
    name.extend_from_slice(rel.as_os_str().as_bytes());
    name
}

fn append(
    builder: &mut tar::Builder<File>,
    name: &[u8],
    bytes: &[u8],
    files: &mut Vec<ArchiveFile>,
) -> std::io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    builder.append_data(&mut header, Path::new(std::ffi::OsStr::from_bytes(name)), bytes)?;
    files.push(ArchiveFile {
        path: String::from_utf8_lossy(name).into_owned(),
        size: bytes.len() as u64,
        blake3: store::blake3_hex(bytes),
    });
    Ok(())
}

/// `MANIFEST.json`'s `kind` of a Run Bundle archive.
const KIND_BUNDLE: &str = "pvisor-run-bundle";
/// `MANIFEST.json`'s `kind` of a lost Job's salvaged stage: the records that
/// exist and a live scan of the stage, with no receipt to confirm any of it.
const KIND_UNCONFIRMED: &str = "pvisor-unconfirmed-stage";

/// What [`export`] wrote.
#[derive(Debug)]
pub struct Exported {
    pub manifest: ArchiveManifest,
    /// False for a lost Job's stage: nothing in it is confirmed by a receipt.
    pub confirmed: bool,
}

/// Writes the Run Bundle archive of `job` to `out`. A Job with a valid
/// receipt gives a Run Bundle; a Job closed as lost (or ended `unknown`)
/// gives its stage as the sandbox left it, marked unconfirmed, so it can be
/// inspected and salvaged but never imported or applied.
pub fn export(store: &Store, job_id: &JobId, out: &Path) -> Result<Exported, ArchiveError> {
    let contents = contents(store, job_id, out)?;
    let temp_prefix = format!(".{}.tmp-", out.file_name().map(|n| n.to_string_lossy()).unwrap_or_default());
    remove_dead_temporaries(out, &temp_prefix);
    let tmp = out.with_file_name(format!("{temp_prefix}{}", std::process::id()));
    let file = File::create(&tmp).map_err(io("create", &tmp))?;
    let mut builder = tar::Builder::new(file);
    let mut files = Vec::new();
    if let Err(e) = write_contents(&mut builder, &contents, &tmp, &mut files) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    let manifest = ArchiveManifest {
        format: FORMAT,
        kind: contents.kind.into(),
        job: job_id.clone(),
        attempt: contents.attempt,
        created_at: Timestamp::now(),
        files,
    };
    let mut throwaway = Vec::new();
    append(
        &mut builder,
        format!("{ROOT}/MANIFEST.json").as_bytes(),
        &store::to_json_bytes(&manifest),
        &mut throwaway,
    )
    .map_err(io("write", &tmp))?;
    let file = builder.into_inner().map_err(io("finish", &tmp))?;
    file.sync_all().map_err(io("sync", &tmp))?;
    fs::rename(&tmp, out).map_err(io("write", out))?;
    Ok(Exported { manifest, confirmed: contents.kind == KIND_BUNDLE })
}

/// The error of the I/O operation `op` on `path`.
fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ArchiveError {
    let path = path.to_owned();
    move |source| ArchiveError::Io { op, path, source }
}

/// What an export of a Job packages.
struct Contents {
    kind: &'static str,
    /// The Attempt the archive is of.
    attempt: AttemptId,
    changes: Vec<pvisor_core::records::ChangeEntry>,
    /// The records, by their name in the archive.
    records: Vec<(&'static str, PathBuf)>,
    stage: PathBuf,
}

/// What an export of `job_id` packages: the confirmed Bundle's records, or
/// a lost Job's stage as a scan finds it. Never records that do not bind
/// each other, or a foreign Trace.
fn contents(store: &Store, job_id: &JobId, out: &Path) -> Result<Contents, ArchiveError> {
    let job: JobRecord = store.read(&store.job_file(job_id))?;
    let status = views::status(store, job_id)?;
    views::events(store, &job.run)?;
    let attempt = AttemptId::new(job.run.clone(), job.target_attempt);
    let confirmed = completion::load(store, job_id, &attempt).map_err(ViewError::from)?;
    let stage = store.stage_dir(&job.run);
    let (changes, kind, records) = match &confirmed {
        Some((_, bundle)) => (
            bundle.changes.clone(),
            KIND_BUNDLE,
            vec![
                ("job.json", store.job_file(job_id)),
                ("run.json", store.run_file(&job.run)),
                ("attempt.json", store.attempt_file(&attempt)),
                ("bundle.json", store.bundle_file(&attempt)),
                ("completion.json", store.receipt_file(&attempt)),
                ("events.jsonl", store.events_file(&job.run)),
            ],
        ),
        None if status.live || !matches!(status.state, JobState::Lost | JobState::Unknown) => {
            return Err(ArchiveError::NotABundle {
                archive: out.display().to_string(),
                reason: format!(
                    "{job_id} has no completion receipt (state: {}), so there is no confirmed Bundle to export; \
                     a Job closed with `pvisor kill` (lost) can be exported as an unconfirmed stage",
                    status.state
                ),
            })
        }
        None => {
            let upper = stage.join("upper");
            let changes = if upper.is_dir() && status.workspace.is_dir() {
                pvisor_stage::scan(&upper, &status.workspace).map_err(ViewError::Stage)?
            } else {
                Vec::new()
            };
            let records = vec![
                ("job.json", store.job_file(job_id)),
                ("run.json", store.run_file(&job.run)),
                ("attempt.json", store.attempt_file(&attempt)),
                ("events.jsonl", store.events_file(&job.run)),
            ];
            (changes, KIND_UNCONFIRMED, records)
        }
    };
    let attempt = confirmed.map(|(receipt, _)| receipt.attempt).unwrap_or(attempt);
    Ok(Contents { kind, attempt, changes, records, stage })
}

/// Writes `contents` into the archive being built at `tmp`: the records,
/// the baselines, and every staged file and link.
fn write_contents(
    builder: &mut tar::Builder<File>,
    contents: &Contents,
    tmp: &Path,
    files: &mut Vec<ArchiveFile>,
) -> Result<(), ArchiveError> {
    let (kind, changes, stage) = (contents.kind, &contents.changes, &contents.stage);
    for (name, path) in &contents.records {
        let bytes = match store::read_capped(path, store::RECORD_READ_CAP) {
            Ok(bytes) => bytes,
            // A lost Job may lack records its setup never wrote.
            Err(e) if kind == KIND_UNCONFIRMED && e.is_not_found() => continue,
            Err(e) => return Err(e.into()),
        };
        append(builder, format!("{ROOT}/records/{name}").as_bytes(), &bytes, files)
            .map_err(io("write", tmp))?;
    }
    if kind == KIND_UNCONFIRMED {
        // What the scan found, in the Bundle's terms, so `verify` can
        // check every staged file against it.
        append(
            builder,
            format!("{ROOT}/stage/changes.json").as_bytes(),
            &store::to_json_bytes(changes),
            files,
        )
        .map_err(io("write", tmp))?;
    }
    if let Ok(bytes) = store::read_capped(&stage.join("preimages.json"), store::RECORD_READ_CAP) {
        append(builder, format!("{ROOT}/stage/preimages.json").as_bytes(), &bytes, files)
            .map_err(io("write", tmp))?;
    }
    if changes.iter().all(|c| !matches!(c.entry, EntryType::File | EntryType::Symlink)) {
        return Ok(());
    }
    let upper = pvisor_stage::beneath::Root::open(&stage.join("upper")).map_err(io("open", stage))?;
    for change in changes {
        let rel = change.path.as_path();
        match change.entry {
            EntryType::File => {
                let mut bytes = Vec::new();
                upper
                    .open_file(rel)
                    .and_then(|mut f| f.read_to_end(&mut bytes))
                    .map_err(io("read the staged", rel))?;
                append(builder, &staged_name("files", rel), &bytes, files).map_err(io("write", tmp))?;
            }
            EntryType::Symlink => {
                let target = upper.read_link(rel).map_err(io("read the staged link", rel))?;
                append(builder, &staged_name("links", rel), &target, files).map_err(io("write", tmp))?;
            }
            EntryType::Dir | EntryType::None | EntryType::Special => {}
        }
    }
    Ok(())
}

/// A verified archive, in memory.
#[derive(Debug)]
pub struct Verified {
    pub manifest: ArchiveManifest,
    pub receipt: CompletionReceipt,
    pub bundle: Bundle,
    /// Every entry's bytes, by name.
    pub entries: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// Verifies an archive file: every digest, the receipt binding, every staged file.
pub fn verify_archive(path: &Path) -> Result<Verified, ArchiveError> {
    let archive_name = path.display().to_string();
    let not_bundle = |reason: String| ArchiveError::NotABundle { archive: archive_name.clone(), reason };
    let file =
        File::open(path).map_err(|source| ArchiveError::Io { op: "open", path: path.to_owned(), source })?;
    let mut archive = tar::Archive::new(file);
    let mut entries = BTreeMap::new();
    let iter = archive.entries().map_err(|e| not_bundle(e.to_string()))?;
    for entry in iter {
        let mut entry = entry.map_err(|e| not_bundle(format!("unreadable tar entry: {e}")))?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            return Err(not_bundle("it holds an entry that is not a regular file".into()));
        }
        let name = entry.path_bytes().into_owned();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).map_err(|e| not_bundle(format!("unreadable entry: {e}")))?;
        entries.insert(name, bytes);
    }
    let manifest_name = format!("{ROOT}/MANIFEST.json").into_bytes();
    let manifest: ArchiveManifest = serde_json::from_slice(
        entries.get(&manifest_name).ok_or_else(|| not_bundle("MANIFEST.json is missing".into()))?,
    )
    .map_err(|e| not_bundle(format!("MANIFEST.json is corrupt: {e}")))?;
    let mut failures = Vec::new();
    let listed: BTreeMap<&str, &ArchiveFile> = manifest.files.iter().map(|f| (f.path.as_str(), f)).collect();
    for (name, bytes) in &entries {
        if *name == manifest_name {
            continue;
        }
        let shown = String::from_utf8_lossy(name).into_owned();
        match listed.get(shown.as_str()) {
            None => failures.push(format!("{shown}: not listed in MANIFEST.json")),
            Some(f) if f.size != bytes.len() as u64 || f.blake3 != store::blake3_hex(bytes) => {
                failures.push(format!(
                    "{shown}: blake3 {} ({} bytes), MANIFEST.json says {} ({} bytes)",
                    store::blake3_hex(bytes),
                    bytes.len(),
                    f.blake3,
                    f.size
                ))
            }
            Some(_) => {}
        }
    }
    for f in &manifest.files {
        if !entries.keys().any(|n| String::from_utf8_lossy(n) == f.path) {
            failures.push(format!("{}: listed in MANIFEST.json but missing", f.path));
        }
    }
    if manifest.kind == KIND_UNCONFIRMED {
        failures.extend(unconfirmed_stage_failures(&entries));
        if failures.is_empty() {
            failures.push(format!(
                "its {} entries match MANIFEST.json, but it is the unconfirmed stage of {}, a Job closed as lost: \
                 no receipt confirms how its command ended, so it is never imported or applied. \
                 `tar -xf {archive_name}` unpacks it for inspection",
                manifest.files.len(),
                manifest.job
            ));
        }
        return Err(ArchiveError::Failed { archive: archive_name, failures });
    }
    let record = |name: &str| entries.get(format!("{ROOT}/records/{name}").as_bytes());
    let receipt: Option<CompletionReceipt> =
        record("completion.json").and_then(|b| serde_json::from_slice(b).ok());
    let bundle_bytes = record("bundle.json");
    let (Some(receipt), Some(bundle_bytes)) = (receipt, bundle_bytes) else {
        failures.push("records/completion.json or records/bundle.json is missing or corrupt".into());
        return Err(ArchiveError::Failed { archive: archive_name, failures });
    };
    if let Err(e) = completion::validate(
        &receipt,
        &manifest.job,
        &manifest.attempt,
        "records/completion.json",
        "records/bundle.json",
        bundle_bytes,
    ) {
        failures.push(e.to_string());
    }
    let bundle: Option<Bundle> = serde_json::from_slice(bundle_bytes).ok();
    if let Some(bundle) = &bundle {
        failures.extend(changes_failures(&bundle.changes, &entries));
    }
    match (failures.is_empty(), bundle) {
        (true, Some(bundle)) => Ok(Verified { manifest, receipt, bundle, entries }),
        (_, None) => {
            failures.push("records/bundle.json is corrupt".into());
            Err(ArchiveError::Failed { archive: archive_name, failures })
        }
        (false, Some(_)) => Err(ArchiveError::Failed { archive: archive_name, failures }),
    }
}

/// An unconfirmed stage's staged files checked against its `changes.json`.
fn unconfirmed_stage_failures(entries: &BTreeMap<Vec<u8>, Vec<u8>>) -> Vec<String> {
    let Some(bytes) = entries.get(format!("{ROOT}/stage/changes.json").as_bytes()) else {
        return vec!["stage/changes.json is missing".into()];
    };
    let Ok(changes) = serde_json::from_slice::<Vec<pvisor_core::records::ChangeEntry>>(bytes) else {
        return vec!["stage/changes.json is corrupt".into()];
    };
    changes_failures(&changes, entries)
}

/// Every staged file and link of `changes` present in `entries` with the
/// recorded digest.
fn changes_failures(
    changes: &[pvisor_core::records::ChangeEntry],
    entries: &BTreeMap<Vec<u8>, Vec<u8>>,
) -> Vec<String> {
    let mut failures = Vec::new();
    for change in changes {
        let rel = change.path.as_path();
        let (kind, expected) = match change.entry {
            EntryType::File => ("files", change.blake3.as_deref()),
            EntryType::Symlink => ("links", change.blake3.as_deref()),
            EntryType::Dir | EntryType::None | EntryType::Special => continue,
        };
        let name = staged_name(kind, rel);
        match entries.get(&name) {
            None => failures.push(format!(
                "{}: staged {} missing",
                String::from_utf8_lossy(&name),
                change.kind.as_str()
            )),
            Some(bytes) if Some(staged_digest(change.entry, bytes).as_str()) != expected => failures
                .push(format!("{}: does not match the Bundle's manifest", String::from_utf8_lossy(&name))),
            Some(_) => {}
        }
    }
    failures
}

/// Removes what killed exports to `out` left beside it: `.<name>.tmp-<pid>`
/// files whose process is gone (a live export's own temporary is kept).
fn remove_dead_temporaries(out: &Path, prefix: &str) {
    let dir = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(prefix).and_then(|p| p.parse::<u32>().ok()) else { continue };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Verifies a local Job: its receipt and Bundle, and every staged file that has
/// not been applied or dropped against the Bundle's manifest.
pub fn verify_job(store: &Store, job_id: &JobId) -> Result<usize, ArchiveError> {
    let job: JobRecord = store.read(&store.job_file(job_id))?;
    // Identity and binding of job.json, run.json, attempt.json and the
    // conflict baselines (the Stage checks those it opens).
    crate::effects::Stage::open(store, job_id)
        .map_err(|e| ArchiveError::Failed { archive: job_id.to_string(), failures: vec![e.to_string()] })?;
    let (_, trace_warnings) = views::events(store, &job.run)?;
    let attempt = AttemptId::new(job.run.clone(), job.target_attempt);
    let Some((_, bundle)) = completion::load(store, job_id, &attempt).map_err(ViewError::from)? else {
        return Err(ArchiveError::Failed {
            archive: job_id.to_string(),
            failures: vec!["no completion receipt".into()],
        });
    };
    let stage = store.stage_dir(&job.run);
    let outcomes =
        pvisor_stage::ledger::Ledger::new(&stage, &job.run).outcomes().map_err(ViewError::Stage)?;
    let upper = pvisor_stage::beneath::Root::open(&stage.join("upper"));
    // A Trace out of order (two writers, or an edit) fails verification when
    // the Bundle binds the Trace; older pvisor wrote duplicate seqs itself.
    let binds_trace = bundle.binding.as_ref().is_some_and(|b| b.trace.is_some());
    let mut failures: Vec<String> =
        trace_warnings.into_iter().filter(|w| binds_trace && w.contains("out of order")).collect();
    let mut checked = 0;
    // Staged files `gc --force` removed are gone by design: the receipt,
    // Bundle and Trace are still checked, the files are not.
    let collected = stage.join("collected").exists();
    for change in bundle.changes.iter().filter(|_| !collected) {
        if outcomes.contains_key(&change.path)
            || !matches!(change.entry, EntryType::File | EntryType::Symlink)
        {
            continue;
        }
        let rel = change.path.as_path();
        let digest = match (&upper, change.entry) {
            (Ok(root), EntryType::File) => root.open_file(rel).and_then(|f| pvisor_core::digest::digest(&f)),
            (Ok(root), _) => root.read_link(rel).map(|t| store::blake3_hex(&t)),
            (Err(e), _) => Err(std::io::Error::new(e.kind(), e.to_string())),
        };
        checked += 1;
        match digest {
            Ok(d) if Some(d.as_str()) == change.blake3.as_deref() => {}
            Ok(_) => failures.push(format!(
                "{}: staged content differs from the Bundle",
                stage.join("upper").join(rel).display()
            )),
            Err(e) => failures.push(format!("{}: {e}", stage.join("upper").join(rel).display())),
        }
    }
    if failures.is_empty() {
        Ok(checked)
    } else {
        Err(ArchiveError::Failed { archive: job_id.to_string(), failures })
    }
}

/// Imports a verified archive as a read-only Job.
pub fn import(store: &Store, path: &Path) -> Result<JobId, ArchiveError> {
    let verified = verify_archive(path)?;
    let job_id = verified.manifest.job.clone();
    if store.job_file(&job_id).exists() {
        return Err(ArchiveError::Exists { job: job_id, root: store.root().to_owned() });
    }
    let get = |name: &str| {
        verified.entries.get(format!("{ROOT}/records/{name}").as_bytes()).cloned().unwrap_or_default()
    };
    let mut job: JobRecord = store::parse_record(Path::new("records/job.json"), &get("job.json"))?;
    let run: RunRecord = store::parse_record(Path::new("records/run.json"), &get("run.json"))?;
    let attempt = verified.receipt.attempt.clone();
    // The records must tell one story, or an archive could overwrite another run.
    if job.id != job_id || run.id != *attempt.run() || job.run != run.id || run.job != job_id {
        return Err(ArchiveError::Failed {
            archive: path.display().to_string(),
            failures: vec![
                "records/job.json, run.json and completion.json name different Jobs or Runs".into()
            ],
        });
    }
    if store.run_dir(&run.id).exists() {
        return Err(ArchiveError::Exists { job: job_id, root: store.root().to_owned() });
    }
    job.imported_from = Some(path.display().to_string());
    job.continuation = false;
    job.state = verified.receipt.result.state.job_state();
    // Held until the Job is published, so gc never takes the half-imported
    // Run for the leftover of a killed import (see `Store::admission_lock_file`).
    let creating = store::OwnerLock::acquire_shared_blocking(&store.admission_lock_file())?;
    store::create_dir_all_durable(&store.attempt_dir(&attempt))?;
    let _owner = store::OwnerLock::acquire(&store.lock_file(&attempt))?;
    drop(creating);
    let attempt_dir = store.attempt_dir(&attempt);
    store::write_atomic(&store.run_file(&run.id), &get("run.json"))?;
    store::write_atomic(&attempt_dir.join("attempt.json"), &get("attempt.json"))?;
    store::write_atomic(&attempt_dir.join("bundle.json"), &get("bundle.json"))?;
    store::write_atomic(&store.events_file(&run.id), &get("events.jsonl"))?;
    let stage = store.stage_dir(&run.id);
    let upper = stage.join("upper");
    store::create_dir_all_private(&upper)?;
    let io = |op, p: &Path| {
        let p = p.to_owned();
        move |source| ArchiveError::Io { op, path: p, source }
    };
    // Every write goes through the confined root: a crafted path or a staged
    // symlink cannot lead outside the new upper directory.
    let root = pvisor_stage::beneath::Root::open(&upper).map_err(io("open", &upper))?;
    let mut changes: Vec<_> = verified.bundle.changes.iter().collect();
    changes.sort_by(|a, b| a.path.cmp(&b.path));
    for change in changes {
        let rel = change.path.as_path();
        let mut parents: Vec<&Path> = rel.ancestors().skip(1).filter(|p| !p.as_os_str().is_empty()).collect();
        parents.reverse();
        for parent in parents {
            root.mkdir(parent, 0o755).map_err(io("create", &upper.join(parent)))?;
        }
        let dst = upper.join(rel);
        match change.entry {
            EntryType::File => {
                let bytes = verified.entries.get(&staged_name("files", rel)).cloned().unwrap_or_default();
                root.write_file(rel, bytes.as_slice(), change.mode & 0o777, change.blake3.as_deref())
                    .map_err(io("write", &dst))?;
            }
            EntryType::Symlink => {
                let target = verified.entries.get(&staged_name("links", rel)).cloned().unwrap_or_default();
                root.write_symlink(rel, &target).map_err(io("link", &dst))?;
            }
            EntryType::Dir => root.mkdir(rel, change.mode & 0o7777).map_err(io("create", &dst))?,
            // Deletions and specials are described by the Bundle; review reads it.
            EntryType::None | EntryType::Special => {}
        }
    }
    if let Some(bytes) = verified.entries.get(format!("{ROOT}/stage/preimages.json").as_bytes()) {
        store::write_atomic(&stage.join("preimages.json"), bytes)?;
    }
    // The staged entries are durable before the receipt confirms them, as a run's are.
    pvisor_stage::seal(&upper).map_err(|e| io("sync", &upper)(std::io::Error::other(e)))?;
    // The receipt last: the imported Job is confirmed only once everything is in place.
    store::write_atomic(&attempt_dir.join("completion.json"), &get("completion.json"))?;
    store.publish_job(&job)?;
    Ok(job_id)
}

/// The digest the Bundle records for a staged entry's bytes: a file's
/// content digest, or BLAKE3 of a symlink's target.
fn staged_digest(entry: EntryType, bytes: &[u8]) -> String {
    match entry {
        EntryType::File => pvisor_core::digest::digest_bytes(bytes),
        _ => store::blake3_hex(bytes),
    }
}
