//! Listening and lifecycle: where the server listens (TCP or a Unix
//! socket), the tonic server with its HTTP/2 settings and health service,
//! and graceful shutdown (NOT_SERVING, drain, grace period).

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::limits::{CONNECTION_WINDOWS_PER_STREAM, DEFAULT_STREAM_WINDOW_BYTES};
use super::pb::shardfeed_server::ShardfeedServer;
use super::service::ShardfeedService;
use crate::net::bounds::{Http2Bounds, ListenerBounds, DEFAULT_FRAME_BYTES};
use crate::net::connections::{limit, CountCallsLayer};
use crate::net::requests::BoundRequestsLayer;

/// Where the gRPC server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::str::FromStr for ListenAddr {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        if let Some(path) = value
            .strip_prefix("unix://")
            .or_else(|| value.strip_prefix("unix:"))
        {
            if path.is_empty() {
                return Err("unix socket path is empty".into());
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        value
            .parse()
            .map(Self::Tcp)
            .map_err(|e| format!("{value:?} is neither host:port nor unix:/path ({e})"))
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Tcp(addr) => write!(f, "{addr}"),
            ListenAddr::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("starting: {0}")]
    Startup(String),
}

/// A bound listener, so callers (tests, the demo) learn the real port first.
pub enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener, PathBuf),
}

impl Listener {
    pub async fn bind(addr: &ListenAddr) -> Result<Self, ServeError> {
        let bind_error = |source| ServeError::Bind {
            addr: addr.to_string(),
            source,
        };
        match addr {
            ListenAddr::Tcp(socket) => Ok(Self::Tcp(
                tokio::net::TcpListener::bind(socket)
                    .await
                    .map_err(bind_error)?,
            )),
            ListenAddr::Unix(path) => Ok(Self::Unix(bind_unix(path)?, path.clone())),
        }
    }

    pub fn local_addr(&self) -> ListenAddr {
        match self {
            Listener::Tcp(listener) => ListenAddr::Tcp(
                listener
                    .local_addr()
                    .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0))),
            ),
            Listener::Unix(_, path) => ListenAddr::Unix(path.clone()),
        }
    }
}

/// Binds a Unix socket at `path`, replacing a stale one; owner and group
/// may connect (the trainer container shares the pod's fsGroup), not others.
fn bind_unix(path: &std::path::Path) -> Result<tokio::net::UnixListener, ServeError> {
    let bind_error = |source| ServeError::Bind {
        addr: format!("unix:{}", path.display()),
        source,
    };
    remove_stale_socket(path).map_err(bind_error)?;
    let listener = tokio::net::UnixListener::bind(path).map_err(bind_error)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(bind_error)?;
    Ok(listener)
}

/// Stops a background task when the server stops.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Removes a socket file a previous run left behind, so bind can succeed;
/// refuses to touch anything else: a file that is not a socket, or a socket
/// a live server still answers on.
fn remove_stale_socket(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    if !meta.file_type().is_socket() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "the path exists and is not a socket; refusing to replace it",
        ));
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            "another server is listening on this socket",
        ));
    }
    std::fs::remove_file(path)
}

/// Owner and group may connect to the Unix socket.
pub const SOCKET_MODE: u32 = 0o660;

/// HTTP/2 bounds per connection. A trainer process opens one stream per
/// rank it serves (accelerate's dispatch: every rank of the host, in
/// turn) plus short calls (Describe, health, reports): 64 is several
/// hosts' worth, and `--max-streams` still bounds the server's streams in
/// all. Without a bound tonic advertises none, and 10,000 header-only
/// streams on one connection were all accepted. Headers are gRPC's and a
/// few of ours; a peer that makes the server reset this many streams, or
/// resets this many itself before they are accepted, loses its connection.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 64;
/// Connections the sidecar holds per listener, and how long one may stay
/// open with no call: a host's trainer processes and their data-loader
/// workers each hold one (8 ranks x 16 workers is 128), and a connection
/// closed for idleness is reopened by the client's channel on its next
/// call. Each idle connection costs the server its HTTP/2 state (see
/// docs/operating.md for the measured figure).
pub const CONNECTION_LIMITS: crate::net::connections::ConnectionLimits =
    crate::net::connections::ConnectionLimits {
        max_connections: 1024,
        idle: Duration::from_secs(600),
    };
pub const MAX_HEADER_LIST_BYTES: u32 = 16 << 10;
pub const MAX_LOCAL_ERROR_RESETS: usize = 256;
pub const MAX_PENDING_ACCEPT_RESETS: usize = 64;
pub const HTTP2: Http2Bounds = Http2Bounds {
    streams: MAX_STREAMS_PER_CONNECTION,
    header_list_bytes: MAX_HEADER_LIST_BYTES,
    frame_bytes: DEFAULT_FRAME_BYTES,
    local_error_resets: MAX_LOCAL_ERROR_RESETS,
    pending_accept_resets: MAX_PENDING_ACCEPT_RESETS,
};

/// The bounds of the gRPC listener `name` ("unix" or "tcp").
pub const fn grpc_bounds(name: &'static str) -> ListenerBounds {
    ListenerBounds {
        http2: Some(HTTP2),
        requests: Some(super::limits::REQUESTS),
        ..ListenerBounds::new(name, CONNECTION_LIMITS)
    }
}

/// How long open streams may run on after shutdown starts.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Serves until `shutdown` resolves, then drains: reports NOT_SERVING, refuses
/// new streams, lets each open stream send its batch in flight and end with
/// UNAVAILABLE (and a resume hint), and after `grace` ends whatever is left.
///
/// Until `startup` resolves (the disk cache is open: minutes for millions of
/// entries) the server already answers, health says NOT_SERVING and
/// requests get UNAVAILABLE; a failed startup ends `serve` with its error.
pub async fn serve(
    listener: Listener,
    service: ShardfeedService,
    startup: impl Future<Output = Result<(), String>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> Result<(), ServeError> {
    let (service, _fd_server) = with_ring_socket(&listener, service)?;
    let lifecycle = service.lifecycle();
    // However `serve` ends, the engine is let go of with it.
    let _release_engine = ReleaseEngine(lifecycle.clone());
    // Our receive windows (client requests are small; these matter when the
    // server is reached through a proxy that also streams to us).
    let window = DEFAULT_STREAM_WINDOW_BYTES;
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    set_health(&health_reporter, tonic_health::ServingStatus::NotServing).await;
    let (drain_tx, drain_rx) = tokio::sync::oneshot::channel::<()>();
    let drain_started = async move {
        let _ = drain_rx.await;
    };
    let bounds = grpc_bounds(match &listener {
        Listener::Tcp(_) => "tcp",
        Listener::Unix(..) => "unix",
    });
    bounds.publish();
    let router = HTTP2
        .configure(tonic::transport::Server::builder())
        .layer(CountCallsLayer)
        .layer(BoundRequestsLayer::new(super::limits::REQUESTS))
        .initial_stream_window_size(window)
        .initial_connection_window_size(window.saturating_mul(CONNECTION_WINDOWS_PER_STREAM))
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .tcp_nodelay(true)
        .add_service(health_service)
        .add_service(service.into_server());
    let server = async move {
        match listener {
            Listener::Tcp(listener) => {
                let incoming = limit(
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                    CONNECTION_LIMITS,
                    "tcp",
                );
                router
                    .serve_with_incoming_shutdown(incoming, drain_started)
                    .await
            }
            Listener::Unix(listener, _) => {
                // Clients send the socket path as :authority: see authority.rs.
                let incoming = limit(
                    futures::TryStreamExt::map_ok(
                        tokio_stream::wrappers::UnixListenerStream::new(listener),
                        super::authority::AnyAuthority::new,
                    ),
                    CONNECTION_LIMITS,
                    "unix",
                );
                router
                    .serve_with_incoming_shutdown(incoming, drain_started)
                    .await
            }
        }
    };
    let mut server = std::pin::pin!(server);
    let mut shutdown = std::pin::pin!(shutdown);
    // Startup first: one already done is SERVING before the first request.
    tokio::select! {
        biased;
        started = startup => {
            started.map_err(ServeError::Startup)?;
            lifecycle.started.cancel();
            set_health(&health_reporter, tonic_health::ServingStatus::Serving).await;
            tracing::info!("ready: SERVING");
            tokio::select! {
                result = &mut server => return result.map_err(ServeError::from),
                () = &mut shutdown => {}
            }
        }
        () = &mut shutdown => {}
        result = &mut server => return result.map_err(ServeError::from),
    }
    drain(&lifecycle, &health_reporter, grace, server, drain_tx).await
}

/// Beside a Unix socket, the companion socket that hands out shared-memory
/// rings (trainers on this host map batches from it), served for as long
/// as the returned task is held.
fn with_ring_socket(
    listener: &Listener,
    service: ShardfeedService,
) -> Result<(ShardfeedService, Option<AbortOnDrop>), ServeError> {
    match listener {
        Listener::Unix(_, path) => {
            let fd_path = super::shm::fd_socket_path(path);
            let fd_listener = bind_unix(&fd_path)?;
            let rings = std::sync::Arc::new(super::shm::RingRegistry::new(fd_path));
            super::shm::BOUNDS.publish();
            let task = tokio::spawn(super::shm::serve_fd_socket(
                fd_listener,
                rings.clone(),
                super::shm::BOUNDS.max_connections,
            ));
            Ok((service.with_shared_memory(rings), Some(AbortOnDrop(task))))
        }
        Listener::Tcp(_) => Ok((service, None)),
    }
}

/// Drain: report NOT_SERVING (probes and new connections still get
/// answers), refuse new streams, let open ones send their batch in flight
/// for `grace` at most, then close the connections.
async fn drain<Server: Future<Output = Result<(), tonic::transport::Error>>>(
    lifecycle: &super::service::Lifecycle,
    health_reporter: &tonic_health::server::HealthReporter,
    grace: Duration,
    mut server: std::pin::Pin<&mut Server>,
    drain_tx: tokio::sync::oneshot::Sender<()>,
) -> Result<(), ServeError> {
    tracing::info!(
        grace_seconds = grace.as_secs_f64(),
        open_streams = lifecycle.open_streams(),
        "shutting down: NOT_SERVING, draining open streams"
    );
    set_health(health_reporter, tonic_health::ServingStatus::NotServing).await;
    lifecycle.drain.cancel();
    // Every open stream holds a token of the tracker: once closed, `wait`
    // resolves when the last one is dropped.
    lifecycle.open.close();
    tokio::select! {
        result = &mut server => return result.map_err(ServeError::from),
        drained = tokio::time::timeout(grace, lifecycle.open.wait()) => {
            if drained.is_err() {
                tracing::warn!(
                    open_streams = lifecycle.open_streams(),
                    "grace period over; ending the streams still open"
                );
                lifecycle.abort.cancel();
            }
        }
    }
    // Let the final statuses reach the clients, then close connections.
    let _ = drain_tx.send(());
    match tokio::time::timeout(Duration::from_secs(2), &mut server).await {
        Ok(result) => result.map_err(ServeError::from),
        Err(_) => Ok(()),
    }
}

struct ReleaseEngine(super::service::Lifecycle);

impl Drop for ReleaseEngine {
    fn drop(&mut self) {
        self.0.engine.release();
    }
}

/// The status of the whole server ("") and of the Shardfeed service.
async fn set_health(
    reporter: &tonic_health::server::HealthReporter,
    status: tonic_health::ServingStatus,
) {
    reporter.set_service_status("", status).await;
    reporter
        .set_service_status(
            <ShardfeedServer<ShardfeedService> as tonic::server::NamedService>::NAME,
            status,
        )
        .await;
}
