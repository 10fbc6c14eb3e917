//! RandomRotation: torchvision's `RandomRotation(degrees, interpolation,
//! expand=False, center=None, fill)`, each sample turned about its centre
//! by an angle drawn uniform in `degrees` from the op's own key.

use super::super::kernels::{self, Interpolation, Sampling};
use super::super::key::uniform_in;
use super::super::op::{invalid, AugmentError, DrawAt, Op};
use super::policy::Fill;
use crate::plan::rng::Rng;

/// The angle range (degrees; None: off) and how the turned sample is
/// sampled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomRotation {
    pub degrees: Option<(f64, f64)>,
    /// None: an interpolation the wire named that this server does not know.
    pub interpolation: Option<Interpolation>,
    pub fill: Fill,
}

impl Default for RandomRotation {
    fn default() -> Self {
        Self::OFF
    }
}

impl RandomRotation {
    /// torchvision's `RandomRotation(degrees)`: nearest, fill 0.
    pub fn new(low: f64, high: f64) -> Self {
        Self {
            degrees: Some((low, high)),
            interpolation: Some(Interpolation::Nearest),
            fill: Fill::colour([0; 3]),
        }
    }

    fn sampling(&self) -> Sampling {
        Sampling {
            interpolation: self.interpolation.unwrap_or_default(),
            fill: self.fill.get(),
        }
    }
}

impl Op for RandomRotation {
    /// The angle the sample was turned by (None: the op is off).
    type Drawn = Option<f64>;

    const NAME: &'static str = "rotation";
    const CLIENT_REPLAYS: bool = false;
    const OFF: Self = Self {
        degrees: None,
        interpolation: Some(Interpolation::Nearest),
        fill: Fill {
            levels: [0; 3],
            count: 0,
        },
    };

    fn validate(&self) -> Result<(), AugmentError> {
        let Some((low, high)) = self.degrees else {
            return Ok(());
        };
        if !(low.is_finite() && high.is_finite() && low <= high) {
            return Err(invalid(
                "augmentation.rotation.degrees",
                format!("must be finite with min <= max, not {low}..{high}"),
            ));
        }
        if self.interpolation.is_none() {
            return Err(invalid(
                "augmentation.rotation.interpolation",
                "must be INTERPOLATION_NEAREST or INTERPOLATION_BILINEAR (torchvision's \
                 tensor rotate samples with these)"
                    .into(),
            ));
        }
        self.fill.validate("augmentation.rotation.fill")
    }

    fn is_random(&self) -> bool {
        self.degrees.is_some()
    }

    fn draw(&self, _: &mut Rng, at: &DrawAt) -> Option<f64> {
        // torchvision: `torch.empty(1).uniform_(low, high)`, here from the
        // op's key; the angle is reported, so replay needs no generator.
        let degrees = self.degrees?;
        Some(uniform_in(&mut at.generator(Self::NAME), degrees))
    }

    fn apply(&self, angle: &Option<f64>, width: u32, out: &mut [u8]) {
        if let Some(angle) = *angle {
            kernels::rotate(out, width, angle, self.sampling());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::op::draw_alone;
    use super::*;
    use crate::decode::augment::wire::OpWire;
    use crate::proto::v1 as pb;

    #[test]
    fn the_parameters_are_checked_and_survive_the_wire() {
        let rotation = RandomRotation {
            interpolation: Some(Interpolation::Bilinear),
            ..RandomRotation::new(-30.0, 15.0)
        };
        assert!(rotation.validate().is_ok());
        let mut wire = pb::Augmentation::default();
        rotation.to_wire(&mut wire);
        assert_eq!(RandomRotation::from_wire(&wire), rotation);
        assert_eq!(
            RandomRotation::from_wire(&pb::Augmentation::default()),
            RandomRotation::OFF
        );
        let field = |r: RandomRotation| r.validate().unwrap_err().field;
        assert_eq!(
            field(RandomRotation::new(10.0, -10.0)),
            "augmentation.rotation.degrees"
        );
        assert_eq!(
            field(RandomRotation::new(f64::NAN, 1.0)),
            "augmentation.rotation.degrees"
        );
        assert_eq!(
            field(RandomRotation {
                interpolation: None,
                ..rotation
            }),
            "augmentation.rotation.interpolation"
        );
        assert_eq!(
            field(RandomRotation {
                fill: Fill::from_levels(&[1, 2]),
                ..rotation
            }),
            "augmentation.rotation.fill"
        );
    }

    #[test]
    fn angles_fill_the_range_and_are_each_samples_own() {
        let rotation = RandomRotation::new(-30.0, 30.0);
        let angles: Vec<f64> = (0..2000u64)
            .map(|s| draw_alone(&rotation, (3, 0, s), (40, 40)).unwrap())
            .collect();
        assert!(angles.iter().all(|a| (-30.0..30.0).contains(a)));
        let below = angles.iter().filter(|&&a| a < 0.0).count();
        // 1000 +- 4 standard deviations (22).
        assert!((912..=1088).contains(&below), "{below}");
        let again = draw_alone(&rotation, (3, 0, 17), (40, 40));
        assert_eq!(again, Some(angles[17]));
        assert_ne!(draw_alone(&rotation, (3, 1, 17), (40, 40)), again);
        assert_eq!(draw_alone(&RandomRotation::OFF, (3, 0, 17), (40, 40)), None);
    }
}
