//! How many idle `pvisor serve` sandboxes this host holds, measured by
//! filling it: `tests/sdk/density.py` creates sandboxes through the published
//! SDK, each until a command ran in it, and keeps them until memory or CPU
//! runs out (see that script for the stop conditions). Prints:
//! - how many the host held, and what stopped the fill;
//! - the host memory each idle sandbox takes (the drop in MemAvailable over
//!   the fill, divided by the count), and the count memory alone would allow;
//! - the host CPU each idle sandbox takes (the rise in busy CPU with the
//!   sandboxes idle), and the count CPU alone would allow;
//! - a create until its command ran, early and late in the fill;
//! - a command in each of them at the end, all alive at once.
//!
//! `cargo bench -p pvisor-cli --bench density` (after `scripts/test.sh`
//! built the guest image, the default sandbox image and the SDK venv); it
//! takes minutes and most of the host's memory. Under `cargo test` it is a
//! smoke test of two sandboxes. `PVISOR_DENSITY_MAX` caps the count.

// A test (or benchmark) program: it writes fixtures and says what it measured
// or skipped; clippy.toml's lints are for the libraries' own code.
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]
// A benchmark stops at the first failure; each one names what failed.
#![allow(clippy::unwrap_used)]

#[path = "support/serving.rs"]
mod serving;
#[path = "support/table.rs"]
mod table;

use std::path::Path;
use std::process::{Command, Stdio};

/// MemAvailable the fill leaves the host (MiB).
const RESERVE_MIB: u64 = 2048;
/// Busy CPU (percent, sandboxes idle) at which the fill stops.
const BUSY_LIMIT: f64 = 85.0;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    let (python, rootfs) = serving::sdk_and_image();
    let max =
        std::env::var("PVISOR_DENSITY_MAX").unwrap_or_else(|_| if measuring { "1000" } else { "2" }.into());
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("state");
    let key = "bench-key-0123456789abcdef";
    std::fs::write(dir.path().join("key"), key).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let daemon = serving::Daemon(
        Command::new(env!("CARGO_BIN_EXE_pvisor"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--api-key-file"])
            .arg(dir.path().join("key"))
            .current_dir(dir.path())
            .env("PVISOR_HOME", &home)
            .env("PVISOR_SANDBOX_IMAGE", &rootfs)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    serving::wait_listening(port);
    let out = Command::new(&python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/sdk/density.py"))
        .env("PVISOR_URL", format!("127.0.0.1:{port}"))
        .env("PVISOR_KEY", key)
        .env("MAX", &max)
        .env("RESERVE_MIB", RESERVE_MIB.to_string())
        .env("BUSY_LIMIT", BUSY_LIMIT.to_string())
        .env("STEP", if measuring { "10" } else { "1" })
        .env("SAMPLE_S", if measuring { "5" } else { "1" })
        .output()
        .unwrap();
    drop(daemon);
    let accel = accelerator(&home);
    serving::kill_left_running(&home);
    assert!(out.status.success(), "density.py failed: {}", String::from_utf8_lossy(&out.stderr));
    let fill: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    report(&fill, &accel, max.parse().unwrap_or(0));
}

/// The accelerator the last sandbox's Job recorded (KVM or TCG): the last
/// one its Trace names.
fn accelerator(home: &Path) -> String {
    let events = Command::new(env!("CARGO_BIN_EXE_pvisor"))
        .args(["events", "--json"])
        .env("PVISOR_HOME", home)
        .output();
    let events = events.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    let name = "\"accelerator\":\"";
    let last = events.rfind(name).map(|at| &events[at + name.len()..]);
    last.and_then(|s| s.split('"').next()).unwrap_or("?").to_uppercase()
}

fn report(fill: &serde_json::Value, accel: &str, max: u64) {
    let num = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
    let held = fill["held"].as_u64().unwrap();
    let (base, last) = (&fill["baseline"], &fill["final"]);
    // The CPUs /proc/stat counts, which the busy figures cover (not this
    // process's affinity or quota).
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let cpus = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count() as f64;
    println!("idle pvisor serve sandboxes on this host ({accel}; {cpus} CPUs; serve's default 2 GiB guests)");
    let stop = match fill["stop"].as_str().unwrap() {
        "memory" => format!("memory: MemAvailable below the {RESERVE_MIB} MiB kept for the host"),
        "cpu" => format!("CPU: the CPUs {BUSY_LIMIT}% busy with every sandbox idle"),
        "slow" => "a create until its command ran took over 30 s".into(),
        "failed" => format!("a create failed: {}", fill["error"].as_str().unwrap_or("?")),
        _ => format!("the cap of {max} (PVISOR_DENSITY_MAX)"),
    };
    println!("{:<46} {held} (stopped by {stop})", "sandboxes held, each idle and answering");
    let per_mib = (num(&base["mem_available_mib"]) - num(&last["mem_available_mib"])) / held.max(1) as f64;
    let by_memory = (num(&base["mem_available_mib"]) - RESERVE_MIB as f64) / per_mib.max(1.0);
    println!("{:<46} {per_mib:.1} MiB (MemAvailable's drop / {held})", "host memory per idle sandbox");
    println!(
        "{:<46} {by_memory:.0} (MemAvailable at the start less {RESERVE_MIB} MiB)",
        "— how many memory alone allows"
    );
    // A short fill can end less busy than it began: the host's own work comes in bursts.
    let per_cpu = ((num(&last["busy_pct"]) - num(&base["busy_pct"])) / held.max(1) as f64).max(0.0);
    let by_cpu = (BUSY_LIMIT - num(&base["busy_pct"])) / per_cpu.max(1e-3);
    println!(
        "{:<46} {:.2}% of one CPU (busy {:.1}% before the fill, {:.1}% at the end)",
        "host CPU per idle sandbox",
        per_cpu * cpus,
        num(&base["busy_pct"]),
        num(&last["busy_pct"])
    );
    println!(
        "{:<46} {by_cpu:.0} (to {BUSY_LIMIT}% busy, if each costs the same)",
        "— how many CPU alone allows"
    );
    let creates: Vec<f64> = fill["create_ms"].as_array().unwrap().iter().map(num).collect();
    let k = creates.len().min(10);
    println!(
        "{:<46} first {k}: median {:.0} ms; last {k}: median {:.0} ms",
        "create until commands.run(\"true\") returned",
        median(creates[..k].to_vec()),
        median(creates[creates.len() - k..].to_vec())
    );
    for row in fill["samples"].as_array().unwrap() {
        println!(
            "  at {:>4}: MemAvailable {:>6} MiB, CPUs {:>5.1}% busy, that create {:>6.0} ms",
            row["n"],
            row["mem_available_mib"],
            num(&row["busy_pct"]),
            num(&row["create_ms"])
        );
    }
    let pings = fill["ping_ms"].as_array().unwrap();
    let answered: Vec<f64> = pings.iter().filter_map(|v| v.as_f64()).collect();
    let slowest = answered.iter().copied().fold(0.0, f64::max);
    println!(
        "{:<46} {} of {} answered: median {:.0} ms, slowest {slowest:.0} ms",
        "then a command in each, all alive",
        answered.len(),
        pings.len(),
        median(answered.clone())
    );
    assert_eq!(answered.len(), pings.len(), "an idle sandbox did not answer: {}", fill["error"]);
    table::row(
        "idle serve sandboxes held",
        "sandboxes",
        held as f64,
        None,
        "what memory alone allows",
        by_memory,
    );
}
