//! The upper-layer reader, fed crafted trees: files, directories, symlinks,
//! whiteouts (0/0 character devices and xattr whiteouts) and opaque markers,
//! over a lower layer with files of its own. The scan must not panic, every
//! change must name a plain relative path inside the tree (in the upper, or
//! a lower path an opaque directory of the upper hides), and capturing the
//! baselines must not fail on anything the scan returned.
#![no_main]

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use libfuzzer_sys::fuzz_target;
use pvisor_core::store::RelPath;
use pvisor_stage::preimage::CopyUps;

const NAMES: [&str; 6] = ["a", "b", "dir", "x.txt", "new\nline", "sp ace"];

fn setxattr(path: &Path, name: &str, value: &[u8]) {
    let (p, n) = (CString::new(path.as_os_str().as_bytes()).unwrap(), CString::new(name).unwrap());
    // SAFETY: valid C strings and buffer.
    unsafe { libc::lsetxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
}

fn build(root: &Path, data: &[u8]) {
    for chunk in data.chunks(3) {
        let [kind, a, b] = match chunk {
            [k, a, b] => [*k, *a, *b],
            _ => return,
        };
        let mut rel = PathBuf::from(NAMES[a as usize % NAMES.len()]);
        if b % 3 != 0 {
            rel = PathBuf::from(NAMES[b as usize % NAMES.len()]).join(rel);
        }
        let path = root.join(&rel);
        if let Some(parent) = path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        match kind % 6 {
            0 => drop(std::fs::write(&path, [a, b])),
            1 => drop(std::fs::create_dir_all(&path)),
            2 => drop(std::os::unix::fs::symlink(if a % 2 == 0 { "/etc" } else { "../.." }, &path)),
            3 => {
                let c = CString::new(path.as_os_str().as_bytes()).unwrap();
                // SAFETY: a valid path; a 0/0 character device (an overlay whiteout).
                unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR, 0) };
            }
            4 => {
                let _ = std::fs::create_dir_all(&path);
                setxattr(&path, "user.overlay.opaque", if a % 2 == 0 { b"y" } else { b"x" });
            }
            _ => {
                if std::fs::write(&path, []).is_ok() {
                    setxattr(&path, "user.overlay.whiteout", b"");
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().unwrap();
    let (upper, lower) = (dir.path().join("upper"), dir.path().join("lower"));
    std::fs::create_dir_all(&upper).unwrap();
    std::fs::create_dir_all(lower.join("dir")).unwrap();
    for name in ["a", "b", "x.txt", "dir/a"] {
        std::fs::write(lower.join(name), name).unwrap();
    }
    let half = data.len() / 2;
    build(&upper, &data[..half]);
    build(&lower, &data[half..]);
    let Ok(changes) = pvisor_stage::scan(&upper, &lower) else { return };
    for change in &changes {
        let bytes = change.path.as_path().as_os_str().as_bytes();
        assert!(RelPath::is_plain_relative(bytes), "scan produced {:?}", change.path);
        if upper.join(change.path.as_path()).symlink_metadata().is_err() {
            // Only a host entry hidden beneath an opaque directory of the
            // upper is named without being in it: a deletion of a lower path.
            let hidden = change.kind == pvisor_core::records::ChangeKind::Deleted
                && lower.join(change.path.as_path()).symlink_metadata().is_ok()
                && change.path.as_path().ancestors().skip(1).any(|a| !a.as_os_str().is_empty() && upper.join(a).is_dir());
            assert!(hidden, "scan named a path in neither layer as it says: {change:?}");
        }
    }
    // With the overlay's copy-up marks (none here) and without (the older,
    // coarser rule for added directories).
    for copy_ups in [CopyUps::Marked(&[]), CopyUps::Unmarked] {
        let _ = pvisor_stage::preimage::capture(&lower, &changes, copy_ups, i128::MAX);
    }
});
