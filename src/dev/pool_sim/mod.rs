//! The decode pool at 1,000 ranks, in virtual time: every host's sidecar
//! is a real [`PoolClient`] (placement, hedging, re-issue, cool-downs and
//! local fallback are the sidecar's own code), reaching a modelled pool
//! ([`super::pool_model`]) that loses pods, is resized, partitioned and
//! autoscaled by the chart's rule. Each rank's producer splits a batch
//! between its host's cores and the pool as `--pool-share auto` settles
//! (the shortfall); each trainer steps at its demand and records how long
//! it waited. A ledger checks that every sample of every delivered batch
//! arrived once, in its slot.
//!
//! It needs a paused tokio clock (`start_paused`), which only test builds
//! enable: run it as `cargo run --release --example pool_sim` or through
//! `tests/pool_sim.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

mod report;

pub use report::{print, step_responses, SimReport, StepResponse};

use super::pool_model::{Autoscaling, Hpa, SimConnector, SimPool, WorkerModel};
use crate::decode::{OutputSpec, SampleKey};
use crate::pool::wire::{SampleAnswer, UnitSample};
use crate::pool::{PoolClient, PoolConfig};
use crate::shard::ImageFormat;

/// Wire bytes per sample of the unit format, out and back, as `pool-bench`
/// measures them for ~110 KB photos at 224x224x3 in units of 8.
pub const WIRE_OUT_PER_SAMPLE: f64 = 108_474.0;
pub const WIRE_BACK_PER_SAMPLE: f64 = 150_570.0;
/// The trainer's waits of its first seconds (every queue empty) are not
/// counted.
const WARM_UP: f64 = 3.0;
/// The local part of a batch takes this share of a step once `auto` has
/// settled (it steps the share 0.05 a batch; at the exact shortfall the
/// local part would take the whole step and any jitter would show).
const SETTLED_LOCAL_PACE: f64 = 0.9;
/// Weight of the newest batch in a rank's demand estimate (as the sidecar).
const DEMAND_SMOOTHING: f64 = 0.2;

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
    fn demand_at(&self, second: f64) -> f64 {
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
    waits: Vec<(f64, f64)>,
    delivered: u64,
    duplicates: u64,
    lost: u64,
    misplaced: u64,
}

/// Runs `spec` on the current runtime, whose clock must be paused.
pub async fn run(spec: SimSpec) -> SimReport {
    let pool = SimPool::new(spec.workers.clone(), spec.initial_workers, spec.seed);
    let spec = Arc::new(spec);
    let started = Instant::now();
    let output = OutputSpec::center(1, 8);
    let mut clients = Vec::new();
    let mut ranks = Vec::new();
    let gauges: Arc<Vec<AtomicU64>> = Arc::new(
        (0..spec.hosts * spec.ranks_per_host)
            .map(|_| AtomicU64::new(0f64.to_bits()))
            .collect(),
    );
    let ready = pool.ready();
    for host in 0..spec.hosts {
        let mut config = PoolConfig::new(vec!["pool.sim:50061".into()], "sim".into());
        config.unit_samples = spec.unit_samples;
        let client =
            PoolClient::with_connector(config, "sim", Box::new(SimConnector(pool.clone())));
        client.set_members(ready.clone());
        tokio::spawn(follow_service(
            client.clone(),
            pool.clone(),
            spec.clone(),
            host,
        ));
        for local_rank in 0..spec.ranks_per_host {
            let rank = host * spec.ranks_per_host + local_rank;
            ranks.push(tokio::spawn(run_rank(
                client.clone(),
                spec.clone(),
                output,
                rank,
                gauges.clone(),
            )));
        }
        clients.push(client);
    }
    tokio::spawn(chaos(pool.clone(), spec.clone()));
    let hpa = spec.autoscaling.clone().map(|rule| {
        let hpa = Arc::new(Mutex::new(Hpa::new(rule.clone())));
        tokio::spawn(autoscale(pool.clone(), hpa.clone(), rule, gauges.clone()));
        hpa
    });
    let mut logs = Vec::new();
    for rank in ranks {
        logs.push(rank.await.unwrap_or_default());
    }
    let elapsed = started.elapsed().as_secs_f64();
    report::report(&spec, &pool, &clients, logs, elapsed, hpa)
}

/// The sidecar's DNS refresh: the Service's ready pods every refresh,
/// hosts out of step with each other.
async fn follow_service(client: PoolClient, pool: Arc<SimPool>, spec: Arc<SimSpec>, host: usize) {
    let offset = spec
        .dns_refresh
        .mul_f64(host as f64 / spec.hosts.max(1) as f64);
    tokio::time::sleep(offset).await;
    while pool.seconds() < spec.seconds {
        client.set_members(pool.ready());
        tokio::time::sleep(spec.dns_refresh).await;
    }
}

/// One rank: a producer that fills batches (local cores and the pool) and
/// a trainer that takes one a step.
async fn run_rank(
    client: PoolClient,
    spec: Arc<SimSpec>,
    output: OutputSpec,
    rank: usize,
    gauges: Arc<Vec<AtomicU64>>,
) -> RankLog {
    let (sender, mut batches) = tokio::sync::mpsc::channel::<Vec<u64>>(spec.ready_batches.max(1));
    let local_rate = spec.local_per_host / spec.ranks_per_host as f64;
    let producer = tokio::spawn({
        let spec = spec.clone();
        async move {
            use futures::StreamExt;
            // The rank's share of the host's cores: one local part at a time.
            let cores = tokio::sync::Mutex::new(());
            let started = Instant::now();
            let mut decoding = futures::stream::FuturesOrdered::new();
            for batch in 0u64.. {
                let now = started.elapsed().as_secs_f64();
                if now >= spec.seconds {
                    break;
                }
                let ids: Vec<u64> = (0..spec.batch as u64)
                    .map(|slot| ((rank as u64) << 40) | (batch * spec.batch as u64 + slot))
                    .collect();
                let (client, spec, cores) = (&client, &*spec, &cores);
                decoding.push_back(async move {
                    fill_batch(client, spec, cores, output, &ids, local_rate, now).await
                });
                if decoding.len() < spec.decode_ahead.max(1) {
                    continue;
                }
                let Some(delivered) = decoding.next().await else {
                    break;
                };
                if sender.send(delivered).await.is_err() {
                    break;
                }
            }
        }
    });
    let mut log = RankLog::default();
    let started = Instant::now();
    let mut last = Instant::now();
    let mut demand = 0.0;
    let mut next_expected = 0u64;
    loop {
        let asked = Instant::now();
        let Some(batch) = batches.recv().await else {
            break;
        };
        let waited = asked.elapsed().as_secs_f64();
        let now = started.elapsed().as_secs_f64();
        let rank_demand = spec.demand_at(now) / spec.ranks_per_host as f64;
        let step = spec.batch as f64 / rank_demand;
        if now > WARM_UP {
            log.waits.push((now, waited / step));
        }
        let first = ((rank as u64) << 40) | (next_expected * spec.batch as u64);
        let expected = first..first + spec.batch as u64;
        log.misplaced += batch
            .iter()
            .zip(expected.clone())
            .filter(|(id, want)| **id != *want)
            .count() as u64;
        let mut held = batch.clone();
        held.sort_unstable();
        held.dedup();
        // Repeats within the batch, and samples of batches already taken.
        log.duplicates += (batch.len() - held.len()) as u64
            + held
                .iter()
                .filter(|id| (**id >> 40) == rank as u64 && **id < first)
                .count() as u64;
        log.lost += expected
            .filter(|id| held.binary_search(id).is_err())
            .count() as u64;
        next_expected += 1;
        log.delivered += batch.len() as u64;
        // The sidecar's demand gauge: what the trainer would take if it
        // never waited, less what local cores give.
        let interval = last.elapsed().as_secs_f64();
        last = Instant::now();
        if interval > 0.0 {
            let busy = (interval - waited).max(interval / 10.0);
            let gap = (spec.batch as f64 / busy - local_rate).max(0.0);
            demand += DEMAND_SMOOTHING * (gap - demand);
            gauges[rank].store(demand.to_bits(), Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_secs_f64(step)).await;
        if now >= spec.seconds {
            break;
        }
    }
    drop(batches);
    let _ = producer.await;
    log
}

/// One batch: the shortfall's units to the pool, the rest decoded here
/// meanwhile, any unit the pool did not answer decoded here after. Returns
/// the sample id each slot holds.
async fn fill_batch(
    client: &PoolClient,
    spec: &SimSpec,
    cores: &tokio::sync::Mutex<()>,
    output: OutputSpec,
    ids: &[u64],
    local_rate: f64,
    now: f64,
) -> Vec<u64> {
    let rank_demand = spec.demand_at(now) / spec.ranks_per_host as f64;
    // Where `auto` settles: local decode a little ahead of the trainer.
    let share = (1.0 - SETTLED_LOCAL_PACE * local_rate / rank_demand).clamp(0.0, 1.0);
    let remote = if client.live_workers() == 0 {
        0
    } else {
        (ids.len() as f64 * share).ceil() as usize
    };
    let local = ids.len() - remote;
    let units: Vec<Vec<UnitSample>> = ids[local..]
        .chunks(spec.unit_samples.max(1))
        .map(|chunk| {
            chunk
                .iter()
                .map(|&id| UnitSample {
                    key: SampleKey {
                        seed: 0,
                        epoch: 0,
                        sample: id,
                    },
                    format: ImageFormat::Jpeg,
                    data: Bytes::new(),
                })
                .collect()
        })
        .collect();
    let local_time = Duration::from_secs_f64(local as f64 / local_rate);
    let decode_here = async {
        let _cores = cores.lock().await;
        tokio::time::sleep(local_time).await;
    };
    let (answers, ()) = tokio::join!(
        futures::future::join_all(units.iter().map(|unit| client.decode(&output, unit))),
        decode_here,
    );
    let mut slots: Vec<u64> = ids[..local].to_vec();
    let mut fallback = 0usize;
    for (unit, answer) in units.iter().zip(answers) {
        match answer {
            Some(answer) => {
                let sample_bytes = output.bytes();
                for (i, (sample, outcome)) in unit.iter().zip(&answer.samples).enumerate() {
                    let pixels = &answer.pixels[i * sample_bytes..i * sample_bytes + 8];
                    let id = u64::from_le_bytes(pixels.try_into().unwrap_or_default());
                    debug_assert!(matches!(outcome, SampleAnswer::Decoded(_)));
                    slots.push(if matches!(outcome, SampleAnswer::Decoded(_)) {
                        id
                    } else {
                        sample.key.sample
                    });
                }
            }
            None => {
                fallback += unit.len();
                slots.extend(unit.iter().map(|sample| sample.key.sample));
            }
        }
    }
    if fallback > 0 {
        let _cores = cores.lock().await;
        tokio::time::sleep(Duration::from_secs_f64(fallback as f64 / local_rate)).await;
    }
    slots
}

/// Pods lost at the spec's rate, resizes and partitions at their times.
async fn chaos(pool: Arc<SimPool>, spec: Arc<SimSpec>) {
    let mut owed = 0.0;
    let mut resizes = spec.resizes.clone();
    let mut partitions = spec.partitions.clone();
    while pool.seconds() < spec.seconds {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = pool.seconds();
        owed += spec.loss_per_minute * pool.replicas() as f64 / 600.0;
        while owed >= 1.0 {
            pool.kill_one();
            owed -= 1.0;
        }
        resizes.retain(|&(at, factor)| {
            if at > now {
                return true;
            }
            let replicas = (pool.replicas() as f64 * factor).round().max(1.0) as usize;
            pool.scale_to(replicas);
            false
        });
        partitions.retain(|&(at, share, seconds)| {
            if at > now {
                return true;
            }
            pool.partition(share, Duration::from_secs_f64(seconds));
            false
        });
    }
}

/// Prometheus scrapes the gauges, KEDA polls, the HPA sets replicas.
async fn autoscale(
    pool: Arc<SimPool>,
    hpa: Arc<Mutex<Hpa>>,
    rule: Autoscaling,
    gauges: Arc<Vec<AtomicU64>>,
) {
    loop {
        tokio::time::sleep(rule.polling).await;
        let demand: f64 = gauges
            .iter()
            .map(|gauge| f64::from_bits(gauge.load(Ordering::Relaxed)))
            .sum();
        let now = pool.seconds();
        let replicas =
            hpa.lock()
                .unwrap_or_else(|e| e.into_inner())
                .decide(now, demand, pool.replicas());
        pool.scale_to(replicas);
    }
}
