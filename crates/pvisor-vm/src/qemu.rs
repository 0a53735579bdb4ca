//! The QEMU process: its command line (shared by boots, restores and the
//! KVM probe), spawning it in its own session, capturing the guest console,
//! and reaping it with its resource usage. Nothing here speaks to the agent.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::disk::Disk;
use super::{Accelerator, CpuModel, GuestImage, MachineConfig, Pit};
use pvisor_sandbox::Usage;

/// Escapes a value for a QEMU `key=value,...` option (commas are doubled).
fn opt(path: &Path) -> String {
    path.to_string_lossy().replace(',', ",,")
}

/// Quotes `path` for the shell that QEMU's `exec:` migration runs.
fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.to_string_lossy().replace('\'', r"'\''"))
}

/// How guest RAM is provided. Part of the migration contract: a restore
/// must use a layout whose RAM block is named as the saved one's.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ram<'a> {
    /// `-m N` alone, without `x-ignore-shared`: restores of checkpoints taken
    /// before templates existed (their streams lack that capability's fields).
    Legacy,
    /// Anonymous RAM in the `pvisor.ram` backend: boots and restores.
    Private,
    /// A template being built: RAM *is* the file, mapped shared, so the
    /// migration skips it (`x-ignore-shared`) and the file holds the pages.
    TemplateSource(&'a Path),
    /// A clone of a template: its RAM file mapped privately, so the clone's
    /// writes are copy-on-write and idle clones share the template's pages.
    TemplateClone(&'a Path),
    /// Anonymous shared memory (a memfd), which vhost-user back ends such as
    /// virtiofsd map to reach the guest's buffers: boots with shares.
    Shared,
}

/// The RAM backend's id: the migration stream names RAM blocks by it.
const RAM_ID: &str = "pvisor.ram";

/// The guest's NIC: the TAP's descriptor (inherited by QEMU) and the MAC.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TapNic<'a> {
    pub(crate) tap: std::os::fd::BorrowedFd<'a>,
    pub(crate) mac: &'a str,
}

/// A shared directory's device: the vhost-user socket connected to its
/// virtiofsd (inherited by QEMU) and the tag the guest mounts it by.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FsShare<'a> {
    pub(crate) socket: std::os::fd::BorrowedFd<'a>,
    pub(crate) tag: &'a str,
}

/// The QEMU command line shared by boots, restores, template builds and the
/// KVM probe. The device list and its order are part of the migration
/// contract: `disks` come first, in order (lower, delta, upper for a fresh
/// start; the checkpoint's own list for a restore; none for the probe), and
/// a `nic` last (templates have none). `shares` (never migrated) come
/// between them and take [`Ram::Shared`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn qemu_command(
    image: &GuestImage,
    config: &MachineConfig,
    ram: Ram<'_>,
    disks: &[Disk<'_>],
    agent: &UnixStream,
    qmp: &UnixStream,
    console: &UnixStream,
    shares: &[FsShare<'_>],
    nic: Option<TapNic<'_>>,
    incoming: bool,
) -> Command {
    let mut cmdline = image.cmdline.clone();
    let mut command = Command::new(qemu_binary());
    let backend = match ram {
        Ram::Legacy => None,
        Ram::Private => Some(format!("memory-backend-ram,id={RAM_ID},size={}M", config.memory_mib)),
        Ram::Shared => Some(format!("memory-backend-memfd,id={RAM_ID},size={}M,share=on", config.memory_mib)),
        Ram::TemplateSource(file) | Ram::TemplateClone(file) => Some(format!(
            "memory-backend-file,id={RAM_ID},size={}M,mem-path={},share={}",
            config.memory_mib,
            opt(file),
            if matches!(ram, Ram::TemplateSource(_)) { "on" } else { "off" }
        )),
    };
    let mut machine = String::from("microvm");
    if config.pit == Pit::Off {
        machine.push_str(",pit=off");
    }
    if backend.is_some() {
        machine.push_str(&format!(",memory-backend={RAM_ID}"));
    }
    command.args(["-machine", &machine]);
    if let Some(backend) = &backend {
        command.args(["-object", backend]);
    }
    command.args(["-nodefaults", "-no-user-config", "-nographic", "-no-reboot"]);
    match config.accelerator {
        Accelerator::Kvm => {
            command.args(["-accel", "kvm", "-cpu", "host"]);
        }
        Accelerator::Tcg => {
            command.args(["-accel", "tcg"]);
            // What the machine was started with, so a restore repeats it.
            if config.cpu == CpuModel::Max {
                command.args(["-cpu", "max"]);
            }
            // Without it a TCG guest cannot calibrate the TSC while the host is busy.
            if let Some(khz) = host_tsc_khz() {
                cmdline.push_str(&format!(" tsc_early_khz={khz}"));
            }
        }
    }
    command
        .args(["-m", &config.memory_mib.to_string(), "-smp", &config.cpus.to_string()])
        .arg("-kernel")
        .arg(image.kernel())
        .arg("-initrd")
        .arg(image.initramfs())
        .args(["-append", &cmdline])
        .args([
            "-chardev",
            &format!("socket,id=console,fd={}", console.as_raw_fd()),
            "-serial",
            "chardev:console",
        ]);
    for disk in disks {
        let access = if disk.readonly { "readonly=on" } else { "cache=writeback" };
        command.args([
            "-drive",
            &format!("file={},if=none,id={},format=raw,{access}", opt(disk.path), disk.id),
            "-device",
            &format!("virtio-blk-device,drive={},serial={}", disk.id, disk.serial),
        ]);
    }
    command.args([
        "-device",
        "virtio-serial-device",
        "-chardev",
        &format!("socket,id=agent,fd={}", agent.as_raw_fd()),
        "-device",
        &format!("virtserialport,chardev=agent,name={}", pvisor_agent_proto::PORT_NAME),
        "-chardev",
        &format!("socket,id=qmp,fd={}", qmp.as_raw_fd()),
        "-mon",
        "chardev=qmp,mode=control",
    ]);
    if !shares.is_empty() {
        // virtiofsd (libvhost-user) serves only virtio 1.0 devices, and
        // microvm's virtio-mmio transports are legacy unless told otherwise.
        // Only VMs with shares change: templates and checkpoints were saved
        // with legacy transports, and such VMs never restore either.
        command.args(["-global", "virtio-mmio.force-legacy=false"]);
    }
    for (index, share) in shares.iter().enumerate() {
        command.args([
            "-chardev",
            &format!("socket,id=share{index},fd={}", share.socket.as_raw_fd()),
            "-device",
            &format!("vhost-user-fs-device,chardev=share{index},tag={}", share.tag),
        ]);
    }
    match nic {
        Some(nic) => command.args([
            "-netdev",
            &format!("tap,id=net0,fd={}", nic.tap.as_raw_fd()),
            "-device",
            &format!("virtio-net-device,netdev=net0,mac={}", nic.mac),
        ]),
        None => command.args(["-nic", "none"]),
    };
    if incoming {
        // The state is loaded over QMP ([`incoming_uri`]), after the
        // migration capabilities are set.
        command.args(["-S", "-incoming", "defer"]);
    }
    command
}

/// The `migrate-incoming` URI that loads the saved state in `state`.
pub(crate) fn incoming_uri(state: &Path) -> String {
    format!("exec:cat {}", shell_quote(state))
}

/// The QEMU binary's identity for template keys: its resolved path, size
/// and modification time (an upgrade replaces the file).
pub(crate) fn binary_identity() -> String {
    let name = qemu_binary();
    let path = if name.contains('/') {
        Some(std::path::PathBuf::from(&name))
    } else {
        std::env::var_os("PATH")
            .and_then(|paths| std::env::split_paths(&paths).map(|d| d.join(&name)).find(|p| p.is_file()))
    };
    let meta = path.as_ref().and_then(|p| fs::metadata(p).ok());
    match (path, meta) {
        (Some(path), Some(meta)) => {
            use std::os::unix::fs::MetadataExt;
            format!("{}:{}:{}.{}", path.display(), meta.len(), meta.mtime(), meta.mtime_nsec())
        }
        _ => name,
    }
}

fn qemu_binary() -> String {
    std::env::var("PVISOR_QEMU").unwrap_or_else(|_| "qemu-system-x86_64".into())
}

fn host_tsc_khz() -> Option<u64> {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").ok()?;
    let mhz: f64 =
        cpuinfo.lines().find(|l| l.starts_with("cpu MHz"))?.split(':').nth(1)?.trim().parse().ok()?;
    Some((mhz * 1000.0) as u64)
}

/// Starts QEMU in its own session (a terminal's ^C is the supervisor's to
/// forward), dying with the supervisor thread, with `keep` inherited.
pub(crate) fn spawn_qemu(
    command: &mut Command,
    log: &Path,
    keep: &[std::os::fd::BorrowedFd<'_>],
) -> io::Result<Child> {
    spawn_helper(command, log, keep).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            io::Error::new(
                e.kind(),
                format!("{} not found; install qemu-system-x86 (scripts/setup.sh)", qemu_binary()),
            )
        } else {
            e
        }
    })
}

/// Starts a helper process of the VM (QEMU, virtiofsd) in its own session,
/// killed when the supervisor thread that started it dies, with `keep`
/// inherited and its output in `log`.
pub(crate) fn spawn_helper(
    command: &mut Command,
    log: &Path,
    keep: &[std::os::fd::BorrowedFd<'_>],
) -> io::Result<Child> {
    let log = fs::File::create(log)?;
    let fds: Vec<i32> = keep.iter().map(|s| s.as_raw_fd()).collect();
    command.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    // SAFETY: only async-signal-safe calls (setsid, prctl, fcntl) run in the child.
    unsafe {
        command.pre_exec(move || {
            libc::setsid();
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            for &fd in &fds {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    command.spawn()
}

/// The most of the guest console kept on disk: the guest writes it at will.
const CONSOLE_CAP: u64 = 1 << 20;

/// Copies the guest console into `path`, keeping the first [`CONSOLE_CAP`]
/// bytes and discarding the rest (still reading, so the guest never blocks).
pub(crate) fn capture_console(console: UnixStream, path: &Path) -> io::Result<()> {
    let mut file = fs::File::create(path)?;
    let _ = std::thread::Builder::new().name("pvisor-vm-console".into()).spawn(move || {
        let (mut console, mut kept, mut buf) = (console, 0u64, vec![0u8; 16 * 1024]);
        loop {
            match console.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) if kept < CONSOLE_CAP => {
                    let n = n.min((CONSOLE_CAP - kept) as usize);
                    let _ = file.write_all(&buf[..n]);
                    kept += n as u64;
                    if kept >= CONSOLE_CAP {
                        let _ = file.write_all(b"\n[pvisor: console truncated at 1 MiB]\n");
                    }
                }
                Ok(_) => {}
            }
        }
    });
    Ok(())
}

/// Reads the last lines of a log for an error message.
pub(super) fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join(" | ")
}

/// Waits for QEMU (killing it after `grace`), with its resource usage.
pub(super) fn reap(child: Child, grace: Duration) -> (String, Usage) {
    let pid = child.id() as libc::pid_t;
    let deadline = Instant::now() + grace;
    let mut killed = false;
    let (status, usage) = loop {
        match pvisor_sandbox::sys::wait4(pid, libc::WNOHANG) {
            Ok(Some((_, status, usage))) => break (status, usage),
            Ok(None) => {}
            Err(_) => break (0, Usage::default()),
        }
        if Instant::now() > deadline {
            // The child is not reaped yet, so `pid` is still ours.
            if let Ok(pid) = pvisor_sandbox::sys::pid(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
            killed = true;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let described = if libc::WIFEXITED(status) {
        format!("exited {}", libc::WEXITSTATUS(status))
    } else {
        format!("killed by signal {}", libc::WTERMSIG(status))
    };
    tracing::info!(
        pid,
        status = %described,
        killed_after_grace = killed,
        user_cpu_ms = usage.user_cpu.as_millis() as u64,
        max_rss_kib = usage.max_rss_kib,
        "QEMU exited"
    );
    (described, usage)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn args(command: &Command) -> Vec<String> {
        command.get_args().map(|a| a.to_string_lossy().into_owned()).collect()
    }

    /// A VM with shares gets shared RAM, modern virtio-mmio transports and
    /// one vhost-user-fs device per share; one without keeps the layout
    /// templates and checkpoints were saved with.
    #[test]
    fn shares_take_shared_ram_and_modern_transports_and_nothing_else_changes() {
        let image = GuestImage::for_tests();
        let config = MachineConfig {
            memory_mib: 256,
            cpus: 1,
            accelerator: Accelerator::Kvm,
            ram: super::super::RamFormat::Named,
            cpu: super::super::CpuModel::Max,
            pit: Pit::Off,
        };
        let (agent, _a) = UnixStream::pair().unwrap();
        let (qmp, _q) = UnixStream::pair().unwrap();
        let (console, _c) = UnixStream::pair().unwrap();
        let (socket, _s) = UnixStream::pair().unwrap();
        let share = FsShare { socket: socket.as_fd(), tag: "pvisor-share0" };
        let with = args(&qemu_command(
            &image,
            &config,
            Ram::Shared,
            &[],
            &agent,
            &qmp,
            &console,
            &[share],
            None,
            false,
        ));
        let joined = with.join(" ");
        assert!(joined.contains("memory-backend-memfd,id=pvisor.ram,size=256M,share=on"), "{joined}");
        assert!(joined.contains("-global virtio-mmio.force-legacy=false"), "{joined}");
        assert!(
            joined.contains(&format!("socket,id=share0,fd={}", socket.as_raw_fd()))
                && joined.contains("vhost-user-fs-device,chardev=share0,tag=pvisor-share0"),
            "{joined}"
        );
        let without =
            args(&qemu_command(&image, &config, Ram::Private, &[], &agent, &qmp, &console, &[], None, false))
                .join(" ");
        assert!(!without.contains("force-legacy") && !without.contains("vhost-user"), "{without}");
        assert!(without.contains("memory-backend-ram,id=pvisor.ram,size=256M"), "{without}");
    }

    /// A machine config as checkpoints saved before the CPU model and the
    /// PIT were recorded have it.
    fn config_before_the_choices() -> MachineConfig {
        serde_json::from_str(r#"{"memory_mib": 256, "cpus": 1, "accelerator": "tcg", "ram": "named"}"#)
            .unwrap()
    }

    /// The value after `flag` on the QEMU command line of a machine of `config`.
    fn flag_value(config: &MachineConfig, ram: Ram<'_>, flag: &str) -> Option<String> {
        let image = GuestImage::for_tests();
        let (agent, _a) = UnixStream::pair().unwrap();
        let (qmp, _q) = UnixStream::pair().unwrap();
        let (console, _c) = UnixStream::pair().unwrap();
        let args = args(&qemu_command(&image, config, ram, &[], &agent, &qmp, &console, &[], None, false));
        args.iter().position(|a| a == flag).map(|i| args[i + 1].clone())
    }

    /// A fresh machine has no PIT; one restored from a checkpoint saved
    /// before the choice was recorded keeps it, or its saved state would
    /// name a device the restored QEMU lacks.
    #[test]
    fn a_machine_has_a_pit_exactly_when_its_config_names_one() {
        let old = config_before_the_choices();
        assert_eq!(old.pit, Pit::On);
        let machine = |config: &MachineConfig, ram| flag_value(config, ram, "-machine").unwrap();
        assert_eq!(machine(&old, Ram::Private), "microvm,memory-backend=pvisor.ram");
        assert_eq!(machine(&old, Ram::Legacy), "microvm");
        let fresh = MachineConfig { pit: Pit::Off, ..old };
        assert_eq!(machine(&fresh, Ram::Private), "microvm,pit=off,memory-backend=pvisor.ram");
        assert_eq!(machine(&fresh, Ram::Legacy), "microvm,pit=off");
    }

    /// A TCG guest of a fresh start emulates `-cpu max`; one restored from
    /// a checkpoint saved before the model was recorded keeps QEMU's
    /// default, as it was saved with; KVM always has the host's.
    #[test]
    fn a_tcg_guest_gets_the_cpu_model_its_machine_config_names() {
        let old = config_before_the_choices();
        assert_eq!(old.cpu, CpuModel::Default);
        let cpu = |config: &MachineConfig| flag_value(config, Ram::Private, "-cpu");
        assert_eq!(cpu(&old), None);
        assert_eq!(cpu(&MachineConfig { cpu: CpuModel::Max, ..old }).as_deref(), Some("max"));
        let kvm = MachineConfig { cpu: CpuModel::Max, accelerator: Accelerator::Kvm, ..old };
        assert_eq!(cpu(&kvm).as_deref(), Some("host"));
    }
}
