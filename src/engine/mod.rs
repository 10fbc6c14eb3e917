//! The engine: what every stream on the host shares, and the one way to
//! turn a validated request into a stream of batches.
//!
//! An [`Engine`] owns the dataset registry (opened datasets and their
//! indexes, the stores, the disk cache), the decoder and its decode pool
//! (one rayon pool sized to the cores, shared by all streams), and the
//! plan-driven cache hints. It plans each stream, tells the cache which
//! shards the stream reads this epoch and the next, and starts the stream's
//! pipeline. It knows nothing of protobuf or gRPC: the server translates
//! requests into [`StreamRequest`]s and errors into statuses.

pub mod budget;
mod cgroup;
pub mod mix;
pub mod warm;

use std::sync::Arc;

use budget::{BudgetError, MemoryBudget, MemoryConfig, StreamCost, StreamShape};

use crate::dataset::{DatasetError, DatasetRegistry};
use crate::decode::{self, Decoder, OutputSpec, ScratchBudget};
use crate::metrics::StreamMetrics;
use crate::pipeline::{self, BatchReceiver, CacheHints, PipelineConfig, StreamContext};
use crate::plan::{
    self, EpochCounts, Partition, PlanError, PlanRequest, ShuffleConfig, StreamPlan,
};
use crate::store::cache::PlanFollower;
use crate::store::decoded::DecodedCache;

/// Decode threads when none are configured: one per core.
pub fn default_decode_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
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
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            pipeline: PipelineConfig::default(),
            decode_threads: default_decode_threads(),
            default_shuffle: ShuffleConfig::default(),
            memory: MemoryConfig::detect(),
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

/// One stream to open: a dataset, its plan request and the output images.
#[derive(Debug, Clone)]
pub struct StreamRequest {
    pub dataset: String,
    pub plan: PlanRequest,
    pub output: OutputSpec,
    /// Decode into a shared-memory ring handed out on this socket (None:
    /// batches stay in process memory and are sent inline).
    pub shared_memory: Option<std::path::PathBuf>,
    /// What else to read of each sample.
    pub layout: crate::shard::SampleLayout,
    /// The dataset identity the resume position was taken on, if it says.
    pub resume_dataset: Option<String>,
    /// Define outputs from decoded sources stored in this form (the tier).
    pub decoded_source: Option<decode::source::SourceForm>,
    /// Pixels, or baseline JPEGs for the client to decode.
    pub delivery: crate::pipeline::Delivery,
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
    /// The dataset index's identity, for the positions the stream reports.
    pub dataset_identity: String,
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
}

impl StreamGeometry {
    fn of(plan: &StreamPlan) -> Self {
        Self {
            steps: plan.counts.steps,
            global_batch: plan.counts.global_batch,
            world_size: plan.world_size,
            base_position: plan.base_position.clone(),
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

/// What `describe` tells about a dataset at a world size and batch size.
#[derive(Debug, Clone, Copy)]
pub struct DatasetSummary {
    pub shards: u64,
    pub total_bytes: u64,
    pub counts: EpochCounts,
}

#[derive(Debug)]
pub struct Engine {
    registry: Arc<DatasetRegistry>,
    config: EngineConfig,
    pool: Arc<rayon::ThreadPool>,
    decoder: Arc<dyn Decoder>,
    memory: MemoryBudget,
    scratch: Arc<ScratchBudget>,
    /// The host's decoded-source tier, when it keeps one: set once, when
    /// it is open (the server opens it after it listens, as the shard cache).
    decoded: Arc<std::sync::OnceLock<Arc<DecodedCache>>>,
    /// What runs a started stream: the real pipeline, or a double a caller
    /// hands in (the dev transport benchmark's pattern batches).
    producer: StreamProducer,
}

/// Runs a planned stream's producer and returns its batches; holds `held`
/// (the stream's memory reservation) until the stream ends.
pub type StreamProducer =
    fn(StreamContext, tracing::Span, Arc<crate::engine::budget::Reservation>) -> BatchReceiver;

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
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(config.decode_threads.max(1))
            .thread_name(|i| format!("shardfeed-decode-{i}"))
            .build()
            .map_err(std::io::Error::other)?;
        Ok(Self {
            memory: MemoryBudget::new(config.memory.streams)
                .with_admission_wait(config.memory.admission_wait),
            scratch: Arc::new(ScratchBudget::new(config.memory.decode_scratch)),
            registry,
            config,
            pool: Arc::new(pool),
            decoder,
            decoded: Default::default(),
            producer: pipeline::spawn_stream,
        })
    }

    /// Streams of this engine run `producer` instead of the pipeline (a
    /// benchmark's double: the engine links no dev code of its own).
    pub fn with_stream_producer(mut self, producer: StreamProducer) -> Self {
        self.producer = producer;
        self
    }

    /// Keeps decoded sources in `cache` for streams that ask for the tier.
    pub fn with_decoded_cache(self, cache: Arc<DecodedCache>) -> Self {
        let _ = self.decoded.set(cache);
        self
    }

    /// Where the tier goes once it is open (see [`Engine::with_decoded_cache`]),
    /// for a server that opens it while already listening.
    pub fn decoded_cache_slot(&self) -> Arc<std::sync::OnceLock<Arc<DecodedCache>>> {
        self.decoded.clone()
    }

    /// The tier a stream of `form` uses: this host's store, if any.
    fn tier(&self, form: Option<decode::source::SourceForm>) -> Option<decode::tier::TierRequest> {
        form.map(|form| decode::tier::TierRequest {
            form,
            cache: self
                .decoded
                .get()
                .map(|tier| tier.clone() as Arc<dyn decode::tier::SourceStore>),
        })
    }

    fn spawn_stream(
        &self,
        context: StreamContext,
        span: tracing::Span,
        held: Arc<crate::engine::budget::Reservation>,
    ) -> BatchReceiver {
        (self.producer)(context, span, held)
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The streams' memory budget (for observers and tests).
    pub fn memory_budget(&self) -> &MemoryBudget {
        &self.memory
    }

    /// What a stream of `request` over a dataset with `mean_sample_bytes`
    /// per sample (of loose objects or not) reserves.
    pub fn stream_cost(
        &self,
        request: &StreamRequest,
        mean_sample_bytes: u64,
        loose_objects: bool,
    ) -> StreamCost {
        let shuffle = request.plan.shuffle.effective();
        StreamCost::new(
            &self.config.pipeline,
            StreamShape {
                interleave: shuffle.interleave,
                shuffle_buffer: shuffle.buffer,
                batch_bytes: request.output.bytes() as u64 * u64::from(request.plan.batch_size),
                mean_sample_bytes,
                loose_objects,
            },
        )
    }

    /// What decodes JPEGs on this engine.
    pub fn decoder_name(&self) -> &'static str {
        self.decoder.name()
    }

    /// Admits, plans and starts the stream; batches arrive on the returned
    /// receiver. The stream's memory is reserved before anything of it is
    /// allocated, and planning (whose cost follows the dataset) runs off the
    /// async runtime.
    pub async fn open_stream(&self, request: StreamRequest) -> Result<OpenStream, EngineError> {
        plan::validate_shuffle(request.plan.shuffle)?;
        request.output.validate()?;
        let dataset = self.registry.open(&request.dataset).await?;
        let dataset_identity = dataset.index.identity();
        if let Some(taken) = request
            .resume_dataset
            .as_ref()
            .filter(|taken| **taken != dataset_identity)
        {
            return Err(EngineError::StalePosition {
                dataset: request.dataset.clone(),
                taken: taken.clone(),
                now: dataset_identity,
            });
        }
        if dataset.is_loose() && !request.layout.fields.is_empty() {
            return Err(EngineError::Unsupported(format!(
                "{} is a dataset of loose image objects: its samples have no fields \
                 ({:?} asked); pack it into tar shards to keep captions or metadata with the images",
                request.dataset, request.layout.fields
            )));
        }
        let mean_sample = dataset
            .index
            .bytes()
            .div_ceil(dataset.index.samples().max(1));
        let reservation = Arc::new(
            self.memory
                .admit(self.stream_cost(&request, mean_sample, dataset.is_loose()))
                .await?,
        );
        let shared = self.shared_target(
            request.shared_memory.as_ref(),
            request.output.bytes() * request.plan.batch_size as usize,
            &reservation,
        )?;
        let shard_samples = dataset.shard_samples();
        // Both the shard cache and, for a stream that uses it, the
        // decoded-source tier evict by the plans. Loose objects are cached
        // one by one, not as the plan's virtual shards: eviction falls back
        // to LRU for them.
        let mut followers: Vec<Arc<dyn PlanFollower>> = Vec::new();
        if !dataset.is_loose() {
            if let Some(cache) = self.registry.cache() {
                followers.push(cache.clone());
            }
            if let Some(tier) = self
                .decoded
                .get()
                .filter(|_| request.decoded_source.is_some())
            {
                followers.push(tier.clone());
            }
        }
        let want_hints = !followers.is_empty();
        let plan_request = request.plan.clone();
        let (plan, hinted_shards) = tokio::task::spawn_blocking(move || {
            let plan = plan::plan_stream(&shard_samples, &plan_request)?;
            // The shards this stream reads this epoch and the next: both
            // pure functions of the request, so cache eviction can look ahead.
            let mut sequence = Vec::new();
            if want_hints {
                sequence = plan.shard_sequence();
                match plan::next_epoch_shard_sequence(&shard_samples, &plan_request) {
                    Ok(next) => sequence.extend(next),
                    Err(error) => tracing::debug!(%error, "no next-epoch hints"),
                }
            }
            Ok::<_, PlanError>((plan, sequence))
        })
        .await
        .map_err(|e| EngineError::Internal(format!("planning task failed: {e}")))??;
        let plan = Arc::new(plan);
        let span = tracing::info_span!(
            "stream",
            dataset = %request.dataset,
            rank = request.plan.rank,
            world_size = request.plan.world_size,
            epoch = request.plan.epoch,
        );
        span.in_scope(|| {
            tracing::info!(
                batches = plan.batches,
                start_batch = plan.first_batch,
                "stream started"
            )
        });
        let cache_hints = want_hints.then(|| {
            let locations: Vec<String> = hinted_shards
                .into_iter()
                .map(|shard| dataset.store.location(&dataset.shard_key(shard)))
                .collect();
            let stream = crate::store::cache::stream_key(
                &request.dataset,
                request.plan.seed,
                request.plan.rank,
                request.plan.world_size,
            );
            // The shards a stream may still be consuming behind the one it
            // last started: its readers, and the shards its shuffle buffer
            // spans (the tier fills as samples leave the buffer).
            let shuffle = request.plan.shuffle.effective();
            let shard_mean = dataset
                .index
                .samples()
                .div_ceil(dataset.index.shards.len().max(1) as u64);
            let buffered = u64::from(shuffle.buffer).div_ceil(shard_mean.max(1));
            let in_flight = shuffle.interleave as usize
                + self.config.pipeline.prefetch_shards
                + buffered.min(MAX_BUFFERED_SHARDS) as usize;
            for follower in &followers {
                follower.announce(&stream, &locations, in_flight);
            }
            CacheHints { followers, stream }
        });
        let metrics = StreamMetrics::new(request.plan.rank);
        let batches = self.spawn_stream(
            StreamContext {
                dataset,
                plan: plan.clone(),
                spec: request.output,
                seed: request.plan.seed,
                epoch: request.plan.epoch,
                config: self.config.pipeline.clone(),
                pool: self.pool.clone(),
                decoder: self.decoder.clone(),
                scratch: self.scratch.clone(),
                cache_hints,
                shared: shared.clone(),
                layout: Arc::new(request.layout.clone()),
                tier: self.tier(request.decoded_source),
                delivery: request.delivery.clone(),
                metrics: metrics.clone(),
            },
            span.clone(),
            reservation.clone(),
        );
        Ok(OpenStream {
            batches,
            shape: StreamGeometry::of(&plan),
            metrics,
            span,
            reservation,
            ring: shared.map(|shared| shared.ring),
            dataset_identity,
        })
    }

    /// The shared-memory ring a stream decodes into, when it asked for one.
    /// The ring takes the place of the batch buffers the reservation
    /// counted: (decode_ahead + ready_batches + 3) batches.
    fn shared_target(
        &self,
        socket: Option<&std::path::PathBuf>,
        batch_bytes: usize,
        reservation: &Arc<budget::Reservation>,
    ) -> Result<Option<crate::pipeline::SharedTarget>, EngineError> {
        let Some(socket) = socket else {
            return Ok(None);
        };
        let pipeline = &self.config.pipeline;
        let slots = pipeline.decode_ahead.max(1)
            + pipeline.ready_batches.max(1)
            + crate::pipeline::shm::CLIENT_SLOTS;
        let ring = crate::pipeline::shm::Ring::new(slots, batch_bytes)
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        // The ring may outlive the stream (kept for a client still to
        // collect it, mapped by one that holds a batch): the budget
        // counts its memory until it is gone.
        ring.hold_until_dropped(reservation.clone());
        Ok(Some(crate::pipeline::SharedTarget {
            ring,
            fd_socket: socket.clone(),
        }))
    }

    /// Sizes of `dataset` and its epoch counts at this world and batch size.
    pub async fn describe(
        &self,
        dataset: &str,
        world_size: u32,
        batch_size: u32,
        partition: Partition,
    ) -> Result<DatasetSummary, EngineError> {
        let dataset = self.registry.open(dataset).await?;
        let counts =
            plan::epoch_counts(dataset.index.samples(), world_size, batch_size, partition)?;
        Ok(DatasetSummary {
            shards: dataset.index.shards.len() as u64,
            total_bytes: dataset.index.bytes(),
            counts,
        })
    }
}
