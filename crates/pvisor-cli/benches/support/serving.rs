//! What a benchmark of `pvisor serve` needs around the daemon: the SDK's
//! venv and the default sandbox image that `scripts/test.sh` builds, and,
//! at the end, every Job of its state directory still running or suspended
//! killed as a user would (`pvisor kill`), so no sandbox outlives the
//! benchmark (a daemon killed mid-teardown leaves its sandboxes' supervisors
//! running, by design: a new daemon adopts them).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The daemon, killed and reaped when dropped: also when the benchmark
/// panics, so no daemon outlives it.
pub struct Daemon(pub Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The cargo target directory the benchmark was built in.
pub fn target() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_pvisor")).parent().unwrap().parent().unwrap().to_path_buf()
}

/// The SDK venv's python and the default sandbox image's rootfs; panics
/// with what to run when either is missing.
pub fn sdk_and_image() -> (PathBuf, PathBuf) {
    let python = target().join("sdk-venv/bin/python");
    let rootfs = target().join("sandbox-image/rootfs");
    if !python.exists() || !rootfs.join("bin/sh").exists() {
        panic!(
            "run scripts/sandbox-image.sh and scripts/sdk-env.sh first (looked for {} and {})",
            python.display(),
            rootfs.display()
        );
    }
    (python, rootfs)
}

/// Waits until the daemon accepts connections on `port` (60 s at most).
pub fn wait_listening(port: u16) {
    let up = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(up.elapsed() < std::time::Duration::from_secs(60), "the daemon did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Kills every Job under `home` that has not ended: running, suspended, or
/// still pending (its supervisor, which survives the daemon, would go on
/// to start it).
pub fn kill_left_running(home: &Path) {
    let pvisor = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pvisor"));
        cmd.args(args).env("PVISOR_HOME", home).stdin(Stdio::null());
        cmd.output().unwrap()
    };
    let jobs = pvisor(&["jobs", "--json"]);
    for line in String::from_utf8_lossy(&jobs.stdout).lines() {
        let line: serde_json::Value = serde_json::from_str(line).unwrap();
        let job = &line["data"];
        if ["pending", "running", "suspended"].iter().any(|s| job["state"] == *s) {
            pvisor(&["kill", job["job"].as_str().unwrap(), "--grace", "2s"]);
        }
    }
}
