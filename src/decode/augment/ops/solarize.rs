//! RandomSolarize: torchvision's `RandomSolarize(threshold, p)`, a coin per
//! sample (from its own key), every value at or above the threshold
//! inverted.

use super::super::kernels;
use super::super::key::uniform;
use super::super::op::{invalid, AugmentError, DrawAt, Op};
use crate::plan::rng::Rng;
use crate::proto::v1 as pb;

/// The threshold (in levels, 0 to 255) and the probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomSolarize {
    pub threshold: f64,
    pub p: f64,
}

impl Default for RandomSolarize {
    fn default() -> Self {
        Self::OFF
    }
}

impl Op for RandomSolarize {
    /// Whether the sample was solarized.
    type Drawn = bool;

    const NAME: &'static str = "solarize";
    const CLIENT_REPLAYS: bool = false;
    const OFF: Self = Self {
        threshold: 128.0,
        p: 0.0,
    };

    fn validate(&self) -> Result<(), AugmentError> {
        if !(0.0..=1.0).contains(&self.p) {
            return Err(invalid(
                "augmentation.solarize.p",
                format!("must be a probability in [0, 1], not {}", self.p),
            ));
        }
        // torchvision refuses a threshold above the dtype's maximum.
        if !(0.0..=255.0).contains(&self.threshold) {
            return Err(invalid(
                "augmentation.solarize.threshold",
                format!("must be in [0, 255] (uint8 levels), not {}", self.threshold),
            ));
        }
        Ok(())
    }

    fn is_random(&self) -> bool {
        self.p > 0.0
    }

    fn draw(&self, _: &mut Rng, at: &DrawAt) -> bool {
        // torchvision's `_RandomApplyTransform`: skipped when rand >= p.
        self.is_random() && uniform(&mut at.generator(Self::NAME)) < self.p
    }

    fn apply(&self, &solarized: &bool, _width: u32, out: &mut [u8]) {
        if solarized {
            kernels::solarize(out, self.threshold);
        }
    }

    fn from_wire(wire: &pb::Augmentation) -> Self {
        wire.solarize.as_ref().map_or(Self::OFF, |solarize| Self {
            threshold: solarize.threshold,
            p: solarize.p,
        })
    }

    fn to_wire(&self, wire: &mut pb::Augmentation) {
        if self.is_random() {
            wire.solarize = Some(pb::RandomSolarize {
                threshold: self.threshold,
                p: self.p,
            });
        }
    }

    fn drawn_from_wire(wire: &pb::CropBox) -> bool {
        wire.solarized
    }

    fn drawn_to_wire(solarized: bool, wire: &mut pb::CropBox) {
        wire.solarized = solarized;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_and_probability_are_checked_and_survive_the_wire() {
        let solarize = RandomSolarize {
            threshold: 128.0,
            p: 0.2,
        };
        assert!(solarize.validate().is_ok());
        let mut wire = pb::Augmentation::default();
        solarize.to_wire(&mut wire);
        assert_eq!(RandomSolarize::from_wire(&wire), solarize);
        let field = |s: RandomSolarize| s.validate().unwrap_err().field;
        assert_eq!(
            field(RandomSolarize {
                threshold: 256.0,
                ..solarize
            }),
            "augmentation.solarize.threshold"
        );
        assert_eq!(
            field(RandomSolarize {
                p: -0.1,
                ..solarize
            }),
            "augmentation.solarize.p"
        );
    }
}
