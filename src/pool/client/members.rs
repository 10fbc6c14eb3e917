//! The pool's membership: the workers the targets (a headless Service's
//! name) resolve to, followed as workers come and go, re-resolved at once
//! when a worker cannot be reached and backed off while resolution fails.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};

use crate::metrics::pool as pool_metrics;
use crate::pool::link::{Connector, WorkerLink};

const MIN_RERESOLVE: Duration = Duration::from_secs(1);
const MAX_RESOLVE_BACKOFF: Duration = Duration::from_secs(30);
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);
const BUSY_COOLDOWN: Duration = Duration::from_millis(20);
const REFUSED_COOLDOWN: Duration = Duration::from_secs(60);
const MAX_FAILURE_COOLDOWN: Duration = Duration::from_secs(5);

/// One resolved worker.
pub(super) struct Worker {
    pub(super) addr: SocketAddr,
    /// The address's hash, taken once: placement scores every live worker
    /// for every unit.
    pub(super) key: u64,
    pub(super) link: Arc<dyn WorkerLink>,
    pub(super) in_flight: Arc<Semaphore>,
    /// Until when (nanoseconds past the client's start; 0: not cooling) the
    /// worker gets no units. Atomics, not a lock: placement reads every
    /// worker's for every unit.
    cooling_until: AtomicU64,
    failures: AtomicU32,
    refusal_logged: AtomicBool,
}

impl Worker {
    fn new(addr: SocketAddr, link: Arc<dyn WorkerLink>, units: usize) -> Self {
        Self {
            addr,
            key: crate::hash::fnv1a(addr.to_string().into_bytes()),
            link,
            in_flight: Arc::new(Semaphore::new(units.max(1))),
            cooling_until: AtomicU64::new(0),
            failures: AtomicU32::new(0),
            refusal_logged: AtomicBool::new(false),
        }
    }

    pub(super) fn available(&self, now_nanos: u64) -> bool {
        self.cooling_until.load(Ordering::Relaxed) <= now_nanos
    }

    pub(super) fn succeeded(&self) {
        self.failures.store(0, Ordering::Relaxed);
        self.cooling_until.store(0, Ordering::Relaxed);
    }

    pub(super) fn failed(&self, now_nanos: u64) {
        let failures = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        let backoff = Duration::from_millis(100)
            .saturating_mul(1 << failures.min(6))
            .min(MAX_FAILURE_COOLDOWN);
        self.cool_for(now_nanos, backoff);
    }

    /// A busy worker is healthy: it sits out a moment, not a backoff, or
    /// a pool near its capacity would shed the workers it needs most.
    pub(super) fn busy(&self, now_nanos: u64) {
        self.cool_for(now_nanos, BUSY_COOLDOWN);
    }

    pub(super) fn refused(&self, now_nanos: u64, status: &tonic::Status) {
        self.cool_for(now_nanos, REFUSED_COOLDOWN);
        if !self.refusal_logged.swap(true, Ordering::Relaxed) {
            tracing::error!(
                worker = %self.addr,
                code = ?status.code(),
                message = status.message(),
                "pool worker refused this sidecar; it gets no units for a minute"
            );
        }
    }

    fn cool_for(&self, now_nanos: u64, span: Duration) {
        let span = u64::try_from(span.as_nanos()).unwrap_or(u64::MAX);
        self.cooling_until
            .store(now_nanos.saturating_add(span).max(1), Ordering::Relaxed);
    }
}

/// The live workers, ordered by address (logs and tests see a stable set);
/// replaced whole on a change, so placement reads it without a lock held.
pub(super) type Members = Arc<Vec<Arc<Worker>>>;

/// The live workers and how they are found: the targets, re-resolved every
/// `refresh` or at once when asked, and the connector that links each.
pub(super) struct Membership {
    targets: Vec<String>,
    refresh: Duration,
    units_per_worker: usize,
    connector: Box<dyn Connector>,
    current: Mutex<Members>,
    reresolve: Notify,
}

impl Membership {
    pub(super) fn new(
        targets: Vec<String>,
        refresh: Duration,
        units_per_worker: usize,
        connector: Box<dyn Connector>,
    ) -> Self {
        Self {
            targets,
            refresh,
            units_per_worker,
            connector,
            current: Mutex::default(),
            reresolve: Notify::new(),
        }
    }

    pub(super) fn current(&self) -> Members {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Asks [`follow`] to resolve the targets now (a worker was unreachable).
    pub(super) fn reresolve(&self) {
        self.reresolve.notify_one();
    }

    /// Replaces the membership with `addrs`, keeping the workers (and their
    /// links, cool-downs and slots) that stay.
    pub(super) fn update(&self, mut addrs: Vec<SocketAddr>) {
        addrs.sort();
        addrs.dedup();
        let mut members = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if members.len() == addrs.len() && members.iter().zip(&addrs).all(|(w, a)| w.addr == *a) {
            return;
        }
        let next: Vec<Arc<Worker>> = addrs
            .iter()
            .filter_map(
                |&addr| match members.binary_search_by_key(&addr, |w| w.addr) {
                    Ok(at) => Some(members[at].clone()),
                    Err(_) => {
                        let link = self.connector.connect(addr)?;
                        Some(Arc::new(Worker::new(addr, link, self.units_per_worker)))
                    }
                },
            )
            .collect();
        *members = Arc::new(next);
        drop(members);
        // Thousands of workers would make this line a page: a count, and the
        // addresses only where they fit on a line.
        if addrs.len() <= 16 {
            tracing::info!(workers = ?addrs, "decode pool membership changed");
        } else {
            tracing::info!(workers = addrs.len(), "decode pool membership changed");
        }
        pool_metrics::workers(addrs.len());
    }
}

/// Keeps the membership equal to what the targets resolve to, until the
/// client is dropped.
pub(super) async fn follow(membership: Weak<Membership>) {
    let mut backoff = MIN_RERESOLVE;
    loop {
        let Some(strong) = membership.upgrade() else {
            return;
        };
        let resolved = resolve_all(&strong.targets).await;
        let wait = match resolved {
            Ok(addrs) => {
                strong.update(addrs);
                backoff = MIN_RERESOLVE;
                strong.refresh
            }
            Err(message) => {
                tracing::warn!(
                    targets = ?strong.targets,
                    %message,
                    retry_in_s = backoff.as_secs_f64(),
                    "cannot resolve the decode pool; decoding locally meanwhile"
                );
                let wait = backoff;
                backoff = (backoff * 2).min(MAX_RESOLVE_BACKOFF);
                wait
            }
        };
        let reresolve = async {
            strong.reresolve.notified().await;
            // At most once a second, however many attempts fail.
            tokio::time::sleep(MIN_RERESOLVE).await;
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = reresolve => {}
        }
        drop(strong);
    }
}

/// Every target's addresses; an error only when none resolves.
async fn resolve_all(targets: &[String]) -> Result<Vec<SocketAddr>, String> {
    let mut addrs = Vec::new();
    let mut errors = Vec::new();
    for target in targets {
        match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host(target.as_str())).await
        {
            Ok(Ok(found)) => addrs.extend(found),
            Ok(Err(error)) => errors.push(format!("{target}: {error}")),
            Err(_) => errors.push(format!("{target}: timed out")),
        }
    }
    if addrs.is_empty() && !errors.is_empty() {
        return Err(errors.join("; "));
    }
    addrs.sort();
    addrs.dedup();
    Ok(addrs)
}
