//! `pvisor serve`: a single-node daemon that speaks the OpenSandbox
//! lifecycle and execd APIs over pvisor's vm sandboxes.
//!
//! - [`sandbox`]: records, the state machine, and the operations (each
//!   sandbox is a vm Job with its own supervisor process).
//! - [`lifecycle`] and [`execd`]: the two APIs; [`handle`] is the one router,
//!   so tests drive it without a socket.
//! - [`images`]: the named root filesystems sandboxes boot.
//!
//! Paths: the lifecycle API under `/v1/…` and `/…`; a sandbox's execd under
//! `/sandboxes/{id}/port/44772/…` (what `endpoints/44772` returns, with the
//! `X-EXECD-ACCESS-TOKEN` header); `GET /health` without auth.

mod bash_sessions;
pub mod execd;
pub mod http;
pub mod images;
pub mod lifecycle;
pub mod multipart;
pub mod sandbox;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};

pub use http::Body;
pub use sandbox::{Config, Daemon};

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
    let mut response = match route(&daemon, api_key.as_deref().map(String::as_str), req).await {
        Ok(r) => r,
        Err(e) => {
            // The access log names errors; successful polling stays quiet.
            eprintln!(
                "pvisor serve: {request_id} {method} {path} -> {} {} ({} ms): {}",
                e.status.as_u16(),
                e.code,
                started.elapsed().as_millis(),
                e.message
            );
            e.into_response()
        }
    };
    if method != Method::GET && response.status().is_success() {
        eprintln!(
            "pvisor serve: {request_id} {method} {path} -> {} ({} ms)",
            response.status().as_u16(),
            started.elapsed().as_millis()
        );
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
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    let query = parts.uri.query().map(str::to_owned);
    let segments: Vec<String> = path.split('/').filter(|s| !s.is_empty()).map(http::percent_decode).collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    match segments.as_slice() {
        ["health"] | ["v1", "health"] if parts.method == Method::GET => {
            return Ok(http::json(StatusCode::OK, &serde_json::json!({ "status": "healthy" })))
        }
        // A sandbox's own ports: execd authenticates with its access token.
        ["sandboxes", id, "port", port, rest @ ..] | ["v1", "sandboxes", id, "port", port, rest @ ..] => {
            return if *port == sandbox::EXECD_PORT.to_string() {
                execd::route(daemon, id, &parts.method, rest, query.as_deref(), &parts.headers, body).await
            } else {
                Err(ApiError::new(
                    StatusCode::NOT_IMPLEMENTED,
                    "PORT_NOT_REACHABLE",
                    format!(
                        "port {port} of sandbox {id} cannot be proxied: pvisor sandboxes have no network device, so only the execd API (port {}) is served (docs/cli-reference.md)",
                        sandbox::EXECD_PORT
                    ),
                ))
            };
        }
        _ => {}
    }
    if let Some(key) = api_key {
        let given = parts.headers.get("open-sandbox-api-key").map(|v| v.as_bytes()).unwrap_or(b"");
        if !http::constant_time_eq(given, key.as_bytes()) {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "UNAUTHORIZED",
                "missing or wrong OPEN-SANDBOX-API-KEY header",
            ));
        }
    }
    let rest = match segments.as_slice() {
        ["v1", rest @ ..] => rest,
        rest => rest,
    };
    let body = http::read_body(body, LIFECYCLE_BODY_LIMIT).await?;
    lifecycle::route(daemon, &parts.method, rest, query.as_deref(), &parts.headers, body).await
}

/// How `pvisor serve` was asked to run.
#[derive(Debug)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    pub api_key: Option<String>,
    pub config: Config,
    /// The built default image's rootfs, imported as `default` when newer.
    pub default_image: Option<PathBuf>,
}

/// Runs the daemon until SIGTERM or SIGINT, then applies the shutdown policy
/// (pause every Running sandbox; see [`Daemon::shutdown`]).
pub fn serve(options: ServeOptions) -> anyhow::Result<()> {
    if options.api_key.is_none() && !options.listen.ip().is_loopback() {
        anyhow::bail!(
            "refusing to listen on {} without an API key: pass --api-key-file, or listen on 127.0.0.1",
            options.listen
        );
    }
    let daemon = Daemon::open(options.config)?;
    if let Some(built) = &options.default_image {
        if let Err(e) = daemon.images.ensure_default(built) {
            eprintln!("pvisor serve: warning: the default image is not available: {e}");
        }
    }
    daemon.recover();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let api_key = options.api_key.map(Arc::new);
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(options.listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", options.listen))?;
        eprintln!(
            "pvisor serve: listening on http://{} ({} sandboxes on record{})",
            listener.local_addr()?,
            daemon.list().len(),
            if api_key.is_some() { "; OPEN-SANDBOX-API-KEY required" } else { "; no API key (loopback only)" }
        );
        let expiry = {
            let daemon = daemon.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let d = daemon.clone();
                    let _ = tokio::task::spawn_blocking(move || d.expire()).await;
                }
            })
        };
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let (daemon, api_key) = (daemon.clone(), api_key.clone());
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req| {
                            let (daemon, api_key) = (daemon.clone(), api_key.clone());
                            async move { Ok::<_, std::convert::Infallible>(handle(daemon, api_key, req).await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await;
                    });
                }
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
        expiry.abort();
        eprintln!("pvisor serve: stopping: pausing running sandboxes (they resume on request after a restart)");
        let d = daemon.clone();
        tokio::task::spawn_blocking(move || d.shutdown()).await?;
        Ok(())
    })
}
