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

use crate::pipeline::shm::{Ring, CONNECT_TIMEOUT, TOKEN_BYTES};

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

/// Connections the fd socket serves at once: one per open shared-memory
/// stream is the use; beyond this a connection is closed at once.
pub const MAX_FD_CONNECTIONS: usize = 1024;

/// Serves the fd socket: hands each client its ring's memfd and takes its
/// credits until it disconnects.
pub async fn serve_fd_socket(listener: tokio::net::UnixListener, registry: Arc<RingRegistry>) {
    let connections = Arc::new(tokio::sync::Semaphore::new(MAX_FD_CONNECTIONS));
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
                let Ok(permit) = connections.clone().try_acquire_owned() else {
                    tracing::warn!(
                        limit = MAX_FD_CONNECTIONS,
                        "refused a shared-memory connection: too many open"
                    );
                    drop(stream);
                    continue;
                };
                let registry = registry.clone();
                tokio::spawn(async move {
                    if let Err(error) = serve_client(stream, &registry).await {
                        tracing::debug!(%error, "shared-memory client ended");
                    }
                    drop(permit);
                });
            }
            Err(error) => {
                tracing::warn!(%error, "accepting on the shared-memory socket failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn serve_client(
    mut stream: tokio::net::UnixStream,
    registry: &RingRegistry,
) -> std::io::Result<()> {
    let mut token = [0u8; TOKEN_BYTES];
    tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut token))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no token"))??;
    let Some(ring) = registry.collect(&token) else {
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
}
