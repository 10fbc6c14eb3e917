//! Each op's row on the wire: its request fields and its `CropBox` fields.
//! An absent message is the op off; a present one's unset fields take
//! torchvision's defaults, as the Python client leaves them unset.

use super::super::kernels::{Interpolation, PilResample};
use super::super::op::Op;
use super::super::ops::{
    AffineDrawn, AutoAugment, Autocontrast, Coin, ColorJitter, Equalize, EraseValue, ErasedBox,
    Fill, GaussianBlur, Grayscale, HorizontalFlip, Invert, JitterDrawn, JitterOp, Kernel,
    PhotometricDrawn, Policy, PolicyDrawn, PolicyOp, PolicyStep, Posterize, RandomAffine,
    RandomErasing, RandomPhotometricDistort, RandomRotation, Sharpness, Solarize, TimmDrawn,
    TimmOp, TimmRandAugment, TimmStep, VerticalFlip, DEFAULT_BINS, ERASE_RATIO, ERASE_SCALE,
    MAX_JITTER_STEPS, MAX_TIMM_OPS,
};
use crate::proto::v1 as pb;

/// An op's parameters as a request (or a pool unit) names them, and its
/// decision as a batch's `CropBox` reports it.
pub trait OpWire: Op {
    /// The op a request names (absent: [`Op::OFF`]); checked later, by
    /// [`Op::validate`], so that a refusal names the field.
    fn from_wire(wire: &pb::Augmentation) -> Self;
    /// Writes the op into `wire`; an op that is off writes nothing.
    fn to_wire(&self, wire: &mut pb::Augmentation);
    fn drawn_from_wire(wire: &pb::CropBox) -> Self::Drawn;
    fn drawn_to_wire(drawn: Self::Drawn, wire: &mut pb::CropBox);
}

type Range = (f64, f64);

/// A geometric op's sampling as the wire names it; None: one this server
/// does not sample with (torchvision's tensor kernels take nearest or
/// bilinear only).
fn interpolation_from_wire(wire: i32) -> Option<Interpolation> {
    match pb::Interpolation::try_from(wire) {
        Ok(pb::Interpolation::Nearest) => Some(Interpolation::Nearest),
        Ok(pb::Interpolation::Bilinear) => Some(Interpolation::Bilinear),
        Ok(pb::Interpolation::Bicubic) | Err(_) => None,
    }
}

fn interpolation_to_wire(interpolation: Option<Interpolation>) -> i32 {
    let wire = match interpolation.unwrap_or_default() {
        Interpolation::Nearest => pb::Interpolation::Nearest,
        Interpolation::Bilinear => pb::Interpolation::Bilinear,
    };
    wire as i32
}

fn range_from_wire(range: &Option<pb::Range>) -> Option<Range> {
    range.as_ref().map(|r| (r.min, r.max))
}

fn range_to_wire(range: Option<Range>) -> Option<pb::Range> {
    range.map(|(min, max)| pb::Range { min, max })
}

impl OpWire for HorizontalFlip {
    fn from_wire(wire: &pb::Augmentation) -> Self {
        Self(wire.horizontal_flip)
    }

    fn to_wire(&self, wire: &mut pb::Augmentation) {
        wire.horizontal_flip = self.0;
    }

    fn drawn_from_wire(wire: &pb::CropBox) -> bool {
        wire.flipped
    }

    fn drawn_to_wire(flipped: bool, wire: &mut pb::CropBox) {
        wire.flipped = flipped;
    }
}

impl OpWire for RandomRotation {
    fn from_wire(wire: &pb::Augmentation) -> Self {
        wire.rotation.as_ref().map_or(Self::OFF, |rotation| {
            let degrees = rotation.degrees.unwrap_or_default();
            Self {
                degrees: Some((degrees.min, degrees.max)),
                interpolation: interpolation_from_wire(rotation.interpolation),
                fill: Fill::from_levels(&rotation.fill),
            }
        })
    }

    fn to_wire(&self, wire: &mut pb::Augmentation) {
        if let Some((min, max)) = self.degrees {
            wire.rotation = Some(pb::RandomRotation {
                degrees: Some(pb::Range { min, max }),
                interpolation: interpolation_to_wire(self.interpolation),
                fill: self.fill.to_levels(),
            });
        }
    }

    fn drawn_from_wire(wire: &pb::CropBox) -> Option<f64> {
        wire.rotation
    }

    fn drawn_to_wire(angle: Option<f64>, wire: &mut pb::CropBox) {
        wire.rotation = angle;
    }
}

impl OpWire for RandomAffine {
    fn from_wire(wire: &pb::Augmentation) -> Self {
        let Some(affine) = &wire.affine else {
            return Self::OFF;
        };
        let translate = (affine.translate_x.is_some() || affine.translate_y.is_some()).then(|| {
            (
                affine.translate_x.unwrap_or(0.0),
                affine.translate_y.unwrap_or(0.0),
            )
        });
        Self {
            degrees: Some(range_from_wire(&affine.degrees).unwrap_or((0.0, 0.0))),
            translate,
            scale: range_from_wire(&affine.scale),
            shear_x: range_from_wire(&affine.shear_x),
            shear_y: range_from_wire(&affine.shear_y),
            interpolation: interpolation_from_wire(affine.interpolation),
            fill: Fill::from_levels(&affine.fill),
        }
    }

    fn to_wire(&self, wire: &mut pb::Augmentation) {
        let Some(degrees) = self.degrees else {
            return;
        };
        wire.affine = Some(pb::RandomAffine {
            degrees: range_to_wire(Some(degrees)),
            translate_x: self.translate.map(|(x, _)| x),
            translate_y: self.translate.map(|(_, y)| y),
            scale: range_to_wire(self.scale),
            shear_x: range_to_wire(self.shear_x),
            shear_y: range_to_wire(self.shear_y),
            interpolation: interpolation_to_wire(self.interpolation),
            fill: self.fill.to_levels(),
        });
    }

    fn drawn_from_wire(wire: &pb::CropBox) -> Option<AffineDrawn> {
        wire.affine.map(|drawn| AffineDrawn {
            angle: drawn.angle,
            translate: [drawn.translate_x, drawn.translate_y],
            scale: drawn.scale,
            shear: [drawn.shear_x, drawn.shear_y],
        })
    }

    fn drawn_to_wire(drawn: Option<AffineDrawn>, wire: &mut pb::CropBox) {
        wire.affine = drawn.map(|drawn| pb::AffineDrawn {
            angle: drawn.angle,
            translate_x: drawn.translate[0],
            translate_y: drawn.translate[1],
            scale: drawn.scale,
            shear_x: drawn.shear[0],
            shear_y: drawn.shear[1],
        });
    }
}

/// torchvision's auto-augment policies: each op and its wire value.
const POLICY_OPS: [(PolicyOp, pb::PolicyOp); 15] = [
    (PolicyOp::Identity, pb::PolicyOp::Identity),
    (PolicyOp::ShearX, pb::PolicyOp::ShearX),
    (PolicyOp::ShearY, pb::PolicyOp::ShearY),
    (PolicyOp::TranslateX, pb::PolicyOp::TranslateX),
    (PolicyOp::TranslateY, pb::PolicyOp::TranslateY),
    (PolicyOp::Rotate, pb::PolicyOp::Rotate),
    (PolicyOp::Brightness, pb::PolicyOp::Brightness),
    (PolicyOp::Color, pb::PolicyOp::Color),
    (PolicyOp::Contrast, pb::PolicyOp::Contrast),
    (PolicyOp::Sharpness, pb::PolicyOp::Sharpness),
    (PolicyOp::Posterize, pb::PolicyOp::Posterize),
    (PolicyOp::Solarize, pb::PolicyOp::Solarize),
    (PolicyOp::AutoContrast, pb::PolicyOp::AutoContrast),
    (PolicyOp::Equalize, pb::PolicyOp::Equalize),
    (PolicyOp::Invert, pb::PolicyOp::Invert),
];

impl OpWire for AutoAugment {
    fn from_wire(wire: &pb::Augmentation) -> Self {
        let Some(auto) = &wire.auto_augment else {
            return Self::OFF;
        };
        use pb::auto_augment::Policy as Wire;
        let policy = match &auto.policy {
            None => Policy::Off,
            Some(Wire::TrivialAugmentWide(t)) => Policy::TrivialAugmentWide {
                bins: t.num_magnitude_bins.unwrap_or(DEFAULT_BINS),
            },
            Some(Wire::RandAugment(r)) => Policy::RandAugment {
                num_ops: r.num_ops.unwrap_or(2),
                magnitude: r.magnitude.unwrap_or(9),
                bins: r.num_magnitude_bins.unwrap_or(DEFAULT_BINS),
            },
            Some(Wire::Imagenet(_)) => Policy::AutoAugmentImageNet,
        };
        Self {
            policy,
            interpolation: interpolation_from_wire(auto.interpolation),
            fill: Fill::from_levels(&auto.fill),
        }
    }

    fn to_wire(&self, wire: &mut pb::Augmentation) {
        use pb::auto_augment::Policy as Wire;
        let policy = match self.policy {
            Policy::Off => return,
            Policy::TrivialAugmentWide { bins } => {
                Wire::TrivialAugmentWide(pb::TrivialAugmentWide {
                    num_magnitude_bins: Some(bins),
                })
            }
            Policy::RandAugment {
                num_ops,
                magnitude,
                bins,
            } => Wire::RandAugment(pb::RandAugment {
                num_ops: Some(num_ops),
                magnitude: Some(magnitude),
                num_magnitude_bins: Some(bins),
            }),
            Policy::AutoAugmentImageNet => Wire::Imagenet(pb::AutoAugmentImageNet {}),
        };
        wire.auto_augment = Some(pb::AutoAugment {
            policy: Some(policy),
            interpolation: interpolation_to_wire(self.interpolation),
            fill: self.fill.to_levels(),
        });
    }

    fn drawn_from_wire(wire: &pb::CropBox) -> PolicyDrawn {
        let mut drawn = PolicyDrawn::default();
        for step in &wire.policy {
            let op = pb::PolicyOp::try_from(step.op).map_or(PolicyOp::Identity, |theirs| {
                POLICY_OPS
                    .iter()
                    .find(|(_, wire)| *wire == theirs)
                    .map_or(PolicyOp::Identity, |(ours, _)| *ours)
            });
            drawn.push(PolicyStep {
                op,
                magnitude: step.magnitude,
            });
        }
        drawn
    }

    fn drawn_to_wire(drawn: PolicyDrawn, wire: &mut pb::CropBox) {
        let op_to_wire = |op: PolicyOp| {
            POLICY_OPS
                .iter()
                .find(|(ours, _)| *ours == op)
                .map_or(pb::PolicyOp::Identity, |(_, wire)| *wire)
        };
        wire.policy = drawn
            .steps()
            .iter()
            .map(|step| pb::PolicyStep {
                op: op_to_wire(step.op) as i32,
                magnitude: step.magnitude,
            })
            .collect();
    }
}

/// timm's RandAugment ops and their wire values.
const TIMM_OPS: [(TimmOp, pb::TimmOp); 24] = [
    (TimmOp::AutoContrast, pb::TimmOp::AutoContrast),
    (TimmOp::Equalize, pb::TimmOp::Equalize),
    (TimmOp::Invert, pb::TimmOp::Invert),
    (TimmOp::Rotate, pb::TimmOp::Rotate),
    (TimmOp::Posterize, pb::TimmOp::Posterize),
    (TimmOp::PosterizeIncreasing, pb::TimmOp::PosterizeIncreasing),
    (TimmOp::PosterizeOriginal, pb::TimmOp::PosterizeOriginal),
    (TimmOp::Solarize, pb::TimmOp::Solarize),
    (TimmOp::SolarizeIncreasing, pb::TimmOp::SolarizeIncreasing),
    (TimmOp::SolarizeAdd, pb::TimmOp::SolarizeAdd),
    (TimmOp::Color, pb::TimmOp::Color),
    (TimmOp::ColorIncreasing, pb::TimmOp::ColorIncreasing),
    (TimmOp::Contrast, pb::TimmOp::Contrast),
    (TimmOp::ContrastIncreasing, pb::TimmOp::ContrastIncreasing),
    (TimmOp::Brightness, pb::TimmOp::Brightness),
    (
        TimmOp::BrightnessIncreasing,
        pb::TimmOp::BrightnessIncreasing,
    ),
    (TimmOp::Sharpness, pb::TimmOp::Sharpness),
    (TimmOp::SharpnessIncreasing, pb::TimmOp::SharpnessIncreasing),
    (TimmOp::ShearX, pb::TimmOp::ShearX),
    (TimmOp::ShearY, pb::TimmOp::ShearY),
    (TimmOp::TranslateXRel, pb::TimmOp::TranslateXRel),
    (TimmOp::TranslateYRel, pb::TimmOp::TranslateYRel),
    (TimmOp::TranslateX, pb::TimmOp::TranslateX),
    (TimmOp::TranslateY, pb::TimmOp::TranslateY),
];

fn timm_op_from_wire(wire: i32) -> Option<TimmOp> {
    TIMM_OPS
        .iter()
        .find(|(_, theirs)| *theirs as i32 == wire)
        .map(|(ours, _)| *ours)
}

fn timm_op_to_wire(op: TimmOp) -> pb::TimmOp {
    TIMM_OPS
        .iter()
        .find(|(ours, _)| *ours == op)
        .map_or(pb::TimmOp::Unspecified, |(_, wire)| *wire)
}

fn pil_resample_to_wire(resample: PilResample) -> pb::Interpolation {
    match resample {
        PilResample::Bilinear => pb::Interpolation::Bilinear,
        PilResample::Bicubic => pb::Interpolation::Bicubic,
    }
}

impl OpWire for TimmRandAugment {
    fn from_wire(wire: &pb::Augmentation) -> Self {
        let Some(timm) = &wire.timm_rand_augment else {
            return Self::OFF;
        };
        let mut ops = [TimmOp::AutoContrast; MAX_TIMM_OPS];
        let mut unknown_op = false;
        for (slot, &op) in ops.iter_mut().zip(&timm.ops) {
            match timm_op_from_wire(op) {
                Some(op) => *slot = op,
                None => unknown_op = true,
            }
        }
        let resample = match pb::Interpolation::try_from(timm.resample) {
            Ok(pb::Interpolation::Bilinear) => Some(PilResample::Bilinear),
            Ok(pb::Interpolation::Bicubic) => Some(PilResample::Bicubic),
            _ => None,
        };
        Self {
            ops,
            op_count: timm.ops.len(),
            unknown_op,
            num_layers: timm.num_layers,
            magnitude: timm.magnitude,
            magnitude_std: timm.magnitude_std,
            magnitude_max: timm.magnitude_max,
            prob: timm.prob,
            translate_pct: timm.translate_pct,
            translate_const: timm.translate_const,
            resample,
            random_resample: timm.random_resample,
            fill: Fill::from_levels(&timm.fill),
        }
    }

    fn to_wire(&self, wire: &mut pb::Augmentation) {
        if !self.is_random() {
            return;
        }
        wire.timm_rand_augment = Some(pb::TimmRandAugment {
            ops: self
                .ops()
                .iter()
                .map(|&op| timm_op_to_wire(op) as i32)
                .collect(),
            num_layers: self.num_layers,
            magnitude: self.magnitude,
            magnitude_std: self.magnitude_std,
            magnitude_max: self.magnitude_max,
            prob: self.prob,
            translate_pct: self.translate_pct,
            translate_const: self.translate_const,
            resample: pil_resample_to_wire(self.resample.unwrap_or_default()) as i32,
            random_resample: self.random_resample,
            fill: self.fill.to_levels(),
        });
    }

    fn drawn_from_wire(wire: &pb::CropBox) -> TimmDrawn {
        let mut drawn = TimmDrawn::default();
        for step in &wire.timm_steps {
            let resample = if step.resample == pb::Interpolation::Bicubic as i32 {
                PilResample::Bicubic
            } else {
                PilResample::Bilinear
            };
            drawn.push(TimmStep {
                op: timm_op_from_wire(step.op).unwrap_or_default(),
                argument: step.argument,
                resample,
            });
        }
        drawn
    }

    fn drawn_to_wire(drawn: TimmDrawn, wire: &mut pb::CropBox) {
        wire.timm_steps = drawn
            .steps()
            .iter()
            .map(|step| pb::TimmStep {
                op: timm_op_to_wire(step.op) as i32,
                argument: step.argument,
                resample: if step.op.is_geometric() {
                    pil_resample_to_wire(step.resample) as i32
                } else {
                    0
                },
            })
            .collect();
    }
}

/// ColorJitter's and the photometric distort's adjustments, in the order
/// drawn.
fn jitter_steps_from_wire(wire: &[pb::JitterStep]) -> JitterDrawn {
    let mut drawn = JitterDrawn::default();
    for step in wire.iter().take(MAX_JITTER_STEPS) {
        let op = match pb::JitterOp::try_from(step.op) {
            Ok(pb::JitterOp::Brightness) | Err(_) => JitterOp::Brightness,
            Ok(pb::JitterOp::Contrast) => JitterOp::Contrast,
            Ok(pb::JitterOp::Saturation) => JitterOp::Saturation,
            Ok(pb::JitterOp::Hue) => JitterOp::Hue,
        };
        drawn.steps[usize::from(drawn.len)] = (op, step.factor);
        drawn.len += 1;
    }
    drawn
}

fn jitter_steps_to_wire(drawn: &JitterDrawn) -> Vec<pb::JitterStep> {
    drawn
        .steps()
        .iter()
        .map(|&(op, factor)| pb::JitterStep {
            op: match op {
                JitterOp::Brightness => pb::JitterOp::Brightness,
                JitterOp::Contrast => pb::JitterOp::Contrast,
                JitterOp::Saturation => pb::JitterOp::Saturation,
                JitterOp::Hue => pb::JitterOp::Hue,
            } as i32,
            factor,
        })
        .collect()
}

impl OpWire for ColorJitter {
    fn from_wire(wire: &pb::Augmentation) -> Self {
        let Some(jitter) = &wire.color_jitter else {
            return Self::OFF;
        };
        Self {
            brightness: range_from_wire(&jitter.brightness),
            contrast: range_from_wire(&jitter.contrast),
            saturation: range_from_wire(&jitter.saturation),
            hue: range_from_wire(&jitter.hue),
            p: jitter.p.unwrap_or(1.0),
        }
    }

    fn to_wire(&self, wire: &mut pb::Augmentation) {
        if !self.is_random() {
            return;
        }
        wire.color_jitter = Some(pb::ColorJitter {
            brightness: range_to_wire(self.brightness),
            contrast: range_to_wire(self.contrast),
            saturation: range_to_wire(self.saturation),
            hue: range_to_wire(self.hue),
            p: (self.p < 1.0).then_some(self.p),
        });
    }

    fn drawn_from_wire(wire: &pb::CropBox) -> JitterDrawn {
        jitter_steps_from_wire(&wire.jitter)
    }

    fn drawn_to_wire(drawn: JitterDrawn, wire: &mut pb::CropBox) {
        wire.jitter = jitter_steps_to_wire(&drawn);
    }
}

impl OpWire for RandomPhotometricDistort {
    fn from_wire(wire: &pb::Augmentation) -> Self {
        let Some(distort) = &wire.photometric_distort else {
            return Self::OFF;
        };
        let range = |r: &Option<pb::Range>, default: Range| range_from_wire(r).unwrap_or(default);
        Self {
            brightness: range(&distort.brightness, Self::OFF.brightness),
            contrast: range(&distort.contrast, Self::OFF.contrast),
            saturation: range(&distort.saturation, Self::OFF.saturation),
            hue: range(&distort.hue, Self::OFF.hue),
            p: distort.p,
        }
    }

    fn to_wire(&self, wire: &mut pb::Augmentation) {
        if !self.is_random() {
            return;
        }
        wire.photometric_distort = Some(pb::RandomPhotometricDistort {
            brightness: range_to_wire(Some(self.brightness)),
            contrast: range_to_wire(Some(self.contrast)),
            saturation: range_to_wire(Some(self.saturation)),
            hue: range_to_wire(Some(self.hue)),
            p: self.p,
        });
    }

    fn drawn_from_wire(wire: &pb::CropBox) -> PhotometricDrawn {
        let permutation = match wire.channel_permutation[..] {
            [a, b, c] if [a, b, c].iter().all(|&v| v < 3) => Some([a as u8, b as u8, c as u8]),
            _ => None,
        };
        PhotometricDrawn {
            adjustments: jitter_steps_from_wire(&wire.photometric),
            permutation,
        }
    }

    fn drawn_to_wire(drawn: PhotometricDrawn, wire: &mut pb::CropBox) {
        wire.photometric = jitter_steps_to_wire(&drawn.adjustments);
        wire.channel_permutation = drawn
            .permutation
            .map_or_else(Vec::new, |order| order.map(u32::from).to_vec());
    }
}

impl OpWire for GaussianBlur {
    fn from_wire(wire: &pb::Augmentation) -> Self {
        let Some(blur) = &wire.gaussian_blur else {
            return Self::OFF;
        };
        Self {
            kernel: (blur.kernel_width, blur.kernel_height),
            sigma: range_from_wire(&blur.sigma).unwrap_or(Self::OFF.sigma),
            p: blur.p.unwrap_or(1.0),
        }
    }

    fn to_wire(&self, wire: &mut pb::Augmentation) {
        if !self.is_random() {
            return;
        }
        wire.gaussian_blur = Some(pb::GaussianBlur {
            kernel_width: self.kernel.0,
            kernel_height: self.kernel.1,
            sigma: range_to_wire(Some(self.sigma)),
            p: (self.p < 1.0).then_some(self.p),
        });
    }

    fn drawn_from_wire(wire: &pb::CropBox) -> Option<f32> {
        wire.blur_sigma
    }

    fn drawn_to_wire(drawn: Option<f32>, wire: &mut pb::CropBox) {
        wire.blur_sigma = drawn;
    }
}

impl OpWire for RandomErasing {
    fn from_wire(wire: &pb::Augmentation) -> Self {
        let Some(erasing) = &wire.random_erasing else {
            return Self::OFF;
        };
        use pb::random_erasing::Value;
        let triple = |values: &[f64]| {
            let mut out = [0.0; 3];
            for (slot, v) in out.iter_mut().zip(values) {
                *slot = *v;
            }
            (out, values.len())
        };
        Self {
            p: erasing.p,
            scale: range_from_wire(&erasing.scale).unwrap_or(ERASE_SCALE),
            ratio: range_from_wire(&erasing.ratio).unwrap_or(ERASE_RATIO),
            value: match &erasing.value {
                Some(Value::Colour(colour)) => {
                    let mut levels = [0u32; 3];
                    for (slot, l) in levels.iter_mut().zip(&colour.levels) {
                        *slot = *l;
                    }
                    EraseValue::Colour(levels, colour.levels.len())
                }
                Some(Value::Random(_)) => EraseValue::Random,
                Some(Value::Mean(_)) | None => EraseValue::Mean,
            },
            mean: triple(&erasing.normalize_mean),
            std: triple(&erasing.normalize_std),
        }
    }

    fn to_wire(&self, wire: &mut pb::Augmentation) {
        if !self.is_random() {
            return;
        }
        use pb::random_erasing::Value;
        wire.random_erasing = Some(pb::RandomErasing {
            p: self.p,
            scale: range_to_wire(Some(self.scale)),
            ratio: range_to_wire(Some(self.ratio)),
            value: Some(match self.value {
                EraseValue::Colour(levels, count) => Value::Colour(pb::Colour {
                    levels: levels[..count.min(3)].to_vec(),
                }),
                EraseValue::Mean => Value::Mean(pb::EraseMean {}),
                EraseValue::Random => Value::Random(pb::EraseNoise {}),
            }),
            normalize_mean: self.mean.0[..self.mean.1.min(3)].to_vec(),
            normalize_std: self.std.0[..self.std.1.min(3)].to_vec(),
        });
    }

    fn drawn_from_wire(wire: &pb::CropBox) -> Option<ErasedBox> {
        wire.erased.as_ref().map(|b| ErasedBox {
            top: b.top,
            left: b.left,
            height: b.height,
            width: b.width,
            noise: b.noise,
        })
    }

    fn drawn_to_wire(drawn: Option<ErasedBox>, wire: &mut pb::CropBox) {
        wire.erased = drawn.map(|b| pb::ErasedBox {
            top: b.top,
            left: b.left,
            height: b.height,
            width: b.width,
            noise: b.noise,
        });
    }
}

/// A coin op's kernel on the wire: its parameters and probability, and
/// whether the `CropBox` says it ran.
pub trait KernelWire: Kernel {
    /// The parameters and probability a request names (p 0: off).
    fn from_wire(wire: &pb::Augmentation) -> (Self, f64);
    fn to_wire(&self, p: f64, wire: &mut pb::Augmentation);
    fn ran(wire: &pb::CropBox) -> bool;
    fn set_ran(wire: &mut pb::CropBox, ran: bool);
}

impl<K: KernelWire> OpWire for Coin<K> {
    fn from_wire(wire: &pb::Augmentation) -> Self {
        let (kernel, p) = K::from_wire(wire);
        Self { kernel, p }
    }

    fn to_wire(&self, wire: &mut pb::Augmentation) {
        if self.is_random() {
            self.kernel.to_wire(self.p, wire);
        }
    }

    fn drawn_from_wire(wire: &pb::CropBox) -> bool {
        K::ran(wire)
    }

    fn drawn_to_wire(ran: bool, wire: &mut pb::CropBox) {
        K::set_ran(wire, ran);
    }
}

/// Kernels without parameters: the probability a `double` of the request,
/// the decision a `bool` of the `CropBox`.
macro_rules! plain_kernels {
    ($($kernel:ty: $field:ident, $ran:ident;)+) => {$(
        impl KernelWire for $kernel {
            fn from_wire(wire: &pb::Augmentation) -> (Self, f64) {
                (Self, wire.$field)
            }

            fn to_wire(&self, p: f64, wire: &mut pb::Augmentation) {
                wire.$field = p;
            }

            fn ran(wire: &pb::CropBox) -> bool {
                wire.$ran
            }

            fn set_ran(wire: &mut pb::CropBox, ran: bool) {
                wire.$ran = ran;
            }
        }
    )+};
}

plain_kernels! {
    Grayscale: grayscale, grayscale;
    VerticalFlip: vertical_flip, vertically_flipped;
    Equalize: equalize, equalized;
    Autocontrast: autocontrast, autocontrasted;
    Invert: invert, inverted;
}

impl KernelWire for Solarize {
    fn from_wire(wire: &pb::Augmentation) -> (Self, f64) {
        wire.solarize.as_ref().map_or((Self::DEFAULT, 0.0), |s| {
            (
                Self {
                    threshold: s.threshold,
                },
                s.p,
            )
        })
    }

    fn to_wire(&self, p: f64, wire: &mut pb::Augmentation) {
        wire.solarize = Some(pb::RandomSolarize {
            threshold: self.threshold,
            p,
        });
    }

    fn ran(wire: &pb::CropBox) -> bool {
        wire.solarized
    }

    fn set_ran(wire: &mut pb::CropBox, ran: bool) {
        wire.solarized = ran;
    }
}

impl KernelWire for Sharpness {
    fn from_wire(wire: &pb::Augmentation) -> (Self, f64) {
        wire.sharpness.as_ref().map_or((Self::DEFAULT, 0.0), |s| {
            (
                Self {
                    factor: s.sharpness_factor,
                },
                s.p,
            )
        })
    }

    fn to_wire(&self, p: f64, wire: &mut pb::Augmentation) {
        wire.sharpness = Some(pb::RandomAdjustSharpness {
            sharpness_factor: self.factor,
            p,
        });
    }

    fn ran(wire: &pb::CropBox) -> bool {
        wire.sharpened
    }

    fn set_ran(wire: &mut pb::CropBox, ran: bool) {
        wire.sharpened = ran;
    }
}

impl KernelWire for Posterize {
    fn from_wire(wire: &pb::Augmentation) -> (Self, f64) {
        wire.posterize
            .as_ref()
            .map_or((Self::DEFAULT, 0.0), |s| (Self { bits: s.bits }, s.p))
    }

    fn to_wire(&self, p: f64, wire: &mut pb::Augmentation) {
        wire.posterize = Some(pb::RandomPosterize { bits: self.bits, p });
    }

    fn ran(wire: &pb::CropBox) -> bool {
        wire.posterized
    }

    fn set_ran(wire: &mut pb::CropBox, ran: bool) {
        wire.posterized = ran;
    }
}
