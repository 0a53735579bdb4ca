//! `pvisor serve`, `pvisor image`, and the hidden `pvisor
//! sandbox-supervisor` the daemon starts for each sandbox.

use anyhow::{bail, Context};

use pvisor::Runtime;
use pvisor_server::images::ImageStore;
use pvisor_server::supervisor::{Supervisor, SupervisorOptions};
use pvisor_vm::VmExecutor;

use crate::cli::{ImageArgs, ImageCommand, SandboxSupervisorArgs, ServeArgs};
use crate::json::{json_line, JsonType};

/// Its logs were started by `dispatch`, before the runtime was built.
pub fn cmd_serve(runtime: &Runtime, args: ServeArgs) -> anyhow::Result<i32> {
    let store = runtime.store();
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
    warm_default_template(runtime.clone());
    let built_in_images = pvisor_server::images::built_in_found();
    pvisor_server::serve(pvisor_server::ServeOptions {
        listen: args.listen,
        api_key,
        config: pvisor_server::Config {
            state_root: store.root().to_path_buf(),
            pvisor: exe,
            max_timeout: args.max_timeout,
            log_level: args.log_level,
            volumes: volume_config(store.root(), &args.volume_root, args.volume_dir.clone())?,
        },
        built_in_images,
        max_connections: args.max_connections.map(|n| n as usize),
    })?;
    Ok(0)
}

/// Where volumes may come from: each `--volume-root` (canonical, so a
/// request is compared with the directory itself), and the named volumes'
/// directory, by default beside the state directory (never in it: every
/// sandbox has pvisor's state hidden).
fn volume_config(
    state: &std::path::Path,
    roots: &[std::path::PathBuf],
    named: Option<std::path::PathBuf>,
) -> anyhow::Result<pvisor_server::volumes::VolumeConfig> {
    let roots = roots
        .iter()
        .map(|root| {
            std::fs::canonicalize(root)
                .with_context(|| format!("--volume-root {}: no such directory", root.display()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let named = named.unwrap_or_else(|| {
        let name =
            state.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "pvisor".into());
        state.with_file_name(format!("{name}-volumes"))
    });
    Ok(pvisor_server::volumes::VolumeConfig { roots, named })
}

/// Builds the template of the default sandbox shape (512 MiB, 1 vCPU, as
/// the lifecycle API defaults) in the background, so the first create
/// restores rather than boots. A sandbox created meanwhile boots, and its
/// Placement says why.
fn warm_default_template(runtime: Runtime) {
    let _ = std::thread::Builder::new().name("pvisor-warm-template".into()).spawn(move || {
        let limits = pvisor_core::records::ResourceLimits {
            memory_bytes: Some(512 << 20),
            cpus: Some(1.0),
            ..Default::default()
        };
        match runtime.execute(pvisor::actions::WarmTemplate { limits }) {
            Ok(t) => tracing::info!(template = %t.id, built = t.built, build_ms = ?t.build_ms, "default vm template ready"),
            Err(e) => tracing::warn!(error = %e, "cannot warm the default vm template; sandboxes boot instead"),
        }
    });
}

pub fn cmd_image(runtime: &Runtime, args: ImageArgs) -> anyhow::Result<i32> {
    let images = ImageStore::new(runtime.store());
    match args.command {
        ImageCommand::Import { name, source, json } => {
            if !json {
                eprintln!("pvisor: importing {} as {name} ...", source.display());
            }
            let record = images.import(&name, &source)?;
            if json {
                json_line(&mut crate::output::stdout(), JsonType::Result, &record)?;
                return Ok(0);
            }
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
            let mut out = crate::output::stdout();
            for record in &list {
                if json {
                    json_line(&mut out, JsonType::Image, record)?;
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
        ImageCommand::Warm { name, memory_mib, cpus, json } => {
            if let Some(name) = &name {
                if !images.list()?.iter().any(|r| &r.name == name) {
                    bail!("no image {name:?} is imported; `pvisor image ls` lists them");
                }
            }
            let limits = pvisor_core::records::ResourceLimits {
                memory_bytes: Some(memory_mib << 20),
                cpus: Some(cpus as f64),
                ..Default::default()
            };
            if !json {
                eprintln!(
                    "pvisor: building the vm template for {memory_mib} MiB, {cpus} vCPU (one boot) ..."
                );
            }
            let warmed = runtime.execute(pvisor::actions::WarmTemplate { limits })?;
            if json {
                let line = serde_json::json!({"template": warmed.id, "dir": warmed.dir, "build_ms": warmed.build_ms});
                json_line(&mut crate::output::stdout(), JsonType::Result, &line)?;
                return Ok(0);
            }
            match warmed.build_ms {
                Some(ms) => {
                    println!("{}: built in {:.1} s ({})", warmed.id, ms as f64 / 1000.0, warmed.dir.display())
                }
                None => println!("{}: already built and verified ({})", warmed.id, warmed.dir.display()),
            }
        }
        ImageCommand::Templates { json } => {
            let list = runtime.execute(pvisor::actions::ListTemplates)?;
            let mut out = crate::output::stdout();
            for t in &list {
                if json {
                    json_line(&mut out, JsonType::Template, t)?;
                } else {
                    use std::io::Write;
                    let shape = t.manifest.as_ref().map_or("(unreadable manifest)".to_owned(), |m| {
                        format!(
                            "{} MiB, {} vCPU, {}",
                            m.key.memory_mib,
                            m.key.cpus,
                            m.key.accelerator.as_str()
                        )
                    });
                    let stale = if t.stale { "  stale (removed by `pvisor gc`)" } else { "" };
                    writeln!(out, "{}  {:>8.1} MB  {shape}{stale}", t.id, t.bytes as f64 / 1e6)?;
                }
            }
            if list.is_empty() && !json {
                eprintln!("no vm templates; the first vm start builds one, or run `pvisor image warm`");
            }
        }
        ImageCommand::RmTemplate { id, json } => {
            let bytes = runtime.execute(pvisor::actions::RemoveTemplate { id: id.clone() })?;
            if json {
                let line = serde_json::json!({"template": id, "bytes": bytes});
                json_line(&mut crate::output::stdout(), JsonType::Result, &line)?;
                return Ok(0);
            }
            println!("removed {id} ({:.1} MB)", bytes as f64 / 1e6);
        }
    }
    Ok(0)
}

/// Its logs were started by `dispatch`, before the runtime was built.
pub fn cmd_sandbox_supervisor(runtime: &Runtime, args: SandboxSupervisorArgs) -> anyhow::Result<i32> {
    let store = runtime.store().clone();
    let options = SupervisorOptions {
        bind: args.bind,
        workspace: args.workspace,
        memory_mib: args.memory_mib,
        cpus: args.cpus,
        resume: args.resume,
        network_policy: args.network_policy,
        volumes: args.volumes,
    };
    let supervisor = Supervisor::prepare(store, options)?;
    super::run::drive(runtime, super::run::Shown::quiet(true), move || Ok(supervisor.start()?))
}
