//! `pvisor cache ls|prune`: the stores `pvisor run --cache` keeps what runs
//! add in (`$PVISOR_HOME/caches/<name>-<digest>/`: `upper/`, `work/`, the
//! host `path`, and `use.lock`, held by the run using it).

use std::fs;
use std::path::PathBuf;

use pvisor::runtime::gc;

use crate::cli::{CacheAction, CacheArgs};
use crate::output::{json_line, shown_path};

struct Cache {
    store: PathBuf,
    path: PathBuf,
    bytes: u64,
}

fn caches(store: &pvisor_core::store::Store) -> anyhow::Result<Vec<Cache>> {
    let dir = store.caches_dir();
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(anyhow::anyhow!("cannot list {}: {e}", dir.display())),
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let store_dir = entry.path();
        let path = fs::read(store_dir.join("path"))
            .map(|b| PathBuf::from(std::ffi::OsString::from(String::from_utf8_lossy(&b).into_owned())))
            .unwrap_or_default();
        out.push(Cache { bytes: gc::size_of(&store_dir.join("upper")), store: store_dir, path });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

pub fn cmd_cache(args: CacheArgs) -> anyhow::Result<i32> {
    let store = super::open_store()?;
    match args.action {
        CacheAction::Ls { json } => {
            let mut out = std::io::stdout().lock();
            for cache in caches(&store)? {
                let in_use = pvisor_sandbox::CacheMount::hold(&cache.store).is_none();
                if json {
                    json_line(
                        &mut out,
                        "cache",
                        &serde_json::json!({"path": cache.path, "store": cache.store, "bytes": cache.bytes, "in_use": in_use}),
                    )?;
                } else {
                    use std::io::Write;
                    writeln!(
                        out,
                        "{:>10}  {}{}",
                        format!("{:.1} MiB", cache.bytes as f64 / (1 << 20) as f64),
                        shown_path(&cache.path),
                        if in_use { "  (in use)" } else { "" }
                    )?;
                }
            }
        }
        CacheAction::Prune { paths } => {
            let wanted: Vec<PathBuf> =
                paths.iter().map(|p| fs::canonicalize(p).unwrap_or_else(|_| p.clone())).collect();
            let (mut freed, mut removed) = (0u64, 0usize);
            for cache in caches(&store)? {
                if !wanted.is_empty() && !wanted.contains(&cache.path) {
                    continue;
                }
                let Some(_held) = pvisor_sandbox::CacheMount::hold(&cache.store) else {
                    eprintln!("pvisor: kept the cache of {}: a run is using it", shown_path(&cache.path));
                    continue;
                };
                gc::remove_tree(&cache.store)
                    .map_err(|(at, e)| anyhow::anyhow!("cannot remove {}: {e}", at.display()))?;
                freed += cache.bytes;
                removed += 1;
            }
            println!("removed {removed} cache(s), {:.1} MiB", freed as f64 / (1 << 20) as f64);
        }
    }
    Ok(0)
}
