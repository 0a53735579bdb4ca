//! `pvisor serve`, `pvisor image`, and the hidden `pvisor
//! sandbox-supervisor` the daemon starts for each sandbox.

use std::sync::Arc;

use anyhow::{bail, Context};

use pvisor::runtime::job_service::views;
use pvisor::runtime::suspension;
use pvisor::{JobService, RunRequest};
use pvisor_core::records::JobRecord;
use pvisor_net::{Mode, PolicySpec, Scope, ScopedPolicy};
use pvisor_sandbox::vm::VmExecutor;
use pvisor_server::images::ImageStore;
use pvisor_server::sandbox::{Binding, KEEPER};

use crate::cli::{ImageArgs, ImageCommand, SandboxSupervisorArgs, ServeArgs};
use crate::output::json_line;

pub fn cmd_serve(args: ServeArgs) -> anyhow::Result<i32> {
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
    // PVISOR_SANDBOX_IMAGE (PVISOR_SANDBOX_IMAGE_PYTHON) overrides where
    // `default` (`python`) is built.
    let built_in_images = pvisor_server::images::BUILT_IN
        .iter()
        .filter_map(|(name, asset, variable)| {
            let overridden = std::env::var_os(variable).map(std::path::PathBuf::from);
            let rootfs = overridden.or_else(|| {
                pvisor_core::assets::locate(asset, |d| d.join("rootfs/bin/sh").exists())
                    .ok()
                    .map(|d| d.join("rootfs"))
            })?;
            Some((name.to_string(), rootfs))
        })
        .collect();
    pvisor_server::serve(pvisor_server::ServeOptions {
        listen: args.listen,
        api_key,
        config: pvisor_server::Config {
            state_root: store.root().to_path_buf(),
            pvisor: exe,
            max_timeout: args.max_timeout,
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
    let store = super::open_store()?;
    let bind = args.bind.clone();
    let write_bind = move |run: &pvisor::ManagedJobRun| -> anyhow::Result<()> {
        let binding = Binding { job: run.job().clone(), attempt: run.attempt().number() };
        pvisor_core::store::write_atomic(&bind, &pvisor_core::store::to_json_bytes(&binding))?;
        Ok(())
    };
    if let Some(job) = &args.resume {
        let job = views::resolve_job(&store, Some(job))?;
        let record: JobRecord = store.read(&store.job_file(&job))?;
        let (_, _, manifest) = suspension::resumable(&store, &record)?
            .with_context(|| format!("Job {job} is not suspended; nothing to resume"))?;
        let executor = Arc::new(VmExecutor::for_checkpoint(store.root(), &manifest)?);
        let service = JobService::new(store, executor);
        return super::run::drive(true, move || {
            let run = service.resume(&job).context("Cannot resume")?;
            write_bind(&run)?;
            Ok(run)
        });
    }
    let workspace = args.workspace.context("--workspace or --resume is required")?;
    let ordered: Option<pvisor_net::OrderedPolicy> = args
        .network_policy
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .context("--network-policy is not an ordered policy (JSON)")?;
    let executor = Arc::new(VmExecutor::prepare(store.root())?);
    let request = RunRequest {
        caches: Vec::new(),
        workspace,
        cwd: None,
        program: "/bin/sh".into(),
        args: vec!["-c".into(), KEEPER.into()],
        env: vec![("PATH".into(), "/bin:/sbin:/usr/bin:/usr/sbin".into())],
        kill_grace: std::time::Duration::from_secs(5),
        network: vec![ScopedPolicy {
            scope: Scope::CommandLine,
            source: "pvisor serve".into(),
            spec: PolicySpec {
                mode: Some(if ordered.is_some() { Mode::Proxy } else { Mode::None }),
                allow: Vec::new(),
                deny: Vec::new(),
                ordered,
            },
        }],
        fork: None,
        fork_execution: None,
        secrets: pvisor::admission::SecretPolicy::default(),
        seccomp: true,
        limits: pvisor_core::records::ResourceLimits {
            memory_bytes: Some(args.memory_mib << 20),
            pids: None,
            cpus: Some(f64::from(args.cpus)),
            ..Default::default()
        },
    };
    let service = JobService::new(store, executor);
    super::run::drive(true, move || {
        let run = service.submit(request)?;
        write_bind(&run)?;
        Ok(run)
    })
}
