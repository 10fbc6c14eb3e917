//! Parquet files in the index: each row group a shard, planned from the
//! files' footers alone (one ranged GET of each file's tail, a second only
//! for a footer longer than the first read), never from their data.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::{OnceCell, OwnedSemaphorePermit};

use super::charge::{entry_bytes, FooterBytes, IndexCharge};
use super::format::{RowGroupRef, ShardKind};
use super::index::{DatasetError, ShardEntry, ShardIndex};
use crate::shard::parquet::columns::LabelColumn;
use crate::shard::parquet::{
    label_names, ChunkBytes, ClassNames, ColumnNames, Footer, ParquetError, Projection,
    RowGroupInput,
};
use crate::shard::ShardError;
use crate::store::read::read_range;
use crate::store::{ObjectMeta, ObjectStore};

/// A footer read under a [`FooterBytes`] bound, holding its share of it
/// until dropped.
pub struct HeldFooter {
    pub footer: Footer,
    pub held: OwnedSemaphorePermit,
}

/// Reads and checks the footer of the Parquet file `object`, its bytes and
/// its parsed form held to `bound` before they are read.
pub async fn read_footer(
    store: &dyn ObjectStore,
    object: &ObjectMeta,
    bound: &FooterBytes,
) -> Result<HeldFooter, DatasetError> {
    let damaged = |source: ParquetError| DatasetError::Shard {
        location: store.location(&object.key),
        source: ShardError::Parquet(source),
    };
    let tail_range = crate::shard::parquet::footer::tail_range(object.size);
    let held = bound.hold(tail_range.end - tail_range.start).await;
    let etag = object.etag.as_deref();
    let tail = read_range(store, &object.key, tail_range, etag).await?;
    match Footer::from_tail(&tail, object.size) {
        Ok(footer) => Ok(HeldFooter { footer, held }),
        Err(Err(error)) => Err(damaged(error)),
        Err(Ok(longer)) => {
            // The tail's share goes back before the longer one is asked:
            // a scan that waits holds nothing.
            drop((tail, held));
            let held = bound.hold(longer.end - longer.start).await;
            let metadata = read_range(store, &object.key, longer, etag).await?;
            let footer = Footer::parse(&metadata, object.size).map_err(damaged)?;
            Ok(HeldFooter { footer, held })
        }
    }
}

/// What indexing one Parquet file gives.
pub struct ScannedFile {
    /// A shard per row group (empty ones left out: they hold no sample).
    pub entries: Vec<ShardEntry>,
    /// The class names its schema's `huggingface` metadata gives.
    pub classes: Vec<String>,
    /// Where it names none and its labels are strings: the names it holds
    /// (the dataset's classes are all files' names, sorted).
    pub label_names: BTreeSet<String>,
}

/// Distinct string labels a dataset may have: past this, its label column
/// is not a class name (a caption, a file name) and indexing says so.
pub const MAX_LABEL_NAMES: usize = 1 << 20;
/// The most memory planning reads one row group's string label chunk with
/// (its bytes fetched, decompressed, and the names copied out): a million
/// 32-byte names is ~100 MB by that count. Planning runs before any
/// stream's budget, so a label chunk is held to this before it is fetched.
pub const MAX_LABEL_CHUNK_BYTES: u64 = 256 << 20;

/// Indexes one Parquet file from its footer; string labels without class
/// names in the metadata cost one small GET per row group (its label
/// column's chunk), integer labels none.
pub async fn scan_file(
    store: &dyn ObjectStore,
    object: &ObjectMeta,
    name: String,
    (footers, charge): (&FooterBytes, &IndexCharge),
) -> Result<ScannedFile, DatasetError> {
    let HeldFooter { footer, held } = read_footer(store, object, footers).await?;
    let damaged = |source: ParquetError| DatasetError::Shard {
        location: store.location(&object.key),
        source: ShardError::Parquet(source),
    };
    // Charged before it is made: every row group at most one entry, and
    // the build's empty per-shard index beside it until the build ends.
    let groups = footer.row_groups() as u64;
    let per_group =
        entry_bytes(&name, object.etag.as_deref()) + std::mem::size_of::<ShardIndex>() as u64;
    charge.charge(groups, groups.saturating_mul(per_group))?;
    let mut entries = Vec::with_capacity(footer.row_groups());
    let mut first_row = 0u64;
    for group in 0..footer.row_groups() {
        let span = footer.span(group).map_err(damaged)?;
        if span.rows > 0 {
            entries.push(ShardEntry {
                name: name.clone(),
                size: span.bytes.end - span.bytes.start,
                etag: object.etag.clone(),
                samples: span.rows,
                kind: ShardKind::RowGroup(RowGroupRef {
                    group: group as u32,
                    first_row,
                    offset: span.bytes.start,
                    uncompressed: span.uncompressed,
                    file_size: object.size,
                }),
            });
        }
        first_row += span.rows;
    }
    let classes = footer.class_names("label");
    let label_names = match classes.is_empty() {
        true => string_labels(store, object, &footer).await?,
        false => BTreeSet::new(),
    };
    let names: u64 = label_names
        .iter()
        .map(|n| (std::mem::size_of::<String>() + n.len()) as u64)
        .sum();
    charge.charge(0, names)?;
    drop((footer, held));
    Ok(ScannedFile {
        entries,
        classes,
        label_names,
    })
}

/// The names in a string `label` column, every row group's chunk read.
async fn string_labels(
    store: &dyn ObjectStore,
    object: &ObjectMeta,
    footer: &Footer,
) -> Result<BTreeSet<String>, DatasetError> {
    let schema = footer.metadata.file_metadata().schema_descr();
    let Ok(projection) = Projection::resolve(schema, &ColumnNames::default(), &[]) else {
        return Ok(BTreeSet::new());
    };
    let Some(LabelColumn::Text(column)) = projection.label else {
        return Ok(BTreeSet::new());
    };
    let damaged = |source: ParquetError| DatasetError::Shard {
        location: store.location(&object.key),
        source: ShardError::Parquet(source),
    };
    let mut names = BTreeSet::new();
    for group in 0..footer.row_groups() {
        let range = footer.chunk_range(group, column).map_err(damaged)?;
        // The footer's figures, which the page walk holds the pages to.
        let uncompressed = footer
            .metadata
            .row_group(group)
            .column(column)
            .uncompressed_size();
        let need = (range.end - range.start).saturating_add(
            u64::try_from(uncompressed)
                .unwrap_or(u64::MAX)
                .saturating_mul(2),
        );
        if need > MAX_LABEL_CHUNK_BYTES {
            return Err(damaged(ParquetError::LabelChunkTooLarge {
                group,
                bytes: need,
                limit: MAX_LABEL_CHUNK_BYTES,
            }));
        }
        let data = read_range(store, &object.key, range.clone(), object.etag.as_deref()).await?;
        let input = RowGroupInput {
            footer,
            group,
            first_row: 0,
            projection: &projection,
            chunks: vec![(column, ChunkBytes::whole(range.start, data))],
            classes: &ClassNames::default(),
            max_field_bytes: 0,
        };
        names.extend(label_names(&input).map_err(damaged)?);
        if names.len() > MAX_LABEL_NAMES {
            return Err(DatasetError::Shard {
                location: store.location(&object.key),
                source: ShardError::Parquet(ParquetError::ColumnType {
                    column: "label".into(),
                    found: format!("over {MAX_LABEL_NAMES} distinct strings"),
                    wanted: "class names".into(),
                }),
            });
        }
    }
    Ok(names)
}

/// Footers of the files a dataset's streams are reading, each read once
/// however many of its row groups are in flight, and kept while their
/// bytes fit [`FOOTER_CACHE_BYTES`] (the oldest let go first).
#[derive(Debug, Default)]
pub struct FooterCache {
    inner: Mutex<FooterCacheInner>,
    reading: FooterBytes,
}

/// Parsed footers kept per dataset, in memory bytes (of the quarter of the
/// memory limit left to the runtime and indexes, `engine::budget`): a
/// footer of 100 row groups of 3 columns is ~100 KB parsed.
pub const FOOTER_CACHE_BYTES: u64 = 64 << 20;

type FooterCell = Arc<OnceCell<Arc<Footer>>>;

#[derive(Debug, Default)]
struct FooterCacheInner {
    cells: HashMap<String, FooterCell>,
    order: std::collections::VecDeque<String>,
}

impl FooterCache {
    pub async fn get(
        &self,
        store: &dyn ObjectStore,
        object: &ObjectMeta,
    ) -> Result<Arc<Footer>, DatasetError> {
        let cell = {
            let mut inner = self.lock();
            match inner.cells.get(&object.key) {
                Some(cell) => cell.clone(),
                None => {
                    let cell = FooterCell::default();
                    inner.cells.insert(object.key.clone(), cell.clone());
                    inner.order.push_back(object.key.clone());
                    cell
                }
            }
        };
        // Held to the bound while read and parsed; once kept, the cache's
        // own byte bound holds it.
        let footer = cell
            .get_or_try_init(|| async {
                read_footer(store, object, &self.reading)
                    .await
                    .map(|held| Arc::new(held.footer))
            })
            .await?
            .clone();
        self.trim();
        Ok(footer)
    }

    /// Lets the oldest footers go past the byte bound (the newest stays).
    fn trim(&self) {
        let mut inner = self.lock();
        let held = |inner: &FooterCacheInner| -> u64 {
            inner
                .cells
                .values()
                .filter_map(|cell| cell.get())
                .map(|footer| footer.metadata.memory_size() as u64)
                .sum()
        };
        while inner.order.len() > 1 && held(&inner) > FOOTER_CACHE_BYTES {
            if let Some(oldest) = inner.order.pop_front() {
                inner.cells.remove(&oldest);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FooterCacheInner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
