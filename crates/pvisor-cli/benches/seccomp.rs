//! The seccomp filter's cost on a syscall-heavy workload, measured against the
//! same sandbox without it (`--no-seccomp`) in the same run.
//!
//! `cargo bench -p pvisor-cli --bench seccomp` times `git status` over a
//! 10,000-file repository inside `pvisor run`, interleaving both variants.
//! Target: at most 10% overhead. Under `cargo test` it runs once, small.

// A test (or benchmark) program: it writes fixtures and says what it measured
// or skipped; clippy.toml's lints are for the libraries' own code.
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

#[path = "support/table.rs"]
mod table;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn git(repo: &std::path::Path, args: &[&str]) {
    let ok = Command::new("git")
        .args(["-c", "user.name=bench", "-c", "user.email=bench@example.invalid"])
        .args(args)
        .current_dir(repo)
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "git {args:?}");
}

fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    let (files, iterations) = if measuring { (10_000, 15) } else { (100, 1) };
    let dir = tempfile::tempdir().expect("tempdir");
    let (ws, home) = (dir.path().join("repo"), dir.path().join("state"));
    for i in 0..files {
        let sub = ws.join(format!("d{}", i / 500));
        std::fs::create_dir_all(&sub).expect("dir");
        std::fs::write(sub.join(format!("f{i}.txt")), format!("{i}\n")).expect("file");
    }
    git(&ws, &["init", "-q"]);
    git(&ws, &["add", "-A"]);
    git(&ws, &["commit", "-qm", "bench"]);
    let run = |extra: &[&str]| {
        let start = Instant::now();
        let status = Command::new(env!("CARGO_BIN_EXE_pvisor"))
            .arg("run")
            .arg("-q")
            .args(extra)
            .args(["--", "git", "status", "--porcelain"])
            .current_dir(&ws)
            .env("PVISOR_HOME", &home)
            .stdout(Stdio::null())
            .status()
            .expect("pvisor");
        assert!(status.success());
        start.elapsed()
    };
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..iterations {
        with.push(run(&[]));
        without.push(run(&["--no-seccomp"]));
    }
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e3
    };
    let (a, b) = (median(with), median(without));
    println!("seccomp benchmark ({} mode)", if measuring { "measuring" } else { "smoke" });
    table::row(&format!("git status of {files} files, seccomp on"), "ms", a, None, "--no-seccomp", b);
    println!(
        "git status, {files} files, inside pvisor run: {a:.1} ms with the filter, {b:.1} ms without: {:+.1}% (target <= +10%)",
        100.0 * (a - b) / b
    );
}
