//! The auto-augment policies over torchvision's magnitude tables:
//! TrivialAugmentWide, RandAugment and AutoAugment (ImageNet), each
//! sample's ops and magnitudes drawn for it alone (torchvision draws one
//! for a whole batch).
//!
//! The tables are torchvision v2's (`transforms/v2/_auto_augment.py`),
//! computed as it computes them: `torch.linspace` in float32 (the first
//! half from the start, the second from the end) and posterize's bits
//! rounded half to even. A draw picks the op, then the bin, then the sign
//! (signed ops only, negative with probability 1/2), as torchvision does.

use super::super::kernels::{self, Interpolation, Sampling};
use super::super::key::uniform;
use super::super::op::{invalid, AugmentError, DrawAt, Op};
use crate::plan::rng::Rng;

/// Most ops one sample goes through (RandAugment's `num_ops`): bounds the
/// decisions a sample carries.
pub const MAX_POLICY_OPS: usize = 8;
const MAX_BINS: u32 = 1024;
pub const DEFAULT_BINS: u32 = 31;

/// An op of the policies, with torchvision's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PolicyOp {
    #[default]
    Identity,
    ShearX,
    ShearY,
    TranslateX,
    TranslateY,
    Rotate,
    Brightness,
    Color,
    Contrast,
    Sharpness,
    Posterize,
    Solarize,
    AutoContrast,
    Equalize,
    Invert,
}

use PolicyOp::*;

impl PolicyOp {
    /// An op whose output jumps where its input crosses a level (a
    /// threshold, a bit, a histogram bin): a one-level difference between
    /// two decoders of the same JPEG can become up to 255 levels after it.
    pub fn amplifies_level_differences(self) -> bool {
        matches!(self, Posterize | Solarize | Equalize)
    }
}

/// TrivialAugmentWide's and RandAugment's op set, in torchvision's order.
const WIDE_OPS: [PolicyOp; 14] = [
    Identity,
    ShearX,
    ShearY,
    TranslateX,
    TranslateY,
    Rotate,
    Brightness,
    Color,
    Contrast,
    Sharpness,
    Posterize,
    Solarize,
    AutoContrast,
    Equalize,
];

/// AutoAugment's ImageNet policy: 25 sub-policies of two (op, probability,
/// bin of 10) each.
type SubPolicy = [(PolicyOp, f32, u32); 2];
const IMAGENET: [SubPolicy; 25] = [
    [(Posterize, 0.4, 8), (Rotate, 0.6, 9)],
    [(Solarize, 0.6, 5), (AutoContrast, 0.6, 0)],
    [(Equalize, 0.8, 0), (Equalize, 0.6, 0)],
    [(Posterize, 0.6, 7), (Posterize, 0.6, 6)],
    [(Equalize, 0.4, 0), (Solarize, 0.2, 4)],
    [(Equalize, 0.4, 0), (Rotate, 0.8, 8)],
    [(Solarize, 0.6, 3), (Equalize, 0.6, 0)],
    [(Posterize, 0.8, 5), (Equalize, 1.0, 0)],
    [(Rotate, 0.2, 3), (Solarize, 0.6, 8)],
    [(Equalize, 0.6, 0), (Posterize, 0.4, 6)],
    [(Rotate, 0.8, 8), (Color, 0.4, 0)],
    [(Rotate, 0.4, 9), (Equalize, 0.6, 0)],
    [(Equalize, 0.0, 0), (Equalize, 0.8, 0)],
    [(Invert, 0.6, 0), (Equalize, 1.0, 0)],
    [(Color, 0.6, 4), (Contrast, 1.0, 8)],
    [(Rotate, 0.8, 8), (Color, 1.0, 2)],
    [(Color, 0.8, 8), (Solarize, 0.8, 7)],
    [(Sharpness, 0.4, 7), (Invert, 0.6, 0)],
    [(ShearX, 0.6, 5), (Equalize, 1.0, 0)],
    [(Color, 0.4, 0), (Equalize, 0.6, 0)],
    [(Equalize, 0.4, 0), (Solarize, 0.2, 4)],
    [(Solarize, 0.6, 5), (AutoContrast, 0.6, 0)],
    [(Invert, 0.6, 0), (Equalize, 1.0, 0)],
    [(Color, 0.6, 4), (Contrast, 1.0, 8)],
    [(Equalize, 0.8, 0), (Equalize, 0.6, 0)],
];
const IMAGENET_BINS: u32 = 10;

/// Which magnitude table: TrivialAugmentWide's, or the one RandAugment and
/// AutoAugment share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Table {
    Wide,
    Standard,
}

/// A policy and its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    #[default]
    Off,
    TrivialAugmentWide {
        bins: u32,
    },
    RandAugment {
        num_ops: u32,
        magnitude: u32,
        bins: u32,
    },
    AutoAugmentImageNet,
}

/// A policy with how its geometric ops sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoAugment {
    pub policy: Policy,
    /// None: an interpolation the wire named that this server does not know.
    pub interpolation: Option<Interpolation>,
    /// The wire's fill levels as sent (checked by `validate`).
    pub fill: Fill,
}

/// A fill colour as a request sends it: none, or up to three levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fill {
    pub levels: [u32; 3],
    pub count: usize,
}

impl Fill {
    pub fn colour(colour: [u8; 3]) -> Self {
        Self {
            levels: colour.map(u32::from),
            count: 3,
        }
    }

    /// The levels as the wire sends them.
    pub fn from_levels(levels: &[u32]) -> Self {
        let mut fill = Self {
            levels: [0; 3],
            count: levels.len(),
        };
        for (slot, &level) in fill.levels.iter_mut().zip(levels) {
            *slot = level;
        }
        fill
    }

    pub fn to_levels(self) -> Vec<u32> {
        self.levels[..self.count.min(3)].to_vec()
    }

    /// Checks the levels sent, naming `field`.
    pub(super) fn validate(&self, field: &'static str) -> Result<(), AugmentError> {
        if !(self.count == 0 || self.count == 3) || self.levels.iter().any(|&l| l > 255) {
            return Err(invalid(
                field,
                format!(
                    "must be empty or three levels in 0..=255, not {:?}",
                    &self.levels[..self.count.min(3)]
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn get(&self) -> Option<[u8; 3]> {
        (self.count == 3).then(|| self.levels.map(|level| level.min(255) as u8))
    }
}

/// One op a policy applied, with its signed magnitude (see the proto's
/// `PolicyStep`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PolicyStep {
    pub op: PolicyOp,
    pub magnitude: f32,
}

/// A sample's policy ops in the order applied.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PolicyDrawn {
    pub steps: [PolicyStep; MAX_POLICY_OPS],
    pub len: u8,
}

impl PolicyDrawn {
    pub fn steps(&self) -> &[PolicyStep] {
        &self.steps[..usize::from(self.len)]
    }

    pub fn push(&mut self, step: PolicyStep) {
        if let Some(slot) = self.steps.get_mut(usize::from(self.len)) {
            *slot = step;
            self.len += 1;
        }
    }
}

impl AutoAugment {
    /// This policy writing `colour` where a geometric op's source is
    /// outside the image.
    pub fn with_fill(self, colour: [u8; 3]) -> Self {
        Self {
            fill: Fill::colour(colour),
            ..self
        }
    }

    fn sampling(&self) -> Sampling {
        Sampling {
            interpolation: self.interpolation.unwrap_or_default(),
            fill: self.fill.get(),
        }
    }
}

impl Default for AutoAugment {
    fn default() -> Self {
        Self::OFF
    }
}

impl Op for AutoAugment {
    type Drawn = PolicyDrawn;

    const NAME: &'static str = "auto_augment";
    const CLIENT_REPLAYS: bool = false;
    const OFF: Self = Self {
        policy: Policy::Off,
        interpolation: Some(Interpolation::Nearest),
        fill: Fill {
            levels: [0; 3],
            count: 0,
        },
    };

    fn validate(&self) -> Result<(), AugmentError> {
        let bins_ok = |bins: u32| (2..=MAX_BINS).contains(&bins);
        match self.policy {
            Policy::Off | Policy::AutoAugmentImageNet => {}
            Policy::TrivialAugmentWide { bins } => {
                if !bins_ok(bins) {
                    return Err(invalid(
                        "augmentation.auto_augment.trivial_augment_wide.num_magnitude_bins",
                        format!("must be in 2..={MAX_BINS}, not {bins}"),
                    ));
                }
            }
            Policy::RandAugment {
                num_ops,
                magnitude,
                bins,
            } => {
                if !bins_ok(bins) {
                    return Err(invalid(
                        "augmentation.auto_augment.rand_augment.num_magnitude_bins",
                        format!("must be in 2..={MAX_BINS}, not {bins}"),
                    ));
                }
                if magnitude >= bins {
                    return Err(invalid(
                        "augmentation.auto_augment.rand_augment.magnitude",
                        format!("must be below num_magnitude_bins ({bins}), not {magnitude}"),
                    ));
                }
                if !(1..=MAX_POLICY_OPS as u32).contains(&num_ops) {
                    return Err(invalid(
                        "augmentation.auto_augment.rand_augment.num_ops",
                        format!("must be in 1..={MAX_POLICY_OPS}, not {num_ops}"),
                    ));
                }
            }
        }
        if self.interpolation.is_none() {
            return Err(invalid(
                "augmentation.auto_augment.interpolation",
                "must be INTERPOLATION_NEAREST or INTERPOLATION_BILINEAR".into(),
            ));
        }
        self.fill.validate("augmentation.auto_augment.fill")
    }

    fn is_random(&self) -> bool {
        self.policy != Policy::Off
    }

    fn draw(&self, _: &mut Rng, at: &DrawAt) -> PolicyDrawn {
        let mut drawn = PolicyDrawn::default();
        if !self.is_random() {
            return drawn;
        }
        let mut rng = at.generator(Self::NAME);
        let size = (at.width, at.height);
        match self.policy {
            Policy::Off => {}
            Policy::TrivialAugmentWide { bins } => {
                let op = WIDE_OPS[rng.below(WIDE_OPS.len() as u64) as usize];
                let bin = rng.below(u64::from(bins)) as u32;
                drawn.push(step(op, Table::Wide, bins, bin, size, &mut rng));
            }
            Policy::RandAugment {
                num_ops,
                magnitude,
                bins,
            } => {
                for _ in 0..num_ops {
                    let op = WIDE_OPS[rng.below(WIDE_OPS.len() as u64) as usize];
                    drawn.push(step(op, Table::Standard, bins, magnitude, size, &mut rng));
                }
            }
            Policy::AutoAugmentImageNet => {
                let sub = IMAGENET[rng.below(IMAGENET.len() as u64) as usize];
                for (op, probability, bin) in sub {
                    // torchvision: `if not torch.rand(()) <= probability`.
                    if uniform(&mut rng) as f32 > probability {
                        continue;
                    }
                    drawn.push(step(
                        op,
                        Table::Standard,
                        IMAGENET_BINS,
                        bin,
                        size,
                        &mut rng,
                    ));
                }
            }
        }
        drawn
    }

    fn apply(&self, drawn: &PolicyDrawn, width: u32, out: &mut [u8]) {
        for step in drawn.steps() {
            apply_step(*step, self.sampling(), width, out);
        }
    }
}

/// One op's magnitude from its table (None for ops without one), then its
/// sign, as torchvision draws them.
fn step(
    op: PolicyOp,
    table: Table,
    bins: u32,
    bin: u32,
    (width, height): (u32, u32),
    rng: &mut Rng,
) -> PolicyStep {
    let Some((magnitude, signed)) = magnitude(op, table, bins, bin, width, height) else {
        return PolicyStep { op, magnitude: 0.0 };
    };
    // torchvision: `if signed and torch.rand(()) <= 0.5: magnitude *= -1`.
    let negative = signed && uniform(rng) <= 0.5;
    PolicyStep {
        op,
        magnitude: if negative { -magnitude } else { magnitude },
    }
}

/// `torch.linspace(start, end, steps)[index]` as PyTorch's CPU kernel
/// computes it in float32.
fn linspace(start: f32, end: f32, steps: u32, index: u32) -> f32 {
    if steps <= 1 {
        return start;
    }
    let step = (end - start) / (steps - 1) as f32;
    if index < steps / 2 {
        start + step * index as f32
    } else {
        end - step * (steps - index - 1) as f32
    }
}

/// The op's table entry at `bin` of `bins` and whether it is signed.
fn magnitude(
    op: PolicyOp,
    table: Table,
    bins: u32,
    bin: u32,
    width: u32,
    height: u32,
) -> Option<(f32, bool)> {
    let wide = table == Table::Wide;
    let line = |end: f64| linspace(0.0, end as f32, bins, bin);
    Some(match op {
        Identity | AutoContrast | Equalize | Invert => return None,
        ShearX | ShearY => (line(if wide { 0.99 } else { 0.3 }), true),
        TranslateX | TranslateY => {
            let side = if op == TranslateX { width } else { height };
            let end = if wide {
                32.0
            } else {
                150.0 / 331.0 * f64::from(side)
            };
            (line(end), true)
        }
        Rotate => (line(if wide { 135.0 } else { 30.0 }), true),
        Brightness | Color | Contrast | Sharpness => (line(if wide { 0.99 } else { 0.9 }), true),
        Posterize => {
            // `(8 - arange(bins) / ((bins - 1) / k)).round().int()`, float32.
            let k = if wide { 6.0 } else { 4.0 };
            let divisor = ((f64::from(bins) - 1.0) / k) as f32;
            let bits = (8.0 - bin as f32 / divisor).round_ties_even();
            (bits, false)
        }
        Solarize => (linspace(1.0, 0.0, bins, bin), false),
    })
}

/// Applies one step as torchvision's `_apply_image_or_video_transform`.
pub fn apply_step(step: PolicyStep, sampling: Sampling, width: u32, out: &mut [u8]) {
    let m = f64::from(step.magnitude);
    // `1.0 + magnitude` in double, taken by the kernel in float32.
    let factor = (1.0 + m) as f32;
    let shear = m.atan().to_degrees();
    match step.op {
        Identity => {}
        ShearX => kernels::affine(
            out,
            width,
            0.0,
            [0.0, 0.0],
            [shear, 0.0],
            Some([0.0, 0.0]),
            sampling,
        ),
        ShearY => kernels::affine(
            out,
            width,
            0.0,
            [0.0, 0.0],
            [0.0, shear],
            Some([0.0, 0.0]),
            sampling,
        ),
        // `int(magnitude)` truncates toward zero.
        TranslateX => kernels::affine(
            out,
            width,
            0.0,
            [m.trunc(), 0.0],
            [0.0, 0.0],
            None,
            sampling,
        ),
        TranslateY => kernels::affine(
            out,
            width,
            0.0,
            [0.0, m.trunc()],
            [0.0, 0.0],
            None,
            sampling,
        ),
        Rotate => kernels::rotate(out, width, m, sampling),
        Brightness => kernels::adjust_brightness(out, factor),
        Color => kernels::adjust_saturation(out, factor),
        Contrast => kernels::adjust_contrast(out, factor),
        Sharpness => kernels::adjust_sharpness(out, width, factor),
        Posterize => kernels::posterize(out, m.clamp(0.0, 8.0) as u8),
        // `255 * magnitude` in double, compared with uint8 in float32.
        Solarize => kernels::solarize(out, f64::from((255.0 * m) as f32)),
        AutoContrast => kernels::autocontrast(out),
        Equalize => kernels::equalize(out),
        Invert => kernels::invert(out),
    }
}

#[cfg(test)]
mod tests;
