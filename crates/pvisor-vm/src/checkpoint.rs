//! Execution checkpoints of a running microVM: the control protocol between
//! `pvisor checkpoint|suspend` and the Attempt's supervisor, the manifest,
//! how a checkpoint is taken, and how one is verified before a restore.
//!
//! Order of a checkpoint (each step only after the previous succeeded):
//! quiesce (sync + FIFREEZE through the agent) → QMP `stop` → migrate the
//! machine state to `state` → copy the upper and delta disks, link the
//! lower image →
//! hash everything → write `manifest.json`, fsync, rename the directory into
//! place (publication) → `cont` + thaw, or `quit` for a suspension. A crash
//! before the rename leaves only a `.partial-*` directory that nothing trusts.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pvisor_agent_proto::{Reply, Request};
use pvisor_core::ids::CheckpointId;
use pvisor_core::time::Timestamp;

use super::link::{LinkError, Shared};
use super::{disk, qmp};

pub use pvisor_sandbox::checkpoint::{
    CheckpointFile, ExecCheckpoint, MachineConfig, DELTA, IMAGE_DELTA, IMAGE_LOWER, KIND, LOWER, MANIFEST,
    STATE, UPPER,
};
pub(super) fn digest(path: &Path, sparse: bool) -> io::Result<CheckpointFile> {
    let size = fs::metadata(path)?.len();
    let blake3 = if sparse { disk::sparse_digest(path)? } else { disk::file_digest(path)? };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    Ok(CheckpointFile { name, size, blake3, sparse })
}

/// Why a checkpoint cannot be restored.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("checkpoint {}: {source}", dir.display())]
    Read { dir: PathBuf, source: pvisor_core::store::StoreError },
    #[error("checkpoint manifest {} is corrupt: {source}", path.display())]
    Corrupt { path: PathBuf, source: serde_json::Error },
    #[error("{} is not an execution checkpoint pvisor can restore (format {format}, kind {kind})", path.display())]
    NotExecution { path: PathBuf, format: u32, kind: String },
    #[error("checkpoint {id} lists disks pvisor does not know: {disks:?}")]
    UnknownDisks { id: CheckpointId, disks: Vec<String> },
    #[error("checkpoint {id} does not list its {name}")]
    Unlisted { id: CheckpointId, name: String },
    #[error("checkpoint file {}: {source}", path.display())]
    File { path: PathBuf, source: io::Error },
    #[error(
        "checkpoint file {} is corrupt: {size} bytes, BLAKE3 {blake3}; the manifest says {listed_size} bytes, {listed_blake3}",
        path.display()
    )]
    Mismatch { path: PathBuf, size: u64, blake3: String, listed_size: u64, listed_blake3: String },
}

/// Reads and fully verifies the checkpoint in `dir`.
pub fn verify(dir: &Path) -> Result<ExecCheckpoint, VerifyError> {
    let manifest_path = dir.join(MANIFEST);
    let bytes = pvisor_core::store::read_capped(&manifest_path, 1 << 20)
        .map_err(|source| VerifyError::Read { dir: dir.to_owned(), source })?;
    let manifest: ExecCheckpoint = serde_json::from_slice(&bytes)
        .map_err(|source| VerifyError::Corrupt { path: manifest_path.clone(), source })?;
    if manifest.format != 1 || manifest.kind != KIND {
        return Err(VerifyError::NotExecution {
            path: manifest_path,
            format: manifest.format,
            kind: manifest.kind,
        });
    }
    if manifest.disks.iter().any(|d| ![LOWER, DELTA, UPPER, IMAGE_LOWER, IMAGE_DELTA].contains(&d.as_str())) {
        return Err(VerifyError::UnknownDisks { id: manifest.id, disks: manifest.disks });
    }
    for name in std::iter::once(STATE).chain(manifest.disks.iter().map(String::as_str)) {
        let listed = manifest
            .files
            .iter()
            .find(|f| f.name == name)
            .ok_or_else(|| VerifyError::Unlisted { id: manifest.id.clone(), name: name.to_owned() })?;
        let path = dir.join(name);
        let actual = match digest(&path, listed.sparse) {
            Ok(actual) => actual,
            Err(source) => return Err(VerifyError::File { path, source }),
        };
        if actual.size != listed.size || actual.blake3 != listed.blake3 {
            return Err(VerifyError::Mismatch {
                path,
                size: actual.size,
                blake3: actual.blake3,
                listed_size: listed.size,
                listed_blake3: listed.blake3.clone(),
            });
        }
    }
    Ok(manifest)
}

/// Why a checkpoint (or suspension) of a live VM was not taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TakeError {
    #[error(
        "the VM shares host directories live (virtiofs: a pod's read-write volumes), which QEMU cannot save: it cannot be checkpointed, suspended or forked"
    )]
    SharesDirectories,
    #[error("the VM is already suspended")]
    Suspended,
    #[error("the command has already finished; there is no execution state to save")]
    Finished,
    #[error("cannot create {}: {source}", path.display())]
    Create { path: PathBuf, source: io::Error },
    #[error("the agent answered Quiesce with {0}")]
    Quiesce(String),
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error(transparent)]
    Qmp(#[from] qmp::QmpError),
    #[error("cannot create the state file: {0}")]
    StateFile(#[source] io::Error),
    #[error("cannot keep the disk {name}: {source}")]
    KeepDisk { name: String, source: io::Error },
    #[error("cannot sync the state: {0}")]
    SyncState(#[source] io::Error),
    /// Digesting a saved file failed.
    #[error("{0}")]
    Digest(#[source] io::Error),
    #[error("cannot publish the checkpoint: {0}")]
    Publish(#[source] io::Error),
}

/// Lists the published checkpoints under `dir`, oldest first (ids are ULIDs).
pub fn list(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join(MANIFEST).is_file())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(CheckpointId::PREFIX)))
        .collect();
    found.sort();
    found
}

/// Takes a checkpoint of the live VM (the control thread's side).
/// Takes a checkpoint; with `suspend` the VM is then stopped instead of continued.
pub(super) fn take(shared: &Shared, suspend: bool) -> Result<Box<ExecCheckpoint>, TakeError> {
    let _op = shared.op.lock().unwrap_or_else(|p| p.into_inner());
    if !shared.vm.shared_directories.is_empty() {
        return Err(TakeError::SharesDirectories);
    }
    if shared.suspended.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
        return Err(TakeError::Suspended);
    }
    if *shared.exited.lock().unwrap_or_else(|p| p.into_inner()) || !shared.qemu_running() {
        return Err(TakeError::Finished);
    }
    let started = Instant::now();
    let id = CheckpointId::generate();
    let step = if suspend { "suspend" } else { "checkpoint" };
    tracing::info!(%id, step, "quiescing the guest");
    let root = &shared.vm.checkpoints;
    let partial = root.join(format!(".partial-{id}"));
    let published = root.join(id.to_string());
    fs::create_dir_all(&partial).map_err(|source| TakeError::Create { path: partial.clone(), source })?;
    let timeout = Duration::from_secs(60);
    // Held until the guest runs again (or QEMU is told to quit): no stdin,
    // signal or proxy frame may be cut in half by the stop.
    let mut held = shared.agent.lock().unwrap_or_else(|p| p.into_inner());

    let frozen = match shared.call_held(&mut held, &Request::Quiesce, &[], timeout) {
        Ok((Reply::Quiesced { frozen }, _)) => frozen,
        other => {
            // The agent may still freeze late: always thaw, and leave nothing behind.
            let _ = shared.call_held(&mut held, &Request::Thaw, &[], timeout);
            let _ = fs::remove_dir_all(&partial);
            return Err(match other {
                Err(e) => e.into(),
                Ok((reply, _)) => TakeError::Quiesce(format!("{reply:?}")),
            });
        }
    };
    pvisor_core::failpoint::hit("vm-after-quiesce");
    tracing::debug!(%id, ?frozen, elapsed_ms = started.elapsed().as_millis() as u64, "guest quiesced");
    let paused = Instant::now();
    let disks: Vec<String> = shared
        .disks
        .iter()
        .map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())
        .collect();
    let saved = save(shared, &partial).and_then(|()| {
        pvisor_core::failpoint::hit("vm-after-state");
        let manifest = ExecCheckpoint {
            format: 1,
            id: id.clone(),
            kind: KIND.into(),
            created_at: Timestamp::now(),
            image: shared.image.digest.clone(),
            machine: shared.config,
            workspace: shared.spec.workspace.clone(),
            exec_id: super::EXEC_ID,
            context: shared.vm.context.clone(),
            files: std::iter::once(digest(&partial.join(STATE), false))
                .chain(disks.iter().map(|name| digest(&partial.join(name), true)))
                .collect::<io::Result<_>>()
                .map_err(TakeError::Digest)?,
            disks: disks.clone(),
            frozen: frozen.clone(),
            nic: shared.nic_mac.clone(),
            userland: shared.vm.image.clone(),
            paused_ms: paused.elapsed().as_millis() as u64,
            save_ms: started.elapsed().as_millis() as u64,
        };
        publish(&partial, &published, &manifest).map_err(TakeError::Publish)?;
        Ok(manifest)
    });
    let manifest = match saved {
        Ok(manifest) => manifest,
        Err(e) => {
            tracing::info!(%id, step, error = %e, "saving failed; resuming the guest");
            // The guest must not stay stopped or frozen because a save failed.
            let _ = fs::remove_dir_all(&partial);
            let _ = shared.qmp::<qmp::Empty>(&qmp::Command::Cont);
            let _ = shared.call_held(&mut held, &Request::Thaw, &[], timeout);
            return Err(e);
        }
    };
    pvisor_core::failpoint::hit("vm-after-publish");
    tracing::info!(
        %id,
        step,
        paused_ms = manifest.paused_ms,
        save_ms = manifest.save_ms,
        "checkpoint published"
    );
    if suspend {
        *shared.suspended.lock().unwrap_or_else(|p| p.into_inner()) = Some(manifest.clone());
        // The waiter reaps QEMU and reports the suspension.
        let _ = shared.qmp::<qmp::Empty>(&qmp::Command::Quit);
    } else {
        shared.qmp::<qmp::Empty>(&qmp::Command::Cont)?;
        shared.call_held(&mut held, &Request::Thaw, &[], timeout)?;
        tracing::info!(%id, elapsed_ms = started.elapsed().as_millis() as u64, "guest resumed after checkpoint");
    }
    Ok(Box::new(manifest))
}

/// Stops the guest and writes its machine state and disks into `dir`.
fn save(shared: &Shared, dir: &Path) -> Result<(), TakeError> {
    let started = Instant::now();
    shared.qmp::<qmp::Empty>(&qmp::Command::Stop)?;
    tracing::debug!("guest stopped");
    // The default cap (32 MiB/s in QEMU 7.2) doubles the save time.
    let state = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dir.join(STATE))
        .map_err(TakeError::StateFile)?;
    let mut qmp = shared.qmp.lock().unwrap_or_else(|p| p.into_inner());
    qmp::migrate_to_file(
        &mut qmp,
        state,
        shared.config.ram == super::RamFormat::Named,
        Duration::from_secs(300),
    )?;
    drop(qmp);
    tracing::debug!(elapsed_ms = started.elapsed().as_millis() as u64, "machine state migrated");
    let copying = Instant::now();
    for path in &shared.disks {
        let name = path.file_name().unwrap_or_default();
        disk::keep_disk(path, &dir.join(name))
            .map_err(|source| TakeError::KeepDisk { name: name.to_string_lossy().into_owned(), source })?;
    }
    tracing::debug!(elapsed_ms = copying.elapsed().as_millis() as u64, "disks copied");
    fs::File::open(dir.join(STATE)).and_then(|f| f.sync_all()).map_err(TakeError::SyncState)
}

fn publish(partial: &Path, published: &Path, manifest: &ExecCheckpoint) -> io::Result<()> {
    publish_dir(partial, published, &pvisor_core::store::to_json_bytes(manifest))
}

/// Writes `manifest` into `partial`, syncs it and the directory, and renames
/// it to `published` (the publication: nothing trusts a `.partial-*`).
pub(super) fn publish_dir(partial: &Path, published: &Path, manifest: &[u8]) -> io::Result<()> {
    let mut file = fs::File::create(partial.join(MANIFEST))?;
    file.write_all(manifest)?;
    file.sync_all()?;
    fs::File::open(partial)?.sync_all()?;
    fs::rename(partial, published)?;
    // The checkpoints directory, and its own name in the Run's directory:
    // it may have been made for this checkpoint, and nothing else syncs it.
    for dir in published.ancestors().skip(1).take(2) {
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint directory as a pvisor without the delta disk wrote it.
    fn two_disk_checkpoint(dir: &Path) -> serde_json::Value {
        for (name, bytes) in [(STATE, &b"machine"[..]), (UPPER, b"upper"), (LOWER, b"lower")] {
            fs::write(dir.join(name), bytes).unwrap();
        }
        let file =
            |name: &str, sparse| serde_json::to_value(digest(&dir.join(name), sparse).unwrap()).unwrap();
        serde_json::json!({
            "format": 1, "id": CheckpointId::generate(), "kind": KIND, "created_at": Timestamp::now(),
            "image": "digest", "machine": {"memory_mib": 512, "cpus": 1, "accelerator": "tcg"},
            "workspace": "/w", "exec_id": 1, "context": {},
            "files": [file(STATE, false), file(UPPER, true), file(LOWER, true)],
            "frozen": [], "paused_ms": 1, "save_ms": 2,
        })
    }

    #[test]
    fn a_checkpoint_from_before_the_delta_disk_restores_with_its_two_disks() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = two_disk_checkpoint(dir.path());
        fs::write(dir.path().join(MANIFEST), serde_json::to_vec(&manifest).unwrap()).unwrap();
        let verified = verify(dir.path()).unwrap();
        assert_eq!(verified.disks, [LOWER, UPPER], "the device list it was taken with");
    }

    /// A run with a userland image (`--image`) saves its image's base and
    /// delta after the workspace's disks; a restore attaches all five.
    #[test]
    fn a_checkpoint_with_a_userland_image_lists_its_disks() {
        let dir = tempfile::tempdir().unwrap();
        let mut manifest = two_disk_checkpoint(dir.path());
        let disks = [LOWER, DELTA, UPPER, IMAGE_LOWER, IMAGE_DELTA];
        for name in [DELTA, IMAGE_LOWER, IMAGE_DELTA] {
            fs::write(dir.path().join(name), name).unwrap();
            let file = serde_json::to_value(digest(&dir.path().join(name), true).unwrap()).unwrap();
            manifest["files"].as_array_mut().unwrap().push(file);
        }
        manifest["disks"] = serde_json::json!(disks);
        manifest["userland"] = serde_json::json!({"name": "python", "digest": "blake3:00", "rootfs": "/r"});
        fs::write(dir.path().join(MANIFEST), serde_json::to_vec(&manifest).unwrap()).unwrap();
        let verified = verify(dir.path()).unwrap();
        assert_eq!(verified.disks, disks);
        assert_eq!(verified.userland.unwrap().name, "python");
    }

    #[test]
    fn a_listed_disk_must_be_known_present_and_intact() {
        let dir = tempfile::tempdir().unwrap();
        let mut manifest = two_disk_checkpoint(dir.path());
        let write = |m: &serde_json::Value| {
            fs::write(dir.path().join(MANIFEST), serde_json::to_vec(m).unwrap()).unwrap()
        };
        manifest["disks"] = serde_json::json!([LOWER, "../../etc/passwd", UPPER]);
        write(&manifest);
        assert!(verify(dir.path()).unwrap_err().to_string().contains("does not know"));
        manifest["disks"] = serde_json::json!([LOWER, DELTA, UPPER]);
        write(&manifest);
        assert!(verify(dir.path()).unwrap_err().to_string().contains("does not list its delta.img"));
        manifest["disks"] = serde_json::json!([LOWER, UPPER]);
        write(&manifest);
        fs::write(dir.path().join(UPPER), b"UPPER").unwrap();
        assert!(verify(dir.path()).unwrap_err().to_string().contains("is corrupt"));
    }
}
