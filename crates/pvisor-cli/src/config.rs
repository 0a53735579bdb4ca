//! Configuration files: the workspace's `.pvisor.toml` and the user's
//! `~/.config/pvisor/config.toml`, read safely and parsed strictly.
//!
//! Both are read the same way: a regular file only (never through a symlink,
//! never a device, FIFO or terminal), at most [`CONFIG_CAP`] bytes, and every
//! unknown key is an error naming the file. The workspace file is the
//! repository's content, so the caller lets it only *narrow* the policy until
//! the user trusts that exact file (`pvisor trust`; see `pvisor::trust`).

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Deserialize;

use pvisor_net::policy::PolicySpec;

/// The largest configuration file pvisor reads.
pub const CONFIG_CAP: u64 = 64 * 1024;

/// The name of a workspace's configuration file.
pub const WORKSPACE_FILE: &str = ".pvisor.toml";

/// A configuration file's contents.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// `[network]`: `mode`, `allow`, `deny`.
    #[serde(default)]
    pub network: Option<PolicySpec>,
    /// `[apply]`: `sensitive`, globs of paths whose changes need consent.
    #[serde(default)]
    pub apply: Option<ApplyConfig>,
    /// `[limits]`: the default `memory`, `pids`, `cpus` and `disk` of every run
    /// (flags override them). Only read from the user's config.
    #[serde(default)]
    pub limits: Option<LimitsConfig>,
    /// `[agents.NAME]`: agent presets of the user's own, or additions to a
    /// built-in one (see `crate::agents`). Only read from the user's config.
    #[serde(default)]
    pub agents: std::collections::BTreeMap<String, crate::agents::AgentPreset>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Bytes, or a size like "8G".
    #[serde(default, deserialize_with = "size")]
    pub memory: Option<u64>,
    #[serde(default)]
    pub pids: Option<u64>,
    #[serde(default)]
    pub cpus: Option<f64>,
    /// The stage's disk quota: bytes, or a size like "20G".
    #[serde(default, deserialize_with = "size")]
    pub disk: Option<u64>,
}

fn size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Bytes(u64),
        Text(String),
    }
    match Option::<Size>::deserialize(d)? {
        None => Ok(None),
        Some(Size::Bytes(b)) => Ok(Some(b)),
        Some(Size::Text(t)) => pvisor_sandbox::limits::parse_size(&t)
            .map(Some)
            .ok_or_else(|| serde::de::Error::custom(format!("{t:?} is not a size like 512M or 8G"))),
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyConfig {
    #[serde(default)]
    pub sensitive: Vec<String>,
}

/// Reads a configuration file safely. `Ok(None)` when it does not exist.
pub fn read(path: &Path) -> anyhow::Result<Option<Vec<u8>>> {
    // O_NOFOLLOW: a symlink is refused, not followed (to /dev/zero, /dev/tty,
    // or a file outside the workspace). O_NONBLOCK: opening a FIFO never hangs.
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => bail!(
            "{} is a symlink; pvisor reads configuration only from a regular file (replace the link with the file)",
            path.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("Cannot read {}", path.display())),
    };
    let meta = file.metadata().with_context(|| format!("Cannot read {}", path.display()))?;
    if !meta.file_type().is_file() {
        let what = match meta.file_type() {
            t if t.is_dir() => "a directory",
            t if t.is_fifo() => "a FIFO",
            t if t.is_char_device() || t.is_block_device() => "a device",
            t if t.is_socket() => "a socket",
            _ => "not a regular file",
        };
        bail!("{} is {what}; pvisor reads configuration only from a regular file", path.display());
    }
    if meta.len() > CONFIG_CAP {
        bail!(
            "{} is {} bytes, over the {CONFIG_CAP}-byte limit for a configuration file",
            path.display(),
            meta.len()
        );
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(CONFIG_CAP + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("Cannot read {}", path.display()))?;
    if bytes.len() as u64 > CONFIG_CAP {
        bail!("{} grew over the {CONFIG_CAP}-byte limit while being read", path.display());
    }
    Ok(Some(bytes))
}

/// Parses a configuration file's bytes strictly (unknown keys are errors).
pub fn parse(bytes: &[u8], path: &Path) -> anyhow::Result<ConfigFile> {
    let text = std::str::from_utf8(bytes).with_context(|| format!("{} is not UTF-8 text", path.display()))?;
    toml::from_str(text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Where the user's configuration lives: `$XDG_CONFIG_HOME/pvisor/config.toml`,
/// else `~/.config/pvisor/config.toml`.
pub fn user_config_path() -> Option<PathBuf> {
    std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .map(|dir| dir.join("pvisor/config.toml"))
}

/// The user's configuration (empty when there is none). A HOME pvisor may
/// not read (e.g. `sudo -u` without `-H`) is skipped with a warning.
pub fn user_config() -> anyhow::Result<(Option<PathBuf>, ConfigFile)> {
    let Some(path) = user_config_path() else { return Ok((None, ConfigFile::default())) };
    match read(&path) {
        Ok(Some(bytes)) => Ok((Some(path.clone()), parse(&bytes, &path)?)),
        Ok(None) => Ok((None, ConfigFile::default())),
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied) =>
        {
            crate::output::warning(&format!("skipping the user config {}: {e:#}", path.display()));
            Ok((None, ConfigFile::default()))
        }
        Err(e) => Err(e),
    }
}

/// The sensitive paths: the built-in list, the user's own globs, and what
/// this host runs from a workspace (the home directory, the user's git
/// configs) or must never take from one (pvisor's own config and state,
/// `store`'s and every registered one). A workspace cannot shorten this list.
pub fn sensitive(store: &pvisor_core::store::Store) -> anyhow::Result<pvisor::Sensitive> {
    let (path, user) = user_config()?;
    let sensitive =
        pvisor::Sensitive::new(user.apply.map(|a| a.sensitive).unwrap_or_default()).map_err(|e| {
            let file = path.map(|p| p.display().to_string()).unwrap_or_else(|| "the user config".into());
            anyhow::anyhow!("{file}: [apply] sensitive: {e}")
        })?;
    Ok(sensitive.with_host(host(store)))
}

/// What this user's environment says about the host: see [`sensitive`].
fn host(store: &pvisor_core::store::Store) -> pvisor_stage::sensitive::Host {
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
    let config_home = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".config")));
    let mut git_configs: Vec<PathBuf> = home.iter().map(|h| h.join(".gitconfig")).collect();
    git_configs.extend(config_home.iter().map(|c| c.join("git/config")));
    git_configs.push(PathBuf::from("/etc/gitconfig"));
    // git reads these instead of the two above when they are set.
    for var in ["GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM"] {
        git_configs.extend(std::env::var_os(var).filter(|v| !v.is_empty()).map(PathBuf::from));
    }
    let why_config = "pvisor's own configuration, which sets every later run's policy; edit it yourself, outside a sandbox";
    let why_state = "a pvisor state directory (Jobs, trust, evidence); pvisor writes it itself";
    let mut protected = Vec::new();
    if let Some(config) = user_config_path() {
        protected.extend(config.parent().map(|dir| (dir.to_path_buf(), why_config.to_owned())));
    }
    protected.push((store.root().to_path_buf(), why_state.to_owned()));
    protected.extend(crate::commands::other_state_dirs(store).into_iter().map(|d| (d, why_state.to_owned())));
    let registry = pvisor_core::store::state_dirs_registry(
        std::env::var_os("XDG_STATE_HOME"),
        home.clone().map(Into::into),
    );
    if let Some(registry) = registry {
        let why = "pvisor's list of state directories, which every sandbox hides; pvisor writes it itself";
        let mut lock = registry.clone().into_os_string();
        lock.push(".lock");
        protected.push((PathBuf::from(lock), why.to_owned()));
        protected.push((registry, why.to_owned()));
    }
    // Relative entries (`.`, an empty one) name wherever the user stands:
    // no directory of the workspace in particular.
    let path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).filter(|d| d.is_absolute()).collect())
        .unwrap_or_default();
    pvisor_stage::sensitive::Host { home, git_configs, protected, homes: account_homes(), path }
}

/// How many passwd entries are read for home directories (a directory
/// service that enumerates could list very many).
const ACCOUNTS: usize = 10_000;

/// Every account's home directory, from the passwd database (NSS, so
/// directory-service accounts that enumerate are included).
fn account_homes() -> Vec<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let mut homes = Vec::new();
    // SAFETY: getpwent's entry is copied out before the next call; this
    // process enumerates passwd nowhere else at the same time.
    unsafe {
        libc::setpwent();
        while homes.len() < ACCOUNTS {
            let entry = libc::getpwent();
            if entry.is_null() {
                break;
            }
            let dir = (*entry).pw_dir;
            if !dir.is_null() {
                let dir = std::ffi::CStr::from_ptr(dir).to_bytes();
                if dir.starts_with(b"/") {
                    homes.push(PathBuf::from(std::ffi::OsStr::from_bytes(dir)));
                }
            }
        }
        libc::endpwent();
    }
    homes
}

/// Says so when `workspace` is the user's home directory or holds it:
/// staging there makes every dotfile a path the host runs.
pub fn warn_if_home(workspace: &Path) {
    let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) else { return };
    let home = std::fs::canonicalize(&home).unwrap_or_else(|_| PathBuf::from(home));
    let workspace = std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_path_buf());
    if home.starts_with(&workspace) {
        crate::output::warning(&format!(
            "the workspace {} is your home directory or holds it: shell start-up files, ssh, git and systemd user units are all inside it (they are marked sensitive, and pvisor's own config and state are never applied)",
            crate::output::shown_path(&workspace)
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_files_parse_strictly() {
        let p = Path::new(".pvisor.toml");
        let file = parse(b"[network]\nmode = \"proxy\"\nallow = [\"pypi.org\"]\n", p).unwrap();
        assert_eq!(file.network.unwrap().mode, Some(pvisor_net::policy::Mode::Proxy));
        assert!(parse(b"[network]\nmode = \"open\"\n", p).is_err());
        assert!(parse(b"[network]\nallwo = []\n", p).is_err(), "unknown keys are refused");
        assert!(parse(b"[netwrok]\n", p).is_err(), "unknown tables are refused");
        assert_eq!(parse(b"", p).unwrap(), ConfigFile::default());
        let file = parse(b"[apply]\nsensitive = [\"Makefile\"]\n", p).unwrap();
        assert_eq!(file.apply.unwrap().sensitive, vec!["Makefile".to_owned()]);
    }

    #[test]
    fn only_regular_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("link.toml");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let err = read(&link).unwrap_err().to_string();
        assert!(err.contains("is a symlink"), "{err}");
        let err = read(dir.path()).unwrap_err().to_string();
        assert!(err.contains("a directory"), "{err}");
        let big = dir.path().join("big.toml");
        std::fs::write(&big, vec![b'#'; CONFIG_CAP as usize + 1]).unwrap();
        assert!(read(&big).unwrap_err().to_string().contains("limit"));
        assert_eq!(read(&dir.path().join("absent.toml")).unwrap(), None);
    }
}
