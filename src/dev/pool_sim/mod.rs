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
mod spec;

pub use report::{print, step_responses, SimReport, StepResponse};
pub use spec::{churn, demand_step, worker, SimSpec, WIRE_BACK_PER_SAMPLE, WIRE_OUT_PER_SAMPLE};
use spec::{RankLog, DEMAND_SMOOTHING, SETTLED_LOCAL_PACE, WARM_UP};

use super::pool_model::{Autoscaling, Hpa, SimConnector, SimPool};
use crate::decode::{OutputSpec, SampleKey};
use crate::pool::wire::{SampleAnswer, UnitSample};
use crate::pool::{PoolClient, PoolConfig};
use crate::shard::ImageFormat;

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
                        copy: 0,
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
