//! Which client connections the daemon holds, and for how long: the
//! boundary between anyone who can reach the listening socket (no key is
//! needed to open a connection) and the daemon's descriptors, threads and
//! memory.
//!
//! - At most [`Limits::max_connections`] are open, at most
//!   [`Limits::max_per_client`] from one address. A connection over either
//!   limit takes the place of the oldest *idle* one (no request in flight, no
//!   response streaming: it costs its owner a reconnect), the client's own
//!   first; when none is idle the new connection is closed at once, and while
//!   the daemon is full of busy connections the accept loop waits for room
//!   instead of accepting and spinning. One client is one address as
//!   [`client_of`] counts them: every loopback address is the same host,
//!   and an IPv6 client owns its whole /64.
//! - Request headers must arrive within [`Limits::header_timeout`] and a
//!   request body must bring at least [`MIN_BODY_PROGRESS`] bytes (or its
//!   end) in every [`Limits::body_idle_timeout`]: a byte every 29 s is a
//!   stall, not progress.
//! - A response may not stall longer than [`Limits::write_stall_timeout`]:
//!   a client that stops reading (a streamed log it never takes) would
//!   otherwise keep its connection busy, unevictable, and its stream slot
//!   held, for ever ([`StallingIo`]).
//! - An `accept` that fails for want of descriptors or memory backs off
//!   instead of retrying at once.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Bytes, Frame};
use tokio::sync::Notify;

use crate::http::Body;

/// How many connections the daemon holds and how long it waits for them.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub max_per_client: usize,
    pub header_timeout: Duration,
    pub body_idle_timeout: Duration,
    pub write_stall_timeout: Duration,
}

/// Descriptors kept free of connections: each busy request may open a few of
/// its own (a guest link, a record, a log), and the sandboxes' watchers,
/// supervisors' pipes and the image store need some at any time.
const FD_RESERVE: u64 = 256;
/// Descriptors a busy connection may hold besides its socket.
const FDS_PER_CONNECTION: u64 = 4;

impl Limits {
    /// Limits that fit a descriptor budget of `nofile` (the soft
    /// `RLIMIT_NOFILE`): connections and what their requests open stay below it.
    pub fn for_descriptors(nofile: u64) -> Self {
        let budget = nofile.saturating_sub(FD_RESERVE) / FDS_PER_CONNECTION;
        Self {
            max_connections: 0,
            max_per_client: 0,
            header_timeout: Duration::from_secs(10),
            body_idle_timeout: Duration::from_secs(30),
            write_stall_timeout: Duration::from_secs(30),
        }
        .with_max_connections(budget.clamp(16, 1024) as usize)
    }

    /// These limits with `max` connections in all, a quarter of them (at
    /// least one) from one address.
    pub fn with_max_connections(mut self, max: usize) -> Self {
        self.max_connections = max.max(1);
        self.max_per_client = (max / 4).max(1);
        self
    }
}

/// The soft descriptor limit the daemon runs under. It is not raised: the
/// supervisors and VMs the daemon starts inherit it, and some programs
/// close every descriptor up to it.
pub fn nofile() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(1 << 20)
}

/// The open connections, oldest first.
#[derive(Debug)]
pub struct Admission {
    limits: Limits,
    table: Mutex<Table>,
    /// Woken when a connection closes or goes idle.
    room: Notify,
}

#[derive(Debug, Default)]
struct Table {
    next: u64,
    open: BTreeMap<u64, Conn>,
}

#[derive(Debug)]
struct Conn {
    peer: IpAddr,
    busy: Arc<AtomicUsize>,
    evict: Arc<Notify>,
}

/// One admitted connection; dropping it gives its place back.
#[derive(Debug)]
pub struct Ticket {
    admission: Arc<Admission>,
    id: u64,
    busy: Arc<AtomicUsize>,
    /// Notified when a newer connection took this one's place.
    pub evicted: Arc<Notify>,
}

impl Ticket {
    pub fn admission_limits(&self) -> Limits {
        self.admission.limits
    }
}

/// A connection's place, kept by whoever takes the connection over from
/// hyper (an upgrade relayed into a sandbox, see `proxy.rs`): the
/// connection then counts against the limits, busy, until that relay ends.
/// Every request carries one in its extensions.
#[derive(Debug, Clone)]
pub struct Place(pub Arc<Ticket>);

impl Place {
    /// Keeps the connection counted, and busy, for as long as this lives.
    pub fn hold(self) -> (Arc<Ticket>, Busy) {
        let busy = Busy::new(&self.0);
        (self.0, busy)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.admission.lock().open.remove(&self.id);
        self.admission.room.notify_waiters();
    }
}

impl Admission {
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self { limits, table: Mutex::new(Table::default()), room: Notify::new() })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until a new connection could be admitted: the daemon is under
    /// its limit, or holds an idle connection to give up.
    pub async fn room(&self) {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let table = self.lock();
                if table.open.len() < self.limits.max_connections || table.oldest_idle(None).is_some() {
                    return;
                }
            }
            notified.await;
        }
    }

    /// Admits a connection from `peer` (counted as [`client_of`] it), evicting the oldest idle connection
    /// (of `peer` itself when it is at its own limit) to make room; `None`
    /// when every connection in the way is busy.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Ticket> {
        let peer = client_of(peer);
        let mut table = self.lock();
        let from_peer = table.open.values().filter(|c| c.peer == peer).count();
        if from_peer >= self.limits.max_per_client {
            table.evict(Some(peer))?;
        } else if table.open.len() >= self.limits.max_connections {
            table.evict(None)?;
        }
        let id = table.next;
        table.next += 1;
        let (busy, evict) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
        table.open.insert(id, Conn { peer, busy: busy.clone(), evict: evict.clone() });
        Some(Ticket { admission: self.clone(), id, busy, evicted: evict })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.lock().open.len()
    }
}

/// The client an address belongs to, for the per-client limit: a client
/// with many addresses would otherwise have a quarter of the daemon per
/// address. Every loopback address (`127.0.0.0/8`, `::1`) is this host; an
/// IPv4-mapped IPv6 address is its IPv4 address; any other IPv6 address
/// counts as its /64, the prefix one site is given.
pub fn client_of(peer: IpAddr) -> IpAddr {
    let peer = peer.to_canonical();
    if peer.is_loopback() {
        return IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    }
    match peer {
        IpAddr::V6(v6) => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        v4 => v4,
    }
}

impl Table {
    fn oldest_idle(&self, peer: Option<IpAddr>) -> Option<u64> {
        self.open
            .iter()
            .find(|(_, c)| peer.is_none_or(|p| c.peer == p) && c.busy.load(Ordering::SeqCst) == 0)
            .map(|(id, _)| *id)
    }

    fn evict(&mut self, peer: Option<IpAddr>) -> Option<()> {
        let id = self.oldest_idle(peer)?;
        let conn = self.open.remove(&id)?;
        // A permit is stored: the connection's task ends even if it is not
        // waiting yet.
        conn.evict.notify_one();
        Some(())
    }
}

/// Marks a connection busy while a request is handled and its response
/// body streams; idle again (and evictable) once dropped.
#[derive(Debug)]
pub struct Busy {
    admission: Arc<Admission>,
    busy: Arc<AtomicUsize>,
}

impl Busy {
    pub fn new(ticket: &Ticket) -> Self {
        ticket.busy.fetch_add(1, Ordering::SeqCst);
        Self { admission: ticket.admission.clone(), busy: ticket.busy.clone() }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if self.busy.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.admission.room.notify_waiters();
        }
    }
}

/// A response body that keeps its connection busy until it is sent or dropped.
pub fn hold_busy(body: Body, busy: Busy) -> Body {
    http_body_util::BodyExt::boxed(Holding { body, _busy: busy })
}

struct Holding {
    body: Body,
    _busy: Busy,
}

impl hyper::body::Body for Holding {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// Why a request body stopped.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error(transparent)]
    Read(Box<dyn std::error::Error + Send + Sync>),
    #[error("the client sent nothing of the request body for {0:?}")]
    Stalled(Duration),
}

/// What a request body must bring in every `idle` period to count as
/// moving: 1 KiB per 30 s is 34 bytes a second, slower than any real link.
pub const MIN_BODY_PROGRESS: usize = 1024;

/// A request body that fails when less than [`MIN_BODY_PROGRESS`] bytes
/// arrive in `idle`: a client cannot hold a worker by starting a body and
/// never finishing it, nor by trickling it a byte at a time.
pub struct IdleBody<B> {
    inner: B,
    idle: Duration,
    /// Bytes since the timer was last reset.
    progress: usize,
    /// Armed when the body is first read: a handler may read it late (and
    /// a client sending `Expect: 100-continue` waits for that first read).
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<B> std::fmt::Debug for IdleBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdleBody").field("idle", &self.idle).finish_non_exhaustive()
    }
}

impl<B> IdleBody<B> {
    pub fn new(inner: B, idle: Duration) -> Self {
        Self { inner, idle, progress: 0, timer: None }
    }
}

impl<B> hyper::body::Body for IdleBody<B>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = BodyError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        let idle = this.idle;
        let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.progress +=
                    frame.as_ref().and_then(|f| f.as_ref().ok()?.data_ref()).map_or(0, Bytes::len);
                if this.progress >= MIN_BODY_PROGRESS {
                    this.progress = 0;
                    timer.as_mut().reset(tokio::time::Instant::now() + idle);
                }
                Poll::Ready(frame.map(|f| f.map_err(|e| BodyError::Read(e.into()))))
            }
            Poll::Pending => match std::future::Future::poll(timer.as_mut(), cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(BodyError::Stalled(idle)))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// A connection's socket whose writes fail with `TimedOut` once the client
/// has taken none of the response for `stall`: hyper then closes the
/// connection and drops the response body, which gives back its busy mark
/// and its stream slot. The response itself may take any time while the
/// client keeps reading.
pub struct StallingIo<T> {
    inner: T,
    stall: Duration,
    /// Armed while a write waits for the client; cleared by any progress.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> std::fmt::Debug for StallingIo<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StallingIo").field("stall", &self.stall).finish_non_exhaustive()
    }
}

impl<T> StallingIo<T> {
    pub fn new(inner: T, stall: Duration) -> Self {
        Self { inner, stall, timer: None }
    }

    /// `Pending` from a write: arms the timer, or fails once it has run out.
    fn waiting(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Error> {
        let stall = self.stall;
        let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        match std::future::Future::poll(timer.as_mut(), cx) {
            Poll::Ready(()) => Poll::Ready(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the client took none of the response for {stall:?}"),
            )),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progressed<R>(
        &mut self,
        done: Poll<std::io::Result<R>>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<R>> {
        match done {
            Poll::Ready(r) => {
                self.timer = None;
                Poll::Ready(r)
            }
            Poll::Pending => self.waiting(cx).map(Err),
        }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for StallingIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for StallingIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let done = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progressed(done, cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let done = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progressed(done, cx)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let done = Pin::new(&mut self.inner).poll_flush(cx);
        self.progressed(done, cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let done = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.progressed(done, cx)
    }
}

/// Whether an `accept` error means the daemon is out of descriptors or
/// memory: retrying at once would only spin.
pub fn accept_starved(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per_client: usize) -> Limits {
        Limits {
            max_connections: max,
            max_per_client: per_client,
            header_timeout: Duration::from_secs(1),
            body_idle_timeout: Duration::from_secs(1),
            write_stall_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn a_full_daemon_evicts_the_oldest_idle_connection_never_a_busy_one() {
        let admission = Admission::new(limits(2, 2));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let first = admission.admit(a).unwrap();
        let second = admission.admit(a).unwrap();
        let busy = Busy::new(&second);
        // The first (idle) gives way; the second is busy and stays.
        let third = admission.admit(a).unwrap();
        assert_eq!(admission.open(), 2);
        assert!(admission.lock().open.contains_key(&second.id));
        assert!(!admission.lock().open.contains_key(&first.id));
        // Everyone busy: refused.
        let _busy3 = Busy::new(&third);
        assert!(admission.admit(a).is_none());
        drop(busy);
        assert!(admission.admit(a).is_some());
    }

    #[test]
    fn a_client_at_its_limit_gives_up_its_own_connections_not_others() {
        let admission = Admission::new(limits(10, 2));
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let other = admission.admit(b).unwrap();
        let _a1 = admission.admit(a).unwrap();
        let _a2 = admission.admit(a).unwrap();
        let _a3 = admission.admit(a).unwrap();
        assert!(admission.lock().open.contains_key(&other.id), "b's idle connection stays");
        assert_eq!(admission.open(), 3);
    }

    /// One client's busy connections from ever new addresses (127.0.0.2,
    /// 127.0.0.3, ..., or one IPv6 /64) still count against one quarter.
    #[test]
    fn a_client_with_many_addresses_is_still_one_client() {
        for addresses in
            [["127.0.0.2", "127.0.0.3", "::1"], ["2001:db8::1", "2001:db8::2", "2001:db8::ffff:3"]]
        {
            let admission = Admission::new(limits(8, 2));
            let (mut held, mut tickets) = (Vec::new(), Vec::new());
            for a in &addresses[..2] {
                let ticket = admission.admit(a.parse().unwrap()).unwrap();
                held.push(Busy::new(&ticket));
                held.push(Busy::new(&ticket));
                tickets.push(ticket);
            }
            assert!(
                admission.admit(addresses[2].parse().unwrap()).is_none(),
                "{addresses:?}: a third address was admitted"
            );
            assert!(admission.admit("10.0.0.9".parse().unwrap()).is_some(), "another client still gets in");
        }
        assert_eq!(client_of("::ffff:10.0.0.1".parse().unwrap()), client_of("10.0.0.1".parse().unwrap()));
        assert_ne!(
            client_of("2001:db8:0:1::1".parse().unwrap()),
            client_of("2001:db8:0:2::1".parse().unwrap())
        );
    }

    /// A body whose client never sends another byte.
    struct Silent;

    impl hyper::body::Body for Silent {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Pending
        }
    }

    /// A body whose client sends one byte at a time, each well within the
    /// idle timeout: slowloris on the body.
    struct Trickle(Pin<Box<tokio::time::Sleep>>, Duration);

    impl hyper::body::Body for Trickle {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            let every = self.1;
            match std::future::Future::poll(self.0.as_mut(), cx) {
                Poll::Ready(()) => {
                    self.0.as_mut().reset(tokio::time::Instant::now() + every);
                    Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))))
                }
                Poll::Pending => Poll::Pending,
            }
        }
    }

    #[test]
    fn a_request_body_trickled_a_byte_at_a_time_fails_as_stalled() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let (idle, every) = (Duration::from_millis(200), Duration::from_millis(20));
        let started = std::time::Instant::now();
        let read = runtime.block_on(async {
            let trickle = Trickle(Box::pin(tokio::time::sleep(every)), every);
            tokio::time::timeout(
                Duration::from_secs(5),
                http_body_util::BodyExt::collect(IdleBody::new(trickle, idle)),
            )
            .await
        });
        let read = read.expect("the trickled body was still being read after 5 s");
        assert!(matches!(read, Err(BodyError::Stalled(d)) if d == idle));
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn a_stalled_request_body_fails_instead_of_holding_its_worker() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let idle = Duration::from_millis(50);
        let started = std::time::Instant::now();
        let read = runtime.block_on(http_body_util::BodyExt::collect(IdleBody::new(Silent, idle)));
        assert!(matches!(read, Err(BodyError::Stalled(d)) if d == idle));
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    /// A response body that never ends.
    struct Endless;

    impl hyper::body::Body for Endless {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'x'; 1 << 16])))))
        }
    }

    /// A client that sends a request and never reads the (endless)
    /// response: the connection ends within the stall timeout and its busy
    /// mark (what holds a stream slot) is given back.
    #[test]
    fn a_client_that_stops_reading_a_response_loses_its_connection() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let admission = Admission::new(limits(4, 4));
        let ticket = Arc::new(admission.admit("127.0.0.1".parse().unwrap()).unwrap());
        let stall = Duration::from_millis(300);
        let started = std::time::Instant::now();
        let (mut client, server) = tokio::io::duplex(4096);
        let served = runtime.block_on(async {
            client.write_all(b"GET /logs HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n").await.unwrap();
            let t = ticket.clone();
            let service = hyper::service::service_fn(move |_req| {
                let busy = Busy::new(&t);
                // A log that never ends: what a running command's stream is.
                let body = hold_busy(http_body_util::BodyExt::boxed(Endless), busy);
                async move { Ok::<_, std::convert::Infallible>(hyper::Response::new(body)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .serve_connection(hyper_util::rt::TokioIo::new(StallingIo::new(server, stall)), service);
            // Proof the response started: the client reads its first bytes, then stops.
            let mut first = [0u8; 12];
            let (served, _) = tokio::join!(
                tokio::time::timeout(Duration::from_secs(10), connection),
                client.read_exact(&mut first)
            );
            assert_eq!(&first, b"HTTP/1.1 200");
            served
        });
        assert!(served.is_ok(), "the connection was still open after 10 s");
        assert!(served.unwrap().is_err(), "it ended with the stall error");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        assert_eq!(ticket.busy.load(Ordering::SeqCst), 0, "the busy mark was given back");
    }

    #[test]
    fn limits_fit_the_descriptor_budget() {
        let small = Limits::for_descriptors(1024);
        assert!(small.max_connections as u64 * FDS_PER_CONNECTION + FD_RESERVE <= 1024);
        assert_eq!(Limits::for_descriptors(1 << 20).max_connections, 1024);
        assert!(small.max_per_client < small.max_connections);
    }
}
