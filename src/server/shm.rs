//! The shared-memory transport: how a stream's [`Ring`] reaches the trainer.
//!
//! A stream that asks for shared memory over the server's Unix socket `P`
//! decodes into a ring (`pipeline::shm`); each `Batch` then carries
//! `shared { token, slot, length, .. }` instead of image bytes. The client
//! connects to the companion socket `P.fds` ([`fd_socket_path`]), sends the
//! 16-byte token, and receives the memfd (`SCM_RIGHTS`), which it maps
//! read-only. The connection stays open as the credit channel: the client
//! writes a slot's index (u32, little endian) when the last view of that
//! batch is dropped. When the connection closes, every slot lent to that
//! client is free again at once.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::io::AsyncReadExt;

use super::pb;
use crate::net::bounds::{FirstBytes, HandshakeBounds, ListenerBounds};
use crate::net::refusals::Refusals;
use crate::pipeline::shm::{Ring, CONNECT_TIMEOUT, TOKEN_BYTES};
use crate::pipeline::BatchImages;

/// A batch's images on the wire: inline bytes, or where they lie in the
/// stream's ring (the slot lent to the client until it returns it).
pub(super) fn images_to_wire(
    images: BatchImages,
    image_bytes: usize,
) -> (bytes::Bytes, Option<pb::SharedImages>) {
    match images {
        BatchImages::Inline(bytes) => (bytes, None),
        BatchImages::Shared(lease) => {
            let ring = lease.ring().clone();
            let slot = lease.lend();
            let shared = pb::SharedImages {
                ring_token: ring.token().to_vec(),
                ring_bytes: ring.total_bytes() as u64,
                slot,
                offset: slot as u64 * ring.slot_bytes() as u64,
                length: image_bytes as u64,
                holdable: crate::pipeline::shm::HOLDABLE,
            };
            (bytes::Bytes::new(), Some(shared))
        }
    }
}

/// The companion socket that hands out memfds for the gRPC socket `grpc`.
pub fn fd_socket_path(grpc: &Path) -> PathBuf {
    let mut name = grpc.as_os_str().to_owned();
    name.push(".fds");
    PathBuf::from(name)
}

/// The rings of the open streams, by token, for the fd socket to find.
///
/// A ring is held here until its client collects it (or for
/// [`CONNECT_TIMEOUT`]): a short stream may have sent its last batch, and
/// dropped its own handle, before the client has read the first one and
/// asked for the memfd.
#[derive(Debug, Default)]
pub struct RingRegistry {
    rings: Mutex<HashMap<[u8; TOKEN_BYTES], Registered>>,
    /// The socket the rings are handed out on (`<gRPC socket>.fds`).
    pub fd_socket: PathBuf,
}

#[derive(Debug)]
struct Registered {
    ring: Weak<Ring>,
    /// Kept alive until collected or this deadline passes.
    uncollected: Option<(Arc<Ring>, tokio::time::Instant)>,
}

impl RingRegistry {
    pub fn new(fd_socket: PathBuf) -> Self {
        Self {
            rings: Mutex::default(),
            fd_socket,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; TOKEN_BYTES], Registered>> {
        self.rings.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn register(&self, ring: &Arc<Ring>) {
        self.expire();
        self.lock().insert(
            ring.token(),
            Registered {
                ring: Arc::downgrade(ring),
                uncollected: Some((ring.clone(), tokio::time::Instant::now() + CONNECT_TIMEOUT)),
            },
        );
    }

    /// The ring for `token`, once: a token is single-use, so a second
    /// connection with it (a leaked token, a confused client) gets nothing.
    /// From now on only its stream keeps the ring alive.
    fn collect(&self, token: &[u8; TOKEN_BYTES]) -> Option<Arc<Ring>> {
        let entry = self.lock().remove(token)?;
        match entry.uncollected {
            Some((ring, _)) => Some(ring),
            None => entry.ring.upgrade(),
        }
    }

    /// The stream of `token` ended without completing (its client left):
    /// nobody will collect the ring, so it is not kept for them.
    pub fn forget_uncollected(&self, token: &[u8; TOKEN_BYTES]) {
        self.lock().remove(token);
    }

    /// Lets go of rings nobody collected in time, and forgets dead ones.
    pub fn expire(&self) {
        let now = tokio::time::Instant::now();
        self.lock().retain(|_, entry| {
            if entry
                .uncollected
                .as_ref()
                .is_some_and(|(_, deadline)| *deadline <= now)
            {
                entry.uncollected = None;
            }
            entry.uncollected.is_some() || entry.ring.strong_count() > 0
        });
    }

    /// Rings registered and still alive.
    pub fn live(&self) -> usize {
        self.lock()
            .values()
            .filter(|entry| entry.ring.strong_count() > 0)
            .count()
    }
}

/// Connections that collected a ring and return its slots: one per open
/// shared-memory stream is the use; beyond this a connection is closed.
pub const MAX_FD_CONNECTIONS: usize = 1024;

/// The descriptor socket's bounds, as published (`listener="shm"`): no
/// idle bound, since a connection lasts as long as its stream does.
pub const BOUNDS: ListenerBounds = ListenerBounds {
    name: "shm",
    max_connections: MAX_FD_CONNECTIONS,
    per_peer: None,
    idle: None,
    handshakes: Some(HandshakeBounds {
        at_once: MAX_HANDSHAKES,
        per_peer: None,
        deadline: TOKEN_WAIT,
    }),
    http2: None,
    requests: None,
    first_bytes: Some(FirstBytes {
        max_bytes: TOKEN_BYTES,
        deadline: TOKEN_WAIT,
    }),
};

/// Connections still to send their ring's token. A client sends it right
/// after connecting, so a connection that has not within
/// [`TOKEN_WAIT`] is dropped; and when this many are waiting, a new one
/// pushes out the oldest: silent connections cannot lock clients out.
pub const MAX_HANDSHAKES: usize = 64;

/// How long a connection may take to send its token.
pub const TOKEN_WAIT: Duration = Duration::from_secs(2);

/// Connections waiting for their token, oldest first, each with the signal
/// that closes it.
#[derive(Default)]
struct Handshakes {
    next_id: u64,
    waiting: std::collections::VecDeque<(u64, tokio_util::sync::CancellationToken)>,
}

impl Handshakes {
    /// Registers a new handshake, pushing out the oldest when full.
    fn begin(&mut self) -> (u64, tokio_util::sync::CancellationToken) {
        if self.waiting.len() >= MAX_HANDSHAKES {
            if let Some((_, oldest)) = self.waiting.pop_front() {
                oldest.cancel();
            }
        }
        self.next_id += 1;
        let cancel = tokio_util::sync::CancellationToken::new();
        self.waiting.push_back((self.next_id, cancel.clone()));
        (self.next_id, cancel)
    }

    fn end(&mut self, id: u64) {
        self.waiting.retain(|(waiting, _)| *waiting != id);
    }
}

/// Serves the fd socket: hands each client its ring's memfd and takes its
/// credits until it disconnects.
pub async fn serve_fd_socket(
    listener: tokio::net::UnixListener,
    registry: Arc<RingRegistry>,
    max_connections: usize,
) {
    let connections = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let handshakes = Arc::new(std::sync::Mutex::new(Handshakes::default()));
    // Clients past the connection places: counted each, logged once a minute.
    let refusals = Arc::new(Refusals::new("shm_clients"));
    let mut sweep = tokio::time::interval(Duration::from_secs(5));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = sweep.tick() => {
                registry.expire();
                continue;
            }
        };
        match accepted {
            Ok((stream, _)) => {
                let (registry, connections, handshakes, refusals) = (
                    registry.clone(),
                    connections.clone(),
                    handshakes.clone(),
                    refusals.clone(),
                );
                let (id, pushed_out) = lock(&handshakes).begin();
                tokio::spawn(async move {
                    // Only the wait for the token can be cut short: once a
                    // token is taken, its ring is handed over or refused.
                    let token = tokio::select! {
                        token = read_token(&stream) => token,
                        () = pushed_out.cancelled() => {
                            Err(std::io::Error::other("pushed out by newer connections"))
                        }
                    };
                    lock(&handshakes).end(id);
                    let result = match token {
                        Ok(token) => {
                            let places = (&connections, max_connections, &*refusals);
                            serve_token(stream, &registry, places, &token).await
                        }
                        Err(error) => Err(error),
                    };
                    if let Err(error) = result {
                        tracing::debug!(%error, "shared-memory client ended");
                    }
                });
            }
            Err(error) => {
                tracing::warn!(%error, "accepting on the shared-memory socket failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Hands the ring `token` names to its client and takes its credits, or,
/// with every connection place taken, turns the client away and fails the
/// ring's stream: the place is taken before the memfd is sent, so a ring is
/// never marked collected by a client that cannot return its slots.
async fn serve_token(
    stream: tokio::net::UnixStream,
    registry: &RingRegistry,
    (connections, limit, refusals): (&Arc<tokio::sync::Semaphore>, usize, &Refusals),
    token: &[u8; TOKEN_BYTES],
) -> std::io::Result<()> {
    let Ok(permit) = connections.clone().try_acquire_owned() else {
        if let Some(ring) = registry.collect(token) {
            ring.refuse(limit);
        }
        refusals.close(stream, |_, left_out| {
            tracing::warn!(
                limit,
                left_out,
                "refused a shared-memory client: too many connected; its stream fails"
            );
        });
        return Ok(());
    };
    let ring = hand_over(&stream, registry, token).await?;
    let served = serve_client(stream, ring).await;
    drop(permit);
    served
}

fn lock(handshakes: &std::sync::Mutex<Handshakes>) -> std::sync::MutexGuard<'_, Handshakes> {
    handshakes.lock().unwrap_or_else(|e| e.into_inner())
}

/// A client's ring token, read within [`TOKEN_WAIT`].
async fn read_token(stream: &tokio::net::UnixStream) -> std::io::Result<[u8; TOKEN_BYTES]> {
    let mut token = [0u8; TOKEN_BYTES];
    let mut read = 0;
    let deadline = tokio::time::Instant::now() + TOKEN_WAIT;
    while read < TOKEN_BYTES {
        tokio::time::timeout_at(deadline, stream.readable())
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no token"))??;
        match stream.try_read(&mut token[read..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => read += n,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(error),
        }
    }
    Ok(token)
}

/// Sends the client the memfd of the ring `token` names; returns the ring.
async fn hand_over(
    stream: &tokio::net::UnixStream,
    registry: &RingRegistry,
    token: &[u8; TOKEN_BYTES],
) -> std::io::Result<Arc<Ring>> {
    let Some(ring) = registry.collect(token) else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "unknown ring token",
        ));
    };
    stream
        .async_io(tokio::io::Interest::WRITABLE, || {
            send_fd(stream.as_raw_fd(), ring.memfd())
        })
        .await?;
    ring.mark_collected();
    Ok(ring)
}

/// Takes a client's credits (slots it gave back) until it disconnects.
async fn serve_client(mut stream: tokio::net::UnixStream, ring: Arc<Ring>) -> std::io::Result<()> {
    // Only a weak handle from here: the stream owns its ring.
    let weak = Arc::downgrade(&ring);
    drop(ring);
    let mut credit = [0u8; 4];
    let result = loop {
        match stream.read_exact(&mut credit).await {
            Ok(_) => match weak.upgrade() {
                Some(ring) => {
                    ring.credit(u32::from_le_bytes(credit));
                }
                None => break Ok(()),
            },
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => break Ok(()),
            Err(error) => break Err(error),
        }
    };
    if let Some(ring) = weak.upgrade() {
        ring.client_gone();
    }
    result
}

/// Sends one byte with `fd` attached (`SCM_RIGHTS`).
fn send_fd(socket: RawFd, fd: RawFd) -> std::io::Result<()> {
    let mut byte = [1u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: an all-zero msghdr is valid; its pointers are set below to
    // buffers that outlive the call.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = space as _;
    // SAFETY: the control buffer holds one header of CMSG_SPACE bytes;
    // CMSG_FIRSTHDR returns a pointer into it.
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<RawFd>(), fd);
    }
    // SAFETY: a valid message on a connected socket.
    let sent = unsafe { libc::sendmsg(socket, &message, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::shm::ShmError;

    #[tokio::test(start_paused = true)]
    async fn the_registry_keeps_a_ring_until_collected_or_too_late() {
        let registry = RingRegistry::new(PathBuf::from("/run/sf.sock.fds"));
        let ring = Ring::new(1, 64).unwrap();
        let token = ring.token();
        registry.register(&ring);
        drop(ring); // the stream ended before its client asked
        let collected = registry.collect(&token).expect("kept for the client");
        assert!(registry.collect(&token).is_none(), "a token is single-use");
        drop(collected);
        let cancelled = Ring::new(1, 64).unwrap();
        registry.register(&cancelled);
        registry.forget_uncollected(&cancelled.token());
        assert_eq!(Arc::strong_count(&cancelled), 1, "not kept for nobody");
        drop(cancelled);
        let late = Ring::new(1, 64).unwrap();
        let late_token = late.token();
        registry.register(&late);
        drop(late);
        tokio::time::advance(CONNECT_TIMEOUT + Duration::from_secs(1)).await;
        registry.expire();
        assert!(registry.collect(&late_token).is_none());
        assert_eq!(registry.live(), 0);
    }

    #[tokio::test]
    async fn silent_connections_cannot_lock_clients_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sf.sock.fds");
        let registry = Arc::new(RingRegistry::new(path.clone()));
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(serve_fd_socket(
            listener,
            registry.clone(),
            MAX_FD_CONNECTIONS,
        ));
        // Many more silent connections than the handshakes waiting at once.
        let mut silent = Vec::new();
        for _ in 0..MAX_FD_CONNECTIONS + MAX_HANDSHAKES {
            silent.push(tokio::net::UnixStream::connect(&path).await.unwrap());
        }
        // A client that sends its token at once still gets its ring's fd.
        let ring = Ring::new(1, 64).unwrap();
        registry.register(&ring);
        let mut client = tokio::net::UnixStream::connect(&path).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut client, &ring.token())
            .await
            .unwrap();
        let mut byte = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(5), client.read_exact(&mut byte))
            .await
            .expect("answered while silent connections wait")
            .unwrap();
        assert_eq!(byte, [1]);
        // The oldest silent ones were pushed out: their reads see the end.
        let mut pushed_out = 0;
        for stream in &mut silent[..MAX_HANDSHAKES] {
            let mut byte = [0u8; 1];
            if let Ok(Ok(0)) =
                tokio::time::timeout(Duration::from_secs(5), stream.read(&mut byte)).await
            {
                pushed_out += 1;
            }
        }
        assert_eq!(pushed_out, MAX_HANDSHAKES);
    }

    #[tokio::test]
    async fn a_client_past_the_connection_limit_fails_its_stream_instead_of_hanging_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sf.sock.fds");
        let registry = Arc::new(RingRegistry::new(path.clone()));
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let limit = 2;
        tokio::spawn(serve_fd_socket(listener, registry.clone(), limit));
        let connect = |ring: Arc<Ring>| {
            let path = path.clone();
            async move {
                let mut client = tokio::net::UnixStream::connect(&path).await.unwrap();
                tokio::io::AsyncWriteExt::write_all(&mut client, &ring.token())
                    .await
                    .unwrap();
                let mut byte = [0u8; 1];
                let read = tokio::time::timeout(Duration::from_secs(5), client.read(&mut byte))
                    .await
                    .expect("answered at once")
                    .unwrap();
                (client, read)
            }
        };
        let mut served = Vec::new();
        for _ in 0..limit {
            let ring = Ring::new(1, 64).unwrap();
            registry.register(&ring);
            let (client, read) = connect(ring.clone()).await;
            assert_eq!(read, 1, "within the limit the memfd is handed over");
            served.push((client, ring));
        }
        // One more: its stream has lent its only slot and waits for a credit.
        let ring = Ring::new(1, 64).unwrap();
        registry.register(&ring);
        let _lent = ring.acquire(&path).await.unwrap().lend();
        let (_client, read) = connect(ring.clone()).await;
        assert_eq!(read, 0, "turned away without the memfd");
        let error = tokio::time::timeout(Duration::from_secs(5), ring.acquire(&path))
            .await
            .expect("the stream's wait ends instead of hanging")
            .unwrap_err();
        assert!(matches!(error, ShmError::Refused { limit: 2 }), "{error}");
        let ended = tokio::time::timeout(
            Duration::from_secs(5),
            ring.clone().wait_collected(path.clone()),
        )
        .await
        .expect("the end of the stream does not wait either");
        assert!(matches!(ended, Err(ShmError::Refused { .. })));
        // A place freed is a place taken again.
        drop(served.pop());
        tokio::time::sleep(Duration::from_millis(100)).await;
        let ring = Ring::new(1, 64).unwrap();
        registry.register(&ring);
        assert_eq!(connect(ring).await.1, 1);
    }
}
