//! `Stats` from the guest: a container is its VM, so its CPU and memory
//! are the guest kernel's (`/proc/stat`, `/proc/meminfo`, read through the
//! agent), reported as containerd's cgroup v1 `Metrics` (what `ctr task
//! metrics` and the CRI plugin decode).

use containerd_shim::protos::cgroups::metrics::{
    CPUStat, CPUUsage, MemoryEntry, MemoryStat, Metrics, PidsStat,
};
use containerd_shim::protos::protobuf::MessageField;

/// The guest kernel's clock ticks per second (`USER_HZ`, 100 on Linux).
const NS_PER_TICK: u64 = 1_000_000_000 / 100;

/// CPU time from `/proc/stat`'s first line: (user, kernel) nanoseconds.
fn cpu_ns(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line.split_whitespace().skip(1).map(|v| v.parse().unwrap_or(0)).collect();
    let at = |i: usize| ticks.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal
    let user = at(0) + at(1);
    let kernel = at(2) + at(5) + at(6);
    Some((user * NS_PER_TICK, kernel * NS_PER_TICK))
}

/// A `/proc/meminfo` field in bytes.
fn meminfo(text: &str, field: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kib| kib << 10)
}

/// The container's metrics from the guest's `/proc/stat` and
/// `/proc/meminfo` and its live process count.
pub fn metrics(stat: &str, mem: &str, processes: u64, pids_limit: u64) -> Metrics {
    let (user, kernel) = cpu_ns(stat).unwrap_or_default();
    let total = meminfo(mem, "MemTotal");
    let used = total.saturating_sub(meminfo(mem, "MemAvailable"));
    let usage = CPUUsage { total: user + kernel, user, kernel, ..Default::default() };
    let memory = MemoryStat {
        cache: meminfo(mem, "Cached"),
        rss: meminfo(mem, "AnonPages"),
        mapped_file: meminfo(mem, "Mapped"),
        dirty: meminfo(mem, "Dirty"),
        writeback: meminfo(mem, "Writeback"),
        usage: MessageField::some(MemoryEntry { usage: used, limit: total, ..Default::default() }),
        ..Default::default()
    };
    Metrics {
        cpu: MessageField::some(CPUStat { usage: MessageField::some(usage), ..Default::default() }),
        memory: MessageField::some(memory),
        pids: MessageField::some(PidsStat { current: processes, limit: pids_limit, ..Default::default() }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_proc_files_become_cgroup_metrics() {
        let stat = "cpu  120 30 50 9000 5 2 3 0 0 0\ncpu0 120 30 50 9000 5 2 3 0 0 0\n";
        let mem = "MemTotal:         500000 kB\nMemFree:  100 kB\nMemAvailable:     400000 kB\nCached:  2000 kB\nAnonPages: 3000 kB\n";
        let m = metrics(stat, mem, 2, 64);
        let cpu = m.cpu.usage.as_ref().expect("cpu usage");
        assert_eq!(cpu.user, 150 * NS_PER_TICK);
        assert_eq!(cpu.kernel, 55 * NS_PER_TICK);
        assert_eq!(cpu.total, 205 * NS_PER_TICK);
        let memory = m.memory.as_ref().expect("memory");
        assert_eq!(memory.usage.usage, 100_000 << 10);
        assert_eq!(memory.usage.limit, 500_000 << 10);
        assert_eq!((memory.cache, memory.rss), (2000 << 10, 3000 << 10));
        assert_eq!((m.pids.current, m.pids.limit), (2, 64));
        assert_eq!(metrics("", "", 0, 0).cpu.usage.total, 0, "unreadable files give zeros, not a panic");
    }
}
