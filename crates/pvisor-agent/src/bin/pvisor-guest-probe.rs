//! The hostile guest of the `vm` executor's tests; never part of the guest
//! image. Run as the command (root in the guest), it does what a command
//! that owns the guest can: takes the agent's virtio-serial descriptor
//! from PID 1 with `pidfd_getfd` and writes frames the host never asked
//! for, then exits 7 so the host's record of the real exit can be checked.
//!
//! `pvisor-guest-probe flood`: 16,000 `NetOpen`s, 64 MiB of `Stdout` for 64
//! execs never started, 60 unrequested `Ready`s.
//! `pvisor-guest-probe sparse FILE`: a 1 GiB file with one written 4 KiB
//! block at 512 MiB, then exit 0 (the export must keep its holes).
//! `pvisor-guest-probe escape`: a pod container's way out of its root, the
//! classic chroot escape (`CAP_SYS_CHROOT`: chroot below the working
//! directory, then `..` past the root), and a report of what it reached:
//! the entries of the root it got to, and of its `proc` and `run`, and
//! whether PID 1's agent port could be taken; then whether it can set the
//! guest kernel's `core_pattern` (a program the kernel runs as the guest's
//! root), and open a guest disk through a device node it makes.

// A test program: it reports what it found on its stdout and stderr.
#![allow(clippy::disallowed_macros)]

use std::fs::{self, File};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

use pvisor_agent_proto::{write_frame, Reply};

const NETOPENS: u32 = 16_000;
const EXECS: u32 = 64;
const REPLIES: u32 = 60;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let result = match args.get(1).map(String::as_str) {
        Some("flood") => flood(),
        Some("sparse") if args.len() == 3 => sparse(&args[2]),
        Some("escape") => escape(),
        _ => Err(io::Error::other("usage: pvisor-guest-probe flood | sparse FILE | escape")),
    };
    if let Err(e) = result {
        eprintln!("probe: {e}");
        std::process::exit(2);
    }
}

fn flood() -> io::Result<()> {
    let mut port = agent_port()?;
    for stream in 0..NETOPENS {
        write_frame(&mut port, &Reply::NetOpen { stream }, &[])?;
    }
    let chunk = vec![b'x'; 1 << 20];
    for id in 1_000..1_000 + EXECS {
        write_frame(&mut port, &Reply::Stdout { id }, &chunk)?;
    }
    for _ in 0..REPLIES {
        write_frame(&mut port, &Reply::Ready { steps_us: Vec::new() }, &[])?;
    }
    println!("probe: sent {NETOPENS} NetOpen, {EXECS} MiB of Stdout for execs never started, {REPLIES} unrequested Ready");
    std::process::exit(7);
}

fn sparse(path: &str) -> io::Result<()> {
    let file = File::create(path)?;
    file.set_len(1 << 30)?;
    file.write_all_at(&[0x5a; 4096], 512 << 20)?;
    file.sync_all()?;
    println!("probe: wrote a 1 GiB sparse file with one block");
    Ok(())
}

fn escape() -> io::Result<()> {
    fs::create_dir_all("/tmp/probe-jail")?;
    // SAFETY: plain syscalls on NUL-terminated literals; each is checked.
    let climbed = unsafe {
        libc::chroot(c"/tmp/probe-jail".as_ptr()) == 0
            && (0..64).all(|_| libc::chdir(c"..".as_ptr()) == 0)
            && libc::chroot(c".".as_ptr()) == 0
    };
    if !climbed {
        return Err(io::Error::last_os_error());
    }
    let names = |dir: &str| -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .map(|entries| entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        names
    };
    println!("root: {}", names("/").join(" "));
    println!("proc: {}", names("/proc").join(" "));
    println!("run: {}", names("/run").join(" "));
    match agent_port() {
        Ok(_) => println!("agent port: taken"),
        Err(e) => println!("agent port: {e}"),
    }
    let pattern = fs::read("/proc/sys/kernel/core_pattern").unwrap_or_default();
    match fs::OpenOptions::new().write(true).open("/proc/sys/kernel/core_pattern") {
        Ok(mut file) => match io::Write::write_all(&mut file, &pattern) {
            Ok(()) => println!("core_pattern: written"),
            Err(e) => println!("core_pattern: {e}"),
        },
        Err(e) => println!("core_pattern: {e}"),
    }
    println!("disk: {}", disk_through_a_node());
    Ok(())
}

/// Makes a node for the guest's first disk (its number from sysfs) and
/// opens it.
fn disk_through_a_node() -> String {
    let Ok(numbers) = fs::read_to_string("/sys/block/vda/dev") else { return "no /sys/block/vda".into() };
    let Some((major, minor)) = numbers.trim().split_once(':') else { return "no device number".into() };
    let (Ok(major), Ok(minor)) = (major.parse::<u32>(), minor.parse::<u32>()) else {
        return "no device number".into();
    };
    for dir in ["/dev", "/tmp"] {
        let node = format!("{dir}/probe-disk");
        let path = std::ffi::CString::new(node.clone()).unwrap_or_default();
        // SAFETY: mknod of a NUL-terminated path we made, with integers.
        let made = unsafe { libc::mknod(path.as_ptr(), libc::S_IFBLK | 0o600, libc::makedev(major, minor)) };
        if made != 0 {
            println!("mknod {node}: {}", io::Error::last_os_error());
            continue;
        }
        if File::open(&node).is_ok() {
            return format!("opened {node}");
        }
    }
    "not opened".into()
}

/// A duplicate of PID 1's descriptor for the agent port (`/dev/vportNpM`).
fn agent_port() -> io::Result<File> {
    // SAFETY: plain syscalls with integer arguments; each result is checked.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, 1, 0) };
    if pidfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pidfd_open returned a new descriptor we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    for entry in fs::read_dir("/proc/1/fd")? {
        let entry = entry?;
        let target = fs::read_link(entry.path()).unwrap_or_default();
        if !target.to_string_lossy().contains("vport") {
            continue;
        }
        let fd: i32 = entry.file_name().to_string_lossy().parse().map_err(io::Error::other)?;
        use std::os::fd::AsRawFd;
        // SAFETY: as above.
        let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pidfd_getfd returned a new descriptor we own.
        return Ok(unsafe { File::from_raw_fd(got as i32) });
    }
    Err(io::Error::other("PID 1 holds no /dev/vport* descriptor"))
}
