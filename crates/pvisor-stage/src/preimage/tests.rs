//! Baselines per path, from sealing to the apply plan: a plain directory
//! stands in for the overlay's upper layer (overlay markers set by hand),
//! and the host writes before the baseline, "during the run" (after the
//! clock reached it) and after sealing.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::*;
use crate::apply::{plan, with_required_ancestors, Verdict};

/// A workspace, an upper layer beside it, and the run's baseline.
struct Run {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    upper: PathBuf,
    baseline: i128,
}

/// Writes `host` files into a fresh workspace (a name ending in `/` is a
/// directory), then starts the "run": takes its baseline and waits until
/// the clock has reached it, so every host write from now on is made
/// during the run.
fn start(host: &[&str]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let (ws, upper) = (dir.path().join("ws"), dir.path().join("upper"));
    fs::create_dir(&ws).unwrap();
    fs::create_dir(&upper).unwrap();
    for path in host {
        make(&ws, path, "host\n");
    }
    // Past the coarse clock's tick, as a run's fixtures wait: an edit in the
    // very tick a run starts may count as made during it.
    std::thread::sleep(std::time::Duration::from_millis(25));
    let baseline = baseline_now();
    while pvisor_core::time::coarse_realtime_ns() < baseline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    Run { _dir: dir, ws, upper, baseline }
}

/// Creates `path` beneath `root` (a directory if it ends in `/`), and the
/// directories above it.
fn make(root: &Path, path: &str, contents: &str) {
    let full = root.join(path);
    if path.ends_with('/') {
        fs::create_dir_all(&full).unwrap();
    } else {
        fs::create_dir_all(full.parent().unwrap()).unwrap();
        fs::write(&full, contents).unwrap();
    }
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    rustix::fs::lsetxattr(path, name, value, rustix::fs::XattrFlags::empty()).unwrap();
}

impl Run {
    /// What the sandbox wrote at `path` (in the upper layer).
    fn stage(&self, path: &str) {
        make(&self.upper, path, "staged\n");
    }

    /// A directory overlayfs copied up from the workspace, as it marks one.
    fn stage_copied_up(&self, path: &str) {
        make(&self.upper, &format!("{path}/"), "");
        set_xattr(&self.upper.join(path), "user.overlay.origin", b"");
    }

    /// A deletion, as a rootless overlay marks one (an xattr whiteout).
    fn stage_deletion(&self, path: &str) {
        make(&self.upper, path, "");
        set_xattr(&self.upper.join(path), "user.overlay.whiteout", b"y");
    }

    /// Seals the stage: its changes and their baselines, with the overlay's
    /// copy-up marks or without (as a VM's stage has none).
    fn seal(&self, marked: bool) -> (Vec<ChangeEntry>, Preimages) {
        let scanned = crate::scan_counted(&self.upper, &self.ws).unwrap();
        let copy_ups = if marked { CopyUps::Marked(&scanned.copied_up) } else { CopyUps::Unmarked };
        let preimages = capture(&self.ws, &scanned.changes, copy_ups, self.baseline).unwrap();
        (scanned.changes, preimages)
    }

    /// The verdict of every change when all are applied, by path.
    fn verdicts(&self, (changes, preimages): &(Vec<ChangeEntry>, Preimages)) -> BTreeMap<String, Verdict> {
        let ws = Root::open(&self.ws).unwrap();
        let all: Vec<usize> = (0..changes.len()).collect();
        let selection = with_required_ancestors(&ws, changes, &all).unwrap();
        plan(&ws, changes, &selection, preimages, &BTreeMap::new(), false)
            .unwrap()
            .into_iter()
            .map(|p| (p.change.path.as_path().display().to_string(), p.verdict))
            .collect()
    }
}

/// The paths in conflict, with the reasons.
fn conflicts(verdicts: &BTreeMap<String, Verdict>) -> BTreeMap<&str, &str> {
    verdicts
        .iter()
        .filter_map(|(path, v)| match v {
            Verdict::Conflict(reason) => Some((path.as_str(), reason.as_str())),
            _ => None,
        })
        .collect()
}

fn applies(verdicts: &BTreeMap<String, Verdict>, path: &str) -> bool {
    verdicts.get(path) == Some(&Verdict::Apply { forced: false })
}

#[test]
fn disjoint_new_files_in_a_shared_directory_do_not_conflict() {
    let run = start(&["top", "shared/kept"]);
    run.stage("mine");
    run.stage("shared/mine");
    run.stage("fresh/mine");
    // Another Job's apply adds files beside them while the run is live,
    // and another after it was sealed.
    make(&run.ws, "theirs", "theirs\n");
    make(&run.ws, "shared/theirs", "theirs\n");
    let sealed = run.seal(true);
    for (path, preimage) in sealed.1.entries.iter().map(|e| (e.path.display_escaped(), &e.preimage)) {
        assert_eq!(preimage, &Preimage::Known(HostState::Absent), "{path}");
    }
    make(&run.ws, "shared/later", "later\n");
    make(&run.ws, "fresh-theirs/x", "theirs\n");
    let verdicts = run.verdicts(&sealed);
    assert!(conflicts(&verdicts).is_empty(), "{verdicts:?}");
    for path in ["mine", "shared/mine", "fresh", "fresh/mine"] {
        assert!(applies(&verdicts, path), "{path}: {verdicts:?}");
    }
}

#[test]
fn the_same_new_path_created_on_the_host_conflicts() {
    let run = start(&["shared/kept"]);
    run.stage("shared/during");
    run.stage("shared/after");
    run.stage("shared/mine");
    make(&run.ws, "shared/during", "host, during the run\n");
    let sealed = run.seal(true);
    make(&run.ws, "shared/after", "host, after sealing\n");
    let verdicts = run.verdicts(&sealed);
    let found = conflicts(&verdicts);
    assert_eq!(found.keys().copied().collect::<Vec<_>>(), ["shared/after", "shared/during"], "{verdicts:?}");
    assert!(found["shared/during"].contains("while the run was live"), "{found:?}");
    assert!(found["shared/after"].contains("was absent, now file"), "{found:?}");
    assert!(applies(&verdicts, "shared/mine"), "{verdicts:?}");
}

#[test]
fn a_modified_file_changed_on_the_host_conflicts() {
    let run = start(&["during", "after", "untouched", "shared/other"]);
    for path in ["during", "after", "untouched"] {
        run.stage(path);
    }
    make(&run.ws, "during", "host edit during the run\n");
    make(&run.ws, "shared/other", "host edit of a file the run left alone\n");
    let sealed = run.seal(true);
    make(&run.ws, "after", "host edit after sealing\n");
    let verdicts = run.verdicts(&sealed);
    let found = conflicts(&verdicts);
    assert_eq!(found.keys().copied().collect::<Vec<_>>(), ["after", "during"], "{verdicts:?}");
    assert!(found["after"].contains("changed on the host since the run"), "{found:?}");
    assert!(applies(&verdicts, "untouched"), "{verdicts:?}");
}

#[test]
fn a_parent_replaced_by_a_symlink_or_removed_is_refused() {
    let run = start(&["sub/file", "gone/file"]);
    run.stage("sub/file");
    run.stage("sub/new");
    run.stage("gone/new");
    let sealed = run.seal(true);
    // After sealing, the host swaps sub/ for a symlink out of the workspace
    // and removes gone/.
    let outside = run.ws.parent().unwrap().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::rename(run.ws.join("sub"), run.ws.parent().unwrap().join("sub.moved")).unwrap();
    symlink(&outside, run.ws.join("sub")).unwrap();
    fs::remove_dir_all(run.ws.join("gone")).unwrap();
    let verdicts = run.verdicts(&sealed);
    let found = conflicts(&verdicts);
    assert_eq!(found.len(), 3, "{verdicts:?}");
    assert_eq!(found["sub/new"], "its directory sub is now a symlink on the host");
    assert_eq!(found["sub/file"], "its directory sub is now a symlink on the host");
    assert_eq!(found["gone/new"], "its directory gone is no longer on the host");
}

#[test]
fn a_parent_swapped_for_a_symlink_during_the_run_is_refused() {
    let run = start(&["sub/file"]);
    run.stage("sub/new");
    fs::remove_dir_all(run.ws.join("sub")).unwrap();
    symlink("/", run.ws.join("sub")).unwrap();
    let sealed = run.seal(true);
    let verdicts = run.verdicts(&sealed);
    let found = conflicts(&verdicts);
    assert!(found["sub"].starts_with("no baseline: changed on the host while the run was live"), "{found:?}");
}

#[test]
fn a_deleted_file_the_host_changed_conflicts() {
    let run = start(&["during", "after", "kept-as-is"]);
    for path in ["during", "after", "kept-as-is"] {
        run.stage_deletion(path);
    }
    make(&run.ws, "during", "host edit during the run\n");
    let sealed = run.seal(true);
    make(&run.ws, "after", "host edit after sealing\n");
    let verdicts = run.verdicts(&sealed);
    let found = conflicts(&verdicts);
    assert_eq!(found.keys().copied().collect::<Vec<_>>(), ["after", "during"], "{verdicts:?}");
    assert!(applies(&verdicts, "kept-as-is"), "{verdicts:?}");
}

#[test]
fn a_directory_the_run_wrote_into_and_the_host_renamed_has_no_baseline() {
    let run = start(&["src/a.rs"]);
    // The run writes into src/ (overlayfs copies it up); the host renames it.
    run.stage_copied_up("src");
    run.stage("src/b.rs");
    run.stage("new/c.rs");
    fs::rename(run.ws.join("src"), run.ws.join("lib")).unwrap();
    let sealed = run.seal(true);
    let verdicts = run.verdicts(&sealed);
    let found = conflicts(&verdicts);
    assert_eq!(found.keys().copied().collect::<Vec<_>>(), ["src"], "{verdicts:?}");
    assert_eq!(found["src"], format!("no baseline: {LOST_DIRECTORY}"));
    assert!(applies(&verdicts, "new") && applies(&verdicts, "new/c.rs"), "{verdicts:?}");

    // A stage without copy-up marks cannot tell: an added directory whose
    // nearest host directory changed during the run keeps no baseline.
    let unmarked = run.verdicts(&run.seal(false));
    let found = conflicts(&unmarked);
    assert_eq!(found.keys().copied().collect::<Vec<_>>(), ["new", "src"], "{unmarked:?}");
    assert!(found["new"].contains("its directory the workspace root changed"), "{found:?}");
}

#[test]
fn a_directory_the_run_replaced_conflicts_on_any_host_change_beneath_it() {
    let run = start(&["d/x", "e/x"]);
    for dir in ["d", "e"] {
        run.stage(&format!("{dir}/y"));
        set_xattr(&run.upper.join(dir), "user.overlay.opaque", b"y");
    }
    // Apply removes whatever the replaced directories hold: what another
    // writer adds to one of them, even under a new name, is a conflict
    // (for the directory, and for the new entry, which it would delete).
    make(&run.ws, "d/theirs", "theirs\n");
    let sealed = run.seal(true);
    let verdicts = run.verdicts(&sealed);
    let found = conflicts(&verdicts);
    assert_eq!(found.keys().copied().collect::<Vec<_>>(), ["d", "d/theirs"], "{verdicts:?}");
    assert!(found["d"].starts_with("no baseline: "), "{found:?}");
    assert!(applies(&verdicts, "e"), "{verdicts:?}");
}
