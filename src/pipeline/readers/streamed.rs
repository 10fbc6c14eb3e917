//! The reader of a tar or TFRecord shard's segment: one sequential byte
//! range, read as large ranged GETs (several in flight) and split into
//! samples as the bytes arrive, each checked against the index's key.

use futures::StreamExt;
use tokio::sync::mpsc;

use super::job::{ReadJob, SampleResult, SegmentReader};
use crate::dataset::ShardIndex;
use crate::pipeline::error::PipelineError;
use crate::shard::splitter::SampleSplitter;
use crate::shard::StreamedFormat;
use crate::store::read::read_parts;

/// A whole object streamed through the splitter
/// ([`crate::dataset::ShardKind::Streamed`]).
pub(super) struct Streamed(pub StreamedFormat);

impl SegmentReader for Streamed {
    /// A stream cannot be split past damage.
    const DAMAGE_ENDS_SEGMENT: bool = true;

    async fn read(
        &self,
        job: &ReadJob,
        index: &ShardIndex,
        tx: &mpsc::Sender<SampleResult>,
        next: &mut u64,
    ) -> Result<(), PipelineError> {
        let entry = &job.dataset.index.shards[job.shard as usize];
        let key = job.dataset.shard_key(job.shard);
        let location = job.dataset.store.location(&key);
        let range = index.starts[job.first as usize]..index.ends[job.end as usize - 1];
        let mut splitter = SampleSplitter::for_format(
            self.0,
            range.start,
            job.first,
            job.max_member,
            job.layout.clone(),
        );
        let mut parts = std::pin::pin!(read_parts(
            job.dataset.store.clone(),
            key,
            range,
            entry.etag.clone(),
            &job.read,
        ));
        let shard_error = |source| PipelineError::Shard {
            location: location.clone(),
            source,
        };
        let mut finished = false;
        loop {
            let sample = if finished {
                splitter.finish().map_err(shard_error)?
            } else {
                match splitter.next_sample().map_err(shard_error)? {
                    Some(sample) => Some(sample),
                    None => {
                        match parts.next().await {
                            Some(part) => splitter.push(&part?.1),
                            None => finished = true,
                        }
                        continue;
                    }
                }
            };
            let Some(sample) = sample else { break };
            if *next >= job.end {
                break;
            }
            let expected = &index.keys[*next as usize];
            if *expected != sample.key {
                return Err(PipelineError::StaleIndex {
                    location,
                    index: *next,
                    expected: expected.clone(),
                    found: sample.key,
                });
            }
            if tx.send(Ok((*next, sample))).await.is_err() {
                return Ok(());
            }
            *next += 1;
        }
        if *next < job.end {
            return Err(PipelineError::StaleIndex {
                location,
                index: *next,
                expected: index.keys[*next as usize].clone(),
                found: "<end of range>".into(),
            });
        }
        Ok(())
    }
}
