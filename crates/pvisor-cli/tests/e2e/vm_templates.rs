//! VM templates: a vm Job starts by restoring a saved, freshly booted guest.
//! Clones must never share random state or a writable layer; a corrupt,
//! half-built or concurrently built template must end in a rebuild or a
//! boot, never in a restore of bad state.

use std::fs;
use std::path::PathBuf;

use crate::support::*;
use crate::vm::require_image;

/// Prints this guest's random bytes, machine-id and hostname, and stages a file.
const IDENTITY: &str = "echo rand $(od -An -tx1 -N16 /dev/urandom | tr -d ' \\n'); \
     echo mid $(cat /etc/machine-id); echo host $(hostname); echo seen > mark-$$";

fn run_vm(env: &Env, script: &str) -> (String, String) {
    let out = env.pvisor(&["run", "-q", "--executor", "vm", "--", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(0), "stdout: {}\nstderr: {}", text(&out.stdout), text(&out.stderr));
    (text(&out.stdout), text(&out.stderr))
}

fn field(out: &str, name: &str) -> String {
    let prefix = format!("{name} ");
    out.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {name} in {out:?}"))
        .trim()
        .to_owned()
}

/// The last Job's `attempt.vm` facts: how its VM started.
fn start_facts(env: &Env) -> serde_json::Value {
    let status = env.status_json(None);
    let job = status["job"].as_str().unwrap().to_owned();
    env.events(&job)
        .into_iter()
        .find(|e| e["type"] == "attempt.vm")
        .map(|e| e["data"].clone())
        .expect("an attempt.vm event")
}

fn templates(env: &Env) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(env.home.join("vm-templates"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    found.sort();
    found
}

#[test]
fn clones_of_one_template_never_share_random_state_or_identity() {
    require_image();
    let env = Env::new(As::Root);
    // The first start builds the template; the next ones restore it, at once.
    run_vm(&env, "true");
    let clones: Vec<_> = (0..3)
        .map(|_| {
            let mut cmd = env.command(&["run", "-q", "--executor", "vm", "--", "sh", "-c", IDENTITY]);
            cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
            cmd.spawn().unwrap()
        })
        .collect();
    let outs: Vec<String> = clones
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
            text(&out.stdout)
        })
        .collect();
    for name in ["rand", "mid"] {
        let mut values: Vec<String> = outs.iter().map(|o| field(o, name)).collect();
        assert!(values.iter().all(|v| v.len() == 32), "{name}: {values:?}");
        values.sort();
        values.dedup();
        assert_eq!(values.len(), 3, "clones of one template repeated their {name}: {outs:?}");
    }
    // Every clone restored the same template, reseeded with host entropy.
    let jobs = env.expect(&["jobs", "--json"], 0);
    let ids: Vec<String> =
        records_of(&jobs, "job").iter().map(|j| j["job"].as_str().unwrap().to_owned()).collect();
    let mut restored_from = Vec::new();
    for job in &ids {
        let facts = env.events(job).into_iter().find(|e| e["type"] == "attempt.vm").unwrap();
        if facts["data"]["start"]["mode"] == "template-restore" {
            assert_eq!(facts["data"]["restored"]["entropy_reseeded_bytes"], 64, "{facts}");
            restored_from.push(facts["data"]["start"]["template"].as_str().unwrap().to_owned());
        }
    }
    assert!(restored_from.len() >= 3, "{restored_from:?}");
    restored_from.dedup();
    assert_eq!(restored_from.len(), 1, "one template served every clone");
    // Private writable layers: each clone staged only its own file.
    for job in &ids {
        let review = env.expect(&["review", job, "--json"], 0);
        assert!(records_of(&review, "change").len() <= 1, "a clone saw another's upper layer: {review}");
    }
    assert_eq!(templates(&env).len(), 1);
}

#[test]
fn a_corrupt_template_is_rebuilt_never_restored() {
    require_image();
    let env = Env::new(As::Root);
    run_vm(&env, "true");
    let template = templates(&env).pop().expect("a published template");
    // Flip a byte of the saved RAM where the guest wrote data.
    let memory = template.join("memory");
    let data = rustix::fs::seek(fs::File::open(&memory).unwrap(), rustix::fs::SeekFrom::Data(0)).unwrap();
    let file = fs::OpenOptions::new().read(true).write(true).open(&memory).unwrap();
    let mut byte = [0u8; 1];
    std::os::unix::fs::FileExt::read_at(&file, &mut byte, data).unwrap();
    std::os::unix::fs::FileExt::write_at(&file, &[byte[0] ^ 0xff], data).unwrap();
    drop(file);

    let (out, _) = run_vm(&env, "echo alive");
    assert_eq!(out.trim(), "alive");
    let facts = start_facts(&env);
    assert_eq!(facts["start"]["mode"], "template-restore", "{facts}");
    // The corrupt copy was moved aside and a fresh one built and verified.
    let moved: Vec<_> = fs::read_dir(env.home.join("vm-templates"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".bad-"))
        .collect();
    assert_eq!(moved.len(), 1, "the corrupt template is kept aside for inspection");
    assert!(template.join("manifest.json").is_file(), "rebuilt in place");

    // A truncated state file: the same.
    fs::OpenOptions::new().write(true).open(template.join("state")).unwrap().set_len(100).unwrap();
    let (out, _) = run_vm(&env, "echo again");
    assert_eq!(out.trim(), "again");
}

#[test]
fn without_templates_a_vm_boots_and_the_placement_says_why() {
    require_image();
    let env = Env::new(As::Root);
    let out = env
        .command(&["run", "-q", "--executor", "vm", "--", "true"])
        .env("PVISOR_VM_TEMPLATES", "off")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let facts = start_facts(&env);
    assert_eq!(facts["start"]["mode"], "boot");
    assert!(facts["start"]["reason"].as_str().unwrap().contains("PVISOR_VM_TEMPLATES=off"), "{facts}");
    let job = env.status_json(None)["job"].as_str().unwrap().to_owned();
    let placement = env.events(&job).into_iter().find(|e| e["type"] == "placement.decided").unwrap();
    let details = &placement["data"]["details"];
    assert_eq!(details["start"], "boot", "{placement}");
    assert!(details["boot_reason"].as_str().unwrap().contains("PVISOR_VM_TEMPLATES=off"), "{placement}");
    assert!(templates(&env).is_empty(), "no template is built when they are off");
}

#[test]
fn concurrent_first_starts_build_one_template_and_all_succeed() {
    require_image();
    let env = Env::new(As::Root);
    let children: Vec<_> = (0..3)
        .map(|_| {
            let mut cmd = env.command(&["run", "-q", "--executor", "vm", "--", "echo", "ok"]);
            cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
            cmd.spawn().unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout).trim(), "ok");
    }
    assert_eq!(templates(&env).len(), 1, "exactly one template for one key");
    let leftovers: Vec<_> = fs::read_dir(env.home.join("vm-templates"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".partial-"))
        .collect();
    assert!(leftovers.is_empty(), "a finished build leaves no partial directory");
}

#[test]
fn a_builder_killed_mid_build_leaves_nothing_a_clone_would_restore() {
    require_image();
    let env = Env::new(As::Root);
    // SIGKILL after the state is saved, before the manifest is published.
    let out = env
        .command(&["run", "-q", "--executor", "vm", "--", "true"])
        .env("PVISOR_FAILPOINT", "template-after-save")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), None, "the failpoint kills pvisor: {}", text(&out.stderr));
    assert!(templates(&env).iter().all(|t| !t.file_name().unwrap().to_string_lossy().starts_with("tpl-")));
    // The next start sweeps the partial build, rebuilds, and restores.
    let (out, _) = run_vm(&env, "echo next");
    assert_eq!(out.trim(), "next");
    assert_eq!(start_facts(&env)["start"]["mode"], "template-restore");
    let names: Vec<String> = fs::read_dir(env.home.join("vm-templates"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.starts_with(".partial-")), "{names:?}");
}

#[test]
fn a_full_disk_while_building_a_template_boots_and_says_so() {
    require_image();
    if !is_root() {
        return; // mounting the small filesystem needs root
    }
    let env = Env::new(As::Root);
    // A private mount namespace with a 90 MiB state directory: room for a
    // booted Job, not for a 512 MiB guest's RAM file.
    let script = format!(
        "mount -t tmpfs -o size=90m tmpfs {home} && {bin} run -q --executor vm -- echo booted && {bin} events --json",
        home = env.home.display(),
        bin = bin()
    );
    fs::create_dir_all(&env.home).unwrap();
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .current_dir(&env.ws)
        .env("PVISOR_HOME", &env.home)
        .env("PVISOR_VM_IMAGE", vm_image().unwrap())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().next(), Some("booted"), "{stdout}");
    // The records live on the tmpfs, gone with the namespace: read them here.
    let events: String = stdout.lines().skip(1).map(|l| format!("{l}\n")).collect();
    let vm = records_of(&events, "event")
        .into_iter()
        .find(|e| e["type"] == "attempt.vm")
        .expect("an attempt.vm event");
    assert_eq!(vm["data"]["start"]["mode"], "boot", "{vm}");
    let reason = vm["data"]["start"]["reason"].as_str().unwrap();
    assert!(reason.contains("SIGBUS") && reason.contains("MiB free"), "{reason}");
}

#[test]
fn a_template_that_verifies_but_will_not_restore_is_set_aside_and_the_job_boots() {
    require_image();
    let env = Env::new(As::Root);
    run_vm(&env, "true");
    let template = templates(&env).pop().unwrap();
    // Device state QEMU cannot load (as from another QEMU build), with a
    // manifest whose digests match it: verification passes, the restore fails.
    let state = template.join("state");
    fs::write(&state, b"QEVM\0\0\0\x03not a device state this QEMU can load").unwrap();
    let manifest_path = template.join("manifest.json");
    let mut manifest: serde_json::Value = serde_json::from_slice(&fs::read(&manifest_path).unwrap()).unwrap();
    let bytes = fs::read(&state).unwrap();
    for file in manifest["files"].as_array_mut().unwrap() {
        if file["name"] == "state" {
            file["size"] = bytes.len().into();
            file["blake3"] = blake3::hash(&bytes).to_hex().to_string().into();
        }
    }
    fs::write(&manifest_path, serde_json::to_vec(&manifest).unwrap()).unwrap();

    let (out, _) = run_vm(&env, "echo booted");
    assert_eq!(out.trim(), "booted");
    let facts = start_facts(&env);
    assert_eq!(facts["start"]["mode"], "boot", "{facts}");
    let reason = facts["start"]["reason"].as_str().unwrap();
    assert!(reason.contains("restoring the template") && reason.contains("moved aside"), "{reason}");
    // The next start rebuilds it and restores again.
    run_vm(&env, "true");
    assert_eq!(start_facts(&env)["start"]["mode"], "template-restore");
}
