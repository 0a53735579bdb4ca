//! Shared fixtures: a hermetic workspace + state directory, and ways to run
//! the binary as root or as an unprivileged user.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The uid/gid the rootless variants run as (no passwd entry needed).
pub const UNPRIVILEGED: u32 = 4242;

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The lines of `--json` output, each an envelope `{"type": KIND, "data":
/// RECORD}`, as (KIND, RECORD) pairs.
pub fn json_lines(stdout: &str) -> Vec<(String, serde_json::Value)> {
    stdout
        .lines()
        .map(|line| {
            let mut envelope: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
            let kind = envelope["type"].as_str().unwrap_or_else(|| panic!("no type: {line}")).to_owned();
            let data = envelope.get_mut("data").unwrap_or_else(|| panic!("no data: {line}")).take();
            (kind, data)
        })
        .collect()
}

/// The records of `--json` output, checking every line is a `kind` record.
pub fn records_of(stdout: &str, kind: &str) -> Vec<serde_json::Value> {
    json_lines(stdout)
        .into_iter()
        .map(|(k, data)| {
            assert_eq!(k, kind, "a {kind} record expected: {data}");
            data
        })
        .collect()
}

/// Sends `sig` to the process `pid` (a child this test started, or one of its own).
pub fn send_signal(pid: u32, sig: rustix::process::Signal) -> std::io::Result<()> {
    let pid = rustix::process::Pid::from_raw(pid as i32).ok_or(std::io::ErrorKind::InvalidInput)?;
    Ok(rustix::process::kill_process(pid, sig)?)
}

/// Who runs the binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum As {
    Root,
    Rootless,
}

impl As {
    /// Fails the test when this variant cannot run here: a root variant run
    /// by another user. Such tests are `#[ignore]`d ("needs root"), so only
    /// `--include-ignored` runs them, as scripts/test.sh does as root (and
    /// in CI); run by another user they fail, never pass unrun.
    pub fn require(self) {
        assert!(
            self != As::Root || is_root(),
            "the root variant needs to run as root (it is ignored unless included)"
        );
    }
}

/// The binary under test, at a path every test user can execute.
///
/// As root, the checkout may sit in a directory the unprivileged user cannot
/// enter (CI clones into a fresh 0700 temporary directory), so the binary is
/// copied once to a world-readable place keyed by its size and mtime.
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        // PVISOR_E2E_BIN runs the suite against another build (e.g. an older
        // release, to count how often its bugs reproduce).
        let built_here = env!("CARGO_BIN_EXE_pvisor").to_owned();
        let built = &*Box::leak(std::env::var("PVISOR_E2E_BIN").unwrap_or(built_here).into_boxed_str());
        if !is_root() {
            return built.to_owned();
        }
        let meta = fs::metadata(built).unwrap();
        let shelf = std::env::temp_dir().join("pvisor-e2e-bin");
        let version = format!("{}-{}", meta.len(), meta.mtime_nsec() + meta.mtime() * 1_000_000_000);
        let dir = shelf.join(&version);
        let copy = dir.join("pvisor");
        if !copy.exists() {
            fs::create_dir_all(&dir).unwrap();
            // Copies of other builds are removed once stale: a test run from
            // another checkout may be using a fresh one right now.
            let stale = std::time::Duration::from_secs(6 * 3600);
            for old in fs::read_dir(&shelf).unwrap().flatten() {
                let age = old.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
                if old.file_name() != version.as_str() && age.is_some_and(|a| a > stale) {
                    let _ = fs::remove_dir_all(old.path());
                }
            }
            let tmp = dir.join(format!("pvisor.{}", std::process::id()));
            fs::copy(built, &tmp).unwrap();
            fs::rename(&tmp, &copy).unwrap();
        }
        for path in [&shelf, &dir, &copy] {
            fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        }
        copy.to_string_lossy().into_owned()
    })
}

/// The guest image `scripts/vm-image.sh` built beside the binary, made
/// reachable for the unprivileged test user like [`bin`] (copied to a
/// world-readable place keyed by its manifest). `None` if it was not built.
pub fn vm_image() -> Option<&'static PathBuf> {
    static IMAGE: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    IMAGE
        .get_or_init(|| {
            let built = Path::new(env!("CARGO_BIN_EXE_pvisor")).parent()?.parent()?.join("vm-image");
            let manifest = fs::read(built.join("manifest.json")).ok()?;
            if !is_root() {
                return Some(built);
            }
            let key = format!(
                "{:x}",
                manifest
                    .iter()
                    .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
            );
            let shelf = std::env::temp_dir().join("pvisor-e2e-image");
            let dir = shelf.join(&key);
            if !dir.join("manifest.json").exists() {
                let tmp = shelf.join(format!("{key}.{}", std::process::id()));
                fs::create_dir_all(&tmp).unwrap();
                for name in ["vmlinux", "initramfs.cpio", "manifest.json"] {
                    fs::copy(built.join(name), tmp.join(name)).unwrap();
                }
                if fs::rename(&tmp, &dir).is_err() {
                    let _ = fs::remove_dir_all(&tmp);
                }
            }
            for path in [&shelf, &dir] {
                fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
            }
            Some(dir)
        })
        .as_ref()
}

/// A workspace and a state directory under one temporary directory.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub ws: PathBuf,
    pub home: PathBuf,
    pub who: As,
}

impl Env {
    pub fn new(who: As) -> Self {
        Self::new_in(who, &std::env::temp_dir())
    }

    /// [`Env::new`] under `base` (e.g. a tmpfs, for a test whose cost is
    /// the disk's metadata writes rather than what it tests).
    pub fn new_in(who: As, base: &Path) -> Self {
        let dir = tempfile::Builder::new().prefix("pvisor-e2e-").tempdir_in(base).unwrap();
        let ws = dir.path().join("ws");
        let home = dir.path().join("state");
        fs::create_dir(&ws).unwrap();
        let env = Self { dir, ws, home, who };
        env.give_away(env.dir.path());
        env
    }

    /// Hands `path` to the user the binary runs as.
    pub fn give_away(&self, path: &Path) {
        if self.who == As::Rootless && is_root() {
            chown_tree(path, UNPRIVILEGED);
        }
    }

    /// Writes a workspace file (owned by the test's user).
    pub fn write(&self, rel: &str, contents: &str) {
        let path = self.ws.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).unwrap();
        }
        fs::write(&path, contents).unwrap();
        self.give_away(&self.ws);
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = if self.who == As::Rootless && is_root() {
            let mut c = Command::new("setpriv");
            let id = UNPRIVILEGED.to_string();
            c.args(["--reuid", &id, "--regid", &id, "--clear-groups", bin()]);
            c
        } else {
            Command::new(bin())
        };
        cmd.args(args)
            .current_dir(&self.ws)
            .env("PVISOR_HOME", &self.home)
            .env("HOME", self.dir.path())
            .env_remove("XDG_STATE_HOME")
            .stdin(Stdio::null());
        if let Some(image) = vm_image() {
            cmd.env("PVISOR_VM_IMAGE", image);
        }
        cmd
    }

    pub fn pvisor(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// Runs `pvisor run -- sh -c SCRIPT` in the workspace.
    ///
    /// First waits out the filesystem timestamp tick, so files the test just
    /// wrote are older than the run's conflict baseline (a file stamped in the
    /// same tick as the start is, correctly, treated as changed during the run).
    pub fn run_sh(&self, script: &str) -> Output {
        std::thread::sleep(std::time::Duration::from_millis(25));
        self.pvisor(&["run", "--", "sh", "-c", script])
    }

    /// Runs pvisor and asserts it exited with `code`, returning stdout.
    pub fn expect(&self, args: &[&str], code: i32) -> String {
        let out = self.pvisor(args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "pvisor {args:?}\nstdout: {}\nstderr: {}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// `review --json`'s change records.
    pub fn review(&self) -> Vec<serde_json::Value> {
        records_of(&self.expect(&["review", "--json"], 0), "change")
    }

    /// `status --json`'s status record.
    pub fn status_json(&self, job: Option<&str>) -> serde_json::Value {
        let mut args = vec!["status", "--json"];
        args.extend(job);
        let out = self.pvisor(&args);
        assert!(out.status.success(), "status failed: {}", text(&out.stderr));
        let mut status = records_of(&text(&out.stdout), "status");
        assert_eq!(status.len(), 1, "one status record: {}", text(&out.stdout));
        status.remove(0)
    }

    /// `events --json`'s event records (each with its own `type` and `data`).
    pub fn events(&self, job: &str) -> Vec<serde_json::Value> {
        let out = self.pvisor(&["events", job, "--json"]);
        assert!(out.status.success(), "events failed: {}", text(&out.stderr));
        records_of(&text(&out.stdout), "event")
    }

    /// Runs the shell command `inner` under script(1), which gives it a real
    /// pseudo-terminal as an interactive user's shell has; returns its output.
    pub fn under_terminal(&self, inner: &str) -> Output {
        Command::new("script")
            .args(["-qec", inner, "/dev/null"])
            .current_dir(&self.ws)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// A shell line for [`Self::under_terminal`]: `command` as a background
    /// job of a job-control shell (its own process group, not the
    /// terminal's foreground one), awaited for at most 60 s. A fixed sleep
    /// instead cut off a slow run's output on a loaded host.
    pub fn in_background(&self, command: &str) -> String {
        let done = self.dir.path().join("background.done");
        let _ = fs::remove_file(&done);
        format!(
            "bash -c 'set -m; (({command}; touch {d}) &) ; for i in $(seq 600); do [ -e {d} ] && break; sleep 0.1; done'",
            d = done.display()
        )
    }

    pub fn attempt_dir(&self, status: &serde_json::Value) -> PathBuf {
        let run = status["run"].as_str().unwrap();
        self.home.join("runs").join(run).join("attempts/1")
    }
}

pub fn chown_tree(path: &Path, id: u32) {
    std::os::unix::fs::lchown(path, Some(id), Some(id)).unwrap();
    if path.is_dir() && !path.is_symlink() {
        for entry in fs::read_dir(path).unwrap() {
            chown_tree(&entry.unwrap().path(), id);
        }
    }
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A snapshot of a tree: path → (mode, size, mtime, content or link target).
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, (u32, u64, i64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let content = if meta.is_file() {
                fs::read(&path).unwrap()
            } else if meta.is_symlink() {
                fs::read_link(&path).unwrap().into_os_string().into_encoded_bytes()
            } else {
                stack.push(path.clone());
                Vec::new()
            };
            out.insert(
                path.strip_prefix(root).unwrap().to_owned(),
                (meta.mode(), meta.len(), meta.mtime(), content),
            );
        }
    }
    out
}

/// Processes running exactly `sleep SECONDS` (the markers tests use), as "pid: cmdline".
pub fn sleepers(seconds: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Ok(cmdline) = fs::read(entry.path().join("cmdline")) {
            let argv: Vec<&[u8]> = cmdline.split(|&b| b == 0).filter(|a| !a.is_empty()).collect();
            if argv.len() == 2 && argv[0].ends_with(b"sleep") && argv[1] == seconds.as_bytes() {
                found.push(format!("{name}: sleep {seconds}"));
            }
        }
    }
    found
}

/// Polls `check` until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The single job id in the state directory.
pub fn only_job(env: &Env) -> String {
    let jobs: Vec<_> = fs::read_dir(env.home.join("jobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    jobs[0].clone()
}

/// `unshare` run as the unprivileged test user (or as ourselves when not root),
/// for tests that build a namespace around pvisor itself.
pub fn unshare_as_test_user() -> Command {
    if is_root() {
        let id = UNPRIVILEGED.to_string();
        let mut c = Command::new("setpriv");
        c.args(["--reuid", &id, "--regid", &id, "--clear-groups", "unshare"]);
        c
    } else {
        Command::new("unshare")
    }
}
