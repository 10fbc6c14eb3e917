//! Properties of the epoch plan against a simple reference model: the epoch is
//! the shards' samples in the epoch's shard order; rank r owns the contiguous
//! slice [r*n, (r+1)*n) of it (wrapping in pad mode), in some order.

use std::collections::{BTreeMap, HashSet};

use proptest::prelude::*;
use shardfeed::plan::{
    emitted_copies, emitted_samples, epoch_counts, plan_stream, EpochLayout, EpochPosition,
    Partition, Phase, PlanError, PlanRequest, ShuffleConfig,
};

type Sample = (u32, u64);

fn request(world_size: u32, rank: u32, batch_size: u32, partition: Partition) -> PlanRequest {
    PlanRequest {
        seed: 5,
        epoch: 2,
        rank,
        world_size,
        batch_size,
        shuffle: ShuffleConfig {
            enabled: true,
            interleave: 3,
            buffer: 7,
        },
        partition,
        repeats: 1,
        start_batch: 0,
        resume_from: EpochPosition::default(),
    }
}

/// The reference: the epoch sequence as a flat list.
fn reference_sequence(shards: &[u64], req: &PlanRequest) -> Vec<Sample> {
    let layout = EpochLayout::new(
        shards,
        req.seed,
        req.epoch,
        req.shuffle.enabled,
        req.repeats,
    );
    let mut order = layout.shard_order().to_vec();
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..shards.len() as u32).collect::<Vec<_>>(),
        "shard order is a permutation"
    );
    order
        .drain(..)
        .flat_map(|s| (0..shards[s as usize]).map(move |i| (s, i)))
        .collect()
}

fn reference_rank(shards: &[u64], req: &PlanRequest, steps: u64) -> Vec<Sample> {
    let sequence = reference_sequence(shards, req);
    let per_rank = steps * u64::from(req.batch_size);
    (u64::from(req.rank) * per_rank..u64::from(req.rank + 1) * per_rank)
        .map(|p| sequence[(p % sequence.len() as u64) as usize])
        .collect()
}

/// A sample with its copy index (repeated augmentation).
type Copy = (u32, u64, u32);

/// The reference with repeats: position `p` of the epoch is sample
/// `p mod N` of the one-pass sequence, copy `(p div N) mod repeats`.
fn reference_rank_copies(shards: &[u64], req: &PlanRequest, steps: u64) -> Vec<Copy> {
    let sequence = reference_sequence(shards, req);
    let n = sequence.len() as u64;
    let per_rank = steps * u64::from(req.batch_size);
    (u64::from(req.rank) * per_rank..u64::from(req.rank + 1) * per_rank)
        .map(|p| {
            let (shard, index) = sequence[(p % n) as usize];
            (shard, index, ((p / n) % u64::from(req.repeats)) as u32)
        })
        .collect()
}

fn sorted<T: Ord>(mut samples: Vec<T>) -> Vec<T> {
    samples.sort_unstable();
    samples
}

fn dataset() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(0u64..25, 1..12)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn ranks_get_equal_disjoint_slices(
        shards in dataset(),
        world_size in 1u32..=64,
        batch_size in 1u32..6,
        pad in any::<bool>(),
        shuffle in any::<bool>(),
    ) {
        let partition = if pad { Partition::Pad } else { Partition::DropLast };
        let total: u64 = shards.iter().sum();
        let global = u64::from(world_size) * u64::from(batch_size);
        let mut seen: BTreeMap<Sample, u32> = BTreeMap::new();
        for rank in 0..world_size {
            let mut req = request(world_size, rank, batch_size, partition);
            req.shuffle.enabled = shuffle;
            match plan_stream(&shards, &req) {
                Err(PlanError::EmptyDataset) => { prop_assert_eq!(total, 0); return Ok(()); }
                Err(PlanError::TooFewSamples { .. }) => {
                    prop_assert!(!pad && total < global);
                    return Ok(());
                }
                Err(other) => prop_assert!(false, "unexpected {other}"),
                Ok(plan) => {
                    let steps = plan.counts.steps;
                    prop_assert_eq!(plan.batches, steps);
                    let emitted = emitted_samples(&plan);
                    prop_assert_eq!(emitted.len() as u64, steps * u64::from(batch_size));
                    prop_assert_eq!(sorted(emitted.clone()), sorted(reference_rank(&shards, &req, steps)));
                    if !shuffle {
                        prop_assert_eq!(&emitted, &reference_rank(&shards, &req, steps), "stored order");
                    }
                    for sample in emitted {
                        *seen.entry(sample).or_default() += 1;
                    }
                }
            }
        }
        let counts = epoch_counts(total, world_size, batch_size, partition).unwrap();
        if pad {
            // Every sample at least once; repeats fill exactly the padding.
            prop_assert_eq!(seen.len() as u64, total);
            let repeats: u64 = seen.values().map(|&c| u64::from(c) - 1).sum();
            prop_assert_eq!(repeats, counts.padded);
        } else {
            prop_assert!(seen.values().all(|&c| c == 1), "a sample reached two ranks");
            prop_assert!(total - seen.len() as u64 == counts.dropped);
            prop_assert!(counts.dropped < global);
        }
    }

    #[test]
    fn repeats_deliver_each_copy_once_on_distinct_ranks(
        shards in dataset(),
        world_size in 1u32..=12,
        batch_size in 1u32..5,
        repeats in 1u32..=4,
        pad in any::<bool>(),
        start in 0u64..20,
    ) {
        let partition = if pad { Partition::Pad } else { Partition::DropLast };
        let total: u64 = shards.iter().sum();
        let global = u64::from(world_size) * u64::from(batch_size);
        let mut ranks_of: BTreeMap<Sample, Vec<u32>> = BTreeMap::new();
        let mut seen: BTreeMap<Copy, u32> = BTreeMap::new();
        for rank in 0..world_size {
            let req = PlanRequest { repeats, ..request(world_size, rank, batch_size, partition) };
            let Ok(plan) = plan_stream(&shards, &req) else {
                prop_assert!(total == 0 || (!pad && total * u64::from(repeats) < global));
                return Ok(());
            };
            let emitted = emitted_copies(&plan);
            prop_assert_eq!(emitted.len() as u64, plan.counts.steps * u64::from(batch_size));
            prop_assert_eq!(
                sorted(emitted.clone()),
                sorted(reference_rank_copies(&shards, &req, plan.counts.steps))
            );
            // A resumed stream is the rest of the full one, copies included.
            let start = start % (plan.batches + 1);
            let resumed = plan_stream(&shards, &PlanRequest { start_batch: start, ..req }).unwrap();
            prop_assert_eq!(
                emitted_copies(&resumed),
                emitted[(start * u64::from(batch_size)) as usize..].to_vec()
            );
            for (shard, index, copy) in emitted {
                prop_assert!(copy < repeats);
                *seen.entry((shard, index, copy)).or_default() += 1;
                ranks_of.entry((shard, index)).or_default().push(rank);
            }
        }
        let counts = epoch_counts(total * u64::from(repeats), world_size, batch_size, partition).unwrap();
        if pad {
            prop_assert_eq!(seen.len() as u64, total * u64::from(repeats));
            let extra: u64 = seen.values().map(|&c| u64::from(c) - 1).sum();
            prop_assert_eq!(extra, counts.padded);
        } else {
            prop_assert!(seen.values().all(|&c| c == 1), "a copy was delivered twice");
            prop_assert_eq!(total * u64::from(repeats) - seen.len() as u64, counts.dropped);
            if world_size >= repeats {
                for (sample, ranks) in &ranks_of {
                    let distinct: HashSet<&u32> = ranks.iter().collect();
                    prop_assert_eq!(distinct.len(), ranks.len(), "copies of {:?} share a rank", sample);
                }
            }
        }
    }

    #[test]
    fn plans_are_deterministic_and_resume_exactly(
        shards in dataset(),
        world_size in 1u32..5,
        batch_size in 1u32..5,
        buffer in 0u32..20,
        interleave in 1u32..5,
        start in 0u64..40,
    ) {
        let mut req = request(world_size, world_size - 1, batch_size, Partition::DropLast);
        req.shuffle.buffer = buffer;
        req.shuffle.interleave = interleave;
        let Ok(plan) = plan_stream(&shards, &req) else { return Ok(()) };
        let full = emitted_samples(&plan);
        prop_assert_eq!(&full, &emitted_samples(&plan_stream(&shards, &req).unwrap()));
        let start = start % (plan.batches + 1);
        let resumed = plan_stream(&shards, &PlanRequest { start_batch: start, ..req.clone() }).unwrap();
        prop_assert_eq!(resumed.batches, plan.batches - start);
        prop_assert_eq!(emitted_samples(&resumed), full[(start * u64::from(batch_size)) as usize..].to_vec());
        let past = plan_stream(&shards, &PlanRequest { start_batch: plan.batches + 1, ..req });
        let is_start_error = matches!(past, Err(PlanError::StartPastEnd { .. }));
        prop_assert!(is_start_error);
    }

    #[test]
    fn elastic_resume_repeats_nothing_and_skips_nothing(
        shards in prop::collection::vec(0u64..40, 1..10),
        global_divisors in prop::collection::vec(prop::sample::select(vec![1u32, 2, 3, 4, 6, 12]), 2..4),
        cut_points in prop::collection::vec(0u64..100, 3),
        pad in any::<bool>(),
        repeats in 1u32..=3,
    ) {
        // Global batch 12; world sizes drawn from its divisors.
        let global = 12u32;
        let partition = if pad { Partition::Pad } else { Partition::DropLast };
        let total: u64 = shards.iter().sum::<u64>() * u64::from(repeats);
        let Ok(counts) = epoch_counts(total, 1, global, partition) else { return Ok(()) };
        let mut position = EpochPosition::default();
        let mut consumed: Vec<Copy> = Vec::new();
        for (phase, &world) in global_divisors.iter().enumerate() {
            let last = phase + 1 == global_divisors.len();
            let left = counts.steps - position.steps();
            let batches = if last { left } else { cut_points[phase] % (left + 1) };
            for rank in 0..world {
                let req = PlanRequest {
                    resume_from: position.clone(),
                    repeats,
                    ..request(world, rank, global / world, partition)
                };
                let plan = plan_stream(&shards, &req).unwrap();
                prop_assert_eq!(plan.batches, left);
                let emitted = emitted_copies(&plan);
                consumed.extend_from_slice(&emitted[..(batches * u64::from(global / world)) as usize]);
                // The batch messages carry the position reached.
                if batches > 0 {
                    let after = plan.position_after(batches - 1);
                    prop_assert_eq!(after.steps(), position.steps() + batches);
                }
            }
            position = position.advanced(world, batches);
        }
        prop_assert_eq!(position.steps(), counts.steps);
        let one_rank = PlanRequest { repeats, ..request(1, 0, global, partition) };
        let expected = reference_rank_copies(&shards, &one_rank, counts.steps);
        prop_assert_eq!(sorted(consumed), sorted(expected));
    }
}

#[test]
fn epochs_and_seeds_change_the_order_and_the_dropped_samples() {
    let shards = vec![50u64; 20];
    let plan = |seed, epoch| {
        let req = PlanRequest {
            seed,
            epoch,
            ..request(3, 1, 16, Partition::DropLast)
        };
        emitted_samples(&plan_stream(&shards, &req).unwrap())
    };
    let (a, b, c) = (plan(0, 0), plan(0, 1), plan(1, 0));
    assert_ne!(a, b);
    assert_ne!(a, c);
    assert_eq!(a, plan(0, 0));
    let as_set = |v: &Vec<Sample>| v.iter().copied().collect::<HashSet<_>>();
    assert_ne!(
        as_set(&a),
        as_set(&b),
        "rank slices move with the shard order"
    );
}

#[test]
fn too_few_samples_is_a_clear_error() {
    let error = plan_stream(&[3, 4], &request(4, 0, 2, Partition::DropLast)).unwrap_err();
    assert_eq!(
        error.to_string(),
        "the dataset has 7 samples, fewer than one global batch (world_size 4 x batch_size 2); \
         use a smaller batch, fewer ranks, or partition=pad"
    );
    let padded = plan_stream(&[3, 4], &request(4, 3, 2, Partition::Pad)).unwrap();
    assert_eq!(padded.batches, 1);
}

#[test]
fn resume_positions_are_validated() {
    let shards = [40u64; 3];
    let bad_world = PlanRequest {
        resume_from: EpochPosition {
            phases: vec![Phase {
                world_size: 5,
                batches: 1,
            }],
        },
        ..request(2, 0, 6, Partition::DropLast)
    };
    assert!(matches!(
        plan_stream(&shards, &bad_world),
        Err(PlanError::ResumeWorldSize { .. })
    ));
    let past_end = PlanRequest {
        resume_from: EpochPosition {
            phases: vec![Phase {
                world_size: 4,
                batches: 99,
            }],
        },
        ..request(2, 0, 6, Partition::DropLast)
    };
    assert!(matches!(
        plan_stream(&shards, &past_end),
        Err(PlanError::ResumePastEnd { .. })
    ));
}

#[test]
fn a_large_shuffle_buffer_starts_emitting_early_and_stays_bounded() {
    use shardfeed::plan::{Step, SHUFFLE_RAMP_START};
    let shards = vec![1_000u64; 8];
    let mut req = request(1, 0, 16, Partition::DropLast);
    req.shuffle.buffer = 2_000;
    let plan = plan_stream(&shards, &req).unwrap();
    let (mut pulls, mut emits, mut first_emit_after) = (0u64, 0u64, None);
    for step in plan.rank_plans[0].schedule() {
        match step {
            Step::Pull(_) => pulls += 1,
            Step::Emit(_) => {
                emits += 1;
                first_emit_after.get_or_insert(pulls);
            }
        }
        // The buffer plus the one sample a pull displaces, emitted next.
        assert!(pulls - emits <= 2_001, "buffer over capacity");
    }
    assert_eq!(first_emit_after, Some(SHUFFLE_RAMP_START as u64));
    assert_eq!(emits, 8_000);
    // Resuming inside the ramp and after it gives the rest of the same stream.
    let full = emitted_samples(&plan);
    for start in [3u64, 40, 300] {
        let resumed = plan_stream(
            &shards,
            &PlanRequest {
                start_batch: start,
                ..req.clone()
            },
        )
        .unwrap();
        assert_eq!(emitted_samples(&resumed), full[(start * 16) as usize..]);
    }
}
