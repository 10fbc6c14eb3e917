//! The policies' decisions against torchvision's distributions: over many
//! samples each op, bin and sign falls within the binomial 99.9% bounds of
//! its probability.

use super::*;
use crate::decode::augment::op::draw_alone;

const Z_999: f64 = 3.29;

fn draws(policy: Policy, samples: u64) -> Vec<PolicyDrawn> {
    let op = AutoAugment {
        policy,
        ..AutoAugment::OFF
    };
    (0..samples)
        .map(|sample| draw_alone(&op, (11, 3, crate::hash::fmix64(sample + 1)), (224, 224)))
        .collect()
}

/// Panics unless `count` of `trials` is within the 99.9% bounds of `p`.
fn assert_binomial(what: &str, count: usize, trials: usize, p: f64) {
    let mean = trials as f64 * p;
    let spread = Z_999 * (trials as f64 * p * (1.0 - p)).sqrt();
    assert!(
        (count as f64 - mean).abs() <= spread,
        "{what}: {count} of {trials}, expected {mean:.0} +- {spread:.0}"
    );
}

/// The bin of a linspace op's magnitude in its table.
fn bin_of(step: PolicyStep, table: Table, bins: u32) -> Option<u32> {
    (0..bins).find(|&bin| {
        magnitude(step.op, table, bins, bin, 224, 224)
            .is_some_and(|(m, _)| m == step.magnitude.abs())
    })
}

#[test]
fn trivial_augment_wide_draws_ops_bins_and_signs_uniformly() {
    let samples = 28_000;
    let drawn = draws(Policy::TrivialAugmentWide { bins: 31 }, samples);
    let steps: Vec<PolicyStep> = drawn.iter().flat_map(|d| d.steps().to_vec()).collect();
    assert_eq!(steps.len(), samples as usize, "one op per sample");
    for op in WIDE_OPS {
        let count = steps.iter().filter(|s| s.op == op).count();
        assert_binomial(&format!("{op:?}"), count, steps.len(), 1.0 / 14.0);
    }
    // Bins and signs over the ops whose table is a linspace (distinct bins).
    let linear: Vec<PolicyStep> = steps
        .iter()
        .copied()
        .filter(|s| {
            matches!(
                s.op,
                ShearX
                    | ShearY
                    | TranslateX
                    | TranslateY
                    | Rotate
                    | Brightness
                    | Color
                    | Contrast
                    | Sharpness
            )
        })
        .collect();
    let mut per_bin = [0usize; 31];
    for step in &linear {
        per_bin[bin_of(*step, Table::Wide, 31).expect("a table entry") as usize] += 1;
    }
    for (bin, &count) in per_bin.iter().enumerate() {
        assert_binomial(&format!("bin {bin}"), count, linear.len(), 1.0 / 31.0);
    }
    let signed: Vec<&PolicyStep> = linear.iter().filter(|s| s.magnitude != 0.0).collect();
    let negative = signed.iter().filter(|s| s.magnitude < 0.0).count();
    assert_binomial("negative", negative, signed.len(), 0.5);
}

#[test]
fn rand_augment_draws_its_ops_with_replacement_at_one_magnitude() {
    let samples = 10_000;
    let drawn = draws(
        Policy::RandAugment {
            num_ops: 2,
            magnitude: 9,
            bins: 31,
        },
        samples,
    );
    assert!(drawn.iter().all(|d| d.len == 2));
    let steps: Vec<PolicyStep> = drawn.iter().flat_map(|d| d.steps().to_vec()).collect();
    for op in WIDE_OPS {
        let count = steps.iter().filter(|s| s.op == op).count();
        assert_binomial(&format!("{op:?}"), count, steps.len(), 1.0 / 14.0);
    }
    let same = drawn
        .iter()
        .filter(|d| d.steps[0].op == d.steps[1].op)
        .count();
    assert_binomial("the same op twice", same, drawn.len(), 1.0 / 14.0);
    // Bin 9 of 31: rotate 9 degrees, shear 0.09, posterize 7 bits,
    // solarize at 0.7 (178.5 of 255).
    for step in &steps {
        let expected = match step.op {
            Rotate => Some(9.0),
            ShearX | ShearY => Some(0.09),
            Brightness | Color | Contrast | Sharpness => Some(0.27),
            Posterize => Some(7.0),
            Solarize => Some(0.7),
            TranslateX | TranslateY => Some(150.0 / 331.0 * 224.0 * 9.0 / 30.0),
            _ => None,
        };
        if let Some(expected) = expected {
            assert!(
                (f64::from(step.magnitude.abs()) - expected).abs() < 1e-4,
                "{step:?} against {expected}"
            );
        }
    }
}

#[test]
fn auto_augment_applies_each_op_at_its_policy_frequency() {
    let samples = 25_000;
    let drawn = draws(Policy::AutoAugmentImageNet, samples);
    for op in [
        Posterize,
        Rotate,
        Solarize,
        AutoContrast,
        Equalize,
        Color,
        Contrast,
        Sharpness,
        ShearX,
        Invert,
    ] {
        // Per sample: the count of `op` among the sub-policy's applied ops.
        let (mut mean, mut square) = (0.0, 0.0);
        for sub in IMAGENET {
            let p: Vec<f64> = sub
                .iter()
                .filter(|(o, ..)| *o == op)
                .map(|&(_, p, _)| f64::from(p))
                .collect();
            let m: f64 = p.iter().sum();
            let both = if p.len() == 2 { 2.0 * p[0] * p[1] } else { 0.0 };
            mean += m / 25.0;
            square += (m + both) / 25.0;
        }
        let variance = square - mean * mean;
        let count: usize = drawn
            .iter()
            .map(|d| d.steps().iter().filter(|s| s.op == op).count())
            .sum();
        let expected = mean * samples as f64;
        let spread = Z_999 * (variance * samples as f64).sqrt();
        assert!(
            (count as f64 - expected).abs() <= spread,
            "{op:?}: {count}, expected {expected:.0} +- {spread:.0}"
        );
    }
}

#[test]
fn tables_match_torchvision_at_their_ends() {
    // TrivialAugmentWide: posterize from 8 bits down to 2; rotate to 135.
    assert_eq!(
        magnitude(Posterize, Table::Wide, 31, 0, 224, 224),
        Some((8.0, false))
    );
    assert_eq!(
        magnitude(Posterize, Table::Wide, 31, 30, 224, 224),
        Some((2.0, false))
    );
    assert_eq!(
        magnitude(Rotate, Table::Wide, 31, 20, 224, 224),
        Some((90.0, true))
    );
    assert_eq!(
        magnitude(Rotate, Table::Wide, 31, 30, 224, 224),
        Some((135.0, true))
    );
    // AutoAugment's ten bins: posterize 8 bits down to 4.
    assert_eq!(
        magnitude(Posterize, Table::Standard, 10, 9, 224, 224),
        Some((4.0, false))
    );
    assert_eq!(
        magnitude(Solarize, Table::Standard, 10, 0, 224, 224),
        Some((1.0, false))
    );
    assert_eq!(magnitude(Identity, Table::Wide, 31, 3, 224, 224), None);
}

#[test]
fn bad_parameters_name_their_field() {
    let check = |policy| {
        AutoAugment {
            policy,
            ..AutoAugment::OFF
        }
        .validate()
        .map_err(|e| e.field)
    };
    assert_eq!(
        check(Policy::TrivialAugmentWide { bins: 1 }),
        Err("augmentation.auto_augment.trivial_augment_wide.num_magnitude_bins")
    );
    assert_eq!(
        check(Policy::RandAugment {
            num_ops: 2,
            magnitude: 31,
            bins: 31
        }),
        Err("augmentation.auto_augment.rand_augment.magnitude")
    );
    assert_eq!(
        check(Policy::RandAugment {
            num_ops: 0,
            magnitude: 9,
            bins: 31
        }),
        Err("augmentation.auto_augment.rand_augment.num_ops")
    );
    let bad_fill = AutoAugment {
        policy: Policy::AutoAugmentImageNet,
        fill: Fill {
            levels: [0, 300, 0],
            count: 3,
        },
        ..AutoAugment::OFF
    };
    assert_eq!(
        bad_fill.validate().unwrap_err().field,
        "augmentation.auto_augment.fill"
    );
    let unknown = AutoAugment {
        policy: Policy::AutoAugmentImageNet,
        interpolation: None,
        ..AutoAugment::OFF
    };
    assert_eq!(
        unknown.validate().unwrap_err().field,
        "augmentation.auto_augment.interpolation"
    );
}
