//! RandomGrayscale: one coin per sample, the output turned to its luma.

use super::super::kernels;
use super::super::key::uniform;
use super::super::op::{invalid, AugmentError, DrawAt, Op};
use crate::plan::rng::Rng;
use crate::proto::v1 as pb;

/// Turns a sample to its luma (in all three channels) with this
/// probability, in `[0, 1]` (torchvision's `RandomGrayscale(p)`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RandomGrayscale(pub f64);

impl Op for RandomGrayscale {
    /// Whether the sample was turned.
    type Drawn = bool;

    const NAME: &'static str = "grayscale";
    const CLIENT_REPLAYS: bool = false;
    const OFF: Self = Self(0.0);

    fn validate(&self) -> Result<(), AugmentError> {
        if !(0.0..=1.0).contains(&self.0) {
            return Err(invalid(
                "augmentation.grayscale",
                format!("must be a probability in [0, 1], not {}", self.0),
            ));
        }
        Ok(())
    }

    fn is_random(&self) -> bool {
        self.0 > 0.0
    }

    fn draw(&self, _: &mut Rng, at: &DrawAt) -> bool {
        self.is_random() && uniform(&mut at.generator(Self::NAME)) < self.0
    }

    fn apply(&self, &turned: &bool, _width: u32, out: &mut [u8]) {
        if turned {
            kernels::grayscale(out);
        }
    }

    fn from_wire(wire: &pb::Augmentation) -> Self {
        Self(wire.grayscale)
    }

    fn to_wire(&self, wire: &mut pb::Augmentation) {
        wire.grayscale = self.0;
    }

    fn drawn_from_wire(wire: &pb::CropBox) -> bool {
        wire.grayscale
    }

    fn drawn_to_wire(turned: bool, wire: &mut pb::CropBox) {
        wire.grayscale = turned;
    }
}
