//! Kernel benchmarks: `cargo bench --bench kernels` (add `--features
//! turbojpeg` for the libjpeg-turbo path). Decode + resize of photo-like
//! JPEGs, encoded delivery's per-sample checks, tar parsing and epoch
//! planning, each with throughput units.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use shardfeed::decode::{
    check_jpeg_complete, decode_bounded, default_decoder, default_decoder_name, jpeg_frame, Crop,
    HorizontalFlip, Ops, OutputSpec, RandomResizedCrop, SampleKey, ScratchBudget,
};
use shardfeed::dev::synthetic::{synthesize_shards, SyntheticSpec};
use shardfeed::plan::mix::{plan_mix, MixRequest, MixSource, MixWeights, WeightChange};
use shardfeed::plan::{
    emitted_samples, plan_stream, EpochPosition, Partition, PlanRequest, ShuffleConfig,
};
use shardfeed::shard::splitter::SampleSplitter;
use shardfeed::shard::{ImageFormat, DEFAULT_MAX_MEMBER_BYTES};

/// One shard of the demo's ~110 KB photos (500x375 on average, JPEG q90).
fn photo_shard(samples: usize) -> Vec<u8> {
    let spec = SyntheticSpec {
        shards: 1,
        samples_per_shard: samples,
        ..SyntheticSpec::default()
    };
    synthesize_shards(&spec).remove(0).1
}

fn jpegs_of(shard: &[u8]) -> Vec<Vec<u8>> {
    let mut splitter = SampleSplitter::new(0, DEFAULT_MAX_MEMBER_BYTES);
    splitter.push(shard);
    let mut jpegs = Vec::new();
    while let Ok(Some(sample)) = splitter.next_sample() {
        if let Some((ImageFormat::Jpeg, data)) = sample.image {
            jpegs.push(data.to_vec());
        }
    }
    jpegs
}

fn decode_resize(c: &mut Criterion) {
    let jpegs = jpegs_of(&photo_shard(32));
    let decoder = default_decoder();
    let mut group = c.benchmark_group("decode_resize");
    group.throughput(Throughput::Elements(jpegs.len() as u64));
    let budget = ScratchBudget::new(1 << 30);
    let train = OutputSpec {
        crop: Crop::RandomResized(RandomResizedCrop::default()),
        ops: Ops::default().with(HorizontalFlip(0.5)),
        ..OutputSpec::center(224, 224)
    };
    let stretch = OutputSpec {
        crop: Crop::Stretch,
        ..OutputSpec::center(224, 224)
    };
    for (name, spec) in [
        ("center_crop_224", OutputSpec::center(224, 224)),
        ("random_resized_crop_flip_224", train),
        ("stretch_224", stretch),
    ] {
        let mut out = vec![0u8; spec.bytes()];
        group.bench_function(BenchmarkId::new(default_decoder_name(), name), |b| {
            b.iter(|| {
                for (sample, jpeg) in jpegs.iter().enumerate() {
                    let key = SampleKey {
                        seed: 0,
                        epoch: 0,
                        sample: sample as u64,
                        copy: 0,
                    };
                    let _ = decode_bounded(
                        &*decoder,
                        &budget,
                        ImageFormat::Jpeg,
                        jpeg,
                        &spec,
                        &key,
                        &mut out,
                    );
                }
                black_box(&out);
            })
        });
    }
    group.finish();
}

/// What encoded delivery pays a sample to send it compressed: its headers
/// read and its scans walked for stray markers (a corrupt scan is left to
/// the server's decode), against decoding it here.
fn encoded_checks(c: &mut Criterion) {
    let jpegs = jpegs_of(&photo_shard(32));
    let mut group = c.benchmark_group("encoded_checks");
    group.throughput(Throughput::Elements(jpegs.len() as u64));
    group.bench_function("frame_and_scan", |b| {
        b.iter(|| {
            for jpeg in &jpegs {
                black_box(jpeg_frame(jpeg));
                black_box(check_jpeg_complete(jpeg).is_ok());
            }
        })
    });
    group.finish();
}

fn tar_parse(c: &mut Criterion) {
    let shard = photo_shard(64);
    let mut group = c.benchmark_group("tar_parse");
    group.throughput(Throughput::Bytes(shard.len() as u64));
    // Parts of 8 MiB, as the default ranged GETs deliver them, and 64 KiB.
    for part in [8 << 20, 64 << 10] {
        group.bench_function(BenchmarkId::new("samples", format!("part_{part}")), |b| {
            b.iter(|| {
                let mut splitter = SampleSplitter::new(0, DEFAULT_MAX_MEMBER_BYTES);
                let mut samples = 0;
                for chunk in shard.chunks(part) {
                    splitter.push(chunk);
                    while let Ok(Some(_)) = splitter.next_sample() {
                        samples += 1;
                    }
                }
                while let Ok(Some(_)) = splitter.finish() {
                    samples += 1;
                }
                black_box(samples)
            })
        });
    }
    group.finish();
}

fn planning(c: &mut Criterion) {
    // ImageNet-like: 1,024 shards of ~1,250 samples, 8 ranks.
    let shards: Vec<u64> = (0..1024).map(|i| 1_200 + (i % 100)).collect();
    let request = PlanRequest {
        seed: 1,
        epoch: 3,
        rank: 5,
        world_size: 8,
        batch_size: 128,
        shuffle: ShuffleConfig::default(),
        partition: Partition::DropLast,
        repeats: 1,
        start_batch: 0,
        resume_from: EpochPosition::default(),
    };
    let mut group = c.benchmark_group("plan");
    group.throughput(Throughput::Elements(shards.len() as u64));
    group.bench_function("plan_stream_1024_shards", |b| {
        b.iter(|| black_box(plan_stream(&shards, &request).unwrap().batches))
    });
    let plan = plan_stream(&shards, &request).unwrap();
    group.throughput(Throughput::Elements(plan.samples()));
    group.bench_function("schedule_one_rank_epoch", |b| {
        b.iter(|| black_box(emitted_samples(&plan).len()))
    });
    let resumed = PlanRequest {
        start_batch: plan.batches / 2,
        ..request.clone()
    };
    group.throughput(Throughput::Elements(plan.samples() / 2));
    group.bench_function("resume_mid_epoch", |b| {
        b.iter(|| {
            let plan = plan_stream(&shards, &resumed).unwrap();
            black_box(plan.shard_sequence().len())
        })
    });
    group.finish();
}

/// Issue 24's planning figure: a stream mixing 10 sources of 10^4 shards
/// each (world 64, resumed mid-epoch), beside one source of the same 10^5
/// shards planned the single-source way.
fn mix_planning(c: &mut Criterion) {
    let source_shards: Vec<u64> = (0..10_000).map(|i| 900 + (i % 200)).collect();
    let sources: Vec<MixSource> = (0..10)
        .map(|k| MixSource {
            key: k,
            shard_samples: source_shards.clone(),
            shuffle: ShuffleConfig::default(),
        })
        .collect();
    let weights: Vec<f64> = (1..=10).map(f64::from).collect();
    let request = MixRequest {
        seed: 1,
        epoch: 2,
        rank: 37,
        world_size: 64,
        batch_size: 256,
        sources,
        repeats: 1,
        weights: vec![WeightChange {
            from_step: 0,
            weights: MixWeights::new(&weights).unwrap(),
        }],
        history: Vec::new(),
        start_batch: 3_000,
    };
    let mut group = c.benchmark_group("plan");
    group.sample_size(10);
    group.bench_function("plan_mix_10_sources_of_10k_shards", |b| {
        b.iter(|| {
            let plan = plan_mix(&request).unwrap();
            let mut shards = 0;
            for k in 0..plan.sources() {
                let slice = plan.source_slices(k).next().unwrap();
                shards += plan
                    .part_plan(k, slice.part)
                    .unwrap()
                    .shard_sequence()
                    .len();
            }
            black_box(shards)
        })
    });
    let one_source: Vec<u64> = (0..10).flat_map(|_| source_shards.clone()).collect();
    let single = PlanRequest {
        seed: 1,
        epoch: 2,
        rank: 37,
        world_size: 64,
        batch_size: 256,
        shuffle: ShuffleConfig::default(),
        partition: Partition::DropLast,
        repeats: 1,
        start_batch: 3_000,
        resume_from: EpochPosition::default(),
    };
    group.bench_function("plan_stream_one_source_of_100k_shards", |b| {
        b.iter(|| {
            black_box(
                plan_stream(&one_source, &single)
                    .unwrap()
                    .shard_sequence()
                    .len(),
            )
        })
    });
    group.finish();
}

criterion_group!(
    kernels,
    decode_resize,
    encoded_checks,
    tar_parse,
    planning,
    mix_planning
);
criterion_main!(kernels);
