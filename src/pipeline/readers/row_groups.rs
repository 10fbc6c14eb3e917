//! The reader of a Parquet row group: its projected column chunks fetched
//! as large ranged GETs (several parts in flight, as a tar shard's), then
//! decoded off the runtime into the segment's rows.

use std::ops::Range;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;

use super::job::{ReadJob, SampleResult, SegmentReader};
use crate::dataset::{RowGroupRef, ShardIndex};
use crate::pipeline::error::PipelineError;
use crate::shard::parquet::{
    fetch_ranges, read_rows, row_group_cost, row_group_limit, ChunkBytes, ParquetError, Projection,
    RowGroupInput, BYTES_PER_ROW,
};
use crate::shard::ShardError;
use crate::store::read::read_parts;

/// A Parquet file's row group ([`crate::dataset::ShardKind::RowGroup`]).
pub(super) struct RowGroup(pub RowGroupRef);

impl SegmentReader for RowGroup {
    /// Pages past damage cannot be decoded.
    const DAMAGE_ENDS_SEGMENT: bool = true;

    async fn read(
        &self,
        job: &ReadJob,
        _index: &ShardIndex,
        tx: &mpsc::Sender<SampleResult>,
        next: &mut u64,
    ) -> Result<(), PipelineError> {
        let group_ref = self.0;
        let entry = &job.dataset.index.shards[job.shard as usize];
        let key = job.dataset.shard_key(job.shard);
        let location = job.dataset.store.location(&key);
        let shard_error = |source: ParquetError| PipelineError::Shard {
            location: location.clone(),
            source: ShardError::Parquet(source),
        };
        let footer = job.dataset.parquet_footer(job.shard).await?;
        let group = group_ref.group as usize;
        let schema = footer.metadata.file_metadata().schema_descr();
        let projection = Projection::resolve(schema, &job.layout.columns, &job.layout.fields)
            .map_err(shard_error)?;
        let mut chunks = Vec::new();
        let (mut compressed, mut uncompressed) = (0u64, 0u64);
        for column in projection.leaves() {
            let range = footer.chunk_range(group, column).map_err(shard_error)?;
            let meta = footer.metadata.row_group(group).column(column);
            compressed += range.end - range.start;
            uncompressed += u64::try_from(meta.uncompressed_size()).unwrap_or(u64::MAX);
            chunks.push((column, range));
        }
        let cost = row_group_cost(compressed, uncompressed, entry.samples);
        let limit = row_group_limit(job.max_member);
        if cost > limit {
            return Err(shard_error(ParquetError::RowGroupTooLarge {
                group,
                bytes: cost,
                limit,
                per_row: BYTES_PER_ROW,
            }));
        }
        let ranges = fetch_ranges(chunks.iter().map(|(_, r)| r.clone()).collect());
        // Each range's parts as they arrived: pages are sliced out of them.
        let mut parts: Vec<(u64, Bytes)> = Vec::new();
        for range in ranges {
            job.fetch(&key, range, &mut parts).await?;
        }
        let chunks = chunks
            .into_iter()
            .map(|(column, range)| (column, chunk_of(&parts, range)))
            .collect::<Vec<_>>();
        drop(parts);
        let (from, to) = (*next, job.end);
        let layout = job.layout.clone();
        let classes = job.dataset.class_names();
        let decoded = tokio::task::spawn_blocking(move || {
            let input = RowGroupInput {
                footer: &footer,
                group,
                first_row: group_ref.first_row,
                projection: &projection,
                chunks,
                classes: &classes,
                max_field_bytes: layout.max_field_bytes,
            };
            read_rows(&input, from, to)
        })
        .await;
        let samples = match decoded {
            Ok(result) => result.map_err(shard_error)?,
            // The crate's page decoding panicked on the file's bytes.
            Err(error) => {
                return Err(shard_error(ParquetError::Pages {
                    group,
                    column: "*".into(),
                    why: format!("the page reader failed: {error}"),
                }))
            }
        };
        let range = entry.byte_range();
        for row in samples {
            let sample = crate::shard::row_sample(row, range.clone());
            if tx.send(Ok((*next, sample))).await.is_err() {
                return Ok(());
            }
            *next += 1;
        }
        if *next < job.end {
            return Err(PipelineError::StaleIndex {
                location,
                index: *next,
                expected: (group_ref.first_row + *next).to_string(),
                found: "<end of row group>".into(),
            });
        }
        Ok(())
    }
}

impl ReadJob {
    /// One range of the file, read as the stream's parts (several GETs in
    /// flight), each appended to `parts` with its file offset.
    async fn fetch(
        &self,
        key: &str,
        range: Range<u64>,
        parts: &mut Vec<(u64, Bytes)>,
    ) -> Result<(), PipelineError> {
        let entry = &self.dataset.index.shards[self.shard as usize];
        let mut fetched = std::pin::pin!(read_parts(
            self.dataset.store.clone(),
            key.to_string(),
            range,
            entry.etag.clone(),
            &self.read,
        ));
        while let Some(part) = fetched.next().await {
            parts.push(part?);
        }
        Ok(())
    }
}

/// The bytes of `range` out of the fetched `parts` (file offset, bytes;
/// in order, covering it), sliced without a copy.
fn chunk_of(parts: &[(u64, Bytes)], range: Range<u64>) -> ChunkBytes {
    let pieces = parts
        .iter()
        .filter_map(|(offset, bytes)| {
            let end = offset + bytes.len() as u64;
            let (from, to) = (range.start.max(*offset), range.end.min(end));
            (from < to).then(|| bytes.slice((from - offset) as usize..(to - offset) as usize))
        })
        .collect();
    ChunkBytes::new(range.start, pieces)
}
