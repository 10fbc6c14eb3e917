//! Connections from one address, bounded apart from the listener's total:
//! on a listener that anyone on the network reaches unauthenticated (the
//! worker's health listener, the metrics endpoint), one peer holding every
//! place would lock out the kubelet or Prometheus for as long as it keeps
//! its connections busy. With a share per address it holds its share only.
//! Applied before the total limit, so a connection refused here never
//! takes one of the listener's places.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use tokio::net::TcpStream;

use super::refusals::Refusals;

/// The connections each address holds now.
struct PeerPlaces {
    held: Mutex<HashMap<IpAddr, usize>>,
    per_peer: usize,
}

impl PeerPlaces {
    fn take(self: &Arc<Self>, peer: IpAddr) -> Option<PeerPlace> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let count = held.entry(peer).or_insert(0);
        if *count >= self.per_peer {
            return None;
        }
        *count += 1;
        Some(PeerPlace {
            places: self.clone(),
            peer,
        })
    }
}

/// One connection's place in its address's share, given back when dropped.
pub struct PeerPlace {
    places: Arc<PeerPlaces>,
    peer: IpAddr,
}

impl Drop for PeerPlace {
    fn drop(&mut self) {
        let mut held = self.places.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = held.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.peer);
            }
        }
    }
}

/// A connection holding its place in its address's share.
pub struct PeerCounted<IO> {
    inner: IO,
    _place: Option<PeerPlace>,
}

impl<IO: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for PeerCounted<IO> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

crate::net::delegate_async_write!(PeerCounted, inner);

/// `incoming`'s connections, at most `per_peer` at once from one address:
/// more are closed as they come (`shardfeed_connections_closed_total
/// {reason="peer"}`, logged once a minute). Accept errors pass through, for
/// the listener's limit to pause on.
pub fn limit_per_peer<S>(
    incoming: S,
    per_peer: usize,
    listener: &'static str,
) -> impl Stream<Item = io::Result<PeerCounted<TcpStream>>>
where
    S: Stream<Item = io::Result<TcpStream>>,
{
    let places = Arc::new(PeerPlaces {
        held: Mutex::new(HashMap::new()),
        per_peer: per_peer.max(1),
    });
    let refusals = Refusals::new("peer");
    incoming.filter_map(move |accepted| {
        let outcome = match accepted {
            Err(error) => Some(Err(error)),
            // An address the socket cannot tell is not counted.
            Ok(connection) => match connection.peer_addr() {
                Err(_) => Some(Ok(PeerCounted {
                    inner: connection,
                    _place: None,
                })),
                Ok(peer) => match places.take(peer.ip()) {
                    Some(place) => Some(Ok(PeerCounted {
                        inner: connection,
                        _place: Some(place),
                    })),
                    None => {
                        refusals.close(connection, |_, left_out| {
                            tracing::warn!(
                                listener,
                                %peer,
                                per_peer,
                                left_out,
                                "closed a new connection: its address holds its share"
                            );
                        });
                        None
                    }
                },
            },
        };
        std::future::ready(outcome)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn an_address_holds_its_share_and_gets_it_back() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let mut admitted = Box::pin(limit_per_peer(incoming, 2, "test"));
        let mut clients = Vec::new();
        let mut held = Vec::new();
        for _ in 0..2 {
            clients.push(TcpStream::connect(addr).await.unwrap());
            held.push(admitted.next().await.unwrap().unwrap());
        }
        // A third from the same address is closed; one from another is not.
        let third = TcpStream::connect(addr).await.unwrap();
        let other = tokio::net::TcpSocket::new_v4().unwrap();
        other.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let other = other.connect(addr).await.unwrap();
        let next = admitted.next().await.unwrap().unwrap();
        assert_eq!(
            next.inner.peer_addr().unwrap(),
            other.local_addr().unwrap(),
            "the third connection from 127.0.0.1 was skipped"
        );
        let mut byte = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            let mut third = third;
            tokio::io::AsyncReadExt::read(&mut third, &mut byte).await
        })
        .await
        .unwrap();
        assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
        // A place given back admits the next.
        held.pop();
        let again = TcpStream::connect(addr).await.unwrap();
        let next = admitted.next().await.unwrap().unwrap();
        assert_eq!(next.inner.peer_addr().unwrap(), again.local_addr().unwrap());
        drop(clients);
    }
}
