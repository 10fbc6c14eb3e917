//! The ops after the crop, per 224x224 sample: `cargo bench --bench
//! augment`. Each op alone on a decoded photo's resized output (what it
//! costs a sample that draws it), then the recipes' whole draws (what a
//! sample costs on average). docs/benchmarks.md has the figures.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use shardfeed::decode::{
    decode_bounded, default_decoder, set_augment_simd, AutoAugment, ColorJitter, Crop, CropBox,
    EraseValue, ErasedBox, Fill, Grayscale, Interpolation, JitterDrawn, JitterOp, Kernel, Ops,
    OutputSpec, PilResample, Policy, PolicyDrawn, PolicyOp, PolicyStep, RandomErasing, SampleKey,
    ScratchBudget, TimmDrawn, TimmOp, TimmRandAugment, TimmStep,
};
use shardfeed::dev::synthetic::{synthesize_shards, SyntheticSpec};
use shardfeed::shard::splitter::SampleSplitter;
use shardfeed::shard::{ImageFormat, DEFAULT_MAX_MEMBER_BYTES};

const MEAN: [f64; 3] = [0.485, 0.456, 0.406];
const STD: [f64; 3] = [0.229, 0.224, 0.225];

/// A demo photo decoded and resized to 224x224: what the ops run on.
fn resized_photo() -> Vec<u8> {
    let spec = SyntheticSpec {
        shards: 1,
        samples_per_shard: 1,
        ..SyntheticSpec::default()
    };
    let shard = synthesize_shards(&spec).remove(0).1;
    let mut splitter = SampleSplitter::new(0, DEFAULT_MAX_MEMBER_BYTES);
    splitter.push(&shard);
    let sample = splitter.next_sample().unwrap().unwrap();
    let (format, data) = sample.image.unwrap();
    assert_eq!(format, ImageFormat::Jpeg);
    let output = OutputSpec::center(224, 224);
    let mut out = vec![0u8; output.bytes()];
    let key = SampleKey {
        seed: 0,
        epoch: 0,
        sample: 0,
        copy: 0,
    };
    decode_bounded(
        &*default_decoder(),
        &ScratchBudget::new(1 << 30),
        format,
        &data,
        &output,
        &key,
        &mut out,
    )
    .unwrap();
    out
}

fn policy(interpolation: Interpolation) -> AutoAugment {
    AutoAugment {
        policy: Policy::TrivialAugmentWide { bins: 31 },
        interpolation: Some(interpolation),
        ..AutoAugment::default()
    }
}

fn one_step(op: PolicyOp, magnitude: f32) -> CropBox {
    let mut crop = CropBox::whole(224, 224);
    let mut drawn = PolicyDrawn::default();
    drawn.steps[0] = PolicyStep { op, magnitude };
    drawn.len = 1;
    crop.drawn.auto_augment = drawn;
    crop
}

fn spec(ops: Ops) -> OutputSpec {
    OutputSpec {
        crop: Crop::Stretch,
        ops,
        ..OutputSpec::center(224, 224)
    }
}

/// Each op alone, in microseconds per 224x224 sample.
fn ops_alone(c: &mut Criterion) {
    let photo = resized_photo();
    let mut group = c.benchmark_group("augment_op_224");
    group.throughput(Throughput::Elements(1));
    let mut cases: Vec<(String, OutputSpec, CropBox)> = Vec::new();
    use PolicyOp::*;
    for (op, magnitude) in [
        (ShearX, 0.27f32),
        (TranslateX, 20.0),
        (Rotate, 27.0),
        (Rotate, 90.0),
    ] {
        for interpolation in [Interpolation::Nearest, Interpolation::Bilinear] {
            cases.push((
                format!("{op:?}({magnitude})/{interpolation:?}"),
                spec(Ops::NONE.with(policy(interpolation))),
                one_step(op, magnitude),
            ));
        }
    }
    for (op, magnitude) in [
        (Brightness, 0.4f32),
        (Color, 0.4),
        (Contrast, 0.4),
        (Sharpness, 0.4),
        (Posterize, 4.0),
        (Solarize, 0.5),
        (AutoContrast, 0.0),
        (Equalize, 0.0),
        (Invert, 0.0),
    ] {
        cases.push((
            format!("{op:?}"),
            spec(Ops::NONE.with(policy(Interpolation::Nearest))),
            one_step(op, magnitude),
        ));
    }
    let jitter = ColorJitter::symmetric(0.4, 0.4, 0.4, 0.1);
    for op in [
        JitterOp::Brightness,
        JitterOp::Contrast,
        JitterOp::Saturation,
        JitterOp::Hue,
    ] {
        let mut crop = CropBox::whole(224, 224);
        crop.drawn.color_jitter = JitterDrawn {
            steps: [(op, 1.2); 4],
            len: 1,
        };
        cases.push((format!("Jitter{op:?}"), spec(Ops::NONE.with(jitter)), crop));
    }
    // DINOv2's blur (kernel 9) at both ends of its sigma range.
    let blur = shardfeed::decode::GaussianBlur {
        kernel: (9, 9),
        sigma: (0.1, 2.0),
        p: 1.0,
    };
    for sigma in [0.1f32, 2.0] {
        let mut crop = CropBox::whole(224, 224);
        crop.drawn.gaussian_blur = Some(sigma);
        cases.push((
            format!("GaussianBlur9({sigma})"),
            spec(Ops::NONE.with(blur)),
            crop,
        ));
    }
    let mut crop = CropBox::whole(224, 224);
    crop.drawn.grayscale = true;
    cases.push((
        "Grayscale".into(),
        spec(Ops::NONE.with(Grayscale.coin(1.0))),
        crop,
    ));
    // The single-op rows with kernels of their own (the colour ones run the
    // policies' kernels, measured above).
    let mut crop = CropBox::whole(224, 224);
    crop.drawn.vertical_flip = true;
    cases.push((
        "RandomVerticalFlip".into(),
        spec(Ops::NONE.with(shardfeed::decode::VerticalFlip.coin(1.0))),
        crop,
    ));
    let mut crop = CropBox::whole(224, 224);
    crop.drawn.rotation = Some(17.5);
    cases.push((
        "RandomRotation".into(),
        spec(Ops::NONE.with(shardfeed::decode::RandomRotation::new(-30.0, 30.0))),
        crop,
    ));
    let mut crop = CropBox::whole(224, 224);
    crop.drawn.affine = Some(shardfeed::decode::AffineDrawn {
        angle: 12.5,
        translate: [3, -5],
        scale: 1.1,
        shear: [6.0, 0.0],
    });
    cases.push((
        "RandomAffine".into(),
        spec(Ops::NONE.with(shardfeed::decode::RandomAffine::new(-30.0, 30.0))),
        crop,
    ));
    // A box of 17.5% of the output, the mean of scale U(0.02, 0.33).
    for (name, value) in [
        ("EraseMean", EraseValue::Mean),
        ("EraseRandom", EraseValue::Random),
    ] {
        let mut crop = CropBox::whole(224, 224);
        crop.drawn.random_erasing = Some(ErasedBox {
            top: 50,
            left: 40,
            height: 94,
            width: 94,
            noise: 7,
        });
        let erasing = RandomErasing::new(1.0, value, MEAN, STD);
        cases.push((name.into(), spec(Ops::NONE.with(erasing)), crop));
    }
    cases.extend(timm_cases());
    let mut out = photo.clone();
    for (name, spec, crop) in &cases {
        // The kernels' AVX2 build (where the CPU has it), then the baseline.
        for (build, simd) in [("simd", true), ("baseline", false)] {
            set_augment_simd(simd);
            group.bench_function(BenchmarkId::new(build, name), |b| {
                b.iter(|| {
                    out.copy_from_slice(&photo);
                    spec.finish(crop, &mut out);
                    black_box(&out);
                })
            });
        }
        set_augment_simd(true);
    }
    group.bench_function(BenchmarkId::from_parameter("copy only"), |b| {
        b.iter(|| {
            out.copy_from_slice(&photo);
            black_box(&out);
        })
    });
    group.finish();
}

/// DeiT's timm RandAugment (rand-m9-mstd0.5-inc1, bicubic, the ImageNet
/// mean as fill), each op alone at magnitude 9.
fn deit() -> TimmRandAugment {
    TimmRandAugment {
        fill: Fill::colour([124, 116, 104]),
        ..TimmRandAugment::new(9.0, 2, 0.5, true)
    }
}

/// timm's ops alone: the geometric ones with both samplings.
fn timm_cases() -> Vec<(String, OutputSpec, CropBox)> {
    use TimmOp::*;
    let mut cases = Vec::new();
    let ops = [
        (Rotate, 27.0),
        (ShearX, 0.27),
        (TranslateXRel, 0.405),
        (AutoContrast, 0.0),
        (Equalize, 0.0),
        (Invert, 0.0),
        (PosterizeIncreasing, 1.0),
        (SolarizeIncreasing, 26.0),
        (SolarizeAdd, 99.0),
        (ColorIncreasing, 1.81),
        (ContrastIncreasing, 1.81),
        (BrightnessIncreasing, 1.81),
        (SharpnessIncreasing, 1.81),
    ];
    for (op, argument) in ops {
        let samplings: &[PilResample] = if op.is_geometric() {
            &[PilResample::Bilinear, PilResample::Bicubic]
        } else {
            &[PilResample::Bicubic]
        };
        for &resample in samplings {
            let mut crop = CropBox::whole(224, 224);
            let mut drawn = TimmDrawn::default();
            drawn.steps[0] = TimmStep {
                op,
                argument,
                resample,
            };
            drawn.len = 1;
            crop.drawn.timm_rand_augment = drawn;
            let name = if op.is_geometric() {
                format!("Timm{op:?}/{resample:?}")
            } else {
                format!("Timm{op:?}")
            };
            cases.push((name, spec(Ops::NONE.with(deit())), crop));
        }
    }
    cases
}

/// The recipes' own draws over 256 samples: the mean cost of the ops a
/// sample goes through (without its decode and resize).
fn recipes(c: &mut Criterion) {
    let photo = resized_photo();
    let mut group = c.benchmark_group("augment_recipe_224");
    let samples = 256u64;
    group.throughput(Throughput::Elements(samples));
    let erase = |p| RandomErasing::new(p, EraseValue::Mean, MEAN, STD);
    let recipes = [
        (
            "trivial_augment_wide+erasing_0.1",
            Ops::NONE
                .with(policy(Interpolation::Bilinear))
                .with(erase(0.1)),
        ),
        (
            "rand_augment_2_9",
            Ops::NONE.with(AutoAugment {
                policy: Policy::RandAugment {
                    num_ops: 2,
                    magnitude: 9,
                    bins: 31,
                },
                ..AutoAugment::default()
            }),
        ),
        (
            "auto_augment_imagenet+erasing_0.2",
            Ops::NONE
                .with(AutoAugment {
                    policy: Policy::AutoAugmentImageNet,
                    ..AutoAugment::default()
                })
                .with(erase(0.2)),
        ),
        (
            "timm_rand_m9_mstd0.5_inc1+erasing_0.25_pixel",
            Ops::NONE.with(deit()).with(RandomErasing {
                scale: (0.02, 1.0 / 3.0),
                ratio: (0.3, 1.0 / 0.3),
                ..RandomErasing::new(0.25, EraseValue::Random, MEAN, STD)
            }),
        ),
        (
            "color_jitter_0.4+grayscale_0.2",
            Ops::NONE
                .with(ColorJitter::symmetric(0.4, 0.4, 0.4, 0.0))
                .with(Grayscale.coin(0.2)),
        ),
    ];
    let mut out = photo.clone();
    for (name, ops) in recipes {
        let spec = spec(ops);
        let crops: Vec<CropBox> = (0..samples)
            .map(|sample| {
                let key = SampleKey {
                    seed: 1,
                    epoch: 0,
                    sample,
                    copy: 0,
                };
                spec.crop_box(224, 224, &key)
            })
            .collect();
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                for crop in &crops {
                    out.copy_from_slice(&photo);
                    spec.finish(crop, &mut out);
                }
                black_box(&out);
            })
        });
    }
    group.finish();
}

criterion_group!(augment, ops_alone, recipes);
criterion_main!(augment);
