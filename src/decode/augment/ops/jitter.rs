//! ColorJitter: brightness, contrast, saturation and hue factors drawn per
//! sample and applied in a random order, as torchvision v2's `ColorJitter`
//! (`fn_idx = randperm(4)`, then each factor uniform in its range), with
//! probability `p` (torchvision's `RandomApply([ColorJitter(...)], p)`, as
//! SimCLR, MoCo, BYOL and DINO write it). Whether it applies is drawn from
//! a key of its own, so p = 1 draws exactly what the op drew before it had
//! a probability.

use super::super::kernels;
use super::super::key::{uniform, uniform_in};
use super::super::op::{invalid, AugmentError, DrawAt, Op};
use crate::plan::rng::Rng;

/// The four adjustments, in torchvision's numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JitterOp {
    #[default]
    Brightness,
    Contrast,
    Saturation,
    Hue,
}

const ORDER: [JitterOp; 4] = [
    JitterOp::Brightness,
    JitterOp::Contrast,
    JitterOp::Saturation,
    JitterOp::Hue,
];

/// Each adjustment's factor range (`None`: left out), and the probability
/// that a sample is jittered at all.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ColorJitter {
    pub brightness: Option<(f64, f64)>,
    pub contrast: Option<(f64, f64)>,
    pub saturation: Option<(f64, f64)>,
    pub hue: Option<(f64, f64)>,
    pub p: f64,
}

impl Default for ColorJitter {
    fn default() -> Self {
        Self::OFF
    }
}

/// The key of the apply-or-not draw: apart from the factors' key, so that
/// adding a probability moves no factor.
const APPLY_KEY: &str = "color_jitter.p";

impl ColorJitter {
    /// torchvision's float form: `[max(0, 1 - v), 1 + v]` for the first
    /// three, `[-h, h]` for hue; 0 leaves an adjustment out.
    pub fn symmetric(brightness: f64, contrast: f64, saturation: f64, hue: f64) -> Self {
        let around_one = |v: f64| (v != 0.0).then(|| ((1.0 - v).max(0.0), 1.0 + v));
        Self {
            brightness: around_one(brightness),
            contrast: around_one(contrast),
            saturation: around_one(saturation),
            hue: (hue != 0.0).then_some((-hue, hue)),
            p: 1.0,
        }
    }

    /// The same jitter, applied to a sample with probability `p`.
    pub fn with_p(self, p: f64) -> Self {
        Self { p, ..self }
    }

    fn range(&self, op: JitterOp) -> Option<(f64, f64)> {
        match op {
            JitterOp::Brightness => self.brightness,
            JitterOp::Contrast => self.contrast,
            JitterOp::Saturation => self.saturation,
            JitterOp::Hue => self.hue,
        }
    }
}

/// The most adjustments a sample takes: each of the four once.
pub const MAX_STEPS: usize = 4;

/// A sample's adjustments in the order applied.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct JitterDrawn {
    pub steps: [(JitterOp, f32); MAX_STEPS],
    pub len: u8,
}

impl JitterDrawn {
    pub fn steps(&self) -> &[(JitterOp, f32)] {
        &self.steps[..usize::from(self.len)]
    }
}

/// Applies adjustments in order (ColorJitter's, and
/// RandomPhotometricDistort's).
pub(super) fn apply_steps(drawn: &JitterDrawn, out: &mut [u8]) {
    for &(op, factor) in drawn.steps() {
        match op {
            JitterOp::Brightness => kernels::adjust_brightness(out, factor),
            JitterOp::Contrast => kernels::adjust_contrast(out, factor),
            JitterOp::Saturation => kernels::adjust_saturation(out, factor),
            JitterOp::Hue => kernels::adjust_hue(out, factor),
        }
    }
}

/// Checks a probability and the four factor ranges (None: left out), the
/// first three within [0, inf), hue's within [-0.5, 0.5], as torchvision's
/// kernels take them; `fields` names p's and each range's request field.
pub(super) fn check_factors(
    fields: [&'static str; 5],
    p: f64,
    ranges: [Option<(f64, f64)>; 4],
) -> Result<(), AugmentError> {
    if !(0.0..=1.0).contains(&p) {
        return Err(invalid(
            fields[0],
            format!("must be a probability in [0, 1], not {p}"),
        ));
    }
    let bounds = [(0.0, f64::INFINITY); 3].into_iter().chain([(-0.5, 0.5)]);
    for ((field, range), (low, high)) in fields[1..].iter().zip(ranges).zip(bounds) {
        let Some((min, max)) = range else { continue };
        if !(min.is_finite() && max.is_finite() && low <= min && min <= max && max <= high) {
            return Err(invalid(
                field,
                format!("must be a range with {low} <= min <= max <= {high}, not [{min}, {max}]"),
            ));
        }
    }
    Ok(())
}

impl Op for ColorJitter {
    type Drawn = JitterDrawn;

    const NAME: &'static str = "color_jitter";
    const CLIENT_REPLAYS: bool = false;
    const OFF: Self = Self {
        brightness: None,
        contrast: None,
        saturation: None,
        hue: None,
        p: 1.0,
    };

    fn validate(&self) -> Result<(), AugmentError> {
        check_factors(
            [
                "augmentation.color_jitter.p",
                "augmentation.color_jitter.brightness",
                "augmentation.color_jitter.contrast",
                "augmentation.color_jitter.saturation",
                "augmentation.color_jitter.hue",
            ],
            self.p,
            [self.brightness, self.contrast, self.saturation, self.hue],
        )
    }

    fn is_random(&self) -> bool {
        self.p > 0.0 && ORDER.iter().any(|&op| self.range(op).is_some())
    }

    fn draw(&self, _: &mut Rng, at: &DrawAt) -> JitterDrawn {
        let mut drawn = JitterDrawn::default();
        if !self.is_random() {
            return drawn;
        }
        // torchvision's RandomApply: skipped when p < rand.
        if self.p < 1.0 && self.p < uniform(&mut at.generator(APPLY_KEY)) {
            return drawn;
        }
        let mut rng = at.generator(Self::NAME);
        let mut order = ORDER;
        rng.shuffle(&mut order);
        // torchvision draws the factors in its fixed order, then applies
        // them in the shuffled one.
        let factors = ORDER.map(|op| {
            self.range(op)
                .map(|range| uniform_in(&mut rng, range) as f32)
        });
        for op in order {
            if let Some(factor) = factors[op as usize] {
                drawn.steps[usize::from(drawn.len)] = (op, factor);
                drawn.len += 1;
            }
        }
        drawn
    }

    fn apply(&self, drawn: &JitterDrawn, _width: u32, out: &mut [u8]) {
        apply_steps(drawn, out);
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::op::draw_alone;
    use super::*;
    use crate::decode::augment::wire::OpWire;
    use crate::proto::v1 as pb;

    fn drawn(jitter: ColorJitter, sample: u64) -> JitterDrawn {
        draw_alone(&jitter, (3, 1, crate::hash::fmix64(sample + 1)), (224, 224))
    }

    #[test]
    fn random_apply_jitters_a_share_p_and_moves_no_factor() {
        let always = ColorJitter::symmetric(0.4, 0.4, 0.2, 0.1);
        let mostly = always.with_p(0.8);
        let samples = 4000u64;
        let mut applied = 0;
        for sample in 0..samples {
            let (all, some) = (drawn(always, sample), drawn(mostly, sample));
            assert_eq!(all.len, 4);
            if some.len > 0 {
                // A jittered sample draws what p = 1 draws.
                assert_eq!(some, all);
                applied += 1;
            }
        }
        // The 99.9% binomial bounds of 0.8 of 4000: 3200 +- 83.
        assert!((3117..=3283).contains(&applied), "{applied} of {samples}");
        assert!(!always.with_p(0.0).is_random());
    }

    #[test]
    fn the_probability_is_checked_and_survives_the_wire() {
        let jitter = ColorJitter::symmetric(0.4, 0.0, 0.0, 0.0).with_p(0.8);
        let mut wire = pb::Augmentation::default();
        jitter.to_wire(&mut wire);
        assert_eq!(ColorJitter::from_wire(&wire), jitter);
        let field = jitter.with_p(1.5).validate().unwrap_err().field;
        assert_eq!(field, "augmentation.color_jitter.p");
        let plain = ColorJitter::symmetric(0.4, 0.0, 0.0, 0.0);
        plain.to_wire(&mut wire);
        assert_eq!(wire.color_jitter.unwrap().p, None, "p = 1 is left unset");
    }
}
