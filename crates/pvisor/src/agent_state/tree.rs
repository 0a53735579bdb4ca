//! Plain file trees of agent state: copying one (never following a
//! symlink, never copying a socket, fifo or device) and its manifest, one
//! digest per entry, which is what "changed" means for state.
//!
//! Nothing here knows about Jobs or gating; `layer.rs` does.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Each entry of a tree by its path relative to the tree's root (`/`
/// separated): `dir`, `link:TARGET`, or `file:MODE:BLAKE3`.
pub(crate) type Manifest = BTreeMap<String, String>;

/// The digest of an entry that does not exist: a deletion.
pub(crate) const ABSENT: &str = "absent";

/// Copies the tree `from` into `to` (created), keeping modes and symlinks,
/// leaving out sockets, fifos, devices and every path `skip` names (a
/// hidden secret store). A missing `from` copies nothing.
pub(crate) fn copy_tree(from: &Path, to: &Path, skip: &dyn Fn(&Path) -> bool) -> io::Result<()> {
    let Ok(meta) = fs::symlink_metadata(from) else {
        return fs::create_dir_all(to);
    };
    fs::create_dir_all(to)?;
    fs::set_permissions(to, fs::Permissions::from_mode(meta.permissions().mode() & 0o7777))?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if skip(&src) {
            continue;
        }
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&src, &dst, skip)?;
        } else {
            copy_entry(&src, &dst)?;
        }
    }
    Ok(())
}

/// Copies one file or symlink `from` to `to`, replacing what is there and
/// making the parents; anything else (a socket, a device) is left out.
pub(crate) fn copy_entry(from: &Path, to: &Path) -> io::Result<()> {
    let kind = fs::symlink_metadata(from)?.file_type();
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent)?;
    }
    remove(to)?;
    if kind.is_symlink() {
        std::os::unix::fs::symlink(fs::read_link(from)?, to)
    } else if kind.is_file() {
        // Never a setuid or setgid copy of what a sandbox wrote.
        let mode = fs::copy(from, to).and_then(|_| fs::metadata(to))?.permissions().mode();
        fs::set_permissions(to, fs::Permissions::from_mode(mode & 0o777))
    } else if kind.is_dir() {
        copy_tree(from, to, &|_| false)
    } else {
        Ok(())
    }
}

/// Removes `path`, whatever it is; a missing one is fine.
pub(crate) fn remove(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The manifest of the tree at `root` (empty when it does not exist).
pub(crate) fn manifest(root: &Path) -> io::Result<Manifest> {
    let mut out = Manifest::new();
    walk(root, "", &mut out)?;
    Ok(out)
}

fn walk(dir: &Path, prefix: &str, out: &mut Manifest) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
        let path = entry.path();
        let Some(digest) = digest(&path)? else { continue };
        let is_dir = digest == "dir";
        out.insert(rel.clone(), digest);
        if is_dir {
            walk(&path, &rel, out)?;
        }
    }
    Ok(())
}

/// The manifest digest of one entry: `None` for what a tree never holds
/// (a socket, fifo or device) and for a missing path.
pub(crate) fn digest(path: &Path) -> io::Result<Option<String>> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let kind = meta.file_type();
    Ok(if kind.is_dir() {
        Some("dir".into())
    } else if kind.is_symlink() {
        Some(format!("link:{}", fs::read_link(path)?.display()))
    } else if kind.is_file() {
        let hash = blake3::hash(&fs::read(path)?);
        Some(format!("file:{:o}:{}", meta.permissions().mode() & 0o111, hash.to_hex()))
    } else {
        None
    })
}

/// Whether `path` is an overlay whiteout (a 0/0 character device): the
/// command deleted what the lower layer had.
pub(crate) fn is_whiteout(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == 0)
}

/// `rel` under `root`, every ancestor made a real directory first: a
/// symlink or file the sandbox left where a directory is needed is
/// removed, so nothing written or removed at the result can land outside
/// `root` (the runtime does this as root, on trees a sandbox wrote).
pub(crate) fn beneath(root: &Path, rel: &str) -> io::Result<PathBuf> {
    fs::create_dir_all(root)?;
    let mut path = root.to_owned();
    let parts: Vec<&str> = rel.split('/').collect();
    let (last, ancestors) = parts.split_last().unwrap_or((&"", &[]));
    for part in ancestors {
        path.push(part);
        match fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => continue,
            Ok(_) => fs::remove_file(&path)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        fs::create_dir(&path)?;
    }
    Ok(path.join(last))
}

/// Makes an overlay whiteout (a 0/0 character device) at `path`: in an
/// upper layer it hides what the lower one has there.
pub(crate) fn whiteout(path: &Path) -> io::Result<()> {
    let mode = rustix::fs::Mode::from_raw_mode(0o600);
    rustix::fs::mknodat(rustix::fs::CWD, path, rustix::fs::FileType::CharacterDevice, mode, 0)
        .map_err(io::Error::from)
}

/// `root` joined with the `/`-separated relative path `rel`.
pub(crate) fn join(root: &Path, rel: &str) -> PathBuf {
    rel.split('/').fold(root.to_owned(), |p, c| p.join(c))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::disallowed_methods)]
    use super::*;

    #[test]
    fn a_copy_has_the_same_manifest_without_sockets_or_skipped_paths() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        fs::create_dir_all(src.join("a/b")).unwrap();
        fs::write(src.join("a/b/f"), b"x").unwrap();
        fs::write(src.join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink("a/b/f", src.join("l")).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(src.join("sock")).unwrap();
        let dst = dir.path().join("dst");
        let secret = src.join("secret");
        copy_tree(&src, &dst, &|p| p == secret).unwrap();
        let m = manifest(&dst).unwrap();
        assert_eq!(m.keys().collect::<Vec<_>>(), ["a", "a/b", "a/b/f", "l"]);
        assert_eq!(m["l"], "link:a/b/f");
        let mut src_m = manifest(&src).unwrap();
        src_m.remove("secret");
        assert_eq!(src_m, m, "a socket is not in a manifest, and the copy matches");
        assert!(manifest(&dir.path().join("missing")).unwrap().is_empty());
    }

    #[test]
    fn beneath_replaces_a_symlinked_ancestor_rather_than_follow_it() {
        let dir = tempfile::tempdir().unwrap();
        let (root, outside) = (dir.path().join("tree"), dir.path().join("outside"));
        fs::create_dir_all(&root).unwrap();
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("start"), b"host").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("hooks")).unwrap();
        let target = beneath(&root, "hooks/start").unwrap();
        remove(&target).unwrap();
        assert_eq!(fs::read(outside.join("start")).unwrap(), b"host", "never through the link");
        assert!(root.join("hooks").is_dir() && !root.join("hooks").is_symlink());
    }
}
