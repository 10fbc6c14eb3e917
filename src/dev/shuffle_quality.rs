//! Shuffle quality, measured on a class-sorted dataset (each shard holds one
//! or two classes, as when a dataset is packed folder by folder).
//!
//! Two figures, each as a fraction of what a uniform random permutation of
//! the same samples gives: the mean number of distinct labels per batch (how
//! mixed a batch is) and the mean displacement of samples from their stored
//! position (how far the order moved). The baseline is the common WebDataset
//! recipe, re-implemented here from its description: shard order shuffled,
//! shards read one after another through a shuffle buffer per reader.

use std::collections::HashSet;

use crate::plan::rng::Rng;
use crate::plan::{
    emitted_samples, plan_stream, EpochPosition, Partition, PlanRequest, ShuffleConfig,
};

#[derive(Debug, Clone)]
pub struct SortedDataset {
    pub classes: u32,
    pub samples_per_class: u64,
    pub samples_per_shard: u64,
}

impl SortedDataset {
    pub fn total(&self) -> u64 {
        u64::from(self.classes) * self.samples_per_class
    }

    pub fn shard_samples(&self) -> Vec<u64> {
        let total = self.total();
        (0..total.div_ceil(self.samples_per_shard))
            .map(|s| {
                self.samples_per_shard
                    .min(total - s * self.samples_per_shard)
            })
            .collect()
    }

    /// Stored position of sample `index` of `shard`.
    pub fn position(&self, shard: u32, index: u64) -> u64 {
        u64::from(shard) * self.samples_per_shard + index
    }

    /// Class of the sample at stored position `position` (sorted by class).
    pub fn label(&self, position: u64) -> u64 {
        position / self.samples_per_class
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quality {
    pub distinct_labels_per_batch: f64,
    pub mean_displacement: f64,
}

/// Measures an emitted order (stored positions, in emit order).
pub fn measure(dataset: &SortedDataset, order: &[u64], batch_size: usize) -> Quality {
    let batches: Vec<&[u64]> = order.chunks_exact(batch_size).collect();
    let distinct: f64 = batches
        .iter()
        .map(|batch| {
            batch
                .iter()
                .map(|&p| dataset.label(p))
                .collect::<HashSet<_>>()
                .len() as f64
        })
        .sum::<f64>()
        / batches.len().max(1) as f64;
    // Displacement relative to where the sample sits in the stored order of
    // the samples this stream emits (so dropped samples do not count).
    let mut stored: Vec<u64> = order.to_vec();
    stored.sort_unstable();
    let displacement: f64 = order
        .iter()
        .enumerate()
        .map(|(emitted_at, position)| {
            let stored_at = stored.binary_search(position).unwrap_or(0);
            (emitted_at as f64 - stored_at as f64).abs()
        })
        .sum::<f64>()
        / order.len().max(1) as f64;
    Quality {
        distinct_labels_per_batch: distinct,
        mean_displacement: displacement,
    }
}

/// A uniform random permutation of `samples` stored positions.
pub fn uniform_order(dataset: &SortedDataset, seed: u64) -> Vec<u64> {
    let mut order: Vec<u64> = (0..dataset.total()).collect();
    Rng::derive(&[seed, 0x0F]).shuffle(&mut order);
    order
}

/// shardfeed's order for one rank of `world_size`, as stored positions.
pub fn shardfeed_order(
    dataset: &SortedDataset,
    shuffle: ShuffleConfig,
    world_size: u32,
    batch_size: u32,
    seed: u64,
) -> Vec<u64> {
    let request = PlanRequest {
        seed,
        epoch: 0,
        rank: 0,
        world_size,
        batch_size,
        shuffle,
        partition: Partition::DropLast,
        repeats: 1,
        start_batch: 0,
        resume_from: EpochPosition::default(),
    };
    let plan = plan_stream(&dataset.shard_samples(), &request).expect("valid benchmark plan");
    emitted_samples(&plan)
        .into_iter()
        .map(|(shard, index)| dataset.position(shard, index))
        .collect()
}

/// The WebDataset recipe for one of `world_size` ranks: shuffled shard list
/// split over ranks, each rank reading its shards in turn through a shuffle
/// buffer of `buffer` samples (fill the buffer, then emit a random element
/// per sample read, then drain it).
pub fn webdataset_order(
    dataset: &SortedDataset,
    buffer: usize,
    world_size: u32,
    seed: u64,
) -> Vec<u64> {
    let shards = dataset.shard_samples();
    let mut order: Vec<u32> = (0..shards.len() as u32).collect();
    let mut rng = Rng::derive(&[seed, 0x3D5]);
    rng.shuffle(&mut order);
    let mine = order.iter().step_by(world_size as usize);
    let mut pool: Vec<u64> = Vec::with_capacity(buffer);
    let mut out = Vec::new();
    for &shard in mine {
        for index in 0..shards[shard as usize] {
            pool.push(dataset.position(shard, index));
            if pool.len() >= buffer {
                let pick = rng.below(pool.len() as u64) as usize;
                out.push(pool.swap_remove(pick));
            }
        }
    }
    while !pool.is_empty() {
        let pick = rng.below(pool.len() as u64) as usize;
        out.push(pool.swap_remove(pick));
    }
    out
}

/// `shardfeed shuffle-quality`: shardfeed's order against the WebDataset
/// recipe at world sizes 1 and 8 and two buffer sizes, as JSON lines.
pub fn run(dataset: &SortedDataset, batch_size: u32, seed: u64) {
    let batch = batch_size as usize;
    let uniform = measure(dataset, &uniform_order(dataset, seed), batch);
    let defaults = ShuffleConfig::default();
    for world_size in [1u32, 8] {
        for buffer in [1_000u32, defaults.buffer] {
            let rows = [
                (
                    "shardfeed",
                    defaults.interleave,
                    shardfeed_order(
                        dataset,
                        ShuffleConfig { buffer, ..defaults },
                        world_size,
                        batch_size,
                        seed,
                    ),
                ),
                (
                    "webdataset_recipe",
                    1,
                    webdataset_order(dataset, buffer as usize, world_size, seed),
                ),
            ];
            for (method, interleave, order) in rows {
                let quality = measure(dataset, &order, batch);
                // A uniform permutation of this stream's own samples moves
                // each by about a third of the stream.
                let uniform_displacement = order.len() as f64 / 3.0;
                println!(
                    "{}",
                    serde_json::json!({
                        "method": method,
                        "world_size": world_size,
                        "buffer_samples": buffer,
                        "interleave": interleave,
                        "samples": order.len(),
                        "distinct_labels_per_batch": round2(quality.distinct_labels_per_batch),
                        "distinct_vs_uniform": round3(
                            quality.distinct_labels_per_batch / uniform.distinct_labels_per_batch
                        ),
                        "mean_displacement": quality.mean_displacement.round(),
                        "displacement_vs_uniform": round3(
                            quality.mean_displacement / uniform_displacement
                        ),
                    })
                );
            }
        }
    }
    println!(
        "{}",
        serde_json::json!({
            "method": "uniform_permutation",
            "samples": dataset.total(),
            "distinct_labels_per_batch": round2(uniform.distinct_labels_per_batch),
            "mean_displacement": uniform.mean_displacement.round(),
        })
    );
}

fn round2(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_shuffle_beats_the_webdataset_recipe_at_equal_buffer() {
        let dataset = SortedDataset {
            classes: 40,
            samples_per_class: 300,
            samples_per_shard: 200,
        };
        let batch = 64;
        let ours = measure(
            &dataset,
            &shardfeed_order(
                &dataset,
                ShuffleConfig {
                    buffer: 500,
                    ..ShuffleConfig::default()
                },
                1,
                batch,
                0,
            ),
            batch as usize,
        );
        let theirs = measure(
            &dataset,
            &webdataset_order(&dataset, 500, 1, 0),
            batch as usize,
        );
        assert!(
            ours.distinct_labels_per_batch > theirs.distinct_labels_per_batch,
            "{ours:?} vs {theirs:?}"
        );
        let uniform = measure(&dataset, &uniform_order(&dataset, 0), batch as usize);
        assert!(uniform.distinct_labels_per_batch > ours.distinct_labels_per_batch);
        // A uniform permutation moves a sample about N/3 on average.
        let third = dataset.total() as f64 / 3.0;
        assert!(
            (uniform.mean_displacement - third).abs() < third * 0.05,
            "{uniform:?}"
        );
    }
}
