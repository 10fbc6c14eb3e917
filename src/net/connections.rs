//! Bounds on a listener's connections, beside the per-connection HTTP/2
//! bounds each server sets: how many connections it holds at once, and how
//! long one may stay open with no call on it.
//!
//! [`limit`] wraps a listener's accepted connections: it holds at most
//! `max_connections`, and when they are all held a newcomer takes the
//! place of the one longest without progress that has no call in service
//! ([`super::places`]); only when every one is in service is the newcomer
//! closed at once (counted, logged once a minute), so a client that opens
//! thousands of sockets costs file descriptors for an instant, not the
//! server's memory, and one that holds places without using them holds
//! them only until someone needs one. Each admitted connection is a
//! [`Tracked`], whose [`Activity`] counts its open calls and those whose
//! request arrived whole (the [`CountCalls`] layer, via the request's
//! connect info); one with no call for `idle` is closed too. A trainer's
//! connection always has its stream open, and a client's channel
//! reconnects on its next call, so only abandoned or hostile connections
//! give their places up.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::places::{Admitted, Occupant, Place, Places};
use super::refusals::Refusals;
use crate::metrics::log_gate::LogGate;

/// A listener's connection bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections held at once; more are closed as they come.
    pub max_connections: usize,
    /// A connection with no call open for this long is closed.
    pub idle: Duration,
}

/// What one open connection with no call costs the server: hyper's and
/// h2's state and buffers, and the socket's. `tests/hostile_listeners/`
/// measures it (RSS over a listener's whole limit of connections that sent
/// their preface and SETTINGS): 16-17 KiB on the sidecar and the worker;
/// this leaves room for a connection's first buffers. Calls are counted in
/// their own terms (streams, units).
pub const BYTES_PER_IDLE_CONNECTION: u64 = 64 << 10;

impl ConnectionLimits {
    /// The most the listener's connections hold between calls.
    pub fn memory_bound(&self) -> u64 {
        self.max_connections as u64 * BYTES_PER_IDLE_CONNECTION
    }
}

/// What one connection is doing: its open calls, those in service (their
/// request arrived whole), since when it has had none, and when it last
/// made progress.
#[derive(Debug)]
pub struct Activity {
    open_calls: AtomicUsize,
    in_service: AtomicUsize,
    /// Millis since `epoch` when the last call ended (or the connection
    /// opened).
    idle_since_ms: AtomicU64,
    /// Millis since the process's first connection when the connection
    /// opened, a request of it arrived whole or a call in service ended:
    /// comparable across connections.
    progress_ms: AtomicU64,
    epoch: Instant,
    /// Told to close: its place went to a newcomer.
    evicted: AtomicBool,
    wake: AtomicWaker,
}

/// The clock connections' progress is compared on.
fn progress_clock() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Default for Activity {
    fn default() -> Self {
        Self::new()
    }
}

impl Activity {
    pub fn new() -> Self {
        Self {
            open_calls: AtomicUsize::new(0),
            in_service: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            progress_ms: AtomicU64::new(progress_clock()),
            epoch: Instant::now(),
            evicted: AtomicBool::new(false),
            wake: AtomicWaker::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A call opened, its request still to arrive; it is open until the
    /// returned guard and its clones are dropped.
    pub fn begin_call(self: &Arc<Self>) -> CallGuard {
        self.open_calls.fetch_add(1, Ordering::AcqRel);
        CallGuard(Arc::new(Call {
            activity: self.clone(),
            arrived: AtomicBool::new(false),
        }))
    }

    fn progressed(&self) {
        self.progress_ms
            .fetch_max(progress_clock(), Ordering::AcqRel);
    }

    pub(super) fn evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire)
    }

    /// When the connection went idle, if it is.
    fn idle_since(&self) -> Option<Instant> {
        if self.open_calls.load(Ordering::Acquire) > 0 {
            return None;
        }
        let ms = self.idle_since_ms.load(Ordering::Acquire);
        Some(self.epoch + Duration::from_millis(ms))
    }
}

impl Occupant for Activity {
    fn in_service(&self) -> bool {
        self.in_service.load(Ordering::Acquire) > 0
    }

    fn progress_ms(&self) -> u64 {
        self.progress_ms.load(Ordering::Acquire)
    }

    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        self.wake.wake();
    }
}

/// An open call on a connection (cloned where its request and its
/// response are held apart).
#[derive(Debug, Clone)]
pub struct CallGuard(Arc<Call>);

impl CallGuard {
    /// The call's request arrived whole: it is in service.
    pub fn arrived(&self) {
        if !self.0.arrived.swap(true, Ordering::AcqRel) {
            self.0.activity.in_service.fetch_add(1, Ordering::AcqRel);
            self.0.activity.progressed();
        }
    }
}

#[derive(Debug)]
struct Call {
    activity: Arc<Activity>,
    arrived: AtomicBool,
}

impl Drop for Call {
    fn drop(&mut self) {
        let activity = &self.activity;
        if self.arrived.load(Ordering::Acquire) {
            activity.progressed();
            activity.in_service.fetch_sub(1, Ordering::AcqRel);
        }
        // The stamp first: a check between the two sees a call still open.
        activity
            .idle_since_ms
            .store(activity.now_ms(), Ordering::Release);
        activity.open_calls.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the server's layers learn of a connection (tonic puts it in each
/// request's extensions).
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    pub activity: Arc<Activity>,
}

/// An admitted connection: holds its place until closed, and closes itself
/// when idle too long.
pub struct Tracked<IO> {
    inner: IO,
    activity: Arc<Activity>,
    idle: Duration,
    check: Pin<Box<Sleep>>,
    _place: Place<Activity>,
}

impl<IO> Tracked<IO> {
    /// The connection's calls, for a server that counts them itself (one
    /// not behind [`CountCallsLayer`]).
    pub fn activity(&self) -> Arc<Activity> {
        self.activity.clone()
    }

    fn new(inner: IO, activity: Arc<Activity>, place: Place<Activity>, idle: Duration) -> Self {
        Self {
            inner,
            activity,
            idle,
            check: Box::pin(tokio::time::sleep(idle)),
            _place: place,
        }
    }

    /// Whether the idle bound is past; re-arms the check otherwise.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            ready!(self.check.as_mut().poll(cx));
            let next = match self.activity.idle_since() {
                Some(since) if since + self.idle <= Instant::now() => return Poll::Ready(()),
                Some(since) => since + self.idle,
                None => Instant::now() + self.idle,
            };
            self.check.as_mut().reset(next);
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Tracked<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Poll::Ready(read) = Pin::new(&mut this.inner).poll_read(cx, buf) {
            return Poll::Ready(read);
        }
        // Registered before the check: an eviction after it wakes this read.
        this.activity.wake.register(cx.waker());
        if this.activity.evicted() {
            metrics::counter!(crate::metrics::CONNECTIONS_CLOSED, "reason" => "evicted")
                .increment(1);
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the listener was full and this connection had gone longest without use",
            )));
        }
        ready!(this.poll_idle(cx));
        metrics::counter!(crate::metrics::CONNECTIONS_CLOSED, "reason" => "idle").increment(1);
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no call on the connection within the idle bound",
        )))
    }
}

// Writes pass through untouched: only reads see the idle bound.
crate::net::delegate_async_write!(Tracked, inner);

impl<IO> tonic::transport::server::Connected for Tracked<IO> {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        ConnectionInfo {
            activity: self.activity.clone(),
        }
    }
}

/// The first pause after a failed `accept`; it doubles to
/// [`MAX_ACCEPT_PAUSE`] while `accept` keeps failing.
const FIRST_ACCEPT_PAUSE: Duration = Duration::from_millis(10);
const MAX_ACCEPT_PAUSE: Duration = Duration::from_secs(1);

/// `incoming` without its accept errors: each failure (the descriptor
/// limit, mostly) pauses the listener, 10 ms doubling to 1 s, and is
/// logged once a minute. Without it a listener at the descriptor limit
/// retries at once: tonic's loop skips the error and spins a core.
pub fn pause_on_accept_errors<IO, S>(incoming: S, listener: &'static str) -> impl Stream<Item = IO>
where
    S: Stream<Item = io::Result<IO>>,
{
    let pause = Arc::new(AtomicU64::new(FIRST_ACCEPT_PAUSE.as_millis() as u64));
    let failures = Arc::new(LogGate::new(Duration::from_secs(60)));
    incoming.filter_map(move |accepted| {
        let (pause, failures) = (pause.clone(), failures.clone());
        async move {
            match accepted {
                Ok(connection) => {
                    pause.store(FIRST_ACCEPT_PAUSE.as_millis() as u64, Ordering::Relaxed);
                    Some(connection)
                }
                Err(error) => {
                    if let Some(left_out) = failures.open() {
                        tracing::warn!(listener, %error, left_out, "accept failed; pausing the listener");
                    }
                    let millis = pause.load(Ordering::Relaxed);
                    let next = (millis * 2).min(MAX_ACCEPT_PAUSE.as_millis() as u64);
                    pause.store(next, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(millis)).await;
                    None
                }
            }
        }
    })
}

/// `incoming`'s connections within `limits` (its accept errors paused on,
/// never passed on); `listener` names it in logs and metrics.
pub fn limit<IO, S>(
    incoming: S,
    limits: ConnectionLimits,
    listener: &'static str,
) -> impl Stream<Item = io::Result<Tracked<IO>>>
where
    S: Stream<Item = io::Result<IO>>,
{
    let places = Places::new(limits.max_connections);
    let refusals = Arc::new(Refusals::new("limit"));
    let evictions = Arc::new(crate::metrics::log_gate::LogGate::new(Duration::from_secs(
        60,
    )));
    pause_on_accept_errors(incoming, listener).filter_map(move |connection| {
        let activity = Arc::new(Activity::new());
        let place = places.take(&activity);
        let (refusals, evictions) = (refusals.clone(), evictions.clone());
        async move {
            match place {
                Some((place, admitted)) => {
                    if admitted == Admitted::Evicted {
                        if let Some(left_out) = evictions.open() {
                            tracing::warn!(
                                listener,
                                limit = limits.max_connections,
                                left_out,
                                "the listener is full: the connection longest without use \
                                 gave its place to a new one"
                            );
                        }
                    }
                    Some(Ok(Tracked::new(connection, activity, place, limits.idle)))
                }
                None => {
                    refusals.close(connection, |_, left_out| {
                        tracing::warn!(
                            listener,
                            limit = limits.max_connections,
                            left_out,
                            "closed a new connection: every connection the listener holds \
                             is in use"
                        );
                    });
                    None
                }
            }
        }
    })
}

/// Counts each call on its connection's [`Activity`] for as long as its
/// response body is open (a stream's whole life).
#[derive(Debug, Clone, Copy, Default)]
pub struct CountCallsLayer;

impl<S> tower::Layer<S> for CountCallsLayer {
    type Service = CountCalls<S>;

    fn layer(&self, inner: S) -> CountCalls<S> {
        CountCalls { inner }
    }
}

#[derive(Debug, Clone)]
pub struct CountCalls<S> {
    inner: S,
}

type HttpRequest = tonic::codegen::http::Request<tonic::body::Body>;
type HttpResponse = tonic::codegen::http::Response<tonic::body::Body>;

impl<S> tower::Service<HttpRequest> for CountCalls<S>
where
    S: tower::Service<HttpRequest, Response = HttpResponse>,
    S::Future: Send + 'static,
{
    type Response = HttpResponse;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<HttpResponse, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: HttpRequest) -> Self::Future {
        // Under TLS, tonic wraps the connection's info in its own.
        let extensions = request.extensions();
        let guard = extensions
            .get::<ConnectionInfo>()
            .or_else(|| {
                extensions
                    .get::<tonic::transport::server::TlsConnectInfo<ConnectionInfo>>()
                    .map(|tls| tls.get_ref())
            })
            .map(|info| info.activity.begin_call());
        // The call is in service once its request arrived whole: until
        // then its connection may give its place up (see `places`).
        let request = match &guard {
            Some(call) => {
                let call = call.clone();
                request.map(|body| {
                    tonic::body::Body::new(CallBody {
                        body,
                        call: Some(call),
                        request: true,
                    })
                })
            }
            None => request,
        };
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(match guard {
                Some(guard) => response.map(|body| {
                    tonic::body::Body::new(CallBody {
                        body,
                        call: Some(guard),
                        request: false,
                    })
                }),
                None => response,
            })
        })
    }
}

/// A call's request or its response body, holding the call open: the
/// request's marks the call in service at its end (and lets go of it),
/// the response's keeps it counted until it is dropped.
struct CallBody {
    body: tonic::body::Body,
    call: Option<CallGuard>,
    request: bool,
}

impl http_body::Body for CallBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.body).poll_frame(cx));
        if this.request {
            let ended = match &frame {
                None => true,
                Some(Ok(_)) => this.body.is_end_stream(),
                Some(Err(_)) => false,
            };
            if let Some(call) = this.call.take_if(|_| ended) {
                call.arrived();
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_connection_without_calls_closes_after_the_idle_bound_and_one_with_a_call_does_not() {
        let places = Places::new(1);
        let (server, mut client) = tokio::io::duplex(64);
        let idle = Duration::from_secs(60);
        let activity = Arc::new(Activity::new());
        let (place, _) = places.take(&activity).unwrap();
        let mut tracked = Tracked::new(server, activity, place, idle);
        let activity = tracked.activity.clone();
        let call = activity.begin_call();
        let mut buf = [0u8; 8];
        // A call open: a read waits past the bound for the client's bytes.
        let read = tokio::time::timeout(idle * 3, tracked.read(&mut buf)).await;
        assert!(read.is_err(), "no close while a call is open");
        client.write_all(b"x").await.unwrap();
        assert_eq!(tracked.read(&mut buf).await.unwrap(), 1);
        drop(call);
        let started = Instant::now();
        let error = tracked.read(&mut buf).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= idle, "{:?}", started.elapsed());
        assert_eq!(places.held(), 1);
        drop(tracked);
        assert_eq!(places.held(), 0, "its place is free again");
    }

    #[tokio::test(start_paused = true)]
    async fn accept_errors_pause_the_listener_and_are_not_passed_on() {
        let (sender, receiver) = futures::channel::mpsc::unbounded::<io::Result<u32>>();
        for _ in 0..3 {
            let error = io::Error::from_raw_os_error(24); // EMFILE
            sender.unbounded_send(Err(error)).unwrap();
        }
        sender.unbounded_send(Ok(7)).unwrap();
        let mut accepted = Box::pin(pause_on_accept_errors(receiver, "test"));
        let started = Instant::now();
        assert_eq!(accepted.next().await, Some(7));
        // 10 + 20 + 40 ms: doubling pauses, not a spin.
        assert_eq!(started.elapsed(), Duration::from_millis(70));
    }

    #[tokio::test]
    async fn past_the_limit_a_newcomer_takes_an_unused_place_or_is_closed() {
        let (sender, receiver) = futures::channel::mpsc::unbounded::<io::Result<_>>();
        let limits = ConnectionLimits {
            max_connections: 2,
            idle: Duration::from_secs(60),
        };
        let mut admitted = Box::pin(limit(receiver, limits, "test"));
        let connect = || {
            let (server, client) = tokio::io::duplex(64);
            sender.unbounded_send(Ok(server)).unwrap();
            client
        };
        let _clients = [connect(), connect()];
        let mut first = admitted.next().await.unwrap().unwrap();
        let second = admitted.next().await.unwrap().unwrap();
        // Full, neither in service: the newcomer takes the first's place,
        // and the first closes on its next read.
        let _third_client = connect();
        let third = admitted.next().await.unwrap().unwrap();
        let mut byte = [0u8; 1];
        let error = first.read(&mut byte).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionAborted);
        drop(first);
        // Both held in service: the next newcomer is closed at once.
        let calls = [
            second.activity().begin_call(),
            third.activity().begin_call(),
        ];
        calls.iter().for_each(CallGuard::arrived);
        let mut fourth = connect();
        let refused = tokio::time::timeout(Duration::from_secs(1), admitted.next()).await;
        assert!(refused.is_err(), "not handed to the server");
        assert_eq!(fourth.read(&mut byte).await.unwrap(), 0);
        // A place freed is taken by the next.
        drop(second);
        let _fifth = connect();
        assert!(admitted.next().await.unwrap().is_ok());
    }
}
