//! A hostile command stages changes built to deceive review or to amplify
//! apply; each test asserts review showed what apply does, and apply wrote
//! no more than was staged. Each runs as root and rootless.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use super::change;
use crate::support::*;

/// Nine MiB of numbered lines: over the 8 MiB a side review reads whole.
fn big_log() -> String {
    (0..1_000_000).map(|i| format!("line {i:07}\n")).collect()
}

fn review_cannot_be_deceived(who: As) {
    who.require();
    let env = Env::new(who);
    env.write("src/guard.rs", "pub fn check() -> bool { verify() }\n");
    env.write("src/main.rs", "fn main() {}\n");
    env.write("src/sub/deep.rs", "deep\n");
    env.write("auth.py", "def check(token):\n    return verify(token)\n");
    env.write("setup.py", "setup()\n");
    env.write("big.log", &big_log());
    // rm -rf src && mkdir src, most files copied back; a backdoor behind 33
    // zero-width characters; a one-line change in a 9 MiB file; two names
    // that print like setup.py.
    let zw = "\u{200b}".repeat(33);
    let script = format!(
        "m=$(cat src/main.rs); rm -rf src && mkdir -p src/sub && printf '%s\\n' \"$m\" > src/main.rs
         printf 'def check(token):\\n    # {zw}\\n    return True  # backdoor\\n' > auth.py
         sed -i 's/^line 0500000$/return True  # backdoor/' big.log
         echo evil > 'setup.py ' && echo evil > \"$(printf 'setup\\302\\240py')\"
         echo probe-ran"
    );
    let out = env.run_sh(&script);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("probe-ran"));

    let review = env.review();
    for deleted in ["src/guard.rs", "src/sub/deep.rs"] {
        assert_eq!(change(&review, deleted)["kind"], "deleted", "{review:?}");
    }
    assert!(review.iter().all(|c| c["path"] != "src/main.rs"), "an unchanged copy is no change: {review:?}");
    for name in ["setup.py ", "setup\u{a0}py"] {
        let c = change(&review, name);
        assert_eq!(c["confusable"], true, "{c}");
    }
    assert_eq!(change(&review, "auth.py")["confusable"], false);

    let listed = env.expect(&["review"], 0);
    assert!(listed.contains("src/guard.rs") && listed.contains("src/sub/deep.rs"), "{listed}");
    assert_eq!(listed.matches("CONFUSABLE NAME").count(), 2, "{listed}");

    let start = Instant::now();
    let diff = env.expect(&["review", "--diff", "--color", "never"], 0);
    assert!(start.elapsed() < Duration::from_secs(20), "review --diff took {:?}", start.elapsed());
    assert!(!diff.contains('\u{200b}'), "a raw zero-width character reached the terminal");
    assert!(diff.contains(&format!("+    # {}", "\\u{200b}".repeat(33))), "{diff}");
    assert!(diff.contains("+    return True  # backdoor"), "the hidden line is shown: {diff}");
    assert!(diff.contains("-line 0500000\n+return True  # backdoor"), "the large file's change is shown");
    assert!(!diff.contains("not shown") && !diff.contains("not diffed"), "{}", &diff[..diff.len().min(4000)]);
    assert!(
        diff.contains("@@ -500001 +500001 @@") || diff.contains("@@ -499998,7 +499998,7 @@"),
        "line numbers"
    );
    assert!(diff.contains("diff src/guard.rs (deleted)\n--- a/src/guard.rs\n+++ /dev/null"), "{diff}");
    assert!(diff.contains("CONFUSABLE NAME"), "the diff header marks it");

    // apply removes exactly what review named beneath the opaque directory.
    env.expect(&["apply", "--all"], 0);
    assert!(!env.ws.join("src/guard.rs").exists() && !env.ws.join("src/sub/deep.rs").exists());
    assert_eq!(fs::read_to_string(env.ws.join("src/main.rs")).unwrap(), "fn main() {}\n");
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn review_names_every_deletion_and_shows_every_text_change_as_root() {
    review_cannot_be_deceived(As::Root);
}

#[test]
fn review_names_every_deletion_and_shows_every_text_change_rootless() {
    review_cannot_be_deceived(As::Rootless);
}

fn apply_writes_no_more_than_was_staged(who: As) {
    who.require();
    let env = Env::new(who);
    let lines: String = (0..150_000).map(|i| format!("old line {i}\n")).collect();
    env.write("rewritten.txt", &lines);
    // 200 hard links of one 16 MiB file; a 1 GiB file with three 4 KiB data
    // blocks; a 150,000-line file rewritten end to end.
    let start = Instant::now();
    let out = env.run_sh(
        "head -c 16777216 /dev/urandom > big && for i in $(seq 200); do ln big link$i; done
         truncate -s 1G sparse && for at in 0 1000 200000; do
           head -c 4096 /dev/urandom | dd of=sparse bs=4096 seek=$at conv=notrunc status=none; done
         sed -i 's/^old/new/' rewritten.txt && echo probe-ran",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("probe-ran"));
    // Hashing every name (3.2 GB) took tens of seconds; one inode is 16 MiB.
    assert!(start.elapsed() < Duration::from_secs(20), "run and seal took {:?}", start.elapsed());
    let review = env.review();
    let linked = review.iter().filter(|c| c["hardlink_of"] == "big").count();
    assert_eq!(linked, 200, "every later name records its first");

    let start = Instant::now();
    let diff = env.pvisor(&["review", "--diff", "rewritten.txt"]);
    assert!(diff.status.success());
    assert!(start.elapsed() < Duration::from_secs(10), "150,000-line diff took {:?}", start.elapsed());
    assert_eq!(text(&diff.stdout).lines().filter(|l| l.starts_with("+new line ")).count(), 150_000);

    env.expect(&["apply", "--all"], 0);
    let inodes: BTreeSet<u64> = std::iter::once("big".to_owned())
        .chain((1..=200).map(|i| format!("link{i}")))
        .map(|name| fs::symlink_metadata(env.ws.join(name)).unwrap().ino())
        .collect();
    assert_eq!(inodes.len(), 1, "the links were applied as separate files");
    let sparse = fs::metadata(env.ws.join("sparse")).unwrap();
    assert_eq!(sparse.len(), 1 << 30);
    assert!(sparse.blocks() * 512 <= 1 << 20, "1 GiB sparse file took {} bytes", sparse.blocks() * 512);
}

#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn hard_links_and_holes_apply_as_staged_and_a_rewrite_diffs_fast_as_root() {
    apply_writes_no_more_than_was_staged(As::Root);
}

#[test]
fn hard_links_and_holes_apply_as_staged_and_a_rewrite_diffs_fast_rootless() {
    apply_writes_no_more_than_was_staged(As::Rootless);
}
