//! What a stream runs with: what its sources share ([`StreamCommon`]), each
//! source ([`Source`]), what it emits ([`Planned`]: one dataset's plan or a
//! mix), and the part of a source's plan a walk follows ([`SourcePart`]).

use std::sync::Arc;

use super::config::PipelineConfig;
use super::encoded::Delivery;
use super::error::PipelineError;
use super::sample::SampleOrigin;
use super::shm;
use crate::dataset::Dataset;
use crate::decode::{Decoder, OutputSpec, ScratchBudget, Views};
use crate::metrics;
use crate::plan::mix::MixPlan;
use crate::plan::StreamPlan;
use crate::shard::SampleLayout;
use crate::store::cache::PlanFollower;

/// Tells the disk cache which shards a stream has reached, so its eviction
/// knows what is still ahead.
#[derive(Clone)]
pub struct CacheHints {
    /// The shard cache and the decoded-source tier, where the stream uses them.
    pub followers: Vec<Arc<dyn PlanFollower>>,
    pub stream: String,
}

/// What every source of a stream shares: its settings, the host's decode
/// pool and budgets, the output it makes and where its batches go.
pub struct StreamCommon {
    pub config: PipelineConfig,
    pub pool: Arc<rayon::ThreadPool>,
    pub decoder: Arc<dyn Decoder>,
    /// Decode memory shared by every stream's decodes.
    pub scratch: Arc<ScratchBudget>,
    pub spec: OutputSpec,
    /// Decode into this shared-memory ring instead of process memory.
    pub ring: Option<SharedTarget>,
    /// Outputs defined from stored decoded sources (the decoded tier).
    pub tier: Option<crate::tier::output::TierRequest>,
    /// Pixels, or baseline JPEGs for the client to decode.
    pub delivery: Delivery,
    /// The stream's metric handles, resolved once.
    pub metrics: metrics::StreamMetrics,
    /// The decode pool, where the server has one.
    pub remote: Option<crate::pool::PoolClient>,
    /// Several views per sample in place of `spec`'s one output.
    pub views: Option<Arc<Views>>,
}

/// A dataset a stream reads, and what it reads of each sample.
#[derive(Clone)]
pub struct Source {
    pub dataset: Arc<Dataset>,
    pub layout: Arc<SampleLayout>,
    /// Where the source's shard reads are followed (a one-dataset stream's:
    /// a mix's parts run across epochs, and its caches fall back to LRU).
    pub cache_hints: Option<CacheHints>,
}

/// What a stream emits, in order: one dataset's plan, or a mix of sources.
pub enum Planned {
    One {
        source: Source,
        plan: Arc<StreamPlan>,
        /// The request's seed and epoch, which key every sample's augmentation.
        seed: u64,
        epoch: u64,
    },
    Mix {
        sources: Vec<Source>,
        plan: Arc<MixPlan>,
        /// The index of the stream's first batch in its epoch.
        first_index: u64,
    },
}

impl Planned {
    /// The batches the stream sends: the first one's index, and how many.
    pub fn batch_range(&self) -> std::ops::Range<u64> {
        match self {
            Self::One { plan, .. } => plan.first_batch..plan.first_batch + plan.batches,
            Self::Mix {
                plan, first_index, ..
            } => *first_index..first_index + plan.batches,
        }
    }

    /// The rank whose batches the stream sends.
    pub fn rank(&self) -> u32 {
        match self {
            Self::One { plan, .. } => plan.rank,
            Self::Mix { plan, .. } => plan.rank,
        }
    }

    pub fn batch_size(&self) -> u32 {
        match self {
            Self::One { plan, .. } => plan.batch_size,
            Self::Mix { plan, .. } => plan.batch_size,
        }
    }
}

/// What one stream needs to run.
pub struct StreamContext {
    pub common: StreamCommon,
    pub planned: Planned,
}

/// A stream's shared-memory ring, and the socket it is handed out on (for
/// error messages).
#[derive(Clone, Debug)]
pub struct SharedTarget {
    pub ring: Arc<shm::Ring>,
    pub fd_socket: std::path::PathBuf,
}

impl SharedTarget {
    /// A slot to fill: waits (bounded) until the client has returned one.
    pub async fn acquire(&self) -> Result<shm::SlotLease, PipelineError> {
        self.ring
            .acquire(&self.fd_socket)
            .await
            .map_err(|e| match e {
                shm::ShmError::Refused { .. } => PipelineError::SharedMemoryBusy(e.to_string()),
                shm::ShmError::ClientGone => PipelineError::ClientLeft,
                _ => PipelineError::SharedMemory(e.to_string()),
            })
    }
}

/// One part of a source's plan, walked in order: a one-dataset stream's
/// whole plan, or a slice of a mixed stream's source.
pub(crate) struct SourcePart<'a> {
    pub source: &'a Source,
    pub plan: &'a StreamPlan,
    /// With `epoch`, keys every sample's augmentation.
    pub seed: u64,
    /// The stream's epoch, or the source-epoch in a mixed stream.
    pub epoch: u64,
    /// The source's index in a mixed stream (0 otherwise).
    pub index: u32,
}

impl SourcePart<'_> {
    /// Where the samples this part emits come from.
    pub fn origin(&self) -> SampleOrigin {
        SampleOrigin {
            dataset: self.source.dataset.clone(),
            seed: self.seed,
            epoch: self.epoch,
            label_offset: self.source.layout.label_offset,
            source: self.index,
        }
    }
}
