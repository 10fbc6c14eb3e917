//! The one way a request becomes a stream: check, admit, plan, hint, spawn.
//! A one-dataset stream and a mix differ only in their planner (kept apart
//! so that neither's frozen order moves) and in the hints their caches get.

use std::sync::Arc;

use super::budget::{self, StreamCost, StreamShape};
use super::{
    Engine, EngineError, OpenStream, OutputRequest, Sources, StreamGeometry, StreamRequest,
    MAX_BUFFERED_SHARDS,
};
use crate::dataset::Dataset;
use crate::metrics::StreamMetrics;
use crate::pipeline::{CacheHints, Planned, SharedTarget, Source, StreamCommon, StreamContext};
use crate::plan::{self, PlanError};
use crate::store::cache::PlanFollower;

impl Engine {
    /// Admits, plans and starts the stream; batches arrive on the returned
    /// receiver. The stream's memory is reserved before anything of it is
    /// allocated, and planning (whose cost follows the dataset) runs off the
    /// async runtime.
    pub async fn open_stream(&self, request: StreamRequest) -> Result<OpenStream, EngineError> {
        let request = self.with_default_tier(request);
        let datasets = self.check(&request).await?;
        let reservation = Arc::new(
            self.memory
                .admit(self.stream_cost(&request, &datasets))
                .await?,
        );
        let ring = self.shared_target(&request, &reservation)?;
        let dataset_identity = identity(&datasets);
        if request.output.decoded_source.is_some() && self.tier.is_open() {
            for dataset in &datasets {
                warn_unversioned_once(dataset);
            }
        }
        let (planned, geometry) = match &request.sources {
            Sources::One { .. } => self.plan_one(&request, datasets).await?,
            Sources::Mix(mix) => self.plan_mix(&request, mix, datasets).await?,
        };
        let span = stream_span(&request);
        span.in_scope(|| {
            let batches = planned.batch_range();
            tracing::info!(
                batches = batches.end - batches.start,
                start_batch = batches.start,
                "stream started"
            )
        });
        let metrics = StreamMetrics::new(request.plan.rank);
        let context = StreamContext {
            common: StreamCommon {
                config: self.config.pipeline.clone(),
                pool: self.pool.clone(),
                decoder: self.decoder.clone(),
                scratch: self.scratch.clone(),
                spec: request.output.spec,
                ring: ring.clone(),
                tier: self.tier(&request.output),
                delivery: request.output.delivery,
                metrics: metrics.clone(),
                remote: self.remote.clone(),
                views: request.output.views.clone(),
            },
            planned,
        };
        let batches = (self.producer)(context, span.clone(), reservation.clone());
        Ok(OpenStream {
            batches,
            shape: geometry,
            metrics,
            span,
            reservation,
            ring: ring.map(|target| target.ring),
            dataset_identity,
            epoch: request.plan.epoch,
            first_index: request.plan.start_batch,
            output: request.output.spec,
            views: request.output.views.clone(),
            field_names: request.field_names().to_vec(),
        })
    }

    /// The request's checks that need its datasets: each one opened, the
    /// resume position taken on these very indexes, fields asked only of
    /// datasets whose samples have them.
    async fn check(&self, request: &StreamRequest) -> Result<Vec<Arc<Dataset>>, EngineError> {
        plan::validate_shuffle(request.plan.shuffle)?;
        request.output.spec.validate()?;
        if let Some(views) = &request.output.views {
            views.validate()?;
        }
        let mut datasets = Vec::new();
        for (uri, layout) in request.each_source() {
            let dataset = self.registry.open(uri).await?;
            if dataset.is_loose() && !layout.fields.is_empty() {
                return Err(EngineError::Unsupported(format!(
                    "{uri} is a dataset of loose image objects: its samples have no fields \
                     ({:?} asked); pack it into tar shards to keep captions or metadata with \
                     the images",
                    layout.fields
                )));
            }
            datasets.push(dataset);
        }
        let now = identity(&datasets);
        if let Some(taken) = request.resume_dataset.as_ref().filter(|t| **t != now) {
            return Err(EngineError::StalePosition {
                dataset: match &request.sources {
                    Sources::One { dataset, .. } => dataset.clone(),
                    Sources::Mix(_) => "the mixed stream's sources".into(),
                },
                taken: taken.clone(),
                now,
            });
        }
        Ok(datasets)
    }

    /// What the stream reserves: per source, its readers, queues and
    /// shuffle buffer; one stream's batches (see [`StreamCost`]).
    fn stream_cost(&self, request: &StreamRequest, datasets: &[Arc<Dataset>]) -> StreamCost {
        let shuffle = request.plan.shuffle.effective();
        let shapes: Vec<StreamShape> = datasets
            .iter()
            .map(|dataset| StreamShape {
                interleave: shuffle.interleave,
                shuffle_buffer: shuffle.buffer,
                batch_bytes: request.batch_bytes() as u64,
                mean_sample_bytes: dataset
                    .index
                    .bytes()
                    .div_ceil(dataset.index.samples().max(1)),
                loose_objects: dataset.is_loose(),
                row_group_bytes: dataset.largest_read_cost(),
            })
            .collect();
        match &request.sources {
            Sources::One { .. } => StreamCost::new(&self.config.pipeline, shapes[0]),
            Sources::Mix(_) => {
                StreamCost::mixed(&self.config.pipeline, &shapes, request.plan.batch_size)
            }
        }
    }

    /// The shared-memory ring a stream decodes into, when it asked for one.
    /// The ring takes the place of the batch buffers the reservation
    /// counted: (decode_ahead + ready_batches + 3) batches.
    fn shared_target(
        &self,
        request: &StreamRequest,
        reservation: &Arc<budget::Reservation>,
    ) -> Result<Option<SharedTarget>, EngineError> {
        let Some(socket) = &request.output.shared_memory else {
            return Ok(None);
        };
        let pipeline = &self.config.pipeline;
        let slots = pipeline.decode_ahead.max(1)
            + pipeline.ready_batches.max(1)
            + crate::pipeline::shm::CLIENT_SLOTS;
        let ring = crate::pipeline::shm::Ring::new(slots, request.batch_bytes())
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        // The ring may outlive the stream (kept for a client still to
        // collect it, mapped by one that holds a batch): the budget
        // counts its memory until it is gone.
        ring.hold_until_dropped(reservation.clone());
        Ok(Some(SharedTarget {
            ring,
            fd_socket: socket.clone(),
        }))
    }

    /// A decoded stream whose request names no tier uses this server's
    /// default form, where it keeps a tier directory: its first epoch costs
    /// what the tier off does, later epochs read the tier (a stream of
    /// views too: each view from the one stored source). Not with a
    /// decode pool, which decodes what the tier would serve.
    fn with_default_tier(&self, mut request: StreamRequest) -> StreamRequest {
        let output = &mut request.output;
        let defaultable = output.decoded_by_default
            && output.delivery == crate::pipeline::encoded::Delivery::Decoded
            && self.remote.is_none();
        output.decoded_source = self.tier.form(output.decoded_source, defaultable);
        request
    }

    /// What a stream of the request's form runs with (fills on the decode
    /// threads' count, at idle priority).
    fn tier(&self, output: &OutputRequest) -> Option<crate::tier::output::TierRequest> {
        let form = output.decoded_source?;
        Some(self.tier.stream(
            form,
            output.decoded_from_epoch,
            &self.decoder,
            self.config.decode_threads,
        ))
    }

    /// Plans a one-dataset stream, and tells its caches the shards it reads
    /// this epoch and the next.
    async fn plan_one(
        &self,
        request: &StreamRequest,
        mut datasets: Vec<Arc<Dataset>>,
    ) -> Result<(Planned, StreamGeometry), EngineError> {
        let (uri, dataset, layout) = match (&request.sources, datasets.pop()) {
            (
                Sources::One {
                    dataset: uri,
                    layout,
                },
                Some(dataset),
            ) => (uri, dataset, layout),
            _ => return Err(EngineError::Internal("one dataset to plan".into())),
        };
        let followers = self.followers(request, &dataset);
        let want_hints = !followers.is_empty();
        let shard_samples = dataset.shard_samples();
        let plan_request = request.plan.clone();
        let (plan, hinted_shards) = tokio::task::spawn_blocking(move || {
            let plan = plan::plan_stream(&shard_samples, &plan_request)?;
            // The shards this stream reads this epoch and the next: both
            // pure functions of the request, so cache eviction can look ahead.
            let mut sequence = Vec::new();
            if want_hints {
                sequence = plan.shard_sequence();
                match plan::next_epoch_shard_sequence(&shard_samples, &plan_request) {
                    Ok(next) => sequence.extend(next),
                    Err(error) => tracing::debug!(%error, "no next-epoch hints"),
                }
            }
            Ok::<_, PlanError>((plan, sequence))
        })
        .await
        .map_err(|e| EngineError::Internal(format!("planning task failed: {e}")))??;
        let cache_hints =
            want_hints.then(|| self.announce(request, uri, &dataset, followers, &hinted_shards));
        let geometry = StreamGeometry::of(&plan);
        let planned = Planned::One {
            source: Source {
                dataset,
                layout: Arc::new(layout.clone()),
                cache_hints,
            },
            plan: Arc::new(plan),
            seed: request.plan.seed,
            epoch: request.plan.epoch,
        };
        Ok((planned, geometry))
    }

    /// The caches that evict by this stream's plan: the shard cache and, for
    /// a stream that uses it, the decoded-source tier. Loose objects are
    /// cached one by one, not as the plan's virtual shards: eviction falls
    /// back to LRU for them.
    fn followers(&self, request: &StreamRequest, dataset: &Dataset) -> Vec<Arc<dyn PlanFollower>> {
        let mut followers: Vec<Arc<dyn PlanFollower>> = Vec::new();
        if dataset.is_loose() {
            return followers;
        }
        if let Some(cache) = self.registry.cache() {
            followers.push(cache.clone());
        }
        if request.output.decoded_source.is_some() {
            followers.extend(self.tier.follower());
        }
        followers
    }

    /// Tells `followers` the shards the stream reads, and how many it may
    /// still be consuming behind the one it last started: its readers, and
    /// the shards its shuffle buffer spans (the tier fills as samples leave
    /// the buffer).
    fn announce(
        &self,
        request: &StreamRequest,
        uri: &str,
        dataset: &Dataset,
        followers: Vec<Arc<dyn PlanFollower>>,
        shards: &[u32],
    ) -> CacheHints {
        let locations: Vec<String> = shards
            .iter()
            .map(|&shard| dataset.store.location(&dataset.shard_key(shard)))
            .collect();
        let stream = crate::store::cache::stream_key(
            uri,
            request.plan.seed,
            request.plan.rank,
            request.plan.world_size,
        );
        let shuffle = request.plan.shuffle.effective();
        let shard_mean = dataset
            .index
            .samples()
            .div_ceil(dataset.index.shards.len().max(1) as u64);
        let buffered = u64::from(shuffle.buffer).div_ceil(shard_mean.max(1));
        let in_flight = shuffle.interleave as usize
            + self.config.pipeline.prefetch_shards
            + buffered.min(MAX_BUFFERED_SHARDS) as usize;
        for follower in &followers {
            follower.announce(&stream, &locations, in_flight);
        }
        CacheHints { followers, stream }
    }
}

/// The identity resume positions carry: the dataset index's, or a mix's
/// sources', joined in source order.
fn identity(datasets: &[Arc<Dataset>]) -> String {
    datasets
        .iter()
        .map(|dataset| dataset.index.identity())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The stream's tracing span: its dataset (or its sources' count), rank,
/// world size and epoch.
fn stream_span(request: &StreamRequest) -> tracing::Span {
    let plan = &request.plan;
    match &request.sources {
        Sources::One { dataset, .. } => tracing::info_span!(
            "stream",
            dataset = %dataset,
            rank = plan.rank,
            world_size = plan.world_size,
            epoch = plan.epoch,
        ),
        Sources::Mix(mix) => tracing::info_span!(
            "stream",
            dataset = "mixed",
            sources = mix.sources.len(),
            rank = plan.rank,
            world_size = plan.world_size,
            epoch = plan.epoch,
        ),
    }
}

/// Says once per dataset (per process) that the decoded-source tier keeps
/// none of the samples of its shards without a version (no ETag in the
/// listing or from HEAD): a stream asking for the tier still works, at the
/// cold epoch's cost every epoch, so the reason must not stay silent.
fn warn_unversioned_once(dataset: &Dataset) {
    static WARNED: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<String>>> =
        std::sync::OnceLock::new();
    let unversioned = dataset
        .index
        .shards
        .iter()
        .filter(|shard| shard.version().is_none())
        .count();
    if unversioned == 0 {
        return;
    }
    let location = dataset.uri.clone();
    let warned = WARNED.get_or_init(Default::default);
    let first = warned
        .lock()
        .map(|mut set| set.insert(location.clone()))
        .unwrap_or(false);
    if first {
        tracing::warn!(
            dataset = %location,
            shards = unversioned,
            of = dataset.index.shards.len(),
            "the decoded-source tier keeps nothing of shards without a version: \
             the store gave them no ETag (listing or HEAD); they are decoded from \
             the original every epoch (counted as shardfeed_decoded_tier_total{{event=\"unversioned\"}})"
        );
    }
}
