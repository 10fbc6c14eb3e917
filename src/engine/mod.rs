//! The engine: what every stream on the host shares, and the one way to
//! turn a validated request into a stream of batches.
//!
//! An [`Engine`] owns the dataset registry (opened datasets and their
//! indexes, the stores, the disk cache), the decoder and its decode pool
//! (one rayon pool sized to the cores, shared by all streams), and the
//! plan-driven cache hints. It plans each stream, tells the cache which
//! shards the stream reads this epoch and the next, and starts the stream's
//! pipeline (`open.rs`: one opener for one dataset or a mix; `mix.rs`: the
//! mix's planner). It knows nothing of protobuf or gRPC: the server
//! translates requests into [`StreamRequest`]s and errors into statuses.

pub mod budget;
mod cgroup;
mod mix;
mod open;
mod request;
pub mod sizing;
pub mod warm;

use std::sync::Arc;

use budget::{BudgetError, MemoryBudget, MemoryConfig};
pub use request::{MixSources, MixedSource, OutputRequest, Sources, StreamRequest};

use crate::dataset::{DatasetError, DatasetRegistry};
use crate::decode::{self, Decoder, OutputSpec, ScratchBudget};
use crate::metrics::StreamMetrics;
use crate::pipeline::{self, BatchReceiver, PipelineConfig};
use crate::plan::{self, EpochCounts, Partition, PlanError, ShuffleConfig, StreamPlan};
use crate::tier::host::HostTier;
use crate::tier::records::DecodedCache;

/// Decode threads when none are configured: the CPUs this process may use
/// (its cgroup's quota, within its cores; see [`sizing`]).
pub fn default_decode_threads() -> usize {
    sizing::detect_decode_threads().value
}

/// Most shards a shuffle buffer is counted as spanning in the plan hints
/// (a buffer far larger than shards mixes so widely that following the
/// plan shard by shard no longer says what is read next).
const MAX_BUFFERED_SHARDS: u64 = 64;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub pipeline: PipelineConfig,
    /// Threads of the decode pool shared by every stream.
    pub decode_threads: usize,
    /// Shuffle settings for requests that leave them unset.
    pub default_shuffle: ShuffleConfig,
    /// How `--memory-limit` is shared between streams and decode scratch.
    pub memory: MemoryConfig,
    /// The tier form a decoded stream uses when its request names none,
    /// where this server keeps a tier directory and has no decode pool.
    pub decoded_default: Option<decode::source::SourceForm>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            pipeline: PipelineConfig::default(),
            decode_threads: default_decode_threads(),
            default_shuffle: ShuffleConfig::default(),
            memory: MemoryConfig::detect(),
            decoded_default: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    Dataset(#[from] DatasetError),
    #[error("{0}")]
    Plan(#[from] PlanError),
    #[error("{0}")]
    Mix(#[from] plan::mix::MixError),
    #[error("{0}")]
    Memory(#[from] BudgetError),
    #[error("{0}")]
    Augment(#[from] decode::augment::AugmentError),
    /// A valid request the dataset cannot serve.
    #[error("{0}")]
    Unsupported(String),
    #[error(
        "the resume position was taken on another index of {dataset} ({taken}); it now has \
         {now}. A loose dataset's listing changed since (objects added or removed regroup \
         it): save its index with `shardfeed index` so it stays fixed, or start the epoch over"
    )]
    StalePosition {
        dataset: String,
        taken: String,
        now: String,
    },
    #[error("internal error: {0}")]
    Internal(String),
}

/// A started stream: its batches, in order, and what they were planned from.
pub struct OpenStream {
    /// Dropping it stops the stream and frees its resources.
    pub batches: BatchReceiver,
    pub shape: StreamGeometry,
    pub metrics: StreamMetrics,
    /// The stream's tracing span (dataset, rank, world size, epoch).
    pub span: tracing::Span,
    /// The stream's memory, reserved until both this handle and the
    /// pipeline's task are gone: decoded batches wait in the ready queue
    /// after the pipeline has finished.
    pub reservation: Arc<budget::Reservation>,
    /// The stream's shared-memory ring, when it asked for one.
    pub ring: Option<Arc<crate::pipeline::shm::Ring>>,
    /// The dataset index's identity (a mix's: its sources', joined), for
    /// the positions the stream reports.
    pub dataset_identity: String,
    /// The request's epoch, and the index of the first batch it sends.
    pub epoch: u64,
    pub first_index: u64,
    pub output: OutputSpec,
    /// The stream's view groups, when it serves several views per sample.
    pub views: Option<Arc<crate::decode::Views>>,
    /// The names of the fields every batch carries.
    pub field_names: Vec<String>,
}

/// Where a stream's batches fall in its epoch, for the positions it reports.
#[derive(Debug, Clone)]
pub struct StreamGeometry {
    /// Steps of the epoch (batches per rank).
    pub steps: u64,
    pub global_batch: u64,
    pub world_size: u32,
    /// The position batch indexes count from.
    pub base_position: plan::EpochPosition,
    /// A mixed stream's world sizes before this epoch (empty otherwise).
    pub before_epoch: Vec<plan::Phase>,
    /// A mixed stream's samples sent, per source, counted by dataset
    /// (empty for one dataset: its batches carry no sources).
    source_samples: Vec<::metrics::Counter>,
}

impl StreamGeometry {
    fn of(plan: &StreamPlan) -> Self {
        Self {
            steps: plan.counts.steps,
            global_batch: plan.counts.global_batch,
            world_size: plan.world_size,
            base_position: plan.base_position.clone(),
            before_epoch: Vec::new(),
            source_samples: Vec::new(),
        }
    }

    /// Whether the stream mixes sources (its batches say each sample's).
    pub fn is_mixed(&self) -> bool {
        !self.source_samples.is_empty()
    }

    /// Counts a mixed batch's samples per source (`sources`: each
    /// sample's source index).
    pub fn count_samples(&self, sources: &[u32]) {
        let mut counts = vec![0u64; self.source_samples.len()];
        for &k in sources {
            if let Some(count) = counts.get_mut(k as usize) {
                *count += 1;
            }
        }
        for (counter, count) in self.source_samples.iter().zip(counts) {
            counter.increment(count);
        }
    }

    /// The epoch position once every rank has finished batch `index`.
    pub fn position_after(&self, index: u64) -> plan::EpochPosition {
        self.base_position.advanced(self.world_size, index + 1)
    }

    /// Samples consumed across all ranks once every rank finished batch `index`.
    pub fn global_samples_after(&self, index: u64) -> u64 {
        (self.base_position.steps() + index + 1) * self.global_batch
    }
}

/// What runs a started stream: the real pipeline, or a double a caller
/// hands in (the dev transport benchmark's pattern batches). It holds
/// `held` (the stream's memory reservation) until the stream ends.
pub type StreamProducer =
    fn(pipeline::StreamContext, tracing::Span, Arc<budget::Reservation>) -> BatchReceiver;

/// What `describe` tells about a dataset at a world size and batch size.
#[derive(Debug, Clone)]
pub struct DatasetSummary {
    pub shards: u64,
    /// The dataset's samples (the counts hold every copy of each).
    pub samples: u64,
    pub total_bytes: u64,
    pub counts: EpochCounts,
    /// Label `i`'s name is `classes[i]` (empty: no names known).
    pub classes: Vec<String>,
}

#[derive(Debug)]
pub struct Engine {
    registry: Arc<DatasetRegistry>,
    config: EngineConfig,
    pool: Arc<rayon::ThreadPool>,
    decoder: Arc<dyn Decoder>,
    memory: MemoryBudget,
    scratch: Arc<ScratchBudget>,
    /// The host's decoded-source tier: its store once open, its fill, the
    /// form a decoded stream gets by default.
    tier: HostTier,
    /// What runs a started stream: the real pipeline, or a double a caller
    /// hands in (the dev transport benchmark's pattern batches).
    producer: StreamProducer,
    /// The decode pool streams send their shortfall to, where configured.
    remote: Option<crate::pool::PoolClient>,
    /// Dropped with the engine: tells [`EngineDropped`] waiters.
    alive: tokio::sync::watch::Sender<()>,
}

/// Resolves once the engine is dropped: whoever held it (the service, its
/// server task) has let go, and with it the registry, caches and pool.
#[derive(Debug, Clone)]
pub struct EngineDropped(tokio::sync::watch::Receiver<()>);

impl EngineDropped {
    pub async fn wait(&mut self) {
        // Nothing is ever sent: `changed` fails only once the sender is gone.
        while self.0.changed().await.is_ok() {}
    }
}

impl Engine {
    /// An engine with the default decoder (libjpeg-turbo when built in).
    pub fn new(registry: Arc<DatasetRegistry>, config: EngineConfig) -> std::io::Result<Self> {
        Self::with_decoder(registry, config, decode::default_decoder())
    }

    pub fn with_decoder(
        registry: Arc<DatasetRegistry>,
        config: EngineConfig,
        decoder: Arc<dyn Decoder>,
    ) -> std::io::Result<Self> {
        let pool = decode::decode_thread_pool(config.decode_threads, "shardfeed-decode")
            .map_err(std::io::Error::other)?;
        let tier = HostTier::new(config.decoded_default);
        Ok(Self {
            memory: MemoryBudget::new(config.memory.streams)
                .with_admission_wait(config.memory.admission_wait),
            scratch: Arc::new(ScratchBudget::new(config.memory.decode_scratch)),
            registry,
            config,
            pool: Arc::new(pool),
            decoder,
            tier,
            producer: pipeline::spawn_stream,
            remote: None,
            alive: tokio::sync::watch::Sender::new(()),
        })
    }

    /// Streams of decoded deliveries send the batches' shortfall to `pool`.
    /// Streams decode at least [`crate::pool::POOL_DECODE_AHEAD`] batches
    /// at once from here on: a batch waits on its slowest unit, and with
    /// two in flight a rank consuming 10,000 samples/s outruns them (the
    /// pool simulation: p99 wait 2.4 steps at two, none at four).
    pub fn with_pool(mut self, pool: crate::pool::PoolClient) -> Self {
        self.remote = Some(pool);
        let pipeline = &mut self.config.pipeline;
        pipeline.decode_ahead = pipeline.decode_ahead.max(crate::pool::POOL_DECODE_AHEAD);
        self
    }

    /// Streams of this engine run `producer` instead of the pipeline (a
    /// benchmark's double: the engine links no dev code of its own).
    pub fn with_stream_producer(mut self, producer: StreamProducer) -> Self {
        self.producer = producer;
        self
    }

    /// Keeps decoded sources in `cache` for streams that ask for the tier.
    pub fn with_decoded_cache(self, cache: Arc<DecodedCache>) -> Self {
        self.tier.open(cache);
        self
    }

    /// Where the tier goes once it is open (see [`Engine::with_decoded_cache`]),
    /// for a server that opens it while already listening.
    pub fn decoded_cache_slot(&self) -> Arc<std::sync::OnceLock<Arc<DecodedCache>>> {
        self.tier.slot()
    }

    /// A future-maker that resolves once this engine has been dropped.
    pub fn dropped(&self) -> EngineDropped {
        EngineDropped(self.alive.subscribe())
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The streams' memory budget (for observers and tests).
    pub fn memory_budget(&self) -> &MemoryBudget {
        &self.memory
    }

    /// What decodes JPEGs on this engine.
    pub fn decoder_name(&self) -> &'static str {
        self.decoder.name()
    }

    /// Sizes of `dataset` and its epoch counts at this world and batch size,
    /// with `repeats` copies of each sample.
    pub async fn describe(
        &self,
        dataset: &str,
        world_size: u32,
        batch_size: u32,
        partition: Partition,
        repeats: u32,
    ) -> Result<DatasetSummary, EngineError> {
        plan::validate_repeats(repeats)?;
        let dataset = self.registry.open(dataset).await?;
        let samples = dataset.index.samples();
        let copies = samples * u64::from(repeats);
        let counts = plan::epoch_counts(copies, world_size, batch_size, partition)?;
        Ok(DatasetSummary {
            shards: dataset.index.shards.len() as u64,
            samples,
            total_bytes: dataset.index.bytes(),
            counts,
            classes: dataset.index.classes.clone(),
        })
    }
}
