//! VM templates: a saved guest that booted and ran no user code (agent up,
//! no disk mounted, nothing secret in memory), from which a vm Job's first
//! Attempt starts instead of booting a kernel.
//!
//! A template is keyed by everything its saved state depends on
//! ([`TemplateKey`]): the guest image, the machine shape, the accelerator,
//! the QEMU binary and the disk layout. Its RAM is a file the template VM
//! mapped *shared*, so the migration stream skips it (`x-ignore-shared`)
//! and the file holds the pages; each clone maps that file *privately*, so
//! its writes are copy-on-write and idle clones share the template's pages
//! in the host page cache. The workspace disks are not part of a template:
//! a clone attaches its own (same ids, same virtual sizes) and the agent
//! mounts them after the restore.
//!
//! Lifecycle, under `vm-templates/` in the state directory:
//! 1. build under `<id>.lock` (exclusive, non-blocking: one builder per key;
//!    the others boot meanwhile) into `.partial-<id>-<pid>/`;
//! 2. boot, agent `Hello`, `stop`, migrate the device state, `quit`;
//! 3. fsync, write `manifest.json` with BLAKE3 digests, rename into place;
//! 4. a clone holds `<id>.lock` shared from verification until QEMU has
//!    loaded the state, and verifies the manifest, its key and both digests
//!    first; a template that fails is moved aside (`.bad-*`), never restored;
//! 5. `remove`/`gc` take the lock exclusively, so never under a starting clone.

use std::fs;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pvisor_core::store::OwnerLock;
use pvisor_core::time::Timestamp;

use super::checkpoint::digest;
use super::disk::{self, Layout};
use super::qemu::{capture_console, qemu_command, spawn_qemu, tail, Ram};
use super::{qmp, Accelerator, GuestImage, MachineConfig};
pub use pvisor_sandbox::templates::{Swept, TemplateKey, TemplateListing, TemplateManifest};

pub const DIR: &str = "vm-templates";
pub const MEMORY: &str = "memory";
pub const STATE: &str = "state";
pub const MANIFEST: &str = "manifest.json";
/// Bumped whenever what a template saves changes meaning. 2: the machine
/// has no PIT (`MachineConfig::pit`), so a format-1 template's saved state
/// names a device a clone lacks.
const FORMAT: u32 = 2;

/// The key of a template of `image` with the machine `config` and the
/// device list `layout`, on this host.
pub fn key(image: &GuestImage, config: &MachineConfig, layout: Layout) -> TemplateKey {
    TemplateKey {
        format: FORMAT,
        image: image.digest.clone(),
        memory_mib: config.memory_mib,
        cpus: config.cpus,
        accelerator: config.accelerator,
        qemu: super::qemu::binary_identity(),
        disks: layout.description(),
        host_cpu: match config.accelerator {
            Accelerator::Kvm => host_cpu_fingerprint(),
            // The emulated model, which a restore must repeat.
            Accelerator::Tcg => format!("tcg:{}", config.cpu.as_str()),
        },
    }
}

/// Whether a template of `key` can still serve a start: a fresh start of
/// its shape (memory, vCPUs, accelerator, device list), whose machine is
/// `fresh` otherwise, would compute exactly its key. A template of an older
/// format, guest image, QEMU, CPU model or machine can never be restored
/// again: it is stale, and `pvisor gc` removes it.
pub fn is_current(key: &TemplateKey, image: &GuestImage, fresh: MachineConfig) -> bool {
    let config =
        MachineConfig { memory_mib: key.memory_mib, cpus: key.cpus, accelerator: key.accelerator, ..fresh };
    Layout::ALL.into_iter().any(|layout| self::key(image, &config, layout) == *key)
}

/// The first CPU's vendor, model and flags in /proc/cpuinfo and the kernel
/// release, digested: what a KVM guest saved with `-cpu host` depends on.
fn host_cpu_fingerprint() -> String {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let first = cpuinfo.split("\n\n").next().unwrap_or_default();
    let wanted: Vec<&str> = first
        .lines()
        .filter(|l| {
            ["vendor_id", "cpu family", "model", "model name", "stepping", "flags"]
                .iter()
                .any(|k| l.split(':').next().is_some_and(|name| name.trim() == *k))
        })
        .collect();
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let text = format!("{}|{}", wanted.join("\n"), release.trim());
    blake3::hash(text.as_bytes()).to_hex()[..16].to_owned()
}

/// A published, verified template.
#[derive(Clone, Debug)]
pub struct Template {
    pub dir: PathBuf,
    pub manifest: TemplateManifest,
}

impl Template {
    pub fn memory(&self) -> PathBuf {
        self.dir.join(MEMORY)
    }
    pub fn state(&self) -> PathBuf {
        self.dir.join(STATE)
    }
}

/// Why no template could be used.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("the template {0} is being built by another pvisor process")]
    Busy(String),
    /// The template store could not be created or locked.
    #[error("{what}: {source}")]
    Store { what: &'static str, source: pvisor_core::store::StoreError },
    #[error("cannot create the template directory: {0}")]
    CreateDir(#[source] std::io::Error),
    #[error(transparent)]
    Aside(#[from] AsideError),
    #[error(transparent)]
    Verify(#[from] VerifyError),
    #[error("building the vm template {id} failed: {source}")]
    Build { id: String, source: BuildError },
}

/// Why a template is not what its manifest and key say (it is not restored).
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("template {}: {source}", dir.display())]
    Read { dir: PathBuf, source: pvisor_core::store::StoreError },
    #[error("template manifest {} is corrupt: {source}", path.display())]
    Corrupt { path: PathBuf, source: serde_json::Error },
    #[error("template {} was built for other inputs than this start", dir.display())]
    OtherInputs { dir: PathBuf },
    #[error("template {id} does not list its {name}")]
    Unlisted { id: String, name: &'static str },
    #[error("template file {}: {source}", path.display())]
    File { path: PathBuf, source: std::io::Error },
    #[error(
        "template file {} is corrupt: {size} bytes, BLAKE3 {blake3}; the manifest says {listed_size} bytes, {listed_blake3}",
        path.display()
    )]
    Mismatch { path: PathBuf, size: u64, blake3: String, listed_size: u64, listed_blake3: String },
}

/// Why a template could not be moved aside (out of its published name).
#[derive(Debug, thiserror::Error)]
pub enum AsideError {
    #[error("template {0} is in use by another start, so it was left in place")]
    InUse(String),
    #[error("cannot move template {id} aside: {source}")]
    Move { id: String, source: std::io::Error },
}

/// Why a published template could not be opened for a clone.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{0}")]
    Lock(#[source] pvisor_core::store::StoreError),
    /// It failed verification; `aside` says what became of it.
    #[error("{source}; {aside}")]
    Refused { source: VerifyError, aside: String },
}

/// Why `pvisor image templates --remove` did not remove a template.
#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    #[error("{0:?} is not a template id (see `pvisor image templates`)")]
    NotAnId(String),
    #[error("no template {0} (see `pvisor image templates`)")]
    NoSuch(String),
    #[error("template {0} is in use by a starting clone or its builder; try again")]
    InUse(String),
    #[error(transparent)]
    Aside(#[from] AsideError),
    #[error("cannot remove {}: {source}", path.display())]
    Remove { path: PathBuf, source: std::io::Error },
}

/// Why the build of a template failed after its directory was made.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Boot(#[from] BootError),
    /// Digesting a saved file failed.
    #[error("{0}")]
    Digest(#[source] std::io::Error),
    #[error("cannot publish the template: {0}")]
    Publish(#[source] std::io::Error),
}

/// Why the template VM did not boot and save.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("cannot {action} {}: {source}", path.display())]
    File { action: &'static str, path: PathBuf, source: std::io::Error },
    #[error("cannot create placeholder disks: {0}")]
    Placeholders(#[source] std::io::Error),
    #[error(transparent)]
    Disk(#[from] disk::UnknownDisk),
    /// Making the channels to QEMU, or spawning it.
    #[error("{0}")]
    Spawn(#[source] std::io::Error),
    #[error(transparent)]
    Qmp(#[from] qmp::QmpError),
    #[error("the agent answered Hello with {0}")]
    Hello(String),
    #[error("no agent within {secs} s: {source}")]
    NoAgent { secs: u64, source: std::io::Error },
    #[error("cannot create the state file: {0}")]
    StateFile(#[source] std::io::Error),
    #[error(
        "QEMU was killed by SIGBUS writing the template's RAM file: the filesystem of {} has {free_mib} MiB free for a {memory_mib} MiB guest",
        dir.display()
    )]
    Sigbus { dir: PathBuf, free_mib: u64, memory_mib: u64 },
    /// QEMU ended with the build: why, and the tails of its log and console.
    #[error("{source}; qemu: {qemu}; console: {console}")]
    Qemu { source: Box<BootError>, qemu: String, console: String },
    #[error("cannot sync {name}: {source}")]
    Sync { name: &'static str, source: std::io::Error },
}

pub fn root(state_root: &Path) -> PathBuf {
    state_root.join(DIR)
}

fn lock_path(root: &Path, id: &str) -> PathBuf {
    root.join(format!("{id}.lock"))
}

/// Holds a template against removal while a clone starts from it (the
/// shared lock is released on drop).
pub struct InUse {
    _lock: OwnerLock,
}

impl std::fmt::Debug for InUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InUse")
    }
}

/// Opens the published template for `key`, verified, with a shared lock
/// that keeps `remove` away until the caller drops it. `Ok(None)`: none is
/// published. A template that fails verification is moved aside and
/// reported, so the next start rebuilds it.
pub fn open(root: &Path, key: &TemplateKey) -> Result<Option<(Template, InUse)>, OpenError> {
    let id = key.id();
    let dir = root.join(&id);
    if !dir.join(MANIFEST).is_file() {
        return Ok(None);
    }
    let lock = OwnerLock::acquire_shared_blocking(&lock_path(root, &id)).map_err(OpenError::Lock)?;
    if !dir.join(MANIFEST).is_file() {
        return Ok(None); // removed while we waited
    }
    match verify(&dir, key) {
        Ok(manifest) => Ok(Some((Template { dir, manifest }, InUse { _lock: lock }))),
        Err(why) => {
            drop(lock);
            Err(OpenError::Refused { source: why, aside: discarded(discard(root, &id)) })
        }
    }
}

/// Moves a template that failed verification or a restore out of the way
/// (under the exclusive lock, so no clone is starting from it); returns
/// where it went.
pub fn discard(root: &Path, id: &str) -> Result<PathBuf, AsideError> {
    let _lock = OwnerLock::acquire(&lock_path(root, id)).map_err(|_| AsideError::InUse(id.to_owned()))?;
    move_aside(root, id)
}

/// Renames `root/id` to a `.bad-*` name that nothing restores and gc sweeps.
fn move_aside(root: &Path, id: &str) -> Result<PathBuf, AsideError> {
    let bad = root.join(format!(".bad-{id}-{}", Timestamp::now().unix_micros()));
    fs::rename(root.join(id), &bad).map_err(|source| AsideError::Move { id: id.to_owned(), source })?;
    Ok(bad)
}

/// Says where [`discard`] put a template, for an error message.
pub fn discarded(result: Result<PathBuf, AsideError>) -> String {
    match result {
        Ok(path) => format!("it was moved aside to {} and will be rebuilt", path.display()),
        Err(why) => why.to_string(),
    }
}

/// Checks the manifest, that it was built for `key`, and both files' digests.
pub fn verify(dir: &Path, key: &TemplateKey) -> Result<TemplateManifest, VerifyError> {
    let path = dir.join(MANIFEST);
    let bytes = pvisor_core::store::read_capped(&path, 1 << 20)
        .map_err(|source| VerifyError::Read { dir: dir.to_owned(), source })?;
    let manifest: TemplateManifest =
        serde_json::from_slice(&bytes).map_err(|source| VerifyError::Corrupt { path, source })?;
    if &manifest.key != key {
        return Err(VerifyError::OtherInputs { dir: dir.to_owned() });
    }
    for (name, sparse) in [(MEMORY, true), (STATE, false)] {
        let listed = manifest
            .files
            .iter()
            .find(|f| f.name == name)
            .ok_or_else(|| VerifyError::Unlisted { id: manifest.id.clone(), name })?;
        let file = dir.join(name);
        let actual = match digest(&file, sparse) {
            Ok(actual) => actual,
            Err(source) => return Err(VerifyError::File { path: file, source }),
        };
        if actual.size != listed.size || actual.blake3 != listed.blake3 {
            return Err(VerifyError::Mismatch {
                path: file,
                size: actual.size,
                blake3: actual.blake3,
                listed_size: listed.size,
                listed_blake3: listed.blake3.clone(),
            });
        }
    }
    Ok(manifest)
}

/// Builds and publishes the template for `key` (see the module doc). Fails
/// with [`TemplateError::Busy`] at once if another process is building it.
pub fn build(
    root: &Path,
    image: &GuestImage,
    config: &MachineConfig,
    layout: Layout,
) -> Result<Template, TemplateError> {
    let key = key(image, config, layout);
    let id = key.id();
    let store = |what: &'static str| move |source| TemplateError::Store { what, source };
    pvisor_core::store::create_dir_all_private(root).map_err(store("cannot create the template store"))?;
    let _lock = OwnerLock::acquire(&lock_path(root, &id)).map_err(|e| match e {
        pvisor_core::store::StoreError::Io { ref source, .. }
            if source.raw_os_error() == Some(libc::EWOULDBLOCK) =>
        {
            TemplateError::Busy(id.clone())
        }
        other => store("cannot lock the template")(other),
    })?;
    let published = root.join(&id);
    if published.exists() && !published.join(MANIFEST).is_file() {
        // A removal killed half-way: not a template, and in the way of one.
        move_aside(root, &id)?;
    }
    if published.join(MANIFEST).is_file() {
        // Built by another process while we were deciding.
        let manifest = verify(&published, &key)?;
        return Ok(Template { dir: published, manifest });
    }
    // Builders killed mid-way left these; the lock says none is running.
    for entry in fs::read_dir(root).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with(&format!(".partial-{id}-")) {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
    let partial = root.join(format!(".partial-{id}-{}", std::process::id()));
    fs::create_dir_all(&partial).map_err(TemplateError::CreateDir)?;
    let started = Instant::now();
    tracing::info!(%id, memory_mib = config.memory_mib, cpus = config.cpus, "building a vm template");
    let result =
        boot_and_save(&partial, image, config, layout).map_err(BuildError::from).and_then(|boot_ms| {
            pvisor_core::failpoint::hit("template-after-save");
            let manifest = TemplateManifest {
                id: id.clone(),
                key: key.clone(),
                created_at: Timestamp::now(),
                files: vec![
                    digest(&partial.join(MEMORY), true).map_err(BuildError::Digest)?,
                    digest(&partial.join(STATE), false).map_err(BuildError::Digest)?,
                ],
                boot_ms,
                build_ms: started.elapsed().as_millis() as u64,
            };
            super::checkpoint::publish_dir(
                &partial,
                &published,
                &pvisor_core::store::to_json_bytes(&manifest),
            )
            .map_err(BuildError::Publish)?;
            Ok(manifest)
        });
    match result {
        Ok(manifest) => {
            tracing::info!(%id, build_ms = manifest.build_ms, "vm template published");
            Ok(Template { dir: published, manifest })
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&partial);
            Err(TemplateError::Build { id, source: e })
        }
    }
}

/// How long a template boot may take to reach the agent.
fn boot_timeout(accelerator: Accelerator) -> Duration {
    match accelerator {
        Accelerator::Kvm => Duration::from_secs(30),
        Accelerator::Tcg => Duration::from_secs(120),
    }
}

/// Boots a guest with its RAM in `dir/memory`, waits for the agent, stops
/// it and saves its device state to `dir/state`. Returns the boot time.
fn boot_and_save(
    dir: &Path,
    image: &GuestImage,
    config: &MachineConfig,
    layout: Layout,
) -> Result<u64, BootError> {
    let memory = dir.join(MEMORY);
    let file_error = |action, source| BootError::File { action, path: memory.clone(), source };
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&memory)
        .map_err(|e| file_error("create", e))?;
    file.set_len(config.memory_mib << 20).map_err(|e| file_error("size", e))?;
    drop(file);
    // Blank disks with the clones' ids and sizes: the guest probes them at
    // boot, and a clone attaches its own in their place.
    let placeholders = layout.placeholder_disks(dir).map_err(BootError::Placeholders)?;
    let disks: Vec<disk::Disk<'_>> =
        placeholders.iter().map(|p| disk::Disk::of(p)).collect::<Result<_, _>>()?;
    let (mut agent, agent_qemu) = UnixStream::pair().map_err(BootError::Spawn)?;
    let (qmp_host, qmp_qemu) = UnixStream::pair().map_err(BootError::Spawn)?;
    let (console_host, console_qemu) = UnixStream::pair().map_err(BootError::Spawn)?;
    let console = dir.join("console.log");
    capture_console(console_host, &console).map_err(BootError::Spawn)?;
    let mut command = qemu_command(
        image,
        config,
        Ram::TemplateSource(&memory),
        &disks,
        &agent_qemu,
        &qmp_qemu,
        &console_qemu,
        &[],
        None,
        false,
    );
    let started = Instant::now();
    let log = dir.join("qemu.log");
    let mut child =
        spawn_qemu(&mut command, &log, &[agent_qemu.as_fd(), qmp_qemu.as_fd(), console_qemu.as_fd()])
            .map_err(BootError::Spawn)?;
    drop((agent_qemu, qmp_qemu, console_qemu));
    let timeout = boot_timeout(config.accelerator);
    let saved = (|| -> Result<u64, BootError> {
        let mut qmp = qmp::Qmp::connect(qmp_host, timeout)?;
        agent.set_read_timeout(Some(timeout)).map_err(BootError::Spawn)?;
        let hello = pvisor_agent_proto::Request::Hello { version: pvisor_agent_proto::VERSION };
        pvisor_agent_proto::write_frame(&mut agent, &hello, &[]).map_err(BootError::Spawn)?;
        match pvisor_agent_proto::read_frame::<pvisor_agent_proto::Reply>(&mut agent) {
            Ok(Some((pvisor_agent_proto::Reply::Hello { version, .. }, _)))
                if version == pvisor_agent_proto::VERSION => {}
            Ok(other) => return Err(BootError::Hello(format!("{other:?}"))),
            Err(source) => return Err(BootError::NoAgent { secs: timeout.as_secs(), source }),
        }
        let boot_ms = started.elapsed().as_millis() as u64;
        qmp.execute::<qmp::Empty>(&qmp::Command::Stop)?;
        let state = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dir.join(STATE))
            .map_err(BootError::StateFile)?;
        qmp::migrate_to_file(&mut qmp, state, true, Duration::from_secs(120))?;
        let _ = qmp.execute::<qmp::Empty>(&qmp::Command::Quit);
        Ok(boot_ms)
    })();
    let _ = child.kill();
    let status = child.wait().ok();
    let boot_ms = saved.map_err(|e| {
        use std::os::unix::process::ExitStatusExt;
        // QEMU backs the guest's RAM with the file: a page the filesystem
        // cannot allocate is a SIGBUS, not an error QEMU could report.
        let why = if status.and_then(|s| s.signal()) == Some(libc::SIGBUS) {
            BootError::Sigbus { dir: dir.to_owned(), free_mib: free_mib(dir), memory_mib: config.memory_mib }
        } else {
            e
        };
        BootError::Qemu { source: Box::new(why), qemu: tail(&log, 3), console: tail(&console, 3) }
    })?;
    for path in &placeholders {
        let _ = fs::remove_file(path);
    }
    for name in [MEMORY, STATE] {
        fs::File::open(dir.join(name))
            .and_then(|f| f.sync_all())
            .map_err(|source| BootError::Sync { name, source })?;
    }
    Ok(boot_ms)
}

fn free_mib(dir: &Path) -> u64 {
    rustix::fs::statvfs(dir).map_or(0, |s| (s.f_bavail * s.f_frsize) >> 20)
}

/// Every published template under `root`, with `current` telling which keys are still current.
pub fn list(root: &Path, current: &dyn Fn(&TemplateKey) -> bool) -> Vec<TemplateListing> {
    let mut out: Vec<TemplateListing> = fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("tpl-") && e.path().is_dir())
        .map(|e| {
            let dir = e.path();
            let manifest = pvisor_core::store::read_capped(&dir.join(MANIFEST), 1 << 20)
                .ok()
                .and_then(|b| serde_json::from_slice::<TemplateManifest>(&b).ok());
            TemplateListing {
                id: e.file_name().to_string_lossy().into_owned(),
                bytes: disk::allocated_bytes(&dir),
                stale: manifest.as_ref().is_none_or(|m| !current(&m.key)),
                dir,
                manifest,
            }
        })
        .collect();
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

/// Removes template `id` unless a clone is starting from it; also what
/// failed verification or a killed builder left behind.
pub fn remove(root: &Path, id: &str) -> Result<u64, RemoveError> {
    if !id.starts_with("tpl-") || id.contains('/') {
        return Err(RemoveError::NotAnId(id.to_owned()));
    }
    let dir = root.join(id);
    if !dir.is_dir() {
        return Err(RemoveError::NoSuch(id.to_owned()));
    }
    let _lock = OwnerLock::acquire(&lock_path(root, id)).map_err(|_| RemoveError::InUse(id.to_owned()))?;
    let bytes = disk::allocated_bytes(&dir);
    // Out of the published name first: a removal killed half-way leaves a
    // `.bad-*` for gc, never a half-deleted template under its id.
    let aside = move_aside(root, id)?;
    fs::remove_dir_all(&aside).map_err(|source| RemoveError::Remove { path: aside.clone(), source })?;
    Ok(bytes)
}

/// Removes leftovers nothing can use: `.bad-*` (failed verification) and
/// `.partial-*` whose builder is gone (its lock is free).
pub fn sweep(root: &Path, dry_run: bool) -> Vec<Swept> {
    let mut swept = Vec::new();
    for entry in fs::read_dir(root).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        // Held across the removal, so no builder of that id starts meanwhile.
        let (what, _lock) = if name.starts_with(".bad-") {
            ("vm template that failed verification or was being removed", None)
        } else if let Some(rest) = name.strip_prefix(".partial-") {
            let id = rest.rsplit_once('-').map_or(rest, |(id, _)| id);
            let Ok(lock) = OwnerLock::acquire(&lock_path(root, id)) else {
                continue; // its builder is still at work
            };
            ("partial vm template of a builder that did not finish", Some(lock))
        } else {
            continue;
        };
        let path = entry.path();
        let bytes = disk::allocated_bytes(&path);
        if dry_run || fs::remove_dir_all(&path).is_ok() {
            swept.push(Swept { what: what.into(), path, bytes });
        }
    }
    swept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> TemplateKey {
        TemplateKey {
            format: FORMAT,
            image: "img".into(),
            memory_mib: 512,
            cpus: 1,
            accelerator: Accelerator::Tcg,
            qemu: "q".into(),
            disks: "d".into(),
            host_cpu: "tcg".into(),
        }
    }

    #[test]
    fn every_input_changes_the_id() {
        let base = key().id();
        let mut k = key();
        k.image = "other".into();
        assert_ne!(k.id(), base);
        let mut k = key();
        k.memory_mib = 1024;
        assert_ne!(k.id(), base);
        let mut k = key();
        k.qemu = "newer".into();
        assert_ne!(k.id(), base);
        let mut k = key();
        k.host_cpu = "another host CPU".into();
        assert_ne!(k.id(), base);
        assert_eq!(key().id(), base);
    }

    /// A template is current exactly when a fresh start of its shape would
    /// compute its key: one of an older format (saved with a PIT), CPU
    /// model or guest image is stale, so gc removes it.
    #[test]
    fn a_template_of_an_older_format_cpu_model_or_image_is_stale() {
        let image = GuestImage::for_tests();
        let fresh = MachineConfig {
            memory_mib: 512,
            cpus: 1,
            accelerator: Accelerator::Tcg,
            ram: crate::RamFormat::Named,
            cpu: crate::CpuModel::Max,
            pit: crate::Pit::Off,
        };
        let serve_shape = MachineConfig { memory_mib: 2048, cpus: 2, ..fresh };
        for layout in Layout::ALL {
            let current = super::key(&image, &serve_shape, layout);
            assert!(is_current(&current, &image, fresh));
            assert!(!is_current(&TemplateKey { format: 1, ..current.clone() }, &image, fresh));
            assert!(!is_current(
                &TemplateKey { host_cpu: "tcg:default".into(), ..current.clone() },
                &image,
                fresh
            ));
            assert!(!is_current(&TemplateKey { image: "older".into(), ..current.clone() }, &image, fresh));
            assert!(!is_current(&TemplateKey { disks: "other".into(), ..current }, &image, fresh));
        }
    }

    fn publish_fake(root: &Path, key: &TemplateKey) -> PathBuf {
        let dir = root.join(key.id());
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(MEMORY), vec![7u8; 8192]).unwrap();
        fs::write(dir.join(STATE), b"device state").unwrap();
        let manifest = TemplateManifest {
            id: key.id(),
            key: key.clone(),
            created_at: Timestamp::now(),
            files: vec![digest(&dir.join(MEMORY), true).unwrap(), digest(&dir.join(STATE), false).unwrap()],
            boot_ms: 1,
            build_ms: 1,
        };
        fs::write(dir.join(MANIFEST), serde_json::to_vec(&manifest).unwrap()).unwrap();
        dir
    }

    #[test]
    fn a_corrupt_template_is_moved_aside_never_opened() {
        let root = tempfile::tempdir().unwrap();
        let dir = publish_fake(root.path(), &key());
        assert!(open(root.path(), &key()).unwrap().is_some());
        // One flipped byte in the RAM file.
        std::os::unix::fs::FileExt::write_at(
            &fs::OpenOptions::new().write(true).open(dir.join(MEMORY)).unwrap(),
            b"x",
            100,
        )
        .unwrap();
        let err = open(root.path(), &key()).expect_err("a corrupt template must not open").to_string();
        assert!(err.contains("corrupt") && err.contains("rebuilt"), "{err}");
        assert!(!dir.exists(), "the corrupt template must be moved aside");
        assert!(open(root.path(), &key()).unwrap().is_none());
        assert_eq!(sweep(root.path(), false).len(), 1, "the moved-aside copy is swept");
    }

    #[test]
    fn a_template_for_other_inputs_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = publish_fake(root.path(), &key());
        let mut other = key();
        other.image = "newer image".into();
        assert!(verify(&dir, &other).unwrap_err().to_string().contains("other inputs"));
    }

    #[test]
    fn remove_waits_for_no_clone_and_names_bad_ids() {
        let root = tempfile::tempdir().unwrap();
        publish_fake(root.path(), &key());
        let (_template, in_use) = open(root.path(), &key()).unwrap().unwrap();
        assert!(remove(root.path(), &key().id()).unwrap_err().to_string().contains("in use"));
        drop(in_use);
        assert!(remove(root.path(), &key().id()).unwrap() > 0);
        assert!(remove(root.path(), "../etc").unwrap_err().to_string().contains("not a template id"));
    }
}
