//! The harness of the containerd tests: a private containerd
//! (scripts/containerd-env.sh) with the busybox test image imported, `ctr`
//! against it, and what the tests look for afterwards (VM processes, disks).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const IMAGE: &str = "docker.io/pvisor/busybox:latest";
pub const RUNTIME: &str = "io.containerd.pvisor.v1";
pub const NAMESPACE: &str = "pvisor-test";
/// The containerd namespace the CRI plugin keeps its images and pods in.
pub const CRI_NAMESPACE: &str = "k8s.io";
/// A process that counts in /tmp/count, once a second.
pub const COUNTER: &str =
    "i=0; while :; do i=$((i+1)); echo $i >/tmp/next; mv /tmp/next /tmp/count; sleep 1; done";

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A private containerd, stopped when dropped.
pub struct Containerd {
    pub dir: tempfile::TempDir,
    pub sock: String,
}

impl Drop for Containerd {
    /// A failed test must not leave VMs behind: shims outlive containerd
    /// by design, so every task is force-deleted before it stops.
    fn drop(&mut self) {
        for namespace in [NAMESPACE, CRI_NAMESPACE] {
            let tasks = self.ctr_in(namespace, &["task", "ls", "-q"]);
            for id in text(&tasks.stdout).lines().filter(|l| !l.is_empty()) {
                let _ = self.ctr_in(namespace, &["task", "delete", "-f", id]);
                let _ = self.ctr_in(namespace, &["container", "rm", id]);
            }
        }
        let _ =
            Command::new(repo().join("scripts/containerd-env.sh")).arg("stop").arg(self.dir.path()).status();
    }
}

impl Containerd {
    pub fn ctr(&self, args: &[&str]) -> Output {
        self.ctr_in(NAMESPACE, args)
    }

    pub fn ctr_in(&self, namespace: &str, args: &[&str]) -> Output {
        Command::new("ctr")
            .args(["-a", &self.sock, "-n", namespace])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("ctr runs")
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.ctr(args);
        assert!(out.status.success(), "ctr {args:?}: {}{}", text(&out.stdout), text(&out.stderr));
        text(&out.stdout)
    }

    /// Stops containerd and starts it again over the same directories.
    pub fn restart(&self) {
        let script = repo().join("scripts/containerd-env.sh");
        assert!(Command::new(&script).arg("stop").arg(self.dir.path()).status().is_ok_and(|s| s.success()));
        let shim = Path::new(env!("CARGO_BIN_EXE_containerd-shim-pvisor-v1"));
        let out = Command::new(&script)
            .arg("start")
            .arg(self.dir.path())
            .arg(shim.parent().expect("a directory"))
            .output();
        assert!(out.is_ok_and(|o| o.status.success()), "containerd restarts");
    }

    pub fn home(&self) -> PathBuf {
        self.dir.path().join("pvisor-home")
    }

    /// The task's status column in `ctr task ls`.
    pub fn task_status(&self, id: &str) -> Option<String> {
        let list = self.ok(&["task", "ls"]);
        list.lines()
            .find(|l| l.split_whitespace().next() == Some(id))
            .and_then(|l| l.split_whitespace().nth(2).map(str::to_owned))
    }
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Why this machine cannot run the test, if it cannot.
pub fn unable() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("containerd needs root to mount snapshots".into());
    }
    if !repo().join("target/vm-image/manifest.json").exists() {
        return Some("target/vm-image is not built (scripts/vm-image.sh)".into());
    }
    let installed = Command::new(repo().join("scripts/containerd-env.sh")).arg("install").status();
    if !installed.is_ok_and(|s| s.success()) {
        return Some("containerd cannot be installed (apt-get install containerd failed)".into());
    }
    None
}

/// Fails the test when this machine cannot run it. The containerd tests
/// are `#[ignore]`d, so only `--include-ignored` runs them, as
/// scripts/test.sh does as root (and in CI, which has root, the guest image
/// and the Debian mirror): included, they fail rather than pass unrun.
pub fn require() {
    if let Some(why) = unable() {
        panic!("this machine cannot run the containerd tests: {why}");
    }
}

/// A private containerd with the test image imported into `namespace`.
pub fn start(namespace: &str) -> Containerd {
    let shim = Path::new(env!("CARGO_BIN_EXE_containerd-shim-pvisor-v1"));
    start_with(namespace, shim.parent().expect("the shim's directory"), &[])
}

/// [`start`], with the shim found in `shim_dir` and `env` in containerd's
/// (so every shim's) environment.
pub fn start_with(namespace: &str, shim_dir: &Path, env: &[(&str, &str)]) -> Containerd {
    let dir = tempfile::Builder::new().prefix("pvisor-ctr-").tempdir_in("/tmp").expect("tempdir");
    let out = Command::new(repo().join("scripts/containerd-env.sh"))
        .arg("start")
        .arg(dir.path())
        .arg(shim_dir)
        .envs(env.iter().copied())
        .output()
        .expect("containerd-env.sh runs");
    assert!(out.status.success(), "containerd did not start: {}", text(&out.stderr));
    let sock = text(&out.stdout).trim().to_owned();
    let containerd = Containerd { dir, sock };
    let image = Command::new(repo().join("scripts/oci-image.sh")).output().expect("oci-image.sh runs");
    assert!(image.status.success(), "the image did not build: {}", text(&image.stderr));
    let imported = containerd.ctr_in(namespace, &["images", "import", text(&image.stdout).trim()]);
    assert!(imported.status.success(), "ctr images import: {}", text(&imported.stderr));
    containerd
}

/// Processes whose command line names `needle` (a VM of this test's Jobs).
pub fn processes_naming(needle: &Path) -> Vec<String> {
    let needle = needle.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmdline = text(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) && !cmdline.contains("containerd-shim-pvisor-v1") {
            found.push(cmdline);
        }
    }
    found
}

/// Every file under `dir`.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

pub fn eventually(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "{what} did not happen within {} s", timeout.as_secs());
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn pvisor(c: &Containerd, args: &[&str]) -> String {
    let out = Command::new(repo().join("target/debug/pvisor"))
        .args(args)
        .env("PVISOR_HOME", c.home())
        .output()
        .expect("target/debug/pvisor runs (cargo build -p pvisor-cli)");
    assert!(out.status.success(), "pvisor {args:?}: {}", text(&out.stderr));
    text(&out.stdout)
}
