//! Mixed-stream requests (`StreamBatchesRequest.sources`): checked and
//! translated into the engine's [`MixedStreamRequest`].

use super::pb;
use super::request::{sample_layout, stream_request};
use super::status::ServiceError;
use crate::engine::mix::{MixedSource, MixedStreamRequest};
use crate::plan::mix::{MAX_SOURCES, MAX_WEIGHT_CHANGES};
use crate::plan::{Partition, Phase, ShuffleConfig};

/// The engine's request for a mixed `StreamBatches` call: every field of a
/// single stream's is checked the same way, then the sources and weights.
pub fn mixed_request(
    request: &pb::StreamBatchesRequest,
    defaults: ShuffleConfig,
) -> Result<MixedStreamRequest, ServiceError> {
    let invalid = |message: String| Err(ServiceError::InvalidArgument(message));
    if !request.dataset.is_empty() {
        return invalid(format!(
            "dataset {:?} and sources are both set: a mixed stream names its datasets in \
             sources only",
            request.dataset
        ));
    }
    if request.sources.len() < 2 || request.sources.len() > MAX_SOURCES {
        return invalid(format!(
            "sources: {} given; a mixed stream has 2 to {MAX_SOURCES} (one dataset goes in \
             `dataset`)",
            request.sources.len()
        ));
    }
    if request.weight_changes.len() > MAX_WEIGHT_CHANGES {
        return invalid(format!(
            "weight_changes: {} given; at most {MAX_WEIGHT_CHANGES}",
            request.weight_changes.len()
        ));
    }
    let single = stream_request(request, defaults)?;
    if single.plan.partition != Partition::DropLast {
        return invalid(
            "partition: a mixed stream's epochs count global batches of all its sources; \
             PARTITION_PAD is for one dataset"
                .into(),
        );
    }
    let mut sources = Vec::with_capacity(request.sources.len());
    for (index, source) in request.sources.iter().enumerate() {
        if source.dataset.is_empty() {
            return invalid(format!("sources[{index}].dataset is empty"));
        }
        let layout = match &source.layout {
            None => single.layout.clone(),
            Some(own) if !own.fields.is_empty() => {
                return invalid(format!(
                    "sources[{index}].layout.fields is set: a stream's fields are the same \
                     for every source (set them in `layout`)"
                ))
            }
            Some(own) => {
                let mut layout = sample_layout(Some(own))
                    .map_err(|e| ServiceError::InvalidArgument(format!("sources[{index}].{e}")))?;
                layout.fields = single.layout.fields.clone();
                layout
            }
        };
        sources.push(MixedSource {
            dataset: source.dataset.clone(),
            weight: source.weight,
            layout,
        });
    }
    for (index, change) in request.weight_changes.iter().enumerate() {
        if change.weights.len() != sources.len() {
            return invalid(format!(
                "weight_changes[{index}] has {} weights for {} sources",
                change.weights.len(),
                sources.len()
            ));
        }
    }
    let before_epoch = request
        .resume_from
        .as_ref()
        .map(|position| {
            position
                .before_epoch
                .iter()
                .map(|s| Phase {
                    world_size: s.world_size,
                    batches: s.batches,
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(MixedStreamRequest {
        sources,
        weight_changes: request
            .weight_changes
            .iter()
            .map(|change| (change.from_step, change.weights.clone()))
            .collect(),
        weights_from: request.weights_from_step,
        seed: single.plan.seed,
        epoch: single.plan.epoch,
        rank: single.plan.rank,
        world_size: single.plan.world_size,
        batch_size: single.plan.batch_size,
        shuffle: single.plan.shuffle,
        resume_from: single.plan.resume_from,
        start_batch: single.plan.start_batch,
        before_epoch,
        output: single.output,
        shared_memory: None,
        resume_dataset: single.resume_dataset,
        decoded_source: single.decoded_source,
        delivery: single.delivery,
    })
}
