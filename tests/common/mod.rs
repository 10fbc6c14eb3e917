//! Shared test fixtures: a real S3-compatible server on loopback, datasets
//! written into it through aws-sdk-s3, and a shardfeed server in front.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_s3::primitives::ByteStream;
use shardfeed::dataset::DatasetRegistry;
use shardfeed::dev::s3mem::{self, RunningS3};
use shardfeed::engine::budget::MemoryConfig;
use shardfeed::engine::{Engine, EngineConfig};
use shardfeed::pipeline::PipelineConfig;
use shardfeed::server::pb::shardfeed_client::ShardfeedClient;
use shardfeed::server::{pb, ListenAddr, LocalServer, ServiceConfig, ShardfeedService};
use shardfeed::shard::tar::TarWriter;
use shardfeed::store::cache::{CacheConfig, DiskCache, EvictionPolicy};
use shardfeed::store::read::ReadConfig;
use shardfeed::store::retry::RetryPolicy;
use tonic::transport::Channel;

/// A sample to write: key, image member (extension, bytes), label text.
#[derive(Clone)]
pub struct Sample {
    pub key: String,
    pub image: Option<(&'static str, Vec<u8>)>,
    pub label: Option<String>,
}

pub fn jpeg(width: u32, height: u32, seed: u64) -> Vec<u8> {
    let pixels =
        shardfeed::dev::synthetic::synthetic_image(seed, seed, (seed % 10) as u32, width, height);
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 85)
        .encode_image(&pixels)
        .unwrap();
    out
}

/// `shards` shards of `per_shard` small JPEG samples; sample `i` has label `i % 7`.
pub fn simple_dataset(shards: usize, per_shard: usize) -> Vec<Vec<Sample>> {
    (0..shards)
        .map(|s| {
            (0..per_shard)
                .map(|i| {
                    let n = (s * per_shard + i) as u64;
                    Sample {
                        key: format!("s{s:03}/k{n:06}"),
                        image: Some((
                            "jpg",
                            jpeg(40 + (n % 5) as u32 * 8, 32 + (n % 3) as u32 * 8, n),
                        )),
                        label: Some((n % 7).to_string()),
                    }
                })
                .collect()
        })
        .collect()
}

pub fn tar_of(samples: &[Sample]) -> Vec<u8> {
    let mut tar = TarWriter::new();
    for sample in samples {
        if let Some((ext, data)) = &sample.image {
            tar.append(&format!("{}.{ext}", sample.key), data);
        }
        if let Some(label) = &sample.label {
            tar.append(&format!("{}.cls", sample.key), label.as_bytes());
        }
    }
    tar.finish()
}

/// An SDK client of our own for fixtures, independent of shardfeed's store.
pub async fn sdk_client(s3: &RunningS3) -> aws_sdk_s3::Client {
    let creds = aws_sdk_s3::config::Credentials::new(
        s3mem::DEMO_ACCESS_KEY,
        s3mem::DEMO_SECRET_KEY,
        None,
        None,
        "tests",
    );
    let config = aws_sdk_s3::config::Builder::new()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .endpoint_url(s3.endpoint())
        .region(aws_sdk_s3::config::Region::new("us-east-1"))
        .credentials_provider(creds)
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

/// Uploads shards to `s3://bucket/prefix` and returns the dataset URI.
pub async fn upload(s3: &RunningS3, bucket: &str, prefix: &str, shards: &[Vec<Sample>]) -> String {
    let objects = shards
        .iter()
        .enumerate()
        .map(|(i, shard)| (format!("{prefix}shard-{i:04}.tar"), tar_of(shard)));
    put_objects(s3, bucket, objects).await;
    format!("s3://{bucket}/{prefix}")
}

/// Creates `bucket` unless it exists.
pub async fn create_bucket(s3: &RunningS3, bucket: &str) {
    let client = sdk_client(s3).await;
    let _ = client.create_bucket().bucket(bucket).send().await;
}

/// Writes `(key, bytes)` objects into `bucket`, creating it if needed.
pub async fn put_objects(
    s3: &RunningS3,
    bucket: &str,
    objects: impl IntoIterator<Item = (String, Vec<u8>)>,
) {
    create_bucket(s3, bucket).await;
    let client = sdk_client(s3).await;
    for (key, data) in objects {
        client
            .put_object()
            .bucket(bucket)
            .key(key)
            .body(ByteStream::from(data))
            .send()
            .await
            .unwrap();
    }
}

/// The loopback S3 server and a shardfeed server in front of it.
pub struct Harness {
    pub s3: RunningS3,
    pub addr: ListenAddr,
    pub server: LocalServer,
}

pub struct Options {
    pub decode_threads: usize,
    pub listen: ListenAddr,
    pub pipeline: PipelineConfig,
    pub retry: RetryPolicy,
    pub max_streams: usize,
    pub allow: Vec<String>,
    pub grace: Duration,
    pub cache: Option<Arc<DiskCache>>,
    pub memory: MemoryConfig,
    /// The decoder (default: the build's fastest).
    pub decoder: Option<Arc<dyn shardfeed::decode::Decoder>>,
    /// The host's decoded-source tier.
    pub decoded: Option<Arc<shardfeed::tier::records::DecodedCache>>,
    /// The tier form requests that name none use (`--decoded-default-side`).
    pub decoded_default: Option<shardfeed::decode::source::SourceForm>,
    /// The decode pool streams send to.
    pub pool: Option<shardfeed::pool::PoolClient>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            decode_threads: 2,
            listen: ListenAddr::Tcp(([127, 0, 0, 1], 0).into()),
            pipeline: PipelineConfig {
                read: small_parts(),
                ..PipelineConfig::default()
            },
            retry: fast_retries(),
            max_streams: 16,
            allow: Vec::new(),
            grace: Duration::from_secs(5),
            cache: None,
            memory: MemoryConfig::from_limit(8 << 30),
            decoder: None,
            decoded: None,
            decoded_default: None,
            pool: None,
        }
    }
}

/// Small parts, so that even small shards are read in several GETs.
pub fn small_parts() -> ReadConfig {
    ReadConfig {
        part_size: 64 << 10,
        parts_in_flight: 3,
        parts_sized: false,
        ..ReadConfig::default()
    }
}

/// Retries quick enough for tests (the injected faults are immediate).
pub fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 4,
        budget: Duration::from_secs(10),
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(50),
        idle_timeout: Duration::from_secs(10),
    }
}

impl Harness {
    pub async fn start(options: Options) -> Self {
        let s3 = s3mem::start(0).await.unwrap();
        Self::with_s3(s3, options).await
    }

    pub async fn with_s3(s3: RunningS3, options: Options) -> Self {
        let mut registry =
            DatasetRegistry::new(s3.s3_config(), options.retry, options.pipeline.read.clone())
                .with_bad_shard_policy(options.pipeline.on_bad_shard);
        if let Some(cache) = options.cache {
            registry = registry.with_cache(cache);
        }
        let engine = Engine::with_decoder(
            Arc::new(registry),
            EngineConfig {
                pipeline: options.pipeline,
                decode_threads: options.decode_threads,
                memory: options.memory,
                decoded_default: options.decoded_default,
                ..EngineConfig::default()
            },
            options
                .decoder
                .unwrap_or_else(shardfeed::decode::default_decoder),
        )
        .unwrap();
        let engine = match options.decoded {
            Some(tier) => engine.with_decoded_cache(tier),
            None => engine,
        };
        let engine = match options.pool {
            Some(pool) => engine.with_pool(pool),
            None => engine,
        };
        let service = ShardfeedService::new(
            engine,
            ServiceConfig {
                max_streams: options.max_streams,
                allow: options.allow,
            },
        );
        let server = LocalServer::start(service, &options.listen, options.grace)
            .await
            .unwrap();
        Self {
            s3,
            addr: server.addr.clone(),
            server,
        }
    }

    pub async fn client(&self) -> ShardfeedClient<Channel> {
        self.server.client().await.unwrap()
    }

    /// Starts shutdown (as SIGTERM would) without waiting for it.
    pub fn begin_shutdown(&mut self) {
        self.server.begin_shutdown();
    }

    pub async fn shutdown(self) {
        let _ = self.server.stop().await;
    }

    /// Stops the server (releasing everything it holds, the disk cache's
    /// lock included) and hands back the S3 server, as a sidecar restart
    /// against the same bucket.
    pub async fn restart_s3(self) -> RunningS3 {
        let _ = self.server.stop().await;
        self.s3
    }
}

/// Waits (at most 10 s) until the server's health says NOT_SERVING: it
/// watches the health service's stream rather than polling it.
pub async fn wait_not_serving(addr: &ListenAddr) {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    let channel = shardfeed::server::connect(addr).await.unwrap();
    let mut watch = HealthClient::new(channel)
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let not_serving = async {
        while let Some(update) = watch.message().await.unwrap() {
            if update.status == ServingStatus::NotServing as i32 {
                return;
            }
        }
        panic!("the health watch ended before NOT_SERVING");
    };
    tokio::time::timeout(Duration::from_secs(10), not_serving)
        .await
        .expect("NOT_SERVING within 10 s");
}

/// The request field an INVALID_ARGUMENT status names (its gRPC
/// `BadRequest` detail), "" when it names none.
pub fn bad_field(status: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    status
        .get_details_bad_request()
        .and_then(|bad| bad.field_violations.first().map(|v| v.field.clone()))
        .unwrap_or_default()
}

pub fn request(dataset: &str) -> pb::StreamBatchesRequest {
    pb::StreamBatchesRequest {
        dataset: dataset.to_string(),
        world_size: 1,
        batch_size: Some(8),
        height: 24,
        width: 32,
        ..Default::default()
    }
}

/// `request` in the dataset's stored order: batches hold known samples.
pub fn unshuffled(dataset: &str) -> pb::StreamBatchesRequest {
    pb::StreamBatchesRequest {
        shuffle: Some(false),
        ..request(dataset)
    }
}

/// `Describe` of `dataset` at this world and batch size (drop_last).
pub async fn describe(
    client: &mut ShardfeedClient<Channel>,
    dataset: &str,
    world_size: u32,
    batch_size: u32,
) -> pb::DescribeResponse {
    client
        .describe(pb::DescribeRequest {
            dataset: dataset.to_string(),
            world_size,
            batch_size: Some(batch_size),
            partition: pb::Partition::DropLast as i32,
            repeats: 0,
        })
        .await
        .unwrap()
        .into_inner()
}

/// Every batch of a stream, or the status that ended it.
pub async fn collect(
    client: &mut ShardfeedClient<Channel>,
    request: pb::StreamBatchesRequest,
) -> Result<Vec<pb::Batch>, tonic::Status> {
    let mut stream = client.stream_batches(request).await?.into_inner();
    let mut batches = Vec::new();
    while let Some(batch) = stream.message().await? {
        batches.push(batch);
    }
    Ok(batches)
}

/// Shuffled streams of `uri` at each of `world` ranks, batch 4: each
/// rank's batch count (all equal) and every sample as `shard/key`.
pub async fn across_ranks(
    client: &mut ShardfeedClient<Channel>,
    uri: &str,
    world: u32,
) -> (Vec<usize>, Vec<String>) {
    let mut counts = Vec::new();
    let mut seen = Vec::new();
    for rank in 0..world {
        let request = pb::StreamBatchesRequest {
            rank,
            world_size: world,
            batch_size: Some(4),
            ..request(uri)
        };
        let batches = collect(client, request).await.unwrap();
        counts.push(batches.len());
        seen.extend(batches.iter().flat_map(|b| {
            b.shards
                .iter()
                .zip(&b.keys)
                .map(|(s, k)| format!("{s}/{k}"))
                .collect::<Vec<_>>()
        }));
    }
    (counts, seen)
}

pub fn keys(batches: &[pb::Batch]) -> Vec<String> {
    batches.iter().flat_map(|b| b.keys.clone()).collect()
}

/// A digest of everything a batch carries, for byte-for-byte comparisons.
pub fn digest(batches: &[pb::Batch]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for batch in batches {
        batch.index.hash(&mut hasher);
        batch.images.hash(&mut hasher);
        batch.labels.hash(&mut hasher);
        batch.keys.hash(&mut hasher);
        batch.substituted.hash(&mut hasher);
    }
    hasher.finish()
}

pub fn cache_at(dir: &std::path::Path, max_bytes: u64, policy: EvictionPolicy) -> Arc<DiskCache> {
    let config = CacheConfig {
        max_bytes,
        min_free_percent: 0.0,
        // Small blocks so that small test shards span several.
        block_size: 16 << 10,
        policy,
        ..CacheConfig::new(dir.to_path_buf())
    };
    // A stopped server's connection tasks may still be winding down (and
    // holding the previous cache, hence its lock) for a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match DiskCache::open(config.clone()) {
            Err(shardfeed::store::cache::CacheError::Locked { .. })
                if std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            result => return result.unwrap(),
        }
    }
}

/// Writes the dataset's index beside it (as `shardfeed index` does).
pub async fn write_index(s3: &RunningS3, bucket: &str, prefix: &str) {
    let location = shardfeed::dataset::DatasetLocation::prefix(prefix);
    write_index_at(s3, bucket, &location).await;
}

/// Writes the index of the dataset at `location` (a folder or a manifest).
pub async fn write_index_at(
    s3: &RunningS3,
    bucket: &str,
    location: &shardfeed::dataset::DatasetLocation,
) {
    let client = shardfeed::store::s3::client(&s3.s3_config()).await;
    let store: Arc<dyn shardfeed::store::ObjectStore> =
        Arc::new(shardfeed::store::s3::S3Store::new(client, bucket));
    let (index, shards) = shardfeed::dataset::build_index(
        store.clone(),
        location,
        &small_parts(),
        shardfeed::shard::BadShardPolicy::Fail,
    )
    .await
    .unwrap();
    shardfeed::dataset::write_index(store.as_ref(), location, &index, &shards)
        .await
        .unwrap();
}

pub fn gets(s3: &RunningS3) -> u64 {
    s3.state
        .counts
        .get
        .load(std::sync::atomic::Ordering::SeqCst)
}

/// Writes `shards` as `part-N.tar` files under a temp dir and indexes them
/// with the real binary.
pub fn indexed_local_dataset(shards: &[Vec<Sample>]) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    for (i, shard) in shards.iter().enumerate() {
        std::fs::write(dir.path().join(format!("part-{i}.tar")), tar_of(shard)).unwrap();
    }
    let uri = format!("file://{}/", dir.path().display());
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_shardfeed"))
        .args(["index", &uri])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    (dir, uri)
}

/// torchvision's training recipe: RandomResizedCrop (its defaults) + flip.
pub fn training_augmentation() -> pb::Augmentation {
    pb::Augmentation {
        crop: Some(pb::augmentation::Crop::RandomResizedCrop(
            pb::RandomResizedCrop::default(),
        )),
        horizontal_flip: 0.5,
        ..Default::default()
    }
}

/// torchvision's "new recipe": RandomResizedCrop + flip + TrivialAugmentWide
/// + RandomErasing(0.1) after ImageNet's Normalize.
pub fn trivial_augment_recipe() -> pb::Augmentation {
    pb::Augmentation {
        auto_augment: Some(pb::AutoAugment {
            policy: Some(pb::auto_augment::Policy::TrivialAugmentWide(
                pb::TrivialAugmentWide::default(),
            )),
            interpolation: pb::Interpolation::Bilinear as i32,
            fill: vec![],
        }),
        random_erasing: Some(pb::RandomErasing {
            p: 0.1,
            value: Some(pb::random_erasing::Value::Mean(pb::EraseMean {})),
            normalize_mean: vec![0.485, 0.456, 0.406],
            normalize_std: vec![0.229, 0.224, 0.225],
            ..Default::default()
        }),
        ..training_augmentation()
    }
}

/// A training stream of `dataset` with `seed`.
/// A RandomResizedCrop of the area scale `min` to `max`, default ratios.
pub fn random_resized(min: f64, max: f64) -> Option<pb::augmentation::Crop> {
    Some(pb::augmentation::Crop::RandomResizedCrop(
        pb::RandomResizedCrop {
            scale_min: Some(min),
            scale_max: Some(max),
            ..Default::default()
        },
    ))
}

pub fn train_request(dataset: &str, seed: u64) -> pb::StreamBatchesRequest {
    pb::StreamBatchesRequest {
        seed,
        augmentation: Some(training_augmentation()),
        ..request(dataset)
    }
}

/// 4 shards of 16 photos of a few sizes (64 samples, labels 0..5); the
/// samples numbered in `corrupt` hold bytes that are no JPEG.
pub fn photo_shards(corrupt: &[u64]) -> Vec<Vec<Sample>> {
    (0..4)
        .map(|s| {
            (0..16)
                .map(|i| {
                    let n = (s * 16 + i) as u64;
                    let image = if corrupt.contains(&n) {
                        b"\xff\xd8 not a jpeg".to_vec()
                    } else {
                        jpeg(160 + (n % 4) as u32 * 40, 120 + (n % 3) as u32 * 30, n)
                    };
                    Sample {
                        key: format!("s{s}/k{n:03}"),
                        image: Some(("jpg", image)),
                        label: Some((n % 5).to_string()),
                    }
                })
                .collect()
        })
        .collect()
}

/// A raw HTTP/2 connection to `addr` (for hostile-listener tests), once
/// the server's SETTINGS have arrived.
pub async fn raw_h2(addr: std::net::SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (h2, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let h2 = h2.ready().await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    h2
}

/// A throwaway pool CA and two certificates it signed (server and client
/// use, naming `name`), and one from another CA, as `PoolTls` values.
pub struct PoolCerts {
    pub good: shardfeed::net::tls::PoolTls,
    pub other: shardfeed::net::tls::PoolTls,
}

pub fn pool_certs(name: &str) -> PoolCerts {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa,
        KeyPair,
    };
    let authority = || {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
    };
    let leaf = |issuer: &CertifiedIssuer<'_, KeyPair>| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, issuer).unwrap();
        shardfeed::net::tls::PoolTls {
            ca: issuer.pem().into_bytes(),
            cert: cert.pem().into_bytes(),
            key: key.serialize_pem().into_bytes(),
            server_name: name.to_string(),
        }
    };
    let pool = authority();
    let stranger = authority();
    let mut other = leaf(&stranger);
    // A stranger who trusts the pool's CA but holds its own certificate.
    other.ca = pool.pem().into_bytes();
    PoolCerts {
        good: leaf(&pool),
        other,
    }
}
