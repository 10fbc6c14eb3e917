//! The commands and their flags, and how they become the library's configs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::RangedU64ValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};

#[cfg(feature = "dev")]
use super::dev_args::*;
use super::pool_args::{PoolArgs, PoolWorkerArgs};
use super::store_args::{CacheArgs, ReadArgs, S3Args};
use super::values::{parse_size, ConfigError};
use crate::dataset::DatasetUri;
use crate::engine::budget::MemoryConfig;
use crate::engine::sizing::Chosen;
use crate::engine::{self, EngineConfig};
use crate::pipeline::{self, PipelineConfig};
use crate::plan::{self, ShuffleConfig};
use crate::server::{self, ListenAddr, ServiceConfig};
use crate::store::cache::CacheConfig;
use crate::store::read::{self, ReadConfig};
use crate::store::retry::RetryPolicy;
use crate::store::s3::S3Config;

#[derive(Parser, Debug)]
#[command(
    name = "shardfeed",
    version,
    about = "Streams decoded, batched images from tar shards in S3 to GPU trainers over gRPC"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log format.
    #[arg(long, global = true, env = "SHARDFEED_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve batches over gRPC.
    Serve(Box<ServeArgs>),
    /// Scan a dataset's shards and write its index beside them.
    Index(IndexArgs),
    /// Fill the disk cache with a dataset ahead of training, within its size limit.
    Warm(WarmArgs),
    /// Pack an image folder (ImageFolder layout, or a CSV/JSONL manifest of
    /// path,label) into WebDataset tar shards and their index.
    Pack(PackArgs),
    /// Run a decode pool worker: decode the work units sidecars started
    /// with --pool send (a Deployment behind a headless Service).
    PoolWorker(PoolWorkerArgs),
    /// Exit 0 if the server at --listen reports SERVING (for probes).
    Health(HealthArgs),
    /// Give a cache directory on the node (a hostPath) to the sidecar's
    /// user: run as root with CAP_CHOWN alone, before the sidecar starts.
    PrepareCacheDir(PrepareCacheDirArgs),
    /// Run the whole path on a synthetic dataset in an in-process S3 server.
    #[cfg(feature = "dev")]
    Demo(DemoArgs),
    /// Entitlement benchmark: fetch + parse + decode + batch for one rank, no
    /// gRPC. With --synthetic, on a demo-like dataset in an in-process S3.
    #[cfg(feature = "dev")]
    Bench(BenchArgs),
    /// Compare cache eviction policies: S3 bytes per epoch with a cache of
    /// half the dataset (in-process S3 server). Prints JSON lines.
    #[cfg(feature = "dev")]
    CacheBench,
    /// The disk cache with a million small entries: cached reads alone and
    /// while misses evict, fill and reopen times. Prints JSON lines.
    #[cfg(feature = "dev")]
    CacheScaleBench(CacheScaleArgs),
    /// Stored source forms for the decoded tier: bytes per sample, PSNR
    /// against today's path, and the one-thread rate from each form beside
    /// today's decode (the demo's photos). Prints JSON lines.
    #[cfg(feature = "dev")]
    TierBench(TierBenchArgs),
    /// A two-source 70/30 mixed stream against one stream over the same
    /// samples, alternately (the demo's photos). Prints JSON lines.
    #[cfg(feature = "dev")]
    MixBench(MixBenchArgs),
    /// The same photos as tar shards and as Hugging Face-layout Parquet
    /// files (row groups of 100 and 1,000 rows), streamed alternately over
    /// loopback S3 with a first-byte delay; then planning many files from
    /// their footers. Prints JSON lines.
    #[cfg(feature = "dev")]
    ParquetBench(ParquetBenchArgs),
    /// The decoded-source tier on the stream path: today's path, then the
    /// tier cold and warm, for the training and evaluation recipes, beside
    /// the entropy floor (the demo's photos). Prints JSON lines.
    #[cfg(feature = "dev")]
    TierStreamBench(TierStreamBenchArgs),
    /// The server's CPU per sample for encoded against decoded delivery of
    /// a training stream, alternately (the demo's photos). Prints JSON lines.
    #[cfg(feature = "dev")]
    DeliveryBench(DeliveryBenchArgs),
    /// A training stream decoded here alone against the same stream with
    /// the decode pool at --pool taking the shortfall, alternately (the
    /// demo's photos). Prints JSON lines.
    #[cfg(feature = "dev")]
    PoolBench(PoolBenchArgs),
    /// Compare shuffle quality with the WebDataset recipe on a class-sorted
    /// dataset (no I/O: the plan alone decides the order). Prints JSON lines.
    #[cfg(feature = "dev")]
    ShuffleQuality(ShuffleQualityArgs),
    /// Run an in-memory S3-compatible server for tests and benchmarks (data
    /// is lost on exit; credentials: shardfeed-demo / shardfeed-demo-secret).
    #[cfg(feature = "dev")]
    DevS3(DevS3Args),
}

impl Command {
    /// The log level when SHARDFEED_LOG is unset: servers log their life,
    /// tools only warnings (their output is the point).
    pub fn default_log_level(&self) -> &'static str {
        match self {
            Command::Serve(_) | Command::Index(_) | Command::PoolWorker(_) => "info",
            _ => "warn",
        }
    }
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// gRPC address: host:port or unix:/path/to.sock.
    #[arg(
        long,
        env = "SHARDFEED_LISTEN",
        default_value = "127.0.0.1:50051",
        help_heading = "Listening"
    )]
    pub listen: ListenAddr,
    /// Prometheus metrics address (serves /metrics).
    #[arg(
        long,
        env = "SHARDFEED_METRICS_LISTEN",
        default_value = "127.0.0.1:9464",
        help_heading = "Listening"
    )]
    pub metrics_listen: SocketAddr,
    /// Streams open at once; more get RESOURCE_EXHAUSTED.
    #[arg(long, env = "SHARDFEED_MAX_STREAMS", default_value_t = server::DEFAULT_MAX_STREAMS,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=4096), help_heading = "Listening")]
    pub max_streams: usize,
    /// Dataset URI prefix that may be requested (repeatable). Without any,
    /// every dataset the pod's credentials can read may be requested.
    #[arg(
        long = "allow",
        env = "SHARDFEED_ALLOW",
        value_delimiter = ',',
        help_heading = "Listening"
    )]
    pub allow: Vec<String>,
    /// Seconds open streams may run on after SIGTERM.
    #[arg(long, env = "SHARDFEED_SHUTDOWN_GRACE", default_value_t = server::DEFAULT_SHUTDOWN_GRACE.as_secs(),
          help_heading = "Listening")]
    pub shutdown_grace: u64,
    /// Shut down (as on SIGTERM) when the process with this PID, the one
    /// that started shardfeed, exits: `shardfeed.serve()` in Python sets it
    /// so that a killed trainer leaves no server behind.
    #[arg(long, env = "SHARDFEED_EXIT_WITH_PARENT", help_heading = "Listening")]
    pub exit_with_parent: Option<u32>,
    #[command(flatten)]
    pub s3: S3Args,
    #[command(flatten)]
    pub read: ReadArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub streams: StreamArgs,
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Benchmarks only: streams send batches of a fixed pattern written on
    /// the decode pool, reading nothing (the transport measured alone).
    #[cfg(feature = "dev")]
    #[arg(long, hide = true)]
    pub dev_synthetic_batches: bool,
}

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Streams")]
pub struct StreamArgs {
    /// Decode threads (default: the container's CPU limit, its cgroup
    /// quota rounded, else its CPU request, within the cores this process
    /// may run on).
    #[arg(long, env = "SHARDFEED_DECODE_THREADS",
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub decode_threads: Option<usize>,
    /// The container's CPU request in millicores (the chart passes it from
    /// the Downward API; 0: none): decode threads follow it where no cgroup
    /// CPU quota binds.
    #[arg(long, env = "SHARDFEED_CPU_REQUEST_MILLICORES")]
    pub cpu_request_millicores: Option<u64>,
    /// Shard readers started ahead of the ones in use, per stream.
    #[arg(long, env = "SHARDFEED_PREFETCH_SHARDS", default_value_t = pipeline::DEFAULT_PREFETCH_SHARDS,
          value_parser = RangedU64ValueParser::<usize>::new().range(0..=64))]
    pub prefetch_shards: usize,
    /// Decoded batches queued per stream for the client.
    #[arg(long, env = "SHARDFEED_READY_BATCHES", default_value_t = pipeline::DEFAULT_READY_BATCHES,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub ready_batches: usize,
    /// Bytes of one tar member, TFRecord record or loose object at most: a
    /// reader buffers one whole; larger ones are a shard error (records,
    /// members) or substituted (`too_large`, loose objects).
    #[arg(long, env = "SHARDFEED_MAX_MEMBER_BYTES", default_value_t = crate::shard::DEFAULT_MAX_MEMBER_BYTES,
          value_parser = RangedU64ValueParser::<u64>::new().range(1 << 20..=1 << 30))]
    pub max_member_bytes: u64,
    /// Default shuffle buffer in samples (requests may override).
    #[arg(long, env = "SHARDFEED_SHUFFLE_BUFFER", default_value_t = plan::DEFAULT_SHUFFLE_BUFFER,
          value_parser = clap::value_parser!(u32).range(0..=plan::MAX_SHUFFLE_BUFFER as i64))]
    pub shuffle_buffer: u32,
    /// Default shards read at once per rank (requests may override).
    #[arg(long, env = "SHARDFEED_INTERLEAVE", default_value_t = plan::DEFAULT_INTERLEAVE,
          value_parser = clap::value_parser!(u32).range(1..=plan::MAX_INTERLEAVE as i64))]
    pub interleave: u32,
    /// Memory the server plans for, e.g. 8Gi (default: the container's cgroup
    /// limit, else the machine's memory). Streams may reserve 3/4 of it minus
    /// the decode scratch budget, min(limit/8, 1 GiB); a stream that does not
    /// fit is refused (RESOURCE_EXHAUSTED).
    #[arg(long, env = "SHARDFEED_MEMORY_LIMIT", value_parser = parse_size)]
    pub memory_limit: Option<u64>,
}

/// Everything `shardfeed serve` runs with.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: ListenAddr,
    pub metrics_listen: SocketAddr,
    pub s3: S3Config,
    pub retry: RetryPolicy,
    pub read: ReadConfig,
    pub cache: Option<CacheConfig>,
    pub engine: EngineConfig,
    pub service: ServiceConfig,
    pub shutdown_grace: Duration,
    pub pool: Option<crate::pool::PoolConfig>,
}

impl ServeArgs {
    pub fn config(&self) -> Result<ServeConfig, ConfigError> {
        let mut problems = Vec::new();
        let cache = self.cache.config(&mut problems);
        let pool = self.pool.config(&mut problems);
        for rule in &self.allow {
            if let Err(error) = DatasetUri::parse(rule) {
                problems.push(format!("--allow {rule:?}: {error}"));
            }
        }
        if !problems.is_empty() {
            return Err(ConfigError(problems));
        }
        let engine = self.streams.engine_config(self.read.read_config());
        Ok(ServeConfig {
            listen: self.listen.clone(),
            metrics_listen: self.metrics_listen,
            s3: self.s3.config(),
            retry: self.read.retry_policy(),
            read: self.read.read_config(),
            cache,
            engine: EngineConfig {
                pipeline: PipelineConfig {
                    on_bad_shard: self.read.on_bad_shard.into(),
                    ..engine.pipeline
                },
                decoded_default: (self.cache.decoded_default_side > 0).then_some(
                    crate::decode::source::SourceForm {
                        shorter_side: self.cache.decoded_default_side,
                        kind: crate::decode::source::SourceKind::Raw,
                    },
                ),
                ..engine
            },
            service: ServiceConfig {
                max_streams: self.max_streams,
                allow: self.allow.clone(),
            },
            shutdown_grace: Duration::from_secs(self.shutdown_grace),
            pool,
        })
    }
}

impl StreamArgs {
    /// `--decode-threads`, else sized from the CPUs this process may use.
    pub fn decode_threads_sized(&self) -> Chosen<usize> {
        Chosen::or(self.decode_threads, || {
            engine::sizing::CpuBudget::detect(self.cpu_request_millicores).decode_threads()
        })
    }

    pub fn engine_config(&self, read: ReadConfig) -> EngineConfig {
        EngineConfig {
            pipeline: PipelineConfig {
                read,
                prefetch_shards: self.prefetch_shards,
                ready_batches: self.ready_batches,
                max_member_bytes: self.max_member_bytes,
                ..PipelineConfig::default()
            },
            memory: match self.memory_limit {
                Some(limit) => MemoryConfig::from_limit(limit),
                None => MemoryConfig::detect(),
            },
            decode_threads: self.decode_threads_sized().value,
            decoded_default: None,
            default_shuffle: ShuffleConfig {
                enabled: true,
                interleave: self.interleave,
                buffer: self.shuffle_buffer,
            },
        }
    }
}

#[derive(Args, Debug)]
pub struct IndexArgs {
    /// s3://bucket/prefix/ or file:///abs/dir/
    pub uri: String,
    #[command(flatten)]
    pub s3: S3Args,
    #[command(flatten)]
    pub read: ReadArgs,
}

#[derive(Args, Debug)]
pub struct WarmArgs {
    /// s3://bucket/prefix/
    pub uri: String,
    #[command(flatten)]
    pub s3: S3Args,
    #[command(flatten)]
    pub read: ReadArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Fill the decoded-source tier (--decoded-cache-dir) instead: every
    /// sample's source at this shorter side, as streams asking for
    /// `decoded_source` with it will read them (also the shard cache, when
    /// --cache-dir is given).
    #[arg(long, value_parser = clap::value_parser!(u32).range(64..=4096))]
    pub decoded: Option<u32>,
    /// With --decoded: also keep the evaluation outputs of this size (center
    /// crop, torchvision's Resize(size * 8 / 7)), copied by later epochs.
    #[arg(long, requires = "decoded", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub eval_size: Option<u32>,
}

impl WarmArgs {
    /// The shard cache's configuration: required unless `--decoded`.
    pub fn cache_config(&self) -> Result<Option<CacheConfig>, ConfigError> {
        let mut problems = Vec::new();
        let config = self.cache.config(&mut problems);
        if config.is_none() && self.decoded.is_none() {
            problems.push("--cache-dir is required".into());
        }
        if self.decoded.is_some() && self.cache.decoded_cache_dir.is_none() {
            problems.push("--decoded needs --decoded-cache-dir".into());
        }
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError(problems))
        }
    }
}

#[derive(Args, Debug)]
pub struct PackArgs {
    /// The image folder: one directory per class, any layout with --manifest,
    /// or a folder of TFRecord files (*.tfrecord, labels from their Examples);
    /// or loose images in a store: s3://bucket/images/ (class folders) or
    /// s3://bucket/images/train.csv (a manifest, as `shardfeed serve` reads it).
    pub source: PathBuf,
    /// Where the shards go: s3://bucket/prefix/ or file:///abs/dir/
    pub dest: String,
    /// CSV (`path,label`) or JSONL (`{"path": …, "label": …}`) listing the
    /// files, paths relative to SOURCE; labels are integers or class names.
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Target shard size, e.g. 256M, 1G (S3 reads fastest at 100 MB-1 GB).
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    pub shard_size: u64,
    /// Seed of the order samples are spread over the shards.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Also write the report as JSON here: samples, shards, bytes, seconds,
    /// classes and every skipped file with its reason.
    #[arg(long)]
    pub report: Option<PathBuf>,
    #[command(flatten)]
    pub s3: S3Args,
    #[command(flatten)]
    pub read: ReadArgs,
}

impl PackArgs {
    /// The source when it is a dataset URI rather than a local folder.
    pub fn source_uri(&self) -> Option<&str> {
        let source = self.source.to_str()?;
        (source.starts_with("s3://") || source.starts_with("file://")).then_some(source)
    }

    /// Every problem of the arguments, before anything is read.
    pub fn check(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        match self.source_uri() {
            Some(uri) => {
                if let Err(error) = DatasetUri::parse(uri) {
                    problems.push(error.to_string());
                }
                if self.manifest.is_some() {
                    problems.push(
                        "--manifest names a local file; for a source in a store put the \
                         manifest in the URI (s3://bucket/images/train.csv)"
                            .into(),
                    );
                }
            }
            None if !self.source.is_dir() => {
                problems.push(format!("{} is not a directory", self.source.display()));
            }
            None => {}
        }
        if let Err(error) = DatasetUri::parse(&self.dest) {
            problems.push(error.to_string());
        }
        if self.shard_size < 1 << 20 {
            problems.push("--shard-size must be at least 1M".into());
        }
        if !problems.is_empty() {
            return Err(ConfigError(problems));
        }
        Ok(())
    }

    /// The pack's configuration, `source` resolved (see [`Self::source_uri`]).
    pub fn config(&self, source: crate::pack::PackSource) -> crate::pack::PackConfig {
        crate::pack::PackConfig {
            source,
            manifest: self.manifest.clone(),
            shard_bytes: self.shard_size,
            seed: self.seed,
            object_requests_in_flight: self
                .read
                .object_requests_in_flight
                .unwrap_or(read::DEFAULT_OBJECT_REQUESTS_IN_FLIGHT),
        }
    }
}

#[derive(Args, Debug)]
pub struct PrepareCacheDirArgs {
    /// The directory (created if missing).
    pub dir: PathBuf,
    /// The user and group that will own it, as UID:GID.
    #[arg(long, value_parser = parse_owner)]
    pub owner: (u32, u32),
}

fn parse_owner(text: &str) -> Result<(u32, u32), String> {
    let (uid, gid) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?}: expected UID:GID, e.g. 65532:65532"))?;
    let number = |part: &str| {
        part.parse::<u32>()
            .map_err(|_| format!("{text:?}: {part:?} is not a numeric id"))
    };
    Ok((number(uid)?, number(gid)?))
}

#[derive(Args, Debug)]
pub struct HealthArgs {
    /// The server's gRPC address (the same value it was started with).
    #[arg(long, env = "SHARDFEED_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: ListenAddr,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_decimal_and_binary_units() {
        assert_eq!(parse_size("500G"), Ok(500_000_000_000));
        assert_eq!(parse_size("64Gi"), Ok(64 << 30));
        assert_eq!(parse_size("1.5k"), Ok(1500));
        assert_eq!(parse_size("123"), Ok(123));
        assert!(parse_size("12 parsecs").is_err());
    }

    #[test]
    fn clap_checks_ranges_and_config_reports_every_problem() {
        use clap::Parser;
        let parse = |args: &[&str]| Cli::try_parse_from(["shardfeed", "serve"].iter().chain(args));
        assert!(parse(&["--parts-in-flight", "0"]).is_err());
        assert!(parse(&["--part-size", "1024"]).is_err());
        assert!(parse(&["--interleave", "0"]).is_err());
        assert!(parse(&["--listen", "nowhere"]).is_err());
        let Command::Serve(args) = parse(&[
            "--cache-dir",
            "/tmp/x",
            "--cache-min-free-percent",
            "120",
            "--allow",
            "ftp://x",
            "--decoded-cache-dir",
            "/tmp/x",
        ])
        .unwrap()
        .command
        else {
            panic!("not serve");
        };
        let error = args.config().unwrap_err();
        assert_eq!(error.0.len(), 3, "{error}");
        assert!(error
            .to_string()
            .contains("--decoded-cache-dir must differ"));
        let Command::Serve(args) = parse(&["--listen", "unix:/run/sf.sock"]).unwrap().command
        else {
            panic!("not serve");
        };
        let config = args.config().unwrap();
        assert_eq!(config.listen, ListenAddr::Unix("/run/sf.sock".into()));
        assert_eq!(
            config.engine.pipeline.prefetch_shards,
            pipeline::DEFAULT_PREFETCH_SHARDS
        );
    }
}
