//! The effective policy: resolved once from the request, with every rewrite
//! pvisor makes to what the command gets recorded as an event.
//!
//! This covers the host paths the command may reach besides the workspace
//! (`--expose-socket`, `--cache`, `--ro`), the network decision and its attachment,
//! the variables pvisor sets, and the `admission.policy`,
//! `admission.network` and `admission.rewrite` events. Later stages consume
//! the recorded [`EffectivePolicy`] and never re-read the request.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use pvisor_core::event::EventKind;
use pvisor_core::ids::JobId;
use pvisor_core::records::{
    EffectiveNetwork, EffectivePolicy, NetworkMode, ResourceLimits, SharedDirectory, UserlandImage,
};
use pvisor_core::store::StoreError;
use pvisor_sandbox::NetworkAttachment;

use super::secrets::Secrets;
use super::{AdmissionError, SecretPolicy};
use crate::trace::{data, Trace};

/// The host paths the command may reach outside the workspace, each
/// checked against the workspace, the state directory and the hidden paths.
#[derive(Debug, Default)]
pub(super) struct HostPaths {
    /// `--expose-socket`: host Unix sockets it may connect to.
    pub(super) sockets: Vec<PathBuf>,
    /// `--cache`: host directories it may write through the cache store.
    pub(super) caches: Vec<PathBuf>,
    /// `--ro`: host files and directories it sees read-only at their path.
    pub(super) read_only: Vec<PathBuf>,
}

/// Decides the [`HostPaths`]: the `--expose-socket` sockets, the `--cache`
/// directories and the `--ro` paths.
pub(super) fn host_paths(
    secrets: &SecretPolicy,
    caches: &[PathBuf],
    state: &Path,
    workspace: &Path,
    hidden: &[(PathBuf, &'static str)],
) -> Result<HostPaths, AdmissionError> {
    let sockets = exposable_sockets(secrets, state, workspace)?;
    let hidden = hidden_now(state, hidden);
    let caches = cache_paths(caches, workspace, &hidden, secrets.home.as_deref())?;
    // A cache's upper is written by earlier runs: a place for the socket
    // would be made through whatever they left there.
    if let Some(path) = sockets.iter().find(|s| caches.iter().any(|c| s.starts_with(c))) {
        return Err(AdmissionError::ExposeSocket {
            path: path.clone(),
            problem: "is inside a --cache directory; expose it without the cache, or cache another directory",
        });
    }
    let read_only = read_only_paths(&secrets.read_only, workspace, &hidden, &caches)?;
    Ok(HostPaths { sockets, caches, read_only })
}

/// Resolves and checks each `--ro` path: an existing host directory or
/// regular file (a socket or device would be a way to a host process or
/// the host's hardware), not `/`, not in the workspace (the sandbox sees
/// that through its overlay), not hidden (`--expose` shows a secret store),
/// not in a cache, and not in the sandbox's own `/proc`, `/dev` or `/sys`.
/// Its place under `/tmp` or `/run` is made in the sandbox's own tmpfs.
fn read_only_paths(
    requested: &[PathBuf],
    workspace: &Path,
    hidden: &[PathBuf],
    caches: &[PathBuf],
) -> Result<Vec<PathBuf>, AdmissionError> {
    let mut out = Vec::new();
    for path in requested {
        let problem = |problem| AdmissionError::ReadOnly { path: path.clone(), problem };
        let real = std::fs::canonicalize(path)
            .map_err(|_| problem("no such file or directory; give an existing host path"))?;
        let meta = std::fs::metadata(&real).map_err(|_| problem("cannot be inspected"))?;
        if !(meta.is_dir() || meta.is_file()) {
            return Err(problem("is neither a directory nor a regular file; --expose-socket shows a socket"));
        }
        if real == Path::new("/") {
            return Err(problem("is the whole host, which the sandbox already sees read-only"));
        }
        if real.starts_with(workspace) {
            return Err(problem("is in the workspace, which the sandbox sees through its staged overlay"));
        }
        if hidden.iter().any(|h| real.starts_with(h)) {
            return Err(problem(
                "is hidden (a secret store or a pvisor state directory); --expose shows a secret store, a state directory is never shown",
            ));
        }
        if caches.iter().any(|c| real.starts_with(c) || c.starts_with(&real)) {
            return Err(problem("overlaps a --cache directory; give one or the other"));
        }
        if ["/proc", "/dev", "/sys"].iter().any(|p| real.starts_with(p)) {
            return Err(problem("is in the sandbox's own /proc, /dev or /sys"));
        }
        if real.to_str().is_none() {
            return Err(AdmissionError::NonUtf8Path { path: real });
        }
        if !out.contains(&real) {
            out.push(real);
        }
    }
    Ok(out)
}

/// The paths the sandbox must not reach: the state directory, then the
/// hidden secret stores.
pub(super) fn hidden_now(state: &Path, hidden: &[(PathBuf, &'static str)]) -> Vec<PathBuf> {
    std::iter::once(state.to_owned()).chain(hidden.iter().map(|(p, _)| p.clone())).collect()
}

/// Checks each shared directory of a vm Job: its source an existing host
/// directory (canonicalized, as virtiofsd is given it) that neither overlaps
/// the workspace nor a hidden path, and is no kernel filesystem; its target a
/// plain absolute path in the guest's root that is not one of the guest's
/// own filesystems (`/proc`, `/dev`, `/sys`). virtiofsd (QEMU's) sandboxes
/// itself with mount namespaces and `pivot_root`, which takes root.
pub(super) fn shared_directories(
    requested: &[SharedDirectory],
    executor: super::Backend<'_>,
    workspace: &Path,
    hidden: &[PathBuf],
) -> Result<Vec<SharedDirectory>, AdmissionError> {
    let mut out: Vec<SharedDirectory> = Vec::new();
    for share in requested {
        let problem =
            |problem: String| AdmissionError::SharedDirectory { path: share.source.clone(), problem };
        if !executor.traits.guest_machine {
            return Err(problem(format!(
                "only a vm Job shares host directories (this Job's executor is {executor})"
            )));
        }
        if !rustix::process::geteuid().is_root() {
            return Err(problem("sharing a directory with a VM takes root (virtiofsd); run as root".into()));
        }
        let real = std::fs::canonicalize(&share.source)
            .map_err(|_| problem("no such directory; create it first (mkdir -p)".into()))?;
        if !real.is_dir() {
            return Err(problem("is not a directory".into()));
        }
        if real.starts_with(workspace) || workspace.starts_with(&real) {
            return Err(problem(format!(
                "overlaps the workspace {}, whose changes are staged, not shared",
                workspace.display()
            )));
        }
        if hidden.iter().any(|h| real.starts_with(h) || h.starts_with(&real)) {
            return Err(problem(
                "overlaps a hidden path (a secret store or a pvisor state directory)".into(),
            ));
        }
        if SharedDirectory::in_kernel_filesystem(&real) || real == Path::new("/") {
            return Err(problem("is / or a kernel filesystem (/proc, /dev, /sys)".into()));
        }
        // virtiofsd takes the path in its `-o` list, where a comma would
        // start another option.
        if real.to_string_lossy().contains(',') {
            return Err(problem(
                "contains a comma, which virtiofsd's options cannot carry; share a path without one".into(),
            ));
        }
        let plain = share.target.is_absolute()
            && share.target.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
            && share.target.components().count() > 1;
        if !plain {
            return Err(problem(format!(
                "its target {} must be a plain absolute path below / (no `.` or `..`)",
                share.target.display()
            )));
        }
        if SharedDirectory::in_kernel_filesystem(&share.target) {
            return Err(problem(format!(
                "its target {} is in the guest's own /proc, /dev or /sys",
                share.target.display()
            )));
        }
        if out.iter().any(|o| o.target == share.target) {
            return Err(problem(format!("its target {} is shared twice", share.target.display())));
        }
        if real.to_str().is_none() || share.target.to_str().is_none() {
            return Err(AdmissionError::NonUtf8Path { path: real });
        }
        out.push(SharedDirectory {
            source: real,
            target: share.target.clone(),
            read_only: share.read_only,
            live_mounts: share.live_mounts,
        });
    }
    Ok(out)
}

/// Checks the userland image of a vm Job: only a guest machine has a root
/// of its own to replace (an ns run sees the host's), and the imported tree
/// must still be there.
pub(super) fn image(
    requested: Option<&UserlandImage>,
    executor: super::Backend<'_>,
) -> Result<Option<UserlandImage>, AdmissionError> {
    let Some(image) = requested else { return Ok(None) };
    let problem = |problem: String| AdmissionError::Image { name: image.name.clone(), problem };
    if !executor.traits.guest_machine {
        return Err(problem(format!(
            "--image applies to --executor vm; an ns run uses the host's userland (this Job's executor is {executor})"
        )));
    }
    if !image.rootfs.join("bin/sh").exists() && !image.rootfs.join("usr/bin/sh").exists() {
        return Err(problem(format!(
            "its root filesystem {} is gone or has no /bin/sh; import it again (pvisor image import {} DIR|TAR|OCI-LAYOUT)",
            image.rootfs.display(),
            image.name
        )));
    }
    Ok(Some(image.clone()))
}

/// What the request says about enforcement, besides paths and secrets.
pub(super) struct Requested<'a> {
    /// Checked by [`shared_directories`].
    pub(super) shared_directories: Vec<SharedDirectory>,
    /// Checked by [`image`].
    pub(super) image: Option<UserlandImage>,
    pub(super) network: &'a [pvisor_net::ScopedPolicy],
    /// A network namespace to join instead ([`NetworkMode::Namespace`]).
    pub(super) namespace: Option<&'a Path>,
    pub(super) kill_grace: Duration,
    pub(super) seccomp: bool,
    pub(super) limits: &'a ResourceLimits,
}

/// Decides the effective policy, once: merges the network policies in
/// scope, and fixes the kill grace, seccomp, limits, hidden paths (the
/// state directory first), exposed sockets and caches. Returns it with the
/// network attachment the executor gets.
pub(super) fn effective(
    requested: Requested<'_>,
    state: &Path,
    secrets: &Secrets,
    paths: &HostPaths,
) -> Result<(EffectivePolicy, NetworkAttachment), AdmissionError> {
    let mut network = pvisor_net::policy::resolve(requested.network)?;
    if let Some(path) = requested.namespace {
        let rules = !network.allow.is_empty() || !network.deny.is_empty() || network.ordered.is_some();
        if network.mode != NetworkMode::None || rules {
            return Err(AdmissionError::NetworkNamespace {
                path: path.to_owned(),
                problem: format!(
                    "a Job that joins a network namespace has no pvisor network policy of its own, but {} sets mode {}{}",
                    network.mode_source,
                    network.mode.as_str(),
                    if rules { " and rules" } else { "" }
                ),
            });
        }
        network.mode = NetworkMode::Namespace;
        network.namespace = Some(path.to_owned());
    }
    let attachment = attachment_for(network.mode);
    let policy = EffectivePolicy {
        network,
        kill_grace_ms: requested.kill_grace.as_millis() as u64,
        seccomp: requested.seccomp,
        limits: requested.limits.clone(),
        hidden_paths: std::iter::once(state.to_owned())
            .chain(secrets.hidden.iter().map(|(p, _)| p.clone()))
            .collect(),
        exposed_sockets: paths.sockets.clone(),
        caches: paths.caches.clone(),
        read_only: paths.read_only.clone(),
        shared_directories: requested.shared_directories,
        image: requested.image,
    };
    Ok((policy, attachment))
}

/// The variables pvisor sets in every sandbox (and, with the proxy, the
/// ones that point programs at it), replacing any the request passed.
pub(super) fn env_rewrites(job: &JobId, network: &EffectiveNetwork) -> Vec<(&'static str, String)> {
    let mut env_rewrites = vec![("PVISOR_SANDBOX", "1".to_owned()), ("PVISOR_JOB", job.to_string())];
    if network.mode == NetworkMode::Proxy {
        env_rewrites.extend(proxy_env(&pvisor_net::policy::proxied_loopback_names(network)));
    }
    env_rewrites
}

/// The command's environment: `env` with `rewrites` in place of any
/// variable of the same name.
pub(super) fn rewrite_env(
    mut env: Vec<(String, String)>,
    rewrites: &[(&'static str, String)],
) -> Vec<(String, String)> {
    let rewritten: Vec<&str> = rewrites.iter().map(|(k, _)| *k).collect();
    env.retain(|(k, _)| !rewritten.contains(&k.as_str()));
    env.extend(rewrites.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    env
}

/// What [`record`] records: the decisions and every rewrite behind them.
pub(super) struct Rewrites<'a> {
    pub(super) state: &'a Path,
    pub(super) secrets: &'a Secrets,
    pub(super) paths: &'a HostPaths,
    pub(super) agent_state: &'a crate::agent_state::Plan,
    pub(super) env_rewrites: &'a [(&'static str, String)],
    /// The `--secret` bindings (recorded by variable and destination).
    pub(super) brokered: Option<&'a super::Brokered>,
    /// Variables removed because they held a bound value.
    pub(super) copies: &'a [String],
}

/// Records `admission.policy` (caused by `job.created`), then the network
/// decision and each rewrite, all caused by it, in a fixed order: the state
/// directory, hidden secrets, skipped hides, caches, agent state, sockets, read-only paths, shared directories, scrubbed and
/// set variables. Returns the seq of `admission.policy`.
pub(super) fn record(
    trace: &mut Trace,
    created: u64,
    policy: &EffectivePolicy,
    executor: &dyn pvisor_sandbox::Executor,
    attachment: NetworkAttachment,
    rewrites: Rewrites<'_>,
) -> Result<u64, StoreError> {
    let network = &policy.network;
    let Rewrites { state, secrets, paths, agent_state, env_rewrites, brokered, copies } = rewrites;
    let policy_event = trace.emit(EventKind::AdmissionPolicy, None, Some(created), policy, false)?;
    let decision = data::AdmissionNetwork {
        mode: network.mode,
        mode_source: &network.mode_source,
        namespace: network.namespace.as_deref(),
        allow: &network.allow,
        deny: &network.deny,
        attachment: executor.describe_attachment(attachment),
        non_bypassable: attachment.non_bypassable(),
    };
    trace.emit(EventKind::AdmissionNetwork, None, Some(policy_event), &decision, false)?;
    let state_dir = data::AdmissionRewrite::Hide {
        path: state,
        reason: "the sandbox must not read or forge pvisor's records",
    };
    let hidden = secrets.hidden.iter().map(|(path, reason)| data::AdmissionRewrite::Hide { path, reason });
    let skipped = secrets.skipped.iter().map(|path| data::AdmissionRewrite::HideSkipped {
        path,
        reason: "it contains the workspace, which the command must see",
    });
    let caches = paths.caches.iter().map(|path| data::AdmissionRewrite::Cache {
        path,
        reason: "--cache: writable, persisted in pvisor's cache store, not staged",
    });
    let agent_state = agent_state.paths.iter().map(|s| data::AdmissionRewrite::State {
        path: &s.path,
        reason: if s.secret_on_host {
            "--state over a secret store: the Job's own copy, which never starts from the host's; carried within a session, gated changes held for review"
        } else {
            "--state: writable through the Job's own layer, carried within a session, gated changes held for review; never the host's files"
        },
    });
    let sockets = paths
        .sockets
        .iter()
        .map(|path| data::AdmissionRewrite::ExposeSocket { path, reason: "--expose-socket" });
    let read_only = paths.read_only.iter().map(|path| data::AdmissionRewrite::ReadOnly {
        path,
        reason: "--ro: shown read-only at its own path",
    });
    let shares = policy.shared_directories.iter().map(|share| data::AdmissionRewrite::Share {
        path: &share.source,
        target: &share.target,
        reason: "a shared volume: the VM reads and writes the host directory itself, live and not staged",
    });
    let removed = secrets.scrubbed.iter().map(|name| data::AdmissionRewrite::EnvRemove {
        name,
        reason: "named like a secret; pass it with --env",
    });
    let copies = copies.iter().map(|name| data::AdmissionRewrite::EnvRemove {
        name,
        reason: "holds the value of a --secret, which only the proxy may send",
    });
    let set = env_rewrites.iter().map(|(name, _)| data::AdmissionRewrite::EnvSet { name });
    let bindings = brokered.map(|b| b.broker.bindings()).unwrap_or_default();
    let secrets_bound = bindings.iter().map(|b| data::AdmissionRewrite::Secret {
        name: &b.spec.variable,
        host: &b.spec.host,
        port: b.spec.port,
        reason: "--secret: the command holds a placeholder; the proxy puts the value into requests to this destination alone",
    });
    let ca = brokered.into_iter().flat_map(|b| {
        let bundle = data::AdmissionRewrite::ReadOnly {
            path: &b.bundle,
            reason: "--secret: the host's roots and the run's CA, which the command trusts (shown over the system CA bundles too)",
        };
        std::iter::once(bundle)
            .chain(super::CA_VARIABLES.iter().map(|name| data::AdmissionRewrite::EnvSet { name }))
    });
    let all = std::iter::once(state_dir)
        .chain(hidden)
        .chain(skipped)
        .chain(caches)
        .chain(agent_state)
        .chain(sockets)
        .chain(read_only)
        .chain(shares)
        .chain(removed)
        .chain(copies)
        .chain(set)
        .chain(secrets_bound)
        .chain(ca);
    for rewrite in all {
        trace.emit(EventKind::AdmissionRewrite, None, Some(policy_event), &rewrite, false)?;
    }
    Ok(policy_event)
}

/// The loopback port the proxy listens on inside the sandbox.
pub const PROXY_PORT: u16 = 3128;

/// The variables that point a sandbox's programs at the proxy listener
/// (ordinary tools — curl, pip, npm, cargo, git — honour them). `NO_PROXY`
/// lists the loopback names, the sandbox's own, except those `proxied`
/// names (a `HOST:PORT` rule opened them on the host, which only the proxy
/// reaches).
pub fn proxy_env(proxied: &[&str]) -> Vec<(&'static str, String)> {
    let url = format!("http://127.0.0.1:{PROXY_PORT}");
    let mut env: Vec<(&'static str, String)> =
        ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"]
            .into_iter()
            .map(|name| (name, url.clone()))
            .collect();
    let direct: Vec<&str> =
        pvisor_net::policy::LOOPBACK_NAMES.into_iter().filter(|n| !proxied.contains(n)).collect();
    env.extend(["NO_PROXY", "no_proxy"].map(|name| (name, direct.join(","))));
    env
}

/// The attachment the executor gives the sandbox for network mode `mode`.
pub(super) fn attachment_for(mode: NetworkMode) -> NetworkAttachment {
    match mode {
        NetworkMode::None => NetworkAttachment::Isolated,
        NetworkMode::Proxy => NetworkAttachment::ProxyListener { port: PROXY_PORT },
        NetworkMode::Host => NetworkAttachment::Host,
        NetworkMode::Namespace => NetworkAttachment::Namespace,
    }
}

/// The host loopback ports to forward into the sandbox: those the allow
/// rules open, with the proxy only (no other mode has a policy to apply),
/// except 127.0.0.1:[`PROXY_PORT`], where the proxy itself listens (that
/// host port stays reachable through the proxy).
pub(super) fn loopback_forwards(network: &EffectiveNetwork) -> Vec<pvisor_net::policy::LoopbackForward> {
    if network.mode != NetworkMode::Proxy {
        return Vec::new();
    }
    let proxy = std::net::SocketAddr::from(([127, 0, 0, 1], PROXY_PORT));
    pvisor_net::policy::loopback_forwards(network).into_iter().filter(|f| f.listen != proxy).collect()
}

/// A namespace to join must be a network namespace other than the host's
/// (`pvisor_vm::nic::open_network_namespace`), and the executor vm.
pub(super) fn check_namespace(path: &Path, executor: super::Backend<'_>) -> Result<(), AdmissionError> {
    let problem = |problem: String| AdmissionError::NetworkNamespace { path: path.to_owned(), problem };
    if !executor.traits.guest_machine {
        return Err(problem(format!(
            "only a vm Job joins one (this Job's executor is {executor}); use --executor vm"
        )));
    }
    pvisor_vm::nic::open_network_namespace(path).map(drop).map_err(|e| problem(e.to_string()))
}

/// Resolves and checks each `--cache` path: an existing host directory that
/// is not the workspace (nor holds or sits in it), not hidden, holds no
/// agent config or credentials, and not under
/// `/tmp` or `/run` (the sandbox has its own).
fn cache_paths(
    requested: &[PathBuf],
    workspace: &Path,
    hidden: &[PathBuf],
    home: Option<&Path>,
) -> Result<Vec<PathBuf>, AdmissionError> {
    let mut out = Vec::new();
    for path in requested {
        let problem = |problem| AdmissionError::Cache { path: path.clone(), problem };
        let real = std::fs::canonicalize(path)
            .map_err(|_| problem("no such directory; create it first (mkdir -p)"))?;
        if !real.is_dir() {
            return Err(problem("is not a directory"));
        }
        if real.starts_with(workspace) || workspace.starts_with(&real) {
            return Err(problem(
                "overlaps the workspace; a cache is never the workspace, whose changes are staged",
            ));
        }
        if hidden.iter().any(|h| real.starts_with(h) || h.starts_with(&real)) {
            return Err(problem("overlaps a hidden path (a secret store or a pvisor state directory)"));
        }
        // A cache carries to later runs unreviewed: a hook written there
        // would run next time. Agent state has its own, gated layer.
        if crate::agent_state::agent_config_in(&real, home).is_some() {
            return Err(problem(
                "holds agent config or credentials, which a cache would carry to later runs unreviewed; use --agent NAME or --state PATH",
            ));
        }
        if ["/tmp", "/run", "/proc", "/dev", "/sys"].iter().any(|p| real.starts_with(p))
            || real == Path::new("/")
        {
            return Err(problem(
                "is in a part of the tree the sandbox gets fresh (/tmp, /run, /dev, /proc, /sys)",
            ));
        }
        if real.to_str().is_none() {
            return Err(AdmissionError::NonUtf8Path { path: real });
        }
        if !out.contains(&real) {
            out.push(real);
        }
    }
    Ok(out)
}

/// Resolves and checks each `--expose-socket` path: it must be a host Unix
/// socket, and never one of pvisor's own (a state directory's control sockets).
fn exposable_sockets(
    secrets: &SecretPolicy,
    state: &Path,
    workspace: &Path,
) -> Result<Vec<PathBuf>, AdmissionError> {
    use std::os::unix::fs::FileTypeExt;
    let mut sockets = Vec::new();
    for path in &secrets.expose_sockets {
        let problem = |problem| AdmissionError::ExposeSocket { path: path.clone(), problem };
        let real = std::fs::canonicalize(path)
            .map_err(|_| problem("no such socket; give the path of a listening Unix socket"))?;
        let meta = std::fs::metadata(&real).map_err(|_| problem("cannot be inspected"))?;
        if !meta.file_type().is_socket() {
            return Err(problem("is not a Unix socket"));
        }
        if real.starts_with(state) || secrets.other_state_dirs.iter().any(|d| real.starts_with(d)) {
            return Err(problem(
                "is inside a pvisor state directory; pvisor's own sockets are never exposed",
            ));
        }
        if real.starts_with(workspace) {
            return Err(problem("is inside the workspace, which the sandbox sees through its overlay; give a socket outside it"));
        }
        if real.to_str().is_none() {
            return Err(AdmissionError::NonUtf8Path { path: real });
        }
        if !sockets.contains(&real) {
            sockets.push(real);
        }
    }
    Ok(sockets)
}

#[cfg(test)]
mod tests {
    use super::{check_namespace, shared_directories};
    use crate::admission::Backend;
    use pvisor_core::records::SharedDirectory;
    use std::path::Path;

    fn on(name: &str) -> Backend<'_> {
        Backend { name, traits: crate::backends::host_traits(name) }
    }

    /// Only the proxy mode forwards, and never onto the proxy's own port.
    #[test]
    fn loopback_ports_are_forwarded_with_the_proxy_but_not_on_its_port() {
        use pvisor_net::policy::{resolve, PolicySpec, Scope, ScopedPolicy};
        let net = |mode, allow: &[&str]| {
            let spec = PolicySpec {
                mode: Some(mode),
                allow: allow.iter().map(|s| s.to_string()).collect(),
                deny: Vec::new(),
                ordered: None,
            };
            resolve(&[ScopedPolicy { scope: Scope::CommandLine, source: "test".into(), spec }]).unwrap()
        };
        let rules = ["127.0.0.1:3128", "localhost:3128", "127.0.0.1:8000"];
        let forwarded: Vec<String> = super::loopback_forwards(&net(super::NetworkMode::Proxy, &rules))
            .iter()
            .map(|f| f.listen.to_string())
            .collect();
        assert_eq!(forwarded, ["[::1]:3128", "127.0.0.1:8000"]);
        assert!(super::loopback_forwards(&net(super::NetworkMode::Host, &rules)).is_empty());
    }

    /// A userland image is for a vm Job only, and must still be a root
    /// filesystem (a shell) when the Job is admitted.
    #[test]
    fn a_userland_image_is_for_a_vm_job_with_a_root_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        let image = pvisor_core::records::UserlandImage {
            name: "python".into(),
            digest: "blake3:00".into(),
            rootfs: dir.path().to_owned(),
        };
        let check = |executor| super::image(Some(&image), on(executor)).map_err(|e| e.to_string());
        assert_eq!(super::image(None, on("ns")).unwrap(), None);
        let e = check("ns").unwrap_err();
        assert!(e.contains("--image applies to --executor vm; an ns run uses the host's userland"), "{e}");
        let e = check("vm").unwrap_err();
        assert!(e.contains("has no /bin/sh") && e.contains("pvisor image import python"), "{e}");
        std::fs::write(dir.path().join("bin/sh"), b"").unwrap();
        assert_eq!(check("vm").unwrap(), Some(image.clone()));
    }

    /// A shared directory is a host directory outside the workspace, the
    /// state directory and the secrets, shared by a vm Job run as root, at a
    /// plain target outside the guest's own filesystems.
    #[test]
    fn a_shared_directory_is_checked_before_anything_is_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let (workspace, state, volume) =
            (dir.path().join("ws"), dir.path().join("state"), dir.path().join("vol"));
        for d in [&workspace, &state, &volume, &workspace.join("inner")] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(dir.path().join("file"), b"").unwrap();
        std::fs::create_dir(dir.path().join("a,sandbox=none")).unwrap();
        let hidden = [state.clone()];
        let share = |source: &Path, target: &str| SharedDirectory {
            source: source.to_owned(),
            target: target.into(),
            read_only: false,
            live_mounts: false,
        };
        let check = |shares: &[SharedDirectory], executor| {
            shared_directories(shares, on(executor), &workspace, &hidden).map_err(|e| e.to_string())
        };
        let e = check(&[share(&volume, "/data")], "ns").unwrap_err();
        assert!(e.contains("only a vm Job"), "{e}");
        if !rustix::process::geteuid().is_root() {
            let e = check(&[share(&volume, "/data")], "vm").unwrap_err();
            assert!(e.contains("takes root"), "{e}");
            return;
        }
        let ok = check(&[share(&volume.join("."), "/data")], "vm").expect("admitted");
        assert_eq!(ok, [share(&std::fs::canonicalize(&volume).unwrap(), "/data")], "canonical");
        for (shares, expected) in [
            (vec![share(&dir.path().join("missing"), "/data")], "no such directory"),
            (vec![share(&dir.path().join("file"), "/data")], "not a directory"),
            (vec![share(&workspace.join("inner"), "/data")], "overlaps the workspace"),
            (vec![share(dir.path(), "/data")], "overlaps the workspace"),
            (vec![share(&state, "/data")], "hidden path"),
            (vec![share(Path::new("/proc"), "/data")], "kernel filesystem"),
            (vec![share(&dir.path().join("a,sandbox=none"), "/data")], "comma"),
            (vec![share(Path::new("/"), "/data")], "overlaps the workspace"),
            (vec![share(&volume, "/data/../etc")], "plain absolute path"),
            (vec![share(&volume, "data")], "plain absolute path"),
            (vec![share(&volume, "/")], "plain absolute path"),
            (vec![share(&volume, "/dev/shm")], "guest's own"),
            (vec![share(&volume, "/a"), share(&volume, "/a")], "shared twice"),
        ] {
            let e = check(&shares, "vm").unwrap_err();
            assert!(e.contains(expected) && e.starts_with("Shared directory "), "{shares:?}: {e}");
        }
    }

    #[test]
    fn only_a_vm_job_joins_only_a_namespace_file_not_the_hosts() {
        let e = check_namespace(Path::new("/proc/self/ns/net"), on("vm")).unwrap_err().to_string();
        assert!(e.contains("the host's network namespace"), "{e}");
        let e = check_namespace(Path::new("/proc/self/ns/net"), on("ns")).unwrap_err().to_string();
        assert!(e.contains("only a vm Job") && e.contains("/proc/self/ns/net"), "{e}");
        let e = check_namespace(Path::new("/tmp"), on("vm")).unwrap_err().to_string();
        assert!(e.contains("not a namespace file"), "{e}");
        let e = check_namespace(Path::new("/nonexistent/netns"), on("vm")).unwrap_err().to_string();
        assert!(e.contains("cannot open the network namespace"), "{e}");
    }
}
