//! Sandbox root filesystems by name: `pvisor image import NAME SRC`,
//! `pvisor image ls`, and the built-in images `default` (sh, bash,
//! coreutils, setpriv), `python` (python3, pip, venv, git, curl) and
//! `code-interpreter` (python's, plus a JDK, Go, node and TypeScript), built
//! from Debian packages by `scripts/sandbox-image.sh`. `default` is imported
//! when the daemon starts; the larger ones when a sandbox first asks for
//! them.
//!
//! Layout: `$PVISOR_HOME/sandbox-images/<blake3(name)[..16]>/` holds
//! `rootfs/` and `image.json`. An import is built in a `.partial-*`
//! directory and renamed into place, so a half-imported image never exists.
//! A sandbox boots its image's rootfs as the read-only lower layer of its VM.
//!
//! This module names, stores and reads images and unpacks a tar given
//! whole; [`oci`] verifies an OCI layout's blobs and applies its layers.

mod digest;
mod oci;

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::process::Command;

use pvisor_stage::beneath::Root;
use serde::{Deserialize, Serialize};

use crate::layers::{self, Unpacked};

use pvisor_core::time::Timestamp;

/// The image a create without one names.
pub const DEFAULT: &str = "default";

/// The built-in images: name, the directory `scripts/sandbox-image.sh`
/// builds it in (found like every shipped asset, `pvisor_core::assets`), and
/// the variable that names its rootfs instead.
pub const BUILT_IN: [(&str, &str, &str); 3] = [
    (DEFAULT, "sandbox-image", "PVISOR_SANDBOX_IMAGE"),
    ("python", "sandbox-image-python", "PVISOR_SANDBOX_IMAGE_PYTHON"),
    ("code-interpreter", "sandbox-image-code-interpreter", "PVISOR_SANDBOX_IMAGE_CODE_INTERPRETER"),
];

/// The built-in images built on this host (name → rootfs):
/// `PVISOR_SANDBOX_IMAGE` (`_PYTHON`, `_CODE_INTERPRETER`) overrides where
/// `default` (`python`, `code-interpreter`) is built.
pub fn built_in_found() -> Vec<(String, PathBuf)> {
    BUILT_IN
        .iter()
        .filter_map(|(name, asset, variable)| {
            let overridden = std::env::var_os(variable).map(PathBuf::from);
            let rootfs = overridden.or_else(|| {
                pvisor_core::assets::locate(asset, |d| d.join("rootfs/bin/sh").exists())
                    .ok()
                    .map(|d| d.join("rootfs"))
            })?;
            Some((name.to_string(), rootfs))
        })
        .collect()
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ImageRecord {
    pub name: String,
    /// Where it was imported from, and as what (`dir`, `tar`, `oci-layout`).
    pub source: String,
    pub kind: String,
    pub imported_at: Timestamp,
    pub files: u64,
    pub bytes: u64,
    /// What the import did not create on the host (device nodes, FIFOs,
    /// setuid/setgid bits).
    #[serde(default)]
    pub left_out: Unpacked,
    /// The content digest of the rootfs (`blake3:HEX`, see [`digest`]);
    /// absent in records from before it, and then taken at first use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ImageError(pub String);

fn err(message: impl Into<String>) -> ImageError {
    ImageError(message.into())
}

#[derive(Clone, Debug)]
pub struct ImageStore {
    dir: PathBuf,
    /// Built-in images found built on this host: name → built rootfs.
    built_in: Vec<(String, PathBuf)>,
    /// One import of a built-in image at a time (two creates racing).
    importing: std::sync::Arc<std::sync::Mutex<()>>,
}

impl ImageStore {
    pub fn new(store: &pvisor_core::store::Store) -> Self {
        Self { dir: store.sandbox_images_dir(), built_in: Vec::new(), importing: Default::default() }
    }

    /// Knows these built-in images (name → built rootfs).
    pub fn with_built_in(mut self, built_in: Vec<(String, PathBuf)>) -> Self {
        self.built_in = built_in;
        self
    }

    /// The rootfs of `name`: imported already, or a built-in image imported
    /// now (again when its build is newer than the imported copy).
    pub fn rootfs_importing(&self, name: &str) -> Result<Option<PathBuf>, ImageError> {
        if let Some((_, built)) = self.built_in.iter().find(|(n, _)| n == name) {
            let _one = self.importing.lock().unwrap_or_else(|p| p.into_inner());
            self.ensure_built_in(name, built)?;
        }
        Ok(self.rootfs(name))
    }

    /// The imported (or built-in) image `name` as a vm Job's userland:
    /// its rootfs and content digest (taken now, and kept in its record,
    /// for an image imported before digests were). `None`: no such image.
    pub fn userland(&self, name: &str) -> Result<Option<pvisor_core::records::UserlandImage>, ImageError> {
        validate_name(name)?;
        let Some(rootfs) = self.rootfs_importing(name)? else { return Ok(None) };
        let path = self.slot(name).join("image.json");
        let bytes = fs::read(&path).map_err(|e| err(format!("cannot read {}: {e}", path.display())))?;
        let mut record: ImageRecord = serde_json::from_slice(&bytes)
            .map_err(|e| err(format!("{} is corrupt ({e}); re-import that image", path.display())))?;
        let digest = match record.digest.clone() {
            Some(digest) => digest,
            None => {
                let digest = digest::tree_digest(&rootfs)
                    .map_err(|e| err(format!("cannot digest {}: {e}", rootfs.display())))?;
                record.digest = Some(digest.clone());
                pvisor_core::store::write_atomic(&path, &pvisor_core::store::to_json_bytes(&record))
                    .map_err(|e| err(e.to_string()))?;
                digest
            }
        };
        Ok(Some(pvisor_core::records::UserlandImage { name: name.to_owned(), digest, rootfs }))
    }

    fn slot(&self, name: &str) -> PathBuf {
        self.dir.join(&blake3::hash(name.as_bytes()).to_hex()[..16])
    }

    /// The rootfs of `name`, if imported.
    pub fn rootfs(&self, name: &str) -> Option<PathBuf> {
        let slot = self.slot(name);
        slot.join("image.json").is_file().then(|| slot.join("rootfs"))
    }

    /// Every name a create may give: the images imported, and the
    /// built-in ones built on this host (imported at first use), sorted.
    pub fn known_names(&self) -> Vec<String> {
        let imported = self.list().unwrap_or_default().into_iter().map(|r| r.name);
        let built = self.built_in.iter().map(|(name, _)| name.clone());
        let names: std::collections::BTreeSet<String> = imported.chain(built).collect();
        names.into_iter().collect()
    }

    pub fn list(&self) -> Result<Vec<ImageRecord>, ImageError> {
        let mut out = Vec::new();
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(err(format!("cannot read {}: {e}", self.dir.display()))),
        };
        for entry in entries.flatten() {
            let path = entry.path().join("image.json");
            if let Ok(bytes) = fs::read(&path) {
                match serde_json::from_slice::<ImageRecord>(&bytes) {
                    Ok(record) => out.push(record),
                    Err(e) => {
                        return Err(err(format!("{} is corrupt ({e}); re-import that image", path.display())))
                    }
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Imports `source` (a directory, a tar archive, or an OCI image layout
    /// directory) as `name`, replacing an image of that name.
    pub fn import(&self, name: &str, source: &Path) -> Result<ImageRecord, ImageError> {
        validate_name(name)?;
        let meta = fs::metadata(source).map_err(|e| err(format!("cannot read {}: {e}", source.display())))?;
        fs::create_dir_all(&self.dir)
            .map_err(|e| err(format!("cannot create {}: {e}", self.dir.display())))?;
        let partial = self.dir.join(format!(".partial-{}", pvisor_core::ids::new_ulid()));
        let rootfs = partial.join("rootfs");
        fs::create_dir_all(&rootfs).map_err(|e| err(format!("cannot create {}: {e}", rootfs.display())))?;
        let result = (|| {
            let mut left_out = Unpacked::default();
            let kind = if meta.is_dir() && source.join("oci-layout").is_file() {
                oci::import_oci(source, &open_root(&rootfs)?, &mut left_out)?;
                "oci-layout"
            } else if meta.is_dir() {
                copy_tree(source, &rootfs)?;
                "dir"
            } else {
                unpack(source, &open_root(&rootfs)?, &mut left_out)?;
                "tar"
            };
            if !rootfs.join("bin/sh").exists() && !rootfs.join("usr/bin/sh").exists() {
                return Err(err(format!(
                    "{} has no /bin/sh; sandboxes run commands through sh -c, so import a root filesystem with a shell",
                    source.display()
                )));
            }
            let (files, bytes) = tree_size(&rootfs);
            let digest = digest::tree_digest(&rootfs)
                .map_err(|e| err(format!("cannot digest {}: {e}", rootfs.display())))?;
            let record = ImageRecord {
                digest: Some(digest),
                name: name.to_owned(),
                source: source.display().to_string(),
                kind: kind.into(),
                imported_at: Timestamp::now(),
                files,
                bytes,
                left_out,
            };
            pvisor_core::store::write_atomic(
                &partial.join("image.json"),
                &pvisor_core::store::to_json_bytes(&record),
            )
            .map_err(|e| err(e.to_string()))?;
            let slot = self.slot(name);
            if slot.exists() {
                // Sandboxes still running from the old rootfs keep it: their VMs
                // read an ext4 copy made at boot, so the directory can go.
                let old = self.dir.join(format!(".old-{}", pvisor_core::ids::new_ulid()));
                fs::rename(&slot, &old)
                    .map_err(|e| err(format!("cannot replace {}: {e}", slot.display())))?;
                let _ = pvisor_core::tree::remove_tree(&old);
            }
            fs::rename(&partial, &slot)
                .map_err(|e| err(format!("cannot publish {}: {e}", slot.display())))?;
            Ok(record)
        })();
        if result.is_err() {
            let _ = pvisor_core::tree::remove_tree(&partial);
        }
        result
    }

    /// Removes the image `name` (gone already: nothing to do). A sandbox
    /// booted from it keeps running: its VM reads a copy made at boot.
    pub fn remove(&self, name: &str) -> Result<(), ImageError> {
        validate_name(name)?;
        let slot = self.slot(name);
        let old = self.dir.join(format!(".old-{}", pvisor_core::ids::new_ulid()));
        match fs::rename(&slot, &old) {
            Ok(()) => pvisor_core::tree::remove_tree(&old)
                .map_err(|(path, e)| err(format!("cannot remove {}: {e}", path.display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(err(format!("cannot remove {}: {e}", slot.display()))),
        }
    }

    /// Imports the built-in image `name` from `built`
    /// (`target/sandbox-image/rootfs`) when it is missing or older than the build.
    pub fn ensure_built_in(&self, name: &str, built: &Path) -> Result<(), ImageError> {
        let stamp = built.parent().map(|p| p.join("stamp")).and_then(|s| fs::read_to_string(s).ok());
        let current = self.list()?.into_iter().find(|r| r.name == name);
        let want_source = format!("{}#{}", built.display(), stamp.as_deref().unwrap_or("").trim());
        if current.as_ref().is_some_and(|r| r.source == want_source) {
            return Ok(());
        }
        let mut record = self.import(name, built)?;
        record.source = want_source;
        pvisor_core::store::write_atomic(
            &self.slot(name).join("image.json"),
            &pvisor_core::store::to_json_bytes(&record),
        )
        .map_err(|e| err(e.to_string()))?;
        Ok(())
    }
}

/// Why the daemon would not read a file of an image on the host.
#[derive(Debug, thiserror::Error)]
pub enum ImageFileError {
    #[error("the image's /{} is not a regular file (a FIFO, device, socket, directory or symlink); the daemon reads only regular files from an image", rel.display())]
    NotRegular { rel: PathBuf },
    #[error("the image's /{} is over {limit} bytes; the daemon reads at most that", rel.display())]
    TooLarge { rel: PathBuf, limit: u64 },
    #[error("cannot read the image's /{}: {source}", rel.display())]
    Io {
        rel: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Reads the file `rel` of the image at `rootfs` on the host: opened beneath
/// the rootfs (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, the
/// last name with `O_NOFOLLOW | O_NONBLOCK`), checked to be a regular file
/// before and after it is opened, and read only up to `limit` bytes. So a
/// FIFO never blocks a worker, a device never streams, and a symlink never
/// reaches a host file. `None` when the image has no such file.
pub fn read_image_file(rootfs: &Path, rel: &Path, limit: u64) -> Result<Option<Vec<u8>>, ImageFileError> {
    use io::Read;
    let io_err = |source: io::Error| ImageFileError::Io { rel: rel.to_owned(), source };
    let root = pvisor_stage::beneath::Root::open(rootfs).map_err(io_err)?;
    match root.stat(rel).map_err(io_err)? {
        None => return Ok(None),
        Some(st) if st.kind != pvisor_stage::beneath::Kind::File => {
            return Err(ImageFileError::NotRegular { rel: rel.to_owned() })
        }
        Some(_) => {}
    }
    let file = root.open_file(rel).map_err(|e| match e.kind() {
        io::ErrorKind::InvalidInput => ImageFileError::NotRegular { rel: rel.to_owned() },
        _ if e.raw_os_error() == Some(libc::ELOOP) => ImageFileError::NotRegular { rel: rel.to_owned() },
        _ => io_err(e),
    })?;
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes).map_err(io_err)?;
    if bytes.len() as u64 > limit {
        return Err(ImageFileError::TooLarge { rel: rel.to_owned(), limit });
    }
    Ok(Some(bytes))
}

/// Image names as the OpenSandbox `image.uri` spells them: `name[:tag]`,
/// with registry-style slashes. No whitespace or control characters.
pub fn validate_name(name: &str) -> Result<(), ImageError> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-/:@".contains(&b))
        && !name.starts_with(['.', '-', '/']);
    if ok {
        Ok(())
    } else {
        Err(err(format!(
            "{name:?} is not a valid image name (use letters, digits and . _ - / : @, like python:3.11)"
        )))
    }
}

fn open_root(dir: &Path) -> Result<Root, ImageError> {
    Root::open(dir).map_err(|e| err(format!("cannot open {}: {e}", dir.display())))
}

fn copy_tree(source: &Path, dest: &Path) -> Result<(), ImageError> {
    let mut from = source.as_os_str().to_owned();
    from.push("/.");
    let status = Command::new("cp")
        .args(["-a", "--reflink=auto", "--"])
        .arg(&from)
        .arg(dest)
        .status()
        .map_err(|e| err(format!("cannot run cp: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(err(format!("copying {} failed ({status})", source.display())))
    }
}

/// How a tar archive is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compression {
    None,
    Gzip,
}

/// Reads `file` as a tar archive in `compression`.
fn decompressed<'a>(file: impl Read + 'a, compression: Compression) -> Box<dyn Read + 'a> {
    match compression {
        Compression::None => Box::new(file),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(file)),
    }
}

/// A tar archive given whole (plain or gzip): unpacked by [`crate::layers`],
/// the same code as every OCI layer.
fn unpack(source: &Path, dest: &Root, report: &mut Unpacked) -> Result<(), ImageError> {
    let open = || fs::File::open(source).map_err(|e| err(format!("cannot open {}: {e}", source.display())));
    let mut magic = [0u8; 6];
    let n = open()?.read(&mut magic).unwrap_or(0);
    let compression = if n >= 2 && magic.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if magic.starts_with(&[0xfd, b'7', b'z', b'X', b'Z'])
        || magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd])
    {
        return Err(err(format!(
            "{} is xz or zstd compressed; decompress it (or gzip it) and import the result",
            source.display()
        )));
    } else {
        Compression::None
    };
    layers::extract(dest, decompressed(open()?, compression), report)
        .map_err(|e| err(format!("{} cannot be imported: {e}", source.display())))
}

fn tree_size(root: &Path) -> (u64, u64) {
    let (mut files, mut bytes) = (0, 0);
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            files += 1;
            if meta.is_dir() {
                stack.push(e.path());
            } else {
                bytes += meta.len();
            }
        }
    }
    (files, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_whites_out_trees_of_any_depth_without_recursion() {
        use crate::layers::tests::{archive, E};
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("dest");
        // 1,500 levels: one stack frame per level would overflow the small
        // stack below.
        let chain = "d/".repeat(1500);
        fs::create_dir_all(dest.join("gone").join(&chain)).unwrap();
        fs::create_dir_all(dest.join("opaque/old").join(&chain)).unwrap();
        fs::write(dest.join("keep"), "k").unwrap();
        let layer = archive(&[
            E::File(".wh.gone", b"", 0o644),
            E::Dir("opaque"),
            E::File("opaque/.wh..wh..opq", b"", 0o644),
        ]);
        let d = dest.clone();
        let applied = std::thread::Builder::new()
            .stack_size(128 * 1024)
            .spawn(move || layers::apply_whiteouts(&Root::open(&d).unwrap(), &layer[..]))
            .unwrap();
        applied.join().unwrap().unwrap();
        assert!(!dest.join("gone").exists() && !dest.join("opaque/old").exists());
        assert!(dest.join("opaque").is_dir() && dest.join("keep").is_file());
    }

    #[test]
    fn imports_a_directory_and_a_tar_and_refuses_one_without_a_shell() {
        let home = tempfile::tempdir().unwrap();
        let store = ImageStore::new(&pvisor_core::store::Store::open(home.path().join("state")).unwrap());
        let src = home.path().join("src");
        fs::create_dir_all(src.join("bin")).unwrap();
        fs::write(src.join("bin/sh"), b"#!fake").unwrap();
        let record = store.import("app:1", &src).unwrap();
        assert_eq!((record.kind.as_str(), record.files), ("dir", 2));
        assert!(store.rootfs("app:1").unwrap().join("bin/sh").is_file());

        let tarball = home.path().join("img.tar");
        let mut builder = tar::Builder::new(fs::File::create(&tarball).unwrap());
        builder.append_dir_all(".", &src).unwrap();
        builder.finish().unwrap();
        drop(builder);
        assert_eq!(store.import("app:2", &tarball).unwrap().kind, "tar");

        let empty = home.path().join("empty");
        fs::create_dir_all(&empty).unwrap();
        let e = store.import("bad", &empty).unwrap_err();
        assert!(e.0.contains("no /bin/sh"), "{e}");
        assert!(store.rootfs("bad").is_none());
        let names: Vec<_> = store.list().unwrap().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["app:1", "app:2"]);
        assert!(validate_name("a b").is_err());
        assert!(validate_name("../x").is_err());
    }

    /// A vm run's userland names the import's rootfs and content digest;
    /// a record from before digests gets one at first use, kept; no such
    /// image is `None`.
    #[test]
    fn a_userland_is_an_imports_rootfs_and_digest() {
        let home = tempfile::tempdir().unwrap();
        let store = ImageStore::new(&pvisor_core::store::Store::open(home.path().join("state")).unwrap());
        let src = home.path().join("src");
        fs::create_dir_all(src.join("bin")).unwrap();
        fs::write(src.join("bin/sh"), b"#!fake").unwrap();
        let record = store.import("app", &src).unwrap();
        let digest = record.digest.clone().unwrap();
        assert_eq!(digest, digest::tree_digest(&src).unwrap(), "the import's digest is its tree's");
        let userland = store.userland("app").unwrap().unwrap();
        assert_eq!(
            (userland.digest.as_str(), userland.rootfs),
            (digest.as_str(), store.rootfs("app").unwrap())
        );

        let path = store.slot("app").join("image.json");
        let mut old: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        old.as_object_mut().unwrap().remove("digest");
        fs::write(&path, serde_json::to_vec(&old).unwrap()).unwrap();
        assert_eq!(store.userland("app").unwrap().unwrap().digest, digest);
        assert_eq!(store.list().unwrap()[0].digest.as_deref(), Some(digest.as_str()), "kept in the record");
        assert!(store.userland("none").unwrap().is_none());
    }

    #[test]
    fn image_files_are_read_only_when_regular_beneath_the_root_and_bounded() {
        let root = tempfile::tempdir().unwrap();
        let etc = root.path().join("etc");
        fs::create_dir_all(&etc).unwrap();
        fs::write(etc.join("passwd"), b"root:x:0:0::/root:/bin/sh\n").unwrap();
        let read = |rel: &str| read_image_file(root.path(), Path::new(rel), 64);
        assert_eq!(read("etc/passwd").unwrap().unwrap(), b"root:x:0:0::/root:/bin/sh\n");
        assert!(read("etc/missing").unwrap().is_none());
        // A FIFO would block the reading thread forever: refused at once.
        rustix::fs::mknodat(
            rustix::fs::CWD,
            etc.join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let started = std::time::Instant::now();
        assert!(matches!(read("etc/fifo"), Err(ImageFileError::NotRegular { .. })));
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        // A link to a device (or any host file) is never followed.
        std::os::unix::fs::symlink("/dev/zero", etc.join("zero")).unwrap();
        assert!(matches!(read("etc/zero"), Err(ImageFileError::NotRegular { .. })));
        std::os::unix::fs::symlink("/etc", root.path().join("host-etc")).unwrap();
        assert!(read("host-etc/passwd").unwrap().is_none(), "a symlinked directory is not walked");
        fs::write(etc.join("big"), vec![b'x'; 65]).unwrap();
        assert!(matches!(read("etc/big"), Err(ImageFileError::TooLarge { limit: 64, .. })));
    }

    /// Writes `bytes` as a blob of `layout`; returns its descriptor.
    fn blob(layout: &Path, media: &str, bytes: &[u8]) -> serde_json::Value {
        use sha2::Digest;
        let hex: String = sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect();
        fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
        fs::write(layout.join("blobs/sha256").join(&hex), bytes).unwrap();
        serde_json::json!({ "mediaType": media, "digest": format!("sha256:{hex}"), "size": bytes.len() })
    }

    /// An OCI layout of `layers` (gzip), its index naming the manifest.
    fn layout(dir: &Path, layers: &[Vec<u8>]) -> Vec<serde_json::Value> {
        use std::io::Write;
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        let config = blob(
            dir,
            "application/vnd.oci.image.config.v1+json",
            br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#,
        );
        let descriptors: Vec<_> = layers
            .iter()
            .map(|tar| {
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                gz.write_all(tar).unwrap();
                blob(dir, "application/vnd.oci.image.layer.v1.tar+gzip", &gz.finish().unwrap())
            })
            .collect();
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config,
            "layers": descriptors,
        });
        let manifest =
            blob(dir, "application/vnd.oci.image.manifest.v1+json", manifest.to_string().as_bytes());
        let index = serde_json::json!({ "schemaVersion": 2, "manifests": [manifest] });
        fs::write(dir.join("index.json"), index.to_string()).unwrap();
        descriptors
    }

    /// Descriptors whose digest names a path (`sha256:../../x`), and an
    /// oversized config: refused before any host file outside the layout
    /// (or more than the JSON limit) is read.
    #[test]
    fn an_oci_layout_cannot_name_a_blob_outside_itself_or_an_enormous_config() {
        let home = tempfile::tempdir().unwrap();
        let store = ImageStore::new(&pvisor_core::store::Store::open(home.path().join("state")).unwrap());
        let secret = home.path().join("x");
        fs::write(&secret, br#"{"schemaVersion":2,"manifests":[]}"#).unwrap();
        let dir = home.path().join("lay/out");
        layout(&dir, &[crate::layers::tests::archive(&[])]);
        for digest in ["sha256:../../x", "sha256:../../../x", "sha256:/etc/passwd"] {
            let index = serde_json::json!({ "schemaVersion": 2, "manifests": [{
                "mediaType": "application/vnd.oci.image.index.v1+json", "digest": digest, "size": 34 }] });
            fs::write(dir.join("index.json"), index.to_string()).unwrap();
            let e = store.import("evil", &dir).unwrap_err();
            assert!(!e.0.contains("schemaVersion"), "{digest}: {e}");
            assert!(store.rootfs("evil").is_none(), "{digest}");
        }
        let hex = "0".repeat(64);
        let manifest = serde_json::json!({ "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{hex}"), "size": 1u64 << 40 },
            "layers": [] });
        let m = blob(&dir, "application/vnd.oci.image.manifest.v1+json", manifest.to_string().as_bytes());
        fs::write(
            dir.join("index.json"),
            serde_json::json!({ "schemaVersion": 2, "manifests": [m] }).to_string(),
        )
        .unwrap();
        let e = store.import("evil", &dir).unwrap_err();
        assert!(e.0.contains("is over"), "{e}");
    }

    #[test]
    fn an_oci_import_verifies_every_blob_and_applies_whiteouts() {
        use crate::layers::tests::{archive, E};
        let home = tempfile::tempdir().unwrap();
        let store = ImageStore::new(&pvisor_core::store::Store::open(home.path().join("state")).unwrap());
        let base = archive(&[E::Dir("bin"), E::File("bin/sh", b"sh", 0o755), E::File("gone", b"x", 0o644)]);
        let top = archive(&[E::File(".wh.gone", b"", 0o644), E::File("bin/su", b"su", 0o4755)]);
        let good = home.path().join("good");
        layout(&good, &[base.clone(), top.clone()]);
        let record = store.import("ok", &good).unwrap();
        assert_eq!(record.kind, "oci-layout");
        let rootfs = store.rootfs("ok").unwrap();
        assert!(rootfs.join("bin/sh").is_file() && !rootfs.join("gone").exists());
        assert_eq!(record.left_out.setid_bits_dropped, ["bin/su"]);

        // A layer stored under the digest of other bytes: refused, naming the blob.
        let bad = home.path().join("bad");
        let layers = layout(&bad, &[base.clone(), top]);
        let digest = layers[1]["digest"].as_str().unwrap().to_owned();
        let path = bad.join("blobs/sha256").join(digest.trim_start_matches("sha256:"));
        let mut other = fs::read(&path).unwrap();
        let last = other.len() - 1;
        other[last] ^= 0xff;
        fs::write(&path, &other).unwrap();
        let e = store.import("bad", &bad).unwrap_err();
        assert!(e.0.contains(&digest) && e.0.contains("does not match its digest"), "{e}");
        assert!(store.rootfs("bad").is_none(), "nothing of it was published");
        // A size that disagrees with the descriptor.
        fs::write(&path, b"short").unwrap();
        let e = store.import("bad", &bad).unwrap_err();
        assert!(e.0.contains(&digest) && e.0.contains("5 bytes"), "{e}");

        // A manifest whose bytes changed after its digest was taken.
        let index: serde_json::Value =
            serde_json::from_slice(&fs::read(good.join("index.json")).unwrap()).unwrap();
        let manifest =
            index["manifests"][0]["digest"].as_str().unwrap().trim_start_matches("sha256:").to_owned();
        let path = good.join("blobs/sha256").join(&manifest);
        let text = fs::read_to_string(&path).unwrap().replace("schemaVersion\":2", "schemaVersion\": 2");
        let truncated = &text[..text.len() - 1];
        fs::write(&path, format!("{truncated} ")).unwrap();
        let e = store.import("bad", &good).unwrap_err();
        assert!(e.0.contains(&manifest), "{e}");
    }
}
