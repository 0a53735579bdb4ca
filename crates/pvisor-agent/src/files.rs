//! The guest side of the sandbox file API ([`Request::FileOp`](pvisor_agent_proto::Request::FileOp)):
//! each operation resolved beneath a sandbox root with
//! [`resolve_in_root`](pvisor_agent_proto::resolve_in_root), and the plain
//! reads and writes of `ReadFile`/`WriteFile`. Plain std, so it is unit-tested on the host.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use pvisor_agent_proto::{
    resolve_in_root, EntryKind, FileOp, FileStat, Reply, MAX_HEADER, MAX_LISTING, MAX_PAYLOAD,
};

/// Runs `op` beneath `root` and returns the reply to send.
pub fn run(root: &Path, op: FileOp) -> io::Result<Reply> {
    let done = |op: &str| Reply::Done { op: op.into() };
    match op {
        FileOp::Stat { path } => {
            let meta = fs::metadata(resolve_in_root(root, &path, true)?)?;
            Ok(Reply::Stat { stat: stat_of(path, &meta) })
        }
        FileOp::List { path, depth } => {
            let dir = resolve_in_root(root, &path, true)?;
            let device = fs::metadata(&dir)?.dev();
            let mut listing = Listing { entries: Vec::new(), bytes: 0, device };
            let truncated = list(&dir, Path::new(""), depth.max(1), &mut listing)?;
            Ok(Reply::Listing { entries: listing.entries, truncated })
        }
        FileOp::Mkdir { path, mode } => {
            let dir = resolve_in_root(root, &path, true)?;
            fs::create_dir_all(&dir)?;
            fs::set_permissions(&dir, fs::Permissions::from_mode(mode & 0o7777))?;
            Ok(done("mkdir"))
        }
        FileOp::MkParents { path } => {
            let file = resolve_in_root(root, &path, true)?;
            if let Some(parent) = file.parent() {
                fs::create_dir_all(parent)?;
            }
            Ok(Reply::Resolved { path: file })
        }
        FileOp::Resolve { path } => Ok(Reply::Resolved { path: resolve_in_root(root, &path, true)? }),
        FileOp::Remove { path, recursive } => {
            let target = resolve_in_root(root, &path, false)?;
            if target == root {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "refusing to remove the sandbox root",
                ));
            }
            let meta = fs::symlink_metadata(&target)?;
            match (meta.is_dir(), recursive) {
                (true, true) => remove_tree(&target)?,
                (true, false) => fs::remove_dir(&target)?,
                (false, _) => fs::remove_file(&target)?,
            }
            Ok(done("remove"))
        }
        FileOp::Rename { from, to } => {
            let (from, to) = (resolve_in_root(root, &from, false)?, resolve_in_root(root, &to, false)?);
            if let Some(parent) = to.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::rename(from, to)?;
            Ok(done("rename"))
        }
        FileOp::Chmod { path, mode, uid, gid } => {
            let target = resolve_in_root(root, &path, true)?;
            if let Some(mode) = mode {
                fs::set_permissions(&target, fs::Permissions::from_mode(mode & 0o7777))?;
            }
            if uid.is_some() || gid.is_some() {
                std::os::unix::fs::chown(&target, uid, gid)?;
            }
            Ok(done("chmod"))
        }
    }
}

/// A listing being built: its entries, their encoded size so far, and the
/// filesystem it stays on.
struct Listing {
    entries: Vec<FileStat>,
    bytes: usize,
    device: u64,
}

/// Room for a `Listing` reply's entries: well inside the frame's header
/// limit, so a huge tree is cut short instead of breaking the channel.
const LISTING_BYTES: usize = (MAX_HEADER as usize) * 3 / 4;

/// Appends the entries below `dir` (named relative to the listed directory)
/// down to `depth` levels, not descending into other filesystems (`/proc`,
/// `/sys`, `/dev` are mounted inside a sandbox root). True when the listing
/// was cut short ([`MAX_LISTING`] entries, or the reply size).
fn list(dir: &Path, prefix: &Path, depth: u32, out: &mut Listing) -> io::Result<bool> {
    let mut names: Vec<_> = fs::read_dir(dir)?.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let Ok(meta) = fs::symlink_metadata(&path) else { continue };
        let relative = prefix.join(&name);
        // The JSON of one entry: its path plus about 150 bytes of fields.
        let size = relative.as_os_str().len() * 2 + 160;
        if out.entries.len() >= MAX_LISTING || out.bytes + size > LISTING_BYTES {
            return Ok(true);
        }
        out.bytes += size;
        out.entries.push(stat_of(relative.clone(), &meta));
        if meta.is_dir() && depth > 1 && meta.dev() == out.device && list(&path, &relative, depth - 1, out)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Removes the directory tree at `path` without recursion and without
/// following symlinks: the sandbox's command chose its depth, and std's
/// `remove_dir_all` recurses once per level (on PID 1's stack, here).
fn remove_tree(path: &Path) -> io::Result<()> {
    use rustix::fs::{AtFlags, Mode, OFlags};
    let open = |at: &rustix::fd::OwnedFd, name: &std::ffi::OsStr| {
        rustix::fs::openat(
            at,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
    };
    let names = |dir: &rustix::fd::OwnedFd| -> io::Result<Vec<std::ffi::OsString>> {
        let mut out = Vec::new();
        for entry in rustix::fs::Dir::read_from(dir)? {
            let bytes = entry?.file_name().to_bytes().to_vec();
            if bytes != b"." && bytes != b".." {
                out.push(std::os::unix::ffi::OsStringExt::from_vec(bytes));
            }
        }
        Ok(out)
    };
    let mut dir = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    // Per level entered: its name and its (device, inode), to climb back by
    // `..` and check that it is the directory the walk came down from.
    let id = |fd: &rustix::fd::OwnedFd| rustix::fs::fstat(fd).map(|st| (st.st_dev, st.st_ino));
    let mut trail: Vec<(std::ffi::OsString, (u64, u64))> = Vec::new();
    let mut pending = vec![names(&dir)?];
    let mut here = id(&dir)?;
    while let Some(level) = pending.last_mut() {
        let Some(name) = level.pop() else {
            pending.pop();
            let Some((done, parent)) = trail.pop() else { break };
            let up = open(&dir, std::ffi::OsStr::new(".."))?;
            if id(&up)? != parent {
                return Err(io::Error::other("the tree was moved while it was removed"));
            }
            (dir, here) = (up, parent);
            rustix::fs::unlinkat(&dir, &done, AtFlags::REMOVEDIR)?;
            continue;
        };
        match rustix::fs::unlinkat(&dir, &name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => continue,
            Err(rustix::io::Errno::ISDIR | rustix::io::Errno::PERM) => {}
            Err(e) => return Err(e.into()),
        }
        let child = open(&dir, &name)?;
        pending.push(names(&child)?);
        trail.push((name, here));
        here = id(&child)?;
        dir = child;
    }
    drop(dir);
    fs::remove_dir(path)
}

fn stat_of(path: PathBuf, meta: &fs::Metadata) -> FileStat {
    let kind = if meta.is_dir() {
        EntryKind::Dir
    } else if meta.file_type().is_symlink() {
        EntryKind::Symlink
    } else if meta.is_file() {
        EntryKind::File
    } else {
        // FIFOs, sockets and devices: reported as neither file nor directory.
        EntryKind::Fifo
    };
    FileStat {
        path,
        kind,
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
        ctime_ns: meta.ctime() * 1_000_000_000 + meta.ctime_nsec(),
    }
}

/// Reads at most `len` bytes (and at most `MAX_PAYLOAD`) from `offset`.
pub fn read_range(path: &Path, offset: u64, len: Option<u64>) -> io::Result<Vec<u8>> {
    use std::io::{Seek, SeekFrom};
    let mut file = open_regular(OpenOptions::new().read(true), path)?;
    file.seek(SeekFrom::Start(offset))?;
    let limit = len.unwrap_or(u64::MAX).min(u64::from(MAX_PAYLOAD));
    let mut bytes = Vec::new();
    file.take(limit).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Opens `path` without blocking (a FIFO or a tty would hang the agent's
/// only request loop) and refuses anything but a regular file.
pub fn open_regular(options: &OpenOptions, path: &Path) -> io::Result<File> {
    let mut options = options.clone();
    options.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    let file = options.open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    // Regular-file I/O ignores O_NONBLOCK, but clear it anyway, and only it
    // (F_SETFL replaces every status flag: O_APPEND must stay).
    if let Ok(flags) = rustix::fs::fcntl_getfl(&file) {
        let _ = rustix::fs::fcntl_setfl(&file, flags - rustix::fs::OFlags::NONBLOCK);
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_deeper_than_the_stack_and_path_max_is_removed() {
        use rustix::fs::{Mode, OFlags};
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("deep");
        fs::create_dir(&root).unwrap();
        let flags = OFlags::RDONLY | OFlags::DIRECTORY;
        let mut at = rustix::fs::open(&root, flags, Mode::empty()).unwrap();
        for _ in 0..3000 {
            rustix::fs::mkdirat(&at, "d", Mode::from_raw_mode(0o755)).unwrap();
            rustix::fs::openat(&at, "f", OFlags::CREATE | OFlags::WRONLY, Mode::from_raw_mode(0o644))
                .unwrap();
            at = rustix::fs::openat(&at, "d", flags, Mode::empty()).unwrap();
        }
        drop(at);
        // On a thread with a small stack: one frame per level would overflow it.
        let target = root.clone();
        let removed =
            std::thread::Builder::new().stack_size(64 * 1024).spawn(move || remove_tree(&target)).unwrap();
        removed.join().unwrap().unwrap();
        assert!(!root.exists());
    }

    #[test]
    fn file_ops_work_beneath_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        run(root, FileOp::Mkdir { path: "/a/b".into(), mode: 0o750 }).unwrap();
        fs::write(root.join("a/b/f"), b"hey").unwrap();
        let Reply::Stat { stat } = run(root, FileOp::Stat { path: "/a/b/f".into() }).unwrap() else {
            panic!()
        };
        assert_eq!((stat.size, stat.kind), (3, EntryKind::File));
        run(root, FileOp::Rename { from: "/a/b/f".into(), to: "/c/g".into() }).unwrap();
        let Reply::Listing { entries, truncated } =
            run(root, FileOp::List { path: "/".into(), depth: 3 }).unwrap()
        else {
            panic!()
        };
        let names: Vec<_> = entries.iter().map(|e| e.path.to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["a", "a/b", "c", "c/g"]);
        assert!(!truncated);
        assert!(run(root, FileOp::Remove { path: "/a".into(), recursive: false }).is_err());
        run(root, FileOp::Remove { path: "/a".into(), recursive: true }).unwrap();
        assert!(run(root, FileOp::Remove { path: "/".into(), recursive: true }).is_err());
        assert!(root.join("c/g").exists());
    }

    #[test]
    fn a_huge_listing_is_cut_short_within_the_frame_limit() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for i in 0..12_000 {
            fs::write(root.join(format!("file-with-a-longish-name-{i:05}")), b"").unwrap();
        }
        let Reply::Listing { entries, truncated } =
            run(root, FileOp::List { path: "/".into(), depth: 1 }).unwrap()
        else {
            panic!()
        };
        assert!(truncated && entries.len() > 1000);
        let header = serde_json::to_vec(&Reply::Listing { entries, truncated }).unwrap();
        assert!(header.len() < MAX_HEADER as usize, "{}", header.len());
    }
}
