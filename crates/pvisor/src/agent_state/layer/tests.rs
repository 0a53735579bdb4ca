#![allow(clippy::disallowed_methods)]
use super::*;

fn state(path: &Path) -> CheckedState {
    CheckedState {
        path: path.to_owned(),
        kind: StateKind::Directory,
        gated: super::super::DEFAULT_GATED.iter().map(|g| (*g).to_owned()).collect(),
    }
}

/// A slot whose run started from `start` (rel, content) and left `end`.
fn slot(dir: &Path, state: &CheckedState, start: &[(&str, &str)], end: &[(&str, &str)]) -> PathBuf {
    let slot = dir.join("prev");
    let tree = slot.join("tree");
    fs::create_dir_all(&tree).unwrap();
    let write = |files: &[(&str, &str)]| {
        tree::remove(&tree).unwrap();
        for (rel, body) in files {
            let p = tree::join(&tree, rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, body).unwrap();
        }
    };
    write(start);
    record_start(state, &slot).unwrap();
    write(end);
    slot
}

#[test]
fn an_unapproved_gated_change_is_reset_and_held_until_approved() {
    let dir = tempfile::tempdir().unwrap();
    let st = state(Path::new("/home/u/.agent"));
    let prev = slot(
        dir.path(),
        &st,
        &[("settings.json", "{}"), ("sessions/a", "1")],
        &[("settings.json", "{\"hook\":1}"), ("sessions/a", "2"), ("hooks/start", "touch x")],
    );
    let next = dir.path().join("next");
    carry(&prev, &[], &st, &next).unwrap();
    let tree = next.join("tree");
    assert_eq!(fs::read_to_string(tree.join("sessions/a")).unwrap(), "2", "ordinary state carries");
    assert_eq!(fs::read_to_string(tree.join("settings.json")).unwrap(), "{}", "reset to approved");
    assert!(!tree.join("hooks/start").exists(), "a new hook is held back");
    let held: BTreeMap<String, String> = read_json(&next.join("pending.json")).unwrap();
    assert_eq!(held.keys().collect::<Vec<_>>(), ["hooks/start", "settings.json"]);

    // The next run (which changed nothing) still holds them; approving the
    // hook's exact content lets the run after it have the hook.
    record_start(&st, &next).unwrap();
    let digest = held["hooks/start"].clone();
    let approval = Approval { path: "/home/u/.agent/hooks/start".into(), digest };
    let third = dir.path().join("third");
    carry(&next, &[approval], &st, &third).unwrap();
    assert_eq!(fs::read_to_string(third.join("tree/hooks/start")).unwrap(), "touch x");
    assert_eq!(fs::read_to_string(third.join("tree/settings.json")).unwrap(), "{}");
    let held: BTreeMap<String, String> = read_json(&third.join("pending.json")).unwrap();
    assert_eq!(held.keys().collect::<Vec<_>>(), ["settings.json"]);
}

#[test]
fn an_approval_of_other_content_does_not_count() {
    let dir = tempfile::tempdir().unwrap();
    let st = state(Path::new("/home/u/.agent"));
    let prev = slot(dir.path(), &st, &[], &[("CLAUDE.md", "run evil")]);
    let approval = Approval { path: "/home/u/.agent/CLAUDE.md".into(), digest: "file:0:0000".into() };
    let next = dir.path().join("next");
    carry(&prev, &[approval], &st, &next).unwrap();
    assert!(!next.join("tree/CLAUDE.md").exists());
}
