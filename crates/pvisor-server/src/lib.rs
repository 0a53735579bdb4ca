//! `pvisor serve`: a single-node daemon that speaks the OpenSandbox
//! lifecycle and execd APIs over pvisor's vm sandboxes.
//!
//! - [`sandbox`]: records, the state machine, and the operations (each
//!   sandbox is a vm Job with its own supervisor process).
//! - [`lifecycle`] and [`execd`]: the two APIs; [`handle`] is the one router,
//!   so tests drive it without a socket. `diagnostics`: the lifecycle's
//!   diagnostics routes, as the reference answers them.
//! - [`images`]: the named root filesystems sandboxes boot; [`layers`]
//!   unpacks their archives on the host.
//! - [`conns`]: which client connections are held, and for how long.
//! - [`guest_link`]: the one place the daemon calls into a live VM.
//! - [`supervisor`]: the per-sandbox supervisor process (`pvisor
//!   sandbox-supervisor`); [`logging`]: stderr diagnostics of both.
//!
//! Paths: the lifecycle API under `/v1/…` and `/…`; a sandbox's execd under
//! `/sandboxes/{id}/port/44772/…` (what `endpoints/44772` returns, with the
//! `X-EXECD-ACCESS-TOKEN` header); `GET /health` without auth.

// The lints of clippy.toml (durable record writes, no prints) are for the
// library's own code: its unit tests write fixtures and may say what they do.
#![cfg_attr(test, allow(clippy::disallowed_methods, clippy::disallowed_macros))]

mod code_contexts;
pub mod conns;
mod credential_vault;
mod diagnostics;
mod egress_policy;
pub mod execd;
pub mod guest_link;
pub mod http;
pub mod images;
pub mod layers;
pub mod lifecycle;
mod lines;
pub mod logging;
mod proxy;
mod repl;
pub mod sandbox;
pub mod snapshots;
pub mod supervisor;
pub mod volumes;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};

pub use http::Body;
pub use sandbox::{Config, Daemon, Supervisors};

use http::ApiError;

/// Largest JSON body a lifecycle request may carry.
const LIFECYCLE_BODY_LIMIT: usize = 1 << 20;

/// Routes one request. Every response carries `X-Request-ID` (the client's,
/// or a new one); errors are `{code, message}`.
pub async fn handle<B>(daemon: Arc<Daemon>, api_key: Option<Arc<String>>, req: Request<B>) -> Response<Body>
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let request_id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .map(str::to_owned)
        .unwrap_or_else(http::uuid4);
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let started = std::time::Instant::now();
    let (mut response, failure) = match route(&daemon, api_key.as_deref().map(String::as_str), req).await {
        Ok(r) => (r, None),
        Err(e) => {
            let failure = (e.code, e.message.clone());
            (e.into_response(), Some(failure))
        }
    };
    // The access log: one line per request, naming the error when there was one.
    let (status, ms) = (response.status().as_u16(), started.elapsed().as_millis() as u64);
    match failure {
        None => tracing::info!(request_id, %method, path, status, ms, "request"),
        Some((code, message)) if status >= 500 => {
            tracing::warn!(request_id, %method, path, status, ms, code, message, "request failed")
        }
        Some((code, message)) => {
            tracing::info!(request_id, %method, path, status, ms, code, message, "request refused")
        }
    }
    if let Ok(v) = request_id.parse() {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}

async fn route<B>(daemon: &Arc<Daemon>, api_key: Option<&str>, req: Request<B>) -> http::ApiResult
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    let query = parts.uri.query().map(str::to_owned);
    let segments: Vec<String> =
        path.split('/').filter(|s| !s.is_empty()).map(http::path_segment).collect::<Result<_, _>>()?;
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    match segments.as_slice() {
        ["health"] | ["v1", "health"] if parts.method == Method::GET => {
            return Ok(http::json(StatusCode::OK, &serde_json::json!({ "status": "healthy" })))
        }
        // A sandbox's own ports, authenticated with its access token: execd,
        // or a service of its own relayed into the guest.
        // `/proxy/` is the reference server's name for the same relay.
        ["sandboxes", id, "port" | "proxy", port, rest @ ..]
        | ["v1", "sandboxes", id, "port" | "proxy", port, rest @ ..] => {
            let port: u16 =
                port.parse().map_err(|_| ApiError::bad_request(format!("port {port:?} must be 1-65535")))?;
            if port == sandbox::EXECD_PORT {
                return execd::route(daemon, id, &parts.method, rest, query.as_deref(), &parts.headers, body)
                    .await;
            }
            if port == egress_policy::EGRESS_PORT {
                return egress_policy::route(daemon, id, &parts.method, rest, &parts.headers, body).await;
            }
            // The service sees the path as the client wrote it (not decoded).
            let skip = if segments.first() == Some(&"v1") { 5 } else { 4 };
            let mut raw_rest =
                path.split('/').filter(|s| !s.is_empty()).skip(skip).collect::<Vec<_>>().join("/");
            if path.ends_with('/') && !raw_rest.is_empty() {
                raw_rest.push('/');
            }
            let target = proxy::Target { port, raw_rest: &raw_rest, query: query.as_deref() };
            let upgrade = proxy::Upgrade::of(&mut parts);
            return proxy::route(daemon, id, target, &parts.method, &parts.headers, upgrade, body).await;
        }
        _ => {}
    }
    match api_key {
        Some(key) => {
            let given = parts.headers.get("open-sandbox-api-key").map(|v| v.as_bytes()).unwrap_or(b"");
            if !http::constant_time_eq(given, key.as_bytes()) {
                return Err(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "UNAUTHORIZED",
                    "missing or wrong OPEN-SANDBOX-API-KEY header",
                ));
            }
        }
        None => loopback_only(&parts.headers)?,
    }
    let rest: Vec<String> = match segments.as_slice() {
        ["v1", rest @ ..] => rest,
        rest => rest,
    }
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let body = http::read_body(body, LIFECYCLE_BODY_LIMIT).await?;
    let daemon = daemon.clone();
    tokio::task::spawn_blocking(move || {
        let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
        lifecycle::route(&daemon, &parts.method, &rest, query.as_deref(), &parts.headers, body)
    })
    .await
    .map_err(|e| ApiError::internal(format!("worker failed: {e}")))?
}

/// Without an API key only local, non-browser clients may call: a web page
/// could otherwise reach the daemon (a cross-site POST, or DNS rebinding
/// with a Host that is not loopback).
fn loopback_only(headers: &hyper::HeaderMap) -> Result<(), ApiError> {
    let forbidden = |why: &str| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "FORBIDDEN",
            format!("{why}; without --api-key-file only local non-browser clients are served"),
        )
    };
    if headers.contains_key("origin") {
        return Err(forbidden("requests from web pages (with an Origin header) are refused"));
    }
    let host = headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or("");
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !name.ends_with(':') => name,
        _ => host,
    };
    let loopback = name == "localhost"
        || name
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        return Err(forbidden(&format!("Host {host:?} is not a loopback name")));
    }
    Ok(())
}

/// How `pvisor serve` was asked to run.
#[derive(Debug)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    pub api_key: Option<String>,
    pub config: Config,
    /// The built-in images found built (name → rootfs): `default` is
    /// imported at start when newer, the others when first asked for.
    pub built_in_images: Vec<(String, PathBuf)>,
    /// Overrides the connection limit the descriptor limit allows.
    pub max_connections: Option<usize>,
}

/// Why `pvisor serve` could not start, or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("refusing to listen on {0} without an API key: pass --api-key-file, or listen on 127.0.0.1")]
    NoKeyOffLoopback(SocketAddr),
    #[error("another pvisor serve is using {} ({source}); stop it first", root.display())]
    Locked {
        root: PathBuf,
        #[source]
        source: pvisor_core::store::StoreError,
    },
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] pvisor_core::store::StoreError),
    #[error(transparent)]
    Open(#[from] sandbox::OpenError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("the shutdown worker failed: {0}")]
    Shutdown(#[from] tokio::task::JoinError),
}

/// Runs the daemon until SIGTERM or SIGINT, then applies the shutdown policy
/// (pause every Running sandbox; see [`Daemon::shutdown`]).
pub fn serve(options: ServeOptions) -> Result<(), ServeError> {
    if options.api_key.is_none() && !options.listen.ip().is_loopback() {
        return Err(ServeError::NoKeyOffLoopback(options.listen));
    }
    // One daemon per state directory: a second one would reconcile (and
    // could kill) the first one's sandboxes.
    let server_dir = options.config.state_root.join("server");
    pvisor_core::store::create_dir_all_private(&server_dir)?;
    let _lock = pvisor_core::store::OwnerLock::acquire(&server_dir.join("daemon.lock"))
        .map_err(|source| ServeError::Locked { root: options.config.state_root.clone(), source })?;
    let listener = std::net::TcpListener::bind(options.listen)
        .map_err(|source| ServeError::Listen { addr: options.listen, source })?;
    listener.set_nonblocking(true)?;
    let daemon = Daemon::open(options.config, options.built_in_images.clone())?;
    if let Some((_, built)) = options.built_in_images.iter().find(|(n, _)| n == images::DEFAULT) {
        if let Err(e) = daemon.images.ensure_built_in(images::DEFAULT, built) {
            tracing::warn!("the default image is not available: {e}");
        }
    }
    daemon.recover();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let api_key = options.api_key.map(Arc::new);
    let mut limits = conns::Limits::for_descriptors(conns::nofile());
    if let Some(max) = options.max_connections {
        limits = limits.with_max_connections(max);
    }
    let admission = conns::Admission::new(limits);
    let result = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        tracing::info!(
            "listening on http://{} ({} sandboxes on record{})",
            listener.local_addr()?,
            daemon.list().len(),
            if api_key.is_some() {
                "; OPEN-SANDBOX-API-KEY required"
            } else {
                "; no API key (loopback only)"
            }
        );
        tracing::info!(limits = ?admission.limits(), "connection limits");
        // Its own thread: expiry must go on however busy the request workers are.
        let stop_expiry = Arc::new(std::sync::atomic::AtomicBool::new(false));
        {
            let (daemon, stop) = (daemon.clone(), stop_expiry.clone());
            std::thread::Builder::new().name("pvisor-serve-expiry".into()).spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_secs(1));
                    daemon.expire();
                }
            })?;
        }
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
        loop {
            tokio::select! {
                // Room first, then accept: at the limit, connections wait in
                // the listen backlog rather than being accepted and dropped.
                accepted = async { admission.room().await; listener.accept().await } => match accepted {
                    Ok((stream, peer)) => match admission.admit(peer.ip()) {
                        Some(ticket) => {
                            tokio::spawn(serve_connection(stream, ticket, daemon.clone(), api_key.clone()));
                        }
                        // Every connection in the way is busy: this one is closed.
                        None => drop(stream),
                    },
                    Err(e) if conns::accept_starved(&e) => {
                        tracing::warn!("cannot accept a connection ({e}); backing off");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(_) => {}
                },
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
        stop_expiry.store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::info!("stopping: pausing running sandboxes (they resume on request after a restart)");
        let d = daemon.clone();
        tokio::task::spawn_blocking(move || d.shutdown()).await?;
        Ok::<_, ServeError>(())
    });
    // Streams still open (a sandbox that could not be paused) must not keep
    // the daemon from exiting.
    runtime.shutdown_timeout(Duration::from_secs(5));
    result
}

/// Serves one admitted connection until it closes, times out, or a newer
/// connection takes its place (see [`conns`]).
async fn serve_connection(
    stream: tokio::net::TcpStream,
    ticket: conns::Ticket,
    daemon: Arc<Daemon>,
    api_key: Option<Arc<String>>,
) {
    let limits = ticket.admission_limits();
    let evicted = ticket.evicted.clone();
    let ticket = Arc::new(ticket);
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let (daemon, api_key) = (daemon.clone(), api_key.clone());
        let busy = conns::Busy::new(&ticket);
        let mut req = req.map(|b| conns::IdleBody::new(b, limits.body_idle_timeout));
        req.extensions_mut().insert(conns::Place(ticket.clone()));
        async move {
            let response = handle(daemon, api_key, req).await;
            Ok::<_, std::convert::Infallible>(response.map(|b| conns::hold_busy(b, busy)))
        }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(
            hyper_util::rt::TokioIo::new(conns::StallingIo::new(stream, limits.write_stall_timeout)),
            service,
        )
        // An upgrade (a WebSocket to a sandbox's port) takes the
        // connection over; `conns::Place` keeps it counted meanwhile.
        .with_upgrades();
    tokio::select! {
        _ = connection => {}
        () = evicted.notified() => {}
    }
}

#[cfg(test)]
mod on_fakes;

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> hyper::HeaderMap {
        pairs.iter().map(|(k, v)| (hyper::header::HeaderName::from_static(k), v.parse().unwrap())).collect()
    }

    #[test]
    fn without_a_key_only_local_non_browser_clients_are_served() {
        assert!(loopback_only(&headers(&[("host", "127.0.0.1:8080")])).is_ok());
        assert!(loopback_only(&headers(&[("host", "localhost:8080")])).is_ok());
        assert!(loopback_only(&headers(&[("host", "[::1]:8080")])).is_ok());
        // DNS rebinding: a page served as evil.example that resolves to 127.0.0.1.
        assert!(loopback_only(&headers(&[("host", "evil.example:8080")])).is_err());
        // A cross-site POST from a browser carries an Origin.
        assert!(loopback_only(&headers(&[("host", "127.0.0.1:8080"), ("origin", "https://evil.example")]))
            .is_err());
        assert!(loopback_only(&headers(&[])).is_err());
    }
}
