//! Building a dataset's index: scanning shards once (each format by its
//! scan, [`super::scan`]), or turning a listing
//! (or a manifest) of loose objects into virtual shards; writing it beside
//! the shards.

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};

use super::charge::IndexCharge;
use super::index::{
    shard_index_key, summary_key, to_json, DatasetError, DatasetIndex, DatasetLayout,
    DatasetLocation, ShardIndex, CLASSES_FILE, INDEX_DIR, INDEX_VERSION,
};
use super::scan::{scan_every_object, IndexProgress, Listed, Scanned};
use super::{loose, manifest};
use crate::shard::{BadShardPolicy, ShardFormat};
use crate::store::read::{get_all, ReadConfig};
use crate::store::ObjectStore;

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
    let shards: Vec<Listed> = objects
        .iter()
        .filter(|o| !o.key[prefix.len()..].starts_with(INDEX_DIR))
        .filter_map(|o| {
            let format = ShardFormat::from_name(&o.key)?;
            Some(Listed {
                object: o.clone(),
                format,
            })
        })
        .collect();
    let (images, classes) = loose::from_class_folders(&objects, prefix);
    if let (Some(shard), Some(image)) = (shards.first(), images.first()) {
        return Err(DatasetError::MixedLayout {
            location: store.location(prefix),
            shard: shard.object.key.clone(),
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
    use super::super::format::{RowGroupRef, ShardKind};
    use super::super::index::ShardEntry;
    use super::*;

    /// A row group's index is its entry: writing the index asks whether an
    /// entry makes its own index without making it (this group claims 2^40
    /// rows, terabytes of keys were they made).
    #[test]
    fn writing_the_index_makes_no_row_group_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::local::LocalStore::new(dir.path());
        let group = RowGroupRef {
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
}
