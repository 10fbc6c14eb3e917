//! A stream of several views per sample on the wire: a request's view
//! groups read into the library's [`Views`], and each group's array in a
//! batch's bytes written with its rows' boxes and its views' augmentations.

use std::sync::Arc;

use super::pb;
use crate::decode::{
    self, AugmentError, Crop, OutputSpec, ViewGroup, Views, DEFAULT_SIZE, MAX_VIEWS_PER_GROUP,
    MAX_VIEW_GROUPS,
};
use crate::pipeline::{DecodedBatch, ViewLayout};

/// A stream's view groups, and each view's augmentation as its batches
/// report it (written once).
pub(super) struct StreamViews {
    views: Arc<Views>,
    augmentations: Vec<Vec<pb::Augmentation>>,
}

impl StreamViews {
    pub fn new(views: Arc<Views>) -> Self {
        Self {
            augmentations: augmentations_to_wire(&views),
            views,
        }
    }

    /// Each group's array in the batch's bytes, its rows' boxes in the
    /// pixels' order (view-major).
    pub fn to_wire(&self, batch: &DecodedBatch) -> Vec<pb::ViewBatch> {
        let layout = ViewLayout::new(&self.views, batch.size);
        let mut first_view = 0;
        layout
            .groups
            .iter()
            .zip(&self.views.groups)
            .zip(&self.augmentations)
            .map(|((place, group), augmentations)| {
                let (height, width) = group.size();
                let crops = (0..place.views)
                    .flat_map(|view| {
                        batch
                            .view_crops
                            .iter()
                            .map(move |boxes| boxes.get(first_view + view).copied())
                    })
                    .map(|crop| crop.unwrap_or_default().to_wire())
                    .collect();
                first_view += place.views;
                pb::ViewBatch {
                    shape: Some(pb::Shape {
                        n: (place.views * batch.size) as u32,
                        height,
                        width,
                        channels: decode::CHANNELS as u32,
                    }),
                    offset: place.offset as u64,
                    length: place.length(batch.size) as u64,
                    crops,
                    augmentations: augmentations.clone(),
                }
            })
            .collect()
    }
}

/// The groups a request names, not yet checked against the bounds of the
/// specs themselves ([`Views::validate`]): only what reading them needs
/// (how many, and each group's count against its views), checked before
/// anything is made of a count, so a hostile count costs nothing.
pub(super) fn views_from_wire(wire: &[pb::ViewGroup]) -> Result<Views, AugmentError> {
    if wire.len() > MAX_VIEW_GROUPS {
        return Err(invalid(
            "views",
            format!(
                "{} view groups; at most {MAX_VIEW_GROUPS} are served",
                wire.len()
            ),
        ));
    }
    let groups = wire
        .iter()
        .enumerate()
        .map(|(g, group)| group_from_wire(g, group))
        .collect::<Result<_, _>>()?;
    Ok(Views { groups })
}

/// Per group, each view's augmentation with every default resolved.
fn augmentations_to_wire(views: &Views) -> Vec<Vec<pb::Augmentation>> {
    views
        .groups
        .iter()
        .map(|group| {
            group
                .views
                .iter()
                .map(OutputSpec::augmentation_to_wire)
                .collect()
        })
        .collect()
}

fn invalid(field: &'static str, message: String) -> AugmentError {
    AugmentError { field, message }
}

fn group_from_wire(g: usize, wire: &pb::ViewGroup) -> Result<ViewGroup, AugmentError> {
    let count = match (wire.views.len(), wire.count) {
        (0 | 1, 0) => 1,
        (0 | 1, count) => count as usize,
        (listed, 0) => listed,
        (listed, count) if count as usize == listed => listed,
        (listed, count) => {
            return Err(invalid(
                "views.count",
                format!(
                    "group {g}: count {count} with {listed} views listed; list one view for \
                     `count` alike, or leave count 0"
                ),
            ))
        }
    };
    if count > MAX_VIEWS_PER_GROUP as usize {
        return Err(invalid(
            "views.count",
            format!("group {g}: {count} views; each group takes 1 to {MAX_VIEWS_PER_GROUP}"),
        ));
    }
    let side = |value: u32| if value == 0 { DEFAULT_SIZE } else { value };
    let (height, width) = (side(wire.height), side(wire.width));
    let default = pb::Augmentation::default();
    let spec_of = |v: usize, augmentation: &pb::Augmentation| {
        let crop = Crop::from_wire(augmentation).unwrap_or(Crop::Center { resize: None });
        OutputSpec::from_wire(height, width, crop, augmentation).map_err(|e| AugmentError {
            message: format!("in view group {g}, view {v}: {}", e.message),
            ..e
        })
    };
    let views = match wire.views.as_slice() {
        [] => vec![spec_of(0, &default)?; count],
        [one] => vec![spec_of(0, one)?; count],
        listed => listed
            .iter()
            .enumerate()
            .map(|(v, augmentation)| spec_of(v, augmentation))
            .collect::<Result<_, _>>()?,
    };
    Ok(ViewGroup { views })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::Resample;

    fn rrc(scale_min: f64) -> pb::Augmentation {
        pb::Augmentation {
            crop: Some(pb::augmentation::Crop::RandomResizedCrop(
                pb::RandomResizedCrop {
                    scale_min: Some(scale_min),
                    scale_max: Some(1.0),
                    ..Default::default()
                },
            )),
            horizontal_flip: 0.5,
            resize_interpolation: Some(pb::Interpolation::Bicubic as i32),
            ..Default::default()
        }
    }

    #[test]
    fn groups_read_as_written_and_back() {
        let wire = vec![
            pb::ViewGroup {
                height: 224,
                width: 224,
                views: vec![rrc(0.32), {
                    let mut second = rrc(0.32);
                    second.solarize = Some(pb::RandomSolarize {
                        threshold: 128.0,
                        p: 0.2,
                    });
                    second
                }],
                count: 0,
            },
            pb::ViewGroup {
                height: 96,
                width: 96,
                views: vec![rrc(0.05)],
                count: 8,
            },
        ];
        let views = views_from_wire(&wire).unwrap();
        views.validate().unwrap();
        assert_eq!(views.count(), 10);
        assert_eq!(views.groups[1].size(), (96, 96));
        assert_eq!(views.groups[0].views[0].resample, Resample::Bicubic);
        assert_ne!(views.groups[0].views[0], views.groups[0].views[1]);
        let back = augmentations_to_wire(&views);
        assert_eq!(back[1].len(), 8);
        let again: Vec<pb::ViewGroup> = back
            .into_iter()
            .zip(&views.groups)
            .map(|(augmentations, group)| pb::ViewGroup {
                height: group.size().0,
                width: group.size().1,
                views: augmentations,
                count: 0,
            })
            .collect();
        assert_eq!(views_from_wire(&again).unwrap(), views);
    }

    #[test]
    fn counts_are_refused_before_anything_is_made_of_them() {
        let field = |wire: Vec<pb::ViewGroup>| views_from_wire(&wire).unwrap_err().field;
        let huge = pb::ViewGroup {
            views: vec![rrc(0.05)],
            count: u32::MAX,
            ..Default::default()
        };
        assert_eq!(field(vec![huge]), "views.count");
        let mismatched = pb::ViewGroup {
            views: vec![rrc(0.05), rrc(0.05)],
            count: 3,
            ..Default::default()
        };
        assert_eq!(field(vec![mismatched]), "views.count");
        assert_eq!(field(vec![pb::ViewGroup::default(); 9]), "views");
        let bicubic_nearest = pb::ViewGroup {
            views: vec![pb::Augmentation {
                resize_interpolation: Some(99),
                ..Default::default()
            }],
            ..Default::default()
        };
        let error = views_from_wire(&[bicubic_nearest]).unwrap_err();
        assert!(
            error.message.starts_with("in view group 0, view 0"),
            "{error}"
        );
        // Empty groups read as one center crop at the default size.
        let plain = views_from_wire(&[pb::ViewGroup::default()]).unwrap();
        assert_eq!(plain.groups[0].size(), (DEFAULT_SIZE, DEFAULT_SIZE));
        assert_eq!(plain.groups[0].views[0].crop, Crop::Center { resize: None });
    }
}
