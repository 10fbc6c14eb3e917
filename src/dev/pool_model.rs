//! The pool the simulation ([`super::pool_sim`]) runs against: workers as
//! Kubernetes runs them (a Deployment that replaces lost pods, a Service
//! that lists the ready ones, pods that drain on scale-down, partitions
//! that swallow calls) and the autoscaling rule the chart ships (KEDA's
//! Prometheus trigger on the sidecars' demand gauge, through the HPA's
//! algorithm and the chart's scale-up and scale-down policies). Time is
//! tokio's, so a paused runtime runs minutes of it in seconds.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::hash::fmix64;
use crate::pool::link::{Connector, WorkerLink};
use crate::pool::wire::pb;

/// A worker's decode: how many units at once, how long each takes.
#[derive(Debug, Clone)]
pub struct WorkerModel {
    /// Units one worker decodes at once (its decode threads).
    pub threads: usize,
    /// Median time one unit takes on one thread.
    pub unit_median: Duration,
    /// Sigma of the unit time's lognormal.
    pub unit_sigma: f64,
    /// Network time of a unit out and its answer back (both ways).
    pub network: Duration,
    /// From a pod's creation to its address in the Service.
    pub pod_start: Duration,
}

impl WorkerModel {
    /// Samples/s one worker decodes flat out, for units of `unit_samples`.
    pub fn capacity(&self, unit_samples: usize) -> f64 {
        let mean = self.unit_median.as_secs_f64() * (self.unit_sigma * self.unit_sigma / 2.0).exp();
        self.threads as f64 * unit_samples as f64 / mean
    }
}

/// The chart's `pool.autoscaling` rule, as the HPA applies it.
#[derive(Debug, Clone)]
pub struct Autoscaling {
    pub samples_per_worker: f64,
    pub min_replicas: usize,
    pub max_replicas: usize,
    /// Prometheus scrape and KEDA poll (the HPA syncs as often).
    pub polling: Duration,
    pub scale_down_stabilization: Duration,
    /// Most replicas added per 15 s and removed per 60 s, in percent.
    pub scale_up_percent: f64,
    pub scale_down_percent: f64,
}

const STARTING: u8 = 0;
const READY: u8 = 1;
const DRAINING: u8 = 2;
const GONE: u8 = 3;

/// Calls that come in while a worker is partitioned away fail this long
/// after the partition heals (the HTTP/2 keep-alive notices).
const PARTITION_NOTICE: Duration = Duration::from_secs(10);
/// Units a worker takes per decode thread before it answers busy: the
/// real worker's `--max-units` defaults to four per thread, and it admits
/// twice that (the rest wait for a slot, a second at most).
const ADMITTED_PER_THREAD: usize = 8;
/// Connection refused by a pod that is gone.
const REFUSED_AFTER: Duration = Duration::from_millis(1);

struct SimWorker {
    state: AtomicU8,
    /// Until when (ns past the pool's start) calls to it hang.
    partitioned_until: AtomicU64,
    slots: Arc<Semaphore>,
    admitted: Arc<Semaphore>,
}

/// The pool's pods, its Service's view of them and the counts the
/// report needs. Shared by every sidecar's connector.
pub struct SimPool {
    model: WorkerModel,
    started: Instant,
    seed: u64,
    draws: AtomicU64,
    inner: Mutex<PoolState>,
    pub answers_back: AtomicU64,
}

#[derive(Default)]
struct PoolState {
    workers: Vec<(SocketAddr, Arc<SimWorker>)>,
    /// The Deployment's replicas (what the HPA sets).
    replicas: usize,
    next_addr: u32,
    /// (time, replicas) whenever the Deployment's replicas change.
    replica_history: Vec<(f64, usize)>,
    /// (time, ready pods) at every change.
    ready_history: Vec<(f64, usize)>,
    killed: usize,
}

impl SimPool {
    pub fn new(model: WorkerModel, replicas: usize, seed: u64) -> Arc<Self> {
        let pool = Arc::new(Self {
            model,
            started: Instant::now(),
            seed,
            draws: AtomicU64::new(0),
            inner: Mutex::default(),
            answers_back: AtomicU64::new(0),
        });
        // The first pods are up before the job starts.
        let mut state = pool.lock();
        for _ in 0..replicas {
            let (addr, worker) = pool.new_worker(&mut state);
            worker.state.store(READY, Ordering::Relaxed);
            state.workers.push((addr, worker));
        }
        state.replicas = replicas;
        state.replica_history.push((0.0, replicas));
        state.ready_history.push((0.0, replicas));
        drop(state);
        pool
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn now_nanos(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// A uniform draw in (0, 1), reproducible from the seed.
    pub fn uniform(&self) -> f64 {
        let draw = self.draws.fetch_add(1, Ordering::Relaxed);
        ((fmix64(self.seed ^ fmix64(draw)) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn lognormal(&self, median: Duration, sigma: f64) -> Duration {
        // Box-Muller: one normal from two uniforms.
        let normal = (-2.0 * self.uniform().ln()).sqrt()
            * (2.0 * std::f64::consts::PI * self.uniform()).cos();
        median.mul_f64((sigma * normal).exp())
    }

    fn new_worker(&self, state: &mut PoolState) -> (SocketAddr, Arc<SimWorker>) {
        state.next_addr += 1;
        let n = state.next_addr;
        let addr = SocketAddr::from(([10, (n >> 16) as u8, (n >> 8) as u8, n as u8], 50061));
        let threads = self.model.threads.max(1);
        let worker = Arc::new(SimWorker {
            state: AtomicU8::new(STARTING),
            partitioned_until: AtomicU64::new(0),
            slots: Arc::new(Semaphore::new(threads)),
            admitted: Arc::new(Semaphore::new(ADMITTED_PER_THREAD * threads)),
        });
        (addr, worker)
    }

    /// What the headless Service resolves to: the ready pods.
    pub fn ready(&self) -> Vec<SocketAddr> {
        self.lock()
            .workers
            .iter()
            .filter(|(_, worker)| worker.state.load(Ordering::Relaxed) == READY)
            .map(|(addr, _)| *addr)
            .collect()
    }

    pub fn replicas(&self) -> usize {
        self.lock().replicas
    }

    pub fn killed(&self) -> usize {
        self.lock().killed
    }

    pub fn replica_history(&self) -> Vec<(f64, usize)> {
        self.lock().replica_history.clone()
    }

    pub fn ready_history(&self) -> Vec<(f64, usize)> {
        self.lock().ready_history.clone()
    }

    fn note_ready(&self, state: &mut PoolState) {
        let ready = state
            .workers
            .iter()
            .filter(|(_, worker)| worker.state.load(Ordering::Relaxed) == READY)
            .count();
        let now = self.seconds();
        state.ready_history.push((now, ready));
    }

    /// Starts a pod that is ready after the model's start time.
    fn start_pod(self: &Arc<Self>, state: &mut PoolState) {
        let (addr, worker) = self.new_worker(state);
        state.workers.push((addr, worker.clone()));
        let pool = self.clone();
        let start = self.model.pod_start;
        tokio::spawn(async move {
            tokio::time::sleep(start).await;
            if worker
                .state
                .compare_exchange(STARTING, READY, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                let mut state = pool.lock();
                pool.note_ready(&mut state);
            }
        });
    }

    /// The Deployment at `replicas`: pods started, or (newest first, as
    /// the ReplicaSet picks) drained and removed from the Service.
    pub fn scale_to(self: &Arc<Self>, replicas: usize) {
        let mut state = self.lock();
        if replicas == state.replicas {
            return;
        }
        let live = |state: &PoolState| {
            state
                .workers
                .iter()
                .filter(|(_, w)| w.state.load(Ordering::Relaxed) <= READY)
                .count()
        };
        while live(&state) < replicas {
            self.start_pod(&mut state);
        }
        let mut surplus = live(&state).saturating_sub(replicas);
        for (_, worker) in state.workers.iter().rev() {
            if surplus == 0 {
                break;
            }
            if worker.state.load(Ordering::Relaxed) <= READY {
                worker.state.store(DRAINING, Ordering::Relaxed);
                surplus -= 1;
            }
        }
        state.replicas = replicas;
        let now = self.seconds();
        state.replica_history.push((now, replicas));
        self.note_ready(&mut state);
        self.forget_gone(&mut state);
    }

    /// A ready pod dies at once (node lost, OOM); the Deployment starts a
    /// replacement.
    pub fn kill_one(self: &Arc<Self>) {
        let mut state = self.lock();
        let ready: Vec<usize> = (0..state.workers.len())
            .filter(|&i| state.workers[i].1.state.load(Ordering::Relaxed) == READY)
            .collect();
        if ready.is_empty() {
            return;
        }
        let victim = ready[(self.uniform() * ready.len() as f64) as usize % ready.len()];
        state.workers[victim].1.state.store(GONE, Ordering::Relaxed);
        state.killed += 1;
        self.start_pod(&mut state);
        self.note_ready(&mut state);
        self.forget_gone(&mut state);
    }

    /// `share` of the ready pods unreachable for `span`: calls hang, the
    /// Service still lists them (their kubelet sees them ready).
    pub fn partition(&self, share: f64, span: Duration) {
        let until = self.now_nanos() + u64::try_from(span.as_nanos()).unwrap_or(u64::MAX);
        let state = self.lock();
        for (_, worker) in &state.workers {
            if worker.state.load(Ordering::Relaxed) == READY && self.uniform() < share {
                worker.partitioned_until.store(until, Ordering::Relaxed);
            }
        }
    }

    /// Drops pods that are gone and hold nothing (draining ones once idle).
    fn forget_gone(&self, state: &mut PoolState) {
        let admitted = ADMITTED_PER_THREAD * self.model.threads.max(1);
        state
            .workers
            .retain(|(_, worker)| match worker.state.load(Ordering::Relaxed) {
                GONE => false,
                DRAINING => worker.admitted.available_permits() < admitted,
                _ => true,
            });
    }

    fn worker(&self, addr: SocketAddr) -> Option<Arc<SimWorker>> {
        let state = self.lock();
        state
            .workers
            .iter()
            .find(|(a, _)| *a == addr)
            .map(|(_, worker)| worker.clone())
    }

    /// One call to `worker`: the model's answer or the status the real
    /// worker (or the network) would give. The decode runs on as a task
    /// of its own, as a real worker finishes a unit it started however the
    /// caller fares; a unit still waiting for a slot when its caller gave
    /// up is skipped.
    async fn call(
        self: Arc<Self>,
        worker: Arc<SimWorker>,
        unit: pb::DecodeUnit,
    ) -> Result<pb::DecodedUnit, tonic::Status> {
        let hang_until = worker.partitioned_until.load(Ordering::Relaxed);
        if hang_until > self.now_nanos() {
            let heals = Duration::from_nanos(hang_until - self.now_nanos());
            tokio::time::sleep(heals + PARTITION_NOTICE).await;
            return Err(tonic::Status::unavailable("connection timed out"));
        }
        match worker.state.load(Ordering::Relaxed) {
            READY => {}
            DRAINING => return Err(tonic::Status::unavailable("worker draining")),
            _ => {
                tokio::time::sleep(REFUSED_AFTER).await;
                return Err(tonic::Status::unavailable("connection refused"));
            }
        }
        let Ok(admitted) = worker.admitted.clone().try_acquire_owned() else {
            return Err(tonic::Status::resource_exhausted("worker busy"));
        };
        let abandoned = Arc::new(AtomicBool::new(false));
        let _mark = AbandonOnDrop(abandoned.clone());
        let took = self.lognormal(self.model.unit_median, self.model.unit_sigma);
        let network = self.model.network;
        let task = tokio::spawn({
            let worker = worker.clone();
            async move {
                let _admitted = admitted;
                let slot = tokio::time::timeout(
                    Duration::from_secs(1),
                    worker.slots.clone().acquire_owned(),
                )
                .await;
                let Ok(Ok(_slot)) = slot else {
                    return false;
                };
                if abandoned.load(Ordering::Relaxed) {
                    return false;
                }
                tokio::time::sleep(took).await;
                true
            }
        });
        tokio::time::sleep(network / 2).await;
        let decoded = task.await.unwrap_or(false);
        if !decoded {
            return Err(tonic::Status::resource_exhausted(
                "no decode slot within 1s",
            ));
        }
        tokio::time::sleep(network / 2).await;
        if worker.state.load(Ordering::Relaxed) == GONE {
            return Err(tonic::Status::unavailable("connection reset"));
        }
        self.answers_back.fetch_add(1, Ordering::Relaxed);
        Ok(answer(&unit))
    }
}

struct AbandonOnDrop(Arc<AtomicBool>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The answer a worker gives: each sample's pixels carry its sample id,
/// so the ledger sees which sample landed in which slot.
fn answer(unit: &pb::DecodeUnit) -> pb::DecodedUnit {
    let spec = unit.spec.as_ref();
    let sample_bytes = spec.map_or(0, |spec| (spec.height * spec.width) as usize * 3);
    let mut pixels = Vec::with_capacity(sample_bytes * unit.samples.len());
    for sample in &unit.samples {
        let mut pixel = sample.sample.to_le_bytes().to_vec();
        pixel.resize(sample_bytes, 0);
        pixels.extend_from_slice(&pixel);
    }
    pb::DecodedUnit {
        unit_id: unit.unit_id,
        pixels: pixels.into(),
        results: unit
            .samples
            .iter()
            .map(|_| {
                crate::pool::wire::answer_to_wire(&crate::pool::wire::SampleAnswer::Decoded(
                    crate::decode::CropBox {
                        left: 0.0,
                        top: 0.0,
                        width: 1.0,
                        height: 1.0,
                        drawn: crate::decode::Drawn::default(),
                    },
                ))
            })
            .collect(),
    }
}

/// Every sidecar's connector: links to the pool's pods by address.
pub struct SimConnector(pub Arc<SimPool>);

struct SimLink {
    pool: Arc<SimPool>,
    worker: Arc<SimWorker>,
}

impl Connector for SimConnector {
    fn connect(&self, addr: SocketAddr) -> Option<Arc<dyn WorkerLink>> {
        let worker = self.0.worker(addr)?;
        Some(Arc::new(SimLink {
            pool: self.0.clone(),
            worker,
        }))
    }
}

impl WorkerLink for SimLink {
    fn decode(
        &self,
        unit: pb::DecodeUnit,
        _identity: &str,
        _token: &str,
    ) -> BoxFuture<'static, Result<pb::DecodedUnit, tonic::Status>> {
        Box::pin(self.pool.clone().call(self.worker.clone(), unit))
    }
}

/// The HPA driven by KEDA's Prometheus trigger: every `polling`, the
/// demand the last scrape saw over `samples_per_worker`, within 10%
/// tolerance; up at most `scale_up_percent` per 15 s; down only to the
/// highest recommendation of the stabilization window, at most
/// `scale_down_percent` per 60 s.
pub struct Hpa {
    rule: Autoscaling,
    recommendations: VecDeque<(f64, usize)>,
    changes: VecDeque<(f64, isize)>,
    pub decisions: Vec<(f64, f64, usize)>,
}

impl Hpa {
    pub fn new(rule: Autoscaling) -> Self {
        Self {
            rule,
            recommendations: VecDeque::new(),
            changes: VecDeque::new(),
            decisions: Vec::new(),
        }
    }

    /// The replicas to set at `now` for `demand` samples/s, with `current`.
    pub fn decide(&mut self, now: f64, demand: f64, current: usize) -> usize {
        let rule = &self.rule;
        let ratio = demand / (rule.samples_per_worker * current.max(1) as f64);
        let raw = if (ratio - 1.0).abs() <= 0.1 {
            current
        } else {
            (demand / rule.samples_per_worker).ceil() as usize
        };
        let raw = raw.clamp(rule.min_replicas, rule.max_replicas);
        self.recommendations.push_back((now, raw));
        let window = rule.scale_down_stabilization.as_secs_f64();
        while self
            .recommendations
            .front()
            .is_some_and(|(at, _)| *at < now - window)
        {
            self.recommendations.pop_front();
        }
        while self.changes.front().is_some_and(|(at, _)| *at < now - 60.0) {
            self.changes.pop_front();
        }
        let stable = self
            .recommendations
            .iter()
            .map(|(_, r)| *r)
            .max()
            .unwrap_or(raw);
        let moved = |since: f64| -> isize {
            self.changes
                .iter()
                .filter(|(at, _)| *at >= now - since)
                .map(|(_, change)| *change)
                .sum()
        };
        let next = if raw > current {
            let period_start = (current as isize - moved(15.0).max(0)).max(1) as usize;
            let most =
                (period_start as f64 * (1.0 + rule.scale_up_percent / 100.0)).floor() as usize;
            raw.min(most)
        } else if stable < current {
            let period_start = current as isize - moved(60.0).min(0);
            let floor =
                (period_start as f64 * (1.0 - rule.scale_down_percent / 100.0)).ceil() as usize;
            stable.max(floor)
        } else {
            current
        };
        if next != current {
            self.changes
                .push_back((now, next as isize - current as isize));
        }
        self.decisions.push((now, demand, next));
        next
    }
}
