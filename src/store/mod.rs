//! Object stores: where shard bytes come from.
//!
//! One small trait, [`ObjectStore`], in front of S3 ([`s3::S3Store`]) and a
//! local directory ([`local::LocalStore`]). Wrappers implement it too: the
//! disk cache ([`cache::CacheStore`]) in front of a store, and
//! [`retry::RetryingStore`], which retries every operation, bounds every
//! attempt in time and resumes broken bodies: retries live there and nowhere
//! else. [`read`] splits large ranges into ranged GETs in flight. This module
//! knows nothing about tar, images or plans.

pub mod cache;
pub mod local;
pub mod read;
pub mod retry;
pub mod s3;
pub mod throttle;

use std::fmt;
use std::ops::Range;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;

/// One object as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    pub key: String,
    pub size: u64,
    pub etag: Option<String>,
}

/// Body of a ranged GET: consecutive `(offset, bytes)` pieces.
pub type PartStream = BoxStream<'static, Result<(u64, Bytes), StoreError>>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("{location} not found{}", detail(.message))]
    NotFound { location: String, message: String },
    #[error("access to {location} denied{}", detail(.message))]
    PermissionDenied { location: String, message: String },
    /// No usable credentials (none in the chain, expired, unknown key):
    /// retrying cannot help; the operator must fix the environment.
    #[error("no valid AWS credentials to read {location}: {message}")]
    Credentials { location: String, message: String },
    #[error("{location} changed since it was indexed (ETag no longer matches); rebuild the index with `shardfeed index`")]
    Changed { location: String },
    /// Worth retrying: 5xx, timeouts, broken connections.
    #[error("transient failure reading {location}: {message}")]
    Transient { location: String, message: String },
    /// Worth retrying, more slowly: the store asked for fewer requests.
    #[error("{location} is throttled: {message}")]
    Throttled { location: String, message: String },
    #[error("retries exhausted for {location} after {attempts} attempts (retry budget or attempt limit reached): {message}")]
    Exhausted {
        location: String,
        attempts: u32,
        message: String,
    },
    #[error("{location}: {message}")]
    Other { location: String, message: String },
}

fn detail(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

impl StoreError {
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Transient { .. } | StoreError::Throttled { .. }
        )
    }
}

#[async_trait]
pub trait ObjectStore: Send + Sync + fmt::Debug {
    /// Objects whose key starts with `prefix`, sorted by key.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StoreError>;

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError>;

    /// Bytes `range` of `key`. With `if_match`, fails with
    /// [`StoreError::Changed`] when the object's ETag differs.
    async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<PartStream, StoreError>;

    /// The whole of `object`, whose size and ETag the caller already knows
    /// (from an index): a wrapper that would otherwise look them up first
    /// (the disk cache) reads it without a HEAD. Loose-object datasets read
    /// every sample this way: one request per sample, not two.
    async fn get_object(&self, object: &ObjectMeta) -> Result<PartStream, StoreError> {
        self.get_range(&object.key, 0..object.size, object.etag.as_deref())
            .await
    }

    async fn put(&self, key: &str, data: Bytes) -> Result<(), StoreError>;

    /// Human-readable location of `key`, for errors and logs.
    fn location(&self, key: &str) -> String;
}
