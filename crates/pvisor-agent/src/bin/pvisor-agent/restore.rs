//! Execution checkpoints from the guest's side: `sync` and freeze the
//! writable filesystem before the snapshot, thaw it after, and once
//! restored (or forked) step the clock and reseed the CRNG so no two copies
//! share a random stream.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use pvisor_agent_proto::Reply;
use rustix::time::{ClockId, Timespec};

use crate::init::UPPER_MNT;
use crate::Agent;

impl Agent {
    /// After a restore or fork: resets what belonged to the old host, steps
    /// the clock and reseeds the CRNG with `payload`, the host's entropy.
    /// Answers `Restored`, or `Error` if the reseed failed.
    pub(crate) fn restored(&self, clock_unix_ns: i64, payload: &[u8]) {
        // Connections to the old host's proxy are gone: reset them.
        self.streams.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.stream_credits.clear();
        self.gate.open();
        let step = set_clock(clock_unix_ns).unwrap_or(0);
        // An unreseeded copy would repeat its checkpoint's random stream:
        // the host must fail the restore, not record a repaired guest.
        if let Err(e) = reseed(payload) {
            let message = format!("cannot reseed the CRNG: {e}");
            return self.send(Reply::Error { op: "restored".into(), message }, Vec::new());
        }
        let entropy_avail = fs::read_to_string("/proc/sys/kernel/random/entropy_avail")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        self.send(Reply::Restored { clock_step_ns: step, entropy_avail }, Vec::new());
    }
}

pub(crate) fn quiesce() -> io::Result<Vec<PathBuf>> {
    rustix::fs::sync();
    let mut frozen = Vec::new();
    if Path::new(UPPER_MNT).join("upper").is_dir() {
        path_ioctl(UPPER_MNT, FIFREEZE)?;
        frozen.push(PathBuf::from(UPPER_MNT));
    }
    Ok(frozen)
}

pub(crate) fn thaw() -> io::Result<()> {
    match path_ioctl(UPPER_MNT, FITHAW) {
        // EINVAL: not frozen (thaw after a restore whose checkpoint froze is still fine).
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        other => other,
    }
}

const FIFREEZE: libc::c_ulong = 0xC004_5877;
const FITHAW: libc::c_ulong = 0xC004_5878;
/// Write back and drop a block device's buffer cache (`_IO(0x12, 97)`).
pub(crate) const BLKFLSBUF: libc::c_ulong = 0x1261;

/// Opens `path` and issues `request`, one of the ioctls above, whose
/// argument the kernel ignores. libc's ioctl: rustix has no call for any of
/// them, and its generic ioctl would be just as unsafe.
pub(crate) fn path_ioctl(path: &str, request: libc::c_ulong) -> io::Result<()> {
    let file = File::open(path)?;
    // SAFETY: FIFREEZE, FITHAW and BLKFLSBUF take an int argument that the
    // kernel ignores; no memory is passed.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), request, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Steps CLOCK_REALTIME to the host's time; returns how far it moved.
pub(crate) fn set_clock(unix_ns: i64) -> io::Result<i64> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    let ts = Timespec { tv_sec: unix_ns / 1_000_000_000, tv_nsec: unix_ns % 1_000_000_000 };
    rustix::time::clock_settime(ClockId::Realtime, ts)?;
    Ok(unix_ns - now)
}

/// Mixes host entropy into the pool and forces the CRNG to reseed, so a
/// restored or forked guest does not repeat its parent's random stream.
/// Either ioctl failing is an error naming it: the caller must not report
/// a repaired guest. libc's ioctl: rustix has no call for either.
fn reseed(entropy: &[u8]) -> io::Result<()> {
    const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
    const RNDRESEEDCRNG: libc::c_ulong = 0x5207;
    if entropy.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "the host sent no entropy"));
    }
    let failed = |what: &str, e: io::Error| io::Error::new(e.kind(), format!("{what} on /dev/urandom: {e}"));
    let random = OpenOptions::new().write(true).open("/dev/urandom").map_err(|e| failed("open", e))?;
    let mut buf = Vec::with_capacity(8 + entropy.len());
    buf.extend_from_slice(&((entropy.len() * 8) as i32).to_ne_bytes());
    buf.extend_from_slice(&(entropy.len() as i32).to_ne_bytes());
    buf.extend_from_slice(entropy);
    // SAFETY: `buf` is a struct rand_pool_info followed by its buffer, and
    // outlives the call; the kernel only reads it.
    if unsafe { libc::ioctl(random.as_raw_fd(), RNDADDENTROPY, buf.as_ptr()) } != 0 {
        return Err(failed("RNDADDENTROPY", io::Error::last_os_error()));
    }
    // SAFETY: RNDRESEEDCRNG takes no argument.
    if unsafe { libc::ioctl(random.as_raw_fd(), RNDRESEEDCRNG, 0) } != 0 {
        return Err(failed("RNDRESEEDCRNG", io::Error::last_os_error()));
    }
    // The reseeded CRNG must answer getrandom(2) without blocking, in full.
    let mut sample = [0u8; 32];
    match rustix::rand::getrandom(&mut sample, rustix::rand::GetRandomFlags::NONBLOCK) {
        Ok(n) if n == sample.len() => Ok(()),
        Ok(n) => Err(io::Error::other(format!("getrandom after the reseed returned {n} of 32 bytes"))),
        Err(e) => Err(io::Error::other(format!("getrandom after the reseed failed: {}", io::Error::from(e)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reseed_without_entropy_is_refused_before_any_ioctl() {
        let e = reseed(&[]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("no entropy"), "{e}");
    }
}
