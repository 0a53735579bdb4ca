use std::os::unix::fs::MetadataExt;

use super::*;
use crate::lower::index::{diff, walk};

fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

fn entry<'a>(manifest: &'a DeltaManifest, path: &str) -> &'a DeltaEntry {
    manifest
        .entries
        .iter()
        .find(|e| e.path == path.as_bytes())
        .unwrap_or_else(|| panic!("{path} not in the delta"))
}

fn names(list: &Option<Vec<Vec<u8>>>) -> Vec<String> {
    let mut out: Vec<String> =
        list.as_ref().expect("a listing").iter().map(|n| String::from_utf8_lossy(n).into_owned()).collect();
    out.sort();
    out
}

#[test]
fn the_layer_holds_changed_entries_with_their_ancestors_and_the_manifest_the_rest() {
    let ws = tempfile::tempdir().unwrap();
    let root = ws.path();
    for rel in ["deep/er/edit", "deep/er/same", "deep/del", "top", "gone/x"] {
        write(root, rel, "old");
    }
    let index = walk(root).unwrap();
    write(root, "deep/er/edit", "new contents");
    fs::set_permissions(root.join("deep/er/edit"), fs::Permissions::from_mode(0o4750)).unwrap();
    fs::remove_file(root.join("deep/del")).unwrap();
    fs::remove_dir_all(root.join("gone")).unwrap();
    write(root, "new/file", "n");
    fs::hard_link(root.join("new/file"), root.join("new/twin")).unwrap();
    symlink("../top", root.join("new/link")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.join("new/pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o640),
        0,
    )
    .unwrap();
    let xattr =
        rustix::fs::lsetxattr(root.join("new/file"), "user.pvisor", b"v", rustix::fs::XattrFlags::empty());
    let current = walk(root).unwrap();
    let d = diff(&index, &current, i64::MAX);

    let staging = tempfile::tempdir().unwrap();
    let stage_dir = staging.path().join("s");
    let size = stage(root, &current, &d, &stage_dir).unwrap();
    let layer = stage_dir.join(DELTA_LAYER);
    let manifest = DeltaManifest::parse(&fs::read(stage_dir.join(DELTA_MANIFEST)).unwrap()).unwrap();

    // Changed files are copied; unchanged siblings are not (the base has them).
    assert_eq!(fs::read_to_string(layer.join("deep/er/edit")).unwrap(), "new contents");
    assert!(!layer.join("deep/er/same").exists() && !layer.join("top").exists());
    assert_eq!(fs::read_link(layer.join("new/link")).unwrap(), Path::new("../top"));
    let (a, b) =
        (fs::metadata(layer.join("new/file")).unwrap(), fs::metadata(layer.join("new/twin")).unwrap());
    assert_eq!(a.ino(), b.ino(), "a hard link stays one inode");
    assert!(!layer.join("new/pipe").exists(), "the guest makes special files");
    assert_eq!(entry(&manifest, "new/pipe").node, Some(DeltaNode::Fifo));
    assert_eq!(size.bytes, 12 + 1, "the twin is not copied twice");

    // Exact host metadata for every entry, ancestors included.
    let host = fs::symlink_metadata(root.join("deep/er/edit")).unwrap();
    let edit = entry(&manifest, "deep/er/edit");
    assert_eq!((edit.mode, edit.uid, edit.gid), (0o4750, host.uid(), host.gid()));
    assert_eq!(edit.mtime_ns, host.mtime() * 1_000_000_000 + host.mtime_nsec());
    let er = fs::symlink_metadata(root.join("deep/er")).unwrap();
    assert_eq!(entry(&manifest, "deep/er").mtime_ns, er.mtime() * 1_000_000_000 + er.mtime_nsec());
    if xattr.is_ok() {
        assert_eq!(entry(&manifest, "new/file").xattrs, [(b"user.pvisor".to_vec(), b"v".to_vec())]);
    }

    // Deletions are listings of the changed directories; an unchanged
    // ancestor carries none (the base's own listing is right).
    assert_eq!(names(&entry(&manifest, "").listing), ["deep", "new", "top"]);
    assert_eq!(names(&entry(&manifest, "deep").listing), ["er"]);
    assert_eq!(entry(&manifest, "deep/er").listing, None, "deep/er itself did not change");
    assert_eq!(manifest.entries[0].path, b"", "the layer root comes first");
    let order: Vec<&[u8]> = manifest.entries.iter().map(|e| e.path.as_slice()).collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted, "parents before children");
}

#[test]
fn an_unchanged_workspace_still_gets_a_delta_of_the_right_size() {
    let ws = tempfile::tempdir().unwrap();
    write(ws.path(), "a", "a");
    let entries = walk(ws.path()).unwrap();
    let d = diff(&entries, &entries, i64::MAX);
    assert!(d.changed.is_empty());
    let out = tempfile::tempdir().unwrap();
    let image = out.path().join("delta.img");
    let size = build(ws.path(), &entries, &d, &out.path().join("staging"), &image).unwrap();
    assert_eq!(size, DeltaSize { entries: 1, bytes: 0 }, "just the root");
    assert_eq!(fs::metadata(&image).unwrap().len(), disk::DELTA_DISK_BYTES);
    assert!(!out.path().join("staging").exists(), "the staging tree is removed");
    // What the guest will read: the manifest at the image root (debugfs
    // comes with the e2fsprogs the vm executor needs for mkfs).
    let debugfs = ["/usr/sbin/debugfs", "/sbin/debugfs"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("debugfs");
    let cat = std::process::Command::new(debugfs)
        .args(["-R", &format!("cat /{DELTA_MANIFEST}")])
        .arg(&image)
        .output()
        .unwrap();
    assert!(cat.status.success(), "{}", String::from_utf8_lossy(&cat.stderr));
    let manifest = DeltaManifest::parse(&cat.stdout).unwrap();
    assert_eq!(manifest.entries.len(), 1);
    assert_eq!(manifest.entries[0].mode, fs::metadata(ws.path()).unwrap().mode() & 0o7777);
    // Even unchanged, the root is listed: the base has mkfs's lost+found.
    assert_eq!(names(&manifest.entries[0].listing), ["a"]);
}
