//! Warnings that would repeat per sample (a full disk, a pool past its
//! bounds) logged at most once a period, with how many were left out: the
//! counter beside each says how often it happened, the log says that it did.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct LogGate {
    period: Duration,
    /// The gate's clock zero.
    started: Instant,
    /// When the gate last opened (nanos since `started` + 1; 0: never).
    opened_at: AtomicU64,
    /// Occurrences since it last opened.
    left_out: AtomicU64,
}

impl LogGate {
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            started: Instant::now(),
            opened_at: AtomicU64::new(0),
            left_out: AtomicU64::new(0),
        }
    }

    /// `Some(left out since the last one)` when this occurrence is to be
    /// logged, `None` when it is one of those left out.
    pub fn open(&self) -> Option<u64> {
        let now = u64::try_from(self.started.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let last = self.opened_at.load(Ordering::Relaxed);
        let period = u64::try_from(self.period.as_nanos()).unwrap_or(u64::MAX);
        if last != 0 && now.saturating_sub(last) < period {
            self.left_out.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        match self
            .opened_at
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => Some(self.left_out.swap(0, Ordering::Relaxed)),
            Err(_) => {
                self.left_out.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_log_a_period_with_the_count_left_out() {
        let gate = LogGate::new(Duration::from_millis(200));
        assert_eq!(gate.open(), Some(0));
        for _ in 0..5 {
            assert_eq!(gate.open(), None);
        }
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(gate.open(), Some(5));
        assert_eq!(gate.open(), None);
    }
}
