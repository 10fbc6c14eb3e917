//! The stream's spec on the wire: its crop, its resize, the ops table's
//! rows (built from the table's own list, each through its type's
//! `OpWire`, which the compiler asks of every row) and their groups, and a
//! sample's `CropBox`.

use super::super::crop::{Crop, RandomResizedCrop};
use super::super::op::{invalid, AugmentError};
use super::super::ops::op_table_rows;
use super::super::ops::{
    AutoAugment, ColorJitter, Drawn, GaussianBlur, Group, GroupKind, Groups, HorizontalFlip, Ops,
    RandomAdjustSharpness, RandomAffine, RandomAutocontrast, RandomEqualize, RandomErasing,
    RandomGrayscale, RandomInvert, RandomPhotometricDistort, RandomPosterize, RandomRotation,
    RandomSolarize, RandomVerticalFlip, TimmRandAugment, MAX_GROUPS, MAX_GROUP_ROWS,
};
use super::super::spec::{CropBox, OutputSpec, Resample};
use super::rows::OpWire;
use crate::proto::v1 as pb;

/// The ops table's rows (`../ops/mod.rs`, `op_table_rows!`) on the wire:
/// each row's type answers through its [`OpWire`] impl.
macro_rules! op_rows {
    ($($(#[doc = $doc:literal])* $name:ident: $op:ty,)+) => {
        impl Ops {
            /// The rows a request names, its groups checked against them.
            pub fn from_wire(wire: &pb::Augmentation) -> Result<Self, AugmentError> {
                Ok(Self {
                    $($name: <$op as OpWire>::from_wire(wire),)+
                    groups: groups_from_wire(&wire.groups, Self::NAMES)?,
                })
            }

            pub fn to_wire(&self, wire: &mut pb::Augmentation) {
                $(self.$name.to_wire(wire);)+
                wire.groups = groups_to_wire(&self.groups, Self::NAMES);
            }
        }

        impl Drawn {
            pub fn from_wire(wire: &pb::CropBox) -> Self {
                Self {
                    $($name: <$op as OpWire>::drawn_from_wire(wire),)+
                    applied: (!wire.applied_rows.is_empty()).then(|| {
                        super::super::ops::Applied::from_names(&wire.applied_rows, Ops::NAMES)
                    }),
                }
            }

            pub fn to_wire(&self, wire: &mut pb::CropBox) {
                $(<$op as OpWire>::drawn_to_wire(self.$name, wire);)+
                if let Some(applied) = &self.applied {
                    wire.applied_rows =
                        applied.rows().map(|row| Ops::NAMES[row].to_string()).collect();
                }
            }
        }
    };
}

op_table_rows!(op_rows);

impl OutputSpec {
    /// The spec a request or a unit names, its ranges not yet checked
    /// ([`Self::validate`]); the caller has resolved the crop (a request
    /// may name it by its legacy `resize` mode). An interpolation the
    /// server does not resize with is refused here.
    pub fn from_wire(
        height: u32,
        width: u32,
        crop: Crop,
        wire: &pb::Augmentation,
    ) -> Result<Self, AugmentError> {
        Ok(Self {
            height,
            width,
            crop,
            resample: resample_from_wire(wire)?,
            ops: Ops::from_wire(wire)?,
        })
    }

    /// The augmentation a request or a pool unit carries for this spec:
    /// its crop set and every bound resolved.
    pub fn augmentation_to_wire(&self) -> pb::Augmentation {
        let mut wire = pb::Augmentation::default();
        self.crop.to_wire(&mut wire);
        resample_to_wire(self.resample, &mut wire);
        self.ops.to_wire(&mut wire);
        wire
    }
}

impl CropBox {
    /// As a batch reports it (single precision, the wire's).
    pub fn to_wire(&self) -> pb::CropBox {
        let mut wire = pb::CropBox {
            left: self.left as f32,
            top: self.top as f32,
            width: self.width as f32,
            height: self.height as f32,
            ..Default::default()
        };
        self.drawn.to_wire(&mut wire);
        wire
    }

    pub fn from_wire(wire: &pb::CropBox) -> Self {
        Self {
            left: f64::from(wire.left),
            top: f64::from(wire.top),
            width: f64::from(wire.width),
            height: f64::from(wire.height),
            drawn: Drawn::from_wire(wire),
        }
    }
}

impl Crop {
    /// The crop a request's augmentation names; `None` when it names none
    /// (the caller decides, e.g. from the legacy `resize` mode).
    pub fn from_wire(wire: &pb::Augmentation) -> Option<Self> {
        use pb::augmentation::Crop as Wire;
        Some(match wire.crop.as_ref()? {
            Wire::CenterCrop(center) => Crop::Center {
                resize: (center.resize != 0).then_some(center.resize),
            },
            Wire::Stretch(_) => Crop::Stretch,
            Wire::RandomResizedCrop(random) => {
                let defaults = RandomResizedCrop::default();
                Crop::RandomResized(RandomResizedCrop {
                    scale: (
                        random.scale_min.unwrap_or(defaults.scale.0),
                        random.scale_max.unwrap_or(defaults.scale.1),
                    ),
                    ratio: (
                        random.ratio_min.unwrap_or(defaults.ratio.0),
                        random.ratio_max.unwrap_or(defaults.ratio.1),
                    ),
                })
            }
        })
    }

    /// The crop as a request names it, every bound set.
    pub fn to_wire(&self, wire: &mut pb::Augmentation) {
        use pb::augmentation::Crop as Wire;
        wire.crop = Some(match *self {
            Crop::Center { resize } => Wire::CenterCrop(pb::CenterCrop {
                resize: resize.unwrap_or(0),
            }),
            Crop::Stretch => Wire::Stretch(pb::Stretch {}),
            Crop::RandomResized(RandomResizedCrop { scale, ratio }) => {
                Wire::RandomResizedCrop(pb::RandomResizedCrop {
                    scale_min: Some(scale.0),
                    scale_max: Some(scale.1),
                    ratio_min: Some(ratio.0),
                    ratio_max: Some(ratio.1),
                })
            }
        });
    }
}

fn resample_from_wire(wire: &pb::Augmentation) -> Result<Resample, AugmentError> {
    let Some(value) = wire.resize_interpolation else {
        return Ok(Resample::Bilinear);
    };
    match pb::Interpolation::try_from(value) {
        Ok(pb::Interpolation::Bilinear) => Ok(Resample::Bilinear),
        Ok(pb::Interpolation::Bicubic) => Ok(Resample::Bicubic),
        _ => Err(invalid(
            "augmentation.resize_interpolation",
            format!(
                "{value} is not served: the crop is resized with INTERPOLATION_BILINEAR or \
                 INTERPOLATION_BICUBIC (antialiased, as torchvision's and PIL's resize)"
            ),
        )),
    }
}

fn resample_to_wire(resample: Resample, wire: &mut pb::Augmentation) {
    wire.resize_interpolation = Some(match resample {
        Resample::Bilinear => pb::Interpolation::Bilinear,
        Resample::Bicubic => pb::Interpolation::Bicubic,
    } as i32);
}

const GROUPS_FIELD: &str = "augmentation.groups";

/// A request's RandomApply / RandomChoice / RandomOrder over the table's
/// rows (`names`), each checked for its shape here (its rows' being on is
/// checked with the ops, [`Groups::validate`]).
fn groups_from_wire(wire: &[pb::OpGroup], names: &[&str]) -> Result<Groups, AugmentError> {
    if wire.len() > MAX_GROUPS {
        return Err(invalid(
            GROUPS_FIELD,
            format!("at most {MAX_GROUPS} groups, not {}", wire.len()),
        ));
    }
    let mut groups = Groups::NONE;
    for (place, group) in wire.iter().enumerate() {
        let at = |message: String| invalid(GROUPS_FIELD, format!("group {place}: {message}"));
        let kind = match pb::OpGroupKind::try_from(group.kind) {
            Ok(pb::OpGroupKind::Apply) => GroupKind::Apply,
            Ok(pb::OpGroupKind::Choice) => GroupKind::Choice,
            Ok(pb::OpGroupKind::Order) => GroupKind::Order,
            _ => return Err(at("kind must be APPLY, CHOICE or ORDER".into())),
        };
        if group.rows.len() > MAX_GROUP_ROWS {
            return Err(at(format!(
                "at most {MAX_GROUP_ROWS} rows, not {}",
                group.rows.len()
            )));
        }
        let mut rows = Vec::with_capacity(group.rows.len());
        for name in &group.rows {
            let row = names
                .iter()
                .position(|known| known == name)
                .ok_or_else(|| {
                    at(format!(
                        "no row is named {name:?} (Describe.augmentation_ops lists them)"
                    ))
                })?;
            rows.push(row);
        }
        if kind != GroupKind::Choice && !group.weights.is_empty() {
            return Err(at("weights are for CHOICE groups".into()));
        }
        if kind != GroupKind::Apply && group.p != 0.0 {
            return Err(at("p is for APPLY groups".into()));
        }
        if !group.weights.is_empty() && group.weights.len() != rows.len() {
            return Err(at(format!(
                "{} weights for {} rows: name one per row, or none",
                group.weights.len(),
                rows.len()
            )));
        }
        groups = groups.with(Group::new(kind, &rows, group.p, &group.weights));
    }
    Ok(groups)
}

fn groups_to_wire(groups: &Groups, names: &[&str]) -> Vec<pb::OpGroup> {
    groups
        .iter()
        .map(|group| pb::OpGroup {
            kind: match group.kind {
                GroupKind::Apply => pb::OpGroupKind::Apply,
                GroupKind::Choice => pb::OpGroupKind::Choice,
                GroupKind::Order => pb::OpGroupKind::Order,
            } as i32,
            rows: group.rows().map(|row| names[row].to_string()).collect(),
            p: group.p,
            weights: if group.kind == GroupKind::Choice {
                group.weights().to_vec()
            } else {
                Vec::new()
            },
        })
        .collect()
}
