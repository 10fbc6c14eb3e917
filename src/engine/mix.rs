//! Mixed streams: several datasets, weighted, in one stream. The engine
//! opens every source, checks the weights and the resume position, reserves
//! every source's readers, plans with [`plan::mix`] and starts the mixing
//! pipeline.

use std::sync::Arc;

use super::budget::{StreamCost, StreamShape};
use super::{Engine, EngineError, OpenStream, StreamGeometry};
use crate::decode::OutputSpec;
use crate::metrics::StreamMetrics;
use crate::pipeline::mix::{spawn_mixed_stream, MixedStreamContext};
use crate::pipeline::StreamContext;
use crate::plan::mix::{
    plan_mix_unless, MixError, MixRequest, MixSource, MixWeights, WeightChange,
};
use crate::plan::{self, EpochPosition, Partition, Phase, ShuffleConfig};
use crate::shard::SampleLayout;

/// One source of a mixed stream request.
#[derive(Debug, Clone)]
pub struct MixedSource {
    pub dataset: String,
    pub weight: f64,
    pub layout: SampleLayout,
}

/// A mixed stream to open.
#[derive(Debug, Clone)]
pub struct MixedStreamRequest {
    pub sources: Vec<MixedSource>,
    /// Earlier weights: `(from_step, weights)`, oldest first.
    pub weight_changes: Vec<(u64, Vec<f64>)>,
    /// The global step the sources' weights began at (None: the request's
    /// first step). A reconnect resumes past it and must not move it: the
    /// plan rounds each weight span from its own start.
    pub weights_from: Option<u64>,
    pub seed: u64,
    pub epoch: u64,
    pub rank: u32,
    pub world_size: u32,
    pub batch_size: u32,
    pub shuffle: ShuffleConfig,
    /// Batches of the epoch done: `resume_from`'s, then `start_batch` more
    /// at `world_size`.
    pub resume_from: EpochPosition,
    pub start_batch: u64,
    /// The world sizes the stream ran at before this epoch.
    pub before_epoch: Vec<Phase>,
    pub output: OutputSpec,
    pub shared_memory: Option<std::path::PathBuf>,
    pub resume_dataset: Option<String>,
    pub decoded_source: Option<crate::decode::source::SourceForm>,
    pub delivery: crate::pipeline::Delivery,
}

/// Where a mixed stream's batches stand, for the positions it reports.
#[derive(Debug, Clone)]
pub struct MixedGeometry {
    pub before_epoch: Vec<Phase>,
    /// Per source: its samples sent, counted by dataset.
    samples_sent: Vec<::metrics::Counter>,
}

impl MixedGeometry {
    /// Counts a batch's samples per source (`sources`: each sample's index).
    pub fn count_samples(&self, sources: &[u32]) {
        let mut counts = vec![0u64; self.samples_sent.len()];
        for &k in sources {
            counts[k as usize] += 1;
        }
        for (counter, count) in self.samples_sent.iter().zip(counts) {
            counter.increment(count);
        }
    }
}

impl MixedStreamRequest {
    /// The weight log the plan follows: the request's changes, then the
    /// sources' weights from `weights_from` (else `first_step`) where they
    /// differ from the last.
    fn weight_log(&self, first_step: u64) -> Result<Vec<WeightChange>, MixError> {
        let weights: Vec<f64> = self.sources.iter().map(|s| s.weight).collect();
        let current = MixWeights::new(&weights)?;
        let current_from = self.weights_from.unwrap_or(first_step);
        if current_from > first_step {
            return Err(MixError::BadWeightsFrom(format!(
                "weights_from_step {current_from} is after this request's first step {first_step}"
            )));
        }
        if let Some((last_from, _)) = self.weight_changes.last() {
            if current_from < *last_from {
                return Err(MixError::BadWeightsFrom(format!(
                    "weights_from_step {current_from} is before the last weight change's \
                     from_step {last_from}"
                )));
            }
        }
        let mut log = Vec::with_capacity(self.weight_changes.len() + 1);
        for (index, (from_step, weights)) in self.weight_changes.iter().enumerate() {
            let weights = MixWeights::new(weights).map_err(|e| MixError::BadChange {
                index,
                reason: e.to_string(),
            })?;
            if *from_step > first_step {
                return Err(MixError::BadChange {
                    index,
                    reason: format!(
                        "from_step {from_step} is after this request's first step {first_step}"
                    ),
                });
            }
            log.push(WeightChange {
                from_step: *from_step,
                weights,
            });
        }
        match log.last() {
            Some(last) if last.weights == current => {}
            Some(last) if last.from_step == current_from => {
                log.last_mut().expect("a last change").weights = current;
            }
            _ => log.push(WeightChange {
                from_step: if log.is_empty() { 0 } else { current_from },
                weights: current,
            }),
        }
        Ok(log)
    }
}

/// Sets its flag when dropped: a blocking task watching it gives up.
struct AbandonOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A stable key for a source: its dataset's address.
fn source_key(dataset: &str) -> u64 {
    crate::decode::augment::fmix64(crate::decode::augment::fnv1a(dataset.bytes()))
}

impl Engine {
    /// Admits, plans and starts a mixed stream (see [`Engine::open_stream`]).
    pub async fn open_mixed_stream(
        &self,
        request: MixedStreamRequest,
    ) -> Result<(OpenStream, MixedGeometry), EngineError> {
        plan::validate_shuffle(request.shuffle)?;
        request.output.validate()?;
        let mut datasets = Vec::with_capacity(request.sources.len());
        for source in &request.sources {
            let dataset = self.registry.open(&source.dataset).await?;
            if dataset.is_loose() && !source.layout.fields.is_empty() {
                return Err(EngineError::Unsupported(format!(
                    "{} is a dataset of loose image objects: its samples have no fields ({:?} \
                     asked)",
                    source.dataset, source.layout.fields
                )));
            }
            datasets.push(dataset);
        }
        let identity = datasets
            .iter()
            .map(|d| d.index.identity())
            .collect::<Vec<_>>()
            .join("; ");
        if let Some(taken) = request.resume_dataset.as_ref().filter(|t| **t != identity) {
            return Err(EngineError::StalePosition {
                dataset: "the mixed stream's sources".into(),
                taken: taken.clone(),
                now: identity,
            });
        }
        let shapes: Vec<StreamShape> = datasets
            .iter()
            .map(|dataset| {
                let shuffle = request.shuffle.effective();
                StreamShape {
                    interleave: shuffle.interleave,
                    shuffle_buffer: shuffle.buffer,
                    batch_bytes: request.output.bytes() as u64 * u64::from(request.batch_size),
                    mean_sample_bytes: dataset
                        .index
                        .bytes()
                        .div_ceil(dataset.index.samples().max(1)),
                    loose_objects: dataset.is_loose(),
                }
            })
            .collect();
        let cost = StreamCost::mixed(&self.config.pipeline, &shapes, request.batch_size);
        let reservation = Arc::new(self.memory.admit(cost).await?);
        let shared = self.shared_target(
            request.shared_memory.as_ref(),
            request.output.bytes() * request.batch_size as usize,
            &reservation,
        )?;

        let sources: Vec<MixSource> = datasets
            .iter()
            .map(|dataset| MixSource {
                // The canonical URI: `s3://b/a` and `s3://b/a/` are one
                // source across a resume, with one shuffle.
                key: source_key(&dataset.uri),
                shard_samples: dataset.shard_samples(),
                shuffle: request.shuffle,
            })
            .collect();
        let (first_index, history) = {
            let done = request.resume_from.normalized();
            let mut history = request.before_epoch.clone();
            history.extend(done.phases.iter().copied());
            let history = EpochPosition { phases: history }.normalized().phases;
            (done.steps().saturating_add(request.start_batch), history)
        };
        let planned = request.clone();
        // A long walk stops once nobody waits for it: this future is dropped
        // when the client leaves or the server shuts down.
        let abandoned = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let _abandon_when_dropped = AbandonOnDrop(abandoned.clone());
        let plan = tokio::task::spawn_blocking(move || {
            let total: u64 = sources
                .iter()
                .map(|s| s.shard_samples.iter().sum::<u64>())
                .sum();
            let steps = plan::epoch_counts(
                total,
                planned.world_size,
                planned.batch_size,
                Partition::DropLast,
            )?
            .steps;
            if first_index > steps {
                return Err(MixError::StartPastEnd {
                    start: first_index,
                    steps,
                });
            }
            let first_step = planned
                .epoch
                .saturating_mul(steps)
                .saturating_add(first_index);
            let weights = planned.weight_log(first_step)?;
            plan_mix_unless(
                &MixRequest {
                    seed: planned.seed,
                    epoch: planned.epoch,
                    rank: planned.rank,
                    world_size: planned.world_size,
                    batch_size: planned.batch_size,
                    sources,
                    weights,
                    history,
                    start_batch: first_index,
                },
                &abandoned,
            )
        })
        .await
        .map_err(|e| EngineError::Internal(format!("planning task failed: {e}")))??;
        let plan = Arc::new(plan);
        let span = tracing::info_span!(
            "stream",
            dataset = "mixed",
            sources = request.sources.len(),
            rank = request.rank,
            world_size = request.world_size,
            epoch = request.epoch,
        );
        span.in_scope(|| {
            tracing::info!(
                batches = plan.batches,
                start_batch = first_index,
                "mixed stream started"
            )
        });
        let metrics = StreamMetrics::new(request.rank);
        let layouts = request.sources.iter().map(|s| Arc::new(s.layout.clone()));
        let contexts: Vec<StreamContext> = datasets
            .into_iter()
            .zip(layouts)
            .map(|(dataset, layout)| StreamContext {
                dataset,
                // Replaced part by part.
                plan: Arc::new(plan::StreamPlan::empty()),
                spec: request.output,
                seed: request.seed,
                epoch: request.epoch,
                config: self.config.pipeline.clone(),
                pool: self.pool.clone(),
                decoder: self.decoder.clone(),
                scratch: self.scratch.clone(),
                // Sources' parts run across epochs: eviction falls back to LRU.
                cache_hints: None,
                shared: shared.clone(),
                layout,
                tier: self.tier(request.decoded_source),
                delivery: request.delivery.clone(),
                metrics: metrics.clone(),
            })
            .collect();
        let batches = spawn_mixed_stream(
            MixedStreamContext {
                sources: contexts,
                plan: plan.clone(),
                first_index: request.start_batch,
            },
            span.clone(),
            reservation.clone(),
        );
        let open = OpenStream {
            batches,
            shape: StreamGeometry {
                steps: plan.steps_per_epoch,
                global_batch: u64::from(request.world_size) * u64::from(request.batch_size),
                world_size: request.world_size,
                base_position: request.resume_from.normalized(),
            },
            metrics,
            span,
            reservation,
            ring: shared.map(|shared| shared.ring),
            dataset_identity: identity,
        };
        Ok((
            open,
            MixedGeometry {
                before_epoch: request.before_epoch,
                samples_sent: request
                    .sources
                    .iter()
                    .map(|s| crate::metrics::source_samples_counter(&s.dataset))
                    .collect(),
            },
        ))
    }
}
