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

use crate::proxy::{
    one_host_header, text, Ctx, HostHeaderError, NetEvent, Outcome, ProxyBody, VaultVerdict, IDLE_TIMEOUT,
};

/// The first byte of a TLS connection (a handshake record).
pub(crate) const TLS_HANDSHAKE: u8 = 0x16;

/// A client stream whose first byte has been read to tell TLS from plain
/// HTTP, and is given back to the next reader.
pub(crate) struct Peeked<S> {
    first: Option<u8>,
    inner: S,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Peeked<S> {
    /// Reads the first byte (`None`: the client closed without sending).
    pub(crate) async fn new(mut inner: S) -> std::io::Result<Self> {
        let mut byte = [0u8; 1];
        let n = tokio::io::AsyncReadExt::read(&mut inner, &mut byte).await?;
        Ok(Self { first: (n == 1).then_some(byte[0]), inner })
    }

    pub(crate) fn first_byte(&self) -> Option<u8> {
        self.first
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Peeked<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if buf.remaining() > 0 {
            if let Some(byte) = self.first.take() {
                buf.put_slice(&[byte]);
                return std::task::Poll::Ready(Ok(()));
            }
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Peeked<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Where a bound connection goes, and how.
#[derive(Clone, Debug)]
pub(crate) struct Destination {
    pub(crate) host: Arc<str>,
    pub(crate) port: u16,
    /// Speak TLS to the destination (the sandbox spoke TLS to us),
    /// verified as this says (the broker's or the vault's roots).
    pub(crate) tls: Option<super::tls::Upstream>,
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
    if req.uri().authority().is_some() || req.uri().scheme().is_some() {
        // An absolute-form target names its own host, which a front end
        // routes by before `Host` (RFC 9112 3.2.2): only origin-form is relayed.
        let reason = format!("the request target {} names a host; send the path alone", req.uri());
        ctx.report(Outcome::Denied, &to.host, to.port, &method, "host-mismatch", Some(reason.clone()));
        return Ok(text(StatusCode::BAD_REQUEST, format!("pvisor: request refused: {reason}")));
    }
    if let Err(reason) = host_names_destination(req.headers(), &to) {
        ctx.report(Outcome::Denied, &to.host, to.port, &method, "host-mismatch", Some(reason.to_string()));
        return Ok(text(StatusCode::BAD_REQUEST, format!("pvisor: request refused: {reason}")));
    }
    if super::echoes_headers(req.method()) {
        ctx.report(
            Outcome::Denied,
            &to.host,
            to.port,
            &method,
            "secret-echo",
            Some("TRACE echoes headers".into()),
        );
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, super::ECHO_REFUSED.into()));
    }
    strip_hop_by_hop(req.headers_mut());
    if let Some(broker) = &ctx.broker {
        for substitution in broker.substitute(req.headers_mut(), &to.host, to.port, &method, to.tls.is_none())
        {
            let _ = ctx.events.send(NetEvent::Substituted(substitution));
        }
    }
    let mut upstream = upstream.lock().await;
    if let Err(refused) = upstream.ready(&ctx, &to).await {
        return Ok(refused);
    }
    // Chosen only now, with the upstream ready: a request parsed while an
    // earlier response was still streaming leaves with the vault in force
    // when it is sent, not the one it was read under (a revoked binding stays revoked).
    let scheme = if to.tls.is_some() { "https" } else { "http" };
    let verdict = match ctx.apply_vault(scheme, &to.host, to.port, &mut req) {
        VaultVerdict::Refused(response) => return Ok(response),
        verdict => verdict,
    };
    let Some(sender) = upstream.sender.as_mut() else {
        return Ok(text(StatusCode::BAD_GATEWAY, "pvisor: no upstream connection".into()));
    };
    Ok(match sender.send_request(req).await {
        Ok(mut resp) => {
            if let Some(broker) = &ctx.broker {
                broker.mask(resp.headers_mut());
            }
            verdict.redact(resp.headers_mut());
            resp.map(|body| body.boxed())
        }
        Err(e) => text(StatusCode::BAD_GATEWAY, format!("pvisor: upstream request failed: {e}")),
    })
}

/// Removes the headers that belong to the connection from the sandbox, not
/// to the destination (RFC 9110 7.6.1): `Connection` and the names it
/// lists, `Keep-Alive`, `TE`, `Upgrade` (upgrades are not relayed) and the
/// proxy's own. A name listed in `Connection` never takes `Host` or the
/// body's framing with it.
fn strip_hop_by_hop(headers: &mut hyper::HeaderMap) {
    use hyper::header::{HeaderName, CONNECTION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
    let listed: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .filter(|name| ![HOST, CONTENT_LENGTH, TRANSFER_ENCODING].contains(name))
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for hop in ["connection", "keep-alive", "te", "upgrade", "proxy-connection", "proxy-authorization"] {
        headers.remove(hop);
    }
}

/// The request's `Host` must name the destination ([`one_host_header`]);
/// on loopback, any loopback name with the destination's port does (a
/// forwarded `localhost` port is reached as `127.0.0.1` as often as not,
/// and no shared front end sits there to route by name).
fn host_names_destination(headers: &hyper::HeaderMap, to: &Destination) -> Result<(), HostHeaderError> {
    if !headers.contains_key(hyper::header::HOST) {
        return Err(HostHeaderError::Missing);
    }
    // A `Host` without a port names the scheme's default (RFC 9110 7.2).
    let default_port = if to.tls.is_some() { 443 } else { 80 };
    let checked = one_host_header(headers, &to.host, to.port, default_port);
    if checked.is_err() && super::is_loopback(&to.host) {
        for name in crate::policy::LOOPBACK_NAMES {
            if one_host_header(headers, name, to.port, default_port).is_ok() {
                return Ok(());
            }
        }
    }
    checked
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
        let sender =
            if to.tls.is_some() { handshake(tls(to, tcp).await?).await? } else { handshake(tcp).await? };
        self.sender = Some(sender);
        Ok(())
    }
}

/// TLS to the destination, verified with the host's trusted roots.
async fn tls(
    to: &Destination,
    tcp: TcpStream,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, Response<ProxyBody>> {
    let Some(upstream) = to.tls.as_ref() else {
        return Err(text(StatusCode::BAD_GATEWAY, "pvisor: no TLS configuration for the destination".into()));
    };
    let name = rustls::pki_types::ServerName::try_from(to.host.to_string()).map_err(|e| {
        text(StatusCode::BAD_GATEWAY, format!("pvisor: {} is not a TLS server name: {e}", to.host))
    })?;
    let hint = upstream.missing_roots().map(|h| format!("; {h}")).unwrap_or_default();
    tokio_rustls::TlsConnector::from(upstream.client()).connect(name, tcp).await.map_err(|e| {
        text(
            StatusCode::BAD_GATEWAY,
            format!(
                "pvisor: TLS to {}:{} failed (verified with this host's trusted roots): {e}{hint}",
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use hyper_util::rt::TokioIo;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::{mpsc, watch};

    use crate::broker::{tls, Binding, Broker};
    use crate::policy::{resolve, PolicySpec, Scope, ScopedPolicy};
    use crate::proxy::{NetEvent, Outcome, Shared};

    /// An HTTPS server on 127.0.0.1 with a leaf its own CA signed, that
    /// answers each request with the `x-api-key` it got. Returns its port
    /// and the CA.
    async fn upstream() -> (u16, CertificateDer<'static>) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::default();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&leaf_key, &ca, &ca_key)
            .unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            #[allow(deprecated)]
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let Ok(tls) = acceptor.accept(tcp).await else { continue };
                let service =
                    hyper::service::service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                        let key =
                            req.headers().get("x-api-key").map(|v| v.as_bytes().to_vec()).unwrap_or_default();
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(http_body_util::Full::new(
                            hyper::body::Bytes::from(key),
                        )))
                    });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service),
                );
            }
        });
        (port, ca.der().clone())
    }

    /// Opens a CONNECT through the proxy at `proxy` and TLS over it,
    /// trusting `ca_pem` alone; sends `request` and returns the response.
    async fn through_proxy(proxy: std::net::SocketAddr, port: u16, ca_pem: &str, request: String) -> String {
        let mut tcp = tokio::net::TcpStream::connect(proxy).await.unwrap();
        tcp.write_all(
            format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(tcp.read_u8().await.unwrap());
        }
        assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(tls::certificates_from_pem(ca_pem.as_bytes()));
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            #[allow(deprecated)]
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.unwrap();
        tls.write_all(request.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        let _ = tls.read_to_end(&mut response).await;
        String::from_utf8_lossy(&response).into_owned()
    }

    #[test]
    fn a_loopback_destination_takes_any_loopback_name_and_others_their_own() {
        let headers = |host: &str| {
            let mut h = hyper::HeaderMap::new();
            h.insert(hyper::header::HOST, host.parse().unwrap());
            h
        };
        let tls = || Some(tls::Upstream::with_roots(rustls::RootCertStore::empty()).unwrap());
        let to = |host: &str, tls| super::Destination { host: host.into(), port: 8080, tls, label: "TCP" };
        let local = to("localhost", None);
        for host in ["localhost:8080", "127.0.0.1:8080", "[::1]:8080"] {
            assert!(super::host_names_destination(&headers(host), &local).is_ok(), "{host}");
        }
        assert!(super::host_names_destination(&headers("127.0.0.1:9090"), &local).is_err());
        let public = to("api.example.com", tls());
        assert!(super::host_names_destination(&headers("api.example.com:8080"), &public).is_ok());
        assert!(super::host_names_destination(&headers("evil.example.com:8080"), &public).is_err());
        assert!(super::host_names_destination(&headers("localhost:8080"), &public).is_err());
        // Userinfo would name another host to an upstream that reads it so.
        assert!(super::host_names_destination(&headers("evil.example.com@api.example.com:8080"), &public)
            .is_err());
        assert!(super::host_names_destination(&hyper::HeaderMap::new(), &local).is_err(), "no Host");
        // No port in `Host`: the scheme's default, 443 behind TLS.
        let https =
            super::Destination { host: "api.example.com".into(), port: 443, tls: tls(), label: "CONNECT" };
        assert!(super::host_names_destination(&headers("api.example.com"), &https).is_ok());
        assert!(super::host_names_destination(&headers("api.example.com:80"), &https).is_err());
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_lists_are_not_relayed() {
        let mut h = hyper::HeaderMap::new();
        for (name, value) in [
            ("connection", "close, x-api-key, host, content-length"),
            ("x-api-key", "PLACEHOLDER"),
            ("host", "api.example.com"),
            ("content-length", "2"),
            ("keep-alive", "timeout=5"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic eA=="),
            ("accept", "*/*"),
        ] {
            h.append(name, value.parse().unwrap());
        }
        super::strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["accept", "content-length", "host"]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_bound_connect_is_terminated_substituted_and_a_fronted_host_refused() {
        let (port, upstream_ca) = upstream().await;
        let binding =
            Binding::new(format!("K@127.0.0.1:{port}").parse().unwrap(), "real-value".into()).unwrap();
        let placeholder = binding.placeholder.clone();
        let broker = Broker {
            bindings: vec![binding],
            tls: tls::Authority::for_tests_with_roots(&["127.0.0.1"], &[upstream_ca]),
        };
        let ca_pem = broker.ca_pem().to_owned();
        let spec =
            PolicySpec { mode: None, allow: vec![format!("127.0.0.1:{port}")], deny: vec![], ordered: None };
        let policy =
            resolve(&[ScopedPolicy { scope: Scope::CommandLine, source: "test".into(), spec }]).unwrap();
        let (events, mut rx) = mpsc::unbounded_channel();
        let (_stop, stopped) = watch::channel(false);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = listener.local_addr().unwrap();
        let policy = Arc::new(crate::policy::LivePolicy::new(policy));
        let shared = Shared { policy, broker: Some(Arc::new(broker)), vault: Default::default(), events };
        tokio::spawn(crate::proxy::serve(listener, shared, stopped));

        let request = |host: &str| {
            format!("GET / HTTP/1.1\r\nHost: {host}\r\nx-api-key: {placeholder}\r\nConnection: close\r\n\r\n")
        };
        let response = through_proxy(proxy, port, &ca_pem, request(&format!("127.0.0.1:{port}"))).await;
        assert!(response.starts_with("HTTP/1.1 200") && response.ends_with("real-value"), "{response}");
        let Some(NetEvent::Request(connected)) = rx.recv().await else { panic!("a request event") };
        assert_eq!((connected.outcome, connected.method.as_str()), (Outcome::Connected, "CONNECT"));
        let Some(NetEvent::Substituted(substituted)) = rx.recv().await else { panic!("a substitution") };
        assert_eq!(
            (substituted.variable.as_str(), substituted.headers.as_slice()),
            ("K", &["x-api-key".to_owned()][..])
        );

        let response = through_proxy(proxy, port, &ca_pem, request("elsewhere.example")).await;
        assert!(response.starts_with("HTTP/1.1 400") && !response.contains("real-value"), "{response}");

        // An absolute-form target names another host than `Host` does: a
        // front end would route by it, so it is refused, key and all.
        let absolute = format!(
            "GET https://elsewhere.example/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nx-api-key: {placeholder}\r\nConnection: close\r\n\r\n"
        );
        let response = through_proxy(proxy, port, &ca_pem, absolute).await;
        assert!(response.starts_with("HTTP/1.1 400") && !response.contains("real-value"), "{response}");
        // No Host at all: refused as well.
        let bare = format!("GET / HTTP/1.1\r\nx-api-key: {placeholder}\r\nConnection: close\r\n\r\n");
        let response = through_proxy(proxy, port, &ca_pem, bare).await;
        assert!(response.starts_with("HTTP/1.1 400") && !response.contains("real-value"), "{response}");
    }
}
