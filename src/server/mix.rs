//! Mixed-stream requests (`StreamBatchesRequest.sources`): the sources and
//! weights checked and translated into the engine's [`MixSources`]; the
//! rest of the request is translated as a one-dataset stream's.

use super::layout::sample_layout;
use super::pb;
use super::status::ServiceError;
use crate::engine::{MixSources, MixedSource};
use crate::plan::mix::{MAX_SOURCES, MAX_WEIGHT_CHANGES};
use crate::plan::{Partition, Phase, PlanRequest};
use crate::shard::SampleLayout;

/// The checks of a mixed request's shape, made before any other field's.
pub(super) fn check_counts(request: &pb::StreamBatchesRequest) -> Result<(), ServiceError> {
    let invalid = |field: &str, message: String| Err(ServiceError::invalid(field, message));
    if !request.dataset.is_empty() {
        return invalid(
            "dataset",
            format!(
                "dataset {:?} and sources are both set: a mixed stream names its datasets in \
             sources only",
                request.dataset
            ),
        );
    }
    if request.sources.len() < 2 || request.sources.len() > MAX_SOURCES {
        return invalid(
            "sources",
            format!(
                "sources: {} given; a mixed stream has 2 to {MAX_SOURCES} (one dataset goes in \
             `dataset`)",
                request.sources.len()
            ),
        );
    }
    if request.weight_changes.len() > MAX_WEIGHT_CHANGES {
        return invalid(
            "weight_changes",
            format!(
                "weight_changes: {} given; at most {MAX_WEIGHT_CHANGES}",
                request.weight_changes.len()
            ),
        );
    }
    Ok(())
}

/// A mixed request's sources and weights, checked: `plan` and `layout`
/// are the request's own, checked as a one-dataset stream's.
pub(super) fn mix_sources(
    request: &pb::StreamBatchesRequest,
    plan: &PlanRequest,
    layout: SampleLayout,
) -> Result<MixSources, ServiceError> {
    let invalid = |field: &str, message: String| Err(ServiceError::invalid(field, message));
    if plan.partition != Partition::DropLast {
        return invalid(
            "partition",
            "partition: a mixed stream's epochs count global batches of all its sources; \
             PARTITION_PAD is for one dataset"
                .into(),
        );
    }
    let mut sources = Vec::with_capacity(request.sources.len());
    for (index, source) in request.sources.iter().enumerate() {
        if source.dataset.is_empty() {
            return invalid(
                &format!("sources[{index}].dataset"),
                format!("sources[{index}].dataset is empty"),
            );
        }
        let layout = match &source.layout {
            None => layout.clone(),
            Some(own) if !own.fields.is_empty() => {
                return invalid(
                    &format!("sources[{index}].layout.fields"),
                    format!(
                        "sources[{index}].layout.fields is set: a stream's fields are the same \
                     for every source (set them in `layout`)"
                    ),
                )
            }
            Some(own) => {
                let mut own =
                    sample_layout(Some(own)).map_err(|e| e.within(&format!("sources[{index}]")))?;
                own.fields = layout.fields.clone();
                own
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
            return invalid(
                &format!("weight_changes[{index}].weights"),
                format!(
                    "weight_changes[{index}] has {} weights for {} sources",
                    change.weights.len(),
                    sources.len()
                ),
            );
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
    Ok(MixSources {
        sources,
        weight_changes: request
            .weight_changes
            .iter()
            .map(|change| (change.from_step, change.weights.clone()))
            .collect(),
        weights_from: request.weights_from_step,
        before_epoch,
    })
}
