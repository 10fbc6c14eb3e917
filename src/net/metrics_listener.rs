//! The Prometheus scrape endpoint (`/metrics`), behind the same connection
//! bounds as the gRPC listeners.
//!
//! The exporter crate's own HTTP listener bounds nothing: it holds every
//! idle connection and every unfinished request head for as long as the
//! client likes, and when `accept` fails (the descriptor limit) it retries
//! at once, logging each failure, which spins a core and floods the log.
//! Here the exporter only renders; this listener admits at most
//! `max_connections` at once ([`limit`]), closes a connection with no
//! request for `idle`, gives a request head `head_deadline` to arrive and
//! at most [`MAX_HEAD_BYTES`] to fill, and (through [`limit`]) pauses
//! after a failed `accept`, logging it once a minute.

use std::convert::Infallible;
use std::io;
use std::time::Duration;

use futures::StreamExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::bounds::{FirstBytes, ListenerBounds};
use super::connections::{limit, ConnectionLimits};
use super::peers::limit_per_peer;

/// The most a request head may buffer (hyper's smallest read buffer): a
/// scrape's head is a few hundred bytes.
pub const MAX_HEAD_BYTES: usize = 8 << 10;

/// How often the exporter's histograms are brought up to date between
/// scrapes (the exporter's own listener does it every 5 s).
const UPKEEP: Duration = Duration::from_secs(5);

/// The metrics listener's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsBounds {
    pub connections: ConnectionLimits,
    /// Connections one address may hold: a scraper needs one or two.
    pub per_peer: usize,
    /// A request head not complete within this is answered 408 and closed.
    pub head_deadline: Duration,
}

impl MetricsBounds {
    /// A few scrapers (Prometheus, an agent, a person with curl) need a
    /// handful of connections; the rest are someone else's.
    pub const DEFAULT: MetricsBounds = MetricsBounds {
        connections: ConnectionLimits {
            max_connections: 32,
            idle: Duration::from_secs(120),
        },
        per_peer: 8,
        head_deadline: Duration::from_secs(10),
    };

    /// As every listener publishes its bounds (`listener="metrics"`).
    pub fn published(&self) -> ListenerBounds {
        ListenerBounds {
            first_bytes: Some(FirstBytes {
                max_bytes: MAX_HEAD_BYTES,
                deadline: self.head_deadline,
            }),
            per_peer: Some(self.per_peer),
            ..ListenerBounds::new("metrics", self.connections)
        }
    }

    /// The most the listener's connections hold: each idle connection's
    /// state plus a full request head.
    pub fn memory_bound(&self) -> u64 {
        self.connections.memory_bound()
            + self.connections.max_connections as u64 * MAX_HEAD_BYTES as u64
    }
}

/// Serves `handle`'s rendering at `/metrics` on `listener` within `bounds`,
/// and keeps the exporter's upkeep, until the task is aborted.
pub fn serve(
    listener: TcpListener,
    handle: PrometheusHandle,
    bounds: MetricsBounds,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let upkeep = {
            let handle = handle.clone();
            tokio::spawn(async move {
                let mut every = tokio::time::interval(UPKEEP);
                loop {
                    every.tick().await;
                    handle.run_upkeep();
                }
            })
        };
        let _stop_upkeep = AbortOnDrop(upkeep);
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let incoming = limit_per_peer(incoming, bounds.per_peer, "metrics");
        let mut admitted = Box::pin(limit(incoming, bounds.connections, "metrics"));
        while let Some(accepted) = admitted.next().await {
            // `limit` pauses on accept errors itself and never yields one.
            let Ok(connection) = accepted else { continue };
            let activity = connection.activity();
            let handle = handle.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    // Counted while it is answered: a connection between
                    // scrapes meets the idle bound, one mid-scrape does not.
                    // hyper calls this once the request head arrived whole:
                    // the call is in service at once.
                    let call = activity.begin_call();
                    call.arrived();
                    let response = answer(&request, &handle);
                    drop(call);
                    async move { Ok::<_, Infallible>(response) }
                });
                let served = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(bounds.head_deadline)
                    .max_buf_size(MAX_HEAD_BYTES)
                    .serve_connection(TokioIo::new(connection), service)
                    .await;
                if let Err(error) = served {
                    tracing::debug!(%error, "metrics connection ended");
                }
            });
        }
    })
}

/// Binds `addr` (port 0: a free port) and serves the metrics there;
/// returns the address bound.
pub async fn bind_and_serve(
    addr: std::net::SocketAddr,
    handle: PrometheusHandle,
    bounds: MetricsBounds,
) -> io::Result<(std::net::SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    bounds.published().publish();
    Ok((bound, serve(listener, handle, bounds)))
}

fn answer(
    request: &hyper::Request<hyper::body::Incoming>,
    handle: &PrometheusHandle,
) -> hyper::Response<String> {
    let status = match (request.method(), request.uri().path()) {
        (&hyper::Method::GET | &hyper::Method::HEAD, "/metrics" | "/") => {
            return hyper::Response::builder()
                .header("content-type", "text/plain; version=0.0.4")
                .body(handle.render())
                .unwrap_or_default();
        }
        (_, "/metrics" | "/") => hyper::StatusCode::METHOD_NOT_ALLOWED,
        _ => hyper::StatusCode::NOT_FOUND,
    };
    let mut response = hyper::Response::new(String::new());
    *response.status_mut() = status;
    response
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn scrape(addr: std::net::SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut out = String::new();
        stream.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_the_rendering_and_refuses_other_paths() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            metrics::counter!("shardfeed_test_total").increment(3);
        });
        let (addr, _served) = bind_and_serve(
            "127.0.0.1:0".parse().unwrap(),
            handle,
            MetricsBounds::DEFAULT,
        )
        .await
        .unwrap();
        let page = scrape(addr, "/metrics").await;
        assert!(page.starts_with("HTTP/1.1 200"), "{page}");
        assert!(page.contains("shardfeed_test_total 3"), "{page}");
        assert!(scrape(addr, "/elsewhere").await.starts_with("HTTP/1.1 404"));
    }

    /// What the exporter's own listener held forever: unfinished and
    /// unstarted heads are closed at the head deadline, connections past the
    /// cap at once; an honest scrape is served after them.
    #[tokio::test]
    async fn unfinished_heads_extra_and_idle_connections_are_closed() {
        let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
            .build_recorder()
            .handle();
        let bounds = MetricsBounds {
            connections: ConnectionLimits {
                max_connections: 4,
                idle: Duration::from_millis(1500),
            },
            // All from one address here: the total is what is under test.
            per_peer: 4,
            head_deadline: Duration::from_millis(300),
        };
        let (addr, _served) = bind_and_serve("127.0.0.1:0".parse().unwrap(), handle, bounds)
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        let mut held = Vec::new();
        for n in 0..4 {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            if n < 2 {
                // Half a head, never finished.
                stream
                    .write_all(b"GET /metrics HTTP/1.1\r\nhost:")
                    .await
                    .unwrap();
            }
            held.push(stream);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The fifth finds the places taken: closed before a byte is read.
        let mut extra = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut byte = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(1), extra.read(&mut byte)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
        // The unfinished heads end at their deadline (hyper answers 408).
        for stream in &mut held[..2] {
            let mut answer = Vec::new();
            let read =
                tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut answer));
            assert!(read.await.is_ok(), "an unfinished head was held");
        }
        assert!(started.elapsed() < Duration::from_millis(1400));
        // The silent ones end too (a first head has the same deadline), and
        // their places serve an honest scrape.
        for stream in &mut held[2..] {
            let mut answer = Vec::new();
            let read =
                tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut answer));
            assert!(read.await.is_ok(), "an idle connection was held");
        }
        assert!(scrape(addr, "/metrics").await.starts_with("HTTP/1.1 200"));
    }
}
