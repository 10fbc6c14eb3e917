//! The epoch's sample sequence (rule 1 of the module above): the shards in
//! their order for (seed, epoch), and the runs of one shard's samples that
//! cover a stretch of it.

use super::rng::Rng;

/// Keyed into the generator for the shard order (the rank order has its own).
pub(super) const PURPOSE_SHARD_ORDER: u64 = 1;

/// A contiguous run of samples `[start, end)` of one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub shard: u32,
    pub start: u64,
    pub end: u64,
    /// Past the epoch's end, wrapped to its start (pad mode): these samples
    /// repeat ones the epoch already has, and batches mark them.
    pub padding: bool,
    /// Which of the epoch's passes over the shards this run belongs to
    /// (`0..repeats`): with repeated augmentation each pass is one copy of
    /// every sample, and the copy index keys the sample's own decisions.
    pub copy: u32,
}

impl Segment {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// The epoch's sample sequence: shards in (possibly permuted) order, passed
/// over `repeats` times (one pass a copy of every sample).
#[derive(Debug, Clone)]
pub struct EpochLayout {
    order: Vec<u32>,
    repeats: u32,
    /// `starts[i]` is the sequence position of the first sample of `order[i]`.
    starts: Vec<u64>,
    total: u64,
    shard_samples: Vec<u64>,
}

impl EpochLayout {
    pub fn new(shard_samples: &[u64], seed: u64, epoch: u64, shuffle: bool, repeats: u32) -> Self {
        let mut order: Vec<u32> = (0..shard_samples.len() as u32).collect();
        if shuffle {
            Rng::derive(&[seed, epoch, PURPOSE_SHARD_ORDER]).shuffle(&mut order);
        }
        let mut starts = Vec::with_capacity(order.len());
        let mut total = 0u64;
        for &shard in &order {
            starts.push(total);
            total += shard_samples[shard as usize];
        }
        Self {
            order,
            repeats: repeats.max(1),
            starts,
            total,
            shard_samples: shard_samples.to_vec(),
        }
    }

    /// Samples in one pass (the dataset's size).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Positions in the epoch's sequence before padding: every pass.
    pub fn repeated_total(&self) -> u64 {
        self.total * u64::from(self.repeats)
    }

    /// The shard order of this epoch.
    pub fn shard_order(&self) -> &[u32] {
        &self.order
    }

    /// Segments covering positions `[from, to)`. Position `p` is sample
    /// `p mod total` of copy `(p div total) mod repeats`: the passes follow
    /// each other, so a contiguous range of positions stays a sequential
    /// read, and the `repeats` copies of a sample lie one pass apart (on
    /// `repeats` different ranks wherever a rank's share is at most a pass).
    /// Positions past every pass wrap to the start (pad mode).
    pub fn segments(&self, from: u64, to: u64) -> Vec<Segment> {
        let mut segments = Vec::new();
        let mut position = from;
        while position < to && self.total > 0 {
            let wrapped = position % self.total;
            // Last shard whose first position is <= wrapped (skips empty shards).
            let slot = self.starts.partition_point(|&s| s <= wrapped) - 1;
            let shard = self.order[slot];
            let start = wrapped - self.starts[slot];
            let available = self.shard_samples[shard as usize] - start;
            let take = available.min(to - position);
            segments.push(Segment {
                shard,
                start,
                end: start + take,
                padding: position >= self.repeated_total(),
                copy: ((position / self.total) % u64::from(self.repeats)) as u32,
            });
            position += take;
        }
        segments
    }
}
