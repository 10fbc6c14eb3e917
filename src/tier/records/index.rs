//! The tier's index in memory: which records it holds, grouped by the
//! shard they came from, and which to evict next.
//!
//! Eviction follows the streams' plans as the shard cache's does: a shard's
//! samples are read together (shards are read front to back), so the unit
//! of the choice is the shard's group of records. The group to take from is
//! the least recently used one no stream announced, else the one announced
//! furthest ahead; records leave it one at a time. With no plan announced
//! this is least-recently-used by group.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::store::cache::PlanHints;

/// Where this run's use stamps start; records adopted from an earlier run
/// are stamped below it (older than anything used since).
const LIVE_CLOCK: u64 = 1 << 62;

/// Bytes of process memory the index may take per record, a bound: measured
/// 55-89 (a million and two million records in groups of 1,000 and of 10;
/// the hash tables' growth decides where in that range).
pub const INDEX_BYTES_PER_RECORD: u64 = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Record {
    pub shard: u64,
    pub bytes: u64,
}

#[derive(Debug, Default)]
struct Group {
    members: HashSet<u64>,
    bytes: u64,
    used: u64,
}

#[derive(Debug)]
pub(super) struct Index {
    records: HashMap<u64, Record>,
    groups: HashMap<u64, Group>,
    /// (last use, shard): the groups' eviction order.
    by_use: BTreeSet<(u64, u64)>,
    bytes: u64,
    clock: u64,
    adopted_clock: u64,
    /// While the directory is still being scanned: a record not in the
    /// index may still be on disk.
    pub adopting: bool,
    hints: PlanHints,
    /// The group eviction takes from, until the hints move or it empties.
    victim: Option<u64>,
}

impl Default for Index {
    fn default() -> Self {
        Self {
            records: HashMap::new(),
            groups: HashMap::new(),
            by_use: BTreeSet::new(),
            bytes: 0,
            clock: LIVE_CLOCK,
            adopted_clock: 0,
            adopting: false,
            hints: PlanHints::default(),
            victim: None,
        }
    }
}

impl Index {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn get(&self, name: u64) -> Option<Record> {
        self.records.get(&name).copied()
    }

    /// `name` was read: its group moves to the back of the order.
    pub fn touch(&mut self, name: u64) {
        if let Some(record) = self.records.get(&name) {
            self.clock += 1;
            let shard = record.shard;
            self.stamp(shard, self.clock);
        }
    }

    fn stamp(&mut self, shard: u64, used: u64) {
        if let Some(group) = self.groups.get_mut(&shard) {
            self.by_use.remove(&(group.used, shard));
            group.used = used;
            self.by_use.insert((used, shard));
        }
    }

    /// A record stored (or found on disk) by this run.
    pub fn insert(&mut self, name: u64, record: Record) {
        self.remove(name);
        self.clock += 1;
        self.add(name, record, self.clock);
        self.stamp(record.shard, self.clock);
    }

    /// A record an earlier run left, unless this run already knows it; a
    /// new group is older than anything this run used.
    pub fn adopt(&mut self, name: u64, record: Record) {
        if self.records.contains_key(&name) {
            return;
        }
        self.adopted_clock += 1;
        self.add(name, record, self.adopted_clock);
    }

    fn add(&mut self, name: u64, record: Record, used: u64) {
        self.records.insert(name, record);
        self.bytes += record.bytes;
        let group = self.groups.entry(record.shard).or_insert_with(|| {
            self.by_use.insert((used, record.shard));
            Group {
                used,
                ..Group::default()
            }
        });
        group.members.insert(name);
        group.bytes += record.bytes;
    }

    pub fn remove(&mut self, name: u64) -> Option<Record> {
        let record = self.records.remove(&name)?;
        self.bytes -= record.bytes;
        if let Some(group) = self.groups.get_mut(&record.shard) {
            group.members.remove(&name);
            group.bytes -= record.bytes;
            if group.members.is_empty() {
                let used = group.used;
                self.groups.remove(&record.shard);
                self.by_use.remove(&(used, record.shard));
                if self.victim == Some(record.shard) {
                    self.victim = None;
                }
            }
        }
        Some(record)
    }

    pub fn announce(&mut self, stream: &str, sequence: &[String], in_flight: usize) {
        self.hints.announce(stream, sequence, in_flight);
        self.victim = None;
    }

    pub fn reached(&mut self, stream: &str, location: &str) {
        if self.hints.reached(stream, location) {
            self.victim = None;
        }
    }

    /// The next record to evict (taken out of the index), if any.
    pub fn evict_one(&mut self) -> Option<(u64, Record)> {
        let shard = match self.victim.filter(|s| self.groups.contains_key(s)) {
            Some(shard) => shard,
            None => {
                let shard = self.pick_group()?;
                self.victim = Some(shard);
                shard
            }
        };
        let name = *self.groups.get(&shard)?.members.iter().next()?;
        let record = self.remove(name)?;
        Some((name, record))
    }

    /// The least recently used group no stream announced, else the one
    /// announced furthest ahead (ties: the older).
    fn pick_group(&mut self) -> Option<u64> {
        if self.hints.is_empty() {
            return self.by_use.iter().next().map(|&(_, shard)| shard);
        }
        let next_use = self.hints.next_use();
        let mut furthest: Option<(usize, u64)> = None;
        for &(_, shard) in &self.by_use {
            match next_use.get(&shard) {
                None => return Some(shard),
                Some(&distance) if furthest.is_none_or(|(best, _)| distance > best) => {
                    furthest = Some((distance, shard));
                }
                Some(_) => {}
            }
        }
        furthest.map(|(_, shard)| shard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::cache::hints::location_id;

    fn record(shard: &str) -> Record {
        Record {
            shard: location_id(shard),
            bytes: 10,
        }
    }

    fn fill(index: &mut Index) {
        // Two records per shard, used in the order a, b, c.
        let mut name = 0;
        for shard in ["a", "b", "c"] {
            for _ in 0..2 {
                name += 1;
                index.insert(name, record(shard));
            }
        }
    }

    fn evicted_shards(index: &mut Index, count: usize) -> Vec<u64> {
        (0..count)
            .map(|_| index.evict_one().unwrap().1.shard)
            .collect()
    }

    #[test]
    fn without_a_plan_the_least_recently_used_group_goes_first() {
        let mut index = Index::default();
        fill(&mut index);
        index.touch(1); // a is now the most recent
        let id = location_id;
        assert_eq!(
            evicted_shards(&mut index, 4),
            [id("b"), id("b"), id("c"), id("c")]
        );
        assert_eq!((index.len(), index.bytes()), (2, 20));
    }

    #[test]
    fn a_plan_keeps_what_it_reads_soonest() {
        let mut index = Index::default();
        fill(&mut index);
        // The stream reads c, then a; b (the middle one) nobody announced.
        index.announce("s", &["c".to_string(), "a".to_string()], 0);
        let id = location_id;
        assert_eq!(
            evicted_shards(&mut index, 4),
            [id("b"), id("b"), id("a"), id("a")]
        );
        // Once it has read c, c is still its nearest: it stays.
        index.reached("s", "c");
        assert_eq!(index.evict_one().unwrap().1.shard, id("c"));
        assert!(index.evict_one().is_some() && index.evict_one().is_none());
    }

    #[test]
    fn adopted_records_are_older_than_this_runs_and_known_ones_stay() {
        let mut index = Index::default();
        index.insert(1, record("live"));
        index.adopt(2, record("old"));
        index.adopt(1, record("old")); // already known: ignored
        assert_eq!(index.get(1), Some(record("live")));
        assert_eq!(index.evict_one().unwrap().0, 2);
        assert_eq!(index.evict_one().unwrap().0, 1);
        assert_eq!((index.len(), index.bytes()), (0, 0));
    }
}
