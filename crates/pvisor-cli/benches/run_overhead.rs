//! Start-up overhead of `pvisor run`, measured against baselines in the same run.
//!
//! `cargo bench -p pvisor-cli --bench run_overhead` prints the median (and
//! p10/p90) wall time of:
//! - `true` (process spawn only),
//! - `unshare -Urmpn --fork true` (bare namespaces, no overlay, no records),
//! - `bwrap --ro-bind / / --dev /dev --proc /proc --unshare-all true`
//!   (bubblewrap's sandbox, where installed),
//! - `pvisor run -q -- true` (namespaces + overlay + durable records + receipt),
//!
//! and the ratios between them. They are interleaved, each round in the
//! other order, so drift in machine load hits each alike. Then what the
//! metadata a run makes costs on the filesystem the state directory is on
//! (`TMPDIR` chooses it): a `mkdir`, a file, a synced record and, as root,
//! the workspace overlay's mount and unmount with and without `volatile`.
//! Then pvisor and bwrap again while another process writes to that
//! filesystem (a build in another terminal): what a run's end would cost
//! if it flushed it. `PVISOR_BENCH_ITERS` sets the sample count (default
//! 60); the smoke run (`cargo test`) skips the writer.
//! `PVISOR_BENCH_BASELINE=/path/to/older/pvisor` times that build too, in the
//! same interleaving, with its own state directory, and prints new / baseline.

// A test (or benchmark) program: it writes fixtures and says what it measured
// or skipped; clippy.toml's lints are for the libraries' own code.
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

#[path = "support/table.rs"]
mod table;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn time(cmd: &mut Command) -> Duration {
    let start = Instant::now();
    let status = cmd.status().expect("spawn");
    let elapsed = start.elapsed();
    assert!(status.success(), "{cmd:?} failed: {status}");
    elapsed
}

/// The order of one round: forwards, then backwards, so no command always
/// runs just after the same one (a sandbox's network namespace is torn down
/// by the kernel after its process has exited, on the next one's time).
fn in_turn(count: usize, round: usize) -> Vec<usize> {
    let order = 0..count;
    if round.is_multiple_of(2) {
        order.collect()
    } else {
        order.rev().collect()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary
    // without it, and then a 2-sample smoke run checks only that it works.
    let measuring = std::env::args().any(|a| a == "--bench");
    let default_iterations = if measuring { 60 } else { 2 };
    let iterations: usize =
        std::env::var("PVISOR_BENCH_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(default_iterations);
    let dir = tempfile::tempdir().expect("tempdir");
    let workspace = dir.path().join("ws");
    let home = dir.path().join("state");
    std::fs::create_dir(&workspace).expect("workspace");
    std::fs::write(workspace.join("file"), "content\n").expect("file");

    let mut commands: Vec<(&str, Command)> = Vec::new();
    let mut plain = Command::new("true");
    plain.stdout(Stdio::null());
    commands.push(("true", plain));
    let mut unshare = Command::new("unshare");
    unshare.args(["-Urmpn", "--fork", "true"]);
    commands.push(("unshare -Urmpn --fork true", unshare));
    let bwrap_args = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all", "true"];
    let has_bwrap =
        Command::new("bwrap").args(bwrap_args).stdout(Stdio::null()).status().is_ok_and(|s| s.success());
    if has_bwrap {
        let mut bwrap = Command::new("bwrap");
        bwrap.args(bwrap_args);
        commands.push(("bwrap --unshare-all true", bwrap));
    } else {
        println!("bwrap is not installed (or cannot run here): not compared");
    }
    let mut pvisor = Command::new(env!("CARGO_BIN_EXE_pvisor"));
    pvisor.args(["run", "-q", "--", "true"]).current_dir(&workspace).env("PVISOR_HOME", &home);
    let pvisor_at = commands.len();
    commands.push(("pvisor run -- true", pvisor));
    let baseline = std::env::var_os("PVISOR_BENCH_BASELINE");
    if let Some(older) = &baseline {
        let mut cmd = Command::new(older);
        cmd.args(["run", "-q", "--", "true"])
            .current_dir(&workspace)
            .env("PVISOR_HOME", dir.path().join("state-baseline"));
        commands.push(("baseline pvisor run -- true", cmd));
    }

    for (_, cmd) in commands.iter_mut() {
        for _ in 0..3 {
            time(cmd);
        }
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(iterations); commands.len()];
    for round in 0..iterations {
        for i in in_turn(commands.len(), round) {
            samples[i].push(time(&mut commands[i].1));
        }
    }
    println!("run_overhead: {iterations} interleaved samples each");
    println!("{:<30} {:>10} {:>10} {:>10}", "command", "median ms", "p10 ms", "p90 ms");
    let mut medians = Vec::new();
    let mut spreads = Vec::new();
    for ((name, _), mut s) in commands.iter().zip(samples) {
        s.sort();
        let median = percentile(&s, 0.5);
        medians.push(median);
        spreads.push((ms(percentile(&s, 0.1)), ms(percentile(&s, 0.9))));
        println!(
            "{name:<30} {:>10.2} {:>10.2} {:>10.2}",
            ms(median),
            ms(percentile(&s, 0.1)),
            ms(percentile(&s, 0.9))
        );
    }
    let pvisor_ms = ms(medians[pvisor_at]);
    let who = if rustix::process::geteuid().is_root() { "root" } else { "unprivileged" };
    for (i, (name, _)) in commands.iter().enumerate().take(pvisor_at).skip(1) {
        let measure = format!("pvisor run -- true, {who}");
        table::row(&measure, "ms", pvisor_ms, Some(spreads[pvisor_at]), name, ms(medians[i]));
    }
    println!("ratio pvisor / unshare: {:.2}x", pvisor_ms / ms(medians[1]));
    if has_bwrap {
        println!("ratio pvisor / bwrap:   {:.2}x", pvisor_ms / ms(medians[2]));
    }
    println!("ratio pvisor / true:    {:.2}x", pvisor_ms / ms(medians[0]));
    if baseline.is_some() {
        let base = ms(medians[pvisor_at + 1]);
        println!("this build vs baseline:  {:+.2} ms ({:.2}x)", pvisor_ms - base, pvisor_ms / base);
    }
    filesystem_costs(dir.path(), if measuring { 200 } else { 5 });
    if rustix::process::geteuid().is_root() {
        overlay_costs(dir.path(), if measuring { 40 } else { 2 });
    }
    // The writer puts hundreds of MiB on the filesystem: measuring only.
    if has_bwrap && measuring {
        let others: Vec<_> =
            commands.iter_mut().filter(|(name, _)| *name != "true" && !name.starts_with("unshare")).collect();
        while_another_process_writes(dir.path(), others, iterations.min(20), who);
    }
    if measuring {
        let verdict = if pvisor_ms <= 25.0 { "met" } else { "MISSED" };
        println!("target: pvisor run -- true median <= 25 ms: {verdict}");
    } else {
        println!("smoke run only (debug build); `cargo bench -p pvisor-cli --bench run_overhead` measures");
    }
}

/// Times each of `commands` (bwrap first, then pvisor, then a baseline
/// pvisor) interleaved while a thread writes to the filesystem of `dir`
/// without syncing, as a build would: dirty data that a sync of the whole
/// filesystem would have to write out first.
fn while_another_process_writes(
    dir: &std::path::Path,
    mut commands: Vec<&mut (&str, Command)>,
    iterations: usize,
    who: &str,
) {
    use std::io::{Seek, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let writing = stop.clone();
    let path = dir.join("another-process-writes");
    let writer = std::thread::spawn(move || {
        let mut file = std::fs::File::create(&path).expect("writer's file");
        let chunk = vec![0x5au8; 4 << 20];
        while !writing.load(Ordering::Relaxed) {
            // A full filesystem ends the writing, not the bench.
            if file.write_all(&chunk).is_err() {
                break;
            }
            // 512 MiB at most on disk: start over.
            if file.stream_position().expect("position") >= 512 << 20 {
                file.set_len(0).expect("truncate");
                file.rewind().expect("rewind");
            }
        }
        let _ = std::fs::remove_file(&path);
    });
    std::thread::sleep(Duration::from_millis(500));
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(iterations); commands.len()];
    for round in 0..iterations {
        for i in in_turn(commands.len(), round) {
            samples[i].push(time(&mut commands[i].1));
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    println!("while another process writes: {iterations} interleaved samples each");
    let mut medians = Vec::new();
    for (entry, mut s) in commands.iter().zip(samples) {
        s.sort();
        let (median, p10, p90) = (ms(percentile(&s, 0.5)), ms(percentile(&s, 0.1)), ms(percentile(&s, 0.9)));
        println!("{:<30} {median:>10.2} {p10:>10.2} {p90:>10.2}", entry.0);
        medians.push((median, (p10, p90)));
    }
    let (bwrap, pvisor) = (medians[0].0, medians[1]);
    let measure = format!("pvisor run -- true, {who}, another process writing");
    table::row(&measure, "ms", pvisor.0, Some(pvisor.1), "bwrap --unshare-all true, the same", bwrap);
    if let Some((base, _)) = medians.get(2) {
        println!(
            "while writing, this build vs baseline: {:+.2} ms ({:.2}x)",
            pvisor.0 - base,
            pvisor.0 / base
        );
    }
}

/// What the metadata a run makes costs on the filesystem of `dir` (where the
/// state directory is): a `mkdir`, a file created, and one atomic record
/// write (temporary, `fsync`, rename, directory `fsync`). A run of `true`
/// makes about 10, 17 and 12 of them (docs/performance.md).
fn filesystem_costs(dir: &std::path::Path, count: usize) {
    use std::io::Write;
    let scratch = dir.join("filesystem-costs");
    std::fs::create_dir(&scratch).expect("scratch");
    let median = |mut samples: Vec<Duration>| {
        samples.sort();
        ms(percentile(&samples, 0.5)) * 1000.0
    };
    let timed = |op: &dyn Fn(usize)| {
        median(
            (0..count)
                .map(|i| {
                    let start = Instant::now();
                    op(i);
                    start.elapsed()
                })
                .collect(),
        )
    };
    let mkdir = timed(&|i| std::fs::create_dir(scratch.join(format!("d{i}"))).expect("mkdir"));
    let create = timed(&|i| drop(std::fs::File::create(scratch.join(format!("f{i}"))).expect("create")));
    let record = timed(&|i| {
        let (tmp, path) = (scratch.join(format!(".r{i}.tmp")), scratch.join("record.json"));
        let mut file = std::fs::File::create(&tmp).expect("temporary");
        file.write_all(&[b'x'; 1024]).expect("write");
        file.sync_all().expect("fsync");
        std::fs::rename(&tmp, &path).expect("rename");
        std::fs::File::open(&scratch).and_then(|d| d.sync_all()).expect("directory fsync");
    });
    println!("the state directory's filesystem, {count} of each: mkdir {mkdir:.0} us, create {create:.0} us, atomic record write {record:.0} us");
    let _ = std::fs::remove_dir_all(&scratch);
}

/// What the workspace overlay's mount and unmount cost on the filesystem of
/// `dir`, with `volatile` (as pvisor mounts it) and without (an unmount that
/// syncs the whole upper filesystem): a fresh upper and work directory each
/// time, as each run has. Needs root.
fn overlay_costs(dir: &std::path::Path, count: usize) {
    use rustix::mount::{mount, unmount, MountFlags, UnmountFlags};
    let base = dir.join("overlay-costs");
    let (lower, target) = (base.join("lower"), base.join("mounted"));
    for d in [&lower, &target] {
        std::fs::create_dir_all(d).expect("overlay scratch");
    }
    // Interleaved, so the filesystem's drift hits both alike.
    let mut times: [(Vec<Duration>, Vec<Duration>); 2] = Default::default();
    for i in 0..count {
        for (volatile, (mounts, unmounts)) in [false, true].into_iter().zip(times.iter_mut()) {
            let (upper, work) = (base.join(format!("u{volatile}{i}")), base.join(format!("w{volatile}{i}")));
            std::fs::create_dir(&upper).and_then(|()| std::fs::create_dir(&work)).expect("layers");
            let mut options = format!(
                "lowerdir={},upperdir={},workdir={}",
                lower.display(),
                upper.display(),
                work.display()
            );
            if volatile {
                options.push_str(",volatile");
            }
            let options = std::ffi::CString::new(options).expect("no NUL in the paths");
            let start = Instant::now();
            if let Err(e) = mount("overlay", &target, "overlay", MountFlags::empty(), options.as_c_str()) {
                println!("overlay on this filesystem: cannot mount ({e}); not measured");
                let _ = pvisor_core::tree::remove_tree(&base);
                return;
            }
            mounts.push(start.elapsed());
            let start = Instant::now();
            unmount(&target, UnmountFlags::empty()).expect("unmount");
            unmounts.push(start.elapsed());
        }
    }
    for (kind, (mut mounts, mut unmounts)) in ["not volatile", "volatile"].into_iter().zip(times) {
        mounts.sort();
        unmounts.sort();
        println!(
            "overlay, {kind}, {count} of each: mount {:.0} us, unmount {:.0} us",
            ms(percentile(&mounts, 0.5)) * 1000.0,
            ms(percentile(&unmounts, 0.5)) * 1000.0
        );
    }
    let _ = pvisor_core::tree::remove_tree(&base);
}
