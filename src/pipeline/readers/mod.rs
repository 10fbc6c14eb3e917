//! The shard readers of a stream: one task per planned byte range of a
//! shard (or group of loose objects), started in order a window ahead, each
//! sending its samples, in order, into a bounded channel.

mod job;
mod objects;
mod row_groups;
mod streamed;

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use self::job::{ReadJob, SampleResult, SegmentReader};
use super::config::PipelineConfig;
use super::context::Source;
use super::error::PipelineError;
use crate::dataset::{ShardIndex, ShardKind};
use crate::metrics;
use crate::plan::{RankPlan, SampleRef};
use crate::shard::{BadShardPolicy, RawSample, ShardError};
use crate::store::StoreError;

/// The shard readers of one rank plan, one per segment (a byte range of a
/// shard), started in order, a window ahead.
pub(super) struct ShardReaders<'a> {
    config: &'a PipelineConfig,
    source: &'a Source,
    plan: &'a RankPlan,
    starts: Vec<Option<u64>>,
    receivers: HashMap<u32, mpsc::Receiver<SampleResult>>,
    /// Aborts every reader when the stream ends or is dropped.
    tasks: JoinSet<()>,
    next_to_spawn: u32,
    /// Loose GETs in flight, as the stream's readers sized them so far.
    object_requests: Arc<AtomicUsize>,
}

impl<'a> ShardReaders<'a> {
    pub(super) fn new(
        config: &'a PipelineConfig,
        source: &'a Source,
        plan: &'a RankPlan,
        starts: Vec<Option<u64>>,
    ) -> Self {
        Self {
            config,
            source,
            plan,
            starts,
            receivers: HashMap::new(),
            tasks: JoinSet::new(),
            next_to_spawn: 0,
            object_requests: Arc::new(AtomicUsize::new(config.read.object_requests_in_flight)),
        }
    }

    fn ensure_spawned(&mut self, segment: u32) {
        let last = (segment as usize + self.config.prefetch_shards)
            .min(self.plan.segments.len().saturating_sub(1)) as u32;
        while self.next_to_spawn <= last {
            let index = self.next_to_spawn;
            self.next_to_spawn += 1;
            let Some(first) = self.starts[index as usize] else {
                continue;
            };
            let segment = self.plan.segments[index as usize];
            let (tx, rx) = mpsc::channel(self.config.reader_queue.max(1));
            self.receivers.insert(index, rx);
            if let Some(hints) = &self.source.cache_hints {
                let location = self
                    .source
                    .dataset
                    .store
                    .location(&self.source.dataset.shard_key(segment.shard));
                for follower in &hints.followers {
                    follower.reached(&hints.stream, &location);
                }
            }
            let job = ReadJob {
                dataset: self.source.dataset.clone(),
                layout: self.source.layout.clone(),
                shard: segment.shard,
                first,
                end: segment.end,
                read: self.config.read.clone(),
                max_member: self.config.max_member_bytes,
                on_bad_shard: self.config.on_bad_shard,
                object_requests: self.object_requests.clone(),
            };
            self.tasks.spawn(async move {
                if let Err(error) = job.run(&tx).await {
                    let _ = tx.send(Err(error)).await;
                }
            });
        }
    }

    /// The bytes of `sample`, skipping samples its reader had to read past.
    pub(super) async fn take(&mut self, sample: SampleRef) -> Result<RawSample, PipelineError> {
        self.ensure_spawned(sample.segment);
        let end = self.plan.segments[sample.segment as usize].end;
        let receiver = self.receivers.get_mut(&sample.segment).ok_or_else(|| {
            PipelineError::Internal(format!("no reader for segment {}", sample.segment))
        })?;
        loop {
            match receiver.recv().await {
                Some(Ok((index, raw))) if index == sample.index => {
                    if index + 1 == end {
                        self.receivers.remove(&sample.segment);
                    }
                    return Ok(raw);
                }
                // Emitted before the resume point: parsed, never decoded.
                Some(Ok((index, _))) if index < sample.index => continue,
                Some(Ok((index, _))) => {
                    return Err(PipelineError::Internal(format!(
                        "reader passed sample {} (at {index})",
                        sample.index
                    )))
                }
                Some(Err(error)) => return Err(error),
                None => {
                    return Err(PipelineError::Internal(format!(
                        "reader for segment {} ended before sample {}",
                        sample.segment, sample.index
                    )))
                }
            }
        }
    }
}

impl ReadJob {
    async fn run(self, tx: &mpsc::Sender<SampleResult>) -> Result<(), PipelineError> {
        let index = self.dataset.shard_index(self.shard).await?;
        match self.dataset.index.shards[self.shard as usize].kind {
            ShardKind::Streamed(format) => {
                self.drive(&streamed::Streamed(format), &index, tx).await
            }
            ShardKind::RowGroup(group) => {
                self.drive(&row_groups::RowGroup(group), &index, tx).await
            }
            ShardKind::Objects { .. } => self.drive(&objects::Objects, &index, tx).await,
        }
    }

    /// Reads the segment with `reader`; a damaged one under `--on-bad-shard
    /// skip` has its unread rest substituted.
    async fn drive<R: SegmentReader>(
        &self,
        reader: &R,
        index: &ShardIndex,
        tx: &mpsc::Sender<SampleResult>,
    ) -> Result<(), PipelineError> {
        let mut next = self.first;
        let result = reader.read(self, index, tx, &mut next).await;
        if !R::DAMAGE_ENDS_SEGMENT {
            return result;
        }
        // A field over the request's cap, or a Parquet file whose columns
        // are not what the request reads, is not damage.
        let damaged = match &result {
            Err(PipelineError::Shard { source, .. }) => match source {
                ShardError::FieldTooLarge { .. } => false,
                ShardError::Parquet(error) => !error.is_precondition(),
                _ => true,
            },
            Err(PipelineError::StaleIndex { .. })
            | Err(PipelineError::Store(StoreError::Truncated { .. })) => true,
            _ => false,
        };
        if !(damaged && self.on_bad_shard == BadShardPolicy::Skip) {
            return result;
        }
        let Err(error) = result else { return Ok(()) };
        // Keep every rank's counts: the rest of the range becomes
        // placeholders that the decode stage substitutes.
        metrics::bad_shard();
        tracing::warn!(
            %error,
            substituted = self.end - next,
            "skipping the rest of a damaged shard (--on-bad-shard skip)"
        );
        let why = error.to_string();
        while next < self.end {
            let placeholder = RawSample::unreadable(index.keys[next as usize].clone(), why.clone());
            if tx.send(Ok((next, placeholder))).await.is_err() {
                break;
            }
            next += 1;
        }
        Ok(())
    }
}
