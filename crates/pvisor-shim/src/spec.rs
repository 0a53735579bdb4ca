//! What the OCI bundle asks for, in pvisor's terms: a container's `process`
//! becomes a guest exec (argv, env, cwd, user) and its Linux resources
//! become the VM's limits. Only this module reads `config.json`.
//!
//! What a VM cannot honour is refused here with a clear message (a user
//! without `setpriv` in the image), not ignored.

use std::path::{Path, PathBuf};

use oci_spec::runtime::{Process, Spec};
use pvisor::actions::guest::KEEPER;
use pvisor_core::labels::Labels;
use pvisor_core::records::ResourceLimits;

/// A process to start in the container's root, from a bundle's `process`
/// or an exec's process spec.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessSpec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// On a terminal of its own (`process.terminal`: `ctr -t`, `kubectl
    /// exec -t`) rather than pipes.
    pub terminal: bool,
    /// Run in the guest's own root rather than chrooted into the
    /// container's rootfs (only a pod sandbox's stand-in process).
    pub guest_root: bool,
}

/// The annotation containerd's CRI plugin puts on each container of a pod:
/// `sandbox` on the pod's sandbox (pause) container, `container` on the rest.
const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";

/// Why a spec cannot be run.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum SpecError {
    #[error("cannot read the bundle's config.json: {0}")]
    Load(String),
    #[error("the OCI spec has no process to run")]
    NoProcess,
    #[error("the process has no args")]
    NoArgs,
    #[error("unsupported: {0}")]
    Unsupported(String),
}

/// The CRI annotations copied into the Job's labels, so `pvisor jobs
/// --label io.kubernetes.cri.sandbox-name=web` finds a pod's VMs.
const CRI_LABELS: [&str; 5] = [
    "io.kubernetes.cri.sandbox-id",
    "io.kubernetes.cri.sandbox-name",
    "io.kubernetes.cri.sandbox-namespace",
    "io.kubernetes.cri.container-name",
    CRI_CONTAINER_TYPE,
];
/// The Job labels naming the container.
pub const NAMESPACE_LABEL: &str = "containerd.io/namespace";
pub const CONTAINER_LABEL: &str = "containerd.io/container";

/// The labels of the container's Job: its containerd namespace and id, and
/// the CRI plugin's pod and container names where it set them. An
/// annotation that is not a valid label value is left out (logged), not
/// a failed create.
pub fn labels(spec: &Spec, namespace: &str, id: &str) -> Labels {
    let mut labels = Labels::from([
        (NAMESPACE_LABEL.to_owned(), namespace.to_owned()),
        (CONTAINER_LABEL.to_owned(), id.to_owned()),
    ]);
    let annotations = spec.annotations().clone().unwrap_or_default();
    for key in CRI_LABELS {
        if let Some(value) = annotations.get(key) {
            labels.insert(key.to_owned(), value.clone());
        }
    }
    labels.retain(|k, v| {
        let valid = pvisor_core::labels::check(k, v);
        if let Err(e) = &valid {
            log::warn!("{id}: not a Job label: {e}");
        }
        valid.is_ok()
    });
    labels
}

/// The network namespace the container's VM joins, if any: the OCI spec's
/// `network` namespace path (`ctr run --with-ns network:PATH`, or the pod
/// netns CNI set up, which CRI gives the pod's sandbox container). None for
/// the host's network (no `network` entry: `hostNetwork: true`, `ctr run
/// --net-host`) and for a new empty one (no path): the VM then has no NIC.
///
/// A pod's sandbox container holds the pod's network for the other
/// containers and is given none itself. CRI gives those containers
/// `/proc/PID/ns/net` of the sandbox's task pid (containerd's
/// `pkg/cri/server/container_create_linux.go`, `WithPodNamespaces`),
/// which here is the sandbox's shim, a host process in the host's network
/// namespace (admission refuses that one): the namespace is read instead
/// from the sandbox's own spec, in its bundle beside this one (containerd's
/// runtime v2 keeps `<state>/<namespace>/<id>` per container). The id is an
/// annotation, so it must be one plain path component, and the spec found
/// must be that sandbox's.
pub fn network_namespace(spec: &Spec, bundle: &Path) -> Result<Option<PathBuf>, SpecError> {
    let annotations = spec.annotations().clone().unwrap_or_default();
    if annotations.get(CRI_CONTAINER_TYPE).is_some_and(|k| k == "sandbox") {
        return Ok(None);
    }
    let Some(path) = own_network_namespace(spec) else { return Ok(None) };
    let sandbox = annotations.get("io.kubernetes.cri.sandbox-id");
    match sandbox {
        Some(id) if path.starts_with("/proc") => {
            let plain = !id.is_empty()
                && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
                && id != "."
                && id != "..";
            let parent = bundle.parent().filter(|p| p.is_absolute());
            let (true, Some(parent)) = (plain, parent) else {
                return Err(SpecError::Unsupported(format!("the pod's network: {id:?} is not a sandbox id")));
            };
            let sandbox_spec = load(&parent.join(id)).map_err(|e| {
                SpecError::Unsupported(format!("the pod's network: cannot read sandbox {id}'s spec: {e}"))
            })?;
            let found = sandbox_spec.annotations().clone().unwrap_or_default();
            let is_it = found.get(CRI_CONTAINER_TYPE).is_some_and(|k| k == "sandbox")
                && found.get("io.kubernetes.cri.sandbox-id").is_none_or(|s| s == id);
            if !is_it {
                return Err(SpecError::Unsupported(format!("the pod's network: {id} is not a pod sandbox")));
            }
            Ok(own_network_namespace(&sandbox_spec))
        }
        _ => Ok(Some(path)),
    }
}

fn own_network_namespace(spec: &Spec) -> Option<PathBuf> {
    let namespaces = spec.linux().as_ref()?.namespaces().clone().unwrap_or_default();
    let network = namespaces.iter().find(|n| n.typ() == oci_spec::runtime::LinuxNamespaceType::Network)?;
    network.path().clone().filter(|p| !p.as_os_str().is_empty())
}

/// The bundle's spec.
pub fn load(bundle: &Path) -> Result<Spec, SpecError> {
    Spec::load(bundle.join("config.json")).map_err(|e| SpecError::Load(e.to_string()))
}

/// The container's own process (the bundle's `process`), or for a CRI pod
/// sandbox pvisor's keeper in the guest's root. Each container of a pod is
/// its own VM, so nothing joins the sandbox's namespaces: its process only
/// has to live until the pod is stopped, and the image CRI runs it from
/// (`sandbox_image`) need not hold a program that does (a pause image's
/// `/pause` would; a busybox stand-in's `/bin/sh` would end at the end of
/// its stdin).
pub fn init_process(spec: &Spec, rootfs: &Path) -> Result<ProcessSpec, SpecError> {
    let kind = spec.annotations().as_ref().and_then(|a| a.get(CRI_CONTAINER_TYPE));
    if kind.is_some_and(|k| k == "sandbox") {
        return Ok(ProcessSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), KEEPER.into()],
            env: vec![("PATH".into(), "/bin:/sbin:/usr/bin:/usr/sbin".into())],
            cwd: "/".into(),
            terminal: false,
            guest_root: true,
        });
    }
    process(spec.process().as_ref().ok_or(SpecError::NoProcess)?, rootfs)
}

/// An exec's process, as containerd sends it (the OCI `Process` in JSON).
pub fn exec_process(json: &[u8], rootfs: &Path) -> Result<ProcessSpec, SpecError> {
    let parsed: Process =
        serde_json::from_slice(json).map_err(|e| SpecError::Load(format!("the exec's process spec: {e}")))?;
    process(&parsed, rootfs)
}

fn process(process: &Process, rootfs: &Path) -> Result<ProcessSpec, SpecError> {
    let args = process.args().clone().unwrap_or_default();
    if args.is_empty() {
        return Err(SpecError::NoArgs);
    }
    let env = process
        .env()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => (kv, String::new()),
        })
        .collect();
    let user = process.user();
    let argv = as_user(user.uid(), user.gid(), args, rootfs)?;
    let terminal = process.terminal().unwrap_or(false);
    Ok(ProcessSpec { argv, env, cwd: process.cwd().clone(), terminal, guest_root: false })
}

/// The agent starts processes as root; another user is taken on through
/// the image's `setpriv`, as `pvisor serve`'s execd does.
fn as_user(uid: u32, gid: u32, args: Vec<String>, rootfs: &Path) -> Result<Vec<String>, SpecError> {
    if uid == 0 && gid == 0 {
        return Ok(args);
    }
    let Some(setpriv) = ["usr/bin/setpriv", "bin/setpriv"].into_iter().find(|p| rootfs.join(p).exists())
    else {
        return Err(SpecError::Unsupported(format!(
            "running as uid {uid} gid {gid} needs setpriv (util-linux) in the image"
        )));
    };
    let mut argv = vec![
        format!("/{setpriv}"),
        format!("--reuid={uid}"),
        format!("--regid={gid}"),
        "--clear-groups".into(),
        "--".into(),
    ];
    argv.extend(args);
    Ok(argv)
}

/// The VM's limits from `linux.resources`: memory, CPU quota, pids.
pub fn limits(spec: &Spec) -> ResourceLimits {
    let mut limits = ResourceLimits::default();
    let Some(resources) = spec.linux().as_ref().and_then(|l| l.resources().as_ref()) else {
        return limits;
    };
    if let Some(memory) = resources.memory().as_ref().and_then(|m| m.limit()).filter(|l| *l > 0) {
        limits.memory_bytes = Some(memory as u64);
    }
    if let Some(cpu) = resources.cpu() {
        if let (Some(quota), Some(period)) = (cpu.quota(), cpu.period()) {
            if quota > 0 && period > 0 {
                limits.cpus = Some(quota as f64 / period as f64);
            }
        }
    }
    if let Some(pids) = resources.pids().as_ref().map(|p| p.limit()).filter(|l| *l > 0) {
        limits.pids = Some(pids as u64);
    }
    limits
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> Spec {
        serde_json::from_value(json).expect("a valid spec")
    }

    #[test]
    fn the_process_becomes_argv_env_and_cwd() {
        let s = spec(serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sh", "-c", "exit 3"], "env": ["PATH=/bin", "EMPTY"], "cwd": "/tmp",
                        "user": {"uid": 0, "gid": 0}},
            "root": {"path": "rootfs"}
        }));
        let p = init_process(&s, Path::new("/nonexistent")).expect("runnable");
        assert_eq!(p.argv, ["sh", "-c", "exit 3"]);
        assert_eq!(p.env, [("PATH".to_owned(), "/bin".to_owned()), ("EMPTY".to_owned(), String::new())]);
        assert_eq!(p.cwd, Path::new("/tmp"));
    }

    fn with_network(path: Option<&str>, annotations: serde_json::Value) -> serde_json::Value {
        let mut namespace = serde_json::json!({"type": "network"});
        if let Some(path) = path {
            namespace["path"] = path.into();
        }
        serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sh"], "cwd": "/", "user": {"uid": 0, "gid": 0}},
            "root": {"path": "rootfs"},
            "annotations": annotations,
            "linux": {"namespaces": [{"type": "pid"}, namespace]}
        })
    }

    /// The namespace a container's VM joins: its own path (ctr's
    /// `--with-ns`); none for a new empty one, the host's, or a pod's
    /// sandbox; and for a CRI container, whose path is `/proc/PID/ns/net` of
    /// the sandbox's (guest) pid, the sandbox's own path from its bundle.
    #[test]
    fn the_network_namespace_is_the_specs_or_the_pod_sandboxs() {
        let none = serde_json::json!({});
        let bundles = tempfile::tempdir().unwrap();
        let bundle = bundles.path().join("app");
        let given = spec(with_network(Some("/var/run/netns/x"), none.clone()));
        assert_eq!(network_namespace(&given, &bundle).unwrap(), Some(PathBuf::from("/var/run/netns/x")));
        assert_eq!(network_namespace(&spec(with_network(None, none.clone())), &bundle).unwrap(), None);
        let mut host = with_network(None, none);
        host["linux"]["namespaces"] = serde_json::json!([{"type": "pid"}]);
        assert_eq!(network_namespace(&spec(host), &bundle).unwrap(), None);
        let sandbox =
            with_network(Some("/var/run/netns/cni-1"), serde_json::json!({CRI_CONTAINER_TYPE: "sandbox"}));
        assert_eq!(
            network_namespace(&spec(sandbox.clone()), &bundle).unwrap(),
            None,
            "the sandbox takes none"
        );
        std::fs::create_dir_all(bundles.path().join("sb1")).unwrap();
        std::fs::write(bundles.path().join("sb1/config.json"), sandbox.to_string()).unwrap();
        let app = with_network(
            Some("/proc/42/ns/net"),
            serde_json::json!({CRI_CONTAINER_TYPE: "container", "io.kubernetes.cri.sandbox-id": "sb1"}),
        );
        assert_eq!(
            network_namespace(&spec(app), &bundle).unwrap(),
            Some(PathBuf::from("/var/run/netns/cni-1"))
        );
        let orphan = with_network(
            Some("/proc/42/ns/net"),
            serde_json::json!({CRI_CONTAINER_TYPE: "container", "io.kubernetes.cri.sandbox-id": "gone"}),
        );
        assert!(network_namespace(&spec(orphan), &bundle).unwrap_err().to_string().contains("sandbox gone"));
        for hostile in ["../other/sb1", "/etc", "..", ""] {
            let app = with_network(
                Some("/proc/42/ns/net"),
                serde_json::json!({CRI_CONTAINER_TYPE: "container", "io.kubernetes.cri.sandbox-id": hostile}),
            );
            assert!(network_namespace(&spec(app), &bundle).is_err(), "{hostile:?}");
        }
        // A sibling that is not a pod sandbox is not taken for one.
        std::fs::create_dir_all(bundles.path().join("plain")).unwrap();
        let plain = with_network(Some("/var/run/netns/y"), serde_json::json!({}));
        std::fs::write(bundles.path().join("plain/config.json"), plain.to_string()).unwrap();
        let app = with_network(
            Some("/proc/42/ns/net"),
            serde_json::json!({CRI_CONTAINER_TYPE: "container", "io.kubernetes.cri.sandbox-id": "plain"}),
        );
        assert!(network_namespace(&spec(app), &bundle)
            .unwrap_err()
            .to_string()
            .contains("not a pod sandbox"));
    }

    #[test]
    fn a_cri_pod_sandbox_runs_the_keeper_in_the_guests_root() {
        let s = spec(serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["/bin/sh"], "cwd": "/", "user": {"uid": 0, "gid": 0}},
            "annotations": {"io.kubernetes.cri.container-type": "sandbox"},
            "root": {"path": "rootfs"}
        }));
        let p = init_process(&s, Path::new("/nonexistent")).expect("runnable");
        assert_eq!(p.argv, ["/bin/sh", "-c", KEEPER]);
        assert!(p.guest_root);
        let mut s = s;
        s.set_annotations(Some([(CRI_CONTAINER_TYPE.to_owned(), "container".to_owned())].into()));
        let p = init_process(&s, Path::new("/nonexistent")).expect("runnable");
        assert_eq!((p.argv.as_slice(), p.guest_root), (["/bin/sh".to_owned()].as_slice(), false));
    }

    #[test]
    fn the_jobs_labels_name_the_container_and_its_pod() {
        let mut s = spec(
            serde_json::json!({"ociVersion": "1.0.2", "process": {"args": ["true"], "cwd": "/", "user": {"uid": 0, "gid": 0}}}),
        );
        s.set_annotations(Some(
            [
                (CRI_CONTAINER_TYPE.to_owned(), "container".to_owned()),
                ("io.kubernetes.cri.sandbox-name".to_owned(), "web".to_owned()),
                ("io.kubernetes.cri.container-name".to_owned(), "bad\u{1b}[2J".to_owned()),
                ("unrelated".to_owned(), "x".to_owned()),
            ]
            .into(),
        ));
        let labels = labels(&s, "k8s.io", "abc123");
        let expected: Labels = [
            (NAMESPACE_LABEL, "k8s.io"),
            (CONTAINER_LABEL, "abc123"),
            (CRI_CONTAINER_TYPE, "container"),
            ("io.kubernetes.cri.sandbox-name", "web"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(labels, expected, "an unsafe value is left out, other annotations are not labels");
    }

    #[test]
    fn a_terminal_is_asked_for_and_a_user_without_setpriv_is_refused_clearly() {
        let tty =
            serde_json::json!({"terminal": true, "args": ["sh"], "cwd": "/", "user": {"uid": 0, "gid": 0}});
        assert!(exec_process(tty.to_string().as_bytes(), Path::new("/")).expect("runnable").terminal);
        let pipes = serde_json::json!({"args": ["sh"], "cwd": "/", "user": {"uid": 0, "gid": 0}});
        assert!(!exec_process(pipes.to_string().as_bytes(), Path::new("/")).expect("runnable").terminal);
        let user = serde_json::json!({"args": ["id"], "cwd": "/", "user": {"uid": 1000, "gid": 1000}});
        let empty = tempfile::tempdir().expect("tempdir");
        let err = exec_process(user.to_string().as_bytes(), empty.path()).unwrap_err();
        assert!(matches!(err, SpecError::Unsupported(m) if m.contains("setpriv")));
        std::fs::create_dir_all(empty.path().join("usr/bin")).expect("mkdir");
        std::fs::write(empty.path().join("usr/bin/setpriv"), b"").expect("write");
        let p = exec_process(user.to_string().as_bytes(), empty.path()).expect("runnable");
        assert_eq!(p.argv[..2], ["/usr/bin/setpriv".to_owned(), "--reuid=1000".to_owned()]);
        assert_eq!(p.argv.last().map(String::as_str), Some("id"));
    }

    #[test]
    fn linux_resources_become_the_vms_limits() {
        let s = spec(serde_json::json!({
            "ociVersion": "1.0.2",
            "linux": {"resources": {"memory": {"limit": 268435456}, "cpu": {"quota": 150000, "period": 100000},
                                    "pids": {"limit": 64}}}
        }));
        let l = limits(&s);
        assert_eq!(l.memory_bytes, Some(256 << 20));
        assert_eq!(l.cpus, Some(1.5));
        assert_eq!(l.pids, Some(64));
        assert_eq!(limits(&spec(serde_json::json!({"ociVersion": "1.0.2"}))), ResourceLimits::default());
    }
}
