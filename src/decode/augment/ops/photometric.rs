//! RandomPhotometricDistort: torchvision v2's photometric distortion (the
//! detection references' and SSD's), each of brightness, contrast,
//! saturation and hue on its own coin, the contrast before the saturation
//! or after the hue, then a channel shuffle on a coin; every draw from the
//! op's own key in torchvision's order, reported as the adjustments in the
//! order applied and the channel order.

use super::super::kernels;
use super::super::key::{uniform, uniform_in};
use super::super::op::{AugmentError, DrawAt, Op};
use super::jitter::{apply_steps, check_factors, JitterDrawn, JitterOp};
use crate::plan::rng::Rng;

type Range = (f64, f64);

/// Each adjustment's factor range, and the coins' probability (0: off).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomPhotometricDistort {
    pub brightness: Range,
    pub contrast: Range,
    pub saturation: Range,
    pub hue: Range,
    pub p: f64,
}

/// What one sample drew: its adjustments in order, its channel order.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PhotometricDrawn {
    pub adjustments: JitterDrawn,
    pub permutation: Option<[u8; 3]>,
}

impl Default for RandomPhotometricDistort {
    fn default() -> Self {
        Self::OFF
    }
}

impl RandomPhotometricDistort {
    /// torchvision's defaults, on coins of probability `p`.
    pub fn with_p(p: f64) -> Self {
        Self { p, ..Self::OFF }
    }
}

impl Op for RandomPhotometricDistort {
    type Drawn = PhotometricDrawn;

    const NAME: &'static str = "photometric_distort";
    const CLIENT_REPLAYS: bool = false;
    const OFF: Self = Self {
        brightness: (0.875, 1.125),
        contrast: (0.5, 1.5),
        saturation: (0.5, 1.5),
        hue: (-0.05, 0.05),
        p: 0.0,
    };

    fn validate(&self) -> Result<(), AugmentError> {
        check_factors(
            [
                "augmentation.photometric_distort.p",
                "augmentation.photometric_distort.brightness",
                "augmentation.photometric_distort.contrast",
                "augmentation.photometric_distort.saturation",
                "augmentation.photometric_distort.hue",
            ],
            self.p,
            [self.brightness, self.contrast, self.saturation, self.hue].map(Some),
        )
    }

    fn is_random(&self) -> bool {
        self.p > 0.0
    }

    fn draw(&self, _: &mut Rng, at: &DrawAt) -> PhotometricDrawn {
        let mut drawn = PhotometricDrawn::default();
        if !self.is_random() {
            return drawn;
        }
        let mut rng = at.generator(Self::NAME);
        // torchvision's `make_params`: for each adjustment in turn a coin,
        // then (when it comes up) the factor; then the contrast's place,
        // then the shuffle's coin and order.
        let mut factor =
            |range: Range| (uniform(&mut rng) < self.p).then(|| uniform_in(&mut rng, range) as f32);
        let brightness = factor(self.brightness);
        let contrast = factor(self.contrast);
        let saturation = factor(self.saturation);
        let hue = factor(self.hue);
        let contrast_before = uniform(&mut rng) < 0.5;
        let shuffled = uniform(&mut rng) < self.p;
        let permutation = shuffled.then(|| {
            let mut order = [0u8, 1, 2];
            rng.shuffle(&mut order);
            order
        });
        let (before, after) = if contrast_before {
            (contrast, None)
        } else {
            (None, contrast)
        };
        let steps = &mut drawn.adjustments;
        for (op, factor) in [
            (JitterOp::Brightness, brightness),
            (JitterOp::Contrast, before),
            (JitterOp::Saturation, saturation),
            (JitterOp::Hue, hue),
            (JitterOp::Contrast, after),
        ] {
            if let Some(factor) = factor {
                steps.steps[usize::from(steps.len)] = (op, factor);
                steps.len += 1;
            }
        }
        drawn.permutation = permutation;
        drawn
    }

    fn apply(&self, drawn: &PhotometricDrawn, _width: u32, out: &mut [u8]) {
        apply_steps(&drawn.adjustments, out);
        if let Some(order) = drawn.permutation {
            kernels::permute_channels(out, order);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::op::draw_alone;
    use super::*;
    use crate::decode::augment::wire::OpWire;
    use crate::proto::v1 as pb;

    #[test]
    fn the_ranges_are_checked_and_survive_the_wire() {
        let distort = RandomPhotometricDistort::with_p(0.5);
        assert!(distort.validate().is_ok());
        let mut wire = pb::Augmentation::default();
        distort.to_wire(&mut wire);
        assert_eq!(RandomPhotometricDistort::from_wire(&wire), distort);
        let field = |d: RandomPhotometricDistort| d.validate().unwrap_err().field;
        assert_eq!(
            field(RandomPhotometricDistort {
                hue: (-0.6, 0.0),
                ..distort
            }),
            "augmentation.photometric_distort.hue"
        );
        assert_eq!(
            field(RandomPhotometricDistort {
                contrast: (-1.0, 1.0),
                ..distort
            }),
            "augmentation.photometric_distort.contrast"
        );
        assert_eq!(
            field(RandomPhotometricDistort::with_p(2.0)),
            "augmentation.photometric_distort.p"
        );
    }

    /// Each coin lands on about p of the samples, the contrast on either
    /// side of the saturation and hue, every permutation drawn; the draws
    /// survive the CropBox.
    #[test]
    fn the_coins_the_contrasts_place_and_the_shuffle_follow_torchvision() {
        let distort = RandomPhotometricDistort::with_p(0.5);
        let (mut shuffled, mut contrast_first, mut steps) = (0, 0, 0);
        let mut orders = std::collections::HashSet::new();
        for sample in 0..2000u64 {
            let drawn = draw_alone(&distort, (4, 0, sample), (32, 32));
            let applied = drawn.adjustments.steps();
            steps += applied.len();
            if let Some(order) = drawn.permutation {
                shuffled += 1;
                orders.insert(order);
            }
            let place = |op| applied.iter().position(|&(o, _)| o == op);
            if let (Some(c), Some(s)) = (place(JitterOp::Contrast), place(JitterOp::Saturation)) {
                contrast_first += usize::from(c < s);
            }
            let mut crop = pb::CropBox::default();
            RandomPhotometricDistort::drawn_to_wire(drawn, &mut crop);
            assert_eq!(RandomPhotometricDistort::drawn_from_wire(&crop), drawn);
        }
        // 4 coins of 0.5 over 2000 samples: 4000 +- 4 sd (89).
        assert!((3644..=4356).contains(&steps), "{steps}");
        assert!((911..=1089).contains(&shuffled), "{shuffled}");
        assert_eq!(orders.len(), 6, "{orders:?}");
        // Contrast and saturation both drawn: a quarter of the samples,
        // the contrast first in half of those (250 +- 4 sd of 16).
        assert!((186..=314).contains(&contrast_first), "{contrast_first}");
        let off = draw_alone(&RandomPhotometricDistort::OFF, (4, 0, 1), (32, 32));
        assert_eq!(off, PhotometricDrawn::default());
    }
}
