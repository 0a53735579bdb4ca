//! What the OCI bundle asks for, in pvisor's terms: a container's `process`
//! becomes a guest exec (argv, env, cwd, user) and its Linux resources
//! become the VM's limits. Only this module reads `config.json`.
//!
//! What restricts the process (capabilities, `noNewPrivileges`, rlimits,
//! the user, sysctls, the seccomp profile, compiled here by
//! [`crate::seccomp`]) becomes a [`Confinement`] the guest agent applies
//! inside the VM, as runc would on a host; the container's execs get the
//! same seccomp profile, as runc gives them. What a VM cannot honour is
//! refused here with a clear message, never dropped: hooks (they would run
//! on the host, as root), host devices, a host pid namespace to join, and
//! what of a seccomp profile the guest cannot apply (a listener on the
//! host). AppArmor and SELinux labels name host policies the guest
//! kernel does not load: they are logged as not applied, which is what
//! Kata Containers does (its runtime drops the guest's SELinux label with
//! a log line when guest SELinux is off, and its agent ignores
//! `apparmorProfile`: kata-containers/kata-containers,
//! `src/runtime/virtcontainers/kata_agent.go`, `constrainGRPCSpec`).

use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxDeviceType, LinuxNamespaceType, Process, Spec};
use pvisor::actions::guest::KEEPER;
use pvisor_agent_proto::{Capabilities, Confinement, Rlimit, Seccomp, RLIMITS};
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
    /// Where its `/` is in the guest.
    pub root: Root,
    /// The user, capabilities and limits the agent confines it to (none
    /// for pvisor's own stand-in).
    pub confinement: Option<Box<Confinement>>,
}

/// Where a process's `/` is in the guest.
#[derive(Clone, Debug, PartialEq)]
pub enum Root {
    /// Chrooted into the container's rootfs, the VM's workspace.
    Workspace,
    /// The guest's own root (only a pod sandbox's stand-in process).
    Guest,
    /// Chrooted into this guest directory: the rootfs of a pod's later
    /// container, in the pod's shared directory.
    At(PathBuf),
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
    pvisor_core::labels::CRI_POD_NAME,
    pvisor_core::labels::CRI_POD_NAMESPACE,
    "io.kubernetes.cri.container-name",
    CRI_CONTAINER_TYPE,
];
/// The Job labels naming the container.
pub use pvisor_core::labels::{
    CONTAINERD_CONTAINER as CONTAINER_LABEL, CONTAINERD_NAMESPACE as NAMESPACE_LABEL,
};

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
/// A pod's sandbox container boots the pod's VM, which takes the pod's
/// network; the pod's later containers run in that VM ([`crate::pod`]).
/// A later container that is not (its sandbox is served by another shim)
/// reads the namespace from the sandbox's spec: CRI gives those containers
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
        return Ok(own_network_namespace(spec));
    }
    let Some(path) = own_network_namespace(spec) else { return Ok(None) };
    let sandbox = annotations.get("io.kubernetes.cri.sandbox-id");
    match sandbox {
        Some(id) if path.starts_with("/proc") => {
            let plain = is_plain_id(id);
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

/// Whether `id` (a containerd or CRI id, from an annotation or a request)
/// is one plain path component.
pub fn is_plain_id(id: &str) -> bool {
    !id.is_empty()
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && id != "."
        && id != ".."
}

/// The pod sandbox whose VM a CRI container runs in: its sandbox id, for a
/// container of a pod (not the sandbox itself) whose id is plain.
pub fn pod_member_of(spec: &Spec) -> Option<String> {
    let annotations = spec.annotations().as_ref()?;
    let member = annotations.get(CRI_CONTAINER_TYPE).is_some_and(|k| k == "container");
    let sandbox = annotations.get("io.kubernetes.cri.sandbox-id")?;
    (member && is_plain_id(sandbox)).then(|| sandbox.clone())
}

/// Whether the spec is a CRI pod's sandbox container.
pub fn is_pod_sandbox(spec: &Spec) -> bool {
    let annotations = spec.annotations().clone().unwrap_or_default();
    annotations.get(CRI_CONTAINER_TYPE).is_some_and(|k| k == "sandbox")
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
/// sandbox pvisor's keeper in the guest's root. The pod's containers run
/// in the VM, not in the sandbox's namespaces: its process only has to
/// live until the pod is stopped, and the image CRI runs it from
/// (`sandbox_image`) need not hold a program that does (a pause image's
/// `/pause` would; a busybox stand-in's `/bin/sh` would end at the end of
/// its stdin). Either way, what the spec asks that no VM can honour is
/// refused first ([`refuse_unhonourable`]).
pub fn init_process(spec: &Spec) -> Result<ProcessSpec, SpecError> {
    refuse_unhonourable(spec)?;
    if is_pod_sandbox(spec) {
        return Ok(ProcessSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), KEEPER.into()],
            env: vec![("PATH".into(), "/bin:/sbin:/usr/bin:/usr/sbin".into())],
            cwd: "/".into(),
            terminal: false,
            root: Root::Guest,
            confinement: None,
        });
    }
    let seccomp = spec.linux().as_ref().and_then(|l| l.seccomp().as_ref()).map(crate::seccomp::compile);
    let mut process = process(spec.process().as_ref().ok_or(SpecError::NoProcess)?, seccomp.transpose()?)?;
    let sysctl = spec.linux().as_ref().and_then(|l| l.sysctl().clone()).unwrap_or_default();
    if let Some(confinement) = process.confinement.as_mut() {
        confinement.sysctl = sysctl.into_iter().collect();
    }
    Ok(process)
}

/// An exec's process, as containerd sends it (the OCI `Process` in JSON),
/// under the container's seccomp filter (`seccomp`, its init process's).
pub fn exec_process(json: &[u8], seccomp: Option<&Seccomp>) -> Result<ProcessSpec, SpecError> {
    let parsed: Process =
        serde_json::from_slice(json).map_err(|e| SpecError::Load(format!("the exec's process spec: {e}")))?;
    process(&parsed, seccomp.cloned())
}

fn process(process: &Process, seccomp: Option<Seccomp>) -> Result<ProcessSpec, SpecError> {
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
    let terminal = process.terminal().unwrap_or(false);
    let confinement = Some(Box::new(Confinement { seccomp, ..confinement(process)? }));
    Ok(ProcessSpec {
        argv: args,
        env,
        cwd: process.cwd().clone(),
        terminal,
        root: Root::Workspace,
        confinement,
    })
}

/// The process's user, capabilities, `noNewPrivileges` and rlimits (its
/// sysctls are the spec's `linux` section's).
fn confinement(process: &Process) -> Result<Confinement, SpecError> {
    let user = process.user();
    if user.username().as_ref().is_some_and(|u| !u.is_empty()) {
        return Err(SpecError::Unsupported("a user by name (only uid and gid are Linux's)".into()));
    }
    let capabilities = process.capabilities().as_ref().map(|caps| -> Result<Capabilities, SpecError> {
        Ok(Capabilities {
            bounding: mask(caps.bounding())?,
            effective: mask(caps.effective())?,
            permitted: mask(caps.permitted())?,
            inheritable: mask(caps.inheritable())?,
            ambient: mask(caps.ambient())?,
        })
    });
    let rlimits = process.rlimits().clone().unwrap_or_default();
    let rlimits = rlimits
        .iter()
        .map(|r| {
            let name = serde_json::to_value(r.typ()).ok().and_then(|v| v.as_str().map(str::to_owned));
            let resource = name.as_deref().and_then(|n| RLIMITS.iter().position(|known| *known == n));
            let resource = resource.ok_or_else(|| {
                SpecError::Unsupported(format!("the rlimit {:?}, which Linux does not have", r.typ()))
            })?;
            Ok(Rlimit { resource: resource as u32, soft: r.soft(), hard: r.hard() })
        })
        .collect::<Result<_, SpecError>>()?;
    Ok(Confinement {
        uid: user.uid(),
        gid: user.gid(),
        additional_gids: user.additional_gids().clone().unwrap_or_default(),
        capabilities: capabilities.transpose()?,
        no_new_privileges: process.no_new_privileges().unwrap_or(false),
        rlimits,
        sysctl: Vec::new(),
        seccomp: None,
        container: None,
    })
}

/// A capability set as a mask (bit `n` for capability `n`); an absent set
/// is empty, as runc reads it.
fn mask(set: &Option<oci_spec::runtime::Capabilities>) -> Result<u64, SpecError> {
    let mut mask = 0;
    for cap in set.iter().flatten() {
        let name = cap.to_string();
        let bare = name.strip_prefix("CAP_").unwrap_or(&name);
        let bit = rustix::thread::CapabilitySet::from_name(bare).ok_or_else(|| {
            SpecError::Unsupported(format!("the capability {name}, which the guest has not"))
        })?;
        mask |= bit.bits();
    }
    Ok(mask)
}

/// The devices every guest has (its own devtmpfs): a spec may list these
/// (containerd's defaults); any other would be a host device.
const GUEST_DEVICES: [(&str, i64, i64); 8] = [
    ("/dev/null", 1, 3),
    ("/dev/zero", 1, 5),
    ("/dev/full", 1, 7),
    ("/dev/random", 1, 8),
    ("/dev/urandom", 1, 9),
    ("/dev/tty", 5, 0),
    ("/dev/console", 5, 1),
    ("/dev/ptmx", 5, 2),
];

/// Refuses what a VM cannot honour (see the module's documentation); logs
/// the labels it does not apply.
pub fn refuse_unhonourable(spec: &Spec) -> Result<(), SpecError> {
    let unsupported = |what: &str| Err(SpecError::Unsupported(what.to_owned()));
    if let Some(hooks) = spec.hooks() {
        let any = [
            hooks.prestart(),
            hooks.create_runtime(),
            hooks.create_container(),
            hooks.start_container(),
            hooks.poststart(),
            hooks.poststop(),
        ]
        .iter()
        .any(|h| h.as_ref().is_some_and(|h| !h.is_empty()));
        if any {
            return unsupported("OCI hooks (they would run on the host, as root; the shim runs none)");
        }
    }
    let Some(linux) = spec.linux() else { return Ok(()) };
    for device in linux.devices().iter().flatten() {
        let path = device.path().display().to_string();
        let known = device.typ() == LinuxDeviceType::C
            && GUEST_DEVICES.contains(&(path.as_str(), device.major(), device.minor()));
        if !known {
            return Err(SpecError::Unsupported(format!(
                "the host device {path} (a VM has only its own devices)"
            )));
        }
    }
    let pid_path = linux.namespaces().iter().flatten().any(|n| {
        n.typ() == LinuxNamespaceType::Pid && n.path().as_ref().is_some_and(|p| !p.as_os_str().is_empty())
    });
    if pid_path {
        return unsupported("joining a pid namespace (shareProcessNamespace: each container is its own VM)");
    }
    let apparmor = spec.process().as_ref().and_then(|p| p.apparmor_profile().clone());
    let selinux = spec.process().as_ref().and_then(|p| p.selinux_label().clone());
    for (what, label) in [("AppArmor profile", apparmor), ("SELinux label", selinux)] {
        if let Some(label) = label.filter(|l| !l.is_empty()) {
            log::warn!("the {what} {label:?} is not applied: it names host policy the guest kernel has not");
        }
    }
    Ok(())
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
        let p = init_process(&s).expect("runnable");
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
    /// `--with-ns`, or a pod's sandbox); none for a new empty one or the
    /// host's; and for a CRI container (outside its pod's VM), whose path is `/proc/PID/ns/net` of
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
            Some(PathBuf::from("/var/run/netns/cni-1")),
            "the sandbox's VM is the pod's, and takes the pod's network"
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
        let p = init_process(&s).expect("runnable");
        assert_eq!(p.argv, ["/bin/sh", "-c", KEEPER]);
        assert_eq!(p.root, Root::Guest);
        let mut s = s;
        s.set_annotations(Some([(CRI_CONTAINER_TYPE.to_owned(), "container".to_owned())].into()));
        let p = init_process(&s).expect("runnable");
        assert_eq!((p.argv.as_slice(), &p.root), (["/bin/sh".to_owned()].as_slice(), &Root::Workspace));
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
    fn a_terminal_is_asked_for_and_the_user_is_the_agents_to_take_on() {
        let tty =
            serde_json::json!({"terminal": true, "args": ["sh"], "cwd": "/", "user": {"uid": 0, "gid": 0}});
        assert!(exec_process(tty.to_string().as_bytes(), None).expect("runnable").terminal);
        let pipes = serde_json::json!({"args": ["sh"], "cwd": "/", "user": {"uid": 0, "gid": 0}});
        assert!(!exec_process(pipes.to_string().as_bytes(), None).expect("runnable").terminal);
        let user = serde_json::json!({"args": ["id"], "cwd": "/",
                                      "user": {"uid": 1000, "gid": 1001, "additionalGids": [5]}});
        let p = exec_process(user.to_string().as_bytes(), None).expect("runnable");
        assert_eq!(p.argv, ["id"], "no setpriv: the agent switches the user");
        let c = p.confinement.expect("confined");
        assert_eq!((c.uid, c.gid, c.additional_gids.as_slice()), (1000, 1001, [5].as_slice()));
    }

    /// Empty capability sets, `noNewPrivileges`, rlimits and sysctls reach
    /// the agent as asked; no capabilities object leaves the sets alone.
    #[test]
    fn capabilities_rlimits_and_sysctls_become_the_confinement() {
        let s = spec(serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sh"], "cwd": "/", "user": {"uid": 0, "gid": 0}, "noNewPrivileges": true,
                        "capabilities": {"bounding": [], "effective": [], "permitted": [], "inheritable": [],
                                         "ambient": []},
                        "rlimits": [{"type": "RLIMIT_NOFILE", "soft": 64, "hard": 128}]},
            "linux": {"sysctl": {"net.ipv4.ip_forward": "1"}}
        }));
        let c = init_process(&s).expect("runnable").confinement.expect("confined");
        assert_eq!(c.capabilities, Some(Capabilities::default()), "every set empty");
        assert!(c.no_new_privileges);
        assert_eq!(c.rlimits, [Rlimit { resource: 7, soft: 64, hard: 128 }]);
        assert_eq!(c.sysctl, [("net.ipv4.ip_forward".to_owned(), "1".to_owned())]);

        let mut s = s;
        let mut process = s.process().clone().expect("a process");
        let every: oci_spec::runtime::Capabilities = serde_json::from_value(serde_json::json!([
            "CAP_CHOWN",
            "CAP_DAC_OVERRIDE",
            "CAP_DAC_READ_SEARCH",
            "CAP_FOWNER",
            "CAP_FSETID",
            "CAP_KILL",
            "CAP_SETGID",
            "CAP_SETUID",
            "CAP_SETPCAP",
            "CAP_LINUX_IMMUTABLE",
            "CAP_NET_BIND_SERVICE",
            "CAP_NET_BROADCAST",
            "CAP_NET_ADMIN",
            "CAP_NET_RAW",
            "CAP_IPC_LOCK",
            "CAP_IPC_OWNER",
            "CAP_SYS_MODULE",
            "CAP_SYS_RAWIO",
            "CAP_SYS_CHROOT",
            "CAP_SYS_PTRACE",
            "CAP_SYS_PACCT",
            "CAP_SYS_ADMIN",
            "CAP_SYS_BOOT",
            "CAP_SYS_NICE",
            "CAP_SYS_RESOURCE",
            "CAP_SYS_TIME",
            "CAP_SYS_TTY_CONFIG",
            "CAP_MKNOD",
            "CAP_LEASE",
            "CAP_AUDIT_WRITE",
            "CAP_AUDIT_CONTROL",
            "CAP_SETFCAP",
            "CAP_MAC_OVERRIDE",
            "CAP_MAC_ADMIN",
            "CAP_SYSLOG",
            "CAP_WAKE_ALARM",
            "CAP_BLOCK_SUSPEND",
            "CAP_AUDIT_READ",
            "CAP_PERFMON",
            "CAP_BPF",
            "CAP_CHECKPOINT_RESTORE"
        ]))
        .expect("capabilities");
        assert_eq!(mask(&Some(every)).expect("all known"), (1 << 41) - 1, "each name is its own bit");
        process.set_capabilities(None);
        s.set_process(Some(process));
        assert_eq!(init_process(&s).expect("runnable").confinement.expect("confined").capabilities, None);
    }

    /// Each thing a VM cannot honour is refused with its own reason;
    /// containerd's default devices and a label are not.
    #[test]
    fn what_a_vm_cannot_honour_is_refused_with_its_reason() {
        let base = serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sh"], "cwd": "/", "user": {"uid": 0, "gid": 0},
                        "apparmorProfile": "cri-containerd.apparmor.d"},
            "linux": {"devices": [{"path": "/dev/null", "type": "c", "major": 1, "minor": 3}],
                      "namespaces": [{"type": "pid"}]}
        });
        assert!(init_process(&spec(base.clone())).is_ok(), "default devices, a label, a new pid namespace");
        let refused = |change: &dyn Fn(&mut serde_json::Value), reason: &str| {
            let mut json = base.clone();
            change(&mut json);
            let err = init_process(&spec(json)).expect_err(reason).to_string();
            assert!(err.contains(reason), "{err}");
        };
        refused(&|j| j["hooks"] = serde_json::json!({"prestart": [{"path": "/bin/true"}]}), "hooks");
        refused(
            &|j| {
                j["linux"]["devices"][0] =
                    serde_json::json!({"path": "/dev/sda", "type": "b", "major": 8, "minor": 0})
            },
            "host device /dev/sda",
        );
        refused(
            &|j| j["linux"]["namespaces"][0]["path"] = "/proc/1/ns/pid".into(),
            "joining a pid namespace",
        );
        refused(
            &|j| {
                j["linux"]["seccomp"] = serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW",
                    "syscalls": [{"names": ["ioctl"], "action": "SCMP_ACT_NOTIFY"}]})
            },
            "SCMP_ACT_NOTIFY",
        );
        refused(&|j| j["process"]["user"]["username"] = "nobody".into(), "a user by name");
    }

    /// A seccomp profile becomes the init process's filter, and an exec
    /// into the container runs under the same one.
    #[test]
    fn the_seccomp_profile_confines_the_init_process_and_its_execs() {
        let s = spec(serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sh"], "cwd": "/", "user": {"uid": 0, "gid": 0}},
            "linux": {"seccomp": {"defaultAction": "SCMP_ACT_ALLOW",
                                  "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_ERRNO"}]}}
        }));
        let init = init_process(&s).expect("runnable").confinement.expect("confined");
        let seccomp = init.seccomp.expect("a filter");
        assert!(!seccomp.programs.is_empty());
        let exec = serde_json::json!({"args": ["sh"], "cwd": "/", "user": {"uid": 0, "gid": 0}});
        let exec = exec_process(exec.to_string().as_bytes(), Some(&seccomp)).expect("runnable");
        assert_eq!(exec.confinement.expect("confined").seccomp, Some(seccomp));
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
