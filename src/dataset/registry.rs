//! The registry of opened datasets: one store per URI, one open (and one
//! index build) shared by every stream on the host.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::{BoxFuture, Shared};
use futures::FutureExt;
use tokio::sync::OnceCell;

use super::{Dataset, DatasetError, DatasetLocation, DatasetUri};
use crate::shard::BadShardPolicy;
use crate::store::cache::{CacheStore, DiskCache};
use crate::store::local::LocalStore;
use crate::store::read::ReadConfig;
use crate::store::retry::{RetryPolicy, RetryingStore};
use crate::store::s3::{S3Config, S3Store};
use crate::store::throttle::{RequestLimiter, DEFAULT_INITIAL_LIMIT};
use crate::store::ObjectStore;

/// Opens stores for URIs and keeps opened datasets, one per URI, so that every
/// stream on the host shares one index.
#[derive(Debug)]
pub struct DatasetRegistry {
    s3: S3Config,
    retry: RetryPolicy,
    read: ReadConfig,
    s3_client: OnceCell<aws_sdk_s3::Client>,
    /// S3 requests in flight, host-wide, adapted to throttling.
    limiter: Arc<RequestLimiter>,
    /// Opened datasets, and opens in progress: an open (which may build an
    /// index for minutes) runs in its own task, so it goes on when the
    /// caller that started it leaves, and every caller awaits the same one.
    datasets: Mutex<HashMap<String, SharedOpen>>,
    cache: Option<Arc<DiskCache>>,
    on_bad_shard: BadShardPolicy,
}

type SharedOpen = Shared<BoxFuture<'static, Result<Arc<Dataset>, DatasetError>>>;

impl DatasetRegistry {
    /// Datasets in S3 (reached with `s3`) or local directories, every store
    /// wrapped in a [`RetryingStore`] with `retry`; indexes are built with
    /// reads of `read`.
    pub fn new(s3: S3Config, retry: RetryPolicy, read: ReadConfig) -> Self {
        Self {
            s3,
            retry,
            read,
            s3_client: OnceCell::new(),
            limiter: RequestLimiter::new(DEFAULT_INITIAL_LIMIT),
            datasets: Mutex::default(),
            cache: None,
            on_bad_shard: BadShardPolicy::Fail,
        }
    }

    /// What an index build does with a shard it cannot parse.
    pub fn with_bad_shard_policy(mut self, policy: BadShardPolicy) -> Self {
        self.on_bad_shard = policy;
        self
    }

    /// Reads S3 datasets through `cache` (local directories are not cached).
    pub fn with_cache(mut self, cache: Arc<DiskCache>) -> Self {
        self.cache = Some(cache);
        self
    }

    pub fn cache(&self) -> Option<&Arc<DiskCache>> {
        self.cache.as_ref()
    }

    pub fn read_config(&self) -> &ReadConfig {
        &self.read
    }

    /// The store and key prefix for a dataset URI: the origin, wrapped in
    /// the retrying store, behind the disk cache for S3.
    pub async fn store_for(&self, uri: &DatasetUri) -> (Arc<dyn ObjectStore>, String) {
        match uri {
            DatasetUri::S3 { bucket, prefix, .. } => {
                let client = self
                    .s3_client
                    .get_or_init(|| crate::store::s3::client(&self.s3))
                    .await
                    .clone();
                let s3: Arc<dyn ObjectStore> = Arc::new(
                    RetryingStore::new(
                        Arc::new(S3Store::new(client, bucket.clone())),
                        self.retry.clone(),
                    )
                    .with_limiter(self.limiter.clone()),
                );
                let store: Arc<dyn ObjectStore> = match &self.cache {
                    Some(cache) => Arc::new(CacheStore::new(s3, cache.clone())),
                    None => s3,
                };
                (store, prefix.clone())
            }
            DatasetUri::Local { root, .. } => (
                Arc::new(RetryingStore::new(
                    Arc::new(LocalStore::new(root.clone())),
                    self.retry.clone(),
                )),
                String::new(),
            ),
        }
    }

    /// The dataset at `uri`, opened once; concurrent requests share one open
    /// (and one index build), which finishes even if they all leave.
    /// Failures are not kept: the next request tries again.
    pub async fn open(&self, uri: &str) -> Result<Arc<Dataset>, DatasetError> {
        let parsed = DatasetUri::parse(uri)?;
        let existing = self.lock_datasets().get(uri).cloned();
        let open = match existing {
            Some(open) => open,
            None => {
                let (store, prefix) = self.store_for(&parsed).await;
                let location = DatasetLocation {
                    prefix,
                    manifest: parsed.manifest().map(str::to_string),
                };
                let (read, policy, owned_uri) =
                    (self.read.clone(), self.on_bad_shard, uri.to_string());
                self.lock_datasets()
                    .entry(uri.to_string())
                    .or_insert_with(|| {
                        let task = tokio::spawn(async move {
                            Dataset::open(&owned_uri, store, location, &read, policy)
                                .await
                                .map(Arc::new)
                        });
                        async move {
                            task.await.unwrap_or_else(|error| {
                                Err(DatasetError::Internal(format!("open task ended: {error}")))
                            })
                        }
                        .boxed()
                        .shared()
                    })
                    .clone()
            }
        };
        let result = open.clone().await;
        if result.is_err() {
            let mut datasets = self.lock_datasets();
            if datasets
                .get(uri)
                .is_some_and(|current| current.ptr_eq(&open))
            {
                datasets.remove(uri);
            }
        }
        result
    }

    fn lock_datasets(&self) -> std::sync::MutexGuard<'_, HashMap<String, SharedOpen>> {
        self.datasets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
