//! Checkpoint and fork cost, against `cp -a` of the same stage in the same run.
//!
//! `cargo bench -p pvisor-cli --bench checkpoint` stages 10,000 files of
//! 500 MiB in all, then times `pvisor checkpoint` and `pvisor fork CKPT --
//! true` against `cp -a` of the staged tree. As root, with `mkfs.xfs`
//! available, it repeats the checkpoint on a loop-mounted XFS image with
//! reflinks, against `cp -a --reflink=always`.
//!
//! Under `cargo test` (no `--bench`) it runs once with tiny sizes.

// A test (or benchmark) program: it writes fixtures and says what it measured
// or skipped; clippy.toml's lints are for the libraries' own code.
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

#[path = "support/table.rs"]
mod table;

#[path = "support/scratch.rs"]
mod scratch;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn pvisor(home: &Path, ws: &Path, args: &[&str]) -> (Duration, String) {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_pvisor"))
        .args(args)
        .current_dir(ws)
        .env("PVISOR_HOME", home)
        .stderr(Stdio::piped())
        .output()
        .expect("pvisor");
    let elapsed = start.elapsed();
    assert!(out.status.success(), "pvisor {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    (elapsed, String::from_utf8_lossy(&out.stdout).into_owned())
}

fn timed(cmd: &mut Command) -> Duration {
    let start = Instant::now();
    assert!(cmd.status().expect("spawn").success(), "{cmd:?}");
    start.elapsed()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Stages `files` files of `size` bytes under `base`; returns (ws, home, upper).
fn staged(base: &Path, files: usize, size: usize) -> (PathBuf, PathBuf, PathBuf) {
    let (ws, home) = (base.join("ws"), base.join("state"));
    std::fs::create_dir_all(&ws).expect("ws");
    let script = format!(
        "import os\nos.makedirs('t', exist_ok=True)\nblock = os.urandom({size})\nfor i in range({files}):\n    open(f't/f{{i}}', 'wb').write(block[:{size} - (i % 7)])\n"
    );
    pvisor(&home, &ws, &["run", "-q", "--", "python3", "-c", &script]);
    let run = std::fs::read_dir(home.join("runs")).expect("runs").next().expect("run").expect("entry").path();
    (ws, home, run.join("stage/upper"))
}

fn measure(label: &str, base: &Path, files: usize, size: usize, reflink: bool) {
    let (ws, home, upper) = staged(base, files, size);
    let _ = Command::new("sync").status();
    let mut cp = Command::new("cp");
    cp.arg("-a");
    if reflink {
        cp.arg("--reflink=always");
    }
    let cp_time = timed(cp.arg(&upper).arg(base.join("cp-copy")));
    let _ = Command::new("sync").status();
    let (ckpt_time, out) = pvisor(&home, &ws, &["checkpoint"]);
    let id = out.split(':').next().unwrap_or_default().to_owned();
    let method = out.split('(').nth(1).and_then(|s| s.split(')').next()).unwrap_or("?").to_owned();
    let _ = Command::new("sync").status();
    let (fork_time, _) = pvisor(&home, &ws, &["fork", &id, "-q", "--", "true"]);
    let cp_name = if reflink { "cp -a --reflink" } else { "cp -a" };
    table::row(
        &format!("checkpoint of {files} files ({label})"),
        "ms",
        ms(ckpt_time),
        None,
        cp_name,
        ms(cp_time),
    );
    println!(
        "{label}: {files} files / {} MiB: cp -a{} {:.0} ms; checkpoint {:.0} ms ({method}) = {:.2}x; fork (restore + run + seal) {:.0} ms = {:.2}x",
        (files * size) >> 20,
        if reflink { " --reflink" } else { "" },
        ms(cp_time),
        ms(ckpt_time),
        ms(ckpt_time) / ms(cp_time),
        ms(fork_time),
        ms(fork_time) / ms(cp_time),
    );
}

fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    let (files, size) = if measuring { (10_000, 52_428) } else { (50, 1024) };
    let dir = tempfile::tempdir().expect("tempdir");
    println!("checkpoint benchmark ({} mode)", if measuring { "measuring" } else { "smoke" });
    measure("ext4/tmp", &dir.path().join("plain"), files, size, false);

    if !measuring {
        println!("reflink figure skipped: needs --bench");
        return;
    }
    let xfs = match scratch::Scratch::xfs(dir.path(), "2G") {
        Ok(xfs) => xfs,
        Err(why) => {
            println!("reflink figure skipped: {why}");
            return;
        }
    };
    measure("xfs+reflink", &xfs.mount.join("b"), files, size, true);
}
