//! `deploy/node-install.sh` against the real containerd's own reading of
//! the configs it writes (`containerd config dump`): the runtime is
//! registered beside runc, a second install changes nothing, uninstall takes
//! out exactly what install put in, and an operator's own entry is kept.

// A test program: it writes fixtures; clippy.toml's lints are for the
// libraries' own code.
#![allow(clippy::disallowed_methods, clippy::disallowed_macros, clippy::unwrap_used)]

#[allow(dead_code)]
#[path = "containerd/harness.rs"]
mod harness;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use harness::{repo, text};

/// What Debian's containerd package ships: no runtimes of its own, so
/// containerd's defaults (runc) apply.
const DEBIAN_CONFIG: &str = "version = 2\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    [plugins.\"io.containerd.grpc.v1.cri\".cni]\n      bin_dir = \"/usr/lib/cni\"\n";

struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().expect("tempdir");
        let from = dir.path().join("from/bin");
        fs::create_dir_all(&from).unwrap();
        fs::create_dir_all(dir.path().join("from/share/pvisor/vm-image")).unwrap();
        fs::write(dir.path().join("from/share/pvisor/vm-image/manifest.json"), "{}").unwrap();
        // The shim as built; in place of pvisor too, which this crate does
        // not build (the script copies both alike).
        let shim = PathBuf::from(env!("CARGO_BIN_EXE_containerd-shim-pvisor-v1"));
        for name in ["containerd-shim-pvisor-v1", "pvisor"] {
            fs::copy(&shim, from.join(name)).expect("the shim is built");
        }
        Node { dir }
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("etc/containerd/config.toml")
    }

    fn prefix(&self) -> PathBuf {
        self.dir.path().join("node/usr/local")
    }

    fn script(&self, action: &str) -> Output {
        Command::new(repo().join("deploy/node-install.sh"))
            .arg(action)
            .arg("--from")
            .arg(self.dir.path().join("from"))
            .arg("--prefix")
            .arg(self.prefix())
            .arg("--config")
            .arg(self.config())
            .output()
            .expect("deploy/node-install.sh runs")
    }

    fn ok(&self, action: &str) -> String {
        let out = self.script(action);
        assert!(out.status.success(), "node-install.sh {action}: {}", text(&out.stderr));
        text(&out.stderr)
    }

    /// The runtimes containerd reads from the config, with their types.
    fn runtimes(&self) -> String {
        let out = Command::new("containerd")
            .arg("--config")
            .arg(self.config())
            .args(["config", "dump"])
            .output()
            .expect("containerd runs");
        assert!(out.status.success(), "containerd config dump: {}", text(&out.stderr));
        let dump = text(&out.stdout);
        let mut runtimes = Vec::new();
        let mut current = None;
        for line in dump.lines().map(str::trim) {
            if let Some(name) = line
                .strip_prefix("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.")
                .and_then(|rest| rest.strip_suffix(']'))
                .filter(|name| !name.contains('.'))
            {
                current = Some(name.to_owned());
            } else if let (Some(name), Some(kind)) = (&current, line.strip_prefix("runtime_type = ")) {
                runtimes.push(format!("{name}={}", kind.trim_matches('"')));
                current = None;
            }
        }
        runtimes.join(" ")
    }
}

fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[test]
#[ignore = "needs containerd (scripts/containerd-env.sh install): scripts/test.sh runs it as root, with --include-ignored"]
fn the_node_installer_registers_the_runtime_beside_runc_and_takes_out_only_its_own() {
    let installed = Command::new(repo().join("scripts/containerd-env.sh")).arg("install").status();
    assert!(installed.is_ok_and(|s| s.success()), "containerd is installed");
    let node = Node::new();
    fs::create_dir_all(node.config().parent().unwrap()).unwrap();
    fs::write(node.config(), DEBIAN_CONFIG).unwrap();
    assert_eq!(node.runtimes(), "runc=io.containerd.runc.v2", "Debian's config runs runc alone");

    // Install: the binaries and the guest image, and the runtime beside runc.
    let said = node.ok("install");
    assert!(said.contains("so that runc stays"), "{said}");
    assert_eq!(node.runtimes(), "pvisor=io.containerd.pvisor.v1 runc=io.containerd.runc.v2");
    for binary in ["pvisor", "containerd-shim-pvisor-v1"] {
        assert!(executable(&node.prefix().join("bin").join(binary)), "{binary} is installed");
    }
    assert!(node.prefix().join("share/pvisor/vm-image/manifest.json").exists());
    assert_eq!(
        fs::read_to_string(node.config().with_extension("toml.pvisor-backup")).unwrap(),
        DEBIAN_CONFIG,
        "the original is kept"
    );

    // Again: nothing changes.
    let before = fs::read(node.config()).unwrap();
    assert!(node.ok("install").contains("already registers"));
    assert_eq!(fs::read(node.config()).unwrap(), before, "a second install leaves the config as it was");

    // Uninstall: the runtime and the files go; runc stays.
    node.ok("uninstall");
    assert_eq!(node.runtimes(), "runc=io.containerd.runc.v2");
    assert!(!node.prefix().join("bin/containerd-shim-pvisor-v1").exists());
    assert!(!fs::read_to_string(node.config()).unwrap().contains("pvisor"));

    // An entry the operator wrote is theirs: kept, not doubled.
    let own = format!(
        "{}\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.pvisor]\n  runtime_type = \"io.containerd.pvisor.v1\"\n  pod_annotations = [\"x\"]\n",
        fs::read_to_string(node.config()).unwrap()
    );
    fs::write(node.config(), &own).unwrap();
    assert!(node.ok("install").contains("written by hand"));
    assert_eq!(fs::read_to_string(node.config()).unwrap(), own);
}

/// containerd 2.x reads config version 3, where CRI's runtimes live under
/// `io.containerd.cri.v1.runtime` (containerd's `docs/cri/config.md`).
/// Debian 12 has no containerd 2, so this checks the text alone.
#[test]
fn a_version_3_config_gets_the_containerd_2_table() {
    let node = Node::new();
    fs::create_dir_all(node.config().parent().unwrap()).unwrap();
    let v3 = "version = 3\n\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n  runtime_type = 'io.containerd.runc.v2'\n";
    fs::write(node.config(), v3).unwrap();
    node.ok("install");
    let written = fs::read_to_string(node.config()).unwrap();
    assert!(written.starts_with(v3), "the operator's config is kept: {written}");
    assert!(
        written.contains("[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.pvisor]\n  runtime_type = \"io.containerd.pvisor.v1\""),
        "{written}"
    );
    node.ok("uninstall");
    assert_eq!(fs::read_to_string(node.config()).unwrap(), v3);
}

#[test]
fn a_version_1_config_or_an_unknown_option_is_refused_with_what_to_do() {
    let node = Node::new();
    fs::create_dir_all(node.config().parent().unwrap()).unwrap();
    fs::write(node.config(), "version = 1\n[plugins.cri.containerd.runtimes.runc]\n  runtime_type = \"x\"\n")
        .unwrap();
    let out = node.script("install");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("containerd config migrate"), "{}", text(&out.stderr));
    let out =
        Command::new(repo().join("deploy/node-install.sh")).args(["install", "--bogus"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("unknown option --bogus"), "{}", text(&out.stderr));
}

/// A config whose pvisor block lost its end marker, and a config that is a
/// symlink, are refused and left exactly as they were.
#[test]
fn a_config_that_is_a_symlink_or_has_an_unended_block_is_refused_untouched() {
    let node = Node::new();
    let dir = node.config().parent().unwrap().to_owned();
    fs::create_dir_all(&dir).unwrap();
    let unended = "version = 2\n# BEGIN pvisor (node-install.sh): runtime io.containerd.pvisor.v1, CRI handler \"pvisor\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n";
    fs::write(node.config(), unended).unwrap();
    let out = node.script("install");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("mend the config by hand"), "{}", text(&out.stderr));
    assert_eq!(fs::read_to_string(node.config()).unwrap(), unended, "nothing of it is dropped");

    let real = dir.join("real.toml");
    fs::write(&real, DEBIAN_CONFIG).unwrap();
    fs::remove_file(node.config()).unwrap();
    std::os::unix::fs::symlink(&real, node.config()).unwrap();
    let out = node.script("install");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("is a symlink"), "{}", text(&out.stderr));
    assert!(fs::symlink_metadata(node.config()).unwrap().file_type().is_symlink(), "the link is kept");
    assert_eq!(fs::read_to_string(&real).unwrap(), DEBIAN_CONFIG);
}
