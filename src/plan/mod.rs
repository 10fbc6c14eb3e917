//! Epoch planning: which samples a rank emits in an epoch, and in which order.
//!
//! This module is a pure function of (shard sample counts, seed, epoch, rank,
//! world size, batch size, shuffle settings, resume position). All randomness
//! of shardfeed lives here. It never does I/O, never reads a clock and never
//! depends on thread timing; the pipeline follows its [`Schedule`] exactly,
//! which is what makes streams byte-for-byte reproducible.
//!
//! The rules, in order:
//! 1. **Shard order.** The epoch's sample sequence is the shards' samples in
//!    stored order, shards permuted by (seed, epoch) when shuffling. With
//!    repeated augmentation (`repeats = k`) the sequence is that pass `k`
//!    times over, pass `c` being copy `c` of every sample: `N = k × samples`
//!    below, and a sample's copies lie a pass apart, so they go to `k`
//!    different ranks whenever a rank's share is at most a pass (world size
//!    at least `k`).
//! 2. **Partition.** With global batch `G = world_size * batch_size`, the
//!    epoch has `steps = floor(N / G)` (drop_last) or `ceil(N / G)` (pad)
//!    steps. Rank `r` takes the contiguous positions
//!    `[r * steps * B, (r + 1) * steps * B)` of the sequence; positions past
//!    `N` wrap to the start (pad mode), so what is dropped or repeated changes
//!    with the shard order every epoch. Contiguous ranges keep reads
//!    sequential: a rank reads only its byte range of a boundary shard.
//! 3. **Rank order.** A rank reads `interleave` of its segments at once,
//!    drawing each next sample from a random open segment, and passes the
//!    samples through a seeded shuffle buffer.
//! 4. **Resume.** `start_batch` skips emitted samples by simulating the
//!    schedule on sample ids (no data). An [`EpochPosition`] reached at other
//!    world sizes (same global batch) is replayed phase by phase: each
//!    phase's unconsumed samples, in their order, are concatenated and
//!    split contiguously over the new ranks.
//!
//! Cost: O(shards) per epoch to plan, O(samples emitted) integer work to
//! resume, O(interleave + shuffle_buffer) memory per schedule.

mod layout;
pub mod mix;
pub mod rng;
mod schedule;

pub use layout::{EpochLayout, Segment};
pub use schedule::{
    RankPlan, SampleRef, Schedule, ShuffleConfig, Step, DEFAULT_INTERLEAVE, DEFAULT_SHUFFLE_BUFFER,
    SHUFFLE_RAMP_START,
};

/// Largest accepted shuffle buffer; bounds a stream's memory.
pub const MAX_SHUFFLE_BUFFER: u32 = 1 << 20;
/// Largest accepted interleave; each open segment holds a reader.
pub const MAX_INTERLEAVE: u32 = 256;
/// Largest world size planned for (requests and resume positions alike).
pub const MAX_WORLD_SIZE: u32 = 1 << 16;
/// Most copies of each sample an epoch may hold (repeated augmentation;
/// the recipes use 3 or 4): each copy is a pass over the shards' bytes.
pub const MAX_REPEATS: u32 = 16;
/// Most world-size changes within one epoch a resume position may hold.
pub const MAX_RESUME_PHASES: usize = 64;

/// Keyed into the generator for a rank's order, so it is independent of the
/// shard order ([`layout::PURPOSE_SHARD_ORDER`]).
const PURPOSE_RANK_ORDER: u64 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Partition {
    #[default]
    DropLast,
    Pad,
}

/// A phase of an epoch: a stretch trained at one world size. (On the wire a
/// phase is a `PositionSegment`; in this crate "segment" means a run of one
/// shard's samples.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Phase {
    pub world_size: u32,
    /// Batches every rank completed at this world size.
    pub batches: u64,
}

/// A point in an epoch, valid at any world size with the same global batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EpochPosition {
    pub phases: Vec<Phase>,
}

impl EpochPosition {
    /// Drops empty segments and merges neighbours of equal world size: two
    /// stretches at the same world size continue each other exactly.
    pub fn normalized(&self) -> Self {
        let mut phases: Vec<Phase> = Vec::with_capacity(self.phases.len());
        for phase in self.phases.iter().filter(|p| p.batches > 0) {
            match phases.last_mut() {
                Some(last) if last.world_size == phase.world_size => {
                    // Saturates: a sum past the epoch is refused by the plan.
                    last.batches = last.batches.saturating_add(phase.batches);
                }
                _ => phases.push(*phase),
            }
        }
        Self { phases }
    }

    /// Global steps (batches per rank) completed.
    pub fn steps(&self) -> u64 {
        self.phases
            .iter()
            .fold(0u64, |sum, p| sum.saturating_add(p.batches))
    }

    /// The position after `batches` more batches at `world_size`.
    pub fn advanced(&self, world_size: u32, batches: u64) -> Self {
        let mut phases = self.phases.clone();
        phases.push(Phase {
            world_size,
            batches,
        });
        Self { phases }.normalized()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanRequest {
    pub seed: u64,
    pub epoch: u64,
    pub rank: u32,
    pub world_size: u32,
    pub batch_size: u32,
    pub shuffle: ShuffleConfig,
    pub partition: Partition,
    /// Copies of every sample in the epoch (1: none repeated).
    pub repeats: u32,
    /// Batches to skip after `resume_from`.
    pub start_batch: u64,
    pub resume_from: EpochPosition,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("batch_size must be at least 1")]
    ZeroBatchSize,
    #[error("world_size must be at least 1")]
    ZeroWorldSize,
    #[error("world_size {0} exceeds the maximum {MAX_WORLD_SIZE}")]
    WorldTooLarge(u32),
    #[error("rank {rank} is out of range for world_size {world_size}")]
    RankOutOfRange { rank: u32, world_size: u32 },
    #[error("the dataset has no samples")]
    EmptyDataset,
    #[error(
        "the dataset has {samples} samples, fewer than one global batch \
         (world_size {world_size} x batch_size {batch_size}); use a smaller batch, \
         fewer ranks, or partition=pad"
    )]
    TooFewSamples {
        samples: u64,
        world_size: u32,
        batch_size: u32,
    },
    #[error("repeats {0} is out of range: 1 to {MAX_REPEATS} copies of each sample an epoch")]
    Repeats(u32),
    #[error("shuffle_buffer {0} exceeds the maximum {MAX_SHUFFLE_BUFFER}")]
    ShuffleBufferTooLarge(u32),
    #[error("interleave {0} exceeds the maximum {MAX_INTERLEAVE}")]
    InterleaveTooLarge(u32),
    #[error(
        "resume position segment world_size {world_size} does not divide the global batch \
         {global_batch} (world_size x batch_size must stay the same across a resize)"
    )]
    ResumeWorldSize { world_size: u32, global_batch: u64 },
    #[error(
        "resume position has {0} segments of different world sizes; at most {MAX_RESUME_PHASES} \
         resizes within one epoch are supported"
    )]
    TooManyResumePhases(usize),
    #[error("resume position is {steps} batches into an epoch of {total} batches per rank")]
    ResumePastEnd { steps: u64, total: u64 },
    #[error("start_batch {start} is past the {available} batches left in the epoch")]
    StartPastEnd { start: u64, available: u64 },
}

/// Epoch-level counts for a dataset of `samples` samples.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochCounts {
    pub samples: u64,
    pub global_batch: u64,
    /// Batches per rank.
    pub steps: u64,
    pub dropped: u64,
    pub padded: u64,
}

pub fn epoch_counts(
    samples: u64,
    world_size: u32,
    batch_size: u32,
    partition: Partition,
) -> Result<EpochCounts, PlanError> {
    if batch_size == 0 {
        return Err(PlanError::ZeroBatchSize);
    }
    if world_size == 0 {
        return Err(PlanError::ZeroWorldSize);
    }
    if world_size > MAX_WORLD_SIZE {
        return Err(PlanError::WorldTooLarge(world_size));
    }
    if samples == 0 {
        return Err(PlanError::EmptyDataset);
    }
    let global_batch = u64::from(world_size) * u64::from(batch_size);
    let (steps, dropped, padded) = match partition {
        Partition::DropLast => {
            let steps = samples / global_batch;
            if steps == 0 {
                return Err(PlanError::TooFewSamples {
                    samples,
                    world_size,
                    batch_size,
                });
            }
            (steps, samples - steps * global_batch, 0)
        }
        Partition::Pad => {
            let steps = samples.div_ceil(global_batch);
            (steps, 0, steps * global_batch - samples)
        }
    };
    Ok(EpochCounts {
        samples,
        global_batch,
        steps,
        dropped,
        padded,
    })
}

/// A slice `[from, to)` of one rank plan's emitted sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    pub rank_plan: usize,
    pub from: u64,
    pub to: u64,
}

/// Everything one stream emits: slices of rank plans, concatenated, batched.
#[derive(Debug, Clone)]
pub struct StreamPlan {
    pub counts: EpochCounts,
    pub batch_size: u32,
    pub rank_plans: Vec<RankPlan>,
    pub slices: Vec<Slice>,
    /// Batches this stream emits.
    pub batches: u64,
    /// Index of the first emitted batch (= start_batch).
    pub first_batch: u64,
    /// The position the stream's batch indexes count from.
    pub base_position: EpochPosition,
    pub world_size: u32,
    pub rank: u32,
}

impl StreamPlan {
    /// Samples this stream emits.
    pub fn samples(&self) -> u64 {
        self.slices.iter().map(|p| p.to - p.from).sum()
    }

    /// The epoch position once every rank has finished batch `index`.
    pub fn position_after(&self, index: u64) -> EpochPosition {
        self.base_position.advanced(self.world_size, index + 1)
    }

    /// Samples consumed across all ranks once every rank finished batch `index`.
    pub fn global_samples_after(&self, index: u64) -> u64 {
        (self.base_position.steps() + index + 1) * self.counts.global_batch
    }
}

/// Checks the shuffle settings against their hard limits.
pub fn validate_shuffle(shuffle: ShuffleConfig) -> Result<(), PlanError> {
    if shuffle.buffer > MAX_SHUFFLE_BUFFER {
        return Err(PlanError::ShuffleBufferTooLarge(shuffle.buffer));
    }
    if shuffle.interleave > MAX_INTERLEAVE {
        return Err(PlanError::InterleaveTooLarge(shuffle.interleave));
    }
    Ok(())
}

/// Checks the copies asked for against their bounds.
pub fn validate_repeats(repeats: u32) -> Result<(), PlanError> {
    if repeats == 0 || repeats > MAX_REPEATS {
        return Err(PlanError::Repeats(repeats));
    }
    Ok(())
}

/// Plans one rank's stream. `shard_samples[i]` is the sample count of shard i.
pub fn plan_stream(shard_samples: &[u64], request: &PlanRequest) -> Result<StreamPlan, PlanError> {
    let PlanRequest {
        seed,
        epoch,
        rank,
        world_size,
        batch_size,
        shuffle,
        partition,
        repeats,
        start_batch,
        ref resume_from,
    } = *request;
    validate_shuffle(shuffle)?;
    validate_repeats(repeats)?;
    let shuffle = shuffle.effective();
    let layout = EpochLayout::new(shard_samples, seed, epoch, shuffle.enabled, repeats);
    let counts = epoch_counts(layout.repeated_total(), world_size, batch_size, partition)?;
    if rank >= world_size {
        return Err(PlanError::RankOutOfRange { rank, world_size });
    }
    let resume = resume_from.normalized();
    check_resume(&resume, &counts)?;
    let split = RankSplit {
        layout: &layout,
        counts: &counts,
        seed,
        epoch,
        shuffle,
    };
    let (rank_plans, own_parts) = split.parts_of(rank, world_size, &resume);

    let available = counts.steps - resume.steps();
    if start_batch > available {
        return Err(PlanError::StartPastEnd {
            start: start_batch,
            available,
        });
    }
    let skip = start_batch * u64::from(batch_size);
    let slices = slice_parts(&own_parts, skip, u64::MAX);
    Ok(StreamPlan {
        counts,
        batch_size,
        rank_plans,
        slices,
        batches: available - start_batch,
        first_batch: start_batch,
        base_position: resume,
        world_size,
        rank,
    })
}

/// Checks a resume position against the epoch: planning walks every rank
/// of every phase, so the phase count is bounded here and each phase's
/// world size by the global batch (which the dataset bounds), and a
/// request cannot make planning arbitrarily long.
fn check_resume(resume: &EpochPosition, counts: &EpochCounts) -> Result<(), PlanError> {
    let global_batch = counts.global_batch;
    if resume.phases.len() > MAX_RESUME_PHASES {
        return Err(PlanError::TooManyResumePhases(resume.phases.len()));
    }
    for phase in &resume.phases {
        if phase.world_size > MAX_WORLD_SIZE {
            return Err(PlanError::WorldTooLarge(phase.world_size));
        }
        if phase.world_size == 0 || !global_batch.is_multiple_of(u64::from(phase.world_size)) {
            return Err(PlanError::ResumeWorldSize {
                world_size: phase.world_size,
                global_batch,
            });
        }
    }
    if resume.steps() > counts.steps {
        return Err(PlanError::ResumePastEnd {
            steps: resume.steps(),
            total: counts.steps,
        });
    }
    Ok(())
}

/// One epoch's samples split over ranks, phase after phase of a resume.
struct RankSplit<'a> {
    layout: &'a EpochLayout,
    counts: &'a EpochCounts,
    seed: u64,
    epoch: u64,
    shuffle: ShuffleConfig,
}

impl RankSplit<'_> {
    /// Rank `rank`'s share of the epoch at `world_size`.
    fn rank_plan(&self, world_size: u32, rank: u32) -> RankPlan {
        let per_rank = self.counts.steps * (self.counts.global_batch / u64::from(world_size));
        let from = u64::from(rank) * per_rank;
        let segments = self.layout.segments(from, from + per_rank);
        RankPlan {
            world_size,
            rank,
            len: per_rank,
            segments,
            shuffle: self.shuffle,
            rng_key: [
                self.seed,
                self.epoch,
                u64::from(world_size),
                u64::from(rank),
                PURPOSE_RANK_ORDER,
            ],
        }
    }

    /// The rank plans the stream reads from, and rank `rank`'s sequence as
    /// slices of them, at `world_size` after the phases of `resume`.
    fn parts_of(
        &self,
        rank: u32,
        world_size: u32,
        resume: &EpochPosition,
    ) -> (Vec<RankPlan>, Vec<Slice>) {
        // Phase one: the partition at the world size the epoch started with.
        let first_world = resume.phases.first().map_or(world_size, |p| p.world_size);
        let mut rank_plans: Vec<RankPlan> = Vec::new();
        let mut plan_index = std::collections::HashMap::new();
        let mut rank_parts = |rank: u32, rank_plans: &mut Vec<RankPlan>| -> Vec<Slice> {
            let index = *plan_index.entry(rank).or_insert_with(|| {
                rank_plans.push(self.rank_plan(first_world, rank));
                rank_plans.len() - 1
            });
            vec![Slice {
                rank_plan: index,
                from: 0,
                to: rank_plans[index].len,
            }]
        };

        // Each completed phase consumes a prefix of every rank's sequence;
        // the remainders, concatenated in rank order, are split over the
        // next world.
        let mut current: Option<Vec<Vec<Slice>>> = None; // per-rank slices, phase >= 2
        for (i, phase) in resume.phases.iter().enumerate() {
            let next_world = resume
                .phases
                .get(i + 1)
                .map_or(world_size, |p| p.world_size);
            let per_rank_batch = self.counts.global_batch / u64::from(phase.world_size);
            let skip = phase.batches * per_rank_batch;
            // The universe after this phase, as one list of slices.
            let mut universe: Vec<Slice> = Vec::new();
            for r in 0..phase.world_size {
                let parts = match &current {
                    Some(per_rank) => per_rank[r as usize].clone(),
                    None => rank_parts(r, &mut rank_plans),
                };
                universe.extend(slice_parts(&parts, skip, u64::MAX));
            }
            let remaining: u64 = universe.iter().map(|p| p.to - p.from).sum();
            let per_rank = remaining / u64::from(next_world);
            current = Some(
                (0..u64::from(next_world))
                    .map(|r| slice_parts(&universe, r * per_rank, (r + 1) * per_rank))
                    .collect(),
            );
        }
        let own_parts = match current {
            Some(mut per_rank) => per_rank.swap_remove(rank as usize),
            None => rank_parts(rank, &mut rank_plans),
        };
        (rank_plans, own_parts)
    }
}

/// The sub-sequence `[from, to)` of the concatenation of `parts`.
fn slice_parts(parts: &[Slice], from: u64, to: u64) -> Vec<Slice> {
    let mut out = Vec::new();
    let mut offset = 0u64;
    for part in parts {
        let len = part.to - part.from;
        let lo = from.max(offset);
        let hi = to.min(offset + len);
        if lo < hi {
            out.push(Slice {
                rank_plan: part.rank_plan,
                from: part.from + (lo - offset),
                to: part.from + (hi - offset),
            });
        }
        offset += len;
    }
    out
}

/// One slice of a stream plan, its schedule advanced to where the slice
/// starts: what a reader of the slice follows.
pub struct ResumedSlice<'a> {
    pub rank_plan: &'a RankPlan,
    /// The rest of the rank's schedule; the slice emits `emits` samples of it.
    pub schedule: Schedule<'a>,
    pub emits: u64,
    /// Samples in the shuffle buffer at the slice's start, sorted: they were
    /// pulled before the slice began but not yet emitted, so they are read first.
    pub held: Vec<SampleRef>,
    /// The first sample of each segment the slice still reads; `None` for
    /// segments it never reads again.
    pub segment_starts: Vec<Option<u64>>,
}

impl<'a> ResumedSlice<'a> {
    fn new(plan: &'a StreamPlan, slice: &Slice) -> Self {
        let rank_plan = &plan.rank_plans[slice.rank_plan];
        let mut schedule = rank_plan.schedule();
        let held = schedule.skip_emits(slice.from);
        let segment_starts = schedule.segment_starts(&held);
        Self {
            rank_plan,
            schedule,
            emits: slice.to - slice.from,
            held,
            segment_starts,
        }
    }

    /// The shards this slice reads, in the order it starts reading them.
    pub fn shards(&self) -> impl Iterator<Item = u32> + '_ {
        self.rank_plan
            .segments
            .iter()
            .zip(&self.segment_starts)
            .filter(|(_, start)| start.is_some())
            .map(|(segment, _)| segment.shard)
    }
}

impl StreamPlan {
    /// The stream's slices, each ready to be read from its start. Resuming
    /// costs integer work per skipped sample, no data.
    pub fn resumed_slices(&self) -> impl Iterator<Item = ResumedSlice<'_>> {
        self.slices
            .iter()
            .map(|slice| ResumedSlice::new(self, slice))
    }

    /// The shards this stream reads, in order: what a cache should keep.
    pub fn shard_sequence(&self) -> Vec<u32> {
        let mut shards = Vec::new();
        for slice in self.resumed_slices() {
            shards.extend(slice.shards());
        }
        shards
    }
}

/// The shards the same stream reads in the epoch after `request`'s, from its
/// start: the look-ahead a cache needs to keep what the next epoch reads.
pub fn next_epoch_shard_sequence(
    shard_samples: &[u64],
    request: &PlanRequest,
) -> Result<Vec<u32>, PlanError> {
    let next = PlanRequest {
        epoch: request.epoch.wrapping_add(1),
        start_batch: 0,
        resume_from: EpochPosition::default(),
        ..request.clone()
    };
    Ok(plan_stream(shard_samples, &next)?.shard_sequence())
}

/// The samples a plan emits, in order, as (shard, index) pairs. For tests and
/// tools: it walks the whole stream.
pub fn emitted_samples(plan: &StreamPlan) -> Vec<(u32, u64)> {
    emitted_copies(plan)
        .into_iter()
        .map(|(shard, index, _)| (shard, index))
        .collect()
}

/// [`emitted_samples`] with each sample's copy index: (shard, index, copy).
pub fn emitted_copies(plan: &StreamPlan) -> Vec<(u32, u64, u32)> {
    let mut out = Vec::with_capacity(plan.samples() as usize);
    for slice in plan.resumed_slices() {
        let rank_plan = slice.rank_plan;
        let emits = slice.schedule.filter_map(|step| match step {
            Step::Emit(sample) => Some(sample),
            Step::Pull(_) => None,
        });
        for sample in emits.take(slice.emits as usize) {
            let segment = &rank_plan.segments[sample.segment as usize];
            out.push((segment.shard, sample.index, segment.copy));
        }
    }
    out
}
