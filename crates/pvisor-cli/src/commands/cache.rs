//! `pvisor cache ls|prune`: the stores `pvisor run --cache` keeps what runs
//! add in (`$PVISOR_HOME/caches/<name>-<digest>/`: `upper/`, `work/`, the
//! host `path`, and `use.lock`, held by the run using it).

use std::fs;
use std::path::PathBuf;

use pvisor::actions::{ListCaches, PruneCache};
use pvisor::Runtime;

use crate::cli::{CacheAction, CacheArgs};
use crate::json::{json_line, JsonType};
use crate::output::shown_path;

pub fn cmd_cache(runtime: &Runtime, args: CacheArgs) -> anyhow::Result<i32> {
    match args.action {
        CacheAction::Ls { json } => {
            let mut out = crate::output::stdout();
            for cache in runtime.execute(ListCaches)? {
                let in_use = cache.in_use;
                if json {
                    json_line(
                        &mut out,
                        JsonType::Cache,
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
        CacheAction::Prune { paths, json } => {
            let wanted: Vec<PathBuf> =
                paths.iter().map(|p| fs::canonicalize(p).unwrap_or_else(|_| p.clone())).collect();
            let (mut freed, mut removed, mut kept) = (0u64, 0usize, Vec::new());
            for cache in runtime.execute(ListCaches)? {
                if !wanted.is_empty() && !wanted.contains(&cache.path) {
                    continue;
                }
                if !runtime.execute(PruneCache { store: cache.store.clone() })? {
                    kept.push(cache.path.clone());
                    crate::output::note(&format!(
                        "kept the cache of {}: a run is using it",
                        shown_path(&cache.path)
                    ));
                    continue;
                }
                freed += cache.bytes;
                removed += 1;
            }
            if json {
                let line = serde_json::json!({"removed": removed, "bytes": freed, "kept_in_use": kept});
                json_line(&mut crate::output::stdout(), JsonType::Result, &line)?;
                return Ok(0);
            }
            println!("removed {removed} cache(s), {:.1} MiB", freed as f64 / (1 << 20) as f64);
        }
    }
    Ok(0)
}
