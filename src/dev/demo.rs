//! `shardfeed demo`: the whole path on one machine, with no account needed.
//!
//! Synthesizes photo-like JPEGs, writes them as WebDataset shards through
//! aws-sdk-s3 into the in-process S3 server, indexes them, serves them over
//! real gRPC and streams two epochs through a gRPC client.

use std::sync::Arc;
use std::time::Instant;

use super::s3mem;
use super::synthetic::{publish, SyntheticSpec};
use crate::dataset::DatasetRegistry;
use crate::engine::{self, Engine, EngineConfig};
use crate::server::{pb, LocalServer, ServiceConfig, ShardfeedService};
use crate::store::cache::{CacheConfig, DiskCache};

#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub data: SyntheticSpec,
    pub epochs: u64,
    pub batch_size: u32,
    pub image_size: u32,
    pub decode_threads: usize,
    /// Read through a disk cache in this directory (epoch 2 then makes no GETs).
    pub cache_dir: Option<std::path::PathBuf>,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            data: SyntheticSpec::default(),
            epochs: 2,
            batch_size: 128,
            image_size: 224,
            decode_threads: engine::default_decode_threads(),
            cache_dir: None,
        }
    }
}

/// Runs the demo, printing progress and a summary to stdout.
pub async fn run(options: DemoOptions) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let s3 = s3mem::start(0).await?;
    println!(
        "S3-compatible server (in-process, in memory) at {}",
        s3.endpoint()
    );

    let started = Instant::now();
    let uri = publish(&s3, &options.data).await?;
    let samples = options.data.shards * options.data.samples_per_shard;
    println!(
        "synthesized {samples} photo-like JPEGs (~{}x{}) in {} shards, wrote them through aws-sdk-s3 \
         and indexed {uri} in {:.1}s",
        options.data.width,
        options.data.height,
        options.data.shards,
        started.elapsed().as_secs_f64()
    );
    let local = serve(&s3, &options).await?;
    let mut client = local.client().await?;
    let described = client
        .describe(pb::DescribeRequest {
            dataset: uri.clone(),
            world_size: 1,
            batch_size: Some(options.batch_size),
            partition: 0,
            repeats: 0,
        })
        .await?
        .into_inner();
    println!(
        "describe: {} shards, {} samples, {} batches per rank of {}",
        described.shards, described.samples, described.batches_per_rank, options.batch_size
    );

    let mut total_samples = 0u64;
    let mut total_seconds = 0f64;
    let mut first_keys = Vec::new();
    for epoch in 0..options.epochs {
        let (samples, seconds, first_key) =
            stream_epoch(&mut client, &uri, &options, epoch).await?;
        total_samples += samples;
        total_seconds += seconds;
        first_keys.push(first_key);
    }
    let counts = &s3.state.counts;
    println!(
        "summary: {total_samples} samples in {total_seconds:.2}s = {:.0} samples/s; S3 served {} GETs, {:.1} MB; \
         epochs start with {:?} (shuffled per epoch)",
        total_samples as f64 / total_seconds.max(1e-9),
        counts.get.load(std::sync::atomic::Ordering::Relaxed),
        counts.get_bytes.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e6,
        first_keys,
    );
    local.stop().await?;
    Ok(())
}

/// The sidecar the demo streams from, over the in-memory S3.
async fn serve(
    s3: &s3mem::RunningS3,
    options: &DemoOptions,
) -> Result<LocalServer, Box<dyn std::error::Error + Send + Sync>> {
    let mut registry = DatasetRegistry::new(s3.s3_config(), Default::default(), Default::default());
    if let Some(dir) = &options.cache_dir {
        registry = registry.with_cache(DiskCache::open(CacheConfig {
            max_bytes: u64::MAX,
            ..CacheConfig::new(dir.clone())
        })?);
        println!("reading through a disk cache in {}", dir.display());
    }
    let engine = Engine::new(
        Arc::new(registry),
        EngineConfig {
            decode_threads: options.decode_threads,
            ..EngineConfig::default()
        },
    )?;
    let local =
        LocalServer::loopback(ShardfeedService::new(engine, ServiceConfig::default())).await?;
    // Which decoder runs says which figures to expect: libjpeg-turbo (the
    // `turbojpeg` feature, what the container and install.sh build where
    // cmake and nasm exist) decodes ~1.5x faster than the pure-Rust one.
    println!(
        "shardfeed serving on {} with {} decode threads, decoder {}",
        local.addr,
        options.decode_threads,
        crate::decode::default_decoder_name()
    );
    Ok(local)
}

/// Streams one epoch and prints its figures: its samples, its seconds and
/// its first key.
async fn stream_epoch(
    client: &mut pb::shardfeed_client::ShardfeedClient<tonic::transport::Channel>,
    uri: &str,
    options: &DemoOptions,
    epoch: u64,
) -> Result<(u64, f64, String), Box<dyn std::error::Error + Send + Sync>> {
    let request = pb::StreamBatchesRequest {
        dataset: uri.to_string(),
        seed: 0,
        epoch,
        world_size: 1,
        batch_size: Some(options.batch_size),
        height: options.image_size,
        width: options.image_size,
        ..Default::default()
    };
    let epoch_started = Instant::now();
    let mut stream = client.stream_batches(request).await?.into_inner();
    let (mut batches, mut epoch_samples, mut substituted, mut payload) =
        (0u64, 0u64, 0usize, 0usize);
    let (mut first_batch, mut first_key) = (None, String::new());
    let mut label_sum = 0i64;
    while let Some(batch) = stream.message().await? {
        first_batch.get_or_insert_with(|| epoch_started.elapsed());
        if batches == 0 {
            first_key = batch.keys.first().cloned().unwrap_or_default();
        }
        batches += 1;
        epoch_samples += batch.labels.len() as u64;
        substituted += batch.substituted.len();
        payload += batch.images.len();
        label_sum += batch.labels.iter().sum::<i64>();
    }
    let seconds = epoch_started.elapsed().as_secs_f64();
    println!(
        "epoch {epoch}: {batches} batches, {epoch_samples} samples in {seconds:.2}s = {:.0} samples/s, \
         {:.0} MB/s of {}x{}x3 uint8, first batch after {:.0} ms, {substituted} substituted, mean label {:.2}",
        epoch_samples as f64 / seconds,
        payload as f64 / seconds / 1e6,
        options.image_size,
        options.image_size,
        first_batch.unwrap_or_default().as_secs_f64() * 1e3,
        label_sum as f64 / epoch_samples.max(1) as f64,
    );
    Ok((epoch_samples, seconds, first_key))
}
