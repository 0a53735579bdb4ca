use super::*;
use std::os::unix::fs::{symlink, PermissionsExt};

fn kinds(changes: &[ChangeEntry]) -> Vec<(String, &'static str)> {
    changes.iter().map(|c| (c.path.display_escaped(), c.kind.as_str())).collect()
}

fn mknod_whiteout(path: &Path) -> bool {
    crate::overlay::make_whiteout(path).is_ok()
}

#[test]
fn classifies_plain_changes_against_the_lower_layer() {
    let lower = tempfile::tempdir().unwrap();
    let upper = tempfile::tempdir().unwrap();
    let (l, u) = (lower.path(), upper.path());
    fs::write(l.join("tracked"), "a\n").unwrap();
    fs::write(l.join("same"), "same\n").unwrap();
    fs::write(l.join("chmod"), "x").unwrap();
    fs::create_dir(l.join("dir")).unwrap();
    fs::write(l.join("was-file"), "f").unwrap();
    symlink("old", l.join("link")).unwrap();

    fs::write(u.join("tracked"), "a\nb\n").unwrap();
    fs::write(u.join("same"), "same\n").unwrap();
    fs::write(u.join("chmod"), "x").unwrap();
    fs::set_permissions(u.join("chmod"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(l.join("chmod"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::create_dir(u.join("dir")).unwrap();
    fs::write(u.join("dir/new"), "n").unwrap();
    fs::create_dir(u.join("was-file")).unwrap();
    symlink("new", u.join("link")).unwrap();

    let changes = scan(u, l).unwrap();
    assert_eq!(
        kinds(&changes),
        vec![
            ("chmod".into(), "mode-changed"),
            ("dir/new".into(), "added"),
            ("link".into(), "symlink"),
            ("tracked".into(), "modified"),
            ("was-file".into(), "type-changed"),
        ]
    );
    let tracked = changes.iter().find(|c| c.path.as_path() == Path::new("tracked")).unwrap();
    assert_eq!(tracked.size, 4);
    assert_eq!(tracked.blake3.as_deref(), Some(blake3::hash(b"a\nb\n").to_hex().as_str()));
}

#[test]
fn added_directories_the_overlay_copied_up_are_noted() {
    let lower = tempfile::tempdir().unwrap();
    let upper = tempfile::tempdir().unwrap();
    let (l, u) = (lower.path(), upper.path());
    fs::create_dir(l.join("kept")).unwrap();
    for dir in ["kept", "lost", "made"] {
        fs::create_dir(u.join(dir)).unwrap();
        fs::write(u.join(dir).join("f"), "f").unwrap();
    }
    // Copied up from the lower layer; "lost" is no longer there.
    for dir in ["kept", "lost"] {
        let flags = rustix::fs::XattrFlags::empty();
        rustix::fs::lsetxattr(u.join(dir), "user.overlay.origin", b"", flags).unwrap();
    }
    let scanned = scan_counted(u, l).unwrap();
    assert_eq!(kinds(&scanned.changes).len(), 5, "{:?}", kinds(&scanned.changes));
    assert_eq!(scanned.copied_up, [RelPath::new(Path::new("lost"))]);
}

#[test]
#[ignore = "needs CAP_MKNOD (root): scripts/test.sh runs it as root, with --include-ignored"]
fn whiteouts_are_deletions_only_when_the_lower_path_exists() {
    let lower = tempfile::tempdir().unwrap();
    let upper = tempfile::tempdir().unwrap();
    fs::write(lower.path().join("gone"), "x").unwrap();
    assert!(
        mknod_whiteout(&upper.path().join("gone")),
        "creating a whiteout needs CAP_MKNOD (the test is ignored unless included)"
    );
    assert!(mknod_whiteout(&upper.path().join("never-existed")));
    assert_eq!(kinds(&scan(upper.path(), lower.path()).unwrap()), vec![("gone".into(), "deleted")]);
}

#[test]
fn an_opaque_directory_names_every_host_entry_it_hides() {
    let lower = tempfile::tempdir().unwrap();
    let upper = tempfile::tempdir().unwrap();
    let (l, u) = (lower.path(), upper.path());
    fs::create_dir_all(l.join("src/sub")).unwrap();
    fs::write(l.join("src/guard.rs"), "check()\n").unwrap();
    fs::write(l.join("src/main.rs"), "main\n").unwrap();
    fs::write(l.join("src/sub/deep.rs"), "deep\n").unwrap();
    fs::write(l.join("src/sub/kept.rs"), "kept\n").unwrap();
    // `rm -rf src && mkdir src` and most files copied back.
    fs::create_dir_all(u.join("src/sub")).unwrap();
    // Every filesystem a temporary directory lives on here has user
    // xattrs (tmpfs since Linux 6.6): a host without them fails this.
    crate::overlay::mark_opaque(&u.join("src")).expect("user xattrs in the temporary directory");
    fs::write(u.join("src/main.rs"), "main\n").unwrap();
    fs::write(u.join("src/sub/kept.rs"), "kept, edited\n").unwrap();
    assert_eq!(
        kinds(&scan(u, l).unwrap()),
        vec![
            ("src".into(), "opaque-dir"),
            ("src/guard.rs".into(), "deleted"),
            ("src/sub/deep.rs".into(), "deleted"),
            ("src/sub/kept.rs".into(), "modified"),
        ]
    );
}

#[test]
fn a_file_with_several_names_is_hashed_once_and_its_least_path_is_the_first() {
    let lower = tempfile::tempdir().unwrap();
    let upper = tempfile::tempdir().unwrap();
    let u = upper.path();
    fs::create_dir(u.join("a")).unwrap();
    fs::write(u.join("a/x"), "data").unwrap();
    fs::hard_link(u.join("a/x"), u.join("a-c")).unwrap();
    fs::hard_link(u.join("a/x"), u.join("b")).unwrap();
    let changes = scan(u, lower.path()).unwrap();
    let first = |p: &str| {
        let c = changes.iter().find(|c| c.path.as_path() == Path::new(p)).unwrap();
        c.hardlink_of.as_ref().map(|f| f.display_escaped())
    };
    assert_eq!(first("a-c"), None);
    assert_eq!(first("a/x"), Some("a-c".into()));
    assert_eq!(first("b"), Some("a-c".into()));
}

#[test]
fn a_tree_10000_directories_deep_under_an_opaque_directory_is_scanned_without_recursion() {
    use rustix::fs::{mkdirat, openat, Mode, OFlags};
    let lower = tempfile::tempdir().unwrap();
    let upper = tempfile::tempdir().unwrap();
    let (l, u) = (lower.path(), upper.path());
    fs::create_dir_all(l.join("keep/a")).unwrap();
    fs::write(l.join("keep/a/gone"), "x").unwrap();
    fs::create_dir(u.join("keep")).unwrap();
    crate::overlay::mark_opaque(&u.join("keep")).expect("user xattrs in the temporary directory");
    // Deeper than PATH_MAX, so made one directory at a time.
    let mut dir =
        openat(rustix::fs::CWD, u.join("keep"), OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).unwrap();
    for _ in 0..10_000 {
        mkdirat(&dir, "a", Mode::from_raw_mode(0o755)).unwrap();
        dir = openat(&dir, "a", OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).unwrap();
    }
    // The test thread's 2 MiB stack: a recursive walk overflows it here.
    let scanned = scan_counted(u, l).unwrap();
    let changes = &scanned.changes;
    // "keep" then "/a" per level (the first `a` is the host's, unchanged):
    // the directories past PATH_MAX are counted, not recorded.
    let recorded_dirs = (RECORDED_PATH_MAX - "keep".len()) / 2 - 1;
    assert_eq!(changes.len(), 1 + 1 + recorded_dirs, "the opaque dir, the deletion, the new directories");
    assert_eq!(changes.len() as u64 + scanned.beyond_limit, 1 + 1 + 9_999);
    assert_eq!(changes.iter().filter(|c| c.kind == ChangeKind::Deleted).count(), 1);
    let gone = RelPath::new(Path::new("keep/a/gone"));
    assert!(changes.iter().any(|c| c.path == gone));
}

#[test]
fn a_tree_deeper_than_the_stack_and_path_max_is_scanned_and_what_is_too_deep_counted() {
    use pvisor_core::tree::DirCursor;
    let lower = tempfile::tempdir().unwrap();
    let upper = tempfile::tempdir().unwrap();
    let mut cursor = DirCursor::open(upper.path()).unwrap();
    let depth = 3_000;
    for _ in 0..depth {
        let dir = std::fs::File::open(cursor.entry_path(std::ffi::OsStr::new("."))).unwrap();
        rustix::fs::mkdirat(&dir, "d", rustix::fs::Mode::from_raw_mode(0o700)).unwrap();
        fs::write(cursor.entry_path(std::ffi::OsStr::new("f")), "x").unwrap();
        cursor.descend(std::ffi::OsStr::new("d")).unwrap();
    }
    let scanned = scan_counted(upper.path(), lower.path()).unwrap();
    // "d/" per level: every path up to PATH_MAX is recorded, the rest counted.
    let recorded = scanned.changes.len() as u64;
    assert_eq!(recorded + scanned.beyond_limit, 2 * depth as u64);
    assert!(scanned.beyond_limit > 0 && recorded > 2_000, "{recorded} {}", scanned.beyond_limit);
    assert!(scanned.changes.iter().all(|c| c.path.as_path().as_os_str().len() <= RECORDED_PATH_MAX));
}

#[test]
fn symlinks_in_the_stage_are_never_followed() {
    let lower = tempfile::tempdir().unwrap();
    let upper = tempfile::tempdir().unwrap();
    symlink("/etc/shadow", upper.path().join("evil")).unwrap();
    let changes = scan(upper.path(), lower.path()).unwrap();
    assert_eq!(changes[0].entry, EntryType::Symlink);
    assert_eq!(changes[0].size, "/etc/shadow".len() as u64);
}
