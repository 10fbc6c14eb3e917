//! A mixed stream's producer. One feeder task per source walks that
//! source's slices of parts ([`crate::plan::mix`]) with the same bounded
//! readers and shuffle buffer as a single stream, and queues its samples
//! (at most a batch's worth); the producer takes each batch's count of every
//! source, in source order, and decodes the batch as any other.
//!
//! A source reads one part at a time, so a mixed stream holds, per source,
//! one stream's readers and shuffle buffer plus its queue, and one stream's
//! batches in all (see `StreamCost::mixed`).

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::batch::{BatchDispatch, EmittedSample, SampleOrigin};
use super::walk::SampleWalker;
use super::{spawn_producer, BatchReceiver, DecodedBatch, PipelineError, StreamContext};
use crate::plan::mix::MixPlan;

/// What a mixed stream needs to run.
pub struct MixedStreamContext {
    /// Per source: its dataset, layout and cache hints; the shared parts
    /// (decoder, pool, output, ring) are taken from the first. `plan`,
    /// `seed` and `epoch` are set per part.
    pub sources: Vec<StreamContext>,
    pub plan: Arc<MixPlan>,
    /// The index of the stream's first batch in its epoch.
    pub first_index: u64,
}

type SampleSender = mpsc::Sender<Result<EmittedSample, PipelineError>>;

/// Starts a mixed stream's producer; see [`super::spawn_stream`].
pub fn spawn_mixed_stream<H: Send + 'static>(
    context: MixedStreamContext,
    span: tracing::Span,
    held: H,
) -> BatchReceiver {
    let capacity = context.sources[0].config.ready_batches;
    let feeders_span = span.clone();
    spawn_producer(capacity, span, held, move |tx| async move {
        produce_mixed(&context, &tx, feeders_span).await
    })
}

async fn produce_mixed(
    context: &MixedStreamContext,
    tx: &mpsc::Sender<Result<DecodedBatch, PipelineError>>,
    span: tracing::Span,
) -> Result<(), PipelineError> {
    let plan = &context.plan;
    let shared = &context.sources[0];
    let batch_size = plan.batch_size as usize;
    // Dropped with the producer: aborts every feeder and its readers.
    let mut feeders = JoinSet::new();
    let mut queues = Vec::with_capacity(plan.sources());
    for (k, need) in plan.source_needs().into_iter().enumerate() {
        let (sender, receiver) = mpsc::channel(batch_size.max(1));
        let feed = feed_source(context.sources[k].clone(), plan.clone(), k, need, sender);
        feeders.spawn(tracing::Instrument::instrument(feed, span.clone()));
        queues.push(receiver);
    }
    let mut dispatch = BatchDispatch::new(shared, tx, context.first_index, plan.rank);
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
    template: StreamContext,
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
            let context = StreamContext {
                plan: Arc::new(part),
                seed: plan.source_seed(k),
                epoch: slice.part.epoch,
                ..template.clone()
            };
            let origin = Arc::new(SampleOrigin {
                dataset: context.dataset.clone(),
                seed: context.seed,
                epoch: context.epoch,
                label_offset: context.layout.label_offset,
                source: k as u32,
            });
            let mut walker = SampleWalker::new(&context, origin);
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
