//! Which source region each sample's output comes from, decided before any
//! pixel is decoded.
//!
//! A sample's region (its [`CropBox`]) is a pure function of the stream's
//! [`OutputSpec`], the source image's size and a [`SampleKey`]: the seed, the
//! epoch and a hash of the sample's identity (its shard and key). Nothing
//! about the stream that carries it (rank, world size, decode thread, resume
//! point, cache state, retries) enters, so a sample gets the same crop and
//! flip wherever it is decoded, and a new one every epoch.
//!
//! # RandomResizedCrop
//!
//! The box sampling follows torchvision's `RandomResizedCrop.get_params`:
//! up to ten attempts draw an area fraction `s ~ U(scale)` and a log-aspect
//! `log r ~ U(log ratio)`, take `w = round(sqrt(s·A·r))`,
//! `h = round(sqrt(s·A/r))` (ties to even, as Python's `round`), and accept
//! the first box that fits, placing it at `top ~ U{0..H-h}`,
//! `left ~ U{0..W-w}`. When none fits, the fallback is the largest centered
//! box whose aspect is clamped into `ratio`. The flip is then one draw
//! `u ~ U[0, 1)`, flipped when `u < p`.
//!
//! The generator is the plan's SplitMix64 ([`Rng`]), keyed by
//! `[seed, epoch, PURPOSE_AUGMENT, sample]` where `sample` is
//! [`sample_identity`] of the shard name and key. Uniform reals are the top
//! 53 bits of a draw; integers use Lemire's method. Both are frozen: a test
//! pins boxes, so a change cannot alter users' augmentations silently.

use crate::plan::rng::Rng;

/// Bytes per output pixel: RGB.
pub const CHANNELS: usize = 3;
/// The output side when a request names none.
pub const DEFAULT_SIZE: u32 = 224;
/// Largest accepted output side; bounds batch buffers.
pub const MAX_SIZE: u32 = 4096;

/// Keeps the augmentation stream independent of the plan's streams.
const PURPOSE_AUGMENT: u64 = 3;
/// torchvision's number of box attempts before the fallback.
const RANDOM_CROP_ATTEMPTS: usize = 10;
/// Largest accepted aspect ratio bound (either way).
pub const MAX_ASPECT_RATIO: f64 = 100.0;

/// How a source image becomes the output (before an optional flip).
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

/// The source rectangle one output came from, in source pixels, and whether
/// the output was mirrored left to right after resizing.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CropBox {
    pub left: f64,
    pub top: f64,
    pub width: f64,
    pub height: f64,
    pub flipped: bool,
}

impl CropBox {
    /// The whole of a `width x height` image, not mirrored.
    pub fn whole(width: u32, height: u32) -> Self {
        Self {
            left: 0.0,
            top: 0.0,
            width: f64::from(width),
            height: f64::from(height),
            flipped: false,
        }
    }
}

/// What the augmentation of one sample is keyed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleKey {
    pub seed: u64,
    pub epoch: u64,
    /// [`sample_identity`] of the sample.
    pub sample: u64,
}

/// A stable 64-bit identity of a sample: FNV-1a over the shard name, a NUL
/// and the key, then MurmurHash3's finalizer. Frozen (a test pins it).
pub fn sample_identity(shard: &str, key: &str) -> u64 {
    let bytes = shard.bytes().chain([0]).chain(key.bytes());
    fmix64(fnv1a(bytes))
}

/// The frozen hashes, where they were first defined (now `crate::hash`).
pub use crate::hash::{fmix64, fnv1a};

/// A request's augmentation could not be used; names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct AugmentError {
    pub field: &'static str,
    pub message: String,
}

fn invalid(field: &'static str, message: String) -> AugmentError {
    AugmentError { field, message }
}

/// Output size, crop kind and flip probability of a stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutputSpec {
    pub height: u32,
    pub width: u32,
    pub crop: Crop,
    /// Probability of mirroring a sample left to right.
    pub flip: f64,
}

impl OutputSpec {
    /// Today's evaluation transform: shorter side scaled to cover, center crop.
    pub fn center(height: u32, width: u32) -> Self {
        Self {
            height,
            width,
            crop: Crop::default(),
            flip: 0.0,
        }
    }

    pub fn bytes(&self) -> usize {
        self.height as usize * self.width as usize * CHANNELS
    }

    /// Whether samples need their [`SampleKey`] (anything random).
    pub fn is_random(&self) -> bool {
        matches!(self.crop, Crop::RandomResized(_)) || self.flip > 0.0
    }

    /// Checks every range, naming the request field that is wrong.
    pub fn validate(&self) -> Result<(), AugmentError> {
        if !(0.0..=1.0).contains(&self.flip) {
            return Err(invalid(
                "augmentation.horizontal_flip",
                format!("must be a probability in [0, 1], not {}", self.flip),
            ));
        }
        match self.crop {
            Crop::Center {
                resize: Some(resize),
            } => {
                let longer = self.height.max(self.width);
                if resize < longer || resize > 8 * MAX_SIZE {
                    return Err(invalid(
                        "augmentation.center_crop.resize",
                        format!(
                            "{resize} must be between the output's longer side ({longer}) and {} \
                             (the shorter source side is scaled to it, then the output is cut \
                             from its center)",
                            8 * MAX_SIZE
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

    /// The source box and flip of one sample of a `width x height` image.
    /// `key` is only read when [`Self::is_random`].
    pub fn crop_box(&self, width: u32, height: u32, key: &SampleKey) -> CropBox {
        let mut rng = Rng::derive(&[key.seed, key.epoch, PURPOSE_AUGMENT, key.sample]);
        let (w, h) = (f64::from(width), f64::from(height));
        let (left, top, box_w, box_h) = match self.crop {
            Crop::Stretch => (0.0, 0.0, w, h),
            Crop::Center { resize } => {
                let (out_w, out_h) = (f64::from(self.width), f64::from(self.height));
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
            Crop::RandomResized(params) => random_resized_box(&params, width, height, &mut rng),
        };
        let flipped = self.flip > 0.0 && uniform(&mut rng) < self.flip;
        CropBox {
            left,
            top,
            width: box_w,
            height: box_h,
            flipped,
        }
    }
}

/// Uniform in `[0, 1)` from the top 53 bits of one draw.
fn uniform(rng: &mut Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

fn uniform_in(rng: &mut Rng, (low, high): (f64, f64)) -> f64 {
    low + (high - low) * uniform(rng)
}

/// torchvision's `RandomResizedCrop.get_params` on integer source pixels.
fn random_resized_box(
    params: &RandomResizedCrop,
    width: u32,
    height: u32,
    rng: &mut Rng,
) -> (f64, f64, f64, f64) {
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

/// Mirrors `out` (one `spec`-sized output) when `crop` says so: the last
/// step of every path that makes an output from a box.
pub fn apply_flip(crop: &CropBox, spec: &OutputSpec, out: &mut [u8]) {
    if crop.flipped {
        flip_rows(&mut out[..spec.bytes()], spec.width);
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

    fn train(height: u32, width: u32) -> OutputSpec {
        OutputSpec {
            height,
            width,
            crop: Crop::RandomResized(RandomResizedCrop::default()),
            flip: 0.5,
        }
    }

    fn key(sample: u64) -> SampleKey {
        SampleKey {
            seed: 7,
            epoch: 0,
            sample,
        }
    }

    #[test]
    fn sample_identity_is_frozen() {
        // Changing these changes every user's augmentation of every sample.
        assert_eq!(
            sample_identity("train-000000.tar", "n01440764_10026"),
            0x2d03_b2cf_00a7_566e
        );
        assert_ne!(
            sample_identity("a", "bc"),
            sample_identity("ab", "c"),
            "the separator keeps shard and key apart"
        );
    }

    #[test]
    fn random_boxes_are_frozen() {
        // Changing these changes every user's training crops: never do it
        // silently.
        let spec = train(224, 224);
        let boxes: Vec<CropBox> = (0..3)
            .map(|i| spec.crop_box(500, 375, &key(sample_identity("s.tar", &i.to_string()))))
            .collect();
        let pinned = [
            (269.0, 165.0, 189.0, 196.0, true),
            (197.0, 41.0, 301.0, 297.0, false),
            (49.0, 25.0, 255.0, 301.0, false),
        ];
        let got: Vec<_> = boxes
            .iter()
            .map(|b| (b.left, b.top, b.width, b.height, b.flipped))
            .collect();
        assert_eq!(got, pinned);
    }

    #[test]
    fn random_boxes_fit_the_image_and_the_ranges() {
        let spec = train(224, 224);
        let mut flips = 0;
        for sample in 0..2000u64 {
            let (width, height) = (
                200 + (sample % 7) as u32 * 150,
                150 + (sample % 5) as u32 * 200,
            );
            let b = spec.crop_box(width, height, &key(sample));
            assert!(b.left >= 0.0 && b.top >= 0.0 && b.width >= 1.0 && b.height >= 1.0);
            assert!(
                b.left + b.width <= f64::from(width),
                "{b:?} in {width}x{height}"
            );
            assert!(
                b.top + b.height <= f64::from(height),
                "{b:?} in {width}x{height}"
            );
            let area = b.width * b.height / (f64::from(width) * f64::from(height));
            assert!(area <= 1.0 + 1e-9);
            flips += usize::from(b.flipped);
        }
        assert!(
            (850..1150).contains(&flips),
            "{flips} of 2000 flipped at p = 0.5"
        );
    }

    #[test]
    fn the_same_key_gives_the_same_box_and_the_next_epoch_another() {
        let spec = train(224, 224);
        let first = spec.crop_box(640, 480, &key(42));
        assert_eq!(first, spec.crop_box(640, 480, &key(42)));
        let changed: usize = (1..20u64)
            .filter(|&epoch| spec.crop_box(640, 480, &SampleKey { epoch, ..key(42) }) != first)
            .count();
        assert_eq!(changed, 19);
    }

    #[test]
    fn impossible_ratios_fall_back_to_a_centered_clamped_box() {
        // A 10:1 strip with ratios up to 4:3: no attempt can fit its area,
        // so the fallback keeps the full height and a 4:3 width.
        let spec = OutputSpec {
            crop: Crop::RandomResized(RandomResizedCrop {
                scale: (1.0, 1.0),
                ratio: (0.75, 4.0 / 3.0),
            }),
            flip: 0.0,
            ..train(224, 224)
        };
        let b = spec.crop_box(1000, 100, &key(1));
        assert_eq!(
            (b.left, b.top, b.width, b.height),
            (433.0, 0.0, 133.0, 100.0)
        );
    }

    #[test]
    fn center_crop_follows_torchvision_resize_then_center_crop() {
        let eval = OutputSpec {
            crop: Crop::Center { resize: Some(256) },
            ..OutputSpec::center(224, 224)
        };
        // 500x375 -> shorter side 256 (scale 256/375); 224 px of it is 328.1 source px.
        let b = eval.crop_box(500, 375, &key(0));
        let side = 224.0 * 375.0 / 256.0;
        assert!((b.width - side).abs() < 1e-9 && (b.height - side).abs() < 1e-9);
        assert!((b.left - (500.0 - side) / 2.0).abs() < 1e-9);
        // Without a resize the box covers the output: the whole shorter side.
        let cover = OutputSpec::center(224, 224).crop_box(500, 375, &key(0));
        assert_eq!(
            (cover.left, cover.top, cover.width, cover.height),
            (62.5, 0.0, 375.0, 375.0)
        );
        assert!(!cover.flipped);
    }

    #[test]
    fn invalid_ranges_name_their_field() {
        let bad = |crop, flip| {
            OutputSpec {
                crop,
                flip,
                ..OutputSpec::center(224, 224)
            }
            .validate()
            .unwrap_err()
            .field
        };
        let rrc = |scale, ratio| Crop::RandomResized(RandomResizedCrop { scale, ratio });
        assert_eq!(bad(Crop::default(), 1.5), "augmentation.horizontal_flip");
        assert_eq!(
            bad(Crop::default(), f64::NAN),
            "augmentation.horizontal_flip"
        );
        assert_eq!(
            bad(rrc((0.0, 1.0), (0.75, 1.33)), 0.0),
            "augmentation.random_resized_crop.scale"
        );
        assert_eq!(
            bad(rrc((0.5, 0.2), (0.75, 1.33)), 0.0),
            "augmentation.random_resized_crop.scale"
        );
        assert_eq!(
            bad(rrc((0.08, 1.0), (2.0, 1.0)), 0.0),
            "augmentation.random_resized_crop.ratio"
        );
        assert_eq!(
            bad(rrc((0.08, f64::NAN), (0.75, 1.33)), 0.0),
            "augmentation.random_resized_crop.scale"
        );
        assert_eq!(
            bad(Crop::Center { resize: Some(100) }, 0.0),
            "augmentation.center_crop.resize"
        );
        assert!(train(224, 224).validate().is_ok());
    }

    #[test]
    fn flip_mirrors_each_row() {
        let mut pixels: Vec<u8> = (0..2 * 3 * 3).map(|v| v as u8).collect();
        flip_rows(&mut pixels, 3);
        assert_eq!(
            pixels,
            [6, 7, 8, 3, 4, 5, 0, 1, 2, 15, 16, 17, 12, 13, 14, 9, 10, 11]
        );
    }
}
