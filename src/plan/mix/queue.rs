//! Rule 7's bookkeeping: each rank's way through a source as pieces of
//! ranks' parts of source-epochs, and their regrouping at a resize.

/// A rank's part of a source-epoch, as partitioned at `world_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartId {
    pub epoch: u64,
    pub world_size: u32,
    pub rank: u32,
}

/// Samples `[from, to)` of a part, in the part's own emit order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartSlice {
    pub part: PartId,
    pub from: u64,
    pub to: u64,
}

impl PartSlice {
    pub fn len(&self) -> u64 {
        self.to - self.from
    }

    pub fn is_empty(&self) -> bool {
        self.from == self.to
    }
}

/// One rank's way through one source: `slices` first, then its fresh parts
/// of source-epochs `next_epoch, next_epoch + 1, …` at `world_size`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceQueue {
    pub slices: std::collections::VecDeque<PartSlice>,
    pub next_epoch: u64,
    pub world_size: u32,
    pub rank: u32,
}

impl SourceQueue {
    pub(super) fn fresh(next_epoch: u64, world_size: u32, rank: u32) -> Self {
        Self {
            slices: Default::default(),
            next_epoch,
            world_size,
            rank,
        }
    }

    /// Appends the rank's next fresh part.
    pub(super) fn open_next(&mut self, samples: u64) {
        self.slices.push_back(PartSlice {
            part: PartId {
                epoch: self.next_epoch,
                world_size: self.world_size,
                rank: self.rank,
            },
            from: 0,
            to: samples / u64::from(self.world_size),
        });
        self.next_epoch += 1;
    }

    /// Consumes `count` samples; `samples` is the source's size.
    pub(super) fn take(&mut self, mut count: u64, samples: u64) {
        let part = samples / u64::from(self.world_size);
        while count > 0 {
            let Some(front) = self.slices.front_mut() else {
                // Whole fresh parts taken (source-epochs run through) are
                // skipped by arithmetic; the last one is opened.
                if part > 0 && count > part {
                    let whole = (count - 1) / part;
                    self.next_epoch += whole;
                    count -= whole * part;
                }
                self.open_next(samples);
                continue;
            };
            let taken = count.min(front.len());
            front.from += taken;
            count -= taken;
            if front.is_empty() {
                self.slices.pop_front();
            }
        }
    }
}

/// The samples `[from, to)` of the concatenation of `slices`.
fn sub_slices(slices: &[PartSlice], from: u64, to: u64) -> Vec<PartSlice> {
    let mut out = Vec::new();
    let mut offset = 0u64;
    for slice in slices {
        let (lo, hi) = (from.max(offset), to.min(offset + slice.len()));
        if lo < hi {
            out.push(PartSlice {
                part: slice.part,
                from: slice.from + (lo - offset),
                to: slice.from + (hi - offset),
            });
        }
        offset += slice.len();
    }
    out
}

/// Rule 7: every old rank's queue of one source, regrouped over `world_size`
/// new ranks.
pub(super) fn regroup(
    mut queues: Vec<SourceQueue>,
    world_size: u32,
    samples: u64,
) -> Vec<SourceQueue> {
    let frontier = queues.iter().map(|q| q.next_epoch).max().unwrap_or(0);
    let mut universes: std::collections::BTreeMap<u64, Vec<PartSlice>> = Default::default();
    for queue in &mut queues {
        // A source-epoch another rank started is in flight for this one too.
        while queue.next_epoch < frontier {
            queue.open_next(samples);
        }
        for slice in queue.slices.iter().filter(|s| !s.is_empty()) {
            universes.entry(slice.part.epoch).or_default().push(*slice);
        }
    }
    let world = u64::from(world_size);
    (0..world_size)
        .map(|rank| {
            let mut queue = SourceQueue::fresh(frontier, world_size, rank);
            for universe in universes.values() {
                let total: u64 = universe.iter().map(PartSlice::len).sum();
                let (share, extra) = (total / world, total % world);
                let r = u64::from(rank);
                let start = r * share + r.min(extra);
                let end = start + share + u64::from(r < extra);
                queue.slices.extend(sub_slices(universe, start, end));
            }
            queue
        })
        .collect()
}
