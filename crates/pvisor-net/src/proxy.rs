//! pvisor's HTTP forward + CONNECT proxy.
//!
//! The proxy accepts on a listening socket that was created inside the
//! sandbox's network namespace and handed to the supervisor, so it is the only
//! thing the sandbox can reach; it resolves names and connects on the host
//! side, after [`EffectiveNetwork`] allowed the destination. Every request is
//! reported as a [`ProxyEvent`] for the Trace.
//!
//! - `CONNECT host:port` (HTTPS and any TLS): checked, resolved, connected,
//!   then tunnelled byte for byte.
//! - Absolute-form `GET http://host/...`: exactly one `Host` header, naming
//!   the same host and port as the request line (else 400: a second or
//!   different one would carry another destination past the check, to an
//!   upstream that reads that one); the request is forwarded in origin form on a
//!   fresh upstream connection and the response streamed back. The client's
//!   connection stays keep-alive (hyper also handles pipelining).
//!
//! - A destination a [`Broker`] binds: a `CONNECT` to it has its TLS
//!   terminated with the run's CA and its requests relayed with the bound
//!   values in their headers ([`crate::broker`]); an absolute-form request
//!   to it gets them too. Every other destination is tunnelled or
//!   forwarded untouched, placeholders and all.
//!
//! Bodies are streamed, never buffered. Idle client connections time out.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

use crate::broker::relay::{self, Destination};
use crate::broker::tls;
use crate::broker::{Broker, Substitution};
use crate::policy::{Decide, Decision, LivePolicy};
use crate::vault::{self, ActiveVault, Injection, LiveVault, Selection};

/// How long a client connection may sit idle between requests.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
pub(crate) const TUNNEL_BUFFER: usize = 256 * 1024;

/// What became of one request: the policy's verdict, and for an allowed
/// one whether pvisor reached the destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Allowed and connected to the destination.
    Connected,
    /// Allowed, but the name did not resolve or no address accepted the
    /// connection: nothing was reached, which the records must not call
    /// a success.
    Failed,
    /// Refused by the policy.
    Denied,
}

/// One proxied request (or forwarded connection), as recorded in the Trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProxyEvent {
    /// Whether the policy allowed it (also true when it then [`Outcome::Failed`]).
    pub allowed: bool,
    pub outcome: Outcome,
    pub host: String,
    pub port: u16,
    /// `CONNECT`, the HTTP method of a forwarded request, or `TCP` for a
    /// connection to a forwarded loopback port.
    pub method: String,
    /// The rule that decided (e.g. `allow *.pypi.org (command line)`).
    pub rule: String,
    /// Why it was denied, or why an allowed request still failed upstream.
    pub reason: Option<String>,
}

/// What the proxy and the port forwards report for the Trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetEvent {
    /// A request or connection: decided, and connected or not.
    Request(ProxyEvent),
    /// A bound value was put into a request's headers.
    Substituted(Substitution),
    /// A credential vault binding's headers were put into a request.
    Injected(Injection),
}

pub(crate) type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// The policy, the broker and the event channel shared by the proxy's and
/// the port forwards' connections.
pub(crate) struct Ctx {
    pub(crate) policy: Arc<LivePolicy>,
    pub(crate) broker: Option<Arc<Broker>>,
    pub(crate) vault: Arc<LiveVault>,
    pub(crate) events: mpsc::UnboundedSender<NetEvent>,
}

/// What the credential vault did to one request.
pub(crate) enum VaultVerdict {
    /// No binding matched: the request leaves as the sandbox sent it.
    Untouched,
    /// A binding's headers are in; the response's headers are redacted with this vault.
    Injected(Arc<ActiveVault>),
    /// More than one binding matched (the reference's 403).
    Refused(Response<ProxyBody>),
}

impl VaultVerdict {
    /// Redacts the values a response header echoes, if a binding was injected.
    pub(crate) fn redact(&self, headers: &mut hyper::HeaderMap) {
        if let Self::Injected(vault) = self {
            vault.redact(headers);
        }
    }
}

impl Ctx {
    /// The broker, if it binds `host:port` (in `clear` text, or over TLS).
    pub(crate) fn binding(&self, host: &str, port: u16, clear: bool) -> Option<&Arc<Broker>> {
        self.broker.as_ref().filter(|b| b.binds(host, port, clear))
    }

    /// Puts the headers of the vault binding that matches `req` (sent as
    /// `scheme` to `host:port`) into it, recording the injection; call it
    /// once the hop-by-hop headers are gone.
    pub(crate) fn apply_vault<B>(
        &self,
        scheme: &str,
        host: &str,
        port: u16,
        req: &mut Request<B>,
    ) -> VaultVerdict {
        let Some(active) = self.vault.current() else { return VaultVerdict::Untouched };
        let method = req.method().to_string();
        let path = req.uri().path().to_owned();
        let request = vault::active::Request { scheme, host, port, method: &method, path: &path };
        match active.select(&request) {
            Selection::None => VaultVerdict::Untouched,
            Selection::Ambiguous => {
                let reason = "more than one credential binding matches".to_owned();
                self.report(Outcome::Denied, host, port, &method, "credential-vault", Some(reason));
                VaultVerdict::Refused(text(StatusCode::FORBIDDEN, "credential binding ambiguous".into()))
            }
            Selection::Bound(_) if crate::broker::echoes_headers(req.method()) => {
                let reason = Some("TRACE echoes headers".to_owned());
                self.report(Outcome::Denied, host, port, &method, "secret-echo", reason);
                VaultVerdict::Refused(text(
                    StatusCode::METHOD_NOT_ALLOWED,
                    crate::broker::ECHO_REFUSED.into(),
                ))
            }
            Selection::Bound(binding) => {
                let injection = active.inject(binding, req.headers_mut(), &request);
                let _ = self.events.send(NetEvent::Injected(injection));
                VaultVerdict::Injected(active.clone())
            }
        }
    }
}

/// Why [`Ctx::connect`] did not connect: the status an HTTP client gets and
/// the message, already recorded as an event.
#[derive(Debug)]
pub(crate) struct Refused {
    status: StatusCode,
    message: String,
    /// Refused by an ordered policy (OpenSandbox's `networkPolicy`): a
    /// plain-HTTP client then gets no answer at all, its connection closed,
    /// so it fails as under the reference egress, where a denied name does
    /// not resolve (components/egress: NXDOMAIN) and nothing is reached. A
    /// 403 page would read as a successful request to `curl` and most SDKs.
    closes: bool,
}

/// A denied plain-HTTP request under an ordered policy: hyper closes the
/// client's connection without a response.
#[derive(Debug, thiserror::Error)]
#[error("denied by the sandbox's network policy; the connection is closed")]
pub(crate) struct ClosedByPolicy;

/// Marks a response whose connection is closed instead (see [`Refused::closes`]).
#[derive(Clone, Copy)]
struct CloseInstead;

impl Refused {
    pub(crate) fn response(self) -> Response<ProxyBody> {
        let mut response = text(self.status, self.message);
        if self.closes {
            response.extensions_mut().insert(CloseInstead);
        }
        response
    }
}

pub(crate) fn text(status: StatusCode, message: String) -> Response<ProxyBody> {
    let mut resp =
        Response::new(Full::new(Bytes::from(message + "\n")).map_err(|never| match never {}).boxed());
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain"));
    resp
}

fn split_authority(authority: &str, default_port: u16) -> Option<(String, u16)> {
    let uri_auth: hyper::http::uri::Authority = authority.parse().ok()?;
    let host = uri_auth.host().trim_start_matches('[').trim_end_matches(']').to_owned();
    Some((host, uri_auth.port_u16().unwrap_or(default_port)))
}

impl Ctx {
    pub(crate) fn report(
        &self,
        outcome: Outcome,
        host: &str,
        port: u16,
        method: &str,
        rule: &str,
        reason: Option<String>,
    ) {
        let _ = self.events.send(NetEvent::Request(ProxyEvent {
            allowed: outcome != Outcome::Denied,
            outcome,
            host: host.to_owned(),
            port,
            method: method.to_owned(),
            rule: rule.to_owned(),
            reason,
        }));
    }

    /// Applies the policy, resolves and connects, recording the outcome.
    pub(crate) async fn connect(&self, host: &str, port: u16, method: &str) -> Result<TcpStream, Refused> {
        // Decided by the policy now; a change after this leaves this connection be.
        let policy = self.policy.current();
        let rule = match policy.decide(host, port) {
            Decision::Allow { rule } => rule,
            Decision::Deny { rule, reason } => {
                self.report(Outcome::Denied, host, port, method, &rule, Some(reason.clone()));
                return Err(Refused {
                    closes: policy.ordered.is_some(),
                    status: StatusCode::FORBIDDEN,
                    message: format!(
                        "pvisor: {method} {host}:{port} denied by network policy ({rule}: {reason})"
                    ),
                });
            }
        };
        let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => match tokio::net::lookup_host((host, port)).await {
                Ok(addrs) => addrs.collect(),
                Err(e) => {
                    self.report(
                        Outcome::Failed,
                        host,
                        port,
                        method,
                        &rule,
                        Some(format!("cannot resolve: {e}")),
                    );
                    return Err(Refused {
                        closes: false,
                        status: StatusCode::BAD_GATEWAY,
                        message: format!("pvisor: cannot resolve {host}: {e}"),
                    });
                }
            },
        };
        let mut refused = None;
        let permitted: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|a| match policy.check_address(host, port, a.ip()) {
                Ok(()) => true,
                Err(why) => {
                    refused = Some(why.to_string());
                    false
                }
            })
            .collect();
        if permitted.is_empty() {
            let reason = refused.unwrap_or_else(|| "no addresses".into());
            self.report(Outcome::Denied, host, port, method, "internal-address", Some(reason.clone()));
            return Err(Refused {
                closes: policy.ordered.is_some(),
                status: StatusCode::FORBIDDEN,
                message: format!("pvisor: {method} {host}:{port} denied: {reason}"),
            });
        }
        let mut last_err = None;
        for addr in permitted {
            match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    self.report(Outcome::Connected, host, port, method, &rule, None);
                    return Ok(stream);
                }
                Ok(Err(e)) => last_err = Some(e.to_string()),
                Err(_) => last_err = Some("connection timed out".into()),
            }
        }
        let reason = last_err.unwrap_or_default();
        self.report(Outcome::Failed, host, port, method, &rule, Some(format!("cannot connect: {reason}")));
        Err(Refused {
            closes: false,
            status: StatusCode::BAD_GATEWAY,
            message: format!("pvisor: cannot connect to {host}:{port}: {reason}"),
        })
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Result<Response<ProxyBody>, ClosedByPolicy> {
        if req.method() == Method::CONNECT {
            return Ok(self.tunnel(req).await);
        }
        let response = self.forward(req).await;
        match response.extensions().get::<CloseInstead>() {
            Some(_) => Err(ClosedByPolicy),
            None => Ok(response),
        }
    }

    async fn tunnel(self: Arc<Self>, req: Request<Incoming>) -> Response<ProxyBody> {
        let Some((host, port)) = req.uri().authority().and_then(|a| split_authority(a.as_str(), 443)) else {
            return text(StatusCode::BAD_REQUEST, "pvisor: CONNECT needs host:port".into());
        };
        let upstream = match self.connect(&host, port, "CONNECT").await {
            Ok(c) => c,
            Err(refused) => return refused.response(),
        };
        if self.reads(&host, port) {
            tokio::spawn(async move {
                let Ok(upgraded) = hyper::upgrade::on(req).await else { return };
                self.bound_tunnel(TokioIo::new(upgraded), upstream, host, port).await;
            });
            return Response::new(Empty::new().map_err(|never| match never {}).boxed());
        }
        tokio::spawn(async move {
            if let Ok(upgraded) = hyper::upgrade::on(req).await {
                copy_both_ways(TokioIo::new(upgraded), upstream).await;
            }
        });
        Response::new(Empty::new().map_err(|never| match never {}).boxed())
    }

    /// Whether a `CONNECT` to `host:port` is read rather than tunnelled: a
    /// `--secret` binds it, or a vault binding names it.
    fn reads(&self, host: &str, port: u16) -> bool {
        self.binding(host, port, false).is_some()
            || self
                .vault
                .current()
                .is_some_and(|v| v.intercepts("https", host, port) || v.intercepts("http", host, port))
    }

    /// Whether plain HTTP to `host:port` through a tunnel is relayed: a
    /// `--secret` may travel there in clear text, or an http vault binding names it.
    fn reads_clear(&self, host: &str, port: u16) -> bool {
        self.binding(host, port, true).is_some()
            || self.vault.current().is_some_and(|v| v.intercepts("http", host, port))
    }

    /// What TLS to `host:port` is terminated with (the leaf the sandbox
    /// sees) and how the destination is then verified: the broker's for a
    /// host a `--secret` binds, else the vault's for one an https binding names.
    fn terminator(&self, host: &str, port: u16) -> Option<(Arc<rustls::ServerConfig>, tls::Upstream)> {
        if let Some(broker) = self.binding(host, port, false) {
            let server = broker.tls().server(host)?;
            return Some((server, broker.tls().upstream().clone()));
        }
        if !self.vault.current()?.intercepts("https", host, port) {
            return None;
        }
        let vault_tls = self.vault.tls()?;
        Some((vault_tls.server(host)?, vault_tls.upstream().clone()))
    }

    /// A tunnel to a bound destination, read by its first byte: TLS (a
    /// handshake record) is terminated with the run's (or the vault's) CA
    /// and relayed with the values; plain HTTP (what Node's proxy agents
    /// send through `CONNECT` even for `http://`) is relayed with them
    /// where they may travel in clear text; anything else is tunnelled untouched.
    async fn bound_tunnel(
        self: Arc<Self>,
        client: TokioIo<hyper::upgrade::Upgraded>,
        upstream: TcpStream,
        host: String,
        port: u16,
    ) {
        let Ok(client) = relay::Peeked::new(client).await else { return };
        let terminator = self.terminator(&host, port);
        match (client.first_byte(), terminator) {
            (Some(relay::TLS_HANDSHAKE), Some((server, verified))) => {
                let Ok(tls) = tokio_rustls::TlsAcceptor::from(server).accept(client).await else { return };
                let destination =
                    Destination { host: host.into(), port, tls: Some(verified), label: "CONNECT" };
                relay::serve(tls, upstream, self, destination).await;
            }
            (Some(relay::TLS_HANDSHAKE), None) => copy_both_ways(client, upstream).await,
            _ if self.reads_clear(&host, port) => {
                let destination = Destination { host: host.into(), port, tls: None, label: "CONNECT" };
                relay::serve(client, upstream, self, destination).await;
            }
            _ => copy_both_ways(client, upstream).await,
        }
    }

    async fn forward(&self, mut req: Request<Incoming>) -> Response<ProxyBody> {
        let method = req.method().to_string();
        if req.uri().scheme_str() != Some("http") {
            return text(
                StatusCode::BAD_REQUEST,
                "pvisor: send absolute http:// URLs to this proxy, or CONNECT for https".into(),
            );
        }
        let Some((host, port)) = req.uri().authority().and_then(|a| split_authority(a.as_str(), 80)) else {
            return text(StatusCode::BAD_REQUEST, "pvisor: the request line has no host".into());
        };
        if let Err(reason) = one_host_header(req.headers(), &host, port, 80) {
            self.report(Outcome::Denied, &host, port, &method, "host-mismatch", Some(reason.to_string()));
            return text(StatusCode::BAD_REQUEST, format!("pvisor: request refused: {reason}"));
        }
        if self.binding(&host, port, true).is_some() && crate::broker::echoes_headers(req.method()) {
            self.report(
                Outcome::Denied,
                &host,
                port,
                &method,
                "secret-echo",
                Some("TRACE echoes headers".into()),
            );
            return text(StatusCode::METHOD_NOT_ALLOWED, crate::broker::ECHO_REFUSED.into());
        }
        let upstream = match self.connect(&host, port, &method).await {
            Ok(c) => c,
            Err(refused) => return refused.response(),
        };
        let handshake = hyper::client::conn::http1::Builder::new()
            .max_buf_size(1 << 20)
            .handshake(TokioIo::new(upstream));
        let (mut sender, conn) = match handshake.await {
            Ok(pair) => pair,
            Err(e) => {
                return text(StatusCode::BAD_GATEWAY, format!("pvisor: upstream handshake failed: {e}"))
            }
        };
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let path = req.uri().path_and_query().map_or("/".to_owned(), |p| p.to_string());
        // The request line named the destination; a request without `Host`
        // (HTTP/1.0) gets it from there, so no front end can route it, and
        // a credential with it, to its default site.
        if let Some(authority) =
            req.uri().authority().map(|a| a.as_str().rsplit('@').next().unwrap_or("").to_owned())
        {
            if let Ok(value) = hyper::header::HeaderValue::from_str(&authority) {
                req.headers_mut().entry(hyper::header::HOST).or_insert(value);
            }
        }
        *req.uri_mut() = path.parse().unwrap_or_default();
        for hop in [
            "proxy-connection",
            "proxy-authorization",
            "connection",
            "keep-alive",
            "te",
            "trailer",
            "upgrade",
        ] {
            req.headers_mut().remove(hop);
        }
        let broker = self.binding(&host, port, true).cloned();
        if let Some(broker) = &broker {
            for substitution in broker.substitute(req.headers_mut(), &host, port, &method, true) {
                let _ = self.events.send(NetEvent::Substituted(substitution));
            }
        }
        let verdict = match self.apply_vault("http", &host, port, &mut req) {
            VaultVerdict::Refused(response) => return response,
            verdict => verdict,
        };
        match sender.send_request(req).await {
            Ok(mut resp) => {
                if let Some(broker) = &broker {
                    broker.mask(resp.headers_mut());
                }
                verdict.redact(resp.headers_mut());
                resp.map(|body| body.boxed())
            }
            Err(e) => text(StatusCode::BAD_GATEWAY, format!("pvisor: upstream request failed: {e}")),
        }
    }
}

/// Copies a tunnel both ways until either side closes. Large buffers: a
/// tunnel is a bulk copy, and loopback is fast.
async fn copy_both_ways<C>(mut client: C, mut upstream: TcpStream)
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let _ =
        tokio::io::copy_bidirectional_with_sizes(&mut client, &mut upstream, TUNNEL_BUFFER, TUNNEL_BUFFER)
            .await;
}

/// Why a request's `Host` headers were refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HostHeaderError {
    #[error("Host header {header:?} differs from the request line's {host}:{port}")]
    Differs { header: hyper::header::HeaderValue, host: String, port: u16 },
    #[error("{count} Host headers; a request has one")]
    Several { count: usize },
    #[error("no Host header; a request to a destination with a --secret names it")]
    Missing,
}

/// The `Host` headers must not smuggle a different destination past the
/// check: at most one, naming the request line's host and port.
pub(crate) fn one_host_header(
    headers: &hyper::HeaderMap,
    host: &str,
    port: u16,
    default_port: u16,
) -> Result<(), HostHeaderError> {
    let all: Vec<&hyper::header::HeaderValue> = headers.get_all(hyper::header::HOST).iter().collect();
    match all.as_slice() {
        [] => Ok(()),
        [header] => {
            // No userinfo: `evil.example@api.example.com` parses as the
            // latter, but an upstream may read it as the former.
            let named = header
                .to_str()
                .ok()
                .filter(|h| !h.contains('@'))
                .and_then(|h| split_authority(h, default_port));
            match named {
                Some((h, p)) if h.eq_ignore_ascii_case(host) && p == port => Ok(()),
                _ => Err(HostHeaderError::Differs { header: (*header).clone(), host: host.to_owned(), port }),
            }
        }
        _ => Err(HostHeaderError::Several { count: all.len() }),
    }
}

/// What every connection of a run's proxy and port forwards shares: the
/// recorded policy, the broker of its `--secret`s (if any) and where
/// events go.
#[derive(Clone, Debug)]
pub struct Shared {
    pub policy: Arc<LivePolicy>,
    pub broker: Option<Arc<Broker>>,
    /// The credential vault a frontend put in force (empty: none).
    pub vault: Arc<LiveVault>,
    pub events: mpsc::UnboundedSender<NetEvent>,
}

impl Shared {
    pub(crate) fn ctx(self) -> Arc<Ctx> {
        Arc::new(Ctx { policy: self.policy, broker: self.broker, vault: self.vault, events: self.events })
    }
}

/// Serves the proxy on `listener` until `stop` turns true.
pub async fn serve(
    listener: std::net::TcpListener,
    shared: Shared,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let ctx = shared.ctx();
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let ctx = ctx.clone();
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |req| ctx.clone().handle(req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(IDLE_TIMEOUT)
                        .keep_alive(true)
                        .max_buf_size(1 << 20)
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades()
                        .await;
                });
            }
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    break;
                }
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.abort_all();
    Ok(())
}
