//! The vm executor, measured against baselines in the same run.
//!
//! `cargo bench -p pvisor-cli --bench vm` (after `scripts/vm-image.sh`) prints
//! medians (p10/p90) of:
//! - `pvisor run -- true` on `ns`, on `vm` (a template restore: the normal
//!   start) and on `vm` with `PVISOR_VM_TEMPLATES=off` (a full boot), and
//!   the ratios;
//! - a vm start to the command's first output (`run -- echo`, until its
//!   line arrives), against the same on `ns` (the target is 300 ms under TCG);
//! - the same `vm` run over a workspace of 10,000 small files (the first
//!   sample builds its cached base image, the others start from it; the
//!   `vm_workspace` bench measures those cases apart), against `cp -a` of it;
//! - `pvisor suspend` (quiesce, stop, save, publish, QEMU exit, receipt) and
//!   `pvisor resume` until the command's next line, on a counter loop;
//! - `pvisor fork --state execution` of a running counter until the child's
//!   first line;
//! - the machine-state size, and the marginal memory (PSS of QEMU and its
//!   `pvisor run`) of idle sandboxes started from one template.
//!
//! Each figure names the accelerator (KVM or TCG). `PVISOR_BENCH_ITERS` sets
//! the sample count (default 10; 1 when run as a smoke test by `cargo test`).

// A test (or benchmark) program: it writes fixtures and says what it measured
// or skipped; clippy.toml's lints are for the libraries' own code.
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]
// A benchmark stops at the first failure; each one names what failed.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "support/table.rs"]
mod table;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn summary(samples: &mut [Duration]) -> (Duration, Duration, Duration) {
    samples.sort();
    let p = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (p(0.5), p(0.1), p(0.9))
}

fn report(name: &str, samples: &mut [Duration]) -> Duration {
    let (median, p10, p90) = summary(samples);
    println!(
        "{name:<44} median {:>8.1} ms  (p10 {:>8.1}, p90 {:>8.1}, n={})",
        ms(median),
        ms(p10),
        ms(p90),
        samples.len()
    );
    median
}

fn time(cmd: &mut Command) -> Duration {
    let start = Instant::now();
    let out = cmd.output().expect("spawn");
    let elapsed = start.elapsed();
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    elapsed
}

/// From spawning `cmd` to the first line on its stdout; then waits for its exit.
fn first_line(cmd: &mut Command) -> Duration {
    let start = Instant::now();
    let mut child = cmd.stdout(Stdio::piped()).spawn().expect("spawn");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let elapsed = start.elapsed();
    assert_eq!(line, "first\n", "{cmd:?} printed something else first");
    assert!(child.wait().unwrap().success(), "{cmd:?} failed");
    elapsed
}

fn pvisor(home: &Path, ws: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pvisor"));
    cmd.current_dir(ws).env("PVISOR_HOME", home).stdin(Stdio::null());
    cmd
}

fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    let iterations: usize = std::env::var("PVISOR_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if measuring { 10 } else { 1 });
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("state");
    let ws = dir.path().join("ws");
    let big = dir.path().join("big");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("file"), "content\n").unwrap();
    for i in 0..10_000 {
        let sub = big.join(format!("d{}", i / 100));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join(format!("f{i}")), format!("file {i}\n")).unwrap();
    }

    // Warm-up: installs the image and settles the accelerator choice.
    time(pvisor(&home, &ws).args(["run", "-q", "--executor", "vm", "--", "true"]));
    let accel = accelerator(&home, &ws);
    println!("vm executor benchmark (accelerator: {accel}, {iterations} samples each)");

    let (mut ns, mut vm, mut vm_big, mut cp) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut booted, mut ns_first, mut vm_first) = (Vec::new(), Vec::new(), Vec::new());
    let echo = ["run", "-q", "--", "echo", "first"];
    let vm_echo = ["run", "-q", "--executor", "vm", "--", "echo", "first"];
    for i in 0..iterations {
        ns.push(time(pvisor(&home, &ws).args(["run", "-q", "--", "true"])));
        vm.push(time(pvisor(&home, &ws).args(["run", "-q", "--executor", "vm", "--", "true"])));
        ns_first.push(first_line(pvisor(&home, &ws).args(echo)));
        vm_first.push(first_line(pvisor(&home, &ws).args(vm_echo)));
        booted.push(time(pvisor(&home, &ws).env("PVISOR_VM_TEMPLATES", "off").args([
            "run",
            "-q",
            "--executor",
            "vm",
            "--",
            "true",
        ])));
        vm_big.push(time(pvisor(&home, &big).args(["run", "-q", "--executor", "vm", "--", "true"])));
        let copy = dir.path().join(format!("copy{i}"));
        cp.push(time(Command::new("cp").arg("-a").arg(&big).arg(&copy)));
        let _ = std::fs::remove_dir_all(&copy);
    }
    let ns_median = report("pvisor run -- true (ns)", &mut ns);
    let vm_median = report(&format!("pvisor run --executor vm -- true ({accel})"), &mut vm);
    let boot_median = report(&format!("  same, forced full boot ({accel})"), &mut booted);
    println!("ratio template start / full boot: {:.2}x", ms(vm_median) / ms(boot_median));
    let big_median = report(&format!("  same, workspace of 10k files ({accel})"), &mut vm_big);
    let cp_median = report("cp -a of that workspace", &mut cp);
    println!("ratio vm/ns: {:.1}x", ms(vm_median) / ms(ns_median));
    let measure = format!("run --executor vm -- true ({accel})");
    table::row(&measure, "ms", ms(vm_median), None, "run -- true (ns)", ms(ns_median));
    let ns_first = report("run -- echo, to its first line (ns)", &mut ns_first);
    let (_, p10, p90) = summary(&mut vm_first);
    let vm_first = report(&format!("run --executor vm -- echo, to its first line ({accel})"), &mut vm_first);
    if accel == "tcg" {
        println!("  target: a vm start to the first output within 300 ms under TCG");
    }
    let measure = format!("vm start to first output ({accel})");
    table::row(&measure, "ms", ms(vm_first), Some((ms(p10), ms(p90))), "the same on ns", ms(ns_first));
    println!(
        "10k-file workspace adds {:.0} ms to a vm run; cp -a takes {:.0} ms ({:.2}x)",
        ms(big_median) - ms(vm_median),
        ms(cp_median),
        (ms(big_median) - ms(vm_median)) / ms(cp_median)
    );

    let (mut suspend, mut resume, mut state_bytes, mut rss) = (Vec::new(), Vec::new(), 0u64, 0u64);
    for _ in 0..iterations {
        let mut run = counter(&home, &ws);
        let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
        for _ in 0..5 {
            lines.next();
        }
        rss = rss.max(qemu_rss_kib(&home));
        let job = last_job(&home);
        let start = Instant::now();
        let out = pvisor(&home, &ws).args(["suspend", &job, "--json"]).output().unwrap();
        suspend.push(start.elapsed());
        assert!(out.status.success(), "suspend: {}", String::from_utf8_lossy(&out.stderr));
        // The manifest's line, then the `result` line.
        let first = out.stdout.split(|&b| b == b'\n').next().unwrap_or_default();
        let manifest: serde_json::Value = serde_json::from_slice(first).unwrap();
        state_bytes = manifest["data"]["files"].as_array().unwrap()[0]["size"].as_u64().unwrap();
        let _ = run.wait();

        let start = Instant::now();
        let mut resumed = pvisor(&home, &ws)
            .args(["resume", "-q", &job])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(resumed.stdout.take().unwrap()).lines();
        lines.next();
        resume.push(start.elapsed());
        let _ = pvisor(&home, &ws).args(["kill", &job]).output();
        let _ = resumed.wait();
    }
    let mut fork = Vec::new();
    for _ in 0..iterations {
        let mut run = counter(&home, &ws);
        let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
        for _ in 0..3 {
            lines.next();
        }
        let job = last_job(&home);
        let start = Instant::now();
        let mut child = pvisor(&home, &ws)
            .args(["fork", &job, "--state", "execution", "-q"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut child_lines = BufReader::new(child.stdout.take().unwrap()).lines();
        child_lines.next();
        fork.push(start.elapsed());
        let child_job = last_job(&home);
        for job in [&job, &child_job] {
            let _ = pvisor(&home, &ws).args(["kill", job]).output();
        }
        let _ = (run.wait(), child.wait());
    }
    report(&format!("pvisor suspend ({accel})"), &mut suspend);
    report(&format!("pvisor resume to the next output line ({accel})"), &mut resume);
    report(&format!("execution fork to the child's first line ({accel})"), &mut fork);
    println!("machine state per checkpoint: {:.1} MB (512 MiB guest)", state_bytes as f64 / 1e6);
    println!("QEMU resident memory of a running guest: {:.0} MiB", rss as f64 / 1024.0);
    idle_memory(&home, &ws, if measuring { 10 } else { 2 });
}

/// A `pvisor run` of a counter printing a line every 0.1 s.
fn counter(home: &Path, ws: &Path) -> std::process::Child {
    pvisor(home, ws)
        .args([
            "run",
            "-q",
            "--executor",
            "vm",
            "--",
            "sh",
            "-c",
            "i=0; while true; do i=$((i+1)); echo $i; sleep 0.1; done",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Starts `n` idle sandboxes from the template and prints the marginal
/// memory of one: the PSS of every QEMU and `pvisor run` they add, over `n`
/// (PSS splits shared pages, such as the template's RAM in the page cache,
/// between their users).
fn idle_memory(home: &Path, ws: &Path, n: usize) {
    let mut runs = Vec::new();
    for _ in 0..n {
        let mut run = pvisor(home, ws)
            .args(["run", "-q", "--executor", "vm", "--", "sh", "-c", "echo up; exec sleep 600"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
        lines.next();
        runs.push(run);
    }
    std::thread::sleep(Duration::from_secs(2));
    let supervisors: u64 = runs.iter().map(|r| pss_kib(r.id())).sum();
    let qemus: u64 = qemu_pids(home).into_iter().map(pss_kib).sum();
    println!(
        "idle sandboxes from one template: {n}; PSS QEMU {:.0} MiB + pvisor {:.0} MiB = {:.1} MiB per sandbox -> about {} in 24 GiB",
        qemus as f64 / 1024.0,
        supervisors as f64 / 1024.0,
        (qemus + supervisors) as f64 / 1024.0 / n as f64,
        (24u64 * 1024 * 1024 * n as u64).checked_div(qemus + supervisors).unwrap_or(0)
    );
    for mut run in runs {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(run.id() as i32).unwrap(),
            rustix::process::Signal::TERM,
        );
        let _ = run.wait();
    }
}

fn pss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("Pss:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// The QEMUs whose command line mentions `home`.
fn qemu_pids(home: &Path) -> Vec<u32> {
    let needle = home.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("qemu-system") && c.contains(&needle)
            })
        })
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .collect()
}

fn accelerator(home: &Path, ws: &Path) -> String {
    let out = pvisor(home, ws).args(["events", "--json"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|e| e["data"]["type"] == "attempt.vm")
        .and_then(|e| e["data"]["data"]["accelerator"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

fn last_job(home: &Path) -> String {
    let mut jobs: Vec<String> = std::fs::read_dir(home.join("jobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    jobs.sort();
    jobs.pop().unwrap()
}

/// The largest VmRSS of a QEMU whose command line mentions `home`.
fn qemu_rss_kib(home: &Path) -> u64 {
    qemu_pids(home)
        .into_iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .filter_map(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .max()
        .unwrap_or(0)
}
