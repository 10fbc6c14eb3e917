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

mod assemble;
pub(crate) mod buffers;
mod dispatch;
pub mod encoded;
mod mix;
mod readers;
mod remote;
mod sample;
mod seek;
pub mod shm;
mod substitute;
mod walk;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::dataset::{Dataset, DatasetError};
use crate::decode::{self, CropBox, Decoder, OutputSpec, ScratchBudget};
use crate::metrics;
use crate::plan::mix::MixPlan;
use crate::plan::StreamPlan;
use crate::shard::{BadShardPolicy, SampleLayout, ShardError, DEFAULT_MAX_MEMBER_BYTES};
use crate::store::cache::PlanFollower;
use crate::store::read::ReadConfig;
use crate::store::StoreError;
use dispatch::BatchDispatch;
pub use encoded::{Delivery, Placement};
use sample::EmittedSample;
pub use substitute::{substitute_source, Substitution};
use walk::SampleWalker;

pub const DEFAULT_PREFETCH_SHARDS: usize = 2;
pub const DEFAULT_READER_QUEUE: usize = 64;
pub const DEFAULT_READY_BATCHES: usize = 2;
pub const DEFAULT_DECODE_AHEAD: usize = 2;
/// HTTP/2 flow-control windows sized for multi-megabyte messages: the
/// server's, and what its own clients ask for. A stream's batches in the
/// transport count against a tuned share's measurements (`dispatch`).
pub const DEFAULT_STREAM_WINDOW_BYTES: u32 = 16 << 20;

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
    /// The shared-memory socket is at its client limit.
    #[error("{0}")]
    SharedMemoryBusy(String),
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
    /// A tuned encoded delivery: the server's best share so far.
    pub settled_share: Option<f64>,
}

/// Tells the disk cache which shards a stream has reached, so its eviction
/// knows what is still ahead.
#[derive(Clone)]
pub struct CacheHints {
    /// The shard cache and the decoded-source tier, where the stream uses them.
    pub followers: Vec<Arc<dyn PlanFollower>>,
    pub stream: String,
}

/// What every source of a stream shares: its settings, the host's decode
/// pool and budgets, the output it makes and where its batches go.
pub struct StreamCommon {
    pub config: PipelineConfig,
    pub pool: Arc<rayon::ThreadPool>,
    pub decoder: Arc<dyn Decoder>,
    /// Decode memory shared by every stream's decodes.
    pub scratch: Arc<ScratchBudget>,
    pub spec: OutputSpec,
    /// Decode into this shared-memory ring instead of process memory.
    pub ring: Option<SharedTarget>,
    /// Outputs defined from stored decoded sources (the decoded tier).
    pub tier: Option<decode::tier::TierRequest>,
    /// Pixels, or baseline JPEGs for the client to decode.
    pub delivery: Delivery,
    /// The stream's metric handles, resolved once.
    pub metrics: metrics::StreamMetrics,
    /// The decode pool, where the server has one.
    pub remote: Option<crate::pool::PoolClient>,
}

/// A dataset a stream reads, and what it reads of each sample.
#[derive(Clone)]
pub struct Source {
    pub dataset: Arc<Dataset>,
    pub layout: Arc<SampleLayout>,
    /// Where the source's shard reads are followed (a one-dataset stream's:
    /// a mix's parts run across epochs, and its caches fall back to LRU).
    pub cache_hints: Option<CacheHints>,
}

/// What a stream emits, in order: one dataset's plan, or a mix of sources.
pub enum Planned {
    One {
        source: Source,
        plan: Arc<StreamPlan>,
        /// The request's seed and epoch, which key every sample's augmentation.
        seed: u64,
        epoch: u64,
    },
    Mix {
        sources: Vec<Source>,
        plan: Arc<MixPlan>,
        /// The index of the stream's first batch in its epoch.
        first_index: u64,
    },
}

impl Planned {
    /// The batches the stream sends: the first one's index, and how many.
    pub fn batch_range(&self) -> std::ops::Range<u64> {
        match self {
            Self::One { plan, .. } => plan.first_batch..plan.first_batch + plan.batches,
            Self::Mix {
                plan, first_index, ..
            } => *first_index..first_index + plan.batches,
        }
    }

    pub fn batch_size(&self) -> u32 {
        match self {
            Self::One { plan, .. } => plan.batch_size,
            Self::Mix { plan, .. } => plan.batch_size,
        }
    }
}

/// What one stream needs to run.
pub struct StreamContext {
    pub common: StreamCommon,
    pub planned: Planned,
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
            .map_err(|e| match e {
                shm::ShmError::Refused { .. } => PipelineError::SharedMemoryBusy(e.to_string()),
                _ => PipelineError::SharedMemory(e.to_string()),
            })
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
    let capacity = context.common.config.ready_batches;
    let feeders_span = span.clone();
    spawn_producer(capacity, span, held, move |tx| async move {
        match &context.planned {
            Planned::One {
                source,
                plan,
                seed,
                epoch,
            } => {
                let part = SourcePart {
                    source,
                    plan,
                    seed: *seed,
                    epoch: *epoch,
                    index: 0,
                };
                produce(&context.common, part, &tx).await
            }
            Planned::Mix {
                sources,
                plan,
                first_index,
            } => {
                let mix = mix::Mixing {
                    sources,
                    plan,
                    first_index: *first_index,
                };
                mix::produce_mixed(&context.common, mix, &tx, feeders_span).await
            }
        }
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

/// One part of a source's plan, walked in order: a one-dataset stream's
/// whole plan, or a slice of a mixed stream's source.
pub(crate) struct SourcePart<'a> {
    pub source: &'a Source,
    pub plan: &'a StreamPlan,
    /// With `epoch`, keys every sample's augmentation.
    pub seed: u64,
    /// The stream's epoch, or the source-epoch in a mixed stream.
    pub epoch: u64,
    /// The source's index in a mixed stream (0 otherwise).
    pub index: u32,
}

async fn produce(
    common: &StreamCommon,
    part: SourcePart<'_>,
    tx: &BatchSender,
) -> Result<(), PipelineError> {
    let plan = part.plan;
    let batch_size = plan.batch_size as usize;
    let mut walker = SampleWalker::new(&common.config, part);
    let mut dispatch = BatchDispatch::new(common, tx, plan.first_batch, plan.rank);
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
