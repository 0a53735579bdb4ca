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
//! - 20 concurrent creates (2 as a smoke test), each until `commands.run("true")`
//!   returned: the wall time until the last one and each client's own time,
//!   against one create alone;
//! - the memory of an idle sandbox (PSS of its QEMU and supervisor), and how
//!   many fit in 24 GiB;
//! - egress through a `networkPolicy` (the agent's relay, then the Job's
//!   proxy): a 100 MB download (1 MiB as a smoke test) and the time of a
//!   small request from a `python` sandbox, against the same requests by a
//!   host process straight to the host server;
//! - one `POST /files/upload` of 1 GiB (16 MiB as a smoke test): its
//!   throughput, and how much the daemon's resident memory grew meanwhile
//!   (sampled VmRSS, and VmHWM, from /proc/PID/status), against the
//!   target of < 64 MiB (the upload is streamed to the guest page by page).
//!
//! - a read-write host volume (virtiofs) against the guest's own disk: a
//!   large write (`dd`, 1 GiB; 16 MiB as a smoke test) and a walk of a
//!   10,000-file tree (1,000 as a smoke test), each timed around the execd
//!   command that does it.
//!
//! - the credential vault (as root): small requests from a sandbox through
//!   a vault binding that injects a bearer token, against the same requests
//!   through the same proxy with a vault that binds nothing (the daemon gets
//!   a private `/etc/hosts` naming the host server, on port 80).
//!
//! - snapshots: `POST /sandboxes/{id}/snapshots` until `Ready`, and a
//!   create from `snapshotId` until a command ran, against a create from
//!   the image until a command ran.
//!
//! Every figure names the accelerator. `PVISOR_BENCH_ITERS` sets the sample
//! count (default 5; 1 when `cargo test` runs this as a smoke test).

// A test (or benchmark) program: it writes fixtures and says what it measured
// or skipped; clippy.toml's lints are for the libraries' own code.
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]
// A benchmark stops at the first failure; each one names what failed.
#![allow(clippy::unwrap_used)]

#[path = "support/hosts.rs"]
mod hosts;
#[path = "support/serving.rs"]
mod serving;
#[path = "support/table.rs"]
mod table;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn summary(name: &str, samples: &mut [f64], unit_baseline: Option<(&str, f64)>) -> f64 {
    samples.sort_by(f64::total_cmp);
    let p = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    let median = p(0.5);
    if let Some((what, base)) = unit_baseline {
        table::row(name, "ms", median, Some((p(0.1), p(0.9))), what, base);
    }
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

/// One HTTP/1.1 request (`Connection: close`) to the daemon: status and body.
/// `body` is sent as `length` bytes it writes itself.
fn request(
    port: u16,
    head: &str,
    length: u64,
    body: impl FnOnce(&mut std::net::TcpStream),
) -> (u16, Vec<u8>) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(stream, "{head}Host: 127.0.0.1:{port}\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n")
        .unwrap();
    body(&mut stream);
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let status = String::from_utf8_lossy(&answer[9..12]).parse().unwrap();
    let at = answer.windows(4).position(|w| w == b"\r\n\r\n").map_or(answer.len(), |p| p + 4);
    (status, answer[at..].to_vec())
}

/// A field of /proc/PID/status, in KiB (`VmRSS:`, `VmHWM:`).
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Uploads `bytes` to a new sandbox through `POST /files/upload` while
/// sampling the daemon's VmRSS; prints the throughput beside the growth.
fn upload_memory(port: u16, key: &str, daemon: u32, bytes: u64) {
    let auth = format!("OPEN-SANDBOX-API-KEY: {key}\r\n");
    let (id, execd, token) = ready_sandbox(port, &auth, serde_json::json!({}));

    let head = b"--B0undary\r\nContent-Disposition: form-data; name=\"metadata\"\r\nContent-Type: application/json\r\n\r\n{\"path\": \"/root/upload.bin\"}\r\n--B0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"upload.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n";
    let tail = b"\r\n--B0undary--\r\n";
    // The whole body within the daemon's 1 GiB upload limit.
    let bytes = bytes.min((1 << 30) - (head.len() + tail.len()) as u64);
    let mut page = vec![0u8; 1 << 20];
    pvisor_core::random::fill(&mut page).unwrap();
    let before = status_kib(daemon, "VmRSS:");
    let hwm_before = status_kib(daemon, "VmHWM:");
    let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(status_kib(daemon, "VmRSS:"));
                std::thread::sleep(Duration::from_millis(10));
            }
            peak
        })
    };
    let start = Instant::now();
    let (status, body) = request(
        port,
        &format!("POST {execd}/files/upload HTTP/1.1\r\n{token}Content-Type: multipart/form-data; boundary=B0undary\r\n"),
        head.len() as u64 + bytes + tail.len() as u64,
        |s| {
            use std::io::Write;
            s.write_all(head).unwrap();
            let mut left = bytes;
            while left > 0 {
                let n = left.min(page.len() as u64) as usize;
                s.write_all(&page[..n]).unwrap();
                left -= n as u64;
            }
            s.write_all(tail).unwrap();
        },
    );
    let elapsed = start.elapsed().as_secs_f64();
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.join().unwrap().max(status_kib(daemon, "VmRSS:"));
    assert_eq!(status, 200, "upload: {}", String::from_utf8_lossy(&body));
    let hwm = status_kib(daemon, "VmHWM:");
    println!(
        "{:<46} {:.0} MB/s ({:.0} MiB in {elapsed:.1} s); daemon RSS +{:.1} MiB (VmHWM +{:.1} MiB; target < 64 MiB)",
        "POST /files/upload, streamed",
        bytes as f64 / 1e6 / elapsed,
        bytes as f64 / f64::from(1 << 20),
        peak.saturating_sub(before) as f64 / 1024.0,
        hwm.saturating_sub(hwm_before) as f64 / 1024.0,
    );
    let _ = request(port, &format!("DELETE /v1/sandboxes/{id} HTTP/1.1\r\n{auth}"), 0, |_| {});
}

/// Creates a sandbox (the body's extra fields merged in) and waits until
/// its execd answers; returns its id and execd path and token header.
fn ready_sandbox(port: u16, auth: &str, extra: serde_json::Value) -> (String, String, String) {
    let mut create = serde_json::json!({ "image": { "uri": "default" }, "timeout": 600 });
    create.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    // A null in `extra` removes the default (`"image": null` for a snapshot).
    create.as_object_mut().unwrap().retain(|_, v| !v.is_null());
    let create = create.to_string();
    let (status, body) = request(
        port,
        &format!("POST /v1/sandboxes HTTP/1.1\r\n{auth}Content-Type: application/json\r\n"),
        create.len() as u64,
        |s| std::io::Write::write_all(s, create.as_bytes()).unwrap(),
    );
    assert!(status < 300, "create: {status} {}", String::from_utf8_lossy(&body));
    let sandbox: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let id = sandbox["id"].as_str().unwrap().to_owned();
    let (_, body) =
        request(port, &format!("GET /v1/sandboxes/{id}/endpoints/44772 HTTP/1.1\r\n{auth}"), 0, |_| {});
    let endpoint: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let token = format!(
        "X-EXECD-ACCESS-TOKEN: {}\r\n",
        endpoint["headers"]["X-EXECD-ACCESS-TOKEN"].as_str().unwrap()
    );
    let execd = format!("/sandboxes/{id}/port/44772");
    let up = Instant::now();
    while request(port, &format!("GET {execd}/ping HTTP/1.1\r\n{token}"), 0, |_| {}).0 != 200 {
        assert!(up.elapsed() < Duration::from_secs(300), "sandbox {id} did not become ready");
    }
    (id, execd, token)
}

/// Runs `command` to its end through execd; its elapsed milliseconds.
fn timed_command(port: u16, execd: &str, token: &str, command: &str) -> f64 {
    let body = serde_json::json!({ "command": command }).to_string();
    let start = Instant::now();
    let (status, answer) = request(
        port,
        &format!("POST {execd}/command HTTP/1.1\r\n{token}Content-Type: application/json\r\n"),
        body.len() as u64,
        |s| std::io::Write::write_all(s, body.as_bytes()).unwrap(),
    );
    let elapsed = start.elapsed().as_secs_f64() * 1000.0;
    let answer = String::from_utf8_lossy(&answer);
    assert!(status == 200 && answer.contains("execution_complete"), "{command}: {status} {answer}");
    elapsed
}

/// A read-write host volume against the guest's own disk: a write of
/// `mib` MiB and a walk of `files` files, each `iterations` times.
fn volume_figures(port: u16, key: &str, volumes: &Path, mib: u64, files: usize, iterations: usize) {
    let auth = format!("OPEN-SANDBOX-API-KEY: {key}\r\n");
    let host = volumes.join("bench");
    for i in 0..files {
        let dir = host.join(format!("tree/d{}", i / 100));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("f{i}")), b"x").unwrap();
    }
    let volume = serde_json::json!({ "volumes": [{ "name": "bench", "host": { "path": host }, "mountPath": "/mnt/vol" }] });
    let (id, execd, token) = ready_sandbox(port, &auth, volume);
    let run = |command: &str| timed_command(port, &execd, &token, command);
    run("cp -r /mnt/vol/tree /root/tree");
    let write =
        |to: &str| format!("dd if=/dev/zero of={to} bs=1M count={mib} conv=fsync 2>/dev/null; rm -f {to}");
    let (mut disk_w, mut vol_w, mut disk_t, mut vol_t) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..iterations {
        disk_w.push(run(&write("/root/big")));
        vol_w.push(run(&write("/mnt/vol/big")));
        disk_t.push(run("busybox find /root/tree | busybox wc -l"));
        vol_t.push(run("busybox find /mnt/vol/tree | busybox wc -l"));
    }
    let base = summary(&format!("baseline: write {mib} MiB to the guest's disk"), &mut disk_w, None);
    summary(
        &format!("write {mib} MiB to a host volume (virtiofs)"),
        &mut vol_w,
        Some(("the guest's disk", base)),
    );
    let base = summary(&format!("baseline: walk {files} files on the guest's disk"), &mut disk_t, None);
    summary(&format!("walk {files} files on a host volume"), &mut vol_t, Some(("the guest's disk", base)));
    let _ = request(port, &format!("DELETE /v1/sandboxes/{id} HTTP/1.1\r\n{auth}"), 0, |_| {});
}

/// Snapshot create (until `Ready`), and a create from it until a command
/// ran, against a create from the image until a command ran.
fn snapshot_figures(port: u16, key: &str, iterations: usize) {
    let auth = format!("OPEN-SANDBOX-API-KEY: {key}\r\n");
    let call = |head: String, body: &str| {
        let (status, answer) = request(port, &head, body.len() as u64, |s| {
            std::io::Write::write_all(s, body.as_bytes()).unwrap()
        });
        (status, serde_json::from_slice::<serde_json::Value>(&answer).unwrap_or_default())
    };
    let (source, execd, token) = ready_sandbox(port, &auth, serde_json::json!({}));
    timed_command(port, &execd, &token, "mkdir -p /srv/app && seq 100000 > /srv/app/data");
    let json = "Content-Type: application/json\r\n";
    let until_command = |extra: serde_json::Value| {
        let start = Instant::now();
        let (id, execd, token) = ready_sandbox(port, &auth, extra);
        timed_command(port, &execd, &token, "true");
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        let _ = request(port, &format!("DELETE /v1/sandboxes/{id} HTTP/1.1\r\n{auth}"), 0, |_| {});
        ms
    };
    let (mut create, mut restored, mut fresh) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..iterations {
        let start = Instant::now();
        let (status, snapshot) =
            call(format!("POST /v1/sandboxes/{source}/snapshots HTTP/1.1\r\n{auth}{json}"), "{}");
        assert_eq!(status, 202, "{snapshot}");
        let id = snapshot["id"].as_str().unwrap().to_owned();
        let state = loop {
            let (_, got) = call(format!("GET /v1/snapshots/{id} HTTP/1.1\r\n{auth}"), "");
            if got["status"]["state"] != "Creating" {
                break got["status"]["state"].clone();
            }
            assert!(start.elapsed() < Duration::from_secs(600), "snapshot {id} is still Creating");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(state, "Ready", "snapshot {id}");
        create.push(start.elapsed().as_secs_f64() * 1000.0);
        restored.push(until_command(serde_json::json!({ "image": null, "snapshotId": id })));
        fresh.push(until_command(serde_json::json!({})));
        let _ = call(format!("DELETE /v1/snapshots/{id} HTTP/1.1\r\n{auth}"), "");
    }
    summary("snapshot create (until Ready)", &mut create, None);
    let base = summary("baseline: create from the image until a command ran", &mut fresh, None);
    summary(
        "create from a snapshot until a command ran",
        &mut restored,
        Some(("a create from the image", base)),
    );
    let _ = request(port, &format!("DELETE /v1/sandboxes/{source} HTTP/1.1\r\n{auth}"), 0, |_| {});
}

fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    let iterations: usize = std::env::var("PVISOR_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if measuring { 5 } else { 1 });
    let (python, rootfs) = serving::sdk_and_image();
    let python_image = serving::target().join("sandbox-image-python/rootfs");
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
    let volumes = dir.path().join("volumes");
    std::fs::create_dir_all(&volumes).unwrap();
    // The vault's host server: port 80 (a binding names 80 or 443) on a
    // loopback address of its own, named in the daemon's own /etc/hosts.
    let vault = is_root().then(|| vault_server(dir.path()));
    let mut serve = pvisor(&["serve", "--listen", &format!("127.0.0.1:{port}"), "--api-key-file"]);
    if let Some((_, hosts)) = &vault {
        serve = hosts::in_own_hosts(serve, hosts);
    }
    let daemon = serving::Daemon(
        serve
            .arg(dir.path().join("key"))
            .arg("--volume-root")
            .arg(&volumes)
            .env("PVISOR_SANDBOX_IMAGE", &rootfs)
            .env("PVISOR_SANDBOX_IMAGE_PYTHON", &python_image)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    serving::wait_listening(port);
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
        .env("IDLE", if measuring { "20" } else { "1" })
        .env("CONCURRENT", if measuring { "20" } else { "2" });
    if egress {
        bench.env("EGRESS_PORT", web_port.to_string()).env("EGRESS_BYTES", big_bytes.to_string());
    }
    if egress && vault.is_some() {
        bench.env("VAULT_HOST", VAULT_HOST).env("VAULT_IP", VAULT_IP);
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
    let alone = summary(
        "create until commands.run(\"true\") returned",
        &mut samples("create_run_ms"),
        Some(("the vm run", vm)),
    );
    let mut pings = samples("idle_ping_ms");
    let slowest = pings.iter().copied().fold(0.0, f64::max);
    summary(&format!("a command in each of {} idle sandboxes", pings.len()), &mut pings, None);
    println!("{:<46} slowest {slowest:.0} ms (target: every one within 1000 ms)", "");
    let health = summary("baseline: HTTP GET /health", &mut samples("health_ms"), None);
    summary(
        "commands.run(\"true\") round trip",
        &mut samples("run_true_ms"),
        Some(("a /health round trip", health)),
    );
    let mut wall = samples("concurrent_wall_ms");
    let mut each = samples("concurrent_each_ms");
    let n = each.len();
    summary(
        &format!("{n} concurrent creates, until the last ran \"true\""),
        &mut wall,
        Some(("one create alone", alone)),
    );
    summary(&format!("— each of the {n}, create to \"true\""), &mut each, Some(("one create alone", alone)));
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
    if figures.get("vault_plain_s").is_some() {
        let to_ms = |k: &str| -> Vec<f64> { samples(k).iter().map(|s| s * 1000.0).collect() };
        let plain =
            summary("baseline: 1 KiB via networkPolicy, no binding", &mut to_ms("vault_plain_s"), None);
        let injected = summary(
            "1 KiB via a credential vault binding",
            &mut to_ms("vault_injected_s"),
            Some(("the same request unbound", plain)),
        );
        println!("{:<46} {:+.2} ms per request for the injection", "", injected - plain);
    } else {
        println!("(the credential vault figures need root and the python image)");
    }
    if let Some((mut server, _)) = vault {
        let _ = server.kill();
        let _ = server.wait();
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

    // After the idle figure: these sandboxes are not idle, and their stops are not waited for.
    snapshot_figures(port, key, iterations);
    upload_memory(port, key, daemon.0.id(), if measuring { 1 << 30 } else { 16 << 20 });
    if rustix::process::geteuid().is_root() {
        let (mib, files) = if measuring { (1024, 10_000) } else { (16, 1_000) };
        volume_figures(port, key, &volumes, mib, files, iterations);
    } else {
        println!("(not root: no volume figures; virtiofsd takes root)");
    }

    drop(daemon);
    serving::kill_left_running(&home);
}

const VAULT_HOST: &str = "vault-bench.pvisor.test";
const VAULT_IP: &str = "127.79.0.1";

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
}

/// A host server of 1 KiB at `VAULT_IP:80`, and an `/etc/hosts` naming it.
fn vault_server(dir: &Path) -> (Child, PathBuf) {
    let served = dir.join("vault-served");
    std::fs::create_dir_all(&served).unwrap();
    std::fs::write(served.join("small"), vec![b'x'; 1024]).unwrap();
    let server = Command::new("python3")
        .args(["-m", "http.server", "80", "--bind", VAULT_IP, "--directory"])
        .arg(&served)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    while std::net::TcpStream::connect((VAULT_IP, 80)).is_err() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, format!("127.0.0.1 localhost\n{VAULT_IP} {VAULT_HOST}\n")).unwrap();
    (server, hosts)
}
