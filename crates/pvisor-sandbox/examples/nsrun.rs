//! Runs one command in an `ns` sandbox over a workspace, staging into a given dir:
//! `nsrun WORKSPACE STAGE_DIR PROGRAM [ARGS...]`. For poking at the executor by hand.

use pvisor_sandbox::ns::{maybe_run_helper, NsExecutor};
use pvisor_sandbox::{Executor, SandboxSpec};

fn main() {
    maybe_run_helper();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (workspace, stage) = (std::fs::canonicalize(&args[0]).unwrap(), std::path::PathBuf::from(&args[1]));
    for d in ["upper", "work", "root"] {
        std::fs::create_dir_all(stage.join(d)).unwrap();
    }
    let stage = std::fs::canonicalize(stage).unwrap();
    let spec = SandboxSpec {
        cwd: workspace.clone(),
        workspace,
        upper: stage.join("upper"),
        work: stage.join("work"),
        root_mount: stage.join("root"),
        hidden: vec![stage.clone()],
        program: args[2].clone(),
        args: args[3..].to_vec(),
        env: std::env::vars().collect(),
        hostname: "pvisor".into(),
    };
    match NsExecutor.start(&spec) {
        Ok(p) => println!("{:?}", p.wait()),
        Err(e) => println!("error: {e} hint: {:?}", e.hint()),
    }
}
