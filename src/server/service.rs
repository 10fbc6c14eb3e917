//! The `shardfeed.v1.Shardfeed` service: has requests checked and translated
//! into the engine's types (`request.rs`, `mix.rs`), admits streams (`--allow`, `--max-streams`, drain),
//! and turns the engine's batches into protobuf messages with stall
//! accounting. No plan, pipeline or cache logic lives here.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use futures::Stream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status};

use super::limits::{DEFAULT_BATCH_SIZE, DEFAULT_MAX_STREAMS, MAX_MESSAGE_BYTES};
use super::pb;
use super::pb::shardfeed_server::{Shardfeed, ShardfeedServer};
use super::request::partition;
pub use super::request::stream_request;
use super::shm::RingRegistry;
use super::status::{self, ServiceError};
use super::views::StreamViews;
use crate::decode::{self, OutputSpec};
pub use crate::engine::EngineDropped;
use crate::engine::{Engine, StreamGeometry};
use crate::metrics::{self, ActiveStream, StreamMetrics};
use crate::pipeline::shm::ShmError;
use crate::pipeline::{encoded, BatchReceiver, DecodedBatch, PipelineError};
use crate::plan::{EpochPosition, Phase};

/// Settings of the service itself (the engine has its own).
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub max_streams: usize,
    /// Dataset URI prefixes that may be requested; empty allows any.
    pub allow: Vec<String>,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            max_streams: DEFAULT_MAX_STREAMS,
            allow: Vec::new(),
        }
    }
}

#[derive(Debug)]
pub struct ShardfeedService {
    engine: EngineSlot,
    config: ServiceConfig,
    streams: Arc<Semaphore>,
    lifecycle: Lifecycle,
    /// Shared-memory rings, when serving on a Unix socket.
    rings: Option<Arc<RingRegistry>>,
    /// Resolves once the engine is dropped (taken before it can be released).
    engine_dropped: EngineDropped,
}

/// Lets `serve` start and drain the service: requests are refused until
/// `started` (the disk cache is open), `drain` makes streams end after the
/// batch in flight, `abort` ends them at once (grace period over), and
/// `open` tracks the streams still open: each holds a token until dropped.
#[derive(Debug, Clone)]
pub struct Lifecycle {
    pub(super) started: CancellationToken,
    pub(super) drain: CancellationToken,
    pub(super) abort: CancellationToken,
    pub(super) open: TaskTracker,
    /// Released when `serve` ends (see [`EngineSlot`]).
    pub(super) engine: EngineSlot,
}

/// The service's engine, let go of when `serve` ends: a connection a
/// client keeps open holds the service, but not the registry, caches and
/// decode pool behind it. Requests after that are refused as draining.
#[derive(Debug, Clone)]
pub struct EngineSlot(Arc<std::sync::Mutex<Option<Arc<Engine>>>>);

impl EngineSlot {
    fn get(&self) -> Result<Arc<Engine>, ServiceError> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .ok_or(ServiceError::Draining)
    }

    pub(super) fn release(&self) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
    }
}

impl Lifecycle {
    pub fn open_streams(&self) -> usize {
        self.open.len()
    }
}

impl ShardfeedService {
    pub fn new(engine: Engine, config: ServiceConfig) -> Self {
        let engine_dropped = engine.dropped();
        let engine = EngineSlot(Arc::new(std::sync::Mutex::new(Some(Arc::new(engine)))));
        Self {
            engine_dropped,
            engine: engine.clone(),
            streams: Arc::new(Semaphore::new(config.max_streams)),
            lifecycle: Lifecycle {
                started: CancellationToken::new(),
                drain: CancellationToken::new(),
                abort: CancellationToken::new(),
                open: TaskTracker::new(),
                engine,
            },
            config,
            rings: None,
        }
    }

    /// Serves shared-memory rings for streams that ask (see
    /// [`super::shm`]); set by `serve` on a Unix socket.
    pub fn with_shared_memory(mut self, rings: Arc<RingRegistry>) -> Self {
        self.rings = Some(rings);
        self
    }

    /// Resolves once the service's engine is dropped (see [`LocalServer::stop`]).
    ///
    /// [`LocalServer::stop`]: super::LocalServer::stop
    pub fn engine_dropped(&self) -> EngineDropped {
        self.engine_dropped.clone()
    }

    pub fn lifecycle(&self) -> Lifecycle {
        self.lifecycle.clone()
    }

    /// Refuses requests before the server has started or while it drains.
    fn check_serving(&self) -> Result<(), ServiceError> {
        if !self.lifecycle.started.is_cancelled() {
            return Err(ServiceError::Starting);
        }
        if self.lifecycle.drain.is_cancelled() {
            return Err(ServiceError::Draining);
        }
        Ok(())
    }

    pub fn into_server(self) -> ShardfeedServer<Self> {
        ShardfeedServer::new(self)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
            // The listener's bound (published as
            // `shardfeed_listener_bound{bound="request_bytes"}`), less the
            // prefix: the listener refuses a larger claim on the prefix,
            // counted, before tonic reads it.
            .max_decoding_message_size(super::limits::REQUESTS.max_message_bytes())
    }

    /// Whether `--allow` admits `dataset`; a local folder comes back held
    /// open, to be kept until the request has opened its store.
    fn check_allowed(
        &self,
        dataset: &str,
    ) -> Result<Option<Arc<crate::store::beneath::Beneath>>, ServiceError> {
        super::allow::check(&self.config.allow, dataset)
    }

    async fn start_stream(
        &self,
        request: pb::StreamBatchesRequest,
    ) -> Result<BatchStream, ServiceError> {
        self.check_serving()?;
        let wants_shared = request.transport == pb::Transport::SharedMemory as i32;
        let engine = self.engine.get()?;
        let mut request = stream_request(&request, engine.config().default_shuffle)?;
        // Held until the stream has opened its stores (below).
        let mut _checked_folders = Vec::new();
        for (dataset, _) in request.each_source() {
            _checked_folders.push(self.check_allowed(dataset)?);
        }
        // Over TCP there is no socket to hand a memfd through: inline.
        request.output.shared_memory = wants_shared
            .then(|| self.rings.as_ref().map(|rings| rings.fd_socket.clone()))
            .flatten();
        let permit = self.admit()?;
        let stream = engine.open_stream(request).await?;
        let ring = match (&stream.ring, &self.rings) {
            (Some(ring), Some(rings)) => {
                rings.register(ring);
                Some((rings.clone(), ring.clone()))
            }
            _ => None,
        };
        Ok(BatchStream {
            receiver: stream.batches,
            shape: stream.shape,
            output: stream.output,
            views: stream.views.map(StreamViews::new),
            field_names: stream.field_names,
            epoch: stream.epoch,
            metrics: stream.metrics,
            waiting_since: None,
            next_index: stream.first_index,
            drain: Box::pin(self.lifecycle.drain.clone().cancelled_owned()),
            abort: Box::pin(self.lifecycle.abort.clone().cancelled_owned()),
            state: StreamState::Sending,
            dataset_identity: stream.dataset_identity,
            ring,
            sent_shared: false,
            span: stream.span,
            _active: ActiveStream::open(),
            _open: self.lifecycle.open.token(),
            _permit: permit,
            _memory: stream.reservation,
        })
    }
}

impl ShardfeedService {
    /// A stream slot (`--max-streams`), or why not.
    fn admit(&self) -> Result<OwnedSemaphorePermit, ServiceError> {
        self.streams
            .clone()
            .try_acquire_owned()
            .map_err(|_| ServiceError::TooManyStreams(self.config.max_streams))
    }
}

/// The response stream of one `StreamBatches` call.
pub struct BatchStream {
    receiver: BatchReceiver,
    /// Where its batches fall in the epoch (and, mixed, its sources).
    shape: StreamGeometry,
    output: OutputSpec,
    views: Option<StreamViews>,
    /// The request's `layout.fields`, which name the batches' fields.
    field_names: Vec<String>,
    epoch: u64,
    metrics: StreamMetrics,
    /// Set when the client asked for a batch that was not ready.
    waiting_since: Option<Instant>,
    /// Index of the next batch to send (for the resume hint on drain).
    next_index: u64,
    drain: Pin<Box<WaitForCancellationFutureOwned>>,
    abort: Pin<Box<WaitForCancellationFutureOwned>>,
    state: StreamState,
    /// The dataset index's identity, carried by every position sent.
    dataset_identity: String,
    /// The stream's registered ring, forgotten if the stream ends early.
    ring: Option<(Arc<RingRegistry>, Arc<crate::pipeline::shm::Ring>)>,
    /// A shared batch was sent: the stream may end only once its client
    /// has collected the ring, so that a stream that completes is one whose
    /// ring needs no keeping for a client still to come.
    sent_shared: bool,
    span: tracing::Span,
    _active: ActiveStream,
    /// Shutdown waits until every stream has dropped this.
    _open: TaskTrackerToken,
    _permit: OwnedSemaphorePermit,
    _memory: Arc<crate::engine::budget::Reservation>,
}

/// Where a `StreamBatches` response stands.
enum StreamState {
    /// Sending batches as they are ready.
    Sending,
    /// Shutdown began: send the batch in flight (`sent`: it has been),
    /// then end with UNAVAILABLE. A batch that waits on the client (every
    /// ring slot lent) is not in flight: a trainer may hold its batches
    /// until the sidecar has gone.
    Draining { sent: bool },
    /// Every batch was sent; the stream ends once its client has collected
    /// the ring (false: it never did).
    Collecting(Pin<Box<dyn Future<Output = Result<(), ShmError>> + Send>>),
    /// Ended; `completed`: every batch was sent (and its ring collected),
    /// so the ring is kept for a client still to come for it.
    Ended { completed: bool },
}

impl BatchStream {
    fn to_message(&self, batch: DecodedBatch) -> pb::Batch {
        let views = self
            .views
            .as_ref()
            .map_or_else(Vec::new, |views| views.to_wire(&batch));
        let position = self.shape.position_after(batch.index);
        let (sample_sources, sample_source_epochs) = if self.shape.is_mixed() {
            self.shape.count_samples(&batch.sources);
            (batch.sources, batch.source_epochs)
        } else {
            Default::default()
        };
        // A stream of views has no one output size: each group says its own.
        let (height, width) = match self.views {
            Some(_) => (0, 0),
            None => (self.output.height, self.output.width),
        };
        let (images, shared) = super::shm::images_to_wire(batch.images, batch.image_bytes);
        pb::Batch {
            epoch: self.epoch,
            index: batch.index,
            shape: Some(pb::Shape {
                n: batch.size as u32,
                height,
                width,
                channels: decode::CHANNELS as u32,
            }),
            views,
            images,
            shared,
            labels: batch.labels,
            keys: batch.keys,
            substituted: batch.substituted.iter().map(|s| s.slot).collect(),
            substitute_sources: batch
                .substituted
                .iter()
                .map(|s| s.source.map_or(-1, |slot| slot as i32))
                .collect(),
            substitution_reasons: batch.substituted.into_iter().map(|s| s.reason).collect(),
            position: Some(position_message(
                &position,
                &self.shape.before_epoch,
                &self.dataset_identity,
            )),
            global_samples: self.shape.global_samples_after(batch.index),
            epoch_steps: self.shape.steps,
            sample_sources,
            sample_source_epochs,
            shards: batch.shards,
            padded: batch.padded,
            copies: batch.copies,
            crops: batch.crops.iter().map(|crop| crop.to_wire()).collect(),
            fields: self
                .field_names
                .iter()
                .zip(batch.fields)
                .map(|(name, values)| pb::FieldValues {
                    name: name.clone(),
                    missing: (0..values.len() as u32)
                        .filter(|&slot| values[slot as usize].is_none())
                        .collect(),
                    values: values.into_iter().map(Option::unwrap_or_default).collect(),
                })
                .collect(),
            encoded: super::delivery::placements_to_wire(&batch.encoded),
            server_decode_settled: batch.search.map(|search| search.center),
            server_decode_search: batch.search.as_ref().map(super::delivery::search_to_wire),
            // A client that decodes reads the resize's interpolation here
            // too, so a bicubic stream says so even with nothing random.
            augmentation: (self.views.is_none()
                && (self.output.is_random()
                    || self.output.resample != crate::decode::Resample::Bilinear))
                .then(|| self.output.augmentation_to_wire()),
        }
    }
}

pub fn position_message(
    position: &EpochPosition,
    before_epoch: &[Phase],
    dataset: &str,
) -> pb::EpochPosition {
    let segments = |phases: &[Phase]| {
        phases
            .iter()
            .map(|s| pb::PositionSegment {
                world_size: s.world_size,
                batches: s.batches,
            })
            .collect()
    };
    pb::EpochPosition {
        dataset: dataset.to_string(),
        segments: segments(&position.phases),
        before_epoch: segments(before_epoch),
    }
}

impl BatchStream {
    /// No batch can be made until the client gives a slot back.
    fn waits_on_client(&self) -> bool {
        self.ring
            .as_ref()
            .is_some_and(|(_, ring)| ring.lent() == ring.slot_count())
    }

    fn drained_status(&mut self) -> Status {
        self.state = StreamState::Ended { completed: false };
        let _entered = self.span.enter();
        tracing::info!(next_batch = self.next_index, "stream ended by shutdown");
        metrics::request("StreamBatches", tonic::Code::Unavailable);
        self.ended(
            tonic::Code::Unavailable,
            "shardfeed is shutting down",
            status::REASON_DRAINING,
        )
    }

    /// The status that ends this stream before its last batch, with where
    /// to resume (right after the last batch sent) in its details.
    fn ended(&self, code: tonic::Code, message: &str, reason: &str) -> Status {
        let position = self
            .shape
            .base_position
            .advanced(self.shape.world_size, self.next_index);
        let resume = status::ResumePoint {
            start_batch: self.next_index,
            epoch: self.epoch,
            position: &position,
            before_epoch: &self.shape.before_epoch,
            dataset: &self.dataset_identity,
        };
        let retry_after = (code == tonic::Code::Unavailable).then_some(status::RETRY_AFTER_RESTART);
        status::stream_ended(code, message, reason, &resume, retry_after)
    }
}

impl BatchStream {
    /// The end of a stream whose every batch was sent: at once, or, if it
    /// sent shared batches, once the client has collected the ring (an
    /// error status if it never did).
    fn poll_end(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<pb::Batch, Status>>> {
        if !matches!(self.state, StreamState::Collecting(_)) {
            match self.ring.as_ref().filter(|_| self.sent_shared) {
                Some((rings, ring)) => {
                    self.state = StreamState::Collecting(Box::pin(
                        ring.clone().wait_collected(rings.fd_socket.clone()),
                    ))
                }
                None => return self.completed(),
            }
        }
        let StreamState::Collecting(waiting) = &mut self.state else {
            unreachable!("set above")
        };
        let error = match ready!(waiting.as_mut().poll(cx)) {
            Ok(()) => return self.completed(),
            Err(error) => error,
        };
        self.state = StreamState::Ended { completed: false };
        let code = match error {
            ShmError::Refused { .. } => tonic::Code::ResourceExhausted,
            _ => tonic::Code::FailedPrecondition,
        };
        metrics::request("StreamBatches", code);
        Poll::Ready(Some(Err(Status::new(code, error.to_string()))))
    }

    fn completed(&mut self) -> Poll<Option<Result<pb::Batch, Status>>> {
        self.state = StreamState::Ended { completed: true };
        metrics::request("StreamBatches", tonic::Code::Ok);
        Poll::Ready(None)
    }
}

impl Drop for BatchStream {
    fn drop(&mut self) {
        // Cancelled or failed: the ring (and the memory it holds) is not
        // kept for a client that will not come for it.
        let completed = matches!(self.state, StreamState::Ended { completed: true });
        if let (false, Some((rings, ring))) = (completed, &self.ring) {
            rings.forget_uncollected(&ring.token());
        }
    }
}

impl Stream for BatchStream {
    type Item = Result<pb::Batch, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let StreamState::Ended { .. } = self.state {
            return Poll::Ready(None);
        }
        if self.abort.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(self.drained_status())));
        }
        if let StreamState::Collecting(_) = self.state {
            return self.poll_end(cx);
        }
        if matches!(self.state, StreamState::Sending) && self.drain.as_mut().poll(cx).is_ready() {
            self.state = StreamState::Draining { sent: false };
        }
        let draining = match self.state {
            StreamState::Draining { sent: true } => {
                // The batch that was in flight when draining began has been sent.
                return Poll::Ready(Some(Err(self.drained_status())));
            }
            StreamState::Draining { sent: false } => true,
            _ => false,
        };
        match self.receiver.poll_recv(cx) {
            Poll::Pending if draining && self.waits_on_client() => {
                Poll::Ready(Some(Err(self.drained_status())))
            }
            Poll::Pending => {
                self.waiting_since.get_or_insert_with(Instant::now);
                Poll::Pending
            }
            Poll::Ready(None) => self.poll_end(cx),
            Poll::Ready(Some(Err(error))) => {
                self.state = StreamState::Ended { completed: false };
                let left = matches!(error, PipelineError::ClientLeft);
                let error = ServiceError::from(error);
                let _entered = self.span.enter();
                if left {
                    // A trainer that stopped reading (an abandoned iterator).
                    tracing::info!(next_batch = self.next_index, "the client left the stream");
                } else {
                    tracing::error!(%error, next_batch = self.next_index, "stream failed");
                }
                let code = error.code();
                metrics::request("StreamBatches", code);
                // Every batch before this one was delivered: say where to resume.
                Poll::Ready(Some(Err(self.ended(
                    code,
                    &error.to_string(),
                    status::REASON_STREAM_FAILED,
                ))))
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
                self.sent_shared |= message.shared.is_some();
                // While draining, this was the batch in flight: end after it.
                if draining {
                    self.state = StreamState::Draining { sent: true };
                }
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
            self.check_serving()?;
            let _checked_folder = self.check_allowed(&request.dataset)?;
            let engine = self.engine.get()?;
            let summary = engine
                .describe(
                    &request.dataset,
                    world_size,
                    batch_size,
                    partition,
                    request.repeats.max(1),
                )
                .await?;
            Ok::<_, ServiceError>(pb::DescribeResponse {
                shards: summary.shards,
                samples: summary.samples,
                batches_per_rank: summary.counts.steps,
                dropped_per_epoch: summary.counts.dropped,
                padded_per_epoch: summary.counts.padded,
                total_bytes: summary.total_bytes,
                decoder: engine.decoder_name().to_string(),
                classes: summary.classes,
                augmentation_ops: crate::decode::Ops::NAMES
                    .iter()
                    .map(|name| name.to_string())
                    .collect(),
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

    async fn report_client_decodes(
        &self,
        request: Request<pb::ClientDecodeReport>,
    ) -> Result<Response<pb::ClientDecodeReportResponse>, Status> {
        let report = request.into_inner();
        if report.failures.len() > MAX_REPORTED_FAILURES {
            let error = ServiceError::invalid(
                "failures",
                format!(
                "a report names {} failures; at most {MAX_REPORTED_FAILURES} (report more often)",
                report.failures.len()
            ),
            );
            metrics::request("ReportClientDecodes", error.code());
            return Err(error.into());
        }
        // Every part checked before any is taken: a refused report
        // changes nothing.
        if let Some(waits) = &report.loop_waits {
            if let Err(bad) =
                encoded::loop_waits::check(waits.waited_seconds, waits.stepped_seconds)
            {
                let error = ServiceError::invalid("loop_waits", bad.to_string());
                metrics::request("ReportClientDecodes", error.code());
                return Err(error.into());
            }
        }
        let reported = report.decoded.saturating_add(report.failures.len() as u64);
        if let Err(left) = metrics::take_client_reports(reported) {
            let error = ServiceError::invalid(
                "decoded",
                format!(
                    "decoded + failures: the report counts {reported} samples; {left} samples \
                 were sent compressed and not yet reported"
                ),
            );
            metrics::request("ReportClientDecodes", error.code());
            return Err(error.into());
        }
        metrics::client_decodes(report.decoded);
        if let Some(waits) = &report.loop_waits {
            // A loop's totals for its stream's share search; a stream that
            // ended hears nothing, which is no error (reports race its end).
            let _ = encoded::loop_waits::report(
                waits.loop_id,
                waits.waited_seconds,
                waits.stepped_seconds,
                waits.steps,
            );
        }
        let mut unlogged = 0usize;
        for failure in &report.failures {
            metrics::substituted("client_decode");
            if !CLIENT_FAILURE_LOG.take() {
                unlogged += 1;
                continue;
            }
            tracing::warn!(
                rank = report.rank,
                shard = %bounded(&failure.shard),
                key = %bounded(&failure.key),
                error = %bounded(&failure.reason),
                "the client substituted a sample it could not decode"
            );
        }
        if unlogged > 0 && CLIENT_FAILURE_LOG.summary_due() {
            tracing::warn!(
                rank = report.rank,
                unlogged,
                "clients substituted more samples than are logged one by one \
                 (shardfeed_substituted_samples_total{{reason=\"client_decode\"}} counts all)"
            );
        }
        metrics::request("ReportClientDecodes", tonic::Code::Ok);
        Ok(Response::new(pb::ClientDecodeReportResponse {}))
    }
}

/// Failures one `ReportClientDecodes` may name: a few batches' worth.
const MAX_REPORTED_FAILURES: usize = 4096;

/// Client-reported failures logged one by one: at most this many a minute,
/// whatever clients send (the counter counts every one).
const CLIENT_FAILURE_LINES_PER_MINUTE: u32 = 100;

static CLIENT_FAILURE_LOG: LogBudget = LogBudget::new(CLIENT_FAILURE_LINES_PER_MINUTE);

/// Log lines a minute, shared by every caller.
struct LogBudget {
    per_minute: u32,
    /// (the minute's start, lines logged in it, whether its summary was logged)
    window: std::sync::Mutex<Option<(std::time::Instant, u32, bool)>>,
}

impl LogBudget {
    const fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            window: std::sync::Mutex::new(None),
        }
    }

    fn with_window<T>(&self, f: impl FnOnce(&mut (std::time::Instant, u32, bool)) -> T) -> T {
        let mut window = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        let current = window.get_or_insert((now, 0, false));
        if now.duration_since(current.0) >= std::time::Duration::from_secs(60) {
            *current = (now, 0, false);
        }
        f(current)
    }

    /// Whether one more line may be logged this minute.
    fn take(&self) -> bool {
        self.with_window(|(_, lines, _)| {
            *lines += 1;
            *lines <= self.per_minute
        })
    }

    /// Whether this minute's one summary of lines not logged is still due.
    fn summary_due(&self) -> bool {
        self.with_window(|(_, _, summarized)| !std::mem::replace(summarized, true))
    }
}

/// A client's text as logged: at most 512 bytes of it.
fn bounded(text: &str) -> &str {
    let mut end = text.len().min(512);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
