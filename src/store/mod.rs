//! Object stores: where shard bytes come from.
//!
//! One small trait, [`ObjectStore`], in front of S3 ([`s3::S3Store`]) and a
//! local directory ([`local::LocalStore`]). Wrappers implement it too: the
//! disk cache ([`cache::CacheStore`]) in front of a store, and
//! [`retry::RetryingStore`], which retries every operation, bounds every
//! attempt in time and resumes broken bodies: retries live there and nowhere
//! else. [`read`] splits large ranges into ranged GETs in flight. These
//! know nothing about tar, images or plans beyond the plans' eviction hints.
//! The decoded-source tier keeps its records beside the shard cache on the
//! same disk, but is a module of its own ([`crate::tier`]): it stores images.

pub mod beneath;
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
    /// The object ends before a range its index names: it was replaced by
    /// a shorter one (an index without ETags cannot tell otherwise).
    #[error("{location} is shorter than its index says ({message}): it changed since it was indexed; rebuild the index with `shardfeed index`")]
    Truncated { location: String, message: String },
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
    /// A file read whole (an index, a class list) larger than such a file
    /// may be: refused before a byte of it is read or reserved.
    #[error("{location} is {size} bytes, more than the {limit} bytes a file of its kind may have; it is not an index shardfeed wrote (rebuild it with `shardfeed index`)")]
    TooLarge {
        location: String,
        size: u64,
        limit: u64,
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

/// How a store takes large objects in parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MultipartShape {
    /// Objects larger than this go up in parts.
    pub threshold: u64,
    pub part_size: usize,
    /// Parts uploaded at once.
    pub in_flight: usize,
}

/// One page of a listing and the token of the next, if there is one.
#[derive(Debug, Clone, Default)]
pub struct ListPage {
    pub objects: Vec<ObjectMeta>,
    pub next: Option<String>,
}

/// Pages between progress lines of a long listing (S3 pages hold 1,000 keys).
const LIST_PROGRESS_PAGES: u64 = 100;

/// Every page of a listing, sorted by key. Each page is its own request, so
/// a wrapper bounds and retries pages one by one (a listing of a million
/// keys takes minutes; one page takes milliseconds).
pub async fn list_pages(
    store: &(impl ObjectStore + ?Sized),
    prefix: &str,
) -> Result<Vec<ObjectMeta>, StoreError> {
    let started = std::time::Instant::now();
    let mut objects = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0u64;
    loop {
        let page = store.list_page(prefix, token.as_deref()).await?;
        objects.extend(page.objects);
        pages += 1;
        if pages.is_multiple_of(LIST_PROGRESS_PAGES) {
            tracing::info!(
                location = %store.location(prefix),
                objects = objects.len(),
                pages,
                seconds = started.elapsed().as_secs_f64(),
                "listing"
            );
        }
        match page.next {
            Some(next) if token.as_deref() != Some(next.as_str()) => token = Some(next),
            _ => break,
        }
    }
    objects.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(objects)
}

#[async_trait]
pub trait ObjectStore: Send + Sync + fmt::Debug {
    /// Objects whose key starts with `prefix`, sorted by key.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StoreError> {
        list_pages(self, prefix).await
    }

    /// One page of the listing of `prefix`, from `token` (a page's `next`).
    /// Stores that list in one piece return everything with no `next`.
    async fn list_page(&self, prefix: &str, token: Option<&str>) -> Result<ListPage, StoreError>;

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

    /// How large objects go up in parts (S3's multipart upload), if this
    /// store takes them: callers put objects over the threshold through the
    /// part operations below, each part bounded and retried on its own.
    fn multipart(&self) -> Option<MultipartShape> {
        None
    }

    /// Starts a multipart upload of `key`; returns its upload id.
    async fn create_upload(&self, key: &str) -> Result<String, StoreError> {
        Err(self.no_multipart(key))
    }

    /// Uploads part `number` (1-based); returns the part's ETag.
    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: i32,
        data: Bytes,
    ) -> Result<Option<String>, StoreError> {
        let _ = (upload_id, number, data);
        Err(self.no_multipart(key))
    }

    /// Completes the upload from its parts' `(number, etag)` in order.
    async fn complete_upload(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<(i32, Option<String>)>,
    ) -> Result<(), StoreError> {
        let _ = (upload_id, parts);
        Err(self.no_multipart(key))
    }

    /// Abandons the upload and deletes its parts (billed until then).
    async fn abort_upload(&self, key: &str, upload_id: &str) -> Result<(), StoreError> {
        let _ = upload_id;
        Err(self.no_multipart(key))
    }

    #[doc(hidden)]
    fn no_multipart(&self, key: &str) -> StoreError {
        StoreError::Other {
            location: self.location(key),
            message: "this store takes no multipart uploads".into(),
        }
    }

    /// Human-readable location of `key`, for errors and logs.
    fn location(&self, key: &str) -> String;
}
