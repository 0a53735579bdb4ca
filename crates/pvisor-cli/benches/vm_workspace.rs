//! The vm executor's workspace disks over a large workspace, against an
//! empty-workspace start measured in the same run.
//!
//! `cargo bench -p pvisor-cli --bench vm_workspace` (after
//! `scripts/vm-image.sh`) builds a deterministic workspace of 10,000 files,
//! about 230 MB, and prints medians (p10/p90) of `pvisor run --executor vm
//! -- true`:
//! - over an empty workspace (the baseline);
//! - over the big one with no cached base (the first start: the base image
//!   is built, as every start imaged the whole workspace before the cache);
//! - over it unchanged since the last vm Job (a walk and an empty delta);
//! - after editing 10 of its files (a delta of those 10);
//!
//! each with what it adds to the baseline, and the median time the
//! supervisor spent preparing the disks (`attempt.vm` →
//! `workspace_disks.prepare_ms`). Samples are interleaved, so drift on a
//! busy machine hits every series alike. `PVISOR_BENCH_ITERS` sets the
//! sample count (default 5; 1, over 1,000 files, when `cargo test` runs it
//! as a smoke test).

// A test (or benchmark) program: it writes fixtures and says what it measured
// or skipped; clippy.toml's lints are for the libraries' own code.
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]
// A benchmark stops at the first failure; each one names what failed.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn report(name: &str, samples: &mut [Duration]) -> Duration {
    samples.sort();
    let p = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    println!(
        "{name:<48} median {:>8.1} ms  (p10 {:>8.1}, p90 {:>8.1}, n={})",
        ms(p(0.5)),
        ms(p(0.1)),
        ms(p(0.9)),
        samples.len()
    );
    p(0.5)
}

fn median(values: &mut [u64]) -> u64 {
    values.sort_unstable();
    values[values.len() / 2]
}

fn pvisor(home: &Path, ws: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pvisor"));
    cmd.current_dir(ws).env("PVISOR_HOME", home).stdin(Stdio::null());
    cmd
}

/// Times `pvisor run --executor vm -- true` in `ws`; returns it and the
/// Job's workspace-disk facts.
fn vm_run(home: &Path, ws: &Path) -> (Duration, serde_json::Value) {
    let start = Instant::now();
    let out = pvisor(home, ws).args(["run", "-q", "--executor", "vm", "--", "true"]).output().unwrap();
    let elapsed = start.elapsed();
    assert!(
        out.status.success(),
        "vm run in {} failed: {}",
        ws.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let events = pvisor(home, ws).args(["events", "--json"]).output().unwrap();
    let facts = String::from_utf8_lossy(&events.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|e| e["data"]["type"] == "attempt.vm")
        .map(|e| e["data"]["data"].clone())
        .unwrap();
    (elapsed, facts)
}

/// Deterministic, incompressible-looking bytes for file `i` (xorshift64).
fn contents(i: u64, len: usize, round: u64) -> Vec<u8> {
    let mut state = (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ round;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    let iterations: usize = std::env::var("PVISOR_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if measuring { 5 } else { 1 });
    let files: u64 = if measuring { 10_000 } else { 1_000 };
    let dir = tempfile::tempdir().expect("tempdir");
    let (home, empty, big) = (dir.path().join("state"), dir.path().join("empty"), dir.path().join("big"));
    std::fs::create_dir_all(&empty).unwrap();
    let mut bytes = 0u64;
    for i in 0..files {
        let sub = big.join(format!("d{:03}", i / 100));
        std::fs::create_dir_all(&sub).unwrap();
        // 1 KiB to 45 KiB, about 23 KB on average.
        let len = 1024 + (i * 7919 % 45) as usize * 1024;
        std::fs::write(sub.join(format!("f{i:05}")), contents(i, len, 0)).unwrap();
        bytes += len as u64;
    }
    // Past the racy-clean margin: a base built now may trust these stamps.
    std::thread::sleep(Duration::from_millis(2_200));

    // Warm-up: installs the image and settles the accelerator choice.
    vm_run(&home, &empty);
    let (_, facts) = vm_run(&home, &empty);
    let accel = facts["accelerator"].as_str().unwrap_or("?").to_owned();
    println!(
        "vm workspace-disk benchmark (accelerator: {accel}; {files} files, {:.0} MB; {iterations} samples each)",
        bytes as f64 / 1e6
    );

    let lowers = home.join("vm-lowers");
    let (mut base, mut first, mut unchanged, mut edited) = (vec![], vec![], vec![], vec![]);
    let (mut first_prep, mut unchanged_prep, mut edited_prep) = (vec![], vec![], vec![]);
    for round in 0..iterations {
        base.push(vm_run(&home, &empty).0);

        let _ = std::fs::remove_dir_all(&lowers);
        let (t, facts) = vm_run(&home, &big);
        assert!(facts["workspace_disks"]["rebuilt"].is_string(), "the first start builds: {facts}");
        first.push(t);
        first_prep.push(facts["workspace_disks"]["prepare_ms"].as_u64().unwrap());

        let (t, facts) = vm_run(&home, &big);
        assert!(facts["workspace_disks"]["rebuilt"].is_null(), "an unchanged start reuses: {facts}");
        unchanged.push(t);
        unchanged_prep.push(facts["workspace_disks"]["prepare_ms"].as_u64().unwrap());

        for i in (0..files).step_by(files as usize / 10).take(10) {
            let path = big.join(format!("d{:03}/f{i:05}", i / 100));
            let len = std::fs::metadata(&path).unwrap().len() as usize;
            std::fs::write(&path, contents(i, len, round as u64 + 1)).unwrap();
        }
        let (t, facts) = vm_run(&home, &big);
        assert!(facts["workspace_disks"]["rebuilt"].is_null(), "10 edits ride the delta: {facts}");
        assert!(facts["workspace_disks"]["delta_entries"].as_u64().unwrap() >= 10, "{facts}");
        edited.push(t);
        edited_prep.push(facts["workspace_disks"]["prepare_ms"].as_u64().unwrap());
    }
    let base = report(&format!("empty workspace ({accel})"), &mut base);
    let first = report("big workspace, first start (base built)", &mut first);
    let unchanged = report("big workspace, unchanged since the last Job", &mut unchanged);
    let edited = report("big workspace, 10 files edited", &mut edited);
    let added = |d: Duration| ms(d) - ms(base);
    println!(
        "added to the empty-workspace start: first {:.0} ms, unchanged {:.0} ms, 10 edited {:.0} ms",
        added(first),
        added(unchanged),
        added(edited)
    );
    println!(
        "disk preparation (median prepare_ms): first {} ms, unchanged {} ms, 10 edited {} ms",
        median(&mut first_prep),
        median(&mut unchanged_prep),
        median(&mut edited_prep)
    );
}
