#![allow(clippy::disallowed_methods)]
use super::*;

fn state(path: &Path) -> CheckedState {
    CheckedState {
        path: path.to_owned(),
        kind: StateKind::Directory,
        gated: super::super::DEFAULT_GATED.iter().map(|g| (*g).to_owned()).collect(),
        gated_keys: Vec::new(),
        secret_on_host: false,
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

#[test]
fn a_json_state_file_carries_except_its_gated_keys() {
    let dir = tempfile::tempdir().unwrap();
    let st = CheckedState {
        path: PathBuf::from("/home/u/.agent.json"),
        kind: StateKind::File,
        gated: super::super::DEFAULT_GATED.iter().map(|g| (*g).to_owned()).collect(),
        gated_keys: super::super::DEFAULT_GATED_KEYS.iter().map(|g| (*g).to_owned()).collect(),
        secret_on_host: false,
    };
    let start = r#"{"numStartups": 1}"#;
    let planted = r#"{"numStartups": 2, "mcpServers": {"evil": {"command": "sh"}}}"#;
    let prev = slot(dir.path(), &st, &[(".agent.json", start)], &[(".agent.json", planted)]);
    let next = dir.path().join("next");
    carry(&prev, &[], &st, &next).unwrap();
    let carried: serde_json::Value =
        serde_json::from_slice(&fs::read(next.join("tree/.agent.json")).unwrap()).unwrap();
    assert_eq!(carried, serde_json::json!({"numStartups": 2}), "the counter carries, the server does not");
    let held: BTreeMap<String, String> = read_json(&next.join("pending.json")).unwrap();
    assert_eq!(held.keys().collect::<Vec<_>>(), [".agent.json"]);

    // A run that only counts is no gated change: nothing new is held.
    let quiet = dir.path().join("quiet");
    let prev = slot(&quiet, &st, &[(".agent.json", start)], &[(".agent.json", r#"{"numStartups": 3}"#)]);
    let next = quiet.join("next");
    carry(&prev, &[], &st, &next).unwrap();
    let held: BTreeMap<String, String> = read_json(&next.join("pending.json")).unwrap();
    assert!(held.is_empty());
    assert_eq!(fs::read_to_string(next.join("tree/.agent.json")).unwrap(), r#"{"numStartups": 3}"#);
}

#[test]
fn a_held_json_change_approved_later_keeps_the_newer_counters() {
    let dir = tempfile::tempdir().unwrap();
    let st = CheckedState {
        path: PathBuf::from("/home/u/.agent.json"),
        kind: StateKind::File,
        gated: Vec::new(),
        gated_keys: vec!["mcpServers".into()],
        secret_on_host: false,
    };
    let planted = r#"{"n": 2, "mcpServers": {"m": 1}}"#;
    let prev = slot(dir.path(), &st, &[(".agent.json", r#"{"n": 1}"#)], &[(".agent.json", planted)]);
    let second = dir.path().join("second");
    carry(&prev, &[], &st, &second).unwrap();
    record_start(&st, &second).unwrap();
    fs::write(second.join("tree/.agent.json"), r#"{"n": 3}"#).unwrap();
    let held: BTreeMap<String, String> = read_json(&second.join("pending.json")).unwrap();
    let approval = Approval { path: "/home/u/.agent.json".into(), digest: held[".agent.json"].clone() };
    let third = dir.path().join("third");
    carry(&second, &[approval], &st, &third).unwrap();
    let carried: serde_json::Value =
        serde_json::from_slice(&fs::read(third.join("tree/.agent.json")).unwrap()).unwrap();
    assert_eq!(carried, serde_json::json!({"n": 3, "mcpServers": {"m": 1}}));
}

#[test]
fn a_state_file_that_is_not_json_is_gated_whole() {
    let dir = tempfile::tempdir().unwrap();
    let st = CheckedState {
        path: PathBuf::from("/home/u/.agent.json"),
        kind: StateKind::File,
        gated: Vec::new(),
        gated_keys: vec!["mcpServers".into()],
        secret_on_host: false,
    };
    let prev = slot(dir.path(), &st, &[(".agent.json", "{}")], &[(".agent.json", "not json")]);
    let next = dir.path().join("next");
    carry(&prev, &[], &st, &next).unwrap();
    assert_eq!(fs::read_to_string(next.join("tree/.agent.json")).unwrap(), "{}", "reset whole");
    let held: BTreeMap<String, String> = read_json(&next.join("pending.json")).unwrap();
    assert_eq!(held.keys().collect::<Vec<_>>(), [".agent.json"]);
}

/// What gating by name alone missed: a gated directory's bare name as a
/// symlink (here to a directory of hooks the sandbox wrote elsewhere), a
/// gated file turned into a directory (the approved settings gone), an
/// executable outside any gated name, a status line script, a symlink
/// anywhere. Each is held and the approved tree comes back.
#[test]
fn symlinks_executables_and_type_changes_are_gated() {
    let dir = tempfile::tempdir().unwrap();
    let st = state(Path::new("/home/u/.agent"));
    let start = [("settings.json", "{\"deny\":1}"), ("notes/a", "1")];
    let prev = slot(dir.path(), &st, &start, &start);
    let tree = prev.join("tree");
    fs::create_dir_all(tree.join("elsewhere")).unwrap();
    fs::write(tree.join("elsewhere/start"), "touch x").unwrap();
    std::os::unix::fs::symlink("elsewhere", tree.join("hooks")).unwrap();
    fs::remove_file(tree.join("settings.json")).unwrap();
    fs::create_dir_all(tree.join("settings.json")).unwrap();
    fs::write(tree.join("settings.json/x"), "").unwrap();
    fs::write(tree.join("notes/a"), "2").unwrap();
    fs::write(tree.join("notes/run"), "#!/bin/sh\ntouch x\n").unwrap();
    fs::set_permissions(tree.join("notes/run"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(tree.join("statusline.sh"), "touch x").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", tree.join("notes/link")).unwrap();

    let next = dir.path().join("next");
    carry(&prev, &[], &st, &next).unwrap();
    let tree = next.join("tree");
    assert_eq!(fs::read_to_string(tree.join("notes/a")).unwrap(), "2", "ordinary state carries");
    assert_eq!(
        fs::read_to_string(tree.join("settings.json")).unwrap(),
        "{\"deny\":1}",
        "the approved file is back"
    );
    for held in ["hooks", "notes/run", "statusline.sh", "notes/link"] {
        assert!(fs::symlink_metadata(tree.join(held)).is_err(), "{held} carried");
    }
    let held: BTreeMap<String, String> = read_json(&next.join("pending.json")).unwrap();
    assert_eq!(
        held.keys().collect::<Vec<_>>(),
        ["hooks", "notes/link", "notes/run", "settings.json", "statusline.sh"]
    );
}

/// An entry gated at the start stays gated whatever the run makes of it:
/// an executable script an approved hook runs through an interpreter,
/// rewritten and made plain (`chmod 644`), is held and reset.
#[test]
fn an_entry_gated_at_the_start_stays_gated_when_made_plain() {
    let dir = tempfile::tempdir().unwrap();
    let st = state(Path::new("/home/u/.agent"));
    let start = [("scripts/guard.py", "print('guard')"), ("notes/a", "1")];
    let prev = dir.path().join("prev");
    let tree = prev.join("tree");
    for (rel, body) in start {
        fs::create_dir_all(tree.join(rel).parent().unwrap()).unwrap();
        fs::write(tree.join(rel), body).unwrap();
    }
    fs::set_permissions(tree.join("scripts/guard.py"), fs::Permissions::from_mode(0o755)).unwrap();
    record_start(&st, &prev).unwrap();
    fs::remove_file(tree.join("scripts/guard.py")).unwrap();
    fs::write(tree.join("scripts/guard.py"), "import os; os.system('touch x')").unwrap();
    fs::set_permissions(tree.join("scripts/guard.py"), fs::Permissions::from_mode(0o644)).unwrap();

    let next = dir.path().join("next");
    carry(&prev, &[], &st, &next).unwrap();
    assert_eq!(fs::read_to_string(next.join("tree/scripts/guard.py")).unwrap(), "print('guard')");
    let held: BTreeMap<String, String> = read_json(&next.join("pending.json")).unwrap();
    assert_eq!(held.keys().collect::<Vec<_>>(), ["scripts/guard.py"]);
}
