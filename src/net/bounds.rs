//! A listener's bounds in one record. Each listener is configured from its
//! record (the connection limiter, the handshake gate, the HTTP/2 settings,
//! the request bounds) and publishes it when it binds, one gauge a bound
//! (`shardfeed_listener_bound{listener, bound}`), so what a running process
//! holds can be read back rather than trusted: docs/operating.md's table of
//! every listener is checked against a live sidecar and worker
//! (`clients/python/tests/e2e/test_bounds.py`).

use std::time::Duration;

use super::connections::ConnectionLimits;
use super::handshake::HandshakeLimits;
use super::requests::RequestBounds;

/// The gauge every bound is published as.
pub const LISTENER_BOUND: &str = "shardfeed_listener_bound";

/// HTTP/2's smallest frame size: what a server takes unless it says more.
pub const DEFAULT_FRAME_BYTES: u32 = 16 << 10;

/// A gRPC listener's HTTP/2 settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Bounds {
    /// Streams one connection may hold open at once.
    pub streams: u32,
    /// The largest header list a stream may send.
    pub header_list_bytes: u32,
    /// The largest frame the listener takes (it buffers a frame whole).
    pub frame_bytes: u32,
    /// Streams the server may reset for a peer's errors before it sends
    /// GOAWAY.
    pub local_error_resets: usize,
    /// Streams a peer may reset before they are accepted.
    pub pending_accept_resets: usize,
}

impl Http2Bounds {
    /// `builder` with these settings.
    pub fn configure<L>(
        &self,
        builder: tonic::transport::Server<L>,
    ) -> tonic::transport::Server<L> {
        builder
            .max_concurrent_streams(self.streams)
            .http2_max_header_list_size(self.header_list_bytes)
            .max_frame_size(self.frame_bytes)
            .http2_max_local_error_reset_streams(Some(self.local_error_resets))
            .http2_max_pending_accept_reset_streams(Some(self.pending_accept_resets))
    }
}

/// What a connection must send first, and by when: an HTTP/1 request head
/// (metrics), a ring's token (the shared-memory socket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FirstBytes {
    pub max_bytes: usize,
    pub deadline: Duration,
}

/// Connections not yet admitted: at most `at_once` (and `per_peer` from one
/// address, where peers have one), each for at most `deadline`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeBounds {
    pub at_once: usize,
    pub per_peer: Option<usize>,
    pub deadline: Duration,
}

impl From<HandshakeLimits> for HandshakeBounds {
    fn from(limits: HandshakeLimits) -> Self {
        Self {
            at_once: limits.max_handshakes,
            per_peer: Some(limits.per_peer),
            deadline: limits.timeout,
        }
    }
}

/// Every bound one listener keeps; `None` where a bound does not apply
/// (docs/operating.md says why for each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerBounds {
    /// The listener's name in metrics (`listener` label), as its
    /// connection limiter counts it.
    pub name: &'static str,
    pub max_connections: usize,
    /// Connections one address may hold at once, where anyone may connect.
    pub per_peer: Option<usize>,
    /// How long a connection with no call open stays.
    pub idle: Option<Duration>,
    /// Connections still shaking hands (TLS) or yet to send their token.
    pub handshakes: Option<HandshakeBounds>,
    pub http2: Option<Http2Bounds>,
    pub requests: Option<RequestBounds>,
    pub first_bytes: Option<FirstBytes>,
}

impl ListenerBounds {
    /// A listener limited by `connections`, every other bound unset.
    pub const fn new(name: &'static str, connections: ConnectionLimits) -> Self {
        Self {
            name,
            max_connections: connections.max_connections,
            per_peer: None,
            idle: Some(connections.idle),
            handshakes: None,
            http2: None,
            requests: None,
            first_bytes: None,
        }
    }

    /// Each bound as `(bound, value)`: counts, bytes and seconds.
    pub fn values(&self) -> Vec<(&'static str, f64)> {
        let mut values = vec![("connections", self.max_connections as f64)];
        if let Some(per_peer) = self.per_peer {
            values.push(("connections_per_peer", per_peer as f64));
        }
        if let Some(idle) = self.idle {
            values.push(("idle_seconds", idle.as_secs_f64()));
        }
        if let Some(handshakes) = self.handshakes {
            values.push(("handshakes", handshakes.at_once as f64));
            if let Some(per_peer) = handshakes.per_peer {
                values.push(("handshakes_per_peer", per_peer as f64));
            }
            values.push(("handshake_seconds", handshakes.deadline.as_secs_f64()));
        }
        if let Some(http2) = self.http2 {
            values.push(("streams_per_connection", f64::from(http2.streams)));
            values.push(("header_list_bytes", f64::from(http2.header_list_bytes)));
            values.push(("frame_bytes", f64::from(http2.frame_bytes)));
            values.push(("local_error_resets", http2.local_error_resets as f64));
            values.push(("pending_accept_resets", http2.pending_accept_resets as f64));
        }
        if let Some(requests) = self.requests {
            values.push(("request_bytes", requests.max_body_bytes as f64));
            values.push(("request_seconds", requests.deadline.as_secs_f64()));
            values.push(("request_bytes_in_flight", requests.in_flight_bytes as f64));
        }
        if let Some(first) = self.first_bytes {
            values.push(("first_bytes", first.max_bytes as f64));
            values.push(("first_bytes_seconds", first.deadline.as_secs_f64()));
        }
        values
    }

    /// Sets this listener's gauges (call once the recorder is installed).
    pub fn publish(&self) {
        metrics::describe_gauge!(
            LISTENER_BOUND,
            "Each bound a listener runs with, by listener and bound (counts, bytes, seconds): \
             what the process holds, read back."
        );
        for (bound, value) in self.values() {
            metrics::gauge!(LISTENER_BOUND, "listener" => self.name, "bound" => bound).set(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_bounds_a_listener_keeps_are_published() {
        let mut bounds = ListenerBounds::new(
            "test",
            ConnectionLimits {
                max_connections: 3,
                idle: Duration::from_secs(1),
            },
        );
        bounds.idle = None;
        bounds.handshakes = Some(HandshakeBounds {
            at_once: 4,
            per_peer: None,
            deadline: Duration::from_millis(1500),
        });
        assert_eq!(
            bounds.values(),
            [
                ("connections", 3.0),
                ("handshakes", 4.0),
                ("handshake_seconds", 1.5)
            ]
        );
    }
}
