//! `endpoints/{port}` for ports other than execd: HTTP requests relayed to
//! a service listening on guest `127.0.0.1:port`. The guest has no network
//! device, so the bytes travel over the VM's agent channel
//! ([`crate::guest_link::forward`]), one stream per request.
//! Requests need the sandbox's access token like execd; the token is not
//! passed on to the service.

use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{HeaderMap, Method, Request, Response, StatusCode};

use crate::guest_link;

use crate::http::{self, ApiError, ApiResult};
use crate::sandbox::Daemon;

/// Largest request body relayed to a sandbox service.
const BODY_LIMIT: usize = 64 << 20;

/// Headers that describe one hop, not the request.
const HOP: &[&str] =
    &["connection", "keep-alive", "transfer-encoding", "upgrade", "proxy-connection", "te", "trailer"];

#[allow(clippy::too_many_arguments)]
pub async fn route<B>(
    daemon: &Arc<Daemon>,
    id: &str,
    port: u16,
    method: &Method,
    raw_rest: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: B,
) -> ApiResult
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let link = {
        let (daemon, id, headers) = (daemon.clone(), id.to_owned(), headers.clone());
        tokio::task::spawn_blocking(move || -> Result<_, ApiError> {
            crate::execd::check_token(&daemon.visible(&id)?, &headers)?;
            daemon.accessed(&id);
            Ok(daemon.live_link(&id)?.1)
        })
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??
    };
    let slot = daemon.stream_slot(id)?;
    let bytes = http::read_body(body, BODY_LIMIT).await?;
    let unreachable = |why: String| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "PORT_NOT_REACHABLE",
            format!("port {port} of sandbox {id}: {why}"),
        )
    };
    let stream = tokio::task::spawn_blocking(move || guest_link::forward(&link, port))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| unreachable(e.0))?;
    stream.set_nonblocking(true).map_err(|e| ApiError::internal(e.to_string()))?;
    let io = tokio::net::UnixStream::from_std(stream).map_err(|e| ApiError::internal(e.to_string()))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    tokio::spawn(connection);

    let target = match query {
        Some(q) => format!("/{raw_rest}?{q}"),
        None => format!("/{raw_rest}"),
    };
    // Hop-by-hop headers (and those `Connection` names), and pvisor's own
    // credentials, stay here: the service is the sandbox's, not trusted.
    let named: Vec<String> = headers
        .get_all("connection")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|n| n.trim().to_ascii_lowercase()))
        .collect();
    let mut request = Request::builder().method(method.clone()).uri(&target);
    for (name, value) in headers {
        let name_s = name.as_str();
        let skip = HOP.contains(&name_s)
            || named.iter().any(|n| n == name_s)
            || ["host", "x-execd-access-token", "open-sandbox-api-key", "expect"].contains(&name_s);
        if !skip {
            request = request.header(name, value);
        }
    }
    let request = request
        .header("host", format!("127.0.0.1:{port}"))
        .body(Full::new(bytes))
        .map_err(|e| ApiError::bad_request(format!("cannot relay this request: {e}")))?;
    let response =
        sender.send_request(request).await.map_err(|e| unreachable(format!("the service failed: {e}")))?;

    let (parts, mut incoming) = response.into_parts();
    let (tx, body) = http::channel_body(16);
    tokio::spawn(async move {
        let _slot = slot;
        while let Some(Ok(frame)) = incoming.frame().await {
            if let Ok(data) = frame.into_data() {
                if tx.send(data).await.is_err() {
                    return;
                }
            }
        }
    });
    let mut out = Response::new(body);
    *out.status_mut() = parts.status;
    for (name, value) in &parts.headers {
        if !HOP.contains(&name.as_str()) {
            out.headers_mut().append(name, value.clone());
        }
    }
    Ok(out)
}
