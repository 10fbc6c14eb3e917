//! `shardfeed pool-worker`: decodes the units sidecars send it.
//!
//! Stateless: it holds a unit only while decoding it. Bounded: at most
//! `max_units` units decoding and as many again waiting (a second's wait
//! for a slot; any more are refused at once), each at most
//! `max_unit_bytes` in and `max_unit_output_bytes` out, so a worker's peak
//! is about
//!
//! ```text
//! max_units * (2 * max_unit_bytes + max_unit_output_bytes) + decode scratch
//! ```
//!
//! and a unit past any bound is refused with a status that names the bound
//! (a sidecar then decodes it elsewhere). Authenticated before anything
//! is read: every call must carry the pool's token, and the sender's build
//! must be the worker's own; the [`Gate`] checks both, and takes the call's
//! admission place, on the headers alone, so a call without the token, or
//! one past the admitted units, costs the worker its headers and never its
//! body (tonic reads a unary call's whole message before the handler runs).
//! On SIGTERM it reports NOT_SERVING, refuses new units (UNAVAILABLE: the
//! sidecar re-issues them at once) and finishes the ones it holds.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use rayon::prelude::*;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::{Request, Response, Status};

use super::wire::{self, pb, SampleAnswer};
use crate::decode::{self, Decoder, SampleKey, ScratchBudget};
use crate::metrics::pool as pool_metrics;
use crate::net::bounds::{Http2Bounds, ListenerBounds, DEFAULT_FRAME_BYTES};
use crate::net::connections::{limit, ConnectionLimits, CountCallsLayer, Tracked};
use crate::net::handshake::{accept_tls, HandshakeLimits};
use crate::net::peers::limit_per_peer;
use crate::net::requests::{BoundRequestsLayer, RequestBounds};
use crate::net::tls::PoolTls;

pub const DEFAULT_MAX_UNIT_BYTES: usize = 32 << 20;
pub const DEFAULT_MAX_UNIT_OUTPUT_BYTES: usize = 32 << 20;
pub const DEFAULT_MAX_UNIT_SAMPLES: usize = 256;
/// Longest a unit waits for a free slot before it is refused as busy.
const SLOT_WAIT: Duration = Duration::from_secs(1);
/// Longest a worker lets the units it holds finish after SIGTERM.
pub const DEFAULT_DRAIN_GRACE: Duration = Duration::from_secs(20);

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub listen: SocketAddr,
    pub token: String,
    pub decode_threads: usize,
    /// Units decoded at once (others are refused as RESOURCE_EXHAUSTED).
    pub max_units: usize,
    pub max_unit_bytes: usize,
    pub max_unit_output_bytes: usize,
    pub max_unit_samples: usize,
    pub decode_scratch: u64,
    pub drain_grace: Duration,
    /// Connections held at once and the idle bound.
    pub connections: ConnectionLimits,
    /// TLS with client certificates (None: plain text, loopback or by
    /// choice).
    pub tls: Option<PoolTls>,
    /// A plain-text listener serving gRPC health alone, for the kubelet's
    /// probes (which speak no TLS): nothing else is served on it.
    pub health_listen: Option<SocketAddr>,
}

impl WorkerConfig {
    /// HTTP/2 streams a connection may hold open at once: the admitted
    /// units and a few health checks.
    pub fn max_concurrent_streams(&self) -> u32 {
        u32::try_from(2 * self.max_units.max(1))
            .unwrap_or(u32::MAX)
            .saturating_add(super::transport::WORKER_EXTRA_STREAMS)
    }

    /// The worker's HTTP/2 settings: a frame of HTTP/2's smallest size
    /// until a peer is known (a frame is buffered whole before its headers
    /// are read).
    pub fn http2(&self) -> Http2Bounds {
        Http2Bounds {
            streams: self.max_concurrent_streams(),
            header_list_bytes: super::transport::MAX_HEADER_LIST_BYTES,
            frame_bytes: super::transport::WORKER_MAX_FRAME_BYTES,
            local_error_resets: super::transport::MAX_LOCAL_ERROR_RESETS,
            pending_accept_resets: super::transport::MAX_PENDING_ACCEPT_RESETS,
        }
    }

    /// Every bound of the worker's listener, as published
    /// (`listener="pool-worker"`).
    pub fn bounds(&self) -> ListenerBounds {
        ListenerBounds {
            handshakes: self.tls.as_ref().map(|_| HandshakeLimits::DEFAULT.into()),
            http2: Some(self.http2()),
            requests: Some(self.request_bounds()),
            ..ListenerBounds::new("pool-worker", self.connections)
        }
    }

    /// A unit's request: whole within 30 s (an admitted unit holds one of
    /// `max_units` places, so a peer that never finishes one would keep it
    /// from every sidecar), at most `max_unit_bytes`, and the admitted
    /// units' bytes together (the formula's request term).
    pub fn request_bounds(&self) -> RequestBounds {
        // A message travels behind gRPC's 5-byte length prefix.
        let body = self.max_unit_bytes.saturating_add(5);
        RequestBounds {
            deadline: Duration::from_secs(30),
            max_body_bytes: body,
            in_flight_bytes: self.max_units.max(1).saturating_mul(body),
        }
    }

    /// The worker's peak memory by the formula above, scratch and the
    /// connections' HTTP/2 state included.
    pub fn memory_bound(&self) -> u64 {
        (self.max_units as u64) * (2 * self.max_unit_bytes + self.max_unit_output_bytes) as u64
            + self.decode_scratch
            + self.connections.memory_bound()
    }
}

/// What a worker has decoded so far (tests and benchmarks read it; the
/// process's metrics count the same).
#[derive(Debug, Default)]
pub struct WorkerStats {
    pub units: std::sync::atomic::AtomicU64,
    pub samples: std::sync::atomic::AtomicU64,
}

struct WorkerService {
    stats: Arc<WorkerStats>,
    decoder: Arc<dyn Decoder>,
    scratch: Arc<ScratchBudget>,
    pool: Arc<rayon::ThreadPool>,
    slots: Arc<Semaphore>,
    max_units: usize,
    max_unit_samples: usize,
    max_unit_output_bytes: usize,
}

/// What a call must show on its headers before its body is read: the
/// pool's token, the worker's build, a worker not draining, and a free
/// admission place (units decoding or waiting for a slot: twice the slots),
/// which it holds until its unit is answered.
#[derive(Clone)]
struct Gate {
    token: Arc<str>,
    identity: Arc<str>,
    admitted: Arc<Semaphore>,
    max_units: usize,
    draining: Arc<AtomicBool>,
}

/// A call's admission place, taken by the [`Gate`] and handed to the
/// handler in the request's extensions (which must be `Clone`).
#[derive(Clone)]
struct Admitted {
    _permit: Arc<OwnedSemaphorePermit>,
}

impl Interceptor for Gate {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        self.check(request.metadata())?;
        let Ok(permit) = self.admitted.clone().try_acquire_owned() else {
            pool_metrics::worker_unit("busy");
            return Err(Status::resource_exhausted(format!(
                "worker busy: {} units decoding and as many waiting (--max-units)",
                self.max_units
            )));
        };
        request.extensions_mut().insert(Admitted {
            _permit: Arc::new(permit),
        });
        Ok(request)
    }
}

impl Gate {
    /// The caller's token and build, and whether the worker still takes units.
    fn check(&self, metadata: &tonic::metadata::MetadataMap) -> Result<(), Status> {
        let presented = metadata
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        if !presented.is_some_and(|token| constant_time_eq(token.as_bytes(), self.token.as_bytes()))
        {
            pool_metrics::worker_unit("unauthenticated");
            return Err(Status::unauthenticated(
                "the pool's token is missing or wrong (sidecar --pool-token-file and worker \
                 --token-file must name the same secret)",
            ));
        }
        let build = metadata
            .get(wire::BUILD_HEADER)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("");
        if build != &*self.identity {
            pool_metrics::worker_unit("wrong_build");
            return Err(Status::failed_precondition(format!(
                "this worker runs {:?} but the sidecar runs {build:?}: pixels from another \
                 build may differ, so units go only to workers of the sidecar's own build \
                 (deploy the pool from the sidecar's image)",
                self.identity
            )));
        }
        if self.draining.load(Ordering::Acquire) {
            pool_metrics::worker_unit("draining");
            return Err(Status::unavailable("worker is draining (SIGTERM)"));
        }
        Ok(())
    }
}

impl WorkerService {
    fn check_unit(&self, unit: &pb::DecodeUnit) -> Result<wire::UnitOutput, Status> {
        check_unit(unit, self.max_unit_samples, self.max_unit_output_bytes).map_err(|error| {
            pool_metrics::worker_unit("invalid");
            Status::invalid_argument(error.to_string())
        })
    }
}

/// A unit's output, if the unit is one a worker of these bounds decodes:
/// its spec (or views) sound, 1 to `max_samples` samples whose outputs fit
/// `max_output_bytes`, every sample's format known.
pub(crate) fn check_unit(
    unit: &pb::DecodeUnit,
    max_samples: usize,
    max_output_bytes: usize,
) -> Result<wire::UnitOutput, wire::UnitError> {
    let output = wire::output_from_wire(unit)?;
    let samples = unit.samples.len();
    if samples == 0 || samples > max_samples {
        return Err(wire::UnitError {
            field: "samples",
            message: format!(
                "{samples} samples; a unit holds 1 to {max_samples} (worker --max-unit-samples)"
            ),
        });
    }
    let bytes = output.sample_bytes().saturating_mul(samples);
    if bytes > max_output_bytes {
        return Err(wire::UnitError {
            field: "samples",
            message: format!(
                "{samples} samples of {} output bytes each are {bytes} bytes, over the \
                 worker's --max-unit-output-bytes {max_output_bytes}",
                output.sample_bytes()
            ),
        });
    }
    for sample in &unit.samples {
        wire::format_from_wire(sample.format)?;
    }
    Ok(output)
}

#[tonic::async_trait]
impl pb::decode_pool_server::DecodePool for WorkerService {
    async fn decode(
        &self,
        mut request: Request<pb::DecodeUnit>,
    ) -> Result<Response<pb::DecodedUnit>, Status> {
        // Taken by the gate on the headers; held until the unit is answered.
        let Some(_admitted) = request.extensions_mut().remove::<Admitted>() else {
            return Err(Status::internal("a unit reached the worker past its gate"));
        };
        // A unit waits briefly for a slot (the sidecar's units in flight
        // are about what the worker has slots for), then goes elsewhere.
        let Ok(Ok(permit)) =
            tokio::time::timeout(SLOT_WAIT, self.slots.clone().acquire_owned()).await
        else {
            pool_metrics::worker_unit("busy");
            return Err(Status::resource_exhausted(format!(
                "worker busy: {} units decoding (--max-units) for {} ms",
                self.max_units,
                SLOT_WAIT.as_millis()
            )));
        };
        let unit = request.into_inner();
        let output = self.check_unit(&unit)?;
        let started = Instant::now();
        let busy = pool_metrics::WorkerBusy::enter(self.max_units);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (decoder, scratch) = (self.decoder.clone(), self.scratch.clone());
        self.pool.spawn(move || {
            // A unit whose sender has gone (answered by a hedge, or given
            // back to local decode) is not worth a slot's time.
            let answer = decode_unit(&*decoder, &scratch, &output, &unit, &|| tx.is_closed());
            let _ = tx.send(answer);
            drop(permit);
        });
        let answer = rx
            .await
            .map_err(|_| Status::internal("the decode thread dropped its unit"))?;
        drop(busy);
        pool_metrics::worker_unit("decoded");
        pool_metrics::worker_samples(answer.results.len() as u64);
        self.stats.units.fetch_add(1, Ordering::Relaxed);
        self.stats
            .samples
            .fetch_add(answer.results.len() as u64, Ordering::Relaxed);
        pool_metrics::worker_unit_time(started.elapsed());
        Ok(Response::new(answer))
    }
}

/// Decodes every sample of `unit` into one buffer, as a local stream would
/// (each sample once, however many views it has).
pub(crate) fn decode_unit(
    decoder: &dyn Decoder,
    scratch: &ScratchBudget,
    output: &wire::UnitOutput,
    unit: &pb::DecodeUnit,
    abandoned: &(dyn Fn() -> bool + Sync),
) -> pb::DecodedUnit {
    let sample_bytes = output.sample_bytes();
    let mut pixels = vec![0u8; sample_bytes * unit.samples.len()];
    let answers: Vec<SampleAnswer> = pixels
        .par_chunks_mut(sample_bytes)
        .zip(unit.samples.par_iter())
        .map(|(out, sample)| {
            if abandoned() {
                return SampleAnswer::Failed {
                    reason: "abandoned".into(),
                    message: "the sender no longer waits for this unit".into(),
                };
            }
            let format = match wire::format_from_wire(sample.format) {
                Ok(format) => format,
                Err(error) => {
                    return SampleAnswer::Failed {
                        reason: "format".into(),
                        message: error.to_string(),
                    }
                }
            };
            let key = SampleKey {
                seed: sample.seed,
                epoch: sample.epoch,
                sample: sample.sample,
                copy: sample.copy,
            };
            let decoded = match output {
                wire::UnitOutput::One(spec) => {
                    decode::decode_bounded(decoder, scratch, format, &sample.data, spec, &key, out)
                        .map(SampleAnswer::Decoded)
                }
                wire::UnitOutput::Views(views) => {
                    let mut outs = views_outputs(views, out);
                    decode::decode_views_bounded(
                        decoder,
                        scratch,
                        format,
                        &sample.data,
                        views,
                        &key,
                        &mut outs,
                    )
                    .map(|plan| SampleAnswer::DecodedViews(plan.boxes))
                }
            };
            match decoded {
                Ok(answer) => answer,
                Err(error) => {
                    out.fill(0);
                    SampleAnswer::Failed {
                        reason: error.reason().into(),
                        message: error.to_string(),
                    }
                }
            }
        })
        .collect();
    pb::DecodedUnit {
        unit_id: unit.unit_id,
        pixels: Bytes::from(pixels),
        results: answers.iter().map(wire::answer_to_wire).collect(),
    }
}

/// One sample's bytes in a unit's answer cut into its views' outputs, one
/// after another in the views' order.
fn views_outputs<'o>(views: &decode::Views, mut out: &'o mut [u8]) -> Vec<&'o mut [u8]> {
    views
        .specs()
        .map(|spec| {
            let (view, rest) = std::mem::take(&mut out).split_at_mut(spec.bytes());
            out = rest;
            view
        })
        .collect()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("starting the decode threads: {0}")]
    Threads(String),
    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),
    #[error("the pool's TLS files: {0}")]
    Tls(#[from] crate::net::tls::TlsError),
}

/// A worker bound to its address: the port is known before it serves.
pub struct BoundWorker {
    stats: Arc<WorkerStats>,
    listener: tokio::net::TcpListener,
    health_listener: Option<tokio::net::TcpListener>,
    config: WorkerConfig,
    decoder: Arc<dyn Decoder>,
}

impl BoundWorker {
    pub async fn bind(config: WorkerConfig) -> Result<Self, WorkerError> {
        Self::bind_with_decoder(config, decode::default_decoder()).await
    }

    pub async fn bind_with_decoder(
        config: WorkerConfig,
        decoder: Arc<dyn Decoder>,
    ) -> Result<Self, WorkerError> {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| WorkerError::Bind {
                addr: config.listen,
                source,
            })?;
        let health_listener = match config.health_listen {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| WorkerError::Bind { addr, source })?,
            ),
            None => None,
        };
        Ok(Self {
            stats: Arc::default(),
            listener,
            health_listener,
            config,
            decoder,
        })
    }

    /// What this worker decodes, as it goes.
    pub fn stats(&self) -> Arc<WorkerStats> {
        self.stats.clone()
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(self.config.listen)
    }

    /// Where the plain-text health listener took its port, if there is one.
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.health_listener
            .as_ref()
            .and_then(|listener| listener.local_addr().ok())
    }

    /// Serves until `shutdown` resolves, then drains (see the module doc).
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), WorkerError> {
        let config = self.config;
        let pool = decode::decode_thread_pool(config.decode_threads, "shardfeed-pool-decode")
            .map_err(|e| WorkerError::Threads(e.to_string()))?;
        let draining = Arc::new(AtomicBool::new(false));
        let slots = Arc::new(Semaphore::new(config.max_units.max(1)));
        let gate = Gate {
            token: config.token.as_str().into(),
            identity: wire::build_identity(self.decoder.name()).into(),
            admitted: Arc::new(Semaphore::new(2 * config.max_units.max(1))),
            max_units: config.max_units.max(1),
            draining: draining.clone(),
        };
        let service = WorkerService {
            stats: self.stats,
            decoder: self.decoder,
            scratch: Arc::new(ScratchBudget::new(config.decode_scratch)),
            pool: Arc::new(pool),
            slots: slots.clone(),
            max_units: config.max_units.max(1),
            max_unit_samples: config.max_unit_samples,
            max_unit_output_bytes: config.max_unit_output_bytes,
        };
        tracing::info!(
            listen = %self.listener.local_addr().map_or_else(|_| config.listen.to_string(), |a| a.to_string()),
            build = %gate.identity,
            decode_threads = config.decode_threads,
            max_units = config.max_units,
            memory_bound_mib = config.memory_bound() >> 20,
            "pool worker serving"
        );
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_serving::<pb::decode_pool_server::DecodePoolServer<WorkerService>>()
            .await;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let _health_server = self
            .health_listener
            .map(|listener| serve_health(listener, health_service.clone()));
        let incoming = incoming(self.listener, &config)?;
        let server = config
            .http2()
            .configure(tonic::transport::Server::builder())
            .layer(CountCallsLayer)
            .layer(BoundRequestsLayer::new(config.request_bounds()))
            .tcp_nodelay(true)
            .initial_stream_window_size(super::transport::STREAM_WINDOW_BYTES)
            .initial_connection_window_size(super::transport::CONNECTION_WINDOW_BYTES)
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(20)))
            .add_service(health_service)
            .add_service(InterceptedService::new(
                pb::decode_pool_server::DecodePoolServer::new(service)
                    .max_decoding_message_size(config.request_bounds().max_message_bytes())
                    .max_encoding_message_size(config.max_unit_output_bytes + (1 << 20)),
                gate,
            ))
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stop_rx.await;
            });
        let mut server = std::pin::pin!(server);
        tokio::select! {
            result = &mut server => return result.map_err(WorkerError::from),
            () = shutdown => {}
        }
        tracing::info!("pool worker draining: NOT_SERVING, refusing new units");
        draining.store(true, Ordering::Release);
        health
            .set_not_serving::<pb::decode_pool_server::DecodePoolServer<WorkerService>>()
            .await;
        health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        // Every unit decoding holds a slot: all of them back means none is left.
        let all = u32::try_from(config.max_units.max(1)).unwrap_or(u32::MAX);
        if tokio::time::timeout(config.drain_grace, slots.acquire_many(all))
            .await
            .is_err()
        {
            tracing::warn!("drain grace over with units still decoding");
        }
        let _ = stop_tx.send(());
        let _ = tokio::time::timeout(Duration::from_secs(2), &mut server).await;
        tracing::info!("pool worker stopped");
        Ok(())
    }
}

/// The worker's health listener, apart from its units' (the kubelet's
/// probes are never queued behind units), served while the task is held.
fn serve_health(
    listener: tokio::net::TcpListener,
    health_service: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
) -> AbortOnDrop {
    HEALTH_BOUNDS.publish();
    AbortOnDrop(tokio::spawn(async move {
        let served = HEALTH_HTTP2
            .configure(tonic::transport::Server::builder())
            .layer(CountCallsLayer)
            .layer(BoundRequestsLayer::new(HEALTH_REQUESTS))
            .add_service(health_service)
            .serve_with_incoming(limit(
                limit_per_peer(
                    tonic::transport::server::TcpIncoming::from(listener),
                    HEALTH_PER_PEER,
                    HEALTH_BOUNDS.name,
                ),
                HEALTH_CONNECTION_LIMITS,
                HEALTH_BOUNDS.name,
            ))
            .await;
        if let Err(error) = served {
            tracing::error!(%error, "the pool worker's health listener failed");
        }
    }))
}

/// The units' connections, held to the listener's places; under TLS a
/// connection shakes hands before it takes a place.
fn incoming(
    listener: tokio::net::TcpListener,
    config: &WorkerConfig,
) -> Result<ConnectionStream, WorkerError> {
    let bounds = config.bounds();
    bounds.publish();
    let tcp = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    Ok(match &config.tls {
        Some(tls) => Box::pin(limit(
            accept_tls(tcp, tls.server_acceptor()?, HandshakeLimits::DEFAULT)
                .map(|tls| tls.map(|tls| Box::new(tls) as Box<dyn Connection>)),
            config.connections,
            bounds.name,
        )),
        None => Box::pin(limit(
            tcp.map(|tcp| tcp.map(|tcp| Box::new(tcp) as Box<dyn Connection>)),
            config.connections,
            bounds.name,
        )),
    })
}

/// The health listener's bounds: the kubelet probes every few seconds.
const HEALTH_CONNECTION_LIMITS: ConnectionLimits = ConnectionLimits {
    max_connections: 64,
    idle: Duration::from_secs(60),
};

/// A worker's connection, plain or TLS.
trait Connection: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Connection for T {}

type ConnectionStream = std::pin::Pin<
    Box<dyn futures::Stream<Item = std::io::Result<Tracked<Box<dyn Connection>>>> + Send>,
>;

/// A probe's stream and headers are gRPC health's: a few of each.
const HEALTH_HTTP2: Http2Bounds = Http2Bounds {
    streams: 8,
    header_list_bytes: super::transport::MAX_HEADER_LIST_BYTES,
    frame_bytes: DEFAULT_FRAME_BYTES,
    local_error_resets: super::transport::MAX_LOCAL_ERROR_RESETS,
    pending_accept_resets: super::transport::MAX_PENDING_ACCEPT_RESETS,
};

/// Connections one address may hold on the health listener: the kubelet
/// runs a few probes at once; every pod may reach the listener, and one
/// holding all 64 places would have the kubelet restart the worker.
const HEALTH_PER_PEER: usize = 8;

/// The health listener's bounds, as published.
const HEALTH_BOUNDS: ListenerBounds = ListenerBounds {
    per_peer: Some(HEALTH_PER_PEER),
    http2: Some(HEALTH_HTTP2),
    requests: Some(HEALTH_REQUESTS),
    ..ListenerBounds::new("pool-worker-health", HEALTH_CONNECTION_LIMITS)
};

/// A probe's request is a service name: a few bytes, sent at once.
const HEALTH_REQUESTS: RequestBounds = RequestBounds {
    deadline: Duration::from_secs(5),
    max_body_bytes: 4 << 10,
    in_flight_bytes: 256 << 10,
};

/// Stops the health listener with the worker.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Binds `config.listen` and serves until `shutdown` resolves.
pub async fn serve_worker(
    config: WorkerConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), WorkerError> {
    BoundWorker::bind(config).await?.serve(shutdown).await
}
