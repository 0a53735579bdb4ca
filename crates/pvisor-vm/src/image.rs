//! The guest image (kernel + initramfs built by `scripts/vm-image.sh`), its
//! installation under the state directory by digest, the QEMU command line,
//! and the choice of accelerator.
//!
//! An execution checkpoint is only restorable on the very same kernel and
//! initramfs, so a Run records the image digest and resume/fork boot the
//! installed copy, never whatever the build directory holds by then.

use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use pvisor_sandbox::SandboxError;

pub use pvisor_sandbox::checkpoint::Accelerator;

#[derive(Debug, Deserialize)]
struct ImageManifest {
    format: u32,
    kernel_version: String,
    kernel: FileDigest,
    initramfs: FileDigest,
    cmdline: String,
}

#[derive(Debug, Deserialize)]
struct FileDigest {
    file: String,
    blake3: String,
}

/// A verified guest image.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GuestImage {
    pub dir: PathBuf,
    /// BLAKE3 of `manifest.json`, which names the digests of both files.
    pub digest: String,
    pub kernel_version: String,
    pub cmdline: String,
}

fn image_error(message: String) -> SandboxError {
    SandboxError::Setup {
        step: "vm-image".into(),
        message,
        hint: Some(
            "build the guest image with scripts/vm-image.sh, or install pvisor with scripts/install.sh (or set PVISOR_VM_IMAGE to its directory)".into(),
        ),
    }
}

impl GuestImage {
    /// An image that names no real files, for tests of command lines and keys.
    #[cfg(test)]
    pub(crate) fn for_tests() -> Self {
        Self {
            dir: "/img".into(),
            digest: "d".into(),
            kernel_version: "k".into(),
            cmdline: "console=ttyS0".into(),
        }
    }

    pub fn kernel(&self) -> PathBuf {
        self.dir.join("vmlinux")
    }

    pub fn initramfs(&self) -> PathBuf {
        self.dir.join("initramfs.cpio")
    }

    /// Where the built image is: `$PVISOR_VM_IMAGE`, else the first of the
    /// build tree (`target/vm-image`), the install prefix
    /// (`PREFIX/share/pvisor/vm-image`) and `$XDG_DATA_HOME/pvisor/vm-image`
    /// that holds one (see `pvisor_core::assets`).
    pub fn locate_built() -> Result<PathBuf, SandboxError> {
        if let Some(dir) = std::env::var_os("PVISOR_VM_IMAGE") {
            return Ok(PathBuf::from(dir));
        }
        pvisor_core::assets::locate("vm-image", |d| d.join("manifest.json").is_file()).map_err(|searched| {
            image_error(format!("no guest image found (looked in {})", display_list(&searched)))
        })
    }

    /// Verifies the image at `source` and installs it as `images/<digest>/`
    /// under `state_root` (hard links where possible). Idempotent.
    pub fn install(source: &Path, state_root: &Path) -> Result<Self, SandboxError> {
        let manifest_bytes = fs::read(source.join("manifest.json")).map_err(|e| {
            image_error(format!("cannot read {}: {e}", source.join("manifest.json").display()))
        })?;
        let digest = blake3::hash(&manifest_bytes).to_hex().to_string();
        let installed = state_root.join("images").join(&digest);
        if installed.join("manifest.json").is_file() {
            return Self::open(&installed, &digest, false);
        }
        Self::verify_files(source, &manifest_bytes)?;
        let partial = state_root.join("images").join(format!(".partial-{digest}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&partial);
        let copy = || -> io::Result<()> {
            fs::create_dir_all(&partial)?;
            // The build replaces vmlinux and initramfs.cpio by rename, so links
            // keep these bytes; the manifest is written from what was hashed.
            for name in ["vmlinux", "initramfs.cpio"] {
                if fs::hard_link(source.join(name), partial.join(name)).is_err() {
                    fs::copy(source.join(name), partial.join(name))?;
                    fs::File::open(partial.join(name))?.sync_all()?;
                }
            }
            pvisor_core::store::write_atomic(&partial.join("manifest.json"), &manifest_bytes)
                .map_err(io::Error::other)?;
            // The build may have replaced a file since it was verified.
            Self::verify_files(&partial, &manifest_bytes).map_err(io::Error::other)?;
            match fs::rename(&partial, &installed) {
                // Another process installed it first: same digest, same bytes.
                Err(_) if installed.join("manifest.json").is_file() => {
                    let _ = fs::remove_dir_all(&partial);
                    Ok(())
                }
                other => other,
            }
        };
        copy().map_err(|e| {
            image_error(format!("cannot install the guest image under {}: {e}", installed.display()))
        })?;
        Self::open(&installed, &digest, false)
    }

    /// Opens the installed image `digest`; `verify` re-hashes both files.
    pub fn open_installed(state_root: &Path, digest: &str) -> Result<Self, SandboxError> {
        Self::open(&state_root.join("images").join(digest), digest, true)
    }

    fn open(dir: &Path, digest: &str, verify: bool) -> Result<Self, SandboxError> {
        let bytes = fs::read(dir.join("manifest.json"))
            .map_err(|e| image_error(format!("guest image {digest} is not installed ({e})")))?;
        if blake3::hash(&bytes).to_hex().as_str() != digest {
            return Err(image_error(format!(
                "{} does not match its digest {digest}",
                dir.join("manifest.json").display()
            )));
        }
        let manifest = if verify { Self::verify_files(dir, &bytes)? } else { parse_manifest(&bytes)? };
        Ok(Self {
            dir: dir.to_owned(),
            digest: digest.to_owned(),
            kernel_version: manifest.kernel_version,
            cmdline: manifest.cmdline,
        })
    }

    fn verify_files(dir: &Path, manifest_bytes: &[u8]) -> Result<ImageManifest, SandboxError> {
        let manifest = parse_manifest(manifest_bytes)?;
        for (want_name, file) in [("vmlinux", &manifest.kernel), ("initramfs.cpio", &manifest.initramfs)] {
            let path = dir.join(want_name);
            if file.file != want_name {
                return Err(image_error(format!(
                    "manifest names {} where {want_name} was expected",
                    file.file
                )));
            }
            let got = super::disk::file_digest(&path)
                .map_err(|e| image_error(format!("cannot read {}: {e}", path.display())))?;
            if got != file.blake3 {
                return Err(image_error(format!(
                    "{} is corrupt: BLAKE3 {got}, manifest says {}",
                    path.display(),
                    file.blake3
                )));
            }
        }
        Ok(manifest)
    }
}

fn parse_manifest(bytes: &[u8]) -> Result<ImageManifest, SandboxError> {
    let manifest: ImageManifest = serde_json::from_slice(bytes)
        .map_err(|e| image_error(format!("the image manifest is corrupt: {e}")))?;
    if manifest.format != 1 {
        return Err(image_error(format!("image manifest format {} is not supported", manifest.format)));
    }
    Ok(manifest)
}

fn display_list(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

/// The chosen accelerator and why.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AccelChoice {
    pub accelerator: Accelerator,
    pub reason: String,
}

/// How long a KVM probe boot may take to reach the agent.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// Picks KVM when a short probe boot of `image` under KVM reaches the agent,
/// else TCG. `PVISOR_VM_ACCEL=kvm|tcg` overrides. The probe's verdict is
/// cached per guest kernel, host kernel and KVM module in `/var/tmp/pvisor-<uid>/`.
pub fn choose_accelerator(image: &GuestImage) -> AccelChoice {
    match std::env::var("PVISOR_VM_ACCEL").as_deref() {
        Ok("tcg") => {
            return AccelChoice { accelerator: Accelerator::Tcg, reason: "PVISOR_VM_ACCEL=tcg".into() }
        }
        Ok("kvm") => {
            return AccelChoice { accelerator: Accelerator::Kvm, reason: "PVISOR_VM_ACCEL=kvm".into() }
        }
        _ => {}
    }
    if let Err(e) = fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        let reason = format!("cannot open /dev/kvm ({e}); using TCG software emulation");
        return AccelChoice { accelerator: Accelerator::Tcg, reason };
    }
    let module = ["kvm_intel", "kvm_amd", "kvm_pvm"]
        .into_iter()
        .filter(|m| Path::new("/sys/module").join(m).exists())
        .collect::<Vec<_>>()
        .join("+");
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let uid = rustix::process::geteuid().as_raw();
    // The verdict depends on the guest kernel, not on the agent inside the initramfs.
    let key =
        blake3::hash(format!("{}|{module}|{}", image.kernel_version, release.trim()).as_bytes()).to_hex();
    let cache_dir = PathBuf::from(format!("/var/tmp/pvisor-{uid}"));
    let cache = cache_dir.join(format!("accel-{}.json", &key[..16]));
    // Another user could have made the directory first and planted a verdict:
    // trust it only if it is ours and private.
    let trusted = {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        let _ = fs::DirBuilder::new().mode(0o700).create(&cache_dir);
        let ours = fs::symlink_metadata(&cache_dir).is_ok_and(|m| m.is_dir() && m.uid() == uid);
        ours && fs::set_permissions(&cache_dir, fs::Permissions::from_mode(0o700)).is_ok()
    };
    let cached = || {
        trusted
            .then(|| fs::read(&cache).ok())
            .flatten()
            .and_then(|b| serde_json::from_slice::<AccelChoice>(&b).ok())
    };
    if let Some(choice) = cached() {
        return choice;
    }
    // One probe at a time per host and user; the others wait for its verdict.
    let _probe_lock = trusted
        .then(|| pvisor_core::store::OwnerLock::acquire_blocking(&cache.with_extension("lock")).ok())
        .flatten();
    if let Some(choice) = cached() {
        return choice;
    }
    let choice = match probe_kvm(image) {
        Ok(ms) => AccelChoice {
            accelerator: Accelerator::Kvm,
            reason: format!("a probe boot under KVM ({module}) reached the agent in {ms} ms"),
        },
        Err(why) => AccelChoice {
            accelerator: Accelerator::Tcg,
            reason: format!("/dev/kvm ({module}) failed a probe boot: {why}; using TCG software emulation"),
        },
    };
    if trusted {
        let _ = pvisor_core::store::write_atomic(&cache, &serde_json::to_vec(&choice).unwrap_or_default());
    }
    choice
}

/// Why a probe boot under KVM did not reach the agent.
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    /// Preparing or spawning the probe VM.
    #[error("{0}")]
    Setup(#[from] io::Error),
    #[error("the agent did not answer")]
    NoAnswer,
    #[error("no agent within {secs} s ({why}; console: {last})")]
    NoAgent { secs: u64, why: String, last: String },
}

fn probe_kvm(image: &GuestImage) -> Result<u128, ProbeError> {
    let dir = tempfile_dir()?;
    let (agent, agent_qemu) = UnixStream::pair()?;
    let (_qmp, qmp_qemu) = UnixStream::pair()?;
    let (console_host, console_qemu) = UnixStream::pair()?;
    let console = dir.join("console.log");
    super::qemu::capture_console(console_host, &console)?;
    let config = super::MachineConfig {
        memory_mib: 256,
        cpus: 1,
        accelerator: Accelerator::Kvm,
        ram: super::RamFormat::Named,
        cpu: super::CpuModel::Max,
        pit: super::Pit::Off,
    };
    let mut command = super::qemu::qemu_command(
        image,
        &config,
        super::qemu::Ram::Private,
        &[],
        &agent_qemu,
        &qmp_qemu,
        &console_qemu,
        &[],
        None,
        false,
    );
    let started = Instant::now();
    let mut child = super::qemu::spawn_qemu(
        &mut command,
        &dir.join("qemu.log"),
        &[agent_qemu.as_fd(), qmp_qemu.as_fd(), console_qemu.as_fd()],
    )?;
    drop((agent_qemu, qmp_qemu, console_qemu));
    let mut channel = agent;
    let _ = channel.set_read_timeout(Some(PROBE_TIMEOUT));
    let hello = pvisor_agent_proto::write_frame(
        &mut channel,
        &pvisor_agent_proto::Request::Hello { version: pvisor_agent_proto::VERSION },
        &[],
    )
    .and_then(|()| pvisor_agent_proto::read_frame::<pvisor_agent_proto::Reply>(&mut channel));
    let _ = child.kill();
    let _ = child.wait();
    let result = match hello {
        Ok(Some((pvisor_agent_proto::Reply::Hello { .. }, _))) => Ok(started.elapsed().as_millis()),
        Ok(_) => Err(ProbeError::NoAnswer),
        Err(e) => {
            let tail = fs::read_to_string(&console).unwrap_or_default();
            let last =
                tail.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no console output").to_owned();
            let why =
                if e.kind() == io::ErrorKind::WouldBlock { "timed out".to_owned() } else { e.to_string() };
            Err(ProbeError::NoAgent { secs: PROBE_TIMEOUT.as_secs(), why, last })
        }
    };
    let _ = fs::remove_dir_all(&dir);
    result
}

/// A fresh private directory (`mkdtemp`): a name another user prepared, or a
/// symlink planted there, makes creation fail instead of being used.
fn tempfile_dir() -> io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let random = pvisor_core::random::bytes::<8>()?;
    let name = format!("pvisor-kvm-probe-{}", u64::from_le_bytes(random));
    let dir = std::env::temp_dir().join(name);
    fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}
