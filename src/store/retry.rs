//! Retries, resume-from-offset and parallel ranged reads: the one place where
//! transient store failures are absorbed.
//!
//! A broken body is resumed from the byte where it broke, so a retry never
//! re-downloads what already arrived and never changes the bytes delivered.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};

use super::{ObjectStore, StoreError};

#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Attempts per request, the first included.
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// A body that delivers nothing for this long is treated as broken.
    pub idle_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 8,
            base_delay: Duration::from_millis(50),
            max_delay: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// Exponential backoff with full jitter. Jitter only changes timing, never data.
    fn delay(&self, attempt: u32) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.max_delay);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let fraction = f64::from(nanos % 1000) / 1000.0;
        exp.mul_f64(0.5 + fraction / 2.0)
    }
}

/// Runs `op` until it succeeds, fails for good, or runs out of attempts.
pub async fn with_retries<T, F, Fut>(policy: &RetryPolicy, mut op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut attempt = 0;
    loop {
        match op().await {
            Err(error) if error.is_transient() => {
                attempt += 1;
                if attempt >= policy.max_attempts {
                    return Err(exhausted(error, attempt));
                }
                crate::metrics::store_retry();
                tracing::debug!(%error, attempt, "retrying store request");
                tokio::time::sleep(policy.delay(attempt)).await;
            }
            other => return other,
        }
    }
}

fn exhausted(error: StoreError, attempts: u32) -> StoreError {
    match error {
        StoreError::Transient { location, message } => StoreError::Exhausted {
            location,
            attempts,
            message,
        },
        other => other,
    }
}

/// Reads `range` of `key` into one buffer, resuming broken bodies.
pub async fn read_range(
    store: &dyn ObjectStore,
    key: &str,
    range: Range<u64>,
    if_match: Option<&str>,
    policy: &RetryPolicy,
) -> Result<Bytes, StoreError> {
    let mut buf = BytesMut::with_capacity((range.end - range.start) as usize);
    let mut attempt = 0;
    loop {
        let next = range.start + buf.len() as u64;
        if next >= range.end {
            return Ok(buf.freeze());
        }
        match read_into(store, key, next..range.end, if_match, policy, &mut buf).await {
            Ok(()) => {}
            Err(error) if error.is_transient() => {
                attempt += 1;
                if attempt >= policy.max_attempts {
                    return Err(exhausted(error, attempt));
                }
                crate::metrics::store_retry();
                tracing::debug!(%error, attempt, resume_at = range.start + buf.len() as u64, "resuming ranged read");
                tokio::time::sleep(policy.delay(attempt)).await;
            }
            Err(error) => return Err(error),
        }
    }
}

async fn read_into(
    store: &dyn ObjectStore,
    key: &str,
    range: Range<u64>,
    if_match: Option<&str>,
    policy: &RetryPolicy,
    buf: &mut BytesMut,
) -> Result<(), StoreError> {
    let mut body = store.get_range(key, range.clone(), if_match).await?;
    let mut expected = range.start;
    loop {
        let item = tokio::time::timeout(policy.idle_timeout, body.next())
            .await
            .map_err(|_| StoreError::Transient {
                location: store.location(key),
                message: format!("no data for {:?}", policy.idle_timeout),
            })?;
        match item {
            None if expected < range.end => {
                return Err(StoreError::Transient {
                    location: store.location(key),
                    message: format!("body ended at {expected}, expected {}", range.end),
                })
            }
            None => return Ok(()),
            Some(Err(error)) => return Err(error),
            Some(Ok((offset, bytes))) => {
                debug_assert_eq!(offset, expected);
                let take = bytes.len().min((range.end - expected) as usize);
                buf.extend_from_slice(&bytes[..take]);
                expected += take as u64;
            }
        }
    }
}

/// How a large range is split into concurrent ranged GETs.
#[derive(Debug, Clone)]
pub struct ReadConfig {
    pub part_size: u64,
    /// Parts fetched concurrently per reader.
    pub parts_in_flight: usize,
    pub retry: RetryPolicy,
}

pub const DEFAULT_PART_SIZE: u64 = 8 << 20;
pub const DEFAULT_PARTS_IN_FLIGHT: usize = 2;

impl Default for ReadConfig {
    fn default() -> Self {
        Self {
            part_size: DEFAULT_PART_SIZE,
            parts_in_flight: DEFAULT_PARTS_IN_FLIGHT,
            retry: RetryPolicy::default(),
        }
    }
}

/// Reads `range` front to back as `part_size` ranged GETs, `parts_in_flight`
/// at a time, yielding parts in order. Memory: at most
/// `parts_in_flight * part_size` bytes are held (plus the consumer's part).
pub fn read_parts(
    store: Arc<dyn ObjectStore>,
    key: String,
    range: Range<u64>,
    if_match: Option<String>,
    config: ReadConfig,
) -> impl Stream<Item = Result<(u64, Bytes), StoreError>> + Send + 'static {
    let part_size = config.part_size.max(1);
    let starts = (range.start..range.end).step_by(part_size as usize);
    let parts_in_flight = config.parts_in_flight.max(1);
    let config = Arc::new(config);
    futures::stream::iter(starts)
        .map(move |start| {
            let store = store.clone();
            let key = key.clone();
            let if_match = if_match.clone();
            let config = config.clone();
            let end = (start + part_size).min(range.end);
            async move {
                // Counted until the part is handed to the consumer.
                let in_flight =
                    crate::metrics::GaugeGuard::new(crate::metrics::PARTS_IN_FLIGHT, 1.0);
                let bytes = read_range(
                    store.as_ref(),
                    &key,
                    start..end,
                    if_match.as_deref(),
                    &config.retry,
                )
                .await?;
                Ok::<_, StoreError>((start, bytes, in_flight))
            }
        })
        .buffered(parts_in_flight)
        .map(|part| part.map(|(start, bytes, _in_flight)| (start, bytes)))
}
