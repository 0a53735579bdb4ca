//! The guest kernel's OOM kills, read from its log (`/dev/kmsg`): each
//! kill is told as [`Reply::Oom`] to the running execs it concerns. A
//! guest without memory groups is one memory domain (its RAM is the
//! sandbox's memory limit), so a kill there is an event of the whole
//! sandbox, as a container's cgroup OOM is of the whole container; a kill
//! inside a pod container's cgroup ([`crate::cgroup`]) is told to that
//! group's execs only: the group the kernel's report names, or, where the
//! kernel left that report out (it is rate-limited), the groups whose OOM
//! kill count grew since the last look.
//!
//! A thread waits on the log; an exec that ended by SIGKILL reads it too
//! before its `Exited` is sent (the kernel logs the kill right after
//! sending the signal), so a victim's `Oom` precedes its exit.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Arc, Mutex};

use pvisor_agent_proto::Reply;
use rustix::event::{PollFd, PollFlags};

use crate::exec::{running_in, Execs};
use crate::Out;

/// Victims remembered, so a kill the log reports twice is told once.
const REMEMBERED: usize = 64;

/// The kernel log reader.
pub(crate) struct OomWatch {
    kmsg: Mutex<Option<File>>,
    seen: Mutex<VecDeque<i32>>,
    /// Each memory group's OOM kill count at the last scan.
    kills: Mutex<std::collections::HashMap<String, u64>>,
    out: Out,
    execs: Execs,
}

impl OomWatch {
    /// Opens the log past its current end (earlier kills are not this
    /// guest's news) and starts the thread that waits on it. Without a
    /// readable log there is no OOM news, and nothing else changes.
    pub(crate) fn start(out: Out, execs: Execs) -> Arc<OomWatch> {
        let kmsg = open_kmsg().map_err(|e| eprintln!("pvisor-agent: no OOM events: /dev/kmsg: {e}")).ok();
        // The thread waits on its own descriptor of the same open file (one
        // read position), so `scan` never waits behind its poll.
        let waiter = kmsg.as_ref().and_then(|f| f.try_clone().ok());
        let watch = Arc::new(OomWatch {
            kmsg: Mutex::new(kmsg),
            seen: Mutex::default(),
            kills: Mutex::default(),
            out,
            execs,
        });
        if let Some(waiter) = waiter {
            let watch = watch.clone();
            std::thread::spawn(move || loop {
                let mut fds = [PollFd::new(&waiter, PollFlags::IN)];
                match rustix::event::poll(&mut fds, None) {
                    Ok(_) => watch.scan(),
                    Err(rustix::io::Errno::INTR) => {}
                    Err(_) => return,
                }
            });
        }
        watch
    }

    /// Reads every record the log holds now and tells the running execs
    /// of each OOM kill among them.
    pub(crate) fn scan(&self) {
        let mut victims = Vec::new();
        {
            let mut kmsg = self.kmsg.lock().unwrap_or_else(|p| p.into_inner());
            let Some(file) = kmsg.as_mut() else { return };
            // One record per read; records are at most 8 KiB with their header.
            let mut record = vec![0u8; 8192];
            loop {
                match file.read(&mut record) {
                    Ok(0) => break,
                    Ok(n) => victims.extend(victim(&String::from_utf8_lossy(&record[..n]))),
                    // The ring overran this reader: records were lost, go on.
                    Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break, // EAGAIN: nothing more now
                }
            }
        }
        let grown = self.groups_with_new_kills();
        for (pid, memcg) in victims {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if seen.contains(&pid) {
                continue;
            }
            if seen.len() == REMEMBERED {
                seen.pop_front();
            }
            seen.push_back(pid);
            drop(seen);
            let concerned: Vec<u32> = match (memcg, grown.as_slice()) {
                (Some(memcg), _) => running_in(&self.execs, Some(&memcg)),
                (None, []) => running_in(&self.execs, None),
                (None, groups) => groups.iter().flat_map(|g| running_in(&self.execs, Some(g))).collect(),
            };
            for id in concerned {
                let _ = self.out.send((Reply::Oom { id, pid }, Vec::new(), None));
            }
        }
    }

    /// The memory groups whose OOM kill count grew since the last call.
    fn groups_with_new_kills(&self) -> Vec<String> {
        let now = crate::cgroup::kill_counts();
        let mut last = self.kills.lock().unwrap_or_else(|p| p.into_inner());
        let grown = now.iter().filter(|(group, n)| last.get(*group).map_or(**n > 0, |before| *n > before));
        let grown = grown.map(|(group, _)| group.clone()).collect();
        *last = now;
        grown
    }
}

fn open_kmsg() -> io::Result<File> {
    let mut file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open("/dev/kmsg")?;
    file.seek(SeekFrom::End(0))?;
    Ok(file)
}

/// The pid an OOM kill record names: `Out of memory: Killed process N
/// (comm) ...` (not rate-limited, unlike the report before it), or the
/// summary line `oom-kill:...,task_memcg=/G,...,pid=N,...`, which comes
/// first and also names the victim's memory cgroup. Only the kernel's own
/// records count (facility 0 in the record's `PRI`): a process that can
/// write the log writes as a user facility, and forges nothing here.
fn victim(record: &str) -> Option<(i32, Option<String>)> {
    let (header, message) = record.split_once(';')?;
    let priority: u32 = header.split(',').next()?.parse().ok()?;
    if priority >> 3 != 0 {
        return None;
    }
    let digits = |s: &str| -> Option<i32> {
        let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        s[..end].parse().ok()
    };
    if let Some((_, rest)) = message.split_once("Killed process ") {
        return digits(rest).map(|pid| (pid, None));
    }
    if message.starts_with("oom-kill:") {
        let field = |name: &str| message.split(',').find_map(|f| f.strip_prefix(name));
        let memcg = field("task_memcg=").map(|m| m.trim_end().to_owned());
        return field("pid=").and_then(digits).map(|pid| (pid, memcg));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::victim;

    #[test]
    fn the_victim_is_read_from_the_kill_record_and_the_summary() {
        let kill = "3,412,8123456,-;Out of memory: Killed process 231 (sh) total-vm:245760kB, \
                    anon-rss:200000kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:500kB oom_score_adj:0\n";
        assert_eq!(victim(kill), Some((231, None)));
        let summary = "6,411,8123400,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,\
                       mems_allowed=0,global_oom,task_memcg=/,task=sh,pid=231,uid=0\n";
        assert_eq!(victim(summary), Some((231, Some("/".to_owned()))));
        let in_group = "6,411,8123400,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,\
                        mems_allowed=0,oom_memcg=/pod-c2,task_memcg=/pod-c2,task=sh,pid=77,uid=0\n";
        assert_eq!(victim(in_group), Some((77, Some("/pod-c2".to_owned()))));
        assert_eq!(victim("6,1,1,-;oom_reaper: reaped process 231 (sh), now anon-rss:0kB\n"), None);
        assert_eq!(victim("6,2,2,-;virtio_blk virtio1: [vda] 16 512-byte logical blocks\n"), None);
        // Written to /dev/kmsg by a process: the user facility (1 << 3 | 6).
        assert_eq!(victim("14,3,3,-;oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/pod-c1,pid=9\n"), None);
        assert_eq!(victim("no header"), None);
    }
}
