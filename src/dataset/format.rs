//! What each shard of an index is: the one table that names the formats.
//! A shard is a whole tar or TFRecord object streamed through the splitter,
//! a row group of a Parquet file, or a virtual group of loose objects; what
//! differs between them for the rest of the server (the bytes of its object
//! it is, what reading it holds, where its per-shard index comes from, what
//! versions it, whether the shard cache holds it whole) is answered here,
//! through [`ShardEntry`](super::ShardEntry)'s methods, so no other file
//! branches on a shard's format to ask. The pipeline's readers name each
//! kind's reader (`pipeline/readers.rs`), the index's scan each format's
//! scan (`build.rs`).
//!
//! On disk an entry keeps the summary's fields as shardfeed has always
//! written them (`digest` for a group, `row_group` for a row group), so a
//! summary saved by an earlier `shardfeed index` loads, and a dataset's
//! identity (a hash of the summary) does not move.

use serde::{Deserialize, Serialize};

use crate::shard::{ShardFormat, StreamedFormat};

/// A shard's format, and the part of its object it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardKind {
    /// A whole `*.tar` or `*.tfrecord(s)` object, read in large sequential
    /// ranges through the splitter.
    Streamed(StreamedFormat),
    /// A row group of a Parquet file (the entry's `name`): the entry's
    /// `size` its column chunks' bytes, `samples` its rows, planned from
    /// the file's footer.
    RowGroup(RowGroupRef),
    /// A virtual group of loose objects, one GET per sample. `digest`
    /// hashes its members' keys, ETags and labels, so the summary changes
    /// when its membership does; none when the listing gives no ETags.
    Objects { digest: Option<String> },
}

/// Where a Parquet row group lies in its file, from the file's footer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowGroupRef {
    /// Its number in the file.
    pub group: u32,
    /// The file's row number of its first row (rows are keyed by theirs).
    pub first_row: u64,
    /// Its first byte in the file (its column chunks are `size` bytes on).
    pub offset: u64,
    /// Its column chunks' bytes once decompressed: with `size`, what a
    /// reader holds to read it (`shard::parquet::row_group_cost`).
    pub uncompressed: u64,
    /// The whole file's size: where its footer is.
    pub file_size: u64,
}

impl ShardKind {
    /// A listed shard's kind from its name (`None`: not a streamed shard).
    pub fn streamed(name: &str) -> Option<Self> {
        match ShardFormat::from_name(name)? {
            ShardFormat::Streamed(format) => Some(Self::Streamed(format)),
            ShardFormat::Parquet => None,
        }
    }

    /// The kind a summary's entry names: a row group carries its place, a
    /// group its digest (or none), a listed shard's name its format (a
    /// group's name, `objects-000042`, has no extension).
    pub(super) fn from_record(
        name: &str,
        digest: Option<String>,
        row_group: Option<RowGroupRef>,
    ) -> Self {
        match (row_group, digest) {
            (Some(group), _) => Self::RowGroup(group),
            (None, Some(digest)) => Self::Objects {
                digest: Some(digest),
            },
            (None, None) => Self::streamed(name).unwrap_or(Self::Objects { digest: None }),
        }
    }

    /// The summary's `digest` and `row_group` fields for this kind.
    pub(super) fn into_record(self) -> (Option<String>, Option<RowGroupRef>) {
        match self {
            Self::Streamed(_) => (None, None),
            Self::RowGroup(group) => (None, Some(group)),
            Self::Objects { digest } => (digest, None),
        }
    }

    /// The bytes of its object a shard of `size` bytes is: a row group's,
    /// or all.
    pub(super) fn byte_range(&self, size: u64) -> std::ops::Range<u64> {
        match self {
            Self::RowGroup(group) => group.offset..group.offset + size,
            Self::Streamed(_) | Self::Objects { .. } => 0..size,
        }
    }

    /// The size of the object the shard is part of (a row group's file).
    pub(super) fn object_size(&self, size: u64) -> u64 {
        match self {
            Self::RowGroup(group) => group.file_size,
            Self::Streamed(_) | Self::Objects { .. } => size,
        }
    }

    /// What one reader holds to read the shard beyond the stream's parts
    /// and samples in flight (those are the stream's own terms): a row
    /// group's column chunks and their decompressed pages
    /// (`shard::parquet::row_group_cost`); 0 for a streamed shard or a
    /// group.
    pub(super) fn read_cost(&self, size: u64, samples: u64) -> u64 {
        match self {
            Self::RowGroup(group) => {
                crate::shard::parquet::row_group_cost(size, group.uncompressed, samples)
            }
            Self::Streamed(_) | Self::Objects { .. } => 0,
        }
    }

    /// What tells a changed shard from the one indexed, beside its
    /// object's ETag: a group's digest.
    pub(super) fn version(&self) -> Option<&String> {
        match self {
            Self::Objects { digest } => digest.as_ref(),
            Self::Streamed(_) | Self::RowGroup(_) => None,
        }
    }

    /// Memory the kind holds beyond the entry's struct.
    pub(super) fn held_bytes(&self) -> u64 {
        self.version().map_or(0, |digest| digest.len() as u64)
    }

    /// The shard's samples keyed by their row numbers, when the entry alone
    /// makes its per-shard index (a row group's rows have no byte ranges of
    /// their own: theirs is the row group's); None when the index is a file
    /// (or the scan's, held in memory).
    pub(super) fn rows(&self, samples: u64) -> Option<std::ops::Range<u64>> {
        match self {
            Self::RowGroup(group) => Some(group.first_row..group.first_row + samples),
            Self::Streamed(_) | Self::Objects { .. } => None,
        }
    }

    /// Whether the shard cache holds the shard as its object whole (a row
    /// group is part of its file: the file's cached bytes do not say
    /// whether its own are).
    pub(super) fn cached_whole(&self) -> bool {
        match self {
            Self::Streamed(_) | Self::Objects { .. } => true,
            Self::RowGroup(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::{DatasetIndex, DatasetLayout};

    /// Summaries as earlier releases wrote them: each entry reads to its
    /// kind and writes back byte for byte, so saved summaries load and
    /// identities (resume positions carry them) stay.
    #[test]
    fn summaries_written_before_read_and_write_back_the_same() {
        let shards = r#"{"version":1,"layout":"shards","shards":[{"name":"a/train-000.tar","size":10,"etag":"\"e1\"","samples":2},{"name":"b.tfrecord","size":9,"etag":null,"samples":1},{"name":"c.parquet","size":50,"etag":"\"e2\"","samples":3,"row_group":{"group":1,"first_row":7,"offset":4,"uncompressed":90,"file_size":200}}]}"#;
        let objects = r#"{"version":1,"layout":"objects","shards":[{"name":"objects-000000","size":30,"etag":null,"samples":2,"digest":"00ff"},{"name":"objects-000001","size":10,"etag":null,"samples":1}],"classes":["cat"]}"#;
        for json in [shards, objects] {
            let index: DatasetIndex = serde_json::from_str(json).unwrap();
            assert_eq!(serde_json::to_string(&index).unwrap(), json);
        }
        let index: DatasetIndex = serde_json::from_str(shards).unwrap();
        let kinds: Vec<_> = index.shards.iter().map(|s| s.kind.clone()).collect();
        assert_eq!(kinds[0], ShardKind::Streamed(StreamedFormat::Tar));
        assert_eq!(kinds[1], ShardKind::Streamed(StreamedFormat::TfRecord));
        assert!(matches!(
            kinds[2],
            ShardKind::RowGroup(RowGroupRef { group: 1, .. })
        ));
        assert_eq!(index.shards[2].byte_range(), 4..54);
        assert_eq!(index.shards[2].object_size(), 200);
        let index: DatasetIndex = serde_json::from_str(objects).unwrap();
        assert_eq!(index.layout, DatasetLayout::Objects);
        assert_eq!(index.shards[0].version().map(String::as_str), Some("00ff"));
        assert_eq!(
            index.shards[1].kind,
            ShardKind::Objects { digest: None },
            "an unversioned group is still a group"
        );
    }
}
