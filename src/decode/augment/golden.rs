//! Golden vectors for the client: each case an input output, the decisions
//! the server took for it and the output it made, written as a `Batch` of
//! one sample (what a client parses) beside the raw input. The Python
//! suite (`tests/unit/test_ops_golden.py`) replays every case's reported
//! ops with torchvision and holds the agreement to the bounds.
//!
//! Written to `$SHARDFEED_AUGMENT_GOLDEN`, else `target/augment-golden/`
//! of the crate, every `cargo test` run.

use std::path::PathBuf;

use prost::Message;

use super::kernels::Interpolation;
use super::op::Op;
use super::ops::{
    self as row, AutoAugment, ColorJitter, EraseValue, ErasedBox, Grayscale, JitterDrawn, JitterOp,
    Kernel, Policy, PolicyDrawn, PolicyOp, PolicyStep, RandomErasing,
};
use super::{Crop, CropBox, Ops, OutputSpec, SampleKey};
use crate::proto::v1 as pb;

const IMAGENET_MEAN: [f64; 3] = [0.485, 0.456, 0.406];
const IMAGENET_STD: [f64; 3] = [0.229, 0.224, 0.225];

/// A photo-like image: smooth shading, hard-edged shapes and fine noise,
/// so that interpolation, histograms and edges all matter.
fn photo(height: u32, width: u32) -> Vec<u8> {
    let mut pixels = Vec::with_capacity((height * width * 3) as usize);
    for y in 0..height {
        for x in 0..width {
            let (fx, fy) = (f64::from(x), f64::from(y));
            let noise = (crate::hash::fmix64(u64::from(y * width + x)) % 13) as f64 - 6.0;
            let disc = (fx - 150.0).powi(2) + (fy - 70.0).powi(2) < 40.0f64.powi(2);
            let bar = (30..60).contains(&x) && y > 40;
            let base = [
                110.0 + 70.0 * (fx / 23.0 + fy / 41.0).sin() + 20.0 * (fx * fy / 2900.0).cos(),
                100.0 + 60.0 * (fy / 19.0).cos() * (fx / 57.0).sin(),
                90.0 + 0.4 * fx - 0.2 * fy,
            ];
            for (c, value) in base.into_iter().enumerate() {
                let value = if disc {
                    [230.0, 190.0, 40.0][c]
                } else if bar {
                    [20.0, 60.0, 150.0][c]
                } else {
                    value
                };
                pixels.push((value + noise).clamp(0.0, 255.0) as u8);
            }
        }
    }
    pixels
}

fn golden_dir() -> PathBuf {
    std::env::var_os("SHARDFEED_AUGMENT_GOLDEN").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/augment-golden"),
        PathBuf::from,
    )
}

struct Writer {
    dir: PathBuf,
    cases: usize,
}

impl Writer {
    fn case(&mut self, name: &str, spec: &OutputSpec, crop: CropBox) {
        let input = photo(spec.height, spec.width);
        let mut output = input.clone();
        spec.finish(&crop, &mut output);
        let batch = pb::Batch {
            shape: Some(pb::Shape {
                n: 1,
                height: spec.height,
                width: spec.width,
                channels: 3,
            }),
            images: output.into(),
            labels: vec![0],
            keys: vec![name.to_string()],
            shards: vec!["golden".into()],
            crops: vec![crop.to_wire()],
            augmentation: Some(spec.augmentation_to_wire()),
            ..Default::default()
        };
        let stem = self.dir.join(format!("{:03}-{name}", self.cases));
        std::fs::write(stem.with_extension("input"), &input).unwrap();
        std::fs::write(stem.with_extension("batch"), batch.encode_to_vec()).unwrap();
        self.cases += 1;
    }
}

impl Writer {
    /// A recipe as 24 samples draw it at 224²: the seed, the epoch, and
    /// where the samples' identities start.
    fn whole_draws(&mut self, name: &str, ops: Ops, (seed, epoch, first): (u64, u64, u64)) {
        let spec = spec(224, 224, ops);
        for sample in 0..24u64 {
            let key = SampleKey {
                seed,
                epoch,
                sample: crate::hash::fmix64(sample + first),
                copy: 0,
            };
            self.case(name, &spec, spec.crop_box(224, 224, &key));
        }
    }
}

fn spec(height: u32, width: u32, ops: Ops) -> OutputSpec {
    OutputSpec {
        height,
        width,
        crop: Crop::Stretch,
        resample: super::Resample::Bilinear,
        ops,
    }
}

fn policy_step(op: PolicyOp, magnitude: f32) -> CropBox {
    let mut drawn = PolicyDrawn::default();
    drawn.steps[0] = PolicyStep { op, magnitude };
    drawn.len = 1;
    let mut crop = CropBox::whole(224, 224);
    crop.drawn.auto_augment = drawn;
    crop
}

fn erasing(value: EraseValue) -> RandomErasing {
    RandomErasing::new(0.5, value, IMAGENET_MEAN, IMAGENET_STD)
}

#[test]
fn write_golden_vectors() {
    let dir = golden_dir();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut writer = Writer { dir, cases: 0 };
    use PolicyOp::*;
    let singles: &[(PolicyOp, &[f32])] = &[
        (Identity, &[0.0]),
        (ShearX, &[0.09, -0.3, 0.99]),
        (ShearY, &[-0.09, 0.3, -0.66]),
        (TranslateX, &[30.45, -32.0, 9.7]),
        (TranslateY, &[-30.45, 32.0]),
        (Rotate, &[9.0, -30.0, 90.0, -90.0, 135.0, 180.0, -49.5]),
        (Brightness, &[0.27, -0.99, 0.99]),
        (Color, &[0.27, -0.99, 0.99]),
        (Contrast, &[0.27, -0.99, 0.99]),
        (Sharpness, &[0.27, -0.99, 0.99]),
        (Posterize, &[2.0, 4.0, 7.0]),
        (Solarize, &[0.7, 0.3, 0.0]),
        (AutoContrast, &[0.0]),
        (Equalize, &[0.0]),
        (Invert, &[0.0]),
    ];
    let samplings = [
        (Interpolation::Nearest, None),
        (Interpolation::Bilinear, None),
        (Interpolation::Nearest, Some([124u8, 116, 104])),
        (Interpolation::Bilinear, Some([124u8, 116, 104])),
    ];
    for &(op, magnitudes) in singles {
        let geometric = matches!(op, ShearX | ShearY | TranslateX | TranslateY | Rotate);
        let used = if geometric {
            &samplings[..]
        } else {
            &samplings[..1]
        };
        for &(interpolation, fill) in used {
            let plain = AutoAugment {
                policy: Policy::TrivialAugmentWide { bins: 31 },
                interpolation: Some(interpolation),
                ..AutoAugment::OFF
            };
            let policy = fill.map_or(plain, |colour| plain.with_fill(colour));
            for &magnitude in magnitudes {
                let name = format!("{op:?}-{interpolation:?}-{}", fill.is_some());
                let ops = Ops::NONE.with(policy);
                writer.case(&name, &spec(224, 224, ops), policy_step(op, magnitude));
                if op == Rotate && geometric {
                    // A non-square output takes the sampled path at 90 degrees.
                    let mut crop = policy_step(op, magnitude);
                    crop.width = 160.0;
                    writer.case(&name, &spec(160, 224, ops), crop);
                }
            }
        }
    }
    let jitter = ColorJitter::symmetric(0.4, 0.4, 0.4, 0.5);
    for (op, factors) in [
        (JitterOp::Brightness, &[0.6f32, 1.4][..]),
        (JitterOp::Contrast, &[0.6, 1.4]),
        (JitterOp::Saturation, &[0.6, 1.4]),
        (JitterOp::Hue, &[-0.5, -0.2, 0.1, 0.5]),
    ] {
        for &factor in factors {
            let mut crop = CropBox::whole(224, 224);
            crop.drawn.color_jitter = JitterDrawn {
                steps: [(op, factor); 4],
                len: 1,
            };
            writer.case(
                &format!("Jitter{op:?}"),
                &spec(224, 224, Ops::NONE.with(jitter)),
                crop,
            );
        }
    }
    let mut crop = CropBox::whole(224, 224);
    crop.drawn.grayscale = true;
    writer.case(
        "Grayscale",
        &spec(224, 224, Ops::NONE.with(Grayscale.coin(0.5))),
        crop,
    );
    // The single-op transforms, each drawn alone: each row, and how a
    // sample that drew it reports so.
    type Ran = fn(&mut CropBox);
    let coins: [(&str, Ops, Ran); 6] = [
        (
            "RandomVerticalFlip",
            Ops::NONE.with(row::VerticalFlip.coin(0.5)),
            |c| c.drawn.vertical_flip = true,
        ),
        (
            "RandomAdjustSharpness",
            Ops::NONE.with(row::Sharpness { factor: 2.0 }.coin(0.5)),
            |c| c.drawn.sharpness = true,
        ),
        (
            "RandomPosterize",
            Ops::NONE.with(row::Posterize { bits: 3 }.coin(0.5)),
            |c| c.drawn.posterize = true,
        ),
        (
            "RandomEqualize",
            Ops::NONE.with(row::Equalize.coin(0.5)),
            |c| c.drawn.equalize = true,
        ),
        (
            "RandomAutocontrast",
            Ops::NONE.with(row::Autocontrast.coin(0.5)),
            |c| c.drawn.autocontrast = true,
        ),
        ("RandomInvert", Ops::NONE.with(row::Invert.coin(0.5)), |c| {
            c.drawn.invert = true
        }),
    ];
    for (name, ops, ran) in coins {
        let mut crop = CropBox::whole(224, 224);
        ran(&mut crop);
        writer.case(name, &spec(224, 224, ops), crop);
    }
    for &(interpolation, fill) in &samplings {
        let rotation = row::RandomRotation {
            interpolation: Some(interpolation),
            fill: fill.map_or(row::Fill::default(), row::Fill::colour),
            ..row::RandomRotation::new(-45.0, 45.0)
        };
        for angle in [-37.25, 12.5, 90.0, 180.0] {
            let mut crop = CropBox::whole(224, 224);
            crop.drawn.rotation = Some(angle);
            let name = format!("RandomRotation-{interpolation:?}-{}", fill.is_some());
            writer.case(&name, &spec(224, 224, Ops::NONE.with(rotation)), crop);
        }
    }
    for &(interpolation, fill) in &samplings {
        let affine = row::RandomAffine {
            interpolation: Some(interpolation),
            fill: fill.map_or(row::Fill::default(), row::Fill::colour),
            ..row::RandomAffine::new(-45.0, 45.0)
        };
        for (angle, translate, scale, shear) in [
            (12.5, [3, -5], 1.15, [8.0, -4.0]),
            (-30.0, [0, 0], 0.85, [0.0, 0.0]),
            (0.0, [10, 0], 1.0, [20.0, 0.0]),
        ] {
            let mut crop = CropBox::whole(224, 224);
            crop.drawn.affine = Some(row::AffineDrawn {
                angle,
                translate,
                scale,
                shear,
            });
            let name = format!("RandomAffine-{interpolation:?}-{}", fill.is_some());
            writer.case(&name, &spec(224, 224, Ops::NONE.with(affine)), crop);
        }
    }
    // RandomPhotometricDistort: every adjustment, the contrast after the
    // hue, then a shuffle; and the contrast first with no shuffle.
    let distort = Ops::NONE.with(row::RandomPhotometricDistort::with_p(0.5));
    for (contrast_last, permutation) in [(true, Some([2, 0, 1])), (false, None)] {
        let (brightness, contrast) = ((JitterOp::Brightness, 1.1f32), (JitterOp::Contrast, 0.7));
        let (saturation, hue) = ((JitterOp::Saturation, 1.3), (JitterOp::Hue, 0.04));
        let steps = if contrast_last {
            [brightness, saturation, hue, contrast]
        } else {
            [brightness, contrast, saturation, hue]
        };
        let mut crop = CropBox::whole(224, 224);
        crop.drawn.photometric_distort = row::PhotometricDrawn {
            adjustments: JitterDrawn { steps, len: 4 },
            permutation,
        };
        writer.case("RandomPhotometricDistort", &spec(224, 224, distort), crop);
    }
    for (name, value) in [
        ("EraseColour", EraseValue::Colour([10, 200, 30], 3)),
        ("EraseMean", EraseValue::Mean),
        ("EraseRandom", EraseValue::Random),
    ] {
        let mut crop = CropBox::whole(224, 224);
        crop.drawn.random_erasing = Some(ErasedBox {
            top: 31,
            left: 17,
            height: 70,
            width: 101,
            noise: 0xfeed_5eed,
        });
        writer.case(name, &spec(224, 224, Ops::NONE.with(erasing(value))), crop);
    }
    // Whole recipes as drawn: several ops in sequence per sample.
    let recipes: [(&str, Ops); 7] = [
        (
            "RecipeTrivialAugment",
            Ops::NONE
                .with(AutoAugment {
                    policy: Policy::TrivialAugmentWide { bins: 31 },
                    interpolation: Some(Interpolation::Bilinear),
                    ..AutoAugment::OFF
                })
                .with(erasing(EraseValue::Random)),
        ),
        (
            "RecipeRandAugment",
            Ops::NONE.with(AutoAugment {
                policy: Policy::RandAugment {
                    num_ops: 2,
                    magnitude: 9,
                    bins: 31,
                },
                ..AutoAugment::OFF
            }),
        ),
        (
            "RecipeAutoAugment",
            Ops::NONE
                .with(AutoAugment {
                    policy: Policy::AutoAugmentImageNet,
                    ..AutoAugment::OFF
                })
                .with(erasing(EraseValue::Mean)),
        ),
        (
            "RecipeColorJitter",
            Ops::NONE
                .with(ColorJitter::symmetric(0.4, 0.4, 0.4, 0.1))
                .with(Grayscale.coin(0.2)),
        ),
        (
            // SimCLR's view: jitter 0.8 of strength 0.8, grayscale, a blur
            // of 10% of the side (23 taps at 224) on half the samples.
            "RecipeSimCLR",
            Ops::NONE
                .with(ColorJitter::symmetric(0.8, 0.8, 0.8, 0.2).with_p(0.8))
                .with(Grayscale.coin(0.2))
                .with(row::GaussianBlur {
                    kernel: (23, 23),
                    sigma: (0.1, 2.0),
                    p: 0.5,
                }),
        ),
        (
            // DINOv2's second global view (BYOL's second view alike): its
            // blur's p raised from 0.1 so the cases see it often.
            "RecipeDinoGlobal2",
            Ops::NONE
                .with(ColorJitter::symmetric(0.4, 0.4, 0.2, 0.1).with_p(0.8))
                .with(Grayscale.coin(0.2))
                .with(row::GaussianBlur {
                    kernel: (9, 9),
                    sigma: (0.1, 2.0),
                    p: 0.5,
                })
                .with(row::Solarize { threshold: 128.0 }.coin(0.2)),
        ),
        (
            "RecipeSingleOps",
            Ops::NONE
                .with(row::VerticalFlip.coin(0.5))
                .with(row::RandomRotation::new(-20.0, 20.0))
                .with(row::RandomPhotometricDistort::with_p(0.5))
                .with(row::RandomAffine {
                    translate: Some((0.1, 0.1)),
                    scale: Some((0.9, 1.1)),
                    shear_x: Some((-10.0, 10.0)),
                    ..row::RandomAffine::new(-10.0, 10.0)
                })
                .with(row::Sharpness { factor: 0.3 }.coin(0.5))
                .with(row::Posterize { bits: 5 }.coin(0.3))
                .with(row::Equalize.coin(0.3))
                .with(row::Autocontrast.coin(0.3))
                .with(row::Invert.coin(0.3)),
        ),
    ];
    for (name, ops) in recipes {
        writer.whole_draws(name, ops, (5, 1, 100));
    }
    write_group_cases(&mut writer);
    write_timm_cases(&mut writer);
    assert!(writer.cases > 150, "{} cases", writer.cases);
}

/// RandomChoice, RandomOrder and RandomApply of several rows, as drawn:
/// the report's order is the order the rows ran in.
fn write_group_cases(writer: &mut Writer) {
    use row::{Group, GroupKind::*, Groups};
    let at = |name: &str| Ops::NAMES.iter().position(|known| *known == name).unwrap();
    let group = |kind, rows: &[&str], p, weights: &[f64]| {
        let rows: Vec<usize> = rows.iter().map(|name| at(name)).collect();
        Group::new(kind, &rows, p, weights)
    };
    let blur = row::GaussianBlur {
        kernel: (9, 9),
        sigma: (0.1, 2.0),
        p: 1.0,
    };
    let cases = [
        (
            // DeiT III's three augmentations, after a jitter.
            "RecipeGroupChoice",
            Ops {
                groups: Groups::NONE.with(group(
                    Choice,
                    &["grayscale", "gaussian_blur", "solarize"],
                    0.0,
                    &[],
                )),
                ..Ops::NONE
                    .with(ColorJitter::symmetric(0.3, 0.3, 0.3, 0.0))
                    .with(Grayscale.coin(1.0))
                    .with(blur)
                    .with(row::Solarize { threshold: 128.0 }.coin(1.0))
            },
        ),
        (
            "RecipeGroupOrder",
            Ops {
                groups: Groups::NONE
                    .with(group(Order, &["color_jitter", "grayscale"], 0.0, &[]))
                    .with(group(Apply, &["gaussian_blur"], 0.5, &[]))
                    .with(group(
                        Order,
                        &["solarize", "sharpness", "posterize"],
                        0.0,
                        &[],
                    )),
                ..Ops::NONE
                    .with(ColorJitter::symmetric(0.4, 0.4, 0.4, 0.1))
                    .with(Grayscale.coin(0.5))
                    .with(blur)
                    .with(row::Solarize { threshold: 128.0 }.coin(1.0))
                    .with(row::Sharpness { factor: 2.0 }.coin(1.0))
                    .with(row::Posterize { bits: 3 }.coin(1.0))
            },
        ),
        (
            "RecipeGroupApply",
            Ops {
                groups: Groups::NONE
                    .with(group(Apply, &["rotation", "affine"], 0.5, &[]))
                    .with(group(
                        Choice,
                        &["equalize", "autocontrast", "invert"],
                        0.0,
                        &[2.0, 1.0, 1.0],
                    )),
                ..Ops::NONE
                    .with(row::RandomRotation::new(-20.0, 20.0))
                    .with(row::RandomAffine {
                        translate: Some((0.1, 0.1)),
                        ..row::RandomAffine::new(-10.0, 10.0)
                    })
                    .with(row::Equalize.coin(1.0))
                    .with(row::Autocontrast.coin(1.0))
                    .with(row::Invert.coin(1.0))
            },
        ),
    ];
    for (name, ops) in cases {
        ops.validate().unwrap();
        writer.whole_draws(name, ops, (7, 3, 200));
    }
}

/// timm's RandAugment: each op alone at arguments across its range (the
/// geometric ones with both samplings), then whole recipes as drawn.
fn write_timm_cases(writer: &mut Writer) {
    use row::TimmOp::*;
    let timm = |op| row::TimmRandAugment {
        fill: row::Fill::colour([124, 116, 104]),
        ..row::TimmRandAugment::new(9.0, 2, 0.5, true).with_op_list(&[op])
    };
    let singles: &[(row::TimmOp, &[f64])] = &[
        (AutoContrast, &[0.0]),
        (Equalize, &[0.0]),
        (Invert, &[0.0]),
        (Rotate, &[27.0, -13.4, 3.0, -30.0]),
        (ShearX, &[0.27, -0.131]),
        (ShearY, &[-0.27, 0.05]),
        (TranslateXRel, &[0.405, -0.2]),
        (TranslateYRel, &[-0.405, 0.133]),
        (TranslateX, &[100.0, -37.5]),
        (TranslateY, &[-100.0]),
        (Posterize, &[0.0, 1.0, 3.0, 4.0]),
        (Solarize, &[0.0, 128.0, 230.0, 256.0]),
        (SolarizeAdd, &[99.0, 17.0]),
        (Color, &[0.1, 0.55, 1.9, 1.37]),
        (Contrast, &[0.1, 0.55, 1.9, 1.37]),
        (Brightness, &[0.1, 0.55, 1.9, 1.37]),
        (Sharpness, &[0.1, 0.55, 1.9, 1.37]),
    ];
    for (op, arguments) in singles {
        let samplings: &[row::PilResample] = if op.is_geometric() {
            &[row::PilResample::Bilinear, row::PilResample::Bicubic]
        } else {
            &[row::PilResample::Bilinear]
        };
        for &argument in *arguments {
            for &resample in samplings {
                let mut drawn = row::TimmDrawn::default();
                drawn.steps[0] = row::TimmStep {
                    op: *op,
                    argument,
                    resample,
                };
                drawn.len = 1;
                let mut crop = CropBox::whole(224, 224);
                crop.drawn.timm_rand_augment = drawn;
                let name = if op.is_geometric() {
                    format!("Timm{op:?}-{resample:?}")
                } else {
                    format!("Timm{op:?}")
                };
                writer.case(&name, &spec(224, 224, Ops::NONE.with(timm(*op))), crop);
            }
        }
    }
    let recipes = [
        (
            "RecipeTimmDeiT",
            Ops::NONE
                .with(row::TimmRandAugment {
                    fill: row::Fill::colour([124, 116, 104]),
                    ..row::TimmRandAugment::new(9.0, 2, 0.5, true)
                })
                .with(erasing(EraseValue::Random)),
        ),
        (
            "RecipeTimmRandomSampling",
            Ops::NONE.with(row::TimmRandAugment {
                prob: 1.0,
                random_resample: true,
                magnitude_std: f64::INFINITY,
                ..row::TimmRandAugment::new(10.0, 3, 0.0, false)
            }),
        ),
    ];
    for (name, ops) in recipes {
        writer.whole_draws(name, ops, (11, 0, 300));
    }
}
