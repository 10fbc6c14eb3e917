//! Indexing a listed shard object, each format by its own scan: a tar or
//! TFRecord shard's bytes read once through the splitter, framed only
//! (keys and byte ranges); a Parquet file's footer, which plans its row
//! groups without a byte of row data ([`super::parquet::scan_file`]).
//! [`ScanOf::object`] is the one place a listed object's format picks its
//! scan; loose objects are indexed from the listing, not scanned
//! ([`super::loose`]).

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};

use super::charge::{entry_bytes, shard_index_bytes, FooterBytes, IndexCharge};
use super::format::ShardKind;
use super::index::{DatasetError, ShardEntry, ShardIndex, INDEX_VERSION};
use crate::shard::splitter::SampleSplitter;
use crate::shard::{
    BadShardPolicy, SampleLayout, ShardError, ShardFormat, StreamedFormat, DEFAULT_MAX_MEMBER_BYTES,
};
use crate::store::read::{read_parts, ReadConfig};
use crate::store::{ObjectMeta, ObjectStore, StoreError};

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

/// Progress of an index build: shards scanned of all, and their bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct IndexProgress {
    pub shards_done: u64,
    pub shards: u64,
    pub bytes_done: u64,
    pub bytes: u64,
}

/// A listed object to index, and its format (from its name).
pub(super) struct Listed {
    pub object: ObjectMeta,
    pub format: ShardFormat,
}

/// Scans every listed shard, several at once, each charging what it keeps
/// to `charge`; `progress` is told as each scan ends.
pub(super) async fn scan_every_object(
    store: &Arc<dyn ObjectStore>,
    shards: Vec<Listed>,
    prefix: &str,
    (read, on_bad_shard): (&ReadConfig, BadShardPolicy),
    charge: &Arc<IndexCharge>,
    progress: &(dyn Fn(IndexProgress) + Send + Sync),
) -> Result<Vec<Scanned>, DatasetError> {
    let mut done = IndexProgress {
        shards: shards.len() as u64,
        bytes: shards.iter().map(|s| s.object.size).sum(),
        ..IndexProgress::default()
    };
    progress(done);
    let (concurrent_scans, scan_read) = index_scan_window(read);
    // A Parquet file's scan is one small GET of its tail (FOOTER_SCANS of
    // them hold ~16 MiB): latency-bound, so many run at once.
    let concurrent_scans = if shards.iter().all(|s| s.format == ShardFormat::Parquet) {
        FOOTER_SCANS
    } else {
        concurrent_scans
    };
    let footers = FooterBytes::default();
    futures::stream::iter(shards.into_iter().map(|listed| {
        let name = listed.object.key[prefix.len()..].to_string();
        let scan = ScanOf {
            store: store.clone(),
            read: scan_read.clone(),
            on_bad_shard,
            footers: footers.clone(),
            charge: charge.clone(),
        };
        async move {
            let size = listed.object.size;
            let scanned = scan.object(listed, name).await?;
            Ok::<_, DatasetError>((size, scanned))
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
    /// The object's entries and indexes, by its format's scan.
    async fn object(self, listed: Listed, name: String) -> Result<Scanned, DatasetError> {
        match listed.format {
            ShardFormat::Streamed(format) => self.streamed(format, &listed.object, name).await,
            ShardFormat::Parquet => self.footer(&listed.object, name).await,
        }
    }

    /// A Parquet file's row groups, planned from its footer: no byte of
    /// row data is read.
    async fn footer(self, object: &ObjectMeta, name: String) -> Result<Scanned, DatasetError> {
        let file = super::parquet::scan_file(
            self.store.as_ref(),
            object,
            name,
            (&self.footers, &self.charge),
        )
        .await?;
        Ok(Scanned {
            indexes: vec![ShardIndex::default(); file.entries.len()],
            entries: file.entries,
            classes: file.classes,
            label_names: file.label_names,
        })
    }

    /// A tar or TFRecord shard's samples, from its bytes.
    async fn streamed(
        self,
        format: StreamedFormat,
        object: &ObjectMeta,
        name: String,
    ) -> Result<Scanned, DatasetError> {
        let index = scan_shard(self.store, format, object, self.read, self.on_bad_shard).await?;
        self.charge.charge(
            1,
            entry_bytes(&name, object.etag.as_deref()) + shard_index_bytes(&index),
        )?;
        let entry = ShardEntry {
            name,
            size: object.size,
            etag: object.etag.clone(),
            samples: index.keys.len() as u64,
            kind: ShardKind::Streamed(format),
        };
        Ok(Scanned {
            entries: vec![entry],
            indexes: vec![index],
            classes: Vec::new(),
            label_names: Default::default(),
        })
    }
}

/// What scanning one object gave: a tar or TFRecord shard's entry and
/// index, or a Parquet file's row groups (their indexes empty: each is
/// made from its entry when read) and class names.
pub(super) struct Scanned {
    pub entries: Vec<ShardEntry>,
    pub indexes: Vec<ShardIndex>,
    pub classes: Vec<String>,
    pub label_names: std::collections::BTreeSet<String>,
}

/// A streamed shard's index from its bytes, framed only; under
/// `--on-bad-shard skip` a damaged one keeps the samples before the damage.
async fn scan_shard(
    store: Arc<dyn ObjectStore>,
    format: StreamedFormat,
    object: &ObjectMeta,
    read: ReadConfig,
    on_bad_shard: BadShardPolicy,
) -> Result<ShardIndex, DatasetError> {
    let location = store.location(&object.key);
    let etag = object.etag.clone();
    let mut index = ShardIndex {
        version: INDEX_VERSION,
        etag: etag.clone(),
        ..ShardIndex::default()
    };
    match scan_into(&mut index, store, format, object, read).await {
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
    format: StreamedFormat,
    object: &ObjectMeta,
    read: ReadConfig,
) -> Result<(), ScanError> {
    // Only keys and ranges are kept: the default layout reads nothing more.
    let layout = Arc::new(SampleLayout::default());
    let mut splitter =
        SampleSplitter::for_format(format, 0, 0, DEFAULT_MAX_MEMBER_BYTES, layout).frames_only();
    let mut parts = std::pin::pin!(read_parts(
        store,
        object.key.clone(),
        0..object.size,
        object.etag.clone(),
        &read,
    ));
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

#[cfg(test)]
mod tests {
    use super::*;

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
