//! GaussianBlur: torchvision's `GaussianBlur(kernel_size, sigma)`, its
//! sigma drawn per sample uniform in the range, applied to a share `p` of
//! the samples (`RandomApply([GaussianBlur(...)], p)`, as DINO, DINOv2 and
//! BYOL write it). The apply-or-not and the sigma draw from keys of their
//! own.

use super::super::kernels::{self, MAX_BLUR_KERNEL};
use super::super::key::{uniform, uniform_in};
use super::super::op::{invalid, AugmentError, DrawAt, Op};
use crate::plan::rng::Rng;

/// The kernel's sides (odd; 0: off), the sigma range and the probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GaussianBlur {
    pub kernel: (u32, u32),
    pub sigma: (f64, f64),
    pub p: f64,
}

impl Default for GaussianBlur {
    fn default() -> Self {
        Self::OFF
    }
}

const APPLY_KEY: &str = "gaussian_blur.p";

impl Op for GaussianBlur {
    /// The sigma a sample was blurred with (None: not blurred).
    type Drawn = Option<f32>;

    const NAME: &'static str = "gaussian_blur";
    const CLIENT_REPLAYS: bool = false;
    const OFF: Self = Self {
        kernel: (0, 0),
        sigma: (0.1, 2.0),
        p: 0.0,
    };

    fn validate(&self) -> Result<(), AugmentError> {
        if !self.is_random() {
            return Ok(());
        }
        let (kx, ky) = self.kernel;
        for side in [kx, ky] {
            if side % 2 == 0 || side > MAX_BLUR_KERNEL {
                return Err(invalid(
                    "augmentation.gaussian_blur.kernel_size",
                    format!(
                        "sides must be odd, 1 to {MAX_BLUR_KERNEL}, not {kx}x{ky} (torchvision's \
                         GaussianBlur takes odd sides)"
                    ),
                ));
            }
        }
        let (low, high) = self.sigma;
        if !(low > 0.0 && low <= high && high.is_finite()) {
            return Err(invalid(
                "augmentation.gaussian_blur.sigma",
                format!("must be a range with 0 < min <= max, not [{low}, {high}]"),
            ));
        }
        if !(0.0..=1.0).contains(&self.p) {
            return Err(invalid(
                "augmentation.gaussian_blur.p",
                format!("must be a probability in [0, 1], not {}", self.p),
            ));
        }
        Ok(())
    }

    fn is_random(&self) -> bool {
        self.p > 0.0 && self.kernel != (0, 0)
    }

    fn draw(&self, _: &mut Rng, at: &DrawAt) -> Option<f32> {
        if !self.is_random() || (self.p < 1.0 && self.p < uniform(&mut at.generator(APPLY_KEY))) {
            return None;
        }
        // torchvision draws sigma in float32 (`torch.empty(1).uniform_`).
        Some(uniform_in(&mut at.generator(Self::NAME), self.sigma) as f32)
    }

    fn apply(&self, drawn: &Option<f32>, width: u32, out: &mut [u8]) {
        if let Some(sigma) = *drawn {
            kernels::gaussian_blur(out, width, self.kernel, sigma);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::op::draw_alone;
    use super::*;
    use crate::decode::augment::wire::OpWire;
    use crate::proto::v1 as pb;

    fn drawn(blur: GaussianBlur, sample: u64) -> Option<f32> {
        draw_alone(&blur, (5, 2, crate::hash::fmix64(sample + 7)), (96, 96))
    }

    #[test]
    fn a_share_p_is_blurred_with_sigmas_in_the_range() {
        let dino = GaussianBlur {
            kernel: (9, 9),
            sigma: (0.1, 2.0),
            p: 0.5,
        };
        let always = GaussianBlur { p: 1.0, ..dino };
        let mut blurred = 0;
        for sample in 0..4000 {
            let sigma = drawn(always, sample).expect("p = 1 blurs every sample");
            assert!((0.1..=2.0).contains(&sigma), "{sigma}");
            if let Some(some) = drawn(dino, sample) {
                assert_eq!(some, sigma, "the apply coin moves no sigma");
                blurred += 1;
            }
        }
        // 99.9% binomial bounds of 0.5 of 4000: 2000 +- 104.
        assert!((1896..=2104).contains(&blurred), "{blurred}");
    }

    #[test]
    fn bad_kernels_and_ranges_name_their_field() {
        let blur = GaussianBlur {
            kernel: (9, 9),
            sigma: (0.1, 2.0),
            p: 1.0,
        };
        assert!(blur.validate().is_ok());
        let field = |b: GaussianBlur| b.validate().unwrap_err().field;
        assert_eq!(
            field(GaussianBlur {
                kernel: (8, 9),
                ..blur
            }),
            "augmentation.gaussian_blur.kernel_size"
        );
        assert_eq!(
            field(GaussianBlur {
                kernel: (129, 129),
                ..blur
            }),
            "augmentation.gaussian_blur.kernel_size"
        );
        assert_eq!(
            field(GaussianBlur {
                sigma: (0.0, 2.0),
                ..blur
            }),
            "augmentation.gaussian_blur.sigma"
        );
        assert_eq!(
            field(GaussianBlur { p: 1.5, ..blur }),
            "augmentation.gaussian_blur.p"
        );
        let mut wire = pb::Augmentation::default();
        GaussianBlur { p: 0.1, ..blur }.to_wire(&mut wire);
        assert_eq!(
            GaussianBlur::from_wire(&wire),
            GaussianBlur { p: 0.1, ..blur }
        );
    }
}
