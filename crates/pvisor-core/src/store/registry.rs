//! The list of a user's pvisor state directories, so every sandbox can hide
//! all of them: one canonical path per line, pruned of the gone, changed
//! under a lock beside it.

use std::ffi::{OsStr, OsString};
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::FlockOperation;

use super::{read_capped, write_atomic};

/// Where a user's pvisor state directories are listed, so every sandbox can
/// hide all of them, not only its own: `$XDG_STATE_HOME/pvisor-state-dirs`,
/// else `$HOME/.local/state/pvisor-state-dirs`.
pub fn state_dirs_registry(xdg_state_home: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    let non_empty = |v: Option<OsString>| v.filter(|s| !s.is_empty()).map(PathBuf::from);
    non_empty(xdg_state_home)
        .or_else(|| non_empty(home).map(|h| h.join(".local/state")))
        .map(|dir| dir.join("pvisor-state-dirs"))
}

/// Adds `root` to the registry (one canonical path per line) unless it is
/// listed already, and drops entries whose directory is gone once they
/// outnumber the live ones (test suites and benchmarks make hundreds of
/// temporary state directories, and every run stats each entry). Best
/// effort: a registry that cannot be written only means fewer directories
/// are known to hide. Changes are serialised by `flock` on a lock file
/// beside the registry, so a prune never loses a concurrent registration.
pub fn register_state_dir(registry: &Path, root: &Path) {
    let (live, dead) = listed_state_dirs(registry);
    let listed = live.iter().any(|known| known == root);
    if listed && dead <= 16.max(live.len()) {
        return;
    }
    let mut line = root.as_os_str().as_bytes().to_vec();
    if line.contains(&b'\n') {
        return;
    }
    line.push(b'\n');
    if let Some(parent) = registry.parent() {
        let _ = fs::create_dir_all(parent);
    }
    let mut lock_path = registry.as_os_str().to_owned();
    lock_path.push(".lock");
    let Ok(lock) = OpenOptions::new().write(true).create(true).truncate(false).mode(0o600).open(&lock_path)
    else {
        return;
    };
    // Released when `lock` is dropped.
    if rustix::fs::flock(&lock, FlockOperation::LockExclusive).is_err() {
        return;
    }
    // Re-read under the lock: another process may have changed it.
    let (mut live, dead) = listed_state_dirs(registry);
    if !live.iter().any(|known| known == root) {
        live.push(root.to_owned());
    }
    if dead > 16.max(live.len()) {
        let mut text = Vec::new();
        for dir in &live {
            text.extend_from_slice(dir.as_os_str().as_bytes());
            text.push(b'\n');
        }
        let _ = write_atomic(registry, &text);
    } else if !listed {
        let _ = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(registry)
            .and_then(|mut f| f.write_all(&line));
    }
}

/// The state directories listed in the registry that still exist.
pub fn known_state_dirs(registry: &Path) -> Vec<PathBuf> {
    listed_state_dirs(registry).0
}

/// The listed directories that exist, and how many listed ones are gone.
fn listed_state_dirs(registry: &Path) -> (Vec<PathBuf>, usize) {
    let Ok(bytes) = read_capped(registry, 1 << 20) else { return (Vec::new(), 0) };
    let listed: Vec<PathBuf> = bytes
        .split(|&b| b == b'\n')
        .filter(|l| l.first() == Some(&b'/'))
        .map(|l| PathBuf::from(OsStr::from_bytes(l)))
        .collect();
    let total = listed.len();
    let mut dirs: Vec<PathBuf> = listed.into_iter().filter(|p| p.is_dir()).collect();
    let dead = total - dirs.len();
    dirs.sort();
    dirs.dedup();
    (dirs, dead)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_dir_registry_forgets_dirs_that_are_gone() {
        let dir = tempfile::tempdir().unwrap();
        let registry = dir.path().join("registry");
        let live: Vec<PathBuf> = (0..2).map(|i| dir.path().join(format!("live{i}"))).collect();
        let mut text = String::new();
        for i in 0..40 {
            text.push_str(&format!("{}/gone{i}\n", dir.path().display()));
        }
        for l in &live {
            fs::create_dir(l).unwrap();
            text.push_str(&format!("{}\n", l.display()));
        }
        fs::write(&registry, text).unwrap();
        let new = dir.path().join("new");
        fs::create_dir(&new).unwrap();
        register_state_dir(&registry, &new);
        let mut expected = live.clone();
        expected.push(new.clone());
        expected.sort();
        assert_eq!(known_state_dirs(&registry), expected);
        assert_eq!(fs::read_to_string(&registry).unwrap().lines().count(), 3, "dead entries were pruned");
        register_state_dir(&registry, &new);
        assert_eq!(fs::read_to_string(&registry).unwrap().lines().count(), 3, "listed once");
    }
}
