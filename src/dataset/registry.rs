//! The registry of opened datasets: one store per URI, one open (and one
//! index build) shared by every stream on the host.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::{BoxFuture, Shared};
use futures::FutureExt;
use tokio::sync::OnceCell;

use super::index::{DatasetError, DatasetLocation};
use super::opened::Dataset;
use super::uri::DatasetUri;
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
    /// Keyed by canonical URI; least recently used datasets that no stream
    /// holds are let go beyond `index_budget` bytes of indexes.
    datasets: Mutex<Opened>,
    index_budget: u64,
    /// The most one dataset's index may hold, in use or not: a build past
    /// it is refused (`super::charge`).
    index_limit: u64,
    /// Set once, before the first dataset is opened: the server opens a
    /// large cache after it starts listening (see [`Self::set_cache`]).
    cache: std::sync::OnceLock<Arc<DiskCache>>,
    on_bad_shard: BadShardPolicy,
}

type SharedOpen = Shared<BoxFuture<'static, Result<Arc<Dataset>, DatasetError>>>;

/// Indexes kept in memory by default (the server sets `memory limit / 8`,
/// 1.5 GiB at the chart's 12 GiB limit; part of the quarter of the limit the
/// memory formula leaves to runtime and indexes).
pub const DEFAULT_INDEX_BUDGET: u64 = 1 << 30;

#[derive(Debug, Default)]
struct Opened {
    entries: HashMap<String, OpenEntry>,
    /// Bumped on every use, for least-recently-used order.
    clock: u64,
}

#[derive(Debug)]
struct OpenEntry {
    open: SharedOpen,
    last_used: u64,
}

impl Opened {
    /// The open of `key`, marked as just used.
    fn touch(&mut self, key: &str) -> Option<SharedOpen> {
        self.clock += 1;
        let clock = self.clock;
        let entry = self.entries.get_mut(key)?;
        entry.last_used = clock;
        Some(entry.open.clone())
    }

    /// Lets go of the least recently used datasets that no stream holds
    /// until the indexes kept fit `budget` (a dataset in use stays: its
    /// streams keep its index alive anyway, and a re-open would re-index).
    fn evict(&mut self, budget: u64) {
        let opened = |entry: &OpenEntry| match entry.open.peek() {
            Some(Ok(dataset)) => Some(dataset.clone()),
            _ => None,
        };
        let mut idle: Vec<(u64, String, u64)> = Vec::new();
        let mut total = 0u64;
        for (uri, entry) in &self.entries {
            if let Some(dataset) = opened(entry) {
                let bytes = dataset.index_bytes();
                total += bytes;
                // The registry's own handle, in the shared future, plus ours.
                if Arc::strong_count(&dataset) <= 2 {
                    idle.push((entry.last_used, uri.clone(), bytes));
                }
            }
        }
        idle.sort();
        for (_, uri, bytes) in idle {
            if total <= budget {
                break;
            }
            tracing::info!(dataset = %uri, bytes, "letting go of an idle dataset's index");
            self.entries.remove(&uri);
            total -= bytes;
        }
    }
}

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
            index_budget: DEFAULT_INDEX_BUDGET,
            index_limit: DEFAULT_INDEX_BUDGET,
            cache: std::sync::OnceLock::new(),
            on_bad_shard: BadShardPolicy::Fail,
        }
    }

    /// Bytes of indexes kept for datasets no stream uses (see
    /// [`DEFAULT_INDEX_BUDGET`]).
    pub fn with_index_budget(mut self, bytes: u64) -> Self {
        self.index_budget = bytes;
        self
    }

    /// The most memory one dataset's index may hold, whether a stream uses
    /// it or not (default [`DEFAULT_INDEX_BUDGET`]); a larger one is refused
    /// when it is built or loaded, naming the way out.
    pub fn with_index_limit(mut self, bytes: u64) -> Self {
        self.index_limit = bytes;
        self
    }

    /// What an index build does with a shard it cannot parse.
    pub fn with_bad_shard_policy(mut self, policy: BadShardPolicy) -> Self {
        self.on_bad_shard = policy;
        self
    }

    /// Reads S3 datasets through `cache` (local directories are not cached).
    pub fn with_cache(self, cache: Arc<DiskCache>) -> Self {
        self.set_cache(cache);
        self
    }

    /// Sets the cache of a registry already shared; the server does so
    /// before it admits requests. A second cache is refused (false).
    pub fn set_cache(&self, cache: Arc<DiskCache>) -> bool {
        self.cache.set(cache).is_ok()
    }

    pub fn cache(&self) -> Option<&Arc<DiskCache>> {
        self.cache.get()
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
                let store: Arc<dyn ObjectStore> = match self.cache.get() {
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
        let key = parsed.canonical();
        let existing = self.lock_datasets().touch(&key);
        let open = match existing {
            Some(open) => open,
            None => {
                let (store, prefix) = self.store_for(&parsed).await;
                let location = DatasetLocation {
                    prefix,
                    manifest: parsed.manifest().map(str::to_string),
                };
                let (read, owned_uri) = (self.read.clone(), key.clone());
                let policy = (self.on_bad_shard, self.index_limit);
                let mut datasets = self.lock_datasets();
                datasets.clock += 1;
                let clock = datasets.clock;
                datasets
                    .entries
                    .entry(key.clone())
                    .or_insert_with(|| {
                        let task = tokio::spawn(async move {
                            Dataset::open(&owned_uri, store, location, &read, policy)
                                .await
                                .map(Arc::new)
                        });
                        let open = async move {
                            task.await.unwrap_or_else(|error| {
                                Err(DatasetError::Internal(format!("open task ended: {error}")))
                            })
                        }
                        .boxed()
                        .shared();
                        OpenEntry {
                            open,
                            last_used: clock,
                        }
                    })
                    .open
                    .clone()
            }
        };
        let result = open.clone().await;
        let mut datasets = self.lock_datasets();
        if result.is_err() {
            if datasets
                .entries
                .get(&key)
                .is_some_and(|current| current.open.ptr_eq(&open))
            {
                datasets.entries.remove(&key);
            }
        } else {
            datasets.evict(self.index_budget);
        }
        result
    }

    fn lock_datasets(&self) -> std::sync::MutexGuard<'_, Opened> {
        self.datasets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
