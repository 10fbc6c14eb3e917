//! The mixing rules, checked on ids: examples and properties.

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
fn huge_weights_whose_sum_overflows_keep_their_ratio() {
    assert_eq!(weights(&[1e308, 1e308]), weights(&[1.0, 1.0]));
    assert_eq!(weights(&[f64::MAX, f64::MAX / 3.0]), weights(&[3.0, 1.0]));
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
        repeats: 1,
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
        history: Vec::new(),
        start_batch: 0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Rules 2 and 3: every global batch holds floor or ceil of each
    /// source's share, every prefix is at most one sample from the
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
                // At most one sample: the credit rule can serve a source
                // whose credit stands exactly at 0 (a tie), which puts its
                // prefix one whole sample ahead (weights 14:12:12:12:14
                // over batches of 50: 76 after 8 steps against 75).
                prop_assert!(
                    got.abs_diff(target) <= u128::from(WEIGHT_ONE),
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
        repeats in 1u32..=3,
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
                    repeats,
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
            // A source-epoch is every copy of each of its samples.
            let total = sources[*source as usize].iter().sum::<u64>() * u64::from(repeats);
            let part = total / u64::from(world_size);
            prop_assert!(samples.iter().all(|s| s.copy < repeats));
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
            prop_assert_eq!(whole.queue(k), &SourceQueue::fresh(0, world_size, rank));
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
            prop_assert_eq!(reweighted.queue(k), tail.queue(k));
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

    /// Rule 7: a stream run at one world size and resumed at another
    /// (same global batch) reads no sample twice within a source-epoch,
    /// finishes every source-epoch it leaves behind, and keeps the
    /// global batches' counts.
    #[test]
    fn a_resize_repeats_and_skips_nothing_inside_a_source_epoch(
        w in mix_weights(),
        worlds in prop::sample::select(vec![(1u32, 4u32), (4, 2), (2, 4), (4, 1), (3, 6), (6, 2)]),
        per_rank in 1u32..5,
        at in 0u64..30,
    ) {
        let (before, after) = worlds;
        let global_batch = before * after * per_rank;
        let sources: Vec<Vec<u64>> = vec![vec![13, 29, 7], vec![31], vec![5, 5, 5, 9], vec![50, 3], vec![17]][..w.len()].to_vec();
        let changes = single(&MixWeights::new(&w).unwrap());
        let old = |rank| request(&sources, changes.clone(), before, rank, global_batch / before);
        let steps = plan_mix(&old(0)).unwrap().steps_per_epoch;
        let at = at.min(steps);
        let mut seen: std::collections::HashMap<(u32, u64), Vec<MixedSample>> = Default::default();
        let mut per_step: Vec<Vec<u64>> = vec![vec![0; w.len()]; (3 * steps) as usize];
        let mut furthest: std::collections::HashMap<(u32, u32), u64> = Default::default();
        let mut record = |step: u64, batch: &[MixedSample]| {
            for sample in batch {
                seen.entry((sample.source, sample.source_epoch)).or_default().push(*sample);
                per_step[step as usize][sample.source as usize] += 1;
            }
        };
        for rank in 0..before {
            for (i, batch) in emitted_mix(&plan_mix(&old(rank)).unwrap()).unwrap()[..at as usize].iter().enumerate() {
                record(i as u64, batch);
            }
        }
        for rank in 0..after {
            for epoch in 0..3u64 {
                let resumed = MixRequest {
                    epoch,
                    start_batch: if epoch == 0 { at } else { 0 },
                    history: vec![crate::plan::Phase { world_size: before, batches: at }],
                    ..request(&sources, changes.clone(), after, rank, global_batch / after)
                };
                let plan = plan_mix(&resumed).unwrap();
                for (i, batch) in emitted_mix(&plan).unwrap().iter().enumerate() {
                    record(plan.first_step + i as u64, batch);
                    for sample in batch {
                        let entry = furthest.entry((rank, sample.source)).or_default();
                        *entry = (*entry).max(sample.source_epoch);
                    }
                }
            }
        }
        // The global counts are the world-independent ones.
        let mut counts = GlobalCounts::new(&changes, u64::from(global_batch));
        let mut global = vec![0; w.len()];
        for step in &per_step {
            counts.next(&mut global);
            prop_assert_eq!(step, &global);
        }
        for ((source, epoch), samples) in &seen {
            let mut unique = samples.clone();
            unique.sort_unstable();
            unique.dedup();
            prop_assert_eq!(unique.len(), samples.len(), "source {} epoch {} repeats a sample", source, epoch);
            // Read whole once every new rank has gone on to a later one.
            let behind_all = (0..after).all(|rank| furthest.get(&(rank, *source)).is_some_and(|&e| e > *epoch));
            if behind_all {
                let total: u64 = sources[*source as usize].iter().sum();
                let n = samples.len() as u64;
                let full = [before, after].map(|world| total / u64::from(world) * u64::from(world));
                prop_assert!(full.contains(&n), "source {} epoch {}: {} of {:?}", source, epoch, n, full);
            }
        }
    }
}

#[test]
fn planning_refuses_a_walk_past_its_bound_and_stops_when_abandoned() {
    let mut req = request(
        &[vec![1000; 10], vec![1000; 5]],
        single(&weights(&[0.7, 0.3])),
        8,
        3,
        128,
    );
    // 14 steps an epoch: epoch 10^15 is far past any bound.
    req.epoch = 1_000_000_000_000_000;
    let refused = plan_mix(&req).unwrap_err();
    assert!(
        matches!(refused, MixError::TooFarToPlan { .. }),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("epoch"), "{refused}");
    // Abandoned (the client left): planning stops at its next check.
    req.epoch = 1000;
    let abandoned = std::sync::atomic::AtomicBool::new(true);
    assert_eq!(
        plan_mix_unless(&req, &abandoned).unwrap_err(),
        MixError::Abandoned
    );
}

#[test]
fn taking_many_samples_at_once_equals_taking_them_one_step_at_a_time() {
    let (samples, world) = (37u64, 4u32);
    let mut stepped = queue::SourceQueue::fresh(0, world, 1);
    let mut at_once = stepped.clone();
    for count in [3u64, 0, 9, 1, 40, 7, 100] {
        stepped.take(count, samples);
    }
    at_once.take(160, samples);
    assert_eq!(stepped, at_once);
}
