//! RandomAffine: torchvision's `RandomAffine(degrees, translate, scale,
//! shear, interpolation, fill, center=None)`, each sample's angle,
//! translation, scale and shear drawn from the op's own key in
//! torchvision's order, and reported as `affine`'s arguments.

use super::super::kernels::{self, Affine, Interpolation, Sampling};
use super::super::key::uniform_in;
use super::super::op::{invalid, AugmentError, DrawAt, Op};
use super::policy::Fill;
use crate::plan::rng::Rng;

type Range = (f64, f64);

/// The ranges (degrees None: off) and how the sample is resampled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomAffine {
    pub degrees: Option<Range>,
    /// The largest translation, as fractions of the width and the height.
    pub translate: Option<(f64, f64)>,
    pub scale: Option<Range>,
    pub shear_x: Option<Range>,
    pub shear_y: Option<Range>,
    /// None: an interpolation the wire named that this server does not know.
    pub interpolation: Option<Interpolation>,
    pub fill: Fill,
}

/// What one sample drew: `affine`'s arguments.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AffineDrawn {
    pub angle: f64,
    pub translate: [i32; 2],
    pub scale: f64,
    pub shear: [f64; 2],
}

impl Default for RandomAffine {
    fn default() -> Self {
        Self::OFF
    }
}

impl RandomAffine {
    /// torchvision's `RandomAffine(degrees)`: nearest, fill 0, nothing but
    /// the angle.
    pub fn new(low: f64, high: f64) -> Self {
        Self {
            degrees: Some((low, high)),
            fill: Fill::colour([0; 3]),
            ..Self::OFF
        }
    }

    fn sampling(&self) -> Sampling {
        Sampling {
            interpolation: self.interpolation.unwrap_or_default(),
            fill: self.fill.get(),
        }
    }
}

fn check_range(
    field: &'static str,
    range: Option<Range>,
    fits: impl Fn(f64, f64) -> bool,
    wanted: &str,
) -> Result<(), AugmentError> {
    match range {
        Some((low, high)) if !(low.is_finite() && high.is_finite() && fits(low, high)) => Err(
            invalid(field, format!("must be {wanted}, not {low}..{high}")),
        ),
        _ => Ok(()),
    }
}

impl Op for RandomAffine {
    /// `affine`'s arguments for the sample (None: the op is off).
    type Drawn = Option<AffineDrawn>;

    const NAME: &'static str = "affine";
    const CLIENT_REPLAYS: bool = false;
    const OFF: Self = Self {
        degrees: None,
        translate: None,
        scale: None,
        shear_x: None,
        shear_y: None,
        interpolation: Some(Interpolation::Nearest),
        fill: Fill {
            levels: [0; 3],
            count: 0,
        },
    };

    fn validate(&self) -> Result<(), AugmentError> {
        if self.degrees.is_none() {
            return Ok(());
        }
        let ordered = |low: f64, high: f64| low <= high;
        check_range(
            "augmentation.affine.degrees",
            self.degrees,
            ordered,
            "finite with min <= max",
        )?;
        check_range(
            "augmentation.affine.translate",
            self.translate,
            |x, y| (0.0..=1.0).contains(&x) && (0.0..=1.0).contains(&y),
            "fractions in [0, 1]",
        )?;
        check_range(
            "augmentation.affine.scale",
            self.scale,
            |low, high| low > 0.0 && low <= high,
            "0 < min <= max",
        )?;
        check_range(
            "augmentation.affine.shear_x",
            self.shear_x,
            ordered,
            "finite with min <= max",
        )?;
        check_range(
            "augmentation.affine.shear_y",
            self.shear_y,
            ordered,
            "finite with min <= max",
        )?;
        if self.interpolation.is_none() {
            return Err(invalid(
                "augmentation.affine.interpolation",
                "must be INTERPOLATION_NEAREST or INTERPOLATION_BILINEAR (torchvision's \
                 tensor affine samples with these)"
                    .into(),
            ));
        }
        self.fill.validate("augmentation.affine.fill")
    }

    fn is_random(&self) -> bool {
        self.degrees.is_some()
    }

    fn draw(&self, _: &mut Rng, at: &DrawAt) -> Option<AffineDrawn> {
        let degrees = self.degrees?;
        let mut rng = at.generator(Self::NAME);
        // torchvision's `_get_params` order: angle, translation, scale,
        // shear x then y; each present range draws once.
        let angle = uniform_in(&mut rng, degrees);
        let translate = self.translate.map_or([0, 0], |(x, y)| {
            let most = [x * f64::from(at.width), y * f64::from(at.height)];
            // `int(round(u))`: Python rounds half to even.
            most.map(|m| uniform_in(&mut rng, (-m, m)).round_ties_even() as i32)
        });
        let scale = self.scale.map_or(1.0, |range| uniform_in(&mut rng, range));
        let shear_x = self
            .shear_x
            .map_or(0.0, |range| uniform_in(&mut rng, range));
        let shear_y = self
            .shear_y
            .map_or(0.0, |range| uniform_in(&mut rng, range));
        Some(AffineDrawn {
            angle,
            translate,
            scale,
            shear: [shear_x, shear_y],
        })
    }

    fn apply(&self, drawn: &Option<AffineDrawn>, width: u32, out: &mut [u8]) {
        if let Some(drawn) = drawn {
            let transform = Affine {
                angle: drawn.angle,
                translate: drawn.translate.map(f64::from),
                scale: drawn.scale,
                shear: drawn.shear,
                center: None,
            };
            kernels::affine_with(out, width, transform, self.sampling());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::op::draw_alone;
    use super::*;
    use crate::decode::augment::wire::OpWire;
    use crate::proto::v1 as pb;

    fn full() -> RandomAffine {
        RandomAffine {
            translate: Some((0.1, 0.2)),
            scale: Some((0.8, 1.2)),
            shear_x: Some((-10.0, 10.0)),
            shear_y: Some((-5.0, 5.0)),
            interpolation: Some(Interpolation::Bilinear),
            ..RandomAffine::new(-30.0, 30.0)
        }
    }

    #[test]
    fn the_parameters_are_checked_and_survive_the_wire() {
        for affine in [full(), RandomAffine::new(-5.0, 5.0)] {
            assert!(affine.validate().is_ok());
            let mut wire = pb::Augmentation::default();
            affine.to_wire(&mut wire);
            assert_eq!(RandomAffine::from_wire(&wire), affine);
        }
        assert_eq!(
            RandomAffine::from_wire(&pb::Augmentation::default()),
            RandomAffine::OFF
        );
        let field = |a: RandomAffine| a.validate().unwrap_err().field;
        let affine = full();
        for (bad, name) in [
            (
                RandomAffine {
                    degrees: Some((5.0, -5.0)),
                    ..affine
                },
                "augmentation.affine.degrees",
            ),
            (
                RandomAffine {
                    translate: Some((1.5, 0.0)),
                    ..affine
                },
                "augmentation.affine.translate",
            ),
            (
                RandomAffine {
                    scale: Some((0.0, 1.0)),
                    ..affine
                },
                "augmentation.affine.scale",
            ),
            (
                RandomAffine {
                    shear_y: Some((f64::NAN, 1.0)),
                    ..affine
                },
                "augmentation.affine.shear_y",
            ),
            (
                RandomAffine {
                    interpolation: None,
                    ..affine
                },
                "augmentation.affine.interpolation",
            ),
        ] {
            assert_eq!(field(bad), name);
        }
    }

    #[test]
    fn each_draw_is_in_its_range_and_the_samples_own() {
        let affine = full();
        let (width, height) = (50, 40);
        for sample in 0..500u64 {
            let drawn = draw_alone(&affine, (9, 2, sample), (width, height)).unwrap();
            assert!((-30.0..30.0).contains(&drawn.angle));
            // At most 0.1 x 50 and 0.2 x 40, rounded.
            assert!(drawn.translate[0].abs() <= 5 && drawn.translate[1].abs() <= 8);
            assert!((0.8..1.2).contains(&drawn.scale));
            assert!((-10.0..10.0).contains(&drawn.shear[0]));
            assert!((-5.0..5.0).contains(&drawn.shear[1]));
            assert_eq!(
                draw_alone(&affine, (9, 2, sample), (width, height)),
                Some(drawn)
            );
        }
        // Only the angle: nothing else moves.
        let plain = draw_alone(&RandomAffine::new(-30.0, 30.0), (9, 2, 1), (50, 40)).unwrap();
        assert_eq!(
            (plain.translate, plain.scale, plain.shear),
            ([0, 0], 1.0, [0.0, 0.0])
        );
    }
}
