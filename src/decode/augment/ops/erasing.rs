//! RandomErasing: one box per erased sample, drawn as torchvision v2's
//! `RandomErasing` draws it (up to 10 tries of an area and a log-uniform
//! aspect, each side rounded half to even as Python's `round`, the box
//! kept only when it fits), filled with a colour, the normalization's
//! mean or per-value noise (`../kernels/erase.rs`).

use super::super::kernels::{self, EraseFill};
use super::super::key::{uniform, uniform_in};
use super::super::op::{invalid, AugmentError, DrawAt, Op};
use crate::plan::rng::Rng;

const ATTEMPTS: usize = 10;
pub const DEFAULT_SCALE: (f64, f64) = (0.02, 0.33);
pub const DEFAULT_RATIO: (f64, f64) = (0.3, 3.3);

/// What an erased box holds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum EraseValue {
    /// Levels as sent (checked by `validate`).
    Colour([u32; 3], usize),
    /// 0 after Normalize: the mean.
    #[default]
    Mean,
    /// `N(0, 1)` per value after Normalize.
    Random,
}

/// torchvision's `RandomErasing(p, scale, ratio, value)` with the
/// normalization the trainer applies after it (`mean`, `std` in [0, 1]
/// units, three each, as sent).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomErasing {
    pub p: f64,
    pub scale: (f64, f64),
    pub ratio: (f64, f64),
    pub value: EraseValue,
    pub mean: ([f64; 3], usize),
    pub std: ([f64; 3], usize),
}

/// An erased box: rows `top..top + height`, columns `left..left + width`,
/// and the seed of its noise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ErasedBox {
    pub top: u32,
    pub left: u32,
    pub height: u32,
    pub width: u32,
    pub noise: u64,
}

impl RandomErasing {
    /// The recipes' form: `p`, torchvision's default box ranges, a value,
    /// and the normalization.
    pub fn new(p: f64, value: EraseValue, mean: [f64; 3], std: [f64; 3]) -> Self {
        Self {
            p,
            scale: DEFAULT_SCALE,
            ratio: DEFAULT_RATIO,
            value,
            mean: (mean, 3),
            std: (std, 3),
        }
    }

    fn normalization(&self) -> ([f32; 3], [f32; 3]) {
        (self.mean.0.map(|v| v as f32), self.std.0.map(|v| v as f32))
    }

    fn fill(&self, noise: u64) -> EraseFill {
        let (mean, std) = self.normalization();
        match self.value {
            EraseValue::Colour(levels, _) => EraseFill::Colour(levels.map(|l| l.min(255) as u8)),
            EraseValue::Mean => {
                EraseFill::Colour([0, 1, 2].map(|c| kernels::noise_level(0.0, mean[c], std[c])))
            }
            EraseValue::Random => EraseFill::Noise { noise, mean, std },
        }
    }
}

impl Default for RandomErasing {
    fn default() -> Self {
        Self::OFF
    }
}

impl Op for RandomErasing {
    /// The box, when the sample is erased.
    type Drawn = Option<ErasedBox>;

    const NAME: &'static str = "random_erasing";
    const CLIENT_REPLAYS: bool = false;
    const OFF: Self = Self {
        p: 0.0,
        scale: DEFAULT_SCALE,
        ratio: DEFAULT_RATIO,
        value: EraseValue::Mean,
        mean: ([0.0; 3], 0),
        std: ([0.0; 3], 0),
    };

    fn validate(&self) -> Result<(), AugmentError> {
        let field = |name: &str| -> &'static str {
            match name {
                "p" => "augmentation.random_erasing.p",
                "scale" => "augmentation.random_erasing.scale",
                "ratio" => "augmentation.random_erasing.ratio",
                "value" => "augmentation.random_erasing.value",
                "mean" => "augmentation.random_erasing.normalize_mean",
                _ => "augmentation.random_erasing.normalize_std",
            }
        };
        if !(0.0..=1.0).contains(&self.p) {
            return Err(invalid(
                field("p"),
                format!("must be a probability in [0, 1], not {}", self.p),
            ));
        }
        if !self.is_random() {
            return Ok(());
        }
        let (low, high) = self.scale;
        if !(low > 0.0 && low <= high && high < 1.0) {
            return Err(invalid(
                field("scale"),
                format!("must be an area fraction with 0 < min <= max < 1 (a box must fit), not [{low}, {high}]"),
            ));
        }
        let (low, high) = self.ratio;
        if !(low > 0.0 && low <= high && high.is_finite()) {
            return Err(invalid(
                field("ratio"),
                format!("must be an aspect ratio with 0 < min <= max, not [{low}, {high}]"),
            ));
        }
        match self.value {
            EraseValue::Colour(levels, count) => {
                if count != 3 || levels.iter().any(|&l| l > 255) {
                    return Err(invalid(
                        field("value"),
                        format!(
                            "a colour is three levels in 0..=255, not {:?}",
                            &levels[..count.min(3)]
                        ),
                    ));
                }
            }
            EraseValue::Mean | EraseValue::Random => {
                let (mean, count) = self.mean;
                if count != 3 || mean.iter().any(|m| !(0.0..=1.0).contains(m)) {
                    return Err(invalid(
                        field("mean"),
                        format!(
                            "the value needs three means in [0, 1], not {:?}",
                            &mean[..count.min(3)]
                        ),
                    ));
                }
                let (std, count) = self.std;
                if count != 3 || std.iter().any(|s| !(*s > 0.0 && s.is_finite())) {
                    return Err(invalid(
                        field("std"),
                        format!(
                            "the value needs three positive stds, not {:?}",
                            &std[..count.min(3)]
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn is_random(&self) -> bool {
        self.p > 0.0
    }

    fn draw(&self, _: &mut Rng, at: &DrawAt) -> Option<ErasedBox> {
        if !self.is_random() {
            return None;
        }
        let mut rng = at.generator(Self::NAME);
        // torchvision: `if torch.rand(1) >= self.p: return`.
        if uniform(&mut rng) >= self.p {
            return None;
        }
        let (image_h, image_w) = (at.height, at.width);
        let area = f64::from(image_h) * f64::from(image_w);
        let log_ratio = (self.ratio.0.ln(), self.ratio.1.ln());
        for _ in 0..ATTEMPTS {
            let erase_area = area * uniform_in(&mut rng, self.scale);
            let aspect = uniform_in(&mut rng, log_ratio).exp();
            let h = (erase_area * aspect).sqrt().round_ties_even();
            let w = (erase_area / aspect).sqrt().round_ties_even();
            if !(h < f64::from(image_h) && w < f64::from(image_w)) {
                continue;
            }
            let (h, w) = (h as u32, w as u32);
            let top = rng.below(u64::from(image_h - h) + 1) as u32;
            let left = rng.below(u64::from(image_w - w) + 1) as u32;
            return Some(ErasedBox {
                top,
                left,
                height: h,
                width: w,
                noise: rng.next_u64(),
            });
        }
        None
    }

    fn apply(&self, drawn: &Option<ErasedBox>, width: u32, out: &mut [u8]) {
        if let Some(b) = drawn {
            kernels::erase(
                out,
                width,
                (b.top, b.left, b.height, b.width),
                self.fill(b.noise),
            );
        }
    }
}
