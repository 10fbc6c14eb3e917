//! Weighted mixing of several sources (datasets) in one stream: which
//! samples of which source a rank emits at every step. Pure, like the rest
//! of `plan`.
//!
//! The rules, in order:
//! 1. **Weights** become integers over 2^32 ([`MixWeights`]): everything
//!    after is integer arithmetic, the same on every machine.
//! 2. **The global batch.** Global step `t` holds exactly `c_k(t)` samples of
//!    source `k`, `Σ c_k = G = world_size × batch_size`: `floor(w_k G)`, plus
//!    one for the `R = G − Σ floor(w_k G)` sources whose accumulated
//!    remainder is largest (ties: the lower index). Every prefix of the
//!    stream holds each source's share to within one sample, and the counts
//!    do not depend on the world size.
//! 3. **Ranks.** Each rank takes `c_k div W` samples of source `k`; the
//!    `c_k mod W` leftovers of every source, laid end to end, go round-robin
//!    to the ranks from rank `t mod W`. Every rank gets exactly
//!    `batch_size`, at most one leftover per source per step, and the
//!    leftovers rotate over the ranks. A rank's batch holds its sources in
//!    source order. Ranks therefore read a source at slightly different
//!    rates (the rotation evens them out for most weights, but not for
//!    every combination of weights and world size): each reads its own part
//!    of each source-epoch once, whenever it gets there.
//! 4. **Within a source**, today's plan at batch size 1: source-epoch `e` is
//!    partitioned contiguously over the ranks (`floor(N_k / W)` samples
//!    each) and read with its interleave and shuffle buffer. A rank that
//!    finishes its part starts its part of source-epoch `e + 1` (a new shard
//!    order, new augmentation): a source runs out and comes back, and its
//!    samples appear once per source-epoch. A source's seed comes from the
//!    stream's seed and the source's key (its dataset's identity), so its
//!    order does not depend on the other sources.
//! 5. **Stream epochs** count samples: an epoch has `floor(Σ N_k / G)`
//!    steps, as many as the sources hold together, whatever the weights, so
//!    reweighting never changes an epoch's length (and a learning-rate
//!    schedule keyed on steps per epoch holds).
//! 6. **Reweighting.** The weights in force come from a log of
//!    `(from_step, weights)`. At a change the accumulated remainders start
//!    again from zero, so from that step on the new weights hold exactly,
//!    and every source's cursor carries on: nothing inside a source-epoch is
//!    repeated or skipped.
//! 7. **Resume** takes the global step and the world sizes the stream ran
//!    at ([`super::Phase`]s, as for one dataset). Each rank's way through a
//!    source is a queue of [`PartSlice`]s (pieces of ranks' parts of
//!    source-epochs) followed by its own fresh parts. At a change of world
//!    size, every source's unread pieces are gathered per source-epoch in
//!    rank order (a rank that had not yet started a source-epoch another had
//!    started contributes its whole part) and split contiguously over the
//!    new ranks; later source-epochs are partitioned at the new size. So a
//!    resize repeats and skips nothing inside any source-epoch. Cost:
//!    O(steps × sources) integer work, plus O(world size) per resize.

mod queue;

pub use queue::{PartId, PartSlice, SourceQueue};

use super::rng::Rng;
use super::{plan_stream, Partition, PlanError, PlanRequest, ShuffleConfig, StreamPlan};
use queue::regroup;

/// Most sources one stream mixes; each holds its own readers.
pub const MAX_SOURCES: usize = 16;
/// Most weight changes one stream's log holds (each costs a replay segment).
pub const MAX_WEIGHT_CHANGES: usize = 64;
/// Weights are parts of this.
const WEIGHT_ONE: u64 = 1 << 32;
const PURPOSE_SOURCE_SEED: u64 = 3;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MixError {
    #[error("sources: {0} given; a stream mixes 1 to {MAX_SOURCES}")]
    SourceCount(usize),
    #[error("sources[{index}].weight is {weight}: a weight must be finite and at least 0")]
    BadWeight { index: usize, weight: String },
    #[error("sources: every weight is 0; at least one must be positive")]
    AllZero,
    #[error("weight_changes[{index}]: {reason}")]
    BadChange { index: usize, reason: String },
    #[error("{0}")]
    BadWeightsFrom(String),
    #[error(
        "epoch {epoch}: a mixed stream is planned from its first global step, and its \
         first batch is step {first_step} ({steps} steps an epoch), past the \
         {MAX_PLANNED_STEPS} steps planning walks"
    )]
    TooFarToPlan {
        epoch: u64,
        first_step: u64,
        steps: u64,
    },
    #[error("planning was abandoned: the stream's client left")]
    Abandoned,
    #[error(
        "sources[{index}] has {samples} samples, fewer than world_size {world_size}: \
         every rank reads at least one sample of each source"
    )]
    SourceTooSmall {
        index: usize,
        samples: u64,
        world_size: u32,
    },
    #[error("start_batch {start} is past the {steps} batches of a stream epoch")]
    StartPastEnd { start: u64, steps: u64 },
    #[error(transparent)]
    Plan(#[from] PlanError),
}

/// Each source's share of the stream, as parts of 2^32 that sum to 2^32.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixWeights(Vec<u64>);

impl MixWeights {
    pub fn new(weights: &[f64]) -> Result<Self, MixError> {
        if weights.is_empty() || weights.len() > MAX_SOURCES {
            return Err(MixError::SourceCount(weights.len()));
        }
        for (index, &weight) in weights.iter().enumerate() {
            if !weight.is_finite() || weight < 0.0 {
                return Err(MixError::BadWeight {
                    index,
                    weight: weight.to_string(),
                });
            }
        }
        // The sum of finite weights can overflow to infinity (two weights of
        // 1e308), which would make every share zero: then the weights are
        // scaled by the largest first. Only then, so that the shares of
        // ordinary weights (and the batches planned from them) stay as they
        // were.
        let mut scale = 1.0;
        let mut total: f64 = weights.iter().sum();
        if total.is_infinite() {
            scale = weights.iter().copied().fold(0.0, f64::max);
            total = weights.iter().map(|w| w / scale).sum();
        }
        if total <= 0.0 {
            return Err(MixError::AllZero);
        }
        let mut parts: Vec<u64> = weights
            .iter()
            .map(|w| (w / scale / total * WEIGHT_ONE as f64).round() as u64)
            .collect();
        // Rounding leaves the sum a few parts off: the largest share absorbs it.
        let largest = (0..parts.len())
            .max_by_key(|&k| (parts[k], std::cmp::Reverse(k)))
            .expect("at least one source");
        let sum: u64 = parts.iter().sum();
        parts[largest] = (parts[largest] + WEIGHT_ONE).saturating_sub(sum);
        Ok(Self(parts))
    }

    pub fn sources(&self) -> usize {
        self.0.len()
    }

    /// Source `k`'s share, in [0, 1].
    pub fn share(&self, k: usize) -> f64 {
        self.0[k] as f64 / WEIGHT_ONE as f64
    }
}

/// Weights in force from a global step on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightChange {
    pub from_step: u64,
    pub weights: MixWeights,
}

/// Rule 2: the per-source counts of successive global batches.
#[derive(Debug, Clone)]
struct Apportioner {
    base: Vec<u64>,
    remainder: Vec<u64>,
    extras: usize,
    credit: Vec<i128>,
}

impl Apportioner {
    fn new(weights: &MixWeights, global_batch: u64) -> Self {
        let shares: Vec<u128> = weights
            .0
            .iter()
            .map(|&part| u128::from(part) * u128::from(global_batch))
            .collect();
        let one = u128::from(WEIGHT_ONE);
        let remainder: Vec<u64> = shares.iter().map(|s| (s % one) as u64).collect();
        let extras = (remainder.iter().map(|&r| u128::from(r)).sum::<u128>() / one) as usize;
        Self {
            base: shares.iter().map(|s| (s / one) as u64).collect(),
            remainder,
            extras,
            credit: vec![0; weights.0.len()],
        }
    }

    fn next_counts(&mut self, counts: &mut [u64]) {
        counts.copy_from_slice(&self.base);
        if self.extras == 0 {
            return;
        }
        // Only sources with a fractional share compete, so a source of
        // weight 0 (or one that divides the batch) never gets an extra.
        let mut candidates: Vec<usize> = Vec::with_capacity(counts.len());
        for (k, credit) in self.credit.iter_mut().enumerate() {
            if self.remainder[k] > 0 {
                *credit += i128::from(self.remainder[k]);
                candidates.push(k);
            }
        }
        candidates.sort_by_key(|&k| (std::cmp::Reverse(self.credit[k]), k));
        for &k in candidates.iter().take(self.extras) {
            counts[k] += 1;
            self.credit[k] -= i128::from(WEIGHT_ONE);
        }
    }
}

/// Rule 3: rank `rank`'s count of each source in a global batch of `counts`.
fn rank_counts(counts: &[u64], world_size: u32, rank: u32, step: u64, out: &mut [u64]) {
    let world = u64::from(world_size);
    let mut tokens = 0u64;
    let start = step % world;
    for (k, &count) in counts.iter().enumerate() {
        let (even, leftover) = (count / world, count % world);
        let first = (start + tokens) % world;
        let offset = (u64::from(rank) + world - first) % world;
        out[k] = even + u64::from(offset < leftover);
        tokens += leftover;
    }
}

/// The global batches' counts, step by step, following the weight log.
#[derive(Debug, Clone)]
struct GlobalCounts {
    changes: Vec<WeightChange>,
    global_batch: u64,
    next_change: usize,
    apportioner: Apportioner,
    step: u64,
}

impl GlobalCounts {
    fn new(changes: &[WeightChange], global_batch: u64) -> Self {
        Self {
            apportioner: Apportioner::new(&changes[0].weights, global_batch),
            changes: changes.to_vec(),
            global_batch,
            next_change: 1,
            step: 0,
        }
    }

    /// The counts of the next step and its index.
    fn next(&mut self, counts: &mut [u64]) -> u64 {
        if let Some(change) = self.changes.get(self.next_change) {
            if change.from_step == self.step {
                self.apportioner = Apportioner::new(&change.weights, self.global_batch);
                self.next_change += 1;
            }
        }
        self.apportioner.next_counts(counts);
        self.step += 1;
        self.step - 1
    }
}

/// One source of a mixed stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixSource {
    /// The source's identity (a hash of its dataset's): keys its seed.
    pub key: u64,
    pub shard_samples: Vec<u64>,
    pub shuffle: ShuffleConfig,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixRequest {
    pub seed: u64,
    /// The stream's epoch (rule 5).
    pub epoch: u64,
    pub rank: u32,
    pub world_size: u32,
    pub batch_size: u32,
    pub sources: Vec<MixSource>,
    /// Copies of every sample in each source-epoch (rule 4; 1: none).
    pub repeats: u32,
    /// The weight log: the first change is at step 0; steps increase.
    pub weights: Vec<WeightChange>,
    /// The world sizes the stream ran at before, from its step 0, oldest
    /// first (the steps after them to `start_batch` ran at `world_size`).
    pub history: Vec<super::Phase>,
    /// Batches of the epoch already done.
    pub start_batch: u64,
}

/// Every rank's count of each source over `steps` steps at `world_size`.
fn phase_counts(counts: &mut GlobalCounts, steps: u64, world_size: u32) -> Vec<Vec<u64>> {
    let sources = counts.changes[0].weights.sources();
    let world = u64::from(world_size);
    let mut even = vec![0u64; sources];
    // Leftovers land on circular ranges of ranks: a difference array each.
    let mut leftovers = vec![vec![0i64; world_size as usize + 1]; sources];
    let mut global = vec![0; sources];
    for _ in 0..steps {
        let step = counts.next(&mut global);
        let mut tokens = 0u64;
        for (k, &count) in global.iter().enumerate() {
            let (share, leftover) = (count / world, count % world);
            even[k] += share;
            let first = (step % world + tokens) % world;
            let end = first + leftover;
            let marks = &mut leftovers[k];
            marks[first as usize] += 1;
            if end <= world {
                marks[end as usize] -= 1;
            } else {
                marks[world as usize] -= 1;
                marks[0] += 1;
                marks[(end - world) as usize] -= 1;
            }
            tokens += leftover;
        }
    }
    (0..sources)
        .map(|k| {
            let mut running = 0i64;
            (0..world_size as usize)
                .map(|r| {
                    running += leftovers[k][r];
                    even[k] + running as u64
                })
                .collect()
        })
        .collect()
}

/// One rank's mixed stream from its first batch.
#[derive(Debug, Clone)]
pub struct MixPlan {
    /// Steps in a stream epoch.
    pub steps_per_epoch: u64,
    /// The global step of the first batch this stream emits.
    pub first_step: u64,
    /// Batches this stream emits (to the end of its epoch).
    pub batches: u64,
    pub world_size: u32,
    pub rank: u32,
    /// Samples of each rank's batch.
    pub batch_size: u32,
    sources: Vec<MixSource>,
    seeds: Vec<u64>,
    /// Samples of each source-epoch (its samples × `repeats`).
    samples: Vec<u64>,
    repeats: u32,
    queues: Vec<SourceQueue>,
    counts: GlobalCounts,
}

fn validate_changes(request: &MixRequest) -> Result<(), MixError> {
    let sources = request.sources.len();
    if sources == 0 || sources > MAX_SOURCES {
        return Err(MixError::SourceCount(sources));
    }
    let bad = |index: usize, reason: String| Err(MixError::BadChange { index, reason });
    if request.weights.is_empty() || request.weights.len() > MAX_WEIGHT_CHANGES {
        return bad(
            0,
            format!(
                "{} weight changes; a stream has 1 to {MAX_WEIGHT_CHANGES}",
                request.weights.len()
            ),
        );
    }
    if request.weights[0].from_step != 0 {
        return bad(0, "the first weights must hold from step 0".into());
    }
    for (index, change) in request.weights.iter().enumerate() {
        if change.weights.sources() != sources {
            return bad(
                index,
                format!("{} weights for {sources} sources", change.weights.sources()),
            );
        }
        if index > 0 && change.from_step <= request.weights[index - 1].from_step {
            return bad(index, "from_step must increase".into());
        }
    }
    Ok(())
}

/// The most global steps a mixed plan walks to its first batch: its counts
/// are a running apportionment with no closed form, so the walk is linear
/// in the step (about 0.1 µs a step here: a few seconds at the bound). A
/// job of 10^5 steps an epoch plans 330 epochs within it.
pub const MAX_PLANNED_STEPS: u64 = 1 << 25;

/// How many steps the walk takes between looks at its abandon flag.
const STEPS_BETWEEN_CHECKS: u64 = 1 << 16;

/// A stream epoch's counts (rule 5): as many steps as the sources hold
/// samples together, each sample counted once a copy.
pub fn stream_epoch_counts(
    sources: &[MixSource],
    repeats: u32,
    world_size: u32,
    batch_size: u32,
) -> Result<super::EpochCounts, PlanError> {
    super::validate_repeats(repeats)?;
    let total: u64 = sources
        .iter()
        .map(|s| s.shard_samples.iter().sum::<u64>() * u64::from(repeats))
        .sum();
    super::epoch_counts(total, world_size, batch_size, Partition::DropLast)
}

pub fn plan_mix(request: &MixRequest) -> Result<MixPlan, MixError> {
    plan_mix_unless(request, &std::sync::atomic::AtomicBool::new(false))
}

/// [`plan_mix`], giving up with [`MixError::Abandoned`] once `abandoned` is
/// set (the stream's client left, or the server shuts down): a walk of many
/// steps never outlives its reason.
pub fn plan_mix_unless(
    request: &MixRequest,
    abandoned: &std::sync::atomic::AtomicBool,
) -> Result<MixPlan, MixError> {
    validate_changes(request)?;
    let MixRequest {
        seed,
        rank,
        world_size,
        batch_size,
        repeats,
        ..
    } = *request;
    let stream = stream_epoch_counts(&request.sources, repeats, world_size, batch_size)?;
    if rank >= world_size {
        return Err(PlanError::RankOutOfRange { rank, world_size }.into());
    }
    let samples = source_samples(request)?;
    let first_step = first_step(request, &stream)?;
    check_history(request, &stream, first_step)?;
    let (queues, counts) = queues_at(request, &stream, &samples, first_step, abandoned)?;
    let seeds = request
        .sources
        .iter()
        .map(|source| Rng::derive(&[seed, source.key, PURPOSE_SOURCE_SEED]).next_u64())
        .collect();
    Ok(MixPlan {
        steps_per_epoch: stream.steps,
        first_step,
        batches: stream.steps - request.start_batch,
        world_size,
        rank,
        batch_size,
        sources: request.sources.clone(),
        seeds,
        samples,
        repeats,
        queues,
        counts,
    })
}

/// Each source's samples an epoch (its copies counted), checked: every
/// rank of every world the stream ran at reads each source.
fn source_samples(request: &MixRequest) -> Result<Vec<u64>, MixError> {
    let largest_world = request
        .history
        .iter()
        .map(|p| p.world_size)
        .chain([request.world_size])
        .max()
        .unwrap_or(request.world_size);
    let mut samples = Vec::with_capacity(request.sources.len());
    for (index, source) in request.sources.iter().enumerate() {
        super::validate_shuffle(source.shuffle)?;
        let total = source.shard_samples.iter().sum::<u64>() * u64::from(request.repeats);
        if total < u64::from(largest_world) {
            return Err(MixError::SourceTooSmall {
                index,
                samples: total,
                world_size: largest_world,
            });
        }
        samples.push(total);
    }
    Ok(samples)
}

/// The stream's step of the request's first batch, counted from epoch 0,
/// within what a plan walks.
fn first_step(request: &MixRequest, stream: &super::EpochCounts) -> Result<u64, MixError> {
    if request.start_batch > stream.steps {
        return Err(MixError::StartPastEnd {
            start: request.start_batch,
            steps: stream.steps,
        });
    }
    let first_step = request
        .epoch
        .saturating_mul(stream.steps)
        .saturating_add(request.start_batch);
    if first_step > MAX_PLANNED_STEPS {
        return Err(MixError::TooFarToPlan {
            epoch: request.epoch,
            first_step,
            steps: stream.steps,
        });
    }
    Ok(first_step)
}

/// The world sizes the stream ran at, bounded and each dividing the
/// global batch, and no more batches than lie before the first step.
fn check_history(
    request: &MixRequest,
    stream: &super::EpochCounts,
    first_step: u64,
) -> Result<(), MixError> {
    if request.history.len() > super::MAX_RESUME_PHASES {
        return Err(PlanError::TooManyResumePhases(request.history.len()).into());
    }
    for phase in &request.history {
        if phase.world_size == 0
            || !stream
                .global_batch
                .is_multiple_of(u64::from(phase.world_size))
        {
            return Err(PlanError::ResumeWorldSize {
                world_size: phase.world_size,
                global_batch: stream.global_batch,
            }
            .into());
        }
    }
    let history: u64 = request.history.iter().map(|p| p.batches).sum();
    if history > first_step {
        return Err(PlanError::ResumePastEnd {
            steps: history,
            total: first_step,
        }
        .into());
    }
    Ok(())
}

/// Where this rank stands in each source at `first_step`, and the global
/// counts there: every rank's queues walked through the history (regrouped
/// at each resize), then this rank's alone at its world size.
fn queues_at(
    request: &MixRequest,
    stream: &super::EpochCounts,
    samples: &[u64],
    first_step: u64,
    abandoned: &std::sync::atomic::AtomicBool,
) -> Result<(Vec<SourceQueue>, GlobalCounts), MixError> {
    let (rank, world_size) = (request.rank, request.world_size);
    let mut counts = GlobalCounts::new(&request.weights, stream.global_batch);
    let sources = request.sources.len();
    let first_world = request.history.first().map_or(world_size, |p| p.world_size);
    let mut all: Vec<Vec<SourceQueue>> = (0..sources)
        .map(|_| {
            (0..first_world)
                .map(|r| SourceQueue::fresh(0, first_world, r))
                .collect()
        })
        .collect();
    for (i, phase) in request.history.iter().enumerate() {
        let taken = phase_counts(&mut counts, phase.batches, phase.world_size);
        let next_world = request
            .history
            .get(i + 1)
            .map_or(world_size, |p| p.world_size);
        for k in 0..sources {
            for (queue, &count) in all[k].iter_mut().zip(&taken[k]) {
                queue.take(count, samples[k]);
            }
            if next_world != phase.world_size {
                all[k] = regroup(std::mem::take(&mut all[k]), next_world, samples[k]);
            }
        }
    }
    let mut queues: Vec<SourceQueue> = all
        .into_iter()
        .map(|mut per_rank| per_rank.swap_remove(rank as usize))
        .collect();
    let (mut global, mut own) = (vec![0; sources], vec![0; sources]);
    // Taking is additive: the rank's counts add up, then are taken at once.
    let mut taken = vec![0u64; sources];
    while counts.step < first_step {
        if counts.step.is_multiple_of(STEPS_BETWEEN_CHECKS)
            && abandoned.load(std::sync::atomic::Ordering::Relaxed)
        {
            return Err(MixError::Abandoned);
        }
        let step = counts.next(&mut global);
        rank_counts(&global, world_size, rank, step, &mut own);
        for (sum, &count) in taken.iter_mut().zip(&own) {
            *sum += count;
        }
    }
    for (queue, (&count, &total)) in queues.iter_mut().zip(taken.iter().zip(samples)) {
        queue.take(count, total);
    }
    Ok((queues, counts))
}

impl MixPlan {
    pub fn sources(&self) -> usize {
        self.sources.len()
    }

    /// Where this rank starts in source `k`.
    pub fn queue(&self, k: usize) -> &SourceQueue {
        &self.queues[k]
    }

    /// The pieces of source `k` this rank reads, in order, from its first
    /// batch on: its queue, then its fresh parts (endless: the stream's
    /// counts say how much of it is read).
    pub fn source_slices(&self, k: usize) -> impl Iterator<Item = PartSlice> + '_ {
        let mut queue = self.queues[k].clone();
        let samples = self.samples[k];
        std::iter::from_fn(move || {
            if queue.slices.is_empty() {
                queue.open_next(samples);
            }
            queue.slices.pop_front()
        })
        .filter(|slice| !slice.is_empty())
    }

    /// This rank's count of each source, batch by batch, from the first.
    pub fn batch_counts(&self) -> impl Iterator<Item = Vec<u64>> + '_ {
        let mut counts = self.counts.clone();
        let mut global = vec![0; self.sources()];
        (0..self.batches).map(move |_| {
            let step = counts.next(&mut global);
            let mut own = vec![0; global.len()];
            rank_counts(&global, self.world_size, self.rank, step, &mut own);
            own
        })
    }

    /// The plan of one part of source `k`: today's plan at batch size 1
    /// for that part's rank and world size; a slice of the part reads
    /// `[from, to)` of its emitted sequence.
    pub fn part_plan(&self, k: usize, part: PartId) -> Result<StreamPlan, PlanError> {
        self.part_plan_from(k, part, 0)
    }

    /// The plan that reads `slice` of source `k` (and on to its part's end):
    /// starting inside a part costs integer work, no data.
    pub fn slice_plan(&self, k: usize, slice: &PartSlice) -> Result<StreamPlan, PlanError> {
        self.part_plan_from(k, slice.part, slice.from)
    }

    fn part_plan_from(&self, k: usize, part: PartId, from: u64) -> Result<StreamPlan, PlanError> {
        let source = &self.sources[k];
        plan_stream(
            &source.shard_samples,
            &PlanRequest {
                seed: self.seeds[k],
                epoch: part.epoch,
                rank: part.rank,
                world_size: part.world_size,
                batch_size: 1,
                shuffle: source.shuffle,
                partition: Partition::DropLast,
                repeats: self.repeats,
                start_batch: from,
                resume_from: Default::default(),
            },
        )
    }

    /// The augmentation seed of source `k`'s samples.
    pub fn source_seed(&self, k: usize) -> u64 {
        self.seeds[k]
    }

    /// The samples of each source this stream takes, to its epoch's end.
    pub fn source_needs(&self) -> Vec<u64> {
        let mut needs = vec![0u64; self.sources()];
        for counts in self.batch_counts() {
            for (need, count) in needs.iter_mut().zip(counts) {
                *need += count;
            }
        }
        needs
    }
}

/// A sample of a mixed stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MixedSample {
    pub source: u32,
    pub source_epoch: u64,
    pub shard: u32,
    pub index: u64,
    /// The copy (repeated augmentation; else 0).
    pub copy: u32,
}

/// The samples a mixed plan emits, batch by batch. For tests and tools: it
/// walks the whole stream.
pub fn emitted_mix(plan: &MixPlan) -> Result<Vec<Vec<MixedSample>>, PlanError> {
    let mut queues: Vec<std::collections::VecDeque<MixedSample>> =
        vec![Default::default(); plan.sources()];
    let mut slices: Vec<_> = (0..plan.sources()).map(|k| plan.source_slices(k)).collect();
    let mut batches = Vec::with_capacity(plan.batches as usize);
    for counts in plan.batch_counts() {
        let mut batch = Vec::new();
        for (k, &count) in counts.iter().enumerate() {
            while (queues[k].len() as u64) < count {
                let slice = slices[k].next().expect("fresh parts never end");
                let part = plan.part_plan(k, slice.part)?;
                let emitted = super::emitted_copies(&part);
                queues[k].extend(emitted[slice.from as usize..slice.to as usize].iter().map(
                    |&(shard, index, copy)| MixedSample {
                        source: k as u32,
                        source_epoch: slice.part.epoch,
                        shard,
                        index,
                        copy,
                    },
                ));
            }
            batch.extend(queues[k].drain(..count as usize));
        }
        batches.push(batch);
    }
    Ok(batches)
}

#[cfg(test)]
mod tests;
