//! The store in front of the disk cache: serves blocks from disk, fills
//! them from the origin (one download per missing block, however many
//! readers wait for it), and keeps listings and object metadata in memory.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{FutureExt, StreamExt};

use super::disk::{block_len, entry_id, remove_evicted, DiskCache, EntryMeta, MAX_CACHED_LISTING};
use crate::metrics;
use crate::store::read::read_range;
use crate::store::{list_pages, ListPage, ObjectMeta, ObjectStore, PartStream, StoreError};

/// A store that serves from the disk cache and fills it from `inner`.
#[derive(Debug)]
pub struct CacheStore {
    source: BlockSource,
    metadata: Mutex<MetadataCache>,
}

#[derive(Debug, Default)]
struct MetadataCache {
    heads: HashMap<String, (ObjectMeta, Instant)>,
    lists: HashMap<String, (Vec<ObjectMeta>, Instant)>,
}

/// Everything needed to produce one block; cheap to clone into streams.
#[derive(Debug, Clone)]
struct BlockSource {
    /// The origin; it retries (a [`crate::store::retry::RetryingStore`]).
    inner: Arc<dyn ObjectStore>,
    cache: Arc<DiskCache>,
}

impl BlockSource {
    /// One block of an entry: from disk, from a download in flight, or
    /// downloaded now (and written to disk on the way).
    async fn block(
        &self,
        key: &str,
        id: &str,
        meta: &EntryMeta,
        block: u64,
    ) -> Result<Bytes, StoreError> {
        // A block that fails on disk is dropped there and downloaded on the
        // next pass; one that fails again (a disk that keeps failing) is read
        // from the origin without the cache. Never a spin.
        let mut disk_failures = 0;
        loop {
            if disk_failures >= 2 {
                let start = block * meta.block_size;
                let range = start..start + block_len(meta, block);
                return read_range(self.inner.as_ref(), key, range, Some(&meta.etag)).await;
            }
            let found = {
                let mut state = self.cache.lock();
                let entry = state.touch(id, meta);
                if let Some(&checksum) = entry.meta.blocks.get(&block) {
                    Ok(checksum)
                } else if let Some(download) = entry.inflight.get(&block) {
                    Err(download.clone())
                } else {
                    let download = self
                        .clone()
                        .download(key.to_string(), id.to_string(), meta.clone(), block)
                        .boxed()
                        .shared();
                    entry.inflight.insert(block, download.clone());
                    Err(download)
                }
            };
            let checksum = match found {
                Ok(checksum) => checksum,
                Err(download) => return download.await,
            };
            let cache = self.cache.clone();
            let owned_id = id.to_string();
            let meta = meta.clone();
            let from_disk = tokio::task::spawn_blocking(move || {
                cache.read_block_from_disk(&owned_id, &meta, block, checksum)
            })
            .await
            .ok()
            .flatten();
            if let Some(bytes) = from_disk {
                self.cache.stats.hits.fetch_add(1, Ordering::Relaxed);
                ::metrics::counter!(metrics::CACHE_HITS).increment(1);
                ::metrics::counter!(metrics::CACHE_READ_BYTES, "source" => "cache")
                    .increment(bytes.len() as u64);
                return Ok(bytes);
            }
            // Corrupt or unreadable: the block was dropped; fetch it again.
            disk_failures += 1;
        }
    }

    /// Downloads one block, then records it (if there is room).
    async fn download(
        self,
        key: String,
        id: String,
        meta: EntryMeta,
        block: u64,
    ) -> Result<Bytes, StoreError> {
        let cache = self.cache;
        cache.stats.misses.fetch_add(1, Ordering::Relaxed);
        ::metrics::counter!(metrics::CACHE_MISSES).increment(1);
        let start = block * meta.block_size;
        let range = start..start + block_len(&meta, block);
        let bytes = match read_range(self.inner.as_ref(), &key, range, Some(&meta.etag)).await {
            Ok(bytes) => bytes,
            Err(error) => {
                let mut state = cache.lock();
                if let Some(entry) = state.entries.get_mut(&id) {
                    entry.inflight.remove(&block);
                }
                state.forget_if_empty(&id);
                return Err(error);
            }
        };
        ::metrics::counter!(metrics::CACHE_READ_BYTES, "source" => "origin")
            .increment(bytes.len() as u64);
        let stored = {
            let cache = cache.clone();
            let bytes = bytes.clone();
            tokio::task::spawn_blocking(move || store_block(&cache, &id, &meta, block, &bytes))
                .await
                .unwrap_or(false)
        };
        if !stored {
            tracing::debug!(key, block, "block not cached (no room)");
        }
        Ok(bytes)
    }
}

impl CacheStore {
    pub fn new(inner: Arc<dyn ObjectStore>, cache: Arc<DiskCache>) -> Self {
        Self {
            source: BlockSource { inner, cache },
            metadata: Mutex::default(),
        }
    }

    fn fresh(&self, at: Instant) -> bool {
        self.source
            .cache
            .config
            .metadata_ttl
            .is_none_or(|ttl| at.elapsed() < ttl)
    }

    fn metadata(&self) -> std::sync::MutexGuard<'_, MetadataCache> {
        self.metadata
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Writes a downloaded block and records it; false if it was not cached.
fn store_block(cache: &DiskCache, id: &str, meta: &EntryMeta, block: u64, data: &[u8]) -> bool {
    let len = data.len() as u64;
    let mut evicted = Vec::new();
    let room = {
        let mut state = cache.lock();
        let room = cache.make_room(&mut state, id, len, &mut evicted);
        if room {
            // Reserve the space before writing, released if the write fails.
            state.used += len;
        }
        room
    };
    remove_evicted(evicted);
    let written = room
        && match cache.write_block(id, meta, block, data) {
            Ok(()) => true,
            Err(error) => {
                cache.write_failed(&error);
                // The disk filled up under us: make room for the next one
                // (this block is served from memory either way).
                let _ = cache.evict_at_least(id, len);
                false
            }
        };
    let mut state = cache.lock();
    if room && !written {
        state.used -= len;
    }
    let Some(entry) = state.entries.get_mut(id) else {
        if written {
            state.used -= len;
        }
        return false;
    };
    entry.inflight.remove(&block);
    if !written {
        // An object none of whose blocks could be kept leaves nothing behind.
        if state.forget_if_empty(id) {
            let aside = cache.set_aside(id);
            drop(state);
            remove_evicted(aside.into_iter().collect());
        }
        return false;
    }
    entry.meta.blocks.insert(block, crc32fast::hash(data));
    drop(state);
    cache.publish_usage();
    cache.persist_meta(id).is_ok()
}

#[async_trait]
impl ObjectStore for CacheStore {
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StoreError> {
        if let Some((objects, at)) = self.metadata().lists.get(prefix) {
            if self.fresh(*at) {
                return Ok(objects.clone());
            }
        }
        let objects = list_pages(self.source.inner.as_ref(), prefix).await?;
        if objects.len() > MAX_CACHED_LISTING {
            // A loose-object dataset: its index keeps what is needed.
            return Ok(objects);
        }
        let mut metadata = self.metadata();
        for object in &objects {
            metadata
                .heads
                .insert(object.key.clone(), (object.clone(), Instant::now()));
        }
        metadata
            .lists
            .insert(prefix.to_string(), (objects.clone(), Instant::now()));
        Ok(objects)
    }

    async fn list_page(&self, prefix: &str, token: Option<&str>) -> Result<ListPage, StoreError> {
        self.source.inner.list_page(prefix, token).await
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        if let Some((meta, at)) = self.metadata().heads.get(key) {
            if self.fresh(*at) {
                return Ok(meta.clone());
            }
        }
        let meta = self.source.inner.head(key).await?;
        self.metadata()
            .heads
            .insert(key.to_string(), (meta.clone(), Instant::now()));
        Ok(meta)
    }

    async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<PartStream, StoreError> {
        let object = self.head(key).await?;
        self.read_cached(&object, range, if_match).await
    }

    async fn get_object(&self, object: &ObjectMeta) -> Result<PartStream, StoreError> {
        self.read_cached(object, 0..object.size, object.etag.as_deref())
            .await
    }

    async fn put(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
        {
            let mut metadata = self.metadata();
            metadata.heads.remove(key);
            metadata.lists.clear();
        }
        self.source.inner.put(key, data).await
    }

    fn location(&self, key: &str) -> String {
        self.source.inner.location(key)
    }
}

impl CacheStore {
    /// `range` of `object` (as listed or looked up) through the cache's blocks.
    async fn read_cached(
        &self,
        object: &ObjectMeta,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<PartStream, StoreError> {
        let key = object.key.as_str();
        let etag = match (if_match, object.etag.as_deref()) {
            (Some(wanted), _) => wanted.to_string(),
            (None, Some(current)) => current.to_string(),
            // Without an ETag nothing can be cached safely.
            (None, None) => return self.source.inner.get_range(key, range, None).await,
        };
        let location = self.source.inner.location(key);
        let meta = EntryMeta {
            location: location.clone(),
            etag: etag.clone(),
            size: object.size,
            block_size: self.source.cache.config.block_size,
            blocks: BTreeMap::new(),
        };
        let id = entry_id(&location, &etag);
        let end = range.end.min(object.size);
        let block_size = meta.block_size;
        let first = range.start / block_size;
        let last = end.div_ceil(block_size);
        let source = self.source.clone();
        let key = key.to_string();
        // Blocks are produced one at a time as the consumer reads, each
        // yielded as a slice of the block (no copy).
        let stream = futures::stream::iter(first..last).map(move |block| {
            let (source, key, id, meta) = (source.clone(), key.clone(), id.clone(), meta.clone());
            let start = range.start;
            async move {
                let bytes = source.block(&key, &id, &meta, block).await?;
                let block_start = block * block_size;
                let from = start.max(block_start) - block_start;
                let to = end.min(block_start + bytes.len() as u64) - block_start;
                Ok((block_start + from, bytes.slice(from as usize..to as usize)))
            }
        });
        // Two blocks in flight keep a range wider than a block streaming.
        let stream = stream.buffered(2);
        Ok(stream.boxed())
    }
}
