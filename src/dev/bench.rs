//! Benchmarks that run the real path in-process and print their figures
//! and JSON lines: the entitlement benchmark (fetch + parse + decode + batch,
//! no gRPC), its cost under S3-like first-byte latency, and the cache's
//! eviction policies.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::kernel::{cpu_and_peak_rss, decode_kernel, TimedDecoder};
use super::s3mem;
use super::synthetic::{self, SyntheticSpec};
use crate::dataset::{build_index, write_index, DatasetLocation, DatasetRegistry};
use crate::engine::{Engine, EngineConfig, StreamRequest};
use crate::pipeline::PipelineConfig;
use crate::server::{pb, LocalServer, ServiceConfig, ShardfeedService};
use crate::shard::tar::TarWriter;
use crate::shard::BadShardPolicy;
use crate::store::cache::{CacheConfig, DiskCache, EvictionPolicy};
use crate::store::read::ReadConfig;
use crate::store::s3::S3Store;
use crate::store::ObjectStore;

pub type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// An engine over the in-process S3 server `s3`, with default reads and
/// `decode_threads` decode threads.
pub(crate) fn engine_over(
    s3: &s3mem::RunningS3,
    decode_threads: usize,
) -> Result<Engine, BenchError> {
    let registry = DatasetRegistry::new(
        s3.s3_config(),
        crate::store::retry::RetryPolicy::default(),
        PipelineConfig::default().read,
    );
    let config = EngineConfig {
        decode_threads,
        ..EngineConfig::default()
    };
    Ok(Engine::new(Arc::new(registry), config)?)
}

/// torchvision's training recipe at 224x224: RandomResizedCrop + flip.
// `..Ops::NONE` keeps this true when the table gains an op.
#[allow(clippy::needless_update)]
pub(crate) const TRAIN: crate::decode::OutputSpec = crate::decode::OutputSpec {
    height: 224,
    width: 224,
    crop: crate::decode::Crop::RandomResized(crate::decode::RandomResizedCrop {
        scale: (0.08, 1.0),
        ratio: (3.0 / 4.0, 4.0 / 3.0),
    }),
    resample: crate::decode::Resample::Bilinear,
    ops: crate::decode::Ops {
        horizontal_flip: crate::decode::HorizontalFlip(0.5),
        ..crate::decode::Ops::NONE
    },
};

/// The median of `values` (reordered).
pub(crate) fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// A stream's pace over one epoch.
pub(crate) struct EpochFigures {
    pub samples_per_second: f64,
    /// The whole process's CPU time (decode pool, readers, the in-process
    /// S3 server) per sample.
    pub cpu_ms_per_sample: f64,
}

/// Rank 0 of 1 reading `dataset` for one epoch, shuffled, with `output`.
pub(crate) fn bench_request(
    dataset: &str,
    batch_size: u32,
    output: crate::decode::OutputSpec,
    seed: u64,
    epoch: u64,
) -> crate::engine::StreamRequest {
    crate::engine::StreamRequest::one(
        dataset,
        crate::plan::PlanRequest {
            seed,
            epoch,
            rank: 0,
            world_size: 1,
            batch_size,
            shuffle: crate::plan::ShuffleConfig::default(),
            partition: crate::plan::Partition::DropLast,
            repeats: 1,
            start_batch: 0,
            resume_from: crate::plan::EpochPosition::default(),
        },
        output,
    )
}

/// Drains one stream of `request`, timing it and the process's CPU.
pub(crate) async fn measured_epoch(
    engine: &Engine,
    request: crate::engine::StreamRequest,
) -> Result<EpochFigures, BenchError> {
    let (cpu_before, _) = super::kernel::cpu_and_peak_rss();
    let started = std::time::Instant::now();
    let mut batches = engine.open_stream(request).await?.batches;
    let mut samples = 0u64;
    while let Some(batch) = batches.recv().await {
        samples += batch?.size as u64;
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = super::kernel::cpu_and_peak_rss().0 - cpu_before;
    Ok(EpochFigures {
        samples_per_second: samples as f64 / wall,
        cpu_ms_per_sample: 1e3 * cpu / samples.max(1) as f64,
    })
}

#[derive(Debug, Clone)]
pub struct CacheBenchSpec {
    pub shards: usize,
    pub samples_per_shard: usize,
    /// Bytes of ignored payload per sample (sizes the shards).
    pub sample_bytes: usize,
    /// Cache size as a fraction of the dataset.
    pub cache_fraction: f64,
    pub epochs: u64,
}

impl Default for CacheBenchSpec {
    fn default() -> Self {
        Self {
            shards: 40,
            samples_per_shard: 32,
            sample_bytes: 16 << 10,
            cache_fraction: 0.5,
            epochs: 3,
        }
    }
}

/// Streams `epochs` epochs through a cache of `cache_fraction` of the dataset
/// with each eviction policy; prints the S3 bytes each epoch fetched.
pub async fn cache_policy(spec: &CacheBenchSpec) -> Result<(), BenchError> {
    let s3 = s3mem::start(0).await?;
    let client = crate::store::s3::client(&s3.s3_config()).await;
    client.create_bucket().bucket("bench").send().await?;
    let store: Arc<dyn ObjectStore> = Arc::new(S3Store::new(client, "bench"));
    let jpeg = {
        let pixels = synthetic::synthetic_image(1, 1, 1, 32, 32);
        let mut out = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 80).encode_image(&pixels)?;
        out
    };
    let filler = vec![7u8; spec.sample_bytes];
    let mut dataset_bytes = 0u64;
    for shard in 0..spec.shards {
        let mut tar = TarWriter::new();
        for i in 0..spec.samples_per_shard {
            let key = format!("s{shard:04}-{i:04}");
            tar.append(&format!("{key}.jpg"), &jpeg);
            tar.append(&format!("{key}.bin"), &filler);
            tar.append(&format!("{key}.cls"), b"1");
        }
        let tar = tar.finish();
        dataset_bytes += tar.len() as u64;
        store
            .put(&format!("data/shard-{shard:05}.tar"), Bytes::from(tar))
            .await?;
    }
    let read = ReadConfig {
        part_size: 256 << 10,
        ..ReadConfig::default()
    };
    let location = DatasetLocation::prefix("data/");
    let (index, shard_indexes) =
        build_index(store.clone(), &location, &read, BadShardPolicy::Fail).await?;
    write_index(store.as_ref(), &location, &index, &shard_indexes).await?;
    let cache_bytes = (dataset_bytes as f64 * spec.cache_fraction) as u64;

    // "none" first: the first epoch's time without a cache is the baseline
    // for the cost of filling the cache while streaming.
    for (name, policy) in [
        ("none", None),
        ("lru", Some(EvictionPolicy::Lru)),
        ("planned", Some(EvictionPolicy::Planned)),
    ] {
        let dir = tempdir()?;
        let mut registry = DatasetRegistry::new(s3.s3_config(), Default::default(), read.clone());
        if let Some(policy) = policy {
            registry = registry.with_cache(DiskCache::open(CacheConfig {
                max_bytes: cache_bytes,
                min_free_percent: 0.0,
                // As in production: one cache block per ranged GET.
                block_size: read.part_size,
                policy,
                ..CacheConfig::new(dir.clone())
            })?);
        }
        let engine = Engine::new(
            Arc::new(registry),
            EngineConfig {
                pipeline: PipelineConfig {
                    read: read.clone(),
                    ..PipelineConfig::default()
                },
                ..EngineConfig::default()
            },
        )?;
        let local =
            LocalServer::loopback(ShardfeedService::new(engine, ServiceConfig::default())).await?;
        let mut client = local.client().await?;
        let epochs = if policy.is_none() { 1 } else { spec.epochs };
        for epoch in 0..epochs {
            let before = s3.state.counts.get_bytes.load(Ordering::SeqCst);
            let started = std::time::Instant::now();
            let request = pb::StreamBatchesRequest {
                dataset: "s3://bench/data/".into(),
                epoch,
                world_size: 1,
                batch_size: Some(16),
                height: 32,
                width: 32,
                ..Default::default()
            };
            let mut stream = client.stream_batches(request).await?.into_inner();
            while stream.message().await?.is_some() {}
            let seconds = started.elapsed().as_secs_f64();
            let fetched = s3.state.counts.get_bytes.load(Ordering::SeqCst) - before;
            println!(
                "{{\"policy\":\"{name}\",\"epoch\":{},\"dataset_bytes\":{dataset_bytes},\"cache_bytes\":{cache_bytes},\"s3_bytes\":{fetched},\"s3_fraction_of_dataset\":{:.3},\"seconds\":{seconds:.3}}}",
                epoch + 1,
                fetched as f64 / dataset_bytes as f64
            );
        }
        local.stop().await?;
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

fn tempdir() -> std::io::Result<std::path::PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("shardfeed-bench-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

#[derive(Debug, Clone)]
pub struct EntitlementSpec {
    pub batch_size: u32,
    /// Output size and transform (crop kind, flip).
    pub output: crate::decode::OutputSpec,
    pub decode_threads: usize,
    pub pipeline: PipelineConfig,
    /// Stop after this many batches (0: the whole epoch).
    pub max_batches: u64,
}

/// JPEGs the single-thread kernel rate is measured on.
const KERNEL_SAMPLES: usize = 200;

/// Up to `count` JPEGs from the start of the dataset's first shard (or its
/// first loose objects).
async fn first_jpegs(
    dataset: &crate::dataset::Dataset,
    count: usize,
) -> Result<Vec<Vec<u8>>, BenchError> {
    use crate::shard::splitter::SampleSplitter;
    use crate::shard::ImageFormat;
    if dataset.is_loose() {
        let index = dataset.shard_index(0).await?;
        let objects = (0..index.keys.len().min(count)).map(|i| dataset.object(&index, i));
        let mut jpegs = Vec::new();
        for object in objects {
            let data = crate::store::read::read_object(dataset.store.as_ref(), &object).await?;
            if ImageFormat::sniff(&data) == Some(ImageFormat::Jpeg) {
                jpegs.push(data.to_vec());
            }
        }
        return Ok(jpegs);
    }
    let first_size = dataset.index.shards[0].size.min(64 << 20);
    let bytes = crate::store::read::read_range(
        dataset.store.as_ref(),
        &dataset.shard_key(0),
        0..first_size,
        dataset.index.shards[0].etag.as_deref(),
    )
    .await?;
    let mut splitter = SampleSplitter::new(0, crate::shard::DEFAULT_MAX_MEMBER_BYTES);
    splitter.push(&bytes);
    let mut jpegs = Vec::new();
    while let Ok(Some(sample)) = splitter.next_sample() {
        if let Some((ImageFormat::Jpeg, data)) = sample.image {
            jpegs.push(data.to_vec());
        }
        if jpegs.len() == count {
            break;
        }
    }
    Ok(jpegs)
}

/// The entitlement benchmark: fetch + parse + decode + batch for one rank,
/// no gRPC. Prints progress to stderr and a summary (and a JSON line) to stdout.
pub async fn entitlement(
    registry: Arc<DatasetRegistry>,
    uri: &str,
    spec: &EntitlementSpec,
) -> Result<serde_json::Value, BenchError> {
    use crate::decode::{default_decoder, default_decoder_name};

    let dataset = registry.open(uri).await?;
    let output = spec.output;
    let decoder = default_decoder();
    let (kernel_rate, psnr) = kernel_figures(&dataset, decoder.clone(), output).await?;
    let mean_sample_bytes = dataset.index.bytes() as f64 / dataset.index.samples().max(1) as f64;

    let plan_request = crate::plan::PlanRequest {
        seed: 0,
        epoch: 0,
        rank: 0,
        world_size: 1,
        batch_size: spec.batch_size,
        shuffle: crate::plan::ShuffleConfig::default(),
        partition: crate::plan::Partition::DropLast,
        repeats: 1,
        start_batch: 0,
        resume_from: crate::plan::EpochPosition::default(),
    };
    let timed = Arc::new(TimedDecoder::new(decoder));
    let engine = Engine::with_decoder(
        registry,
        EngineConfig {
            pipeline: spec.pipeline.clone(),
            decode_threads: spec.decode_threads,
            ..EngineConfig::default()
        },
        timed.clone(),
    )?;
    let (cpu_before, _) = cpu_and_peak_rss();
    let started = std::time::Instant::now();
    let mut receiver = engine
        .open_stream(StreamRequest::one(uri, plan_request, output))
        .await?
        .batches;
    let (samples, payload, first_batch) = drain(&mut receiver, spec, started).await?;
    drop(receiver);
    let wall = started.elapsed().as_secs_f64();
    let (cpu_after, peak_rss) = cpu_and_peak_rss();
    let cpu = cpu_after - cpu_before;
    let decode_seconds = timed.nanos.load(Ordering::Relaxed) as f64 / 1e9;
    let rate = samples as f64 / wall;
    let cores = spec.decode_threads as f64;
    let first_batch_seconds = first_batch.map_or(0.0, |d| d.as_secs_f64());
    // CPU the decode kernel alone would need for these samples.
    let kernel_cpu = samples as f64 / kernel_rate.max(1e-9);
    let summary = serde_json::json!({
        "benchmark": "entitlement",
        "dataset": uri,
        "decoder": default_decoder_name(),
        "batch_size": spec.batch_size,
        "image_size": spec.output.width,
        "transform": format!("{:?}", spec.output.crop),
        "flip": spec.output.ops.horizontal_flip.0,
        "decode_threads": spec.decode_threads,
        "samples": samples,
        "wall_seconds": wall,
        "samples_per_second": rate,
        "compressed_mb_per_second": rate * mean_sample_bytes / 1e6,
        "output_mb_per_second": payload as f64 / wall / 1e6,
        "first_batch_seconds": first_batch_seconds,
        "kernel_samples_per_second_per_thread": kernel_rate,
        "fraction_of_kernel_times_threads": rate / (kernel_rate * cores).max(1e-9),
        "psnr_vs_full_decode_lanczos_db": psnr,
        "cpu_seconds": cpu,
        "cpu_utilisation_cores": cpu / wall,
        "decode_resize_seconds": decode_seconds,
        "cpu_share_outside_decode": ((cpu - decode_seconds) / cpu.max(1e-9)).max(0.0),
        "cpu_share_beyond_kernel": ((cpu - kernel_cpu) / cpu.max(1e-9)).max(0.0),
        "peak_rss_bytes": peak_rss,
    });
    Ok(summary)
}

/// The kernel's rate: one thread, decode + resize of the first shard's
/// JPEGs, and their PSNR against a full decode (0 and 0 without JPEGs).
async fn kernel_figures(
    dataset: &crate::dataset::Dataset,
    decoder: Arc<dyn crate::decode::Decoder>,
    output: crate::decode::OutputSpec,
) -> Result<(f64, f64), BenchError> {
    let jpegs = first_jpegs(dataset, KERNEL_SAMPLES).await?;
    if jpegs.is_empty() {
        return Ok((0.0, 0.0));
    }
    let jpegs = Arc::new(jpegs);
    let figures =
        tokio::task::spawn_blocking(move || decode_kernel(decoder.as_ref(), &jpegs, &output, 2))
            .await?;
    Ok((figures.rate, figures.psnr))
}

/// Takes the stream's batches (up to `spec.max_batches`), printing the
/// rate every half second: its samples, output bytes and first batch's
/// time.
async fn drain(
    receiver: &mut crate::pipeline::BatchReceiver,
    spec: &EntitlementSpec,
    started: std::time::Instant,
) -> Result<(u64, u64, Option<std::time::Duration>), BenchError> {
    use std::io::Write;
    let (mut samples, mut batches, mut payload) = (0u64, 0u64, 0u64);
    let mut first_batch = None;
    let mut last_print = std::time::Instant::now();
    while let Some(batch) = receiver.recv().await {
        let batch = batch?;
        first_batch.get_or_insert_with(|| started.elapsed());
        samples += batch.size as u64;
        payload += (batch.size * spec.output.bytes()) as u64;
        batches += 1;
        if last_print.elapsed().as_millis() >= 500 {
            last_print = std::time::Instant::now();
            eprint!(
                "\r{batches} batches, {samples} samples, {:.0} samples/s   ",
                samples as f64 / started.elapsed().as_secs_f64()
            );
            std::io::stderr().flush()?;
        }
        if spec.max_batches > 0 && batches >= spec.max_batches {
            break;
        }
    }
    eprintln!();
    Ok((samples, payload, first_batch))
}

/// Where `shardfeed bench` reads from.
#[derive(Debug, Clone)]
pub enum BenchSource {
    /// A dataset the configured store reaches.
    Uri {
        uri: String,
        s3: crate::store::s3::S3Config,
    },
    /// A synthetic photo dataset in an in-process S3 server, with a delay
    /// before every GET response (S3's time to first byte).
    Synthetic {
        data: SyntheticSpec,
        get_delay: Duration,
        /// Run alternately without and with this delay and print the ratio.
        compare_get_delay: Option<Duration>,
    },
}

/// `shardfeed bench`: the entitlement benchmark, printed for people and as JSON.
pub async fn run(source: BenchSource, spec: &EntitlementSpec) -> Result<(), BenchError> {
    let retry = crate::store::retry::RetryPolicy::default();
    let read = spec.pipeline.read.clone();
    let (registry, uri, s3) = match source {
        BenchSource::Uri { uri, s3 } => (DatasetRegistry::new(s3, retry, read), uri, None),
        BenchSource::Synthetic {
            data,
            get_delay,
            compare_get_delay,
        } => {
            let s3 = s3mem::start(0).await?;
            eprintln!(
                "synthesizing {} photo-like JPEGs ...",
                data.shards * data.samples_per_shard
            );
            let uri = synthetic::publish(&s3, &data).await?;
            s3.state.faults.set_get_delay(get_delay);
            let registry = DatasetRegistry::new(s3.s3_config(), retry, read);
            (registry, uri, Some((s3, compare_get_delay)))
        }
    };
    let registry = Arc::new(registry);
    if let Some((s3, Some(delay))) = &s3 {
        return compare_get_delay(registry, &uri, spec, s3, *delay).await;
    }
    let summary = entitlement(registry, &uri, spec).await?;
    let get = |key: &str| summary[key].as_f64().unwrap_or(0.0);
    println!(
        "{} samples in {:.2}s: {:.0} samples/s, {:.1} MB/s compressed, first batch after {:.0} ms",
        summary["samples"],
        get("wall_seconds"),
        get("samples_per_second"),
        get("compressed_mb_per_second"),
        get("first_batch_seconds") * 1e3
    );
    println!(
        "decode+resize kernel: {:.0} samples/s per thread x {} threads; pipeline reaches {:.0}% of that; PSNR {:.1} dB vs full decode + Lanczos3",
        get("kernel_samples_per_second_per_thread"),
        spec.decode_threads,
        100.0 * get("fraction_of_kernel_times_threads"),
        get("psnr_vs_full_decode_lanczos_db")
    );
    println!(
        "CPU: {:.2} s ({:.2} cores busy), {:.2} s decoding+resizing: {:.1}% outside decode ({:.1}% beyond the kernel's own cost); peak RSS {:.0} MB",
        get("cpu_seconds"),
        get("cpu_utilisation_cores"),
        get("decode_resize_seconds"),
        100.0 * get("cpu_share_outside_decode"),
        100.0 * get("cpu_share_beyond_kernel"),
        get("peak_rss_bytes") / 1e6
    );
    println!("{summary}");
    Ok(())
}

/// The entitlement benchmark alternately without and with a first-byte delay
/// on every GET, on one dataset in one process, so the ratio is not skewed
/// by a machine that got busier between two separate runs.
async fn compare_get_delay(
    registry: Arc<DatasetRegistry>,
    uri: &str,
    spec: &EntitlementSpec,
    s3: &s3mem::RunningS3,
    delay: Duration,
) -> Result<(), BenchError> {
    let mut rates: [Vec<f64>; 2] = Default::default();
    let mut first_batch: [Vec<f64>; 2] = Default::default();
    for _round in 0..2 {
        for (slot, delay) in [Duration::ZERO, delay].into_iter().enumerate() {
            s3.state.faults.set_get_delay(delay);
            let summary = entitlement(registry.clone(), uri, spec).await?;
            let rate = summary["samples_per_second"].as_f64().unwrap_or(0.0);
            let first = summary["first_batch_seconds"].as_f64().unwrap_or(0.0);
            println!(
                "GET delay {:>3} ms: {rate:.0} samples/s, first batch after {:.0} ms",
                delay.as_millis(),
                first * 1e3
            );
            rates[slot].push(rate);
            first_batch[slot].push(first);
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let ratio = mean(&rates[1]) / mean(&rates[0]).max(1e-9);
    let delay_ms = delay.as_millis();
    println!(
        "with {delay_ms} ms before every GET: {:.1}% of the throughput without ({:+.1}%)",
        100.0 * ratio,
        100.0 * (ratio - 1.0)
    );
    println!(
        "{}",
        serde_json::json!({
            "benchmark": "get_delay",
            "get_delay_ms": delay_ms,
            "samples_per_second_without": rates[0],
            "samples_per_second_with": rates[1],
            "first_batch_seconds_without": first_batch[0],
            "first_batch_seconds_with": first_batch[1],
            "throughput_ratio": ratio,
        })
    );
    Ok(())
}
