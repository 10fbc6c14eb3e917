//! Every error a request can end with, and the one table that maps errors
//! to gRPC status codes.
//!
//! The table is keyed on the most specific error: [`status_code`] walks an
//! error's source chain to its leaf and takes the code of the deepest error
//! it knows, so a store's 403 reached through a dataset and a pipeline is
//! still `PERMISSION_DENIED`.

use std::collections::HashMap;
use std::error::Error;
use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::dataset::DatasetError;
use crate::engine::budget::BudgetError;
use crate::engine::EngineError;
use crate::pipeline::PipelineError;
use crate::plan::{EpochPosition, PlanError};
use crate::shard::ShardError;
use crate::store::StoreError;

/// Everything that can fail a request at the edge.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// A request field's value the server refuses: `field` names it as a
    /// path (`layout.fields`, `sources[1].weight`), the message says why.
    #[error("{message}")]
    InvalidArgument { field: String, message: String },
    #[error("{0}")]
    Engine(#[from] EngineError),
    #[error("{0}")]
    Pipeline(#[from] PipelineError),
    #[error("too many streams open (limit {0}); close one or raise --max-streams")]
    TooManyStreams(usize),
    #[error("dataset {dataset} is not allowed: this server only serves datasets under --allow {rules:?}")]
    NotAllowed { dataset: String, rules: Vec<String> },
    /// Under `--allow`, a local dataset's folder must exist when the
    /// request is checked: it is held open from then on.
    #[error("dataset {dataset}: its folder cannot be opened ({reason}); under --allow a local dataset must be an existing folder when it is asked for")]
    LocalFolder { dataset: String, reason: String },
    #[error("shardfeed is draining (shutting down); retry on its replacement")]
    Draining,
    #[error("shardfeed is starting (opening its disk cache); retry shortly")]
    Starting,
}

impl ServiceError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The same error, of a field inside `parent` (`sources[1]`): its
    /// field path and message both say so.
    pub fn within(self, parent: &str) -> Self {
        match self {
            Self::InvalidArgument { field, message } => Self::InvalidArgument {
                field: format!("{parent}.{field}"),
                message: format!("{parent}.{message}"),
            },
            other => other,
        }
    }

    pub fn code(&self) -> Code {
        status_code(self)
    }
}

impl From<ServiceError> for Status {
    fn from(error: ServiceError) -> Self {
        let (reason, retry_after) = match error {
            ServiceError::Draining => (REASON_DRAINING, RETRY_AFTER_RESTART),
            ServiceError::Starting => (REASON_STARTING, RETRY_AFTER_RESTART),
            _ => {
                let code = error.code();
                // gRPC's BadRequest names the field, for programs to read.
                return match invalid_field(&error).filter(|_| code == Code::InvalidArgument) {
                    Some(field) => Status::with_error_details(
                        code,
                        error.to_string(),
                        ErrorDetails::with_bad_request_violation(field, error.to_string()),
                    ),
                    None => Status::new(code, error.to_string()),
                };
            }
        };
        let mut details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, HashMap::new());
        details.set_retry_info(Some(retry_after));
        Status::with_error_details(error.code(), error.to_string(), details)
    }
}

/// `ErrorInfo.domain` of every status shardfeed details.
pub const ERROR_DOMAIN: &str = "shardfeed";
/// The sidecar is shutting down: its replacement serves the rest.
pub const REASON_DRAINING: &str = "SERVER_DRAINING";
/// The sidecar is opening its disk cache.
pub const REASON_STARTING: &str = "SERVER_STARTING";
/// A stream ended by an error after it began.
pub const REASON_STREAM_FAILED: &str = "STREAM_FAILED";
/// A sidecar restart (a pod's container restart) takes seconds.
pub const RETRY_AFTER_RESTART: Duration = Duration::from_secs(1);

/// Where a stream that ended early goes on: the same request with
/// `start_batch`, or any request (any world size with the same global batch)
/// with `resume_from` = `position`.
pub struct ResumePoint<'a> {
    pub start_batch: u64,
    pub epoch: u64,
    pub position: &'a EpochPosition,
    /// A mixed stream's world sizes before this epoch (`before_epoch`).
    pub before_epoch: &'a [crate::plan::Phase],
    /// The dataset index's identity (`EpochPosition.dataset`).
    pub dataset: &'a str,
}

impl ResumePoint<'_> {
    /// `ErrorInfo.metadata`: `start_batch`, `epoch`, `dataset` and
    /// `position` as `world_size:batches` segments joined by commas.
    /// A mixed stream's also has `before_epoch`, in the same form.
    fn metadata(&self) -> HashMap<String, String> {
        let segments = |phases: &[crate::plan::Phase]| {
            phases
                .iter()
                .map(|phase| format!("{}:{}", phase.world_size, phase.batches))
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut metadata = HashMap::from([
            ("start_batch".to_string(), self.start_batch.to_string()),
            ("epoch".to_string(), self.epoch.to_string()),
            ("dataset".to_string(), self.dataset.to_string()),
            ("position".to_string(), segments(&self.position.phases)),
        ]);
        if !self.before_epoch.is_empty() {
            metadata.insert("before_epoch".to_string(), segments(self.before_epoch));
        }
        metadata
    }
}

/// The status that ends a stream after it began: the message says where to
/// resume, and so do its details (gRPC's rich error model: `ErrorInfo` with
/// the resume point, `RetryInfo` where waiting helps), for any client.
pub fn stream_ended(
    code: Code,
    message: &str,
    reason: &str,
    resume: &ResumePoint<'_>,
    retry_after: Option<Duration>,
) -> Status {
    let mut details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, resume.metadata());
    if let Some(delay) = retry_after {
        details.set_retry_info(Some(delay));
    }
    Status::with_error_details(
        code,
        format!(
            "{message}; resume this stream with start_batch={}",
            resume.start_batch
        ),
        details,
    )
}

/// The status code for `error`: that of the deepest error in its source
/// chain with a code of its own; `INTERNAL` when none has.
pub fn status_code(error: &(dyn Error + 'static)) -> Code {
    let mut chain = Vec::new();
    let mut next = Some(error);
    while let Some(current) = next {
        chain.push(current);
        next = current.source();
    }
    chain
        .into_iter()
        .rev()
        .find_map(own_code)
        .unwrap_or(Code::Internal)
}

/// The request field an error refuses (gRPC `BadRequest`'s field), as a
/// path: that of the deepest error in its source chain that names one.
pub fn invalid_field(error: &(dyn Error + 'static)) -> Option<String> {
    let mut chain = Vec::new();
    let mut next = Some(error);
    while let Some(current) = next {
        chain.push(current);
        next = current.source();
    }
    chain.into_iter().rev().find_map(own_field)
}

/// The field an error names by itself.
fn own_field(error: &(dyn Error + 'static)) -> Option<String> {
    use crate::plan::mix::MixError;
    if let Some(ServiceError::InvalidArgument { field, .. }) = error.downcast_ref() {
        return Some(field.clone());
    }
    if let Some(error) = error.downcast_ref::<PlanError>() {
        return Some(plan_field(error).into());
    }
    if let Some(error) = error.downcast_ref::<MixError>() {
        return Some(match error {
            MixError::SourceCount(_) | MixError::AllZero => "sources".into(),
            MixError::BadWeight { index, .. } => format!("sources[{index}].weight"),
            MixError::BadChange { index, .. } => format!("weight_changes[{index}]"),
            MixError::BadWeightsFrom(_) => "weights_from_step".into(),
            MixError::SourceTooSmall { index, .. } => format!("sources[{index}].dataset"),
            MixError::TooFarToPlan { .. } | MixError::StartPastEnd { .. } => "start_batch".into(),
            MixError::Plan(error) => plan_field(error).into(),
            MixError::Abandoned => return None,
        });
    }
    if let Some(BudgetError::NeverFits { field, .. }) = error.downcast_ref() {
        return Some((*field).into());
    }
    if let Some(error) = error.downcast_ref::<crate::decode::augment::AugmentError>() {
        return Some(error.field.into());
    }
    if let Some(DatasetError::InvalidUri { .. }) = error.downcast_ref() {
        return Some("dataset".into());
    }
    None
}

fn plan_field(error: &PlanError) -> &'static str {
    match error {
        PlanError::ZeroBatchSize | PlanError::TooFewSamples { .. } => "batch_size",
        PlanError::ZeroWorldSize | PlanError::WorldTooLarge(_) => "world_size",
        PlanError::RankOutOfRange { .. } => "rank",
        PlanError::EmptyDataset => "dataset",
        PlanError::ShuffleBufferTooLarge(_) => "shuffle_buffer",
        PlanError::Repeats(_) => "repeats",
        PlanError::InterleaveTooLarge(_) => "interleave",
        PlanError::ResumeWorldSize { .. }
        | PlanError::TooManyResumePhases(_)
        | PlanError::ResumePastEnd { .. } => "resume_from",
        PlanError::StartPastEnd { .. } => "start_batch",
    }
}

/// The code an error implies by itself; `None` for wrappers that only
/// carry an inner error.
fn own_code(error: &(dyn Error + 'static)) -> Option<Code> {
    if let Some(error) = error.downcast_ref::<StoreError>() {
        return Some(match error {
            StoreError::NotFound { .. } => Code::NotFound,
            StoreError::PermissionDenied { .. } => Code::PermissionDenied,
            StoreError::Credentials { .. } => Code::Unauthenticated,
            StoreError::Changed { .. }
            | StoreError::Truncated { .. }
            | StoreError::TooLarge { .. } => Code::FailedPrecondition,
            StoreError::Transient { .. }
            | StoreError::Throttled { .. }
            | StoreError::Exhausted { .. } => Code::Unavailable,
            StoreError::Other { .. } => Code::Unknown,
        });
    }
    if error.is::<PlanError>() {
        return Some(Code::InvalidArgument);
    }
    // A mix's own refusals, and (transparently wrapped) its plan's.
    if let Some(error) = error.downcast_ref::<crate::plan::mix::MixError>() {
        return Some(match error {
            crate::plan::mix::MixError::Abandoned => Code::Cancelled,
            _ => Code::InvalidArgument,
        });
    }
    if let Some(error) = error.downcast_ref::<ShardError>() {
        return Some(match error {
            // The request's cap on a field, not damage to the shard.
            ShardError::FieldTooLarge { .. } => Code::FailedPrecondition,
            // Columns the request reads are not the file's: not damage.
            ShardError::Parquet(parquet) if parquet.is_precondition() => Code::FailedPrecondition,
            _ => Code::DataLoss,
        });
    }
    if let Some(error) = error.downcast_ref::<DatasetError>() {
        return match error {
            DatasetError::InvalidUri { .. } => Some(Code::InvalidArgument),
            DatasetError::NoShards { .. } => Some(Code::NotFound),
            DatasetError::Manifest { .. } | DatasetError::MixedLayout { .. } => {
                Some(Code::FailedPrecondition)
            }
            DatasetError::CorruptIndex { .. } | DatasetError::IndexTooLarge { .. } => {
                Some(Code::FailedPrecondition)
            }
            DatasetError::Shard { .. } => Some(Code::DataLoss),
            DatasetError::Internal(_) => Some(Code::Internal),
            DatasetError::Store(_) => None,
        };
    }
    if let Some(error) = error.downcast_ref::<PipelineError>() {
        return match error {
            PipelineError::Shard { .. } => Some(Code::DataLoss),
            PipelineError::StaleIndex { .. } | PipelineError::ObjectGone { .. } => {
                Some(Code::FailedPrecondition)
            }
            PipelineError::SharedMemory(_) => Some(Code::FailedPrecondition),
            PipelineError::SharedMemoryBusy(_) => Some(Code::ResourceExhausted),
            PipelineError::ClientLeft => Some(Code::Cancelled),
            PipelineError::Internal(_) => Some(Code::Internal),
            PipelineError::Dataset(_) | PipelineError::Store(_) => None,
        };
    }
    if error
        .downcast_ref::<crate::decode::augment::AugmentError>()
        .is_some()
    {
        return Some(Code::InvalidArgument);
    }
    if let Some(error) = error.downcast_ref::<BudgetError>() {
        return Some(match error {
            BudgetError::NeverFits { .. } => Code::InvalidArgument,
            BudgetError::RowGroupNeverFits { .. } => Code::FailedPrecondition,
            BudgetError::Busy { .. } => Code::ResourceExhausted,
        });
    }
    if let Some(error) = error.downcast_ref::<EngineError>() {
        return match error {
            EngineError::Internal(_) => Some(Code::Internal),
            EngineError::Unsupported(_) | EngineError::StalePosition { .. } => {
                Some(Code::FailedPrecondition)
            }
            _ => None,
        };
    }
    if let Some(error) = error.downcast_ref::<ServiceError>() {
        return match error {
            ServiceError::InvalidArgument { .. } => Some(Code::InvalidArgument),
            ServiceError::TooManyStreams(_) => Some(Code::ResourceExhausted),
            ServiceError::NotAllowed { .. } => Some(Code::PermissionDenied),
            ServiceError::LocalFolder { .. } => Some(Code::NotFound),
            ServiceError::Draining | ServiceError::Starting => Some(Code::Unavailable),
            ServiceError::Engine(_) | ServiceError::Pipeline(_) => None,
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied() -> StoreError {
        StoreError::PermissionDenied {
            location: "s3://b/k".into(),
            message: "AccessDenied".into(),
        }
    }

    #[test]
    fn the_leaf_error_decides_through_every_wrapper() {
        let through_pipeline =
            ServiceError::Pipeline(PipelineError::Dataset(DatasetError::Store(denied())));
        assert_eq!(through_pipeline.code(), Code::PermissionDenied);
        let through_engine = ServiceError::Engine(EngineError::Dataset(DatasetError::Store(
            StoreError::Exhausted {
                location: "s3://b/k".into(),
                attempts: 8,
                message: "SlowDown".into(),
            },
        )));
        assert_eq!(through_engine.code(), Code::Unavailable);
        let shard = ServiceError::Pipeline(PipelineError::Shard {
            location: "s3://b/k".into(),
            source: ShardError::Tar(crate::shard::tar::TarError::BadChecksum { offset: 512 }),
        });
        assert_eq!(shard.code(), Code::DataLoss);
        assert_eq!(
            ServiceError::Engine(EngineError::Plan(PlanError::ZeroBatchSize)).code(),
            Code::InvalidArgument
        );
        assert_eq!(
            ServiceError::TooManyStreams(4).code(),
            Code::ResourceExhausted
        );
        assert_eq!(
            ServiceError::Pipeline(PipelineError::Internal("x".into())).code(),
            Code::Internal
        );
        // A trainer that stopped reading left; nothing failed.
        assert_eq!(
            ServiceError::Pipeline(PipelineError::ClientLeft).code(),
            Code::Cancelled
        );
    }

    /// The field a status's BadRequest names, if it has one.
    fn named_field(error: ServiceError) -> Option<String> {
        let status = Status::from(error);
        let bad = status.get_details_bad_request()?;
        Some(bad.field_violations.first()?.field.clone())
    }

    #[test]
    fn invalid_arguments_name_their_field_through_every_wrapper() {
        let layout = ServiceError::invalid("layout.fields", "layout.fields names \"a\" twice");
        assert_eq!(
            named_field(layout.within("sources[1]")).as_deref(),
            Some("sources[1].layout.fields")
        );
        let plan = ServiceError::Engine(EngineError::Plan(PlanError::RankOutOfRange {
            rank: 4,
            world_size: 2,
        }));
        assert_eq!(named_field(plan).as_deref(), Some("rank"));
        let mix = ServiceError::Engine(EngineError::Mix(crate::plan::mix::MixError::BadWeight {
            index: 1,
            weight: "-1".into(),
        }));
        assert_eq!(named_field(mix).as_deref(), Some("sources[1].weight"));
        let through_mix = ServiceError::Engine(EngineError::Mix(crate::plan::mix::MixError::Plan(
            PlanError::ShuffleBufferTooLarge(1 << 30),
        )));
        assert_eq!(through_mix.code(), Code::InvalidArgument);
        assert_eq!(named_field(through_mix).as_deref(), Some("shuffle_buffer"));
        assert_eq!(named_field(ServiceError::TooManyStreams(4)), None);
        assert_eq!(
            named_field(ServiceError::Engine(EngineError::Mix(
                crate::plan::mix::MixError::Abandoned
            ))),
            None,
            "not an invalid argument"
        );
    }
}
