//! State directories made after a sandbox started stay closed to it: a
//! sandbox's mount namespace is fixed at its start, so what protects them
//! is their mode (`close_to_sandboxes`), checked here against a root
//! sandbox, the one whose uid owns them.

use std::io::{BufRead, BufReader, Write};

use super::*;

/// A root sandbox that started before a state directory existed (one named
/// by `PVISOR_HOME=elsewhere`, and the containerd shim's `/var/lib/pvisor`
/// when this host has none) cannot list it or read a Job's staged file in
/// it, though it does see a 0700 root directory made at the same moment.
/// It runs without seccomp, so it may also try from a user namespace of its
/// own. A sandbox started once the shim's directory exists has it hidden.
#[test]
#[ignore = "needs root: scripts/test.sh runs it as root, with --include-ignored"]
fn a_state_directory_made_after_a_root_sandbox_started_is_closed_to_it() {
    As::Root.require();
    let env = Env::new(As::Root);
    // Outside /tmp: the sandbox's /tmp is private, which would hide it anyway.
    let base = tempfile::Builder::new().prefix("pvisor-e2e-later-").tempdir_in("/var/tmp").unwrap();
    let mut later = vec![base.path().join("state")];
    let shim_root = Path::new(pvisor_core::store::SHIM_STATE_ROOT);
    // Removed however the test ends, if this test made it.
    let _made_shim_root = (!shim_root.exists()).then(|| {
        later.push(shim_root.to_owned());
        RemoveOnDrop(shim_root)
    });
    // The probe reads the paths to try from stdin, once they exist.
    let probe = r#"echo READY
        read control
        cat "$control" 2>/dev/null
        while read root stage; do
            [ -e "$root" ] && echo "SEES $root"
            ls "$root" 2>/dev/null | grep -q runs && echo "LISTED $root"
            cat "$stage" 2>/dev/null
            unshare -r cat "$stage" 2>/dev/null
            unshare -r ls "$root" 2>/dev/null | grep -q runs && echo "LISTED $root"
        done
        echo PROBED"#;
    let mut sandbox = env
        .command(&["run", "-q", "--no-seccomp", "--", "sh", "-c", probe])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(sandbox.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "READY\n", "the sandbox started");

    // Made after the sandbox started: a control directory like a state
    // directory of old (0700, root's), and the state directories.
    let control = base.path().join("control");
    fs::create_dir(&control).unwrap();
    fs::set_permissions(&control, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    fs::write(control.join("secret"), "CONTROL-SECRET\n").unwrap();
    let ws = base.path().join("ws");
    fs::create_dir(&ws).unwrap();
    let mut paths = format!("{}\n", control.join("secret").display());
    for root in &later {
        let out = env
            .command(&["run", "-q", "--", "sh", "-c", "echo STAGED-SECRET > secret.txt"])
            .env("PVISOR_HOME", root)
            .current_dir(&ws)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let run = fs::read_dir(root.join("runs")).unwrap().flatten().next().unwrap().path();
        let stage = run.join("stage/upper/secret.txt");
        assert_eq!(fs::read_to_string(&stage).unwrap(), "STAGED-SECRET\n", "the Job staged it");
        paths.push_str(&format!("{} {}\n", root.display(), stage.display()));
    }
    let mut stdin = sandbox.stdin.take().unwrap();
    stdin.write_all(paths.as_bytes()).unwrap();
    drop(stdin);
    let mut seen = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut seen).unwrap();
    let status = sandbox.wait().unwrap();
    assert!(status.success(), "{seen}");
    assert!(seen.contains("PROBED") && seen.contains("CONTROL-SECRET"), "the probe ran: {seen}");
    for root in &later {
        assert!(seen.contains(&format!("SEES {}", root.display())), "made after the start, yet seen: {seen}");
        assert!(!seen.contains(&format!("LISTED {}", root.display())), "{seen}");
    }
    assert!(!seen.contains("STAGED-SECRET"), "a later Job's staged file was read: {seen}");
    if let Some(made) = &_made_shim_root {
        let out = env.pvisor(&["run", "-q", "--", "ls", "-A", made.0.to_str().unwrap()]);
        assert!(out.status.success() && text(&out.stdout).is_empty(), "{}", text(&out.stdout));
        let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
        let hidden = env.events(&job).into_iter().any(|e| {
            e["type"] == "admission.rewrite"
                && e["data"]["reason"] == "another pvisor state directory"
                && e["data"]["path"] == made.0.to_str().unwrap()
        });
        assert!(hidden, "the shim's state directory is hidden and recorded");
    }
    for root in &later {
        use std::os::unix::fs::MetadataExt;
        let meta = fs::metadata(root).unwrap();
        assert_eq!((meta.mode() & 0o7777, meta.uid(), meta.gid()), (0, 0, 65534), "{}", root.display());
    }
}

struct RemoveOnDrop<'a>(&'a Path);

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(self.0);
    }
}
