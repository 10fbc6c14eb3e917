//! The stream pipeline: wires fetch, parse, shuffle, decode and batch with
//! bounded channels, following a [`StreamPlan`] step by step.
//!
//! # Shape of one stream
//!
//! ```text
//! shard readers  ──► producer task ──► decode pool ──► ready queue ──► gRPC
//! (tokio tasks:       (follows the      (rayon, shared  (bounded mpsc)
//!  ranged GETs,        plan's Pull/Emit   by all streams)
//!  tar parse)          steps; holds the
//!                      shuffle buffer)
//! ```
//!
//! # Where memory is bounded
//!
//! Every queue has a configured bound; nothing grows with the dataset:
//!
//! * **Shard readers.** At most `interleave + prefetch_shards` readers are
//!   alive per stream. Each holds up to `parts_in_flight * part_size` bytes of
//!   ranged GETs in flight, one part being handed to the parser, the parser's
//!   buffer (up to a part plus the member it straddles), and `reader_queue`
//!   parsed samples waiting in its channel.
//! * **Shuffle buffer.** `shuffle_buffer` compressed samples (the plan's
//!   buffer, mirrored here on real bytes).
//! * **Batches.** `decode_ahead` batches being decoded plus `ready_batches`
//!   decoded batches waiting for the client, each
//!   `batch_size * height * width * 3` bytes (an encoded delivery's batch
//!   is at most as long: see [`encoded`]).
//!
//! Peak per stream ≈
//!
//! ```text
//! (interleave + prefetch_shards) * (parts_in_flight + 2) * part_size
//! + (interleave + prefetch_shards) * reader_queue * S
//! + shuffle_buffer * S
//! + (decode_ahead + ready_batches + 3) * batch_bytes
//! ```
//!
//! with `S` the mean compressed sample size. The batch term is the stream's
//! pooled batch buffers (decoding, queued, one being encoded) plus the
//! encoded copies gRPC holds while sending.
//!
//! Decode scratch is shared by all streams: a full-size decode, and a
//! decoded-source tier record read or derived, holds its image's share of
//! the server's scratch budget (`--memory-limit / 8`, at most 1 GiB) while
//! it works, so the decode threads together never hold more.
//!
//! # Where the decoded-source tier's disk I/O runs
//!
//! On the decode threads, inside each sample's decode (decode sees the tier
//! only as a `SourceStore`): a hit reads one record file and a miss writes
//! one, under the scratch budget as above. Not on the async runtime, whose
//! threads only move bytes; and not ahead of the decode on a thread of its
//! own, which would hold a second copy of every record in flight. A slow
//! disk slows the decode pool as a slow decode would, and back-pressure
//! follows as below.
//!
//! # Who blocks whom
//!
//! A slow client fills the ready queue; the producer then waits to send, stops
//! pulling, readers fill their channels and stop fetching. A client that goes
//! away closes the ready queue: the producer notices at once (it watches the
//! queue while it waits) and drops its readers, which aborts their requests.

mod batch;
pub(crate) mod buffers;
pub mod encoded;
pub mod mix;
mod readers;
pub mod shm;
mod walk;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::dataset::{Dataset, DatasetError};
use crate::decode::{self, CropBox, Decoder, OutputSpec, ScratchBudget};
use crate::metrics;
use crate::plan::StreamPlan;
use crate::shard::{BadShardPolicy, SampleLayout, ShardError, DEFAULT_MAX_MEMBER_BYTES};
use crate::store::cache::PlanFollower;
use crate::store::read::ReadConfig;
use crate::store::StoreError;
use batch::{BatchDispatch, EmittedSample, SampleOrigin};
pub use encoded::{Delivery, Placement};
use walk::SampleWalker;

pub const DEFAULT_PREFETCH_SHARDS: usize = 2;
pub const DEFAULT_READER_QUEUE: usize = 64;
pub const DEFAULT_READY_BATCHES: usize = 2;
pub const DEFAULT_DECODE_AHEAD: usize = 2;

#[derive(Debug, Clone)]
pub struct PipelineConfig {
    pub read: ReadConfig,
    /// Shard readers (one per plan segment) started ahead of the ones the
    /// schedule is using.
    pub prefetch_shards: usize,
    /// Parsed samples queued per segment reader.
    pub reader_queue: usize,
    /// Decoded batches queued for the client.
    pub ready_batches: usize,
    /// Batches being decoded at once per stream.
    pub decode_ahead: usize,
    pub max_member_bytes: u64,
    pub on_bad_shard: BadShardPolicy,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            read: ReadConfig::default(),
            prefetch_shards: DEFAULT_PREFETCH_SHARDS,
            reader_queue: DEFAULT_READER_QUEUE,
            ready_batches: DEFAULT_READY_BATCHES,
            decode_ahead: DEFAULT_DECODE_AHEAD,
            max_member_bytes: DEFAULT_MAX_MEMBER_BYTES,
            on_bad_shard: BadShardPolicy::Fail,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("{0}")]
    Dataset(#[from] DatasetError),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("shard {location}: {source}")]
    Shard {
        location: String,
        #[source]
        source: ShardError,
    },
    #[error(
        "shard {location} does not match its index (sample {index}: expected key {expected:?}, \
         found {found:?}); rebuild the index with `shardfeed index`"
    )]
    StaleIndex {
        location: String,
        index: u64,
        expected: String,
        found: String,
    },
    #[error(
        "{location} is gone, though the dataset's index lists it; rebuild the index with \
         `shardfeed index` (or serve with --on-bad-shard skip to substitute missing objects)"
    )]
    ObjectGone { location: String },
    #[error("{0}")]
    SharedMemory(String),
    #[error("internal pipeline error: {0}")]
    Internal(String),
}

/// Where a batch's pixels are.
#[derive(Debug)]
pub enum BatchImages {
    /// In process memory, to be sent inline.
    Inline(Bytes),
    /// In a slot of the stream's shared-memory ring (the first
    /// `size * height * width * 3` bytes of it).
    Shared(shm::SlotLease),
}

/// A decoded batch, ready to send.
#[derive(Debug)]
pub struct DecodedBatch {
    pub index: u64,
    pub size: usize,
    /// `image_bytes` bytes: NHWC pixels, `size * height * width * 3` of
    /// them; delivered encoded, each sample where `encoded` places it.
    pub images: BatchImages,
    pub image_bytes: usize,
    /// Delivered encoded: per slot, where its bytes are and whether they
    /// are pixels or a JPEG (empty otherwise).
    pub encoded: Vec<Placement>,
    pub labels: Vec<i64>,
    pub keys: Vec<String>,
    pub shards: Vec<String>,
    /// Per slot: the source of a mixed stream it came from (0 otherwise),
    /// and that source's epoch (the stream's epoch otherwise).
    pub sources: Vec<u32>,
    pub source_epochs: Vec<u64>,
    /// Slots holding a repeat that pads the epoch (partition pad).
    pub padded: Vec<u32>,
    /// Per slot: the source box the image came from and whether it was
    /// flipped (a substitute carries its source's).
    pub crops: Vec<CropBox>,
    /// Samples replaced by a substitute, in slot order.
    pub substituted: Vec<Substitution>,
    /// Per field of the stream's layout, per slot: its bytes (a substitute
    /// carries its source's).
    pub fields: Vec<Vec<Option<Bytes>>>,
    /// When the batch became ready (for stall accounting).
    pub ready_at: Instant,
}

/// A sample that could not be decoded, and what was sent in its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Substitution {
    pub slot: u32,
    pub reason: String,
    /// The slot whose image and label were copied into this one; `None`
    /// when no sample of the batch decoded (then zeros and label -1).
    pub source: Option<u32>,
}

/// The slot that stands in for the failed sample `key` among the batch's
/// good slots: a pure function of the key and the batch (FNV-1a of the key,
/// then MurmurHash3's 64-bit finalizer so every bit counts), so a rerun
/// substitutes exactly the same way.
pub fn substitute_source(key: &str, good_slots: &[u32]) -> Option<u32> {
    if good_slots.is_empty() {
        return None;
    }
    let hash = decode::augment::fmix64(decode::augment::fnv1a(key.bytes()));
    Some(good_slots[(hash % good_slots.len() as u64) as usize])
}

/// Tells the disk cache which shards a stream has reached, so its eviction
/// knows what is still ahead.
#[derive(Clone)]
pub struct CacheHints {
    /// The shard cache and the decoded-source tier, where the stream uses them.
    pub followers: Vec<Arc<dyn PlanFollower>>,
    pub stream: String,
}

/// What one stream needs to run.
#[derive(Clone)]
pub struct StreamContext {
    pub dataset: Arc<Dataset>,
    pub plan: Arc<StreamPlan>,
    pub spec: OutputSpec,
    /// The request's seed and epoch, which key every sample's augmentation.
    pub seed: u64,
    pub epoch: u64,
    pub config: PipelineConfig,
    pub pool: Arc<rayon::ThreadPool>,
    pub decoder: Arc<dyn Decoder>,
    /// Decode memory shared by every stream's decodes.
    pub scratch: Arc<ScratchBudget>,
    pub cache_hints: Option<CacheHints>,
    /// Decode into this shared-memory ring instead of process memory.
    pub shared: Option<SharedTarget>,
    /// What else to read of each sample.
    pub layout: Arc<SampleLayout>,
    /// Outputs defined from stored decoded sources (the decoded tier).
    pub tier: Option<decode::tier::TierRequest>,
    /// Pixels, or baseline JPEGs for the client to decode.
    pub delivery: Delivery,
    /// The stream's metric handles, resolved once.
    pub metrics: metrics::StreamMetrics,
}

/// A stream's shared-memory ring, and the socket it is handed out on (for
/// error messages).
#[derive(Clone, Debug)]
pub struct SharedTarget {
    pub ring: Arc<shm::Ring>,
    pub fd_socket: std::path::PathBuf,
}

impl SharedTarget {
    /// A slot to fill: waits (bounded) until the client has returned one.
    pub async fn acquire(&self) -> Result<shm::SlotLease, PipelineError> {
        self.ring
            .acquire(&self.fd_socket)
            .await
            .map_err(|e| PipelineError::SharedMemory(e.to_string()))
    }
}

pub type BatchReceiver = mpsc::Receiver<Result<DecodedBatch, PipelineError>>;

/// Starts the stream's producer task and returns its ready queue. Dropping
/// the receiver stops the stream and frees its resources.
///
/// `held` lives as long as the stream's task (e.g. its memory reservation):
/// it is released when the last stage of the stream has stopped.
pub fn spawn_stream<H: Send + 'static>(
    context: StreamContext,
    span: tracing::Span,
    held: H,
) -> BatchReceiver {
    let capacity = context.config.ready_batches;
    spawn_producer(capacity, span, held, move |tx| async move {
        produce(&context, &tx).await
    })
}

pub type BatchSender = mpsc::Sender<Result<DecodedBatch, PipelineError>>;

/// Runs a stream's producer (`produce`, given the ready queue's sender) as a
/// task: an error it returns is the stream's last item, and it is stopped
/// as soon as the client drops the receiver. `held` lives as long as it.
pub fn spawn_producer<H, F, Fut>(
    ready_batches: usize,
    span: tracing::Span,
    held: H,
    produce: F,
) -> BatchReceiver
where
    H: Send + 'static,
    F: FnOnce(BatchSender) -> Fut,
    Fut: std::future::Future<Output = Result<(), PipelineError>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(ready_batches.max(1));
    let producing = produce(tx.clone());
    let task = async move {
        let _held = held;
        tokio::select! {
            result = producing => {
                if let Err(error) = result {
                    let _ = tx.send(Err(error)).await;
                }
            }
            () = tx.closed() => {
                tracing::debug!("client went away; stream stopped");
            }
        }
    };
    tokio::spawn(tracing::Instrument::instrument(task, span));
    rx
}

async fn produce(
    context: &StreamContext,
    tx: &mpsc::Sender<Result<DecodedBatch, PipelineError>>,
) -> Result<(), PipelineError> {
    let plan = &context.plan;
    let batch_size = plan.batch_size as usize;
    let origin = Arc::new(SampleOrigin {
        dataset: context.dataset.clone(),
        seed: context.seed,
        epoch: context.epoch,
        label_offset: context.layout.label_offset,
        source: 0,
    });
    let mut walker = SampleWalker::new(context, origin);
    let mut dispatch = BatchDispatch::new(context, tx, plan.first_batch, plan.rank);
    let mut pending: Vec<EmittedSample> = Vec::with_capacity(batch_size);
    while let Some(sample) = walker.next().await? {
        pending.push(sample);
        if pending.len() == batch_size {
            let samples = std::mem::replace(&mut pending, Vec::with_capacity(batch_size));
            if !dispatch.submit(samples).await? {
                return Ok(());
            }
        }
    }
    if !pending.is_empty() {
        return Err(PipelineError::Internal(format!(
            "{} samples left over: the plan is not a whole number of batches",
            pending.len()
        )));
    }
    dispatch.finish().await
}
