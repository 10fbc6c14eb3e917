//! Building a dataset's index: scanning shards once, or turning a listing
//! (or a manifest) of loose objects into virtual shards; writing it beside
//! the shards.

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};

use super::charge::{entry_bytes, shard_index_bytes, FooterBytes, IndexCharge};
use super::format::ShardKind;
use super::index::{
    shard_index_key, summary_key, to_json, DatasetError, DatasetIndex, DatasetLayout,
    DatasetLocation, ShardEntry, ShardIndex, CLASSES_FILE, INDEX_DIR, INDEX_VERSION,
};
use super::{loose, manifest};
use crate::shard::splitter::SampleSplitter;
use crate::shard::{
    BadShardPolicy, SampleLayout, ShardError, ShardFormat, DEFAULT_MAX_MEMBER_BYTES,
};
use crate::store::read::{get_all, read_parts, ReadConfig};
use crate::store::{ObjectStore, StoreError};

/// Bytes an index build may hold in shard parts at once: it runs beside
/// streams, in the quarter of the memory limit the budget leaves to the
/// runtime and indexes (`engine::budget`), so its window is fixed here
/// rather than following the streams' sized part counts.
const INDEX_SCAN_BYTES: u64 = 256 << 20;
/// Shards scanned at once when building an index, at most.
const INDEX_CONCURRENCY: usize = 8;
/// Ranged GETs in flight per shard scan: eight scans already keep sixteen
/// GETs going.
const INDEX_PARTS_IN_FLIGHT: usize = 2;

/// How an index build reads: `(shards at once, read config of each scan)`.
/// A scan holds at most `INDEX_PARTS_IN_FLIGHT + 2` parts (those in flight,
/// the one being parsed, the one being handed over, as a stream's readers),
/// so the build holds at most `max(INDEX_SCAN_BYTES, 4 × part_size)`.
fn index_scan_window(read: &ReadConfig) -> (usize, ReadConfig) {
    let parts = read.parts_per_reader().min(INDEX_PARTS_IN_FLIGHT);
    let per_scan = (parts as u64 + 2).saturating_mul(read.part_size.max(1));
    let scans = ((INDEX_SCAN_BYTES / per_scan) as usize).clamp(1, INDEX_CONCURRENCY);
    let scan = ReadConfig {
        parts_in_flight: parts,
        parts_sized: false,
        ..read.clone()
    };
    (scans, scan)
}
/// Parquet footers read at once when indexing a dataset of Parquet files:
/// each scan holds a 256 KiB tail and one parsed footer, all of them
/// together held to [`super::charge::FOOTER_SCAN_BYTES`].
const FOOTER_SCANS: usize = 64;
/// HEADs in flight for a listing without ETags (small requests: latency-bound).
const HEAD_CONCURRENCY: usize = 32;

/// Builds the index of the dataset at `location`: lists the shards under
/// its prefix and scans each once; without shards, the listing of its
/// images (or of its manifest's objects) is the index.
pub async fn build_index(
    store: Arc<dyn ObjectStore>,
    location: &DatasetLocation,
    read: &ReadConfig,
    on_bad_shard: BadShardPolicy,
) -> Result<(DatasetIndex, Vec<ShardIndex>), DatasetError> {
    build_index_reporting(store, location, read, on_bad_shard, u64::MAX, &|_| {}).await
}

/// Progress of an index build: shards scanned of all, and their bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct IndexProgress {
    pub shards_done: u64,
    pub shards: u64,
    pub bytes_done: u64,
    pub bytes: u64,
}

/// [`build_index`], calling `progress` as each shard's scan ends (the
/// listing of loose objects, read in one go, reports nothing), and refusing
/// an index that would hold more than `max_index_bytes` ([`IndexCharge`]).
pub async fn build_index_reporting(
    store: Arc<dyn ObjectStore>,
    location: &DatasetLocation,
    read: &ReadConfig,
    on_bad_shard: BadShardPolicy,
    max_index_bytes: u64,
    progress: &(dyn Fn(IndexProgress) + Send + Sync),
) -> Result<(DatasetIndex, Vec<ShardIndex>), DatasetError> {
    let prefix = location.prefix.as_str();
    if let Some(manifest) = &location.manifest {
        return manifest_index(&store, prefix, manifest).await;
    }
    let mut objects = store.list(prefix).await?;
    versions_from_head(&store, prefix, &mut objects).await?;
    let shards: Vec<_> = objects
        .iter()
        .filter(|o| {
            ShardFormat::from_name(&o.key).is_some()
                && !o.key[prefix.len()..].starts_with(INDEX_DIR)
        })
        .cloned()
        .collect();
    let (images, classes) = loose::from_class_folders(&objects, prefix);
    if let (Some(shard), Some(image)) = (shards.first(), images.first()) {
        return Err(DatasetError::MixedLayout {
            location: store.location(prefix),
            shard: shard.key.clone(),
            image: format!("{prefix}{}", image.key),
        });
    }
    if shards.is_empty() {
        if images.is_empty() {
            return Err(DatasetError::NoShards {
                location: store.location(prefix),
            });
        }
        let empty = loose::empty_classes(&images, &classes);
        if !empty.is_empty() {
            tracing::warn!(
                dataset = %store.location(prefix),
                classes = ?empty,
                "class folders with no images keep their labels, so the others do not shift"
            );
        }
        return Ok(loose_index(images, classes));
    }
    drop(images);
    let classes_key = format!("{prefix}{CLASSES_FILE}");
    let classes = match objects.iter().any(|o| o.key == classes_key) {
        true => read_classes(store.as_ref(), &classes_key).await?,
        false => Vec::new(),
    };
    drop(objects);
    let charge = IndexCharge::new(store.location(prefix), max_index_bytes);
    let scans = scan_every_object(
        &store,
        shards,
        prefix,
        (read, on_bad_shard),
        &charge,
        progress,
    )
    .await?;
    Ok(merged(scans, classes))
}

/// Scans every shard, several at once, each charging what it keeps to
/// `charge`; `progress` is told as each scan ends.
async fn scan_every_object(
    store: &Arc<dyn ObjectStore>,
    shards: Vec<crate::store::ObjectMeta>,
    prefix: &str,
    (read, on_bad_shard): (&ReadConfig, BadShardPolicy),
    charge: &Arc<IndexCharge>,
    progress: &(dyn Fn(IndexProgress) + Send + Sync),
) -> Result<Vec<Scanned>, DatasetError> {
    let mut done = IndexProgress {
        shards: shards.len() as u64,
        bytes: shards.iter().map(|s| s.size).sum(),
        ..IndexProgress::default()
    };
    progress(done);
    let (concurrent_scans, scan_read) = index_scan_window(read);
    // A Parquet file's scan is one small GET of its tail (FOOTER_SCANS of
    // them hold ~16 MiB): latency-bound, so many run at once.
    let concurrent_scans = if shards
        .iter()
        .all(|o| ShardFormat::from_name(&o.key) == Some(ShardFormat::Parquet))
    {
        FOOTER_SCANS
    } else {
        concurrent_scans
    };
    let footers = FooterBytes::default();
    futures::stream::iter(shards.into_iter().map(|object| {
        let name = object.key[prefix.len()..].to_string();
        let scan = ScanOf {
            store: store.clone(),
            read: scan_read.clone(),
            on_bad_shard,
            footers: footers.clone(),
            charge: charge.clone(),
        };
        async move {
            let scanned = scan.object(&object, name).await?;
            Ok::<_, DatasetError>((object.size, scanned))
        }
    }))
    .buffered(concurrent_scans)
    .map_ok(|(size, scanned)| {
        done.shards_done += 1;
        done.bytes_done += size;
        progress(done);
        scanned
    })
    .try_collect()
    .await
}

/// What one object's scan is given.
struct ScanOf {
    store: Arc<dyn ObjectStore>,
    read: ReadConfig,
    on_bad_shard: BadShardPolicy,
    footers: FooterBytes,
    charge: Arc<IndexCharge>,
}

impl ScanOf {
    /// A Parquet file's row groups from its footer, or a tar or TFRecord
    /// shard's samples from its bytes.
    async fn object(
        self,
        object: &crate::store::ObjectMeta,
        name: String,
    ) -> Result<Scanned, DatasetError> {
        if ShardFormat::from_name(&object.key) == Some(ShardFormat::Parquet) {
            // Planned from the footer: no byte of row data is read.
            let file = super::parquet::scan_file(
                self.store.as_ref(),
                object,
                name,
                (&self.footers, &self.charge),
            )
            .await?;
            return Ok(Scanned {
                indexes: vec![ShardIndex::default(); file.entries.len()],
                entries: file.entries,
                classes: file.classes,
                label_names: file.label_names,
            });
        }
        let index = scan_shard(
            self.store,
            &object.key,
            object.size,
            object.etag.clone(),
            self.read,
            self.on_bad_shard,
        )
        .await?;
        self.charge.charge(
            1,
            entry_bytes(&name, object.etag.as_deref()) + shard_index_bytes(&index),
        )?;
        let entry = ShardEntry {
            name,
            size: object.size,
            etag: object.etag.clone(),
            samples: index.keys.len() as u64,
            kind: ShardKind::streamed(&object.key).unwrap_or(ShardKind::Streamed(ShardFormat::Tar)),
        };
        Ok(Scanned {
            entries: vec![entry],
            indexes: vec![index],
            classes: Vec::new(),
            label_names: Default::default(),
        })
    }
}

/// The scans' entries and indexes in listing order, and the dataset's
/// classes: a `classes.txt` beside the files wins over their own metadata;
/// else the first file that names its classes names them; else string
/// labels are their own classes, in sorted order.
fn merged(scans: Vec<Scanned>, mut classes: Vec<String>) -> (DatasetIndex, Vec<ShardIndex>) {
    let mut entries = Vec::with_capacity(scans.len());
    let mut indexes = Vec::with_capacity(scans.len());
    let mut label_names = std::collections::BTreeSet::new();
    for scanned in scans {
        if classes.is_empty() {
            classes = scanned.classes;
        }
        label_names.extend(scanned.label_names);
        entries.extend(scanned.entries);
        indexes.extend(scanned.indexes);
    }
    if classes.is_empty() {
        classes = label_names.into_iter().collect();
    }
    (
        DatasetIndex {
            version: INDEX_VERSION,
            layout: DatasetLayout::Shards,
            shards: entries,
            classes,
        },
        indexes,
    )
}

/// What scanning one object gave: a tar or TFRecord shard's entry and
/// index, or a Parquet file's row groups (their indexes empty: each is
/// made from its entry when read) and class names.
struct Scanned {
    entries: Vec<ShardEntry>,
    indexes: Vec<ShardIndex>,
    classes: Vec<String>,
    label_names: std::collections::BTreeSet<String>,
}

/// Objects whose listing named no version (some S3-compatible servers'
/// ListObjectsV2 carries no ETags) are asked with HEAD: the ETag is what
/// tells a changed object from the one whose samples the decoded-source
/// tier and the disk cache keep. One that HEAD does not version either
/// stays without (the tier then keeps none of its samples, and says so).
async fn versions_from_head(
    store: &Arc<dyn ObjectStore>,
    prefix: &str,
    objects: &mut [crate::store::ObjectMeta],
) -> Result<(), DatasetError> {
    let unversioned: Vec<(usize, String)> = objects
        .iter()
        .enumerate()
        .filter(|(_, o)| o.etag.is_none() && !o.key[prefix.len()..].starts_with(INDEX_DIR))
        .map(|(i, o)| (i, o.key.clone()))
        .collect();
    if unversioned.is_empty() {
        return Ok(());
    }
    tracing::info!(
        dataset = %store.location(prefix),
        objects = unversioned.len(),
        "the listing names no ETags: asking each object with HEAD"
    );
    let heads = futures::stream::iter(unversioned.into_iter().map(|(i, key)| {
        let store = store.clone();
        async move { store.head(&key).await.map(|meta| (i, meta.etag)) }
    }))
    .buffer_unordered(HEAD_CONCURRENCY)
    .try_collect::<Vec<_>>()
    .await?;
    for (i, etag) in heads {
        objects[i].etag = etag;
    }
    Ok(())
}

/// The class names of a `classes.txt`, one per line (a trailing newline
/// ends the last, it does not add an empty class).
async fn read_classes(store: &dyn ObjectStore, key: &str) -> Result<Vec<String>, DatasetError> {
    let bytes = get_all(store, key, super::index::MAX_CLASSES_BYTES).await?;
    Ok(parse_classes(&bytes))
}

/// `classes.txt`'s names: lines, lossily UTF-8, a CR before a newline
/// dropped.
pub fn parse_classes(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .map(|line| line.trim_end_matches('\r').to_string())
        .collect()
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
    store: &Arc<dyn ObjectStore>,
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
    let bytes = get_all(store.as_ref(), &key, loose::MAX_MANIFEST_BYTES).await?;
    let name = manifest.to_string();
    // A 1 GiB manifest takes seconds to parse: not on the async runtime.
    let parsed = tokio::task::spawn_blocking(move || manifest::parse_manifest(&name, &bytes))
        .await
        .map_err(|e| DatasetError::Internal(format!("parsing the manifest failed: {e}")))?
        .map_err(&refuse)?;
    let mut objects = store.list(prefix).await?;
    versions_from_head(store, prefix, &mut objects).await?;
    let listed = loose::from_manifest(parsed.entries, &objects, prefix).map_err(refuse)?;
    Ok(loose_index(listed, parsed.classes))
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
    let mut splitter =
        SampleSplitter::for_format(format, 0, 0, DEFAULT_MAX_MEMBER_BYTES, layout).frames_only();
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
        if entry.indexes_itself() {
            // Its index is its entry (a row group's).
            continue;
        }
        store
            .put(&shard_index_key(&root, &entry.name), to_json(shard))
            .await?;
    }
    store.put(&summary_key(&root), to_json(index)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row group's index is its entry: writing the index asks whether an
    /// entry makes its own index without making it (this group claims 2^40
    /// rows, terabytes of keys were they made).
    #[test]
    fn writing_the_index_makes_no_row_group_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::local::LocalStore::new(dir.path());
        let group = super::super::format::RowGroupRef {
            group: 0,
            first_row: 0,
            offset: 4,
            uncompressed: 10,
            file_size: 100,
        };
        let index = DatasetIndex {
            version: INDEX_VERSION,
            layout: DatasetLayout::Shards,
            shards: vec![ShardEntry {
                name: "a.parquet".into(),
                size: 10,
                etag: None,
                samples: 1 << 40,
                kind: ShardKind::RowGroup(group),
            }],
            classes: Vec::new(),
        };
        let written = tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(write_index(
                &store,
                &DatasetLocation::prefix(""),
                &index,
                &[ShardIndex::default()],
            ));
        written.unwrap();
        assert!(index.shards[0].indexes_itself());
    }

    fn read(part_size: u64, flag: Option<usize>) -> ReadConfig {
        ReadConfig {
            part_size,
            parts_in_flight: flag.unwrap_or(2),
            parts_sized: flag.is_none(),
            ..ReadConfig::default()
        }
    }

    #[test]
    fn an_index_build_holds_its_stated_bytes_whatever_the_streams_read_with() {
        // Streams keep 4 sized parts of 8 MiB; a scan keeps 2, eight at once.
        let (scans, scan) = index_scan_window(&ReadConfig::default());
        assert_eq!((scans, scan.parts_per_reader()), (8, 2));
        // Large parts: fewer scans, never none.
        assert_eq!(index_scan_window(&read(32 << 20, None)).0, 2);
        assert_eq!(index_scan_window(&read(64 << 20, Some(16))).0, 1);
        // A flag below the scan's window lowers it.
        assert_eq!(
            index_scan_window(&read(8 << 20, Some(1)))
                .1
                .parts_per_reader(),
            1
        );
        for part_size in [
            64 << 10,
            1 << 20,
            5 << 20,
            8 << 20,
            48 << 20,
            64 << 20,
            1 << 30,
        ] {
            for flag in [None, Some(1), Some(2), Some(16), Some(64)] {
                let (scans, scan) = index_scan_window(&read(part_size, flag));
                let held = scans as u64 * (scan.parts_per_reader() as u64 + 2) * part_size;
                assert!(
                    held <= INDEX_SCAN_BYTES.max(4 * part_size),
                    "{part_size} B parts, flag {flag:?}: {held} B"
                );
            }
        }
    }
}
