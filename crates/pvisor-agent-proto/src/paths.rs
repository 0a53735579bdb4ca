//! Path resolution beneath a sandbox root, shared by the guest agent (the
//! file API inside a microVM) and the host (`pvisor serve` on an ns sandbox's
//! rootfs), so both confine `..` and symlinks the same way.

use std::io;
use std::path::PathBuf;

/// Resolves `path` beneath `root` like `openat2(RESOLVE_IN_ROOT)`: `..` never
/// climbs above `root`, and absolute symlink targets restart at `root`. The
/// final component is followed only with `follow`. Returns the guest path.
pub fn resolve_in_root(root: &std::path::Path, path: &std::path::Path, follow: bool) -> io::Result<PathBuf> {
    use std::path::Component;
    let mut pending: Vec<std::ffi::OsString> = path
        .components()
        .rev()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    let mut resolved: Vec<std::ffi::OsString> = Vec::new();
    let mut hops = 0;
    while let Some(part) = pending.pop() {
        if part == ".." {
            resolved.pop();
            continue;
        }
        let mut candidate = root.to_path_buf();
        candidate.extend(&resolved);
        candidate.push(&part);
        let last = pending.is_empty();
        match std::fs::symlink_metadata(&candidate) {
            Ok(meta) if meta.file_type().is_symlink() && (follow || !last) => {
                hops += 1;
                if hops > 40 {
                    return Err(io::Error::from_raw_os_error(libc::ELOOP));
                }
                let target = std::fs::read_link(&candidate)?;
                if target.is_absolute() {
                    resolved.clear();
                }
                pending.extend(target.components().rev().filter_map(|c| match c {
                    Component::Normal(n) => Some(n.to_os_string()),
                    Component::ParentDir => Some("..".into()),
                    _ => None,
                }));
            }
            _ => resolved.push(part),
        }
    }
    let mut out = root.to_path_buf();
    out.extend(&resolved);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::path::Path;

    #[test]
    fn paths_and_absolute_symlinks_stay_beneath_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(root.join("etc")).unwrap();
        symlink("/etc", root.join("abs")).unwrap();
        symlink("../../../..", root.join("up")).unwrap();
        assert_eq!(resolve_in_root(&root, Path::new("/../../etc/x"), true).unwrap(), root.join("etc/x"));
        assert_eq!(resolve_in_root(&root, Path::new("abs/passwd"), true).unwrap(), root.join("etc/passwd"));
        assert_eq!(resolve_in_root(&root, Path::new("up/etc"), true).unwrap(), root.join("etc"));
        // The final symlink itself, for remove and rename.
        assert_eq!(resolve_in_root(&root, Path::new("abs"), false).unwrap(), root.join("abs"));
        symlink("loop", root.join("loop")).unwrap();
        assert!(resolve_in_root(&root, Path::new("loop/x"), true).is_err());
    }
}
