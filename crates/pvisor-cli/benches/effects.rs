//! Cost of the effects workflow, against baselines measured in the same run.
//!
//! `cargo bench -p pvisor-cli --bench effects` prints medians and ratios for:
//! - `pvisor apply --all` of 10,000 small staged files vs `cp -a` of the same
//!   tree followed by `sync` (apply's conflict checks, ledger and syncfs
//!   included: both sides end durable);
//! - `pvisor apply` of one 1 GiB file vs `cp --reflink=never` (a copy) and vs
//!   plain `cp` (which reflinks where it can);
//!
//! both on the default layout (the stage and the workspace on this machine's
//! filesystem) and, as root with mkfs.xfs, on a loop-mounted XFS with
//! reflink, where apply reflinks sealed files instead of copying them; and
//! the small files again on a tmpfs (root), where no filesystem history
//! (ext4 without a journal scans recently deleted inodes on every create)
//! moves the figures, so they show apply's own cost;
//! - `pvisor review --json` with 1,000 changes in workspaces of 10,000 and
//!   100,000 files, and with 100 changes in 100,000 files: review should cost
//!   O(changes), not O(workspace).
//!
//! - selection globs: a 12-star pattern against 10,000 names, against a
//!   one-star pattern (the target is under 50 ms; an earlier backtracking
//!   matcher was exponential in the stars).
//!
//! Under `cargo test` (no `--bench`) it runs once with tiny sizes as a smoke test.

// A test (or benchmark) program: it writes fixtures and says what it measured
// or skipped; clippy.toml's lints are for the libraries' own code.
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "support/scratch.rs"]
mod scratch;
#[path = "support/table.rs"]
mod table;

struct Bench {
    measuring: bool,
    dir: PathBuf,
    n: u32,
}

impl Bench {
    fn pvisor(&self, home: &Path, ws: &Path, args: &[&str]) -> Duration {
        let start = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_pvisor"))
            .args(args)
            .current_dir(ws)
            .env("PVISOR_HOME", home)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .expect("spawn pvisor");
        let elapsed = start.elapsed();
        assert!(out.status.success(), "pvisor {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        elapsed
    }

    fn fresh(&mut self, label: &str) -> (PathBuf, PathBuf) {
        self.n += 1;
        let base = self.dir.join(format!("{label}-{}", self.n));
        let (ws, home) = (base.join("ws"), base.join("state"));
        std::fs::create_dir_all(&ws).expect("workspace");
        (ws, home)
    }

    /// Runs `script` in a sandbox over a fresh workspace; returns (ws, home, upper).
    fn staged(&mut self, label: &str, setup: impl Fn(&Path), script: &str) -> (PathBuf, PathBuf, PathBuf) {
        let (ws, home) = self.fresh(label);
        setup(&ws);
        std::thread::sleep(Duration::from_millis(30));
        self.pvisor(&home, &ws, &["run", "-q", "--", "sh", "-c", script]);
        let runs = home.join("runs");
        let run = std::fs::read_dir(&runs).expect("runs").next().expect("a run").expect("entry").path();
        (ws, home, run.join("stage/upper"))
    }
}

fn time_cmd(cmd: &mut Command) -> Duration {
    let start = Instant::now();
    let status = cmd.status().expect("spawn");
    let elapsed = start.elapsed();
    assert!(status.success(), "{cmd:?}");
    elapsed
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The same starting point for both sides: dirty data flushed, and with
/// `cold`, the page cache dropped too (root only; `None` says it could not).
fn settle(cold: bool) -> Option<()> {
    let _ = Command::new("sync").status();
    if cold {
        return std::fs::write("/proc/sys/vm/drop_caches", "3").ok();
    }
    Some(())
}

fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    // `cargo bench --bench effects -- small` runs one section (small, big, review).
    let sections: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let run = |name: &str| sections.is_empty() || sections.iter().any(|s| s == name);
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut b = Bench { measuring, dir: tmp.path().to_owned(), n: 0 };
    println!("effects benchmark ({} mode)", if b.measuring { "measuring" } else { "smoke" });
    if run("small") {
        small_files(&mut b, "default layout", 10_000, Cache::Warm);
        if measuring {
            small_files(&mut b, "default layout", 100_000, Cache::Warm);
            small_files(&mut b, "default layout", 100_000, Cache::Cold);
        }
    }
    if run("big") {
        big_file(&mut b, "default layout");
    }
    if measuring && (run("small") || run("big")) {
        match scratch::Scratch::xfs(tmp.path(), "8G") {
            Ok(xfs) => {
                let mut on_xfs = Bench { measuring, dir: xfs.mount.clone(), n: 0 };
                if run("small") {
                    small_files(&mut on_xfs, "xfs+reflink", 10_000, Cache::Warm);
                }
                if run("big") {
                    big_file(&mut on_xfs, "xfs+reflink");
                }
            }
            Err(why) => println!("xfs+reflink figures skipped: {why}"),
        }
    }
    if measuring && run("small") {
        match scratch::Scratch::tmpfs(tmp.path(), "4G") {
            Ok(tmpfs) => {
                let mut on_tmpfs = Bench { measuring, dir: tmpfs.mount.clone(), n: 0 };
                small_files(&mut on_tmpfs, "tmpfs", 10_000, Cache::Warm);
            }
            Err(why) => println!("tmpfs figures skipped: {why}"),
        }
    }
    if run("review") {
        review(&mut b);
    }
    if run("glob") {
        globs(measuring);
    }
}

/// 4. Globs: the cost of stars, in process.
fn globs(measuring: bool) {
    let names: Vec<String> =
        (0..if measuring { 10_000 } else { 100 }).map(|i| format!("{}{i}", "a".repeat(40))).collect();
    let time = |pattern: &str| {
        let glob = pvisor_stage::glob::Pattern::new(pattern).expect("pattern");
        let runs: Vec<Duration> = (0..5)
            .map(|_| {
                let start = Instant::now();
                let hits = names.iter().filter(|n| glob.matches(n.as_bytes())).count();
                std::hint::black_box(hits);
                start.elapsed()
            })
            .collect();
        median(runs)
    };
    let (many, one) = (time(&format!("{}b", "*a".repeat(12))), time("*b"));
    println!(
        "glob: 12 stars against {} names: {:>7.2} ms (target < 50 ms); one star: {:>7.2} ms; ratio {:.1}x",
        names.len(),
        ms(many),
        ms(one),
        ms(many) / ms(one).max(1e-6)
    );
}

/// Whether a figure starts with the stage in the page cache (as right
/// after its run) or read from disk (an apply days later).
#[derive(Clone, Copy, PartialEq)]
enum Cache {
    Warm,
    Cold,
}

/// 1. Many small files: apply vs `cp -a` + `sync`.
fn small_files(b: &mut Bench, layout: &str, count: usize, cache: Cache) {
    let iters = match (b.measuring, count) {
        (false, _) => 1,
        (true, 100_000) => 3,
        (true, _) => 5,
    };
    let small = if b.measuring { count } else { 200 };
    let cold = cache == Cache::Cold;
    let label = format!("{layout}{}", if cold { ", page cache dropped" } else { "" });
    if settle(cold).is_none() {
        println!("{label}: skipped (dropping the page cache needs root)");
        return;
    }
    let gen = format!("mkdir t; i=0; while [ $i -lt {small} ]; do echo file-$i > t/f$i; i=$((i+1)); done");
    let (mut apply_t, mut cp_t) = (Vec::new(), Vec::new());
    for _ in 0..iters {
        let (ws, home, upper) = b.staged("small", |_| {}, &gen);
        let target = ws.with_file_name("cp-target");
        std::fs::create_dir(&target).expect("cp target");
        settle(cold);
        cp_t.push(time_cmd(
            Command::new("sh")
                .arg("-c")
                .arg("cp -a \"$1\" \"$2\" && sync")
                .arg("sh")
                .arg(upper.join("t"))
                .arg(&target),
        ));
        settle(cold);
        apply_t.push(b.pvisor(&home, &ws, &["apply", "-q", "--all"]));
        // Each round's files are kept until the end: ext4 without a
        // journal scans recently deleted inodes when it allocates one, so
        // removing a round would slow the next round's creates.
    }
    let (a, c) = (median(apply_t), median(cp_t));
    table::row(&format!("apply {small} small files ({label})"), "ms", ms(a), None, "cp -a + sync", ms(c));
    println!(
        "{label}: apply {small} small files: {:>8.1} ms   cp -a + sync: {:>8.1} ms   ratio {:.2}x (target <= 1.0x)",
        ms(a),
        ms(c),
        ms(a) / ms(c)
    );
}

/// 2. One big file: apply vs a copy, and vs plain cp.
fn big_file(b: &mut Bench, layout: &str) {
    let iters = if b.measuring { 3 } else { 1 };
    let big_mib = if b.measuring { 1024 } else { 8 };
    // Random bytes: zeros would be applied as holes (sparse), which is
    // not the copy this measures.
    let gen = format!("head -c {}M /dev/urandom > big", big_mib);
    let (mut apply_t, mut copy_t, mut cp_t) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..iters {
        let (ws, home, upper) = b.staged("big", |_| {}, &gen);
        settle(false);
        copy_t.push(time_cmd(
            Command::new("cp")
                .arg("--reflink=never")
                .arg(upper.join("big"))
                .arg(ws.with_file_name("cp-copy")),
        ));
        settle(false);
        cp_t.push(time_cmd(Command::new("cp").arg(upper.join("big")).arg(ws.with_file_name("cp-plain"))));
        settle(false);
        apply_t.push(b.pvisor(&home, &ws, &["apply", "-q", "--all"]));
        // Four copies of a GiB per round: free them before the next.
        let _ = std::fs::remove_dir_all(ws.parent().expect("round directory"));
    }
    let (a, copy, cp) = (median(apply_t), median(copy_t), median(cp_t));
    println!(
        "{layout}: apply one {big_mib} MiB file: {:>8.1} ms   cp --reflink=never: {:>8.1} ms ({:.2}x; target <= 0.1x where reflinks work)   cp: {:>8.1} ms ({:.2}x)",
        ms(a),
        ms(copy),
        ms(a) / ms(copy),
        ms(cp),
        ms(a) / ms(cp)
    );
}

/// 3. review --json: O(changes), not O(workspace).
fn review(b: &mut Bench) {
    let iters = if b.measuring { 5 } else { 1 };
    let scale = if b.measuring { 1 } else { 100 };
    for (files, changes) in
        [(10_000 / scale, 1_000 / scale), (100_000 / scale, 1_000 / scale), (100_000 / scale, 100 / scale)]
    {
        let populate = move |ws: &Path| {
            for d in 0..(files / 1000).max(1) {
                let dir = ws.join(format!("d{d}"));
                std::fs::create_dir(&dir).expect("dir");
                for f in 0..1000.min(files) {
                    std::fs::write(dir.join(format!("f{f}")), format!("{d}/{f}\n")).expect("file");
                }
            }
        };
        let script = format!("i=0; while [ $i -lt {changes} ]; do echo changed >> d0/f$i; i=$((i+1)); done");
        let (ws, home, _) = b.staged("review", populate, &script);
        let t: Vec<Duration> = (0..iters).map(|_| b.pvisor(&home, &ws, &["review", "--json"])).collect();
        println!("review --json: {files:>6} files, {changes:>5} changes: {:>8.1} ms", ms(median(t)));
    }
}
