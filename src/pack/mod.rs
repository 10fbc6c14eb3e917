//! `shardfeed pack`: turns a folder of images into WebDataset tar shards and
//! their index, in S3 or a local directory.
//!
//! Sources: the ImageFolder layout (one directory per class; labels are the
//! indexes of the sorted class names) or any folder with a manifest (CSV or
//! JSONL of `path,label`; labels are integers, or class names indexed in
//! sorted order); a folder of TFRecord files; or a loose-object dataset in a
//! store (class folders or a manifest under an `s3://` prefix, as the server
//! reads them), fetched `object_requests_in_flight` at a time. Class names go
//! to `classes.txt` beside the shards.
//!
//! Packing is a pure function of the files and the seed: samples are shuffled
//! across shards (so a shard is not one class), shard boundaries follow the
//! files' sizes, and tar headers carry no times, so the same input and seed
//! give the same bytes. Files that cannot be read, are not JPEG/PNG/WebP, or
//! exceed the member limit are reported and skipped. Shards are written
//! first, then their index, the summary last: a reader (which starts from the
//! summary) never sees a half-packed dataset, and an interrupted pack is
//! simply run again.
//!
//! Memory: at most `SHARDS_IN_FLIGHT + 1` shards (each about the target
//! size) are held at once: one being read, the others uploading.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt;
use rayon::prelude::*;

use crate::dataset::{index_shard_bytes, write_index, Dataset, DatasetIndex, ShardEntry};
use crate::dataset::{DatasetLayout, DatasetLocation, ShardIndex, ShardKind, INDEX_VERSION};
use crate::plan::rng::Rng;
use crate::shard::tar::TarWriter;
use crate::shard::{ImageFormat, StreamedFormat, DEFAULT_MAX_MEMBER_BYTES};
use crate::store::read::read_object;
use crate::store::{ObjectStore, StoreError};
use folder::{list_inputs, read_record_image};
use input::{sample_key, unique_key, Input, Listing};

mod error;
mod folder;
mod input;

pub use error::PackError;
pub use input::Skipped;

/// S3 reads fastest in objects of 100 MB to 1 GB.
pub const DEFAULT_SHARD_BYTES: u64 = 256_000_000;
/// Shards being uploaded while the next one is read.
const SHARDS_IN_FLIGHT: usize = 2;
pub use crate::dataset::CLASSES_FILE;
// Keys the shuffle of the pack order apart from the plan's streams.
const PURPOSE_PACK_ORDER: u64 = 0x5041_434B;

/// What to pack.
#[derive(Debug, Clone)]
pub enum PackSource {
    /// A local folder: ImageFolder, any layout with a manifest, or TFRecords.
    Folder(PathBuf),
    /// An opened loose-object dataset (e.g. `s3://bucket/images/`).
    Objects(Arc<Dataset>),
}

impl PackSource {
    fn describe(&self) -> String {
        match self {
            Self::Folder(path) => path.display().to_string(),
            Self::Objects(dataset) => dataset.uri.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct PackConfig {
    pub source: PackSource,
    /// A CSV or JSONL manifest of `path,label` (paths relative to `source`);
    /// `None`: the ImageFolder layout.
    pub manifest: Option<PathBuf>,
    /// Shards close before they would exceed this many bytes.
    pub shard_bytes: u64,
    pub seed: u64,
    /// GETs in flight when the source is loose objects in a store.
    pub object_requests_in_flight: usize,
}

#[derive(Debug, Clone, Default)]
pub struct PackReport {
    pub shards: usize,
    pub samples: u64,
    /// Bytes of shards written.
    pub bytes: u64,
    pub seconds: f64,
    /// Class names (empty when the labels were integers).
    pub classes: Vec<String>,
    pub skipped: Vec<Skipped>,
}

/// Progress after each shard: samples and input bytes done, and the totals.
#[derive(Debug, Clone, Copy)]
pub struct PackProgress {
    pub files_done: usize,
    pub files: usize,
    pub bytes_done: u64,
    pub bytes: u64,
    pub shards_done: usize,
}

/// Packs `config.source` into shards under `prefix` of `store`.
pub async fn pack(
    config: &PackConfig,
    store: Arc<dyn ObjectStore>,
    prefix: &str,
    mut progress: impl FnMut(PackProgress),
) -> Result<PackReport, PackError> {
    let started = Instant::now();
    let (inputs, classes, mut skipped) = match &config.source {
        PackSource::Folder(source) => {
            let (source, manifest) = (source.clone(), config.manifest.clone());
            tokio::task::spawn_blocking(move || list_inputs(&source, manifest.as_deref()))
                .await
                .map_err(|e| PackError::Layout(format!("listing the source failed: {e}")))??
        }
        PackSource::Objects(dataset) => object_inputs(dataset).await?,
    };
    if inputs.is_empty() {
        return Err(PackError::Layout(format!(
            "no files to pack under {}",
            config.source.describe()
        )));
    }
    let shards = assign_shards(shuffled(inputs, config.seed), config.shard_bytes);
    let files: usize = shards.iter().map(Vec::len).sum();
    let bytes: u64 = shards.iter().flatten().map(|i| i.size).sum();
    let mut done = PackProgress {
        files_done: 0,
        files,
        bytes_done: 0,
        bytes,
        shards_done: 0,
    };
    progress(done);

    let total_shards = shards.len();
    let uploads = futures::stream::iter(shards.into_iter().enumerate())
        .map(|(number, inputs)| {
            let source = match &config.source {
                PackSource::Objects(dataset) => Some(dataset.store.clone()),
                PackSource::Folder(_) => None,
            };
            let name = shard_name(number, total_shards);
            let to = (store.clone(), format!("{prefix}{name}"), name);
            pack_shard(to, inputs, source, config.object_requests_in_flight)
        })
        .buffered(SHARDS_IN_FLIGHT);
    let mut uploads = std::pin::pin!(uploads);
    let mut entries: Vec<ShardEntry> = Vec::new();
    let mut indexes: Vec<ShardIndex> = Vec::new();
    let mut labels_written = BTreeSet::new();
    while let Some(packed) = uploads.next().await {
        let packed = packed?;
        skipped.extend(packed.skipped);
        labels_written.extend(packed.labels);
        if let Some((entry, index)) = packed.written {
            entries.push(entry);
            indexes.push(index);
        }
        done.files_done += packed.files;
        done.bytes_done += packed.bytes;
        done.shards_done += 1;
        progress(done);
    }
    if entries.is_empty() {
        return Err(PackError::Layout(format!(
            "none of the {files} files under {} is a readable image",
            config.source.describe()
        )));
    }
    skipped.extend(empty_classes(&classes, &labels_written));
    let index = write_dataset(store.as_ref(), prefix, &classes, entries, &indexes).await?;
    skipped.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(PackReport {
        shards: index.shards.len(),
        samples: index.samples(),
        bytes: index.bytes(),
        seconds: started.elapsed().as_secs_f64(),
        classes,
        skipped,
    })
}

/// One shard packed: its entry and index when it holds a readable image,
/// what was skipped, the labels it holds, and the inputs it covered.
struct PackedShard {
    written: Option<(ShardEntry, ShardIndex)>,
    skipped: Vec<Skipped>,
    labels: BTreeSet<i64>,
    files: usize,
    bytes: u64,
}

/// Fetches a shard's inputs (loose objects; a folder's are read while
/// building), builds its tar off the runtime, uploads it to `key` and
/// indexes what was uploaded.
async fn pack_shard(
    (store, key, name): (Arc<dyn ObjectStore>, String, String),
    inputs: Vec<Input>,
    source: Option<Arc<dyn ObjectStore>>,
    requests_in_flight: usize,
) -> Result<PackedShard, PackError> {
    let bytes: u64 = inputs.iter().map(|i| i.size).sum();
    let files = inputs.len();
    let fetched = match source {
        Some(source) => fetch_objects(source, &inputs, requests_in_flight).await?,
        None => Vec::new(),
    };
    let built = tokio::task::spawn_blocking(move || build_shard(&inputs, fetched))
        .await
        .map_err(|e| PackError::Layout(format!("building {name} failed: {e}")))?;
    let written = match &built.tar {
        Some(tar) => {
            store.put(&key, tar.clone()).await?;
            let etag = store.head(&key).await?.etag;
            let index = index_shard_bytes(tar, etag.clone())?;
            let entry = ShardEntry {
                name,
                size: tar.len() as u64,
                etag,
                samples: index.keys.len() as u64,
                kind: ShardKind::Streamed(StreamedFormat::Tar),
            };
            Some((entry, index))
        }
        None => None,
    };
    Ok(PackedShard {
        written,
        skipped: built.skipped,
        labels: built.labels,
        files,
        bytes,
    })
}

/// An empty class keeps its label, so the others do not shift: each is
/// reported with the files skipped.
fn empty_classes(classes: &[String], labels_written: &BTreeSet<i64>) -> Vec<Skipped> {
    classes
        .iter()
        .enumerate()
        .filter(|(label, _)| !labels_written.contains(&(*label as i64)))
        .map(|(label, class)| Skipped {
            path: PathBuf::from(class),
            reason: format!(
                "class {label} has no usable images; it keeps its label and \
                 classes.txt line, so the other labels do not shift"
            ),
        })
        .collect()
}

/// `classes.txt`, the per-shard index files, then the summary: the dataset
/// appears whole or not at all.
async fn write_dataset(
    store: &dyn ObjectStore,
    prefix: &str,
    classes: &[String],
    entries: Vec<ShardEntry>,
    indexes: &[ShardIndex],
) -> Result<DatasetIndex, PackError> {
    if !classes.is_empty() {
        let mut text = classes.join("\n");
        text.push('\n');
        store
            .put(&format!("{prefix}{CLASSES_FILE}"), Bytes::from(text))
            .await?;
    }
    let index = DatasetIndex {
        version: INDEX_VERSION,
        layout: DatasetLayout::Shards,
        shards: entries,
        // Also in classes.txt, which `shardfeed index` reads back.
        classes: classes.to_vec(),
    };
    let location = DatasetLocation::prefix(prefix);
    write_index(store, &location, &index, indexes).await?;
    Ok(index)
}

/// The objects of a loose-object dataset, keyed by their keys without
/// extension, with the labels and class names of its index.
async fn object_inputs(dataset: &Dataset) -> Result<Listing, PackError> {
    if !dataset.is_loose() {
        return Err(PackError::Layout(format!(
            "{} is already tar or TFRecord shards; pack reads loose image objects \
             (class folders or a manifest)",
            dataset.uri
        )));
    }
    let mut inputs = Vec::new();
    let mut skipped = Vec::new();
    let mut keys = HashSet::new();
    for group in 0..dataset.index.shards.len() {
        let index = dataset.shard_index(group as u32).await?;
        for (i, key) in index.keys.iter().enumerate() {
            let object = dataset.object(&index, i);
            if object.size > DEFAULT_MAX_MEMBER_BYTES {
                skipped.push(Skipped {
                    path: PathBuf::from(key),
                    reason: format!(
                        "{} bytes, over the {DEFAULT_MAX_MEMBER_BYTES}-byte member limit",
                        object.size
                    ),
                });
                continue;
            }
            inputs.push(Input {
                path: PathBuf::from(key),
                key: unique_key(sample_key(Path::new(""), Path::new(key)), &mut keys),
                label: index.labels.get(i).copied().unwrap_or(-1),
                size: object.size,
                record: None,
                object: Some(object),
            });
        }
    }
    inputs.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((inputs, dataset.index.classes.clone(), skipped))
}

/// The bytes of a shard's objects, `in_flight` GETs at a time, in order. An
/// object gone or changed since it was listed is skipped with the reason;
/// other failures (after the store's retries) end the pack.
async fn fetch_objects(
    store: Arc<dyn ObjectStore>,
    inputs: &[Input],
    in_flight: usize,
) -> Result<Vec<Result<Bytes, String>>, PackError> {
    let reads = inputs.iter().map(|input| {
        let store = store.clone();
        let object = input.object.clone();
        async move {
            let Some(object) = object else {
                return Ok(Err("not an object".to_string()));
            };
            match read_object(store.as_ref(), &object).await {
                Ok(bytes) => Ok(Ok(bytes)),
                Err(error @ (StoreError::NotFound { .. } | StoreError::Changed { .. })) => {
                    Ok(Err(error.to_string()))
                }
                Err(error) => Err(PackError::Store(error)),
            }
        }
    });
    futures::stream::iter(reads)
        .buffered(in_flight.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// `shard-000042.tar`, numbered at least six digits wide so names sort in order.
fn shard_name(number: usize, total: usize) -> String {
    let width = total.saturating_sub(1).to_string().len().max(6);
    format!("shard-{number:0width$}.tar")
}

fn shuffled(mut inputs: Vec<Input>, seed: u64) -> Vec<Input> {
    Rng::derive(&[seed, PURPOSE_PACK_ORDER]).shuffle(&mut inputs);
    inputs
}

/// Bytes a sample adds to a shard (image and label members).
fn tar_bytes(input: &Input) -> u64 {
    TarWriter::member_bytes(&format!("{}.jpeg", input.key), input.size)
        + TarWriter::member_bytes(&format!("{}.cls", input.key), 20)
}

/// Consecutive runs of samples, each closed before it would pass `target`.
fn assign_shards(inputs: Vec<Input>, target: u64) -> Vec<Vec<Input>> {
    let mut shards: Vec<Vec<Input>> = Vec::new();
    let mut current: Vec<Input> = Vec::new();
    let mut bytes = 1024; // the closing blocks
    for input in inputs {
        let size = tar_bytes(&input);
        if !current.is_empty() && bytes + size > target {
            shards.push(std::mem::take(&mut current));
            bytes = 1024;
        }
        bytes += size;
        current.push(input);
    }
    if !current.is_empty() {
        shards.push(current);
    }
    shards
}

struct BuiltShard {
    /// `None` when no file of the shard was usable.
    tar: Option<Bytes>,
    skipped: Vec<Skipped>,
    /// The labels of the samples written.
    labels: BTreeSet<i64>,
}

/// Reads the shard's files in parallel and writes them in order.
fn build_shard(inputs: &[Input], mut fetched: Vec<Result<Bytes, String>>) -> BuiltShard {
    fetched.resize_with(inputs.len(), || Err("not fetched".into()));
    let read: Vec<Result<(Bytes, &'static str), String>> = inputs
        .par_iter()
        .zip(fetched)
        .map(|(input, fetched)| {
            let data = match (&input.object, &input.record) {
                (Some(_), _) => fetched?,
                (None, Some(record)) => Bytes::from(read_record_image(&input.path, record)?),
                (None, None) => {
                    Bytes::from(std::fs::read(&input.path).map_err(|e| format!("unreadable: {e}"))?)
                }
            };
            let extension = ImageFormat::sniff(&data)
                .ok_or_else(|| "not a JPEG, PNG or WebP image".to_string())?
                .extension();
            Ok((data, extension))
        })
        .collect();
    let capacity: u64 = inputs.iter().map(tar_bytes).sum::<u64>() + 1024;
    let mut tar = TarWriter::with_capacity(capacity as usize);
    let mut skipped = Vec::new();
    let mut labels = BTreeSet::new();
    for (input, result) in inputs.iter().zip(read) {
        match result {
            Ok((data, extension)) => {
                labels.insert(input.label);
                tar.append(&format!("{}.{extension}", input.key), &data);
                tar.append(
                    &format!("{}.cls", input.key),
                    input.label.to_string().as_bytes(),
                );
            }
            Err(reason) => skipped.push(Skipped {
                path: input.path.clone(),
                reason: match &input.record {
                    Some(_) => format!("{}: {reason}", input.key),
                    None => reason,
                },
            }),
        }
    }
    let tar = (!tar.is_empty()).then(|| Bytes::from(tar.finish()));
    BuiltShard {
        tar,
        skipped,
        labels,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_drop_the_extension_and_inner_dots() {
        let source = Path::new("/data");
        assert_eq!(
            sample_key(source, Path::new("/data/cat/img.001.jpeg")),
            "cat/img_001"
        );
        assert_eq!(sample_key(source, Path::new("/data/x")), "x");
        let mut taken = HashSet::new();
        assert_eq!(unique_key("a".into(), &mut taken), "a");
        assert_eq!(unique_key("a".into(), &mut taken), "a_2");
        assert_eq!(unique_key("a".into(), &mut taken), "a_3");
    }

    #[test]
    fn shards_close_before_the_target() {
        let inputs: Vec<Input> = (0..10)
            .map(|i| Input {
                path: PathBuf::from(format!("/f{i}")),
                key: format!("f{i}"),
                label: 0,
                size: 10_000,
                record: None,
                object: None,
            })
            .collect();
        // A sample is 11,776 tar bytes (headers, padding, label); three and
        // the closing blocks fit in 40,000, four do not.
        let shards = assign_shards(inputs, 40_000);
        assert_eq!(
            shards.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![3, 3, 3, 1]
        );
        // A sample larger than the target still gets a shard of its own.
        let big = Input {
            path: PathBuf::from("/big"),
            key: "big".into(),
            label: 0,
            size: 100_000,
            record: None,
            object: None,
        };
        assert_eq!(assign_shards(vec![big], 35_000).len(), 1);
    }

    #[test]
    fn signatures_pick_the_member_extension() {
        assert_eq!(
            ImageFormat::sniff(&[0xFF, 0xD8, 0xFF, 0xE0]).map(ImageFormat::extension),
            Some("jpg")
        );
        assert_eq!(
            ImageFormat::sniff(b"\x89PNG\r\n\x1a\n....").map(ImageFormat::extension),
            Some("png")
        );
        assert_eq!(
            ImageFormat::sniff(b"RIFF\0\0\0\0WEBPVP8 ").map(ImageFormat::extension),
            Some("webp")
        );
        assert_eq!(
            ImageFormat::sniff(b"hello").map(ImageFormat::extension),
            None
        );
        assert_eq!(ImageFormat::sniff(b"").map(ImageFormat::extension), None);
    }

    #[test]
    fn shard_names_sort_in_order() {
        assert_eq!(shard_name(3, 10), "shard-000003.tar");
        assert_eq!(shard_name(3, 2_000_000), "shard-0000003.tar");
    }
}
