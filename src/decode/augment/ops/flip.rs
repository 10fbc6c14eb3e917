//! The horizontal flip: one coin per sample, mirrored after resizing.

use super::super::key::uniform;
use super::super::op::{invalid, AugmentError, DrawAt, Op, CHANNELS};
use crate::plan::rng::Rng;

/// Mirrors a sample left to right with this probability, in `[0, 1]`
/// (torchvision's `RandomHorizontalFlip(p)`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HorizontalFlip(pub f64);

impl Op for HorizontalFlip {
    /// Whether the sample is mirrored.
    type Drawn = bool;

    const NAME: &'static str = "horizontal_flip";
    const CLIENT_REPLAYS: bool = true;
    const OFF: Self = Self(0.0);

    fn validate(&self) -> Result<(), AugmentError> {
        if !(0.0..=1.0).contains(&self.0) {
            return Err(invalid(
                "augmentation.horizontal_flip",
                format!("must be a probability in [0, 1], not {}", self.0),
            ));
        }
        Ok(())
    }

    fn is_random(&self) -> bool {
        self.0 > 0.0
    }

    fn draw(&self, sample: &mut Rng, _: &DrawAt) -> bool {
        self.is_random() && uniform(sample) < self.0
    }

    fn apply(&self, &flipped: &bool, width: u32, out: &mut [u8]) {
        if flipped {
            flip_rows(out, width);
        }
    }
}

/// Mirrors packed RGB rows left to right, in place.
pub fn flip_rows(pixels: &mut [u8], width: u32) {
    let row = width as usize * CHANNELS;
    if row == 0 {
        return;
    }
    for line in pixels.chunks_exact_mut(row) {
        let (mut left, mut right) = (0, width as usize - 1);
        while left < right {
            for channel in 0..CHANNELS {
                line.swap(left * CHANNELS + channel, right * CHANNELS + channel);
            }
            left += 1;
            right -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flip_mirrors_each_row() {
        let mut pixels: Vec<u8> = (0..2 * 3 * 3).map(|v| v as u8).collect();
        flip_rows(&mut pixels, 3);
        assert_eq!(
            pixels,
            [6, 7, 8, 3, 4, 5, 0, 1, 2, 15, 16, 17, 12, 13, 14, 9, 10, 11]
        );
    }

    #[test]
    fn a_probability_outside_0_1_names_its_field() {
        for p in [1.5, -0.1, f64::NAN] {
            assert_eq!(
                HorizontalFlip(p).validate().unwrap_err().field,
                "augmentation.horizontal_flip"
            );
        }
        assert!(HorizontalFlip(1.0).validate().is_ok());
    }
}
