//! Logical checkpoints: sealed, verifiable copies of a stage.
//!
//! A workspace checkpoint is the stage's upper tree — files, directories,
//! symlinks, overlay whiteouts and opaque markers — plus its conflict
//! baselines (`preimages.json`), described entry by entry with digests in a
//! manifest. It saves no process memory, no external service state, and does
//! not freeze the workspace (the lower layer) it sits on.
//!
//! [`restore_logical_checkpoint`] is the embedded API: it verifies a
//! checkpoint and restores its files and baselines together, or not at all.
//! Copies use reflinks (`FICLONE`) where the filesystem shares extents, and
//! `copy_file_range`/read-write elsewhere; [`CopyMethod`] says which.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use pvisor_core::records::{CheckpointEntry, CheckpointManifest};
use pvisor_core::store::{self, RelPath};

use crate::overlay;
use crate::StageError;

/// How files were duplicated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CopyMethod {
    pub reflinked: u64,
    pub copied: u64,
}

impl CopyMethod {
    /// `reflink`, `copy`, or `reflink+copy`.
    pub fn describe(self) -> &'static str {
        match (self.reflinked > 0, self.copied > 0) {
            (true, false) => "reflink",
            (true, true) => "reflink+copy",
            (false, _) => "copy",
        }
    }
}

fn bad(path: &Path, reason: impl Into<String>) -> StageError {
    StageError::Checkpoint { path: path.to_owned(), reason: reason.into() }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StageError + 'a {
    move |e| StageError::io(op, path, e)
}

/// Copies one regular file, reflinking when the filesystem allows; returns
/// the BLAKE3 of its contents and whether it was reflinked.
fn copy_file(src: &Path, dst: &Path, mode: u32) -> Result<(String, bool), StageError> {
    let from = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(src)
        .map_err(io_err("read", src))?;
    let to = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dst)
        .map_err(io_err("create", dst))?;
    let reflinked = pvisor_core::digest::reflink(&from, &to);
    let digest = if reflinked {
        pvisor_core::digest::digest(&from).map_err(io_err("read", src))?
    } else {
        // Hash while copying (one read of the source), keeping holes.
        pvisor_core::digest::copy_sparse(&from, &to).map_err(io_err("copy to", dst))?
    };
    fs::set_permissions(dst, fs::Permissions::from_mode(mode)).map_err(io_err("set the mode of", dst))?;
    Ok((digest, reflinked))
}

fn make_whiteout(dst: &Path) -> Result<(), StageError> {
    overlay::make_whiteout(dst).map_err(io_err("create whiteout", dst))
}

fn mark_opaque(dir: &Path) -> Result<(), StageError> {
    overlay::mark_opaque(dir).map_err(io_err("mark opaque", dir))
}

fn syncfs(dir: &Path) -> Result<(), StageError> {
    let d = File::open(dir).map_err(io_err("open", dir))?;
    rustix::fs::syncfs(&d).map_err(|e| StageError::io("sync", dir, e.into()))
}

fn sync_dir(dir: &Path) -> Result<(), StageError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err("sync", dir))
}

/// Copies the upper tree `src` to `dst` (which must not exist), keeping
/// whiteouts, opaque markers, modes and symlinks, then makes it durable with
/// one `syncfs(2)` (cheaper than an fsync per file, and just as complete).
/// Returns the entries, sorted by path.
pub fn copy_upper(src: &Path, dst: &Path) -> Result<(Vec<CheckpointEntry>, CopyMethod), StageError> {
    copy_upper_except(src, dst, &BTreeSet::new())
}

/// [`copy_upper`], leaving out the changes at `left_out` (those already
/// applied or dropped): a file, symlink or whiteout there is not copied, a
/// directory there loses its opaque marker and is kept only if something
/// beneath it is carried.
pub fn copy_upper_except(
    src: &Path,
    dst: &Path,
    left_out: &BTreeSet<RelPath>,
) -> Result<(Vec<CheckpointEntry>, CopyMethod), StageError> {
    let mode = fs::symlink_metadata(src).map_err(io_err("inspect", src))?.mode() & 0o7777;
    fs::DirBuilder::new().mode(0o700).create(dst).map_err(io_err("create", dst))?;
    let mut entries = Vec::new();
    let mut method = CopyMethod::default();
    copy_dir(src, dst, left_out, &mut entries, &mut method)?;
    fs::set_permissions(dst, fs::Permissions::from_mode(mode)).map_err(io_err("set the mode of", dst))?;
    syncfs(dst)?;
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((entries, method))
}

/// A directory of the copy still being filled: its names left to copy
/// (reversed, so the next is last) and, below the root, its own entry, which
/// is finished once everything beneath it is copied.
struct Pending {
    rel: PathBuf,
    names: Vec<std::ffi::OsString>,
    dir: Option<DirLeft>,
}

struct DirLeft {
    entry: CheckpointEntry,
    leave_out: bool,
    entries_before: usize,
}

fn sorted_names(src_root: &Path, rel: &Path) -> Result<Vec<std::ffi::OsString>, StageError> {
    let dir = src_root.join(rel);
    let mut names: Vec<_> = fs::read_dir(&dir)
        .map_err(io_err("list", &dir))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(io_err("list", &dir))?;
    names.sort_by(|a, b| b.cmp(a));
    Ok(names)
}

/// Copies the tree with an explicit stack, never recursion: the command
/// chose its depth. (A tree deeper than PATH_MAX is refused with an error
/// naming the path, never a crash.)
fn copy_dir(
    src_root: &Path,
    dst_root: &Path,
    left_out: &BTreeSet<RelPath>,
    entries: &mut Vec<CheckpointEntry>,
    method: &mut CopyMethod,
) -> Result<(), StageError> {
    let mut stack =
        vec![Pending { rel: PathBuf::new(), names: sorted_names(src_root, Path::new(""))?, dir: None }];
    while let Some(top) = stack.last_mut() {
        let Some(name) = top.names.pop() else {
            let done = stack.pop().expect("the stack is not empty");
            if let Some(dir) = done.dir {
                finish_dir(&dst_root.join(&done.rel), dir, entries)?;
            }
            continue;
        };
        let rel = top.rel.join(&name);
        let (src, dst) = (src_root.join(&rel), dst_root.join(&rel));
        let meta = fs::symlink_metadata(&src).map_err(io_err("inspect", &src))?;
        let mode = meta.mode() & 0o7777;
        let ft = meta.file_type();
        let mut entry = CheckpointEntry {
            path: RelPath::new(&rel),
            entry: String::new(),
            mode,
            size: 0,
            blake3: None,
            opaque: false,
        };
        let leave_out = left_out.contains(&entry.path);
        if leave_out && !ft.is_dir() {
            continue;
        }
        if overlay::is_whiteout(&src, &meta) {
            make_whiteout(&dst)?;
            entry.entry = "whiteout".into();
            entry.mode = 0;
        } else if ft.is_dir() {
            fs::DirBuilder::new().mode(0o700).create(&dst).map_err(io_err("create", &dst))?;
            entry.opaque = !leave_out && overlay::is_opaque(&src);
            if entry.opaque {
                mark_opaque(&dst)?;
            }
            let names = sorted_names(src_root, &rel)?;
            let dir = DirLeft { entry, leave_out, entries_before: entries.len() };
            stack.push(Pending { rel, names, dir: Some(dir) });
            continue;
        } else if ft.is_file() {
            let (digest, reflinked) = copy_file(&src, &dst, mode)?;
            if reflinked {
                method.reflinked += 1;
            } else {
                method.copied += 1;
            }
            entry.entry = "file".into();
            entry.size = meta.len();
            entry.blake3 = Some(digest);
        } else if ft.is_symlink() {
            let target = fs::read_link(&src).map_err(io_err("read link", &src))?;
            std::os::unix::fs::symlink(&target, &dst).map_err(io_err("create link", &dst))?;
            entry.entry = "symlink".into();
            entry.size = target.as_os_str().len() as u64;
            entry.blake3 = Some(blake3::hash(target.as_os_str().as_bytes()).to_hex().to_string());
        } else {
            // Fifos and sockets are never applied; they are listed, not recreated.
            entry.entry = "special".into();
        }
        entries.push(entry);
    }
    Ok(())
}

/// Ends a copied directory once everything beneath it is copied: one left
/// out with nothing carried beneath it goes; the rest get their mode, last
/// (a mode without write permission would have stopped the copy into it).
fn finish_dir(dst: &Path, dir: DirLeft, entries: &mut Vec<CheckpointEntry>) -> Result<(), StageError> {
    if dir.leave_out && entries.len() == dir.entries_before {
        return fs::remove_dir(dst).map_err(io_err("remove", dst));
    }
    fs::set_permissions(dst, fs::Permissions::from_mode(dir.entry.mode))
        .map_err(io_err("set the mode of", dst))?;
    sync_dir(dst)?;
    let mut entry = dir.entry;
    entry.entry = "dir".into();
    entries.push(entry);
    Ok(())
}

/// Verifies checkpoint directory `dir` against its manifest: every entry
/// present with its kind, mode, size and digest, nothing extra, and the
/// baselines' digest. Returns the manifest.
pub fn verify_checkpoint(dir: &Path) -> Result<CheckpointManifest, StageError> {
    let manifest = read_manifest(dir)?;
    let upper = dir.join("upper");
    let (found, _) = scan_entries(&upper)?;
    compare(&manifest, &found, &upper)?;
    check_preimages(dir, &manifest)?;
    Ok(manifest)
}

fn read_manifest(dir: &Path) -> Result<CheckpointManifest, StageError> {
    store::read_record(&dir.join("manifest.json")).map_err(StageError::Record)
}

fn check_preimages(dir: &Path, manifest: &CheckpointManifest) -> Result<Vec<u8>, StageError> {
    let preimages = dir.join("preimages.json");
    let bytes = store::read_capped(&preimages, store::RECORD_READ_CAP).map_err(StageError::Record)?;
    if store::blake3_hex(&bytes) != manifest.preimages_blake3 {
        return Err(bad(&preimages, "its digest differs from the manifest"));
    }
    Ok(bytes)
}

/// Compares entries found under `upper` with the manifest; names the first difference.
fn compare(manifest: &CheckpointManifest, found: &[CheckpointEntry], upper: &Path) -> Result<(), StageError> {
    let expected: std::collections::BTreeMap<&RelPath, &CheckpointEntry> =
        manifest.entries.iter().filter(|e| e.entry != "special").map(|e| (&e.path, e)).collect();
    let actual: std::collections::BTreeMap<&RelPath, &CheckpointEntry> =
        found.iter().filter(|e| e.entry != "special").map(|e| (&e.path, e)).collect();
    for (path, want) in &expected {
        let file = upper.join(path.as_path());
        match actual.get(path) {
            None => return Err(bad(&file, "listed in the manifest but missing")),
            Some(have) if have != want => {
                return Err(bad(
                    &file,
                    format!(
                        "differs from the manifest ({} {:o} {} bytes, manifest says {} {:o} {} bytes{})",
                        have.entry,
                        have.mode,
                        have.size,
                        want.entry,
                        want.mode,
                        want.size,
                        if have.blake3 != want.blake3 { ", different contents" } else { "" }
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    if let Some(extra) = actual.keys().find(|p| !expected.contains_key(*p)) {
        return Err(bad(&upper.join(extra.as_path()), "present but not in the manifest"));
    }
    Ok(())
}

/// Reads the entries of an upper tree without copying (for verification).
fn scan_entries(upper: &Path) -> Result<(Vec<CheckpointEntry>, ()), StageError> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = upper.join(&rel);
        for item in fs::read_dir(&dir).map_err(io_err("list", &dir))? {
            let item = item.map_err(io_err("list", &dir))?;
            let rel = rel.join(item.file_name());
            let path = upper.join(&rel);
            let meta = fs::symlink_metadata(&path).map_err(io_err("inspect", &path))?;
            let mut entry = CheckpointEntry {
                path: RelPath::new(&rel),
                entry: String::new(),
                mode: meta.mode() & 0o7777,
                size: 0,
                blake3: None,
                opaque: false,
            };
            let ft = meta.file_type();
            if overlay::is_whiteout(&path, &meta) {
                entry.entry = "whiteout".into();
                entry.mode = 0;
            } else if ft.is_dir() {
                entry.entry = "dir".into();
                entry.opaque = overlay::is_opaque(&path);
                stack.push(rel);
            } else if ft.is_file() {
                let file = File::open(&path).map_err(io_err("read", &path))?;
                entry.entry = "file".into();
                entry.size = meta.len();
                entry.blake3 = Some(pvisor_core::digest::digest(&file).map_err(io_err("read", &path))?);
            } else if ft.is_symlink() {
                let target = fs::read_link(&path).map_err(io_err("read link", &path))?;
                entry.entry = "symlink".into();
                entry.size = target.as_os_str().len() as u64;
                entry.blake3 = Some(blake3::hash(target.as_os_str().as_bytes()).to_hex().to_string());
            } else {
                continue;
            }
            out.push(entry);
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((out, ()))
}

/// Restores checkpoint `checkpoint` (a directory holding `manifest.json`,
/// `upper/` and `preimages.json`) into `destination_upper` (absent or an
/// empty directory) and `destination_preimages`: files and conflict baselines
/// together, or not at all. The checkpoint is verified first.
pub fn restore_logical_checkpoint(
    checkpoint: &Path,
    destination_upper: &Path,
    destination_preimages: &Path,
) -> Result<(CheckpointManifest, CopyMethod), StageError> {
    let manifest = read_manifest(checkpoint)?;
    let preimages = check_preimages(checkpoint, &manifest)?;
    if destination_upper.exists() {
        let empty =
            fs::read_dir(destination_upper).map_err(io_err("list", destination_upper))?.next().is_none();
        if !empty {
            return Err(bad(destination_upper, "the destination upper directory is not empty"));
        }
        fs::remove_dir(destination_upper).map_err(io_err("replace", destination_upper))?;
    }
    let name = destination_upper.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let staging = destination_upper.with_file_name(format!(".restore-{name}-{}", std::process::id()));
    let _ = pvisor_core::tree::remove_tree(&staging);
    // Copy, hashing as we go, then hold the copy against the manifest: one read
    // of the checkpoint verifies and restores it.
    let copied = copy_upper(&checkpoint.join("upper"), &staging).and_then(|(entries, method)| {
        compare(&manifest, &entries, &checkpoint.join("upper")).map(|()| method)
    });
    let method = match copied {
        Ok(m) => m,
        Err(e) => {
            let _ = pvisor_core::tree::remove_tree(&staging);
            return Err(e);
        }
    };
    let publish = (|| {
        fs::rename(&staging, destination_upper).map_err(io_err("restore", destination_upper))?;
        if let Err(e) = store::write_atomic(destination_preimages, &preimages) {
            // Not at all: take the files back out.
            let _ = pvisor_core::tree::remove_tree(destination_upper);
            return Err(StageError::Record(e));
        }
        if let Some(parent) = destination_upper.parent() {
            sync_dir(parent)?;
        }
        Ok(())
    })();
    if publish.is_err() {
        let _ = pvisor_core::tree::remove_tree(&staging);
    }
    publish.map(|()| (manifest, method))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_keep_markers_and_verification_catches_damage() {
        let root = tempfile::tempdir().unwrap();
        let upper = root.path().join("upper");
        fs::create_dir_all(upper.join("d/sub")).unwrap();
        fs::write(upper.join("d/sub/f"), "content").unwrap();
        std::os::unix::fs::symlink("../x", upper.join("link")).unwrap();
        mark_opaque(&upper.join("d")).unwrap();
        make_whiteout(&upper.join("gone")).unwrap();
        let ckpt = root.path().join("ckpt");
        fs::create_dir(&ckpt).unwrap();
        let (entries, method) = copy_upper(&upper, &ckpt.join("upper")).unwrap();
        assert!(method.reflinked + method.copied == 1);
        let kinds: Vec<(&str, bool)> = entries.iter().map(|e| (e.entry.as_str(), e.opaque)).collect();
        assert_eq!(
            kinds,
            [("dir", true), ("dir", false), ("file", false), ("whiteout", false), ("symlink", false)]
        );
        fs::write(ckpt.join("preimages.json"), b"{}").unwrap();
        let manifest = CheckpointManifest {
            format: 1,
            id: pvisor_core::ids::CheckpointId::generate(),
            kind: pvisor_core::records::CheckpointKind::Workspace,
            created_at: pvisor_core::time::Timestamp::now(),
            job: pvisor_core::ids::JobId::generate(),
            attempt: pvisor_core::ids::AttemptId::new(pvisor_core::ids::RunId::generate(), 1),
            workspace: "/ws".into(),
            lineage: None,
            copy_method: method.describe().into(),
            entries,
            preimages_blake3: store::blake3_hex(b"{}"),
            limits: String::new(),
            left_out: Vec::new(),
        };
        fs::write(ckpt.join("manifest.json"), store::to_json_bytes(&manifest)).unwrap();
        verify_checkpoint(&ckpt).unwrap();

        let dest = root.path().join("restored");
        let pre = root.path().join("pre.json");
        restore_logical_checkpoint(&ckpt, &dest, &pre).unwrap();
        assert!(overlay::is_opaque(&dest.join("d")));
        assert_eq!(fs::read(&pre).unwrap(), b"{}");

        fs::write(ckpt.join("upper/d/sub/f"), "changed").unwrap();
        let err = verify_checkpoint(&ckpt).unwrap_err();
        assert!(err.to_string().contains("d/sub/f"), "{err}");
        let dest2 = root.path().join("restored2");
        assert!(restore_logical_checkpoint(&ckpt, &dest2, &root.path().join("pre2.json")).is_err());
        assert!(!dest2.exists() && !root.path().join("pre2.json").exists(), "not at all");
    }
}
