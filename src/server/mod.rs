//! The gRPC edge: request validation, the error-to-status table, the batch
//! stream, health, limits and shutdown. No pipeline logic lives here.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::{Request, Response, Status};

use crate::dataset::{Dataset, DatasetError, DatasetRegistry};
use crate::decode::{self, Decoder, OutputSpec, ResizeMode};
use crate::metrics::{self, ActiveStream, StreamMetrics};
use crate::pipeline::{
    self, BatchReceiver, DecodedBatch, PipelineConfig, PipelineError, StreamContext,
};
use crate::plan::{
    self, EpochPosition, Partition, PlanError, PlanRequest, PositionSegment, ShuffleConfig,
};
use crate::store::StoreError;

pub mod codec;

pub mod pb {
    tonic::include_proto!("shardfeed.v1");
}

use pb::shardfeed_server::{Shardfeed, ShardfeedServer};

pub const DEFAULT_BATCH_SIZE: u32 = 128;
pub const DEFAULT_MAX_STREAMS: usize = 64;
/// Largest batch accepted, in bytes; keeps one request from asking for
/// gigabytes of buffers.
pub const MAX_BATCH_BYTES: u64 = 1 << 30;
/// Outgoing messages: one batch plus metadata.
pub const MAX_MESSAGE_BYTES: usize = (MAX_BATCH_BYTES as usize) + (16 << 20);
/// HTTP/2 flow-control windows sized for multi-megabyte messages.
pub const DEFAULT_STREAM_WINDOW_BYTES: u32 = 16 << 20;
/// Connections carry several streams: their window is this many stream windows.
const CONNECTION_WINDOWS_PER_STREAM: u32 = 4;

/// Settings of the service itself (the pipeline has its own).
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub max_streams: usize,
    pub decode_threads: usize,
    pub default_shuffle: ShuffleConfig,
    /// Dataset URI prefixes that may be requested; empty allows any.
    pub allow: Vec<String>,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            max_streams: DEFAULT_MAX_STREAMS,
            decode_threads: default_decode_threads(),
            default_shuffle: ShuffleConfig::default(),
            allow: Vec::new(),
        }
    }
}

/// Whether `--allow` rule `rule` admits `dataset`. A rule without a trailing
/// slash still ends at a path boundary: `s3://b/train` admits
/// `s3://b/train/x/` but not `s3://b/training/`.
pub fn rule_allows(rule: &str, dataset: &str) -> bool {
    let dataset = dataset.trim_end_matches('/');
    let rule_dir = rule.trim_end_matches('/');
    dataset == rule_dir
        || dataset
            .strip_prefix(rule_dir)
            .is_some_and(|rest| rest.starts_with('/'))
        || (rule.ends_with("://") && dataset.starts_with(rule))
}

pub fn default_decode_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Everything that can fail a request, mapped to a status in one place.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error("too many streams open (limit {0}); close one or raise --max-streams")]
    TooManyStreams(usize),
    #[error("dataset {dataset} is not allowed: this server only serves datasets under --allow {rules:?}")]
    NotAllowed { dataset: String, rules: Vec<String> },
    #[error("shardfeed is draining (shutting down); retry on its replacement")]
    Draining,
}

fn store_status(error: &StoreError) -> tonic::Code {
    use tonic::Code;
    match error {
        StoreError::NotFound { .. } => Code::NotFound,
        StoreError::PermissionDenied { .. } => Code::PermissionDenied,
        StoreError::Changed { .. } => Code::FailedPrecondition,
        StoreError::Transient { .. } | StoreError::Exhausted { .. } => Code::Unavailable,
        StoreError::Other { .. } => Code::Unknown,
    }
}

fn dataset_status(error: &DatasetError) -> tonic::Code {
    use tonic::Code;
    match error {
        DatasetError::InvalidUri { .. } => Code::InvalidArgument,
        DatasetError::Store(store) => store_status(store),
        DatasetError::NoShards { .. } => Code::NotFound,
        DatasetError::CorruptIndex { .. } => Code::FailedPrecondition,
        DatasetError::Shard { .. } => Code::DataLoss,
    }
}

impl ServiceError {
    pub fn code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            ServiceError::InvalidArgument(_) | ServiceError::Plan(_) => Code::InvalidArgument,
            ServiceError::TooManyStreams(_) => Code::ResourceExhausted,
            ServiceError::NotAllowed { .. } => Code::PermissionDenied,
            ServiceError::Draining => Code::Unavailable,
            ServiceError::Dataset(error) => dataset_status(error),
            ServiceError::Pipeline(error) => match error {
                PipelineError::Dataset(error) => dataset_status(error),
                PipelineError::Store(store) => store_status(store),
                PipelineError::Shard { .. } => Code::DataLoss,
                PipelineError::StaleIndex { .. } => Code::FailedPrecondition,
                PipelineError::Internal(_) => Code::Internal,
            },
        }
    }
}

impl From<ServiceError> for Status {
    fn from(error: ServiceError) -> Self {
        Status::new(error.code(), error.to_string())
    }
}

#[derive(Debug)]
pub struct ShardfeedService {
    registry: Arc<DatasetRegistry>,
    pipeline: PipelineConfig,
    config: ServiceConfig,
    pool: Arc<rayon::ThreadPool>,
    decoder: Arc<dyn Decoder>,
    streams: Arc<Semaphore>,
    shutdown: ShutdownHandle,
}

/// Lets `serve` drain the service: `drain` makes streams end after the batch
/// in flight, `abort` ends them at once (grace period over).
#[derive(Debug, Clone)]
pub struct ShutdownHandle {
    drain: CancellationToken,
    abort: CancellationToken,
    streams: Arc<Semaphore>,
    max_streams: usize,
}

impl ShutdownHandle {
    pub fn open_streams(&self) -> usize {
        self.max_streams - self.streams.available_permits()
    }
}

impl ShardfeedService {
    pub fn new(
        registry: Arc<DatasetRegistry>,
        pipeline: PipelineConfig,
        config: ServiceConfig,
    ) -> std::io::Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(config.decode_threads.max(1))
            .thread_name(|i| format!("shardfeed-decode-{i}"))
            .build()
            .map_err(std::io::Error::other)?;
        let streams = Arc::new(Semaphore::new(config.max_streams));
        Ok(Self {
            registry,
            pipeline,
            shutdown: ShutdownHandle {
                drain: CancellationToken::new(),
                abort: CancellationToken::new(),
                streams: streams.clone(),
                max_streams: config.max_streams,
            },
            streams,
            config,
            pool: Arc::new(pool),
            decoder: decode::default_decoder(),
        })
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
    }

    fn check_allowed(&self, dataset: &str) -> Result<(), ServiceError> {
        if self.config.allow.is_empty()
            || self
                .config
                .allow
                .iter()
                .any(|rule| rule_allows(rule, dataset))
        {
            Ok(())
        } else {
            Err(ServiceError::NotAllowed {
                dataset: dataset.to_string(),
                rules: self.config.allow.clone(),
            })
        }
    }

    /// Tells the host cache which shards this stream reads, in order, this
    /// epoch and the next (a pure function of the request).
    fn announce_to_cache(
        &self,
        uri: &str,
        dataset: &Dataset,
        plan: &plan::StreamPlan,
        request: &PlanRequest,
    ) -> Option<pipeline::CacheHints> {
        let cache = self.registry.cache()?.clone();
        let location = |shard: u32| dataset.store.location(&dataset.shard_key(shard));
        let mut sequence = Vec::new();
        for part in &plan.parts {
            let rank_plan = &plan.rank_plans[part.rank_plan];
            let mut schedule = rank_plan.schedule();
            let held = schedule.skip_emits(part.from);
            for (segment, start) in rank_plan
                .segments
                .iter()
                .zip(schedule.segment_starts(&held))
            {
                if start.is_some() {
                    sequence.push(location(segment.shard));
                }
            }
        }
        let next_epoch = PlanRequest {
            epoch: request.epoch + 1,
            start_batch: 0,
            resume_from: EpochPosition::default(),
            ..request.clone()
        };
        if let Ok(next) = plan::plan_stream(&dataset.shard_samples(), &next_epoch) {
            for part in &next.parts {
                sequence.extend(
                    next.rank_plans[part.rank_plan]
                        .segments
                        .iter()
                        .map(|s| location(s.shard)),
                );
            }
        }
        let stream =
            crate::store::cache::stream_key(uri, request.seed, request.rank, request.world_size);
        cache.announce(&stream, sequence);
        Some(pipeline::CacheHints { cache, stream })
    }

    pub fn into_server(self) -> ShardfeedServer<Self> {
        ShardfeedServer::new(self)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
            .max_decoding_message_size(4 << 20)
    }

    fn plan_request(
        &self,
        request: &pb::StreamBatchesRequest,
    ) -> Result<(PlanRequest, OutputSpec), ServiceError> {
        let batch_size = request.batch_size.unwrap_or(DEFAULT_BATCH_SIZE);
        let world_size = request.world_size.max(1);
        let height = if request.height == 0 {
            decode::DEFAULT_SIZE
        } else {
            request.height
        };
        let width = if request.width == 0 {
            decode::DEFAULT_SIZE
        } else {
            request.width
        };
        if height > decode::MAX_SIZE || width > decode::MAX_SIZE {
            return Err(ServiceError::InvalidArgument(format!(
                "output size {height}x{width} exceeds the maximum side of {}",
                decode::MAX_SIZE
            )));
        }
        let spec = OutputSpec {
            height,
            width,
            mode: match pb::ResizeMode::try_from(request.resize) {
                Ok(pb::ResizeMode::CenterCrop) => ResizeMode::CenterCrop,
                Ok(pb::ResizeMode::Stretch) => ResizeMode::Stretch,
                Err(_) => {
                    return Err(ServiceError::InvalidArgument(format!(
                        "unknown resize mode {}",
                        request.resize
                    )))
                }
            },
        };
        if spec.bytes() as u64 * u64::from(batch_size) > MAX_BATCH_BYTES {
            return Err(ServiceError::InvalidArgument(format!(
                "a batch of {batch_size} images of {height}x{width} exceeds {MAX_BATCH_BYTES} bytes"
            )));
        }
        let defaults = self.config.default_shuffle;
        let shuffle = ShuffleConfig {
            enabled: request.shuffle.unwrap_or(true),
            interleave: nonzero_or(request.interleave, defaults.interleave),
            buffer: nonzero_or(request.shuffle_buffer, defaults.buffer),
        };
        let resume_from = EpochPosition {
            segments: request
                .resume_from
                .as_ref()
                .map(|p| {
                    p.segments
                        .iter()
                        .map(|s| PositionSegment {
                            world_size: s.world_size,
                            batches: s.batches,
                        })
                        .collect()
                })
                .unwrap_or_default(),
        };
        Ok((
            PlanRequest {
                seed: request.seed,
                epoch: request.epoch,
                rank: request.rank,
                world_size,
                batch_size,
                shuffle,
                partition: partition(request.partition)?,
                start_batch: request.start_batch,
                resume_from,
            },
            spec,
        ))
    }

    async fn start_stream(
        &self,
        request: pb::StreamBatchesRequest,
    ) -> Result<BatchStream, ServiceError> {
        if self.shutdown.drain.is_cancelled() {
            return Err(ServiceError::Draining);
        }
        self.check_allowed(&request.dataset)?;
        let (plan_request, spec) = self.plan_request(&request)?;
        let permit = self
            .streams
            .clone()
            .try_acquire_owned()
            .map_err(|_| ServiceError::TooManyStreams(self.config.max_streams))?;
        let dataset = self.registry.open(&request.dataset).await?;
        let plan = plan::plan_stream(&dataset.shard_samples(), &plan_request)?;
        let span = tracing::info_span!(
            "stream",
            dataset = %request.dataset,
            rank = plan_request.rank,
            world_size = plan_request.world_size,
            epoch = plan_request.epoch,
        );
        span.in_scope(|| {
            tracing::info!(
                batches = plan.batches,
                start_batch = plan.first_batch,
                "stream started"
            )
        });
        let cache_hints = self.announce_to_cache(&request.dataset, &dataset, &plan, &plan_request);
        let plan = Arc::new(plan);
        let receiver = pipeline::spawn_stream(
            StreamContext {
                dataset,
                plan: plan.clone(),
                spec,
                config: self.pipeline.clone(),
                pool: self.pool.clone(),
                decoder: self.decoder.clone(),
                cache_hints,
            },
            span.clone(),
        );
        Ok(BatchStream {
            receiver,
            plan,
            spec,
            epoch: plan_request.epoch,
            metrics: StreamMetrics::new(plan_request.rank),
            waiting_since: None,
            next_index: plan_request.start_batch,
            drain: Box::pin(self.shutdown.drain.clone().cancelled_owned()),
            abort: Box::pin(self.shutdown.abort.clone().cancelled_owned()),
            draining: false,
            sent_since_drain: false,
            finished: false,
            span,
            _active: ActiveStream::open(),
            _permit: permit,
        })
    }
}

fn nonzero_or(value: u32, default: u32) -> u32 {
    if value == 0 {
        default
    } else {
        value
    }
}

fn partition(value: i32) -> Result<Partition, ServiceError> {
    match pb::Partition::try_from(value) {
        Ok(pb::Partition::DropLast) => Ok(Partition::DropLast),
        Ok(pb::Partition::Pad) => Ok(Partition::Pad),
        Err(_) => Err(ServiceError::InvalidArgument(format!(
            "unknown partition {value}"
        ))),
    }
}

/// The response stream of one `StreamBatches` call.
pub struct BatchStream {
    receiver: BatchReceiver,
    plan: Arc<plan::StreamPlan>,
    spec: OutputSpec,
    epoch: u64,
    metrics: StreamMetrics,
    /// Set when the client asked for a batch that was not ready.
    waiting_since: Option<Instant>,
    /// Index of the next batch to send (for the resume hint on drain).
    next_index: u64,
    drain: Pin<Box<WaitForCancellationFutureOwned>>,
    abort: Pin<Box<WaitForCancellationFutureOwned>>,
    /// Draining: send the batch in flight, then end with UNAVAILABLE.
    draining: bool,
    sent_since_drain: bool,
    finished: bool,
    span: tracing::Span,
    _active: ActiveStream,
    _permit: OwnedSemaphorePermit,
}

impl BatchStream {
    fn to_message(&self, batch: DecodedBatch) -> pb::Batch {
        let position = self.plan.position_after(batch.index);
        pb::Batch {
            epoch: self.epoch,
            index: batch.index,
            shape: Some(pb::Shape {
                n: batch.size as u32,
                height: self.spec.height,
                width: self.spec.width,
                channels: decode::CHANNELS as u32,
            }),
            images: batch.images,
            labels: batch.labels,
            keys: batch.keys,
            substituted: batch.substituted.iter().map(|(slot, _)| *slot).collect(),
            substitution_reasons: batch
                .substituted
                .into_iter()
                .map(|(_, reason)| reason)
                .collect(),
            position: Some(position_message(&position)),
            global_samples: self.plan.global_samples_after(batch.index),
            shards: batch.shards,
        }
    }
}

pub fn position_message(position: &EpochPosition) -> pb::EpochPosition {
    pb::EpochPosition {
        segments: position
            .segments
            .iter()
            .map(|s| pb::PositionSegment {
                world_size: s.world_size,
                batches: s.batches,
            })
            .collect(),
    }
}

impl BatchStream {
    fn drained_status(&mut self) -> Status {
        self.finished = true;
        let _entered = self.span.enter();
        tracing::info!(next_batch = self.next_index, "stream ended by shutdown");
        metrics::request("StreamBatches", tonic::Code::Unavailable);
        Status::unavailable(format!(
            "shardfeed is shutting down; resume this stream with start_batch={}",
            self.next_index
        ))
    }
}

impl Stream for BatchStream {
    type Item = Result<pb::Batch, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.finished {
            return Poll::Ready(None);
        }
        if self.abort.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(self.drained_status())));
        }
        if !self.draining && self.drain.as_mut().poll(cx).is_ready() {
            self.draining = true;
        }
        if self.draining && self.sent_since_drain {
            // The batch that was in flight when draining began has been sent.
            return Poll::Ready(Some(Err(self.drained_status())));
        }
        match self.receiver.poll_recv(cx) {
            Poll::Pending => {
                self.waiting_since.get_or_insert_with(Instant::now);
                Poll::Pending
            }
            Poll::Ready(None) => {
                self.finished = true;
                metrics::request("StreamBatches", tonic::Code::Ok);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(error))) => {
                self.finished = true;
                let error = ServiceError::from(error);
                let _entered = self.span.enter();
                tracing::error!(%error, "stream failed");
                metrics::request("StreamBatches", error.code());
                Poll::Ready(Some(Err(error.into())))
            }
            Poll::Ready(Some(Ok(batch))) => {
                // Stall accounting: did the client wait for us, or we for it?
                match self.waiting_since.take() {
                    Some(since) => self.metrics.consumer_waited(since.elapsed()),
                    None => self.metrics.ready_waited(batch.ready_at.elapsed()),
                }
                self.metrics.batch_sent(batch.size as u64);
                self.next_index = batch.index + 1;
                let message = self.to_message(batch);
                // While draining, this was the batch in flight: end after it.
                self.sent_since_drain = self.draining;
                Poll::Ready(Some(Ok(message)))
            }
        }
    }
}

#[tonic::async_trait]
impl Shardfeed for ShardfeedService {
    type StreamBatchesStream = BatchStream;

    async fn stream_batches(
        &self,
        request: Request<pb::StreamBatchesRequest>,
    ) -> Result<Response<Self::StreamBatchesStream>, Status> {
        match self.start_stream(request.into_inner()).await {
            Ok(stream) => Ok(Response::new(stream)),
            Err(error) => {
                tracing::warn!(%error, "stream refused");
                metrics::request("StreamBatches", error.code());
                Err(error.into())
            }
        }
    }

    async fn describe(
        &self,
        request: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::DescribeResponse>, Status> {
        let result = async {
            let request = request.into_inner();
            let batch_size = request.batch_size.unwrap_or(DEFAULT_BATCH_SIZE);
            let world_size = request.world_size.max(1);
            let partition = partition(request.partition)?;
            self.check_allowed(&request.dataset)?;
            let dataset = self.registry.open(&request.dataset).await?;
            let counts =
                plan::epoch_counts(dataset.index.samples(), world_size, batch_size, partition)?;
            Ok::<_, ServiceError>(pb::DescribeResponse {
                shards: dataset.index.shards.len() as u64,
                samples: counts.samples,
                batches_per_rank: counts.steps,
                dropped_per_epoch: counts.dropped,
                padded_per_epoch: counts.padded,
                total_bytes: dataset.index.bytes(),
            })
        }
        .await;
        match result {
            Ok(response) => {
                metrics::request("Describe", tonic::Code::Ok);
                Ok(Response::new(response))
            }
            Err(error) => {
                metrics::request("Describe", error.code());
                Err(error.into())
            }
        }
    }
}

/// Where the gRPC server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::str::FromStr for ListenAddr {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        if let Some(path) = value
            .strip_prefix("unix://")
            .or_else(|| value.strip_prefix("unix:"))
        {
            if path.is_empty() {
                return Err("unix socket path is empty".into());
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        value
            .parse()
            .map(Self::Tcp)
            .map_err(|e| format!("{value:?} is neither host:port nor unix:/path ({e})"))
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Tcp(addr) => write!(f, "{addr}"),
            ListenAddr::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A bound listener, so callers (tests, the demo) learn the real port first.
pub enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener, PathBuf),
}

impl Listener {
    pub async fn bind(addr: &ListenAddr) -> Result<Self, ServeError> {
        let bind_error = |source| ServeError::Bind {
            addr: addr.to_string(),
            source,
        };
        match addr {
            ListenAddr::Tcp(socket) => Ok(Self::Tcp(
                tokio::net::TcpListener::bind(socket)
                    .await
                    .map_err(bind_error)?,
            )),
            ListenAddr::Unix(path) => {
                // A socket file left by a previous run would make bind fail.
                if std::fs::symlink_metadata(path).is_ok() {
                    std::fs::remove_file(path).map_err(bind_error)?;
                }
                Ok(Self::Unix(
                    tokio::net::UnixListener::bind(path).map_err(bind_error)?,
                    path.clone(),
                ))
            }
        }
    }

    pub fn local_addr(&self) -> ListenAddr {
        match self {
            Listener::Tcp(listener) => ListenAddr::Tcp(
                listener
                    .local_addr()
                    .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0))),
            ),
            Listener::Unix(_, path) => ListenAddr::Unix(path.clone()),
        }
    }
}

/// A client channel to a shardfeed server, over TCP or a Unix socket.
pub async fn connect(
    addr: &ListenAddr,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    use tonic::transport::Endpoint;
    match addr {
        ListenAddr::Tcp(socket) => {
            Endpoint::from_shared(format!("http://{socket}"))?
                .connect()
                .await
        }
        ListenAddr::Unix(path) => {
            let path = path.clone();
            // The authority is unused over a Unix socket but must be valid.
            Endpoint::from_static("http://localhost")
                .connect_with_connector(tower::service_fn(move |_| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                }))
                .await
        }
    }
}

/// Asks the server's `grpc.health.v1` service whether it is serving.
pub async fn check_health(addr: &ListenAddr) -> Result<bool, Status> {
    use tonic_health::pb::health_check_response::ServingStatus;
    let channel = connect(addr)
        .await
        .map_err(|e| Status::unavailable(format!("cannot connect to {addr}: {e}")))?;
    let response = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await?
        .into_inner();
    Ok(response.status == ServingStatus::Serving as i32)
}

/// How long open streams may run on after shutdown starts.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Serves until `shutdown` resolves, then drains: reports NOT_SERVING, refuses
/// new streams, lets each open stream send its batch in flight and end with
/// UNAVAILABLE (and a resume hint), and after `grace` ends whatever is left.
pub async fn serve(
    listener: Listener,
    service: ShardfeedService,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> Result<(), ServeError> {
    let shutdown_handle = service.shutdown_handle();
    // Our receive windows (client requests are small; these matter when the
    // server is reached through a proxy that also streams to us).
    let window = DEFAULT_STREAM_WINDOW_BYTES;
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<ShardfeedServer<ShardfeedService>>()
        .await;
    let (drain_tx, drain_rx) = tokio::sync::oneshot::channel::<()>();
    let drain_started = async move {
        let _ = drain_rx.await;
    };
    let router = tonic::transport::Server::builder()
        .initial_stream_window_size(window)
        .initial_connection_window_size(window.saturating_mul(CONNECTION_WINDOWS_PER_STREAM))
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .tcp_nodelay(true)
        .add_service(health_service)
        .add_service(service.into_server());
    let server = async move {
        match listener {
            Listener::Tcp(listener) => {
                let incoming =
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
                router
                    .serve_with_incoming_shutdown(incoming, drain_started)
                    .await
            }
            Listener::Unix(listener, _) => {
                let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
                router
                    .serve_with_incoming_shutdown(incoming, drain_started)
                    .await
            }
        }
    };
    let mut server = std::pin::pin!(server);
    tokio::select! {
        result = &mut server => return result.map_err(ServeError::from),
        () = shutdown => {}
    }
    // Drain: report NOT_SERVING (probes and new connections still get
    // answers), refuse new streams, let open ones send their batch in flight.
    tracing::info!(
        grace_seconds = grace.as_secs_f64(),
        open_streams = shutdown_handle.open_streams(),
        "shutting down: NOT_SERVING, draining open streams"
    );
    health_reporter
        .set_not_serving::<ShardfeedServer<ShardfeedService>>()
        .await;
    health_reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    shutdown_handle.drain.cancel();
    let deadline = tokio::time::Instant::now() + grace;
    while shutdown_handle.open_streams() > 0 && tokio::time::Instant::now() < deadline {
        tokio::select! {
            result = &mut server => return result.map_err(ServeError::from),
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    if shutdown_handle.open_streams() > 0 {
        tracing::warn!(
            open_streams = shutdown_handle.open_streams(),
            "grace period over; ending the streams still open"
        );
        shutdown_handle.abort.cancel();
    }
    // Let the final statuses reach the clients, then close connections.
    let _ = drain_tx.send(());
    match tokio::time::timeout(Duration::from_secs(2), &mut server).await {
        Ok(result) => result.map_err(ServeError::from),
        Err(_) => Ok(()),
    }
}

/// A server on a local listener, run in this process (demo, benchmarks).
pub struct LocalServer {
    pub addr: ListenAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), ServeError>>,
}

impl LocalServer {
    /// On an ephemeral loopback port, with a one-second drain: the in-process
    /// server the demo and the benchmarks stream through.
    pub async fn loopback(service: ShardfeedService) -> Result<Self, ServeError> {
        Self::start(
            service,
            &ListenAddr::Tcp(([127, 0, 0, 1], 0).into()),
            Duration::from_secs(1),
        )
        .await
    }

    pub async fn start(
        service: ShardfeedService,
        listen: &ListenAddr,
        grace: Duration,
    ) -> Result<Self, ServeError> {
        let listener = Listener::bind(listen).await?;
        let addr = listener.local_addr();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(
            listener,
            service,
            async move {
                let _ = stopped.await;
            },
            grace,
        ));
        Ok(Self {
            addr,
            stop: Some(stop),
            task,
        })
    }

    /// A client with message limits raised for whole batches.
    pub async fn client(
        &self,
    ) -> Result<
        pb::shardfeed_client::ShardfeedClient<tonic::transport::Channel>,
        tonic::transport::Error,
    > {
        Ok(
            pb::shardfeed_client::ShardfeedClient::new(connect(&self.addr).await?)
                .max_decoding_message_size(usize::MAX),
        )
    }

    /// Shuts down (draining) and waits for the server to finish.
    pub async fn stop(mut self) -> Result<(), ServeError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task)
            .await
            .map_err(|e| ServeError::Io(std::io::Error::other(e)))?
    }
}
