//! ColorJitter: brightness, contrast, saturation and hue factors drawn per
//! sample and applied in a random order, as torchvision v2's `ColorJitter`
//! (`fn_idx = randperm(4)`, then each factor uniform in its range).

use super::super::kernels;
use super::super::key::uniform_in;
use super::super::op::{invalid, AugmentError, DrawAt, Op};
use crate::plan::rng::Rng;
use crate::proto::v1 as pb;

/// The four adjustments, in torchvision's numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JitterOp {
    #[default]
    Brightness,
    Contrast,
    Saturation,
    Hue,
}

const ORDER: [JitterOp; 4] = [
    JitterOp::Brightness,
    JitterOp::Contrast,
    JitterOp::Saturation,
    JitterOp::Hue,
];

/// Each adjustment's factor range (`None`: left out).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ColorJitter {
    pub brightness: Option<(f64, f64)>,
    pub contrast: Option<(f64, f64)>,
    pub saturation: Option<(f64, f64)>,
    pub hue: Option<(f64, f64)>,
}

impl ColorJitter {
    /// torchvision's float form: `[max(0, 1 - v), 1 + v]` for the first
    /// three, `[-h, h]` for hue; 0 leaves an adjustment out.
    pub fn symmetric(brightness: f64, contrast: f64, saturation: f64, hue: f64) -> Self {
        let around_one = |v: f64| (v != 0.0).then(|| ((1.0 - v).max(0.0), 1.0 + v));
        Self {
            brightness: around_one(brightness),
            contrast: around_one(contrast),
            saturation: around_one(saturation),
            hue: (hue != 0.0).then_some((-hue, hue)),
        }
    }

    fn range(&self, op: JitterOp) -> Option<(f64, f64)> {
        match op {
            JitterOp::Brightness => self.brightness,
            JitterOp::Contrast => self.contrast,
            JitterOp::Saturation => self.saturation,
            JitterOp::Hue => self.hue,
        }
    }
}

/// A sample's adjustments in the order applied.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct JitterDrawn {
    pub steps: [(JitterOp, f32); 4],
    pub len: u8,
}

impl JitterDrawn {
    pub fn steps(&self) -> &[(JitterOp, f32)] {
        &self.steps[..usize::from(self.len)]
    }
}

impl Op for ColorJitter {
    type Drawn = JitterDrawn;

    const NAME: &'static str = "color_jitter";
    const CLIENT_REPLAYS: bool = false;
    const OFF: Self = Self {
        brightness: None,
        contrast: None,
        saturation: None,
        hue: None,
    };

    fn validate(&self) -> Result<(), AugmentError> {
        let fields = [
            (
                "augmentation.color_jitter.brightness",
                self.brightness,
                0.0,
                f64::INFINITY,
            ),
            (
                "augmentation.color_jitter.contrast",
                self.contrast,
                0.0,
                f64::INFINITY,
            ),
            (
                "augmentation.color_jitter.saturation",
                self.saturation,
                0.0,
                f64::INFINITY,
            ),
            ("augmentation.color_jitter.hue", self.hue, -0.5, 0.5),
        ];
        for (field, range, low, high) in fields {
            let Some((min, max)) = range else { continue };
            if !(min.is_finite() && max.is_finite() && low <= min && min <= max && max <= high) {
                return Err(invalid(
                    field,
                    format!(
                        "must be a range with {low} <= min <= max <= {high}, not [{min}, {max}]"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn is_random(&self) -> bool {
        ORDER.iter().any(|&op| self.range(op).is_some())
    }

    fn draw(&self, _: &mut Rng, at: &DrawAt) -> JitterDrawn {
        let mut drawn = JitterDrawn::default();
        if !self.is_random() {
            return drawn;
        }
        let mut rng = at.generator(Self::NAME);
        let mut order = ORDER;
        rng.shuffle(&mut order);
        // torchvision draws the factors in its fixed order, then applies
        // them in the shuffled one.
        let factors = ORDER.map(|op| {
            self.range(op)
                .map(|range| uniform_in(&mut rng, range) as f32)
        });
        for op in order {
            if let Some(factor) = factors[op as usize] {
                drawn.steps[usize::from(drawn.len)] = (op, factor);
                drawn.len += 1;
            }
        }
        drawn
    }

    fn apply(&self, drawn: &JitterDrawn, width: u32, out: &mut [u8]) {
        let _ = width;
        for &(op, factor) in drawn.steps() {
            match op {
                JitterOp::Brightness => kernels::adjust_brightness(out, factor),
                JitterOp::Contrast => kernels::adjust_contrast(out, factor),
                JitterOp::Saturation => kernels::adjust_saturation(out, factor),
                JitterOp::Hue => kernels::adjust_hue(out, factor),
            }
        }
    }

    fn from_wire(wire: &pb::Augmentation) -> Self {
        let Some(jitter) = &wire.color_jitter else {
            return Self::OFF;
        };
        let range = |r: &Option<pb::Range>| r.as_ref().map(|r| (r.min, r.max));
        Self {
            brightness: range(&jitter.brightness),
            contrast: range(&jitter.contrast),
            saturation: range(&jitter.saturation),
            hue: range(&jitter.hue),
        }
    }

    fn to_wire(&self, wire: &mut pb::Augmentation) {
        if !self.is_random() {
            return;
        }
        let range = |r: Option<(f64, f64)>| r.map(|(min, max)| pb::Range { min, max });
        wire.color_jitter = Some(pb::ColorJitter {
            brightness: range(self.brightness),
            contrast: range(self.contrast),
            saturation: range(self.saturation),
            hue: range(self.hue),
        });
    }

    fn drawn_from_wire(wire: &pb::CropBox) -> JitterDrawn {
        let mut drawn = JitterDrawn::default();
        for step in wire.jitter.iter().take(ORDER.len()) {
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

    fn drawn_to_wire(drawn: JitterDrawn, wire: &mut pb::CropBox) {
        wire.jitter = drawn
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
            .collect();
    }
}
