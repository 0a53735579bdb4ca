//! A create request's `volumes` (`sandbox-lifecycle.yml`, `Volume`): each
//! becomes a host directory shared with the sandbox's VM live, through
//! virtiofs, as the containerd shim shares a pod's volumes.
//!
//! Boundary: this module decides which host directory a volume names and
//! refuses every one it may not: it never mounts or starts anything (the
//! Job's admission checks each share again, and the vm backend shares it).
//! - `host`: a directory at or below one the operator allowed with
//!   `pvisor serve --volume-root DIR` (none allowed: host volumes are off).
//! - `pvc`: a named volume, a directory of its own under the daemon's
//!   volume directory (`--volume-dir`), made on first use unless
//!   `createIfNotExists` is false, kept across sandboxes.
//! - `subPath` selects a directory below either, which must exist.
//!
//! Every path is walked one component at a time without following a
//! symlink (`lstat`), so neither a `..` nor a symlink a guest left in a
//! shared directory can lead a later volume outside the directory named.
//! `readOnly` shares read-only, enforced on the host (see
//! [`SharedDirectory::read_only`]).

use std::path::{Component, Path, PathBuf};

use pvisor_core::records::SharedDirectory;
use serde::Deserialize;
use serde_json::Value;

use crate::http::ApiError;

/// Where volumes may come from; given to `pvisor serve`.
#[derive(Clone, Debug, Default)]
pub struct VolumeConfig {
    /// Host directories `host` volumes may name (at or below), canonical.
    pub roots: Vec<PathBuf>,
    /// Where named (`pvc`) volumes live, one directory each.
    pub named: PathBuf,
}

/// The spec's `Volume` (`additionalProperties: false`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct VolumeBody {
    name: String,
    host: Option<HostBody>,
    pvc: Option<PvcBody>,
    ossfs: Option<Value>,
    mount_path: String,
    #[serde(default)]
    read_only: bool,
    sub_path: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostBody {
    path: String,
}

/// The spec's `PVC`; provisioning hints a directory has no use for are
/// accepted and ignored, as Docker ignores them.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PvcBody {
    claim_name: String,
    create_if_not_exists: Option<bool>,
    #[allow(dead_code)]
    delete_on_sandbox_termination: Option<bool>,
    #[allow(dead_code)]
    storage_class: Option<Value>,
    #[allow(dead_code)]
    storage: Option<Value>,
    #[allow(dead_code)]
    access_modes: Option<Value>,
}

/// The shares `volumes` ask for, each checked (see the module doc).
pub fn resolve(volumes: Vec<Value>, config: &VolumeConfig) -> Result<Vec<SharedDirectory>, ApiError> {
    if !volumes.is_empty() && !rustix::process::geteuid().is_root() {
        return Err(ApiError::bad_request(
            "volumes are shared with the VM through virtiofsd, which takes root: run pvisor serve as root",
        ));
    }
    checked(volumes, config)
}

/// [`resolve`] but for the daemon's own privilege.
fn checked(volumes: Vec<Value>, config: &VolumeConfig) -> Result<Vec<SharedDirectory>, ApiError> {
    let mut names: Vec<String> = Vec::new();
    let mut out: Vec<SharedDirectory> = Vec::new();
    for value in volumes {
        let body: VolumeBody = serde_json::from_value(value)
            .map_err(|e| ApiError::bad_request(format!("invalid Volume: {e}")))?;
        let name = body.name.clone();
        let bad = |what: String| ApiError::bad_request(format!("volume {name:?}: {what}"));
        if !dns_label(&name, 63) {
            return Err(bad(
                "name must be a DNS label (lowercase letters, digits and '-', at most 63)".into()
            ));
        }
        if names.contains(&name) {
            return Err(bad("name is used twice".into()));
        }
        let target = mount_path(&body.mount_path).map_err(bad)?;
        if out.iter().any(|s| s.target == target) {
            return Err(bad(format!("mountPath {} is used twice", target.display())));
        }
        let base = backend(&body, config).map_err(bad)?;
        let source = match &body.sub_path {
            None => base,
            Some(sub) => below(&base, sub).map_err(bad)?,
        };
        names.push(name);
        out.push(SharedDirectory { source, target, read_only: body.read_only, live_mounts: false });
    }
    Ok(out)
}

/// The directory a volume's one backend names.
fn backend(body: &VolumeBody, config: &VolumeConfig) -> Result<PathBuf, String> {
    match (&body.host, &body.pvc, &body.ossfs) {
        (Some(host), None, None) => host_dir(&host.path, &config.roots),
        (None, Some(pvc), None) => named(pvc, &config.named),
        (None, None, Some(_)) => Err(
            "ossfs volumes are not supported: this host mounts no object storage; use a host or pvc volume"
                .into(),
        ),
        (None, None, None) => Err("names no backend; give exactly one of host or pvc".into()),
        _ => Err("names several backends; give exactly one of host or pvc".into()),
    }
}

/// A `host` volume's directory: absolute, plain, existing, reached through
/// no symlink, at or below an allowed root.
fn host_dir(path: &str, roots: &[PathBuf]) -> Result<PathBuf, String> {
    if roots.is_empty() {
        return Err("host volumes are off on this daemon; its operator allows host directories with `pvisor serve --volume-root DIR`".into());
    }
    let path = Path::new(path);
    if !path.is_absolute() {
        return Err(format!("host.path {} must be absolute", path.display()));
    }
    let root = roots.iter().find(|root| path.starts_with(root)).ok_or_else(|| {
        format!(
            "host.path {} is outside the directories this daemon allows ({})",
            path.display(),
            shown(roots)
        )
    })?;
    let rest = path.strip_prefix(root).unwrap_or(Path::new(""));
    below(root, &rest.to_string_lossy())
}

/// A named volume's directory under `dir`, made on first use unless the
/// request says not to.
fn named(pvc: &PvcBody, dir: &Path) -> Result<PathBuf, String> {
    if !dns_label(&pvc.claim_name, 253) {
        return Err("pvc.claimName must be a DNS label (lowercase letters, digits and '-')".into());
    }
    let volume = dir.join(&pvc.claim_name);
    match std::fs::symlink_metadata(&volume) {
        Ok(meta) if meta.is_dir() => Ok(volume),
        Ok(_) => Err(format!("the named volume {} is not a directory", volume.display())),
        Err(_) if pvc.create_if_not_exists == Some(false) => Err(format!(
            "the named volume {:?} does not exist and createIfNotExists is false",
            pvc.claim_name
        )),
        Err(_) => {
            pvisor_core::store::create_dir_all_private(dir)
                .map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
            match std::fs::create_dir(&volume) {
                Ok(()) => Ok(volume),
                // Two creates at once: the other made it.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && volume.is_dir() => Ok(volume),
                Err(e) => Err(format!("cannot make the named volume {}: {e}", volume.display())),
            }
        }
    }
}

/// `base` joined with the relative `sub`, each component a real directory
/// (never a symlink, never `..`).
fn below(base: &Path, sub: &str) -> Result<PathBuf, String> {
    let mut at = base.to_path_buf();
    for component in Path::new(sub).components() {
        match component {
            Component::Normal(name) => at.push(name),
            Component::CurDir => {}
            _ => return Err(format!("{sub:?} must be a relative path without '..'")),
        }
        match std::fs::symlink_metadata(&at) {
            Ok(meta) if meta.is_dir() => {}
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(format!("{} is a symlink; a volume is reached through none", at.display()))
            }
            Ok(_) => return Err(format!("{} is not a directory", at.display())),
            Err(_) => return Err(format!("{} does not exist; create it first", at.display())),
        }
    }
    Ok(at)
}

/// `mountPath`: absolute and plain, below `/`, in none of the guest's own
/// kernel filesystems.
fn mount_path(path: &str) -> Result<PathBuf, String> {
    let target = PathBuf::from(path);
    let plain = target.is_absolute()
        && target.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && target.components().count() > 1;
    if !plain {
        return Err(format!("mountPath {path:?} must be an absolute path below / without '.' or '..'"));
    }
    if SharedDirectory::in_kernel_filesystem(&target) {
        return Err(format!("mountPath {path:?} is in the guest's own /proc, /dev or /sys"));
    }
    Ok(target)
}

/// A DNS label (RFC 1123) of at most `max` bytes, as the spec's patterns have it.
fn dns_label(s: &str, max: usize) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    !s.is_empty()
        && s.len() <= max
        && edge(s.chars().next())
        && edge(s.chars().last())
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

fn shown(roots: &[PathBuf]) -> String {
    roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path) -> VolumeConfig {
        VolumeConfig { roots: vec![dir.join("allowed")], named: dir.join("named") }
    }

    fn one(config: &VolumeConfig, volume: Value) -> Result<SharedDirectory, String> {
        checked(vec![volume], config).map(|mut v| v.remove(0)).map_err(|e| e.message)
    }

    #[test]
    fn host_volumes_stay_below_an_allowed_root_through_no_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(dir.path());
        std::fs::create_dir_all(dir.path().join("allowed/data/sub")).unwrap();
        std::fs::create_dir_all(dir.path().join("outside")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("outside"), dir.path().join("allowed/link")).unwrap();
        let host = |path: &Path, sub: Option<&str>| serde_json::json!({ "name": "v", "host": { "path": path }, "mountPath": "/mnt/v", "subPath": sub });
        let ok = one(&c, host(&dir.path().join("allowed/data"), Some("sub"))).unwrap();
        assert_eq!(ok.source, dir.path().join("allowed/data/sub"));
        assert_eq!(ok.target, Path::new("/mnt/v"));
        for (path, sub, says) in [
            (dir.path().join("outside"), None, "outside the directories"),
            (dir.path().join("allowed/../outside"), None, "without '..'"),
            (dir.path().join("allowed/link"), None, "symlink"),
            (dir.path().join("allowed/data"), Some("../../outside"), "without '..'"),
            (dir.path().join("allowed/data"), Some("missing"), "does not exist"),
        ] {
            let e = one(&c, host(&path, sub)).unwrap_err();
            assert!(e.contains(says), "{path:?} {sub:?}: {e}");
        }
        let off = VolumeConfig { roots: Vec::new(), ..c.clone() };
        assert!(one(&off, host(&dir.path().join("allowed/data"), None))
            .unwrap_err()
            .contains("--volume-root"));
    }

    #[test]
    fn named_volumes_are_made_on_first_use_unless_told_not_to() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(dir.path());
        let pvc = |claim: &str, create: bool| serde_json::json!({ "name": "p", "pvc": { "claimName": claim, "createIfNotExists": create }, "mountPath": "/data", "readOnly": true });
        assert!(one(&c, pvc("absent", false)).unwrap_err().contains("does not exist"));
        let made = one(&c, pvc("cache", true)).unwrap();
        assert_eq!(made.source, dir.path().join("named/cache"));
        assert!(made.read_only && made.source.is_dir());
        assert!(one(&c, pvc("Bad_Name", true)).unwrap_err().contains("DNS label"));
    }

    #[test]
    fn bad_volumes_say_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(dir.path());
        let cases = [
            (serde_json::json!({ "name": "v", "mountPath": "/a" }), "names no backend"),
            (serde_json::json!({ "name": "v", "ossfs": {}, "mountPath": "/a" }), "ossfs"),
            (
                serde_json::json!({ "name": "v", "pvc": { "claimName": "a" }, "mountPath": "/proc/x" }),
                "/proc",
            ),
            (serde_json::json!({ "name": "v", "pvc": { "claimName": "a" }, "mountPath": "a/b" }), "absolute"),
            (
                serde_json::json!({ "name": "v", "pvc": { "claimName": "a" }, "mountPath": "/a", "x": 1 }),
                "unknown field",
            ),
            (
                serde_json::json!({ "name": "V!", "pvc": { "claimName": "a" }, "mountPath": "/a" }),
                "DNS label",
            ),
        ];
        for (volume, says) in cases {
            let e = one(&c, volume.clone()).unwrap_err();
            assert!(e.contains(says), "{volume}: {e}");
        }
        let twice = vec![
            serde_json::json!({ "name": "a", "pvc": { "claimName": "a" }, "mountPath": "/a" }),
            serde_json::json!({ "name": "b", "pvc": { "claimName": "b" }, "mountPath": "/a" }),
        ];
        assert!(checked(twice, &c).unwrap_err().message.contains("used twice"));
    }
}
