//! timm's RandAugment as timm runs it (`timm.data.auto_augment`,
//! `rand-m9-mstd0.5-inc1` and the other `rand-` strings without weights):
//! `num_layers` ops drawn with replacement, each on a coin of `prob`, its
//! magnitude drawn around `m` with `mstd` and clamped, mapped to the op's
//! argument by timm's level functions (sign on a fair coin), the geometric
//! ops' sampling fixed or, as timm's random interpolation, bilinear or
//! bicubic per op; run with PIL's kernels (`../kernels/pil.rs`). Every
//! draw is from the op's own key; the decisions are reported as timm's op
//! functions take them, so `timm.data.auto_augment` replays each.

use super::super::kernels::{self, PilResample};
use super::super::key::uniform;
use super::super::op::{invalid, AugmentError, DrawAt, Op};
use super::policy::Fill;
use crate::plan::rng::Rng;

/// Most ops a stream draws from (timm's lists have 15).
pub const MAX_TIMM_OPS: usize = 32;
/// Most ops one sample goes through (`num_layers`).
pub const MAX_TIMM_LAYERS: usize = 8;
/// timm's `_LEVEL_DENOM`: the magnitude scale's top and default clamp.
const LEVEL_DENOM: f64 = 10.0;
/// timm's default fill (`_FILL`).
const TIMM_FILL: [u8; 3] = [128, 128, 128];

/// timm's op names (`NAME_TO_OP`'s keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimmOp {
    #[default]
    AutoContrast,
    Equalize,
    Invert,
    Rotate,
    Posterize,
    PosterizeIncreasing,
    PosterizeOriginal,
    Solarize,
    SolarizeIncreasing,
    SolarizeAdd,
    Color,
    ColorIncreasing,
    Contrast,
    ContrastIncreasing,
    Brightness,
    BrightnessIncreasing,
    Sharpness,
    SharpnessIncreasing,
    ShearX,
    ShearY,
    TranslateXRel,
    TranslateYRel,
    TranslateX,
    TranslateY,
}

use TimmOp::*;

impl TimmOp {
    /// Whether the op samples (and so draws its sampling).
    pub fn is_geometric(self) -> bool {
        matches!(
            self,
            Rotate | ShearX | ShearY | TranslateXRel | TranslateYRel | TranslateX | TranslateY
        )
    }
}

/// A stream's timm RandAugment (off: no ops).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimmRandAugment {
    pub ops: [TimmOp; MAX_TIMM_OPS],
    /// How many ops the request listed (`ops` holds the first 32).
    pub op_count: usize,
    /// Whether the request named an op this server does not know.
    pub unknown_op: bool,
    pub num_layers: u32,
    pub magnitude: f64,
    pub magnitude_std: f64,
    /// 0: timm's 10.
    pub magnitude_max: f64,
    pub prob: f64,
    pub translate_pct: f64,
    pub translate_const: f64,
    /// None: a sampling timm's ops are not served with.
    pub resample: Option<PilResample>,
    pub random_resample: bool,
    pub fill: Fill,
}

/// One op as applied, with the argument its op function takes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TimmStep {
    pub op: TimmOp,
    pub argument: f64,
    pub resample: PilResample,
}

/// A sample's ops in the order applied.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TimmDrawn {
    pub steps: [TimmStep; MAX_TIMM_LAYERS],
    pub len: u8,
}

impl TimmDrawn {
    pub fn steps(&self) -> &[TimmStep] {
        &self.steps[..usize::from(self.len)]
    }

    pub fn push(&mut self, step: TimmStep) {
        if let Some(slot) = self.steps.get_mut(usize::from(self.len)) {
            *slot = step;
            self.len += 1;
        }
    }
}

impl Default for TimmRandAugment {
    fn default() -> Self {
        Self::OFF
    }
}

impl TimmRandAugment {
    /// timm's `rand_augment_transform(f"rand-m{m}-n{n}-mstd{mstd}-inc{inc}")`
    /// with create_transform's hyperparameters for an output of `side`
    /// pixels (`translate_const = int(side * 0.45)`) and bicubic sampling.
    pub fn new(magnitude: f64, num_layers: u32, magnitude_std: f64, increasing: bool) -> Self {
        let list: &[TimmOp] = if increasing { &RAND_INCREASING } else { &RAND };
        Self {
            num_layers,
            magnitude,
            magnitude_std,
            ..Self::OFF
        }
        .with_op_list(list)
    }

    /// These parameters drawing from `ops` alone.
    pub fn with_op_list(self, ops: &[TimmOp]) -> Self {
        let mut list = [AutoContrast; MAX_TIMM_OPS];
        let count = ops.len().min(MAX_TIMM_OPS);
        list[..count].copy_from_slice(&ops[..count]);
        Self {
            ops: list,
            op_count: count,
            ..self
        }
    }

    pub fn ops(&self) -> &[TimmOp] {
        &self.ops[..self.op_count.min(MAX_TIMM_OPS)]
    }

    fn upper_bound(&self) -> f64 {
        if self.magnitude_max > 0.0 {
            self.magnitude_max
        } else {
            LEVEL_DENOM
        }
    }

    /// `AugmentOp.__call__`'s magnitude: noise, then the clamp.
    fn drawn_magnitude(&self, rng: &mut Rng) -> f64 {
        let mut magnitude = self.magnitude;
        if self.magnitude_std == f64::INFINITY {
            magnitude *= uniform(rng);
        } else if self.magnitude_std > 0.0 {
            magnitude += self.magnitude_std * standard_normal(rng);
        }
        magnitude.min(self.upper_bound()).max(0.0)
    }

    /// timm's level function of `op` at `magnitude`: the argument its op
    /// function takes.
    fn argument(&self, op: TimmOp, magnitude: f64, rng: &mut Rng) -> f64 {
        let level = magnitude / LEVEL_DENOM;
        // `_randomly_negate`: `-v if random.random() > 0.5 else v`.
        let mut negate = |v: f64| if uniform(rng) > 0.5 { -v } else { v };
        let posterize = (level * 4.0).trunc();
        let solarize = (level * 256.0).trunc().min(256.0);
        match op {
            AutoContrast | Equalize | Invert => 0.0,
            Rotate => negate(level * 30.0),
            Posterize => posterize,
            PosterizeIncreasing => 4.0 - posterize,
            PosterizeOriginal => posterize + 4.0,
            Solarize => solarize,
            SolarizeIncreasing => 256.0 - solarize,
            SolarizeAdd => (level * 110.0).trunc().min(128.0),
            Color | Contrast | Brightness | Sharpness => level * 1.8 + 0.1,
            ColorIncreasing | ContrastIncreasing | BrightnessIncreasing | SharpnessIncreasing => {
                (1.0 + negate(level * 0.9)).max(0.1)
            }
            ShearX | ShearY => negate(level * 0.3),
            TranslateXRel | TranslateYRel => negate(level * self.translate_pct),
            TranslateX | TranslateY => negate(level * self.translate_const),
        }
    }

    fn fill(&self) -> [u8; 3] {
        self.fill.get().unwrap_or(TIMM_FILL)
    }
}

/// timm's `_RAND_TRANSFORMS`, in its order.
const RAND: [TimmOp; 15] = [
    AutoContrast,
    Equalize,
    Invert,
    Rotate,
    Posterize,
    Solarize,
    SolarizeAdd,
    Color,
    Contrast,
    Brightness,
    Sharpness,
    ShearX,
    ShearY,
    TranslateXRel,
    TranslateYRel,
];

/// timm's `_RAND_INCREASING_TRANSFORMS`, in its order.
const RAND_INCREASING: [TimmOp; 15] = [
    AutoContrast,
    Equalize,
    Invert,
    Rotate,
    PosterizeIncreasing,
    SolarizeIncreasing,
    SolarizeAdd,
    ColorIncreasing,
    ContrastIncreasing,
    BrightnessIncreasing,
    SharpnessIncreasing,
    ShearX,
    ShearY,
    TranslateXRel,
    TranslateYRel,
];

/// A standard normal by Box-Muller (timm's `random.gauss` is another
/// generator; only the distribution is timm's).
fn standard_normal(rng: &mut Rng) -> f64 {
    let u1 = 1.0 - uniform(rng);
    let u2 = uniform(rng);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn check(
    ok: bool,
    field: &'static str,
    message: impl FnOnce() -> String,
) -> Result<(), AugmentError> {
    if ok {
        Ok(())
    } else {
        Err(invalid(field, message()))
    }
}

impl Op for TimmRandAugment {
    type Drawn = TimmDrawn;

    const NAME: &'static str = "timm_rand_augment";
    const CLIENT_REPLAYS: bool = false;
    const OFF: Self = Self {
        ops: [AutoContrast; MAX_TIMM_OPS],
        op_count: 0,
        unknown_op: false,
        num_layers: 2,
        magnitude: 10.0,
        magnitude_std: 0.0,
        magnitude_max: 0.0,
        prob: 0.5,
        translate_pct: 0.45,
        translate_const: 100.0,
        resample: Some(PilResample::Bicubic),
        random_resample: false,
        fill: Fill {
            levels: [0; 3],
            count: 0,
        },
    };

    fn validate(&self) -> Result<(), AugmentError> {
        if self.op_count == 0 {
            return Ok(());
        }
        check(
            self.op_count <= MAX_TIMM_OPS && !self.unknown_op,
            "augmentation.timm_rand_augment.ops",
            || {
                format!(
                    "must be 1..={MAX_TIMM_OPS} known TimmOp values ({} sent)",
                    self.op_count
                )
            },
        )?;
        let layers = self.num_layers;
        check(
            (1..=MAX_TIMM_LAYERS as u32).contains(&layers),
            "augmentation.timm_rand_augment.num_layers",
            || format!("must be in 1..={MAX_TIMM_LAYERS}, not {layers}"),
        )?;
        let ranges: [(&'static str, f64, f64, f64); 6] = [
            (
                "augmentation.timm_rand_augment.magnitude",
                self.magnitude,
                0.0,
                1000.0,
            ),
            (
                "augmentation.timm_rand_augment.magnitude_max",
                self.magnitude_max,
                0.0,
                LEVEL_DENOM,
            ),
            ("augmentation.timm_rand_augment.prob", self.prob, 0.0, 1.0),
            (
                "augmentation.timm_rand_augment.translate_pct",
                self.translate_pct,
                0.0,
                1.0,
            ),
            (
                "augmentation.timm_rand_augment.translate_const",
                self.translate_const,
                0.0,
                10_000.0,
            ),
            (
                "augmentation.timm_rand_augment.magnitude_std",
                self.magnitude_std,
                0.0,
                f64::INFINITY,
            ),
        ];
        for (field, value, low, high) in ranges {
            // `contains` is false for a NaN.
            check((low..=high).contains(&value), field, || {
                format!("must be in [{low}, {high}], not {value}")
            })?;
        }
        check(
            self.random_resample || self.resample.is_some(),
            "augmentation.timm_rand_augment.resample",
            || {
                "must be INTERPOLATION_BILINEAR or INTERPOLATION_BICUBIC (PIL's nearest \
                 affine path is not served), or random_resample"
                    .into()
            },
        )?;
        self.fill.validate("augmentation.timm_rand_augment.fill")
    }

    fn is_random(&self) -> bool {
        self.op_count > 0
    }

    fn draw(&self, _: &mut Rng, at: &DrawAt) -> TimmDrawn {
        let mut drawn = TimmDrawn::default();
        if !self.is_random() {
            return drawn;
        }
        let mut rng = at.generator(Self::NAME);
        let ops = self.ops();
        for _ in 0..self.num_layers {
            let op = ops[rng.below(ops.len() as u64) as usize];
            // `if self.prob < 1.0 and random.random() > self.prob: skip`.
            if self.prob < 1.0 && uniform(&mut rng) > self.prob {
                continue;
            }
            let magnitude = self.drawn_magnitude(&mut rng);
            let argument = self.argument(op, magnitude, &mut rng);
            let resample = if !op.is_geometric() {
                PilResample::default()
            } else if self.random_resample {
                // `random.choice((BILINEAR, BICUBIC))`.
                if rng.below(2) == 0 {
                    PilResample::Bilinear
                } else {
                    PilResample::Bicubic
                }
            } else {
                self.resample.unwrap_or_default()
            };
            drawn.push(TimmStep {
                op,
                argument,
                resample,
            });
        }
        drawn
    }

    fn apply(&self, drawn: &TimmDrawn, width: u32, out: &mut [u8]) {
        for step in drawn.steps() {
            apply_step(*step, self.fill(), width, out);
        }
    }
}

/// One step as timm's op function runs it on a PIL image.
pub fn apply_step(step: TimmStep, fill: [u8; 3], width: u32, out: &mut [u8]) {
    let height = out.len() / (width as usize * 3).max(1);
    let argument = step.argument;
    let affine =
        |out: &mut [u8], matrix| kernels::pil::affine(out, width, matrix, step.resample, fill);
    match step.op {
        AutoContrast => kernels::pil::autocontrast(out),
        Equalize => kernels::equalize(out),
        Invert => kernels::invert(out),
        Rotate => {
            if let Some(matrix) = kernels::pil::rotate_matrix(argument, width, height as u32) {
                affine(out, matrix);
            }
        }
        // ImageOps' posterize and solarize are torchvision's tables on
        // whole-number arguments (0 bits: black; threshold 256: none).
        Posterize | PosterizeIncreasing | PosterizeOriginal => {
            kernels::posterize(out, argument.clamp(0.0, 8.0) as u8)
        }
        Solarize | SolarizeIncreasing => kernels::solarize(out, argument.clamp(0.0, 256.0)),
        SolarizeAdd => kernels::pil::solarize_add(out, argument.clamp(0.0, 255.0) as u32, 128),
        Color | ColorIncreasing => kernels::pil::color(out, argument),
        Contrast | ContrastIncreasing => kernels::pil::contrast(out, argument),
        Brightness | BrightnessIncreasing => kernels::pil::brightness(out, argument),
        Sharpness | SharpnessIncreasing => kernels::pil::sharpness(out, width, argument),
        ShearX => affine(out, [1.0, argument, 0.0, 0.0, 1.0, 0.0]),
        ShearY => affine(out, [1.0, 0.0, 0.0, argument, 1.0, 0.0]),
        // `pixels = pct * img.size[0]` (or `[1]`).
        TranslateXRel => affine(out, [1.0, 0.0, argument * f64::from(width), 0.0, 1.0, 0.0]),
        TranslateYRel => affine(out, [1.0, 0.0, 0.0, 0.0, 1.0, argument * height as f64]),
        TranslateX => affine(out, [1.0, 0.0, argument, 0.0, 1.0, 0.0]),
        TranslateY => affine(out, [1.0, 0.0, 0.0, 0.0, 1.0, argument]),
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::op::draw_alone;
    use super::*;
    use crate::decode::augment::wire::OpWire;
    use crate::proto::v1 as pb;

    fn deit() -> TimmRandAugment {
        TimmRandAugment::new(9.0, 2, 0.5, true)
    }

    #[test]
    fn the_draws_follow_timms_rules() {
        let op = deit();
        let (mut applied, mut layers, mut geometric) = (0usize, 0usize, 0usize);
        let samples = 4000u64;
        for sample in 0..samples {
            let drawn = draw_alone(&op, (7, 1, sample), (224, 224));
            layers += 2;
            applied += drawn.steps().len();
            for step in drawn.steps() {
                let a = step.argument;
                match step.op {
                    Rotate => assert!(a.abs() <= 30.0),
                    ShearX | ShearY => assert!(a.abs() <= 0.3),
                    TranslateXRel | TranslateYRel => assert!(a.abs() <= 0.45),
                    PosterizeIncreasing => assert!((0.0..=4.0).contains(&a) && a.fract() == 0.0),
                    SolarizeIncreasing => assert!((0.0..=256.0).contains(&a)),
                    SolarizeAdd => assert!((0.0..=110.0).contains(&a)),
                    ColorIncreasing | ContrastIncreasing | BrightnessIncreasing
                    | SharpnessIncreasing => assert!((0.1..=1.9).contains(&a)),
                    AutoContrast | Equalize | Invert => assert_eq!(a, 0.0),
                    other => panic!("{other:?} is not in the increasing list"),
                }
                if step.op.is_geometric() {
                    geometric += 1;
                    assert_eq!(step.resample, PilResample::Bicubic);
                }
            }
            assert_eq!(drawn, draw_alone(&op, (7, 1, sample), (224, 224)));
        }
        let share = applied as f64 / layers as f64;
        assert!((share - 0.5).abs() < 0.02, "applied share {share}");
        let geometric_share = geometric as f64 / applied as f64;
        assert!(
            (geometric_share - 5.0 / 15.0).abs() < 0.03,
            "{geometric_share}"
        );
    }

    #[test]
    fn the_magnitude_noise_is_clamped_and_centred() {
        let op = TimmRandAugment {
            prob: 1.0,
            ..deit().with_op_list(&[Rotate])
        };
        let mut sum = 0.0;
        let n = 4000u64;
        for sample in 0..n {
            let drawn = draw_alone(&op, (1, 0, sample), (224, 224));
            assert_eq!(drawn.steps().len(), 2);
            for step in drawn.steps() {
                // m ~ N(9, 0.5) clamped to 10: |degrees| <= 30.
                assert!(step.argument.abs() <= 30.0);
                sum += step.argument.abs() / 3.0;
            }
        }
        let mean = sum / (2 * n) as f64;
        // E[min(N(9, .5), 10)] is just under 9.
        assert!((mean - 8.99).abs() < 0.05, "mean magnitude {mean}");
    }

    #[test]
    fn random_resampling_takes_both() {
        let op = TimmRandAugment {
            prob: 1.0,
            random_resample: true,
            ..deit().with_op_list(&[ShearX])
        };
        let bicubic = (0..1000u64)
            .flat_map(|s| draw_alone(&op, (3, 0, s), (64, 64)).steps().to_vec())
            .filter(|step| step.resample == PilResample::Bicubic)
            .count();
        assert!((900..1100).contains(&bicubic), "{bicubic} of 2000");
    }

    #[test]
    fn bounds_are_checked_by_name() {
        let bad = [
            (
                TimmRandAugment {
                    num_layers: 0,
                    ..deit()
                },
                "num_layers",
            ),
            (
                TimmRandAugment {
                    prob: f64::NAN,
                    ..deit()
                },
                "prob",
            ),
            (
                TimmRandAugment {
                    magnitude_max: 12.0,
                    ..deit()
                },
                "magnitude_max",
            ),
            (
                TimmRandAugment {
                    magnitude_std: -1.0,
                    ..deit()
                },
                "magnitude_std",
            ),
            (
                TimmRandAugment {
                    resample: None,
                    ..deit()
                },
                "resample",
            ),
            (
                TimmRandAugment {
                    op_count: 40,
                    ..deit()
                },
                "ops",
            ),
            (
                TimmRandAugment {
                    unknown_op: true,
                    ..deit()
                },
                "ops",
            ),
        ];
        for (op, field) in bad {
            let error = op.validate().unwrap_err();
            assert!(error.field.ends_with(field), "{error}");
        }
        assert!(deit().validate().is_ok());
        assert!(TimmRandAugment::OFF.validate().is_ok());
    }

    #[test]
    fn the_wire_round_trips() {
        let op = TimmRandAugment {
            random_resample: true,
            fill: Fill::colour([124, 116, 104]),
            translate_const: 100.0,
            ..deit()
        };
        let mut wire = pb::Augmentation::default();
        op.to_wire(&mut wire);
        assert_eq!(TimmRandAugment::from_wire(&wire), op);
        let drawn = draw_alone(&op, (9, 2, 11), (224, 224));
        let mut crop = pb::CropBox::default();
        TimmRandAugment::drawn_to_wire(drawn, &mut crop);
        assert_eq!(TimmRandAugment::drawn_from_wire(&crop), drawn);
        let mut off = pb::Augmentation::default();
        TimmRandAugment::OFF.to_wire(&mut off);
        assert_eq!(off.timm_rand_augment, None);
    }
}
