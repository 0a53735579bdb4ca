//! The cgroups of the guest, one per container of a pod's VM that has
//! limits ([`GuestContainer`]): the pod's containers share the VM, and each
//! container's own limits are its group's: `memory.max` (so one
//! container's OOM kill ends that container, all of its processes with
//! `memory.oom.group` as the kubelet sets it on a node, and leaves the
//! others running), `pids.max` and `cpu.max`.
//!
//! The cgroup v2 tree is mounted at `/sys/fs/cgroup` at the first group's
//! making; a process joins its group between fork and exec, through a
//! descriptor of the group's `cgroup.procs` opened before the fork.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use pvisor_agent_proto::GuestContainer;
use rustix::mount::MountFlags;

const TREE: &str = "/sys/fs/cgroup";

/// The period `cpu.max`'s quota is of, in microseconds (the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;

/// Makes (or finds) the container's group and opens its `cgroup.procs`
/// for a process to join it by writing `0`; `None` for a container without
/// limits. The limits are set each time: every process of a container asks
/// for the same ones.
pub(crate) fn open(container: &GuestContainer) -> io::Result<Option<File>> {
    let limited =
        container.memory_max.is_some() || container.pids_max.is_some() || container.cpu_max_us.is_some();
    if !limited {
        return Ok(None);
    }
    if !container.name_is_plain() {
        let message = format!("{:?} is not a container name", container.name);
        return Err(io::Error::new(io::ErrorKind::InvalidInput, message));
    }
    mount_tree()?;
    let dir = Path::new(TREE).join(container.cgroup().trim_start_matches('/'));
    match fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(context(e, "making", &dir)),
    }
    let set = |file: &str, value: &str| {
        fs::write(dir.join(file), value).map_err(|e| context(e, "setting", &dir.join(file)))
    };
    if let Some(max_bytes) = container.memory_max {
        set("memory.max", &max_bytes.to_string())?;
        set("memory.oom.group", "1")?;
        // No swap in a pvisor guest; where a kernel has it, the limit is RAM's.
        let _ = fs::write(dir.join("memory.swap.max"), "0");
    }
    if let Some(pids) = container.pids_max {
        set("pids.max", &pids.to_string())?;
    }
    if let Some(quota) = container.cpu_max_us {
        set("cpu.max", &format!("{} {CPU_PERIOD_US}", quota.max(1_000)))?;
    }
    let procs = dir.join("cgroup.procs");
    let file = OpenOptions::new().write(true).custom_flags(libc::O_CLOEXEC).open(&procs);
    file.map(Some).map_err(|e| context(e, "opening", &procs))
}

/// The cgroup v2 tree with the memory, pids and cpu controllers on for its
/// children.
fn mount_tree() -> io::Result<()> {
    let controllers = Path::new(TREE).join("cgroup.controllers");
    if !controllers.exists() {
        fs::create_dir_all(TREE)?;
        crate::init::mount(
            "cgroup2",
            TREE,
            "cgroup2",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            "",
        )
        .map_err(|e| context(e, "mounting the cgroup tree at", Path::new(TREE)))?;
    }
    let subtree = Path::new(TREE).join("cgroup.subtree_control");
    fs::write(&subtree, "+memory +pids +cpu").map_err(|e| context(e, "turning on controllers in", &subtree))
}

fn context(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// The OOM kill count of each container's group (`oom_kill` in its
/// `memory.events`), by the group's path (`/pod-NAME`); none before the
/// first group is made.
pub(crate) fn kill_counts() -> std::collections::HashMap<String, u64> {
    let mut counts = std::collections::HashMap::new();
    for entry in fs::read_dir(TREE).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("pod-") {
            continue;
        }
        let events = fs::read_to_string(entry.path().join("memory.events")).unwrap_or_default();
        if let Some(n) = oom_kills(&events) {
            counts.insert(format!("/{name}"), n);
        }
    }
    counts
}

/// `oom_kill N` of a `memory.events`.
fn oom_kills(events: &str) -> Option<u64> {
    events.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_oom_kill_count_is_read_from_memory_events() {
        let events = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 3\noom_group_kill 1\n";
        assert_eq!(super::oom_kills(events), Some(3));
        assert_eq!(super::oom_kills("low 0\n"), None);
    }
}
