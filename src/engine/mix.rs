//! Mixed streams' planner: several datasets, weighted, in one stream. The
//! request's weight log is checked here and the stream planned with
//! [`plan::mix`]; opening it is [`Engine::open_stream`]'s, as for one
//! dataset.

use std::sync::Arc;

use super::{Engine, EngineError, MixSources, StreamGeometry, StreamRequest};
use crate::dataset::Dataset;
use crate::pipeline::{Planned, Source};
use crate::plan::mix::{
    plan_mix_unless, MixError, MixRequest, MixSource, MixWeights, WeightChange,
};
use crate::plan::{self, EpochPosition};

impl MixSources {
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
    crate::hash::fmix64(crate::hash::fnv1a(dataset.bytes()))
}

impl Engine {
    /// Plans a mixed stream: its sources' parts, batch by batch, with
    /// [`plan::mix`]. Its sources' parts run across epochs, so their caches
    /// get no plan hints and evict by LRU.
    pub(super) async fn plan_mix(
        &self,
        request: &StreamRequest,
        mix: &MixSources,
        datasets: Vec<Arc<Dataset>>,
    ) -> Result<(Planned, StreamGeometry), EngineError> {
        let shuffle = request.plan.shuffle;
        let sources: Vec<MixSource> = datasets
            .iter()
            .map(|dataset| MixSource {
                // The canonical URI: `s3://b/a` and `s3://b/a/` are one
                // source across a resume, with one shuffle.
                key: source_key(&dataset.uri),
                shard_samples: dataset.shard_samples(),
                shuffle,
            })
            .collect();
        let resume_from = request.plan.resume_from.normalized();
        let (first_index, history) = {
            let mut history = mix.before_epoch.clone();
            history.extend(resume_from.phases.iter().copied());
            let history = EpochPosition { phases: history }.normalized().phases;
            (
                resume_from.steps().saturating_add(request.plan.start_batch),
                history,
            )
        };
        let (planned, plan_request) = (mix.clone(), request.plan.clone());
        // A long walk stops once nobody waits for it: this future is dropped
        // when the client leaves or the server shuts down.
        let abandoned = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let _abandon_when_dropped = AbandonOnDrop(abandoned.clone());
        let plan = tokio::task::spawn_blocking(move || {
            let steps = plan::mix::stream_epoch_counts(
                &sources,
                plan_request.repeats,
                plan_request.world_size,
                plan_request.batch_size,
            )?
            .steps;
            if first_index > steps {
                return Err(MixError::StartPastEnd {
                    start: first_index,
                    steps,
                });
            }
            let first_step = plan_request
                .epoch
                .saturating_mul(steps)
                .saturating_add(first_index);
            let weights = planned.weight_log(first_step)?;
            plan_mix_unless(
                &MixRequest {
                    seed: plan_request.seed,
                    epoch: plan_request.epoch,
                    rank: plan_request.rank,
                    world_size: plan_request.world_size,
                    batch_size: plan_request.batch_size,
                    sources,
                    repeats: plan_request.repeats,
                    weights,
                    history,
                    start_batch: first_index,
                },
                &abandoned,
            )
        })
        .await
        .map_err(|e| EngineError::Internal(format!("planning task failed: {e}")))??;
        let geometry = StreamGeometry {
            steps: plan.steps_per_epoch,
            global_batch: u64::from(request.plan.world_size) * u64::from(request.plan.batch_size),
            world_size: request.plan.world_size,
            base_position: resume_from,
            before_epoch: mix.before_epoch.clone(),
            source_samples: mix
                .sources
                .iter()
                .map(|s| crate::metrics::source_samples_counter(&s.dataset))
                .collect(),
        };
        let sources = datasets
            .into_iter()
            .zip(&mix.sources)
            .map(|(dataset, source)| Source {
                dataset,
                layout: Arc::new(source.layout.clone()),
                cache_hints: None,
            })
            .collect();
        let planned = Planned::Mix {
            sources,
            plan: Arc::new(plan),
            first_index: request.plan.start_batch,
        };
        Ok((planned, geometry))
    }
}
