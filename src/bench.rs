//! Benchmarks that run the real path in-process and print JSON lines.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use crate::dataset::{build_index, write_index, DatasetRegistry};
use crate::pipeline::PipelineConfig;
use crate::s3mem;
use crate::server::{pb, LocalServer, ServiceConfig, ShardfeedService};
use crate::shard::tar::TarWriter;
use crate::store::cache::{CacheConfig, DiskCache, EvictionPolicy};
use crate::store::retry::ReadConfig;
use crate::store::s3::S3Store;
use crate::store::ObjectStore;

pub type BenchError = Box<dyn std::error::Error + Send + Sync>;

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
        let pixels = crate::demo::synthetic_image(1, 1, 1, 32, 32);
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
    let (index, shard_indexes) = build_index(store.clone(), "data/", &read).await?;
    write_index(store.as_ref(), "data/", &index, &shard_indexes).await?;
    let cache_bytes = (dataset_bytes as f64 * spec.cache_fraction) as u64;

    // "none" first: the first epoch's time without a cache is the baseline
    // for the cost of filling the cache while streaming.
    for (name, policy) in [
        ("none", None),
        ("lru", Some(EvictionPolicy::Lru)),
        ("planned", Some(EvictionPolicy::Planned)),
    ] {
        let dir = tempdir()?;
        let mut registry = DatasetRegistry::new(s3.s3_config(), read.clone());
        if let Some(policy) = policy {
            registry = registry.with_cache(DiskCache::open(CacheConfig {
                dir: dir.clone(),
                max_bytes: cache_bytes,
                min_free_percent: 0.0,
                // As in production: one cache block per ranged GET.
                block_size: read.part_size,
                policy,
                metadata_ttl: None,
            })?);
        }
        let registry = Arc::new(registry);
        let service = ShardfeedService::new(
            registry,
            PipelineConfig {
                read: read.clone(),
                ..PipelineConfig::default()
            },
            ServiceConfig::default(),
        )?;
        let local = LocalServer::loopback(service).await?;
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

/// Single-thread decode + resize rate of `decoder` over `samples` (JPEG
/// bytes), and the mean PSNR of its output against a full-resolution decode
/// with a Lanczos3 resize.
pub fn decode_kernel(
    decoder: &dyn crate::decode::Decoder,
    samples: &[Vec<u8>],
    spec: &crate::decode::OutputSpec,
    rounds: usize,
) -> (f64, f64) {
    use crate::shard::ImageFormat;
    let mut out = vec![0u8; spec.bytes()];
    let mut reference = vec![0u8; spec.bytes()];
    let mut psnr_sum = 0.0;
    let mut measured = 0usize;
    for jpeg in samples.iter().take(64) {
        if decoder
            .decode_into(ImageFormat::Jpeg, jpeg, spec, &mut out)
            .is_ok()
            && crate::decode::reference_decode(ImageFormat::Jpeg, jpeg, spec, &mut reference)
                .is_ok()
        {
            psnr_sum += crate::decode::psnr(&out, &reference).min(99.0);
            measured += 1;
        }
    }
    let started = std::time::Instant::now();
    let mut decoded = 0usize;
    for _ in 0..rounds {
        for jpeg in samples {
            if decoder
                .decode_into(ImageFormat::Jpeg, jpeg, spec, &mut out)
                .is_ok()
            {
                decoded += 1;
            }
        }
    }
    let rate = decoded as f64 / started.elapsed().as_secs_f64();
    (rate, psnr_sum / measured.max(1) as f64)
}

/// CPU time of the calling thread: unlike wall time, it does not count the
/// time a decode thread waits for a core the other processes hold.
fn thread_cpu_nanos() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid out-pointer; the clock id is a constant.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// A decoder wrapper that adds up the CPU time its threads spend decoding.
#[derive(Debug)]
pub struct TimedDecoder {
    inner: Arc<dyn crate::decode::Decoder>,
    pub nanos: Arc<std::sync::atomic::AtomicU64>,
}

impl TimedDecoder {
    pub fn new(inner: Arc<dyn crate::decode::Decoder>) -> Self {
        Self {
            inner,
            nanos: Arc::default(),
        }
    }
}

impl crate::decode::Decoder for TimedDecoder {
    fn decode_into(
        &self,
        format: crate::shard::ImageFormat,
        data: &[u8],
        spec: &crate::decode::OutputSpec,
        out: &mut [u8],
    ) -> Result<(), crate::decode::DecodeError> {
        let started = thread_cpu_nanos();
        let result = self.inner.decode_into(format, data, spec, out);
        self.nanos.fetch_add(
            thread_cpu_nanos().saturating_sub(started),
            Ordering::Relaxed,
        );
        result
    }
}

/// CPU seconds (user + system) this process has used so far, and its peak RSS in bytes.
pub fn cpu_and_peak_rss() -> (f64, u64) {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid out-pointer for the call.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (
        seconds(usage.ru_utime) + seconds(usage.ru_stime),
        usage.ru_maxrss as u64 * 1024,
    )
}

#[derive(Debug, Clone)]
pub struct EntitlementSpec {
    pub batch_size: u32,
    pub image_size: u32,
    pub decode_threads: usize,
    pub pipeline: PipelineConfig,
    /// Stop after this many batches (0: the whole epoch).
    pub max_batches: u64,
}

/// The entitlement benchmark: fetch + parse + decode + batch for one rank,
/// no gRPC. Prints progress to stderr and a summary (and a JSON line) to stdout.
pub async fn entitlement(
    registry: Arc<DatasetRegistry>,
    uri: &str,
    spec: &EntitlementSpec,
) -> Result<serde_json::Value, BenchError> {
    use crate::decode::{default_decoder, default_decoder_name, OutputSpec, ResizeMode};
    use crate::shard::SampleSplitter;
    use std::io::Write;

    let dataset = registry.open(uri).await?;
    let output = OutputSpec {
        height: spec.image_size,
        width: spec.image_size,
        mode: ResizeMode::CenterCrop,
    };
    // Kernel rate: one thread, decode + resize of the first shard's JPEGs.
    let first_key = dataset.shard_key(0);
    let first_size = dataset.index.shards[0].size.min(64 << 20);
    let bytes = crate::store::retry::read_range(
        dataset.store.as_ref(),
        &first_key,
        0..first_size,
        dataset.index.shards[0].etag.as_deref(),
        &spec.pipeline.read.retry,
    )
    .await?;
    let mut splitter = SampleSplitter::new(0, crate::shard::DEFAULT_MAX_MEMBER_BYTES);
    splitter.push(&bytes);
    let mut jpegs = Vec::new();
    while let Ok(Some(sample)) = splitter.next_sample() {
        if let Some((crate::shard::ImageFormat::Jpeg, data)) = sample.image {
            jpegs.push(data.to_vec());
        }
        if jpegs.len() == 200 {
            break;
        }
    }
    let decoder = default_decoder();
    let (kernel_rate, psnr) = if jpegs.is_empty() {
        (0.0, 0.0)
    } else {
        let kernel = decoder.clone();
        let jpegs = Arc::new(jpegs);
        let (rate, psnr) =
            tokio::task::spawn_blocking(move || decode_kernel(kernel.as_ref(), &jpegs, &output, 2))
                .await?;
        (rate, psnr)
    };
    let mean_sample_bytes = dataset.index.bytes() as f64 / dataset.index.samples().max(1) as f64;

    let plan_request = crate::plan::PlanRequest {
        seed: 0,
        epoch: 0,
        rank: 0,
        world_size: 1,
        batch_size: spec.batch_size,
        shuffle: crate::plan::ShuffleConfig::default(),
        partition: crate::plan::Partition::DropLast,
        start_batch: 0,
        resume_from: crate::plan::EpochPosition::default(),
    };
    let plan = crate::plan::plan_stream(&dataset.shard_samples(), &plan_request)?;
    let timed = Arc::new(TimedDecoder::new(decoder));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(spec.decode_threads.max(1))
        .build()?;
    let (cpu_before, _) = cpu_and_peak_rss();
    let started = std::time::Instant::now();
    let mut receiver = crate::pipeline::spawn_stream(
        crate::pipeline::StreamContext {
            dataset: dataset.clone(),
            plan: Arc::new(plan),
            spec: output,
            config: spec.pipeline.clone(),
            pool: Arc::new(pool),
            decoder: timed.clone(),
            cache_hints: None,
        },
        tracing::Span::none(),
    );
    let (mut samples, mut batches, mut payload) = (0u64, 0u64, 0u64);
    let mut first_batch = None;
    let mut last_print = std::time::Instant::now();
    while let Some(batch) = receiver.recv().await {
        let batch = batch?;
        first_batch.get_or_insert_with(|| started.elapsed());
        samples += batch.size as u64;
        payload += batch.images.len() as u64;
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
    drop(receiver);
    eprintln!();
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
        "image_size": spec.image_size,
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
