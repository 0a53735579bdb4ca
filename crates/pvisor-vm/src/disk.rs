//! The VM's disks: ext4 images of a tree (the workspace's base image and
//! its per-start delta, both lower layers of the guest overlay), the sparse
//! ext4 upper disk, the disk list QEMU attaches, plus the sparse copy and
//! digest that checkpoints use.
//!
//! Block devices rather than a 9p share because QEMU cannot migrate a guest
//! with a mounted 9p export, and virtiofs blocks migration always; the copy
//! into the image is the price of execution checkpoints (docs/vm-executor.md).
//!
//! Every disk has a constant virtual size, whatever it holds: a guest
//! restored from a template probed its disks at boot, so a new Attempt's
//! disks must look the same size. The filesystem inside may be smaller.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use pvisor_sandbox::checkpoint::{DELTA, LOWER, UPPER};
pub(crate) use pvisor_sandbox::checkpoint::{IMAGE_DELTA, IMAGE_LOWER};

/// Virtual size of the base image disk: the largest workspace a vm Job takes.
pub(crate) const LOWER_DISK_BYTES: u64 = 256 << 30;
/// Virtual size of the delta disk.
pub(crate) const DELTA_DISK_BYTES: u64 = 64 << 30;
/// Size of the sparse upper disk; only written blocks use host space.
pub(crate) const UPPER_DISK_BYTES: u64 = 8 << 30;

/// One disk on the QEMU command line.
/// A disk file whose name is none of the device list's.
#[derive(Debug, thiserror::Error)]
#[error("{} is not a VM disk pvisor knows", .0.display())]
pub struct UnknownDisk(std::path::PathBuf);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Disk<'a> {
    /// The QEMU drive id.
    pub id: &'static str,
    /// The virtio serial the agent finds it by.
    pub serial: &'static str,
    pub path: &'a Path,
    pub readonly: bool,
}

impl<'a> Disk<'a> {
    /// The disk whose file is `path`, known by its name ([`LOWER`],
    /// [`DELTA`], [`UPPER`], [`IMAGE_LOWER`] or [`IMAGE_DELTA`], as in a
    /// checkpoint). An Attempt's device list is its disk files in order:
    /// lower, delta, upper for a boot, then a userland image's lower and
    /// delta; for a restore exactly the checkpoint's list (one taken before
    /// the delta existed has none).
    pub(crate) fn of(path: &'a Path) -> Result<Self, UnknownDisk> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let (id, serial, readonly) = match name {
            LOWER => ("lower", pvisor_agent_proto::LOWER_SERIAL, true),
            DELTA => ("delta", pvisor_agent_proto::DELTA_SERIAL, false),
            UPPER => ("upper", pvisor_agent_proto::UPPER_SERIAL, false),
            IMAGE_LOWER => ("image-lower", pvisor_agent_proto::IMAGE_LOWER_SERIAL, true),
            // Written once, by the agent finishing it, as the workspace's.
            IMAGE_DELTA => ("image-delta", pvisor_agent_proto::IMAGE_DELTA_SERIAL, false),
            _ => return Err(UnknownDisk(path.to_owned())),
        };
        Ok(Self { id, serial, path, readonly })
    }
}

/// A fresh start's disk files, in device order, with their constant
/// virtual sizes (a template guest probed disks of these sizes at boot, and
/// its clones attach their own in their place): the workspace's three, then
/// a userland image's two (the same sizes as the workspace's pair).
const BOOT_DISKS: [(&str, u64); 5] = [
    (LOWER, LOWER_DISK_BYTES),
    (DELTA, DELTA_DISK_BYTES),
    (UPPER, UPPER_DISK_BYTES),
    (IMAGE_LOWER, LOWER_DISK_BYTES),
    (IMAGE_DELTA, DELTA_DISK_BYTES),
];

/// The device lists a fresh start can have: the workspace's disks alone,
/// or with a userland image's (`--image`). Each is a template shape of its
/// own, since a restored guest has exactly the devices its template booted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Workspace,
    Userland,
}

impl Layout {
    /// Every layout, for recognising a template as current.
    pub(crate) const ALL: [Layout; 2] = [Layout::Workspace, Layout::Userland];

    /// The layout of a start with (or without) a userland image.
    pub fn of(userland: bool) -> Self {
        if userland {
            Self::Userland
        } else {
            Self::Workspace
        }
    }

    /// The disk files of a fresh start, in device order, with their sizes.
    fn disks(self) -> &'static [(&'static str, u64)] {
        match self {
            Self::Workspace => &BOOT_DISKS[..3],
            Self::Userland => &BOOT_DISKS,
        }
    }

    /// The layout as a template key records it: ids, serials, access, sizes.
    pub(crate) fn description(self) -> String {
        self.disks()
            .iter()
            .filter_map(|(name, size)| {
                let path = Path::new(name);
                let d = Disk::of(path).ok()?;
                Some(format!("{}:{}:{}:{size}", d.id, d.serial, if d.readonly { "ro" } else { "rw" }))
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Blank sparse disks of the real names and virtual sizes in `dir`,
    /// for a template's boot; returned in device order.
    pub(crate) fn placeholder_disks(self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        self.disks()
            .iter()
            .map(|(name, size)| {
                let path = dir.join(name);
                File::create(&path)?.set_len(*size)?;
                Ok(path)
            })
            .collect()
    }
}

/// The file names of a fresh start's workspace disks, in device order.
pub(crate) fn boot_disk_names() -> [&'static str; 3] {
    [BOOT_DISKS[0].0, BOOT_DISKS[1].0, BOOT_DISKS[2].0]
}

/// Host bytes allocated under `path` (sparse files count their data only).
/// Walked without recursion (see `pvisor_core::tree`).
pub(crate) fn allocated_bytes(path: &Path) -> u64 {
    pvisor_core::tree::allocated_bytes(path)
}

/// Room an image of a tree needs: file and directory bytes (rounded to
/// blocks) and entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Footprint {
    pub bytes: u64,
    pub inodes: u64,
}

/// Makes `image` an ext4 filesystem holding the tree at `source`
/// (`mkfs.ext4 -d`, no journal) sized for `room`, its root owned by
/// `root_owner`, then extends the file to `disk_bytes` (sparse). A tree that
/// does not fit is an error naming the limit.
pub(crate) fn image_tree(
    source: &Path,
    image: &Path,
    room: Footprint,
    root_owner: (u32, u32),
    disk_bytes: u64,
    what: &str,
) -> io::Result<()> {
    // Room for metadata and block rounding; ext4 needs at least a few MiB.
    let size = (room.bytes + room.bytes / 8 + room.inodes * 4096 + (16 << 20)).div_ceil(1 << 20) << 20;
    if size > disk_bytes {
        return Err(io::Error::other(format!(
            "the {what} needs an ext4 filesystem of {:.1} GiB, over the {} GiB disk the vm executor gives it \
             (use a smaller workspace, or --executor ns)",
            size as f64 / (1u64 << 30) as f64,
            disk_bytes >> 30
        )));
    }
    File::create(image)?.set_len(size)?;
    // 4 KiB blocks, as `room` assumes (mke2fs would pick 1 KiB for a small
    // filesystem). It rounds the inodes per group, sometimes down, so `-N`
    // asks for some more than the tree has.
    mkfs(
        image,
        &[
            "-b",
            "4096",
            "-O",
            "^has_journal,^resize_inode",
            "-N",
            &(room.inodes + room.inodes / 16 + 256).to_string(),
            "-E",
            &format!("root_owner={}:{}", root_owner.0, root_owner.1),
            "-d",
            &source.to_string_lossy(),
        ],
    )?;
    File::options().write(true).open(image)?.set_len(disk_bytes)
}

/// The sparse, empty upper disk, being formatted by `mkfs.ext4` in the
/// background: a start images the workspace and verifies its template
/// meanwhile (the two overlap on a second CPU; on one they cost what they
/// did in a row). Dropped before [`PendingUpper::finish`], the process is
/// killed and reaped.
pub(crate) struct PendingUpper {
    mkfs: Option<Child>,
    image: PathBuf,
}

/// Starts making the upper disk at `image`.
pub(crate) fn start_upper(image: &Path) -> io::Result<PendingUpper> {
    File::create(image)?.set_len(UPPER_DISK_BYTES)?;
    // No journal: the upper disk is scratch (a crashed VM exports nothing,
    // a checkpoint freezes it first), and a journal slows mount and writes.
    let child = mkfs_command(image, &["-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard"])
        .stdin(Stdio::null()) // the command's stdin, never mkfs's
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(cannot_run)?;
    Ok(PendingUpper { mkfs: Some(child), image: image.to_owned() })
}

impl PendingUpper {
    /// Waits for `mkfs.ext4`; its failure is an error naming the image.
    pub(crate) fn finish(mut self) -> io::Result<()> {
        let Some(child) = self.mkfs.take() else { return Ok(()) };
        checked(child.wait_with_output()?, &self.image)
    }
}

impl Drop for PendingUpper {
    fn drop(&mut self) {
        if let Some(mut child) = self.mkfs.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn mkfs_command(image: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(mkfs_path());
    command.args(["-q", "-F", "-t", "ext4"]).args(args).arg(image);
    command
}

fn cannot_run(e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("cannot run mkfs.ext4 (install e2fsprogs): {e}"))
}

fn mkfs(image: &Path, args: &[&str]) -> io::Result<()> {
    checked(mkfs_command(image, args).output().map_err(cannot_run)?, image)
}

fn checked(output: Output, image: &Path) -> io::Result<()> {
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

/// Copies `src` to `dst` keeping holes (reflink first, where the filesystem can).
pub(crate) fn sparse_copy(src: &Path, dst: &Path) -> io::Result<()> {
    let status =
        Command::new("cp").args(["--reflink=auto", "--sparse=always", "--"]).arg(src).arg(dst).status()?;
    if !status.success() {
        return Err(io::Error::other(format!("cp {} {} failed ({status})", src.display(), dst.display())));
    }
    File::open(dst)?.sync_all()
}

/// Keeps the disk `src` at `dst` (a checkpoint's copy, or a restore's): the
/// lower image is read-only to QEMU and never changes, so a link keeps it;
/// the others are guest-writable (the delta too: the guest finished it at
/// setup, and a command as guest root could still write it), so they are
/// copied and never share blocks with a running VM.
pub(crate) fn keep_disk(src: &Path, dst: &Path) -> io::Result<()> {
    // Base images are never written after publication: shared, not copied.
    if src.file_name().is_some_and(|n| n == LOWER || n == IMAGE_LOWER) {
        link_or_copy(src, dst)
    } else {
        sparse_copy(src, dst)
    }
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
    fn a_tree_always_fits_the_image_its_footprint_sizes() {
        // mke2fs rounds the inodes per group, sometimes down: with many
        // groups (much data) and few entries, an exact `-N` came out short
        // ("Could not allocate inode"). A sparse file makes the data cheap.
        let out = tempfile::tempdir().unwrap();
        let tree = tempfile::tempdir().unwrap();
        for i in 0..1000 {
            fs::write(tree.path().join(i.to_string()), "").unwrap();
        }
        let big = 200u64 << 20;
        File::create(tree.path().join("big")).unwrap().set_len(big).unwrap();
        for extra in [0u64, 24 << 20, 48 << 20] {
            let room = Footprint { bytes: big + extra, inodes: 1002 };
            let image = out.path().join(format!("{extra}.img"));
            image_tree(tree.path(), &image, room, (0, 0), 1 << 30, "tree").unwrap();
            assert_eq!(fs::metadata(&image).unwrap().len(), 1 << 30);
        }
    }

    /// The upper disk formatted in the background is an ext4 of the upper's
    /// virtual size once finished; one dropped unfinished leaves no process.
    #[test]
    fn an_upper_disk_made_in_the_background_is_ext4_and_a_dropped_one_is_reaped() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("upper.img");
        start_upper(&image).unwrap().finish().unwrap();
        assert_eq!(fs::metadata(&image).unwrap().len(), UPPER_DISK_BYTES);
        let mut magic = [0u8; 2];
        let mut file = File::open(&image).unwrap();
        file.seek(SeekFrom::Start(1024 + 0x38)).unwrap();
        file.read_exact(&mut magic).unwrap();
        assert_eq!(u16::from_le_bytes(magic), 0xEF53, "no ext4 superblock");

        let pending = start_upper(&dir.path().join("dropped.img")).unwrap();
        let pid = pending.mkfs.as_ref().unwrap().id();
        drop(pending);
        // Killed and waited for: no process, not even a zombie, has the pid.
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "mkfs {pid} outlived its PendingUpper");
    }

    /// A start with a userland image has the workspace's disks, then the
    /// image's two: another template shape, whose placeholders are all five.
    #[test]
    fn a_userland_layout_is_the_workspace_layout_and_two_more_disks() {
        let (plain, userland) = (Layout::Workspace.description(), Layout::Userland.description());
        assert_ne!(plain, userland);
        assert!(userland.starts_with(&format!("{plain},image-lower:")), "{userland}");
        let dir = tempfile::tempdir().unwrap();
        let disks = Layout::Userland.placeholder_disks(dir.path()).unwrap();
        let names: Vec<_> =
            disks.iter().map(|d| d.file_name().unwrap().to_str().unwrap().to_owned()).collect();
        assert_eq!(names, [LOWER, DELTA, UPPER, IMAGE_LOWER, IMAGE_DELTA]);
        assert_eq!(fs::metadata(&disks[3]).unwrap().len(), LOWER_DISK_BYTES);
        assert_eq!(Layout::of(false), Layout::Workspace);
    }

    /// A userland image's disks are known by name, found by the agent by
    /// serial; its base is read-only and kept by a link, never copied.
    #[test]
    fn a_userland_images_disks_are_known_and_its_base_is_shared() {
        let dir = tempfile::tempdir().unwrap();
        let (base, delta) = (dir.path().join(IMAGE_LOWER), dir.path().join(IMAGE_DELTA));
        let d = Disk::of(&base).unwrap();
        assert_eq!((d.serial, d.readonly), (pvisor_agent_proto::IMAGE_LOWER_SERIAL, true));
        let d = Disk::of(&delta).unwrap();
        assert_eq!((d.serial, d.readonly), (pvisor_agent_proto::IMAGE_DELTA_SERIAL, false));
        fs::write(&base, b"base").unwrap();
        let kept = dir.path().join("kept");
        fs::create_dir(&kept).unwrap();
        keep_disk(&base, &kept.join(IMAGE_LOWER)).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(fs::metadata(&base).unwrap().ino(), fs::metadata(kept.join(IMAGE_LOWER)).unwrap().ino());
    }

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
