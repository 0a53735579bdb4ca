//! `pvisor serve`, `pvisor image`, and the hidden `pvisor
//! sandbox-supervisor` the daemon starts for each sandbox.

use anyhow::{bail, Context};

use pvisor_sandbox::vm::VmExecutor;
use pvisor_server::images::ImageStore;
use pvisor_server::supervisor::{Supervisor, SupervisorOptions};

use crate::cli::{ImageArgs, ImageCommand, SandboxSupervisorArgs, ServeArgs};
use crate::output::json_line;

pub fn cmd_serve(args: ServeArgs) -> anyhow::Result<i32> {
    pvisor_server::logging::init(args.log_level.as_deref())?;
    let store = super::open_store()?;
    let api_key = match &args.api_key_file {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("Cannot read the API key file {}", path.display()))?;
            let key = text.lines().next().unwrap_or("").trim().to_owned();
            if key.len() < 16 {
                bail!(
                    "the API key in {} is shorter than 16 characters; use a long random key",
                    path.display()
                );
            }
            Some(key)
        }
    };
    let exe = std::env::current_exe().context("Cannot find the pvisor binary")?;
    // The vm image must be installed before the first sandbox (fails early if missing).
    VmExecutor::prepare(store.root())?;
    let built_in_images = pvisor_server::images::built_in_found();
    pvisor_server::serve(pvisor_server::ServeOptions {
        listen: args.listen,
        api_key,
        config: pvisor_server::Config {
            state_root: store.root().to_path_buf(),
            pvisor: exe,
            max_timeout: args.max_timeout,
            log_level: args.log_level,
        },
        built_in_images,
    })?;
    Ok(0)
}

pub fn cmd_image(args: ImageArgs) -> anyhow::Result<i32> {
    let store = super::open_store()?;
    let images = ImageStore::new(&store);
    match args.command {
        ImageCommand::Import { name, source } => {
            eprintln!("pvisor: importing {} as {name} ...", source.display());
            let record = images.import(&name, &source)?;
            println!(
                "{}: imported from {} ({}; {} files, {:.1} MB)",
                record.name,
                record.source,
                record.kind,
                record.files,
                record.bytes as f64 / 1e6
            );
        }
        ImageCommand::Ls { json } => {
            let list = images.list()?;
            let mut out = std::io::stdout().lock();
            for record in &list {
                if json {
                    json_line(&mut out, "image", record)?;
                } else {
                    use std::io::Write;
                    writeln!(
                        out,
                        "{:<32} {:<10} {:>8.1} MB  {}  {}",
                        record.name,
                        record.kind,
                        record.bytes as f64 / 1e6,
                        record.imported_at,
                        record.source
                    )?;
                }
            }
            if list.is_empty() && !json {
                eprintln!("no images; `pvisor serve` imports `default`, or run `pvisor image import NAME DIR|TAR|OCI-LAYOUT`");
            }
        }
    }
    Ok(0)
}

pub fn cmd_sandbox_supervisor(args: SandboxSupervisorArgs) -> anyhow::Result<i32> {
    pvisor_server::logging::init(args.log_level.as_deref())?;
    let store = super::open_store()?;
    let options = SupervisorOptions {
        bind: args.bind,
        workspace: args.workspace,
        memory_mib: args.memory_mib,
        cpus: args.cpus,
        resume: args.resume,
        network_policy: args.network_policy,
    };
    let supervisor = Supervisor::prepare(store, options)?;
    super::run::drive(true, move || Ok(supervisor.start()?))
}
