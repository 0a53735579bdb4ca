//! Host directories shared with the guest live, through virtiofs: one
//! `virtiofsd` (the vhost-user file server QEMU ships, or the Rust one that
//! replaced it) per directory, each serving exactly one QEMU over a socket
//! this module connects before either process starts. This is how a
//! containerd pod's read-write volumes (an `emptyDir` an init container
//! fills, a directory two containers share) stay one directory across the
//! pod's VMs, as Kata Containers does it.
//!
//! What the guest can do there is what virtiofsd allows: it sandboxes
//! itself (`sandbox=namespace`: new mount, pid and network namespaces,
//! `pivot_root` into the directory, a seccomp filter), so the guest's paths
//! and symlinks resolve inside the directory and never beyond it. It runs as
//! root and would honour the guest's `mknod`: it is started without
//! `CAP_MKNOD` (so a guest cannot make a host device node in the share and
//! read the host's disk through it; FIFOs and sockets need no capability
//! and stay possible, which is why nothing on the host opens one) nor
//! `CAP_SETFCAP`, and with extended attributes off (no `security.*` file
//! capabilities). Writes are
//! not staged: they are the point of a shared volume, and admission records
//! each share as such. The server never gets the shared path itself: the
//! directory is opened through no symlink when the VM starts and bound, by
//! that descriptor, at a view in the VM's private directory (see
//! [`pinned_view`]), so a path a guest can change (a share inside another
//! VM's share) cannot be swapped for a symlink to a host directory between
//! the check and the server's start.
//!
//! Costs, each enforced elsewhere: the VM's RAM must be shared memory
//! ([`Ram::Shared`](super::qemu::Ram)), so it boots instead of cloning a
//! template, and vhost-user-fs cannot be migrated, so it cannot be
//! checkpointed, suspended or forked.

use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use pvisor_agent_proto::Share;
use pvisor_core::records::SharedDirectory;

use super::qemu::{spawn_helper, FsShare};

/// `PVISOR_VIRTIOFSD` names the file server; otherwise the first of these
/// that exists (the Rust package's, then QEMU's own), else `virtiofsd` on PATH.
const VIRTIOFSD_ENV: &str = "PVISOR_VIRTIOFSD";
const VIRTIOFSD_PATHS: [&str; 2] = ["/usr/libexec/virtiofsd", "/usr/lib/qemu/virtiofsd"];
/// How long a file server gets to exit on its own once QEMU is gone.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// The tag the guest mounts share `index` by (at most 36 bytes).
pub(super) fn tag(index: usize) -> String {
    format!("pvisor-share{index}")
}

/// What the agent mounts, in the order of the devices.
pub(super) fn guest_shares(shares: &[SharedDirectory]) -> Vec<Share> {
    let share = |(index, s): (usize, &SharedDirectory)| Share {
        tag: tag(index),
        target: s.target.clone(),
        read_only: s.read_only,
    };
    shares.iter().enumerate().map(share).collect()
}

/// The file server this host would use.
pub fn virtiofsd() -> PathBuf {
    if let Some(path) = std::env::var_os(VIRTIOFSD_ENV) {
        return path.into();
    }
    VIRTIOFSD_PATHS.iter().map(PathBuf::from).find(|p| p.is_file()).unwrap_or_else(|| "virtiofsd".into())
}

/// What narrows virtiofsd beyond its defaults: the capabilities it drops,
/// `mknod` (a guest's device node in the share would be a host device
/// node) and `setfcap`, and extended attributes off (`security.*` file
/// capabilities; the default of both servers, said explicitly to the C one,
/// the Rust one has no such option). QEMU's C server takes `-o modcaps=`,
/// the Rust one `--modcaps=`; which one `binary` is, its `--help` says
/// (asked once per binary).
fn narrowed(binary: &Path) -> Vec<String> {
    const DROPPED: &str = "-mknod:-setfcap";
    static RUST: std::sync::Mutex<Vec<(PathBuf, bool)>> = std::sync::Mutex::new(Vec::new());
    let mut known = RUST.lock().unwrap_or_else(|p| p.into_inner());
    let rust = match known.iter().find(|(b, _)| b == binary) {
        Some((_, rust)) => *rust,
        None => {
            let help = Command::new(binary).arg("--help").output();
            let rust = help.is_ok_and(|h| {
                String::from_utf8_lossy(&h.stdout).contains("--modcaps")
                    || String::from_utf8_lossy(&h.stderr).contains("--modcaps")
            });
            known.push((binary.to_path_buf(), rust));
            rust
        }
    };
    if rust {
        vec![format!("--modcaps={DROPPED}")]
    } else {
        ["-o", &format!("modcaps={DROPPED}"), "-o", "no_xattr"].map(String::from).into()
    }
}

/// One file server and QEMU's end of its socket.
#[derive(Debug)]
struct FileServer {
    child: Option<Child>,
    /// Connected before the server started; QEMU inherits it.
    qemu_end: Option<UnixStream>,
    tag: String,
}

/// The running file servers of one VM. Dropping them stops any still
/// running (a VM that never started, or a QEMU that is gone).
#[derive(Debug, Default)]
pub(super) struct FileServers {
    servers: Vec<FileServer>,
}

impl FileServers {
    /// Starts a server for each share, logging into `dir` (the Attempt's
    /// private `vm/` directory, where the sockets are bound too).
    pub(super) fn start(shares: &[SharedDirectory], dir: &Path) -> Result<Self, ShareError> {
        let mut started = Self::default();
        for (index, share) in shares.iter().enumerate() {
            started.servers.push(start_one(share, index, dir)?);
        }
        Ok(started)
    }

    /// The devices QEMU gets, in order.
    pub(super) fn devices(&self) -> Vec<FsShare<'_>> {
        self.servers
            .iter()
            .filter_map(|s| s.qemu_end.as_ref().map(|end| FsShare { socket: end.as_fd(), tag: &s.tag }))
            .collect()
    }

    /// QEMU holds the sockets now: the supervisor's copies go, so a QEMU
    /// that exits is the server's end of the connection, and so its own.
    pub(super) fn handed_over(&mut self) {
        for server in &mut self.servers {
            server.qemu_end = None;
        }
    }

    /// Waits for each server to exit (it does once QEMU has gone), killing
    /// one that has not after [`EXIT_GRACE`].
    pub(super) fn stop(&mut self) {
        for server in &mut self.servers {
            server.qemu_end = None;
            let Some(mut child) = server.child.take() else { continue };
            let deadline = Instant::now() + EXIT_GRACE;
            loop {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        tracing::debug!(tag = %server.tag, %status, "virtiofsd exited");
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                    _ => {
                        tracing::info!(tag = %server.tag, "virtiofsd did not exit with QEMU; killing it");
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
    }
}

impl Drop for FileServers {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Why a host directory could not be shared with the VM.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    #[error("cannot share {} with the VM: {step}: {source}", source_dir.display())]
    Step { source_dir: PathBuf, step: &'static str, source: io::Error },
    #[error(
        "cannot share {}: {} not found; install qemu-system-common (Debian 12) or virtiofsd, or set {VIRTIOFSD_ENV}",
        source_dir.display(),
        binary.display()
    )]
    NoVirtiofsd { source_dir: PathBuf, binary: PathBuf },
}

/// Opens the shared directory `source` (canonical, as admission left it)
/// without following any symlink: a path a guest could change (a share
/// inside another VM's read-write share) is pinned to the directory it
/// named when checked, whatever is swapped in later.
fn pin(source: &Path) -> io::Result<std::os::fd::OwnedFd> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    rustix::fs::openat2(
        rustix::fs::CWD,
        source,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(io::Error::from)
}

/// Makes the server serve the shared directory `source` at `view` (an
/// empty directory in the VM's private directory, which no guest can
/// reach): before it runs, in a mount namespace of its own (private, so
/// nothing propagates to the host), `source` is opened again through no
/// symlink (as [`pin`] did; a bind needs a mount of this namespace, so the
/// parent's descriptor cannot serve) and bound at `view` by that
/// descriptor, then, for a read-only share, remounted read-only. The
/// server is given `view`, a path nothing untrusted can change; writes
/// through a read-only share fail with `EROFS` on the host side, whatever
/// the guest does with its own mount. `slot` is a descriptor number of the
/// parent's (its pin): the child puts its own descriptor there, so the
/// path to bind from is made before the fork.
fn pinned_view(
    command: &mut Command,
    source: &Path,
    slot: &std::os::fd::OwnedFd,
    view: &Path,
    share: &SharedDirectory,
) -> io::Result<()> {
    use std::os::unix::process::CommandExt;
    let cstring = |bytes: &[u8]| {
        std::ffi::CString::new(bytes)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))
    };
    let slot = slot.as_raw_fd();
    let from = cstring(format!("/proc/self/fd/{slot}").as_bytes())?;
    let source = cstring(source.as_os_str().as_encoded_bytes())?;
    let at = cstring(view.as_os_str().as_encoded_bytes())?;
    let root = c"/";
    // A share of live mounts is read-only at its top: the guest writes
    // only inside the mounts beneath, never the entries the host mounts
    // on (a symlink planted where the host mounts next).
    let read_only = share.read_only || share.live_mounts;
    // Private, so nothing of the host's later mounts reaches the server,
    // unless the share asks for them: then a slave, which receives the
    // host's mounts beneath a shared directory and sends none back.
    let propagation = if share.live_mounts { libc::MS_SLAVE } else { libc::MS_PRIVATE };
    // SAFETY: only async-signal-safe calls (unshare, mount, openat2, dup2,
    // close) run in the child, on strings made before the fork.
    unsafe {
        command.pre_exec(move || {
            use rustix::fs::{Mode, OFlags, ResolveFlags};
            let ok = |r: libc::c_int| if r >= 0 { Ok(()) } else { Err(io::Error::last_os_error()) };
            let none = std::ptr::null();
            ok(libc::unshare(libc::CLONE_NEWNS))?;
            ok(libc::mount(none, root.as_ptr(), none, libc::MS_REC | propagation, std::ptr::null()))?;
            let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW;
            let resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
            let fd = rustix::fs::openat2(rustix::fs::CWD, source.as_c_str(), flags, Mode::empty(), resolve)?;
            ok(libc::dup2(fd.as_raw_fd(), slot))?;
            drop(fd);
            ok(libc::mount(
                from.as_ptr(),
                at.as_ptr(),
                none,
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ))?;
            ok(libc::close(slot))?;
            if read_only {
                let ro = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
                ok(libc::mount(none, at.as_ptr(), none, ro, std::ptr::null()))?;
            }
            Ok(())
        });
    }
    Ok(())
}

/// Binds a listening socket in `dir`, connects QEMU's end to it, removes
/// the name (nothing else can connect), and starts virtiofsd on the
/// listener. The name is reached through `/proc/self/fd`, so a long state
/// directory cannot overflow a socket address.
fn start_one(share: &SharedDirectory, index: usize, dir: &Path) -> Result<FileServer, ShareError> {
    let fail = |step: &'static str, source: io::Error| ShareError::Step {
        source_dir: share.source.clone(),
        step,
        source,
    };
    let dir_fd = File::open(dir).map_err(|e| fail("opening the VM's directory", e))?;
    let name = format!("virtiofs-{index}.sock");
    let _ = fs::remove_file(dir.join(&name));
    let address = format!("/proc/self/fd/{}/{name}", dir_fd.as_raw_fd());
    let listener = UnixListener::bind(&address).map_err(|e| fail("binding its socket", e))?;
    let qemu_end = UnixStream::connect(&address).map_err(|e| fail("connecting its socket", e));
    let _ = fs::remove_file(dir.join(&name));
    let qemu_end = qemu_end?;
    let pinned = pin(&share.source).map_err(|e| fail("opening it through no symlink", e))?;
    let view = dir.join(format!("virtiofs-{index}.view"));
    if view.to_string_lossy().contains(',') {
        // virtiofsd takes it in its `-o` list, where a comma starts another option.
        let comma = io::Error::new(io::ErrorKind::InvalidInput, "the state directory's path holds a comma");
        return Err(fail("making its view", comma));
    }
    fs::create_dir_all(&view).map_err(|e| fail("making its view", e))?;
    let binary = virtiofsd();
    let mut command = Command::new(&binary);
    command
        .arg(format!("--fd={}", listener.as_raw_fd()))
        .arg("-o")
        .arg(format!("source={}", view.display()))
        // Its own namespaces and pivot_root into the directory.
        .args(["-o", "sandbox=namespace"])
        // Attributes cached briefly, data revalidated on open: what Kata
        // uses, and executables in the share can be mapped.
        .args(["-o", "cache=auto"])
        .args(["-o", "log_level=warn"])
        .args(narrowed(&binary));
    pinned_view(&mut command, &share.source, &pinned, &view, share)
        .map_err(|e| fail("preparing its view", e))?;
    let log = dir.join(format!("virtiofs-{index}.log"));
    let child = spawn_helper(&mut command, &log, &[listener.as_fd()]).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            ShareError::NoVirtiofsd { source_dir: share.source.clone(), binary: binary.clone() }
        } else {
            fail("starting virtiofsd", e)
        }
    })?;
    tracing::info!(
        pid = child.id(),
        source = %share.source.display(),
        target = %share.target.display(),
        "virtiofsd started"
    );
    Ok(FileServer { child: Some(child), qemu_end: Some(qemu_end), tag: tag(index) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shared directory is opened through no symlink: one swapped in for
    /// a component (a guest's, in another VM's share) fails the share.
    #[test]
    fn a_share_is_pinned_through_no_symlink() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("vol/sub")).unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("vol/link")).unwrap();
        assert!(pin(&dir.path().join("vol/sub")).is_ok());
        assert!(pin(&dir.path().join("vol/link")).is_err(), "the symlink itself");
        let e = pin(&dir.path().join("vol/link/ssl")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "a symlink on the way: {e}");
    }
}
