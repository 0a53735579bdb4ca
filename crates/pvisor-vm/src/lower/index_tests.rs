use std::os::unix::fs::{symlink, PermissionsExt};

use super::*;

fn paths(current: &[Entry], diff: &Diff) -> Vec<String> {
    diff.changed.iter().map(|&i| String::from_utf8_lossy(&current[i].path).into_owned()).collect()
}

fn deleted(diff: &Diff) -> Vec<String> {
    let mut out: Vec<String> = diff.deleted.iter().map(|p| String::from_utf8_lossy(p).into_owned()).collect();
    out.sort();
    out
}

fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

#[test]
fn an_untouched_tree_has_no_diff_and_the_walk_keeps_symlinks_as_entries() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    write(outside.path(), "secret", "s");
    write(dir.path(), "a/b", "b");
    symlink(outside.path(), dir.path().join("out")).unwrap();
    let index = walk(dir.path()).unwrap();
    let names: Vec<&[u8]> = index.iter().map(|e| e.path.as_slice()).collect();
    assert_eq!(names, [&b""[..], b"a", b"a/b", b"out"], "the symlinked directory was not entered");
    let link = index.iter().find(|e| e.path == b"out").unwrap();
    assert_eq!(
        (link.kind, link.target.as_deref()),
        (Kind::Symlink, Some(outside.path().as_os_str().as_bytes()))
    );
    assert_eq!(diff(&index, &walk(dir.path()).unwrap(), i64::MAX), Diff::default());
}

#[test]
fn an_entry_stamped_at_or_after_the_build_start_counts_as_changed_with_an_identical_stat() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "early", "e");
    std::thread::sleep(std::time::Duration::from_millis(30));
    write(dir.path(), "late", "l");
    let index = walk(dir.path()).unwrap();
    let late = index.iter().find(|e| e.path == b"late").unwrap().ctime_ns;
    let current = walk(dir.path()).unwrap();
    assert_eq!(index, current, "nothing changed on disk");
    // Built at the instant `late` was written: it (and the directory it
    // was written into) may have changed again within that tick.
    let d = diff(&index, &current, late);
    assert_eq!(paths(&current, &d), ["", "late"]);
    // An older build start makes everything suspect; a later one nothing.
    assert_eq!(diff(&index, &current, 0).changed.len(), current.len());
    assert!(diff(&index, &current, late + 1).changed.is_empty());
}

#[test]
fn edits_modes_symlinks_type_changes_and_deleted_directories_all_show() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for rel in
        ["same", "edit", "mode", "d2f/x", "d2f/sub/y", "f2d", "gone/a", "gone/b/c", "keep/k", "keep/del"]
    {
        write(root, rel, "old");
    }
    symlink("same", root.join("link")).unwrap();
    let index = walk(root).unwrap();

    fs::write(root.join("edit"), "new contents").unwrap();
    fs::set_permissions(root.join("mode"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::remove_file(root.join("link")).unwrap();
    symlink("edit", root.join("link")).unwrap();
    fs::remove_dir_all(root.join("d2f")).unwrap();
    write(root, "d2f", "now a file");
    fs::remove_file(root.join("f2d")).unwrap();
    write(root, "f2d/z", "now a dir");
    fs::remove_dir_all(root.join("gone")).unwrap();
    fs::remove_file(root.join("keep/del")).unwrap();
    write(root, "new", "n");

    let current = walk(root).unwrap();
    let d = diff(&index, &current, i64::MAX);
    assert_eq!(paths(&current, &d), ["", "d2f", "edit", "f2d", "f2d/z", "keep", "link", "mode", "new"]);
    assert_eq!(
        deleted(&d),
        ["d2f/sub", "d2f/sub/y", "d2f/x", "gone", "gone/a", "gone/b", "gone/b/c", "keep/del"]
    );
    let kind = |p: &[u8]| current.iter().find(|e| e.path == p).unwrap().kind;
    assert_eq!((kind(b"d2f"), kind(b"f2d")), (Kind::File, Kind::Dir));
}

#[test]
fn the_parent_of_a_deletion_is_changed_even_if_its_stat_is_not() {
    // Two walks that differ only by a vanished entry: the directory must
    // still be listed, whatever its timestamps say.
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "d/x", "x");
    write(dir.path(), "d/y", "y");
    let index = walk(dir.path()).unwrap();
    let current: Vec<Entry> = index.iter().filter(|e| e.path != b"d/x").cloned().collect();
    let d = diff(&index, &current, i64::MAX);
    assert_eq!(paths(&current, &d), ["d"]);
    assert_eq!(deleted(&d), ["d/x"]);
}

#[test]
fn the_index_round_trips_and_damage_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let odd = std::ffi::OsStr::from_bytes(b"n\xffl\nx");
    fs::write(dir.path().join(odd), "x").unwrap();
    symlink(std::ffi::OsStr::from_bytes(b"t\xfe"), dir.path().join("l")).unwrap();
    let entries = walk(dir.path()).unwrap();
    let bytes = encode(&entries);
    assert_eq!(decode(&bytes).unwrap(), entries);
    for broken in [&bytes[..bytes.len() - 1], &bytes[..10], &[bytes.as_slice(), b"x"].concat()[..]] {
        assert_eq!(decode(broken).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }
}

#[test]
fn parents_and_names_of_relative_paths() {
    assert_eq!(parent(b""), None);
    assert_eq!(parent(b"a"), Some(&b""[..]));
    assert_eq!(parent(b"a/b/c"), Some(&b"a/b"[..]));
    assert_eq!((name(b"a"), name(b"a/b/c")), (&b"a"[..], &b"c"[..]));
}
