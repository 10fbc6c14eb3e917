//! The index's vocabulary: where a dataset's index lives, its summary and
//! per-shard files, their JSON, and why a dataset cannot be opened.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::format::{RowGroupRef, ShardKind};
use crate::shard::ShardError;
use crate::store::StoreError;

pub const INDEX_DIR: &str = "_shardfeed/";
pub const INDEX_VERSION: u32 = 1;
/// Class names beside a dataset's shards, one per line, line `i` naming
/// label `i` (pack writes it; the index takes it in).
pub const CLASSES_FILE: &str = "classes.txt";

/// The most bytes each file read whole at a dataset's opening may have,
/// refused on its size before any is read: what opening a dataset holds
/// at once is at most one summary, one class list and the per-shard
/// indexes of the shards a stream reads ahead (their count bounded by the
/// readers in flight), whatever a file in the folder claims. A summary of
/// 10^5 shards is ~10 MB, a per-shard index of 10^5 samples ~5 MB.
pub const MAX_SUMMARY_BYTES: u64 = 256 << 20;
pub const MAX_SHARD_INDEX_BYTES: u64 = 64 << 20;
pub const MAX_CLASSES_BYTES: u64 = 16 << 20;

#[derive(Debug, Clone, thiserror::Error)]
pub enum DatasetError {
    #[error("invalid dataset URI {uri:?}: {reason}")]
    InvalidUri { uri: String, reason: &'static str },
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error(
        "no shards (*.tar, *.tfrecord, *.tfrecords, *.parquet) and no images (*.jpg, *.jpeg, *.png, \
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
    #[error(
        "{location}: its index would hold {bytes} bytes of memory for {entries} shards or row \
         groups, past the {limit} bytes this server keeps for indexes (1/8 of --memory-limit). \
         Write fewer, larger row groups or shards (pyarrow's row_group_size: the Hub's files \
         hold ~100 MB row groups), split the files across datasets read as a mix, or raise \
         --memory-limit"
    )]
    IndexTooLarge {
        location: String,
        entries: u64,
        bytes: u64,
        limit: u64,
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

/// One shard of the index: its object (or a group's name), size, ETag and
/// samples, and what it is ([`ShardKind`], whose table answers what differs
/// between formats). Its JSON is the summary's entry as shardfeed has
/// always written it (`super::format`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "EntryRecord", into = "EntryRecord")]
pub struct ShardEntry {
    /// Object key relative to the dataset prefix.
    pub name: String,
    pub size: u64,
    pub etag: Option<String>,
    pub samples: u64,
    pub kind: ShardKind,
}

/// An entry as the summary's JSON holds it.
#[derive(Serialize, Deserialize)]
struct EntryRecord {
    name: String,
    size: u64,
    etag: Option<String>,
    samples: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    row_group: Option<RowGroupRef>,
}

impl From<EntryRecord> for ShardEntry {
    fn from(record: EntryRecord) -> Self {
        let kind = ShardKind::from_record(&record.name, record.digest, record.row_group);
        Self {
            name: record.name,
            size: record.size,
            etag: record.etag,
            samples: record.samples,
            kind,
        }
    }
}

impl From<ShardEntry> for EntryRecord {
    fn from(entry: ShardEntry) -> Self {
        let (digest, row_group) = entry.kind.into_record();
        Self {
            name: entry.name,
            size: entry.size,
            etag: entry.etag,
            samples: entry.samples,
            digest,
            row_group,
        }
    }
}

/// What differs between formats, asked of an entry (answered by
/// [`ShardKind`]'s table).
impl ShardEntry {
    /// The bytes of its object the shard is.
    pub fn byte_range(&self) -> std::ops::Range<u64> {
        self.kind.byte_range(self.size)
    }

    /// The size of the object the shard is part of.
    pub fn object_size(&self) -> u64 {
        self.kind.object_size(self.size)
    }

    /// What one reader holds to read the shard beyond the stream's terms.
    pub fn read_cost(&self) -> u64 {
        self.kind.read_cost(self.size, self.samples)
    }

    /// What tells a changed shard from the one indexed: its object's ETag,
    /// else what the kind keeps.
    pub fn version(&self) -> Option<&String> {
        self.etag.as_ref().or(self.kind.version())
    }

    /// Memory the entry holds beyond its struct, name and ETag.
    pub fn held_bytes(&self) -> u64 {
        self.kind.held_bytes()
    }

    /// Whether the entry alone makes the shard's per-shard index (asked
    /// without making it: a row group's may hold millions of keys).
    pub fn indexes_itself(&self) -> bool {
        self.kind.rows(self.samples).is_some()
    }

    /// The shard's per-shard index when the entry alone makes it (its
    /// samples keyed by row number, each spanning the shard's bytes); None
    /// when it is a file of the index (or the scan's, held in memory).
    pub fn derived_index(&self) -> Option<ShardIndex> {
        let rows = self.kind.rows(self.samples)?;
        let range = self.byte_range();
        Some(ShardIndex {
            version: INDEX_VERSION,
            etag: self.etag.clone(),
            keys: rows.map(|row| row.to_string()).collect(),
            starts: vec![range.start; self.samples as usize],
            ends: vec![range.end; self.samples as usize],
            labels: Vec::new(),
            etags: Vec::new(),
        })
    }

    /// Whether the shard cache holds the shard as its object whole.
    pub fn cached_whole(&self) -> bool {
        self.kind.cached_whole()
    }
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

pub(super) fn shard_index_key(root: &str, name: &str) -> String {
    format!("{root}shards/{name}.json")
}

pub(super) fn summary_key(root: &str) -> String {
    format!("{root}index.json")
}

/// A shard name from an index must name an object under the dataset's root:
/// relative, without `.` or `..` segments (so neither a local path nor an
/// HTTP client's dot-segment normalisation leaves the prefix `--allow`
/// admitted).
pub(super) fn check_shard_name(name: &str) -> Result<(), String> {
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

pub(super) fn parse_json<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    location: &str,
) -> Result<T, DatasetError> {
    serde_json::from_slice(bytes).map_err(|e| DatasetError::CorruptIndex {
        location: location.to_string(),
        message: e.to_string(),
    })
}

/// A summary index's bytes, parsed, every shard name held beneath the
/// dataset (a summary names the files read next).
pub fn parse_summary(bytes: &[u8], location: &str) -> Result<DatasetIndex, DatasetError> {
    let index: DatasetIndex = parse_json(bytes, location)?;
    for entry in &index.shards {
        check_shard_name(&entry.name).map_err(|message| DatasetError::CorruptIndex {
            location: location.to_string(),
            message,
        })?;
    }
    Ok(index)
}

/// A per-shard index's bytes, parsed and held to the summary's count of
/// `samples`; a loose group's (`loose`) also holds each object's label and
/// ETag, and object keys beneath the prefix.
pub fn parse_shard_index(
    bytes: &[u8],
    location: &str,
    samples: u64,
    loose: bool,
) -> Result<ShardIndex, DatasetError> {
    let loaded: ShardIndex = parse_json(bytes, location)?;
    let count = loaded.keys.len();
    if count as u64 != samples
        || loaded.starts.len() != count
        || loaded.ends.len() != count
        || (loose && (loaded.labels.len() != count || loaded.etags.len() != count))
    {
        return Err(DatasetError::CorruptIndex {
            location: location.to_string(),
            message: format!(
                "expected {samples} samples{}",
                if loose { " with labels and ETags" } else { "" }
            ),
        });
    }
    if loose {
        // Object keys come from the file: they must stay under the prefix.
        if let Some(message) = loaded.keys.iter().find_map(|k| check_shard_name(k).err()) {
            return Err(DatasetError::CorruptIndex {
                location: location.to_string(),
                message,
            });
        }
    }
    Ok(loaded)
}

pub(super) fn to_json<T: Serialize>(value: &T) -> Bytes {
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
