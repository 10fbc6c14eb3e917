//! The ops whose one draw is whether they run: torchvision's single-op
//! transforms with a `p` (`_RandomApplyTransform`: RandomGrayscale,
//! RandomSolarize, RandomVerticalFlip, RandomAdjustSharpness,
//! RandomPosterize, RandomEqualize, RandomAutocontrast, RandomInvert).
//!
//! The coin (its probability checked, drawn from the op's own key, the
//! decision on the wire) is written once, in [`Coin`]; each op is a
//! [`Kernel`]: what it does to a sample that drew it, its fixed parameters
//! and its fields. A new one is a `Kernel` here and a row in the table.

use super::super::kernels;
use super::super::key::uniform;
use super::super::op::{invalid, AugmentError, DrawAt, Op};
use crate::plan::rng::Rng;

/// What a coin op does when its coin comes up, and where it is on the wire.
pub trait Kernel: Copy + PartialEq + std::fmt::Debug {
    /// The op's name and key (see [`Op::NAME`]: never rename one).
    const NAME: &'static str;
    /// The request field that holds the probability.
    const P_FIELD: &'static str;
    /// The parameters a request that leaves them out gets.
    const DEFAULT: Self;

    /// Checks the fixed parameters, naming the field.
    fn validate(&self) -> Result<(), AugmentError> {
        Ok(())
    }

    /// Runs on one output of `width` RGB pixels per row.
    fn run(&self, width: u32, out: &mut [u8]);

    /// This op run on a share `p` of the samples.
    fn coin(self, p: f64) -> Coin<Self> {
        Coin { kernel: self, p }
    }
}

/// A [`Kernel`] run on a share `p` of the samples, in `[0, 1]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Coin<K> {
    pub kernel: K,
    pub p: f64,
}

impl<K: Kernel> Default for Coin<K> {
    fn default() -> Self {
        Self::OFF
    }
}

impl<K: Kernel> Op for Coin<K> {
    /// Whether the op ran on the sample.
    type Drawn = bool;

    const NAME: &'static str = K::NAME;
    const CLIENT_REPLAYS: bool = false;
    const OFF: Self = Self {
        kernel: K::DEFAULT,
        p: 0.0,
    };

    fn validate(&self) -> Result<(), AugmentError> {
        if !(0.0..=1.0).contains(&self.p) {
            return Err(invalid(
                K::P_FIELD,
                format!("must be a probability in [0, 1], not {}", self.p),
            ));
        }
        self.kernel.validate()
    }

    fn is_random(&self) -> bool {
        self.p > 0.0
    }

    fn draw(&self, _: &mut Rng, at: &DrawAt) -> bool {
        // torchvision's `_RandomApplyTransform`: skipped when rand >= p.
        self.is_random() && uniform(&mut at.generator(Self::NAME)) < self.p
    }

    fn apply(&self, &ran: &bool, width: u32, out: &mut [u8]) {
        if ran {
            self.kernel.run(width, out);
        }
    }
}

/// Kernels without parameters, their probability a `double` field of the
/// request and their decision a `bool` of the `CropBox`.
macro_rules! plain_kernels {
    ($($(#[doc = $doc:literal])* $kernel:ident: $name:literal, $field:ident,
       |$width:ident, $out:ident| $run:expr;)+) => {$(
        $(#[doc = $doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub struct $kernel;

        impl Kernel for $kernel {
            const NAME: &'static str = $name;
            const P_FIELD: &'static str = concat!("augmentation.", stringify!($field));
            const DEFAULT: Self = Self;

            fn run(&self, $width: u32, $out: &mut [u8]) {
                $run
            }
        }
    )+};
}

plain_kernels! {
    /// RandomGrayscale: the luma in all three channels.
    Grayscale: "grayscale", grayscale, |_width, out| kernels::grayscale(out);
    /// RandomVerticalFlip: mirrored top to bottom.
    VerticalFlip: "vertical_flip", vertical_flip,
        |width, out| kernels::vertical_flip(out, width);
    /// RandomEqualize: each channel's histogram equalized.
    Equalize: "equalize", equalize, |_width, out| kernels::equalize(out);
    /// RandomAutocontrast: each channel stretched to 0..255.
    Autocontrast: "autocontrast", autocontrast,
        |_width, out| kernels::autocontrast(out);
    /// RandomInvert: `255 - x`.
    Invert: "invert", invert, |_width, out| kernels::invert(out);
}

/// RandomSolarize: every value at or above the threshold (in levels,
/// 0 to 255) inverted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Solarize {
    pub threshold: f64,
}

impl Kernel for Solarize {
    const NAME: &'static str = "solarize";
    const P_FIELD: &'static str = "augmentation.solarize.p";
    const DEFAULT: Self = Self { threshold: 128.0 };

    fn validate(&self) -> Result<(), AugmentError> {
        // torchvision refuses a threshold above the dtype's maximum.
        if !(0.0..=255.0).contains(&self.threshold) {
            return Err(invalid(
                "augmentation.solarize.threshold",
                format!("must be in [0, 255] (uint8 levels), not {}", self.threshold),
            ));
        }
        Ok(())
    }

    fn run(&self, _: u32, out: &mut [u8]) {
        kernels::solarize(out, self.threshold);
    }
}

impl Solarize {
    /// Whether two inputs a level apart can come out more than a level
    /// apart: the levels from `ceil(threshold)` up are inverted, so the
    /// pair straddling it lands `|256 - 2 ceil(threshold)|` apart, which is
    /// 0 only at 128 (the recipes' threshold) and when nothing or
    /// everything is inverted.
    pub fn amplifies_level_differences(&self) -> bool {
        let first_inverted = self.threshold.ceil();
        first_inverted > 0.0 && first_inverted != 128.0
    }
}

/// RandomAdjustSharpness: torchvision's `adjust_sharpness(factor)`, a
/// blend with the 3x3 smoothed sample (0 smooths, 1 leaves, 2 sharpens).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sharpness {
    pub factor: f64,
}

impl Kernel for Sharpness {
    const NAME: &'static str = "sharpness";
    const P_FIELD: &'static str = "augmentation.sharpness.p";
    const DEFAULT: Self = Self { factor: 1.0 };

    fn validate(&self) -> Result<(), AugmentError> {
        // torchvision refuses a negative factor; a huge one saturates
        // every value, which f32 still computes.
        if !(self.factor >= 0.0 && self.factor <= f64::from(f32::MAX)) {
            return Err(invalid(
                "augmentation.sharpness.sharpness_factor",
                format!("must be a finite number >= 0, not {}", self.factor),
            ));
        }
        Ok(())
    }

    fn run(&self, width: u32, out: &mut [u8]) {
        // torchvision blends float32 tensors by a Python float: the
        // factor enters the arithmetic as float32.
        kernels::adjust_sharpness(out, width, self.factor as f32);
    }
}

/// RandomPosterize: the top `bits` bits of each value kept (0 to 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Posterize {
    pub bits: u32,
}

impl Kernel for Posterize {
    const NAME: &'static str = "posterize";
    const P_FIELD: &'static str = "augmentation.posterize.p";
    const DEFAULT: Self = Self { bits: 8 };

    fn validate(&self) -> Result<(), AugmentError> {
        if self.bits > 8 {
            return Err(invalid(
                "augmentation.posterize.bits",
                format!(
                    "must be 0 to 8 (the bits of a uint8 level), not {}",
                    self.bits
                ),
            ));
        }
        Ok(())
    }

    fn run(&self, _: u32, out: &mut [u8]) {
        kernels::posterize(out, self.bits as u8);
    }
}

/// The table's coin ops by their torchvision names.
pub type RandomGrayscale = Coin<Grayscale>;
pub type RandomSolarize = Coin<Solarize>;
pub type RandomVerticalFlip = Coin<VerticalFlip>;
pub type RandomAdjustSharpness = Coin<Sharpness>;
pub type RandomPosterize = Coin<Posterize>;
pub type RandomEqualize = Coin<Equalize>;
pub type RandomAutocontrast = Coin<Autocontrast>;
pub type RandomInvert = Coin<Invert>;

#[cfg(test)]
mod tests {
    use super::super::super::op::draw_alone;
    use super::*;
    use crate::decode::augment::wire::{KernelWire, OpWire};
    use crate::proto::v1 as pb;

    fn round_trip<K: Kernel + KernelWire>(op: Coin<K>) {
        assert!(op.validate().is_ok(), "{op:?}");
        let mut wire = pb::Augmentation::default();
        op.to_wire(&mut wire);
        assert_eq!(Coin::<K>::from_wire(&wire), op);
        let mut crop = pb::CropBox::default();
        Coin::<K>::drawn_to_wire(true, &mut crop);
        assert!(Coin::<K>::drawn_from_wire(&crop));
        // Off is what a request that names nothing gets.
        assert_eq!(
            Coin::<K>::from_wire(&pb::Augmentation::default()),
            Coin::<K>::OFF
        );
    }

    #[test]
    fn each_op_survives_the_wire() {
        round_trip(Grayscale.coin(0.2));
        round_trip(Solarize { threshold: 128.0 }.coin(0.2));
        round_trip(VerticalFlip.coin(0.5));
        round_trip(Sharpness { factor: 2.0 }.coin(0.5));
        round_trip(Posterize { bits: 4 }.coin(0.5));
        round_trip(Equalize.coin(0.5));
        round_trip(Autocontrast.coin(0.5));
        round_trip(Invert.coin(1.0));
    }

    #[test]
    fn bad_parameters_name_their_fields() {
        let field = |error: Result<(), AugmentError>| error.unwrap_err().field;
        assert_eq!(
            field(Grayscale.coin(1.5).validate()),
            "augmentation.grayscale"
        );
        assert_eq!(
            field(VerticalFlip.coin(f64::NAN).validate()),
            "augmentation.vertical_flip"
        );
        assert_eq!(
            field(Solarize { threshold: 256.0 }.coin(0.2).validate()),
            "augmentation.solarize.threshold"
        );
        assert_eq!(
            field(Solarize { threshold: 128.0 }.coin(-0.1).validate()),
            "augmentation.solarize.p"
        );
        assert_eq!(
            field(Posterize { bits: 9 }.coin(0.5).validate()),
            "augmentation.posterize.bits"
        );
        assert_eq!(
            field(Sharpness { factor: -1.0 }.coin(0.5).validate()),
            "augmentation.sharpness.sharpness_factor"
        );
        assert_eq!(
            field(
                Sharpness {
                    factor: f64::INFINITY
                }
                .coin(0.5)
                .validate()
            ),
            "augmentation.sharpness.sharpness_factor"
        );
    }

    /// Each op's coin comes up on its share of the samples, from a key of
    /// its own: two ops at the same p do not agree sample for sample.
    #[test]
    fn each_coin_lands_on_its_share_and_its_own_samples() {
        let drawn = |op: &dyn Fn(u64) -> bool| (0..4000u64).map(op).collect::<Vec<bool>>();
        let invert = drawn(&|s| draw_alone(&Invert.coin(0.3), (7, 1, s), (32, 32)));
        let equalize = drawn(&|s| draw_alone(&Equalize.coin(0.3), (7, 1, s), (32, 32)));
        let count = |v: &[bool]| v.iter().filter(|&&b| b).count();
        // 1200 +- 4 standard deviations (29).
        for share in [count(&invert), count(&equalize)] {
            assert!((1084..=1316).contains(&share), "{share}");
        }
        let both = invert
            .iter()
            .zip(&equalize)
            .filter(|(a, b)| **a && **b)
            .count();
        // Independent: about 0.09 of 4000 (360 +- 4 sd of 18).
        assert!((288..=432).contains(&both), "{both}");
        assert!(!draw_alone(&Invert.coin(0.0), (7, 1, 3), (32, 32)));
        assert!(draw_alone(&Invert.coin(1.0), (7, 1, 3), (32, 32)));
    }

    #[test]
    fn a_sample_that_did_not_draw_the_op_is_left_alone() {
        let mut pixels: Vec<u8> = (0..4 * 4 * 3).map(|v| v as u8 * 5).collect();
        let before = pixels.clone();
        Invert.coin(0.5).apply(&false, 4, &mut pixels);
        assert_eq!(pixels, before);
        Invert.coin(0.5).apply(&true, 4, &mut pixels);
        assert!(pixels.iter().zip(&before).all(|(a, b)| *a == 255 - *b));
    }
}
