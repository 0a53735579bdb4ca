//! overlayfs's markers in an upper layer.
//!
//! - A *whiteout* (the lower path was deleted) is a 0/0 character device, or,
//!   on kernels that use xattr whiteouts, a file carrying `*.overlay.whiteout`.
//! - An *opaque* directory (the lower directory's contents are hidden) carries
//!   `*.overlay.opaque = "y"` (`"x"` marks a directory that merely holds xattr
//!   whiteouts and is not opaque).
//!
//! `*` is `user` for overlays mounted with `userxattr` (rootless, and how pvisor
//! always mounts) and `trusted` for ones mounted by real root without it.

use std::ffi::CString;
use std::fs::Metadata;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

const NAMESPACES: [&str; 2] = ["user", "trusted"];

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let cpath = CString::new(path.as_os_str().as_bytes()).ok()?;
    let cname = CString::new(name).ok()?;
    let mut buf = [0u8; 16];
    // SAFETY: valid C strings and a buffer of the stated length.
    let n = unsafe { libc::lgetxattr(cpath.as_ptr(), cname.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (n >= 0).then(|| buf[..n as usize].to_vec())
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

/// Returns whether the upper directory at `path` is opaque.
pub(crate) fn is_opaque(path: &Path) -> bool {
    overlay_xattr(path, "opaque").is_some_and(|v| v == b"y")
}
