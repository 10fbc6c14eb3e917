//! A stream plan walked sample by sample: its slices in order, each with its
//! shard readers and its shuffle buffer of real samples.

use std::collections::HashMap;
use std::sync::Arc;

use super::config::PipelineConfig;
use super::context::{Source, SourcePart};
use super::error::PipelineError;
use super::readers::ShardReaders;
use super::sample::{EmittedSample, SampleOrigin};
use crate::plan::{RankPlan, ResumedSlice, SampleRef, Schedule, Step};
use crate::shard::RawSample;

/// The samples a source part's plan emits, in order.
pub(super) struct SampleWalker<'a> {
    config: &'a PipelineConfig,
    source: &'a Source,
    origin: Arc<SampleOrigin>,
    slices: Box<dyn Iterator<Item = ResumedSlice<'a>> + Send + 'a>,
    current: Option<SliceWalk<'a>>,
}

/// The slice being read.
struct SliceWalk<'a> {
    rank_plan: &'a RankPlan,
    schedule: Schedule<'a>,
    readers: ShardReaders<'a>,
    buffer: HashMap<SampleRef, RawSample>,
    emitted: u64,
    emits: u64,
}

impl<'a> SampleWalker<'a> {
    pub fn new(config: &'a PipelineConfig, part: SourcePart<'a>) -> Self {
        Self {
            config,
            source: part.source,
            origin: Arc::new(part.origin()),
            slices: Box::new(part.plan.resumed_slices()),
            current: None,
        }
    }

    /// The next emitted sample; `None` once the plan has emitted them all.
    pub async fn next(&mut self) -> Result<Option<EmittedSample>, PipelineError> {
        loop {
            let walk = match &mut self.current {
                Some(walk) if walk.emitted < walk.emits => walk,
                _ => {
                    let Some(slice) = self.slices.next() else {
                        return Ok(None);
                    };
                    let mut readers = ShardReaders::new(
                        self.config,
                        self.source,
                        slice.rank_plan,
                        slice.segment_starts,
                    );
                    let mut buffer = HashMap::with_capacity(slice.held.len());
                    for sample in slice.held {
                        buffer.insert(sample, readers.take(sample).await?);
                    }
                    self.current.insert(SliceWalk {
                        rank_plan: slice.rank_plan,
                        schedule: slice.schedule,
                        readers,
                        buffer,
                        emitted: 0,
                        emits: slice.emits,
                    })
                }
            };
            match walk.schedule.next() {
                Some(Step::Pull(sample)) => {
                    let raw = walk.readers.take(sample).await?;
                    walk.buffer.insert(sample, raw);
                }
                Some(Step::Emit(sample)) => {
                    let raw = walk.buffer.remove(&sample).ok_or_else(|| {
                        PipelineError::Internal(format!("{sample:?} emitted before it was pulled"))
                    })?;
                    walk.emitted += 1;
                    let segment = &walk.rank_plan.segments[sample.segment as usize];
                    return Ok(Some(EmittedSample {
                        shard: segment.shard,
                        padding: segment.padding,
                        copy: segment.copy,
                        origin: self.origin.clone(),
                        sample: raw,
                    }));
                }
                None => {
                    return Err(PipelineError::Internal(format!(
                        "schedule ended after {} of {} samples",
                        walk.emitted, walk.emits
                    )))
                }
            }
        }
    }
}
