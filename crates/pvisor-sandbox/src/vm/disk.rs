//! The VM's disks: a read-only ext4 image of the workspace (the overlay's
//! lower layer) and a sparse ext4 disk for the upper layer, plus the sparse
//! copy and digest that checkpoints use.
//!
//! Block devices rather than a 9p share because QEMU cannot migrate a guest
//! with a mounted 9p export, and virtiofs blocks migration always; the copy
//! into the image is the price of execution checkpoints (docs/vm-executor.md).

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::qemu::Disk;
use std::process::Command;

/// Size of the sparse upper disk; only written blocks use host space.
pub(crate) const UPPER_DISK_BYTES: u64 = 8 << 30;
/// The workspace image's virtual size. Constant, whatever the workspace:
/// a template guest probed disks of these sizes at boot and its clones
/// attach their own in their place (the ext4 inside may be smaller).
pub(crate) const LOWER_DISK_BYTES: u64 = 256 << 30;

/// A VM's workspace disk files, in device order.
#[derive(Clone, Debug)]
pub(crate) struct WorkspaceFiles {
    pub lower: PathBuf,
    pub upper: PathBuf,
}

impl WorkspaceFiles {
    pub(crate) fn in_dir(dir: &Path) -> Self {
        Self { lower: dir.join("lower.img"), upper: dir.join("upper.img") }
    }

    pub(crate) fn all(&self) -> [&Path; 2] {
        [&self.lower, &self.upper]
    }
}

/// The QEMU disks for `files`: the same ids, serials and order for boots,
/// restores and templates (part of the migration contract).
pub(crate) fn workspace_disks(files: &WorkspaceFiles) -> Vec<Disk<'_>> {
    vec![
        Disk { id: "lower", serial: pvisor_agent_proto::LOWER_SERIAL, path: &files.lower, readonly: true },
        Disk { id: "upper", serial: pvisor_agent_proto::UPPER_SERIAL, path: &files.upper, readonly: false },
    ]
}

/// The disk layout as a template key records it.
pub(crate) fn layout_description() -> String {
    let files = WorkspaceFiles::in_dir(Path::new("/"));
    let sizes = [LOWER_DISK_BYTES, UPPER_DISK_BYTES];
    workspace_disks(&files)
        .iter()
        .zip(sizes)
        .map(|(d, size)| format!("{}:{}:{}:{size}", d.id, d.serial, if d.readonly { "ro" } else { "rw" }))
        .collect::<Vec<_>>()
        .join(",")
}

/// Blank sparse disks of the real virtual sizes, for a template's boot.
pub(crate) fn placeholder_disks(dir: &Path) -> io::Result<WorkspaceFiles> {
    let files = WorkspaceFiles::in_dir(dir);
    File::create(&files.lower)?.set_len(LOWER_DISK_BYTES)?;
    File::create(&files.upper)?.set_len(UPPER_DISK_BYTES)?;
    Ok(files)
}

/// Host bytes allocated under `path` (sparse files count their data only).
pub(crate) fn allocated_bytes(path: &Path) -> u64 {
    let Ok(meta) = fs::symlink_metadata(path) else { return 0 };
    if !meta.is_dir() {
        return meta.blocks() * 512;
    }
    fs::read_dir(path).into_iter().flatten().flatten().map(|e| allocated_bytes(&e.path())).sum()
}

/// Builds `image` from the tree at `workspace` with `mkfs.ext4 -d`.
pub(crate) fn build_lower(workspace: &Path, image: &Path) -> io::Result<()> {
    let (bytes, inodes) = measure(workspace)?;
    // Room for metadata and block rounding; ext4 needs at least a few MiB.
    let size = (bytes + bytes / 8 + inodes * 4096 + (16 << 20)).div_ceil(1 << 20) << 20;
    let meta = fs::metadata(workspace)?;
    if size > LOWER_DISK_BYTES {
        return Err(io::Error::other(format!(
            "the workspace needs a {} MiB image, more than the vm executor's {} GiB workspace disk; use --executor ns or a smaller workspace",
            size >> 20,
            LOWER_DISK_BYTES >> 30
        )));
    }
    File::create(image)?.set_len(size)?;
    mkfs(
        image,
        &[
            "-O",
            "^has_journal,^resize_inode",
            "-N",
            &(inodes + 64).to_string(),
            "-E",
            &format!("root_owner={}:{}", meta.uid(), meta.gid()),
            "-d",
            &workspace.to_string_lossy(),
        ],
    )?;
    // The device's size is constant; the filesystem keeps its own.
    fs::OpenOptions::new().write(true).open(image)?.set_len(LOWER_DISK_BYTES)
}

/// Creates the sparse, empty upper disk.
pub(crate) fn create_upper(image: &Path) -> io::Result<()> {
    File::create(image)?.set_len(UPPER_DISK_BYTES)?;
    // No journal: the upper disk is scratch (a crashed VM exports nothing,
    // a checkpoint freezes it first), and a journal slows mount and writes.
    mkfs(image, &["-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard"])
}

fn mkfs(image: &Path, args: &[&str]) -> io::Result<()> {
    let output =
        Command::new(mkfs_path()).args(["-q", "-F", "-t", "ext4"]).args(args).arg(image).output().map_err(
            |e| io::Error::new(e.kind(), format!("cannot run mkfs.ext4 (install e2fsprogs): {e}")),
        )?;
    if !output.status.success() {
        return Err(io::Error::other(format!(
            "mkfs.ext4 failed on {}: {}",
            image.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(())
}

fn mkfs_path() -> &'static str {
    ["/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("mkfs.ext4")
}

/// Bytes (rounded to blocks) and entries under `dir`, not following symlinks.
fn measure(dir: &Path) -> io::Result<(u64, u64)> {
    let (mut bytes, mut inodes) = (0u64, 1u64);
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            inodes += 1;
            bytes += meta.len().div_ceil(4096) * 4096;
            if meta.is_dir() {
                bytes += 4096;
                stack.push(entry.path());
            }
        }
    }
    Ok((bytes, inodes))
}

/// Copies `src` to `dst` keeping holes (reflink first, where the filesystem can).
pub(crate) fn sparse_copy(src: &Path, dst: &Path) -> io::Result<()> {
    let status =
        Command::new("cp").args(["--reflink=auto", "--sparse=always", "--"]).arg(src).arg(dst).status()?;
    if !status.success() {
        return Err(io::Error::other(format!("cp {} {} failed ({status})", src.display(), dst.display())));
    }
    File::open(dst)?.sync_all()
}

/// Links `src` at `dst`, or copies it across filesystems. For immutable files only.
pub(crate) fn link_or_copy(src: &Path, dst: &Path) -> io::Result<()> {
    match fs::hard_link(src, dst) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => sparse_copy(src, dst),
        Err(e) => Err(e),
    }
}

/// BLAKE3 of a whole file, read in 1 MiB chunks.
pub(crate) fn file_digest(path: &Path) -> io::Result<String> {
    let mut hasher = blake3::Hasher::new();
    let mut file = File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().to_hex().to_string())
}

/// BLAKE3 over the data extents of a sparse file (offset, length, bytes), so
/// an 8 GiB disk with 20 MiB written is hashed in 20 MiB of reads. A hole and
/// written zeros hash differently; that is fine for an integrity check of
/// files pvisor itself copied.
pub(crate) fn sparse_digest(path: &Path) -> io::Result<String> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut hasher = blake3::Hasher::new();
    hasher.update(&len.to_le_bytes());
    let mut offset: i64 = 0;
    let mut buf = vec![0u8; 1 << 20];
    while (offset as u64) < len {
        let Ok(data) = rustix::fs::seek(&file, rustix::fs::SeekFrom::Data(offset as u64)) else {
            break; // ENXIO: only a hole remains
        };
        let data = data as i64;
        let end = match rustix::fs::seek(&file, rustix::fs::SeekFrom::Hole(data as u64)) {
            Ok(hole) => hole as i64,
            Err(_) => len as i64,
        };
        hasher.update(&data.to_le_bytes());
        hasher.update(&(end - data).to_le_bytes());
        file.seek(SeekFrom::Start(data as u64))?;
        let mut left = (end - data) as u64;
        while left > 0 {
            let want = left.min(buf.len() as u64) as usize;
            let n = file.read(&mut buf[..want])?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            left -= n as u64;
        }
        offset = end;
    }
    Ok(hasher.finalize().to_hex().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_digest_sees_data_not_holes() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let f = File::create(&a).unwrap();
        f.set_len(64 << 20).unwrap();
        std::os::unix::fs::FileExt::write_at(&f, b"hello", 32 << 20).unwrap();
        sparse_copy(&a, &b).unwrap();
        assert_eq!(sparse_digest(&a).unwrap(), sparse_digest(&b).unwrap());
        std::os::unix::fs::FileExt::write_at(&File::options().write(true).open(&b).unwrap(), b"j", 32 << 20)
            .unwrap();
        assert_ne!(sparse_digest(&a).unwrap(), sparse_digest(&b).unwrap());
    }
}
