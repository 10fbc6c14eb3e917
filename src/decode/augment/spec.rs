//! A stream's output: its size, its crop and the ops after it, and what
//! one sample's output came from.
//!
//! A sample's region (its [`CropBox`]) is a pure function of the stream's
//! [`OutputSpec`], the source image's size and a [`SampleKey`]: the seed, the
//! epoch and a hash of the sample's identity (its shard and key). Nothing
//! about the stream that carries it (rank, world size, decode thread, resume
//! point, cache state, retries) enters, so a sample gets the same crop and
//! ops wherever it is decoded, and new ones every epoch.
//!
//! The generator is the plan's SplitMix64 ([`crate::plan::rng::Rng`]),
//! keyed by `[seed, epoch, PURPOSE_AUGMENT, sample]` where `sample` is
//! [`super::key::sample_identity`] of the shard name and key. The crop draws
//! first, then each op of the table in its order. Uniform reals are the top
//! 53 bits of a draw; integers use Lemire's method. Both are frozen: a test
//! pins boxes, so a change cannot alter users' augmentations silently.

use super::crop::Crop;
use super::key::SampleKey;
use super::op::{AugmentError, DrawAt, CHANNELS};
use super::ops::{Drawn, Ops};

/// The output side when a request names none.
pub const DEFAULT_SIZE: u32 = 224;
/// Largest accepted output side; bounds batch buffers.
pub const MAX_SIZE: u32 = 4096;

/// The source rectangle one output came from, in source pixels, and what
/// each op after the crop decided for it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CropBox {
    pub left: f64,
    pub top: f64,
    pub width: f64,
    pub height: f64,
    pub drawn: Drawn,
}

impl CropBox {
    /// The whole of a `width x height` image, no op applied.
    pub fn whole(width: u32, height: u32) -> Self {
        Self {
            left: 0.0,
            top: 0.0,
            width: f64::from(width),
            height: f64::from(height),
            drawn: Drawn::default(),
        }
    }
}

/// How the crop's box is resized to the output: antialiased convolution,
/// as torchvision's uint8 resize and PIL's (the filter widens with the
/// downscale ratio).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Resample {
    /// The triangle filter: torchvision's and PIL's BILINEAR.
    #[default]
    Bilinear,
    /// Keys' cubic with a = -0.5 (PIL's BICUBIC, and torchvision's on uint8).
    Bicubic,
}

impl Resample {
    /// fast_image_resize's filter of the same kernel (its CatmullRom is
    /// Keys' cubic with a = -0.5).
    pub fn filter(self) -> fast_image_resize::FilterType {
        match self {
            Resample::Bilinear => fast_image_resize::FilterType::Bilinear,
            Resample::Bicubic => fast_image_resize::FilterType::CatmullRom,
        }
    }

    /// The filter's support in output pixels: how far around the box a
    /// resize reads, per output pixel's worth of source.
    pub fn support(self) -> f64 {
        match self {
            Resample::Bilinear => 1.0,
            Resample::Bicubic => 2.0,
        }
    }

    /// The name a client's `client_ops` uses to say its resize does this.
    pub fn client_op(self) -> Option<&'static str> {
        match self {
            Resample::Bilinear => None,
            Resample::Bicubic => Some("resize_bicubic"),
        }
    }
}

/// Output size, crop and the ops after it, of a stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutputSpec {
    pub height: u32,
    pub width: u32,
    pub crop: Crop,
    pub resample: Resample,
    pub ops: Ops,
}

impl OutputSpec {
    /// Today's evaluation transform: shorter side scaled to cover, center crop.
    pub fn center(height: u32, width: u32) -> Self {
        Self {
            height,
            width,
            crop: Crop::default(),
            resample: Resample::Bilinear,
            ops: Ops::default(),
        }
    }

    /// Whether a client that decodes, its resize and ops named in
    /// `client_ops`, makes this stream's pixels (else the server decodes
    /// all of its samples).
    pub fn client_replays(&self, client_ops: &[String]) -> bool {
        let resizes = self
            .resample
            .client_op()
            .is_none_or(|name| client_ops.iter().any(|op| op == name));
        resizes && self.ops.client_replays(client_ops)
    }

    pub fn bytes(&self) -> usize {
        self.height as usize * self.width as usize * CHANNELS
    }

    /// Whether samples need their [`SampleKey`] (anything random).
    pub fn is_random(&self) -> bool {
        self.crop.is_random() || self.ops.is_random()
    }

    /// Whether a sample's own decisions make it the server's to decode when
    /// delivered encoded: another decoder's pixels differ from the
    /// server's by about a level, which an op with a threshold (Solarize,
    /// Posterize, Equalize: [`super::PolicyOp::amplifies_level_differences`];
    /// RandomSolarize at a threshold other than 128:
    /// [`super::Solarize::amplifies_level_differences`]) can turn into up
    /// to 255, past the stated tolerance. A function of the sample alone
    /// (each op draws from its own key), so which side decodes it stays
    /// the same at any world size and resume point.
    pub fn decoded_by_server_alone(&self, key: &SampleKey) -> bool {
        use super::op::Op;
        let at = DrawAt {
            key,
            width: self.width,
            height: self.height,
        };
        let solarize = &self.ops.solarize;
        if solarize.kernel.amplifies_level_differences() && solarize.draw(&mut key.generator(), &at)
        {
            return true;
        }
        let policy = &self.ops.auto_augment;
        if !policy.is_random() {
            return false;
        }
        policy
            .draw(&mut key.generator(), &at)
            .steps()
            .iter()
            .any(|step| step.op.amplifies_level_differences())
    }

    /// Checks every range, naming the request field that is wrong.
    pub fn validate(&self) -> Result<(), AugmentError> {
        self.ops.validate()?;
        self.crop.validate(self.height, self.width, MAX_SIZE)
    }

    /// The source box and each op's decision for one sample of a
    /// `width x height` image. `key` is only read when [`Self::is_random`].
    pub fn crop_box(&self, width: u32, height: u32, key: &SampleKey) -> CropBox {
        let mut rng = key.generator();
        let (left, top, box_width, box_height) =
            self.crop
                .source_box((width, height), (self.width, self.height), &mut rng);
        let at = DrawAt {
            key,
            width: self.width,
            height: self.height,
        };
        CropBox {
            left,
            top,
            width: box_width,
            height: box_height,
            drawn: self.ops.draw(&mut rng, &at),
        }
    }

    /// The last step of every path that makes an output from a box: each
    /// op's decision applied to `out` (one `self`-sized output).
    pub fn finish(&self, crop: &CropBox, out: &mut [u8]) {
        self.ops
            .apply(&crop.drawn, self.width, &mut out[..self.bytes()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::augment::{sample_identity, Drawn, HorizontalFlip, RandomResizedCrop};
    use crate::proto::v1 as pb;

    fn train(height: u32, width: u32) -> OutputSpec {
        OutputSpec {
            height,
            width,
            crop: Crop::RandomResized(RandomResizedCrop::default()),
            resample: Resample::Bilinear,
            ops: Ops::default().with(HorizontalFlip(0.5)),
        }
    }

    fn key(sample: u64) -> SampleKey {
        SampleKey {
            seed: 7,
            epoch: 0,
            sample,
            copy: 0,
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
            .map(|b| (b.left, b.top, b.width, b.height, b.drawn.horizontal_flip))
            .collect();
        assert_eq!(got, pinned);
    }

    #[test]
    fn each_op_draws_from_its_own_key_and_the_crop_never_moves() {
        use crate::decode::augment::{
            AutoAugment, ColorJitter, EraseValue, Grayscale, Kernel, Policy, RandomErasing,
        };
        let policy = AutoAugment {
            policy: Policy::TrivialAugmentWide { bins: 31 },
            ..AutoAugment::default()
        };
        let plain = train(224, 224);
        let with_policy = OutputSpec {
            ops: plain.ops.with(policy),
            ..plain
        };
        let with_all = OutputSpec {
            ops: with_policy
                .ops
                .with(ColorJitter::symmetric(0.4, 0.4, 0.4, 0.1))
                .with(Grayscale.coin(0.5))
                .with(RandomErasing::new(
                    0.5,
                    EraseValue::Random,
                    [0.5; 3],
                    [0.25; 3],
                )),
            ..plain
        };
        let without_flip = OutputSpec {
            ops: Ops::NONE.with(policy),
            ..plain
        };
        for sample in 0..200u64 {
            let k = key(sample_identity("s.tar", &sample.to_string()));
            let base = plain.crop_box(500, 375, &k);
            let one = with_policy.crop_box(500, 375, &k);
            let all = with_all.crop_box(500, 375, &k);
            let bare = without_flip.crop_box(500, 375, &k);
            for other in [one, all, bare] {
                assert_eq!(
                    (other.left, other.top, other.width, other.height),
                    (base.left, base.top, base.width, base.height)
                );
            }
            assert_eq!(one.drawn.horizontal_flip, base.drawn.horizontal_flip);
            assert_eq!(all.drawn.horizontal_flip, base.drawn.horizontal_flip);
            assert_eq!(one.drawn.auto_augment, all.drawn.auto_augment);
            assert_eq!(bare.drawn.auto_augment, one.drawn.auto_augment);
        }
    }

    #[test]
    fn threshold_ops_leave_their_samples_to_the_server() {
        use crate::decode::augment::{AutoAugment, Policy};
        let wide = OutputSpec {
            ops: train(224, 224).ops.with(AutoAugment {
                policy: Policy::TrivialAugmentWide { bins: 31 },
                ..AutoAugment::default()
            }),
            ..train(224, 224)
        };
        let samples = 2000u64;
        let mut by_server = 0;
        for sample in 0..samples {
            let k = key(sample_identity("s.tar", &sample.to_string()));
            let drawn = wide.crop_box(500, 375, &k).drawn.auto_augment;
            let threshold = drawn
                .steps()
                .iter()
                .any(|s| s.op.amplifies_level_differences());
            assert_eq!(wide.decoded_by_server_alone(&k), threshold);
            by_server += usize::from(threshold);
            assert!(!train(224, 224).decoded_by_server_alone(&k));
        }
        // 3 of TrivialAugmentWide's 14 ops: 429 of 2000 +- 61 (99.9%).
        assert!((368..=490).contains(&by_server), "{by_server}");
    }

    /// RandomSolarize leaves a sample it solarized to the server unless
    /// its threshold keeps levels a level apart (128: 127 and 128 both
    /// give 127); the samples it skipped stay the client's.
    #[test]
    fn a_solarize_that_jumps_leaves_its_samples_to_the_server() {
        use crate::decode::augment::ops::RandomSolarize;
        use crate::decode::augment::Solarize;
        let with = |threshold: f64| OutputSpec {
            ops: train(224, 224).ops.with(RandomSolarize {
                kernel: Solarize { threshold },
                p: 0.3,
            }),
            ..train(224, 224)
        };
        for (threshold, jumps) in [
            (128.0, false),
            (127.5, false),
            (0.0, false),
            (127.0, true),
            (128.5, true),
            (200.0, true),
            (255.0, true),
        ] {
            assert_eq!(
                Solarize { threshold }.amplifies_level_differences(),
                jumps,
                "{threshold}"
            );
            let spec = with(threshold);
            let mut by_server = 0;
            for sample in 0..2000u64 {
                let k = key(sample_identity("s.tar", &sample.to_string()));
                let solarized = spec.crop_box(500, 375, &k).drawn.solarize;
                assert_eq!(spec.decoded_by_server_alone(&k), jumps && solarized);
                by_server += usize::from(solarized);
            }
            // p 0.3: 600 of 2000 +- 67 (99.9%).
            assert!((533..=667).contains(&by_server), "{by_server}");
        }
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
            flips += usize::from(b.drawn.horizontal_flip);
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
            ops: Ops::default(),
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
        assert!(!cover.drawn.horizontal_flip);
    }

    #[test]
    fn invalid_ranges_name_their_field() {
        let bad = |crop, flip| {
            OutputSpec {
                crop,
                ops: Ops::default().with(HorizontalFlip(flip)),
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
    fn every_spec_survives_the_wire() {
        for crop in [
            Crop::Center { resize: None },
            Crop::Center { resize: Some(256) },
            Crop::Stretch,
            Crop::RandomResized(RandomResizedCrop::default()),
        ] {
            let spec = OutputSpec {
                crop,
                ..train(224, 200)
            };
            for resample in [Resample::Bilinear, Resample::Bicubic] {
                let spec = OutputSpec { resample, ..spec };
                let wire = spec.augmentation_to_wire();
                let crop = Crop::from_wire(&wire).unwrap();
                assert_eq!(OutputSpec::from_wire(224, 200, crop, &wire).unwrap(), spec);
            }
        }
        let mut nearest = pb::Augmentation {
            resize_interpolation: Some(pb::Interpolation::Nearest as i32),
            ..Default::default()
        };
        let refused = OutputSpec::from_wire(224, 224, Crop::Stretch, &nearest).unwrap_err();
        assert_eq!(refused.field, "augmentation.resize_interpolation");
        nearest.resize_interpolation = None;
        let unset = OutputSpec::from_wire(224, 224, Crop::Stretch, &nearest).unwrap();
        assert_eq!(unset.resample, Resample::Bilinear);
        let crop = CropBox {
            left: 1.5,
            top: 2.0,
            width: 30.0,
            height: 40.0,
            drawn: Drawn {
                horizontal_flip: true,
                ..Drawn::default()
            },
        };
        assert_eq!(CropBox::from_wire(&crop.to_wire()), crop);
    }
}
