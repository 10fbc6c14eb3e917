//! Throttle-aware request concurrency: how many S3 requests the host starts
//! at once, adapted to S3's answers (additive increase, multiplicative
//! decrease, as TCP and the AWS SDKs' adaptive retry mode do).
//!
//! Retrying a throttled request at the same rate keeps the prefix throttled
//! (at 50% SlowDown, one retry per success). Each throttled answer halves
//! the limit (at most once per [`DECREASE_INTERVAL`], so a burst of answers
//! to requests sent together counts once); each success raises it by
//! `1 / limit`, about one more request per round of successes. The limit
//! bounds requests waiting for their response headers; bodies then stream
//! without holding a slot. One limiter serves the whole host.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

pub const DEFAULT_INITIAL_LIMIT: f64 = 128.0;
pub const MIN_LIMIT: f64 = 2.0;
pub const MAX_LIMIT: f64 = 1024.0;
/// Throttled answers closer together than this halve the limit once.
pub const DECREASE_INTERVAL: Duration = Duration::from_millis(100);

#[derive(Debug)]
pub struct RequestLimiter {
    state: Mutex<State>,
    released: Notify,
}

#[derive(Debug)]
struct State {
    limit: f64,
    in_flight: usize,
    last_decrease: Option<Instant>,
}

/// A slot for one request; returned when dropped.
#[derive(Debug)]
pub struct Slot {
    limiter: Arc<RequestLimiter>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.limiter.lock().in_flight -= 1;
        self.limiter.released.notify_waiters();
    }
}

impl RequestLimiter {
    pub fn new(initial: f64) -> Arc<Self> {
        let limiter = Arc::new(Self {
            state: Mutex::new(State {
                limit: initial.clamp(MIN_LIMIT, MAX_LIMIT),
                in_flight: 0,
                last_decrease: None,
            }),
            released: Notify::new(),
        });
        limiter.publish(initial.clamp(MIN_LIMIT, MAX_LIMIT));
        limiter
    }

    /// Waits for a slot under the current limit.
    pub async fn acquire(self: &Arc<Self>) -> Slot {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            // Registered before the check: a release in between is not lost.
            released.as_mut().enable();
            {
                let mut state = self.lock();
                if (state.in_flight as f64) < state.limit.floor() {
                    state.in_flight += 1;
                    return Slot {
                        limiter: self.clone(),
                    };
                }
            }
            released.await;
        }
    }

    /// A request got an answer that was not throttling.
    pub fn on_success(&self) {
        let limit = {
            let mut state = self.lock();
            let before = state.limit.floor();
            state.limit = (state.limit + 1.0 / state.limit).min(MAX_LIMIT);
            if state.limit.floor() == before {
                return;
            }
            state.limit
        };
        self.publish(limit);
        self.released.notify_waiters();
    }

    /// A request was throttled (503 SlowDown and the like).
    pub fn on_throttled(&self) {
        let limit = {
            let mut state = self.lock();
            let now = Instant::now();
            if state
                .last_decrease
                .is_some_and(|at| now.duration_since(at) < DECREASE_INTERVAL)
            {
                return;
            }
            state.last_decrease = Some(now);
            state.limit = (state.limit / 2.0).max(MIN_LIMIT);
            state.limit
        };
        tracing::info!(limit, "S3 is throttling: fewer requests in flight");
        self.publish(limit);
    }

    /// Requests the host may have waiting for a response now.
    pub fn limit(&self) -> usize {
        self.lock().limit.floor() as usize
    }

    fn publish(&self, limit: f64) {
        ::metrics::gauge!(crate::metrics::S3_REQUEST_LIMIT).set(limit.floor());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttling_halves_once_per_burst_and_successes_add_back() {
        let limiter = RequestLimiter::new(64.0);
        limiter.on_throttled();
        limiter.on_throttled(); // the same burst
        assert_eq!(limiter.limit(), 32);
        limiter.lock().last_decrease = Some(Instant::now() - DECREASE_INTERVAL * 2);
        limiter.on_throttled();
        assert_eq!(limiter.limit(), 16);
        // About `limit` successes add one (each adds 1/limit of the moment).
        for _ in 0..17 {
            limiter.on_success();
        }
        assert_eq!(limiter.limit(), 17);
        // From 17 to the cap takes about (1024² - 17²) / 2 successes.
        for _ in 0..600_000 {
            limiter.on_success();
        }
        assert_eq!(limiter.limit(), MAX_LIMIT as usize);
        for _ in 0..20 {
            limiter.lock().last_decrease = None;
            limiter.on_throttled();
        }
        assert_eq!(limiter.limit(), MIN_LIMIT as usize);
    }

    #[tokio::test]
    async fn slots_wait_for_the_limit() {
        let limiter = RequestLimiter::new(2.0);
        let first = limiter.acquire().await;
        let _second = limiter.acquire().await;
        let waiting = tokio::spawn({
            let limiter = limiter.clone();
            async move { limiter.acquire().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !waiting.is_finished(),
            "a third request waits at a limit of 2"
        );
        drop(first);
        let third = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("a released slot wakes the waiter")
            .unwrap();
        drop(third);
    }
}
