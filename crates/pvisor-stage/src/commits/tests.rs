use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use pvisor_core::records::{ChangeEntry, ChangeKind, EntryType};
use pvisor_core::store::RelPath;

use super::*;
use crate::beneath::Root;

fn rel(p: &str) -> RelPath {
    RelPath::new(Path::new(p))
}

#[test]
fn only_objects_refs_and_what_git_derives_are_part_of_a_commit() {
    let obj = ".git/objects/ab/cdef0123456789abcdef0123456789abcdef01";
    let pack = ".git/objects/pack/pack-0123456789abcdef0123456789abcdef01234567.pack";
    let cases = [
        (obj, EntryType::File, Role::Object),
        (obj, EntryType::None, Role::Object),
        (obj, EntryType::Symlink, Role::Other),
        (".git/objects/ab", EntryType::Dir, Role::Derived),
        (pack, EntryType::File, Role::Pack),
        (
            ".git/objects/pack/pack-0123456789abcdef0123456789abcdef01234567.rev",
            EntryType::File,
            Role::Derived,
        ),
        (".git/objects/pack/evil.pack", EntryType::File, Role::Other),
        (".git/refs/heads/main", EntryType::File, Role::Ref),
        (".git/refs/heads/feature/x", EntryType::File, Role::Ref),
        (".git/refs/tags/v1", EntryType::File, Role::Ref),
        (".git/refs/heads/main.lock", EntryType::File, Role::Other),
        (".git/refs/heads/main", EntryType::Symlink, Role::Other),
        (".git/refs/remotes/origin/main", EntryType::File, Role::Other),
        (".git/packed-refs", EntryType::File, Role::PackedRefs),
        (".git/logs/HEAD", EntryType::File, Role::Derived),
        (".git/logs/refs/heads/main", EntryType::File, Role::Derived),
        (".git/index", EntryType::File, Role::Derived),
        (".git/COMMIT_EDITMSG", EntryType::File, Role::Derived),
        // Never part of a commit: what makes the host run code.
        (".git/HEAD", EntryType::File, Role::Other),
        (".git/config", EntryType::File, Role::Other),
        (".git/hooks/post-checkout", EntryType::File, Role::Other),
        (".git/info/attributes", EntryType::File, Role::Other),
        (".git/objects/info/alternates", EntryType::File, Role::Other),
        (".git/modules/sub/config", EntryType::File, Role::Other),
        (".git/worktrees/w/gitdir", EntryType::File, Role::Other),
        ("sub/.git/refs/heads/main", EntryType::File, Role::Other),
        ("src/main.rs", EntryType::File, Role::Other),
    ];
    for (path, entry, expected) in cases {
        assert_eq!(role(Path::new(path), entry), expected, "{path} as {entry:?}");
    }
}

#[test]
fn packed_refs_give_branches_and_tags_only() {
    let a = "a".repeat(40);
    let b = "b".repeat(40);
    let text = format!(
        "# pack-refs with: peeled fully-peeled sorted\n{a} refs/heads/main\n{b} refs/remotes/origin/main\n\
         {b} refs/tags/v1\n^{a}\nnot a line\n{a} refs/heads/.hidden\n"
    );
    assert_eq!(
        parse_packed(text.as_bytes()),
        vec![("refs/heads/main".to_owned(), a.clone()), ("refs/tags/v1".to_owned(), b.clone())]
    );
}

/// Runs git in `dir` with a fixed identity and no user config.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A host repository with one commit, and a sandbox copy of it.
struct Repos {
    _dir: tempfile::TempDir,
    host: PathBuf,
    sandbox: PathBuf,
    upper: PathBuf,
}

/// The sandbox commits a new file `b` ("second") on its branch.
fn commit_b(r: &Repos) {
    fs::write(r.sandbox.join("b"), "b\n").unwrap();
    git(&r.sandbox, &["add", "b"]);
    git(&r.sandbox, &["commit", "-qm", "second"]);
}

fn repos() -> Repos {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host");
    fs::create_dir(&host).unwrap();
    git(&host, &["init", "-q"]);
    fs::write(host.join("a"), "a\n").unwrap();
    git(&host, &["add", "a"]);
    git(&host, &["commit", "-qm", "first"]);
    let sandbox = dir.path().join("sandbox");
    assert!(Command::new("cp").arg("-a").arg(&host).arg(&sandbox).status().unwrap().success());
    let upper = dir.path().join("upper");
    Repos { host, sandbox, upper, _dir: dir }
}

/// What an overlay would have staged: every file under the sandbox's
/// `.git` that differs from the host's, and every host file it lacks.
fn stage(r: &Repos) -> Vec<ChangeEntry> {
    let mut changes = Vec::new();
    let mut stack = vec![PathBuf::from(".git")];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(r.sandbox.join(&d)).unwrap() {
            let p = d.join(entry.unwrap().file_name());
            let full = r.sandbox.join(&p);
            if full.is_dir() {
                stack.push(p);
                continue;
            }
            let host = fs::read(r.host.join(&p)).ok();
            let staged = fs::read(&full).unwrap();
            if host.as_ref() == Some(&staged) {
                continue;
            }
            fs::create_dir_all(r.upper.join(&p).parent().unwrap()).unwrap();
            fs::write(r.upper.join(&p), &staged).unwrap();
            let kind = if host.is_some() { ChangeKind::Modified } else { ChangeKind::Added };
            changes.push(change(&p, kind, EntryType::File));
        }
    }
    let mut stack = vec![PathBuf::from(".git")];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(r.host.join(&d)).unwrap() {
            let p = d.join(entry.unwrap().file_name());
            if r.host.join(&p).is_dir() {
                stack.push(p);
            } else if !r.sandbox.join(&p).exists() {
                changes.push(change(&p, ChangeKind::Deleted, EntryType::None));
            }
        }
    }
    changes.sort_by(|a, b| a.path.cmp(&b.path));
    changes
}

fn change(p: &Path, kind: ChangeKind, entry: EntryType) -> ChangeEntry {
    ChangeEntry { path: RelPath::new(p), kind, entry, size: 0, mode: 0o644, blake3: None, hardlink_of: None }
}

fn check(r: &Repos, changes: &[ChangeEntry]) -> Checked {
    let (ws, upper) = (Root::open(&r.host).unwrap(), Root::open(&r.upper).unwrap());
    let staged = find(changes, &ws, &upper).unwrap().expect("a commit");
    verify(&r.host, &upper, changes, staged, r._dir.path()).unwrap()
}

#[test]
fn a_sandbox_commit_lands_fast_forward_with_its_reflog_and_index() {
    let r = repos();
    commit_b(&r);
    let new = git(&r.sandbox, &["rev-parse", "HEAD"]);
    fs::create_dir_all(&r.upper).unwrap();
    let changes = stage(&r);
    // The host's own `git status` rewrote its index meanwhile: no matter.
    git(&r.host, &["status", "--short"]);
    let checked = check(&r, &changes);
    assert!(checked.refused.is_empty(), "{:?}", checked.refused);
    assert_eq!(checked.moves.len(), 1);
    assert_eq!(checked.moves[0].name, "refs/heads/main");
    assert!(checked.new_objects >= 3, "commit, tree, blob: {}", checked.new_objects);
    let landed = checked.land(&Root::open(&r.host).unwrap(), "pvisor apply").unwrap();
    assert!(landed.failed.is_empty() && landed.warnings.is_empty(), "{landed:?}");
    assert_eq!(git(&r.host, &["rev-parse", "HEAD"]), new);
    git(&r.host, &["fsck", "--strict", "--no-dangling"]);
    assert!(git(&r.host, &["reflog", "-1"]).contains("pvisor apply"));
    // The index follows the branch: `b` is known to git, not staged as removed.
    assert!(git(&r.host, &["ls-files"]).contains('b'));
    // Every staged `.git/` path of a commit is a member; none is left over.
    assert_eq!(checked.members.len(), changes.len(), "{changes:?}");
}

#[test]
fn a_branch_the_host_moved_is_refused_naming_both_commits() {
    let r = repos();
    fs::write(r.sandbox.join("b"), "b\n").unwrap();
    git(&r.sandbox, &["add", "b"]);
    git(&r.sandbox, &["commit", "-qm", "sandbox"]);
    fs::create_dir_all(&r.upper).unwrap();
    let changes = stage(&r);
    fs::write(r.host.join("c"), "c\n").unwrap();
    git(&r.host, &["add", "c"]);
    git(&r.host, &["commit", "-qm", "host"]);
    let host_head = git(&r.host, &["rev-parse", "HEAD"]);
    let checked = check(&r, &changes);
    assert!(checked.moves.is_empty());
    assert_eq!(checked.refused.len(), 1);
    let reason = &checked.refused[0].reason;
    assert!(reason.contains("not a fast-forward") && reason.contains(&host_head[..7]), "{reason}");
}

#[test]
fn a_forged_or_incomplete_history_is_refused() {
    let r = repos();
    commit_b(&r);
    fs::create_dir_all(&r.upper).unwrap();
    let mut changes = stage(&r);
    // The blob of `b` left out of the stage: the commit's tree is dangling.
    let blob = git(&r.sandbox, &["rev-parse", "HEAD:b"]);
    let blob_path = format!(".git/objects/{}/{}", &blob[..2], &blob[2..]);
    changes.retain(|c| c.path.as_path() != Path::new(&blob_path));
    let checked = check(&r, &changes);
    assert!(checked.moves.is_empty());
    assert!(checked.refused[0].reason.contains("incomplete"), "{:?}", checked.refused);

    // A ref naming an object nobody holds.
    let upper_ref = r.upper.join(".git/refs/heads/main");
    fs::write(&upper_ref, format!("{}\n", "1".repeat(40))).unwrap();
    let checked = check(&r, &changes);
    assert!(checked.refused[0].reason.contains("neither the stage nor the host"), "{:?}", checked.refused);
}

#[test]
fn a_repacked_sandbox_lands_from_its_pack_and_packed_refs() {
    let r = repos();
    // A branch the sandbox leaves alone, packed by its gc with the rest.
    git(&r.host, &["branch", "side"]);
    assert!(Command::new("cp")
        .arg("-a")
        .arg(r.host.join(".git/refs"))
        .arg(r.sandbox.join(".git"))
        .status()
        .unwrap()
        .success());
    commit_b(&r);
    git(&r.sandbox, &["gc", "-q"]);
    let new = git(&r.sandbox, &["rev-parse", "HEAD"]);
    fs::create_dir_all(&r.upper).unwrap();
    let changes = stage(&r);
    assert!(changes.iter().any(|c| role(c.path.as_path(), c.entry) == Role::Pack));
    let checked = check(&r, &changes);
    assert!(checked.refused.is_empty(), "{:?}", checked.refused);
    assert_eq!(checked.moves.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), ["refs/heads/main"]);
    assert!(checked.already.is_empty(), "an untouched packed branch is not reported: {:?}", checked.already);
    checked.land(&Root::open(&r.host).unwrap(), "pvisor apply").unwrap();
    assert_eq!(git(&r.host, &["rev-parse", "refs/heads/main"]), new);
    git(&r.host, &["fsck", "--strict", "--no-dangling"]);
}

#[test]
fn hooks_and_config_are_never_members() {
    let r = repos();
    fs::write(r.sandbox.join(".git/hooks/post-commit"), "#!/bin/sh\ntouch pwned\n").unwrap();
    commit_b(&r);
    fs::create_dir_all(&r.upper).unwrap();
    let changes = stage(&r);
    let checked = check(&r, &changes);
    let hook = changes.iter().position(|c| c.path == rel(".git/hooks/post-commit")).unwrap();
    assert!(!checked.members.contains(&hook));
    checked.land(&Root::open(&r.host).unwrap(), "pvisor apply").unwrap();
    assert!(!r.host.join(".git/hooks/post-commit").exists() && !r.host.join("pwned").exists());
}

#[test]
fn an_apply_killed_after_landing_finds_the_refs_already_moved() {
    let r = repos();
    commit_b(&r);
    fs::create_dir_all(&r.upper).unwrap();
    let changes = stage(&r);
    check(&r, &changes).land(&Root::open(&r.host).unwrap(), "pvisor apply").unwrap();
    // The ledger never heard of it: the next apply checks again.
    let again = check(&r, &changes);
    assert!(again.moves.is_empty() && again.refused.is_empty(), "{again:?}");
    assert_eq!(again.already.len(), 1);
    assert_eq!(again.members.len(), changes.len());
    let landed = again.land(&Root::open(&r.host).unwrap(), "pvisor apply").unwrap();
    assert!(landed.moved.is_empty() && landed.failed.is_empty());
    git(&r.host, &["fsck", "--strict", "--no-dangling"]);
}

#[test]
fn a_staged_index_the_user_changed_is_left_alone() {
    let r = repos();
    commit_b(&r);
    fs::create_dir_all(&r.upper).unwrap();
    let changes = stage(&r);
    // The user staged work of their own meanwhile.
    fs::write(r.host.join("mine"), "mine\n").unwrap();
    git(&r.host, &["add", "mine"]);
    let landed = check(&r, &changes).land(&Root::open(&r.host).unwrap(), "pvisor apply").unwrap();
    assert!(landed.warnings.iter().any(|w| w.contains("index")), "{landed:?}");
    assert!(git(&r.host, &["ls-files"]).contains("mine"), "the user's staged file is still staged");
}

/// Run as root in a repository another user owns, the pack, ref, reflog
/// and index git writes are handed to that user (skipped, saying so, when
/// not root).
#[test]
fn as_root_what_git_writes_belongs_to_the_repositorys_owner() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: needs root to own files as another user");
        return;
    }
    let r = repos();
    commit_b(&r);
    fs::create_dir_all(&r.upper).unwrap();
    let changes = stage(&r);
    assert!(Command::new("chown").args(["-R", "4242:4242"]).arg(&r.host).status().unwrap().success());
    check(&r, &changes).land(&Root::open(&r.host).unwrap(), "pvisor apply").unwrap();
    let mut stack = vec![r.host.join(".git")];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 4242, "{} is root's", path.display());
            if meta.is_dir() {
                stack.push(path);
            }
        }
    }
}

/// The loose object file of `hash` in the repository at `dir`.
fn loose(dir: &Path, hash: &str) -> PathBuf {
    dir.join(format!(".git/objects/{}/{}", &hash[..2], &hash[2..]))
}

/// A staged loose object under the name of one the host holds (the blob
/// of `a`), holding a commit whose parent is the host's HEAD, and the
/// branch set to that name: believed, it would pass for a fast-forward of
/// a commit. Every staged object is hashed before anything is read from
/// it, so the forgery is refused as one.
#[test]
fn a_staged_object_posing_as_a_host_object_is_refused() {
    let r = repos();
    let blob = git(&r.host, &["rev-parse", "HEAD:a"]);
    let head = git(&r.host, &["rev-parse", "HEAD"]);
    commit_b(&r);
    let commit = git(&r.sandbox, &["rev-parse", "HEAD"]);
    assert_eq!(git(&r.sandbox, &["rev-parse", "HEAD~1"]), head);
    fs::remove_file(loose(&r.sandbox, &blob)).unwrap();
    fs::copy(loose(&r.sandbox, &commit), loose(&r.sandbox, &blob)).unwrap();
    fs::write(r.sandbox.join(".git/refs/heads/main"), format!("{blob}\n")).unwrap();
    fs::create_dir_all(&r.upper).unwrap();
    let changes = stage(&r);
    let checked = check(&r, &changes);
    assert!(checked.moves.is_empty(), "{:?}", checked.moves);
    assert_eq!(checked.refused.len(), 1);
    let reason = &checked.refused[0].reason;
    assert!(reason.contains("forged or corrupt") || reason.contains("does not hash to its name"), "{reason}");
    assert_eq!(git(&r.host, &["rev-parse", "HEAD"]), head, "the host's branch is where it was");
}

/// A staged pack's index is the stage's word for what the pack holds; it
/// is never read: each staged pack is indexed afresh, so a garbage (or
/// lying) `.idx` changes nothing.
#[test]
fn a_staged_pack_index_is_never_trusted() {
    let r = repos();
    commit_b(&r);
    git(&r.sandbox, &["gc", "-q"]);
    let new = git(&r.sandbox, &["rev-parse", "HEAD"]);
    for entry in fs::read_dir(r.sandbox.join(".git/objects/pack")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "idx") {
            let mut perms = fs::metadata(&path).unwrap().permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o644);
            fs::set_permissions(&path, perms).unwrap();
            fs::write(&path, b"\xfftOc not an index").unwrap();
        }
    }
    fs::create_dir_all(&r.upper).unwrap();
    let changes = stage(&r);
    let checked = check(&r, &changes);
    assert!(checked.refused.is_empty(), "{:?}", checked.refused);
    checked.land(&Root::open(&r.host).unwrap(), "pvisor apply").unwrap();
    assert_eq!(git(&r.host, &["rev-parse", "refs/heads/main"]), new);
    git(&r.host, &["fsck", "--strict", "--no-dangling"]);
}

/// What a commit changes in the work tree is listed, for the caller to
/// judge: here it adds `.envrc` (which direnv runs) and deletes `a`.
#[test]
fn a_commit_lists_what_it_changes_in_the_work_tree() {
    let r = repos();
    fs::write(r.sandbox.join(".envrc"), "touch pwned\n").unwrap();
    git(&r.sandbox, &["add", ".envrc"]);
    git(&r.sandbox, &["rm", "-q", "a"]);
    git(&r.sandbox, &["commit", "-qm", "second"]);
    fs::create_dir_all(&r.upper).unwrap();
    let changes = stage(&r);
    let checked = check(&r, &changes);
    let listed: Vec<(String, ChangeKind)> =
        checked.tree_changes.iter().map(|c| (c.path.display_escaped(), c.kind)).collect();
    assert_eq!(listed, [(".envrc".to_owned(), ChangeKind::Added), ("a".to_owned(), ChangeKind::Deleted)]);
}

/// A new branch whose name differs from a host branch's only in case is
/// refused: on a case-insensitive filesystem its file would be the other's.
#[test]
fn a_branch_named_like_a_host_branch_but_for_case_is_refused() {
    let r = repos();
    commit_b(&r);
    git(&r.sandbox, &["branch", "MAIN"]);
    fs::create_dir_all(&r.upper).unwrap();
    let changes = stage(&r);
    let checked = check(&r, &changes);
    let refused: Vec<&str> = checked.refused.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(refused, ["refs/heads/MAIN"], "{:?}", checked.refused);
    assert!(checked.refused[0].reason.contains("only in case"));
}

#[test]
fn a_submodule_in_a_diff_is_special() {
    let z = "0".repeat(40);
    let a = "a".repeat(40);
    let raw = format!(
        ":160000 160000 {a} {a} M\0vendor/lib\0:000000 100755 {z} {a} A\0run.sh\0:100644 000000 {a} {z} D\0old\0"
    );
    let changes = super::land::parse_raw_diff(raw.as_bytes());
    let got: Vec<(String, ChangeKind, EntryType, u32)> =
        changes.iter().map(|c| (c.path.display_escaped(), c.kind, c.entry, c.mode)).collect();
    assert_eq!(
        got,
        [
            ("vendor/lib".to_owned(), ChangeKind::Modified, EntryType::Special, 0),
            ("run.sh".to_owned(), ChangeKind::Added, EntryType::File, 0o755),
            ("old".to_owned(), ChangeKind::Deleted, EntryType::None, 0),
        ]
    );
}
