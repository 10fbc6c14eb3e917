//! The sidecar's side of the pool: which workers are live, which one a unit
//! goes to, and what happens when a worker is slow, refuses, or is gone.
//!
//! - **Membership.** Each `--pool` target is a `host:port`; names are
//!   resolved with the system resolver (the pod's resolv.conf: search
//!   domains and all), so a headless Service's name gives one address per
//!   ready worker. The set is re-resolved every `refresh`, at once (at
//!   most once a second) when an attempt cannot connect, and with
//!   exponential backoff while resolution fails.
//! - **Placement.** Rendezvous hashing of the unit's first sample over the
//!   live workers: a worker joining or leaving moves about 1/N of the
//!   units, and a unit's second choice is a stable, different worker.
//! - **Deadlines.** A unit's first attempt goes to its first choice; past
//!   the hedge delay (the p95 of answers, at most three medians, at least
//!   `min_hedge`), a hedge goes to the next, and one more each hedge delay
//!   after while workers remain (three attempts at most); an attempt that
//!   fails is re-issued to the next at once. The first answer wins and the
//!   others are dropped. A unit with no worker left to try is given back
//!   for local decode after one hedge delay more than it had attempts
//!   (two at least), and any unit at `deadline`.
//! - **Cool-down.** A worker that failed an attempt sits out a backoff
//!   (doubling to 5 s), one that was busy (RESOURCE_EXHAUSTED) 20 ms; one
//!   that refused the sidecar's token or build sits
//!   out a minute, logged once.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
// Tokio's clock, not std's: the pool simulation runs this code in paused,
// virtual time.
use tokio::time::Instant;

use super::link::{Connector, GrpcConnector};
use super::wire::{self, pb, SampleAnswer, UnitOutput, UnitSample};
use crate::hash::fmix64;
use crate::metrics::log_gate::LogGate;
use crate::metrics::pool as pool_metrics;
use crate::net::tls::PoolTls;

mod members;

use members::{Members, Membership, Worker};

pub const DEFAULT_UNIT_SAMPLES: usize = 8;
pub const DEFAULT_UNITS_PER_WORKER: usize = 4;
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);
pub const DEFAULT_MIN_HEDGE: Duration = Duration::from_millis(50);
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(5);
/// Attempts of one unit at most (first, hedge, re-issues).
const MAX_ATTEMPTS: usize = 3;
/// Answers the hedge delay is taken from.
const LATENCY_WINDOW: usize = 512;
/// Fewer answers than this: no percentiles yet, hedge at a tenth of the
/// deadline.
const LATENCY_MIN_SAMPLES: usize = 8;
/// Answers between two refreshes of the hedge delay.
const HEDGE_REFRESH: u64 = 8;
/// A unit is hedged past the p95 of answers, but no later than this many
/// medians: where one worker of a few is slow, the p95 is that worker's
/// pace and would never hedge its units.
const HEDGE_MEDIANS: u32 = 3;
/// A unit with no worker left to hedge to is decoded locally this many
/// hedge delays after it was sent.
const LOCAL_HEDGE_DELAYS: u32 = 2;

/// How much of each batch a stream sends to the pool.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PoolShareSetting {
    /// Only the shortfall: the share rises while the trainer waits and
    /// falls while local decode keeps ahead.
    Auto,
    /// A fixed share (benchmarks, tests).
    Fixed(f64),
}

impl std::str::FromStr for PoolShareSetting {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text == "auto" {
            return Ok(Self::Auto);
        }
        match text.parse::<f64>() {
            Ok(share) if (0.0..=1.0).contains(&share) => Ok(Self::Fixed(share)),
            _ => Err(format!("{text:?} is neither `auto` nor a share in [0, 1]")),
        }
    }
}

#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// `host:port` entries; a name may resolve to many workers.
    pub targets: Vec<String>,
    pub token: String,
    pub share: PoolShareSetting,
    /// Samples per unit.
    pub unit_samples: usize,
    /// Units in flight to one worker at most.
    pub units_per_worker: usize,
    pub deadline: Duration,
    pub min_hedge: Duration,
    pub refresh: Duration,
    /// TLS to the workers (None: plain text, loopback or by choice).
    pub tls: Option<PoolTls>,
}

impl PoolConfig {
    pub fn new(targets: Vec<String>, token: String) -> Self {
        Self {
            targets,
            token,
            share: PoolShareSetting::Auto,
            unit_samples: DEFAULT_UNIT_SAMPLES,
            units_per_worker: DEFAULT_UNITS_PER_WORKER,
            deadline: DEFAULT_DEADLINE,
            min_hedge: DEFAULT_MIN_HEDGE,
            refresh: DEFAULT_REFRESH,
            tls: None,
        }
    }
}

/// A client's unit outcomes so far (as `shardfeed_pool_units_total`
/// counts them for the whole process).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UnitCounts {
    pub sent: u64,
    pub answered: u64,
    pub hedged: u64,
    pub reissued: u64,
    pub failed: u64,
    pub refused: u64,
    /// Units a worker would not take (past its bounds), decoded here.
    pub rejected: u64,
    pub outpaced: u64,
    pub local: u64,
    /// Samples in the units answered.
    pub remote_samples: u64,
}

struct Inner {
    counts: Mutex<UnitCounts>,
    config: PoolConfig,
    identity: String,
    /// The clock's zero for the workers' cool-downs.
    started: Instant,
    membership: Arc<Membership>,
    latencies: Mutex<VecDeque<Duration>>,
    next_unit: AtomicU64,
    /// The hedge delay in nanoseconds (0: too few answers yet).
    hedge_nanos: AtomicU64,
    /// Answers recorded so far.
    answers: AtomicU64,
    rejections: LogGate,
    /// The share `auto` streams last settled at (f64 bits): a new stream
    /// starts there rather than ramping from nothing.
    settled_share: AtomicU64,
}

/// The sidecar's handle on the pool; clones share one membership.
#[derive(Clone)]
pub struct PoolClient {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PoolClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolClient")
            .field("targets", &self.inner.config.targets)
            .field("live", &self.live_workers())
            .finish()
    }
}

/// A unit's answer: its pixels, in sample order, and each sample's outcome.
#[derive(Debug, Clone)]
pub struct UnitAnswer {
    pub pixels: Bytes,
    pub samples: Vec<SampleAnswer>,
}

enum AttemptError {
    /// The worker will not take this sidecar's units (token, build).
    Refused(tonic::Status),
    /// The worker will not take this unit (past its size or count bounds):
    /// the worker is healthy and every worker of the pool would say the
    /// same, so the unit is decoded here and nobody is benched.
    Rejected(tonic::Status),
    /// The worker holds all the units it takes: the next may have room.
    Busy,
    /// Anything else: the next worker may answer.
    Failed(String),
}

impl PoolClient {
    /// Starts following `config.targets` on the current runtime. `decoder`
    /// names the local decoder: workers must run the same.
    pub fn start(config: PoolConfig, decoder: &str) -> Self {
        let connector = GrpcConnector::new(config.tls.as_ref());
        let client = Self::with_connector(config, decoder, Box::new(connector));
        tokio::spawn(members::follow(Arc::downgrade(&client.inner.membership)));
        client
    }

    /// A client whose workers are reached through `connector` and whose
    /// membership only [`Self::set_members`] changes (the simulation).
    pub fn with_connector(
        config: PoolConfig,
        decoder: &str,
        connector: Box<dyn Connector>,
    ) -> Self {
        let membership = Arc::new(Membership::new(
            config.targets.clone(),
            config.refresh,
            config.units_per_worker,
            connector,
        ));
        let inner = Arc::new(Inner {
            membership,
            counts: Mutex::default(),
            identity: wire::build_identity(decoder),
            started: Instant::now(),
            config,
            latencies: Mutex::new(VecDeque::with_capacity(LATENCY_WINDOW)),
            next_unit: AtomicU64::new(1),
            settled_share: AtomicU64::new(0f64.to_bits()),
            hedge_nanos: AtomicU64::new(0),
            answers: AtomicU64::new(0),
            rejections: LogGate::new(Duration::from_secs(60)),
        });
        Self { inner }
    }

    /// Makes `addrs` the live workers (what a resolution of the targets
    /// does): newcomers are connected, the departed dropped.
    pub fn set_members(&self, addrs: Vec<SocketAddr>) {
        self.inner.membership.update(addrs);
    }

    /// The worker a unit whose first sample is `affinity` goes to first,
    /// when all have free slots (placement, for the simulation's count of
    /// units moved by a membership change).
    pub fn first_choice(&self, affinity: u64) -> Option<SocketAddr> {
        let members = self.members();
        members
            .iter()
            .max_by_key(|worker| rendezvous_score(affinity, worker.key))
            .map(|worker| worker.addr)
    }

    fn members(&self) -> Members {
        self.inner.membership.current()
    }

    fn now_nanos(&self) -> u64 {
        u64::try_from(self.inner.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    pub fn config(&self) -> &PoolConfig {
        &self.inner.config
    }

    /// The share the last `auto` stream settled at.
    pub fn settled_share(&self) -> f64 {
        f64::from_bits(self.inner.settled_share.load(Ordering::Relaxed))
    }

    pub fn settle_share(&self, share: f64) {
        self.inner
            .settled_share
            .store(share.clamp(0.0, 1.0).to_bits(), Ordering::Relaxed);
    }

    /// This client's unit outcomes so far.
    pub fn counts(&self) -> UnitCounts {
        *self.inner.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, outcome: &'static str) {
        pool_metrics::unit(outcome);
        let mut counts = self.inner.counts.lock().unwrap_or_else(|e| e.into_inner());
        let field = match outcome {
            "sent" => &mut counts.sent,
            "answered" => &mut counts.answered,
            "hedged" => &mut counts.hedged,
            "reissued" => &mut counts.reissued,
            "failed" => &mut counts.failed,
            "refused" => &mut counts.refused,
            "rejected" => &mut counts.rejected,
            "outpaced" => &mut counts.outpaced,
            _ => &mut counts.local,
        };
        *field += 1;
    }

    /// Workers resolved and not cooling down.
    pub fn live_workers(&self) -> usize {
        let now = self.now_nanos();
        self.members()
            .iter()
            .filter(|worker| worker.available(now))
            .count()
    }

    /// Resolves the targets now and waits until at least `at_least` workers
    /// are known or `timeout` passes (start-up and tests).
    pub async fn wait_for_workers(&self, at_least: usize, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let known = self.members().len();
            if known >= at_least || tokio::time::Instant::now() >= deadline {
                return known;
            }
            self.inner.membership.reresolve();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Decodes `samples` on the pool. `None`: no worker answered in time
    /// (none live, all refused or failed, or the deadline passed); the
    /// caller decodes them itself.
    pub async fn decode(
        &self,
        output: impl Into<UnitOutput>,
        samples: &[UnitSample],
    ) -> Option<UnitAnswer> {
        let output = output.into();
        let affinity = samples.first().map_or(0, |sample| sample.key.sample);
        let ranked = self.ranked(affinity);
        if ranked.is_empty() {
            self.count("local");
            return None;
        }
        let unit_id = self.inner.next_unit.fetch_add(1, Ordering::Relaxed);
        let request = wire::unit_to_wire(unit_id, output.clone(), samples);
        let started = Instant::now();
        let deadline = started + self.inner.config.deadline;
        let mut attempts = FuturesUnordered::new();
        let mut next = 0usize;
        // Which of the ranked workers' attempts have come back.
        let mut returned = [false; MAX_ATTEMPTS];
        let output = &output;
        let attempt = |order: usize| {
            let worker = ranked[order].clone();
            let request = request.clone();
            let identity = self.inner.identity.clone();
            let token = self.inner.config.token.clone();
            async move {
                let outcome = attempt(&worker, request, &identity, &token, output).await;
                (order, worker, outcome)
            }
        };
        attempts.push(attempt(0));
        self.count("sent");
        next += 1;
        loop {
            let hedge_delay = self.hedge_delay();
            // The n-th attempt goes out n hedge delays after the first
            // (sooner when one fails): a hedge that is slow too is hedged
            // in turn, rather than the unit waiting out its deadline.
            let attempts_sent = u32::try_from(next).unwrap_or(u32::MAX);
            let hedge_at = started + hedge_delay * attempts_sent;
            // With no worker left to hedge to, this host's own cores are
            // the hedge: a little later, since they are the trainer's.
            let local_at = started + hedge_delay * (attempts_sent + 1).max(LOCAL_HEDGE_DELAYS);
            let others_left = next < ranked.len().min(MAX_ATTEMPTS);
            tokio::select! {
                Some((order, worker, outcome)) = attempts.next() => match outcome {
                    Ok(answer) => {
                        worker.succeeded();
                        self.outpaced(&ranked[..order], &returned[..order]);
                        self.answered(started, samples.len());
                        return Some(answer);
                    }
                    Err(error) => {
                        returned[order] = true;
                        if !self.attempt_failed(&worker, error) {
                            // Others may still be decoding it (a hedge
                            // sent first): only without one is it ours.
                            if attempts.is_empty() {
                                self.count("local");
                                return None;
                            }
                            continue;
                        }
                        if next < ranked.len().min(MAX_ATTEMPTS) {
                            attempts.push(attempt(next));
                            next += 1;
                            self.count("sent");
                            self.count("reissued");
                        } else if attempts.is_empty() {
                            self.count("local");
                            return None;
                        }
                    }
                },
                () = tokio::time::sleep_until(hedge_at), if others_left => {
                    attempts.push(attempt(next));
                    next += 1;
                    self.count("sent");
                    self.count("hedged");
                }
                () = tokio::time::sleep_until(local_at.min(deadline)), if !others_left => {
                    self.count("local");
                    return None;
                }
                () = tokio::time::sleep_until(deadline) => {
                    self.count("local");
                    return None;
                }
            }
        }
    }

    /// The workers that had a head start and are still at the unit lost to
    /// a later attempt: each sits out a backoff as a failing one would, so
    /// a worker cut off by a partition (calls hang, nothing fails) stops
    /// costing every unit a hedge delay.
    fn outpaced(&self, earlier: &[Arc<Worker>], returned: &[bool]) {
        let now = self.now_nanos();
        for (worker, _) in earlier.iter().zip(returned).filter(|(_, &back)| !back) {
            worker.failed(now);
            self.count("outpaced");
        }
    }

    fn answered(&self, started: Instant, samples: usize) {
        self.record_latency(started.elapsed());
        self.count("answered");
        self.inner
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remote_samples += samples as u64;
        pool_metrics::unit_time(started.elapsed());
    }

    /// Counts a failed attempt against its worker; whether another worker
    /// may take the unit (false: the unit itself was rejected, so no
    /// worker would decode it).
    fn attempt_failed(&self, worker: &Worker, error: AttemptError) -> bool {
        match error {
            AttemptError::Refused(status) => {
                self.count("refused");
                worker.refused(self.now_nanos(), &status);
            }
            AttemptError::Rejected(status) => {
                self.count("rejected");
                self.log_rejection(worker, &status);
                return false;
            }
            AttemptError::Busy => {
                self.count("failed");
                worker.busy(self.now_nanos());
            }
            AttemptError::Failed(message) => {
                self.count("failed");
                tracing::debug!(worker = %worker.addr, %message, "pool attempt failed");
                worker.failed(self.now_nanos());
                self.inner.membership.reresolve();
            }
        }
        true
    }

    /// Logs a rejected unit at most once a minute per process: a sidecar
    /// whose units are past the pool's bounds would otherwise log every one.
    fn log_rejection(&self, worker: &Worker, status: &tonic::Status) {
        if let Some(left_out) = self.inner.rejections.open() {
            tracing::warn!(
                worker = %worker.addr,
                code = ?status.code(),
                message = status.message(),
                left_out,
                "a pool worker would not take a unit (past its bounds); decoded here. \
                 Raise the workers' bounds or lower --pool-unit-samples"
            );
        }
    }

    /// The first [`MAX_ATTEMPTS`] live workers for a unit of `affinity`
    /// (rendezvous hashing), best first; among those, one with a free slot
    /// goes first. One pass, no sort: a pool of thousands is scored for
    /// every unit.
    fn ranked(&self, affinity: u64) -> Vec<Arc<Worker>> {
        let now = self.now_nanos();
        let members = self.members();
        let mut best: Vec<(u64, &Arc<Worker>)> = Vec::with_capacity(MAX_ATTEMPTS + 1);
        for worker in members.iter().filter(|worker| worker.available(now)) {
            let score = rendezvous_score(affinity, worker.key);
            if best.len() == MAX_ATTEMPTS && best[MAX_ATTEMPTS - 1].0 >= score {
                continue;
            }
            let at = best.partition_point(|(better, _)| *better >= score);
            best.insert(at, (score, worker));
            best.truncate(MAX_ATTEMPTS);
        }
        let mut ranked: Vec<Arc<Worker>> =
            best.into_iter().map(|(_, worker)| worker.clone()).collect();
        // A saturated first choice yields to the next with a free slot:
        // affinity is worth less than a unit waiting.
        if let Some(free) = ranked
            .iter()
            .position(|worker| worker.in_flight.available_permits() > 0)
        {
            ranked[..=free].rotate_right(1);
        }
        ranked
    }

    /// The hedge delay as of the last answers (see [`LATENCY_WINDOW`]).
    fn hedge_delay(&self) -> Duration {
        match self.inner.hedge_nanos.load(Ordering::Relaxed) {
            0 => {
                let config = &self.inner.config;
                (config.deadline / 10).max(config.min_hedge)
            }
            nanos => Duration::from_nanos(nanos),
        }
    }

    /// Keeps `latency` in the window; every [`HEDGE_REFRESH`] answers, the
    /// hedge delay is taken anew from it (not per unit: sorting the window
    /// is the costliest thing a unit would do here).
    fn record_latency(&self, latency: Duration) {
        let mut latencies = self
            .inner
            .latencies
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if latencies.len() == LATENCY_WINDOW {
            latencies.pop_front();
        }
        latencies.push_back(latency);
        let answers = self.inner.answers.fetch_add(1, Ordering::Relaxed) + 1;
        if latencies.len() < LATENCY_MIN_SAMPLES || !answers.is_multiple_of(HEDGE_REFRESH) {
            return;
        }
        let mut sorted: Vec<Duration> = latencies.iter().copied().collect();
        drop(latencies);
        sorted.sort_unstable();
        let at = |share: usize| sorted[(sorted.len() * share / 100).min(sorted.len() - 1)];
        let delay = at(95)
            .min(at(50) * HEDGE_MEDIANS)
            .max(self.inner.config.min_hedge);
        let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.inner.hedge_nanos.store(nanos, Ordering::Relaxed);
    }
}

/// One attempt of a unit on `worker`, within the worker's in-flight bound.
async fn attempt(
    worker: &Worker,
    unit: pb::DecodeUnit,
    identity: &str,
    token: &str,
    output: &UnitOutput,
) -> Result<UnitAnswer, AttemptError> {
    let _slot = worker
        .in_flight
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| AttemptError::Failed("worker closed".into()))?;
    let samples = unit.samples.len();
    let unit_id = unit.unit_id;
    let answer = match worker.link.decode(unit, identity, token).await {
        Ok(answer) => answer,
        Err(status) => {
            return Err(match status.code() {
                tonic::Code::Unauthenticated
                | tonic::Code::PermissionDenied
                | tonic::Code::FailedPrecondition => AttemptError::Refused(status),
                // INVALID_ARGUMENT names the unit's field; OUT_OF_RANGE is
                // a message past the worker's --max-unit-bytes.
                tonic::Code::InvalidArgument | tonic::Code::OutOfRange => {
                    AttemptError::Rejected(status)
                }
                tonic::Code::ResourceExhausted => AttemptError::Busy,
                _ => AttemptError::Failed(format!("{:?}: {}", status.code(), status.message())),
            });
        }
    };
    if answer.unit_id != unit_id {
        return Err(AttemptError::Failed(format!(
            "answer for unit {} to unit {unit_id}",
            answer.unit_id
        )));
    }
    let answers = wire::answers_from_wire(&answer, samples, output)
        .ok_or_else(|| AttemptError::Failed("malformed answer".into()))?;
    Ok(UnitAnswer {
        pixels: answer.pixels,
        samples: answers,
    })
}

/// Highest score first: the unit's rendezvous order over workers.
fn rendezvous_score(affinity: u64, worker_key: u64) -> u64 {
    fmix64(affinity ^ fmix64(worker_key))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::hash::fnv1a;

    fn addrs(n: usize) -> Vec<SocketAddr> {
        (0..n)
            .map(|i| SocketAddr::from(([10, 0, (i / 250) as u8, (i % 250) as u8 + 1], 50061)))
            .collect()
    }

    fn owner(affinity: u64, workers: &[SocketAddr]) -> SocketAddr {
        *workers
            .iter()
            .max_by_key(|addr| rendezvous_score(affinity, fnv1a(addr.to_string().into_bytes())))
            .unwrap()
    }

    #[test]
    fn a_worker_joining_moves_about_one_nth_of_the_units() {
        let before = addrs(10);
        let after = addrs(11);
        let units = 20_000u64;
        let moved = (0..units)
            .map(fmix64)
            .filter(|&unit| owner(unit, &before) != owner(unit, &after))
            .count() as f64;
        let expected = units as f64 / 11.0;
        assert!(
            (moved - expected).abs() < expected * 0.1,
            "{moved} moved, about {expected} expected"
        );
        // Every moved unit went to the newcomer.
        let newcomer = after[10];
        assert!((0..units)
            .map(fmix64)
            .filter(|&unit| owner(unit, &before) != owner(unit, &after))
            .all(|unit| owner(unit, &after) == newcomer));
    }

    #[test]
    fn units_spread_evenly() {
        let workers = addrs(8);
        let mut counts = BTreeMap::new();
        for unit in (0..16_000u64).map(fmix64) {
            *counts.entry(owner(unit, &workers)).or_insert(0usize) += 1;
        }
        assert_eq!(counts.len(), 8);
        for count in counts.values() {
            assert!((1_700..2_300).contains(count), "{counts:?}");
        }
    }

    #[test]
    fn share_settings_parse() {
        assert_eq!("auto".parse(), Ok(PoolShareSetting::Auto));
        assert_eq!("0.5".parse(), Ok(PoolShareSetting::Fixed(0.5)));
        assert!("1.5".parse::<PoolShareSetting>().is_err());
        assert!("most".parse::<PoolShareSetting>().is_err());
    }
}
