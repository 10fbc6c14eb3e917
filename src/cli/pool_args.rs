//! Flags of the decode pool: the sidecar's (`serve --pool …`) and the
//! worker's (`shardfeed pool-worker`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::RangedU64ValueParser;
use clap::Args;

use super::values::ConfigError;
use crate::net::tls::{check_plaintext, PoolTls, PoolTlsFiles};
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
    /// The pool's CA (PEM): workers must present a certificate it signed.
    #[arg(long, env = "SHARDFEED_POOL_TLS_CA", requires_all = ["pool_tls_cert", "pool_tls_key"])]
    pub pool_tls_ca: Option<PathBuf>,
    /// This sidecar's certificate (PEM), signed by the pool's CA.
    #[arg(long, env = "SHARDFEED_POOL_TLS_CERT", requires = "pool_tls_ca")]
    pub pool_tls_cert: Option<PathBuf>,
    /// This sidecar's private key (PEM).
    #[arg(long, env = "SHARDFEED_POOL_TLS_KEY", requires = "pool_tls_ca")]
    pub pool_tls_key: Option<PathBuf>,
    /// The name workers' certificates carry (default: the host of the
    /// first --pool target, the pool Service's name).
    #[arg(long, env = "SHARDFEED_POOL_TLS_SERVER_NAME")]
    pub pool_tls_server_name: Option<String>,
    /// Send units in plain text to workers off this host (the token, the
    /// images and the pixels unencrypted). Without TLS files, only loopback
    /// workers are used otherwise.
    #[arg(long, env = "SHARDFEED_POOL_INSECURE_PLAINTEXT")]
    pub pool_insecure_plaintext: bool,
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
        let server_name = self.pool_tls_server_name.clone().unwrap_or_else(|| {
            let first = &self.pool[0];
            first
                .rsplit_once(':')
                .map_or(first.as_str(), |(host, _)| host)
                .to_string()
        });
        let files = [&self.pool_tls_ca, &self.pool_tls_cert, &self.pool_tls_key];
        let flags = ["--pool-tls-ca", "--pool-tls-cert", "--pool-tls-key"];
        let tls = match load_tls(files, flags, server_name) {
            Some(Ok(tls)) => Some(tls),
            Some(Err(error)) => {
                problems.push(error);
                return None;
            }
            None => {
                if let Err(error) = check_plaintext(
                    "pool workers",
                    &self.pool,
                    (self.pool_insecure_plaintext, "--pool-insecure-plaintext"),
                    "--pool-tls-ca, --pool-tls-cert, --pool-tls-key",
                ) {
                    problems.push(error.to_string());
                    return None;
                }
                None
            }
        };
        Some(PoolConfig {
            share: self.pool_share,
            unit_samples: self.pool_unit_samples,
            units_per_worker: self.pool_units_per_worker,
            deadline: Duration::from_millis(self.pool_deadline_ms),
            tls,
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
    /// The pool's CA (PEM): sidecars must present a certificate it signed.
    #[arg(long, env = "SHARDFEED_POOL_TLS_CA", help_heading = "Listening",
          requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
    /// This worker's certificate (PEM), signed by the pool's CA and naming
    /// the pool's Service.
    #[arg(
        long,
        env = "SHARDFEED_POOL_TLS_CERT",
        help_heading = "Listening",
        requires = "tls_ca"
    )]
    pub tls_cert: Option<PathBuf>,
    /// This worker's private key (PEM).
    #[arg(
        long,
        env = "SHARDFEED_POOL_TLS_KEY",
        help_heading = "Listening",
        requires = "tls_ca"
    )]
    pub tls_key: Option<PathBuf>,
    /// Take units in plain text on an address off this host. Without TLS
    /// files, the worker listens only on loopback otherwise.
    #[arg(
        long,
        env = "SHARDFEED_POOL_INSECURE_PLAINTEXT",
        help_heading = "Listening"
    )]
    pub insecure_plaintext: bool,
    /// A plain-text address serving gRPC health alone, for probes that
    /// speak no TLS (the kubelet's).
    #[arg(long, env = "SHARDFEED_POOL_HEALTH_LISTEN", help_heading = "Listening")]
    pub health_listen: Option<SocketAddr>,
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
    #[arg(long, env = "SHARDFEED_MEMORY_LIMIT", value_parser = super::values::parse_size)]
    pub memory_limit: Option<u64>,
    /// Seconds the units held at SIGTERM may take to finish.
    #[arg(long, env = "SHARDFEED_SHUTDOWN_GRACE", default_value_t = DEFAULT_DRAIN_GRACE.as_secs())]
    pub shutdown_grace: u64,
}

impl PoolWorkerArgs {
    pub fn config(&self) -> Result<WorkerConfig, ConfigError> {
        let token = read_token(&self.token_file).map_err(|error| {
            ConfigError(vec![format!(
                "--token-file {}: {error}",
                self.token_file.display()
            )])
        })?;
        let files = [&self.tls_ca, &self.tls_cert, &self.tls_key];
        let flags = ["--tls-ca", "--tls-cert", "--tls-key"];
        let tls = match load_tls(files, flags, String::new()) {
            Some(loaded) => Some(loaded.map_err(|error| ConfigError(vec![error]))?),
            None => {
                check_plaintext(
                    "the pool worker listening",
                    &[self.listen.to_string()],
                    (self.insecure_plaintext, "--insecure-plaintext"),
                    "--tls-ca, --tls-cert, --tls-key",
                )
                .map_err(|error| ConfigError(vec![error.to_string()]))?;
                None
            }
        };
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
            tls,
            health_listen: self.health_listen,
        })
    }
}

/// The pool's TLS files as `flags` give them (clap requires all three
/// together), read; None when none is given.
fn load_tls(
    [ca, cert, key]: [&Option<PathBuf>; 3],
    flags: [&'static str; 3],
    server_name: String,
) -> Option<Result<PoolTls, String>> {
    let (Some(ca), Some(cert), Some(key)) = (ca, cert, key) else {
        return None;
    };
    let files = PoolTlsFiles {
        ca: ca.clone(),
        cert: cert.clone(),
        key: key.clone(),
        server_name,
    };
    Some(files.load(flags).map_err(|error| error.to_string()))
}
