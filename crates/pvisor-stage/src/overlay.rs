//! overlayfs's markers in an upper layer.
//!
//! - A *whiteout* (the lower path was deleted) is a 0/0 character device, or,
//!   on kernels that use xattr whiteouts, a file carrying `*.overlay.whiteout`.
//! - An *opaque* directory (the lower directory's contents are hidden) carries
//!   `*.overlay.opaque = "y"` (`"x"` marks a directory that merely holds xattr
//!   whiteouts and is not opaque).
//!
//! - A *copied-up* entry (overlayfs copied it up from the lower layer before
//!   the first change to it, or to an entry beneath it) carries
//!   `*.overlay.origin`; an entry the upper layer created has none.
//!
//! `*` is `user` for overlays mounted with `userxattr` (rootless, and how pvisor
//! always mounts) and `trusted` for ones mounted by real root without it.

use std::fs::Metadata;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use rustix::fs::{FileType, Mode, XattrFlags, CWD};

const NAMESPACES: [&str; 2] = ["user", "trusted"];

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = [0u8; 16];
    let n = rustix::fs::lgetxattr(path, name, &mut buf).ok()?;
    Some(buf[..n].to_vec())
}

/// Creates a whiteout at `path`: a 0/0 character device, which Linux 5.8+
/// lets unprivileged users create.
pub(crate) fn make_whiteout(path: &Path) -> io::Result<()> {
    Ok(rustix::fs::mknodat(CWD, path, FileType::CharacterDevice, Mode::empty(), 0)?)
}

/// Marks the directory `path` opaque (`user.overlay.opaque = "y"`).
pub(crate) fn mark_opaque(path: &Path) -> io::Result<()> {
    Ok(rustix::fs::lsetxattr(path, "user.overlay.opaque", b"y", XattrFlags::empty())?)
}

fn overlay_xattr(path: &Path, key: &str) -> Option<Vec<u8>> {
    NAMESPACES.iter().find_map(|ns| xattr(path, &format!("{ns}.overlay.{key}")))
}

/// Returns whether the upper entry at `path` is a whiteout.
pub(crate) fn is_whiteout(path: &Path, meta: &Metadata) -> bool {
    let ft = meta.file_type();
    if ft.is_char_device() && meta.rdev() == 0 {
        return true;
    }
    ft.is_file() && meta.len() == 0 && overlay_xattr(path, "whiteout").is_some()
}

/// Returns whether overlayfs copied the upper entry at `path` up from the
/// lower layer. It records the origin of every directory it copies up, with
/// an empty value where the lower filesystem has no file handles to store:
/// the attribute's presence is the mark, so only its size is read.
pub(crate) fn is_copied_up(path: &Path) -> bool {
    let mut size_only: [u8; 0] = [];
    NAMESPACES
        .iter()
        .any(|ns| rustix::fs::lgetxattr(path, format!("{ns}.overlay.origin"), &mut size_only).is_ok())
}

/// Returns whether the upper directory at `path` is opaque.
pub(crate) fn is_opaque(path: &Path) -> bool {
    overlay_xattr(path, "opaque").is_some_and(|v| v == b"y")
}
