//! A commit made inside the sandbox lands on apply as a commit (objects,
//! ref, reflog; fast-forward only), while the staged git metadata the host's
//! git would execute (hooks, config, `info/attributes`) never does.
//!
//! Each test asserts on the host repository itself (`git log`, `git fsck
//! --strict`) and, for the hostile stage, that no marker file exists after
//! the host's git ran every command that would fire the planted programs,
//! having first shown in a control copy that those programs do fire.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;

/// Runs the host's git in `dir` (no user config, a fixed identity) and
/// hands the workspace back to the user pvisor runs as.
fn git(env: &Env, dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=host", "-c", "user.email=host@example.com", "-c", "safe.directory=*"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("GIT_DIR")
        .output()
        .unwrap();
    env.give_away(&env.ws);
    assert!(out.status.success(), "git {args:?}: {}", text(&out.stderr));
    text(&out.stdout).trim().to_owned()
}

/// A workspace that is a git repository with one commit.
fn repository(who: As) -> Env {
    let env = Env::new(who);
    git(&env, &env.ws, &["init", "-q", "-b", "main"]);
    env.write("a.txt", "a\n");
    git(&env, &env.ws, &["add", "a.txt"]);
    git(&env, &env.ws, &["commit", "-qm", "first"]);
    env
}

/// `git commit` as the sandboxed command runs it.
const COMMIT: &str =
    "git -c safe.directory='*' -c user.name=agent -c user.email=agent@example.com commit -qm";

/// The host repository is whole and its work tree matches HEAD.
fn assert_clean(env: &Env) {
    git(env, &env.ws, &["fsck", "--strict", "--no-dangling"]);
    assert_eq!(git(env, &env.ws, &["status", "--porcelain"]), "", "the work tree matches the commit");
}

fn a_commit_lands(who: As) {
    who.require();
    let env = repository(who);
    let before = git(&env, &env.ws, &["rev-parse", "HEAD"]);
    let out = env.run_sh(&format!("echo x > f && git add f && {COMMIT} 'agent commit'"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // The user looks at the repository before applying: git rewrites the index.
    git(&env, &env.ws, &["status"]);

    // Review shows one line per ref, not the objects.
    let review = env.expect(&["review"], 0);
    assert!(review.contains("commit") && review.contains("refs/heads/main"), "{review}");
    assert!(!review.contains(".git/objects/"), "objects are not listed one by one: {review}");

    let out = env.expect(&["apply", "--all", "--json"], 0);
    let moved =
        json_lines(&out).into_iter().filter(|(k, _)| k == "commit").map(|(_, d)| d).collect::<Vec<_>>();
    assert_eq!(moved.len(), 1, "{out}");
    assert_eq!(moved[0]["ref"], "refs/heads/main");
    assert_eq!(moved[0]["old"], before.as_str());
    let new = git(&env, &env.ws, &["rev-parse", "HEAD"]);
    assert_eq!(moved[0]["new"], new.as_str());
    assert_eq!(git(&env, &env.ws, &["log", "-1", "--format=%s"]), "agent commit");
    assert_eq!(git(&env, &env.ws, &["rev-parse", "HEAD~1"]), before);
    assert!(git(&env, &env.ws, &["reflog", "-1"]).contains("pvisor apply"), "the reflog says who moved it");
    assert_clean(&env);
    assert_eq!(env.status_json(None)["stage_state"], "applied");
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn a_commit_made_in_the_sandbox_lands_on_apply_as_root() {
    a_commit_lands(As::Root);
}

#[test]
fn a_commit_made_in_the_sandbox_lands_on_apply_rootless() {
    a_commit_lands(As::Rootless);
}

/// Where each planted program would leave its mark (outside the workspace).
struct Markers {
    dir: PathBuf,
}

impl Markers {
    fn new(env: &Env) -> Self {
        let dir = env.dir.path().join("markers");
        fs::create_dir(&dir).unwrap();
        // Whoever runs git (the test, or pvisor as the test user) may write here.
        fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        Self { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    fn found(&self) -> Vec<String> {
        fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// What the sandboxed command plants: hooks git runs on commit, checkout
    /// and ref updates; a config whose fsmonitor, pager, external diff and
    /// clean filter run programs; attributes that select that filter.
    fn plant(&self) -> String {
        let hook = |name: &str| {
            format!(
                "printf '#!/bin/sh\\ntouch {}\\n' > .git/hooks/{name} && chmod +x .git/hooks/{name}",
                self.path(name)
            )
        };
        let config = format!(
            "[core]\\n\\trepositoryformatversion = 0\\n\\tfilemode = true\\n\\tbare = false\\n\
             \\tfsmonitor = touch {fsmonitor}; false\\n\\tpager = touch {pager}; cat\\n\
             [diff]\\n\\texternal = touch {diff}; true\\n[filter \"evil\"]\\n\\tclean = touch {filter}; cat\\n",
            fsmonitor = self.path("fsmonitor"),
            pager = self.path("pager"),
            diff = self.path("diff"),
            filter = self.path("filter"),
        );
        [
            "mkdir -p .git/hooks .git/info".to_owned(),
            hook("post-checkout"),
            hook("reference-transaction"),
            hook("post-index-change"),
            format!("printf '{config}' > .git/config"),
            "echo '* filter=evil' > .git/info/attributes".to_owned(),
        ]
        .join(" && ")
    }

    /// Runs the commands that fire every planted program, in `dir`.
    fn fire(&self, env: &Env, dir: &Path) {
        fs::write(dir.join("a.txt"), "changed\n").unwrap();
        let _ = Command::new("git")
            .args(["-c", "safe.directory=*", "-c", "core.pager=", "status"])
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output();
        let _ = Command::new("git")
            .args(["-c", "safe.directory=*", "-p", "diff"])
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_PAGER_IN_USE", "")
            .output();
        git(env, dir, &["checkout", "-q", "--", "a.txt"]);
        git(env, dir, &["checkout", "-q", "-b", "probe"]);
        git(env, dir, &["checkout", "-q", "main"]);
        git(env, dir, &["branch", "-q", "-D", "probe"]);
    }
}

fn hostile_metadata_never_lands(who: As) {
    who.require();
    let env = repository(who);
    let markers = Markers::new(&env);
    let plant = markers.plant();

    // The control: the same planted files in a copy of the repository do
    // run their programs when git is used there.
    let control = env.dir.path().join("control");
    assert!(Command::new("cp").arg("-a").arg(&env.ws).arg(&control).status().unwrap().success());
    let planted = Command::new("sh").args(["-c", &plant]).current_dir(&control).output().unwrap();
    assert!(planted.status.success(), "{}", text(&planted.stderr));
    markers.fire(&env, &control);
    let fired = markers.found();
    for name in ["post-checkout", "reference-transaction", "fsmonitor", "filter"] {
        assert!(fired.contains(&name.to_owned()), "the control did not fire {name}: {fired:?}");
    }
    for name in fired {
        fs::remove_file(markers.dir.join(name)).unwrap();
    }

    let host_git = |rel: &str| fs::read(env.ws.join(".git").join(rel)).ok();
    let (config, attributes) = (host_git("config"), host_git("info/attributes"));
    let hooks = snapshot(&env.ws.join(".git/hooks"));
    // Planted after the commit: inside the sandbox the hooks cannot reach
    // the markers' directory, and a failing reference-transaction hook
    // would abort the commit.
    let out = env.run_sh(&format!("echo x > f && git add f && {COMMIT} 'agent commit' && {plant}"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    // --all lands the commit and skips the rest of .git as sensitive (exit 1).
    let out = env.pvisor(&["apply", "--all"]);
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}\n{}", text(&out.stderr));
    assert!(said.contains("moved") && said.contains("refs/heads/main"), "{said}");
    for path in [".git/config", ".git/hooks/post-checkout", ".git/info/attributes"] {
        assert!(said.contains(&format!("SENSITIVE {path}")), "{path} not skipped: {said}");
    }
    assert_eq!(git(&env, &env.ws, &["log", "-1", "--format=%s"]), "agent commit");
    assert_eq!(host_git("config"), config, "the staged config never lands");
    assert_eq!(host_git("info/attributes"), attributes, "the staged attributes never land");
    assert_eq!(snapshot(&env.ws.join(".git/hooks")), hooks, "no staged hook lands");
    // Naming .git takes the commit (already there) and still skips the rest.
    assert_eq!(env.pvisor(&["apply", ".git"]).status.code(), Some(1));
    assert_eq!(host_git("config"), config);

    // The host's git, used as the control used it, runs nothing planted.
    markers.fire(&env, &env.ws);
    assert_eq!(markers.found(), Vec::<String>::new(), "a planted program ran on the host");
    assert_clean(&env);
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn hooks_config_and_attributes_staged_with_a_commit_never_land_as_root() {
    hostile_metadata_never_lands(As::Root);
}

#[test]
fn hooks_config_and_attributes_staged_with_a_commit_never_land_rootless() {
    hostile_metadata_never_lands(As::Rootless);
}

fn a_moved_branch_is_a_conflict(who: As) {
    who.require();
    let env = repository(who);
    let out = env.run_sh(&format!("echo x > f && git add f && {COMMIT} 'agent commit'"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    env.write("b.txt", "b\n");
    git(&env, &env.ws, &["add", "b.txt"]);
    git(&env, &env.ws, &["commit", "-qm", "host commit"]);
    let host_head = git(&env, &env.ws, &["rev-parse", "HEAD"]);
    let packs = fs::read_dir(env.ws.join(".git/objects/pack")).unwrap().count();

    let out = env.pvisor(&["apply", "--all"]);
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("CONFLICT") && said.contains("not a fast-forward"), "{said}");
    assert!(said.contains(&host_head[..7]), "the conflict names the host's commit: {said}");
    // Nothing half-applied: no file, no object, the branch where it was.
    assert!(!env.ws.join("f").exists(), "a file was applied despite the conflict");
    assert_eq!(git(&env, &env.ws, &["rev-parse", "HEAD"]), host_head);
    assert_eq!(fs::read_dir(env.ws.join(".git/objects/pack")).unwrap().count(), packs);
    assert_clean(&env);
    // --force never forces a commit.
    assert_eq!(env.pvisor(&["apply", "--all", "--force"]).status.code(), Some(1));
    assert_eq!(git(&env, &env.ws, &["rev-parse", "HEAD"]), host_head);
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn a_branch_moved_on_the_host_is_a_conflict_and_nothing_lands_as_root() {
    a_moved_branch_is_a_conflict(As::Root);
}

#[test]
fn a_branch_moved_on_the_host_is_a_conflict_and_nothing_lands_rootless() {
    a_moved_branch_is_a_conflict(As::Rootless);
}

fn a_repacked_commit_lands(who: As) {
    who.require();
    let env = repository(who);
    let script = format!(
        "echo x > f && git add f && {COMMIT} one && echo y > g && git add g && {COMMIT} two && \
         git -c safe.directory='*' gc -q && test -n \"$(ls .git/objects/pack/*.pack)\""
    );
    let out = env.run_sh(&script);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let review = records_of_kind(&env.expect(&["review", "--json"], 0), "change");
    assert!(
        review.iter().any(|c| c["path"].as_str().unwrap().ends_with(".pack")),
        "the stage holds a pack: {review:?}"
    );
    let out = env.pvisor(&["apply", "--all"]);
    let said = text(&out.stdout);
    assert!(said.contains("moved") && said.contains("refs/heads/main"), "{said}\n{}", text(&out.stderr));
    // Whatever else gc left under .git (server info) is skipped as sensitive.
    assert!(out.status.code() == Some(0) || said.contains("SENSITIVE .git/info/"), "{said}");
    assert_eq!(git(&env, &env.ws, &["log", "--format=%s", "-3"]), "two\none\nfirst");
    assert_clean(&env);
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn a_commit_packed_by_gc_in_the_sandbox_lands_as_root() {
    a_repacked_commit_lands(As::Root);
}

#[test]
fn a_commit_packed_by_gc_in_the_sandbox_lands_rootless() {
    a_repacked_commit_lands(As::Rootless);
}

/// The `--json` records of type `kind` (other types skipped).
fn records_of_kind(stdout: &str, kind: &str) -> Vec<serde_json::Value> {
    json_lines(stdout).into_iter().filter(|(k, _)| k == kind).map(|(_, d)| d).collect()
}

fn a_sessions_commits_land(who: As) {
    who.require();
    let env = repository(who);
    for (file, message) in [("f", "one"), ("g", "two")] {
        let script = format!("echo x > {file} && git add {file} && {COMMIT} {message}");
        std::thread::sleep(std::time::Duration::from_millis(25));
        let out = env.pvisor(&["run", "-q", "--session", "s", "--", "sh", "-c", &script]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
    let before = git(&env, &env.ws, &["rev-parse", "HEAD"]);
    // A dry run says what would move and moves nothing.
    let dry = env.expect(&["apply", "--session", "s", "--all", "--dry-run"], 0);
    assert!(dry.contains("would move") && dry.contains("refs/heads/main"), "{dry}");
    assert_eq!(git(&env, &env.ws, &["rev-parse", "HEAD"]), before);

    let said = env.expect(&["apply", "--session", "s", "--all"], 0);
    assert!(said.contains("moved") && said.contains("refs/heads/main"), "{said}");
    assert_eq!(git(&env, &env.ws, &["log", "--format=%s", "-3"]), "two\none\nfirst");
    assert_clean(&env);
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn the_commits_of_a_session_land_on_its_apply_as_root() {
    a_sessions_commits_land(As::Root);
}

#[test]
fn the_commits_of_a_session_land_on_its_apply_rootless() {
    a_sessions_commits_land(As::Rootless);
}

/// A commit carrying a file the host would run (`.envrc`, which direnv
/// runs on entering the directory) needs the same consent as the file
/// itself: the sandbox committed it and removed it from the work tree, so
/// only the commit carries it (a later `git reset --hard` or `git stash`
/// would write it). `--all` leaves the commit; naming its ref lands it.
fn a_commit_carrying_a_sensitive_file(who: As) {
    who.require();
    let env = repository(who);
    let before = git(&env, &env.ws, &["rev-parse", "HEAD"]);
    let script = format!("echo 'touch pwned' > .envrc && git add .envrc && {COMMIT} env && rm .envrc");
    let out = env.run_sh(&script);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    git(&env, &env.ws, &["status"]);

    let review = env.expect(&["review"], 0);
    assert!(review.contains(".envrc") && review.contains("direnv"), "review says why: {review}");
    let out = env.pvisor(&["apply", "--all"]);
    let said = text(&out.stdout);
    assert!(said.contains("SENSITIVE") && said.contains(".envrc"), "{said}");
    assert_eq!(git(&env, &env.ws, &["rev-parse", "HEAD"]), before, "--all moved the branch: {said}");
    assert!(!env.ws.join(".envrc").exists());

    env.expect(&["apply", ".git/refs/heads/main"], 0);
    assert_eq!(git(&env, &env.ws, &["log", "-1", "--format=%s"]), "env");
    assert_eq!(git(&env, &env.ws, &["show", "HEAD:.envrc"]), "touch pwned");
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn a_commit_carrying_a_sensitive_file_needs_consent_as_root() {
    a_commit_carrying_a_sensitive_file(As::Root);
}

#[test]
fn a_commit_carrying_a_sensitive_file_needs_consent_rootless() {
    a_commit_carrying_a_sensitive_file(As::Rootless);
}

/// The same through git's plumbing, into a directory sensitive by its
/// structure: the host has an ignored virtualenv, and the sandbox commits
/// `.venv/bin/pytest` without touching its work tree, so only the commit
/// names the path. The rules are bound with the commit's own paths, so the
/// virtualenv is found, and `--all` leaves the commit.
fn a_plumbed_commit_into_a_virtualenv(who: As) {
    who.require();
    let env = repository(who);
    env.write(".venv/pyvenv.cfg", "home = /usr/bin\n");
    env.write(".venv/bin/python", "");
    env.write(".gitignore", ".venv/\n");
    git(&env, &env.ws, &["add", ".gitignore"]);
    git(&env, &env.ws, &["commit", "-qm", "ignore the venv"]);
    let before = git(&env, &env.ws, &["rev-parse", "HEAD"]);
    let script = "set -e; export GIT_CONFIG_PARAMETERS=\"'safe.directory=*' 'user.name=a' 'user.email=a@example.com'\"; \
        b=$(printf '#!/bin/sh\\necho PWNED\\n' | git hash-object -w --stdin); \
        export GIT_INDEX_FILE=/tmp/plumbed-index; git read-tree HEAD; \
        git update-index --add --cacheinfo 100755,$b,.venv/bin/pytest; \
        c=$(git commit-tree $(git write-tree) -p HEAD -m venv); git update-ref refs/heads/main $c";
    let out = env.run_sh(script);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let said = text(&env.pvisor(&["apply", "--all"]).stdout);
    assert!(said.contains("SENSITIVE") && said.contains(".venv/bin/pytest"), "{said}");
    assert_eq!(git(&env, &env.ws, &["rev-parse", "HEAD"]), before, "--all moved the branch: {said}");
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn a_plumbed_commit_into_a_virtualenv_needs_consent_as_root() {
    a_plumbed_commit_into_a_virtualenv(As::Root);
}

#[test]
fn a_plumbed_commit_into_a_virtualenv_needs_consent_rootless() {
    a_plumbed_commit_into_a_virtualenv(As::Rootless);
}
