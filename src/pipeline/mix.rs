//! A mixed stream's supply of samples. One feeder task per source walks that
//! source's slices of parts ([`crate::plan::mix`]) with the same bounded
//! readers and shuffle buffer as a single stream, and queues its samples
//! (at most a batch's worth); the supply takes each batch's count of every
//! source, in source order, and the producer (`produce.rs`) decodes the
//! batch as any other.
//!
//! A source reads one part at a time, so a mixed stream holds, per source,
//! one stream's readers and shuffle buffer plus its queue, and one stream's
//! batches in all (see `StreamCost::mixed`).

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::config::PipelineConfig;
use super::context::{Source, SourcePart};
use super::error::PipelineError;
use super::sample::EmittedSample;
use super::walk::SampleWalker;
use crate::plan::mix::MixPlan;

type SampleSender = mpsc::Sender<Result<EmittedSample, PipelineError>>;

/// A mixed stream's samples, batch by batch, from its feeders' queues.
pub(super) struct MixSupply<'a> {
    /// Dropped with the supply: aborts every feeder and its readers.
    _feeders: JoinSet<()>,
    queues: Vec<mpsc::Receiver<Result<EmittedSample, PipelineError>>>,
    counts: Box<dyn Iterator<Item = Vec<u64>> + Send + 'a>,
    batch_size: usize,
}

impl<'a> MixSupply<'a> {
    /// Starts one feeder per source, each queueing at most a batch.
    pub fn start(
        config: &PipelineConfig,
        sources: &[Source],
        plan: &'a Arc<MixPlan>,
        span: tracing::Span,
    ) -> Self {
        let batch_size = plan.batch_size as usize;
        let mut feeders = JoinSet::new();
        let mut queues = Vec::with_capacity(plan.sources());
        for (k, need) in plan.source_needs().into_iter().enumerate() {
            let (sender, receiver) = mpsc::channel(batch_size.max(1));
            let feed = feed_source(
                config.clone(),
                sources[k].clone(),
                plan.clone(),
                k,
                need,
                sender,
            );
            feeders.spawn(tracing::Instrument::instrument(feed, span.clone()));
            queues.push(receiver);
        }
        Self {
            _feeders: feeders,
            queues,
            counts: Box::new(plan.batch_counts()),
            batch_size,
        }
    }

    /// The next batch: its count of every source, in source order.
    pub async fn next_batch(&mut self) -> Result<Option<Vec<EmittedSample>>, PipelineError> {
        let Some(counts) = self.counts.next() else {
            return Ok(None);
        };
        let mut samples = Vec::with_capacity(self.batch_size);
        for (k, &count) in counts.iter().enumerate() {
            for _ in 0..count {
                let sample = self.queues[k].recv().await.ok_or_else(|| {
                    PipelineError::Internal(format!("source {k}'s reader stopped early"))
                })??;
                samples.push(sample);
            }
        }
        Ok(Some(samples))
    }
}

/// Queues the `need` samples of source `k` this stream takes, part by part.
async fn feed_source(
    config: PipelineConfig,
    source: Source,
    plan: Arc<MixPlan>,
    k: usize,
    mut need: u64,
    queue: SampleSender,
) {
    let fed = async {
        for slice in plan.source_slices(k) {
            if need == 0 {
                break;
            }
            let part = plan
                .slice_plan(k, &slice)
                .map_err(|e| PipelineError::Internal(format!("source {k}: {e}")))?;
            let mut walker = SampleWalker::new(
                &config,
                SourcePart {
                    source: &source,
                    plan: &part,
                    seed: plan.source_seed(k),
                    epoch: slice.part.epoch,
                    index: k as u32,
                },
            );
            let take = slice.len().min(need);
            for _ in 0..take {
                let sample = walker.next().await?.ok_or_else(|| {
                    PipelineError::Internal(format!("source {k}: a part ended early"))
                })?;
                if queue.send(Ok(sample)).await.is_err() {
                    return Ok(()); // the stream has stopped
                }
            }
            need -= take;
        }
        Ok::<_, PipelineError>(())
    }
    .await;
    if let Err(error) = fed {
        let _ = queue.send(Err(error)).await;
    }
}
