//! Where pvisor finds the images it ships with (the `vm` guest image, the
//! `serve` sandbox image), in every layout the binary can be run from.
//!
//! Three layouts, looked in this order:
//! 1. a build tree: `target/release/pvisor` beside `target/vm-image/`;
//! 2. an install prefix: `PREFIX/bin/pvisor` with `PREFIX/share/pvisor/`
//!    (what `scripts/install.sh` writes, FHS-style);
//! 3. the XDG data directories: `$XDG_DATA_HOME/pvisor/` (default
//!    `~/.local/share/pvisor/`), then each of `$XDG_DATA_DIRS` (default
//!    `/usr/local/share:/usr/share`). That is how a `cargo install`ed binary
//!    in `~/.cargo/bin` finds what `scripts/install.sh` put in `~/.local` (or,
//!    as root, in `/usr/local`).
//!
//! An environment variable named by the caller overrides all three.

use std::path::{Path, PathBuf};

/// The directories that may hold the asset `name` (e.g. `vm-image`), in the
/// order they are tried, for a binary at `exe`.
pub fn candidates(name: &str, exe: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = exe.ancestors().skip(1).take(3).map(|d| d.join(name)).collect();
    if let Some(prefix) = exe.parent().and_then(Path::parent) {
        dirs.push(prefix.join("share/pvisor").join(name));
    }
    for data in data_home().into_iter().chain(data_dirs()) {
        dirs.push(data.join("pvisor").join(name));
    }
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// `$XDG_DATA_HOME`, else `$HOME/.local/share` (the XDG base directory rule:
/// a relative `XDG_DATA_HOME` is ignored).
pub fn data_home() -> Option<PathBuf> {
    std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
}

/// `$XDG_DATA_DIRS`, else `/usr/local/share` and `/usr/share`.
fn data_dirs() -> Vec<PathBuf> {
    let list = std::env::var("XDG_DATA_DIRS").ok().filter(|v| !v.is_empty());
    let list = list.as_deref().unwrap_or("/usr/local/share:/usr/share");
    list.split(':').map(PathBuf::from).filter(|p| p.is_absolute()).collect()
}

/// The first of [`candidates`] for the running binary that `holds` accepts,
/// or the list that was searched (for the error message).
pub fn locate(name: &str, holds: impl Fn(&Path) -> bool) -> Result<PathBuf, Vec<PathBuf>> {
    let exe = std::env::current_exe().unwrap_or_default();
    let dirs = candidates(name, &exe);
    dirs.iter().find(|d| holds(d)).cloned().ok_or(dirs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_tree_then_an_install_prefix_then_the_data_home() {
        let dirs = candidates("vm-image", Path::new("/opt/pv/target/release/pvisor"));
        assert_eq!(dirs[0], Path::new("/opt/pv/target/release/vm-image"));
        assert_eq!(dirs[1], Path::new("/opt/pv/target/vm-image"));
        assert!(dirs.contains(&PathBuf::from("/opt/pv/target/share/pvisor/vm-image")));
        let installed = candidates("vm-image", Path::new("/usr/local/bin/pvisor"));
        assert!(installed.contains(&PathBuf::from("/usr/local/share/pvisor/vm-image")));
    }
}
