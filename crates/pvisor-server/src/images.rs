//! Sandbox root filesystems by name: `pvisor image import NAME SRC`,
//! `pvisor image ls`, and the built-in images `default` (sh, bash,
//! coreutils, setpriv) and `python` (python3, pip, venv, git, curl), built
//! from Debian packages by `scripts/sandbox-image.sh`. `default` is imported
//! when the daemon starts; `python` (ten times larger) when a sandbox first
//! asks for it.
//!
//! Layout: `$PVISOR_HOME/sandbox-images/<blake3(name)[..16]>/` holds
//! `rootfs/` and `image.json`. An import is built in a `.partial-*`
//! directory and renamed into place, so a half-imported image never exists.
//! A sandbox boots its image's rootfs as the read-only lower layer of its VM.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use pvisor_core::time::Timestamp;

/// The image a create without one names.
pub const DEFAULT: &str = "default";

/// The built-in images: name, the directory `scripts/sandbox-image.sh`
/// builds it in (found like every shipped asset, `pvisor_core::assets`), and
/// the variable that names its rootfs instead.
pub const BUILT_IN: [(&str, &str, &str); 2] = [
    (DEFAULT, "sandbox-image", "PVISOR_SANDBOX_IMAGE"),
    ("python", "sandbox-image-python", "PVISOR_SANDBOX_IMAGE_PYTHON"),
];

/// The built-in images built on this host (name → rootfs):
/// `PVISOR_SANDBOX_IMAGE` (`PVISOR_SANDBOX_IMAGE_PYTHON`) overrides where
/// `default` (`python`) is built.
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

    fn slot(&self, name: &str) -> PathBuf {
        self.dir.join(&blake3::hash(name.as_bytes()).to_hex()[..16])
    }

    /// The rootfs of `name`, if imported.
    pub fn rootfs(&self, name: &str) -> Option<PathBuf> {
        let slot = self.slot(name);
        slot.join("image.json").is_file().then(|| slot.join("rootfs"))
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
            let kind = if meta.is_dir() && source.join("oci-layout").is_file() {
                import_oci(source, &rootfs)?;
                "oci-layout"
            } else if meta.is_dir() {
                copy_tree(source, &rootfs)?;
                "dir"
            } else {
                unpack(source, &rootfs)?;
                "tar"
            };
            if !rootfs.join("bin/sh").exists() && !rootfs.join("usr/bin/sh").exists() {
                return Err(err(format!(
                    "{} has no /bin/sh; sandboxes run commands through sh -c, so import a root filesystem with a shell",
                    source.display()
                )));
            }
            let (files, bytes) = tree_size(&rootfs);
            let record = ImageRecord {
                name: name.to_owned(),
                source: source.display().to_string(),
                kind: kind.into(),
                imported_at: Timestamp::now(),
                files,
                bytes,
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

/// Unpacks a tar archive (plain, or compressed as `tar` recognises); the tar
/// crate refuses entries that would land outside `dest`.
fn unpack(source: &Path, dest: &Path) -> Result<(), ImageError> {
    let file = fs::File::open(source).map_err(|e| err(format!("cannot open {}: {e}", source.display())))?;
    let mut magic = [0u8; 6];
    let compressed = {
        use std::io::Read;
        let n = (&file).read(&mut magic).unwrap_or(0);
        n >= 2
            && (magic.starts_with(&[0x1f, 0x8b])
                || magic.starts_with(&[0xfd, b'7', b'z', b'X', b'Z'])
                || magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]))
    };
    if compressed {
        return untar_with_tool(source, dest);
    }
    let file = fs::File::open(source).map_err(|e| err(format!("cannot open {}: {e}", source.display())))?;
    let mut archive = tar::Archive::new(file);
    archive.set_preserve_permissions(true);
    archive.set_overwrite(true);
    archive.unpack(dest).map_err(|e| err(format!("{} is not a usable tar archive: {e}", source.display())))
}

fn untar_with_tool(source: &Path, dest: &Path) -> Result<(), ImageError> {
    let status = Command::new("tar")
        .args(["--no-same-owner", "--delay-directory-restore", "-xf"])
        .arg(source)
        .arg("-C")
        .arg(dest)
        .status()
        .map_err(|e| err(format!("cannot run tar: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(err(format!("unpacking {} failed ({status})", source.display())))
    }
}

/// An OCI image layout: `index.json` → the (first linux/amd64 or only)
/// manifest → its layers in order, applying `.wh.` whiteouts.
fn import_oci(layout: &Path, dest: &Path) -> Result<(), ImageError> {
    let read_json = |path: PathBuf| -> Result<serde_json::Value, ImageError> {
        let bytes = fs::read(&path).map_err(|e| err(format!("cannot read {}: {e}", path.display())))?;
        serde_json::from_slice(&bytes).map_err(|e| err(format!("{} is not JSON: {e}", path.display())))
    };
    let blob = |digest: &str| -> Result<PathBuf, ImageError> {
        let (algo, hex) = digest.split_once(':').ok_or_else(|| err(format!("bad digest {digest:?}")))?;
        if !hex.bytes().all(|b| b.is_ascii_hexdigit()) || algo.contains('/') {
            return Err(err(format!("bad digest {digest:?}")));
        }
        Ok(layout.join("blobs").join(algo).join(hex))
    };
    let index = read_json(layout.join("index.json"))?;
    let manifests = index["manifests"].as_array().cloned().unwrap_or_default();
    let mut chosen = manifests
        .iter()
        .find(|m| m["platform"]["architecture"] == "amd64" && m["platform"]["os"] == "linux")
        .or_else(|| manifests.first())
        .cloned()
        .ok_or_else(|| err(format!("{} lists no manifest", layout.join("index.json").display())))?;
    // An index may point at a nested index (multi-platform images).
    for _ in 0..2 {
        let media = chosen["mediaType"].as_str().unwrap_or("");
        if !media.contains("index") {
            break;
        }
        let nested = read_json(blob(chosen["digest"].as_str().unwrap_or(""))?)?;
        let list = nested["manifests"].as_array().cloned().unwrap_or_default();
        chosen = list
            .iter()
            .find(|m| m["platform"]["architecture"] == "amd64" && m["platform"]["os"] == "linux")
            .or_else(|| list.first())
            .cloned()
            .ok_or_else(|| err("a nested image index lists no manifest"))?;
    }
    let manifest = read_json(blob(chosen["digest"].as_str().unwrap_or(""))?)?;
    let layers = manifest["layers"].as_array().cloned().unwrap_or_default();
    if layers.is_empty() {
        return Err(err("the image manifest has no layers"));
    }
    for layer in layers {
        let path = blob(layer["digest"].as_str().unwrap_or(""))?;
        let scratch = dest.with_extension("layer");
        let _ = pvisor_core::tree::remove_tree(&scratch);
        fs::create_dir_all(&scratch).map_err(|e| err(e.to_string()))?;
        untar_with_tool(&path, &scratch)?;
        apply_layer(&scratch, dest).map_err(|e| err(format!("applying layer {}: {e}", path.display())))?;
        let _ = pvisor_core::tree::remove_tree(&scratch);
    }
    Ok(())
}

/// Moves one unpacked layer onto `dest`: `.wh.NAME` deletes NAME,
/// `.wh..wh..opq` empties the directory first. A layer is untrusted input
/// that chooses its own depth, so the walk keeps an explicit stack (no
/// recursion) and removes trees with `pvisor_core::tree::remove_tree`.
fn apply_layer(layer: &Path, dest: &Path) -> io::Result<()> {
    /// A directory being merged: its entries left, and the mode its
    /// destination gets once they are all in.
    struct Level {
        dest: std::path::PathBuf,
        entries: Vec<fs::DirEntry>,
        mode: Option<fs::Permissions>,
    }
    fn enter(layer: &Path, dest: &Path, mode: Option<fs::Permissions>) -> io::Result<Level> {
        if layer.join(".wh..wh..opq").exists() {
            if let Ok(entries) = fs::read_dir(dest) {
                for e in entries.flatten() {
                    remove(&e.path())?;
                }
            }
        }
        let entries = fs::read_dir(layer)?.collect::<Result<Vec<_>, _>>()?;
        Ok(Level { dest: dest.to_owned(), entries, mode })
    }
    fn remove(path: &Path) -> io::Result<()> {
        pvisor_core::tree::remove_tree(path).map_err(|(_, e)| e)
    }
    let mut stack = vec![enter(layer, dest, None)?];
    while let Some(level) = stack.last_mut() {
        let Some(entry) = level.entries.pop() else {
            let done = stack.pop().expect("the stack is not empty");
            if let Some(mode) = done.mode {
                fs::set_permissions(&done.dest, mode)?;
            }
            continue;
        };
        let name = entry.file_name();
        let name_s = name.to_string_lossy();
        if name_s == ".wh..wh..opq" {
            continue;
        }
        if let Some(deleted) = name_s.strip_prefix(".wh.") {
            let _ = remove(&level.dest.join(deleted));
            continue;
        }
        let (from, to) = (entry.path(), level.dest.join(&name));
        let meta = fs::symlink_metadata(&from)?;
        let existing = fs::symlink_metadata(&to).ok();
        if meta.is_dir() && existing.as_ref().is_some_and(|m| m.is_dir()) {
            let next = enter(&from, &to, Some(meta.permissions()))?;
            stack.push(next);
        } else {
            if existing.is_some() {
                remove(&to)?;
            }
            fs::rename(&from, &to)?;
        }
    }
    Ok(())
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
    fn a_layer_merges_whiteouts_and_any_depth_without_recursion() {
        let dir = tempfile::tempdir().unwrap();
        let (layer, dest) = (dir.path().join("layer"), dir.path().join("dest"));
        fs::create_dir_all(dest.join("keep/gone")).unwrap();
        fs::create_dir_all(dest.join("opaque/old")).unwrap();
        fs::write(dest.join("keep/file"), "old").unwrap();
        fs::create_dir_all(layer.join("keep")).unwrap();
        fs::write(layer.join("keep/.wh.gone"), "").unwrap();
        fs::write(layer.join("keep/file"), "new").unwrap();
        fs::create_dir_all(layer.join("opaque")).unwrap();
        fs::write(layer.join("opaque/.wh..wh..opq"), "").unwrap();
        // 1,500 levels merged into 1,500 existing ones: one stack frame per
        // level would overflow the small stack below.
        let chain = "d/".repeat(1500);
        fs::create_dir_all(layer.join(&chain)).unwrap();
        fs::create_dir_all(dest.join(&chain)).unwrap();
        fs::write(layer.join(&chain).join("bottom"), "b").unwrap();
        let (l, d) = (layer.clone(), dest.clone());
        let merged =
            std::thread::Builder::new().stack_size(128 * 1024).spawn(move || apply_layer(&l, &d)).unwrap();
        merged.join().unwrap().unwrap();
        assert_eq!(fs::read_to_string(dest.join("keep/file")).unwrap(), "new");
        assert!(!dest.join("keep/gone").exists() && !dest.join("opaque/old").exists());
        assert_eq!(fs::read_to_string(dest.join(&chain).join("bottom")).unwrap(), "b");
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
}
