//! The HTTP/1.1 relay of a bound connection.
//!
//! A connection to a bound destination (a `CONNECT` whose TLS the proxy
//! terminated with the run's CA, or a plain connection to a forwarded
//! loopback port) is read as HTTP/1.1 instead of being tunnelled blind:
//! each request must name the destination in its `Host` header (else a
//! shared front end, a CDN, could route it, value and all, to another
//! site), gets the bound values in place of their placeholders, and is
//! forwarded on one upstream connection (re-opened, through the same
//! decision and records, when the destination closes it). Bodies stream
//! through untouched. Upgrades (WebSocket) are not relayed.

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

use crate::proxy::{one_host_header, text, Ctx, NetEvent, Outcome, ProxyBody, IDLE_TIMEOUT};

/// Where a bound connection goes, and how.
#[derive(Clone, Debug)]
pub(crate) struct Destination {
    pub(crate) host: Arc<str>,
    pub(crate) port: u16,
    /// Verify and speak TLS to the destination (the sandbox spoke TLS to us).
    pub(crate) tls: bool,
    /// The method a (re)connection is recorded with: `CONNECT` or `TCP`.
    pub(crate) label: &'static str,
}

/// The one upstream connection of a bound client connection.
struct Upstream {
    /// The connection the decision that admitted the client already made.
    first: Option<TcpStream>,
    sender: Option<SendRequest<Incoming>>,
}

/// Serves the HTTP/1.1 requests of `client` to `destination`, starting
/// with the already connected `first`, until either side closes.
pub(crate) async fn serve<C>(client: C, first: TcpStream, ctx: Arc<Ctx>, destination: Destination)
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let upstream = Arc::new(Mutex::new(Upstream { first: Some(first), sender: None }));
    let service = hyper::service::service_fn(move |req| {
        handle(req, ctx.clone(), destination.clone(), upstream.clone())
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(IDLE_TIMEOUT)
        .keep_alive(true)
        .max_buf_size(1 << 20)
        .serve_connection(TokioIo::new(client), service)
        .await;
}

async fn handle(
    mut req: Request<Incoming>,
    ctx: Arc<Ctx>,
    to: Destination,
    upstream: Arc<Mutex<Upstream>>,
) -> Result<Response<ProxyBody>, Infallible> {
    let method = req.method().to_string();
    if let Err(reason) = one_host_header(req.headers(), &to.host, to.port) {
        ctx.report(Outcome::Denied, &to.host, to.port, &method, "host-mismatch", Some(reason.to_string()));
        return Ok(text(StatusCode::BAD_REQUEST, format!("pvisor: request refused: {reason}")));
    }
    for hop in ["proxy-connection", "proxy-authorization"] {
        req.headers_mut().remove(hop);
    }
    if let Some(broker) = &ctx.broker {
        for substitution in broker.substitute(req.headers_mut(), &to.host, to.port, &method) {
            let _ = ctx.events.send(NetEvent::Substituted(substitution));
        }
    }
    let mut upstream = upstream.lock().await;
    if let Err(refused) = upstream.ready(&ctx, &to).await {
        return Ok(refused);
    }
    let Some(sender) = upstream.sender.as_mut() else {
        return Ok(text(StatusCode::BAD_GATEWAY, "pvisor: no upstream connection".into()));
    };
    Ok(match sender.send_request(req).await {
        Ok(resp) => resp.map(|body| body.boxed()),
        Err(e) => text(StatusCode::BAD_GATEWAY, format!("pvisor: upstream request failed: {e}")),
    })
}

impl Upstream {
    /// Makes `sender` ready for the next request: the open connection, or
    /// a new one (decided, connected and recorded again).
    async fn ready(&mut self, ctx: &Ctx, to: &Destination) -> Result<(), Response<ProxyBody>> {
        if let Some(sender) = self.sender.as_mut() {
            if sender.ready().await.is_ok() {
                return Ok(());
            }
        }
        let tcp = match self.first.take() {
            Some(tcp) => tcp,
            None => ctx.connect(&to.host, to.port, to.label).await.map_err(|refused| refused.response())?,
        };
        let sender = if to.tls { handshake(tls(ctx, to, tcp).await?).await? } else { handshake(tcp).await? };
        self.sender = Some(sender);
        Ok(())
    }
}

/// TLS to the destination, verified with the host's trusted roots.
async fn tls(
    ctx: &Ctx,
    to: &Destination,
    tcp: TcpStream,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, Response<ProxyBody>> {
    let Some(broker) = ctx.broker.as_ref() else {
        return Err(text(StatusCode::BAD_GATEWAY, "pvisor: no broker for a TLS relay".into()));
    };
    let name = rustls::pki_types::ServerName::try_from(to.host.to_string()).map_err(|e| {
        text(StatusCode::BAD_GATEWAY, format!("pvisor: {} is not a TLS server name: {e}", to.host))
    })?;
    tokio_rustls::TlsConnector::from(broker.tls().client()).connect(name, tcp).await.map_err(|e| {
        text(
            StatusCode::BAD_GATEWAY,
            format!(
                "pvisor: TLS to {}:{} failed (verified with this host's trusted roots): {e}",
                to.host, to.port
            ),
        )
    })
}

async fn handshake<T>(io: T) -> Result<SendRequest<Incoming>, Response<ProxyBody>>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(1 << 20)
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| text(StatusCode::BAD_GATEWAY, format!("pvisor: upstream handshake failed: {e}")))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}
