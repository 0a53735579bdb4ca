//! Takes a Running sandbox's root filesystem out of its guest: a `tar` of
//! the image rootfs as the guest sees it (the image below, the sandbox's
//! writes on top), read through a non-recursive bind in a mount namespace
//! of its own, so `/proc`, `/dev`, `/sys` and shared volumes (mounts on
//! top of the rootfs) are not in it, as `docker commit` leaves a
//! container's volumes out. The archive is untrusted (the guest writes
//! it): it is capped in size, and imported by the image store's hardened
//! tar extraction like any archive a user hands to `pvisor image import`.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use hyper::StatusCode;

use crate::guest_link::{self, ExecSpec, Reply};
use crate::http::ApiError;
use crate::sandbox::Daemon;

use super::SnapshotState;

/// The largest archive a capture writes: a guest that produces more (a
/// filesystem flood) fails its snapshot rather than fill the host's disk.
pub const MAX_ARCHIVE_BYTES: u64 = 8 << 30;

/// Captures that run at once, daemon-wide (the reference's two snapshot
/// workers): each is a thread reading a guest's archive to disk.
const MAX_CAPTURES: usize = 2;

/// Captures that may wait for a worker; more are refused (429), so that
/// no client queues unbounded work.
const MAX_QUEUED: usize = 64;

/// The stderr a failed capture reports, at most.
const MAX_STDERR: usize = 4096;

/// Run by the guest's own (initramfs) shell: `$1` is the rootfs.
const SCRIPT: &str = r#"d=$(mktemp -d /tmp/pvisor-snapshot.XXXXXX) || exit 1
unshare -m --propagation private sh -c 'mount --bind "$1" "$2" && cd "$2" && exec tar cf - .' sh "$1" "$d"
s=$?
rmdir "$d" 2>/dev/null
exit $s"#;

/// Why a capture failed; the message becomes the snapshot's.
#[derive(Debug, thiserror::Error)]
enum CaptureError {
    #[error("the sandbox is no longer running: {0}")]
    NotRunning(String),
    #[error("the guest did not run the capture: {0}")]
    Guest(String),
    #[error("cannot write {path}: {source}")]
    Write { path: String, source: std::io::Error },
    #[error(
        "the sandbox's filesystem is over {MAX_ARCHIVE_BYTES} bytes; free space in it and snapshot again"
    )]
    TooLarge,
    #[error("the capture in the guest ended with status {code}: {stderr}")]
    Failed { code: i32, stderr: String },
    #[error("the captured filesystem cannot be imported: {0}")]
    Import(String),
}

/// Records `record` (in `Creating`) and queues its capture, starting a
/// worker when fewer than [`MAX_CAPTURES`] run. Refused, with nothing
/// recorded, when [`MAX_QUEUED`] captures already wait.
pub(super) fn submit(daemon: &Arc<Daemon>, record: super::SnapshotRecord) -> Result<(), ApiError> {
    let mut queue = daemon.snapshots.captures();
    if queue.pending.len() >= MAX_QUEUED {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "SNAPSHOT::TOO_MANY_PENDING",
            format!("{MAX_QUEUED} snapshots are already waiting to be captured; retry once some are Ready"),
        ));
    }
    daemon.snapshots.insert(record.clone())?;
    queue.pending.push_back((record.id.clone(), record.sandbox_id.clone()));
    if queue.workers < MAX_CAPTURES {
        let worker = daemon.clone();
        let spawned = std::thread::Builder::new().name("pvisor-snapshot".into()).spawn(move || work(&worker));
        match spawned {
            Ok(_) => queue.workers += 1,
            // With no worker at all, this capture would wait forever.
            Err(e) if queue.workers == 0 => {
                queue.pending.pop_back();
                drop(queue);
                let _ = daemon.snapshots.update(&record.id, |r| {
                    r.set(
                        SnapshotState::Failed,
                        "snapshot_capture_failed",
                        format!("cannot start the capture: {e}"),
                    );
                    Ok(())
                });
            }
            Err(e) => tracing::warn!(
                "cannot start another snapshot worker ({e}); the running one takes the capture"
            ),
        }
    }
    Ok(())
}

/// A worker: captures what is queued, oldest first, and ends when nothing
/// is.
fn work(daemon: &Arc<Daemon>) {
    loop {
        let next = {
            let mut queue = daemon.snapshots.captures();
            match queue.pending.pop_front() {
                Some(next) => next,
                None => {
                    queue.workers -= 1;
                    return;
                }
            }
        };
        // A capture that panics (a bug) still ends its snapshot `Failed`
        // and leaves the worker counted and working: otherwise the queue
        // would believe in a worker that is gone, and nothing queued would run.
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(daemon, &next.0, &next.1)));
        if ran.is_err() {
            let _ = fs::remove_file(daemon.snapshots.archive(&next.0));
            let failed = daemon.snapshots.update(&next.0, |r| {
                let why = "the capture crashed (a bug in pvisor serve; its log has the panic)";
                r.set(SnapshotState::Failed, "snapshot_capture_failed", why);
                Ok(())
            });
            if let Err(e) = failed {
                tracing::error!(snapshot = %next.0, "the crashed capture could not be recorded: {e}");
            }
        }
    }
}

/// Captures sandbox `sandbox` into snapshot `id` (a record in `Creating`),
/// then records `Ready` or `Failed` saying why.
fn run(daemon: &Arc<Daemon>, id: &str, sandbox: &str) {
    let started = Instant::now();
    let archive = daemon.snapshots.archive(id);
    let outcome = capture(daemon, sandbox, &archive).and_then(|()| {
        let image = super::image_of(id);
        daemon.images.import(&image, &archive).map(drop).map_err(|e| CaptureError::Import(e.0))
    });
    let _ = fs::remove_file(&archive);
    let secs = started.elapsed().as_secs_f64();
    // The sandbox Job's Trace says a snapshot was taken, as it says what
    // execd ran.
    let note = pvisor::FrontendNote {
        command: format!("snapshot {id}"),
        uid: None,
        background: false,
        exit_code: Some(i32::from(outcome.is_err())),
        error: outcome.as_ref().err().map(ToString::to_string),
        duration_ms: started.elapsed().as_millis() as u64,
    };
    crate::execd::commands::note_in_trace(daemon, sandbox, note);
    let recorded = daemon.snapshots.update(id, |r| {
        match &outcome {
            Ok(()) => r.set(SnapshotState::Ready, "snapshot_ready", format!("Captured in {secs:.1} s.")),
            Err(e) => r.set(SnapshotState::Failed, "snapshot_capture_failed", e.to_string()),
        }
        Ok(())
    });
    if let Err(e) = outcome {
        tracing::warn!(snapshot = %id, sandbox = %sandbox, "the snapshot failed: {e}");
    }
    if let Err(e) = recorded {
        tracing::error!(snapshot = %id, "the snapshot's outcome could not be recorded: {e}");
    }
}

/// Writes the guest's archive of `sandbox`'s rootfs to `archive`.
fn capture(daemon: &Arc<Daemon>, sandbox: &str, archive: &Path) -> Result<(), CaptureError> {
    let (record, link) = daemon.live_link(sandbox).map_err(|e| CaptureError::NotRunning(e.to_string()))?;
    let exec_id = daemon.next_exec_id(sandbox).map_err(|e| CaptureError::NotRunning(e.to_string()))?;
    let spec = ExecSpec {
        id: exec_id,
        argv: vec![
            "/bin/sh".into(),
            "-c".into(),
            SCRIPT.into(),
            "sh".into(),
            record.rootfs.display().to_string(),
        ],
        env: Vec::new(),
        cwd: "/".into(),
        root: None,
        output: None,
        terminal: None,
        confinement: None,
    };
    let mut channel = guest_link::exec(&link, spec).map_err(|e| CaptureError::Guest(e.0))?;
    let shown = archive.display().to_string();
    let write_error = |source| CaptureError::Write { path: shown.clone(), source };
    let mut out = fs::File::create(archive).map_err(write_error)?;
    let (mut written, mut stderr) = (0u64, Vec::new());
    let code = loop {
        match channel.next_reply() {
            Ok(Some((Reply::Stdout { .. }, bytes))) => {
                written += bytes.len() as u64;
                if written > MAX_ARCHIVE_BYTES {
                    let _ = guest_link::signal(&link, exec_id, libc::SIGKILL);
                    return Err(CaptureError::TooLarge);
                }
                out.write_all(&bytes).map_err(write_error)?;
            }
            Ok(Some((Reply::Stderr { .. }, bytes))) => {
                let room = MAX_STDERR.saturating_sub(stderr.len());
                stderr.extend_from_slice(&bytes[..bytes.len().min(room)]);
            }
            Ok(Some((Reply::ExecFailed { message, .. }, _))) => return Err(CaptureError::Guest(message)),
            Ok(Some((Reply::Exited { code, signal, .. }, _))) => {
                break code.unwrap_or(128 + signal.unwrap_or(0))
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                return Err(CaptureError::NotRunning("the guest's stream ended (paused or deleted?)".into()))
            }
        }
    };
    if code != 0 {
        let stderr = String::from_utf8_lossy(&stderr).trim().to_owned();
        return Err(CaptureError::Failed { code, stderr });
    }
    out.sync_all().map_err(write_error)
}
