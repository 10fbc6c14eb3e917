//! A stream's shared-memory ring: batch slots in anonymous memory (a
//! memfd) that the trainer maps, so a 19 MB batch is decoded straight to
//! where it is read and never copied through gRPC.
//!
//! The producer takes a free slot ([`Ring::acquire`]) before a batch is
//! decoded and decodes into it; sending lends it to the client; a credit
//! from the client frees it ([`Ring::credit`]). A slow consumer therefore
//! holds the producer back exactly like the ready queue does. How the
//! memfd and the credits travel is the server's transport
//! (`server::shm`).
//!
//! Nothing has a name: the memfd lives while the server's ring or a client
//! mapping holds it, so either side exiting (even by SIGKILL) frees it, and
//! `/dev/shm` (64 MiB in a container) is never used.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// Slots of a ring beyond the producer's own (`decode_ahead +
/// ready_batches`): the batch in flight to the client, and those the client
/// may hold without stalling the stream.
pub const CLIENT_SLOTS: usize = 3;
/// Batches a client may hold at once: one of [`CLIENT_SLOTS`] is in flight.
pub const HOLDABLE: u32 = CLIENT_SLOTS as u32 - 1;

/// Bytes of a ring token.
pub const TOKEN_BYTES: usize = 16;
/// How long a client has to collect the ring's memfd after its first
/// shared batch was sent; then the stream fails instead of waiting forever
/// for credits that cannot come.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    #[error("shared memory: {what}: {source}")]
    Os {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the client did not collect its shared-memory ring from {socket} within {seconds} s \
         (is the socket's directory shared with the trainer?); ask for inline transport instead"
    )]
    NotCollected { socket: String, seconds: u64 },
    #[error("the client closed its shared-memory connection")]
    ClientGone,
    #[error(
        "the shared-memory socket refused this stream's client: {limit} shared-memory clients \
         are connected already; close other streams or ask for inline transport"
    )]
    Refused { limit: usize },
}

/// Why [`Ring::try_take`] found no free slot.
enum Waiting {
    /// Every slot is busy; whether the client has collected the ring.
    Collected(bool),
    ClientGone,
    Refused(usize),
}

fn os_error(what: &'static str) -> ShmError {
    ShmError::Os {
        what,
        source: std::io::Error::last_os_error(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    /// Being decoded into; owned by a [`SlotLease`].
    Filling,
    /// Sent; the client's until it credits it back.
    Lent,
}

#[derive(Debug)]
struct RingState {
    slots: Vec<SlotState>,
    /// The client collected the memfd (credits can come).
    collected: bool,
    /// The client's credit connection closed: no credit will come again.
    client_gone: bool,
    /// The fd socket turned the client away (its connection limit): the
    /// limit, for the stream's error.
    refused: Option<usize>,
}

/// One stream's slots in one memfd.
#[derive(Debug)]
pub struct Ring {
    memfd: OwnedFd,
    base: *mut u8,
    slot_bytes: usize,
    slot_count: usize,
    token: [u8; TOKEN_BYTES],
    state: Mutex<RingState>,
    freed: Notify,
    collected: Notify,
    /// What must live exactly as long as the mapping: the stream's memory
    /// reservation, so the budget counts the ring until it is unmapped.
    held: std::sync::OnceLock<Arc<dyn std::any::Any + Send + Sync>>,
}

// SAFETY: the mapping is owned by the ring; slots are handed out exclusively
// (a `SlotLease` is the only writer of its slot, checked under the lock).
unsafe impl Send for Ring {}
// SAFETY: as above; shared access only reads the immutable fields.
unsafe impl Sync for Ring {}

impl Ring {
    /// A ring of `slot_count` slots of `slot_bytes` (rounded up to pages).
    pub fn new(slot_count: usize, slot_bytes: usize) -> Result<Arc<Self>, ShmError> {
        let page = 4096;
        let slot_bytes = slot_bytes.max(1).div_ceil(page) * page;
        let total = slot_bytes * slot_count.max(1);
        // SAFETY: a constant, NUL-terminated name; the flags are valid.
        let fd = unsafe {
            libc::memfd_create(
                c"shardfeed-batches".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(os_error("memfd_create"));
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain syscalls on the descriptor we own.
        if unsafe { libc::ftruncate(fd, total as libc::off_t) } != 0 {
            return Err(os_error("ftruncate"));
        }
        // A client cannot shrink it under us (which would SIGBUS the server)
        // or grow it.
        // SAFETY: as above.
        if unsafe {
            libc::fcntl(
                fd,
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
            )
        } != 0
        {
            return Err(os_error("sealing the memfd"));
        }
        // SAFETY: maps the whole file we just sized; checked for failure.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(os_error("mmap"));
        }
        let mut token = [0u8; TOKEN_BYTES];
        // SAFETY: fills the buffer we own.
        let filled = unsafe { libc::getrandom(token.as_mut_ptr().cast(), TOKEN_BYTES, 0) };
        if filled != TOKEN_BYTES as isize {
            // SAFETY: unmaps what was mapped above.
            unsafe { libc::munmap(base, total) };
            return Err(os_error("getrandom"));
        }
        Ok(Arc::new(Self {
            memfd,
            base: base.cast(),
            slot_bytes,
            slot_count: slot_count.max(1),
            token,
            state: Mutex::new(RingState {
                slots: vec![SlotState::Free; slot_count.max(1)],
                collected: false,
                client_gone: false,
                refused: None,
            }),
            freed: Notify::new(),
            collected: Notify::new(),
            held: std::sync::OnceLock::new(),
        }))
    }

    /// Keeps `value` (a memory reservation) alive until the ring is dropped:
    /// a ring can outlive its stream while a client may still collect it.
    pub fn hold_until_dropped(&self, value: Arc<dyn std::any::Any + Send + Sync>) {
        let _ = self.held.set(value);
    }

    pub fn token(&self) -> [u8; TOKEN_BYTES] {
        self.token
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    pub fn slot_count(&self) -> usize {
        self.slot_count
    }

    /// Bytes of the whole mapping.
    pub fn total_bytes(&self) -> usize {
        self.slot_bytes * self.slot_count
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RingState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a free slot. Once batches have been lent, a client that has
    /// not collected the memfd (from `fd_socket`) within [`CONNECT_TIMEOUT`]
    /// fails the wait, and so does one that closed its credit connection.
    pub async fn acquire(self: &Arc<Self>, fd_socket: &Path) -> Result<SlotLease, ShmError> {
        let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
        loop {
            let freed = self.freed.notified();
            let collected = self.collected.notified();
            let collected_now = match self.try_take() {
                Ok(lease) => return Ok(lease),
                Err(Waiting::ClientGone) => return Err(ShmError::ClientGone),
                Err(Waiting::Refused(limit)) => return Err(ShmError::Refused { limit }),
                Err(Waiting::Collected(collected_now)) => collected_now,
            };
            if collected_now {
                // Credits come from the client; no timeout while it is
                // connected (a long training step may hold batches).
                freed.await;
                continue;
            }
            tokio::select! {
                () = freed => {}
                () = collected => {}
                () = tokio::time::sleep_until(deadline) => {
                    return Err(ShmError::NotCollected {
                        socket: fd_socket.display().to_string(),
                        seconds: CONNECT_TIMEOUT.as_secs(),
                    });
                }
            }
        }
    }

    /// A free slot, or why there is none to take yet.
    fn try_take(self: &Arc<Self>) -> Result<SlotLease, Waiting> {
        let mut state = self.lock();
        if let Some(limit) = state.refused {
            return Err(Waiting::Refused(limit));
        }
        match state.slots.iter().position(|s| *s == SlotState::Free) {
            Some(slot) => {
                state.slots[slot] = SlotState::Filling;
                Ok(SlotLease {
                    ring: self.clone(),
                    slot: slot as u32,
                    lent: false,
                })
            }
            None if state.client_gone => Err(Waiting::ClientGone),
            None => Err(Waiting::Collected(state.collected)),
        }
    }

    /// A credit from the client: `slot` may be decoded into again. Slots the
    /// client does not hold are ignored (a confused or hostile client cannot
    /// free a slot being filled).
    pub fn credit(&self, slot: u32) -> bool {
        let mut state = self.lock();
        match state.slots.get_mut(slot as usize) {
            Some(s @ SlotState::Lent) => {
                *s = SlotState::Free;
                drop(state);
                self.freed.notify_waiters();
                true
            }
            _ => false,
        }
    }

    /// Waits until the client has collected the memfd (or has come and
    /// gone); fails if it has not within [`CONNECT_TIMEOUT`] or was turned
    /// away.
    pub async fn wait_collected(self: Arc<Self>, fd_socket: PathBuf) -> Result<(), ShmError> {
        let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
        loop {
            let collected = self.collected.notified();
            {
                let state = self.lock();
                if let Some(limit) = state.refused {
                    return Err(ShmError::Refused { limit });
                }
                if state.collected || state.client_gone {
                    return Ok(());
                }
            }
            if tokio::time::timeout_at(deadline, collected).await.is_err() {
                return Err(ShmError::NotCollected {
                    socket: fd_socket.display().to_string(),
                    seconds: CONNECT_TIMEOUT.as_secs(),
                });
            }
        }
    }

    /// The fd socket turned the client away (`limit` clients connected):
    /// no credit can come, so the stream fails at its next wait instead of
    /// holding its memory for a client that cannot return slots.
    pub fn refuse(&self, limit: usize) {
        let mut state = self.lock();
        state.refused = Some(limit);
        drop(state);
        self.freed.notify_waiters();
        self.collected.notify_waiters();
    }

    /// The client has the memfd: credits can come.
    pub fn mark_collected(&self) {
        self.lock().collected = true;
        self.collected.notify_waiters();
    }

    /// The client's credit connection closed. What it was lent stays lent:
    /// its process may still hold those batches (a trainer that keeps the
    /// last batch after `break` closes the connection at once), and a slot
    /// is never written while a client may read it. The stream, whose
    /// client is leaving, ends when it runs out of free slots.
    pub fn client_gone(&self) {
        let mut state = self.lock();
        state.collected = false;
        state.client_gone = true;
        drop(state);
        self.freed.notify_waiters();
    }

    /// Slots the client holds now.
    pub fn lent(&self) -> usize {
        self.lock()
            .slots
            .iter()
            .filter(|s| **s == SlotState::Lent)
            .count()
    }

    /// The memfd, to hand to the client.
    pub fn memfd(&self) -> RawFd {
        self.memfd.as_raw_fd()
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; no lease outlives
        // the ring (each holds an Arc of it).
        unsafe { libc::munmap(self.base.cast(), self.total_bytes()) };
    }
}

/// Exclusive write access to one slot while a batch is decoded into it.
/// Dropped before it is sent, the slot is free again.
#[derive(Debug)]
pub struct SlotLease {
    ring: Arc<Ring>,
    slot: u32,
    /// Handed to the client: dropping the lease leaves the slot lent.
    lent: bool,
}

impl SlotLease {
    pub fn slot(&self) -> u32 {
        self.slot
    }

    pub fn ring(&self) -> &Arc<Ring> {
        &self.ring
    }

    /// The slot's bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the slot lies inside the mapping; this lease is its only
        // writer (state Filling, set under the lock) and the client only
        // reads slots it was lent, never one being filled.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.ring
                    .base
                    .add(self.slot as usize * self.ring.slot_bytes),
                self.ring.slot_bytes,
            )
        }
    }

    /// Hands the slot to the client: it is free again when credited back.
    pub fn lend(mut self) -> u32 {
        self.ring.lock().slots[self.slot as usize] = SlotState::Lent;
        self.lent = true;
        self.slot
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        if !self.lent {
            self.ring.lock().slots[self.slot as usize] = SlotState::Free;
            self.ring.freed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slots_cycle_through_credits_and_a_departed_client_keeps_what_it_held() {
        let socket = std::path::PathBuf::from("/nonexistent/sock.fds");
        let ring = Ring::new(2, 10_000).unwrap();
        assert_eq!(ring.slot_bytes(), 12_288);
        let mut first = ring.acquire(&socket).await.unwrap();
        first.as_mut_slice()[0] = 7;
        let second = ring.acquire(&socket).await.unwrap();
        assert_ne!(first.slot(), second.slot());
        let lent = first.lend();
        drop(second); // never sent: free again
        let third = ring.acquire(&socket).await.unwrap();
        assert_ne!(
            third.slot(),
            lent,
            "a lent slot is not reused before its credit"
        );
        let _third = third.lend();
        ring.mark_collected();
        // Both lent: the next acquire waits for a credit.
        let waiting = {
            let (ring, socket) = (ring.clone(), socket.clone());
            tokio::spawn(async move { ring.acquire(&socket).await.map(|lease| lease.slot()) })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        assert!(!ring.credit(99), "unknown slots are ignored");
        assert!(ring.credit(lent));
        assert_eq!(waiting.await.unwrap().unwrap(), lent);
        // The client closes its credit connection while it may still hold
        // the batch in `third`'s slot: that slot is never written again.
        ring.client_gone();
        assert_eq!(ring.lent(), 1, "what the client held stays lent");
        let free = ring.acquire(&socket).await.unwrap();
        assert_eq!(free.slot(), lent, "only the slot the client gave back");
        let error = ring.acquire(&socket).await.unwrap_err();
        assert!(matches!(error, ShmError::ClientGone), "{error}");
        drop(free);
        assert_eq!(
            Arc::strong_count(&ring),
            1,
            "leases, lent or not, release the ring"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_uncollected_ring_fails_instead_of_waiting_forever() {
        let ring = Ring::new(1, 64).unwrap();
        let _lent = ring
            .acquire(Path::new("/run/sf.sock.fds"))
            .await
            .unwrap()
            .lend();
        let error = ring
            .acquire(Path::new("/run/sf.sock.fds"))
            .await
            .unwrap_err();
        assert!(error.to_string().contains("/run/sf.sock.fds"), "{error}");
    }
}
