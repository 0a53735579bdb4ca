//! `pvisor trust [FILE] [--list] [--revoke]`.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};

use pvisor::trust::{self, Trust};
use pvisor_core::text::{escape, Tabs};

use crate::cli::TrustArgs;
use crate::config;
use crate::json::{json_line, JsonType};

pub fn cmd_trust(runtime: &pvisor::Runtime, args: TrustArgs) -> anyhow::Result<i32> {
    let store = runtime.store();
    if args.list {
        return list(store, args.json);
    }
    let file = match args.file {
        Some(f) => f,
        None => {
            std::env::current_dir().context("Cannot read the current directory")?.join(config::WORKSPACE_FILE)
        }
    };
    // The canonical path of the file itself (its directory resolved; a
    // symlink named as the file is refused by `config::read` below).
    let parent = file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let name = file.file_name().with_context(|| format!("{} names no file", file.display()))?;
    let path: PathBuf = std::fs::canonicalize(parent)
        .with_context(|| format!("Cannot resolve {}", parent.display()))?
        .join(name);
    let shown = escape(&path.to_string_lossy(), Tabs::Escape).into_owned();
    if args.revoke {
        if trust::revoke(store, &path)? {
            println!("{shown} is no longer trusted: it may only narrow the policy");
        } else {
            println!("{shown} was not trusted; nothing to revoke");
        }
        return Ok(0);
    }
    let Some(bytes) = config::read(&path)? else {
        bail!("{shown} does not exist; there is nothing to trust");
    };
    // Never trust a file pvisor would refuse to use.
    let parsed = config::parse(&bytes, &path)?;
    let entry = trust::trust(store, &path, &bytes)?;
    println!("trusted {shown} (blake3 {}…)", &entry.blake3[..16]);
    if let Some(network) = parsed.network {
        let mode = network.mode.map_or("unset".to_owned(), |m| m.as_str().to_owned());
        println!(
            "its [network] now applies in full: mode {mode}; allow {:?}; deny {:?}",
            network.allow, network.deny
        );
    }
    println!("any change to the file makes it untrusted again; `pvisor trust --revoke {shown}` undoes this");
    Ok(0)
}

fn list(store: &pvisor_core::store::Store, json: bool) -> anyhow::Result<i32> {
    let mut out = crate::output::stdout();
    let files = trust::list(store)?;
    if files.is_empty() && !json {
        writeln!(out, "no trusted configuration files (`pvisor trust FILE` trusts one)")?;
    }
    for f in files {
        let now = match config::read(&f.path) {
            Ok(Some(bytes)) => match trust::check(store, &f.path, &bytes)? {
                Trust::Trusted => "trusted",
                Trust::Changed | Trust::Untrusted => "changed since (untrusted)",
            },
            Ok(None) => "missing",
            Err(_) => "unreadable (untrusted)",
        };
        if json {
            json_line(
                &mut out,
                JsonType::Trusted,
                &serde_json::json!({"path": f.path, "blake3": f.blake3, "trusted_at": f.trusted_at, "now": now}),
            )?;
        } else {
            writeln!(
                out,
                "{:<26}  {}  {}",
                now,
                f.trusted_at,
                escape(&f.path.to_string_lossy(), Tabs::Escape)
            )?;
        }
    }
    Ok(0)
}
