//! Which source region becomes the output: the crop, decided before any
//! pixel is decoded so only that region is. A stream has exactly one.
//!
//! # RandomResizedCrop
//!
//! The box sampling follows torchvision's `RandomResizedCrop.get_params`:
//! up to ten attempts draw an area fraction `s ~ U(scale)` and a log-aspect
//! `log r ~ U(log ratio)`, take `w = round(sqrt(s·A·r))`,
//! `h = round(sqrt(s·A/r))` (ties to even, as Python's `round`), and accept
//! the first box that fits, placing it at `top ~ U{0..H-h}`,
//! `left ~ U{0..W-w}`. When none fits, the fallback is the largest centered
//! box whose aspect is clamped into `ratio`. Frozen: a test pins boxes.

use super::key::uniform_in;
use super::op::{invalid, AugmentError};
use crate::plan::rng::Rng;

/// torchvision's number of box attempts before the fallback.
const RANDOM_CROP_ATTEMPTS: usize = 10;
/// Largest accepted aspect ratio bound (either way).
pub const MAX_ASPECT_RATIO: f64 = 100.0;
/// Largest accepted center-crop resize, as a multiple of the largest
/// output side.
const MAX_RESIZE_FACTOR: u32 = 8;

/// How a source image becomes the output (before the ops after it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Crop {
    /// Scale the shorter side to `resize` and take the centered output-sized
    /// box (torchvision's `Resize(resize)` + `CenterCrop`). `None`: the
    /// smallest scale at which the box covers the output (`resize` equal to
    /// the output's longer side for square outputs).
    Center { resize: Option<u32> },
    /// Scale each side to the output, ignoring the aspect ratio.
    Stretch,
    /// torchvision's `RandomResizedCrop` box, resized to the output.
    RandomResized(RandomResizedCrop),
}

impl Default for Crop {
    fn default() -> Self {
        Crop::Center { resize: None }
    }
}

/// Area fraction and aspect-ratio ranges of a random crop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomResizedCrop {
    pub scale: (f64, f64),
    pub ratio: (f64, f64),
}

impl Default for RandomResizedCrop {
    /// torchvision's defaults.
    fn default() -> Self {
        Self {
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
        }
    }
}

/// A box in source pixels: left, top, width, height.
pub type Rect = (f64, f64, f64, f64);

impl Crop {
    pub fn is_random(&self) -> bool {
        matches!(self, Crop::RandomResized(_))
    }

    /// Checks the crop's ranges for an output of `height x width`, naming
    /// the request field that is wrong.
    pub fn validate(&self, height: u32, width: u32, max_side: u32) -> Result<(), AugmentError> {
        match *self {
            Crop::Center {
                resize: Some(resize),
            } => {
                let longer = height.max(width);
                let most = MAX_RESIZE_FACTOR * max_side;
                if resize < longer || resize > most {
                    return Err(invalid(
                        "augmentation.center_crop.resize",
                        format!(
                            "{resize} must be between the output's longer side ({longer}) and \
                             {most} (the shorter source side is scaled to it, then the output is \
                             cut from its center)"
                        ),
                    ));
                }
            }
            Crop::Center { resize: None } | Crop::Stretch => {}
            Crop::RandomResized(RandomResizedCrop { scale, ratio }) => {
                let (low, high) = scale;
                if !(low > 0.0 && low <= high && high <= 1.0) {
                    return Err(invalid(
                        "augmentation.random_resized_crop.scale",
                        format!("area fractions ({low}, {high}) must satisfy 0 < min <= max <= 1"),
                    ));
                }
                let (low, high) = ratio;
                if !(low >= 1.0 / MAX_ASPECT_RATIO && low <= high && high <= MAX_ASPECT_RATIO) {
                    return Err(invalid(
                        "augmentation.random_resized_crop.ratio",
                        format!(
                            "aspect ratios ({low}, {high}) must satisfy \
                             1/{MAX_ASPECT_RATIO} <= min <= max <= {MAX_ASPECT_RATIO}"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The source box of a `width x height` image for an output of
    /// `out_width x out_height`; draws from `rng` only when random.
    pub fn source_box(
        &self,
        (width, height): (u32, u32),
        (out_width, out_height): (u32, u32),
        rng: &mut Rng,
    ) -> Rect {
        let (w, h) = (f64::from(width), f64::from(height));
        match *self {
            Crop::Stretch => (0.0, 0.0, w, h),
            Crop::Center { resize } => {
                let (out_w, out_h) = (f64::from(out_width), f64::from(out_height));
                // Source pixels per output pixel, kept as a ratio of whole
                // numbers and multiplied before dividing, so a box that
                // spans a whole side is exactly that side.
                let (num, den) = match resize {
                    Some(resize) => (w.min(h), f64::from(resize)),
                    None if w * out_h < h * out_w => (w, out_w),
                    None => (h, out_h),
                };
                let box_w = (out_w * num / den).min(w);
                let box_h = (out_h * num / den).min(h);
                ((w - box_w) / 2.0, (h - box_h) / 2.0, box_w, box_h)
            }
            Crop::RandomResized(params) => random_resized_box(&params, width, height, rng),
        }
    }
}

/// torchvision's `RandomResizedCrop.get_params` on integer source pixels.
fn random_resized_box(params: &RandomResizedCrop, width: u32, height: u32, rng: &mut Rng) -> Rect {
    let area = f64::from(width) * f64::from(height);
    let log_ratio = (params.ratio.0.ln(), params.ratio.1.ln());
    for _ in 0..RANDOM_CROP_ATTEMPTS {
        let target_area = area * uniform_in(rng, params.scale);
        let aspect = uniform_in(rng, log_ratio).exp();
        let box_w = (target_area * aspect).sqrt().round_ties_even();
        let box_h = (target_area / aspect).sqrt().round_ties_even();
        if box_w > 0.0 && box_w <= f64::from(width) && box_h > 0.0 && box_h <= f64::from(height) {
            let (box_w, box_h) = (box_w as u32, box_h as u32);
            let top = rng.below(u64::from(height - box_h) + 1);
            let left = rng.below(u64::from(width - box_w) + 1);
            return (left as f64, top as f64, f64::from(box_w), f64::from(box_h));
        }
    }
    // Fallback: the whole image, its aspect clamped into the ratio range.
    let source_ratio = f64::from(width) / f64::from(height);
    let (box_w, box_h) = if source_ratio < params.ratio.0 {
        let box_h = (f64::from(width) / params.ratio.0).round_ties_even();
        (width, (box_h as u32).clamp(1, height))
    } else if source_ratio > params.ratio.1 {
        let box_w = (f64::from(height) * params.ratio.1).round_ties_even();
        ((box_w as u32).clamp(1, width), height)
    } else {
        (width, height)
    };
    (
        f64::from((width - box_w) / 2),
        f64::from((height - box_h) / 2),
        f64::from(box_w),
        f64::from(box_h),
    )
}
