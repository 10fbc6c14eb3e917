//! The retrying store: wraps any [`ObjectStore`] and applies one
//! [`RetryPolicy`] to every operation (list, head, put and ranged GETs). It is
//! the one place where transient failures are absorbed; nothing else in
//! shardfeed retries a store request.
//!
//! Every attempt is bounded in time: a request that makes no progress for
//! `idle_timeout` (no response, or a body that stops delivering) is treated
//! as broken and retried. A broken body is resumed from the byte where it
//! broke, so a retry never re-downloads what already arrived and never
//! changes the bytes delivered.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

// The retry budget runs on tokio's clock, so its tests can pause time.
use tokio::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;

use super::throttle::{RequestLimiter, Slot};
use super::{ListPage, MultipartShape, ObjectMeta, ObjectStore, PartStream, StoreError};

#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Attempts per request, the first included (a backstop; the budget
    /// below is what ends an outage).
    pub max_attempts: u32,
    /// How long a request keeps retrying after its first failure: long
    /// enough to ride out a regional hiccup of a minute or two.
    pub budget: Duration,
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// An attempt that makes no progress (no response, no body bytes) for
    /// this long is treated as broken.
    pub idle_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 100,
            budget: Duration::from_secs(120),
            base_delay: Duration::from_millis(50),
            max_delay: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// Exponential backoff with jitter. Jitter only changes timing, never data.
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

    /// After failed attempt number `attempt` (1-based) with `error`, the
    /// first failure having been at `first_failure`: `Ok` to try again after
    /// the backoff, or the error to give up with.
    async fn back_off(
        &self,
        error: StoreError,
        attempt: u32,
        first_failure: Instant,
    ) -> Result<(), StoreError> {
        if !error.is_transient() {
            return Err(error);
        }
        let delay = self.delay(attempt);
        if attempt >= self.max_attempts || first_failure.elapsed() + delay > self.budget {
            return Err(exhausted(error, attempt));
        }
        crate::metrics::store_retry();
        tracing::debug!(%error, attempt, "retrying store request");
        tokio::time::sleep(delay).await;
        Ok(())
    }
}

fn exhausted(error: StoreError, attempts: u32) -> StoreError {
    match error {
        StoreError::Transient { location, message }
        | StoreError::Throttled { location, message } => StoreError::Exhausted {
            location,
            attempts,
            message,
        },
        other => other,
    }
}

/// A store whose every operation is retried under one policy.
#[derive(Debug)]
pub struct RetryingStore {
    inner: Arc<dyn ObjectStore>,
    policy: Arc<RetryPolicy>,
    limiter: Option<Arc<RequestLimiter>>,
}

impl RetryingStore {
    pub fn new(inner: Arc<dyn ObjectStore>, policy: RetryPolicy) -> Self {
        Self {
            inner,
            policy: Arc::new(policy),
            limiter: None,
        }
    }

    /// Requests wait for a slot of `limiter`, which shrinks when the store
    /// throttles and grows back when it stops (see [`super::throttle`]).
    pub fn with_limiter(mut self, limiter: Arc<RequestLimiter>) -> Self {
        self.limiter = Some(limiter);
        self
    }

    /// Runs `op` until it succeeds, fails for good, or runs out of attempts;
    /// each attempt is cut off after the idle timeout.
    async fn retry<T, F, Fut>(&self, key: &str, mut op: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let mut attempt = 0;
        let mut first_failure = None;
        loop {
            attempt += 1;
            let slot = acquire(&self.limiter).await;
            let result = tokio::time::timeout(self.policy.idle_timeout, op()).await;
            drop(slot);
            let error = match result {
                Ok(Ok(value)) => {
                    adapt(&self.limiter, None);
                    return Ok(value);
                }
                Ok(Err(error)) => error,
                Err(_) => timed_out(self.inner.location(key), self.policy.idle_timeout),
            };
            adapt(&self.limiter, Some(&error));
            let first_failure = *first_failure.get_or_insert_with(Instant::now);
            self.policy.back_off(error, attempt, first_failure).await?;
        }
    }
}

impl RetryingStore {
    async fn put_multipart(
        &self,
        key: &str,
        data: Bytes,
        shape: MultipartShape,
    ) -> Result<(), StoreError> {
        let upload_id = self.retry(key, || self.inner.create_upload(key)).await?;
        let mut upload = OpenUpload {
            store: self.inner.clone(),
            policy: self.policy.clone(),
            key: key.to_string(),
            upload_id: Some(upload_id.clone()),
        };
        let part_size = shape.part_size.max(1);
        let parts = (0..data.len())
            .step_by(part_size)
            .enumerate()
            .map(|(i, start)| {
                let body = data.slice(start..(start + part_size).min(data.len()));
                let number = i as i32 + 1;
                let upload_id = upload_id.as_str();
                async move {
                    let etag = self
                        .retry(key, || {
                            self.inner.upload_part(key, upload_id, number, body.clone())
                        })
                        .await?;
                    Ok::<_, StoreError>((number, etag))
                }
            });
        let uploaded: Result<Vec<_>, StoreError> = futures::stream::iter(parts)
            .buffered(shape.in_flight.max(1))
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect();
        let result = match uploaded {
            Ok(parts) => {
                self.retry(key, || {
                    self.inner.complete_upload(key, &upload_id, parts.clone())
                })
                .await
            }
            Err(error) => Err(error),
        };
        match result {
            Ok(()) => {
                upload.upload_id = None;
                Ok(())
            }
            Err(error) => {
                upload.abort().await;
                Err(error)
            }
        }
    }
}

/// A multipart upload not yet completed: aborted when it fails, and when its
/// caller drops it midway (a timeout, a cancelled pack), from a task of its
/// own, since a dropped future cannot await.
struct OpenUpload {
    store: Arc<dyn ObjectStore>,
    policy: Arc<RetryPolicy>,
    key: String,
    /// `None` once completed or aborted.
    upload_id: Option<String>,
}

impl OpenUpload {
    async fn abort(&mut self) {
        if let Some(upload_id) = self.upload_id.take() {
            abort_upload(
                self.store.clone(),
                self.policy.clone(),
                self.key.clone(),
                upload_id,
            )
            .await;
        }
    }
}

impl Drop for OpenUpload {
    fn drop(&mut self) {
        let Some(upload_id) = self.upload_id.take() else {
            return;
        };
        let (store, policy, key) = (self.store.clone(), self.policy.clone(), self.key.clone());
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(abort_upload(store, policy, key, upload_id));
            }
            Err(_) => tracing::error!(
                location = %store.location(&key),
                upload_id,
                "a multipart upload was abandoned outside a runtime and could not be aborted; \
                 a bucket lifecycle rule (AbortIncompleteMultipartUpload) removes it"
            ),
        }
    }
}

/// Aborts an upload, retrying transient failures within the policy.
async fn abort_upload(
    store: Arc<dyn ObjectStore>,
    policy: Arc<RetryPolicy>,
    key: String,
    upload_id: String,
) {
    let retrying = RetryingStore {
        inner: store,
        policy,
        limiter: None,
    };
    let result = retrying
        .retry(&key, || retrying.inner.abort_upload(&key, &upload_id))
        .await;
    match result {
        Ok(()) => tracing::info!(
            location = %retrying.inner.location(&key),
            "aborted an unfinished multipart upload"
        ),
        Err(error) => tracing::error!(
            %error,
            upload_id,
            "could not abort a multipart upload; a bucket lifecycle rule \
             (AbortIncompleteMultipartUpload) removes it"
        ),
    }
}

async fn acquire(limiter: &Option<Arc<RequestLimiter>>) -> Option<Slot> {
    match limiter {
        Some(limiter) => Some(limiter.acquire().await),
        None => None,
    }
}

/// Tells the limiter how a request was answered (`None`: it succeeded).
fn adapt(limiter: &Option<Arc<RequestLimiter>>, error: Option<&StoreError>) {
    let Some(limiter) = limiter else { return };
    match error {
        None => limiter.on_success(),
        Some(StoreError::Throttled { .. }) => limiter.on_throttled(),
        Some(_) => {}
    }
}

fn timed_out(location: String, after: Duration) -> StoreError {
    StoreError::Transient {
        location,
        message: format!("no response for {after:?}"),
    }
}

#[async_trait]
impl ObjectStore for RetryingStore {
    /// Page by page, each page its own attempts and time bound, the
    /// continuation token kept across a page's retries.
    async fn list_page(&self, prefix: &str, token: Option<&str>) -> Result<ListPage, StoreError> {
        self.retry(prefix, || self.inner.list_page(prefix, token))
            .await
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        self.retry(key, || self.inner.head(key)).await
    }

    async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<PartStream, StoreError> {
        let mut body = ResumingBody {
            inner: self.inner.clone(),
            policy: self.policy.clone(),
            limiter: self.limiter.clone(),
            key: key.to_string(),
            if_match: if_match.map(str::to_string),
            next: range.start,
            end: range.end,
            attempt: 0,
            first_failure: None,
            body: None,
        };
        // Fail here, not in the stream, when the object cannot be read at
        // all (missing, denied): callers tell those apart from a broken body.
        body.connect().await?;
        Ok(futures::stream::unfold(Some(body), |state| async move {
            let mut body = state?;
            match body.next_part().await {
                Ok(Some(part)) => Some((Ok(part), Some(body))),
                Ok(None) => None,
                // End the stream after the error.
                Err(error) => Some((Err(error), None)),
            }
        })
        .boxed())
    }

    /// A whole PUT, or for a large object on a store that takes parts, a
    /// multipart upload whose every request (create, each part, complete)
    /// has its own time bound and retries: a 1 GB shard is not one 30 s
    /// attempt. An upload that fails, or whose caller gives up, is aborted,
    /// so no orphaned parts stay billed.
    async fn put(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
        match self.inner.multipart() {
            Some(shape) if data.len() as u64 > shape.threshold => {
                self.put_multipart(key, data, shape).await
            }
            _ => self.retry(key, || self.inner.put(key, data.clone())).await,
        }
    }

    fn multipart(&self) -> Option<MultipartShape> {
        // Callers hand this store whole objects; it does the parts.
        None
    }

    fn location(&self, key: &str) -> String {
        self.inner.location(key)
    }
}

/// A ranged GET that reconnects from the next missing byte when its body
/// breaks or stalls; attempts are counted over the whole range.
struct ResumingBody {
    inner: Arc<dyn ObjectStore>,
    policy: Arc<RetryPolicy>,
    limiter: Option<Arc<RequestLimiter>>,
    key: String,
    if_match: Option<String>,
    /// The next byte to deliver.
    next: u64,
    end: u64,
    attempt: u32,
    /// When the range first failed: the retry budget counts from here.
    first_failure: Option<Instant>,
    body: Option<PartStream>,
}

impl ResumingBody {
    /// Opens the body from `next`, retrying transient failures.
    async fn connect(&mut self) -> Result<(), StoreError> {
        while self.body.is_none() && self.next < self.end {
            let slot = acquire(&self.limiter).await;
            let request =
                self.inner
                    .get_range(&self.key, self.next..self.end, self.if_match.as_deref());
            let result = tokio::time::timeout(self.policy.idle_timeout, request).await;
            drop(slot);
            let error = match result {
                Ok(Ok(body)) => {
                    adapt(&self.limiter, None);
                    self.body = Some(body);
                    return Ok(());
                }
                Ok(Err(error)) => error,
                Err(_) => timed_out(self.inner.location(&self.key), self.policy.idle_timeout),
            };
            adapt(&self.limiter, Some(&error));
            self.attempt += 1;
            let first_failure = *self.first_failure.get_or_insert_with(Instant::now);
            self.policy
                .back_off(error, self.attempt, first_failure)
                .await?;
        }
        Ok(())
    }

    async fn next_part(&mut self) -> Result<Option<(u64, Bytes)>, StoreError> {
        loop {
            if self.next >= self.end {
                return Ok(None);
            }
            self.connect().await?;
            let Some(body) = self.body.as_mut() else {
                return Ok(None);
            };
            let error = match tokio::time::timeout(self.policy.idle_timeout, body.next()).await {
                Ok(Some(Ok((offset, bytes)))) => {
                    // Trim anything outside [next, end): a store may send
                    // more than asked, never less without saying so.
                    let skip = self.next.saturating_sub(offset);
                    if offset > self.next || skip >= bytes.len() as u64 {
                        if offset > self.next {
                            return Err(StoreError::Other {
                                location: self.inner.location(&self.key),
                                message: format!(
                                    "body skipped from byte {} to {offset}",
                                    self.next
                                ),
                            });
                        }
                        continue;
                    }
                    let take = (bytes.len() as u64).min(self.end - offset) as usize;
                    let bytes = bytes.slice(skip as usize..take);
                    let at = self.next;
                    self.next += bytes.len() as u64;
                    return Ok(Some((at, bytes)));
                }
                Ok(Some(Err(error))) => error,
                Ok(None) => StoreError::Transient {
                    location: self.inner.location(&self.key),
                    message: format!("body ended at byte {}, expected {}", self.next, self.end),
                },
                Err(_) => StoreError::Transient {
                    location: self.inner.location(&self.key),
                    message: format!(
                        "body stalled at byte {}: no data for {:?}",
                        self.next, self.policy.idle_timeout
                    ),
                },
            };
            self.body = None;
            self.attempt += 1;
            tracing::debug!(resume_at = self.next, "resuming ranged read");
            let first_failure = *self.first_failure.get_or_insert_with(Instant::now);
            self.policy
                .back_off(error, self.attempt, first_failure)
                .await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store whose retries back off from 50 ms to 5 s under `budget`.
    fn retrying(budget: Duration) -> RetryingStore {
        RetryingStore::new(
            Arc::new(crate::store::local::LocalStore::new(std::env::temp_dir())),
            RetryPolicy {
                max_attempts: 10_000,
                budget,
                base_delay: Duration::from_millis(50),
                max_delay: Duration::from_secs(5),
                idle_timeout: Duration::from_secs(10),
            },
        )
    }

    /// Fails as S3 does in a regional outage (503) until `until`.
    async fn outage_until(until: Instant) -> Result<(), StoreError> {
        if Instant::now() < until {
            return Err(StoreError::Throttled {
                location: "s3://bucket/shard".into(),
                message: "503 SlowDown".into(),
            });
        }
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_minute_long_outage_is_ridden_out_within_the_budget() {
        let store = retrying(Duration::from_secs(120));
        let started = Instant::now();
        let outage = Duration::from_secs(60);
        store
            .retry("shard", || outage_until(started + outage))
            .await
            .unwrap();
        let took = started.elapsed();
        assert!(took >= outage, "{took:?}");
        // At most one backoff (max 5 s) past the outage's end.
        assert!(took <= outage + Duration::from_secs(5), "{took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_outage_past_the_budget_gives_up_at_the_budget() {
        let budget = Duration::from_secs(120);
        let store = retrying(budget);
        let started = Instant::now();
        let error = store
            .retry("shard", || outage_until(started + Duration::from_secs(600)))
            .await
            .unwrap_err();
        let took = started.elapsed();
        assert!(matches!(error, StoreError::Exhausted { .. }), "{error}");
        assert!(took <= budget, "never sleeps past the budget: {took:?}");
        assert!(
            took >= budget - Duration::from_secs(5),
            "gives up only when the next backoff would pass it: {took:?}"
        );
    }
}
