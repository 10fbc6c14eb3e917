//! What a dataset's index holds in memory, charged as it is built.
//!
//! A dataset's summary and per-shard indexes live as long as the dataset is
//! open, in the share of `--memory-limit` the budget keeps for indexes
//! (`engine::budget`: limit / 8). Their size follows from what the objects
//! say about themselves (a Parquet footer may list 10^5 row groups, each a
//! summary entry), so each scan charges its entries before it makes them,
//! and a build whose index would pass the share is refused naming the way
//! out, rather than the process running past its limit. That share is the
//! cap on row groups per dataset: ~4 · 10^5 at a 1 GiB limit (~340 B a
//! row group with its name and ETag).
//!
//! Parsed Parquet footers are held only while their file is scanned; the
//! scans hold them under [`FooterBytes`], a byte bound of their own.

use std::mem::size_of;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::index::{DatasetError, DatasetIndex, ShardEntry, ShardIndex};

/// Memory one summary entry holds: the struct and its strings.
pub fn entry_bytes(name: &str, etag: Option<&str>) -> u64 {
    (size_of::<ShardEntry>() + name.len() + etag.map_or(0, str::len)) as u64
}

/// Memory the summary holds: its entries and class names.
pub fn summary_bytes(index: &DatasetIndex) -> u64 {
    let entries: u64 = index
        .shards
        .iter()
        .map(|s| entry_bytes(&s.name, s.etag.as_deref()) + s.held_bytes())
        .sum();
    let classes: u64 = index
        .classes
        .iter()
        .map(|c| (size_of::<String>() + c.len()) as u64)
        .sum();
    entries + classes
}

/// Memory one per-shard index holds: keys, ranges, labels and ETags.
pub fn shard_index_bytes(index: &ShardIndex) -> u64 {
    let keys: u64 = index
        .keys
        .iter()
        .map(|k| (size_of::<String>() + k.len()) as u64)
        .sum();
    let etags: u64 = index
        .etags
        .iter()
        .map(|e| (size_of::<Option<String>>() + e.as_ref().map_or(0, String::len)) as u64)
        .sum();
    let numbers = 8 * (index.starts.len() + index.ends.len() + index.labels.len()) as u64;
    size_of::<ShardIndex>() as u64 + keys + etags + numbers
}

/// The index bytes one build has made so far, against its share. Shared by
/// the build's concurrent scans: each charges before it allocates, so what
/// scans finished but not yet collected hold is inside the bound too.
#[derive(Debug)]
pub struct IndexCharge {
    location: String,
    limit: u64,
    held: AtomicU64,
    entries: AtomicU64,
}

impl IndexCharge {
    pub fn new(location: String, limit: u64) -> Arc<Self> {
        Arc::new(Self {
            location,
            limit,
            held: AtomicU64::new(0),
            entries: AtomicU64::new(0),
        })
    }

    /// Charges `bytes` for `entries` more shards or row groups, or refuses
    /// the build if the index would pass its share.
    pub fn charge(&self, entries: u64, bytes: u64) -> Result<(), DatasetError> {
        let entries = self.entries.fetch_add(entries, Ordering::Relaxed) + entries;
        let held = self
            .held
            .fetch_add(bytes, Ordering::Relaxed)
            .saturating_add(bytes);
        check(&self.location, entries, held, self.limit)
    }
}

/// Refuses an index of `bytes` past `limit` (an index loaded whole from a
/// stored summary is held to the same share as one built).
pub fn check(location: &str, entries: u64, bytes: u64, limit: u64) -> Result<(), DatasetError> {
    match bytes > limit {
        true => Err(DatasetError::IndexTooLarge {
            location: location.to_string(),
            entries,
            bytes,
            limit,
        }),
        false => Ok(()),
    }
}

/// Parsed footers' memory per byte of footer metadata, an upper figure:
/// the crate counts 4.1× for the dev writer's footers of one-row groups
/// (`footer_memory_per_metadata_byte` below); the rest is room for the
/// allocator and for footers whose chunks say less per byte.
pub const PARSED_PER_METADATA_BYTE: u64 = 12;
/// What an index build's footer scans may hold at once: their tails,
/// their longer footers' bytes and the parsed footers. 64 scans of
/// footers that fit the tail fit it, so the Hub's files keep their
/// concurrency; 16 MiB footers go a few at a time.
pub const FOOTER_SCAN_BYTES: u64 = 256 << 20;
/// Permits count KiB so that the bound fits the semaphore's `u32`.
const UNIT: u64 = 1 << 10;

/// The byte bound the footer scans of one build share. A scan holds one
/// share at a time (its tail's, then, for a longer footer, that footer's
/// alone), so a scan waiting for a share holds none: waiters cannot keep
/// each other waiting.
#[derive(Debug, Clone)]
pub struct FooterBytes {
    permits: Arc<Semaphore>,
    units: u64,
}

impl Default for FooterBytes {
    fn default() -> Self {
        Self::with_bytes(FOOTER_SCAN_BYTES)
    }
}

impl FooterBytes {
    pub fn with_bytes(bytes: u64) -> Self {
        let units = (bytes / UNIT).max(1);
        Self {
            permits: Arc::new(Semaphore::new(units as usize)),
            units,
        }
    }

    /// Waits until `metadata` bytes of footer, read and parsed, fit the
    /// bound (one larger than the bound waits for all of it).
    pub async fn hold(&self, metadata: u64) -> OwnedSemaphorePermit {
        let bytes = metadata.saturating_mul(1 + PARSED_PER_METADATA_BYTE);
        let units = bytes.div_ceil(UNIT).clamp(1, self.units);
        self.permits
            .clone()
            .acquire_many_owned(units as u32)
            .await
            .expect("the footer bound's semaphore is never closed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_past_its_share_is_refused_naming_the_way_out() {
        let charge = IndexCharge::new("s3://bucket/files/".into(), 1_000);
        charge.charge(3, 600).unwrap();
        let refused = charge.charge(2, 401).unwrap_err();
        let message = refused.to_string();
        assert!(
            matches!(
                refused,
                DatasetError::IndexTooLarge {
                    entries: 5,
                    bytes: 1_001,
                    limit: 1_000,
                    ..
                }
            ),
            "{message}"
        );
        for names in [
            "s3://bucket/files/",
            "row_group_size",
            "--memory-limit",
            "mix",
        ] {
            assert!(message.contains(names), "{message}");
        }
    }

    #[tokio::test]
    async fn footers_past_the_bound_wait_for_the_ones_before_them() {
        let bound = FooterBytes::default();
        // A 16 MiB footer takes 13 × 16 MiB of the 256 MiB bound.
        let first = bound.hold(16 << 20).await;
        let second =
            tokio::time::timeout(std::time::Duration::from_millis(50), bound.hold(16 << 20)).await;
        assert!(second.is_err(), "two 16 MiB footers do not fit at once");
        drop(first);
        let _second = bound.hold(16 << 20).await;
        // 64 scans of footers within the 256 KiB tail fit together.
        let small = futures::future::join_all((0..63).map(|_| bound.hold(256 << 10)));
        tokio::time::timeout(std::time::Duration::from_millis(50), async {
            drop(_second);
            small.await
        })
        .await
        .expect("64 tails at once");
    }

    /// Footers the dev writer makes, which the image's build leaves out.
    #[cfg(feature = "dev")]
    mod written {
        use super::super::*;
        use crate::dev::parquet_files::{self, Layout, Row};
        use crate::shard::parquet::footer::metadata_range;
        use crate::shard::parquet::Footer;

        /// A file of `groups` one-row groups: its footer lists them all.
        fn one_row_groups(groups: i64) -> Vec<u8> {
            let rows: Vec<Row> = (0..groups)
                .map(|i| Row {
                    image: Some(vec![i as u8; 16]),
                    path: Some(format!("{i}.jpg")),
                    label: Some(i),
                })
                .collect();
            let layout = Layout {
                rows_per_group: 1,
                ..Layout::default()
            };
            parquet_files::write(&rows, &layout).unwrap()
        }

        /// A footer longer than the tail read, under a bound smaller than
        /// the tail's share and the footer's together: the scan gives the
        /// tail's share back before it asks the footer's, so it ends.
        #[tokio::test]
        async fn a_long_footer_is_read_under_a_bound_it_fills_alone() {
            use crate::dataset::parquet::read_footer;
            use crate::store::local::LocalStore;
            use crate::store::ObjectMeta;
            let file = one_row_groups(2_000);
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("long.parquet"), &file).unwrap();
            let store = LocalStore::new(dir.path());
            let object = ObjectMeta {
                key: "long.parquet".into(),
                size: file.len() as u64,
                etag: None,
            };
            // The tail's share alone is 13 × 256 KiB; the footer's, 13 ×
            // ~700 KB, clamped to the whole bound.
            let bound = FooterBytes::with_bytes(4 << 20);
            let read = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                read_footer(&store, &object, &bound),
            )
            .await
            .expect("the scan waited on its own share")
            .unwrap();
            assert_eq!(read.footer.row_groups(), 2_000);
        }

        #[test]
        fn footer_memory_per_metadata_byte() {
            let file = one_row_groups(2_000);
            let range = metadata_range(&file, file.len() as u64).unwrap();
            let metadata = &file[range.start as usize..range.end as usize];
            let footer = Footer::parse(metadata, file.len() as u64).unwrap();
            let per_byte = footer.metadata.memory_size() as f64 / metadata.len() as f64;
            println!(
                "{} row groups: {} metadata bytes parse to {} ({per_byte:.1} a byte)",
                footer.row_groups(),
                metadata.len(),
                footer.metadata.memory_size()
            );
            assert!(per_byte <= PARSED_PER_METADATA_BYTE as f64, "{per_byte}");
        }
    }
}
