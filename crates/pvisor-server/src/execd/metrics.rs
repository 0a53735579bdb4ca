//! `GET /metrics` and `GET /metrics/watch`: the guest's CPU and memory,
//! from its /proc.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Bytes;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::events::sse;
use super::Guest;
use crate::http::{self, json, ApiError, ApiResult, Body};

pub(super) fn metrics(guest: &Guest) -> ApiResult {
    Ok(json(StatusCode::OK, &sample(guest)?))
}

/// `/metrics/watch`: a sample each second, each a JSON line, as the
/// reference streams them (components/execd/pkg/web/controller/metric.go,
/// `WatchMetrics`: the metrics object and a newline, not `data:` framed;
/// a failed read is `{"error": ...}`), until the client goes. A failed read
/// also ends the stream here: a guest that stopped answering (paused,
/// deleted) does not come back on this link.
pub(super) fn watch(guest: Guest) -> Response<Body> {
    let (tx, body) = http::channel_body(4);
    let guest = Arc::new(guest);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let from = guest.clone();
            let (line, last) = match tokio::task::spawn_blocking(move || sample(&from)).await {
                Ok(Ok(metrics)) => (metrics, false),
                Ok(Err(e)) => (json!({ "error": e.message }), true),
                Err(e) => (json!({ "error": e.to_string() }), true),
            };
            if tx.send(Bytes::from(format!("{line}\n"))).await.is_err() || last {
                return;
            }
        }
    });
    sse(body)
}

/// One sample: CPU use over 100 ms, memory now (the spec's `Metrics`).
fn sample(guest: &Guest) -> Result<Value, ApiError> {
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
    Ok(json!({
        "cpu_count": cpus as f64,
        "cpu_used_pct": (used * 10.0).round() / 10.0,
        "mem_total_mib": total / 1024.0,
        "mem_used_mib": (total - available) / 1024.0,
        "timestamp": http::unix_ms(),
    }))
}
