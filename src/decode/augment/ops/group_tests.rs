//! The groups through the table: draws, order applied, refusals, wire.

use super::super::super::key::SampleKey;
use super::super::super::op::DrawAt;
use super::super::{
    ColorJitter, Drawn, GaussianBlur, Grayscale, Invert, Kernel, Ops, Posterize, Solarize,
};
use super::*;
use crate::proto::v1 as pb;

fn row(name: &str) -> usize {
    Ops::NAMES.iter().position(|known| *known == name).unwrap()
}

/// Grayscale, blur and solarize always on (DeiT III's three), as rows.
fn three() -> Ops {
    Ops::NONE
        .with(Grayscale.coin(1.0))
        .with(GaussianBlur {
            kernel: (5, 5),
            sigma: (0.1, 2.0),
            p: 1.0,
        })
        .with(Solarize { threshold: 128.0 }.coin(1.0))
}

fn grouped(ops: Ops, kind: GroupKind, rows: &[&str], p: f64, weights: &[f64]) -> Ops {
    let rows: Vec<usize> = rows.iter().map(|name| row(name)).collect();
    Ops {
        groups: Groups::NONE.with(Group::new(kind, &rows, p, weights)),
        ..ops
    }
}

fn draw(ops: &Ops, sample: u64) -> Drawn {
    let key = SampleKey {
        seed: 11,
        epoch: 2,
        sample: crate::hash::fmix64(sample),
        copy: 0,
    };
    let at = DrawAt {
        key: &key,
        width: 32,
        height: 32,
    };
    ops.draw(&mut key.generator(), &at)
}

fn ran(drawn: &Drawn) -> Vec<&'static str> {
    drawn
        .applied
        .unwrap()
        .rows()
        .map(|r| Ops::NAMES[r])
        .collect()
}

const SAMPLES: u64 = 8_000;

#[test]
fn a_choice_runs_one_row_by_weight_and_clears_the_others() {
    let ops = grouped(
        three(),
        GroupKind::Choice,
        &["grayscale", "gaussian_blur", "solarize"],
        0.0,
        &[1.0, 2.0, 1.0],
    );
    ops.validate().unwrap();
    let mut counts = [0u64; 3];
    for sample in 0..SAMPLES {
        let drawn = draw(&ops, sample);
        let ran = ran(&drawn);
        assert_eq!(ran.len(), 1, "{ran:?}");
        match ran[0] {
            "grayscale" => {
                counts[0] += 1;
                assert!(drawn.grayscale && drawn.gaussian_blur.is_none() && !drawn.solarize);
            }
            "gaussian_blur" => {
                counts[1] += 1;
                assert!(!drawn.grayscale && drawn.gaussian_blur.is_some() && !drawn.solarize);
            }
            _ => {
                counts[2] += 1;
                assert!(!drawn.grayscale && drawn.gaussian_blur.is_none() && drawn.solarize);
            }
        }
    }
    let shares = counts.map(|count| count as f64 / SAMPLES as f64);
    for (share, expected) in shares.iter().zip([0.25, 0.5, 0.25]) {
        assert!((share - expected).abs() < 0.02, "{shares:?}");
    }
}

#[test]
fn an_apply_runs_all_of_its_rows_or_none_at_its_p() {
    let ops = grouped(
        three(),
        GroupKind::Apply,
        &["grayscale", "gaussian_blur"],
        0.8,
        &[],
    );
    ops.validate().unwrap();
    let mut together = 0;
    for sample in 0..SAMPLES {
        let drawn = draw(&ops, sample);
        let ran = ran(&drawn);
        assert!(drawn.solarize, "the row outside the group always runs");
        match ran.as_slice() {
            ["grayscale", "gaussian_blur", "solarize"] => together += 1,
            ["solarize"] => assert!(!drawn.grayscale && drawn.gaussian_blur.is_none()),
            other => panic!("{other:?}"),
        }
    }
    let share = together as f64 / SAMPLES as f64;
    assert!((share - 0.8).abs() < 0.02, "{share}");
}

#[test]
fn an_order_runs_every_row_in_each_order_equally_often_and_applies_in_it() {
    // Posterize then solarize differs from solarize then posterize.
    let ops = Ops::NONE
        .with(Solarize { threshold: 100.0 }.coin(1.0))
        .with(Posterize { bits: 2 }.coin(1.0))
        .with(Invert.coin(1.0));
    let ops = grouped(ops, GroupKind::Order, &["posterize", "solarize"], 0.0, &[]);
    ops.validate().unwrap();
    let pixels: Vec<u8> = (0..32 * 32 * 3).map(|v| (v * 7 % 256) as u8).collect();
    let mut solarize_first = 0;
    for sample in 0..2_000 {
        let drawn = draw(&ops, sample);
        let ran = ran(&drawn);
        assert_eq!(ran.len(), 3);
        assert_eq!(ran[2], "invert", "the row after the group stays after it");
        let mut expected = pixels.clone();
        for name in &ran {
            match *name {
                "solarize" => Solarize { threshold: 100.0 }.run(32, &mut expected),
                "posterize" => Posterize { bits: 2 }.run(32, &mut expected),
                _ => Invert.run(32, &mut expected),
            }
        }
        let mut out = pixels.clone();
        ops.apply(&drawn, 32, &mut out);
        assert_eq!(out, expected, "{ran:?}");
        solarize_first += usize::from(ran[0] == "solarize");
    }
    assert!((900..1_100).contains(&solarize_first), "{solarize_first}");
}

#[test]
fn a_group_moves_no_rows_own_draw() {
    let alone = ColorJitter::symmetric(0.4, 0.4, 0.2, 0.1);
    let ops = Ops::NONE.with(alone).with(Grayscale.coin(0.2));
    let with_group = grouped(ops, GroupKind::Apply, &["color_jitter"], 0.8, &[]);
    for sample in 0..200 {
        let plain = draw(&ops, sample);
        let drawn = draw(&with_group, sample);
        assert_eq!(drawn.grayscale, plain.grayscale);
        if drawn
            .applied
            .unwrap()
            .rows()
            .any(|r| r == row("color_jitter"))
        {
            assert_eq!(drawn.color_jitter, plain.color_jitter);
        } else {
            assert_eq!(drawn.color_jitter, Default::default());
        }
    }
}

#[test]
fn groups_and_decisions_round_trip_on_the_wire() {
    let ops = grouped(
        three(),
        GroupKind::Choice,
        &["solarize", "grayscale", "gaussian_blur"],
        0.0,
        &[0.5, 0.25, 0.25],
    );
    let mut wire = pb::Augmentation::default();
    ops.to_wire(&mut wire);
    assert_eq!(Ops::from_wire(&wire).unwrap(), ops);
    for sample in 0..20 {
        let drawn = draw(&ops, sample);
        let mut crop = pb::CropBox::default();
        drawn.to_wire(&mut crop);
        assert_eq!(crop.applied_rows.len(), 1);
        assert_eq!(Drawn::from_wire(&crop), drawn);
    }
    // Without groups nothing new is on the wire.
    let mut crop = pb::CropBox::default();
    draw(&three(), 0).to_wire(&mut crop);
    assert!(crop.applied_rows.is_empty());
}

fn refusal(ops: Ops) -> String {
    let error = ops.validate().unwrap_err();
    assert_eq!(error.field, "augmentation.groups");
    error.message
}

#[test]
fn groups_that_cannot_run_as_written_are_refused_by_name() {
    let names = ["grayscale", "solarize"];
    let message = refusal(grouped(three(), GroupKind::Order, &names, 0.0, &[]));
    assert!(
        message.contains("`gaussian_blur` runs between"),
        "{message}"
    );
    let off = grouped(
        Ops::NONE.with(Grayscale.coin(1.0)),
        GroupKind::Order,
        &names,
        0.0,
        &[],
    );
    assert!(refusal(off).contains("row `solarize` is off"));
    let bad_p = grouped(three(), GroupKind::Apply, &["grayscale"], 1.5, &[]);
    assert!(refusal(bad_p).contains("probability in [0, 1]"));
    let zero = grouped(three(), GroupKind::Choice, &["grayscale"], 0.0, &[0.0]);
    assert!(refusal(zero).contains("not all 0"));
    let twice = Ops {
        groups: Groups::NONE
            .with(Group::new(GroupKind::Apply, &[row("grayscale")], 0.5, &[]))
            .with(Group::new(GroupKind::Apply, &[row("grayscale")], 0.5, &[])),
        ..three()
    };
    assert!(refusal(twice).contains("in two groups"));

    let wire = |group: pb::OpGroup| pb::Augmentation {
        groups: vec![group],
        ..Default::default()
    };
    let unknown = pb::OpGroup {
        kind: pb::OpGroupKind::Order as i32,
        rows: vec!["grayscale".into(), "mixup".into()],
        ..Default::default()
    };
    let error = Ops::from_wire(&wire(unknown)).unwrap_err();
    assert!(
        error.message.contains("no row is named \"mixup\""),
        "{error}"
    );
    let unspecified = pb::OpGroup {
        rows: vec!["grayscale".into()],
        ..Default::default()
    };
    assert!(Ops::from_wire(&wire(unspecified)).is_err());
    let weights_on_order = pb::OpGroup {
        kind: pb::OpGroupKind::Order as i32,
        rows: vec!["grayscale".into()],
        weights: vec![1.0],
        ..Default::default()
    };
    assert!(Ops::from_wire(&wire(weights_on_order)).is_err());
    let too_many = pb::Augmentation {
        groups: vec![pb::OpGroup::default(); MAX_GROUPS + 1],
        ..Default::default()
    };
    assert!(Ops::from_wire(&too_many)
        .unwrap_err()
        .message
        .contains("at most 4"));
}
