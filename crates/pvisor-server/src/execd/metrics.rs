//! `GET /metrics`: the guest's CPU and memory, from its /proc.

use std::path::Path;
use std::time::Duration;

use hyper::StatusCode;
use serde_json::json;

use super::Guest;
use crate::http::{self, json, ApiError, ApiResult};

pub(super) fn metrics(guest: &Guest) -> ApiResult {
    let read = |p: &str| -> Result<String, ApiError> {
        Ok(String::from_utf8_lossy(&guest.read(Path::new(p), 0, 1 << 20)?).into_owned())
    };
    let meminfo = read("/proc/meminfo")?;
    let kib = |key: &str| -> f64 {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0.0)
    };
    let (total, available) = (kib("MemTotal:"), kib("MemAvailable:"));
    let cpu = || -> Result<(f64, f64), ApiError> {
        let stat = read("/proc/stat")?;
        let fields: Vec<f64> = stat
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .filter_map(|n| n.parse().ok())
            .collect();
        let idle = fields.get(3).copied().unwrap_or(0.0) + fields.get(4).copied().unwrap_or(0.0);
        Ok((fields.iter().sum(), idle))
    };
    let (t0, i0) = cpu()?;
    std::thread::sleep(Duration::from_millis(100));
    let (t1, i1) = cpu()?;
    let used = if t1 > t0 { 100.0 * (1.0 - (i1 - i0) / (t1 - t0)) } else { 0.0 };
    let cpus = read("/proc/stat")?.lines().filter(|l| l.starts_with("cpu") && !l.starts_with("cpu ")).count();
    Ok(json(
        StatusCode::OK,
        &json!({
            "cpu_count": cpus as f64,
            "cpu_used_pct": (used * 10.0).round() / 10.0,
            "mem_total_mib": total / 1024.0,
            "mem_used_mib": (total - available) / 1024.0,
            "timestamp": http::unix_ms(),
        }),
    ))
}
