//! `pvisor serve`, measured through the published OpenSandbox Python SDK
//! against baselines taken in the same run.
//!
//! `cargo bench -p pvisor-cli --bench serve` (after `scripts/test.sh` built
//! the guest image, the default sandbox image and the SDK venv) prints
//! medians (p10/p90) of:
//! - create to ready (`SandboxSync.create`: POST, endpoints, `/ping` until the
//!   VM answers), against `pvisor run --executor vm -- true` (a VM boot to a
//!   receipt) and E2B's published ~150 ms (KVM);
//! - `commands.run("true")` round trip, against an HTTP round trip to the
//!   same daemon's `/health` (the floor of any request);
//! - pause (POST until the state is Paused) and resume (until a command ran),
//!   against E2B's published ~1 s resume;
//! - the memory of an idle sandbox (PSS of its QEMU and supervisor), and how
//!   many fit in 24 GiB;
//! - egress through a `networkPolicy` (the agent's relay, then the Job's
//!   proxy): a 100 MB download (1 MiB as a smoke test) and the time of a
//!   small request from a `python` sandbox, against the same requests by a
//!   host process straight to the host server.
//!
//! Every figure names the accelerator. `PVISOR_BENCH_ITERS` sets the sample
//! count (default 5; 1 when `cargo test` runs this as a smoke test).

// A benchmark stops at the first failure; each one names what failed.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn summary(name: &str, samples: &mut [f64], unit_baseline: Option<(&str, f64)>) -> f64 {
    samples.sort_by(f64::total_cmp);
    let p = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    let median = p(0.5);
    let ratio =
        unit_baseline.map(|(what, base)| format!("  = {:.1}x {what}", median / base)).unwrap_or_default();
    println!(
        "{name:<46} median {median:>8.1} ms  (p10 {:>8.1}, p90 {:>8.1}, n={}){ratio}",
        p(0.1),
        p(0.9),
        samples.len()
    );
    median
}

fn target() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_pvisor")).parent().unwrap().parent().unwrap().to_path_buf()
}

/// Proportional set size (KiB) of the processes whose command line mentions `needle`.
fn pss_kib(needle: &str, what: &str) -> (u64, usize) {
    let mut total = (0, 0);
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline);
        if !(cmdline.contains(what) && cmdline.contains(needle)) {
            continue;
        }
        let pss = std::fs::read_to_string(entry.path().join("smaps_rollup"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("Pss:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            })
            .unwrap_or(0u64);
        total = (total.0 + pss, total.1 + 1);
    }
    total
}

fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    let iterations: usize = std::env::var("PVISOR_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if measuring { 5 } else { 1 });
    let python = target().join("sdk-venv/bin/python");
    let rootfs = target().join("sandbox-image/rootfs");
    if !python.exists() || !rootfs.join("bin/sh").exists() {
        panic!(
            "run scripts/sandbox-image.sh and scripts/sdk-env.sh first (looked for {} and {})",
            python.display(),
            rootfs.display()
        );
    }
    let python_image = target().join("sandbox-image-python/rootfs");
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("state");
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let key = "bench-key-0123456789abcdef";
    std::fs::write(dir.path().join("key"), key).unwrap();
    let pvisor = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pvisor"));
        cmd.args(args).current_dir(&ws).env("PVISOR_HOME", &home).stdin(Stdio::null());
        cmd
    };

    // Baseline: one VM boot to a receipt, with the same image and accelerator.
    let mut vm_run = Vec::new();
    for _ in 0..iterations {
        let start = Instant::now();
        let out = pvisor(&["run", "--executor", "vm", "--quiet", "--", "true"]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        vm_run.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    let events = pvisor(&["events", "--json"]).output().unwrap();
    let accel = String::from_utf8_lossy(&events.stdout)
        .split("\"accelerator\":\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap_or("?")
        .to_uppercase();

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut daemon: Child = pvisor(&["serve", "--listen", &format!("127.0.0.1:{port}"), "--api-key-file"])
        .arg(dir.path().join("key"))
        .env("PVISOR_SANDBOX_IMAGE", &rootfs)
        .env("PVISOR_SANDBOX_IMAGE_PYTHON", &python_image)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let up = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(up.elapsed() < Duration::from_secs(60), "the daemon did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The host server the egress figures download from.
    let served = dir.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    let big_bytes: usize = if measuring { 100_000_000 } else { 1 << 20 };
    let mut big = vec![0u8; big_bytes];
    pvisor_core::random::fill(&mut big).unwrap();
    std::fs::write(served.join("big"), &big).unwrap();
    std::fs::write(served.join("small"), vec![b'x'; 1024]).unwrap();
    let web_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut web = Command::new("python3")
        .args(["-m", "http.server", &web_port.to_string(), "--bind", "127.0.0.1", "--directory"])
        .arg(&served)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    while std::net::TcpStream::connect(("127.0.0.1", web_port)).is_err() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let egress = python_image.join("bin/sh").exists();
    let mut bench = Command::new(&python);
    bench
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/sdk/bench.py"))
        .env("PVISOR_URL", format!("127.0.0.1:{port}"))
        .env("PVISOR_KEY", key)
        .env("ITERS", iterations.to_string())
        .env("IDLE", if measuring { "3" } else { "1" });
    if egress {
        bench.env("EGRESS_PORT", web_port.to_string()).env("EGRESS_BYTES", big_bytes.to_string());
    }
    let out = bench.output().unwrap();
    assert!(out.status.success(), "bench.py failed: {}", String::from_utf8_lossy(&out.stderr));
    let figures: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let samples =
        |k: &str| -> Vec<f64> { figures[k].as_array().unwrap().iter().filter_map(|v| v.as_f64()).collect() };

    println!("pvisor serve through the OpenSandbox Python SDK 1.1.1 ({accel}; 2 vCPU host)");
    let vm = summary("baseline: pvisor run --executor vm -- true", &mut vm_run, None);
    summary("create to ready", &mut samples("create_ms"), Some(("the vm run", vm)));
    println!("{:<46} E2B publishes ~150 ms to start (KVM)", "");
    let health = summary("baseline: HTTP GET /health", &mut samples("health_ms"), None);
    summary(
        "commands.run(\"true\") round trip",
        &mut samples("run_true_ms"),
        Some(("a /health round trip", health)),
    );
    summary("pause (until Paused)", &mut samples("pause_ms"), None);
    summary("resume (until a command ran)", &mut samples("resume_ms"), Some(("E2B's ~1 s resume", 1000.0)));

    if egress {
        // The same requests by a host process, straight to the server.
        let host_curl = |path: &str| -> f64 {
            let out = Command::new("curl")
                .args(["-s", "-o", "/dev/null", "-w", "%{time_total}"])
                .arg(format!("http://127.0.0.1:{web_port}/{path}"))
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim().parse::<f64>().unwrap() * 1000.0
        };
        let mut host_big: Vec<f64> = (0..iterations).map(|_| host_curl("big")).collect();
        let mut host_small: Vec<f64> = (0..iterations * 4).map(|_| host_curl("small")).collect();
        let to_ms = |k: &str| -> Vec<f64> { samples(k).iter().map(|s| s * 1000.0).collect() };
        let mb = big_bytes as f64 / 1e6;
        let base = summary(&format!("baseline: host curl of {mb:.0} MB, direct"), &mut host_big, None);
        let through = summary(
            &format!("sandbox curl of {mb:.0} MB via networkPolicy"),
            &mut to_ms("egress_big_s"),
            Some(("the host's direct download", base)),
        );
        println!(
            "{:<46} {:.0} MB/s through the policy path, {:.0} MB/s direct",
            "",
            mb / (through / 1000.0),
            mb / (base / 1000.0)
        );
        let base = summary("baseline: host curl of 1 KiB, direct", &mut host_small, None);
        let small = summary("sandbox curl of 1 KiB via networkPolicy", &mut to_ms("egress_small_s"), None);
        println!("{:<46} +{:.1} ms per request over the direct one", "", small - base);
    } else {
        println!("(no python image: run scripts/sandbox-image.sh for the egress figures)");
    }
    let _ = web.kill();
    let _ = web.wait();

    let home_s = home.to_string_lossy().into_owned();
    let idle = figures["idle"].as_array().unwrap().len().max(1);
    std::thread::sleep(Duration::from_secs(2));
    let (qemu, nq) = pss_kib(&home_s, "qemu-system");
    let (sup, ns) = pss_kib(&home_s, "sandbox-supervisor");
    let per = (qemu + sup) / idle as u64;
    println!(
        "idle sandbox memory (PSS)                      {:.1} MiB = QEMU {:.1} + supervisor {:.1} ({nq} VMs, {ns} supervisors; 512 MiB guests)",
        per as f64 / 1024.0,
        qemu as f64 / 1024.0 / idle as f64,
        sup as f64 / 1024.0 / idle as f64
    );
    println!(
        "idle sandboxes in 24 GiB by that figure        {}",
        (24u64 << 20).checked_div(per).unwrap_or(0)
    );

    let _ = daemon.kill();
    let _ = daemon.wait();
    let jobs = pvisor(&["jobs", "--json"]).output().unwrap();
    for line in String::from_utf8_lossy(&jobs.stdout).lines() {
        let job: serde_json::Value = serde_json::from_str(line).unwrap();
        if job["state"] == "running" || job["state"] == "suspended" {
            let _ = pvisor(&["kill", job["job"].as_str().unwrap(), "--grace", "2s"]).output();
        }
    }
}
