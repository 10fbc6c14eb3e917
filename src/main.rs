//! The `shardfeed` binary: parses configuration, starts logging and metrics,
//! and calls into the library.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand, ValueEnum};

use shardfeed::dataset::{build_index, write_index, DatasetRegistry, DatasetUri};
use shardfeed::pipeline::{self, PipelineConfig};
use shardfeed::plan::{self, ShuffleConfig};
use shardfeed::server::{self, ListenAddr, Listener, ServiceConfig, ShardfeedService};
use shardfeed::store::cache::{self, CacheConfig, DiskCache, EvictionPolicy};
use shardfeed::store::retry::{self, ReadConfig, RetryPolicy};
use shardfeed::store::s3::S3Config;

#[derive(Parser, Debug)]
#[command(
    name = "shardfeed",
    version,
    about = "Streams decoded, batched images from tar shards in S3 to GPU trainers over gRPC"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format.
    #[arg(long, global = true, env = "SHARDFEED_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve batches over gRPC.
    Serve(ServeArgs),
    /// Scan a dataset's shards and write its index beside them.
    Index(IndexArgs),
    /// Fill the disk cache with a dataset ahead of training, within its size limit.
    Warm(WarmArgs),
    /// Run the whole path on a synthetic dataset in an in-process S3 server.
    Demo(DemoArgs),
    /// Exit 0 if the server at --listen reports SERVING (for probes).
    Health(HealthArgs),
    /// Entitlement benchmark: fetch + parse + decode + batch for one rank, no
    /// gRPC. With --synthetic, on a demo-like dataset in an in-process S3.
    Bench(BenchArgs),
    /// Compare cache eviction policies: S3 bytes per epoch with a cache of
    /// half the dataset (in-process S3 server). Prints JSON lines.
    CacheBench,
    /// Compare shuffle quality with the WebDataset recipe on a class-sorted
    /// dataset (no I/O: the plan alone decides the order). Prints JSON lines.
    ShuffleQuality(ShuffleQualityArgs),
    /// Run an in-memory S3-compatible server for tests and benchmarks (data
    /// is lost on exit; credentials: shardfeed-demo / shardfeed-demo-secret).
    DevS3(DevS3Args),
}

#[derive(Args, Debug)]
struct ShuffleQualityArgs {
    #[arg(long, default_value_t = 100)]
    classes: u32,
    #[arg(long, default_value_t = 500)]
    samples_per_class: u64,
    /// Shards hold 1-2 classes when this is at most samples_per_class.
    #[arg(long, default_value_t = 400)]
    samples_per_shard: u64,
    #[arg(long, default_value_t = 128)]
    batch_size: u32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Args, Debug)]
struct BenchArgs {
    /// s3://bucket/prefix/ or file:///abs/dir/ (omit with --synthetic).
    uri: Option<String>,
    /// Benchmark a synthetic photo-like dataset served from memory.
    #[arg(long)]
    synthetic: bool,
    /// Synthetic dataset: shards and samples per shard.
    #[arg(long, default_value_t = 16)]
    shards: usize,
    #[arg(long, default_value_t = 256)]
    samples_per_shard: usize,
    /// Synthetic dataset: delay before every GET response, like S3's time to first byte.
    #[arg(long, default_value_t = 0)]
    get_delay_ms: u64,
    /// Synthetic dataset: run twice without and twice with this GET delay,
    /// alternating, and print the throughput ratio.
    #[arg(long)]
    compare_get_delay_ms: Option<u64>,
    #[arg(long, default_value_t = 128)]
    batch_size: u32,
    #[arg(long, default_value_t = 224)]
    image_size: u32,
    #[arg(long)]
    decode_threads: Option<usize>,
    /// Stop after this many batches (0: one whole epoch).
    #[arg(long, default_value_t = 0)]
    max_batches: u64,
    #[command(flatten)]
    s3: S3Args,
    #[command(flatten)]
    read: ReadArgs,
}

#[derive(Args, Debug)]
struct HealthArgs {
    /// The server's gRPC address (the same value it was started with).
    #[arg(long, env = "SHARDFEED_LISTEN", default_value = "127.0.0.1:50051")]
    listen: String,
}

#[derive(Args, Debug)]
struct DevS3Args {
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Delay before every GET response, like S3's time to first byte.
    #[arg(long, default_value_t = 0)]
    get_delay_ms: u64,
    /// Fail every Nth GET with 503 SlowDown, as a throttled bucket does (0: never).
    #[arg(long, default_value_t = 0)]
    slow_down_every: u64,
    /// Publish the demo's synthetic photo dataset (this many shards) before
    /// listening, so benchmarks elsewhere read the same data as `shardfeed bench --synthetic`.
    #[arg(long, default_value_t = 0)]
    synthetic_shards: usize,
    #[arg(long, default_value_t = shardfeed::demo::SyntheticSpec::default().samples_per_shard)]
    samples_per_shard: usize,
}

#[derive(Args, Debug, Clone)]
struct S3Args {
    /// S3 endpoint URL (default: the AWS chain, e.g. AWS_ENDPOINT_URL).
    #[arg(long, env = "SHARDFEED_S3_ENDPOINT")]
    s3_endpoint: Option<String>,
    /// Address buckets as https://endpoint/bucket (most S3-compatible servers).
    #[arg(long, env = "SHARDFEED_S3_FORCE_PATH_STYLE")]
    s3_force_path_style: bool,
    /// Region (default: the AWS chain, then us-east-1).
    #[arg(long, env = "SHARDFEED_S3_REGION")]
    s3_region: Option<String>,
}

impl S3Args {
    fn config(&self) -> S3Config {
        S3Config {
            endpoint: self.s3_endpoint.clone(),
            force_path_style: self.s3_force_path_style,
            region: self.s3_region.clone(),
            static_credentials: None,
        }
    }
}

#[derive(Args, Debug, Clone)]
struct ReadArgs {
    /// Bytes per ranged GET.
    #[arg(long, env = "SHARDFEED_PART_SIZE", default_value_t = retry::DEFAULT_PART_SIZE)]
    part_size: u64,
    /// Ranged GETs in flight per shard reader.
    #[arg(long, env = "SHARDFEED_PARTS_IN_FLIGHT", default_value_t = retry::DEFAULT_PARTS_IN_FLIGHT)]
    parts_in_flight: usize,
    /// Attempts per S3 request before the stream fails with UNAVAILABLE.
    #[arg(long, env = "SHARDFEED_S3_MAX_ATTEMPTS", default_value_t = RetryPolicy::default().max_attempts)]
    s3_max_attempts: u32,
}

impl ReadArgs {
    fn config(&self) -> ReadConfig {
        ReadConfig {
            part_size: self.part_size,
            parts_in_flight: self.parts_in_flight,
            retry: RetryPolicy {
                max_attempts: self.s3_max_attempts,
                ..RetryPolicy::default()
            },
        }
    }

    fn problems(&self, problems: &mut Vec<String>) {
        if self.part_size < 64 << 10 {
            problems.push(format!("--part-size {} is below 64 KiB", self.part_size));
        }
        if self.parts_in_flight == 0 {
            problems.push("--parts-in-flight must be at least 1".into());
        }
        if self.s3_max_attempts == 0 {
            problems.push("--s3-max-attempts must be at least 1".into());
        }
    }
}

#[derive(Args, Debug, Clone)]
struct CacheArgs {
    /// Directory of the host's shard cache (shared by every stream). Unset: no cache.
    #[arg(long, env = "SHARDFEED_CACHE_DIR")]
    cache_dir: Option<std::path::PathBuf>,
    /// Most bytes the cache may hold, e.g. 500G, 64Gi, 1T.
    #[arg(long, env = "SHARDFEED_CACHE_SIZE", value_parser = parse_size, default_value = "100G")]
    cache_size: u64,
    /// Free disk space (percent of the file system) the cache always leaves.
    #[arg(long, env = "SHARDFEED_CACHE_MIN_FREE_PERCENT", default_value_t = cache::DEFAULT_MIN_FREE_PERCENT)]
    cache_min_free_percent: f64,
    /// Eviction: `planned` (what the streams' plans need furthest ahead) or `lru`.
    #[arg(long, env = "SHARDFEED_CACHE_POLICY", value_enum, default_value_t = PolicyArg::Planned)]
    cache_policy: PolicyArg,
    /// Seconds listings and object metadata are trusted (0: for the process's life).
    #[arg(long, env = "SHARDFEED_METADATA_TTL", default_value_t = 0)]
    metadata_ttl: u64,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum PolicyArg {
    Planned,
    Lru,
}

impl CacheArgs {
    fn problems(&self, problems: &mut Vec<String>) {
        if !(0.0..100.0).contains(&self.cache_min_free_percent) {
            problems.push("--cache-min-free-percent must be in [0, 100)".into());
        }
    }

    fn open(&self) -> anyhow::Result<Option<Arc<DiskCache>>> {
        let Some(dir) = &self.cache_dir else {
            return Ok(None);
        };
        let cache = DiskCache::open(CacheConfig {
            dir: dir.clone(),
            max_bytes: self.cache_size,
            min_free_percent: self.cache_min_free_percent,
            block_size: cache::DEFAULT_BLOCK_SIZE,
            policy: match self.cache_policy {
                PolicyArg::Planned => EvictionPolicy::Planned,
                PolicyArg::Lru => EvictionPolicy::Lru,
            },
            metadata_ttl: (self.metadata_ttl > 0).then(|| Duration::from_secs(self.metadata_ttl)),
        })?;
        Ok(Some(cache))
    }
}

/// Sizes like `100G` (10^9), `64Gi` (2^30) or plain bytes.
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size like 500G"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "ki" | "kib" => 1024.0,
        "mi" | "mib" => 1024f64.powi(2),
        "gi" | "gib" => 1024f64.powi(3),
        "ti" | "tib" => 1024f64.powi(4),
        other => return Err(format!("unknown size unit {other:?} in {text:?}")),
    };
    Ok((number * scale) as u64)
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// gRPC address: host:port or unix:/path/to.sock.
    #[arg(long, env = "SHARDFEED_LISTEN", default_value = "127.0.0.1:50051")]
    listen: String,
    /// Prometheus metrics address (serves /metrics).
    #[arg(
        long,
        env = "SHARDFEED_METRICS_LISTEN",
        default_value = "127.0.0.1:9464"
    )]
    metrics_listen: String,
    #[command(flatten)]
    s3: S3Args,
    #[command(flatten)]
    read: ReadArgs,
    #[command(flatten)]
    cache: CacheArgs,
    /// Decode threads (default: one per core).
    #[arg(long, env = "SHARDFEED_DECODE_THREADS")]
    decode_threads: Option<usize>,
    /// Streams open at once; more get RESOURCE_EXHAUSTED.
    #[arg(long, env = "SHARDFEED_MAX_STREAMS", default_value_t = server::DEFAULT_MAX_STREAMS)]
    max_streams: usize,
    /// Shard readers started ahead of the ones in use, per stream.
    #[arg(long, env = "SHARDFEED_PREFETCH_SHARDS", default_value_t = pipeline::DEFAULT_PREFETCH_SEGMENTS)]
    prefetch_shards: usize,
    /// Decoded batches queued per stream for the client.
    #[arg(long, env = "SHARDFEED_READY_BATCHES", default_value_t = pipeline::DEFAULT_READY_BATCHES)]
    ready_batches: usize,
    /// Default shuffle buffer in samples (requests may override).
    #[arg(long, env = "SHARDFEED_SHUFFLE_BUFFER", default_value_t = plan::DEFAULT_SHUFFLE_BUFFER)]
    shuffle_buffer: u32,
    /// Default shards read at once per rank (requests may override).
    #[arg(long, env = "SHARDFEED_INTERLEAVE", default_value_t = plan::DEFAULT_INTERLEAVE)]
    interleave: u32,
    /// Dataset URI prefix that may be requested (repeatable). Without any,
    /// every dataset the pod's credentials can read may be requested.
    #[arg(long = "allow", env = "SHARDFEED_ALLOW", value_delimiter = ',')]
    allow: Vec<String>,
    /// Seconds open streams may run on after SIGTERM.
    #[arg(long, env = "SHARDFEED_SHUTDOWN_GRACE", default_value_t = server::DEFAULT_SHUTDOWN_GRACE.as_secs())]
    shutdown_grace: u64,
}

#[derive(Args, Debug)]
struct IndexArgs {
    /// s3://bucket/prefix/ or file:///abs/dir/
    uri: String,
    #[command(flatten)]
    s3: S3Args,
    #[command(flatten)]
    read: ReadArgs,
}

#[derive(Args, Debug)]
struct WarmArgs {
    /// s3://bucket/prefix/
    uri: String,
    #[command(flatten)]
    s3: S3Args,
    #[command(flatten)]
    read: ReadArgs,
    #[command(flatten)]
    cache: CacheArgs,
}

#[derive(Args, Debug)]
struct DemoArgs {
    #[arg(long, default_value_t = 8)]
    shards: usize,
    #[arg(long, default_value_t = 192)]
    samples_per_shard: usize,
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    #[arg(long, default_value_t = 128)]
    batch_size: u32,
    #[arg(long, default_value_t = 224)]
    image_size: u32,
    #[arg(long)]
    decode_threads: Option<usize>,
    /// Read through a disk cache in this directory.
    #[arg(long)]
    cache_dir: Option<std::path::PathBuf>,
}

fn init_logging(format: LogFormat, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SHARDFEED_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("shardfeed-io")
        .build()
        .context("starting the async runtime")?;
    match cli.command {
        Command::Serve(args) => {
            init_logging(cli.log_format, "info");
            runtime.block_on(serve(args))
        }
        Command::Index(args) => {
            init_logging(cli.log_format, "info");
            runtime.block_on(index(args))
        }
        Command::Warm(args) => {
            init_logging(cli.log_format, "warn");
            runtime.block_on(warm(args))
        }
        Command::Bench(args) => {
            init_logging(cli.log_format, "warn");
            runtime.block_on(bench(args))
        }
        Command::CacheBench => {
            init_logging(cli.log_format, "warn");
            runtime
                .block_on(shardfeed::bench::cache_policy(
                    &shardfeed::bench::CacheBenchSpec::default(),
                ))
                .map_err(|e| anyhow::anyhow!(e))
        }
        Command::ShuffleQuality(args) => {
            shuffle_quality(&args);
            Ok(())
        }
        Command::Health(args) => {
            init_logging(cli.log_format, "warn");
            let addr: ListenAddr = args
                .listen
                .parse()
                .map_err(|e| anyhow::anyhow!("--listen: {e}"))?;
            match runtime.block_on(server::check_health(&addr)) {
                Ok(true) => Ok(()),
                Ok(false) => bail!("{addr} is NOT_SERVING"),
                Err(status) => bail!("{addr}: {}", status.message()),
            }
        }
        Command::DevS3(args) => {
            init_logging(cli.log_format, "warn");
            runtime.block_on(dev_s3(args))
        }
        Command::Demo(args) => {
            init_logging(cli.log_format, "warn");
            let defaults = shardfeed::demo::DemoOptions::default();
            let options = shardfeed::demo::DemoOptions {
                data: shardfeed::demo::SyntheticSpec {
                    shards: args.shards,
                    samples_per_shard: args.samples_per_shard,
                    ..defaults.data
                },
                epochs: args.epochs,
                batch_size: args.batch_size,
                image_size: args.image_size,
                decode_threads: args.decode_threads.unwrap_or(defaults.decode_threads),
                cache_dir: args.cache_dir,
            };
            runtime
                .block_on(shardfeed::demo::run(options))
                .map_err(|e| anyhow::anyhow!(e))
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Report every configuration problem at once.
    let mut problems = Vec::new();
    let listen: Option<ListenAddr> = args
        .listen
        .parse()
        .map_err(|e| problems.push(format!("--listen: {e}")))
        .ok();
    let metrics_listen: Option<SocketAddr> = args
        .metrics_listen
        .parse()
        .map_err(|e| problems.push(format!("--metrics-listen {:?}: {e}", args.metrics_listen)))
        .ok();
    args.read.problems(&mut problems);
    args.cache.problems(&mut problems);
    if args.decode_threads == Some(0) {
        problems.push("--decode-threads must be at least 1".into());
    }
    for rule in &args.allow {
        if let Err(error) = DatasetUri::parse(rule) {
            problems.push(format!("--allow {rule:?}: {error}"));
        }
    }
    if args.max_streams == 0 {
        problems.push("--max-streams must be at least 1".into());
    }
    if args.ready_batches == 0 {
        problems.push("--ready-batches must be at least 1".into());
    }
    if args.shuffle_buffer > plan::MAX_SHUFFLE_BUFFER {
        problems.push(format!(
            "--shuffle-buffer exceeds {}",
            plan::MAX_SHUFFLE_BUFFER
        ));
    }
    if args.interleave == 0 || args.interleave > plan::MAX_INTERLEAVE {
        problems.push(format!(
            "--interleave must be in 1..={}",
            plan::MAX_INTERLEAVE
        ));
    }
    let (Some(listen), Some(metrics_listen), true) = (listen, metrics_listen, problems.is_empty())
    else {
        bail!("invalid configuration:\n  {}", problems.join("\n  "));
    };

    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(metrics_listen)
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("_seconds".into()),
            shardfeed::metrics::SECONDS_BUCKETS,
        )?
        .install()
        .with_context(|| format!("starting the metrics listener on {metrics_listen}"))?;
    shardfeed::metrics::describe();

    let mut registry = DatasetRegistry::new(args.s3.config(), args.read.config());
    if let Some(cache) = args.cache.open()? {
        registry = registry.with_cache(cache);
    }
    let registry = Arc::new(registry);
    let pipeline = PipelineConfig {
        read: args.read.config(),
        prefetch_segments: args.prefetch_shards,
        ready_batches: args.ready_batches,
        ..PipelineConfig::default()
    };
    let config = ServiceConfig {
        max_streams: args.max_streams,
        decode_threads: args
            .decode_threads
            .unwrap_or_else(server::default_decode_threads),
        default_shuffle: ShuffleConfig {
            enabled: true,
            interleave: args.interleave,
            buffer: args.shuffle_buffer,
        },
        allow: args.allow.clone(),
    };
    let service = ShardfeedService::new(registry, pipeline, config.clone())
        .context("starting the decode pool")?;
    let listener = Listener::bind(&listen).await?;
    tracing::info!(
        listen = %listener.local_addr(),
        metrics = %metrics_listen,
        decode_threads = config.decode_threads,
        max_streams = config.max_streams,
        allow = ?config.allow,
        "shardfeed serving"
    );
    let grace = Duration::from_secs(args.shutdown_grace);
    server::serve(listener, service, shutdown_signal(), grace).await?;
    tracing::info!("shut down");
    Ok(())
}

/// Resolves on the first SIGTERM or SIGINT; a second one exits at once.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers, never start shutdown from here.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::warn!("second signal: exiting now");
        std::process::exit(1);
    });
}

async fn index(args: IndexArgs) -> anyhow::Result<()> {
    let mut problems = Vec::new();
    args.read.problems(&mut problems);
    if !problems.is_empty() {
        bail!("invalid configuration:\n  {}", problems.join("\n  "));
    }
    let uri = DatasetUri::parse(&args.uri)?;
    let registry = DatasetRegistry::new(args.s3.config(), args.read.config());
    let (store, prefix) = registry.store_for(&uri).await;
    let started = std::time::Instant::now();
    let (index, shard_indexes) =
        build_index(store.clone(), &prefix, registry.read_config()).await?;
    write_index(store.as_ref(), &prefix, &index, &shard_indexes).await?;
    println!(
        "indexed {}: {} shards, {} samples, {:.1} MB in {:.1}s; wrote {}",
        args.uri,
        index.shards.len(),
        index.samples(),
        index.bytes() as f64 / 1e6,
        started.elapsed().as_secs_f64(),
        store.location(&format!("{prefix}{}", shardfeed::dataset::INDEX_DIR)),
    );
    Ok(())
}

async fn dev_s3(args: DevS3Args) -> anyhow::Result<()> {
    use std::io::Write;
    let server = shardfeed::s3mem::start_on(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    if args.synthetic_shards > 0 {
        let spec = shardfeed::demo::SyntheticSpec {
            shards: args.synthetic_shards,
            samples_per_shard: args.samples_per_shard,
            ..Default::default()
        };
        let uri = shardfeed::demo::publish(&server, &spec)
            .await
            .map_err(|e| anyhow::anyhow!(e))?;
        eprintln!("published {uri}");
    }
    // Faults start after publishing, which goes through the same server.
    server
        .state
        .faults
        .set_get_delay(Duration::from_millis(args.get_delay_ms));
    server
        .state
        .faults
        .slow_down_every
        .store(args.slow_down_every, std::sync::atomic::Ordering::Relaxed);
    // Tests read this line to learn the port.
    println!("listening on {}", server.endpoint());
    std::io::stdout().flush()?;
    shutdown_signal().await;
    Ok(())
}

fn shuffle_quality(args: &ShuffleQualityArgs) {
    use shardfeed::plan::quality::{
        measure, shardfeed_order, uniform_order, webdataset_order, SortedDataset,
    };
    let dataset = SortedDataset {
        classes: args.classes,
        samples_per_class: args.samples_per_class,
        samples_per_shard: args.samples_per_shard,
    };
    let batch = args.batch_size as usize;
    let uniform = measure(&dataset, &uniform_order(&dataset, args.seed), batch);
    let defaults = ShuffleConfig::default();
    for world_size in [1u32, 8] {
        for buffer in [1_000u32, defaults.buffer] {
            let rows = [
                (
                    "shardfeed",
                    defaults.interleave,
                    shardfeed_order(
                        &dataset,
                        ShuffleConfig { buffer, ..defaults },
                        world_size,
                        args.batch_size,
                        args.seed,
                    ),
                ),
                (
                    "webdataset_recipe",
                    1,
                    webdataset_order(&dataset, buffer as usize, world_size, args.seed),
                ),
            ];
            for (method, interleave, order) in rows {
                let quality = measure(&dataset, &order, batch);
                // A uniform permutation of this stream's own samples moves
                // each by about a third of the stream.
                let uniform_displacement = order.len() as f64 / 3.0;
                println!(
                    "{{\"method\":\"{method}\",\"world_size\":{world_size},\"buffer_samples\":{buffer},\"interleave\":{interleave},\"samples\":{},\"distinct_labels_per_batch\":{:.2},\"distinct_vs_uniform\":{:.3},\"mean_displacement\":{:.0},\"displacement_vs_uniform\":{:.3}}}",
                    order.len(),
                    quality.distinct_labels_per_batch,
                    quality.distinct_labels_per_batch / uniform.distinct_labels_per_batch,
                    quality.mean_displacement,
                    quality.mean_displacement / uniform_displacement,
                );
            }
        }
    }
    println!(
        "{{\"method\":\"uniform_permutation\",\"samples\":{},\"distinct_labels_per_batch\":{:.2},\"mean_displacement\":{:.0}}}",
        dataset.total(),
        uniform.distinct_labels_per_batch,
        uniform.mean_displacement
    );
}

async fn warm(args: WarmArgs) -> anyhow::Result<()> {
    use std::io::Write;
    let mut problems = Vec::new();
    args.read.problems(&mut problems);
    args.cache.problems(&mut problems);
    if args.cache.cache_dir.is_none() {
        problems.push("--cache-dir is required".into());
    }
    if !problems.is_empty() {
        bail!("invalid configuration:\n  {}", problems.join("\n  "));
    }
    let Some(cache) = args.cache.open()? else {
        bail!("--cache-dir is required");
    };
    let registry =
        DatasetRegistry::new(args.s3.config(), args.read.config()).with_cache(cache.clone());
    let dataset = registry.open(&args.uri).await?;
    let total: u64 = dataset.index.bytes();
    let started = std::time::Instant::now();
    let (mut done, mut warmed) = (0u64, 0usize);
    for (shard, entry) in dataset.index.shards.iter().enumerate() {
        let key = dataset.shard_key(shard as u32);
        let location = dataset.store.location(&key);
        let cached = entry
            .etag
            .as_deref()
            .map_or(0, |etag| cache.cached_bytes(&location, etag));
        if cached >= entry.size {
            // Already cached (an earlier warm, or the index scan just now).
            done += entry.size;
            warmed += 1;
            continue;
        }
        // Stop rather than evict what was just warmed.
        if !cache.fits_without_eviction(entry.size - cached) {
            eprintln!();
            println!(
                "cache full: {warmed} of {} shards cached ({:.1} MB in {}); the rest is read from S3 during training",
                dataset.index.shards.len(),
                cache.used_bytes() as f64 / 1e6,
                cache.config().dir.display(),
            );
            return Ok(());
        }
        let mut parts = std::pin::pin!(shardfeed::store::retry::read_parts(
            dataset.store.clone(),
            key,
            0..entry.size,
            entry.etag.clone(),
            args.read.config(),
        ));
        while let Some(part) = futures::StreamExt::next(&mut parts).await {
            done += part?.1.len() as u64;
            let seconds = started.elapsed().as_secs_f64().max(1e-9);
            eprint!(
                "\rwarming {}: {:>5.1}% of {:.2} GB, {:.0} MB/s   ",
                args.uri,
                100.0 * done as f64 / total.max(1) as f64,
                total as f64 / 1e9,
                done as f64 / seconds / 1e6
            );
            std::io::stderr().flush()?;
        }
        warmed += 1;
    }
    eprintln!();
    println!(
        "all {warmed} shards cached ({:.1} MB) in {} after {:.1}s",
        total as f64 / 1e6,
        cache.config().dir.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let mut problems = Vec::new();
    args.read.problems(&mut problems);
    if args.synthetic == args.uri.is_some() {
        problems.push("give either a dataset URI or --synthetic".into());
    }
    if args.compare_get_delay_ms.is_some() && !args.synthetic {
        problems.push("--compare-get-delay-ms needs --synthetic".into());
    }
    if !problems.is_empty() {
        bail!("invalid configuration:\n  {}", problems.join("\n  "));
    }
    let threads = args
        .decode_threads
        .unwrap_or_else(server::default_decode_threads);
    let spec = shardfeed::bench::EntitlementSpec {
        batch_size: args.batch_size,
        image_size: args.image_size,
        decode_threads: threads,
        pipeline: PipelineConfig {
            read: args.read.config(),
            ..PipelineConfig::default()
        },
        max_batches: args.max_batches,
    };
    let (registry, uri, s3) = if args.synthetic {
        let s3 = shardfeed::s3mem::start(0).await?;
        let data = shardfeed::demo::SyntheticSpec {
            shards: args.shards,
            samples_per_shard: args.samples_per_shard,
            ..Default::default()
        };
        eprintln!(
            "synthesizing {} photo-like JPEGs ...",
            data.shards * data.samples_per_shard
        );
        let uri = shardfeed::demo::publish(&s3, &data)
            .await
            .map_err(|e| anyhow::anyhow!(e))?;
        s3.state
            .faults
            .set_get_delay(Duration::from_millis(args.get_delay_ms));
        let registry = DatasetRegistry::new(s3.s3_config(), args.read.config());
        (registry, uri, Some(s3))
    } else {
        let uri = args.uri.clone().unwrap_or_default();
        (
            DatasetRegistry::new(args.s3.config(), args.read.config()),
            uri,
            None,
        )
    };
    let registry = Arc::new(registry);
    if let (Some(delay_ms), Some(s3)) = (args.compare_get_delay_ms, &s3) {
        return compare_get_delay(registry, &uri, &spec, s3, delay_ms).await;
    }
    let summary = shardfeed::bench::entitlement(registry, &uri, &spec)
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
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
        "decode+resize kernel: {:.0} samples/s per thread x {threads} threads; pipeline reaches {:.0}% of that; PSNR {:.1} dB vs full decode + Lanczos3",
        get("kernel_samples_per_second_per_thread"),
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
    spec: &shardfeed::bench::EntitlementSpec,
    s3: &shardfeed::s3mem::RunningS3,
    delay_ms: u64,
) -> anyhow::Result<()> {
    let mut rates: [Vec<f64>; 2] = Default::default();
    let mut first_batch: [Vec<f64>; 2] = Default::default();
    for _round in 0..2 {
        for (slot, delay) in [0, delay_ms].into_iter().enumerate() {
            s3.state.faults.set_get_delay(Duration::from_millis(delay));
            let summary = shardfeed::bench::entitlement(registry.clone(), uri, spec)
                .await
                .map_err(|e| anyhow::anyhow!(e))?;
            let rate = summary["samples_per_second"].as_f64().unwrap_or(0.0);
            let first = summary["first_batch_seconds"].as_f64().unwrap_or(0.0);
            println!(
                "GET delay {delay:>3} ms: {rate:.0} samples/s, first batch after {:.0} ms",
                first * 1e3
            );
            rates[slot].push(rate);
            first_batch[slot].push(first);
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let ratio = mean(&rates[1]) / mean(&rates[0]).max(1e-9);
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
