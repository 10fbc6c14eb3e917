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
//!   `batch_size * height * width * 3` bytes.
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
//! # Who blocks whom
//!
//! A slow client fills the ready queue; the producer then waits to send, stops
//! pulling, readers fill their channels and stop fetching. A client that goes
//! away closes the ready queue: the producer notices at once (it watches the
//! queue while it waits) and drops its readers, which aborts their requests.

pub(crate) mod buffers;
mod readers;
pub mod shm;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::stream::FuturesOrdered;
use futures::StreamExt;
use rayon::prelude::*;
use tokio::sync::{mpsc, oneshot};

use crate::dataset::{Dataset, DatasetError, ShardIndex};
use crate::decode::{self, CropBox, Decoder, OutputSpec, SampleKey, ScratchBudget};
use crate::metrics;
use crate::plan::{RankPlan, SampleRef, Step, StreamPlan};
use crate::shard::{
    BadShardPolicy, Label, RawSample, SampleLayout, SampleSplitter, ShardError, ShardFormat,
    DEFAULT_MAX_MEMBER_BYTES,
};
use crate::store::cache::DiskCache;
use crate::store::read::ReadConfig;
use crate::store::StoreError;
use buffers::BufferPool;
use readers::ShardReaders;

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
    /// `size * height * width * 3` bytes, NHWC.
    pub images: BatchImages,
    pub labels: Vec<i64>,
    pub keys: Vec<String>,
    pub shards: Vec<String>,
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

/// Replaces every failed slot by a copy of a good sample of the same batch
/// (image and label), so training never sees a blank image with a class;
/// counts and logs each failure with its shard and key.
/// The batch's extra fields, field by field, in slot order; a substituted
/// slot takes its source's, like its image and label.
fn batch_fields(
    samples: &[EmittedSample],
    substituted: &[Substitution],
) -> Vec<Vec<Option<Bytes>>> {
    let count = samples
        .iter()
        .map(|e| e.sample.fields.len())
        .max()
        .unwrap_or(0);
    let mut fields: Vec<Vec<Option<Bytes>>> = (0..count)
        .map(|field| {
            samples
                .iter()
                .map(|e| e.sample.fields.get(field).cloned().flatten())
                .collect()
        })
        .collect();
    for substitution in substituted {
        for values in &mut fields {
            values[substitution.slot as usize] = substitution
                .source
                .and_then(|from| values[from as usize].clone());
        }
    }
    fields
}

fn substitute_failures(
    failures: &[Option<(&'static str, String)>],
    samples: &[EmittedSample],
    dataset: &Dataset,
    images: &mut [u8],
    labels: &mut [i64],
    crops: &mut [CropBox],
    slot_bytes: usize,
) -> Vec<Substitution> {
    let good: Vec<u32> = (0..failures.len() as u32)
        .filter(|&slot| failures[slot as usize].is_none())
        .collect();
    let mut substituted = Vec::new();
    for (slot, failure) in failures.iter().enumerate() {
        let Some((reason, message)) = failure else {
            continue;
        };
        let emitted = &samples[slot];
        metrics::substituted(reason);
        tracing::warn!(
            shard = %dataset.shard_key(emitted.shard),
            key = %emitted.sample.key,
            error = %message,
            "substituted a sample that could not be decoded"
        );
        let source = substitute_source(&emitted.sample.key, &good);
        let target = slot * slot_bytes..(slot + 1) * slot_bytes;
        match source {
            Some(from) => {
                let from = from as usize;
                images.copy_within(from * slot_bytes..(from + 1) * slot_bytes, target.start);
                labels[slot] = labels[from];
                crops[slot] = crops[from];
            }
            None => {
                images[target].fill(0);
                labels[slot] = -1;
                crops[slot] = CropBox::default();
            }
        }
        substituted.push(Substitution {
            slot: slot as u32,
            reason: message.clone(),
            source,
        });
    }
    substituted
}

/// Tells the disk cache which shards a stream has reached, so its eviction
/// knows what is still ahead.
#[derive(Clone)]
pub struct CacheHints {
    pub cache: Arc<DiskCache>,
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

/// A sample leaving the shuffle buffer, on its way to the decoder.
struct EmittedSample {
    shard: u32,
    /// A repeat that pads the epoch.
    padding: bool,
    sample: RawSample,
}

async fn produce(
    context: &StreamContext,
    tx: &mpsc::Sender<Result<DecodedBatch, PipelineError>>,
) -> Result<(), PipelineError> {
    let plan = &context.plan;
    let batch_size = plan.batch_size as usize;
    let mut pending: Vec<EmittedSample> = Vec::with_capacity(batch_size);
    let mut decoding = FuturesOrdered::new();
    let mut next_index = plan.first_batch;
    // Batches alive at once: decoding, queued, and one being encoded.
    let buffers = BufferPool::new(context.config.decode_ahead + context.config.ready_batches + 1);
    let stream_metrics = &context.metrics;
    // Per-stream series would be unbounded; the stream label is its rank.
    let ready_gauge = ::metrics::gauge!(metrics::READY_BATCHES, "rank" => plan_rank_label(plan));

    for slice in plan.resumed_slices() {
        let rank_plan = slice.rank_plan;
        let mut schedule = slice.schedule;
        let mut readers = ShardReaders::new(context, rank_plan, slice.segment_starts);
        let mut buffer: HashMap<SampleRef, RawSample> = HashMap::with_capacity(slice.held.len());
        for sample in slice.held {
            buffer.insert(sample, readers.take(sample).await?);
        }
        let mut emitted = 0;
        while emitted < slice.emits {
            match schedule.next() {
                Some(Step::Pull(sample)) => {
                    buffer.insert(sample, readers.take(sample).await?);
                }
                Some(Step::Emit(sample)) => {
                    let raw = buffer.remove(&sample).ok_or_else(|| {
                        PipelineError::Internal(format!("{sample:?} emitted before it was pulled"))
                    })?;
                    emitted += 1;
                    let segment = &rank_plan.segments[sample.segment as usize];
                    pending.push(EmittedSample {
                        shard: segment.shard,
                        padding: segment.padding,
                        sample: raw,
                    });
                    if pending.len() == batch_size {
                        let samples =
                            std::mem::replace(&mut pending, Vec::with_capacity(batch_size));
                        // A shared ring holds the producer back until the
                        // client has returned a slot.
                        let target = match &context.shared {
                            Some(shared) => {
                                match acquire_sending_decoded(
                                    shared,
                                    &mut decoding,
                                    tx,
                                    &ready_gauge,
                                )
                                .await?
                                {
                                    Some(lease) => Some(lease),
                                    None => return Ok(()),
                                }
                            }
                            None => None,
                        };
                        decoding.push_back(decode_batch(
                            context,
                            &buffers,
                            stream_metrics,
                            samples,
                            next_index,
                            target,
                        ));
                        next_index += 1;
                        while decoding.len() >= context.config.decode_ahead.max(1) {
                            if !send_next(&mut decoding, tx, &ready_gauge).await? {
                                return Ok(());
                            }
                        }
                    }
                }
                None => {
                    return Err(PipelineError::Internal(format!(
                        "schedule ended after {emitted} of {} samples",
                        slice.emits
                    )))
                }
            }
        }
    }
    if !pending.is_empty() {
        return Err(PipelineError::Internal(format!(
            "{} samples left over: the plan is not a whole number of batches",
            pending.len()
        )));
    }
    while !decoding.is_empty() {
        if !send_next(&mut decoding, tx, &ready_gauge).await? {
            return Ok(());
        }
    }
    Ok(())
}

fn plan_rank_label(plan: &StreamPlan) -> String {
    plan.rank.to_string()
}

/// A ring slot for the next batch. While the client holds every slot, the
/// batches that finish decoding meanwhile go on to the ready queue: none
/// waits unsent for a slot it does not need (so a draining stream's
/// batches in flight all arrive). `Ok(None)`: the client went away.
async fn acquire_sending_decoded(
    shared: &SharedTarget,
    decoding: &mut FuturesOrdered<oneshot::Receiver<DecodedBatch>>,
    tx: &mpsc::Sender<Result<DecodedBatch, PipelineError>>,
    ready_gauge: &::metrics::Gauge,
) -> Result<Option<shm::SlotLease>, PipelineError> {
    let acquire = shared.acquire();
    tokio::pin!(acquire);
    loop {
        if decoding.is_empty() {
            return acquire.await.map(Some);
        }
        tokio::select! {
            biased;
            lease = &mut acquire => return lease.map(Some),
            // `FuturesOrdered::next` is cancel-safe: an unfinished batch stays queued.
            decoded = decoding.next() => {
                if !send_decoded(decoded, tx, ready_gauge).await? {
                    return Ok(None);
                }
            }
        }
    }
}

/// Sends the oldest decoded batch. `Ok(false)`: the client went away.
async fn send_next(
    decoding: &mut FuturesOrdered<oneshot::Receiver<DecodedBatch>>,
    tx: &mpsc::Sender<Result<DecodedBatch, PipelineError>>,
    ready_gauge: &::metrics::Gauge,
) -> Result<bool, PipelineError> {
    send_decoded(decoding.next().await, tx, ready_gauge).await
}

async fn send_decoded(
    decoded: Option<Result<DecodedBatch, oneshot::error::RecvError>>,
    tx: &mpsc::Sender<Result<DecodedBatch, PipelineError>>,
    ready_gauge: &::metrics::Gauge,
) -> Result<bool, PipelineError> {
    let batch = decoded
        .ok_or_else(|| PipelineError::Internal("no batch decoding".into()))?
        .map_err(|_| PipelineError::Internal("decode task dropped its batch".into()))?;
    let sent = tx.send(Ok(batch)).await.is_ok();
    ready_gauge.set((tx.max_capacity() - tx.capacity()) as f64);
    Ok(sent)
}

/// Decodes a batch on the pool, each image straight into its slot.
fn decode_batch(
    context: &StreamContext,
    buffers: &BufferPool,
    stream_metrics: &metrics::StreamMetrics,
    samples: Vec<EmittedSample>,
    index: u64,
    shared_slot: Option<shm::SlotLease>,
) -> oneshot::Receiver<DecodedBatch> {
    let (tx, rx) = oneshot::channel();
    let decoder = context.decoder.clone();
    let spec = context.spec;
    let dataset = context.dataset.clone();
    let stream_metrics = stream_metrics.clone();
    let buffers = buffers.clone();
    let scratch = context.scratch.clone();
    let (seed, epoch) = (context.seed, context.epoch);
    let label_offset = context.layout.label_offset;
    let queued = metrics::GaugeGuard::new(metrics::DECODE_QUEUE, samples.len() as f64);
    context.pool.spawn(move || {
        let slot = spec.bytes();
        let bytes = slot * samples.len();
        let (mut heap, mut lease) = match shared_slot {
            Some(lease) => (Vec::new(), Some(lease)),
            None => (buffers.take(bytes), None),
        };
        let images: &mut [u8] = match &mut lease {
            Some(lease) => &mut lease.as_mut_slice()[..bytes],
            None => &mut heap,
        };
        let outcomes: Vec<Result<CropBox, (&'static str, String)>> = images
            .par_chunks_mut(slot)
            .zip(samples.par_iter())
            .map(|(out, emitted)| {
                let started = Instant::now();
                let result = match (&emitted.sample.unreadable, &emitted.sample.image) {
                    (Some(unreadable), _) => Err((unreadable.reason, unreadable.message.clone())),
                    (None, Some((format, data))) => {
                        let key = SampleKey {
                            seed,
                            epoch,
                            sample: decode::augment::sample_identity(
                                &dataset.index.shards[emitted.shard as usize].name,
                                &emitted.sample.key,
                            ),
                        };
                        decode::decode_bounded(&*decoder, &scratch, *format, data, &spec, &key, out)
                            .map_err(|e| (e.reason(), e.to_string()))
                    }
                    (None, None) => Err((
                        "no_image",
                        "sample has no .jpg/.jpeg/.png/.webp member".to_string(),
                    )),
                };
                stream_metrics.decode_time(started.elapsed().as_secs_f64());
                result
            })
            .collect();
        let mut crops: Vec<CropBox> = outcomes
            .iter()
            .map(|outcome| outcome.as_ref().copied().unwrap_or_default())
            .collect();
        let failures: Vec<Option<(&'static str, String)>> =
            outcomes.into_iter().map(Result::err).collect();
        let mut labels: Vec<i64> = samples
            .iter()
            .map(|emitted| {
                if let Label::Invalid(text) = &emitted.sample.label {
                    metrics::invalid_label();
                    tracing::warn!(
                        shard = %dataset.shard_key(emitted.shard),
                        key = %emitted.sample.key,
                        label = %text,
                        "label is not an integer; sent as -1"
                    );
                }
                match &emitted.sample.label {
                    // Below 0 after the offset: unlabelled, as -1 always means.
                    Label::Value(label) => label.saturating_add(label_offset).max(-1),
                    _ => -1,
                }
            })
            .collect();
        let substituted = substitute_failures(
            &failures,
            &samples,
            &dataset,
            images,
            &mut labels,
            &mut crops,
            slot,
        );
        let fields = batch_fields(&samples, &substituted);
        let batch = DecodedBatch {
            index,
            size: samples.len(),
            images: match lease {
                Some(lease) => BatchImages::Shared(lease),
                None => BatchImages::Inline(buffers.share(heap)),
            },
            labels,
            shards: samples
                .iter()
                .map(|e| dataset.index.shards[e.shard as usize].name.clone())
                .collect(),
            padded: (0..samples.len() as u32)
                .filter(|&slot| samples[slot as usize].padding)
                .collect(),
            // The samples are done with: move their keys rather than copy them.
            keys: samples
                .into_iter()
                .map(|e| e.sample.name.unwrap_or(e.sample.key))
                .collect(),
            crops,
            substituted,
            fields,
            ready_at: Instant::now(),
        };
        drop(queued);
        let _ = tx.send(batch);
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_substituted_slot_carries_its_sources_fields() {
        let sample = |key: &str, caption: Option<&'static str>| EmittedSample {
            shard: 0,
            padding: false,
            sample: RawSample {
                fields: vec![caption.map(|c: &'static str| Bytes::from_static(c.as_bytes()))],
                ..RawSample::unreadable(key.into(), String::new())
            },
        };
        let samples = [
            sample("a", Some("A")),
            sample("b", Some("B")),
            sample("c", None),
        ];
        let substituted = [
            Substitution {
                slot: 1,
                reason: String::new(),
                source: Some(0),
            },
            Substitution {
                slot: 2,
                reason: String::new(),
                source: None,
            },
        ];
        let fields = batch_fields(&samples, &substituted);
        assert_eq!(
            fields,
            [vec![
                Some(Bytes::from_static(b"A")),
                Some(Bytes::from_static(b"A")),
                None
            ]]
        );
        assert!(batch_fields(&samples[..0], &[]).is_empty());
    }

    #[test]
    fn substitute_sources_are_frozen() {
        // A change here changes which pixels training sees for a failed
        // sample: make it on purpose, with a note for users.
        let good = [0, 1, 3, 4, 6, 7];
        let picked: Vec<Option<u32>> = ["a", "train/000123", "s000/k000002", ""]
            .iter()
            .map(|key| substitute_source(key, &good))
            .collect();
        assert_eq!(picked, vec![Some(7), Some(6), Some(7), Some(3)]);
        assert_eq!(substitute_source("a", &[]), None);
    }
}
