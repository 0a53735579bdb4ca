//! A hostile guest, measured on the host: the command is root in its VM and
//! writes frames on the agent's own port (`pvisor-guest-probe`, built static
//! beside the agent by `scripts/vm-image.sh`, copied into the workspace).
//! One VM run per class: these are slow under TCG.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::support::*;

/// The static probe `scripts/vm-image.sh` builds with the agent.
fn probe() -> PathBuf {
    let target = std::path::Path::new(env!("CARGO_BIN_EXE_pvisor")).parent().unwrap().parent().unwrap();
    let probe = target.join("agent/x86_64-unknown-linux-gnu/release/pvisor-guest-probe");
    assert!(probe.is_file(), "no {}: run scripts/vm-image.sh first", probe.display());
    probe
}

/// `Threads` and `VmRSS` (KiB) of a live process.
fn threads_and_rss(pid: u32) -> Option<(u64, u64)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    };
    Some((field("Threads:")?, field("VmRSS:")?))
}

/// 16,000 refused proxy streams, 64 MiB of output for execs never started
/// and 60 unrequested replies: the supervisor's threads and memory stay
/// where they were, the run does not hang, and the command's real exit (7)
/// is recorded; `verify` then says the exit status is the guest's word.
#[test]
fn a_hostile_guest_cannot_grow_the_host_or_lose_the_commands_exit() {
    crate::vm::require_image();
    let env = Env::new(As::Root);
    fs::copy(probe(), env.ws.join("probe")).unwrap();
    let started = Instant::now();
    let mut child = env
        .command(&["run", "--executor", "vm", "--", "./probe", "flood"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (mut max_threads, mut first_rss, mut max_rss) = (0, None, 0);
    while child.try_wait().unwrap().is_none() {
        assert!(started.elapsed() < Duration::from_secs(300), "the run hangs");
        if let Some((threads, rss)) = threads_and_rss(pid) {
            max_threads = max_threads.max(threads);
            first_rss.get_or_insert(rss);
            max_rss = max_rss.max(rss);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("probe: sent 16000 NetOpen"),
        "the probe never ran: {stdout} {}",
        text(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    let status = env.status_json(None);
    assert_eq!(status["exit_code"], 7, "{status}");
    assert_eq!(status["receipt"], "valid", "{status}");
    assert!(max_threads < 64, "the supervisor reached {max_threads} threads");
    let grown = max_rss.saturating_sub(first_rss.unwrap_or(max_rss));
    assert!(grown < 48 << 10, "the supervisor's RSS grew {grown} KiB (from {first_rss:?})");
    let job = status["job"].as_str().unwrap().to_owned();
    let verified = env.expect(&["verify", &job], 0);
    assert!(verified.contains("what the guest reported"), "{verified}");
}

/// A 1 GiB sparse file with one written block comes out as that block and
/// holes: quickly, and applied with few blocks on the host.
#[test]
fn a_sparse_guest_file_is_exported_and_applied_with_its_holes() {
    crate::vm::require_image();
    let env = Env::new(As::Root);
    fs::copy(probe(), env.ws.join("probe")).unwrap();
    let started = Instant::now();
    let out = env.pvisor(&["run", "--executor", "vm", "--", "./probe", "sparse", "sparse"]);
    let took = started.elapsed();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("probe: wrote a 1 GiB sparse file"), "{}", text(&out.stdout));
    assert!(took < Duration::from_secs(120), "the run took {took:?}");
    env.expect(&["apply", "--all"], 0);
    let meta = fs::metadata(env.ws.join("sparse")).unwrap();
    assert_eq!(meta.len(), 1 << 30);
    assert!(meta.blocks() * 512 < 1 << 20, "{} blocks: the holes arrived as zeros", meta.blocks());
    let mut block = vec![0u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(
        &fs::File::open(env.ws.join("sparse")).unwrap(),
        &mut block,
        512 << 20,
    )
    .unwrap();
    assert_eq!(block, vec![0x5a; 4096]);
}
