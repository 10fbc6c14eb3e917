//! The decode pool's metrics: the sidecar's units (sent, re-issued,
//! hedged, failed, given up to local decode), their latency, the share of
//! samples decoded remotely, the live workers and the demand signal KEDA
//! scales the pool on; and each worker's units and utilisation.

use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

pub const UNITS: &str = "shardfeed_pool_units_total";
pub const UNIT_SECONDS: &str = "shardfeed_pool_unit_seconds";
pub const SAMPLES: &str = "shardfeed_pool_samples_total";
pub const WORKERS: &str = "shardfeed_pool_workers";
pub const SHARE: &str = "shardfeed_pool_share";
pub const DEMAND: &str = "shardfeed_pool_demand_samples_per_second";
pub const WORKER_UNITS: &str = "shardfeed_pool_worker_units_total";
pub const WORKER_SAMPLES: &str = "shardfeed_pool_worker_samples_total";
pub const WORKER_UNIT_SECONDS: &str = "shardfeed_pool_worker_unit_seconds";
pub const WORKER_BUSY: &str = "shardfeed_pool_worker_busy_ratio";

/// Every outcome a sidecar's unit attempt is counted under.
pub const UNIT_OUTCOMES: [&str; 9] = [
    "sent", "answered", "hedged", "reissued", "failed", "refused", "rejected", "outpaced", "local",
];

pub fn describe() {
    describe_counter!(
        UNITS,
        "Decode-pool work units, by outcome: sent (attempts), answered (first answers used), \
         hedged (another attempt for a slow unit), reissued (after a failed attempt), failed \
         (attempts that errored, busy workers included), refused (by a worker's token or build \
         check: the worker is benched for a minute), rejected (a unit past a worker's bounds: \
         decoded here, the worker keeps its place), outpaced (attempts still pending when a later one answered: their worker \
         backs off), local (units no worker answered in time, decoded here)."
    );
    describe_histogram!(
        UNIT_SECONDS,
        metrics::Unit::Seconds,
        "Time from a unit's first attempt to its first answer."
    );
    describe_counter!(
        SAMPLES,
        "Samples of decoded deliveries by where they were decoded (local, remote)."
    );
    describe_gauge!(
        WORKERS,
        "Pool workers the sidecar can send to (resolved and not cooling down)."
    );
    describe_gauge!(
        SHARE,
        "Share of each batch a stream sends to the pool, by rank."
    );
    describe_gauge!(
        DEMAND,
        "Samples per second this sidecar's trainers would consume if they never waited, less what \
         local decode supplies: the pool's autoscaling signal."
    );
    describe_counter!(
        WORKER_UNITS,
        "Units a pool worker received, by outcome (decoded, busy, invalid, unauthenticated, \
         wrong_build, draining)."
    );
    describe_counter!(WORKER_SAMPLES, "Samples a pool worker decoded.");
    describe_histogram!(
        WORKER_UNIT_SECONDS,
        metrics::Unit::Seconds,
        "A pool worker's time per unit, from admission to answer."
    );
    describe_gauge!(
        WORKER_BUSY,
        "Share of a pool worker's unit slots in use (its utilisation)."
    );
    for outcome in UNIT_OUTCOMES {
        counter!(UNITS, "outcome" => outcome).absolute(0);
    }
    for place in ["local", "remote"] {
        counter!(SAMPLES, "decoder" => place).absolute(0);
    }
}

pub fn unit(outcome: &'static str) {
    counter!(UNITS, "outcome" => outcome).increment(1);
}

pub fn unit_time(latency: Duration) {
    histogram!(UNIT_SECONDS).record(latency.as_secs_f64());
}

pub fn samples(local: u64, remote: u64) {
    counter!(SAMPLES, "decoder" => "local").increment(local);
    counter!(SAMPLES, "decoder" => "remote").increment(remote);
}

pub fn workers(live: usize) {
    gauge!(WORKERS).set(live as f64);
}

pub fn share(rank: &str, share: f64) {
    gauge!(SHARE, "rank" => rank.to_string()).set(share);
}

/// Moves the host's demand by a stream's change in its own.
pub fn demand_changed(by: f64) {
    gauge!(DEMAND).increment(by);
}

pub fn worker_unit(outcome: &'static str) {
    counter!(WORKER_UNITS, "outcome" => outcome).increment(1);
}

pub fn worker_samples(samples: u64) {
    counter!(WORKER_SAMPLES).increment(samples);
}

pub fn worker_unit_time(latency: Duration) {
    histogram!(WORKER_UNIT_SECONDS).record(latency.as_secs_f64());
}

/// Counts one unit slot in use for as long as it lives.
pub struct WorkerBusy {
    share: f64,
}

impl WorkerBusy {
    pub fn enter(slots: usize) -> Self {
        let share = 1.0 / slots.max(1) as f64;
        gauge!(WORKER_BUSY).increment(share);
        Self { share }
    }
}

impl Drop for WorkerBusy {
    fn drop(&mut self) {
        gauge!(WORKER_BUSY).decrement(self.share);
    }
}
