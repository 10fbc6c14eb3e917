//! An opened dataset: its store, its summary, and per-shard indexes loaded
//! on demand into a bounded cache.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::build::build_index_reporting;
use super::charge::{check, shard_index_bytes, summary_bytes};
use super::index::{
    parse_shard_index, parse_summary, shard_index_key, summary_key, DatasetError, DatasetIndex,
    DatasetLayout, DatasetLocation, ShardIndex, MAX_SHARD_INDEX_BYTES, MAX_SUMMARY_BYTES,
};
use super::parquet::FooterCache;
use crate::shard::parquet::ClassNames;
use crate::shard::BadShardPolicy;
use crate::store::read::{get_all, ReadConfig};
use crate::store::{ObjectMeta, ObjectStore, StoreError};

/// Per-shard indexes kept in memory when loaded lazily.
const SHARD_INDEX_CACHE: usize = 4096;

/// An opened dataset: its store, its summary, and per-shard indexes on demand.
#[derive(Debug)]
pub struct Dataset {
    pub uri: String,
    pub store: Arc<dyn ObjectStore>,
    pub prefix: String,
    /// Where the index files are (see [`DatasetLocation::index_root`]).
    index_root: String,
    pub index: DatasetIndex,
    shard_indexes: Mutex<ShardIndexCache>,
    /// True when the index was built in memory (no per-shard files to load).
    resident: bool,
    /// Footers of the Parquet files being read.
    footers: FooterCache,
    /// `index.classes` by name, built on a stream's first string label read.
    class_names: std::sync::OnceLock<Arc<ClassNames>>,
}

#[derive(Debug, Default)]
struct ShardIndexCache {
    map: HashMap<u32, Arc<ShardIndex>>,
    order: VecDeque<u32>,
}

impl Dataset {
    /// Opens the dataset, building the index by a scan when none is stored;
    /// an index that would hold more than `max_index_bytes` is refused
    /// (see [`super::charge`]).
    pub async fn open(
        uri: &str,
        store: Arc<dyn ObjectStore>,
        location: DatasetLocation,
        read: &ReadConfig,
        (on_bad_shard, max_index_bytes): (BadShardPolicy, u64),
    ) -> Result<Self, DatasetError> {
        let index_root = location.index_root();
        let summary_key = summary_key(&index_root);
        // `resident`: built here and held whole, so no per-shard file to load.
        let (index, cache, resident) =
            match get_all(store.as_ref(), &summary_key, MAX_SUMMARY_BYTES).await {
                Ok(bytes) => {
                    let summary = store.location(&summary_key);
                    let index = parse_summary(&bytes, &summary)?;
                    let held = summary_bytes(&index);
                    check(&summary, index.shards.len() as u64, held, max_index_bytes)?;
                    (index, ShardIndexCache::default(), false)
                }
                Err(StoreError::NotFound { .. }) => {
                    let started = Instant::now();
                    let (index, shard_indexes) = build_index_reporting(
                        store.clone(),
                        &location,
                        read,
                        on_bad_shard,
                        max_index_bytes,
                        &|_| {},
                    )
                    .await?;
                    crate::metrics::index_built();
                    tracing::warn!(
                        dataset = uri,
                        shards = index.shards.len(),
                        seconds = started.elapsed().as_secs_f64(),
                        "no index found; built one by scanning every shard and kept it in memory. \
                     Run `shardfeed index {uri}` once to save this scan"
                    );
                    let cache = ShardIndexCache {
                        map: shard_indexes
                            .into_iter()
                            .enumerate()
                            .filter(|(i, _)| !index.shards[*i].indexes_itself())
                            .map(|(i, s)| (i as u32, Arc::new(s)))
                            .collect(),
                        order: VecDeque::new(),
                    };
                    (index, cache, true)
                }
                Err(error) => return Err(error.into()),
            };
        Ok(Self {
            uri: uri.to_string(),
            store,
            prefix: location.prefix,
            index_root,
            index,
            shard_indexes: Mutex::new(cache),
            resident,
            footers: FooterCache::default(),
            class_names: std::sync::OnceLock::new(),
        })
    }

    /// Memory this dataset's index holds, roughly: the summary and the
    /// per-shard indexes in memory (keys, ranges, labels, ETags).
    pub fn index_bytes(&self) -> u64 {
        let shards: u64 = self
            .lock_cache()
            .map
            .values()
            .map(|index| shard_index_bytes(index))
            .sum();
        summary_bytes(&self.index) + shards
    }

    pub fn shard_samples(&self) -> Vec<u64> {
        self.index.shards.iter().map(|s| s.samples).collect()
    }

    /// The shard's object key (for a loose dataset, the virtual group's name
    /// under the prefix: a label for logs, not an object).
    pub fn shard_key(&self, shard: u32) -> String {
        format!("{}{}", self.prefix, self.index.shards[shard as usize].name)
    }

    /// The dataset's classes by name, one lookup shared by every stream
    /// and row group (a label column of 10^6 names scanned the list per
    /// row and copied it per row group).
    pub fn class_names(&self) -> Arc<ClassNames> {
        self.class_names
            .get_or_init(|| Arc::new(ClassNames::new(&self.index.classes)))
            .clone()
    }

    /// What one reader holds to read the dataset's costliest shard beyond
    /// the stream's own terms ([`ShardEntry::read_cost`]: a Parquet row
    /// group's columns); 0 when no shard holds more.
    pub fn largest_read_cost(&self) -> u64 {
        self.index
            .shards
            .iter()
            .map(super::index::ShardEntry::read_cost)
            .max()
            .unwrap_or(0)
    }

    pub fn is_loose(&self) -> bool {
        self.index.layout == DatasetLayout::Objects
    }

    /// Sample `i` of a loose group, as the object to GET.
    pub fn object(&self, index: &ShardIndex, i: usize) -> ObjectMeta {
        ObjectMeta {
            key: format!("{}{}", self.prefix, index.keys[i]),
            size: index.ends[i] - index.starts[i],
            etag: index.etags.get(i).cloned().flatten(),
        }
    }

    pub async fn shard_index(&self, shard: u32) -> Result<Arc<ShardIndex>, DatasetError> {
        let entry = &self.index.shards[shard as usize];
        if let Some(derived) = entry.derived_index() {
            // Known from the entry: nothing to load, nothing worth keeping.
            return Ok(Arc::new(derived));
        }
        if let Some(found) = self.lock_cache().map.get(&shard) {
            return Ok(found.clone());
        }
        let key = shard_index_key(&self.index_root, &entry.name);
        let location = self.store.location(&key);
        let bytes = get_all(self.store.as_ref(), &key, MAX_SHARD_INDEX_BYTES).await?;
        let loaded = parse_shard_index(&bytes, &location, entry.samples, self.is_loose())?;
        let loaded = Arc::new(loaded);
        let mut cache = self.lock_cache();
        if !self.resident {
            cache.order.push_back(shard);
            while cache.order.len() > SHARD_INDEX_CACHE {
                if let Some(old) = cache.order.pop_front() {
                    cache.map.remove(&old);
                }
            }
        }
        cache.map.insert(shard, loaded.clone());
        Ok(loaded)
    }

    /// The footer of the Parquet file that shard `shard` (a row group) is
    /// part of: read once however many of its row groups are in flight.
    pub async fn parquet_footer(
        &self,
        shard: u32,
    ) -> Result<Arc<crate::shard::parquet::Footer>, DatasetError> {
        let entry = &self.index.shards[shard as usize];
        let object = ObjectMeta {
            key: self.shard_key(shard),
            size: entry.object_size(),
            etag: entry.etag.clone(),
        };
        self.footers.get(self.store.as_ref(), &object).await
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, ShardIndexCache> {
        self.shard_indexes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
