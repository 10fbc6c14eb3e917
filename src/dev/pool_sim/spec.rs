//! What a pool simulation runs: its spec, the two scenarios, the worker
//! model, and what one rank saw.

use std::time::Duration;

use crate::dev::pool_model::{Autoscaling, WorkerModel};

/// Wire bytes per sample of the unit format, out and back, as `pool-bench`
/// measures them for ~110 KB photos at 224x224x3 in units of 8.
pub const WIRE_OUT_PER_SAMPLE: f64 = 108_474.0;
pub const WIRE_BACK_PER_SAMPLE: f64 = 150_570.0;
/// The trainer's waits of its first seconds (every queue empty) are not
/// counted.
pub(super) const WARM_UP: f64 = 3.0;
/// The local part of a batch takes this share of a step once `auto` has
/// settled (it steps the share 0.05 a batch; at the exact shortfall the
/// local part would take the whole step and any jitter would show).
pub(super) const SETTLED_LOCAL_PACE: f64 = 0.9;
/// Weight of the newest batch in a rank's demand estimate (as the sidecar).
pub(super) const DEMAND_SMOOTHING: f64 = 0.2;

#[derive(Debug, Clone)]
pub struct SimSpec {
    pub hosts: usize,
    pub ranks_per_host: usize,
    pub batch: usize,
    pub unit_samples: usize,
    /// Samples/s a host's own cores decode.
    pub local_per_host: f64,
    /// (from second, samples/s each host's trainers consume).
    pub demand: Vec<(f64, f64)>,
    pub seconds: f64,
    /// Batches a rank's stream decodes at once (`decode_ahead`) and holds
    /// ready ahead of its trainer (`ready_batches`), as the stream config.
    pub decode_ahead: usize,
    pub ready_batches: usize,
    pub workers: WorkerModel,
    pub initial_workers: usize,
    /// Share of the ready pods lost each minute (replaced by the
    /// Deployment).
    pub loss_per_minute: f64,
    /// (at second, replicas as a share of the replicas then).
    pub resizes: Vec<(f64, f64)>,
    /// (at second, share of pods, seconds): calls to them hang meanwhile.
    pub partitions: Vec<(f64, f64, f64)>,
    pub autoscaling: Option<Autoscaling>,
    /// How often a sidecar re-resolves the Service.
    pub dns_refresh: Duration,
    pub seed: u64,
}

impl SimSpec {
    pub(super) fn demand_at(&self, second: f64) -> f64 {
        self.demand
            .iter()
            .rev()
            .find(|(from, _)| *from <= second)
            .or(self.demand.first())
            .map_or(0.0, |(_, rate)| *rate)
    }

    /// Workers the rule would want for `demand` per host.
    pub fn workers_needed(&self, demand: f64, samples_per_worker: f64) -> f64 {
        self.hosts as f64 * (demand - self.local_per_host).max(0.0) / samples_per_worker
    }
}

/// A worker of 4 decode threads: ~2,500 samples/s in units of 8, of which
/// the chart's rule plans 2,000 (80%).
pub fn worker() -> WorkerModel {
    WorkerModel {
        threads: 4,
        unit_median: Duration::from_micros(11_300),
        unit_sigma: 0.5,
        network: Duration::from_micros(800),
        pod_start: Duration::from_secs(20),
    }
}

const SAMPLES_PER_WORKER: f64 = 2_000.0;

/// 125 hosts x 8 ranks (or `hosts`) at 24,000 samples/s a host, 8,000 of
/// them from local cores, against a pool sized by the rule that loses 5%
/// of its pods a minute, has 5% partitioned away for 4 s at 1/7 of the
/// run, grows by half at 2/7 (new pods ready 20 s later) and is cut by
/// half at 5/7, below the demand (trainers then wait; nothing is lost).
pub fn churn(hosts: usize, seconds: f64) -> SimSpec {
    let mut spec = SimSpec {
        hosts,
        ranks_per_host: 8,
        batch: 128,
        unit_samples: 8,
        local_per_host: 8_000.0,
        demand: vec![(0.0, 24_000.0)],
        seconds,
        decode_ahead: crate::pool::POOL_DECODE_AHEAD,
        ready_batches: crate::pipeline::DEFAULT_READY_BATCHES,
        workers: worker(),
        initial_workers: 0,
        loss_per_minute: 0.05,
        resizes: vec![(seconds * 2.0 / 7.0, 1.5), (seconds * 5.0 / 7.0, 0.5)],
        partitions: vec![(seconds / 7.0, 0.05, 4.0)],
        autoscaling: None,
        dns_refresh: Duration::from_secs(5),
        seed: 35,
    };
    spec.initial_workers = spec.workers_needed(24_000.0, SAMPLES_PER_WORKER).ceil() as usize;
    spec
}

/// The chart's autoscaling rule following each host's demand from 24,000
/// to 80,000 samples/s at 60 s and back at 240 s, with pods still lost.
pub fn demand_step(hosts: usize, seconds: f64) -> SimSpec {
    let mut spec = churn(hosts, seconds);
    spec.resizes.clear();
    spec.partitions.clear();
    spec.demand = vec![(0.0, 24_000.0), (60.0, 80_000.0), (240.0, 24_000.0)];
    spec.autoscaling = Some(Autoscaling {
        samples_per_worker: SAMPLES_PER_WORKER,
        min_replicas: 1,
        max_replicas: 100_000,
        polling: Duration::from_secs(15),
        scale_down_stabilization: Duration::from_secs(300),
        // The chart's defaults (pool.autoscaling).
        scale_up_percent: 900.0,
        scale_down_percent: 50.0,
    });
    spec
}

/// What one rank saw.
#[derive(Default)]
pub(super) struct RankLog {
    /// (second, wait / step) for every step after the warm-up.
    pub(super) waits: Vec<(f64, f64)>,
    pub(super) delivered: u64,
    pub(super) duplicates: u64,
    pub(super) lost: u64,
    pub(super) misplaced: u64,
}
