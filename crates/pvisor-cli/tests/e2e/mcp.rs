//! `pvisor mcp` driven by the official MCP Python SDK (tests/mcp/client.py):
//! the tool list, a session of runs, review, diff, apply of one path, drop
//! of the rest, sensitive-path consent, megabytes of output, bad input,
//! malformed JSON-RPC, and the Trace and receipt resources.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;

fn mcp_python() -> PathBuf {
    let target = Path::new(env!("CARGO_BIN_EXE_pvisor")).parent().unwrap().parent().unwrap();
    let python = target.join("mcp-venv/bin/python");
    assert!(python.exists(), "no MCP SDK venv at {}: run scripts/mcp-env.sh", python.display());
    python
}

fn the_official_python_sdk_drives_pvisor_mcp(who: As) {
    who.require();
    let env = Env::new(who);
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/mcp/client.py");
    // The server runs as the test's user; the client (in the checkout's
    // venv) as whoever runs the suite.
    let server = env.command(&["mcp", "-w", env.ws.to_str().unwrap()]);
    let mut argv: Vec<String> = vec![server.get_program().to_string_lossy().into_owned()];
    argv.extend(server.get_args().map(|a| a.to_string_lossy().into_owned()));
    let mut python = Command::new(mcp_python());
    // As root, one run on the vm executor too (its output goes through the
    // VM link, not the command's descriptors).
    let vm = who == As::Root && vm_image().is_some();
    if let (true, Some(image)) = (vm, vm_image()) {
        python.env("PVISOR_VM_IMAGE", image);
    } else {
        python.env_remove("PVISOR_VM_IMAGE");
    }
    let out = python
        .arg(&client)
        .arg(&env.ws)
        .args(&argv)
        .env("PVISOR_HOME", &env.home)
        .env("HOME", env.dir.path())
        .current_dir(env.dir.path())
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{:?}: {stdout}\n{}", out.status, text(&out.stderr));
    // The probe ran to its end: every check printed, none skipped.
    let checks = 37 + usize::from(vm);
    assert!(stdout.contains(&format!("mcp client: {checks} checks passed")), "{stdout}");
}

#[test]
#[ignore = "needs the MCP Python SDK (scripts/mcp-env.sh)"]
fn the_official_python_sdk_drives_pvisor_mcp_rootless() {
    the_official_python_sdk_drives_pvisor_mcp(As::Rootless);
}

#[test]
#[ignore = "needs root and the MCP Python SDK (scripts/mcp-env.sh)"]
fn the_official_python_sdk_drives_pvisor_mcp_as_root() {
    the_official_python_sdk_drives_pvisor_mcp(As::Root);
}
