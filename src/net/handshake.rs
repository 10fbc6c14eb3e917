//! The worker's TLS accept, in front of its connection places.
//!
//! Done inside the HTTP server, a handshake ran on a connection that had
//! already taken one of the listener's places: a peer that opened sockets
//! and never sent a ClientHello held places until the handshake timeout,
//! and 4,200 of them, reopened every 8 s, kept honest sidecars out.
//! Here a connection shakes hands first, under bounds of its own: at most
//! `max_handshakes` at once, at most `per_peer` from one address, each
//! within `timeout`. Only a finished handshake (a peer whose certificate
//! the pool's CA signed) goes on to [`super::connections::limit`] for a
//! place, so established connections are counted apart from strangers.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use super::refusals::Refusals;

/// Bounds on handshakes in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeLimits {
    pub max_handshakes: usize,
    pub per_peer: usize,
    pub timeout: Duration,
}

impl HandshakeLimits {
    /// A sidecar dials each worker over a few connections; a fleet of
    /// hundreds reconnecting at once stays well inside 512, and one address
    /// needs far fewer than 32 at a time.
    pub const DEFAULT: HandshakeLimits = HandshakeLimits {
        max_handshakes: 512,
        per_peer: 32,
        timeout: super::tls::HANDSHAKE_TIMEOUT,
    };
}

/// Handshakes in progress per peer address.
#[derive(Debug, Default)]
struct PeerCounts(Mutex<HashMap<IpAddr, usize>>);

/// One handshake's place among its peer's; freed when dropped.
struct PeerPlace {
    counts: Arc<PeerCounts>,
    peer: IpAddr,
}

impl PeerCounts {
    fn take(self: &Arc<Self>, peer: IpAddr, per_peer: usize) -> Option<PeerPlace> {
        let mut counts = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = counts.entry(peer).or_default();
        if *count >= per_peer {
            return None;
        }
        *count += 1;
        Some(PeerPlace {
            counts: self.clone(),
            peer,
        })
    }
}

impl Drop for PeerPlace {
    fn drop(&mut self) {
        let mut counts = self
            .counts
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = counts.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.peer);
            }
        }
    }
}

/// The connections of `incoming` that finish a TLS handshake with
/// `acceptor` within `limits`; the others are closed (counted in
/// `shardfeed_connections_closed_total{reason="handshakes"}` when refused
/// for a bound, `"handshake"` when the handshake failed or timed out).
pub fn accept_tls<S>(
    incoming: S,
    acceptor: TlsAcceptor,
    limits: HandshakeLimits,
) -> impl Stream<Item = io::Result<TlsStream<TcpStream>>>
where
    S: Stream<Item = io::Result<TcpStream>> + Send + 'static,
{
    // Finished handshakes wait here for the server to take them; each
    // holds its handshake place until taken, so the channel needs no more.
    let (done, ready) = mpsc::channel(limits.max_handshakes.max(1));
    let places = Arc::new(Semaphore::new(limits.max_handshakes.max(1)));
    let peers = Arc::new(PeerCounts::default());
    let refusals = Refusals::new("handshakes");
    let accepting = tokio::spawn(async move {
        let incoming = super::connections::pause_on_accept_errors(incoming, "pool-worker");
        let mut incoming = std::pin::pin!(incoming);
        while let Some(tcp) = incoming.next().await {
            let Some(admitted) = admit(&tcp, &places, &peers, limits) else {
                refusals.close(tcp, |tcp, left_out| {
                    tracing::warn!(
                        peer = ?tcp.peer_addr().ok(),
                        left_out,
                        "closed a new connection: TLS handshakes in progress at their bound"
                    );
                });
                continue;
            };
            let (acceptor, done) = (acceptor.clone(), done.clone());
            tokio::spawn(async move {
                let shaken = tokio::time::timeout(limits.timeout, acceptor.accept(tcp)).await;
                match shaken {
                    Ok(Ok(tls)) => {
                        let _ = done.send((tls, admitted)).await;
                    }
                    _ => {
                        metrics::counter!(crate::metrics::CONNECTIONS_CLOSED, "reason" => "handshake")
                            .increment(1);
                    }
                }
            });
        }
    });
    // The accepting task lives as long as the stream the server reads.
    let accepting = AbortOnDrop(accepting);
    tokio_stream::wrappers::ReceiverStream::new(ready).map(move |(tls, admitted)| {
        let _accepting = &accepting;
        // Its handshake places go back once the server has the connection.
        drop::<(OwnedSemaphorePermit, PeerPlace)>(admitted);
        Ok(tls)
    })
}

/// A handshake place for `tcp`, if the bounds leave one.
fn admit(
    tcp: &TcpStream,
    places: &Arc<Semaphore>,
    peers: &Arc<PeerCounts>,
    limits: HandshakeLimits,
) -> Option<(OwnedSemaphorePermit, PeerPlace)> {
    let peer = tcp.peer_addr().ok()?.ip();
    let peer_place = peers.take(peer, limits.per_peer)?;
    let place = places.clone().try_acquire_owned().ok()?;
    Some((place, peer_place))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
