//! The proxy's cost, against a direct connection measured in the same run.
//!
//! `cargo bench -p pvisor-cli --bench network` runs, inside pvisor sandboxes,
//! a download of 1 GiB and 1,000 small sequential requests from a loopback
//! HTTP server, once through the allowlist proxy (`--allow 127.0.0.1:PORT`) and
//! once direct (`--net host`), and prints throughput (target: proxy ≥ 70% of
//! direct) and the median added latency per request; then the latency the
//! credential broker adds (`--secret`: each request parsed and its
//! `x-api-key` substituted) over the same proxy without a binding.
//!
//! Under `cargo test` (no `--bench`) it runs once with tiny sizes.

// A test (or benchmark) program: it writes fixtures and says what it measured
// or skipped; clippy.toml's lints are for the libraries' own code.
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

#[path = "support/table.rs"]
mod table;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;

fn server(big: u64) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").map_or(0, |p| p + 4);
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end);
                    if head.contains("/big") {
                        let _ = write!(stream, "HTTP/1.1 200 OK\r\nContent-Length: {big}\r\n\r\n");
                        let zeros = vec![0u8; 1 << 20];
                        let mut left = big;
                        while left > 0 {
                            let n = left.min(zeros.len() as u64) as usize;
                            if stream.write_all(&zeros[..n]).is_err() {
                                return;
                            }
                            left -= n as u64;
                        }
                    } else if stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

fn in_sandbox(home: &std::path::Path, ws: &std::path::Path, net: &[&str], script: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_pvisor"))
        .arg("run")
        .arg("-q")
        .args(net)
        .args(["--", "python3", "-c", script])
        .current_dir(ws)
        .env("PVISOR_HOME", home)
        .env("BENCH_KEY", "bench-real-value")
        .output()
        .expect("pvisor");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

const CLIENT: &str = r#"
import os, sys, time, socket, urllib.request, statistics
proxy = os.environ.get("http_proxy")
for name in ("no_proxy", "NO_PROXY"):  # the proxy's own default exempts 127.0.0.1
    os.environ.pop(name, None)
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy} if proxy else {}))
opener.addheaders = [("x-api-key", os.environ.get("BENCH_KEY", "none"))]
mode, url, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "big":
    t = time.perf_counter(); total = 0
    with opener.open(url) as r:
        while True:
            b = r.read(1 << 20)
            if not b: break
            total += len(b)
    print(total / (time.perf_counter() - t))
else:
    lat = []
    for _ in range(n):
        t = time.perf_counter(); opener.open(url).read(); lat.append(time.perf_counter() - t)
    print(statistics.median(lat))
"#;

fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    let (big, small_n) = if measuring { (1u64 << 30, 1000) } else { (1 << 20, 20) };
    let port = server(big);
    let dir = tempfile::tempdir().expect("tempdir");
    let (ws, home) = (dir.path().join("ws"), dir.path().join("state"));
    std::fs::create_dir(&ws).expect("ws");
    let script = |mode: &str, path: &str, n: usize| {
        format!("import sys; sys.argv = ['c', '{mode}', 'http://127.0.0.1:{port}/{path}', '{n}']\n{CLIENT}")
    };
    let allow = format!("127.0.0.1:{port}");
    let proxy = ["--allow", allow.as_str()];
    let direct = ["--net", "host"];
    let rate =
        |net: &[&str]| in_sandbox(&home, &ws, net, &script("big", "big", 0)).parse::<f64>().unwrap_or(0.0);
    // Interleaved samples, medians: on 2 cores one download is noisy.
    let samples = if measuring { 5 } else { 1 };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let interleaved = |f: &dyn Fn(bool) -> f64| {
        let (mut via, mut raw) = (Vec::new(), Vec::new());
        for _ in 0..samples {
            via.push(f(true));
            raw.push(f(false));
        }
        (median(via), median(raw))
    };
    let (via, raw) = interleaved(&|through_proxy| rate(if through_proxy { &proxy } else { &direct }));
    println!(
        "network benchmark ({} mode, medians of {samples})",
        if measuring { "measuring" } else { "smoke" }
    );
    println!(
        "download {} MiB: proxy {:.0} MiB/s, direct {:.0} MiB/s: {:.0}% of direct (target >= 70%)",
        big >> 20,
        via / 1048576.0,
        raw / 1048576.0,
        100.0 * via / raw
    );
    table::row(
        &format!("download {} MiB through the proxy", big >> 20),
        "MiB/s",
        via / 1048576.0,
        None,
        "direct (--net host)",
        raw / 1048576.0,
    );
    // The HTTPS path: a CONNECT tunnel (curl -p), against the same direct download.
    let tunnel = |net: &[&str], via_proxy: bool| {
        let flags = if via_proxy { "--noproxy '' -p" } else { "" };
        let cmd = format!("import subprocess; print(subprocess.run(\"curl -s {flags} -o /dev/null -w '%{{speed_download}}' http://127.0.0.1:{port}/big\", shell=True, capture_output=True, text=True).stdout)");
        in_sandbox(&home, &ws, net, &cmd).parse::<f64>().unwrap_or(0.0)
    };
    let (via, raw) = interleaved(&|through_proxy| {
        if through_proxy {
            tunnel(&proxy, true)
        } else {
            tunnel(&direct, false)
        }
    });
    println!(
        "download {} MiB through a CONNECT tunnel: proxy {:.0} MiB/s, direct {:.0} MiB/s: {:.0}% of direct",
        big >> 20,
        via / 1048576.0,
        raw / 1048576.0,
        100.0 * via / raw
    );
    let latency = |net: &[&str]| {
        in_sandbox(&home, &ws, net, &script("small", "small", small_n)).parse::<f64>().unwrap_or(0.0)
    };
    let (via, raw) = (latency(&proxy), latency(&direct));
    println!(
        "{small_n} small requests: median {:.3} ms via proxy, {:.3} ms direct: +{:.3} ms per request",
        via * 1e3,
        raw * 1e3,
        (via - raw) * 1e3
    );
    // The broker: the same requests with the key bound to the server, so
    // the proxy parses each one and puts the value into its header.
    let secret = format!("BENCH_KEY@127.0.0.1:{port}");
    let brokered = ["--allow", allow.as_str(), "--secret", secret.as_str()];
    let (bound, unbound) = interleaved(&|bound| latency(if bound { &brokered } else { &proxy }));
    println!(
        "{small_n} small requests with --secret: median {:.3} ms brokered, {:.3} ms proxied unbound: +{:.3} ms per request",
        bound * 1e3,
        unbound * 1e3,
        (bound - unbound) * 1e3
    );
}
