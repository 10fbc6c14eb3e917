//! `StreamBatches` requests checked and translated into the engine's
//! [`StreamRequest`]: output size, batch bytes, enum values, the sample
//! layout and the decoded-source form (a mix's sources and weights in
//! `mix.rs`); fields left unset take the server's defaults.

use super::layout::sample_layout;
use super::limits::{DEFAULT_BATCH_SIZE, MAX_BATCH_BYTES};
use super::pb;
use super::status::ServiceError;
use crate::decode::{self, Crop, OutputSpec};
use crate::engine::{OutputRequest, Sources, StreamRequest};
use crate::plan::{EpochPosition, Partition, Phase, PlanRequest, ShuffleConfig};

/// The engine's request for a `StreamBatches` call, of one dataset or a
/// mix, with the fields checked that the engine cannot (output size, batch
/// bytes, enum values); fields left unset take the server's defaults.
/// The most ops a request's `client_ops` may name, and the longest name:
/// far above the table's rows, far below what could cost memory.
const MAX_CLIENT_OPS: usize = 16;
const MAX_CLIENT_OP_NAME: usize = 64;

fn client_ops(request: &pb::StreamBatchesRequest) -> Result<&[String], ServiceError> {
    let names = &request.client_ops;
    if names.len() > MAX_CLIENT_OPS {
        return Err(ServiceError::invalid(
            "client_ops",
            format!(
                "client_ops names {} ops; at most {MAX_CLIENT_OPS}",
                names.len()
            ),
        ));
    }
    if let Some(long) = names.iter().find(|name| name.len() > MAX_CLIENT_OP_NAME) {
        return Err(ServiceError::invalid(
            "client_ops",
            format!(
                "client_ops holds a name of {} bytes; at most {MAX_CLIENT_OP_NAME}",
                long.len()
            ),
        ));
    }
    Ok(names)
}

pub fn stream_request(
    request: &pb::StreamBatchesRequest,
    defaults: ShuffleConfig,
) -> Result<StreamRequest, ServiceError> {
    let mixed = !request.sources.is_empty();
    if mixed {
        super::mix::check_counts(request)?;
    }
    let batch_size = request.batch_size.unwrap_or(DEFAULT_BATCH_SIZE);
    let views = views(request, batch_size)?;
    let spec = match &views {
        // The stream's one spec where the pipeline asks one (its crop's
        // kind): the first view's. Every view's output is its own.
        Some(views) => views.groups[0].views[0],
        None => output_spec(request, batch_size)?,
    };
    let plan = plan_request(request, defaults, batch_size)?;
    let layout = sample_layout(request.layout.as_ref())?;
    let mut output = output_request(request, spec, views.as_ref())?;
    output.views = views.map(std::sync::Arc::new);
    let sources = if mixed {
        Sources::Mix(super::mix::mix_sources(request, &plan, layout)?)
    } else {
        Sources::One {
            dataset: request.dataset.clone(),
            layout,
        }
    };
    Ok(StreamRequest {
        sources,
        plan,
        output,
        resume_dataset: request
            .resume_from
            .as_ref()
            .map(|position| position.dataset.clone())
            .filter(|identity| !identity.is_empty()),
    })
}

/// The output's size, crop and ops, checked, and a batch of them within
/// the largest batch a stream may send.
fn output_spec(
    request: &pb::StreamBatchesRequest,
    batch_size: u32,
) -> Result<OutputSpec, ServiceError> {
    let height = nonzero_or(request.height, decode::DEFAULT_SIZE);
    let width = nonzero_or(request.width, decode::DEFAULT_SIZE);
    if height > decode::MAX_SIZE || width > decode::MAX_SIZE {
        let field = if height > decode::MAX_SIZE {
            "height"
        } else {
            "width"
        };
        return Err(ServiceError::invalid(
            field,
            format!(
                "output size {height}x{width} exceeds the maximum side of {}",
                decode::MAX_SIZE
            ),
        ));
    }
    let augmentation = request.augmentation.clone().unwrap_or_default();
    let invalid = |e: decode::AugmentError| ServiceError::invalid(e.field, e.to_string());
    let output =
        OutputSpec::from_wire(height, width, crop(request)?, &augmentation).map_err(invalid)?;
    output.validate().map_err(invalid)?;
    if output.bytes() as u64 * u64::from(batch_size) > MAX_BATCH_BYTES {
        return Err(ServiceError::invalid(
            "batch_size",
            format!(
                "a batch of {batch_size} images of {height}x{width} exceeds {MAX_BATCH_BYTES} bytes"
            ),
        ));
    }
    Ok(output)
}

/// The request's view groups, checked: none, or views in place of the
/// one output (its size and augmentation unset), a batch of them within
/// the largest batch a stream may send.
fn views(
    request: &pb::StreamBatchesRequest,
    batch_size: u32,
) -> Result<Option<decode::Views>, ServiceError> {
    if request.views.is_empty() {
        return Ok(None);
    }
    let conflict = [
        ("height", request.height != 0),
        ("width", request.width != 0),
        (
            "resize",
            request.resize != pb::ResizeMode::CenterCrop as i32,
        ),
        ("augmentation", request.augmentation.is_some()),
    ]
    .into_iter()
    .find(|(_, set)| *set);
    if let Some((field, _)) = conflict {
        return Err(ServiceError::invalid(
            field,
            format!(
                "{field} is set with views: each view group names its own size and \
                 augmentation (ViewGroup.height, .width, .views); leave {field} unset"
            ),
        ));
    }
    let invalid = |e: decode::AugmentError| ServiceError::invalid(e.field, e.to_string());
    let views = super::views::views_from_wire(&request.views).map_err(invalid)?;
    views.validate().map_err(invalid)?;
    let bytes = views.bytes_per_sample() as u64 * u64::from(batch_size);
    if bytes > MAX_BATCH_BYTES {
        return Err(ServiceError::invalid(
            "views",
            format!(
                "a batch of {batch_size} samples' views is {bytes} bytes, over \
                 {MAX_BATCH_BYTES}: fewer or smaller views, or a smaller batch_size"
            ),
        ));
    }
    Ok(Some(views))
}

/// The plan's parameters: the order, the partition and where the stream
/// resumes.
fn plan_request(
    request: &pb::StreamBatchesRequest,
    defaults: ShuffleConfig,
    batch_size: u32,
) -> Result<PlanRequest, ServiceError> {
    let shuffle = ShuffleConfig {
        enabled: request.shuffle.unwrap_or(true),
        interleave: nonzero_or(request.interleave, defaults.interleave),
        buffer: nonzero_or(request.shuffle_buffer, defaults.buffer),
    };
    let resume_from = EpochPosition {
        phases: request
            .resume_from
            .as_ref()
            .map(|position| {
                position
                    .segments
                    .iter()
                    .map(|s| Phase {
                        world_size: s.world_size,
                        batches: s.batches,
                    })
                    .collect()
            })
            .unwrap_or_default(),
    };
    Ok(PlanRequest {
        seed: request.seed,
        epoch: request.epoch,
        rank: request.rank,
        world_size: request.world_size.max(1),
        batch_size,
        shuffle,
        partition: partition(request.partition)?,
        repeats: request.repeats.max(1),
        start_batch: request.start_batch,
        resume_from,
    })
}

/// What the stream delivers of `spec` (or of `views`): the decoded-source
/// form, and which side decodes (a stream with an op or a resize the
/// client's decoder does not name, in any view, is the server's to
/// decode, whatever the share).
fn output_request(
    request: &pb::StreamBatchesRequest,
    spec: OutputSpec,
    views: Option<&decode::Views>,
) -> Result<OutputRequest, ServiceError> {
    let (decoded_source, decoded_from_epoch) = decoded_source(request.decoded_source.as_ref())?;
    let client_ops = client_ops(request)?;
    let client_replays = match views {
        Some(views) => views.client_replays(client_ops),
        None => spec.client_replays(client_ops),
    };
    Ok(OutputRequest {
        spec,
        shared_memory: None,
        decoded_source,
        decoded_from_epoch,
        decoded_by_default: request.decoded_source.is_none(),
        views: None,
        delivery: super::delivery::delivery_from_wire(request)
            .map_err(|e| ServiceError::invalid(e.field, e.message))?
            .for_ops(client_replays),
    })
}

/// The request's decoded-source form, checked, and its first stored epoch.
fn decoded_source(
    wire: Option<&pb::DecodedSource>,
) -> Result<(Option<decode::source::SourceForm>, u64), ServiceError> {
    use crate::tier::output::{DEFAULT_FROM_EPOCH, MAX_SHORTER_SIDE, MIN_SHORTER_SIDE};
    let Some(wire) = wire else {
        return Ok((None, DEFAULT_FROM_EPOCH));
    };
    if wire.shorter_side == 0 {
        // Asked for no tier (the server's default would otherwise apply).
        return Ok((None, DEFAULT_FROM_EPOCH));
    }
    if !(MIN_SHORTER_SIDE..=MAX_SHORTER_SIDE).contains(&wire.shorter_side) {
        return Err(ServiceError::invalid(
            "decoded_source.shorter_side",
            format!(
                "decoded_source.shorter_side {} is outside {MIN_SHORTER_SIDE}..={MAX_SHORTER_SIDE} \
                 (0: no tier)",
                wire.shorter_side
            ),
        ));
    }
    let from_epoch = wire.stored_from_epoch.map_or(DEFAULT_FROM_EPOCH, u64::from);
    Ok((
        Some(decode::source::SourceForm {
            shorter_side: wire.shorter_side,
            kind: decode::source::SourceKind::Raw,
        }),
        from_epoch,
    ))
}

/// The crop of a request: its augmentation's, else the legacy `resize`.
fn crop(request: &pb::StreamBatchesRequest) -> Result<Crop, ServiceError> {
    let legacy = pb::ResizeMode::try_from(request.resize).map_err(|_| {
        ServiceError::invalid("resize", format!("unknown resize mode {}", request.resize))
    })?;
    let named = request.augmentation.as_ref().and_then(Crop::from_wire);
    match (named, legacy) {
        (None, pb::ResizeMode::CenterCrop) => Ok(Crop::Center { resize: None }),
        (None, pb::ResizeMode::Stretch) => Ok(Crop::Stretch),
        (Some(_), pb::ResizeMode::Stretch) => Err(ServiceError::invalid(
            "resize",
            "resize = STRETCH conflicts with augmentation.crop: set one of them",
        )),
        (Some(crop), pb::ResizeMode::CenterCrop) => Ok(crop),
    }
}

fn nonzero_or(value: u32, default: u32) -> u32 {
    if value == 0 {
        default
    } else {
        value
    }
}

pub(super) fn partition(value: i32) -> Result<Partition, ServiceError> {
    match pb::Partition::try_from(value) {
        Ok(pb::Partition::DropLast) => Ok(Partition::DropLast),
        Ok(pb::Partition::Pad) => Ok(Partition::Pad),
        Err(_) => Err(ServiceError::invalid(
            "partition",
            format!("unknown partition {value}"),
        )),
    }
}
