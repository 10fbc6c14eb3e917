//! What a stream asks of the engine: one request, whether it reads one
//! dataset or mixes several. The plan's parameters and the output are the
//! same for both; only the sources differ.

use crate::decode::source::SourceForm;
use std::sync::Arc;

use crate::decode::{OutputSpec, Views};
use crate::pipeline::Delivery;
use crate::plan::{Phase, PlanRequest};
use crate::shard::SampleLayout;

/// One stream to open.
#[derive(Debug, Clone)]
pub struct StreamRequest {
    pub sources: Sources,
    /// Seed, epoch, rank, world and batch size, shuffle, partition and the
    /// resume position: one dataset's plan, or every source's of a mix.
    pub plan: PlanRequest,
    pub output: OutputRequest,
    /// The dataset identity the resume position was taken on, if it says.
    pub resume_dataset: Option<String>,
}

/// What a stream reads.
#[derive(Debug, Clone)]
pub enum Sources {
    One {
        dataset: String,
        /// What else to read of each sample.
        layout: SampleLayout,
    },
    Mix(MixSources),
}

/// The sources of a mixed stream and the history of their weights.
#[derive(Debug, Clone)]
pub struct MixSources {
    pub sources: Vec<MixedSource>,
    /// Earlier weights: `(from_step, weights)`, oldest first.
    pub weight_changes: Vec<(u64, Vec<f64>)>,
    /// The global step the sources' weights began at (None: the request's
    /// first step). A reconnect resumes past it and must not move it: the
    /// plan rounds each weight span from its own start.
    pub weights_from: Option<u64>,
    /// The world sizes the stream ran at before this epoch.
    pub before_epoch: Vec<Phase>,
}

/// One source of a mixed stream.
#[derive(Debug, Clone)]
pub struct MixedSource {
    pub dataset: String,
    pub weight: f64,
    pub layout: SampleLayout,
}

/// What the stream's batches hold and how they travel.
#[derive(Debug, Clone)]
pub struct OutputRequest {
    pub spec: OutputSpec,
    /// Decode into a shared-memory ring handed out on this socket (None:
    /// batches stay in process memory and are sent inline).
    pub shared_memory: Option<std::path::PathBuf>,
    /// Define outputs from decoded sources stored in this form (the tier).
    pub decoded_source: Option<SourceForm>,
    /// With the tier: its first epoch defined from the stored source (the
    /// ones before are defined from the original and fill the tier).
    pub decoded_from_epoch: u64,
    /// The request named no tier: the server's default applies
    /// ([`super::EngineConfig::decoded_default`]).
    pub decoded_by_default: bool,
    /// Pixels, or baseline JPEGs for the client to decode.
    pub delivery: Delivery,
    /// Several views of each sample in place of `spec`'s one output
    /// (checked: decoded delivery, no tier); `spec` is then the first view's.
    pub views: Option<Arc<Views>>,
}

impl OutputRequest {
    /// Decoded pixels of `spec`, sent inline, without the tier.
    pub fn pixels(spec: OutputSpec) -> Self {
        Self {
            spec,
            shared_memory: None,
            decoded_source: None,
            decoded_from_epoch: crate::tier::output::DEFAULT_FROM_EPOCH,
            decoded_by_default: false,
            delivery: Delivery::Decoded,
            views: None,
        }
    }

    /// Output bytes of one sample: its one output, or all its views.
    pub fn sample_bytes(&self) -> usize {
        match &self.views {
            Some(views) => views.bytes_per_sample(),
            None => self.spec.bytes(),
        }
    }
}

impl StreamRequest {
    /// A stream of one dataset's images (no fields), sent inline.
    pub fn one(dataset: impl Into<String>, plan: PlanRequest, spec: OutputSpec) -> Self {
        Self {
            sources: Sources::One {
                dataset: dataset.into(),
                layout: SampleLayout::default(),
            },
            plan,
            output: OutputRequest::pixels(spec),
            resume_dataset: None,
        }
    }

    /// Every source's dataset and layout, in the stream's source order.
    pub fn each_source(&self) -> Vec<(&str, &SampleLayout)> {
        match &self.sources {
            Sources::One { dataset, layout } => vec![(dataset, layout)],
            Sources::Mix(mix) => mix
                .sources
                .iter()
                .map(|source| (source.dataset.as_str(), &source.layout))
                .collect(),
        }
    }

    /// The names of the fields every batch carries (the same for every source).
    pub fn field_names(&self) -> &[String] {
        match &self.sources {
            Sources::One { layout, .. } => &layout.fields,
            Sources::Mix(mix) => mix
                .sources
                .first()
                .map_or(&[][..], |source| &source.layout.fields),
        }
    }

    /// The batch bytes of the stream's output.
    pub fn batch_bytes(&self) -> usize {
        self.output.sample_bytes() * self.plan.batch_size as usize
    }
}
