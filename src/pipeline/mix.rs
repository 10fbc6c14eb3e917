//! A mixed stream's producer. One feeder task per source walks that
//! source's slices of parts ([`crate::plan::mix`]) with the same bounded
//! readers and shuffle buffer as a single stream, and queues its samples
//! (at most a batch's worth); the producer takes each batch's count of every
//! source, in source order, and decodes the batch as any other.
//!
//! A source reads one part at a time, so a mixed stream holds, per source,
//! one stream's readers and shuffle buffer plus its queue, and one stream's
//! batches in all (see `StreamCost::mixed`).

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::batch::BatchSender;
use super::context::{Source, SourcePart, StreamCommon};
use super::dispatch::BatchDispatch;
use super::error::PipelineError;
use super::sample::EmittedSample;
use super::walk::SampleWalker;
use crate::plan::mix::MixPlan;

/// A mixed stream's sources and plan.
pub(super) struct Mixing<'a> {
    pub sources: &'a [Source],
    pub plan: &'a std::sync::Arc<MixPlan>,
    /// The index of the stream's first batch in its epoch.
    pub first_index: u64,
}

type SampleSender = mpsc::Sender<Result<EmittedSample, PipelineError>>;

pub(super) async fn produce_mixed(
    common: &StreamCommon,
    mix: Mixing<'_>,
    tx: &BatchSender,
    span: tracing::Span,
) -> Result<(), PipelineError> {
    let plan = mix.plan;
    let batch_size = plan.batch_size as usize;
    // Dropped with the producer: aborts every feeder and its readers.
    let mut feeders = JoinSet::new();
    let mut queues = Vec::with_capacity(plan.sources());
    for (k, need) in plan.source_needs().into_iter().enumerate() {
        let (sender, receiver) = mpsc::channel(batch_size.max(1));
        let feed = feed_source(
            common.config.clone(),
            mix.sources[k].clone(),
            plan.clone(),
            k,
            need,
            sender,
        );
        feeders.spawn(tracing::Instrument::instrument(feed, span.clone()));
        queues.push(receiver);
    }
    let mut dispatch = BatchDispatch::new(common, tx, mix.first_index, plan.rank);
    for counts in plan.batch_counts() {
        let mut samples = Vec::with_capacity(batch_size);
        for (k, &count) in counts.iter().enumerate() {
            for _ in 0..count {
                let sample = queues[k].recv().await.ok_or_else(|| {
                    PipelineError::Internal(format!("source {k}'s reader stopped early"))
                })??;
                samples.push(sample);
            }
        }
        if !dispatch.submit(samples).await? {
            return Ok(());
        }
    }
    dispatch.finish().await
}

/// Queues the `need` samples of source `k` this stream takes, part by part.
async fn feed_source(
    config: super::config::PipelineConfig,
    source: Source,
    plan: std::sync::Arc<MixPlan>,
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
