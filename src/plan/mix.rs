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
//!    source order.
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
//! 7. **Resume** takes the global step: each source's cursor is recounted
//!    from the step counts (O(steps × sources) integer work, no data).
//!
//! Not yet: a resume at another world size (the per-rank cursors differ by
//! a few samples, so the sources' remainders must be regrouped as
//! `plan_stream` regroups one dataset's).

use super::rng::Rng;
use super::{plan_stream, Partition, PlanError, PlanRequest, ShuffleConfig, StreamPlan};

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
        let total: f64 = weights.iter().sum();
        if total <= 0.0 {
            return Err(MixError::AllZero);
        }
        let mut parts: Vec<u64> = weights
            .iter()
            .map(|w| (w / total * WEIGHT_ONE as f64).round() as u64)
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
    /// The weight log: the first change is at step 0; steps increase.
    pub weights: Vec<WeightChange>,
    /// Batches of the epoch already done.
    pub start_batch: u64,
}

/// Where a rank stands in one source: its `offset`-th sample of its part of
/// source-epoch `epoch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceCursor {
    pub epoch: u64,
    pub offset: u64,
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
    sources: Vec<MixSource>,
    seeds: Vec<u64>,
    /// Samples of each source every rank's part of a source-epoch holds.
    part_len: Vec<u64>,
    cursors: Vec<SourceCursor>,
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

pub fn plan_mix(request: &MixRequest) -> Result<MixPlan, MixError> {
    validate_changes(request)?;
    let MixRequest {
        seed,
        epoch,
        rank,
        world_size,
        batch_size,
        ..
    } = *request;
    let total: u64 = request
        .sources
        .iter()
        .map(|s| s.shard_samples.iter().sum::<u64>())
        .sum();
    let stream = super::epoch_counts(total, world_size, batch_size, Partition::DropLast)?;
    if rank >= world_size {
        return Err(PlanError::RankOutOfRange { rank, world_size }.into());
    }
    let mut part_len = Vec::with_capacity(request.sources.len());
    for (index, source) in request.sources.iter().enumerate() {
        super::validate_shuffle(source.shuffle)?;
        let samples: u64 = source.shard_samples.iter().sum();
        if samples < u64::from(world_size) {
            return Err(MixError::SourceTooSmall {
                index,
                samples,
                world_size,
            });
        }
        part_len.push(samples / u64::from(world_size));
    }
    if request.start_batch > stream.steps {
        return Err(MixError::StartPastEnd {
            start: request.start_batch,
            steps: stream.steps,
        });
    }
    let first_step = epoch
        .saturating_mul(stream.steps)
        .saturating_add(request.start_batch);
    let mut counts = GlobalCounts::new(&request.weights, stream.global_batch);
    let sources = request.sources.len();
    let (mut global, mut own, mut consumed) =
        (vec![0; sources], vec![0; sources], vec![0u64; sources]);
    while counts.step < first_step {
        let step = counts.next(&mut global);
        rank_counts(&global, world_size, rank, step, &mut own);
        for (total, n) in consumed.iter_mut().zip(&own) {
            *total += n;
        }
    }
    let cursors = consumed
        .iter()
        .zip(&part_len)
        .map(|(&n, &len)| SourceCursor {
            epoch: n / len,
            offset: n % len,
        })
        .collect();
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
        sources: request.sources.clone(),
        seeds,
        part_len,
        cursors,
        counts,
    })
}

impl MixPlan {
    pub fn sources(&self) -> usize {
        self.sources.len()
    }

    /// Where this rank starts in source `k`.
    pub fn cursor(&self, k: usize) -> SourceCursor {
        self.cursors[k]
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

    /// Source `k`'s plan of this rank's part of `source_epoch`, from
    /// sample `offset` of it: the source's today-style plan at batch size 1.
    pub fn source_plan(
        &self,
        k: usize,
        source_epoch: u64,
        offset: u64,
    ) -> Result<StreamPlan, PlanError> {
        let source = &self.sources[k];
        plan_stream(
            &source.shard_samples,
            &PlanRequest {
                seed: self.seeds[k],
                epoch: source_epoch,
                rank: self.rank,
                world_size: self.world_size,
                batch_size: 1,
                shuffle: source.shuffle,
                partition: Partition::DropLast,
                start_batch: offset,
                resume_from: Default::default(),
            },
        )
    }

    /// Samples of source `k` in this rank's part of one source-epoch.
    pub fn part_len(&self, k: usize) -> u64 {
        self.part_len[k]
    }
}

/// A sample of a mixed stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MixedSample {
    pub source: u32,
    pub source_epoch: u64,
    pub shard: u32,
    pub index: u64,
}

/// The samples a mixed plan emits, batch by batch. For tests and tools: it
/// walks the whole stream.
pub fn emitted_mix(plan: &MixPlan) -> Result<Vec<Vec<MixedSample>>, PlanError> {
    // Per source: samples of the current source-epoch not yet taken.
    let mut queues: Vec<std::collections::VecDeque<MixedSample>> =
        vec![Default::default(); plan.sources()];
    let mut next_epoch: Vec<(u64, u64)> = (0..plan.sources())
        .map(|k| (plan.cursor(k).epoch, plan.cursor(k).offset))
        .collect();
    let mut batches = Vec::with_capacity(plan.batches as usize);
    for counts in plan.batch_counts() {
        let mut batch = Vec::new();
        for (k, &count) in counts.iter().enumerate() {
            while (queues[k].len() as u64) < count {
                let (epoch, offset) = next_epoch[k];
                let part = plan.source_plan(k, epoch, offset)?;
                queues[k].extend(super::emitted_samples(&part).into_iter().map(
                    |(shard, index)| MixedSample {
                        source: k as u32,
                        source_epoch: epoch,
                        shard,
                        index,
                    },
                ));
                next_epoch[k] = (epoch + 1, 0);
            }
            batch.extend(queues[k].drain(..count as usize));
        }
        batches.push(batch);
    }
    Ok(batches)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights(w: &[f64]) -> MixWeights {
        MixWeights::new(w).unwrap()
    }

    #[test]
    fn bad_weights_are_refused_naming_the_source() {
        assert_eq!(MixWeights::new(&[]), Err(MixError::SourceCount(0)));
        assert!(matches!(
            MixWeights::new(&[0.5, -1.0]),
            Err(MixError::BadWeight { index: 1, .. })
        ));
        assert!(matches!(
            MixWeights::new(&[f64::NAN]),
            Err(MixError::BadWeight { index: 0, .. })
        ));
        assert_eq!(MixWeights::new(&[0.0, 0.0]), Err(MixError::AllZero));
        assert_eq!(
            MixWeights::new(&[1.0; MAX_SOURCES + 1]),
            Err(MixError::SourceCount(MAX_SOURCES + 1))
        );
        let parts = weights(&[1.0, 1.0, 1.0]).0;
        assert_eq!(parts.iter().sum::<u64>(), WEIGHT_ONE);
    }

    #[test]
    fn seventy_thirty_over_a_global_batch_of_ten() {
        let mut counts = GlobalCounts::new(
            &[WeightChange {
                from_step: 0,
                weights: weights(&[0.7, 0.3]),
            }],
            10,
        );
        let mut global = vec![0; 2];
        for _ in 0..5 {
            counts.next(&mut global);
            assert_eq!(global, [7, 3]);
        }
    }

    #[test]
    fn a_third_each_rotates_the_extra_sample() {
        let mut counts = GlobalCounts::new(
            &[WeightChange {
                from_step: 0,
                weights: weights(&[1.0, 1.0, 1.0]),
            }],
            8,
        );
        let mut global = vec![0; 3];
        let mut seen = Vec::new();
        for _ in 0..3 {
            counts.next(&mut global);
            seen.push(global.clone());
        }
        // 8/3 each: two sources get 3, one gets 2, in turn.
        assert_eq!(seen, [vec![3, 3, 2], vec![3, 2, 3], vec![2, 3, 3]]);
    }

    #[test]
    fn leftovers_go_round_robin_and_every_rank_gets_its_batch() {
        // Global batch 8 over 4 ranks: counts 5 and 3 leave 1 and 3 leftovers.
        let mut totals = [[0u64; 2]; 4];
        for step in 0..4 {
            for rank in 0..4 {
                let mut own = [0; 2];
                rank_counts(&[5, 3], 4, rank, step, &mut own);
                assert_eq!(own.iter().sum::<u64>(), 2);
                totals[rank as usize][0] += own[0];
                totals[rank as usize][1] += own[1];
            }
        }
        // Over four steps the leftovers rotated over every rank.
        assert_eq!(totals, [[5, 3]; 4]);
    }

    use proptest::prelude::*;

    fn single(w: &MixWeights) -> Vec<WeightChange> {
        vec![WeightChange {
            from_step: 0,
            weights: w.clone(),
        }]
    }

    fn mix_weights() -> impl Strategy<Value = Vec<f64>> {
        prop::collection::vec(0u32..20, 2..6)
            .prop_filter("one positive", |w| w.iter().any(|&x| x > 0))
            .prop_map(|w| w.into_iter().map(f64::from).collect())
    }

    fn request(
        sources: &[Vec<u64>],
        changes: Vec<WeightChange>,
        world_size: u32,
        rank: u32,
        batch_size: u32,
    ) -> MixRequest {
        MixRequest {
            seed: 7,
            epoch: 0,
            rank,
            world_size,
            batch_size,
            sources: sources
                .iter()
                .enumerate()
                .map(|(k, shards)| MixSource {
                    key: 100 + k as u64,
                    shard_samples: shards.clone(),
                    shuffle: ShuffleConfig {
                        enabled: true,
                        interleave: 2,
                        buffer: 8,
                    },
                })
                .collect(),
            weights: changes,
            start_batch: 0,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Rules 2 and 3: every global batch holds floor or ceil of each
        /// source's share, every prefix is within one sample of the
        /// weights, and every rank gets exactly its batch.
        #[test]
        fn every_global_batch_is_exact_and_every_prefix_is_within_one(
            w in mix_weights(),
            world_size in 1u32..65,
            batch_size in 1u32..65,
        ) {
            let weights = MixWeights::new(&w).unwrap();
            let global_batch = u64::from(world_size) * u64::from(batch_size);
            let mut counts = GlobalCounts::new(&single(&weights), global_batch);
            let sources = w.len();
            let (mut global, mut own) = (vec![0; sources], vec![0; sources]);
            let mut cumulative = vec![0u64; sources];
            for t in 1..=200u64 {
                let step = counts.next(&mut global);
                prop_assert_eq!(global.iter().sum::<u64>(), global_batch);
                let mut per_source = vec![0u64; sources];
                for rank in 0..world_size {
                    rank_counts(&global, world_size, rank, step, &mut own);
                    prop_assert_eq!(own.iter().sum::<u64>(), u64::from(batch_size));
                    for (sum, n) in per_source.iter_mut().zip(&own) {
                        *sum += n;
                    }
                }
                prop_assert_eq!(&per_source, &global);
                for k in 0..sources {
                    let exact = u128::from(weights.0[k]) * u128::from(global_batch);
                    let floor = (exact / u128::from(WEIGHT_ONE)) as u64;
                    prop_assert!(global[k] == floor || global[k] == floor + 1);
                    if weights.0[k] == 0 {
                        prop_assert_eq!(global[k], 0);
                    }
                    cumulative[k] += global[k];
                    let target = exact * u128::from(t);
                    let got = u128::from(cumulative[k]) * u128::from(WEIGHT_ONE);
                    prop_assert!(
                        got.abs_diff(target) < u128::from(WEIGHT_ONE),
                        "source {} after {} steps: {} vs {}", k, t, got, target
                    );
                }
            }
        }

        /// Rule 4: ranks read disjoint samples, and within each source-epoch
        /// every rank's part is read once; a rank that runs out of a source
        /// goes on into its next source-epoch.
        #[test]
        fn ranks_are_disjoint_and_each_source_epoch_is_read_once(
            w in mix_weights(),
            world_size in 1u32..5,
            batch_size in 1u32..9,
            sizes in prop::collection::vec(prop::collection::vec(1u64..12, 1..5), 5),
        ) {
            let sources: Vec<Vec<u64>> = sizes[..w.len()].to_vec();
            prop_assume!(sources.iter().all(|s| s.iter().sum::<u64>() >= u64::from(world_size)));
            let changes = single(&MixWeights::new(&w).unwrap());
            let mut seen: std::collections::HashMap<(u32, u64), Vec<MixedSample>> = Default::default();
            let mut stream_batches = None;
            for rank in 0..world_size {
                // Three stream epochs: the small sources wrap several times.
                for epoch in 0..3 {
                    let plan = plan_mix(&MixRequest {
                        epoch,
                        ..request(&sources, changes.clone(), world_size, rank, batch_size)
                    });
                    let Ok(plan) = plan else {
                        // Fewer samples than one global batch: refused, as today.
                        let too_few = matches!(plan, Err(MixError::Plan(PlanError::TooFewSamples { .. })));
                        prop_assert!(too_few, "{:?}", plan);
                        return Ok(());
                    };
                    let batches = emitted_mix(&plan).unwrap();
                    prop_assert_eq!(*stream_batches.get_or_insert(batches.len()), batches.len());
                    for batch in batches {
                        prop_assert_eq!(batch.len() as u32, batch_size);
                        for sample in batch {
                            seen.entry((sample.source, sample.source_epoch)).or_default().push(sample);
                        }
                    }
                }
            }
            for ((source, epoch), samples) in &seen {
                let total: u64 = sources[*source as usize].iter().sum();
                let part = total / u64::from(world_size);
                let mut unique = samples.clone();
                unique.sort_unstable();
                unique.dedup();
                prop_assert_eq!(unique.len(), samples.len(), "source {} epoch {} repeats", source, epoch);
                prop_assert!(samples.len() as u64 <= part * u64::from(world_size));
            }
        }

        /// Rules 6 and 7: resuming at a batch gives the rest of the stream;
        /// a weight change at a batch keeps every source's cursor and from
        /// there counts as a fresh plan with the new weights.
        #[test]
        fn resume_is_the_tail_and_a_reweight_starts_fresh_from_the_same_cursors(
            w in mix_weights(),
            later in mix_weights(),
            world_size in 1u32..5,
            batch_size in 1u32..9,
            at in 0u64..40,
        ) {
            let sources: Vec<Vec<u64>> = vec![vec![40, 17, 23]; 5][..w.len()].to_vec();
            let later: Vec<f64> = later.iter().cycle().take(w.len()).copied().collect();
            prop_assume!(later.iter().any(|&x| x > 0.0));
            let rank = world_size - 1;
            let base = request(&sources, single(&MixWeights::new(&w).unwrap()), world_size, rank, batch_size);
            let whole = plan_mix(&base).unwrap();
            for k in 0..w.len() {
                prop_assert_eq!(whole.cursor(k), SourceCursor { epoch: 0, offset: 0 });
            }
            let at = at.min(whole.steps_per_epoch);
            let tail = plan_mix(&MixRequest { start_batch: at, ..base.clone() }).unwrap();
            let all = emitted_mix(&whole).unwrap();
            prop_assert_eq!(&emitted_mix(&tail).unwrap()[..], &all[at as usize..]);

            let new_weights = WeightChange { from_step: at, weights: MixWeights::new(&later).unwrap() };
            let mut changes = single(&MixWeights::new(&w).unwrap());
            if at == 0 {
                changes = vec![new_weights];
            } else {
                changes.push(new_weights);
            }
            let reweighted = plan_mix(&MixRequest { weights: changes.clone(), start_batch: at, ..base.clone() }).unwrap();
            for k in 0..w.len() {
                prop_assert_eq!(reweighted.cursor(k), tail.cursor(k));
            }
            // From `at`, the global counts are those of a fresh apportionment.
            let global_batch = u64::from(world_size) * u64::from(batch_size);
            let mut fresh = Apportioner::new(&MixWeights::new(&later).unwrap(), global_batch);
            let mut global = vec![0; w.len()];
            let mut own = vec![0; w.len()];
            for (i, counts) in reweighted.batch_counts().enumerate() {
                fresh.next_counts(&mut global);
                rank_counts(&global, world_size, rank, at + i as u64, &mut own);
                prop_assert_eq!(&counts, &own);
            }
            // And the samples carry on from the cursors: the first batch's
            // samples of each source follow the tail's in that source.
            let from_cursor = emitted_mix(&reweighted).unwrap();
            let tail_samples = emitted_mix(&tail).unwrap();
            if let (Some(a), Some(b)) = (from_cursor.first(), tail_samples.first()) {
                for k in 0..w.len() as u32 {
                    let ours: Vec<_> = a.iter().filter(|s| s.source == k).collect();
                    let theirs: Vec<_> = b.iter().filter(|s| s.source == k).collect();
                    let n = ours.len().min(theirs.len());
                    prop_assert_eq!(&ours[..n], &theirs[..n]);
                }
            }
        }
    }
}
