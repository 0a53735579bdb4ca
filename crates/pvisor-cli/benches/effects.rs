//! Cost of the effects workflow, against baselines measured in the same run.
//!
//! `cargo bench -p pvisor-cli --bench effects` prints medians and ratios for:
//! - `pvisor apply --all` of 10,000 small staged files vs `cp -a` of the same
//!   tree (hashing, conflict checks, ledger and syncfs included);
//! - `pvisor apply` of one 1 GiB file vs `cp`;
//! - `pvisor review --json` with 1,000 changes in workspaces of 10,000 and
//!   100,000 files, and with 100 changes in 100,000 files: review should cost
//!   O(changes), not O(workspace).
//!
//! Under `cargo test` (no `--bench`) it runs once with tiny sizes as a smoke test.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Bench {
    measuring: bool,
    dir: tempfile::TempDir,
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
        let base = self.dir.path().join(format!("{label}-{}", self.n));
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

fn drop_caches() {
    // Same starting point for both sides: flush dirty data first.
    let _ = Command::new("sync").status();
}

fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    // `cargo bench --bench effects -- small` runs one section (small, big, review).
    let sections: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let run = |name: &str| sections.is_empty() || sections.iter().any(|s| s == name);
    let mut b = Bench { measuring, dir: tempfile::tempdir().expect("tempdir"), n: 0 };
    let iters = if measuring { 5 } else { 1 };
    let small = if measuring { 10_000 } else { 200 };
    let big_mib = if measuring { 1024 } else { 8 };
    println!("effects benchmark ({} mode)", if b.measuring { "measuring" } else { "smoke" });

    // 1. Many small files.
    if run("small") {
        let gen =
            format!("mkdir t; i=0; while [ $i -lt {small} ]; do echo file-$i > t/f$i; i=$((i+1)); done");
        let (mut apply_t, mut cp_t) = (Vec::new(), Vec::new());
        for _ in 0..iters {
            let (ws, home, upper) = b.staged("small", |_| {}, &gen);
            let target = ws.with_file_name("cp-target");
            std::fs::create_dir(&target).expect("cp target");
            drop_caches();
            cp_t.push(time_cmd(Command::new("cp").arg("-a").arg(upper.join("t")).arg(&target)));
            drop_caches();
            apply_t.push(b.pvisor(&home, &ws, &["apply", "--all"]));
        }
        let (a, c) = (median(apply_t), median(cp_t));
        println!(
            "apply {small} small files: {:>9.1} ms   cp -a: {:>9.1} ms   ratio {:.2}x (target <= 1.5x)",
            ms(a),
            ms(c),
            ms(a) / ms(c)
        );
    }

    // 2. One big file.
    if run("big") {
        // Random bytes: zeros would be applied as holes (sparse), which is
        // not the copy this measures.
        let gen = format!("head -c {}M /dev/urandom > big", big_mib);
        let (mut apply_t, mut cp_t) = (Vec::new(), Vec::new());
        for _ in 0..iters.min(3) {
            let (ws, home, upper) = b.staged("big", |_| {}, &gen);
            let target = ws.with_file_name("cp-big");
            drop_caches();
            cp_t.push(time_cmd(Command::new("cp").arg(upper.join("big")).arg(&target)));
            drop_caches();
            apply_t.push(b.pvisor(&home, &ws, &["apply", "--all"]));
        }
        let (a, c) = (median(apply_t), median(cp_t));
        println!(
            "apply one {big_mib} MiB file:  {:>9.1} ms   cp:    {:>9.1} ms   ratio {:.2}x (target <= 1.3x)",
            ms(a),
            ms(c),
            ms(a) / ms(c)
        );
    }

    // 3. review --json: O(changes), not O(workspace).
    if !run("review") {
        return;
    }
    let scale = if measuring { 1 } else { 100 };
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
