//! `endpoints/{port}` for ports other than execd: HTTP requests relayed to
//! a service listening on guest `127.0.0.1:port`. The guest has no network
//! device, so the bytes travel over the VM's agent channel
//! ([`crate::guest_link::forward`]), one stream per request.
//! Requests need the sandbox's access token like execd; the token is not
//! passed on to the service.
//!
//! An upgrade (a WebSocket, or any `Connection: upgrade` request) is passed
//! on with its `Upgrade` header; when the service answers 101, the client's
//! connection and the guest stream are joined and bytes flow both ways until
//! either side closes. The relay holds the sandbox's stream slot and the
//! client connection's place ([`conns::Place`]), so upgraded connections
//! count against the same limits as streamed responses.

use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{HeaderMap, Method, Request, Response, StatusCode};

use crate::conns;
use crate::guest_link;

use crate::http::{self, ApiError, ApiResult};
use crate::sandbox::Daemon;

/// Largest request body relayed to a sandbox service.
const BODY_LIMIT: usize = 64 << 20;

/// Headers that describe one hop, not the request.
const HOP: &[&str] =
    &["connection", "keep-alive", "transfer-encoding", "upgrade", "proxy-connection", "te", "trailer"];

/// Where a relayed request goes: the guest port, and the path and query as
/// the client wrote them.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub port: u16,
    pub raw_rest: &'a str,
    pub query: Option<&'a str>,
}

/// A request that asks to switch protocols: the protocol it names, hyper's
/// handle on the client connection, and that connection's place.
#[derive(Debug)]
pub struct Upgrade {
    protocol: hyper::header::HeaderValue,
    client: hyper::upgrade::OnUpgrade,
    place: Option<conns::Place>,
}

impl Upgrade {
    /// The upgrade `parts` asks for, if any (`Connection: upgrade` and an
    /// `Upgrade` protocol).
    pub fn of(parts: &mut hyper::http::request::Parts) -> Option<Self> {
        let asks = parts
            .headers
            .get_all("connection")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade")));
        let protocol = parts.headers.get("upgrade")?.clone();
        if !asks {
            return None;
        }
        let client = parts.extensions.remove::<hyper::upgrade::OnUpgrade>()?;
        Some(Self { protocol, client, place: parts.extensions.get::<conns::Place>().cloned() })
    }
}

pub async fn route<B>(
    daemon: &Arc<Daemon>,
    id: &str,
    target: Target<'_>,
    method: &Method,
    headers: &HeaderMap,
    upgrade: Option<Upgrade>,
    body: B,
) -> ApiResult
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let port = target.port;
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
    tokio::spawn(connection.with_upgrades());

    let request = relayed_request(target, method, headers, upgrade.as_ref(), bytes)?;
    let mut response =
        sender.send_request(request).await.map_err(|e| unreachable(format!("the service failed: {e}")))?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Ok(streamed(response, slot));
    }
    // The service is untrusted: a switch nobody asked for is its error,
    // not something to pass on to a client that cannot take it.
    let upgrade = upgrade.ok_or_else(|| unreachable("the service switched protocols unasked".into()))?;
    let guest = hyper::upgrade::on(&mut response);
    Ok(switch(response, upgrade, guest, slot))
}

/// The request as the service gets it: hop-by-hop headers (and those
/// `Connection` names), and pvisor's own credentials, stay here: the
/// service is the sandbox's, not trusted. An upgrade keeps its protocol.
fn relayed_request(
    target: Target<'_>,
    method: &Method,
    headers: &HeaderMap,
    upgrade: Option<&Upgrade>,
    bytes: Bytes,
) -> Result<Request<Full<Bytes>>, ApiError> {
    let uri = match target.query {
        Some(q) => format!("/{}?{q}", target.raw_rest),
        None => format!("/{}", target.raw_rest),
    };
    let named: Vec<String> = headers
        .get_all("connection")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|n| n.trim().to_ascii_lowercase()))
        .collect();
    let mut request = Request::builder().method(method.clone()).uri(&uri);
    for (name, value) in headers {
        let name_s = name.as_str();
        let skip = HOP.contains(&name_s)
            || named.iter().any(|n| n == name_s)
            || ["host", "x-execd-access-token", "open-sandbox-api-key", "expect"].contains(&name_s);
        if !skip {
            request = request.header(name, value);
        }
    }
    if let Some(upgrade) = upgrade {
        request = request.header("connection", "upgrade").header("upgrade", upgrade.protocol.clone());
    }
    request
        .header("host", format!("127.0.0.1:{}", target.port))
        .body(Full::new(bytes))
        .map_err(|e| ApiError::bad_request(format!("cannot relay this request: {e}")))
}

/// The service's answer, its body streamed to the client.
fn streamed(
    response: Response<hyper::body::Incoming>,
    slot: crate::sandbox::StreamSlot,
) -> Response<http::Body> {
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
    copy_end_to_end(&parts.headers, out.headers_mut());
    out
}

/// The service switched protocols: the client gets the 101 (with the
/// service's `Upgrade` and its other headers), and the two connections are
/// joined once both sides have been handed over.
fn switch(
    response: Response<hyper::body::Incoming>,
    upgrade: Upgrade,
    guest: hyper::upgrade::OnUpgrade,
    slot: crate::sandbox::StreamSlot,
) -> Response<http::Body> {
    let mut out = http::empty(StatusCode::SWITCHING_PROTOCOLS);
    copy_end_to_end(response.headers(), out.headers_mut());
    // A 1xx has no body (RFC 9110, 8.6): a length the untrusted service
    // put on its 101 would make a client wait for bytes that are the new
    // protocol's.
    out.headers_mut().remove(hyper::header::CONTENT_LENGTH);
    let protocol = response.headers().get("upgrade").cloned().unwrap_or(upgrade.protocol);
    out.headers_mut().insert("connection", hyper::header::HeaderValue::from_static("upgrade"));
    out.headers_mut().insert("upgrade", protocol);
    let held = upgrade.place.map(conns::Place::hold);
    tokio::spawn(async move {
        let _held = (slot, held);
        let (client, guest) = match tokio::join!(upgrade.client, guest) {
            (Ok(client), Ok(guest)) => (client, guest),
            (Err(e), _) | (_, Err(e)) => {
                return tracing::debug!("an upgraded connection was not handed over: {e}")
            }
        };
        let mut client = hyper_util::rt::TokioIo::new(client);
        let mut guest = hyper_util::rt::TokioIo::new(guest);
        let _ = tokio::io::copy_bidirectional(&mut client, &mut guest).await;
    });
    out
}

fn copy_end_to_end(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        if !HOP.contains(&name.as_str()) {
            to.append(name, value.clone());
        }
    }
}
