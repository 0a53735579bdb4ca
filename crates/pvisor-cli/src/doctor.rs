//! Host capability checks for `pvisor doctor`.
//!
//! Each check probes the real thing where it can: namespaces are created in
//! throw-away children, and the sandbox check runs an actual `ns` sandbox
//! (overlay workspace included) over a scratch workspace on the state
//! directory's filesystem. As root it also runs one as an unprivileged user,
//! which is how rootless users will run pvisor.
//!
//! It lives in the CLI, which depends on both backends, because it probes
//! both: the backends' crates stay independent of each other.

use std::path::{Path, PathBuf};

use serde::Serialize;

use pvisor_ns::{diagnose, NsExecutor};
use pvisor_sandbox::{Executor, SandboxError, SandboxSpec, Termination};

/// Hidden first argument: run the sandbox probe in this process and exit.
pub const PROBE_ARG: &str = "__pvisor-doctor-probe";

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Missing,
    /// Reported for information: a feature pvisor does not depend on yet.
    Info,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
    pub fix: Option<String>,
    /// Whether `pvisor run` cannot work without it.
    pub essential: bool,
}

fn check(
    name: &str,
    status: Status,
    detail: impl Into<String>,
    fix: Option<String>,
    essential: bool,
) -> Check {
    Check { name: name.into(), status, detail: detail.into(), fix, essential }
}

/// Why a sandbox probe failed; its text is the check's detail.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot create {}: {source}", dir.display())]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{source}{}", fix_suffix(.source.hint()))]
    Start {
        #[source]
        source: SandboxError,
    },
    #[error("{source}")]
    Wait {
        #[source]
        source: SandboxError,
    },
    #[error("the probe command did not stage its file ({termination:?})")]
    NotStaged { termination: Termination },
    /// The rootless probe's directory could not be made or handed to its user.
    #[error("{source}")]
    Prepare {
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the probe: {source}")]
    Spawn {
        #[source]
        source: std::io::Error,
    },
    /// The unprivileged probe failed; it printed why.
    #[error("{output}")]
    Rootless { output: String },
}

fn fix_suffix(hint: Option<&str>) -> String {
    hint.map(|hint| format!(" (fix: {hint})")).unwrap_or_default()
}

/// Runs `true` in a real sandbox over a scratch workspace under `scratch`;
/// returns the host mounts whose Unix sockets stay reachable (see
/// `host_view.rs` in pvisor-ns).
pub fn probe_sandbox(scratch: &Path) -> Result<Vec<String>, ProbeError> {
    let ws = scratch.join("ws");
    let stage = scratch.join("stage");
    for dir in [&ws, &stage.join("upper"), &stage.join("work"), &stage.join("root")] {
        std::fs::create_dir_all(dir).map_err(|source| ProbeError::CreateDir { dir: dir.clone(), source })?;
    }
    let spec = SandboxSpec {
        workspace: ws.clone(),
        cwd: ws,
        upper: stage.join("upper"),
        work: stage.join("work"),
        root_mount: stage.join("root"),
        hidden: Vec::new(),
        start_at_coarse_ns: None,
        caches: Vec::new(),
        exposed_sockets: Vec::new(),
        read_only: Vec::new(),
        ca_bundle: None,
        state: Vec::new(),
        program: "sh".into(),
        args: vec!["-c".into(), "echo probe > probe-file".into()],
        env: vec![("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())],
        hostname: "pvisor-doctor".into(),
        network: pvisor_sandbox::NetworkAttachment::Isolated,
        loopback_forwards: Vec::new(),
        seccomp: true,
        limits: Default::default(),
        vm: None,
        output: None,
    };
    let process = NsExecutor.start(&spec).map_err(|source| ProbeError::Start { source })?;
    let reachable = process
        .facts()
        .and_then(|f| serde_json::from_value(f["sockets_reachable_under"].clone()).ok())
        .unwrap_or_default();
    let report = process.wait().map_err(|source| ProbeError::Wait { source })?;
    match report.termination {
        Termination::Exited(0) if stage.join("upper/probe-file").is_file() => Ok(reachable),
        termination => Err(ProbeError::NotStaged { termination }),
    }
}

/// Entry point of the re-executed probe (an unprivileged copy of the binary).
pub fn maybe_run_probe() {
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == PROBE_ARG) {
        let dir = PathBuf::from(args.next().unwrap_or_default());
        match probe_sandbox(&dir) {
            Ok(_) => std::process::exit(0),
            Err(e) => {
                println!("{e}");
                std::process::exit(1)
            }
        }
    }
}

/// Runs the probe as uid/gid 65534 in `dir` (which that user can write).
fn probe_rootless(dir: &Path) -> Result<(), ProbeError> {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.arg(PROBE_ARG).arg(dir).env_clear().env("PATH", "/usr/local/bin:/usr/bin:/bin");
    // SAFETY: setgroups/setresgid/setresuid are async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(65534, 65534, 65534) != 0
                || libc::setresuid(65534, 65534, 65534) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().map_err(|source| ProbeError::Spawn { source })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(ProbeError::Rootless { output: String::from_utf8_lossy(&out.stdout).trim().to_owned() })
    }
}

fn fs_name(magic: i64) -> &'static str {
    match magic {
        0xEF53 => "ext4",
        0x0102_1994 => "tmpfs",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x794C_7630 => "overlayfs",
        0x6969 => "nfs",
        0x6573_5546 => "fuse",
        0x0102_1997 => "9p/v9fs",
        _ => "other",
    }
}

fn state_dir_check(state: &Path) -> Check {
    let name = "state directory";
    let c = match pvisor_sandbox::sys::cpath(state) {
        Ok(c) => c,
        Err(_) => return check(name, Status::Missing, "path contains a NUL byte", None, true),
    };
    let sfs = match rustix::fs::statfs(c.as_c_str()) {
        Ok(sfs) => sfs,
        Err(e) => {
            let e = std::io::Error::from(e);
            return check(
                name,
                Status::Missing,
                format!("{}: {e}", state.display()),
                Some("set PVISOR_HOME to a writable directory".into()),
                true,
            );
        }
    };
    let fs = fs_name(sfs.f_type as i64);
    let free = sfs.f_bavail as u64 * sfs.f_bsize as u64;
    let probe = state.join(".doctor-write-probe");
    let writable = std::fs::write(&probe, b"x").and_then(|()| std::fs::remove_file(&probe));
    let detail = format!("{} on {fs}, {:.1} GiB free", state.display(), free as f64 / (1u64 << 30) as f64);
    match (writable, fs) {
        (Err(e), _) => check(
            name,
            Status::Missing,
            format!("{detail}; not writable: {e}"),
            Some("set PVISOR_HOME to a writable directory".into()),
            true,
        ),
        (Ok(()), "overlayfs" | "nfs" | "fuse" | "9p/v9fs") => check(
            name,
            Status::Missing,
            format!("{detail}; {fs} cannot hold overlay upper layers"),
            Some("set PVISOR_HOME to a directory on ext4, xfs, btrfs or tmpfs".into()),
            true,
        ),
        (Ok(()), _) if free < 1 << 30 => check(
            name,
            Status::Missing,
            format!("{detail}; under 1 GiB free"),
            Some("free space, or point PVISOR_HOME at a larger filesystem".into()),
            false,
        ),
        (Ok(()), _) => check(name, Status::Ok, detail, None, true),
    }
}

/// Runs every check. `state` must exist.
pub fn run_checks(state: &Path) -> Vec<Check> {
    let mut checks = Vec::new();
    let max = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".into());
    let user = diagnose::probe(libc::CLONE_NEWUSER);
    checks.push(if user == 0 {
        check("user namespaces", Status::Ok, format!("user.max_user_namespaces = {max}"), None, true)
    } else {
        check(
            "user namespaces",
            Status::Missing,
            std::io::Error::from_raw_os_error(user.max(1)).to_string(),
            Some(diagnose::user_namespace_hint(user)),
            true,
        )
    });
    for (flag, ns, config) in diagnose::NAMESPACES {
        let errno = diagnose::probe(libc::CLONE_NEWUSER | flag);
        let name = format!("{ns} namespace");
        checks.push(if errno == 0 {
            check(&name, Status::Ok, "available inside a user namespace", None, true)
        } else {
            check(
                &name,
                Status::Missing,
                std::io::Error::from_raw_os_error(errno.max(1)).to_string(),
                Some(format!("the kernel needs {config}")),
                true,
            )
        });
    }
    let scratch = state.join(format!(".doctor-{}", std::process::id()));
    let root = rustix::process::geteuid().is_root();
    let who = if root { "as root" } else { "rootless" };
    match probe_sandbox(&scratch) {
        Ok(reachable) => {
            checks.push(check(
                &format!("sandbox ({who})"),
                Status::Ok,
                "namespaces, read-only root, overlay workspace and staging work",
                None,
                true,
            ));
            checks.push(host_sockets(&reachable));
        }
        Err(e) => checks.push(check(&format!("sandbox ({who})"), Status::Missing, e.to_string(), None, true)),
    }
    // remove_tree: the overlay left its work directory mode 000, which a
    // rootless owner cannot enter without giving itself access first.
    let _ = pvisor_core::tree::remove_tree(&scratch);
    if root {
        let dir = std::env::temp_dir().join(format!("pvisor-doctor-rootless-{}", std::process::id()));
        let prepared = std::fs::create_dir_all(&dir)
            .and_then(|()| std::os::unix::fs::chown(&dir, Some(65534), Some(65534)));
        let result =
            prepared.map_err(|source| ProbeError::Prepare { source }).and_then(|()| probe_rootless(&dir));
        checks.push(match result {
            Ok(()) => check(
                "sandbox (rootless)",
                Status::Ok,
                "an unprivileged user (uid 65534) can stage through an overlay too",
                None,
                false,
            ),
            Err(e) => check(
                "sandbox (rootless)",
                Status::Missing,
                e.to_string(),
                Some(
                    "unprivileged users need user namespaces and overlayfs in user namespaces (Linux 5.11+)"
                        .into(),
                ),
                false,
            ),
        });
        let _ = std::fs::remove_dir_all(&dir);
    }
    checks.push(state_dir_check(state));
    checks.push(cgroups());
    checks.push(limits_check());
    checks.push(check(
        "protections",
        Status::Ok,
        "always on: capabilities dropped, no_new_privs, private terminal, hidden state dir and secret stores, scrubbed secret variables, read-only host, private /tmp /run /dev /proc",
        None,
        false,
    ));
    checks.push(seccomp());
    checks.push(kvm());
    checks.push(qemu());
    checks.push(virtiofsd());
    checks.push(vm_image());
    checks
}

fn host_sockets(reachable: &[String]) -> Check {
    if reachable.is_empty() {
        return check(
            "host sockets",
            Status::Ok,
            "unreachable: every host filesystem is shown through a read-only overlay (--expose-socket lets one through)",
            None,
            false,
        );
    }
    check(
        "host sockets",
        Status::Missing,
        format!(
            "reachable under {}: the kernel would not take these mounts as overlay layers, so they are bound read-only and their sockets answer connect(2)",
            reachable.join(", ")
        ),
        Some("keep host services' sockets off these filesystems, or --hide the directories that hold them".into()),
        false,
    )
}

fn cgroups() -> Check {
    let base = Path::new("/sys/fs/cgroup");
    let (kind, controllers) = if base.join("cgroup.controllers").exists() {
        (
            "v2 (unified)",
            std::fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default().trim().to_owned(),
        )
    } else if base.join("memory").exists() {
        let v1: Vec<&str> =
            ["cpu", "memory", "pids", "cpuset"].into_iter().filter(|c| base.join(c).exists()).collect();
        (if base.join("unified").exists() { "v1 hybrid" } else { "v1" }, v1.join(" "))
    } else {
        return check("cgroups", Status::Info, "not mounted at /sys/fs/cgroup", None, false);
    };
    check(
        "cgroups",
        Status::Info,
        format!("{kind}: {controllers}; used by --memory, --pids, --cpus"),
        None,
        false,
    )
}

/// Whether `--memory/--pids/--cpus` can use a cgroup here, or only rlimits.
fn limits_check() -> Check {
    let probe = pvisor_sandbox::limits::Limits {
        memory_bytes: Some(1 << 30),
        pids: Some(4096),
        cpus: Some(1.0),
        ..Default::default()
    };
    let mut applied = pvisor_sandbox::limits::apply(&probe, &format!("pvisor-doctor-{}", std::process::id()));
    let report = applied.report.clone();
    applied.remove();
    let by: Vec<String> = report.iter().map(|e| format!("{}: {}", e.limit, e.by)).collect();
    let all_cgroup = report.iter().all(|e| e.by.to_string().starts_with("cgroup"));
    if all_cgroup {
        check("resource limits", Status::Ok, by.join("; "), None, false)
    } else {
        check(
            "resource limits",
            Status::Missing,
            by.join("; "),
            Some("run as root, or on a cgroup v2 hierarchy delegated to this user, for cgroup limits".into()),
            false,
        )
    }
}

fn seccomp() -> Check {
    match std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail") {
        Ok(actions) => check(
            "seccomp",
            Status::Ok,
            format!("available ({}); pvisor installs its deny-list on every command", actions.trim()),
            None,
            false,
        ),
        Err(_) => check(
            "seccomp",
            Status::Missing,
            "not available (CONFIG_SECCOMP_FILTER)",
            Some("run with --no-seccomp, or use a kernel with CONFIG_SECCOMP_FILTER".into()),
            false,
        ),
    }
}

fn kvm() -> Check {
    let module =
        ["kvm_pvm", "kvm_intel", "kvm_amd"].into_iter().find(|m| Path::new("/sys/module").join(m).exists());
    match std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        Ok(_) => {
            let note = match module {
                Some("kvm_pvm") => {
                    "; kvm_pvm runs only PVM guest kernels: --executor vm probes it once and falls back to TCG"
                }
                _ => "",
            };
            check(
                "KVM",
                Status::Info,
                format!("/dev/kvm usable ({}){note}", module.unwrap_or("kvm")),
                None,
                false,
            )
        }
        Err(e) => check(
            "KVM",
            Status::Info,
            format!("/dev/kvm: {e}"),
            Some("load kvm_intel/kvm_amd, or add the user to the kvm group".into()),
            false,
        ),
    }
}

fn vm_image() -> Check {
    let found = pvisor_vm::GuestImage::locate_built().and_then(|dir| {
        std::fs::read(dir.join("manifest.json"))
            .map(|b| (dir, b))
            .map_err(|e| pvisor_sandbox::SandboxError::Protocol(e.to_string()))
    });
    match found {
        Ok((dir, bytes)) => {
            let kernel = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|m| m["kernel_version"].as_str().map(str::to_owned))
                .unwrap_or_else(|| "unknown kernel".into());
            check("vm guest image", Status::Info, format!("{} ({kernel})", dir.display()), None, false)
        }
        Err(e) => check(
            "vm guest image",
            Status::Info,
            format!("not built: {e}"),
            Some("scripts/vm-image.sh builds it from Debian packages (needed only for --executor vm)".into()),
            false,
        ),
    }
}

/// The file server a containerd pod's read-write volumes need (found by
/// path: QEMU's C virtiofsd has no `--version` to run).
fn virtiofsd() -> Check {
    let found = pvisor_vm::virtiofs::virtiofsd();
    let present = found.is_file()
        || std::env::var_os("PATH")
            .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(&found).is_file()));
    if present {
        check(
            "virtiofsd",
            Status::Info,
            format!("{} (shares a containerd pod's volumes)", found.display()),
            None,
            false,
        )
    } else {
        check(
            "virtiofsd",
            Status::Info,
            "not found: the containerd shim cannot share a pod's read-write volumes",
            Some(
                "apt-get install qemu-system-common (Debian 12) or virtiofsd; or set PVISOR_VIRTIOFSD".into(),
            ),
            false,
        )
    }
}

fn qemu() -> Check {
    let out = std::process::Command::new("qemu-system-x86_64").arg("--version").output();
    match out {
        Ok(o) if o.status.success() => {
            let version = String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or("").to_owned();
            check("QEMU", Status::Info, version, None, false)
        }
        _ => check(
            "QEMU",
            Status::Info,
            "qemu-system-x86_64 not found",
            Some("apt-get install qemu-system-x86".into()),
            false,
        ),
    }
}
