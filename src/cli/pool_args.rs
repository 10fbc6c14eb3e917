//! Flags of the decode pool: the sidecar's (`serve --pool …`) and the
//! worker's (`shardfeed pool-worker`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::RangedU64ValueParser;
use clap::Args;

use crate::pool::client::{DEFAULT_UNITS_PER_WORKER, DEFAULT_UNIT_SAMPLES};
use crate::pool::worker::{
    DEFAULT_DRAIN_GRACE, DEFAULT_MAX_UNIT_BYTES, DEFAULT_MAX_UNIT_OUTPUT_BYTES,
    DEFAULT_MAX_UNIT_SAMPLES,
};
use crate::pool::{read_token, PoolConfig, PoolShareSetting, WorkerConfig};

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Decode pool")]
pub struct PoolArgs {
    /// Decode pool workers to send the shortfall to: host:port, repeatable
    /// or comma-separated. A headless Service's name resolves to every
    /// ready worker and is followed as workers come and go.
    #[arg(long = "pool", env = "SHARDFEED_POOL", value_delimiter = ',')]
    pub pool: Vec<String>,
    /// File holding the pool's shared token (a mounted Secret).
    #[arg(long, env = "SHARDFEED_POOL_TOKEN_FILE")]
    pub pool_token_file: Option<PathBuf>,
    /// Share of each batch sent to the pool: `auto` (only what local decode
    /// cannot keep up with) or a fixed share in [0, 1].
    #[arg(long, env = "SHARDFEED_POOL_SHARE", default_value = "auto")]
    pub pool_share: PoolShareSetting,
    /// Samples per work unit.
    #[arg(long, env = "SHARDFEED_POOL_UNIT_SAMPLES", default_value_t = DEFAULT_UNIT_SAMPLES,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=DEFAULT_MAX_UNIT_SAMPLES as u64))]
    pub pool_unit_samples: usize,
    /// Units in flight to one worker at most.
    #[arg(long, env = "SHARDFEED_POOL_UNITS_PER_WORKER", default_value_t = DEFAULT_UNITS_PER_WORKER,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=256))]
    pub pool_units_per_worker: usize,
    /// Milliseconds a unit may go unanswered before it is decoded locally.
    #[arg(long, env = "SHARDFEED_POOL_DEADLINE_MS", default_value_t = crate::pool::client::DEFAULT_DEADLINE.as_millis() as u64,
          value_parser = RangedU64ValueParser::<u64>::new().range(50..=600_000))]
    pub pool_deadline_ms: u64,
}

impl PoolArgs {
    /// The pool's settings (None: no pool), problems pushed to `problems`.
    pub fn config(&self, problems: &mut Vec<String>) -> Option<PoolConfig> {
        if self.pool.is_empty() {
            return None;
        }
        let token = match &self.pool_token_file {
            None => {
                problems.push(
                    "--pool needs --pool-token-file: workers take units only from sidecars \
                     that hold the pool's token"
                        .into(),
                );
                return None;
            }
            Some(path) => match read_token(path) {
                Ok(token) => token,
                Err(error) => {
                    problems.push(format!("--pool-token-file {}: {error}", path.display()));
                    return None;
                }
            },
        };
        Some(PoolConfig {
            share: self.pool_share,
            unit_samples: self.pool_unit_samples,
            units_per_worker: self.pool_units_per_worker,
            deadline: Duration::from_millis(self.pool_deadline_ms),
            ..PoolConfig::new(self.pool.clone(), token)
        })
    }
}

#[derive(Args, Debug)]
pub struct PoolWorkerArgs {
    /// Address to take units on.
    #[arg(
        long,
        env = "SHARDFEED_POOL_LISTEN",
        default_value = "0.0.0.0:50061",
        help_heading = "Listening"
    )]
    pub listen: SocketAddr,
    /// Prometheus metrics address (serves /metrics).
    #[arg(
        long,
        env = "SHARDFEED_METRICS_LISTEN",
        default_value = "0.0.0.0:9464",
        help_heading = "Listening"
    )]
    pub metrics_listen: SocketAddr,
    /// File holding the pool's shared token (a mounted Secret).
    #[arg(long, env = "SHARDFEED_POOL_TOKEN_FILE", help_heading = "Listening")]
    pub token_file: PathBuf,
    /// Decode threads (default: the CPUs the container may use).
    #[arg(long, env = "SHARDFEED_DECODE_THREADS",
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub decode_threads: Option<usize>,
    /// Units decoded at once; more wait up to a second, then are refused
    /// (RESOURCE_EXHAUSTED) and the sidecar sends them elsewhere (default:
    /// four per decode thread, at least 8).
    #[arg(long, env = "SHARDFEED_POOL_MAX_UNITS",
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=4096))]
    pub max_units: Option<usize>,
    /// Largest unit accepted, in bytes of its message.
    #[arg(long, env = "SHARDFEED_POOL_MAX_UNIT_BYTES", default_value_t = DEFAULT_MAX_UNIT_BYTES,
          value_parser = RangedU64ValueParser::<usize>::new().range(1 << 20..=1 << 30))]
    pub max_unit_bytes: usize,
    /// Largest answer, in bytes of pixels.
    #[arg(long, env = "SHARDFEED_POOL_MAX_UNIT_OUTPUT_BYTES", default_value_t = DEFAULT_MAX_UNIT_OUTPUT_BYTES,
          value_parser = RangedU64ValueParser::<usize>::new().range(1 << 20..=1 << 30))]
    pub max_unit_output_bytes: usize,
    /// Samples per unit at most.
    #[arg(long, env = "SHARDFEED_POOL_MAX_UNIT_SAMPLES", default_value_t = DEFAULT_MAX_UNIT_SAMPLES,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=4096))]
    pub max_unit_samples: usize,
    /// Memory the worker plans for, e.g. 4Gi (default: the container's
    /// cgroup limit): its decode scratch is min(limit/8, 1 GiB).
    #[arg(long, env = "SHARDFEED_MEMORY_LIMIT", value_parser = super::parse_size)]
    pub memory_limit: Option<u64>,
    /// Seconds the units held at SIGTERM may take to finish.
    #[arg(long, env = "SHARDFEED_SHUTDOWN_GRACE", default_value_t = DEFAULT_DRAIN_GRACE.as_secs())]
    pub shutdown_grace: u64,
}

impl PoolWorkerArgs {
    pub fn config(&self) -> Result<WorkerConfig, super::ConfigError> {
        let token = read_token(&self.token_file).map_err(|error| {
            super::ConfigError(vec![format!(
                "--token-file {}: {error}",
                self.token_file.display()
            )])
        })?;
        let memory = match self.memory_limit {
            Some(limit) => crate::engine::budget::MemoryConfig::from_limit(limit),
            None => crate::engine::budget::MemoryConfig::detect(),
        };
        let decode_threads = self
            .decode_threads
            .unwrap_or_else(crate::engine::default_decode_threads);
        Ok(WorkerConfig {
            listen: self.listen,
            token,
            decode_threads,
            max_units: self.max_units.unwrap_or((4 * decode_threads).max(8)),
            max_unit_bytes: self.max_unit_bytes,
            max_unit_output_bytes: self.max_unit_output_bytes,
            max_unit_samples: self.max_unit_samples,
            decode_scratch: memory.decode_scratch,
            drain_grace: Duration::from_secs(self.shutdown_grace),
            connections: crate::pool::CONNECTION_LIMITS,
        })
    }
}
