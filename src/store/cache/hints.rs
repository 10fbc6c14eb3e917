//! What the streams' plans will read next, in order: the eviction hints
//! that the shard cache and the decoded-source tier both follow (Belady's
//! rule: evict what is needed furthest in the future).
//!
//! Each stream announces the shard locations it reads this epoch and the
//! next (both pure functions of its request) and reports each shard as it
//! starts reading it. Locations are kept as 64-bit hashes: a collision can
//! only make an eviction choice worse, never serve wrong bytes (the caches
//! key their contents by full name and version).

use std::collections::HashMap;

/// Streams whose plan is kept as hints (finished ones too: their next
/// epoch's plan is the best guess of what comes next).
const MAX_STREAMS: usize = 256;

/// A cache whose eviction follows the streams' plans.
pub trait PlanFollower: Send + Sync {
    /// `stream` (dataset, seed, rank, world size: the same stream across
    /// epochs, so the next epoch's replaces it) will read the shards at
    /// `sequence`, in order (this epoch, then the next). `in_flight`: how
    /// many shards before the one it last started the stream may still be
    /// consuming (its readers, interleave and shuffle buffer), for a cache
    /// filled as samples are consumed rather than as shards are read.
    fn announce(&self, stream: &str, sequence: &[String], in_flight: usize);
    /// `stream` started reading the shard at `location`.
    fn reached(&self, stream: &str, location: &str);
}

/// A location's id in the hints.
pub fn location_id(location: &str) -> u64 {
    crate::hash::fmix64(crate::hash::fnv1a(location.bytes()))
}

#[derive(Debug)]
struct Hint {
    sequence: Vec<u64>,
    cursor: usize,
    /// Shards before the cursor still in use (distance 0).
    in_flight: usize,
    updated: u64,
}

/// The announced sequences and, rebuilt lazily after any of them moved,
/// each location's distance to its next read over all of them. Not locked
/// itself: it lives inside its cache's state.
#[derive(Debug, Default)]
pub struct PlanHints {
    hints: HashMap<String, Hint>,
    next_use: Option<HashMap<u64, usize>>,
    clock: u64,
}

impl PlanHints {
    /// `stream` (dataset, seed, rank, world size: the same stream across
    /// epochs, so the next epoch's replaces it) will read `sequence`.
    pub fn announce(&mut self, stream: &str, sequence: &[String], in_flight: usize) {
        self.clock += 1;
        self.next_use = None;
        self.hints.insert(
            stream.to_string(),
            Hint {
                sequence: sequence.iter().map(|l| location_id(l)).collect(),
                cursor: 0,
                in_flight,
                updated: self.clock,
            },
        );
        if self.hints.len() > MAX_STREAMS {
            if let Some(oldest) = self
                .hints
                .iter()
                .min_by_key(|(_, hint)| hint.updated)
                .map(|(key, _)| key.clone())
            {
                self.hints.remove(&oldest);
            }
        }
    }

    /// `stream` started reading `location`: its hints before it are past.
    /// Returns whether the distances moved.
    pub fn reached(&mut self, stream: &str, location: &str) -> bool {
        self.clock += 1;
        let clock = self.clock;
        let Some(hint) = self.hints.get_mut(stream) else {
            return false;
        };
        hint.updated = clock;
        let id = location_id(location);
        let Some(offset) = hint.sequence[hint.cursor..].iter().position(|&l| l == id) else {
            return false;
        };
        hint.cursor += offset;
        if offset > 0 {
            self.next_use = None;
        }
        offset > 0
    }

    /// Each announced location's distance to its next read (absent: no
    /// stream announced it).
    pub fn next_use(&mut self) -> &HashMap<u64, usize> {
        let hints = &self.hints;
        self.next_use.get_or_insert_with(|| {
            let mut next_use: HashMap<u64, usize> = HashMap::new();
            for hint in hints.values() {
                let start = hint.cursor.saturating_sub(hint.in_flight);
                for (offset, &location) in hint.sequence[start..].iter().enumerate() {
                    let distance = (start + offset).saturating_sub(hint.cursor);
                    let slot = next_use.entry(location).or_insert(distance);
                    *slot = (*slot).min(distance);
                }
            }
            next_use
        })
    }

    /// Whether any stream announced anything.
    pub fn is_empty(&self) -> bool {
        self.hints.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances_follow_the_nearest_stream_and_move_as_streams_read() {
        let mut hints = PlanHints::default();
        let seq = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        hints.announce("a", &seq(&["s1", "s2", "s3"]), 0);
        hints.announce("b", &seq(&["s3", "s4"]), 0);
        let id = location_id;
        let next = hints.next_use().clone();
        assert_eq!(next[&id("s1")], 0);
        assert_eq!(next[&id("s3")], 0);
        assert_eq!(next[&id("s4")], 1);
        assert!(!next.contains_key(&id("s5")));
        assert!(hints.reached("a", "s2"));
        let next = hints.next_use().clone();
        assert!(!next.contains_key(&id("s1")));
        assert_eq!(next[&id("s2")], 0);
        // Not in the sequence, or an unknown stream: nothing moves.
        assert!(!hints.reached("a", "s9"));
        assert!(!hints.reached("zz", "s1"));
        // The next epoch's stream replaces the old one.
        hints.announce("b", &seq(&["s5"]), 0);
        assert!(!hints.next_use().contains_key(&id("s4")));
    }

    #[test]
    fn shards_still_in_flight_stay_in_use() {
        let mut hints = PlanHints::default();
        let seq: Vec<String> = ["a", "b", "c", "d", "a"]
            .iter()
            .map(|n| n.to_string())
            .collect();
        hints.announce("s", &seq, 1);
        hints.reached("s", "c");
        let next = hints.next_use().clone();
        let id = location_id;
        // b (one behind) is still being consumed; a's next read is ahead.
        assert_eq!((next[&id("b")], next[&id("c")], next[&id("d")]), (0, 0, 1));
        assert_eq!(next[&id("a")], 2);
    }
}
