//! What a simulation run reports: the ledger's totals, the trainers'
//! waits per window, the pool's unit outcomes and network, placement moves
//! and the autoscaling rule's step response, and the table printed.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

use super::spec::{RankLog, SimSpec, WARM_UP, WIRE_BACK_PER_SAMPLE, WIRE_OUT_PER_SAMPLE};
use crate::dev::pool_model::{Hpa, SimPool};
use crate::pool::link::{Connector, WorkerLink};
use crate::pool::wire::pb;
use crate::pool::{PoolClient, PoolConfig};

#[derive(Debug, Clone, Default)]
pub struct SimReport {
    pub ranks: usize,
    pub samples: u64,
    pub duplicates: u64,
    pub losses: u64,
    /// Samples whose slot held another sample's pixels.
    pub misplaced: u64,
    /// (label, from, to, p50, p99, p99.9 of wait / step, steps).
    pub waits: Vec<(String, f64, f64, f64, f64, f64, usize)>,
    pub units_sent_per_sidecar_per_s: f64,
    pub answered: u64,
    pub hedged: u64,
    pub reissued: u64,
    pub failed: u64,
    pub local_units: u64,
    pub remote_share: f64,
    /// Gbit/s a host sends and receives on average.
    pub host_out_gbps: f64,
    pub host_in_gbps: f64,
    /// Units moved by one worker joining and one leaving, as a share of all,
    /// and 1/N for the N at the end.
    pub moved_on_join: f64,
    pub moved_on_leave: f64,
    pub one_nth: f64,
    pub workers_at_end: usize,
    pub killed: usize,
    /// (second, count) at every change of the Deployment's replicas and of
    /// the ready pods; the autoscaler's (second, demand, replicas) calls.
    pub replica_history: Vec<(f64, usize)>,
    pub ready_history: Vec<(f64, usize)>,
    pub decisions: Vec<(f64, f64, usize)>,
}

/// A link nothing answers on: placement alone is measured with it.
struct Unreachable;

impl Connector for Unreachable {
    fn connect(&self, _addr: SocketAddr) -> Option<Arc<dyn WorkerLink>> {
        Some(Arc::new(Unreachable))
    }
}

impl WorkerLink for Unreachable {
    fn decode(
        &self,
        _unit: pb::DecodeUnit,
        _identity: &str,
        _token: &str,
    ) -> BoxFuture<'static, Result<pb::DecodedUnit, tonic::Status>> {
        Box::pin(async { Err(tonic::Status::unavailable("placement only")) })
    }
}

/// Shares of units whose first choice changes when one worker joins and
/// when one leaves `workers`.
fn units_moved(workers: &[SocketAddr]) -> (f64, f64) {
    let client = |addrs: Vec<SocketAddr>| {
        let client = PoolClient::with_connector(
            PoolConfig::new(vec![], String::new()),
            "sim",
            Box::new(Unreachable),
        );
        client.set_members(addrs);
        client
    };
    let base = client(workers.to_vec());
    let mut joined = workers.to_vec();
    joined.push(SocketAddr::from(([10, 255, 255, 254], 50061)));
    let joined = client(joined);
    let left = client(workers[1..].to_vec());
    let units = 100_000u64;
    let (mut on_join, mut on_leave) = (0u64, 0u64);
    for unit in 0..units {
        let affinity = crate::hash::fmix64(unit);
        let owner = base.first_choice(affinity);
        on_join += u64::from(joined.first_choice(affinity) != owner);
        on_leave += u64::from(left.first_choice(affinity) != owner);
    }
    (
        on_join as f64 / units as f64,
        on_leave as f64 / units as f64,
    )
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

pub(super) fn report(
    spec: &SimSpec,
    pool: &Arc<SimPool>,
    clients: &[PoolClient],
    logs: Vec<RankLog>,
    elapsed: f64,
    hpa: Option<Arc<Mutex<Hpa>>>,
) -> SimReport {
    let mut report = SimReport {
        ranks: logs.len(),
        ..SimReport::default()
    };
    for log in &logs {
        report.samples += log.delivered;
        report.duplicates += log.duplicates;
        report.losses += log.lost;
        report.misplaced += log.misplaced;
    }
    for (label, from, to) in windows(spec) {
        let mut shares: Vec<f64> = logs
            .iter()
            .flat_map(|log| log.waits.iter())
            .filter(|(at, _)| *at >= from && *at < to)
            .map(|(_, share)| *share)
            .collect();
        shares.sort_by(f64::total_cmp);
        report.waits.push((
            label,
            from,
            to,
            quantile(&shares, 0.5),
            quantile(&shares, 0.99),
            quantile(&shares, 0.999),
            shares.len(),
        ));
    }
    let mut sent = 0u64;
    let mut remote_samples = 0u64;
    for client in clients {
        let counts = client.counts();
        sent += counts.sent;
        report.answered += counts.answered;
        report.hedged += counts.hedged;
        report.reissued += counts.reissued;
        report.failed += counts.failed;
        report.local_units += counts.local;
        remote_samples += counts.remote_samples;
    }
    let host_seconds = spec.hosts as f64 * elapsed;
    report.units_sent_per_sidecar_per_s = sent as f64 / host_seconds;
    report.remote_share = remote_samples as f64 / report.samples.max(1) as f64;
    let samples_out = sent as f64 * spec.unit_samples as f64;
    let samples_back = pool.answers_back.load(Ordering::Relaxed) as f64 * spec.unit_samples as f64;
    report.host_out_gbps = samples_out * WIRE_OUT_PER_SAMPLE * 8.0 / host_seconds / 1e9;
    report.host_in_gbps = samples_back * WIRE_BACK_PER_SAMPLE * 8.0 / host_seconds / 1e9;
    let ready = pool.ready();
    report.workers_at_end = ready.len();
    if ready.len() > 1 {
        let (join, leave) = units_moved(&ready);
        report.moved_on_join = join;
        report.moved_on_leave = leave;
        report.one_nth = 1.0 / ready.len() as f64;
    }
    report.killed = pool.killed();
    report.replica_history = pool.replica_history();
    report.ready_history = pool.ready_history();
    if let Some(hpa) = hpa {
        report.decisions = hpa
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .decisions
            .clone();
    }
    report
}

/// The spans the waits are reported over: all of the run, the steady part
/// before the first event, and from each event (a resize, a partition, a
/// demand step) to the next, with a demand step's span again from a
/// minute on when an autoscaler follows it.
fn windows(spec: &SimSpec) -> Vec<(String, f64, f64)> {
    let mut windows: Vec<(String, f64, f64)> = vec![("all".into(), WARM_UP, spec.seconds)];
    let mut marks: Vec<(f64, String)> = spec
        .resizes
        .iter()
        .map(|(at, factor)| (*at, format!("after resize x{factor}")))
        .chain(spec.partitions.iter().map(|(at, share, seconds)| {
            (
                *at,
                format!("partition {:.0}% for {seconds}s", share * 100.0),
            )
        }))
        .chain(
            spec.demand
                .iter()
                .skip(1)
                .map(|(at, rate)| (*at, format!("demand {rate:.0}/s"))),
        )
        .collect();
    marks.sort_by(|a, b| a.0.total_cmp(&b.0));
    let first = marks.first().map_or(spec.seconds, |(at, _)| *at);
    windows.push(("steady".into(), WARM_UP, first));
    for (i, (at, label)) in marks.iter().enumerate() {
        let end = marks.get(i + 1).map_or(spec.seconds, |(next, _)| *next);
        windows.push((label.clone(), *at, end));
        // Once the autoscaler has had a minute to follow a demand step.
        if spec.autoscaling.is_some() && label.starts_with("demand") && at + 60.0 < end {
            windows.push((format!("{label}, from +60 s"), at + 60.0, end));
        }
    }
    windows
}

/// How the autoscaling rule followed one demand step.
#[derive(Debug, Clone)]
pub struct StepResponse {
    pub at: f64,
    pub from: f64,
    pub to: f64,
    pub needed: f64,
    /// Seconds until ready pods reached 90% and 100% of `needed` (up) or
    /// replicas came down to within 10% of it (down).
    pub reached_90: Option<f64>,
    pub reached: Option<f64>,
    /// Before the next step: the most ready pods over `needed`, less one
    /// (up), or the fewest (down: below zero, the pool was cut too far).
    pub overshoot: f64,
    /// Times the replica count changed direction before the next step.
    pub reversals: usize,
}

/// The rule's response to each demand step of `spec`.
pub fn step_responses(spec: &SimSpec, report: &SimReport) -> Vec<StepResponse> {
    let Some(rule) = &spec.autoscaling else {
        return Vec::new();
    };
    let mut responses = Vec::new();
    for (i, window) in spec.demand.windows(2).enumerate() {
        let ((_, from), (at, to)) = (window[0], window[1]);
        let end = spec
            .demand
            .get(i + 2)
            .map_or(spec.seconds, |(next, _)| *next);
        let needed = spec.workers_needed(to, rule.samples_per_worker);
        let up = to > from;
        let in_step = |history: &[(f64, usize)]| -> Vec<(f64, usize)> {
            history
                .iter()
                .copied()
                .filter(|(t, _)| *t >= at && *t < end)
                .collect()
        };
        let ready = in_step(&report.ready_history);
        let replicas = in_step(&report.replica_history);
        let first_time = |series: &[(f64, usize)], test: &dyn Fn(f64) -> bool| {
            series
                .iter()
                .find(|(_, count)| test(*count as f64))
                .map(|(t, _)| t - at)
        };
        let (reached_90, reached) = if up {
            (
                first_time(&ready, &|count| count >= 0.9 * needed),
                first_time(&ready, &|count| count >= needed),
            )
        } else {
            let near = first_time(&replicas, &|count| count <= 1.1 * needed);
            (near, near)
        };
        let counts = ready.iter().map(|(_, count)| *count);
        let most = if up { counts.max() } else { counts.min() }.unwrap_or(0) as f64;
        let mut reversals = 0;
        let mut direction = 0i64;
        for pair in replicas.windows(2) {
            let change = pair[1].1 as i64 - pair[0].1 as i64;
            if change != 0 && direction != 0 && change.signum() != direction {
                reversals += 1;
            }
            if change != 0 {
                direction = change.signum();
            }
        }
        responses.push(StepResponse {
            at,
            from,
            to,
            needed,
            reached_90,
            reached,
            overshoot: most / needed.max(1.0) - 1.0,
            reversals,
        });
    }
    responses
}

/// The report as the closing note's table.
pub fn print(spec: &SimSpec, report: &SimReport) {
    let seconds = |value: Option<f64>| value.map_or("never".to_string(), |s| format!("{s:.0} s"));
    println!(
        "{} hosts x {} ranks, batch {}, units of {}, {:.0} local samples/s a host, {} s virtual",
        spec.hosts,
        spec.ranks_per_host,
        spec.batch,
        spec.unit_samples,
        spec.local_per_host,
        spec.seconds
    );
    println!(
        "samples delivered {}, duplicates {}, losses {}, misplaced {}",
        report.samples, report.duplicates, report.losses, report.misplaced
    );
    println!(
        "units: {:.0}/s sent per sidecar; answered {}, hedged {}, re-issued {}, failed {}, decoded locally {}; {:.1}% of samples decoded by the pool",
        report.units_sent_per_sidecar_per_s,
        report.answered,
        report.hedged,
        report.reissued,
        report.failed,
        report.local_units,
        report.remote_share * 100.0
    );
    println!(
        "per host: {:.2} Gbit/s out, {:.2} Gbit/s in (at {WIRE_OUT_PER_SAMPLE:.0} B out, {WIRE_BACK_PER_SAMPLE:.0} B back a sample; hedges and re-issues included)",
        report.host_out_gbps, report.host_in_gbps
    );
    println!(
        "workers at the end {}, pods lost {}; one joining moves {:.3}% of units, one leaving {:.3}% (1/N = {:.3}%)",
        report.workers_at_end,
        report.killed,
        report.moved_on_join * 100.0,
        report.moved_on_leave * 100.0,
        report.one_nth * 100.0
    );
    println!("trainer wait as a share of the step, per window:");
    println!(
        "  {:<28} {:>8} {:>8} {:>8} {:>8} {:>9}",
        "window", "from s", "p50", "p99", "p99.9", "steps"
    );
    for (label, from, _to, p50, p99, p999, steps) in &report.waits {
        println!("  {label:<28} {from:>8.0} {p50:>8.4} {p99:>8.4} {p999:>8.4} {steps:>9}");
    }
    for step in step_responses(spec, report) {
        println!(
            "demand {:.0} -> {:.0}/s a host at {:.0} s: {:.0} workers needed; {}; {} {:+.1}%, {} reversals",
            step.from,
            step.to,
            step.at,
            step.needed,
            if step.to > step.from {
                format!("90% ready after {}, all after {}", seconds(step.reached_90), seconds(step.reached))
            } else {
                format!("within 10% after {}", seconds(step.reached))
            },
            if step.to > step.from { "most ready" } else { "fewest ready" },
            step.overshoot * 100.0,
            step.reversals
        );
    }
}
