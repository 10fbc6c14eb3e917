//! A rank's schedule: the exact order in which it pulls samples from its
//! segments into the shuffle buffer and emits them (rule 3 of the module
//! above). Pure integer work on sample ids; the pipeline follows it on bytes.

use super::layout::Segment;
use super::rng::Rng;

/// Default number of segments (shards) a rank reads at once.
pub const DEFAULT_INTERLEAVE: u32 = 4;
/// Default shuffle buffer, in samples (holds compressed bytes).
pub const DEFAULT_SHUFFLE_BUFFER: u32 = 2_000;
/// Samples the shuffle buffer holds before it starts emitting. Below its
/// capacity it then emits one sample for every two it pulls, so the first
/// batch waits for a few hundred samples, not for a full buffer (2,000
/// photos are ~220 MB: seconds of S3 reads before the first decode).
pub const SHUFFLE_RAMP_START: usize = 256;

/// A sample of a rank plan: the segment it belongs to (index into
/// `RankPlan::segments`) and its index within its shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SampleRef {
    pub segment: u32,
    pub index: u64,
}

/// One step of a rank's schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The next sample of a segment enters the shuffle buffer.
    Pull(SampleRef),
    /// A sample leaves the buffer: it is the stream's next sample.
    Emit(SampleRef),
}

/// The exact order in which a rank pulls samples from its segments and emits
/// them. The pipeline runs the same steps on real bytes.
#[derive(Debug, Clone)]
pub struct Schedule<'a> {
    plan: &'a RankPlan,
    rng: Rng,
    /// Open segments: (segment index, next sample index).
    open: Vec<(u32, u64)>,
    next_segment: u32,
    buffer: Vec<SampleRef>,
    capacity: usize,
    pending_emit: Option<SampleRef>,
    emitted: u64,
    pulled: u64,
}

impl<'a> Schedule<'a> {
    pub(super) fn new(plan: &'a RankPlan) -> Self {
        let mut schedule = Self {
            plan,
            rng: Rng::derive(&plan.rng_key),
            open: Vec::with_capacity(plan.shuffle.interleave as usize),
            next_segment: 0,
            buffer: Vec::with_capacity(plan.shuffle.buffer as usize),
            capacity: plan.shuffle.buffer as usize,
            pending_emit: None,
            emitted: 0,
            pulled: 0,
        };
        while schedule.open.len() < plan.shuffle.interleave as usize
            && schedule.open_next().is_some()
        {}
        schedule
    }

    fn open_next(&mut self) -> Option<()> {
        loop {
            let index = self.next_segment;
            let segment = self.plan.segments.get(index as usize)?;
            self.next_segment += 1;
            if !segment.is_empty() {
                self.open.push((index, segment.start));
                return Some(());
            }
        }
    }

    /// Samples emitted so far.
    pub fn emitted(&self) -> u64 {
        self.emitted
    }

    /// Runs the schedule on ids only until `count` samples have been emitted.
    /// Returns the samples then held in the shuffle buffer, sorted by segment
    /// and index: the pipeline pulls them first (they were pulled before the
    /// resume point but not yet emitted).
    pub fn skip_emits(&mut self, count: u64) -> Vec<SampleRef> {
        while self.emitted < count {
            if self.next().is_none() {
                break;
            }
        }
        let mut held = self.buffer.clone();
        if let Some(pending) = self.pending_emit {
            held.push(pending);
        }
        held.sort_unstable();
        held
    }

    /// The first sample index of each segment the rest of the schedule needs,
    /// given the samples `held` in the buffer at a resume point; `None` for
    /// segments it never reads again.
    pub fn segment_starts(&self, held: &[SampleRef]) -> Vec<Option<u64>> {
        let mut starts: Vec<Option<u64>> = vec![None; self.plan.segments.len()];
        for (index, segment) in self.plan.segments.iter().enumerate() {
            if (index as u32) >= self.next_segment && !segment.is_empty() {
                starts[index] = Some(segment.start);
            }
        }
        for &(segment, next) in &self.open {
            starts[segment as usize] = Some(next);
        }
        for sample in held {
            let start = &mut starts[sample.segment as usize];
            *start = Some(start.map_or(sample.index, |s| s.min(sample.index)));
        }
        starts
    }

    fn pull(&mut self) -> Option<SampleRef> {
        if self.open.is_empty() {
            return None;
        }
        let slot = self.rng.below(self.open.len() as u64) as usize;
        let (segment, index) = self.open[slot];
        let end = self.plan.segments[segment as usize].end;
        if index + 1 < end {
            self.open[slot].1 = index + 1;
        } else {
            // Keep the order of the remaining open segments stable.
            self.open.remove(slot);
            self.open_next();
        }
        Some(SampleRef { segment, index })
    }
}

impl Iterator for Schedule<'_> {
    type Item = Step;

    fn next(&mut self) -> Option<Step> {
        if let Some(sample) = self.pending_emit.take() {
            self.emitted += 1;
            return Some(Step::Emit(sample));
        }
        if let Some(sample) = self.pull() {
            self.pulled += 1;
            if self.capacity == 0 {
                self.pending_emit = Some(sample);
            } else if self.buffer.len() < self.capacity {
                self.buffer.push(sample);
                if self.buffer.len() >= self.capacity.min(SHUFFLE_RAMP_START)
                    && self.pulled.is_multiple_of(2)
                {
                    let slot = self.rng.below(self.buffer.len() as u64) as usize;
                    self.pending_emit = Some(self.buffer.swap_remove(slot));
                }
            } else {
                let slot = self.rng.below(self.capacity as u64) as usize;
                self.pending_emit = Some(std::mem::replace(&mut self.buffer[slot], sample));
            }
            return Some(Step::Pull(sample));
        }
        if self.buffer.is_empty() {
            return None;
        }
        let slot = self.rng.below(self.buffer.len() as u64) as usize;
        self.emitted += 1;
        Some(Step::Emit(self.buffer.swap_remove(slot)))
    }
}

/// One rank's samples for an epoch at one world size, and how they are shuffled.
#[derive(Debug, Clone)]
pub struct RankPlan {
    pub world_size: u32,
    pub rank: u32,
    pub segments: Vec<Segment>,
    pub len: u64,
    pub(super) shuffle: ShuffleConfig,
    pub(super) rng_key: [u64; 5],
}

impl RankPlan {
    pub fn schedule(&self) -> Schedule<'_> {
        Schedule::new(self)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShuffleConfig {
    pub enabled: bool,
    /// Segments read at once (>= 1).
    pub interleave: u32,
    /// Shuffle buffer size in samples (0 = no buffer).
    pub buffer: u32,
}

impl Default for ShuffleConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interleave: DEFAULT_INTERLEAVE,
            buffer: DEFAULT_SHUFFLE_BUFFER,
        }
    }
}

impl ShuffleConfig {
    /// `shuffle = false` means the stored order: one segment at a time, no buffer.
    /// The settings in force: no interleave or buffer when shuffle is off.
    pub fn effective(self) -> Self {
        if self.enabled {
            Self {
                interleave: self.interleave.max(1),
                ..self
            }
        } else {
            Self {
                enabled: false,
                interleave: 1,
                buffer: 0,
            }
        }
    }
}
