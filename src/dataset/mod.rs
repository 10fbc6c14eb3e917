//! Datasets: URIs, the shard index, and the registry of opened datasets.
//!
//! The index lives beside the shards under `_shardfeed/`: a summary
//! (`index.json`: shards, sizes, ETags, sample counts; O(shards)) and one small
//! file per shard with each sample's key and byte range, read only when a
//! stream is about to read that shard. `shardfeed index URI` writes it; a
//! server that finds none builds it by scanning once and keeps it in memory.
//!
//! A prefix without shards but with images is a loose-object dataset
//! ([`loose`]): its listing, grouped into virtual shards, is the index.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

mod build;
pub mod loose;
pub mod manifest;
mod registry;
mod uri;

pub use build::{
    build_index, build_index_reporting, index_shard_bytes, write_index, IndexProgress,
};
pub use registry::DatasetRegistry;
pub use uri::DatasetUri;

use crate::shard::{BadShardPolicy, ShardError};
use crate::store::read::{get_all, ReadConfig};
use crate::store::{ObjectMeta, ObjectStore, StoreError};

pub const INDEX_DIR: &str = "_shardfeed/";
pub const INDEX_VERSION: u32 = 1;
/// Class names beside a dataset's shards, one per line, line `i` naming
/// label `i` (pack writes it; the index takes it in).
pub const CLASSES_FILE: &str = "classes.txt";
/// Per-shard indexes kept in memory when loaded lazily.
const SHARD_INDEX_CACHE: usize = 4096;

#[derive(Debug, Clone, thiserror::Error)]
pub enum DatasetError {
    #[error("invalid dataset URI {uri:?}: {reason}")]
    InvalidUri { uri: String, reason: &'static str },
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error(
        "no shards (*.tar, *.tfrecord, *.tfrecords) and no images (*.jpg, *.jpeg, *.png, \
         *.webp) under {location}"
    )]
    NoShards { location: String },
    #[error(
        "{location} holds both shards ({shard}) and images ({image}); shardfeed reads one \
         layout per prefix: move the stray file, or point at a prefix holding only one"
    )]
    MixedLayout {
        location: String,
        shard: String,
        image: String,
    },
    #[error("manifest {location}: {message}")]
    Manifest { location: String, message: String },
    #[error("corrupt index {location}: {message}")]
    CorruptIndex { location: String, message: String },
    #[error("shard {location}: {source}")]
    Shard {
        location: String,
        #[source]
        source: ShardError,
    },
    #[error("opening the dataset failed inside the server: {0}")]
    Internal(String),
}

/// Where a dataset's objects and its index lie in its store.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DatasetLocation {
    /// Key prefix of the shards or objects (empty or ending in `/`).
    pub prefix: String,
    /// A manifest object in the prefix that lists the samples.
    pub manifest: Option<String>,
}

impl DatasetLocation {
    pub fn prefix(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            manifest: None,
        }
    }

    /// Where the index files live: `_shardfeed/` beside the shards, or
    /// `_shardfeed/<manifest>/` so that several manifests share a folder.
    pub fn index_root(&self) -> String {
        match &self.manifest {
            Some(manifest) => format!("{}{INDEX_DIR}{manifest}/", self.prefix),
            None => format!("{}{INDEX_DIR}", self.prefix),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    /// Object key relative to the dataset prefix.
    pub name: String,
    pub size: u64,
    pub etag: Option<String>,
    pub samples: u64,
    /// A virtual group of loose objects: a digest of its members' keys,
    /// ETags and labels, so the summary changes when its membership does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// What a dataset's "shards" are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatasetLayout {
    /// Tar or TFRecord shards, read in large sequential ranges.
    #[default]
    Shards,
    /// Loose objects in virtual shards: one GET per sample.
    Objects,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetIndex {
    pub version: u32,
    #[serde(default)]
    pub layout: DatasetLayout,
    pub shards: Vec<ShardEntry>,
    /// Class names, label `i` is `classes[i]`: a loose dataset's class
    /// folders, or the `classes.txt` beside a shard dataset (pack writes it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<String>,
}

impl DatasetIndex {
    /// Names this index's content: a position taken on one index means
    /// nothing on another (a loose listing that gained an object regroups
    /// and renumbers), so resume positions carry it. Frozen hash of the
    /// summary (shards, sizes, ETags, group digests, classes).
    pub fn identity(&self) -> String {
        let summary = serde_json::to_vec(self).unwrap_or_default();
        let digest = crate::hash::fmix64(crate::hash::fnv1a(summary));
        format!(
            "samples={} shards={} digest={digest:016x}",
            self.samples(),
            self.shards.len()
        )
    }

    pub fn samples(&self) -> u64 {
        self.shards.iter().map(|s| s.samples).sum()
    }

    pub fn bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.size).sum()
    }
}

/// Each sample's key and byte range `[starts[i], ends[i])` in one shard.
/// For a group of loose objects, keys are object keys (relative to the
/// prefix), ranges their places in the group, and each has a label and ETag.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ShardIndex {
    pub version: u32,
    pub etag: Option<String>,
    pub keys: Vec<String>,
    pub starts: Vec<u64>,
    pub ends: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub etags: Vec<Option<String>>,
}

pub(crate) fn shard_index_key(root: &str, name: &str) -> String {
    format!("{root}shards/{name}.json")
}

pub(crate) fn summary_key(root: &str) -> String {
    format!("{root}index.json")
}

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
}

#[derive(Debug, Default)]
struct ShardIndexCache {
    map: HashMap<u32, Arc<ShardIndex>>,
    order: VecDeque<u32>,
}

impl Dataset {
    /// Opens the dataset, building the index by a scan when none is stored.
    pub async fn open(
        uri: &str,
        store: Arc<dyn ObjectStore>,
        location: DatasetLocation,
        read: &ReadConfig,
        on_bad_shard: BadShardPolicy,
    ) -> Result<Self, DatasetError> {
        let index_root = location.index_root();
        let summary_key = summary_key(&index_root);
        // `resident`: built here and held whole, so no per-shard file to load.
        let (index, cache, resident) = match get_all(store.as_ref(), &summary_key).await {
            Ok(bytes) => {
                let summary = store.location(&summary_key);
                let index: DatasetIndex = parse_json(&bytes, &summary)?;
                for entry in &index.shards {
                    check_shard_name(&entry.name).map_err(|message| {
                        DatasetError::CorruptIndex {
                            location: summary.clone(),
                            message,
                        }
                    })?;
                }
                (index, ShardIndexCache::default(), false)
            }
            Err(StoreError::NotFound { .. }) => {
                let started = Instant::now();
                let (index, shard_indexes) =
                    build_index(store.clone(), &location, read, on_bad_shard).await?;
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
        })
    }

    /// Memory this dataset's index holds, roughly: the summary and the
    /// per-shard indexes in memory (keys, ranges, labels, ETags).
    pub fn index_bytes(&self) -> u64 {
        let summary: u64 = self
            .index
            .shards
            .iter()
            .map(|s| 64 + s.name.len() as u64 + s.etag.as_ref().map_or(0, |e| e.len() as u64))
            .sum();
        let shards: u64 = self
            .lock_cache()
            .map
            .values()
            .map(|index| {
                let keys: u64 = index.keys.iter().map(|k| 24 + k.len() as u64).sum();
                let etags: u64 = index
                    .etags
                    .iter()
                    .map(|e| 24 + e.as_ref().map_or(0, |e| e.len() as u64))
                    .sum();
                keys + etags
                    + 8 * (index.starts.len() + index.ends.len() + index.labels.len()) as u64
            })
            .sum();
        summary + shards
    }

    pub fn shard_samples(&self) -> Vec<u64> {
        self.index.shards.iter().map(|s| s.samples).collect()
    }

    /// The shard's object key (for a loose dataset, the virtual group's name
    /// under the prefix: a label for logs, not an object).
    pub fn shard_key(&self, shard: u32) -> String {
        format!("{}{}", self.prefix, self.index.shards[shard as usize].name)
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
        if let Some(found) = self.lock_cache().map.get(&shard) {
            return Ok(found.clone());
        }
        let entry = &self.index.shards[shard as usize];
        let key = shard_index_key(&self.index_root, &entry.name);
        let location = self.store.location(&key);
        let bytes = get_all(self.store.as_ref(), &key).await?;
        let loaded: ShardIndex = parse_json(&bytes, &location)?;
        let samples = loaded.keys.len();
        let loose = self.is_loose();
        if samples as u64 != entry.samples
            || loaded.starts.len() != samples
            || loaded.ends.len() != samples
            || (loose && (loaded.labels.len() != samples || loaded.etags.len() != samples))
        {
            return Err(DatasetError::CorruptIndex {
                location,
                message: format!(
                    "expected {} samples{}",
                    entry.samples,
                    if loose { " with labels and ETags" } else { "" }
                ),
            });
        }
        if loose {
            // Object keys come from the file: they must stay under the prefix.
            if let Some(message) = loaded.keys.iter().find_map(|k| check_shard_name(k).err()) {
                return Err(DatasetError::CorruptIndex { location, message });
            }
        }
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

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, ShardIndexCache> {
        self.shard_indexes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A shard name from an index must name an object under the dataset's root:
/// relative, without `.` or `..` segments (so neither a local path nor an
/// HTTP client's dot-segment normalisation leaves the prefix `--allow`
/// admitted).
pub(crate) fn check_shard_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.starts_with('/')
        || name.contains('\\')
        || name
            .split('/')
            .any(|segment| segment.is_empty() || segment == "." || segment == "..")
    {
        return Err(format!(
            "shard name {name:?} does not stay inside the dataset (relative, no `.`/`..` segments)"
        ));
    }
    Ok(())
}

fn parse_json<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    location: &str,
) -> Result<T, DatasetError> {
    serde_json::from_slice(bytes).map_err(|e| DatasetError::CorruptIndex {
        location: location.to_string(),
        message: e.to_string(),
    })
}

pub(crate) fn to_json<T: Serialize>(value: &T) -> Bytes {
    // Plain structs of strings and integers: serialization cannot fail.
    Bytes::from(serde_json::to_vec(value).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_shard_names_stay_inside_the_dataset() {
        assert!(check_shard_name("shard-000001.tar").is_ok());
        assert!(check_shard_name("train/part-1.tar").is_ok());
        for bad in [
            "",
            "/etc/passwd",
            "../other/x.tar",
            "a/../../x.tar",
            "a//b.tar",
            "./a.tar",
            "a\\b.tar",
        ] {
            assert!(check_shard_name(bad).is_err(), "{bad:?} accepted");
        }
    }
}
