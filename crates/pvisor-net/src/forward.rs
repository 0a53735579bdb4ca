//! Forwarded loopback ports: raw TCP from the sandbox to one host loopback
//! port a `HOST:PORT` allow rule opened.
//!
//! The sandbox's loopback is its own, so a client that ignores the proxy
//! variables (`nc`, a raw socket, `curl --noproxy '*'`) would find nothing
//! on `127.0.0.1:PORT`. pvisor listens there, inside the sandbox's network
//! namespace (the listener is made there and handed over, like the proxy's),
//! and relays each connection byte for byte to the host's port. Every
//! connection goes through the same decision, resolution and recording as a
//! proxied request ([`crate::proxy`]), with the method `TCP`: any protocol
//! passes, but only to the destination the rule names. A port a `--secret`
//! binds is read as HTTP/1.1 instead, so its requests get the bound value
//! ([`crate::broker`]).

use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::broker::relay::{self, Destination};
use crate::policy::LoopbackForward;
use crate::proxy::{Ctx, Shared, TUNNEL_BUFFER};

/// Relays each connection accepted on `listener` (made for `forward`
/// inside the sandbox) to `forward.host` on the same port, until `stop`
/// turns true. A connection the policy refuses, or that cannot be
/// connected, is closed at once, and recorded like a proxied request.
pub async fn serve(
    listener: std::net::TcpListener,
    forward: LoopbackForward,
    shared: Shared,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let ctx = shared.ctx();
    let host: Arc<str> = forward.host.into();
    let port = forward.listen.port();
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                connections.spawn(relay(client, ctx.clone(), host.clone(), port));
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

/// One forwarded connection: decided, connected and recorded, then copied
/// both ways until either side closes (or, to a bound port, relayed as
/// HTTP/1.1 with the bound values).
async fn relay(mut client: TcpStream, ctx: Arc<Ctx>, host: Arc<str>, port: u16) {
    let Ok(mut upstream) = ctx.connect(&host, port, "TCP").await else { return };
    let _ = client.set_nodelay(true);
    if ctx.binding(&host, port, true).is_some() {
        let destination = Destination { host, port, tls: None, label: "TCP" };
        return relay::serve(client, upstream, ctx, destination).await;
    }
    let _ =
        tokio::io::copy_bidirectional_with_sizes(&mut client, &mut upstream, TUNNEL_BUFFER, TUNNEL_BUFFER)
            .await;
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use tokio::sync::mpsc;

    use super::*;
    use crate::policy::{resolve, LivePolicy, PolicySpec, Scope, ScopedPolicy};
    use crate::proxy::{NetEvent, Outcome};

    fn policy(allow: &[String]) -> Arc<LivePolicy> {
        let spec = PolicySpec { mode: None, allow: allow.to_vec(), deny: Vec::new(), ordered: None };
        let resolved = resolve(&[ScopedPolicy { scope: Scope::CommandLine, source: "test".into(), spec }]);
        Arc::new(LivePolicy::new(resolved.unwrap()))
    }

    /// Starts a forward listening on 127.0.0.2 (the test's stand-in for
    /// the sandbox's loopback) to `host` on the same port.
    fn start(
        host: &str,
        port: u16,
        allow: &[String],
    ) -> (mpsc::UnboundedReceiver<NetEvent>, watch::Sender<bool>, std::net::SocketAddr) {
        let listener = std::net::TcpListener::bind(("127.0.0.2", port)).unwrap();
        let listen = listener.local_addr().unwrap();
        let (events, rx) = mpsc::unbounded_channel();
        let (stop, stopped) = watch::channel(false);
        let forward = LoopbackForward { listen, host: host.to_owned() };
        let shared = Shared { policy: policy(allow), broker: None, vault: Default::default(), events };
        tokio::spawn(serve(listener, forward, shared, stopped));
        (rx, stop, listen)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn each_connection_is_relayed_and_recorded_as_connected() {
        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = server.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for mut stream in server.incoming().flatten() {
                let mut byte = [0u8; 1];
                let _ = stream.read_exact(&mut byte);
                let _ = stream.write_all(&[byte[0] + 1]);
            }
        });
        let (mut rx, _stop, listen) = start("127.0.0.1", port, &[format!("127.0.0.1:{port}")]);
        for i in 0..20u8 {
            let mut client = tokio::net::TcpStream::connect(listen).await.unwrap();
            tokio::io::AsyncWriteExt::write_all(&mut client, &[i]).await.unwrap();
            let mut reply = [0u8; 1];
            tokio::io::AsyncReadExt::read_exact(&mut client, &mut reply).await.unwrap();
            assert_eq!(reply[0], i + 1);
            let Some(NetEvent::Request(event)) = rx.recv().await else { panic!("a request event") };
            assert_eq!((event.outcome, event.method.as_str(), event.port), (Outcome::Connected, "TCP", port));
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_that_cannot_be_made_is_closed_and_recorded_as_failed() {
        // A port nothing listens on: bind one, note it, close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let (mut rx, _stop, listen) = start("127.0.0.1", port, &[format!("127.0.0.1:{port}")]);
        let mut client = tokio::net::TcpStream::connect(listen).await.unwrap();
        let mut buf = [0u8; 1];
        let read = tokio::io::AsyncReadExt::read(&mut client, &mut buf).await;
        assert!(matches!(read, Ok(0) | Err(_)), "the sandbox's connection is closed: {read:?}");
        let Some(NetEvent::Request(event)) = rx.recv().await else { panic!("a request event") };
        assert_eq!(event.outcome, Outcome::Failed, "{event:?}");
        assert!(event.allowed && event.reason.unwrap().starts_with("cannot connect"));
    }
}
