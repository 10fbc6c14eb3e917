//! A training loop's waits, as its client reports them, for the share
//! search of the stream that feeds it.
//!
//! The search sees only the rate the client takes batches at. Under a
//! model that caps that rate, every share that keeps the loop fed gives
//! the same rate, and the search cannot tell the share that spares the
//! trainer's device from the one that works it hardest. The client knows
//! whether its loop waits (`WaitMeter`), and reports its running totals
//! against the stream's `loop_id` (`ClientDecodeReport.loop_waits`); the
//! search reads their differences over each of its windows.
//!
//! One entry per tuned stream, removed when the stream ends: at most
//! [`MAX_LISTENING`] at once, 40 bytes each and the map's slot.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

/// Streams listening at once, most: far above any host's tuned streams
/// (one per rank); a stream past it searches on its rate alone.
pub const MAX_LISTENING: usize = 4096;

/// A loop's totals since it began taking the stream's batches, seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoopTotals {
    pub waited: f64,
    pub stepped: f64,
    pub steps: u64,
}

impl LoopTotals {
    /// Steps a second from `earlier` to these totals; None over fewer
    /// than `at_least` steps.
    pub fn steps_per_second_since(&self, earlier: &LoopTotals, at_least: u64) -> Option<f64> {
        let steps = self.steps.checked_sub(earlier.steps)?;
        let stepped = self.stepped - earlier.stepped;
        (steps >= at_least && stepped > 1e-6).then(|| steps as f64 / stepped)
    }

    /// The share of the loop's time spent waiting from `earlier` to these
    /// totals; None when the loop stepped no measurable time between.
    pub fn waiting_since(&self, earlier: &LoopTotals) -> Option<f64> {
        let stepped = self.stepped - earlier.stepped;
        let waited = self.waited - earlier.waited;
        (stepped > 1e-6).then(|| (waited / stepped).clamp(0.0, 1.0))
    }
}

/// The latest totals of one stream's loop (microseconds; 0 reports: none).
#[derive(Debug, Default)]
struct Latest {
    waited_us: AtomicU64,
    stepped_us: AtomicU64,
    steps: AtomicU64,
    reports: AtomicU64,
}

static LISTENING: LazyLock<Mutex<HashMap<u64, Arc<Latest>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// A stream's place to hear its loop's waits; removed when dropped.
#[derive(Debug)]
pub struct Listener {
    id: u64,
    latest: Arc<Latest>,
}

impl PartialEq for Listener {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Listener {
    /// A new listener, or None with [`MAX_LISTENING`] already open.
    pub fn open() -> Option<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let mut listening = LISTENING.lock().unwrap_or_else(PoisonError::into_inner);
        if listening.len() >= MAX_LISTENING {
            return None;
        }
        // Not a number another client on the host could compute from
        // its own: the count hashed under keys this process drew at
        // random (a mixed count alone is a public bijection of 1, 2, 3...).
        static KEYS: LazyLock<std::collections::hash_map::RandomState> =
            LazyLock::new(std::collections::hash_map::RandomState::new);
        let id = loop {
            let id = KEYS.hash_one(NEXT.fetch_add(1, Ordering::Relaxed));
            if id != 0 && !listening.contains_key(&id) {
                break id;
            }
        };
        let latest = Arc::new(Latest::default());
        listening.insert(id, latest.clone());
        Some(Self { id, latest })
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// The loop's latest totals (None: nothing reported yet).
    pub fn totals(&self) -> Option<LoopTotals> {
        if self.latest.reports.load(Ordering::Acquire) == 0 {
            return None;
        }
        let seconds = |us: &AtomicU64| us.load(Ordering::Relaxed) as f64 / 1e6;
        Some(LoopTotals {
            waited: seconds(&self.latest.waited_us),
            stepped: seconds(&self.latest.stepped_us),
            steps: self.latest.steps.load(Ordering::Relaxed),
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        LISTENING
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

/// Why a report's totals cannot be a loop's.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct BadTotals(pub String);

/// Why `waited` and `stepped` cannot be a loop's running totals, if
/// they cannot (checked before any part of a report is taken).
pub fn check(waited: f64, stepped: f64) -> Result<(), BadTotals> {
    // A year of loop time: a bound that keeps microseconds exact in u64.
    const MOST: f64 = 366.0 * 86_400.0;
    for (name, value) in [("waited_seconds", waited), ("stepped_seconds", stepped)] {
        if !(0.0..=MOST).contains(&value) {
            return Err(BadTotals(format!(
                "{name} {value} is not a loop's running total (0 to {MOST} s)"
            )));
        }
    }
    if waited > stepped {
        return Err(BadTotals(format!(
            "waited_seconds {waited} exceeds stepped_seconds {stepped}: a wait is part of its step"
        )));
    }
    Ok(())
}

/// Takes a client's report for stream `id`: Ok(false) when no stream
/// listens there (it ended: a report racing the stream's end is no error).
pub fn report(id: u64, waited: f64, stepped: f64, steps: u64) -> Result<bool, BadTotals> {
    check(waited, stepped)?;
    let latest = LISTENING
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&id)
        .cloned();
    let Some(latest) = latest else {
        return Ok(false);
    };
    latest
        .waited_us
        .store((waited * 1e6) as u64, Ordering::Relaxed);
    latest
        .stepped_us
        .store((stepped * 1e6) as u64, Ordering::Relaxed);
    latest.steps.store(steps, Ordering::Relaxed);
    latest.reports.fetch_add(1, Ordering::Release);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_hears_its_own_loop_until_it_ends() {
        let first = Listener::open().unwrap();
        let second = Listener::open().unwrap();
        assert_ne!(first.id(), second.id());
        assert_eq!(first.totals(), None, "nothing reported yet");
        assert_eq!(report(first.id(), 0.5, 10.0, 40), Ok(true));
        let totals = first.totals().unwrap();
        assert_eq!((totals.waited, totals.stepped), (0.5, 10.0));
        assert_eq!(second.totals(), None);
        let earlier = LoopTotals {
            waited: 0.3,
            stepped: 6.0,
            steps: 20,
        };
        assert!((totals.waiting_since(&earlier).unwrap() - 0.05).abs() < 1e-9);
        assert_eq!(totals.steps_per_second_since(&earlier, 3), Some(5.0));
        assert_eq!(totals.steps_per_second_since(&earlier, 30), None);
        assert_eq!(totals.waiting_since(&totals), None);
        let id = first.id();
        drop(first);
        assert_eq!(report(id, 1.0, 20.0, 80), Ok(false), "the stream ended");
    }

    #[test]
    fn totals_that_cannot_be_a_loops_are_refused() {
        let listener = Listener::open().unwrap();
        for (waited, stepped) in [(-1.0, 2.0), (f64::NAN, 2.0), (3.0, 2.0), (0.0, 1e12)] {
            assert!(report(listener.id(), waited, stepped, 1).is_err());
        }
        assert_eq!(listener.totals(), None);
    }
}
