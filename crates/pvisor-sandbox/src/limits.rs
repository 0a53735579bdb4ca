//! Resource limits: `--memory`, `--pids`, `--cpus` (and how `--disk` is
//! enforced, for the report).
//!
//! Each limit is enforced the strongest way this host allows, and the report
//! says which — or that it is not enforced, and why; nothing is pretended:
//! - a cgroup made for the run below pvisor's own cgroup: v2 (`memory.max`,
//!   `pids.max`, `cpu.max`) on a unified hierarchy, v1 (`memory.limit_in_bytes`,
//!   `pids.max`, `cpu.cfs_quota_us`) on a legacy or hybrid one — as root, or
//!   wherever the hierarchy is delegated to the user;
//! - otherwise rlimits as the floor, set by init *inside* the new user
//!   namespace: `RLIMIT_AS` for memory (address space, coarser than resident
//!   memory) and `RLIMIT_NPROC` for processes (counted per user namespace;
//!   real uid 0 is exempt, so root without a cgroup gets "not enforced");
//!   there is no rlimit for a CPU *rate*.
//!
//! The helper moves the sandbox's init into the cgroups while init builds the
//! filesystem, and init forks the command only once that is done, so every
//! sandboxed process is inside; the cgroups are removed after the run.

// Writes cgroup control files (the kernel's interface), never a record of
// the store's: the durable-write rule of clippy.toml does not apply here.
#![allow(clippy::disallowed_methods)]

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use pvisor_core::records::{LimitKind, ResourceLimits as Limits};

/// How one limit is enforced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enforcement {
    pub limit: LimitKind,
    pub value: String,
    pub by: Mechanism,
}

impl Enforcement {
    pub fn enforced(&self) -> bool {
        matches!(self.by, Mechanism::Enforced(_))
    }
}

/// What enforces a limit, or why nothing does. Recorded as one string
/// (`cgroup v1 memory.limit_in_bytes`, `not enforced: <why>`), the format
/// the Trace and Bundles have always had.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum Mechanism {
    /// e.g. `cgroup v2 memory.max`, `rlimit RLIMIT_AS (...)`.
    Enforced(String),
    /// Why the limit is not enforced.
    NotEnforced(String),
}

const NOT_ENFORCED: &str = "not enforced: ";

impl From<String> for Mechanism {
    fn from(s: String) -> Self {
        match s.strip_prefix(NOT_ENFORCED) {
            Some(why) => Self::NotEnforced(why.to_owned()),
            None => Self::Enforced(s),
        }
    }
}

impl From<Mechanism> for String {
    fn from(m: Mechanism) -> Self {
        m.to_string()
    }
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Enforced(by) => f.write_str(by),
            Self::NotEnforced(why) => write!(f, "{NOT_ENFORCED}{why}"),
        }
    }
}

/// The cgroups made for one run, and the rlimits for the helper to set.
#[derive(Debug, Default)]
pub struct Applied {
    pub report: Vec<Enforcement>,
    /// `cgroup.procs` files the helper writes its pid into.
    pub join: Vec<PathBuf>,
    /// `(resource, value)` pairs the helper sets with setrlimit.
    pub rlimits: Vec<(u32, u64)>,
    dirs: Vec<PathBuf>,
    /// Where to read the OOM-kill count afterwards, and in which format.
    oom_file: Option<PathBuf>,
}

const ROOT: &str = "/sys/fs/cgroup";

/// This process's cgroup path for `controller` (`""` = the v2 unified hierarchy).
fn own_cgroup(controller: &str) -> Option<String> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = if controller.is_empty() {
            controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == controller)
        };
        hit.then(|| path.to_owned())
    })
}

fn unified() -> bool {
    Path::new(ROOT).join("cgroup.controllers").exists()
}

/// Why a cgroup v1 cgroup for a run could not be made.
#[derive(Debug, thiserror::Error)]
enum CgroupError {
    #[error("no {0} cgroup for this process")]
    NoOwn(String),
    #[error("cannot create {}: {source}", path.display())]
    Create { path: PathBuf, source: std::io::Error },
    #[error("cannot write {}: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
}

/// Makes `<hierarchy>/<own path>/<name>` and writes `settings` into it.
fn make(
    hierarchy: &Path,
    controller: &str,
    name: &str,
    settings: &[(&str, String)],
) -> Result<PathBuf, CgroupError> {
    let own = own_cgroup(controller).ok_or_else(|| CgroupError::NoOwn(controller.to_owned()))?;
    let dir = hierarchy.join(own.trim_start_matches('/')).join(name);
    fs::create_dir_all(&dir).map_err(|source| CgroupError::Create { path: dir.clone(), source })?;
    for (file, value) in settings {
        if let Err(source) = fs::write(dir.join(file), value) {
            let _ = fs::remove_dir(&dir);
            return Err(CgroupError::Write { path: dir.join(file), source });
        }
    }
    Ok(dir)
}

fn human_bytes(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{} MiB", b >> 20)
    }
}

/// The cgroup every run with pvisor's *default* limit joins (and nobody
/// removes). On this hierarchy creating and removing a cgroup costs ~1.5 ms
/// each, per controller, more than the rest of a run's setup; a ceiling
/// shared by default-limited runs costs a write. A limit the user asked for
/// gets a cgroup of the run's own.
const SHARED_DEFAULT: &str = "pvisor-default";

/// Joins the shared default cgroup of the v1 controller of `kind` (named
/// as the limit is), setting `setting`.
fn join_shared_v1(
    out: &mut Applied,
    kind: LimitKind,
    setting: (&str, String),
    value: String,
) -> Result<(), CgroupError> {
    let (file, limit) = setting;
    let controller = kind.as_str();
    let dir = make(&Path::new(ROOT).join(controller), controller, SHARED_DEFAULT, &[(file, limit)])?;
    out.join.push(dir.join("cgroup.procs"));
    out.report.push(Enforcement {
        limit: kind,
        value,
        by: Mechanism::Enforced(format!("cgroup v1 {file} (the default, shared by default-limited runs)")),
    });
    Ok(())
}

/// Starts, in the background, the RCU grace period that moving a process
/// between cgroup v1 cgroups waits for, so the run's own move (moments
/// later, in the helper) finds it passed.
/// Called as `pvisor run` starts, so the wait overlaps admission. (A second
/// warm-up as the sandbox is spawned measured slower: it restarts the wait
/// whenever the first window has closed.)
///
/// Every write to a v1 `cgroup.procs` takes the kernel's threadgroup rwsem
/// for writing, whose first writer waits a grace period (~7 ms here, the
/// largest cost of starting a run with limits); a writer shortly after
/// another does not. Writing this process's own pid into its current memory
/// cgroup is such a write that moves nothing. (cgroup v2 hosts mounted with
/// `favordynmods` do not need this; it is a no-op there and without root.)
pub fn warm_up() {
    if unified() || !rustix::process::geteuid().is_root() {
        return;
    }
    let Some(own) = own_cgroup("memory") else { return };
    let procs = Path::new(ROOT).join("memory").join(own.trim_start_matches('/')).join("cgroup.procs");
    let _ = std::thread::Builder::new().name("pvisor-cgroup-warm-up".into()).spawn(move || {
        let _ = fs::write(procs, std::process::id().to_string());
    });
}

/// The limits this host cannot enforce, and why, found without changing
/// anything: said before the command starts (`apply` reports the same in
/// `attempt.limits` once it has run). A limit is taken as enforceable where
/// the directory `apply` would make its cgroup in is writable.
pub fn unenforceable(limits: &Limits) -> Vec<Enforcement> {
    let writable = |dir: &Path| rustix::fs::access(dir, rustix::fs::Access::WRITE_OK).is_ok();
    let root = rustix::process::geteuid().is_root();
    let cgroup_dir = |controller: &str| -> Option<PathBuf> {
        if unified() {
            if root {
                return Some(PathBuf::from(ROOT));
            }
            let own = own_cgroup("")?;
            return Some(Path::new(ROOT).join(own.trim_start_matches('/')));
        }
        let own = own_cgroup(controller)?;
        Some(Path::new(ROOT).join(controller).join(own.trim_start_matches('/')))
    };
    let usable = |controller: &str| cgroup_dir(controller).is_some_and(|d| writable(&d));
    let without = Limits {
        memory_bytes: limits.memory_bytes.filter(|_| !usable("memory")),
        pids: limits.pids.filter(|_| !usable("pids")),
        cpus: limits.cpus.filter(|_| !usable("cpu")),
        memory_is_default: limits.memory_is_default,
        pids_is_default: limits.pids_is_default,
        ..Limits::default()
    };
    let mut dry = fallback(&without, Applied::default(), "no cgroup this user may create");
    std::mem::take(&mut dry.report).into_iter().filter(|e| !e.enforced()).collect()
}

/// How a disk quota is enforced by the `ns` executor (see `memory_stage.rs` in pvisor-ns).
pub fn disk(bytes: u64) -> Enforcement {
    Enforcement {
        limit: LimitKind::Disk,
        value: human_bytes(bytes),
        by: Mechanism::Enforced("tmpfs size= (the stage is held in memory until the command ends; writes past it fail with ENOSPC)"
            .into()),
    }
}

/// The `size=` of each private tmpfs the `ns` sandbox mounts. tmpfs pages
/// are memory, but an address-space rlimit (the rootless fallback) does not
/// count them, and the kernel's default size is half the host's RAM *per
/// mount*. So the run's memory limit (else half the host's RAM, as the
/// default limit) is split among them and their sum stays within it:
/// `/tmp` a half, `/dev/shm` a quarter, `/run` an eighth, `/dev` (device
/// nodes and links only) at most 1 MiB. A write past a size fails with `ENOSPC`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TmpfsSizes {
    pub tmp: u64,
    pub shm: u64,
    pub run: u64,
    pub dev: u64,
}

impl TmpfsSizes {
    pub fn for_limits(limits: &Limits) -> Self {
        let budget = limits.memory_bytes.unwrap_or_else(|| host_ram() / 2);
        // Never 0, which the kernel reads as "unlimited".
        let size = |bytes: u64| bytes.max(MIN_TMPFS);
        Self {
            tmp: size(budget / 2),
            shm: size(budget / 4),
            run: size(budget / 8),
            dev: size((budget / 16).min(1 << 20)),
        }
    }
}

const MIN_TMPFS: u64 = 64 << 10;

/// The host's RAM in bytes.
fn host_ram() -> u64 {
    let info = rustix::system::sysinfo();
    (info.totalram as u64).saturating_mul(u64::from(info.mem_unit))
}

/// Sets up cgroups (or rlimits) for `limits`; `name` names the run's cgroup.
pub fn apply(limits: &Limits, name: &str) -> Applied {
    let mut out = Applied::default();
    let v2 = unified();
    let period = 100_000u64;
    if v2 {
        return apply_v2(limits, name, period, out);
    }
    // cgroup v1: one hierarchy per controller.
    let mut failures = Vec::new();
    if let Some(m) = limits.memory_bytes.filter(|_| limits.memory_is_default) {
        match join_shared_v1(
            &mut out,
            LimitKind::Memory,
            ("memory.limit_in_bytes", m.to_string()),
            human_bytes(m),
        ) {
            Ok(()) => {}
            Err(e) => failures.push(("memory", e)),
        }
    } else if let Some(m) = limits.memory_bytes {
        let settings = [("memory.limit_in_bytes", m.to_string()), ("memory.swappiness", "0".into())];
        match make(&Path::new(ROOT).join("memory"), "memory", name, &settings[..1]).inspect(|dir| {
            // Best effort: without swap the limit means what it says.
            let _ = fs::write(dir.join(settings[1].0), &settings[1].1);
        }) {
            Ok(dir) => {
                out.join.push(dir.join("cgroup.procs"));
                out.oom_file = Some(dir.join("memory.oom_control"));
                out.dirs.push(dir);
                out.report.push(Enforcement {
                    limit: LimitKind::Memory,
                    value: human_bytes(m),
                    by: Mechanism::Enforced("cgroup v1 memory.limit_in_bytes".into()),
                });
            }
            Err(e) => failures.push(("memory", e)),
        }
    }
    if let Some(p) = limits.pids.filter(|_| limits.pids_is_default) {
        if let Err(e) = join_shared_v1(&mut out, LimitKind::Pids, ("pids.max", p.to_string()), p.to_string())
        {
            failures.push(("pids", e));
        }
    } else if let Some(p) = limits.pids {
        match make(&Path::new(ROOT).join("pids"), "pids", name, &[("pids.max", p.to_string())]) {
            Ok(dir) => {
                out.join.push(dir.join("cgroup.procs"));
                out.dirs.push(dir);
                out.report.push(Enforcement {
                    limit: LimitKind::Pids,
                    value: p.to_string(),
                    by: Mechanism::Enforced("cgroup v1 pids.max".into()),
                });
            }
            Err(e) => failures.push(("pids", e)),
        }
    }
    if let Some(c) = limits.cpus {
        let settings = [
            ("cpu.cfs_period_us", period.to_string()),
            ("cpu.cfs_quota_us", ((c * period as f64).round() as u64).to_string()),
        ];
        match make(&Path::new(ROOT).join("cpu"), "cpu", name, &settings) {
            Ok(dir) => {
                out.join.push(dir.join("cgroup.procs"));
                out.dirs.push(dir);
                out.report.push(Enforcement {
                    limit: LimitKind::Cpus,
                    value: format!("{c}"),
                    by: Mechanism::Enforced("cgroup v1 cpu.cfs_quota_us".into()),
                });
            }
            Err(e) => failures.push(("cpus", e)),
        }
    }
    for (limit, reason) in failures {
        let only = Limits {
            memory_bytes: limits.memory_bytes.filter(|_| limit == "memory"),
            pids: limits.pids.filter(|_| limit == "pids"),
            cpus: limits.cpus.filter(|_| limit == "cpus"),
            memory_is_default: limits.memory_is_default,
            pids_is_default: limits.pids_is_default,
            ..Limits::default()
        };
        out = fallback(&only, out, &reason.to_string());
    }
    out
}

/// cgroup v2. A cgroup's limits need their controllers enabled in its
/// parent's `cgroup.subtree_control`, which the kernel refuses while the
/// parent holds processes: root uses a process-free `/sys/fs/cgroup/pvisor`
/// parent; anyone else tries pvisor's own cgroup (a delegated, process-free
/// one works). Each limit is written on its own, so one that cannot be set
/// falls back alone.
fn apply_v2(limits: &Limits, name: &str, period: u64, mut out: Applied) -> Applied {
    let root = rustix::process::geteuid().is_root();
    let parent = if root {
        let parent = Path::new(ROOT).join("pvisor");
        let _ = fs::create_dir_all(&parent);
        for c in ["+memory", "+pids", "+cpu"] {
            let _ = fs::write(Path::new(ROOT).join("cgroup.subtree_control"), c);
        }
        parent
    } else {
        match own_cgroup("") {
            Some(own) => Path::new(ROOT).join(own.trim_start_matches('/')),
            None => return fallback(limits, out, "no cgroup v2 path for this process"),
        }
    };
    for c in ["+memory", "+pids", "+cpu"] {
        let _ = fs::write(parent.join("cgroup.subtree_control"), c);
    }
    // Only pvisor's defaults: one shared cgroup, created once, never removed.
    let shared = limits.cpus.is_none()
        && (limits.memory_bytes.is_none() || limits.memory_is_default)
        && (limits.pids.is_none() || limits.pids_is_default);
    let dir = parent.join(if shared { SHARED_DEFAULT } else { name });
    if let Err(e) = fs::create_dir_all(&dir) {
        return fallback(limits, out, &format!("cannot create {}: {e}", dir.display()));
    }
    let mut rest = Limits {
        memory_is_default: limits.memory_is_default,
        pids_is_default: limits.pids_is_default,
        ..Limits::default()
    };
    let set = |file: &str, value: String| {
        fs::write(dir.join(file), &value)
            .map(|()| value)
            .map_err(|e| format!("cannot write {}: {e}", dir.join(file).display()))
    };
    let mut reasons = Vec::new();
    if let Some(m) = limits.memory_bytes {
        match set("memory.max", m.to_string()) {
            Ok(_) => {
                let _ = set("memory.swap.max", "0".into());
                out.report.push(Enforcement {
                    limit: LimitKind::Memory,
                    value: human_bytes(m),
                    by: Mechanism::Enforced("cgroup v2 memory.max".into()),
                });
                out.oom_file = Some(dir.join("memory.events"));
            }
            Err(e) => {
                rest.memory_bytes = Some(m);
                reasons.push(e);
            }
        }
    }
    if let Some(p) = limits.pids {
        match set("pids.max", p.to_string()) {
            Ok(_) => out.report.push(Enforcement {
                limit: LimitKind::Pids,
                value: p.to_string(),
                by: Mechanism::Enforced("cgroup v2 pids.max".into()),
            }),
            Err(e) => {
                rest.pids = Some(p);
                reasons.push(e);
            }
        }
    }
    if let Some(c) = limits.cpus {
        match set("cpu.max", format!("{} {period}", (c * period as f64).round() as u64)) {
            Ok(_) => out.report.push(Enforcement {
                limit: LimitKind::Cpus,
                value: format!("{c}"),
                by: Mechanism::Enforced("cgroup v2 cpu.max".into()),
            }),
            Err(e) => {
                rest.cpus = Some(c);
                reasons.push(e);
            }
        }
    }
    out.join.push(dir.join("cgroup.procs"));
    if shared {
        // Its OOM count is every default-limited run's, not this one's.
        out.oom_file = None;
    } else {
        out.dirs.push(dir);
    }
    if reasons.is_empty() {
        out
    } else {
        fallback(&rest, out, &reasons.join("; "))
    }
}

/// Rlimits where no cgroup could be made; a CPU rate cannot be enforced that way.
fn fallback(limits: &Limits, mut out: Applied, reason: &str) -> Applied {
    if let Some(m) = limits.memory_bytes.filter(|_| limits.memory_is_default) {
        out.report.push(Enforcement {
            limit: LimitKind::Memory,
            value: human_bytes(m),
            by: Mechanism::Enforced(format!(
                "not enforced: the default needs a cgroup ({reason}); --memory SIZE enforces one with RLIMIT_AS"
            )),
        });
    } else if let Some(m) = limits.memory_bytes {
        out.rlimits.push((libc::RLIMIT_AS, m));
        out.report.push(Enforcement {
            limit: LimitKind::Memory,
            value: human_bytes(m),
            by: Mechanism::Enforced(format!("rlimit RLIMIT_AS (address space; no cgroup: {reason})")),
        });
    }
    if let Some(p) = limits.pids {
        if rustix::process::geteuid().is_root() {
            // The kernel exempts real uid 0 from RLIMIT_NPROC.
            out.report.push(Enforcement {
                limit: LimitKind::Pids,
                value: p.to_string(),
                by: Mechanism::NotEnforced(format!(
                    "no cgroup ({reason}), and uid 0 is exempt from RLIMIT_NPROC"
                )),
            });
        } else {
            out.rlimits.push((libc::RLIMIT_NPROC, p));
            out.report.push(Enforcement {
                limit: LimitKind::Pids,
                value: p.to_string(),
                by: Mechanism::Enforced(format!(
                    "rlimit RLIMIT_NPROC in the sandbox's user namespace (no cgroup: {reason})"
                )),
            });
        }
    }
    if let Some(c) = limits.cpus {
        out.report.push(Enforcement {
            limit: LimitKind::Cpus,
            value: format!("{c}"),
            by: Mechanism::NotEnforced(reason.to_string()),
        });
    }
    out
}

impl Applied {
    /// Whether the kernel's OOM killer acted in the run's memory cgroup.
    pub fn oom_killed(&self) -> bool {
        let Some(file) = &self.oom_file else { return false };
        fs::read_to_string(file).ok().is_some_and(|text| {
            text.lines().any(|l| {
                let mut f = l.split_whitespace();
                f.next() == Some("oom_kill") && f.next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0) > 0
            })
        })
    }

    /// Removes the run's cgroups (they are empty once the sandbox is gone).
    pub fn remove(&mut self) {
        for dir in self.dirs.drain(..) {
            for _ in 0..50 {
                if fs::remove_dir(&dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
}

impl Drop for Applied {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Parses sizes like `512M`, `2G`, `1048576`, `1.5GiB`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: f64 = number.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    (n > 0.0).then_some((n * mult as f64) as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn tmpfs_sizes_sum_within_the_memory_limit() {
        let limits = super::Limits { memory_bytes: Some(64 << 20), ..Default::default() };
        let sizes = super::TmpfsSizes::for_limits(&limits);
        assert_eq!((sizes.tmp, sizes.shm, sizes.run, sizes.dev), (32 << 20, 16 << 20, 8 << 20, 1 << 20));
        assert!(sizes.tmp + sizes.shm + sizes.run + sizes.dev <= 64 << 20);
        let unlimited = super::TmpfsSizes::for_limits(&super::Limits::default());
        assert!(unlimited.tmp > 0 && unlimited.tmp <= super::host_ram() / 4);
        let tiny = super::Limits { memory_bytes: Some(1), ..Default::default() };
        assert_eq!(super::TmpfsSizes::for_limits(&tiny).dev, super::MIN_TMPFS);
    }

    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("1.5G"), Some(3 << 29));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("2 GiB"), Some(2 << 30));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size("0"), None);
    }

    #[test]
    fn a_cpu_rate_without_cgroups_is_reported_as_not_enforced() {
        let out = fallback(
            &Limits { memory_bytes: Some(1 << 20), pids: Some(10), cpus: Some(0.5), ..Default::default() },
            Applied::default(),
            "rootless",
        );
        assert!(out.report.iter().find(|e| e.limit == LimitKind::Cpus).is_some_and(|e| !e.enforced()));
        let root = rustix::process::geteuid().is_root();
        assert_eq!(out.rlimits.len(), if root { 1 } else { 2 }, "real root is exempt from RLIMIT_NPROC");
    }

    /// The typed enforcement is recorded exactly as the strings were, and
    /// old records read back into the right variant.
    #[test]
    fn enforcement_records_keep_their_string_form() {
        let not = Enforcement {
            limit: LimitKind::Pids,
            value: "64".into(),
            by: Mechanism::NotEnforced("uid 0 is exempt".into()),
        };
        let json = serde_json::to_value(&not).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"limit": "pids", "value": "64", "by": "not enforced: uid 0 is exempt"})
        );
        assert_eq!(serde_json::from_value::<Enforcement>(json).unwrap(), not);
        let old = serde_json::json!({"limit": "memory", "value": "1G", "by": "cgroup v2 memory.max"});
        let read: Enforcement = serde_json::from_value(old).unwrap();
        assert!(read.enforced() && read.limit == LimitKind::Memory);
        assert!(serde_json::from_value::<Enforcement>(
            serde_json::json!({"limit": "gpus", "value": "1", "by": "x"})
        )
        .is_err());
    }
}
