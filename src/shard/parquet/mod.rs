//! Parquet files as shards, laid out as the Hugging Face Hub stores image
//! datasets: an `image` column (binary, or the `datasets` library's
//! `Image` struct of `bytes` and `path`), a `label` column (integers, or
//! strings naming classes), class names in the schema's `huggingface`
//! metadata.
//!
//! The unit of reading is the row group: the index lists each row group of
//! each file as a shard of its own (its rows from the footer, read with one
//! ranged GET of the file's tail), so the plan shuffles row groups and
//! interleaves them in its shuffle buffer as it does tar shards. A reader
//! GETs a row group's projected column chunks (the image, label and asked
//! fields: nothing else) as large ranges, then decodes them here off the
//! runtime. A sample is a row: its key is its row number in the file.
//!
//! What a reader holds (the stream's memory formula counts it per reader):
//! the row group's projected chunks as fetched, plus their decompressed
//! pages, plus the samples copied out of them: at most
//! `compressed + 2 × uncompressed` of the projected chunks, which the index
//! bounds by the row group's own sizes ([`row_group_cost`]).

mod checked_pages;
mod chunk;
mod classes;
pub mod columns;
mod error;
mod expansion;
pub mod footer;
pub mod rows;
mod thrift_guard;

use std::ops::Range;

pub use chunk::ChunkBytes;
pub use classes::ClassNames;
pub use columns::{ColumnNames, Projection};
pub use error::ParquetError;
pub use footer::{Footer, RowGroupSpan};
pub use rows::{label_names, read_rows, Row, RowGroupInput, RowLabel};

/// Two projected column chunks closer than this are read as one range: a
/// GET's latency costs more than the gap's bytes.
pub const COALESCE_GAP_BYTES: u64 = 1 << 20;

/// What a row costs a reader beyond its bytes: its sample (key, name,
/// label, the image's handle), the crate's value and level for each
/// column, and the shard index's key and range. Measured: 2^22 rows of
/// empty images held 1,424 MiB (~340 B a row) before rows were charged.
pub const BYTES_PER_ROW: u64 = 384;

/// What a reader holds to read a row group of `rows` rows, `compressed`
/// bytes that decompress to `uncompressed`: the fetched chunks, their
/// pages, the samples copied out of the pages, and each row's own cost
/// ([`BYTES_PER_ROW`]: a group of millions of empty rows is not free).
pub fn row_group_cost(compressed: u64, uncompressed: u64, rows: u64) -> u64 {
    compressed
        .saturating_add(uncompressed.saturating_mul(2))
        .saturating_add(rows.saturating_mul(BYTES_PER_ROW))
}

/// The most [`row_group_cost`] one reader may hold: eight times the
/// largest tar member a reader takes (`--max-member-bytes`, 64 MiB by
/// default, so 512 MiB: a 128 MB Spark row group of JPEGs, 384 MB to read,
/// fits; a 1 GB one is refused).
pub fn row_group_limit(max_member_bytes: u64) -> u64 {
    max_member_bytes.saturating_mul(8)
}

/// The ranges to GET for `chunks` (sorted by offset): neighbours closer
/// than [`COALESCE_GAP_BYTES`] merged.
pub fn fetch_ranges(mut chunks: Vec<Range<u64>>) -> Vec<Range<u64>> {
    chunks.sort_by_key(|c| c.start);
    let mut ranges: Vec<Range<u64>> = Vec::with_capacity(chunks.len());
    for chunk in chunks {
        match ranges.last_mut() {
            Some(last) if chunk.start <= last.end.saturating_add(COALESCE_GAP_BYTES) => {
                last.end = last.end.max(chunk.end);
            }
            _ => ranges.push(chunk),
        }
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_chunks_are_one_get_and_far_ones_their_own() {
        assert_eq!(
            fetch_ranges(vec![100..200, 4..100, (5 << 20)..(6 << 20)]),
            vec![4..200, (5 << 20)..(6 << 20)]
        );
        assert_eq!(fetch_ranges(vec![4..10, 10..20]), vec![4..20]);
        assert!(fetch_ranges(Vec::new()).is_empty());
    }
}
