//! Flags that reach the store: S3, reads, and the host's disk cache.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::RangedU64ValueParser;
use clap::{Args, ValueEnum};

use super::values::parse_size;
use crate::shard::BadShardPolicy;
use crate::store::cache::{self, CacheConfig, EvictionPolicy};
use crate::store::read::{self, ReadConfig};
use crate::store::retry::RetryPolicy;
use crate::store::s3::S3Config;

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "S3")]
pub struct S3Args {
    /// S3 endpoint URL (default: the AWS chain, e.g. AWS_ENDPOINT_URL).
    #[arg(long, env = "SHARDFEED_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// Address buckets as https://endpoint/bucket (most S3-compatible servers).
    #[arg(long, env = "SHARDFEED_S3_FORCE_PATH_STYLE")]
    pub s3_force_path_style: bool,
    /// Region (default: the AWS chain, then us-east-1).
    #[arg(long, env = "SHARDFEED_S3_REGION")]
    pub s3_region: Option<String>,
}

impl S3Args {
    pub fn config(&self) -> S3Config {
        S3Config {
            endpoint: self.s3_endpoint.clone(),
            force_path_style: self.s3_force_path_style,
            region: self.s3_region.clone(),
            static_credentials: None,
        }
    }
}

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Reading")]
pub struct ReadArgs {
    /// Bytes per ranged GET (at least 64 KiB).
    #[arg(long, env = "SHARDFEED_PART_SIZE", default_value_t = read::DEFAULT_PART_SIZE,
          value_parser = RangedU64ValueParser::<u64>::new().range(64 << 10..=1 << 30))]
    pub part_size: u64,
    /// Ranged GETs in flight per shard reader. Default: sized by the
    /// server, as many parts as 32 MiB holds (4 of 8 MiB), from 2 to 16.
    #[arg(long, env = "SHARDFEED_PARTS_IN_FLIGHT",
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub parts_in_flight: Option<usize>,
    /// GETs in flight per reader of a loose-object dataset (one image each).
    /// Default: sized by the server, from 16 up to as many as 32 MiB of
    /// objects (at most 128), growing while the stream drains the reader
    /// faster than its GETs return.
    #[arg(long, env = "SHARDFEED_OBJECT_REQUESTS_IN_FLIGHT",
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=256))]
    pub object_requests_in_flight: Option<usize>,
    /// Attempts per S3 request at most (a backstop to --s3-retry-budget).
    #[arg(long, env = "SHARDFEED_S3_MAX_ATTEMPTS", default_value_t = RetryPolicy::default().max_attempts,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub s3_max_attempts: u32,
    /// Seconds a failing S3 request keeps retrying (exponential backoff with
    /// jitter) before the stream ends with UNAVAILABLE.
    #[arg(long, env = "SHARDFEED_S3_RETRY_BUDGET", default_value_t = RetryPolicy::default().budget.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub s3_retry_budget: u64,
    /// Seconds an S3 request may make no progress (no response, no body
    /// bytes) before it is cancelled and retried from the byte it reached.
    #[arg(long, env = "SHARDFEED_S3_IDLE_TIMEOUT", default_value_t = RetryPolicy::default().idle_timeout.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub s3_idle_timeout: u64,
    /// A shard that cannot be parsed: `fail` the stream (DATA_LOSS) or the index build, or `skip`
    /// the rest of it, substituting its samples (counts stay equal on every rank).
    #[arg(long, env = "SHARDFEED_ON_BAD_SHARD", value_enum, default_value_t = BadShardArg::Fail)]
    pub on_bad_shard: BadShardArg,
}

impl ReadArgs {
    pub fn read_config(&self) -> ReadConfig {
        ReadConfig {
            part_size: self.part_size,
            parts_in_flight: self
                .parts_in_flight
                .unwrap_or(read::DEFAULT_PARTS_IN_FLIGHT),
            parts_sized: self.parts_in_flight.is_none(),
            object_requests_in_flight: self
                .object_requests_in_flight
                .unwrap_or(read::DEFAULT_OBJECT_REQUESTS_IN_FLIGHT),
            object_requests_sized: self.object_requests_in_flight.is_none(),
        }
    }

    pub fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_attempts: self.s3_max_attempts,
            budget: Duration::from_secs(self.s3_retry_budget),
            idle_timeout: Duration::from_secs(self.s3_idle_timeout),
            ..RetryPolicy::default()
        }
    }
}

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Disk cache")]
pub struct CacheArgs {
    /// Directory of the host's shard cache (shared by every stream). Unset: no cache.
    #[arg(long, env = "SHARDFEED_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Most bytes the cache may hold, e.g. 500G, 64Gi, 1T.
    #[arg(long, env = "SHARDFEED_CACHE_SIZE", value_parser = parse_size, default_value = "100G")]
    pub cache_size: u64,
    /// Free disk space (percent of the file system) the cache always leaves.
    #[arg(long, env = "SHARDFEED_CACHE_MIN_FREE_PERCENT", default_value_t = cache::DEFAULT_MIN_FREE_PERCENT)]
    pub cache_min_free_percent: f64,
    /// Eviction: `planned` (what the streams' plans need furthest ahead) or `lru`.
    #[arg(long, env = "SHARDFEED_CACHE_POLICY", value_enum, default_value_t = PolicyArg::Planned)]
    pub cache_policy: PolicyArg,
    /// Seconds listings and object metadata are trusted (0: for the process's life).
    #[arg(long, env = "SHARDFEED_METADATA_TTL", default_value_t = 0)]
    pub metadata_ttl: u64,
    /// Servers that may share --cache-dir (a node's disk kept across pods):
    /// each takes the first free subdirectory slot-<i>, of up to --cache-size
    /// each. 1: the directory itself, one server at a time.
    #[arg(long, env = "SHARDFEED_CACHE_SLOTS", default_value_t = 1)]
    pub cache_slots: u32,
    /// Seconds to wait for a slot while every one is held (a pod replacing
    /// another on the node waits for the old one to exit); then exit.
    #[arg(long, env = "SHARDFEED_CACHE_LOCK_WAIT", default_value_t = 0)]
    pub cache_lock_wait: u64,
    /// Directory of the host's decoded-source tier: decoded streams crop
    /// their later epochs from sources kept here (see
    /// --decoded-default-side). Unset: streams that ask for
    /// `decoded_source` derive every sample's source and keep none (the
    /// same bytes, slower); others do not use the tier.
    #[arg(long, env = "SHARDFEED_DECODED_CACHE_DIR")]
    pub decoded_cache_dir: Option<PathBuf>,
    /// With --decoded-cache-dir: the stored shorter side a decoded stream
    /// uses when its request names no `decoded_source` (its first epoch is
    /// the original's bytes and fills the tier on idle cores; later epochs
    /// read it). 0: only streams that ask use the tier. Not with --pool
    /// (the pool decodes what the tier would serve).
    #[arg(long, env = "SHARDFEED_DECODED_DEFAULT_SIDE", default_value_t = 320)]
    pub decoded_default_side: u32,
    /// Most bytes the decoded-source tier may hold on disk, e.g. 200G.
    #[arg(long, env = "SHARDFEED_DECODED_CACHE_SIZE", value_parser = parse_size, default_value = "100G")]
    pub decoded_cache_size: u64,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    Planned,
    Lru,
}

impl CacheArgs {
    /// The cache's configuration; `None` without --cache-dir.
    pub fn config(&self, problems: &mut Vec<String>) -> Option<CacheConfig> {
        if !(0.0..100.0).contains(&self.cache_min_free_percent) {
            problems.push("--cache-min-free-percent must be in [0, 100)".into());
        }
        if !(1..=cache::MAX_SLOTS).contains(&self.cache_slots) {
            problems.push(format!(
                "--cache-slots must be in [1, {}]",
                cache::MAX_SLOTS
            ));
        }
        if self.decoded_default_side != 0
            && !(crate::tier::output::MIN_SHORTER_SIDE..=crate::tier::output::MAX_SHORTER_SIDE)
                .contains(&self.decoded_default_side)
        {
            problems.push(format!(
                "--decoded-default-side must be 0 or in [{}, {}]",
                crate::tier::output::MIN_SHORTER_SIDE,
                crate::tier::output::MAX_SHORTER_SIDE
            ));
        }
        if self.decoded_cache_dir.is_some() && self.decoded_cache_dir == self.cache_dir {
            problems.push(
                "--decoded-cache-dir must differ from --cache-dir (each locks its own; \
                 e.g. a decoded/ directory beside the cache)"
                    .into(),
            );
        }
        Some(CacheConfig {
            max_bytes: self.cache_size,
            min_free_percent: self.cache_min_free_percent,
            policy: match self.cache_policy {
                PolicyArg::Planned => EvictionPolicy::Planned,
                PolicyArg::Lru => EvictionPolicy::Lru,
            },
            metadata_ttl: (self.metadata_ttl > 0).then(|| Duration::from_secs(self.metadata_ttl)),
            slots: self.cache_slots,
            lock_wait: Duration::from_secs(self.cache_lock_wait),
            ..CacheConfig::new(self.cache_dir.clone()?)
        })
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum BadShardArg {
    Fail,
    Skip,
}

impl From<BadShardArg> for BadShardPolicy {
    fn from(arg: BadShardArg) -> Self {
        match arg {
            BadShardArg::Fail => BadShardPolicy::Fail,
            BadShardArg::Skip => BadShardPolicy::Skip,
        }
    }
}
