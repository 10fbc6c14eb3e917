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
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::OnceCell;

pub mod loose;

use crate::shard::{
    BadShardPolicy, SampleLayout, SampleSplitter, ShardError, ShardFormat, DEFAULT_MAX_MEMBER_BYTES,
};
use crate::store::cache::{CacheStore, DiskCache};
use crate::store::local::LocalStore;
use crate::store::read::{get_all, read_parts, ReadConfig};
use crate::store::retry::{RetryPolicy, RetryingStore};
use crate::store::s3::{S3Config, S3Store};
use crate::store::throttle::{RequestLimiter, DEFAULT_INITIAL_LIMIT};
use crate::store::{ObjectMeta, ObjectStore, StoreError};

pub const INDEX_DIR: &str = "_shardfeed/";
pub const INDEX_VERSION: u32 = 1;
/// Shards scanned at once when building an index.
const INDEX_CONCURRENCY: usize = 8;
/// Per-shard indexes kept in memory when loaded lazily.
const SHARD_INDEX_CACHE: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatasetUri {
    /// `manifest`: the URI named a manifest object (`*.csv`, `*.jsonl`) in
    /// the folder `prefix` rather than the folder itself.
    S3 {
        bucket: String,
        prefix: String,
        manifest: Option<String>,
    },
    Local {
        root: PathBuf,
        manifest: Option<String>,
    },
}

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

impl DatasetUri {
    pub fn parse(uri: &str) -> Result<Self, DatasetError> {
        let invalid = |reason| DatasetError::InvalidUri {
            uri: uri.to_string(),
            reason,
        };
        if let Some(rest) = uri.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(invalid(
                    "missing bucket name (expected s3://bucket/prefix/)",
                ));
            }
            let (prefix, manifest) = split_manifest(prefix);
            let mut prefix = prefix.to_string();
            if !prefix.is_empty() && !prefix.ends_with('/') {
                prefix.push('/');
            }
            Ok(Self::S3 {
                bucket: bucket.to_string(),
                prefix,
                manifest,
            })
        } else if let Some(path) = uri.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(invalid(
                    "file URIs need an absolute path (file:///abs/dir/)",
                ));
            }
            // `..` would escape an --allow prefix.
            if path.split('/').any(|segment| segment == "..") {
                return Err(invalid("file URIs may not contain `..`"));
            }
            let (root, manifest) = split_manifest(path);
            Ok(Self::Local {
                root: PathBuf::from(if root.is_empty() { "/" } else { root }),
                manifest,
            })
        } else if uri.is_empty() {
            Err(invalid("dataset is empty"))
        } else {
            Err(invalid("expected s3://bucket/prefix/ or file:///abs/dir/"))
        }
    }

    /// The manifest object the URI names, if it names one.
    pub fn manifest(&self) -> Option<&str> {
        match self {
            Self::S3 { manifest, .. } | Self::Local { manifest, .. } => manifest.as_deref(),
        }
    }
}

/// `folder/`, `Some(name)` when the path's last segment names a manifest.
fn split_manifest(path: &str) -> (&str, Option<String>) {
    match path.rsplit_once('/') {
        Some((folder, name)) if loose::is_manifest_name(name) => (folder, Some(name.to_string())),
        None if loose::is_manifest_name(path) => ("", Some(path.to_string())),
        _ => (path, None),
    }
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
    /// Class folder names of a loose dataset: label `i` is `classes[i]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<String>,
}

impl DatasetIndex {
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

fn shard_index_key(root: &str, name: &str) -> String {
    format!("{root}shards/{name}.json")
}

fn summary_key(root: &str) -> String {
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
fn check_shard_name(name: &str) -> Result<(), String> {
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

/// Builds the index of the dataset at `location`: lists the shards under
/// its prefix and scans each once; without shards, the listing of its
/// images (or of its manifest's objects) is the index.
pub async fn build_index(
    store: Arc<dyn ObjectStore>,
    location: &DatasetLocation,
    read: &ReadConfig,
    on_bad_shard: BadShardPolicy,
) -> Result<(DatasetIndex, Vec<ShardIndex>), DatasetError> {
    let prefix = location.prefix.as_str();
    if let Some(manifest) = &location.manifest {
        return manifest_index(store.as_ref(), prefix, manifest).await;
    }
    let objects = store.list(prefix).await?;
    let shards: Vec<_> = objects
        .iter()
        .filter(|o| {
            ShardFormat::from_name(&o.key).is_some()
                && !o.key[prefix.len()..].starts_with(INDEX_DIR)
        })
        .cloned()
        .collect();
    if shards.is_empty() {
        let (images, classes) = loose::from_class_folders(&objects, prefix);
        if images.is_empty() {
            return Err(DatasetError::NoShards {
                location: store.location(prefix),
            });
        }
        return Ok(loose_index(images, classes));
    }
    drop(objects);
    let scans = futures::stream::iter(shards.into_iter().map(|object| {
        let store = store.clone();
        let read = read.clone();
        async move {
            let index = scan_shard(
                store,
                &object.key,
                object.size,
                object.etag.clone(),
                read,
                on_bad_shard,
            )
            .await?;
            Ok::<_, DatasetError>((object, index))
        }
    }))
    .buffered(INDEX_CONCURRENCY)
    .try_collect::<Vec<_>>()
    .await?;
    let mut entries = Vec::with_capacity(scans.len());
    let mut indexes = Vec::with_capacity(scans.len());
    for (object, index) in scans {
        entries.push(ShardEntry {
            name: object.key[prefix.len()..].to_string(),
            size: object.size,
            etag: object.etag,
            samples: index.keys.len() as u64,
        });
        indexes.push(index);
    }
    Ok((
        DatasetIndex {
            version: INDEX_VERSION,
            layout: DatasetLayout::Shards,
            shards: entries,
            classes: Vec::new(),
        },
        indexes,
    ))
}

fn loose_index(
    objects: Vec<loose::LooseObject>,
    classes: Vec<String>,
) -> (DatasetIndex, Vec<ShardIndex>) {
    let (shards, indexes) = loose::group(objects);
    let index = DatasetIndex {
        version: INDEX_VERSION,
        layout: DatasetLayout::Objects,
        shards,
        classes,
    };
    (index, indexes)
}

/// The index of the objects a manifest lists, checked against the listing
/// of its folder (sizes, ETags, and that each one exists).
async fn manifest_index(
    store: &dyn ObjectStore,
    prefix: &str,
    manifest: &str,
) -> Result<(DatasetIndex, Vec<ShardIndex>), DatasetError> {
    let key = format!("{prefix}{manifest}");
    let location = store.location(&key);
    let refuse = |message: String| DatasetError::Manifest {
        location: location.clone(),
        message,
    };
    let meta = store.head(&key).await?;
    if meta.size > loose::MAX_MANIFEST_BYTES {
        return Err(refuse(format!(
            "{} bytes; manifests of up to {} bytes are read",
            meta.size,
            loose::MAX_MANIFEST_BYTES
        )));
    }
    let bytes = get_all(store, &key).await?;
    let entries = loose::parse_manifest(manifest, &bytes).map_err(&refuse)?;
    drop(bytes);
    let objects = store.list(prefix).await?;
    let listed = loose::from_manifest(entries, &objects, prefix).map_err(refuse)?;
    Ok(loose_index(listed, Vec::new()))
}

async fn scan_shard(
    store: Arc<dyn ObjectStore>,
    key: &str,
    size: u64,
    etag: Option<String>,
    read: ReadConfig,
    on_bad_shard: BadShardPolicy,
) -> Result<ShardIndex, DatasetError> {
    let location = store.location(key);
    let mut index = ShardIndex {
        version: INDEX_VERSION,
        etag: etag.clone(),
        ..ShardIndex::default()
    };
    match scan_into(&mut index, store, key, size, etag, read).await {
        Ok(()) => Ok(index),
        Err(ScanError::Shard(source)) if on_bad_shard == BadShardPolicy::Skip => {
            // The samples before the damage are whole (a sample is only
            // emitted once the next one starts): keep them.
            crate::metrics::bad_shard();
            tracing::warn!(
                shard = %location,
                error = %source,
                kept = index.keys.len(),
                "indexing a damaged shard: kept the samples before the damage (--on-bad-shard skip)"
            );
            Ok(index)
        }
        Err(ScanError::Shard(source)) => Err(DatasetError::Shard { location, source }),
        Err(ScanError::Store(error)) => Err(error.into()),
    }
}

enum ScanError {
    Shard(ShardError),
    Store(StoreError),
}

async fn scan_into(
    index: &mut ShardIndex,
    store: Arc<dyn ObjectStore>,
    key: &str,
    size: u64,
    etag: Option<String>,
    read: ReadConfig,
) -> Result<(), ScanError> {
    let format = ShardFormat::from_name(key).unwrap_or(ShardFormat::Tar);
    // Only keys and ranges are kept: the default layout reads nothing more.
    let layout = Arc::new(SampleLayout::default());
    let mut splitter = SampleSplitter::for_format(format, 0, 0, DEFAULT_MAX_MEMBER_BYTES, layout);
    let mut parts = std::pin::pin!(read_parts(store, key.to_string(), 0..size, etag, &read));
    while let Some(part) = parts.next().await {
        let (_, bytes) = part.map_err(ScanError::Store)?;
        splitter.push(&bytes);
        while let Some(sample) = splitter.next_sample().map_err(ScanError::Shard)? {
            index.keys.push(sample.key);
            index.starts.push(sample.start);
            index.ends.push(sample.end);
        }
    }
    while let Some(sample) = splitter.finish().map_err(ScanError::Shard)? {
        index.keys.push(sample.key);
        index.starts.push(sample.start);
        index.ends.push(sample.end);
    }
    Ok(())
}

/// The index of a whole shard held in memory (as `shardfeed pack` writes it):
/// the same parse as a scan, so the two always agree.
pub fn index_shard_bytes(tar: &[u8], etag: Option<String>) -> Result<ShardIndex, ShardError> {
    let mut splitter = SampleSplitter::new(0, DEFAULT_MAX_MEMBER_BYTES);
    splitter.push(tar);
    let mut index = ShardIndex {
        version: INDEX_VERSION,
        etag,
        ..ShardIndex::default()
    };
    loop {
        let sample = match splitter.next_sample()? {
            Some(sample) => Some(sample),
            None => splitter.finish()?,
        };
        let Some(sample) = sample else { break };
        index.keys.push(sample.key);
        index.starts.push(sample.start);
        index.ends.push(sample.end);
    }
    Ok(index)
}

/// Writes the index beside the shards (see [`DatasetLocation::index_root`]).
pub async fn write_index(
    store: &dyn ObjectStore,
    location: &DatasetLocation,
    index: &DatasetIndex,
    shard_indexes: &[ShardIndex],
) -> Result<(), DatasetError> {
    let root = location.index_root();
    // Per-shard files first: a reader that finds the summary finds them too.
    for (entry, shard) in index.shards.iter().zip(shard_indexes) {
        store
            .put(&shard_index_key(&root, &entry.name), to_json(shard))
            .await?;
    }
    store.put(&summary_key(&root), to_json(index)).await?;
    Ok(())
}

fn to_json<T: Serialize>(value: &T) -> Bytes {
    // Plain structs of strings and integers: serialization cannot fail.
    Bytes::from(serde_json::to_vec(value).unwrap_or_default())
}

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

    #[test]
    fn parses_uris() {
        assert_eq!(
            DatasetUri::parse("s3://b/train").unwrap(),
            DatasetUri::S3 {
                bucket: "b".into(),
                prefix: "train/".into(),
                manifest: None,
            }
        );
        assert_eq!(
            DatasetUri::parse("s3://b").unwrap(),
            DatasetUri::S3 {
                bucket: "b".into(),
                prefix: String::new(),
                manifest: None,
            }
        );
        assert_eq!(
            DatasetUri::parse("s3://b/images/train.csv").unwrap(),
            DatasetUri::S3 {
                bucket: "b".into(),
                prefix: "images/".into(),
                manifest: Some("train.csv".into()),
            }
        );
        assert_eq!(
            DatasetUri::parse("s3://b/val.JSONL").unwrap().manifest(),
            Some("val.JSONL")
        );
        assert_eq!(
            DatasetUri::parse("file:///data/m.csv").unwrap(),
            DatasetUri::Local {
                root: "/data".into(),
                manifest: Some("m.csv".into()),
            }
        );
        assert!(DatasetUri::parse("s3:///x").is_err());
        assert!(DatasetUri::parse("file://relative").is_err());
        assert!(DatasetUri::parse("http://x").is_err());
        assert!(DatasetUri::parse("file:///data/../etc/").is_err());
        assert!(matches!(
            DatasetUri::parse("file:///data/").unwrap(),
            DatasetUri::Local { .. }
        ));
    }
}
