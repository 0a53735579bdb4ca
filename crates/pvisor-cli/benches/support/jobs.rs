//! Ends what a benchmark's `pvisor serve` left behind: every Job of its
//! state directory still running or suspended is killed as a user would
//! (`pvisor kill`), so no sandbox outlives the benchmark (a daemon killed
//! mid-teardown leaves its sandboxes' supervisors running, by design: a new
//! daemon adopts them).

use std::path::Path;
use std::process::{Command, Stdio};

/// Kills every running or suspended Job under `home`.
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
        if job["state"] == "running" || job["state"] == "suspended" {
            pvisor(&["kill", job["job"].as_str().unwrap(), "--grace", "2s"]);
        }
    }
}
