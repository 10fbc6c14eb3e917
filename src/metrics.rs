//! Metric names, units and help texts, in one place.
//!
//! Names follow `shardfeed_<thing>_<unit>`: counters end in `_total`,
//! durations are `_seconds` histograms, sizes `_bytes`. Label sets are
//! bounded (operation, outcome, gRPC code): never a key, shard or dataset.
//! `docs/METRICS.md` is the table for operators.

use std::time::Duration;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit,
};

pub mod log_gate;
pub mod pool;

pub const BUILD_INFO: &str = "shardfeed_build_info";
pub const SETTING: &str = "shardfeed_setting";
pub const REQUESTS: &str = "shardfeed_requests_total";
pub const STREAMS_ACTIVE: &str = "shardfeed_streams_active";
pub const BATCHES: &str = "shardfeed_batches_total";
pub const SAMPLES: &str = "shardfeed_samples_total";
pub const SOURCE_SAMPLES: &str = "shardfeed_mixed_source_samples_total";
pub const DECODED_TIER: &str = "shardfeed_decoded_tier_total";
pub const DECODED_TIER_BYTES: &str = "shardfeed_decoded_tier_bytes";
pub const DELIVERED: &str = "shardfeed_delivered_samples_total";
pub const SERVER_DECODE_SHARE: &str = "shardfeed_server_decode_share";
pub const CLIENT_DECODES: &str = "shardfeed_client_decoded_samples_total";
pub const SUBSTITUTED: &str = "shardfeed_substituted_samples_total";
pub const INVALID_LABELS: &str = "shardfeed_invalid_labels_total";
pub const DECODE_SECONDS: &str = "shardfeed_decode_seconds";
pub const S3_REQUESTS: &str = "shardfeed_s3_requests_total";
pub const S3_REQUEST_SECONDS: &str = "shardfeed_s3_request_seconds";
pub const S3_BYTES: &str = "shardfeed_s3_received_bytes_total";
pub const STORE_RETRIES: &str = "shardfeed_store_retries_total";
pub const INDEX_BUILDS: &str = "shardfeed_index_builds_total";
pub const CONSUMER_WAIT_SECONDS: &str = "shardfeed_consumer_wait_seconds";
pub const READY_WAIT_SECONDS: &str = "shardfeed_ready_batch_wait_seconds";
pub const CACHE_HITS: &str = "shardfeed_cache_hits_total";
pub const CACHE_MISSES: &str = "shardfeed_cache_misses_total";
pub const CACHE_READ_BYTES: &str = "shardfeed_cache_read_bytes_total";
pub const CACHE_EVICTIONS: &str = "shardfeed_cache_evictions_total";
pub const CACHE_CORRUPT: &str = "shardfeed_cache_corrupt_blocks_total";
pub const CACHE_BYTES: &str = "shardfeed_cache_bytes";
pub const PARTS_IN_FLIGHT: &str = "shardfeed_s3_parts_in_flight";
pub const S3_REQUEST_LIMIT: &str = "shardfeed_s3_request_limit";
pub const DECODE_QUEUE: &str = "shardfeed_decode_queue_samples";
pub const READY_BATCHES: &str = "shardfeed_ready_batches";
pub const MEMORY_BUDGET: &str = "shardfeed_stream_memory_budget_bytes";
pub const MEMORY_RESERVED: &str = "shardfeed_stream_memory_reserved_bytes";
pub const BAD_SHARDS: &str = "shardfeed_bad_shards_total";
pub const CACHE_WRITE_FAILURES: &str = "shardfeed_cache_write_failures_total";
pub const CONNECTIONS_CLOSED: &str = "shardfeed_connections_closed_total";
pub const REQUESTS_CUT: &str = "shardfeed_requests_cut_total";

/// Histogram buckets for every `_seconds` metric.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Registers help texts; call once after installing the recorder.
/// The sample counter of one source of mixed streams. Its label is a
/// dataset the `--allow` rules admitted: as many series as datasets mixed.
pub fn source_samples_counter(dataset: &str) -> ::metrics::Counter {
    counter!(SOURCE_SAMPLES, "dataset" => dataset.to_string())
}

pub fn describe() {
    describe_gauge!(
        BUILD_INFO,
        "Always 1; its version label is the binary's (crate, Python package and chart share it)."
    );
    ::metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    describe_gauge!(
        SETTING,
        "A setting the server runs with, by name and where it came from (flag, \
         cgroup_cpu_quota, cores, cgroup_memory_limit, machine_memory, default)."
    );
    describe_counter!(REQUESTS, "RPCs handled, by rpc and gRPC code.");
    describe_counter!(
        CONNECTIONS_CLOSED,
        "Connections a listener closed on its own bounds, by reason: limit (past its connections \
         held at once, closed as they came), idle (no call open for the idle bound), handshakes \
         (TLS handshakes in progress at their bound, in all or from the peer's address), \
         handshake (a TLS handshake that failed or timed out)."
    );
    describe_counter!(
        REQUESTS_CUT,
        "Calls a listener ended because their request body broke its bounds, by reason: \
         deadline (not whole in time), size (over the listener's cap), budget (the listener's \
         unfinished requests at their byte bound)."
    );
    pool::describe();
    describe_gauge!(STREAMS_ACTIVE, "Batch streams open now.");
    describe_counter!(BATCHES, "Batches sent to clients.");
    describe_counter!(SAMPLES, "Samples sent to clients.");
    describe_counter!(
        DECODED_TIER,
        "Decoded-source tier lookups and upkeep, by event (hit, miss, fill, eviction, corrupt, missing, write_failed)."
    );
    describe_gauge!(
        DECODED_TIER_BYTES,
        Unit::Bytes,
        "Bytes of decoded-source records on disk."
    );
    describe_counter!(
        SOURCE_SAMPLES,
        "Samples of mixed streams sent to clients, by source dataset."
    );
    describe_counter!(
        DELIVERED,
        "Samples of encoded deliveries sent, by who decodes them (server: as pixels; client: compressed)."
    );
    describe_gauge!(
        SERVER_DECODE_SHARE,
        "Encoded deliveries: the share of the last batch the server decoded, by rank."
    );
    describe_counter!(
        CLIENT_DECODES,
        "Samples clients reported decoding from encoded deliveries (their failures count as substituted)."
    );
    describe_counter!(
        SUBSTITUTED,
        "Samples whose image could not be decoded and were replaced, by reason."
    );
    describe_counter!(
        INVALID_LABELS,
        "Samples whose .cls member was not an integer (sent as -1)."
    );
    describe_histogram!(
        DECODE_SECONDS,
        Unit::Seconds,
        "Decode and resize time per image."
    );
    describe_counter!(S3_REQUESTS, "S3 requests, by operation and outcome.");
    describe_histogram!(
        S3_REQUEST_SECONDS,
        Unit::Seconds,
        "S3 request latency to the response headers, by operation."
    );
    describe_counter!(S3_BYTES, Unit::Bytes, "Body bytes received from S3.");
    describe_counter!(
        STORE_RETRIES,
        "Store requests retried or resumed after a transient failure."
    );
    describe_counter!(
        INDEX_BUILDS,
        "Dataset indexes built by scanning shards (no index found)."
    );
    describe_histogram!(
        CONSUMER_WAIT_SECONDS,
        Unit::Seconds,
        "Per batch, time the client waited for a batch that was not ready (data-bound)."
    );
    describe_counter!(CACHE_HITS, "Cache blocks served from local disk.");
    describe_counter!(CACHE_MISSES, "Cache blocks fetched from the origin store.");
    describe_counter!(
        CACHE_READ_BYTES,
        Unit::Bytes,
        "Bytes read through the cache, by source (cache or origin)."
    );
    describe_counter!(CACHE_EVICTIONS, "Cache entries evicted to make room.");
    describe_counter!(
        CACHE_CORRUPT,
        "Cache blocks that failed their checksum or could not be read back, and were fetched again."
    );
    describe_gauge!(CACHE_BYTES, Unit::Bytes, "Bytes of data in the disk cache.");
    describe_gauge!(
        S3_REQUEST_LIMIT,
        "S3 requests the host may have waiting for a response (halved when throttled)."
    );
    describe_gauge!(
        PARTS_IN_FLIGHT,
        "Ranged GETs in flight or fetched and not yet parsed."
    );
    describe_gauge!(
        DECODE_QUEUE,
        "Samples handed to the decode pool and not yet decoded."
    );
    describe_gauge!(READY_BATCHES, "Decoded batches waiting for their client.");
    describe_gauge!(
        MEMORY_BUDGET,
        Unit::Bytes,
        "Memory all streams together may reserve (from --memory-limit)."
    );
    describe_gauge!(
        MEMORY_RESERVED,
        Unit::Bytes,
        "Memory reserved by the open streams (each stream's formula)."
    );
    describe_counter!(
        BAD_SHARDS,
        "Damaged shards whose rest was substituted (--on-bad-shard skip), while serving or indexing."
    );
    describe_counter!(
        CACHE_WRITE_FAILURES,
        "Blocks the disk cache could not write (disk full or I/O error); served from S3 instead."
    );
    describe_histogram!(
        READY_WAIT_SECONDS,
        Unit::Seconds,
        "Per batch, time a ready batch waited for the client to take it (compute-bound)."
    );
    // Export every series from the start (at zero), so dashboards and alerts
    // see them before the first event.
    for name in [
        BATCHES,
        SAMPLES,
        INVALID_LABELS,
        S3_BYTES,
        STORE_RETRIES,
        INDEX_BUILDS,
        CACHE_HITS,
        CACHE_MISSES,
        CACHE_EVICTIONS,
        CACHE_CORRUPT,
        BAD_SHARDS,
        CACHE_WRITE_FAILURES,
    ] {
        counter!(name).absolute(0);
    }
    for source in ["cache", "origin"] {
        counter!(CACHE_READ_BYTES, "source" => source).absolute(0);
    }
    // Every label value a rule or panel filters on exists from the start:
    // `increase()` cannot see a series born at 1 (the alert on streams
    // refused for memory would never fire on the first refusal).
    for rpc in RPCS {
        for code in ALL_CODES {
            counter!(REQUESTS, "rpc" => rpc, "code" => grpc_code_name(code)).absolute(0);
        }
    }
    for op in ["get", "head", "list", "put"] {
        for outcome in S3_OUTCOMES {
            counter!(S3_REQUESTS, "op" => op, "outcome" => outcome).absolute(0);
        }
    }
    for event in TIER_EVENTS {
        counter!(DECODED_TIER, "event" => event).absolute(0);
    }
    for reason in [
        "limit",
        "evicted",
        "idle",
        "handshakes",
        "handshake",
        "shm_clients",
    ] {
        counter!(CONNECTIONS_CLOSED, "reason" => reason).absolute(0);
    }
    for reason in ["deadline", "size", "budget"] {
        counter!(REQUESTS_CUT, "reason" => reason).absolute(0);
    }
    for decoded_by in ["server", "client"] {
        counter!(DELIVERED, "decoded_by" => decoded_by).absolute(0);
    }
    for reason in [
        "corrupt",
        "too_large",
        "over_budget",
        "resize",
        "panic",
        "no_image",
        "bad_shard",
    ] {
        counter!(SUBSTITUTED, "reason" => reason).absolute(0);
    }
    for name in [
        STREAMS_ACTIVE,
        PARTS_IN_FLIGHT,
        DECODE_QUEUE,
        CACHE_BYTES,
        MEMORY_RESERVED,
    ] {
        gauge!(name).set(0.0);
    }
}

/// The RPCs `shardfeed_requests_total` counts (its `rpc` label).
pub const RPCS: [&str; 3] = ["StreamBatches", "Describe", "ReportClientDecodes"];

/// Every gRPC status code, for series that start at 0.
const ALL_CODES: [tonic::Code; 17] = [
    tonic::Code::Ok,
    tonic::Code::Cancelled,
    tonic::Code::Unknown,
    tonic::Code::InvalidArgument,
    tonic::Code::DeadlineExceeded,
    tonic::Code::NotFound,
    tonic::Code::AlreadyExists,
    tonic::Code::PermissionDenied,
    tonic::Code::ResourceExhausted,
    tonic::Code::FailedPrecondition,
    tonic::Code::Aborted,
    tonic::Code::OutOfRange,
    tonic::Code::Unimplemented,
    tonic::Code::Internal,
    tonic::Code::Unavailable,
    tonic::Code::DataLoss,
    tonic::Code::Unauthenticated,
];

/// The outcomes of S3 requests (`shardfeed_s3_requests_total`).
pub const S3_OUTCOMES: [&str; 8] = [
    "ok",
    "not_found",
    "denied",
    "credentials",
    "changed",
    "transient",
    "throttled",
    "error",
];

/// The decoded-source tier's events (`shardfeed_decoded_tier_total`).
pub const TIER_EVENTS: [&str; 8] = [
    "hit",
    "miss",
    "fill",
    "eviction",
    "corrupt",
    "missing",
    "write_failed",
    "unversioned",
];

pub fn request(rpc: &'static str, code: tonic::Code) {
    counter!(REQUESTS, "rpc" => rpc, "code" => grpc_code_name(code)).increment(1);
}

/// gRPC's own name of a status code (`OK`, `NOT_FOUND` …), as clients and
/// the grpc-ecosystem exporters spell it, not Rust's `Debug` (`NotFound`).
pub fn grpc_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

pub fn s3_request(op: &'static str, outcome: &'static str, latency: Duration) {
    counter!(S3_REQUESTS, "op" => op, "outcome" => outcome).increment(1);
    histogram!(S3_REQUEST_SECONDS, "op" => op).record(latency.as_secs_f64());
}

pub fn s3_bytes(bytes: u64) {
    counter!(S3_BYTES).increment(bytes);
}

pub fn store_retry() {
    counter!(STORE_RETRIES).increment(1);
}

pub fn bad_shard() {
    counter!(BAD_SHARDS).increment(1);
}

pub fn cache_write_failed() {
    counter!(CACHE_WRITE_FAILURES).increment(1);
}

pub fn index_built() {
    counter!(INDEX_BUILDS).increment(1);
}

pub fn invalid_label() {
    counter!(INVALID_LABELS).increment(1);
}

/// A decoded-source tier event: hit, miss, fill, eviction, corrupt,
/// missing, write_failed.
pub fn decoded_tier(event: &'static str) {
    counter!(DECODED_TIER, "event" => event).increment(1);
}

pub fn decoded_tier_bytes(bytes: u64) {
    gauge!(DECODED_TIER_BYTES).set(bytes as f64);
}

/// An encoded delivery's batch: `server` samples sent as pixels, `client`
/// compressed.
pub fn delivered(server: usize, client: usize) {
    counter!(DELIVERED, "decoded_by" => "server").increment(server as u64);
    counter!(DELIVERED, "decoded_by" => "client").increment(client as u64);
    UNREPORTED_CLIENT_SAMPLES.fetch_add(client as u64, std::sync::atomic::Ordering::Relaxed);
}

/// Samples sent compressed that no client has reported decoding (or failing
/// to) yet: what `ReportClientDecodes` may still count.
static UNREPORTED_CLIENT_SAMPLES: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// Takes `samples` reported by a client off the samples sent compressed;
/// refuses (returning what is left) a report of more than were sent, so no
/// client inflates the counters the decode-failure alert reads.
pub fn take_client_reports(samples: u64) -> Result<(), u64> {
    use std::sync::atomic::Ordering;
    UNREPORTED_CLIENT_SAMPLES
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
            left.checked_sub(samples)
        })
        .map(|_| ())
}

pub fn client_decodes(samples: u64) {
    counter!(CLIENT_DECODES).increment(samples);
}

pub fn substituted(reason: &'static str) {
    counter!(SUBSTITUTED, "reason" => reason).increment(1);
}

/// Per-stream handles, resolved once per stream rather than per sample.
/// Distinct rank labels one sidecar exports: a host's ranks (8 GPUs),
/// DataLoader workers' sub-ranks and a restart's new world with room to
/// spare, however many ranks clients name.
pub const MAX_RANK_LABELS: usize = 64;

/// A stream's `rank` label (see [`MAX_RANK_LABELS`]).
pub fn rank_label(rank: u32) -> String {
    static LABELLED: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());
    let mut labelled = LABELLED.lock().unwrap_or_else(|e| e.into_inner());
    if labelled.contains(&rank) {
        return rank.to_string();
    }
    if labelled.len() < MAX_RANK_LABELS {
        labelled.push(rank);
        return rank.to_string();
    }
    "other".to_string()
}

#[derive(Clone)]
pub struct StreamMetrics {
    batches: metrics::Counter,
    samples: metrics::Counter,
    decode_seconds: metrics::Histogram,
    consumer_wait: metrics::Histogram,
    ready_wait: metrics::Histogram,
    server_decode_share: metrics::Gauge,
    /// The client's waits since the producer last looked (the pool's
    /// demand signal reads them).
    consumer_wait_ns: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl StreamMetrics {
    /// Stall figures are labelled by rank: a host serves a handful of ranks.
    /// Ranks are the clients' to choose and a series is never removed, so
    /// only the first [`MAX_RANK_LABELS`] ranks a sidecar sees get a label
    /// of their own; later ones share `other`.
    pub fn new(rank: u32) -> Self {
        let rank = rank_label(rank);
        Self {
            batches: counter!(BATCHES),
            samples: counter!(SAMPLES),
            decode_seconds: histogram!(DECODE_SECONDS),
            consumer_wait: histogram!(CONSUMER_WAIT_SECONDS, "rank" => rank.clone()),
            ready_wait: histogram!(READY_WAIT_SECONDS, "rank" => rank.clone()),
            server_decode_share: gauge!(SERVER_DECODE_SHARE, "rank" => rank),
            consumer_wait_ns: Default::default(),
        }
    }

    pub fn batch_sent(&self, samples: u64) {
        self.batches.increment(1);
        self.samples.increment(samples);
    }

    /// An encoded delivery's batch: the share the server decoded.
    pub fn server_decoded(&self, share: f64) {
        self.server_decode_share.set(share);
    }

    pub fn decode_time(&self, seconds: f64) {
        self.decode_seconds.record(seconds);
    }

    /// The client asked for a batch that was not ready yet (data-bound).
    pub fn consumer_waited(&self, waited: Duration) {
        self.consumer_wait.record(waited.as_secs_f64());
        let nanos = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.consumer_wait_ns
            .fetch_add(nanos, std::sync::atomic::Ordering::Relaxed);
    }

    /// The client's waits since the last call.
    pub fn take_consumer_wait(&self) -> Duration {
        Duration::from_nanos(
            self.consumer_wait_ns
                .swap(0, std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// A ready batch waited for the client to ask (compute-bound).
    pub fn ready_waited(&self, waited: Duration) {
        self.ready_wait.record(waited.as_secs_f64());
    }
}

/// Raises a gauge by `amount` for as long as it lives.
#[derive(Debug)]
pub struct GaugeGuard {
    gauge: metrics::Gauge,
    amount: f64,
}

impl GaugeGuard {
    pub fn new(name: &'static str, amount: f64) -> Self {
        let gauge = gauge!(name);
        gauge.increment(amount);
        Self { gauge, amount }
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.gauge.decrement(self.amount);
    }
}

/// Guard that counts one open stream for as long as it lives.
pub struct ActiveStream;

impl ActiveStream {
    pub fn open() -> Self {
        gauge!(STREAMS_ACTIVE).increment(1.0);
        ActiveStream
    }
}

impl Drop for ActiveStream {
    fn drop(&mut self) {
        gauge!(STREAMS_ACTIVE).decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_chosen_ranks_get_at_most_so_many_labels() {
        let labels: std::collections::HashSet<String> =
            (1_000_000..1_020_000).map(rank_label).collect();
        assert!(labels.len() <= MAX_RANK_LABELS + 1, "{}", labels.len());
        assert!(labels.contains("other"));
        // A rank labelled once keeps its label.
        let first = rank_label(7);
        assert_eq!(rank_label(7), first);
    }

    #[test]
    fn client_reports_count_against_samples_sent_compressed() {
        delivered(0, 5);
        assert!(
            take_client_reports(u64::MAX).is_err(),
            "more than were sent"
        );
        assert_eq!(take_client_reports(5), Ok(()));
    }
}
