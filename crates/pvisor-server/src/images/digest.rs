//! The content digest of an imported root filesystem: what a run records as
//! the userland it ran in (`--image`), so a record still says which bytes
//! ran after the name was imported again.
//!
//! BLAKE3 over every entry in a fixed order (names sorted bytewise, a
//! directory before its children), each entry framed with length prefixes:
//! its path relative to the root, its kind, permission bits, owner and
//! group, and for a file the content digest `pvisor_core::digest` gives
//! every file pvisor hashes, for a symlink its target. Times are left out:
//! two imports of the same tree agree. The walk keeps an explicit stack, so
//! no tree is deep enough to exhaust the supervisor's.

use std::fs;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The digest prefix: which hash, so another can follow without ambiguity.
pub const PREFIX: &str = "blake3:";

/// `blake3:HEX` of the tree at `root` (see the module doc).
pub fn tree_digest(root: &Path) -> io::Result<String> {
    let mut hasher = blake3::Hasher::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let path = root.join(&rel);
        let meta = fs::symlink_metadata(&path)?;
        let kind = meta.file_type();
        let (tag, content) = if kind.is_dir() {
            let mut names: Vec<_> =
                fs::read_dir(&path)?.map(|e| e.map(|e| e.file_name())).collect::<Result<_, _>>()?;
            names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            // Reversed: the stack pops them in sorted order.
            stack.extend(names.into_iter().rev().map(|name| rel.join(name)));
            ("dir", Vec::new())
        } else if kind.is_file() {
            ("file", pvisor_core::digest::digest(&fs::File::open(&path)?)?.into_bytes())
        } else if kind.is_symlink() {
            ("symlink", fs::read_link(&path)?.into_os_string().into_vec())
        } else if kind.is_fifo() {
            ("fifo", Vec::new())
        } else {
            // Imports create no devices or sockets; a tree that has one was
            // changed by hand, and its digest says so.
            ("other", meta.rdev().to_le_bytes().to_vec())
        };
        for field in [
            rel.as_os_str().as_bytes(),
            tag.as_bytes(),
            &(meta.mode() & 0o7777).to_le_bytes(),
            &meta.uid().to_le_bytes(),
            &meta.gid().to_le_bytes(),
            &content,
        ] {
            hasher.update(&(field.len() as u64).to_le_bytes());
            hasher.update(field);
        }
    }
    Ok(format!("{PREFIX}{}", hasher.finalize().to_hex()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("usr/bin")).unwrap();
        fs::write(dir.path().join("usr/bin/tool"), b"#!/bin/sh\n").unwrap();
        std::os::unix::fs::symlink("usr/bin", dir.path().join("bin")).unwrap();
        dir
    }

    #[test]
    fn the_same_tree_has_the_same_digest_and_times_do_not_count() {
        let (a, b) = (tree(), tree());
        let digest = tree_digest(a.path()).unwrap();
        assert!(digest.starts_with(PREFIX) && digest.len() == PREFIX.len() + 64, "{digest}");
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1);
        fs::File::options()
            .write(true)
            .open(b.path().join("usr/bin/tool"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert_eq!(tree_digest(b.path()).unwrap(), digest);
    }

    #[test]
    fn contents_modes_names_and_link_targets_each_change_it() {
        let base = tree_digest(tree().path()).unwrap();
        let changes: [&dyn Fn(&Path); 4] = [
            &|p| fs::write(p.join("usr/bin/tool"), b"#!/bin/bash\n").unwrap(),
            &|p| {
                use std::os::unix::fs::PermissionsExt;
                fs::set_permissions(p.join("usr/bin/tool"), fs::Permissions::from_mode(0o755)).unwrap()
            },
            &|p| fs::rename(p.join("usr/bin/tool"), p.join("usr/bin/tool2")).unwrap(),
            &|p| {
                fs::remove_file(p.join("bin")).unwrap();
                std::os::unix::fs::symlink("/usr/bin", p.join("bin")).unwrap()
            },
        ];
        for (i, change) in changes.iter().enumerate() {
            let dir = tree();
            change(dir.path());
            assert_ne!(tree_digest(dir.path()).unwrap(), base, "change {i} went unnoticed");
        }
    }
}
