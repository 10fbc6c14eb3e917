//! The decode pool in process: a sidecar and workers on 127.0.0.x. Batches
//! are byte-identical whoever decoded their samples (the pool, several of
//! its workers, a hedge, or local decode after a refusal or a drain), and
//! no sample arrives twice.

#[path = "../common/mod.rs"]
mod common;
// The worker's defences against hostile units and connections.
mod defences;

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

/// DINO's shape at test size: two global views that differ in their blur
/// and solarize, and three local views of one spec.
fn views_request(dataset: &str) -> pb::StreamBatchesRequest {
    let crop = random_resized;
    let blur = |p| {
        Some(pb::GaussianBlur {
            kernel_width: 5,
            kernel_height: 5,
            sigma: Some(pb::Range { min: 0.1, max: 2.0 }),
            p: Some(p),
        })
    };
    let global = |blur_p, solarize| pb::Augmentation {
        crop: crop(0.32, 1.0),
        horizontal_flip: 0.5,
        grayscale: 0.2,
        gaussian_blur: blur(blur_p),
        solarize: Some(pb::RandomSolarize {
            threshold: 128.0,
            p: solarize,
        }),
        ..Default::default()
    };
    pb::StreamBatchesRequest {
        height: 0,
        width: 0,
        seed: 5,
        views: vec![
            pb::ViewGroup {
                height: 32,
                width: 32,
                views: vec![global(1.0, 0.0), global(0.1, 0.2)],
                count: 0,
            },
            pb::ViewGroup {
                height: 16,
                width: 16,
                views: vec![pb::Augmentation {
                    crop: crop(0.05, 0.32),
                    horizontal_flip: 0.5,
                    gaussian_blur: blur(0.5),
                    ..Default::default()
                }],
                count: 3,
            },
        ],
        ..request(dataset)
    }
}

/// The batches' pixels, keys, labels, substitutions and every view's
/// place, box and decisions.
fn views_digest(batches: &[pb::Batch]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    digest(batches).hash(&mut hasher);
    for batch in batches {
        assert_eq!(batch.views.len(), 2, "a batch of views has both groups");
        format!("{:?}", batch.views).hash(&mut hasher);
    }
    hasher.finish()
}

/// A unit of views carries the stream's groups; a worker decodes each
/// sample once into all its views, as the sidecar would: the batches
/// (every view's pixels, box and decisions, the corrupt sample's every
/// view substituted) are the same whoever decoded which sample.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_views_equal_local_ones_at_world_one_and_two() {
    let shards = photos();
    let local = Harness::start(Options::default()).await;
    let local_uri = upload(&local.s3, "data", "train/", &shards).await;
    let workers = [
        Worker::start([127, 0, 0, 1], TOKEN, None).await,
        Worker::start([127, 0, 0, 2], TOKEN, None).await,
    ];
    for share in [1.0, 0.5] {
        let (harness, client) =
            pooled(pool_config(&workers.iter().collect::<Vec<_>>(), share), 2).await;
        let uri = upload(&harness.s3, "data", "train/", &shards).await;
        for world_size in [1, 2] {
            let expected = every_rank(&local, &local_uri, views_request(""), world_size).await;
            let pooled = every_rank(&harness, &uri, views_request(""), world_size).await;
            no_repeats(&pooled);
            assert_eq!(pooled.len(), expected.len());
            assert!(
                pooled.iter().any(|b| !b.substituted.is_empty()),
                "the corrupt sample is in the epoch"
            );
            assert_eq!(
                views_digest(&pooled),
                views_digest(&expected),
                "share {share}, world size {world_size}: pooled views differ"
            );
        }
        let counts = client.counts();
        assert!(counts.answered > 0 && counts.local == 0, "{counts:?}");
        harness.shutdown().await;
    }
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
