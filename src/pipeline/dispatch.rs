//! A stream's batches on their way out: at most `decode_ahead` decoding,
//! then sent in order to the ready queue, waiting on the client's ring
//! slots where it has one (the back-pressure of the memory essay).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::stream::FuturesOrdered;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};

use super::assemble::decode_batch;
use super::batch::DecodedBatch;
use super::buffers::BufferPool;
use super::context::{SharedTarget, StreamCommon};
use super::encoded::{SearchState, ServerShare};
use super::error::PipelineError;
use super::remote::{ClientPace, RemoteShare};
use super::sample::EmittedSample;
use super::shm;
use crate::metrics;

/// Batches of one stream on their way out: decoding (at most
/// `decode_ahead`), then sent in order to the ready queue.
pub(super) struct BatchDispatch<'a> {
    common: &'a StreamCommon,
    ready: ReadySink<'a>,
    decoding: FuturesOrdered<oneshot::Receiver<DecodedBatch>>,
    buffers: BufferPool,
    next_index: u64,
    /// The share of an encoded delivery the server decodes, tuned here.
    share: Option<ServerShare>,
    /// The share of each batch sent to the decode pool, tuned here.
    remote: Option<RemoteShare>,
    /// When the last batch was handed on (the share's rate is timed
    /// from batch to batch).
    last_handed: Option<Instant>,
}

/// The ready queue, its gauge, and what the producer saw of the client's
/// pace for the batch at hand.
struct ReadySink<'a> {
    tx: &'a mpsc::Sender<Result<DecodedBatch, PipelineError>>,
    gauge: ::metrics::Gauge,
    client_wait_ns: AtomicU64,
    /// The stream's shared-memory ring: its lent slots are the batches
    /// ahead of the client (gRPC drains the ready queue eagerly when
    /// messages carry only a slot's descriptor).
    ring: Option<std::sync::Arc<super::shm::Ring>>,
    /// Batches handed on so far: until the buffer between the two sides
    /// could have filled once, an empty one says nothing about the client.
    handed: AtomicU64,
    /// A tuned share's search (None: not tuned), told to the client with
    /// each batch so that its next stream goes on from it.
    search: std::sync::Mutex<Option<SearchState>>,
    /// The bytes of the last batch handed on.
    last_bytes: AtomicU64,
}

/// Most batches taken for in the transport, between the ready queue and an
/// inline client (see [`ReadySink::in_transport`]).
const MAX_TRANSPORT_BATCHES: u64 = 16;

impl ReadySink<'_> {
    /// Batches an inline stream's transport may hold ahead of the client:
    /// as many as fit its HTTP/2 window, taken to be as large as ours (the
    /// client sets it; ours is the largest a shardfeed client asks for).
    /// A ring's lent slots count them exactly instead.
    fn in_transport(&self) -> usize {
        if self.ring.is_some() {
            return 0;
        }
        let bytes = self.last_bytes.load(Ordering::Relaxed).max(1);
        u64::from(super::config::DEFAULT_STREAM_WINDOW_BYTES)
            .div_ceil(bytes)
            .min(MAX_TRANSPORT_BATCHES) as usize
    }

    fn waited_on_client(&self, since: Instant) {
        let waited = since.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        self.client_wait_ns.fetch_add(waited, Ordering::Relaxed);
    }

    /// The client's pace over the batch just handed on, `interval` after
    /// the one before: how long the producer waited for it, and the batches
    /// ahead of it (with a ring, less the one the client holds while it
    /// waits for the next).
    fn take_pace(&self, interval: Option<Duration>) -> ClientPace {
        let waited = Duration::from_nanos(self.client_wait_ns.swap(0, Ordering::Relaxed));
        let (ahead, buffer) = match &self.ring {
            Some(ring) => (ring.lent().saturating_sub(1), ring.slot_count()),
            None => (
                self.tx.max_capacity() - self.tx.capacity(),
                self.tx.max_capacity(),
            ),
        };
        let primed = self.handed.fetch_add(1, Ordering::Relaxed) >= buffer as u64;
        ClientPace {
            waited,
            ahead,
            primed,
            interval,
        }
    }
}

impl<'a> BatchDispatch<'a> {
    pub fn new(
        common: &'a StreamCommon,
        tx: &'a mpsc::Sender<Result<DecodedBatch, PipelineError>>,
        first_index: u64,
        rank: u32,
    ) -> Self {
        let share = ServerShare::of(common.delivery);
        let search = share.as_ref().and_then(ServerShare::search);
        Self {
            common,
            ready: ReadySink {
                tx,
                // Per-stream series would be unbounded; the stream label is its rank.
                gauge: ::metrics::gauge!(metrics::READY_BATCHES, "rank" => metrics::rank_label(rank)),
                client_wait_ns: AtomicU64::new(0),
                ring: common.ring.as_ref().map(|target| target.ring.clone()),
                handed: AtomicU64::new(0),
                search: std::sync::Mutex::new(search),
                last_bytes: AtomicU64::new(0),
            },
            decoding: FuturesOrdered::new(),
            // Batches alive at once: decoding, queued, and one being encoded.
            buffers: BufferPool::new(common.config.decode_ahead + common.config.ready_batches + 1),
            next_index: first_index,
            share,
            remote: RemoteShare::of(common, rank),
            last_handed: None,
        }
    }

    /// Starts decoding a batch of `samples`. `Ok(false)`: the client went away.
    pub async fn submit(&mut self, samples: Vec<EmittedSample>) -> Result<bool, PipelineError> {
        // A shared ring holds the producer back until the client has
        // returned a slot.
        let target = match &self.common.ring {
            Some(ring) => {
                match acquire_sending_decoded(ring, &mut self.decoding, &self.ready).await? {
                    Some(lease) => Some(lease),
                    None => return Ok(false),
                }
            }
            None => None,
        };
        let batch_samples = samples.len();
        let remote = self
            .remote
            .as_ref()
            .and_then(|remote| remote.part(&samples));
        self.decoding.push_back(decode_batch(
            self.common,
            &self.buffers,
            self.share.as_ref().map(ServerShare::batch),
            remote,
            samples,
            self.next_index,
            target,
        ));
        self.next_index += 1;
        while self.decoding.len() >= self.common.config.decode_ahead.max(1) {
            if !send_next(&mut self.decoding, &self.ready).await? {
                return Ok(false);
            }
        }
        let now = Instant::now();
        let pace = self
            .ready
            .take_pace(self.last_handed.replace(now).map(|last| now - last));
        if let (Some(share), Some(interval)) = (&mut self.share, pace.interval) {
            // Placed and not yet taken: decoding, ahead of the client (in
            // the ready queue or ring, and in the transport), and the one
            // it holds.
            let in_flight = self.decoding.len() + pace.ahead + self.ready.in_transport() + 1;
            share.handed(batch_samples, interval, in_flight);
            if let Some(search) = share.search() {
                *self
                    .ready
                    .search
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(search);
            }
        }
        if let Some(remote) = &mut self.remote {
            remote.tune(pace, batch_samples);
        }
        Ok(true)
    }

    /// Sends every batch still decoding.
    pub async fn finish(mut self) -> Result<(), PipelineError> {
        while !self.decoding.is_empty() {
            if !send_next(&mut self.decoding, &self.ready).await? {
                return Ok(());
            }
        }
        Ok(())
    }
}

/// A ring slot for the next batch. While the client holds every slot, the
/// batches that finish decoding meanwhile go on to the ready queue: none
/// waits unsent for a slot it does not need (so a draining stream's
/// batches in flight all arrive). `Ok(None)`: the client went away.
async fn acquire_sending_decoded(
    shared: &SharedTarget,
    decoding: &mut FuturesOrdered<oneshot::Receiver<DecodedBatch>>,
    ready: &ReadySink<'_>,
) -> Result<Option<shm::SlotLease>, PipelineError> {
    let started = Instant::now();
    let acquire = shared.acquire();
    tokio::pin!(acquire);
    loop {
        if decoding.is_empty() {
            let lease = acquire.await;
            ready.waited_on_client(started);
            return lease.map(Some);
        }
        tokio::select! {
            biased;
            lease = &mut acquire => {
                ready.waited_on_client(started);
                return lease.map(Some);
            }
            // `FuturesOrdered::next` is cancel-safe: an unfinished batch stays queued.
            decoded = decoding.next() => {
                if !send_decoded(decoded, ready).await? {
                    return Ok(None);
                }
            }
        }
    }
}

/// Sends the oldest decoded batch. `Ok(false)`: the client went away.
async fn send_next(
    decoding: &mut FuturesOrdered<oneshot::Receiver<DecodedBatch>>,
    ready: &ReadySink<'_>,
) -> Result<bool, PipelineError> {
    send_decoded(decoding.next().await, ready).await
}

async fn send_decoded(
    decoded: Option<Result<DecodedBatch, oneshot::error::RecvError>>,
    ready: &ReadySink<'_>,
) -> Result<bool, PipelineError> {
    let batch = decoded
        .ok_or_else(|| PipelineError::Internal("no batch decoding".into()))?
        .map_err(|_| PipelineError::Internal("decode task dropped its batch".into()))?;
    let mut batch = batch;
    batch.search = *ready
        .search
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    ready
        .last_bytes
        .store(batch.image_bytes as u64, Ordering::Relaxed);
    let started = Instant::now();
    let tx = ready.tx;
    let sent = tx.send(Ok(batch)).await.is_ok();
    ready.waited_on_client(started);
    ready.gauge.set((tx.max_capacity() - tx.capacity()) as f64);
    Ok(sent)
}
