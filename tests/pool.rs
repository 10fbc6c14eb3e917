//! The decode pool in process: a sidecar and workers on 127.0.0.x. Batches
//! are byte-identical whoever decoded their samples (the pool, several of
//! its workers, a hedge, or local decode after a refusal or a drain), and
//! no sample arrives twice.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use common::*;
use shardfeed::decode::{self, CropBox, Decoder, OutputSpec};
use shardfeed::pool::client::UnitCounts;
use shardfeed::pool::worker::{BoundWorker, WorkerStats};
use shardfeed::pool::{PoolClient, PoolConfig, PoolShareSetting, WorkerConfig};
use shardfeed::server::pb;
use shardfeed::shard::ImageFormat;

const TOKEN: &str = "pool-test-token";

/// The photos, one of them corrupt (decoded locally wherever it is sent).
fn photos() -> Vec<Vec<Sample>> {
    photo_shards(&[21])
}

fn train(dataset: &str) -> pb::StreamBatchesRequest {
    train_request(dataset, 5)
}

/// A decoder that names itself differently (a worker of another build).
#[derive(Debug)]
struct OtherBuild(Arc<dyn Decoder>);

impl Decoder for OtherBuild {
    fn decode_into(
        &self,
        format: ImageFormat,
        data: &[u8],
        spec: &OutputSpec,
        crop: &CropBox,
        out: &mut [u8],
    ) -> Result<(), decode::DecodeError> {
        self.0.decode_into(format, data, spec, crop, out)
    }

    fn name(&self) -> &'static str {
        "another build's decoder"
    }
}

/// The build's decoder, slowed down per image (a worker on a busy node).
#[derive(Debug)]
struct Slow(Arc<dyn Decoder>, Duration);

impl Decoder for Slow {
    fn decode_into(
        &self,
        format: ImageFormat,
        data: &[u8],
        spec: &OutputSpec,
        crop: &CropBox,
        out: &mut [u8],
    ) -> Result<(), decode::DecodeError> {
        std::thread::sleep(self.1);
        self.0.decode_into(format, data, spec, crop, out)
    }

    fn name(&self) -> &'static str {
        self.0.name()
    }
}

/// The build's decoder that runs a change once, before its first decode
/// goes on: the change lands while the stream's first units are at this
/// worker and none has been answered, however loaded the machine is.
struct Tripwire {
    decoder: Arc<dyn Decoder>,
    change: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Blocks every decode until the change has run (`get_or_init` waits
    /// for a running initializer), so no answer can precede it.
    ran: OnceLock<()>,
    armed: AtomicBool,
}

impl Tripwire {
    fn new(decoder: Arc<dyn Decoder>) -> Self {
        Self {
            decoder,
            change: OnceLock::new(),
            ran: OnceLock::new(),
            armed: AtomicBool::new(false),
        }
    }

    fn arm(&self, change: impl Fn() + Send + Sync + 'static) {
        assert!(self.change.set(Box::new(change)).is_ok(), "armed twice");
        self.armed.store(true, Ordering::SeqCst);
    }

    fn ran(&self) -> bool {
        self.ran.get().is_some()
    }
}

impl std::fmt::Debug for Tripwire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tripwire")
            .field("ran", &self.ran())
            .finish()
    }
}

impl Decoder for Tripwire {
    fn decode_into(
        &self,
        format: ImageFormat,
        data: &[u8],
        spec: &OutputSpec,
        crop: &CropBox,
        out: &mut [u8],
    ) -> Result<(), decode::DecodeError> {
        if self.armed.load(Ordering::SeqCst) {
            self.ran
                .get_or_init(|| (self.change.get().expect("armed with a change"))());
        }
        self.decoder.decode_into(format, data, spec, crop, out)
    }

    fn name(&self) -> &'static str {
        self.decoder.name()
    }
}

struct Worker {
    addr: SocketAddr,
    /// The plain-text health listener, which a TLS worker has.
    health: Option<SocketAddr>,
    stats: Arc<WorkerStats>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Worker {
    async fn start(ip: [u8; 4], token: &str, decoder: Option<Arc<dyn Decoder>>) -> Self {
        Self::start_with(ip, token, decoder, shardfeed::pool::CONNECTION_LIMITS).await
    }

    async fn start_with(
        ip: [u8; 4],
        token: &str,
        decoder: Option<Arc<dyn Decoder>>,
        connections: shardfeed::net::connections::ConnectionLimits,
    ) -> Self {
        Self::start_tls(ip, token, decoder, connections, None).await
    }

    async fn start_tls(
        ip: [u8; 4],
        token: &str,
        decoder: Option<Arc<dyn Decoder>>,
        connections: shardfeed::net::connections::ConnectionLimits,
        tls: Option<shardfeed::net::tls::PoolTls>,
    ) -> Self {
        let config = WorkerConfig {
            listen: (ip, 0).into(),
            token: token.into(),
            decode_threads: 1,
            max_units: 8,
            max_unit_bytes: 16 << 20,
            max_unit_output_bytes: 16 << 20,
            max_unit_samples: 64,
            decode_scratch: 256 << 20,
            drain_grace: Duration::from_secs(5),
            connections,
            health_listen: tls.as_ref().map(|_| SocketAddr::from((ip, 0))),
            tls,
        };
        let decoder = decoder.unwrap_or_else(decode::default_decoder);
        let bound = BoundWorker::bind_with_decoder(config, decoder)
            .await
            .unwrap();
        let (addr, stats, health) = (bound.local_addr(), bound.stats(), bound.health_addr());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            bound
                .serve(async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Self {
            addr,
            health,
            stats,
            stop: Some(stop),
            task,
        }
    }

    fn samples(&self) -> u64 {
        self.stats.samples.load(Ordering::Relaxed)
    }

    /// Drains as on SIGTERM and waits until the worker has stopped.
    async fn drain(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.unwrap();
    }
}

fn pool_config(workers: &[&Worker], share: f64) -> PoolConfig {
    PoolConfig {
        share: PoolShareSetting::Fixed(share),
        unit_samples: 3,
        ..PoolConfig::new(
            workers.iter().map(|w| w.addr.to_string()).collect(),
            TOKEN.into(),
        )
    }
}

async fn pooled(config: PoolConfig, workers: usize) -> (Harness, PoolClient) {
    let client = PoolClient::start(config, decode::default_decoder_name());
    assert_eq!(
        client
            .wait_for_workers(workers, Duration::from_secs(10))
            .await,
        workers
    );
    let harness = Harness::start(Options {
        decode_threads: 1,
        pool: Some(client.clone()),
        ..Options::default()
    })
    .await;
    (harness, client)
}

async fn every_rank(
    harness: &Harness,
    uri: &str,
    request: pb::StreamBatchesRequest,
    world_size: u32,
) -> Vec<pb::Batch> {
    let mut client = harness.client().await;
    let mut all = Vec::new();
    for rank in 0..world_size {
        let ranked = pb::StreamBatchesRequest {
            dataset: uri.into(),
            rank,
            world_size,
            ..request.clone()
        };
        all.extend(collect(&mut client, ranked).await.unwrap());
    }
    all
}

/// One training epoch of `uri`, with `change` made to the pool after the
/// first batch arrived.
async fn epoch_changing_midway(
    harness: &Harness,
    uri: &str,
    change: impl std::future::Future<Output = ()>,
) -> Vec<pb::Batch> {
    let mut stream = harness
        .client()
        .await
        .stream_batches(pb::StreamBatchesRequest {
            dataset: uri.into(),
            ..train("")
        })
        .await
        .unwrap()
        .into_inner();
    let mut batches = vec![stream.message().await.unwrap().unwrap()];
    change.await;
    while let Some(batch) = stream.message().await.unwrap() {
        batches.push(batch);
    }
    batches
}

fn no_repeats(batches: &[pb::Batch]) {
    let mut seen = std::collections::HashSet::new();
    for key in keys(batches) {
        assert!(seen.insert(key.clone()), "{key} delivered twice");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_batches_equal_local_ones_at_world_one_and_four_and_after_a_resume() {
    let shards = photos();
    let local = Harness::start(Options::default()).await;
    let local_uri = upload(&local.s3, "data", "train/", &shards).await;
    let workers = [
        Worker::start([127, 0, 0, 1], TOKEN, None).await,
        Worker::start([127, 0, 0, 2], TOKEN, None).await,
        Worker::start([127, 0, 0, 3], TOKEN, None).await,
    ];
    for share in [1.0, 0.5] {
        let (harness, client) =
            pooled(pool_config(&workers.iter().collect::<Vec<_>>(), share), 3).await;
        let uri = upload(&harness.s3, "data", "train/", &shards).await;
        for world_size in [1, 4] {
            for recipe in [train(""), request("")] {
                let expected = every_rank(&local, &local_uri, recipe.clone(), world_size).await;
                let pooled = every_rank(&harness, &uri, recipe, world_size).await;
                no_repeats(&pooled);
                assert_eq!(pooled.len(), expected.len());
                assert_eq!(
                    digest(&pooled),
                    digest(&expected),
                    "share {share}, world size {world_size}: pooled batches differ"
                );
            }
        }
        // A resume at the third batch equals the tail of the local epoch.
        let whole = every_rank(&local, &local_uri, train(""), 1).await;
        let resumed = every_rank(
            &harness,
            &uri,
            pb::StreamBatchesRequest {
                start_batch: 3,
                ..train("")
            },
            1,
        )
        .await;
        assert_eq!(resumed.first().map(|b| b.index), Some(3));
        assert_eq!(digest(&resumed), digest(&whole[3..]));
        let counts = client.counts();
        assert!(counts.answered > 0 && counts.local == 0, "{counts:?}");
        harness.shutdown().await;
    }
    // Every worker took a part (rendezvous spreads the units).
    for worker in &workers {
        assert!(worker.samples() > 0, "{} decoded nothing", worker.addr);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_and_absent_workers_leave_the_epoch_to_local_decode() {
    let shards = photos();
    let local = Harness::start(Options::default()).await;
    let local_uri = upload(&local.s3, "data", "train/", &shards).await;
    let expected = every_rank(&local, &local_uri, train(""), 2).await;

    let wrong_token = Worker::start([127, 0, 0, 1], "not-the-token", None).await;
    let other_build = Worker::start(
        [127, 0, 0, 2],
        TOKEN,
        Some(Arc::new(OtherBuild(decode::default_decoder()))),
    )
    .await;
    // A port nothing listens on any more: a worker that is gone.
    let gone = std::net::TcpListener::bind("127.0.0.3:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut config = pool_config(&[&wrong_token, &other_build], 1.0);
    config.targets.push(gone.to_string());
    let (harness, client) = pooled(config, 3).await;
    let uri = upload(&harness.s3, "data", "train/", &shards).await;
    let pooled = every_rank(&harness, &uri, train(""), 2).await;
    no_repeats(&pooled);
    assert_eq!(digest(&pooled), digest(&expected));
    assert_eq!(wrong_token.samples() + other_build.samples(), 0);
    let counts = client.counts();
    assert!(counts.refused >= 2, "{counts:?}");
    assert_eq!(counts.answered, 0, "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_past_the_workers_bounds_is_decoded_here_without_benching_the_pool() {
    let worker = Worker::start([127, 0, 0, 1], TOKEN, None).await;
    let client = PoolClient::start(pool_config(&[&worker], 1.0), decode::default_decoder_name());
    assert_eq!(client.wait_for_workers(1, Duration::from_secs(10)).await, 1);
    let sample = one_sample();
    // 1536² outputs: 7 MiB each, 8 of them past the worker's 16 MiB cap.
    let oversized = vec![sample.clone(); 8];
    let answer = client
        .decode(&OutputSpec::center(1536, 1536), &oversized)
        .await;
    assert!(answer.is_none(), "decoded here");
    let counts = client.counts();
    assert_eq!((counts.rejected, counts.refused), (1, 0), "{counts:?}");
    assert_eq!(client.live_workers(), 1, "the worker keeps its place");
    // The next unit within bounds goes to the pool at once.
    let answer = client
        .decode(&OutputSpec::center(32, 32), std::slice::from_ref(&sample))
        .await
        .expect("answered by the worker, not benched");
    assert_eq!(answer.pixels.len(), 32 * 32 * 3);
    assert_eq!(client.counts().answered, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_worker_is_hedged_and_a_drained_one_loses_nothing() {
    let shards = photos();
    let local = Harness::start(Options::default()).await;
    let local_uri = upload(&local.s3, "data", "train/", &shards).await;
    let expected = every_rank(&local, &local_uri, train(""), 1).await;

    let slow = Worker::start(
        [127, 0, 0, 1],
        TOKEN,
        Some(Arc::new(Slow(
            decode::default_decoder(),
            Duration::from_millis(300),
        ))),
    )
    .await;
    let mut fast = Worker::start([127, 0, 0, 2], TOKEN, None).await;
    let mut config = pool_config(&[&slow, &fast], 1.0);
    config.min_hedge = Duration::from_millis(20);
    let (harness, client) = pooled(config, 2).await;
    let uri = upload(&harness.s3, "data", "train/", &shards).await;
    let pooled = every_rank(&harness, &uri, train(""), 1).await;
    assert_eq!(digest(&pooled), digest(&expected));
    let UnitCounts {
        hedged, answered, ..
    } = client.counts();
    assert!(hedged > 0 && answered > 0, "{:?}", client.counts());

    // Drain the fast worker halfway through an epoch: the rest of the
    // units go to the slow one or local decode, and the epoch is whole.
    let batches = epoch_changing_midway(&harness, &uri, fast.drain()).await;
    no_repeats(&batches);
    assert_eq!(digest(&batches), digest(&expected));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_added_mid_epoch_takes_units_and_loses_nothing() {
    let shards = photos();
    let local = Harness::start(Options::default()).await;
    let local_uri = upload(&local.s3, "data", "train/", &shards).await;
    let expected = every_rank(&local, &local_uri, train(""), 1).await;

    // The scale-up lands when the first unit reaches the first worker.
    // With a pool a stream decodes four batches at once, so the first four
    // batches' units are the first worker's alone, and the other four are
    // sent once one of those is answered, which the tripwire holds until
    // the membership has changed: no machine's load can send the whole
    // epoch before the added worker is known (a timed change could).
    let tripwire = Arc::new(Tripwire::new(decode::default_decoder()));
    let first = Worker::start([127, 0, 0, 1], TOKEN, Some(tripwire.clone())).await;
    let added = Worker::start([127, 0, 0, 2], TOKEN, None).await;
    let mut config = pool_config(&[&first], 1.0);
    // The Service's records change only when this test says so.
    config.refresh = Duration::from_secs(3600);
    let (harness, client) = pooled(config, 1).await;
    let uri = upload(&harness.s3, "data", "train/", &shards).await;
    let (members, runtime) = (
        vec![first.addr, added.addr],
        tokio::runtime::Handle::current(),
    );
    let scaling = client.clone();
    // What a DNS refresh does when the Deployment scales up; the worker's
    // decode thread is no runtime thread, and connecting needs one.
    tripwire.arm(move || {
        let _runtime = runtime.enter();
        scaling.set_members(members.clone());
    });
    let batches = epoch_changing_midway(&harness, &uri, async {}).await;
    assert!(tripwire.ran());
    no_repeats(&batches);
    assert_eq!(digest(&batches), digest(&expected));
    assert!(added.samples() > 0, "the added worker got no units");
    assert!(first.samples() > 0);
    assert_eq!(client.live_workers(), 2);
}

/// The status a worker refuses `request` with (it must refuse it).
/// A unit call with the token and build given.
fn call(
    unit: shardfeed::pool::wire::pb::DecodeUnit,
    token: &str,
    build: &str,
) -> tonic::Request<shardfeed::pool::wire::pb::DecodeUnit> {
    let mut request = tonic::Request::new(unit);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
        .metadata_mut()
        .insert(shardfeed::pool::wire::BUILD_HEADER, build.parse().unwrap());
    request
}

/// One small photo to decode, as a unit carries it.
fn one_sample() -> shardfeed::pool::wire::UnitSample {
    shardfeed::pool::wire::UnitSample {
        key: decode::SampleKey {
            seed: 1,
            epoch: 0,
            sample: 7,
            copy: 0,
        },
        format: ImageFormat::Jpeg,
        data: jpeg(64, 48, 1).into(),
    }
}

async fn refusal(
    client: &mut shardfeed::pool::wire::pb::decode_pool_client::DecodePoolClient<
        tonic::transport::Channel,
    >,
    request: tonic::Request<shardfeed::pool::wire::pb::DecodeUnit>,
) -> tonic::Status {
    client.decode(request).await.unwrap_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_units_are_refused_with_the_field_named() {
    use shardfeed::pool::wire::{self, pb as wire_pb};
    let worker = Worker::start([127, 0, 0, 1], TOKEN, None).await;
    let mut client =
        wire_pb::decode_pool_client::DecodePoolClient::connect(format!("http://{}", worker.addr))
            .await
            .unwrap();
    let build = wire::build_identity(decode::default_decoder_name());
    let sample = one_sample();
    let good = wire::unit_to_wire(
        9,
        &OutputSpec::center(32, 32),
        std::slice::from_ref(&sample),
    );

    let answer = client
        .decode(call(good.clone(), TOKEN, &build))
        .await
        .unwrap();
    assert_eq!(answer.get_ref().pixels.len(), 32 * 32 * 3);

    let status = refusal(&mut client, call(good.clone(), "wrong", &build)).await;
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let status = refusal(
        &mut client,
        call(good.clone(), TOKEN, "shardfeed 0.0.1 / x"),
    )
    .await;
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(status.message().contains("0.0.1"), "{}", status.message());

    let too_many = wire::unit_to_wire(9, &OutputSpec::center(32, 32), &vec![sample.clone(); 65]);
    let status = refusal(&mut client, call(too_many, TOKEN, &build)).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().starts_with("samples:"),
        "{}",
        status.message()
    );

    let huge = wire::unit_to_wire(
        9,
        &OutputSpec::center(4096, 4096),
        std::slice::from_ref(&sample),
    );
    let status = refusal(&mut client, call(huge, TOKEN, &build)).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("max-unit-output-bytes"),
        "{}",
        status.message()
    );

    let mut no_spec = good.clone();
    no_spec.spec = None;
    let status = refusal(&mut client, call(no_spec, TOKEN, &build)).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().starts_with("spec:"),
        "{}",
        status.message()
    );

    // A corrupt image is answered as a failure, not an error.
    let mut corrupt = sample;
    corrupt.data = bytes::Bytes::from_static(b"\xff\xd8 not a jpeg");
    let answer = client
        .decode(call(
            wire::unit_to_wire(10, &OutputSpec::center(32, 32), &[corrupt]),
            TOKEN,
            &build,
        ))
        .await
        .unwrap()
        .into_inner();
    let answers = wire::answers_from_wire(&answer, 1, 32 * 32 * 3).unwrap();
    assert!(matches!(answers[0], wire::SampleAnswer::Failed { .. }));
}

/// A raw HTTP/2 call to a worker's Decode: its headers (with `token` and
/// the worker's build), then a gRPC message header declaring `declared`
/// bytes and the first `sent` of them, the body left open. The response
/// resolves only when the worker answers.
async fn open_unit_call(
    h2: &mut h2::client::SendRequest<bytes::Bytes>,
    addr: SocketAddr,
    token: &str,
    declared: u32,
    sent: usize,
) -> (h2::client::ResponseFuture, h2::SendStream<bytes::Bytes>) {
    use shardfeed::pool::wire;
    let request = tonic::codegen::http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/shardfeed.pool.v1.DecodePool/Decode"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .header(
            wire::BUILD_HEADER,
            wire::build_identity(decode::default_decoder_name()),
        )
        .body(())
        .unwrap();
    let mut ready = h2.clone().ready().await.unwrap();
    let (response, mut body) = ready.send_request(request, false).unwrap();
    let mut data = vec![0u8; 5 + sent];
    data[1..5].copy_from_slice(&declared.to_be_bytes());
    // A worker that has answered already may have closed the stream.
    let _ = body.send_data(data.into(), false);
    *h2 = ready;
    (response, body)
}

/// The gRPC status a worker answered with on the headers alone
/// (trailers-only), within `wait` of asking.
async fn status_within(response: h2::client::ResponseFuture, wait: Duration) -> String {
    let response = tokio::time::timeout(wait, response)
        .await
        .expect("answered while its body was still open")
        .unwrap();
    response
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_refused_on_their_headers_before_any_body_is_buffered() {
    use shardfeed::pool::wire::{self, pb as wire_pb};
    let worker = Worker::start([127, 0, 0, 1], TOKEN, None).await;
    let connect = || async {
        let tcp = tokio::net::TcpStream::connect(worker.addr).await.unwrap();
        let (h2, connection) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(connection);
        // The worker's SETTINGS arrive before the first call (a call sent
        // ahead of them was seen to give its admission place back at
        // once, which would put the count of refusals below off by one).
        tokio::time::sleep(Duration::from_millis(200)).await;
        h2
    };
    // Without the token: every call refused at once, its 30 MiB never read
    // (before, the worker buffered each body whole, then refused it).
    let mut h2 = connect().await;
    let mut calls = Vec::new();
    for _ in 0..50 {
        calls.push(open_unit_call(&mut h2, worker.addr, "wrong", 30 << 20, 64 << 10).await);
    }
    for (response, _body) in calls {
        let status = status_within(response, Duration::from_secs(5)).await;
        assert_eq!(status, (tonic::Code::Unauthenticated as i32).to_string());
    }
    // With it: 2 x max_units (16) calls are admitted while their bodies
    // are still coming; the 8 past them are refused as busy on their
    // headers (before, all 24 waited for their bodies).
    let mut h2 = connect().await;
    let mut calls = Vec::new();
    for _ in 0..24 {
        calls.push(open_unit_call(&mut h2, worker.addr, TOKEN, 1 << 20, 1024).await);
    }
    let (responses, mut held): (Vec<_>, Vec<_>) = calls.into_iter().unzip();
    let answered = futures::future::join_all(
        responses
            .into_iter()
            .map(|response| tokio::time::timeout(Duration::from_secs(3), response)),
    )
    .await;
    let busy = (tonic::Code::ResourceExhausted as i32).to_string();
    let refused = answered
        .iter()
        .filter_map(|answer| answer.as_ref().ok())
        .map(|response| {
            let response = response.as_ref().unwrap();
            response
                .headers()
                .get("grpc-status")
                .unwrap()
                .to_str()
                .unwrap()
        })
        .inspect(|status| assert_eq!(status, &busy))
        .count();
    assert_eq!(
        refused, 8,
        "16 admitted with their bodies open, the rest refused"
    );
    // The held calls go away: their places come back, and an honest unit is
    // decoded.
    for body in &mut held {
        body.send_reset(h2::Reason::CANCEL);
    }
    let mut client =
        wire_pb::decode_pool_client::DecodePoolClient::connect(format!("http://{}", worker.addr))
            .await
            .unwrap();
    let build = wire::build_identity(decode::default_decoder_name());
    let unit = wire::unit_to_wire(3, &OutputSpec::center(32, 32), &[one_sample()]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let answer = loop {
        match client.decode(call(unit.clone(), TOKEN, &build)).await {
            Ok(answer) => break answer.into_inner(),
            // The resets may still be on their way.
            Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                assert!(
                    Instant::now() < deadline,
                    "admission places never came back"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => panic!("{status:?}"),
        }
    };
    assert_eq!(answer.pixels.len(), 32 * 32 * 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_holds_no_more_streams_than_the_worker_admits() {
    let worker = Worker::start([127, 0, 0, 1], TOKEN, None).await;
    // max_units 8: 16 admitted units and 8 more for health checks, named in
    // the worker's SETTINGS (before, none), which h2 enforces by refusing
    // streams past it.
    let h2 = raw_h2(worker.addr).await;
    assert_eq!(h2.current_max_send_streams(), 24);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_holds_its_connection_limit_and_closes_idle_connections() {
    let limits = shardfeed::net::connections::ConnectionLimits {
        max_connections: 2,
        idle: Duration::from_secs(1),
    };
    let worker = Worker::start_with([127, 0, 0, 1], TOKEN, None, limits).await;
    // Two connections: one with a call whose request never finishes, then
    // one with no call.
    let mut waiting = raw_h2(worker.addr).await;
    let (response, _body) = open_unit_call(&mut waiting, worker.addr, TOKEN, 1 << 20, 1024).await;
    let idle = raw_h2(worker.addr).await;
    // The listener is full and neither is in service: a third takes the
    // place of the one longest without progress, the waiting call's.
    let _third = raw_h2(worker.addr).await;
    let ended = tokio::time::timeout(Duration::from_secs(2), response)
        .await
        .expect("the waiting call ended with its connection");
    assert!(ended.is_err(), "{ended:?}");
    assert!(idle.clone().ready().await.is_ok(), "the idle one is open");
    // Past the idle bound the connection without a call is gone.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        idle.clone().ready().await.is_err(),
        "the idle connection was closed"
    );
    // Its place is free: an honest client is served.
    let mut client = shardfeed::pool::wire::pb::decode_pool_client::DecodePoolClient::connect(
        format!("http://{}", worker.addr),
    )
    .await
    .unwrap();
    let build = shardfeed::pool::wire::build_identity(decode::default_decoder_name());
    let unit = shardfeed::pool::wire::unit_to_wire(3, &OutputSpec::center(32, 32), &[one_sample()]);
    let answer = client.decode(call(unit, TOKEN, &build)).await.unwrap();
    assert_eq!(answer.get_ref().pixels.len(), 32 * 32 * 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_traffic_is_tls_and_both_ends_must_hold_the_pools_certificates() {
    let certs = pool_certs("shardfeed-pool");
    let worker = Worker::start_tls(
        [127, 0, 0, 1],
        TOKEN,
        None,
        shardfeed::pool::CONNECTION_LIMITS,
        Some(certs.good.clone()),
    )
    .await;
    let sample = one_sample();
    let spec = OutputSpec::center(32, 32);
    let decode_with = |tls: Option<shardfeed::net::tls::PoolTls>| {
        let (worker_addr, sample) = (worker.addr, sample.clone());
        async move {
            let mut config = pool_config(&[], 1.0);
            config.targets = vec![worker_addr.to_string()];
            config.tls = tls;
            let client = PoolClient::start(config, decode::default_decoder_name());
            client.wait_for_workers(1, Duration::from_secs(10)).await;
            let answer = client.decode(&spec, std::slice::from_ref(&sample)).await;
            (answer, client.counts())
        }
    };
    // The pool's sidecar: answered over TLS, pixels as a local decode's.
    let (answer, counts) = decode_with(Some(certs.good.clone())).await;
    let answer = answer.expect("answered over TLS");
    let mut local = vec![0u8; spec.bytes()];
    decode::decode_bounded(
        &*decode::default_decoder(),
        &decode::ScratchBudget::new(256 << 20),
        sample.format,
        &sample.data,
        &spec,
        &sample.key,
        &mut local,
    )
    .unwrap();
    assert_eq!(&answer.pixels[..], &local[..]);
    assert_eq!(counts.answered, 1);
    // Plain text to a TLS worker, a certificate of another CA, or a worker
    // named otherwise: no answer, decoded here, the worker never reached.
    let decoded_before = worker.samples();
    let (answer, _) = decode_with(None).await;
    assert!(answer.is_none(), "plain text is not answered");
    let (answer, _) = decode_with(Some(certs.other.clone())).await;
    assert!(answer.is_none(), "a stranger's certificate is refused");
    let mut misnamed = certs.good.clone();
    misnamed.server_name = "someone-else".into();
    let (answer, _) = decode_with(Some(misnamed)).await;
    assert!(answer.is_none(), "a worker must carry the pool's name");
    assert_eq!(worker.samples(), decoded_before);
    // The kubelet's probes speak no TLS: health alone, in plain text, on a
    // port of its own; the units' service is not there.
    let health = worker.health.expect("a TLS worker has its health listener");
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{health}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let status = tonic_health::pb::health_client::HealthClient::new(channel.clone())
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let unit = shardfeed::pool::wire::unit_to_wire(1, &spec, std::slice::from_ref(&sample));
    let build = shardfeed::pool::wire::build_identity(decode::default_decoder_name());
    let refused = shardfeed::pool::wire::pb::decode_pool_client::DecodePoolClient::new(channel)
        .decode(call(unit, TOKEN, &build))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unimplemented);
}

/// Hardening D8: sockets that never send a ClientHello. A TLS worker shakes
/// hands before a connection takes one of its places, at most 32 at a time
/// from one address: a stranger's 200 stalled sockets leave 168 closed at
/// once and the rest holding handshake places only, and an honest sidecar
/// is served meanwhile through a worker of 8 connection places (which the
/// 32 stalled handshakes filled when tonic shook hands inside them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_handshakes_take_no_connection_places() {
    use shardfeed::net::handshake::HandshakeLimits;
    use tokio::io::AsyncReadExt;
    let certs = pool_certs("shardfeed-pool");
    let places = shardfeed::net::connections::ConnectionLimits {
        max_connections: 8,
        idle: Duration::from_secs(60),
    };
    let worker = Worker::start_tls(
        [127, 0, 0, 1],
        TOKEN,
        None,
        places,
        Some(certs.good.clone()),
    )
    .await;
    let mut strangers = Vec::new();
    for _ in 0..200 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        strangers.push(socket.connect(worker.addr).await.unwrap());
    }
    let reads = strangers.iter_mut().map(|stranger| async move {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(500), stranger.read(&mut byte));
        matches!(read.await, Ok(Ok(0)) | Ok(Err(_)))
    });
    let closed = futures::future::join_all(reads)
        .await
        .into_iter()
        .filter(|&closed| closed)
        .count();
    assert_eq!(closed, 200 - HandshakeLimits::DEFAULT.per_peer);
    // The stalled ones still open, an honest sidecar gets its unit.
    let mut config = pool_config(&[], 1.0);
    config.targets = vec![worker.addr.to_string()];
    config.tls = Some(certs.good.clone());
    let client = PoolClient::start(config, decode::default_decoder_name());
    client.wait_for_workers(1, Duration::from_secs(10)).await;
    let spec = OutputSpec::center(32, 32);
    let answer = client.decode(&spec, &[one_sample()]).await;
    assert!(answer.is_some(), "an honest sidecar was kept out");
    drop(strangers);
}
