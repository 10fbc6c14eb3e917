//! `shardfeed mix-bench`: a two-source 70/30 mixed stream against one
//! stream over the same samples, alternately in one process (so the ratio
//! is not skewed by a machine that got busier between runs). The decode
//! cost per sample is the same in both; the figure is what mixing costs:
//! a feeder per source, their queues and a second set of readers.

use std::time::Instant;

use super::bench::{engine_over, BenchError};
use super::s3mem;
use super::synthetic::{self, SyntheticSpec, DEMO_BUCKET};
use crate::decode::{Crop, Ops, OutputSpec};
use crate::engine::{MixSources, MixedSource, OutputRequest, Sources, StreamRequest};
use crate::pipeline::BatchReceiver;
use crate::plan::{EpochPosition, Partition, PlanRequest, ShuffleConfig};

#[derive(Debug, Clone)]
pub struct MixBenchSpec {
    pub data: SyntheticSpec,
    pub batch_size: u32,
    pub decode_threads: usize,
    /// Alternating rounds (each: one single epoch, one mixed epoch).
    pub rounds: usize,
}

const OUTPUT: OutputSpec = OutputSpec {
    height: 224,
    width: 224,
    crop: Crop::Center { resize: None },
    resample: crate::decode::Resample::Bilinear,
    ops: Ops::NONE,
};

async fn drain(mut batches: BatchReceiver) -> Result<(u64, f64), BenchError> {
    let started = Instant::now();
    let mut samples = 0u64;
    while let Some(batch) = batches.recv().await {
        samples += batch?.size as u64;
    }
    Ok((samples, started.elapsed().as_secs_f64()))
}

pub async fn run(spec: &MixBenchSpec) -> Result<(), BenchError> {
    let s3 = s3mem::start(0).await?;
    let owned = spec.data.clone();
    eprintln!(
        "synthesizing {} photo-like JPEGs ...",
        spec.data.shards * spec.data.samples_per_shard
    );
    let shards = tokio::task::spawn_blocking(move || synthetic::synthesize_shards(&owned)).await?;
    // 70% of the shards in one source, the rest in the other; the baseline
    // reads them all as one dataset.
    let split = (shards.len() * 7).div_ceil(10).clamp(1, shards.len() - 1);
    let all = synthetic::upload_indexed(&s3, "all/", shards.clone()).await?;
    let a = synthetic::upload_indexed(&s3, "a/", shards[..split].to_vec()).await?;
    let b = synthetic::upload_indexed(&s3, "b/", shards[split..].to_vec()).await?;
    debug_assert!(all.starts_with(&format!("s3://{DEMO_BUCKET}/")));
    let engine = engine_over(&s3, spec.decode_threads)?;
    let shuffle = ShuffleConfig::default();
    let mut ratios = Vec::new();
    for round in 0..spec.rounds {
        let plan = PlanRequest {
            seed: round as u64,
            epoch: 0,
            rank: 0,
            world_size: 1,
            batch_size: spec.batch_size,
            shuffle,
            partition: Partition::DropLast,
            repeats: 1,
            start_batch: 0,
            resume_from: EpochPosition::default(),
        };
        let single = engine
            .open_stream(StreamRequest::one(&all, plan.clone(), OUTPUT))
            .await?;
        let (single_samples, single_seconds) = drain(single.batches).await?;
        let source = |dataset: &str, weight: f64| MixedSource {
            dataset: dataset.to_string(),
            weight,
            layout: Default::default(),
        };
        let mixed = engine
            .open_stream(StreamRequest {
                sources: Sources::Mix(MixSources {
                    sources: vec![source(&a, 0.7), source(&b, 0.3)],
                    weight_changes: Vec::new(),
                    weights_from: None,
                    before_epoch: Vec::new(),
                }),
                plan,
                output: OutputRequest::pixels(OUTPUT),
                resume_dataset: None,
            })
            .await?;
        let (mixed_samples, mixed_seconds) = drain(mixed.batches).await?;
        let single_rate = single_samples as f64 / single_seconds;
        let mixed_rate = mixed_samples as f64 / mixed_seconds;
        ratios.push(mixed_rate / single_rate);
        println!(
            "{}",
            serde_json::json!({
                "benchmark": "mix_throughput",
                "round": round,
                "single_samples": single_samples,
                "single_samples_per_second": single_rate,
                "mixed_70_30_samples": mixed_samples,
                "mixed_samples_per_second": mixed_rate,
                "mixed_over_single": mixed_rate / single_rate,
            })
        );
    }
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    println!(
        "two-source 70/30 mixed stream: {:.1}% of one stream's throughput over the same samples \
         (median of {} alternating rounds, {} decode threads)",
        100.0 * median,
        ratios.len(),
        spec.decode_threads
    );
    Ok(())
}
